// The optimizer on the device: the gradient norm (Σ g², which also answers the fp16 overflow
// check) and one step kernel per optimizer over a flat buffer — Adam / AdamW, SGD, Adagrad and
// LAMB (three small kernels around its per-tensor norms). The host references are
// runtime/src/optim/ (mod.rs `sum_squares`, adam.rs, sgd.rs, adagrad.rs, lamb.rs); the launch side
// is runtime/src/backend/kernels/optim.rs.
#include "common.cuh"

// Most blocks the norm's first pass launches (kernels/optim.rs `NORM_BLOCKS`): a constant, not
// the device's SM count, so the partial sums, and the result's bits, depend on n alone.
#define NORM_BLOCKS 1024

// op_mul, op_add, … (IEEE f32 operations never fused into an FMA): common.cuh.

// Stores a double as two floats' bits (low word first): the device buffers are f32, and a view
// may start at any 4-byte offset, so no 8-byte store. The host reassembles the bits
// (kernels/optim.rs), so nothing is rounded on the way.
__device__ __forceinline__ void store_f64(float* out, double x) {
    unsigned long long u = f64_bits(x);
    out[0] = __uint_as_float((unsigned)u);
    out[1] = __uint_as_float((unsigned)(u >> 32));
}

__device__ __forceinline__ double load_f64(const float* in) {
    unsigned long long u = (unsigned long long)__float_as_uint(in[0]) |
                           ((unsigned long long)__float_as_uint(in[1]) << 32);
    double x;
#ifdef RECIPE_EMU
    std::memcpy(&x, &u, 8);
#else
    x = __longlong_as_double((long long)u);
#endif
    return x;
}

// First pass of Σ g²: block b's threads stride over g (grid-stride, so gridDim.x ≤ NORM_BLOCKS
// covers any n), each accumulating in double, and the block's total goes to partial[2b..2b+2).
//
// Why double: the host sums g² in f64 (optim/mod.rs `sum_squares`). Each g² of an f32 is exact in
// double (24-bit significands square to 48 bits), so with FMA contraction `acc + x * x` rounds
// once either way. And a double sum of f32 squares cannot overflow (≤ 2³¹ · (3.4e38)² ≈ 2.5e86),
// so the sum is inf or NaN exactly when some g is: it is the overflow check too
// (precision.rs `has_inf_or_nan`, which scans because an f32 sum could overflow on finite values).
//
// With `store` a 16-bit type, each element is first rounded to it in place, g[i] = st(g[i]),
// and that value squared: a segment's weight gradients, which their GEMMs leave unrounded
// (Backend::round_stored), rounded in the pass that sums them (kernels/optim.rs
// `SegmentNorms::partials_rounding`) rather than in a round_rows pass before it — the same
// values, so the same sums, and one read of the segment less. STORE_F32: g is only read.
extern "C" __global__ void grad_norm_partial(float* partial, float* g, int n, int store) {
    GRID_WAIT();
    __shared__ double red[32];
    double acc = 0.0;
    long long stride = (long long)gridDim.x * blockDim.x;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        float v = g[i];
        if (store != STORE_F32) {
            v = st(v, store);
            g[i] = v;
        }
        double x = (double)v;
        acc += x * x;
    }
    double s = block_sum_d(acc, red);
    if (threadIdx.x == 0) store_f64(partial + 2 * blockIdx.x, s);
}

// Second pass: one block adds the `parts` partial sums in a fixed order (thread t takes partials
// t, t + blockDim.x, …, then the block tree) and writes the total to out[0..2).
extern "C" __global__ void grad_norm_final(float* out, const float* partial, int parts) {
    GRID_WAIT();
    __shared__ double red[32];
    double acc = 0.0;
    for (int b = threadIdx.x; b < parts; b += blockDim.x) acc += load_f64(partial + 2 * b);
    double s = block_sum_d(acc, red);
    if (threadIdx.x == 0) store_f64(out, s);
}

// Weight-decay modes (kernels/optim.rs): none, AdamW's decoupled decay, Adam's L2 term.
#define DECAY_NONE 0
#define DECAY_DECOUPLED 1
#define DECAY_L2 2

