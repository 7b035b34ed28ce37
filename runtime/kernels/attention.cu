// Fused multi-head self-attention, forward and backward, with HF's additive padding mask and
// attention-probability dropout. The semantics are the CPU backend's (runtime/src/backend/cpu.rs,
// `attn_fwd_one` / `attn_bwd_one`):
//
//   q, k, v, ctx, dq, dk, dv, dctx: [batch, seq, heads * head_dim] row-major, head h in columns
//                                   h*head_dim .. (h+1)*head_dim of each token's row;
//   probs, probs_drop, ds:          [batch, heads, seq, seq].
//
// One block per query row (or key row in the backward's second kernel): grid (seq, heads, batch).
// The block's score row lives in dynamic shared memory, so seq is bounded by shared memory only
// (seq 512, head_dim 128: 2.5 KiB). Every sum runs in a fixed order (a thread's own loop, then
// block_sum's fixed tree), no atomics: the same inputs give the same bits.
#include "common.cuh"

// Forward. Scores s_j = (q_i · k_j) · scale, plus f32_lowest() for masked keys (added, not
// replaced: a fully masked row then softmaxes to a finite uniform row, as in PyTorch). probs is
// the softmax rounded to `store`; with dropout (`dropout` != 0) probs_drop is probs times the
// mask multiplier of element (b*heads + h)*seq*seq + i*seq + j, rounded; ctx_i = used probs · v.
//
// Dynamic shared memory: (head_dim + seq) floats.
extern "C" __global__ void attention_fwd(float* ctx, float* probs, float* probs_drop,
                                         const float* q, const float* k, const float* v,
                                         const unsigned* mask, int seq, int heads, int head_dim,
                                         float scale, int dropout, unsigned long long seed,
                                         unsigned long long stream, unsigned threshold,
                                         float dscale, int store) {
    DYN_SHARED(float, smem);
    __shared__ float red[32];
    float* qi = smem;              // this query's head slice
    float* row = smem + head_dim;  // scores, then probabilities
    int i = blockIdx.x, h = blockIdx.y, b = blockIdx.z;
    int d = head_dim;
    long long hid = (long long)heads * head_dim;
    long long tok0 = (long long)b * seq;  // first token of this sequence
    long long prow = (((long long)b * heads + h) * seq + i) * seq;  // probs row, = mask index

    for (int c = threadIdx.x; c < d; c += blockDim.x) qi[c] = q[(tok0 + i) * hid + h * d + c];
    __syncthreads();  // every thread reads the whole q row

    float mx = -f32_inf();
    for (int j = threadIdx.x; j < seq; j += blockDim.x) {
        const float* kj = k + (tok0 + j) * hid + h * d;
        float dot = 0.0f;
        for (int c = 0; c < d; c++) dot += qi[c] * kj[c];
        float s = dot * scale;
        if (mask[tok0 + j] == 0) s += f32_lowest();
        row[j] = s;
        mx = fmaxf(mx, s);
    }
    mx = block_max(mx, red);

    float sum = 0.0f;
    for (int j = threadIdx.x; j < seq; j += blockDim.x) {
        float e = expf(row[j] - mx);
        row[j] = e;
        sum += e;
    }
    sum = block_sum(sum, red);

    for (int j = threadIdx.x; j < seq; j += blockDim.x) {
        float p = st(row[j] / sum, store);
        probs[prow + j] = p;
        if (dropout) {
            p = st(p * dropout_mult(prow + j, seed, stream, threshold, dscale), store);
            probs_drop[prow + j] = p;
        }
        row[j] = p;
    }
    __syncthreads();  // ctx reads every key's probability

    for (int c = threadIdx.x; c < d; c += blockDim.x) {
        float acc = 0.0f;
        for (int j = 0; j < seq; j++) acc += row[j] * v[(tok0 + j) * hid + h * d + c];
        ctx[(tok0 + i) * hid + h * d + c] = st(acc, store);
    }
}

