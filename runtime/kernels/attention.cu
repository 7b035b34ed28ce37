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
// warp's fixed butterfly, so the same inputs give the same bits. Lane l takes the keys
// k · 128 + 4l + u (u < 4) for k = 0, 1, …: four consecutive keys, so that their scores load as
// one 16-byte access where the row allows (seq a multiple of 4, the buffer 16-byte aligned) and
// their dropout multipliers come from one Philox block (dropout_mult4); the scores are read in
// each pass and never written back (recomputing exp is cheaper than a pass over memory; on an
// H200 the kernel was bound by its instructions and its memory passes: docs/cuda.md,
// "Performance").
#include "common.cuh"

#define KEYS_LANE 4
#define KEYS_SPAN (32 * KEYS_LANE)

// Forward: `scores` holds scale · q·kᵀ from the GEMM, unrounded; + f32_lowest() for a masked key
// (added, not replaced: a fully masked row then softmaxes to a finite uniform row, as in
// PyTorch), the softmax rounded to `store` into probs; with dropout (`dropout` != 0) probs_drop
// is probs times the mask multiplier of its element index, rounded. probs and probs_drop are
// typed buffers (common.cuh's ld, sto: 16-bit ones on a device keeping the stored probabilities
// in two bytes); probs may be the scores themselves (an f32 buffer, in place: a lane writes only
// the keys it has just read).
#define masked(v, j) (m[j] == 0 ? (v) + f32_lowest() : (v))

// The vectorised path: seq a multiple of 4, `scores` 16-byte aligned, probs and probs_drop of
// one type PT.
template <int PT>
__device__ __forceinline__ void attention_softmax_v(const float* row, void* probs,
                                                    void* probs_drop, const unsigned* m,
                                                    long long at, int seq, int dropout,
                                                    DropKey k, unsigned threshold, float dscale,
                                                    int store, int lane) {
    float mx = -f32_inf();
    NO_UNROLL
    for (int j0 = lane * KEYS_LANE; j0 < seq; j0 += KEYS_SPAN) {
        unsigned w[4];
        ld16(w, row + j0);
        UNROLL
        for (int u = 0; u < KEYS_LANE; u++) mx = fmaxf(mx, masked(__uint_as_float(w[u]), j0 + u));
    }
    mx = warp_max(mx);
    float sum = 0.0f;
    NO_UNROLL
    for (int j0 = lane * KEYS_LANE; j0 < seq; j0 += KEYS_SPAN) {
        unsigned w[4];
        ld16(w, row + j0);
        UNROLL
        for (int u = 0; u < KEYS_LANE; u++)
            sum += expf(masked(__uint_as_float(w[u]), j0 + u) - mx);
    }
    sum = warp_sum(sum);
    NO_UNROLL
    for (int j0 = lane * KEYS_LANE; j0 < seq; j0 += KEYS_SPAN) {
        unsigned w[4];
        float mult[KEYS_LANE];
        ld16(w, row + j0);
        if (dropout)
            dropout_mult4(mult, (unsigned long long)((at + j0) / 4), k.seed, k.stream, threshold,
                          dscale);
        UNROLL
        for (int u = 0; u < KEYS_LANE; u++) {
            float p = st(expf(masked(__uint_as_float(w[u]), j0 + u) - mx) / sum, store);
            sto(probs, at + j0 + u, p, PT);
            if (dropout) sto(probs_drop, at + j0 + u, st(p * mult[u], store), PT);
        }
    }
}

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
    const float* row = scores + at;
    DropKey k = {0, 0};
    if (dropout) k = drop_key(key, site);
    if (seq % KEYS_LANE == 0 && aligned16(scores) && (!dropout || pd_t == probs_t)) {
        BY_TYPE(probs_t, attention_softmax_v, row, probs, probs_drop, m, at, seq, dropout, k,
                threshold, dscale, store, lane);
        return;
    }
    // The same operations in the same order, a key at a time.
#define each_key(j)                                                       \
    NO_UNROLL                                                             \
    for (int j0 = lane * KEYS_LANE; j0 < seq; j0 += KEYS_SPAN)            \
        NO_UNROLL                                                         \
        for (int j = j0; j < j0 + KEYS_LANE && j < seq; j++)
    float mx = -f32_inf();
    each_key(j) mx = fmaxf(mx, masked(row[j], j));
    mx = warp_max(mx);
    float sum = 0.0f;
    each_key(j) sum += expf(masked(row[j], j) - mx);
    sum = warp_sum(sum);
    each_key(j) {
        float p = st(expf(masked(row[j], j) - mx) / sum, store);
        sto(probs, at + j, p, probs_t);
        if (dropout) {
            float kept = p * dropout_mult(at + j, k.seed, k.stream, threshold, dscale);
            sto(probs_drop, at + j, st(kept, store), pd_t);
        }
    }
