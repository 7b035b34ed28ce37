// LayerNorm over the last dimension, forward and backward. The semantics are the CPU backend's
// (runtime/src/backend/cpu.rs, `layernorm_fwd` / `layernorm_bwd`): biased variance, eps inside the
// square root, the row's mean and 1/std saved (fp32, not rounded to the storage dtype).
//
// Precision: the row statistics are summed in double, as the CPU does (two passes: the mean, then
// the squared deviations from it). Only the order of the additions differs (a lane's strided
// loop, then the warp's butterfly), an error near 1e-16 relative, far below an f32 ulp; so the
// saved mean/rstd, the normalized values and the backward's row means come out as the CPU's f32 values
// except in the rare case where the exact value lies within ~1e-16 of an f32 rounding boundary.
// That keeps the backward's dw/db — which are recomputed from the saved mean/rstd — in bit
// agreement with the CPU too. The cost is a few double operations per element, on a kernel that is
// bound by memory traffic. (In f32 the statistics would be off by about an ulp, and every value
// downstream by as much.)
#include "common.cuh"

// Forward and dinp take one warp per row (a block of BLOCK threads takes BLOCK / 32 rows); the
// row's sums are the warp's butterfly (warp_sum_d), with no barrier. (One block per row,
// reducing through shared memory and three barriers twice, took 22 µs a call on an H200 for
// BERT-base's 4096 × 768: docs/cuda.md, "Performance".) Lane l takes the columns
// k · LN_SPAN + l · VEC + u (u < VEC) for k = 0, 1, …: VEC consecutive columns per 256.
//
// The vectorised path (common.cuh, VEC) holds a row's values in registers between its passes,
// as the words ld_words loaded (a 16-bit element is half a register until it is used), for rows
// of at most LN_CHUNKS · LN_SPAN columns, a multiple of VEC, with the activations of the storage
// dtype (an instantiation per dtype); w and b, loaded once per VEC columns, keep their run-time
// type (ldv_rt). Other rows take the generic path, which loads element by element through
// `ld` (and again in each pass) in the same order, so the same bits. The kernels that take only
// the vectorised path of a 16-bit store (bias_dropout_add_layernorm, layernorm_bwd_dinp16) are
// launched where the host has checked it applies, and hold at most 64 registers, so that a
// BERT-base batch's rows are one wave.
#define LN_SPAN (32 * VEC)
#define LN_CHUNKS 4

// A row's vectorised path applies (`acts`: the activations' types are all the storage dtype).
__device__ __forceinline__ bool ln_vec(int cols, bool acts) {
    return acts && cols % VEC == 0 && cols <= LN_CHUNKS * LN_SPAN;
}

// The dropout mask of a lane's elements of row r, bit k · VEC + u for column
// k · LN_SPAN + lane · VEC + u (the dropout kernel's Philox blocks of elements r · cols + c):
// drawn in a rolled loop, the generator's code once rather than once per chunk.
__device__ __forceinline__ unsigned ln_row_mask(long long r, int cols, int lane, DropKey key,
                                                unsigned threshold) {
    unsigned kept = 0;
    NO_UNROLL
    for (int k = 0; k < LN_CHUNKS; k++) {
        int c = k * LN_SPAN + lane * VEC;
        if (c >= cols) break;
        NO_UNROLL
        for (int h = 0; h < VEC / 4; h++) {
            unsigned long long blk = (unsigned long long)(r * cols + c) / 4 + h;
            kept |= dropout_keep4(blk, key.seed, key.stream, threshold) << (k * VEC + 4 * h);
        }
    }
    return kept;
}

