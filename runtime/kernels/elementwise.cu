// Elementwise kernels: one thread per element, 1-D grid of BLOCK threads, but for the costly ones
// (add_bias, round_rows, bias_gelu, gelu_bwd, bias_dropout_add), whose threads take VEC
// consecutive elements each (common.cuh, VEC). Every kernel stores its result rounded to the
// storage dtype (`store`, see common.cuh), as the CPU backend does.
#include "common.cuh"

// acc[i] += x[i]
extern "C" __global__ void add_assign(float* acc, const float* x, int n, int store) {
    GRID_WAIT();
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) acc[i] = st(acc[i] + x[i], store);
}

// out[r, c] += bias[c] for a rows × cols matrix; with `item_rows` < rows, out is `rows /
// item_rows` such matrices one after another (Backend::bias_epilogue_items: attention's q, k
// and v) and matrix j's bias starts j · bias_stride elements into `bias`.
// out[r, c] = st(out[r, c] + bias[c]); with `first` a half dtype, out is a GEMM's unrounded
// output (Backend::bias_epilogue) and is rounded to it first, as round_rows would have: one pass
// instead of two. `out` may be a 16-bit buffer (a GEMM writing one rounded it already).
// The vectorised path (common.cuh, VEC): `out` of the storage dtype T, so already rounded to
// `first` (T, or f32: nothing).
__device__ __forceinline__ long long bias_at(long long i, int cols, int item_rows,
                                             unsigned long long bias_stride) {
    long long r = i <= 0x7fffffffLL ? (long long)((unsigned)i / (unsigned)cols) : i / cols;
    return r / item_rows * (long long)bias_stride + col_of(i, cols);
}
template <int T>
__device__ __forceinline__ void add_bias_v(void* out, const void* bias, int bias_t, int cols,
                                           int item_rows, unsigned long long bias_stride,
                                           long long i) {
    float v[VEC], b[VEC];
    ldv<T>(v, out, i);
    ldv_rt(b, bias, bias_at(i, cols, item_rows, bias_stride), bias_t);
    UNROLL
    for (int u = 0; u < VEC; u++) v[u] = st(v[u] + b[u], T);
    stv<T>(out, i, v);
}
extern "C" __global__ void add_bias(void* out, int out_t, const void* bias, int bias_t, int rows,
                                    int cols, int item_rows, unsigned long long bias_stride,
                                    int first, int store) {
    GRID_WAIT();
    long long i0 = ((long long)blockIdx.x * blockDim.x + threadIdx.x) * VEC;
    long long n = (long long)rows * cols;
    if (i0 >= n) return;
    if (out_t == store && (first == store || first == STORE_F32) && cols % VEC == 0 &&
        bias_stride % VEC == 0 && aligned16(out) && aligned16(bias)) {
        BY_TYPE(store, add_bias_v, out, bias, bias_t, cols, item_rows, bias_stride, i0);
        return;
    }
    NO_UNROLL
    for (long long i = i0; i < i0 + VEC && i < n; i++) {
        float b = ld(bias, bias_at(i, cols, item_rows, bias_stride), bias_t);
        sto(out, i, st(st(ld(out, i, out_t), first) + b, store), out_t);
    }
}

// dst[i] = src[i], each of its own type (common.cuh's ld, sto): a 16-bit buffer widened to f32
// (exact) for an f32 GEMM, or a GEMM's f32 result rounded into a 16-bit buffer (to nearest even,
// as `st`). Device::gemm_batched's conversions on a GPU.
extern "C" __global__ void convert(void* dst, int dst_t, const void* src, int src_t, int n) {
    GRID_WAIT();
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) sto(dst, i, ld(src, i, src_t), dst_t);
}