// How many of the ascending `bounds` are ≤ i (a binary search).
__device__ __forceinline__ int count_le(const unsigned* bounds, int nbounds, unsigned i) {
    int lo = 0, hi = nbounds;
    while (lo < hi) {
        int mid = (lo + hi) >> 1;
        if (bounds[mid] <= i) lo = mid + 1;
        else hi = mid;
    }
    return lo;
}

// Whether element i decays: `bounds` (ascending) are the starts and ends of the decaying ranges,
// [b0, b1), [b2, b3), …, so i decays iff an odd number of bounds are ≤ i. A binary search over the
// few hundred tensor boundaries of a model instead of a mask as long as the parameters.
__device__ __forceinline__ bool decays_at(const unsigned* bounds, int nbounds, unsigned i) {
    return count_le(bounds, nbounds, i) & 1;
}

// One Adam / AdamW step, ADAM_VEC consecutive elements a thread (1-D grid of BLOCK threads).
//
// The arithmetic is adam.rs `Adam::step` (torch.optim.Adam / AdamW, foreach=False), every
// operation an f32 rounding in the same order; the scalars are formed on the host in f64 and
// rounded to f32 exactly as adam.rs forms them (kernels/optim.rs `AdamScalars`):
//   step_size = −lr / (1 − β₁ᵗ), bc2_sqrt = √(1 − β₂ᵗ), w1 = 1 − β₁, b2 = β₂, w2 = 1 − β₂,
//   decay_mul = 1 − lr·wd, wd.
// `mult` is the one factor the host multiplies the gradient by first: the clip coefficient in
// fp32 (optim/mod.rs `clip_grad_norm`) or f32(1 / combined scale) under mixed precision
// (`Optimizer::step_scaled`); 1 when neither applies.
//
// param is the fp32 master (or the fp32 weights); when `work` is not null the updated value is
// also stored there rounded to `store`, the module's half copy (zero/replica.rs
// `HostOptimizer::step_scaled`: master → parameters, rounded), a typed buffer (common.cuh's sto:
// 16 bits on a device keeping the half parameters in two bytes).
//
// A thread's elements load and store 16 bytes at a time from each f32 buffer where all four are
// aligned (else one at a time, the same arithmetic), and search the decaying ranges once: the
// step moves 28–30 bytes a parameter, and one element a thread with a search each was short of
// the memory's speed (docs/cuda.md, "Performance").
#define ADAM_VEC 4
__device__ __forceinline__ void adam_one(float& p, float gr, float& mi, float& vi, bool decays,
                                         float mult, float step_size, float w1, float b2,
                                         float w2, float bc2_sqrt, float eps, int decay_mode,
                                         float decay_mul, float wd) {
    float g = op_mul(gr, mult);
    if (decays) {
        if (decay_mode == DECAY_DECOUPLED) p = op_mul(p, decay_mul);  // AdamW: p *= 1 − lr·wd
        else g = op_add(g, op_mul(wd, p));                            // Adam L2: g += wd·p
    }
    // m += w1·(g − m): torch.lerp with weight < 0.5 (adam.rs).
    mi = op_add(mi, op_mul(w1, op_sub(g, mi)));
    // v = v·β₂ + (w2·g)·g, left to right as adam.rs writes `v * b2 + w2 * g * g`.
    vi = op_add(op_mul(vi, b2), op_mul(op_mul(w2, g), g));
    // denom = √v / √(1 − β₂ᵗ) + eps; p += (step_size·m) / denom.
    float denom = op_add(op_div(op_sqrt(vi), bc2_sqrt), eps);
    p = op_add(p, op_div(op_mul(step_size, mi), denom));
}
// ADAM_VEC consecutive elements from i0 (`len` of them, the buffer's last chunk may be shorter)
// of one step: adamw_step's body, which the rows-first kernels below share, so that an element
// gets the same operations whichever kernel updates it. With `zero` (the gradient's own
// address, or null), each gradient read is then set to 0: the next window's accumulation
// starts there, without a memset of its own after the step.
__device__ __forceinline__ void adam_chunk(long long i0, int len, float* param, const float* grad,
                                           float* m, float* v, void* work, int work_t,
                                           const unsigned* bounds, int nbounds, float mult,
                                           float step_size, float w1, float b2, float w2,
                                           float bc2_sqrt, float eps, int decay_mode,
                                           float decay_mul, float wd, int store,
                                           float* zero) {
    // Whether each element decays: the bounds at or below the first, then any the others pass.
    bool decays[ADAM_VEC] = {false, false, false, false};
    if (decay_mode != DECAY_NONE) {
        int c = count_le(bounds, nbounds, (unsigned)i0);
        UNROLL
        for (int u = 0; u < ADAM_VEC; u++) {
            while (c < nbounds && bounds[c] <= (unsigned)(i0 + u)) c++;
            decays[u] = c & 1;
        }
    }
    if (len == ADAM_VEC && aligned16(param + i0) && aligned16(grad + i0) && aligned16(m + i0) &&
        aligned16(v + i0)) {
        unsigned pw[4], gw[4], mw[4], vw[4];
        ld16(pw, param + i0);
        ld16(gw, grad + i0);
        ld16(mw, m + i0);
        ld16(vw, v + i0);
        if (zero) {
            unsigned zw[4] = {0, 0, 0, 0};
            st16(zero + i0, zw);
        }
        float p[4], mi[4], vi[4];
        UNROLL
        for (int u = 0; u < ADAM_VEC; u++) {
            p[u] = __uint_as_float(pw[u]);
            mi[u] = __uint_as_float(mw[u]);
            vi[u] = __uint_as_float(vw[u]);
            adam_one(p[u], __uint_as_float(gw[u]), mi[u], vi[u], decays[u], mult, step_size, w1,
                     b2, w2, bc2_sqrt, eps, decay_mode, decay_mul, wd);
            pw[u] = __float_as_uint(p[u]);
            mw[u] = __float_as_uint(mi[u]);
            vw[u] = __float_as_uint(vi[u]);
        }
        st16(param + i0, pw);
        st16(m + i0, mw);
        st16(v + i0, vw);
        if (work) {
            unsigned short* half = (unsigned short*)work + i0;
            if (work_t != STORE_F32 && ((unsigned long long)half & 7) == 0) {
                // The half copy's four elements as one 8-byte store, not four 2-byte ones.
                unsigned h[ADAM_VEC];
                UNROLL
                for (int u = 0; u < ADAM_VEC; u++) h[u] = half_bits(st(p[u], store), work_t);
                st8(half, h[0] | (h[1] << 16), h[2] | (h[3] << 16));
            } else {
                UNROLL
                for (int u = 0; u < ADAM_VEC; u++) sto(work, i0 + u, st(p[u], store), work_t);
            }
        }
        return;
    }
    for (int u = 0; u < len; u++) {
        long long i = i0 + u;
        float p = param[i], mi = m[i], vi = v[i], g = grad[i];
        if (zero) zero[i] = 0.0f;
        adam_one(p, g, mi, vi, decays[u], mult, step_size, w1, b2, w2, bc2_sqrt, eps,
                 decay_mode, decay_mul, wd);
        m[i] = mi;
        v[i] = vi;
        param[i] = p;
        if (work) sto(work, i, st(p, store), work_t);
    }
}
// `zero_grad`: the gradient set to 0 as it is read (adam_chunk's `zero`).
extern "C" __global__ void adamw_step(float* param, float* grad, float* m, float* v, void* work,
                                      int work_t, const unsigned* bounds, int nbounds, int n,
                                      int zero_grad, float mult, float step_size, float w1,
                                      float b2, float w2, float bc2_sqrt, float eps,
                                      int decay_mode, float decay_mul, float wd, int store) {
    GRID_WAIT();
    long long i0 = ((long long)blockIdx.x * blockDim.x + threadIdx.x) * ADAM_VEC;
    if (i0 >= n) return;  // no barrier below
    adam_chunk(i0, min(ADAM_VEC, (int)(n - i0)), param, grad, m, v, work, work_t, bounds, nbounds,
               mult, step_size, w1, b2, w2, bc2_sqrt, eps, decay_mode, decay_mul, wd, store,
               zero_grad ? grad : nullptr);
}