// out = xhat · w + b rounded to `store`, xhat = (x − mean) · rstd computed in double and then
// rounded to f32, as the CPU computes it.
// w and b are typed buffers (the model's parameters), as inp and out.
// The row's values are xw (ld_words' words of the lane's columns).
template <int T>
__device__ __forceinline__ void layernorm_row_v(const unsigned xw[LN_CHUNKS][VEC], void* out,
                                                float* mean, float* rstd, const void* w,
                                                const void* b, int wb_t, long long r, int cols,
                                                float eps, int lane) {
    double s = 0.0;
    UNROLL
    for (int k = 0; k < LN_CHUNKS; k++) {
        if (k * LN_SPAN + lane * VEC < cols) {
            UNROLL
            for (int u = 0; u < VEC; u++) s += (double)unpack<T>(xw[k], u);
        }
    }
    double m = warp_sum_d(s) / cols;
    // Squared deviations from the mean, which do not cancel as E[x²] − mean² would.
    double v = 0.0;
    UNROLL
    for (int k = 0; k < LN_CHUNKS; k++) {
        if (k * LN_SPAN + lane * VEC < cols) {
            UNROLL
            for (int u = 0; u < VEC; u++) {
                double d = (double)unpack<T>(xw[k], u) - m;
                v += d * d;
            }
        }
    }
    double var = warp_sum_d(v) / cols;
    double rs = 1.0 / sqrt(var + (double)eps);
    UNROLL
    for (int k = 0; k < LN_CHUNKS; k++) {
        int c = k * LN_SPAN + lane * VEC;
        if (c < cols) {
            float wv[VEC], bv[VEC], y[VEC];
            ldv_rt(wv, w, c, wb_t);
            ldv_rt(bv, b, c, wb_t);
            UNROLL
            for (int u = 0; u < VEC; u++) {
                float xhat = (float)(((double)unpack<T>(xw[k], u) - m) * rs);
                y[u] = st(op_add(op_mul(xhat, wv[u]), bv[u]), T);
            }
            stv<T>(out, r * cols + c, y);
        }
    }
    if (lane == 0) {
        mean[r] = (float)m;
        rstd[r] = (float)rs;
    }
}

template <int T>
__device__ __forceinline__ void layernorm_fwd_v(void* out, float* mean, float* rstd,
                                                const void* inp, const void* w, const void* b,
                                                int wb_t, long long r, int cols, float eps,
                                                int lane) {
    unsigned xw[LN_CHUNKS][VEC];
    UNROLL
    for (int k = 0; k < LN_CHUNKS; k++) {
        int c = k * LN_SPAN + lane * VEC;
        if (c < cols) ld_words<T>(xw[k], inp, r * cols + c);
    }
    layernorm_row_v<T>(xw, out, mean, rstd, w, b, wb_t, r, cols, eps, lane);
}

extern "C" __global__ void layernorm_fwd(void* out, int out_t, float* mean, float* rstd,
                                         const void* inp, int inp_t, const void* w,
                                         const void* b, int wb_t, int rows, int cols, float eps,
                                         int store) {
    GRID_WAIT();
    long long r = (long long)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (r >= rows) return;  // a whole warp leaves together: the shuffles below stay full
    int lane = threadIdx.x & 31;
    if (ln_vec(cols, out_t == store && inp_t == store) && aligned16(out) && aligned16(inp) &&
        aligned16(w) && aligned16(b)) {
        BY_TYPE(store, layernorm_fwd_v, out, mean, rstd, inp, w, b, wb_t, r, cols, eps, lane);
        return;
    }
    // Lane `lane`'s columns, in the vectorised path's order.
#define each_col(c)                                                     \
    for (int k0 = lane * VEC; k0 < cols; k0 += LN_SPAN)                 \
        for (int c = k0; c < k0 + VEC && c < cols; c++)
#define x(c) ld(inp, r * cols + (c), inp_t)

    double s = 0.0;
    each_col(c) s += (double)x(c);
    double m = warp_sum_d(s) / cols;

    // Second pass (the row is re-read, from cache).
    double v = 0.0;
    each_col(c) {
        double d = (double)x(c) - m;
        v += d * d;
    }
    double var = warp_sum_d(v) / cols;
    double rs = 1.0 / sqrt(var + (double)eps);

    each_col(c) {
        float xhat = (float)(((double)x(c) - m) * rs);
        // op_add/op_mul: NVRTC would fuse this into an FMA the CPU does not make (1 ulp on
        // about 3% of fp32 values).
        float y = op_add(op_mul(xhat, ld(w, c, wb_t)), ld(b, c, wb_t));
        sto(out, r * cols + c, st(y, store), out_t);
    }
    if (lane == 0) {
        mean[r] = (float)m;
        rstd[r] = (float)rs;
    }
#undef x
}

