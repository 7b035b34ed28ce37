// Fused multi-head self-attention, forward and backward, with HF's additive padding mask and
// attention-probability dropout. The semantics are the CPU backend's (runtime/src/backend/cpu.rs,
// `attn_fwd_one` / `attn_bwd_one`):
//
//   q, k, v, ctx, dq, dk, dv, dctx: [batch, seq, heads * head_dim] row-major, head h in columns
//                                   h*head_dim .. (h+1)*head_dim of each token's row;
//   probs, probs_drop, ds:          [batch, heads, seq, seq].
//
// Tiled: a block takes `rows` query rows of one head (grid (ceil(seq / rows), heads, batch)), or
// in the backward's second kernel `rows` key rows. The keys (values) stream through shared memory
// `tile` rows at a time, loaded once per block with coalesced reads and used by every row of
// the block, so a head's K and V are read seq / rows times from memory rather than seq times;
// the block's score rows stay in shared memory (rows × seq floats). Each output element is one
// thread's sum over keys (or queries) in order, each dot product one thread's sum over head_dim
// in order, each softmax row one warp's (a fixed butterfly): no atomics, the same inputs give the
// same bits. Launch shapes: runtime/src/backend/kernels/attention.rs.
#include "common.cuh"

// Output elements a thread accumulates in registers per pass over the keys; a block whose rows
// have more outputs than ATTN_OUT × blockDim.x makes several passes.
#define ATTN_OUT 8

// Loads `n` rows of one head (head_dim floats each, a token's row stride `hid`) starting at token
// `tok` into `dst` (n rows of `ld` floats), the block's threads striding over the elements.
__device__ __forceinline__ void load_rows(float* dst, int ld, const float* src, long long tok,
                                          int n, int d, long long hid, int h) {
    for (int e = threadIdx.x; e < n * d; e += blockDim.x) {
        int r = e / d, c = e % d;
        dst[r * ld + c] = src[(tok + r) * hid + h * d + c];
    }
}

// The key tile's row stride: one float of padding, so that the threads of a warp, each taking
// its own key's row in a dot product, read 32 different shared-memory banks (a stride of
// head_dim = 64 would put them all in one).
__device__ __forceinline__ int tile_ld(int d) { return d + 1; }

// out[r][c] (r < nr, c < d) = Σ_j rowsm[r * seq + j] · src_j[c] over every key j in order, the
// keys' rows of `src` streamed through `tile` (`kt` rows at a time); written as st(mult · sum) at
// token i0 + r. Every thread of the block calls it (it synchronises).
__device__ __forceinline__ void rows_times_keys(float* out, const float* rowsm, const float* src,
                                                float* tile, int kt, long long tok0, int i0,
                                                int nr, int seq, int d, long long hid, int h,
                                                float mult, int store) {
    for (int base = 0; base < nr * d; base += ATTN_OUT * blockDim.x) {
        float acc[ATTN_OUT];
UNROLL
        for (int t = 0; t < ATTN_OUT; t++) acc[t] = 0.0f;
        for (int j0 = 0; j0 < seq; j0 += kt) {
            int nk = min(kt, seq - j0);
            __syncthreads();  // the previous tile (or the rows' last writes) is done with
            load_rows(tile, tile_ld(d), src, tok0 + j0, nk, d, hid, h);
            __syncthreads();  // every thread reads the whole tile
UNROLL
            for (int t = 0; t < ATTN_OUT; t++) {
                int e = base + t * blockDim.x + threadIdx.x;
                if (e < nr * d) {
                    int r = e / d, c = e % d;
                    const float* p = rowsm + (long long)r * seq + j0;
                    for (int jj = 0; jj < nk; jj++) acc[t] += p[jj] * tile[jj * tile_ld(d) + c];
                }
            }
        }
UNROLL
        for (int t = 0; t < ATTN_OUT; t++) {
            int e = base + t * blockDim.x + threadIdx.x;
            if (e < nr * d) {
                int r = e / d, c = e % d;
                out[(tok0 + i0 + r) * hid + h * d + c] = st(mult * acc[t], store);
            }
        }
    }
}