// db[c] += Σ_r dout[r, c], rounded, in Backend::bias_grad's order (backend/mod.rs) in one launch
// and no float atomics: a grid of (columns, chunks) where every chunk of every column runs at
// once. First part[k, c] = Σ dout[r, c] over chunk k's rows (`chunk` of them, the last one
// shorter), in row order from zero; then the last block of each column (`last_of_column`) adds
// the `chunks` sums to db in order and rounds: the CPU backend's additions in its order, so its
// bits. `rows` 0 is one chunk of no rows (a grid is never empty), whose sums are not added.
template <int T>
__device__ __forceinline__ void bias_grad_t(float* db, float* part, unsigned* done,
                                            const void* dout, int rows, int cols, int ld,
                                            int chunk, int chunks, int store) {
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    int r0 = blockIdx.y * chunk;
    int r1 = min(rows, r0 + chunk);
    if (c < cols) part[(long long)blockIdx.y * cols + c] = column_sum<T, 32>(0.0f, dout, r0, r1, ld, c);
    if (last_of_column(done) && c < cols) db[c] = st(chunk_sums(db[c], part, chunks, cols, c), store);
}
// dout's rows `ld` apart. Grid z: items (Backend::bias_grad_items: attention's q and v biases
// from the rows of dq, dk and dv), item z's dout starting z · dout_stride elements in and its db
// z · db_stride, each with its own chunk sums and counters.
extern "C" __global__ void bias_grad(float* db, float* part, unsigned* done, const void* dout,
                                     int dout_t, int rows, int cols, int ld, int chunk,
                                     int chunks, unsigned long long dout_stride,
                                     unsigned long long db_stride, int store) {
    GRID_WAIT();
    unsigned z = blockIdx.z;
    db += z * db_stride;
    part += (unsigned long long)z * chunks * cols;
    done += z * gridDim.x;
    dout = (const char*)dout + z * dout_stride * (dout_t == STORE_F32 ? 4 : 2);
    BY_TYPE(dout_t, bias_grad_t, db, part, done, dout, rows, cols, ld, chunk, chunks, store);
}

// Rounds rows × cols of a matrix with row stride ld to the storage dtype (after a cuBLAS GEMM,
// which writes fp32): VEC elements of a row a thread.
template <int S>
__device__ __forceinline__ void round_rows_v(float* x, long long at) {
    float v[VEC];
    ldv<STORE_F32>(v, x, at);
    UNROLL
    for (int u = 0; u < VEC; u++) v[u] = st(v[u], S);
    stv<STORE_F32>(x, at, v);
}
extern "C" __global__ void round_rows(float* x, int rows, int cols, int ld, int store) {
    GRID_WAIT();
    long long i0 = ((long long)blockIdx.x * blockDim.x + threadIdx.x) * VEC;
    long long n = (long long)rows * cols;
    if (i0 >= n) return;
    // i's row and column, in 32 bits when i fits (common.cuh, col_of).
    long long r = i0 <= 0x7fffffffLL ? (long long)((unsigned)i0 / (unsigned)cols) : i0 / cols;
    if (cols % VEC == 0 && ld % VEC == 0 && aligned16(x)) {
        BY_TYPE(store, round_rows_v, x, r * ld + (i0 - r * cols));
        return;
    }
    NO_UNROLL
    for (long long i = i0; i < i0 + VEC && i < n; i++) {
        r = i <= 0x7fffffffLL ? (long long)((unsigned)i / (unsigned)cols) : i / cols;
        long long at = r * ld + (i - r * cols);
        x[at] = st(x[at], store);
    }
}

// dst[r · ld_dst + c] = src[r · ld_src + c] for a rows × cols block, the elements' bits as
// they are: 4 bytes each when `wide`, else 2 (a 16-bit buffer). Gathers the [CLS] rows of a
// sequence-major matrix into a dense one, or scatters them back (Backend::copy_rows): one
// launch where a copy per row would be one per sequence.
extern "C" __global__ void copy_rows(void* dst, const void* src, int rows, int cols,
                                     int ld_dst, int ld_src, int wide) {
    GRID_WAIT();
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (long long)rows * cols) return;
    long long r = i / cols, c = i - r * cols;
    if (wide)
        ((unsigned*)dst)[r * ld_dst + c] = ((const unsigned*)src)[r * ld_src + c];
    else
        ((unsigned short*)dst)[r * ld_dst + c] = ((const unsigned short*)src)[r * ld_src + c];
}