// LayerNorm's forward on a residual branch's sum, LN(residual + dropout(res + bias)) with `res`
// a linear layer's output (Backend::bias_dropout_add_layernorm): res = st(st(st(res + bias) ·
// mask) + residual), elementwise.cu's bias_dropout_add per element (its Philox blocks, its
// roundings), stored for the backward and kept in registers for layernorm_fwd's row: one pass
// where the two kernels read and wrote res, then read it again. The vectorised path's buffers
// only, of a 16-bit storage dtype (the host launches the two kernels otherwise; an f32 row would
// hold twice the registers), so the two kernels' bits.
template <int T>
__device__ __forceinline__ void bias_dropout_add_layernorm_v(
    void* res, const void* bias, const void* residual, void* out, float* mean, float* rstd,
    const void* w, const void* b, int p_t, long long r, int cols, float eps, int drop,
    DropKey key, unsigned threshold, float scale, int lane) {
    unsigned xw[LN_CHUNKS][VEC], rw[LN_CHUNKS][VEC];
    UNROLL
    for (int k = 0; k < LN_CHUNKS; k++) {
        int c = k * LN_SPAN + lane * VEC;
        if (c < cols) {
            ld_words<T>(xw[k], res, r * cols + c);
            ld_words<T>(rw[k], residual, r * cols + c);
        }
    }
    // The row's dropout mask, drawn while the loads are in flight. Without dropout every
    // element is kept and multiplied by 1, which changes no bit of a rounded value: one body for
    // both (a branch per element had the compiler copy the row's code per case).
    unsigned kept = drop ? ln_row_mask(r, cols, lane, key, threshold) : ~0u;
    float keep_scale = drop ? scale : 1.0f;
    UNROLL
    for (int k = 0; k < LN_CHUNKS; k++) {
        int c = k * LN_SPAN + lane * VEC;
        if (c < cols) {
            float bv[VEC], v[VEC];
            ldv_rt(bv, bias, c, p_t);
            UNROLL
            for (int u = 0; u < VEC; u++) {
                float x = st(unpack<T>(xw[k], u) + bv[u], T);
                x = st(op_mul(x, (kept >> (k * VEC + u)) & 1u ? keep_scale : 0.0f), T);
                v[u] = st(x + unpack<T>(rw[k], u), T);
            }
            pack_words<T>(xw[k], v);
            st_words<T>(res, r * cols + c, xw[k]);
        }
    }
    layernorm_row_v<T>(xw, out, mean, rstd, w, b, p_t, r, cols, eps, lane);
}

// `store` a 16-bit dtype; every buffer 16-byte aligned, of the storage dtype but the parameters
// (bias, w, b: of type p_t); cols a multiple of VEC and at most LN_CHUNKS · LN_SPAN
// (kernels/layernorm.rs checks all of it).
//
// At most 64 registers a thread (four blocks of BLOCK an SM, 32 warps): BERT-base's 4096 rows are
// then one wave of the H200's 132 SMs (4224 warps) instead of 1.2 (ptxas gives it 66 without
// the bound, 64 with it, no spills). The bound is declared on this prototype, where the kernel
// name parsers (kernels/mod.rs, the emulator's build.rs, scripts/check-kernels.sh) do not look.
extern "C" __global__ __launch_bounds__(BLOCK, 4) void
bias_dropout_add_layernorm(void* res, const void* bias, const void* residual, void* out,
                           float* mean, float* rstd, const void* w, const void* b, int p_t,
                           int rows, int cols, float eps, int drop, const unsigned* key,
                           unsigned long long site, unsigned threshold, float scale, int store);
extern "C" __global__ void bias_dropout_add_layernorm(void* res, const void* bias,
                                                      const void* residual, void* out,
                                                      float* mean, float* rstd, const void* w,
                                                      const void* b, int p_t, int rows,
                                                      int cols, float eps, int drop,
                                                      const unsigned* key,
                                                      unsigned long long site,
                                                      unsigned threshold, float scale,
                                                      int store) {
    GRID_WAIT();
    long long r = (long long)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (r >= rows) return;  // a whole warp leaves together
    int lane = threadIdx.x & 31;
    DropKey k = {0, 0};
    if (drop) k = drop_key(key, site);
    if (store == STORE_F16)
        bias_dropout_add_layernorm_v<STORE_F16>(res, bias, residual, out, mean, rstd, w, b, p_t,
                                                r, cols, eps, drop, k, threshold, scale, lane);
    else
        bias_dropout_add_layernorm_v<STORE_BF16>(res, bias, residual, out, mean, rstd, w, b, p_t,
                                                 r, cols, eps, drop, k, threshold, scale, lane);
}