#undef each_key
}
#undef masked

// Backward from `dp` (dctx·vᵀ from the GEMM, f32): with dropout, dp is masked by the forward's
// mask read back from `pd` (probs_drop: 0 where it is 0, else dp · dscale; a zero probability
// that was kept gives the same result, as the softmax backward multiplies by it); then
// ds_ij = p_ij (dp_ij − Σ_j dp_ij p_ij), rounded to `store` into the typed buffer `ds`: the half
// GEMMs for dq and dk read it as a stored value (the CPU's `attn_bwd_one`). `ds` may be `dp`
// itself (an f32 buffer: a lane writes only the keys it has just read).
//
// The vectorised path, probs (and probs_drop) of type PT. dp of keys j0 … j0 + 3 as the
// backward uses it (masked when `dropout`):
template <int PT>
__device__ __forceinline__ void dp_keys(float x[KEYS_LANE], const float* row, const void* pd,
                                        long long at, int j0, int dropout, float dscale) {
    unsigned v[KEYS_LANE];
    ld16(v, row + j0);
    UNROLL
    for (int u = 0; u < KEYS_LANE; u++) {
        x[u] = __uint_as_float(v[u]);
        if (dropout) x[u] = ldt<PT>(pd, at + j0 + u) != 0.0f ? x[u] * dscale : 0.0f;
    }
}
template <int PT>
__device__ __forceinline__ void attention_softmax_bwd_t(const float* row, void* ds, int ds_t,
                                                        const void* probs, const void* pd,
                                                        long long at, int seq, int dropout,
                                                        float dscale, int store, int lane) {
    float dot = 0.0f;
    NO_UNROLL
    for (int j0 = lane * KEYS_LANE; j0 < seq; j0 += KEYS_SPAN) {
        float x[KEYS_LANE];
        dp_keys<PT>(x, row, pd, at, j0, dropout, dscale);
        UNROLL
        for (int u = 0; u < KEYS_LANE; u++) dot += x[u] * ldt<PT>(probs, at + j0 + u);
    }
    dot = warp_sum(dot);
    NO_UNROLL
    for (int j0 = lane * KEYS_LANE; j0 < seq; j0 += KEYS_SPAN) {
        float x[KEYS_LANE];
        dp_keys<PT>(x, row, pd, at, j0, dropout, dscale);
        UNROLL
        for (int u = 0; u < KEYS_LANE; u++) {
            long long i = at + j0 + u;
            sto(ds, i, st(ldt<PT>(probs, i) * (x[u] - dot), store), ds_t);
        }
    }
}
extern "C" __global__ void attention_softmax_bwd(float* dp, void* ds, int ds_t, const void* probs,
                                                 int probs_t, const void* pd, int pd_t, int rows,
                                                 int seq, int dropout, float dscale, int store) {
    int r = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (r >= rows) return;
    int lane = threadIdx.x & 31;
    long long at = (long long)r * seq;
    // The vectorised path: seq a multiple of 4, dp 16-byte aligned, probs and probs_drop of one
    // type whenever dropout reads the latter (the model's buffers).
    if (seq % KEYS_LANE == 0 && aligned16(dp) && (!dropout || pd_t == probs_t)) {
        BY_TYPE(probs_t, attention_softmax_bwd_t, dp + at, ds, ds_t, probs, pd, at, seq, dropout,
                dscale, store, lane);
        return;
    }
    float dot = 0.0f;
    NO_UNROLL
    for (int j0 = lane * KEYS_LANE; j0 < seq; j0 += KEYS_SPAN)
        for (int j = j0; j < j0 + KEYS_LANE && j < seq; j++) {
            float x = dp[at + j];
            if (dropout) x = ld(pd, at + j, pd_t) != 0.0f ? x * dscale : 0.0f;
            dot += x * ld(probs, at + j, probs_t);
        }
    dot = warp_sum(dot);
    NO_UNROLL
    for (int j0 = lane * KEYS_LANE; j0 < seq; j0 += KEYS_SPAN)
        for (int j = j0; j < j0 + KEYS_LANE && j < seq; j++) {
            float x = dp[at + j];
            if (dropout) x = ld(pd, at + j, pd_t) != 0.0f ? x * dscale : 0.0f;
            sto(ds, at + j, st(ld(probs, at + j, probs_t) * (x - dot), store), ds_t);
        }
}