// x[i] = x[i] · factor rounded to the dtype `comm`, then to the stored one: a sum over the ranks
// made the average the host's ReduceOp::Avg makes (one f32 multiply by the rounded 1/N; no add
// follows it to contract into), stored as zero::Storage::reduced stores it.
extern "C" __global__ void scale_round(float* x, int n, float factor, int comm, int store) {
    GRID_WAIT();
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] = st(st(x[i] * factor, comm), store);
}

// dst[i] = the half bits of src[i]: a GEMM operand for cuBLAS's fp16/bf16 inputs (the values
// are the run's half values, so nothing is rounded), n elements from the operand's start.
extern "C" __global__ void pack_half(unsigned short* dst, const float* src, int n, int store) {
    GRID_WAIT();
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) dst[i] = half_bits(src[i], store);
}

// The operand addresses of a batch of GEMMs for cublasGemmBatchedEx (Batch in
// runtime/src/backend/mod.rs): item j = (j / inner, j % inner) of operand X starts at
// x + (j / inner) * x_outer + (j % inner) * x_inner bytes. out holds the count addresses of A,
// then of B, then of C.
extern "C" __global__ void gemm_pointers(unsigned long long* out, unsigned long long a,
                                         unsigned long long b, unsigned long long c, int count,
                                         int inner, unsigned long long a_outer,
                                         unsigned long long a_inner, unsigned long long b_outer,
                                         unsigned long long b_inner, unsigned long long c_outer,
                                         unsigned long long c_inner) {
    GRID_WAIT();
    int j = blockIdx.x * blockDim.x + threadIdx.x;
    if (j >= count) return;
    unsigned long long o = j / inner, i = j % inner;
    out[j] = a + o * a_outer + i * a_inner;
    out[count + j] = b + o * b_outer + i * b_inner;
    out[2 * (long long)count + j] = c + o * c_outer + i * c_inner;
}

// Exact (erf) GELU, HF's "gelu", written as PyTorch's CUDA kernel writes it:
// x · ½(1 + erf(x/√2)).
__device__ __forceinline__ float gelu(float x) {
    return x * 0.5f * (1.0f + erff(x * 0.70710678118654752f));
}

extern "C" __global__ void gelu_fwd(float* out, const float* inp, int n, int store) {
    GRID_WAIT();
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = st(gelu(inp[i]), store);
}

// round_rows, add_bias and gelu_fwd in one pass: act = gelu(st(st(inter) + bias[c])), each
// rounded as those kernels round it. `inter` is a GEMM's fp32 output (Backend::gemm_to_epilogue),
// or already rounded (rounding is idempotent); it is left as it is: the backward adds the bias
// again as it loads it (gelu_bwd, gelu_bwd_bias_grad), where storing the biased pre-activation
// would be a write of the whole matrix more (Backend::gelu_bwd_adds_bias).
template <int T>
__device__ __forceinline__ void bias_gelu_v(const void* inter, void* act, const void* bias,
                                            int bias_t, int cols, long long i) {
    float x[VEC], b[VEC], a[VEC];
    ldv<T>(x, inter, i);
    ldv_rt(b, bias, col_of(i, cols), bias_t);
    UNROLL
    for (int u = 0; u < VEC; u++) a[u] = st(gelu(st(x[u] + b[u], T)), T);
    stv<T>(act, i, a);
}
extern "C" __global__ void bias_gelu(const void* inter, int inter_t, void* act, int act_t,
                                     const void* bias, int bias_t, int rows, int cols,
                                     int store) {
    GRID_WAIT();
    long long i0 = ((long long)blockIdx.x * blockDim.x + threadIdx.x) * VEC;
    long long n = (long long)rows * cols;
    if (i0 >= n) return;
    if (inter_t == store && act_t == store && cols % VEC == 0 && aligned16(inter) &&
        aligned16(act) && aligned16(bias)) {
        BY_TYPE(store, bias_gelu_v, inter, act, bias, bias_t, cols, i0);
        return;
    }
    NO_UNROLL
    for (long long i = i0; i < i0 + VEC && i < n; i++) {
        float x = st(st(ld(inter, i, inter_t), store) + ld(bias, col_of(i, cols), bias_t), store);
        sto(act, i, st(gelu(x), store), act_t);
    }
}