// Backward, dinp (overwritten): one warp per row, as the forward. With xhat = (x − mean) · rstd and
// dxhat = dout · w, both in f32 from the saved statistics,
//   dinp = rstd · (dxhat − mean(dxhat) − xhat · mean(dxhat · xhat)),
// the two row means summed in double (as the CPU) and rounded to f32.
//
// With `keep` (not null) the residual branch's split in the same pass (Backend::
// layernorm_bwd_split): keep = dinp, and dinp = dinp dropped when `dropout` (the dropout kernel's
// mask of element r * cols + c, rounded), where a copy and a dropout pass would follow.
//
// dinp, dout, inp, w and keep are typed buffers (common.cuh's ld, sto).
template <int T>
__device__ __forceinline__ void layernorm_bwd_dinp_v(void* dinp, const void* dout,
                                                     const void* inp, const void* w, int w_t,
                                                     float m,
                                                     float rs, long long r, int cols, void* keep,
                                                     int dropout, DropKey key,
                                                     unsigned threshold, float dscale, int lane) {
    unsigned xw[LN_CHUNKS][VEC], gw[LN_CHUNKS][VEC];
    UNROLL
    for (int k = 0; k < LN_CHUNKS; k++) {
        int c = k * LN_SPAN + lane * VEC;
        if (c < cols) {
            ld_words<T>(xw[k], inp, r * cols + c);
            ld_words<T>(gw[k], dout, r * cols + c);
        }
    }
    double sd = 0.0, sdx = 0.0;
    UNROLL
    for (int k = 0; k < LN_CHUNKS; k++) {
        int c = k * LN_SPAN + lane * VEC;
        if (c < cols) {
            float wv[VEC];
            ldv_rt(wv, w, c, w_t);
            UNROLL
            for (int u = 0; u < VEC; u++) {
                float xhat = (unpack<T>(xw[k], u) - m) * rs;
                float dxhat = unpack<T>(gw[k], u) * wv[u];
                sd += (double)dxhat;
                sdx += (double)(dxhat * xhat);
            }
        }
    }
    float mean_d = (float)(warp_sum_d(sd) / cols);
    float mean_dx = (float)(warp_sum_d(sdx) / cols);
    unsigned kept = keep && dropout ? ln_row_mask(r, cols, lane, key, threshold) : 0;
    UNROLL
    for (int k = 0; k < LN_CHUNKS; k++) {
        int c = k * LN_SPAN + lane * VEC;
        if (c < cols) {
            float wv[VEC], d[VEC];
            ldv_rt(wv, w, c, w_t);
            UNROLL
            for (int u = 0; u < VEC; u++) {
                float xhat = (unpack<T>(xw[k], u) - m) * rs;
                float dx = op_sub(op_sub(op_mul(unpack<T>(gw[k], u), wv[u]), mean_d),
                                  op_mul(xhat, mean_dx));
                d[u] = st(op_mul(rs, dx), T);
            }
            long long i = r * cols + c;
            if (keep) {
                stv<T>(keep, i, d);
                if (dropout) {
                    UNROLL
                    for (int u = 0; u < VEC; u++)
                        d[u] = st(d[u] * ((kept >> (k * VEC + u)) & 1u ? dscale : 0.0f), T);
                }
            }
            stv<T>(dinp, i, d);
        }
    }
}