// The word embeddings' step in two parts, the rows the next forward reads first
// (docs/cuda.md, "The step beside the forward"; kernels/optim.rs `adamw_rows`). `first` holds,
// for each row of the table, the first token of the batch that names it, or NO_TOKEN.
#define NO_TOKEN 0xffffffffu

// first[ids[t]] = the smallest such t: atomicMin gives the same value whatever order the
// threads run in. One thread a token.
extern "C" __global__ void rows_mark(unsigned* first, const unsigned* ids, int ntok) {
    GRID_WAIT();
    int t = blockIdx.x * blockDim.x + threadIdx.x;
    if (t < ntok) atomicMin(first + ids[t], (unsigned)t);
}

// first[ids[t]] = NO_TOKEN again for the next batch (after `adamw_rows` with `rest`, which reads
// the marks: a separate launch, since one of its threads clearing a row's mark could precede
// another thread of that row reading it).
extern "C" __global__ void rows_unmark(unsigned* first, const unsigned* ids, int ntok) {
    GRID_WAIT();
    int t = blockIdx.x * blockDim.x + threadIdx.x;
    if (t < ntok) atomicExch(first + ids[t], NO_TOKEN);
}

// adam_chunk over the rows of a `row_len`-wide table at the start of the buffer (the bounds and
// every pointer as adamw_step's), ⌈row_len / ADAM_VEC⌉ threads a row, each row once:
// - `rest` 0: token t's row, for t < count, when t is the first token that names it
//   (first[ids[t]] == t): the marked rows, whichever tokens repeat them;
// - `rest` 1: row r < count when no token marked it: every other row.
// The two together are adamw_step over the table, element for element.
extern "C" __global__ void adamw_rows(float* param, const float* grad, float* m, float* v,
                                      void* work, int work_t, const unsigned* bounds, int nbounds,
                                      const unsigned* first, const unsigned* ids, int count,
                                      int row_len, int rest, float mult, float step_size,
                                      float w1, float b2, float w2, float bc2_sqrt, float eps,
                                      int decay_mode, float decay_mul, float wd, int store) {
    GRID_WAIT();
    int chunks = (row_len + ADAM_VEC - 1) / ADAM_VEC;
    long long idx = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    long long unit = idx / chunks;
    int c = (int)(idx - unit * chunks);
    if (unit >= count) return;  // no barrier below
    unsigned row;
    if (rest) {
        row = (unsigned)unit;
        if (first[row] != NO_TOKEN) return;
    } else {
        row = ids[unit];
        if (first[row] != (unsigned)unit) return;
    }
    long long i0 = (long long)row * row_len + (long long)c * ADAM_VEC;
    adam_chunk(i0, min(ADAM_VEC, row_len - c * ADAM_VEC), param, grad, m, v, work, work_t,
               bounds, nbounds, mult, step_size, w1, b2, w2, bc2_sqrt, eps, decay_mode,
               decay_mul, wd, store, nullptr);
}