// round_rows, add_bias, dropout (when `drop`) and add_assign in one pass, each rounded as those
// kernels round it: out = ((st(out) + bias) · mask·scale) + residual, `out` as bias_gelu's
// `inter`. The multiply is op_mul (common.cuh)
// so that, in fp32 where nothing rounds between, it is not contracted with the add into an FMA
// the three kernels never make. Each thread takes the four elements of one Philox block
// (dropout_mult4), so the generator runs once per four elements: VEC / 4 times a thread.
template <int T>
__device__ __forceinline__ void bias_dropout_add_v(void* out, const void* bias, int bias_t,
                                                   const void* residual, int cols, long long i,
                                                   int drop, const float m[VEC]) {
    float v[VEC], b[VEC], res[VEC];
    ldv<T>(v, out, i);
    ldv_rt(b, bias, col_of(i, cols), bias_t);
    ldv<T>(res, residual, i);
    UNROLL
    for (int u = 0; u < VEC; u++) {
        float x = st(v[u] + b[u], T);
        if (drop) x = st(op_mul(x, m[u]), T);
        v[u] = st(x + res[u], T);
    }
    stv<T>(out, i, v);
}
extern "C" __global__ void bias_dropout_add(void* out, int out_t, const void* bias, int bias_t,
                                            const void* residual, int residual_t, int rows,
                                            int cols, int drop, const unsigned* key,
                                            unsigned long long site, unsigned threshold,
                                            float scale, int store) {
    GRID_WAIT();
    long long i0 = ((long long)blockIdx.x * blockDim.x + threadIdx.x) * VEC;
    long long n = (long long)rows * cols;
    if (i0 >= n) return;
    DropKey k = {0, 0};
    if (drop) k = drop_key(key, site);
    if (out_t == store && residual_t == store && cols % VEC == 0 && aligned16(out) &&
        aligned16(bias) && aligned16(residual)) {
        float m[VEC];
        UNROLL
        for (int h = 0; h < VEC / 4; h++) {
            if (drop)
                dropout_mult4(m + 4 * h, (unsigned long long)(i0 / 4 + h), k.seed, k.stream,
                              threshold, scale);
            else
                m[4 * h] = m[4 * h + 1] = m[4 * h + 2] = m[4 * h + 3] = 1.0f;
        }
        BY_TYPE(store, bias_dropout_add_v, out, bias, bias_t, residual, cols, i0, drop, m);
        return;
    }
    // Not unrolled: the body's typed loads and stores, VEC times over, would make this one
    // kernel most of the program's PTX. The multiplier by branches (an array indexed at run
    // time would live in local memory).
    NO_UNROLL
    for (long long blk = i0 / 4; blk < i0 / 4 + VEC / 4 && 4 * blk < n; blk++) {
        float m[4] = {1.0f, 1.0f, 1.0f, 1.0f};
        if (drop) dropout_mult4(m, (unsigned long long)blk, k.seed, k.stream, threshold, scale);
        NO_UNROLL
        for (int w = 0; w < 4; w++) {
            long long i = 4 * blk + w;
            if (i < n) {
                float v = st(st(ld(out, i, out_t), store) + ld(bias, col_of(i, cols), bias_t),
                             store);
                float mult = (w & 2) ? ((w & 1) ? m[3] : m[2]) : ((w & 1) ? m[1] : m[0]);
                if (drop) v = st(op_mul(v, mult), store);
                sto(out, i, st(v + ld(residual, i, residual_t), store), out_t);
            }
        }
    }
}