// rowsm[r * seq + j] = f(r, j, q_r · k_j) for r < nr and every key j, q_r the rows in `qs`
// (nr × d), the keys streamed through `tile` (`kt` rows at a time): the scores, or dctx_r · v_j
// in the backward.
// `mode` 0: (dot · scale) + f32_lowest() for a masked key (added, not replaced: a fully masked
// row then softmaxes to a finite uniform row, as in PyTorch). `mode` 1: the dropout-masked dp
// (0 where pd_ij == 0, else dp · dscale — the forward's mask read back from probs_drop).
__device__ __forceinline__ void rows_dot_keys(float* rowsm, const float* qs, const float* src,
                                              float* tile, int kt, long long tok0,
                                              long long prow0, int nr, int seq, int d,
                                              long long hid, int h, int mode, float scale,
                                              const unsigned* mask, const float* pd, int dropout,
                                              float dscale) {
    for (int j0 = 0; j0 < seq; j0 += kt) {
        int nk = min(kt, seq - j0);
        __syncthreads();  // the previous tile is done with (and `qs` loaded, the first time)
        load_rows(tile, tile_ld(d), src, tok0 + j0, nk, d, hid, h);
        __syncthreads();  // every thread reads the whole tile
        for (int e = threadIdx.x; e < nr * nk; e += blockDim.x) {
            int r = e / nk, jj = e % nk, j = j0 + jj;
            const float* a = qs + r * d;
            const float* b = tile + jj * tile_ld(d);
            float dot = 0.0f;
            for (int c = 0; c < d; c++) dot += a[c] * b[c];
            float x;
            if (mode == 0) {
                x = dot * scale;
                if (mask[tok0 + j] == 0) x += f32_lowest();
            } else {
                x = dot;
                if (dropout) x = pd[prow0 + (long long)r * seq + j] != 0.0f ? dot * dscale : 0.0f;
            }
            rowsm[(long long)r * seq + j] = x;
        }
    }
    __syncthreads();  // the rows are complete
}

// Forward. probs is the softmax of the scores rounded to `store`; with dropout (`dropout` != 0)
// probs_drop is probs times the mask multiplier of element (b*heads + h)*seq*seq + i*seq + j,
// rounded; ctx_i = used probs · v.
//
// Dynamic shared memory: rows * head_dim + kt * (head_dim + 1) + rows * seq floats.
extern "C" __global__ void attention_fwd(float* ctx, float* probs, float* probs_drop,
                                         const float* q, const float* k, const float* v,
                                         const unsigned* mask, int seq, int heads, int head_dim,
                                         float scale, int dropout, unsigned long long seed,
                                         unsigned long long stream, unsigned threshold,
                                         float dscale, int store, int rows, int kt) {
    DYN_SHARED(float, smem);
    int d = head_dim, h = blockIdx.y, b = blockIdx.z;
    int i0 = blockIdx.x * rows, nr = min(rows, seq - i0);
    float* qs = smem;                          // the block's query rows, nr × d
    float* tile = qs + rows * d;               // kt key (then value) rows
    float* sc = tile + kt * tile_ld(d);        // scores, then probabilities: nr × seq
    long long hid = (long long)heads * d;
    long long tok0 = (long long)b * seq;       // first token of this sequence
    long long prow0 = (((long long)b * heads + h) * seq + i0) * seq;  // probs row i0, = mask index

    load_rows(qs, d, q, tok0 + i0, nr, d, hid, h);
    rows_dot_keys(sc, qs, k, tile, kt, tok0, prow0, nr, seq, d, hid, h, 0, scale, mask, nullptr, 0,
                  1.0f);

    // One warp per row: max, Σ exp, then the rounded probabilities.
    int lane = threadIdx.x & 31, warps = blockDim.x >> 5;
    for (int r = threadIdx.x >> 5; r < nr; r += warps) {
        float* row = sc + (long long)r * seq;
        long long prow = prow0 + (long long)r * seq;
        float mx = -f32_inf();
        for (int j = lane; j < seq; j += 32) mx = fmaxf(mx, row[j]);
        mx = warp_max(mx);
        float sum = 0.0f;
        for (int j = lane; j < seq; j += 32) {
            float e = expf(row[j] - mx);
            row[j] = e;
            sum += e;
        }
        sum = warp_sum(sum);
        for (int j = lane; j < seq; j += 32) {
            float p = st(row[j] / sum, store);
            probs[prow + j] = p;
            if (dropout) {
                p = st(p * dropout_mult(prow + j, seed, stream, threshold, dscale), store);
                probs_drop[prow + j] = p;
            }
            row[j] = p;
        }
    }
    // (rows_times_keys synchronises before it reads the rows.)
    rows_times_keys(ctx, sc, v, tile, kt, tok0, i0, nr, seq, d, hid, h, 1.0f, store);
}