// One SGD step, one thread per element: sgd.rs `Sgd::step` (torch.optim.SGD), operation for
// operation. torch's `add(…, alpha)` is a fused multiply-add on its vectorized CPU kernel, and
// sgd.rs writes it as `mul_add`: op_fma here, the plain products and sums as op_*. The scalars
// are sgd.rs `SgdScalars` (wd, μ, 1 − dampening, −lr, each rounded to f32 on the host).
// `decay` is 0 when weight_decay is 0 (sgd.rs skips the term then); `momentum` says whether the
// buffer exists (μ ≠ 0; `buf` is null otherwise); `first` is the first step ever, where torch
// starts the buffer from the gradient. `mult`, `work`, `store`: as adamw_step.
extern "C" __global__ void sgd_step(float* param, const float* grad, float* buf, void* work, int work_t,
                                    const unsigned* bounds, int nbounds, int n, float mult,
                                    int decay, float wd, int momentum, float mu, float keep,
                                    int first, int nesterov, float neg_lr, int store) {
    GRID_WAIT();
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;  // no barrier below
    float p = param[i];
    float g = op_mul(grad[i], mult);
    if (decay && decays_at(bounds, nbounds, (unsigned)i)) g = op_fma(p, wd, g);  // g + wd·p
    if (momentum) {
        // b ← g on the first step, else b ← μ·b + (1 − d)·g.
        float b = first ? g : op_fma(g, keep, op_mul(buf[i], mu));
        buf[i] = b;
        g = nesterov ? op_fma(b, mu, g) : b;
    }
    p = op_fma(g, neg_lr, p);  // p − lr·g
    param[i] = p;
    if (work) sto(work, i, st(p, store), work_t);
}