// dinp = dout · (Φ(x) + x φ(x)). `dout` is rounded first: it may be a GEMM's fp32 output
// (Backend::gemm_to_epilogue), and rounding a rounded value changes nothing. The products and
// sums are op_* (no FMA), so that every kernel computing it (gelu_bwd, gelu_bwd_bias_grad) gets
// the same bits whatever the compiler would contract in each.
__device__ __forceinline__ float gelu_grad(float x) {
    float cdf = op_mul(0.5f, op_add(1.0f, erff(op_mul(x, 0.70710678118654752f))));
    float pdf = op_mul(expf(op_mul(op_mul(-0.5f, x), x)), 0.39894228040143268f);
    return op_add(cdf, op_mul(x, pdf));
}
template <int T>
__device__ __forceinline__ void gelu_bwd_v(void* dinp, const void* inp, const void* dout,
                                           long long i) {
    float x[VEC], g[VEC];
    ldv<T>(x, inp, i);
    ldv<T>(g, dout, i);
    UNROLL
    for (int u = 0; u < VEC; u++) x[u] = st(op_mul(g[u], gelu_grad(x[u])), T);
    stv<T>(dinp, i, x);
}
// With `bias` (not null), `inp` is the pre-activation without its bias, as bias_gelu leaves it:
// x = st(st(inp) + bias[c]), bias_gelu's own sum (Backend::gelu_bwd_adds_bias). That is
// gelu_bwd_bias_grad's fallback (buffers it does not take), so it has no vectorised path.
extern "C" __global__ void gelu_bwd(void* dinp, int dinp_t, const void* inp, int inp_t,
                                    const void* dout, int dout_t, const void* bias, int bias_t,
                                    int cols, int n, int store) {
    GRID_WAIT();
    long long i0 = ((long long)blockIdx.x * blockDim.x + threadIdx.x) * VEC;
    if (i0 >= n) return;
    if (!bias && dinp_t == store && inp_t == store && dout_t == store && n % VEC == 0 &&
        aligned16(dinp) && aligned16(inp) && aligned16(dout)) {
        BY_TYPE(store, gelu_bwd_v, dinp, inp, dout, i0);
        return;
    }
    NO_UNROLL
    for (long long i = i0; i < i0 + VEC && i < n; i++) {
        float x = ld(inp, i, inp_t);
        if (bias) x = st(st(x, store) + ld(bias, col_of(i, cols), bias_t), store);
        sto(dinp, i, st(op_mul(st(ld(dout, i, dout_t), store), gelu_grad(x)), store), dinp_t);
    }
}