// Backward, per block of query rows i: dp_j = dctx_i · v_j (dropout-masked, see rows_dot_keys);
// the softmax backward ds_ij = p_ij (dp_j − Σ_j dp_j p_ij), saved to `ds` for the second kernel;
// dq_i = scale · ds_i · k. `pd` is probs_drop, or probs without dropout.
//
// Dynamic shared memory: rows * head_dim + kt * (head_dim + 1) + rows * seq floats.
extern "C" __global__ void attention_bwd_rows(float* dq, float* ds, const float* dctx,
                                              const float* k, const float* v, const float* probs,
                                              const float* pd, int seq, int heads, int head_dim,
                                              float scale, int dropout, float dscale, int store,
                                              int rows, int kt) {
    DYN_SHARED(float, smem);
    int d = head_dim, h = blockIdx.y, b = blockIdx.z;
    int i0 = blockIdx.x * rows, nr = min(rows, seq - i0);
    float* gs = smem;                          // the block's dctx rows, nr × d
    float* tile = gs + rows * d;               // kt value (then key) rows
    float* sc = tile + kt * tile_ld(d);        // dp, then ds: nr × seq
    long long hid = (long long)heads * d;
    long long tok0 = (long long)b * seq;
    long long prow0 = (((long long)b * heads + h) * seq + i0) * seq;

    load_rows(gs, d, dctx, tok0 + i0, nr, d, hid, h);
    rows_dot_keys(sc, gs, v, tile, kt, tok0, prow0, nr, seq, d, hid, h, 1, 1.0f, nullptr, pd,
                  dropout, dscale);

    int lane = threadIdx.x & 31, warps = blockDim.x >> 5;
    for (int r = threadIdx.x >> 5; r < nr; r += warps) {
        float* row = sc + (long long)r * seq;
        long long prow = prow0 + (long long)r * seq;
        float dot = 0.0f;
        for (int j = lane; j < seq; j += 32) dot += row[j] * probs[prow + j];
        dot = warp_sum(dot);
        for (int j = lane; j < seq; j += 32) {
            float x = probs[prow + j] * (row[j] - dot);
            row[j] = x;
            ds[prow + j] = x;
        }
    }
    rows_times_keys(dq, sc, k, tile, kt, tok0, i0, nr, seq, d, hid, h, scale, store);
}

// Backward, per block of `rows` key rows j (after attention_bwd_rows wrote ds):
// dk_j = scale · Σ_i ds_ij q_i and dv_j = Σ_i pd_ij dctx_i, summed over i in order. The queries
// stream through shared memory `kt` rows at a time, with the matching block of ds and pd.
//
// Dynamic shared memory: 2 * kt * (head_dim + rows) floats.
extern "C" __global__ void attention_bwd_cols(float* dk, float* dv, const float* ds,
                                              const float* dctx, const float* q, const float* pd,
                                              int seq, int heads, int head_dim, float scale,
                                              int store, int rows, int kt) {
    DYN_SHARED(float, smem);
    int d = head_dim, h = blockIdx.y, b = blockIdx.z;
    int j0 = blockIdx.x * rows, nc = min(rows, seq - j0);
    float* qt = smem;                          // kt query rows
    float* gt = qt + kt * d;                   // their dctx rows
    float* dst = gt + kt * d;                  // ds[i][j0 + jj], kt × rows
    float* pdt = dst + kt * rows;              // pd[i][j0 + jj]
    long long hid = (long long)heads * d;
    long long tok0 = (long long)b * seq;
    long long head0 = ((long long)b * heads + h) * seq * seq;  // this head's [seq, seq] block

    for (int base = 0; base < nc * d; base += ATTN_OUT * blockDim.x) {
        float gk[ATTN_OUT], gv[ATTN_OUT];
UNROLL
        for (int t = 0; t < ATTN_OUT; t++) gk[t] = gv[t] = 0.0f;
        for (int q0 = 0; q0 < seq; q0 += kt) {
            int nq = min(kt, seq - q0);
            __syncthreads();  // the previous tile is done with
            load_rows(qt, d, q, tok0 + q0, nq, d, hid, h);
            load_rows(gt, d, dctx, tok0 + q0, nq, d, hid, h);
            for (int e = threadIdx.x; e < nq * nc; e += blockDim.x) {
                int ii = e / nc, jj = e % nc;
                long long at = head0 + (long long)(q0 + ii) * seq + j0 + jj;
                dst[ii * rows + jj] = ds[at];
                pdt[ii * rows + jj] = pd[at];
            }
            __syncthreads();  // every thread reads the whole tile
UNROLL
            for (int t = 0; t < ATTN_OUT; t++) {
                int e = base + t * blockDim.x + threadIdx.x;
                if (e < nc * d) {
                    int jj = e / d, c = e % d;
                    for (int ii = 0; ii < nq; ii++) {
                        gk[t] += dst[ii * rows + jj] * qt[ii * d + c];
                        gv[t] += pdt[ii * rows + jj] * gt[ii * d + c];
                    }
                }
            }
        }
UNROLL
        for (int t = 0; t < ATTN_OUT; t++) {
            int e = base + t * blockDim.x + threadIdx.x;
            if (e < nc * d) {
                int jj = e / d, c = e % d;
                long long at = (tok0 + j0 + jj) * hid + h * d + c;
                dk[at] = st(scale * gk[t], store);
                dv[at] = st(gv[t], store);
            }
        }
    }
}