extern "C" __global__ void layernorm_bwd_dinp(void* dinp, int dinp_t, const void* dout,
                                              int dout_t, const void* inp, int inp_t,
                                              const void* w, int w_t, const float* mean,
                                              const float* rstd, int rows, int cols, int store,
                                              void* keep, int keep_t, int dropout,
                                              const unsigned* key, unsigned long long site,
                                              unsigned threshold, float dscale) {
    GRID_WAIT();
    long long r = (long long)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (r >= rows) return;  // a whole warp leaves together
    int lane = threadIdx.x & 31;
    float m = mean[r], rs = rstd[r];
    DropKey k = {0, 0};
    if (keep && dropout) k = drop_key(key, site);
    // A 16-bit store's vectorised path is layernorm_bwd_dinp16's (below).
    bool acts = store == STORE_F32 && dinp_t == store && dout_t == store && inp_t == store &&
                (!keep || keep_t == store);
    if (ln_vec(cols, acts) && aligned16(dinp) && aligned16(dout) && aligned16(inp) &&
        aligned16(w) && aligned16(keep)) {
        layernorm_bwd_dinp_v<STORE_F32>(dinp, dout, inp, w, w_t, m, rs, r, cols, keep, dropout, k,
                                        threshold, dscale, lane);
        return;
    }
#define x(c) ld(inp, r * cols + (c), inp_t)
#define g(c) ld(dout, r * cols + (c), dout_t)
    double sd = 0.0, sdx = 0.0;
    each_col(c) {
        float xhat = (x(c) - m) * rs;
        float dxhat = g(c) * ld(w, c, w_t);
        sd += (double)dxhat;
        sdx += (double)(dxhat * xhat);
    }
    float mean_d = (float)(warp_sum_d(sd) / cols);
    float mean_dx = (float)(warp_sum_d(sdx) / cols);

    each_col(c) {
        float xhat = (x(c) - m) * rs;
        // The CPU's rs · (g·w − mean_d − xhat·mean_dx), unfused (op_*: no FMA).
        float dx = op_sub(op_sub(op_mul(g(c), ld(w, c, w_t)), mean_d), op_mul(xhat, mean_dx));
        float d = st(op_mul(rs, dx), store);
        if (keep) {
            sto(keep, r * cols + c, d, keep_t);
            if (dropout)
                d = st(d * dropout_mult(r * cols + c, k.seed, k.stream, threshold, dscale), store);
        }
        sto(dinp, r * cols + c, d, dinp_t);
    }
#undef g
#undef x
#undef each_col
}

// layernorm_bwd_dinp's vectorised path for a 16-bit store, where the host has checked that it
// applies (kernels/layernorm.rs: every activation buffer of the storage dtype and 16-byte aligned,
// as w; cols a multiple of VEC and at most LN_CHUNKS · LN_SPAN); the same arguments. A kernel of
// its own for its registers: layernorm_bwd_dinp with every path takes 117, so an SM holds two
// blocks (16 warps) and BERT-base's 4096 rows take two waves of the H200's 132 SMs; this path
// alone takes 72, and 64 under the bound below (no spills): four blocks, one wave.
extern "C" __global__ __launch_bounds__(BLOCK, 4) void
layernorm_bwd_dinp16(void* dinp, int dinp_t, const void* dout, int dout_t, const void* inp,
                     int inp_t, const void* w, int w_t, const float* mean, const float* rstd,
                     int rows, int cols, int store, void* keep, int keep_t, int dropout,
                     const unsigned* key, unsigned long long site, unsigned threshold,
                     float dscale);
extern "C" __global__ void layernorm_bwd_dinp16(void* dinp, int dinp_t, const void* dout,
                                                int dout_t, const void* inp, int inp_t,
                                                const void* w, int w_t, const float* mean,
                                                const float* rstd, int rows, int cols, int store,
                                                void* keep, int keep_t, int dropout,
                                                const unsigned* key, unsigned long long site,
                                                unsigned threshold, float dscale) {
    GRID_WAIT();
    long long r = (long long)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (r >= rows) return;  // a whole warp leaves together
    int lane = threadIdx.x & 31;
    float m = mean[r], rs = rstd[r];
    DropKey k = {0, 0};
    if (keep && dropout) k = drop_key(key, site);
    if (store == STORE_F16)
        layernorm_bwd_dinp_v<STORE_F16>(dinp, dout, inp, w, w_t, m, rs, r, cols, keep, dropout,
                                        k, threshold, dscale, lane);
    else
        layernorm_bwd_dinp_v<STORE_BF16>(dinp, dout, inp, w, w_t, m, rs, r, cols, keep, dropout,
                                         k, threshold, dscale, lane);
}