// One Adagrad step, one thread per element: adagrad.rs `Adagrad::step`, either class:
//   torch (ds == 0):              g ← fma(p, wd, g); s ← fma(g, g, s); p ← p + (g·(−clr)) / (√s + eps)
//   DeepSpeedCPUAdagrad (ds == 1): the same s;                         p ← fma(g / (√s + eps), −lr, p)
// `neg_lr` is −clr or −lr and `decay` whether the class adds the decay term at all, both from
// adagrad.rs `AdagradScalars`. `mult`, `work`, `store`: as adamw_step.
extern "C" __global__ void adagrad_step(float* param, const float* grad, float* sum, void* work, int work_t,
                                        const unsigned* bounds, int nbounds, int n, float mult,
                                        int decay, float wd, float eps, float neg_lr, int ds,
                                        int store) {
    GRID_WAIT();
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;  // no barrier below
    float p = param[i];
    float g = op_mul(grad[i], mult);
    if (decay && decays_at(bounds, nbounds, (unsigned)i)) g = op_fma(p, wd, g);
    float s = op_fma(g, g, sum[i]);
    sum[i] = s;
    float denom = op_add(op_sqrt(s), eps);
    if (ds) p = op_fma(op_div(g, denom), neg_lr, p);
    else p = op_add(p, op_div(op_mul(g, neg_lr), denom));
    param[i] = p;
    if (work) sto(work, i, st(p, store), work_t);
}

// LAMB, as lamb.rs `Lamb::step_with_scale` (DeepSpeed's FusedLamb kernel, one trust ratio per
// tensor), in three launches over the whole buffer:
//   lamb_update  per element: the moments and the update u (kept in `upd`);
//   lamb_norms   per (tensor, block): f32 partial sums of p² and u² in the host's order;
//   lamb_coeff   per tensor: the blocks' sums by the host's tree, ‖w‖, ‖u‖ and the trust ratio;
//   lamb_apply   per element: p ← p − (step_size·ratio)·u.
// The sums are f32 in exactly the order lamb.rs `kernel_sum_sq` fixes (FusedLamb's own: 512
// threads per block, min(⌈len/512⌉, 512) blocks per tensor, thread t of the tensor adding
// x[t]², x[t + T]², … with T = blocks·512, then a halving tree within each block and one over
// 512 block slots), so the norms, and everything after them, are bit-identical to the host's.
// `tensors` (ntensors + 1 ascending bounds) are the tensors' starts and the buffer's end;
// `blocks` (ntensors + 1) the first norm block of each tensor and the total.
#define LAMB_THREADS 512

// The halving tree of lamb.rs `tree` over the block's 512 slots of `s`: s[t] += s[t + h] for
// h = 256, …, 1. Every thread of the (512-thread) block calls it; s[0] holds the total after.
__device__ __forceinline__ void lamb_tree(float* s) {
    for (int h = LAMB_THREADS / 2; h >= 1; h >>= 1) {
        __syncthreads();
        if ((int)threadIdx.x < h) s[threadIdx.x] = op_add(s[threadIdx.x], s[threadIdx.x + h]);
    }
    __syncthreads();
}