// Backward, per query row i: dp_j = dctx_i · v_j (with dropout: 0 where pd_ij == 0, else
// dp_j · dscale — the forward's mask read back from probs_drop); the softmax backward
// ds_ij = p_ij (dp_j − Σ_j dp_j p_ij), saved to `ds` for the second kernel; dq_i = scale · ds_i · k.
// `pd` is probs_drop, or probs without dropout.
//
// Dynamic shared memory: (head_dim + seq) floats.
extern "C" __global__ void attention_bwd_rows(float* dq, float* ds, const float* dctx,
                                              const float* k, const float* v, const float* probs,
                                              const float* pd, int seq, int heads, int head_dim,
                                              float scale, int dropout, float dscale, int store) {
    DYN_SHARED(float, smem);
    __shared__ float red[32];
    float* gi = smem;              // dctx_i, this head's slice
    float* row = smem + head_dim;  // dp, then ds
    int i = blockIdx.x, h = blockIdx.y, b = blockIdx.z;
    int d = head_dim;
    long long hid = (long long)heads * head_dim;
    long long tok0 = (long long)b * seq;
    long long prow = (((long long)b * heads + h) * seq + i) * seq;

    for (int c = threadIdx.x; c < d; c += blockDim.x) gi[c] = dctx[(tok0 + i) * hid + h * d + c];
    __syncthreads();  // every thread reads the whole dctx row

    float dot = 0.0f;
    for (int j = threadIdx.x; j < seq; j += blockDim.x) {
        const float* vj = v + (tok0 + j) * hid + h * d;
        float dp = 0.0f;
        for (int c = 0; c < d; c++) dp += gi[c] * vj[c];
        if (dropout) dp = pd[prow + j] != 0.0f ? dp * dscale : 0.0f;
        row[j] = dp;
        dot += dp * probs[prow + j];
    }
    dot = block_sum(dot, red);

    for (int j = threadIdx.x; j < seq; j += blockDim.x) {
        float x = probs[prow + j] * (row[j] - dot);
        row[j] = x;
        ds[prow + j] = x;
    }
    __syncthreads();  // dq reads every key's ds

    for (int c = threadIdx.x; c < d; c += blockDim.x) {
        float acc = 0.0f;
        for (int j = 0; j < seq; j++) acc += row[j] * k[(tok0 + j) * hid + h * d + c];
        dq[(tok0 + i) * hid + h * d + c] = st(scale * acc, store);
    }
}

// Backward, per key row j (after attention_bwd_rows wrote ds): dk_j = scale · Σ_i ds_ij q_i and
// dv_j = Σ_i pd_ij dctx_i, summed over i in order. A key row needs column j of ds and pd, which
// the block gathers into shared memory once; threads then run over head_dim.
//
// Dynamic shared memory: 2 * seq floats.
extern "C" __global__ void attention_bwd_cols(float* dk, float* dv, const float* ds,
                                              const float* dctx, const float* q, const float* pd,
                                              int seq, int heads, int head_dim, float scale,
                                              int store) {
    DYN_SHARED(float, smem);
    float* dscol = smem;      // ds_ij over i
    float* pdcol = smem + seq;  // pd_ij over i
    int j = blockIdx.x, h = blockIdx.y, b = blockIdx.z;
    int d = head_dim;
    long long hid = (long long)heads * head_dim;
    long long tok0 = (long long)b * seq;
    long long head0 = ((long long)b * heads + h) * seq * seq;  // this head's [seq, seq] block

    for (int i = threadIdx.x; i < seq; i += blockDim.x) {
        dscol[i] = ds[head0 + (long long)i * seq + j];
        pdcol[i] = pd[head0 + (long long)i * seq + j];
    }
    __syncthreads();  // every thread reads the whole columns

    for (int c = threadIdx.x; c < d; c += blockDim.x) {
        float gk = 0.0f, gv = 0.0f;
        for (int i = 0; i < seq; i++) {
            long long at = (tok0 + i) * hid + h * d + c;
            gk += dscol[i] * q[at];
            gv += pdcol[i] * dctx[at];
        }
        dk[(tok0 + j) * hid + h * d + c] = st(scale * gk, store);
        dv[(tok0 + j) * hid + h * d + c] = st(gv, store);
    }
}
