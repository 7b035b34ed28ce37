// Multi-head self-attention's softmax, forward and backward, with HF's additive padding mask and
// attention-probability dropout. The products around it (scores = q·kᵀ, ctx = p·v and the
// backward's four) are batched GEMMs on the tensor cores, one item per (sequence, head): see
// runtime/src/backend/kernels/attention.rs. The semantics are the CPU backend's
// (runtime/src/backend/cpu.rs, `attn_fwd_one` / `attn_bwd_one`); this is the approach of
// llm.c's attention (cuBLAS for the products, a kernel for the softmax), without its permutes:
// each GEMM reads a head's columns of [batch, seq, heads * head_dim] in place.
//
//   probs, probs_drop, ds: [batch, heads, seq, seq], row (b*heads + h)*seq + i;
//   mask:                  [batch, seq], 0 for a padding key.
//
// One warp per row (a block of BLOCK threads takes BLOCK / 32 rows); a row's reductions are the
// warp's fixed butterfly, so the same inputs give the same bits.
#include "common.cuh"

// Forward: `scores` holds scale · q·kᵀ from the GEMM, unrounded, and is the kernel's f32
// workspace; + f32_lowest() for a masked key (added, not replaced: a fully masked row then
// softmaxes to a finite uniform row, as in PyTorch), the softmax rounded to `store` into probs;
// with dropout (`dropout` != 0) probs_drop is probs times the mask multiplier of its element
// index, rounded. probs and probs_drop are typed buffers (common.cuh's ld, sto: 16-bit ones on a
// device keeping the stored probabilities in two bytes); probs may be the scores themselves (an
// f32 buffer, in place).
extern "C" __global__ void attention_softmax(float* scores, void* probs, int probs_t,
                                             void* probs_drop, int pd_t, const unsigned* mask,
                                             int rows, int seq, int heads, int dropout,
                                             const unsigned* key, unsigned long long site,
                                             unsigned threshold, float dscale, int store) {
    int r = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (r >= rows) return;  // a whole warp leaves together: the shuffles below stay full
    int lane = threadIdx.x & 31;
    long long at = (long long)r * seq;  // the element index of key 0
    const unsigned* m = mask + (long long)(r / (heads * seq)) * seq;  // this sequence's keys
    float* row = scores + at;
    float mx = -f32_inf();
    for (int j = lane; j < seq; j += 32) {
        float x = row[j];
        if (m[j] == 0) x += f32_lowest();
        row[j] = x;
        mx = fmaxf(mx, x);
    }
    mx = warp_max(mx);
    float sum = 0.0f;
    for (int j = lane; j < seq; j += 32) {
        float e = expf(row[j] - mx);
        row[j] = e;
        sum += e;
    }
    sum = warp_sum(sum);
    DropKey k = {0, 0};
    if (dropout) k = drop_key(key, site);
    for (int j = lane; j < seq; j += 32) {
        float p = st(row[j] / sum, store);
        sto(probs, at + j, p, probs_t);
        if (dropout) {
            float kept = p * dropout_mult(at + j, k.seed, k.stream, threshold, dscale);
            sto(probs_drop, at + j, st(kept, store), pd_t);
        }
    }
}

// Backward from `dp` (dctx·vᵀ from the GEMM, f32): with dropout, dp is masked in place by the
// forward's mask read back from `pd` (probs_drop: 0 where it is 0, else dp · dscale; a zero
// probability that was kept gives the same result, as the softmax backward multiplies by it);
// then ds_ij = p_ij (dp_ij − Σ_j dp_ij p_ij), rounded to `store` into the typed buffer `ds`:
// the half GEMMs for dq and dk read it as a stored value (the CPU's `attn_bwd_one`). `ds` may be
// `dp` itself (an f32 buffer: each lane rewrites the elements it read).
extern "C" __global__ void attention_softmax_bwd(float* dp, void* ds, int ds_t, const void* probs,
                                                 int probs_t, const void* pd, int pd_t, int rows,
                                                 int seq, int dropout, float dscale, int store) {
    int r = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (r >= rows) return;
    int lane = threadIdx.x & 31;
    long long at = (long long)r * seq;
    float* row = dp + at;
    float dot = 0.0f;
    for (int j = lane; j < seq; j += 32) {
        float x = row[j];
        if (dropout) x = ld(pd, at + j, pd_t) != 0.0f ? x * dscale : 0.0f;
        row[j] = x;
        dot += x * ld(probs, at + j, probs_t);
    }
    dot = warp_sum(dot);
    for (int j = lane; j < seq; j += 32)
        sto(ds, at + j, st(ld(probs, at + j, probs_t) * (row[j] - dot), store), ds_t);
}