// Per element: s = (g·mult) / div; m ← β₁·m + w₁·s; v ← β₂·v + (w₂·s)·s;
// u = m / (√v + eps) + decay·p, decay = wd on the decaying tensors, else 0 (lamb.rs computes the
// product either way, so −0 and inf behave alike). `mult` is the clip coefficient or the unscale
// factor the other optimizers' gradients are multiplied by, `div` FusedLamb's `grad_scale` (the
// combined scale under mixed precision); one of them is 1, which changes no bits.
extern "C" __global__ void lamb_update(float* upd, const float* param, const float* grad,
                                       float* m, float* v, const unsigned* bounds, int nbounds,
                                       int n, float mult, float div, float b1, float w1, float b2,
                                       float w2, float eps, float wd) {
    GRID_WAIT();
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;  // no barrier below
    float s = op_div(op_mul(grad[i], mult), div);
    float mi = op_add(op_mul(b1, m[i]), op_mul(w1, s));
    float vi = op_add(op_mul(b2, v[i]), op_mul(op_mul(w2, s), s));
    m[i] = mi;
    v[i] = vi;
    float decay = decays_at(bounds, nbounds, (unsigned)i) ? wd : 0.0f;
    upd[i] = op_add(op_div(mi, op_add(op_sqrt(vi), eps)), op_mul(decay, param[i]));
}

// One block (LAMB_THREADS threads) per norm block of a tensor: block b belongs to the last tensor
// whose first block is ≤ b (tensors with no elements have no blocks). Writes its Σp² and Σu² to
// partial[2b], partial[2b + 1].
extern "C" __global__ void lamb_norms(float* partial, const float* param, const float* upd,
                                      const unsigned* tensors, const unsigned* blocks,
                                      int ntensors) {
    GRID_WAIT();
    __shared__ float sp[LAMB_THREADS], su[LAMB_THREADS];
    unsigned b = blockIdx.x;
    int k = count_le(blocks, ntensors, b) - 1;
    unsigned first = blocks[k], nblocks = blocks[k + 1] - first;
    unsigned start = tensors[k], len = tensors[k + 1] - start;
    unsigned stride = nblocks * LAMB_THREADS;
    float ap = 0.0f, au = 0.0f;
    for (unsigned j = (b - first) * LAMB_THREADS + threadIdx.x; j < len; j += stride) {
        float p = param[start + j], u = upd[start + j];
        ap = op_add(ap, op_mul(p, p));
        au = op_add(au, op_mul(u, u));
    }
    sp[threadIdx.x] = ap;
    su[threadIdx.x] = au;
    lamb_tree(sp);
    lamb_tree(su);
    if (threadIdx.x == 0) {
        partial[2 * b] = sp[0];
        partial[2 * b + 1] = su[0];
    }
}

// One block (LAMB_THREADS threads) per tensor: the tree over 512 slots holding its blocks' sums
// (the unused slots 0), then lamb.rs's trust ratio: 1 when either norm is 0, else ‖w‖/‖u‖
// clamped to [min_coeff, max_coeff] (a NaN passes through, as on the host).
extern "C" __global__ void lamb_coeff(float* coeff, const float* partial, const unsigned* blocks,
                                      float max_coeff, float min_coeff) {
    GRID_WAIT();
    __shared__ float sp[LAMB_THREADS], su[LAMB_THREADS];
    int k = blockIdx.x;
    unsigned first = blocks[k], nblocks = blocks[k + 1] - first;
    unsigned t = threadIdx.x;
    sp[t] = t < nblocks ? partial[2 * (first + t)] : 0.0f;
    su[t] = t < nblocks ? partial[2 * (first + t) + 1] : 0.0f;
    lamb_tree(sp);
    lamb_tree(su);
    if (t == 0) {
        float w_norm = op_sqrt(sp[0]), u_norm = op_sqrt(su[0]);
        float c = 1.0f;
        if (w_norm != 0.0f && u_norm != 0.0f) {
            c = op_div(w_norm, u_norm);
            if (c > max_coeff) c = max_coeff;
            if (c < min_coeff) c = min_coeff;
        }
        coeff[k] = c;
    }
}

// Per element: p ← p − (step_size·ratio)·u with its tensor's ratio. `work`, `store`: as
// adamw_step (the updated fp32 master rounded into the module's half copy).
extern "C" __global__ void lamb_apply(float* param, const float* upd, void* work, int work_t,
                                      const float* coeff, const unsigned* tensors, int ntensors,
                                      int n, float step_size, int store) {
    GRID_WAIT();
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;  // no barrier below
    int k = count_le(tensors, ntensors, (unsigned)i) - 1;
    float p = op_sub(param[i], op_mul(op_mul(step_size, coeff[k]), upd[i]));
    param[i] = p;
    if (work) sto(work, i, st(p, store), work_t);
}