// gelu_bwd and the bias gradient of its output in one pass (Backend::gelu_bwd_bias_grad: the
// feed-forward's first linear), where bias_grad would read dinp back: dinp as gelu_bwd writes
// it, and db[c] += Σ_r dinp[r, c] in bias_grad's order — a (columns × chunks of `chunk` rows)
// grid, each chunk's rows summed in row order from zero into part, then the last block of each
// column (`last_of_column`) adding the chunks' sums in order and rounding. A thread takes two
// adjacent columns (one 32-bit load of two 16-bit elements a row: a warp reads 128 bytes of a
// row at once), GELU_ROWS rows' loads before their arithmetic. The same values and the same
// additions as the two kernels: the same bits.
#define GELU_ROWS 8
// Elements i and i + 1 of a buffer of type T as f32 (i even, the buffer aligned for the pair).
template <int T>
__device__ __forceinline__ void ld2(const void* p, long long i, float& x0, float& x1) {
    if (T == STORE_F32) {
        x0 = ((const float*)p)[i];
        x1 = ((const float*)p)[i + 1];
        return;
    }
    unsigned w = ld_pair((const unsigned short*)p + i);
    x0 = half_value<T>((unsigned short)(w & 0xffffu));
    x1 = half_value<T>((unsigned short)(w >> 16));
}
template <int T>
__device__ __forceinline__ void gelu_bwd_bias_grad_t(void* dinp, const void* inp,
                                                     const void* dout, const void* bias,
                                                     int bias_t, float* db, float* part,
                                                     unsigned* done, int rows, int cols,
                                                     int chunk, int chunks) {
    int c = 2 * (blockIdx.x * blockDim.x + threadIdx.x);
    int r0 = blockIdx.y * chunk;
    int r1 = c < cols ? min(rows, r0 + chunk) : r0;  // a thread past the last column adds nothing
    float a0 = 0.0f, a1 = 0.0f;
    // The two columns' biases, when `inp` is left without them (gelu_bwd's `bias`).
    float b0 = 0.0f, b1 = 0.0f;
    if (bias && c < cols) {
        b0 = ld(bias, c, bias_t);
        b1 = ld(bias, c + 1, bias_t);
    }
    for (int r = r0; r < r1; r += GELU_ROWS) {
        float x[GELU_ROWS][2], g[GELU_ROWS][2];
        UNROLL
        for (int u = 0; u < GELU_ROWS; u++) {
            if (r + u < r1) {
                long long at = (long long)(r + u) * cols + c;
                ld2<T>(inp, at, x[u][0], x[u][1]);
                ld2<T>(dout, at, g[u][0], g[u][1]);
            }
        }
        UNROLL
        for (int u = 0; u < GELU_ROWS; u++) {
            if (r + u < r1) {
                if (bias) {
                    x[u][0] = st(x[u][0] + b0, T);
                    x[u][1] = st(x[u][1] + b1, T);
                }
                float d0 = st(op_mul(g[u][0], gelu_grad(x[u][0])), T);
                float d1 = st(op_mul(g[u][1], gelu_grad(x[u][1])), T);
                long long at = (long long)(r + u) * cols + c;
                if (T == STORE_F32) {
                    ((float*)dinp)[at] = d0;
                    ((float*)dinp)[at + 1] = d1;
                } else {
                    st_pair((unsigned short*)dinp + at, pack_half2<T>(d0, d1));
                }
                a0 += d0;
                a1 += d1;
            }
        }
    }
    if (c < cols) {
        part[(long long)blockIdx.y * cols + c] = a0;
        part[(long long)blockIdx.y * cols + c + 1] = a1;
    }
    if (last_of_column(done) && c < cols) {
        db[c] = st(chunk_sums(db[c], part, chunks, cols, c), T);
        db[c + 1] = st(chunk_sums(db[c + 1], part, chunks, cols, c + 1), T);
    }
}
// Grid (⌈cols / (2·BLOCK)⌉, max(chunks, 1)); every buffer of the storage dtype `store`, cols
// even, dinp, inp and dout aligned for a pair (elementwise.rs checks; other buffers take gelu_bwd
// and bias_grad); `bias` (of any type) as gelu_bwd's, or null.
extern "C" __global__ void gelu_bwd_bias_grad(void* dinp, const void* inp, const void* dout,
                                              const void* bias, int bias_t, float* db,
                                              float* part, unsigned* done, int rows, int cols,
                                              int chunk, int chunks, int store) {
    GRID_WAIT();
    BY_TYPE(store, gelu_bwd_bias_grad_t, dinp, inp, dout, bias, bias_t, db, part, done, rows,
            cols, chunk, chunks);
}

extern "C" __global__ void tanh_fwd(float* out, const float* inp, int n, int store) {
    GRID_WAIT();
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = st(tanhf(inp[i]), store);
}

// From the forward's output y: dinp = dout · (1 − y²), unfused (op_*), as the CPU rounds it
// (NVRTC would make 1 − y² one FMA).
extern "C" __global__ void tanh_bwd(void* dinp, int dinp_t, const void* y, int y_t,
                                    const void* dout, int dout_t, int n, int store) {
    GRID_WAIT();
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        float v = ld(y, i, y_t);
        float d = op_mul(ld(dout, i, dout_t), op_sub(1.0f, op_mul(v, v)));
        sto(dinp, i, st(d, store), dinp_t);
    }
}

// Dropout in place: element i keeps x · scale iff the Philox draw of index first + i is at least
// threshold (= ⌈p · 2³²⌉), else 0. The mask is a pure function of (seed, stream, index), so the
// backward is the same call, and the CPU backend draws the same mask. (seed, stream): `key` and
// `site` (common.cuh, drop_key).
extern "C" __global__ void dropout(void* x, int x_t, int n, const unsigned* key,
                                   unsigned long long site, unsigned threshold, float scale,
                                   unsigned long long first, int store) {
    GRID_WAIT();
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        DropKey k = drop_key(key, site);
        float v = ld(x, i, x_t) * dropout_mult(first + i, k.seed, k.stream, threshold, scale);
        sto(x, i, st(v, store), x_t);
    }
}
