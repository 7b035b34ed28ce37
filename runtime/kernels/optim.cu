// The optimizer on the device: the gradient norm (Σ g², which also answers the fp16 overflow
// check) and a fused Adam / AdamW step over a flat buffer. The host reference is
// runtime/src/optim/ (mod.rs `sum_squares`, adam.rs `Adam::step`); the launch side is
// runtime/src/backend/kernels/optim.rs.
#include "common.cuh"

// Most blocks the norm's first pass launches (kernels/optim.rs `NORM_BLOCKS`): a constant, not
// the device's SM count, so the partial sums, and the result's bits, depend on n alone.
#define NORM_BLOCKS 1024

// IEEE f32 operations, rounded to nearest and never fused into an FMA. NVRTC compiles with
// --fmad=true (backend/cuda/compile.rs), which would contract `a * b + c`; the host optimizer
// (Rust) rounds every product and sum, and these keep the device on the same bits. g++ has no
// FMA to contract into on baseline x86-64, so the emulation uses the plain operators.
#ifdef RECIPE_EMU
__device__ __forceinline__ float op_mul(float a, float b) { return a * b; }
__device__ __forceinline__ float op_add(float a, float b) { return a + b; }
__device__ __forceinline__ float op_sub(float a, float b) { return a - b; }
__device__ __forceinline__ float op_div(float a, float b) { return a / b; }
__device__ __forceinline__ float op_sqrt(float a) { return std::sqrt(a); }
__device__ __forceinline__ unsigned long long f64_bits(double x) {
    unsigned long long u;
    std::memcpy(&u, &x, 8);
    return u;
}
#else
__device__ __forceinline__ float op_mul(float a, float b) { return __fmul_rn(a, b); }
__device__ __forceinline__ float op_add(float a, float b) { return __fadd_rn(a, b); }
__device__ __forceinline__ float op_sub(float a, float b) { return __fsub_rn(a, b); }
__device__ __forceinline__ float op_div(float a, float b) { return __fdiv_rn(a, b); }
__device__ __forceinline__ float op_sqrt(float a) { return __fsqrt_rn(a); }
__device__ __forceinline__ unsigned long long f64_bits(double x) {
    return (unsigned long long)__double_as_longlong(x);
}
#endif

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
extern "C" __global__ void grad_norm_partial(float* partial, const float* g, int n) {
    __shared__ double red[32];
    double acc = 0.0;
    long long stride = (long long)gridDim.x * blockDim.x;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        double x = (double)g[i];
        acc += x * x;
    }
    double s = block_sum_d(acc, red);
    if (threadIdx.x == 0) store_f64(partial + 2 * blockIdx.x, s);
}

// Second pass: one block adds the `parts` partial sums in a fixed order (thread t takes partials
// t, t + blockDim.x, …, then the block tree) and writes the total to out[0..2).
extern "C" __global__ void grad_norm_final(float* out, const float* partial, int parts) {
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

// Whether element i decays: `bounds` (ascending) are the starts and ends of the decaying ranges,
// [b0, b1), [b2, b3), …, so i decays iff an odd number of bounds are ≤ i. A binary search over the
// few hundred tensor boundaries of a model instead of a mask as long as the parameters.
__device__ __forceinline__ bool decays_at(const unsigned* bounds, int nbounds, unsigned i) {
    int lo = 0, hi = nbounds;
    while (lo < hi) {
        int mid = (lo + hi) >> 1;
        if (bounds[mid] <= i) lo = mid + 1;
        else hi = mid;
    }
    return lo & 1;
}

// One Adam / AdamW step, one thread per element (1-D grid of BLOCK threads).
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
// `HostOptimizer::step_scaled`: master → parameters, rounded).
extern "C" __global__ void adamw_step(float* param, const float* grad, float* m, float* v,
                                      float* work, const unsigned* bounds, int nbounds, int n,
                                      float mult, float step_size, float w1, float b2, float w2,
                                      float bc2_sqrt, float eps, int decay_mode, float decay_mul,
                                      float wd, int store) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;  // no barrier below
    float g = op_mul(grad[i], mult);
    float p = param[i];
    if (decay_mode != DECAY_NONE && decays_at(bounds, nbounds, (unsigned)i)) {
        if (decay_mode == DECAY_DECOUPLED) p = op_mul(p, decay_mul);  // AdamW: p *= 1 − lr·wd
        else g = op_add(g, op_mul(wd, p));                            // Adam L2: g += wd·p
    }
    // m += w1·(g − m): torch.lerp with weight < 0.5 (adam.rs).
    float mi = m[i];
    mi = op_add(mi, op_mul(w1, op_sub(g, mi)));
    // v = v·β₂ + (w2·g)·g, left to right as adam.rs writes `v * b2 + w2 * g * g`.
    float vi = v[i];
    vi = op_add(op_mul(vi, b2), op_mul(op_mul(w2, g), g));
    // denom = √v / √(1 − β₂ᵗ) + eps; p += (step_size·m) / denom.
    float denom = op_add(op_div(op_sqrt(vi), bc2_sqrt), eps);
    p = op_add(p, op_div(op_mul(step_size, mi), denom));
    m[i] = mi;
    v[i] = vi;
    param[i] = p;
    if (work) work[i] = st(p, store);
}