// Backward, dw += Σ_r dout · xhat and db += Σ_r dout, rounded, in Backend::bias_grad's order
// (chunks of `chunk` rows each summed from zero, then the chunks' sums added in order, no float
// atomics), as bias_grad (elementwise.cu) does it: a grid of (columns, chunks) writing each
// chunk's sums to pw and pb, then the last block of each column (`last_of_column`) adding them
// to dw and db. op_add/op_mul keep NVRTC from fusing the product into an FMA the CPU does not
// make. With `dl` (Backend::layernorm_bwd_split_bias_grad), also dl += Σ_r branch, the bias
// gradient of the linear below the LayerNorm (`branch`, of dout's type, is its output gradient:
// the split's dropped dinp), as bias_grad sums it (column_sum, each chunk from zero in row
// order; then the chunks in order), where a bias_grad launch read it back after this one.
#define DWDB_AHEAD 32
template <int TI, int TD>
__device__ __forceinline__ void layernorm_bwd_dwdb_t(float* dw, float* db, float* pw, float* pb,
                                                     unsigned* done, const void* dout,
                                                     const void* inp, const float* mean,
                                                     const float* rstd, int rows, int cols,
                                                     int chunk, int chunks, float* dl,
                                                     float* pl, const void* branch,
                                                     int store) {
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    int r0 = blockIdx.y * chunk;
    int r1 = c < cols ? min(rows, r0 + chunk) : r0;  // a thread past the last column adds nothing
    float aw = 0.0f, ab = 0.0f;
    int r = r0;
    // DWDB_AHEAD rows' loads first, then their additions in row order (common.cuh,
    // ROWS_AHEAD): two round trips to memory for a chunk of 64 rows, where 8 rows ahead took 8
    // and left the 192 blocks of BERT-base's 4096 × 768 waiting on them (docs/cuda.md,
    // "Performance").
    for (; r + DWDB_AHEAD <= r1; r += DWDB_AHEAD) {
        float x[DWDB_AHEAD], g[DWDB_AHEAD];
        UNROLL
        for (int u = 0; u < DWDB_AHEAD; u++) {
            long long at = (long long)(r + u) * cols + c;
            x[u] = (ldt<TI>(inp, at) - mean[r + u]) * rstd[r + u];
            g[u] = ldt<TD>(dout, at);
        }
        UNROLL
        for (int u = 0; u < DWDB_AHEAD; u++) {
            aw = op_add(aw, op_mul(g[u], x[u]));
            ab += g[u];
        }
    }
    for (; r < r1; r++) {
        long long at = (long long)r * cols + c;
        float xhat = (ldt<TI>(inp, at) - mean[r]) * rstd[r];
        float g = ldt<TD>(dout, at);
        aw = op_add(aw, op_mul(g, xhat));
        ab += g;
    }
    long long out = (long long)blockIdx.y * cols + c;
    if (c < cols) {
        pw[out] = aw;
        pb[out] = ab;
        // After dw's and db's loads, not among them: bias_grad's loads and registers.
        if (dl) pl[out] = column_sum<TD, 32>(0.0f, branch, r0, r1, cols, c);
    }
    if (last_of_column(done) && c < cols) {
        dw[c] = st(chunk_sums(dw[c], pw, chunks, cols, c), store);
        db[c] = st(chunk_sums(db[c], pb, chunks, cols, c), store);
        if (dl) dl[c] = st(chunk_sums(dl[c], pl, chunks, cols, c), store);
    }
}
// The dout types for one inp type (BY_TYPE takes one template parameter).
template <int TI>
__device__ __forceinline__ void layernorm_bwd_dwdb_i(float* dw, float* db, float* pw, float* pb,
                                                     unsigned* done, const void* dout,
                                                     int dout_t, const void* inp,
                                                     const float* mean, const float* rstd,
                                                     int rows, int cols, int chunk, int chunks,
                                                     float* dl, float* pl, const void* branch,
                                                     int store) {
#define DWDB(TD)                                                                                  \
    layernorm_bwd_dwdb_t<TI, TD>(dw, db, pw, pb, done, dout, inp, mean, rstd, rows, cols, chunk, \
                                 chunks, dl, pl, branch, store)
    if (dout_t == STORE_F32)
        DWDB(STORE_F32);
    else if (dout_t == STORE_F16)
        DWDB(STORE_F16);
    else
        DWDB(STORE_BF16);
#undef DWDB
}
// dl null: no bias gradient (pl and branch unused).
extern "C" __global__ void layernorm_bwd_dwdb(float* dw, float* db, float* pw, float* pb,
                                              unsigned* done, const void* dout, int dout_t,
                                              const void* inp, int inp_t, const float* mean,
                                              const float* rstd, int rows, int cols, int chunk,
                                              int chunks, float* dl, float* pl,
                                              const void* branch, int store) {
    GRID_WAIT();
    BY_TYPE(inp_t, layernorm_bwd_dwdb_i, dw, db, pw, pb, done, dout, dout_t, inp, mean, rstd,
            rows, cols, chunk, chunks, dl, pl, branch, store);
}
