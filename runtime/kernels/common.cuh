// Shared device helpers for every kernel file. Header-free on purpose: NVRTC ships no CUDA headers
// (../../docs/cuda.md, "Kernels"), so half rounding is inline PTX and constants are bit patterns.
//
// The same text compiles for the CPU under runtime/emu/cpp/cuda_emu.hpp (RECIPE_EMU defined),
// which is how the kernels are tested on machines without a GPU.
#pragma once

#ifndef RECIPE_EMU
// A kernel's dynamically sized shared memory, `name` of element type `T`.
#define DYN_SHARED(T, name) extern __shared__ T name[]
#endif

// Unrolls the loop it precedes on the GPU (a loop over a fixed count of per-thread
// accumulators, kept in registers); the CPU emulation's compiler has no such pragma.
#ifdef RECIPE_EMU
#define UNROLL
#define NO_UNROLL
#else
#define UNROLL _Pragma("unroll")
// Keeps a loop rolled (a short loop over a long body, which unrolled would bloat the program).
#define NO_UNROLL _Pragma("unroll 1")
#endif
// Rows a column sum loads before it adds them (column_sum, layernorm_bwd_dwdb): its additions
// stay in row order, but its loads no longer wait for each other (docs/cuda.md, "Performance").
#define ROWS_AHEAD 8

// Storage dtypes, the values of the `store` argument (runtime/src/backend/kernels/mod.rs).
#define STORE_F32 0
#define STORE_F16 1
#define STORE_BF16 2

// Block size every 1-D kernel is launched with (kernels/mod.rs, `BLOCK`).
#define BLOCK 256

// The first statement of every kernel. A kernel launched as a programmatic dependent launch
// (RECIPE_PDL=1 on sm_90 and newer; docs/cuda.md, "Programmatic dependent launch") may be
// scheduled before the kernel ahead of it in its stream has finished: it waits here, before any
// access to global memory (a read of what that kernel writes, or a write of what it reads),
// until that kernel has completed and its writes are visible. Every block waiting so, a kernel
// completes only after the one ahead of it, so the order holds along a whole stream. Without
// such a launch, before sm_90 and in the CPU emulation (blocks one after another), nothing.
// Compiled with RECIPE_PDL_EARLY (RECIPE_PDL=early), each block then also signals that the
// next kernel may be scheduled: once every block of this one has, the next one's blocks may
// take the SMs this one's leave, each waiting here in turn; without it the next kernel is
// launched as this one's blocks exit.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900 && defined(RECIPE_PDL_EARLY)
#define GRID_WAIT() \
    asm volatile("griddepcontrol.wait;\n\tgriddepcontrol.launch_dependents;" ::: "memory")
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define GRID_WAIT() asm volatile("griddepcontrol.wait;" ::: "memory")
#else
#define GRID_WAIT() ((void)0)
#endif

__device__ __forceinline__ float f32_inf() { return __int_as_float(0x7f800000); }
// torch.finfo(float32).min, HF's additive attention mask value.
__device__ __forceinline__ float f32_lowest() { return __int_as_float(0xff7fffff); }

// `x` rounded to the storage dtype (to nearest, ties to even) and widened back, as a device that
// stores fp16/bf16 keeps it. The CPU backend does the same through the `half` crate.
// bf16's 16 bits of `x` by integer arithmetic, rounded to nearest even (a NaN stays a quiet NaN):
// the emulation's, and the GPU's before sm_80, whose PTX has no cvt.rn.bf16.f32.
__device__ __forceinline__ unsigned short bf16_bits_int(float x) {
    unsigned u = __float_as_uint(x);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (unsigned short)((u >> 16) | 0x40u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (unsigned short)(u >> 16);
}

// bf16's 16 bits of `x`, rounded to nearest even.
__device__ __forceinline__ unsigned short bf16_bits(float x) {
#if defined(RECIPE_EMU) || (defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800)
    return bf16_bits_int(x);
#else
    unsigned short b;
    asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(b) : "f"(x));
    return b;
#endif
}

__device__ __forceinline__ float st(float x, int store) {
    if (store == STORE_F32) return x;
#ifdef RECIPE_EMU
    if (store == STORE_F16) return (float)(_Float16)x;
#else
    if (store == STORE_F16) {
        unsigned short h;
        float r;
        asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(x));
        asm("cvt.f32.f16 %0, %1;" : "=f"(r) : "h"(h));
        return r;
    }
#endif
    return __uint_as_float(((unsigned)bf16_bits(x)) << 16);
}

// The 16 bits the half dtype `store` (STORE_F16 or STORE_BF16) keeps for `x`, rounded to nearest
// even: an operand of a tensor-core GEMM. A value already stored rounded (`st`) packs exactly.
__device__ __forceinline__ unsigned short half_bits(float x, int store) {
    if (store != STORE_F16) return bf16_bits(x);
#ifdef RECIPE_EMU
    _Float16 h = (_Float16)x;
    unsigned short b;
    __builtin_memcpy(&b, &h, 2);
    return b;
#else
    unsigned short h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(x));
    return h;
#endif
}

// fp16 bits widened to f32 (exact).
__device__ __forceinline__ float f16_value(unsigned short b) {
#ifdef RECIPE_EMU
    _Float16 h;
    __builtin_memcpy(&h, &b, 2);
    return (float)h;
#else
    float r;
    asm("cvt.f32.f16 %0, %1;" : "=f"(r) : "h"(b));
    return r;
#endif
}

// The value of a 16-bit element of half type S (STORE_F16 or STORE_BF16), exactly.
template <int S>
__device__ __forceinline__ float half_value(unsigned short b) {
    return S == STORE_BF16 ? __uint_as_float(((unsigned)b) << 16) : f16_value(b);
}

// The column of element i of a matrix `cols` wide: in 32 bits when i fits, else in 64 (a 64-bit
// remainder is a long software sequence on a GPU; on the H200 the bias kernels' time did not
// change without it: docs/cuda.md, "Performance").
__device__ __forceinline__ int col_of(long long i, int cols) {
    if (i <= 0x7fffffffLL) return (int)((unsigned)i % (unsigned)cols);
    return (int)(i % cols);
}
// Element i of a buffer whose elements are of type t (STORE_F32: floats; STORE_F16/STORE_BF16:
// the 16 bits a device keeps a stored fp16/bf16 activation in, runtime/src/backend/device.rs
// `Arg::Typed`), as f32. The kernels that take such a buffer take its type after it.
__device__ __forceinline__ float ld(const void* p, long long i, int t) {
    if (t == STORE_F32) return ((const float*)p)[i];
    unsigned short b = ((const unsigned short*)p)[i];
    return t == STORE_BF16 ? __uint_as_float(((unsigned)b) << 16) : f16_value(b);
}

// ld with the type known at compile time: in a loop, the loads of several iterations can then be
// issued before the first one's value is used (a run-time type is a branch in every iteration,
// which keeps them one at a time).
template <int T>
__device__ __forceinline__ float ldt(const void* p, long long i) {
    if (T == STORE_F32) return ((const float*)p)[i];
    return half_value<T>(((const unsigned short*)p)[i]);
}
// acc + Σ x[r, c] for r in [r0, r1) of a matrix `cols` wide of type T, added in row order, the
// loads AHEAD rows at a time. A short grid of long columns (bias_grad's second pass: 3 blocks
// for BERT-base) waits on its loads' round trips, one per AHEAD rows, so it takes more.
template <int T, int AHEAD = ROWS_AHEAD>
__device__ __forceinline__ float column_sum(float acc, const void* x, int r0, int r1, int cols,
                                            int c) {
    int r = r0;
    for (; r + AHEAD <= r1; r += AHEAD) {
        float v[AHEAD];
        UNROLL
        for (int u = 0; u < AHEAD; u++) v[u] = ldt<T>(x, (long long)(r + u) * cols + c);
        UNROLL
        for (int u = 0; u < AHEAD; u++) acc += v[u];
    }
    for (; r < r1; r++) acc += ldt<T>(x, (long long)r * cols + c);
    return acc;
}
// acc + Σ part[r, c] for r in [0, rows), added in row order, 32 rows' loads at a time: the chunk
// sums other blocks of the same launch wrote, read from L2 (`__ldcg`) since this SM's L1 is not
// kept coherent with their writes.
__device__ __forceinline__ float chunk_sums(float acc, const float* part, int rows, int cols,
                                            int c) {
    const int AHEAD = 32;
    int r = 0;
    for (; r + AHEAD <= rows; r += AHEAD) {
        float v[AHEAD];
        UNROLL
        for (int u = 0; u < AHEAD; u++) v[u] = __ldcg(part + (long long)(r + u) * cols + c);
        UNROLL
        for (int u = 0; u < AHEAD; u++) acc += v[u];
    }
    for (; r < rows; r++) acc += __ldcg(part + (long long)r * cols + c);
    return acc;
}
// A column sum's second pass in the launch of its first (no launch of its own: docs/cuda.md,
// "Performance"). The blocks of a (columns × chunks) grid each write their chunk's sums, then
// count themselves in `done[blockIdx.x]`; the last of a column of blocks to count, whichever it
// is, adds the chunks' sums in chunk order, so the bits do not depend on the blocks' order (the
// emulator's tests run them in reverse too). That block sets the counter back to zero for the
// next launch (the counters start at zero: kernels/mod.rs, `with_counters`). Every thread of the
// block must call it (two barriers).
__device__ __forceinline__ bool last_of_column(unsigned* done) {
    __shared__ int last;
    __threadfence();  // this block's sums reach every SM before its count does
    __syncthreads();
    if (threadIdx.x == 0) {
        last = atomicAdd(&done[blockIdx.x], 1u) == gridDim.y - 1;
        if (last) {
            done[blockIdx.x] = 0;
            __threadfence();  // the others' sums, counted before, are seen after this
        }
    }
    __syncthreads();
    return last;
}
// Calls F<T>(args...) for the run-time type t (STORE_F32, STORE_F16 or STORE_BF16).
#define BY_TYPE(t, F, ...)                    \
    do {                                      \
        if ((t) == STORE_F32)                 \
            F<STORE_F32>(__VA_ARGS__);        \
        else if ((t) == STORE_F16)            \
            F<STORE_F16>(__VA_ARGS__);        \
        else                                  \
            F<STORE_BF16>(__VA_ARGS__);       \
    } while (0)
// The vectorised path of the elementwise and LayerNorm kernels (docs/cuda.md, "Performance"):
// a thread takes VEC consecutive elements (kernels/mod.rs, `VEC`), loaded and stored 16 bytes
// at a time with every type known at compile time, so that its loads are issued together and
// no per-element branch on a run-time type remains. A kernel takes it where its buffers allow
// (16-byte aligned, rows a multiple of VEC wide, the activations all of the storage dtype; the
// parameters, loaded once per VEC elements, of any type: ldv_rt); elsewhere the same thread
// takes the same elements one by one through `ld`/`sto`. Both compute the same operations in
// the same order, so the same bits.
#define VEC 8

__device__ __forceinline__ bool aligned16(const void* p) {
    return ((unsigned long long)p & 15) == 0;
}

// The 16 bytes at p (16-byte aligned) as four words, and back.
__device__ __forceinline__ void ld16(unsigned w[4], const void* p) {
#ifdef RECIPE_EMU
    emu::check_aligned(p, 16, "ld16");
    std::memcpy(w, p, 16);
#else
    uint4 u = *(const uint4*)p;
    w[0] = u.x; w[1] = u.y; w[2] = u.z; w[3] = u.w;
#endif
}
__device__ __forceinline__ void st16(void* p, const unsigned w[4]) {
#ifdef RECIPE_EMU
    emu::check_aligned(p, 16, "st16");
    std::memcpy(p, w, 16);
#else
    uint4 u;
    u.x = w[0]; u.y = w[1]; u.z = w[2]; u.w = w[3];
    *(uint4*)p = u;
#endif
}

// The 8 bytes at p (8-byte aligned) set to two words: four 16-bit elements.
__device__ __forceinline__ void st8(void* p, unsigned lo, unsigned hi) {
#ifdef RECIPE_EMU
    emu::check_aligned(p, 8, "st8");
    const unsigned w[2] = {lo, hi};
    std::memcpy(p, w, 8);
#else
    uint2 u;
    u.x = lo;
    u.y = hi;
    *(uint2*)p = u;
#endif
}

// Elements i … i + VEC − 1 of a buffer of type T, raw: VEC words for f32, VEC / 2 for a half
// type (two elements a word, the first in the low half). i is a multiple of VEC.
template <int T>
__device__ __forceinline__ void ld_words(unsigned w[VEC], const void* p, long long i) {
    if (T == STORE_F32) {
        ld16(w, (const float*)p + i);
        ld16(w + 4, (const float*)p + i + 4);
    } else {
        ld16(w, (const unsigned short*)p + i);
    }
}
// Element u of ld_words' words, as f32 (ldt's value).
template <int T>
__device__ __forceinline__ float unpack(const unsigned w[VEC], int u) {
    if (T == STORE_F32) return __uint_as_float(w[u]);
    return half_value<T>((unsigned short)((u & 1) ? w[u >> 1] >> 16 : w[u >> 1] & 0xffffu));
}
// Elements i … i + VEC − 1 of a buffer of type T as f32.
template <int T>
__device__ __forceinline__ void ldv(float v[VEC], const void* p, long long i) {
    unsigned w[VEC];
    ld_words<T>(w, p, i);
    UNROLL
    for (int u = 0; u < VEC; u++) v[u] = unpack<T>(w, u);
}
// ldv with the type t known at run time, for operands loaded once per VEC elements (the
// parameters): the second 16 bytes of an f32 row are a predicated load and each element's value
// a select, where a branch per type would have the compiler copy the code after it per type.
__device__ __forceinline__ void ldv_rt(float v[VEC], const void* p, long long i, int t) {
    bool f32 = t == STORE_F32;
    const char* at = (const char*)p + i * (f32 ? 4 : 2);
    unsigned w[VEC] = {0, 0, 0, 0, 0, 0, 0, 0};
    ld16(w, at);
    if (f32) ld16(w + 4, at + 16);
    UNROLL
    for (int u = 0; u < VEC; u++) {
        unsigned short b = (unsigned short)((u & 1) ? w[u >> 1] >> 16 : w[u >> 1]);
        float h = t == STORE_BF16 ? __uint_as_float(((unsigned)b) << 16) : f16_value(b);
        v[u] = f32 ? __uint_as_float(w[u]) : h;
    }
}
// v (values already rounded to T where T is a half type: `st`) as the words ld_words would
// load for them, exactly.
template <int T>
__device__ __forceinline__ void pack_words(unsigned w[VEC], const float v[VEC]) {
    if (T == STORE_F32) {
        UNROLL
        for (int u = 0; u < VEC; u++) w[u] = __float_as_uint(v[u]);
    } else {
        UNROLL
        for (int u = 0; u < VEC / 2; u++)
            w[u] = (unsigned)half_bits(v[2 * u], T) | ((unsigned)half_bits(v[2 * u + 1], T) << 16);
    }
}
// Stores pack_words' (or ld_words') words as elements i … i + VEC − 1 of a buffer of type T.
template <int T>
__device__ __forceinline__ void st_words(void* p, long long i, const unsigned w[VEC]) {
    if (T == STORE_F32) {
        st16((float*)p + i, w);
        st16((float*)p + i + 4, w + 4);
    } else {
        st16((unsigned short*)p + i, w);
    }
}
// Stores v (values already rounded to T where T is a half type: `st`) as elements
// i … i + VEC − 1 of a buffer of type T, exactly.
template <int T>
__device__ __forceinline__ void stv(void* p, long long i, const float v[VEC]) {
    unsigned w[VEC];
    pack_words<T>(w, v);
    st_words<T>(p, i, w);
}

// Stores v as element i of a buffer of type t (ld's): a value already rounded to that dtype
// (st) keeps its bits exactly.
__device__ __forceinline__ void sto(void* p, long long i, float v, int t) {
    if (t == STORE_F32) {
        ((float*)p)[i] = v;
    } else {
        ((unsigned short*)p)[i] = half_bits(v, t);
    }
}

// IEEE f32 operations, rounded to nearest and never fused into an FMA. NVRTC compiles with
// --fmad=true (backend/cuda/compile.rs), which would contract `a * b + c`; the host (Rust)
// rounds every product and sum, and these keep the device on the same bits (optim.cu, and the
// fused elementwise kernels). g++ has no FMA to contract into on baseline x86-64, so the
// emulation uses the plain operators.
#ifdef RECIPE_EMU
#ifdef RECIPE_EMU_CONTRACT
// The emulation built to fuse like NVRTC (runtime/emu/build.rs): a call it cannot see into is
// a product or sum it cannot fuse with its neighbours.
#define RECIPE_OP __attribute__((noinline))
#else
#define RECIPE_OP __device__ __forceinline__
#endif
RECIPE_OP float op_mul(float a, float b) { return a * b; }
RECIPE_OP float op_add(float a, float b) { return a + b; }
RECIPE_OP float op_sub(float a, float b) { return a - b; }
__device__ __forceinline__ float op_div(float a, float b) { return a / b; }
__device__ __forceinline__ float op_sqrt(float a) { return std::sqrt(a); }
__device__ __forceinline__ float op_fma(float a, float b, float c) { return std::fma(a, b, c); }
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
// a·b + c rounded once: the host's `f32::mul_add` (sgd.rs, adagrad.rs), correctly rounded on both.
__device__ __forceinline__ float op_fma(float a, float b, float c) { return __fmaf_rn(a, b, c); }
__device__ __forceinline__ unsigned long long f64_bits(double x) {
    return (unsigned long long)__double_as_longlong(x);
}
#endif

// Sum over the 32 lanes of a warp (every lane gets the total). The butterfly order is fixed, so
// the result does not depend on timing.
__device__ __forceinline__ float warp_sum(float v) {
    for (int m = 16; m > 0; m >>= 1) v += __shfl_xor_sync(0xffffffffu, v, m);
    return v;
}

// The same in double (LayerNorm's row statistics, runtime/kernels/layernorm.cu).
__device__ __forceinline__ double warp_sum_d(double v) {
    for (int m = 16; m > 0; m >>= 1) v += __shfl_xor_sync(0xffffffffu, v, m);
    return v;
}
__device__ __forceinline__ float warp_max(float v) {
    for (int m = 16; m > 0; m >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, m));
    return v;
}

// Sum of `v` (a double) over the whole block, returned to every thread. `scratch` holds 32
// doubles of shared memory. Every thread of the block must call it (it synchronises).
// Deterministic: warps reduce by butterfly, then warp 0 adds the warp totals in warp order. The
// kernels that match the CPU backend's f64 statistics (cross-entropy, the gradient norm) use it;
// LayerNorm's rows are a warp's each (warp_sum_d).
__device__ __forceinline__ double block_sum_d(double v, double* scratch) {
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    int warps = (blockDim.x + 31) >> 5;
    for (int m = 16; m > 0; m >>= 1) v += __shfl_xor_sync(0xffffffffu, v, m);
    __syncthreads();  // scratch may still be read by a previous call
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    if (warp == 0) {
        double t = lane < warps ? scratch[lane] : 0.0;
        for (int m = 16; m > 0; m >>= 1) t += __shfl_xor_sync(0xffffffffu, t, m);
        if (lane == 0) scratch[0] = t;
    }
    __syncthreads();
    return scratch[0];
}

__device__ __forceinline__ float block_max(float v, float* scratch) {
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    int warps = (blockDim.x + 31) >> 5;
    v = warp_max(v);
    __syncthreads();
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    if (warp == 0) {
        float t = lane < warps ? scratch[lane] : -f32_inf();
        t = warp_max(t);
        if (lane == 0) scratch[0] = t;
    }
    __syncthreads();
    return scratch[0];
}

// Philox4x32-10 (runtime/src/rng.rs): counter (c0..c3) under key (k0, k1), four words out.
__device__ __forceinline__ void philox4x32(unsigned c[4], unsigned k0, unsigned k1) {
    for (int r = 0; r < 10; r++) {
        unsigned hi0 = __umulhi(0xD2511F53u, c[0]), lo0 = 0xD2511F53u * c[0];
        unsigned hi1 = __umulhi(0xCD9E8D57u, c[2]), lo1 = 0xCD9E8D57u * c[2];
        unsigned n0 = hi1 ^ c[1] ^ k0, n2 = hi0 ^ c[3] ^ k1;
        c[0] = n0; c[1] = lo1; c[2] = n2; c[3] = lo0;
        k0 += 0x9E3779B9u; k1 += 0xBB67AE85u;
    }
}

// The dropout multiplier of element `idx` of stream `stream`: word idx % 4 of the Philox block
// idx / 4 kept iff ≥ threshold (runtime/src/backend/cpu.rs, `MaskKey`).
__device__ __forceinline__ float dropout_mult(unsigned long long idx, unsigned long long seed,
                                              unsigned long long stream, unsigned threshold,
                                              float scale) {
    unsigned long long blk = idx >> 2;
    unsigned c[4] = {(unsigned)blk, (unsigned)(blk >> 32), (unsigned)stream,
                     (unsigned)(stream >> 32)};
    philox4x32(c, (unsigned)seed, (unsigned)(seed >> 32));
    // Selected by branches, not `c[idx & 3]`: an array indexed at run time lives in local
    // memory (a stack frame ptxas reports), where registers suffice.
    unsigned w = (idx & 2) ? ((idx & 1) ? c[3] : c[2]) : ((idx & 1) ? c[1] : c[0]);
    return w >= threshold ? scale : 0.0f;
}

// Which of elements 4·blk … 4·blk + 3 dropout keeps: bit w set iff word w of Philox block blk is
// at least the threshold (dropout_mult's rule, one Philox call for four elements).
__device__ __forceinline__ unsigned dropout_keep4(unsigned long long blk, unsigned long long seed,
                                                  unsigned long long stream, unsigned threshold) {
    unsigned c[4] = {(unsigned)blk, (unsigned)(blk >> 32), (unsigned)stream,
                     (unsigned)(stream >> 32)};
    philox4x32(c, (unsigned)seed, (unsigned)(seed >> 32));
    unsigned bits = 0;
    UNROLL
    for (int w = 0; w < 4; w++) bits |= (c[w] >= threshold ? 1u : 0u) << w;
    return bits;
}

// The dropout multipliers of elements 4·blk … 4·blk + 3 (dropout_keep4's bits: scale or 0).
__device__ __forceinline__ void dropout_mult4(float m[4], unsigned long long blk,
                                              unsigned long long seed, unsigned long long stream,
                                              unsigned threshold, float scale) {
    unsigned bits = dropout_keep4(blk, seed, stream, threshold);
    UNROLL
    for (int w = 0; w < 4; w++) m[w] = (bits >> w) & 1u ? scale : 0.0f;
}

// Two floats as the 16-bit pair a tensor-core operand register holds (x0 in the low half, the
// element of the lower index), each rounded to nearest even.
template <int S>
__device__ __forceinline__ unsigned pack_half2(float x0, float x1) {
    return (unsigned)half_bits(x0, S) | ((unsigned)half_bits(x1, S) << 16);
}
// The 32 bits at p (4-byte aligned) of a 16-bit array: two elements.
__device__ __forceinline__ unsigned ld_pair(const unsigned short* p) {
#ifdef RECIPE_EMU
    emu::check_aligned(p, 4, "ld_pair");
    unsigned w;
    std::memcpy(&w, p, 4);
    return w;
#else
    return *(const unsigned*)p;
#endif
}

// The 32 bits at p (4-byte aligned) of a 16-bit array set to w: two elements.
__device__ __forceinline__ void st_pair(unsigned short* p, unsigned w) {
#ifdef RECIPE_EMU
    emu::check_aligned(p, 4, "st_pair");
    std::memcpy(p, &w, 4);
#else
    *(unsigned*)p = w;
#endif
}

// d += a·b for one warp's 16×8 tile, a 16×16 and b 16×8, 16-bit operands of type S with f32
// accumulation: PTX's mma.sync.aligned.m16n8k16.row.col (sm_80 on). The fragments are the PTX
// ISA's layout ("Matrix Fragments for mma.m16n8k16"), g = lane / 4, t = lane % 4: a[0] holds
// row g, columns 2t and 2t + 1, a[1] row g + 8, a[2] and a[3] the same rows at columns + 8;
// b[0] holds rows (k) 2t and 2t + 1 of column g, b[1] rows + 8; d[0], d[1] row g, columns 2t
// and 2t + 1, d[2], d[3] row g + 8. Every lane of the warp takes part.
template <int S>
__device__ __forceinline__ void mma_16816(float d[4], const unsigned a[4], const unsigned b[2]) {
#ifdef RECIPE_EMU
    // The emulation: every lane's registers exchanged, then each output as its f32 sum over k in
    // order (a tensor core's order of additions is its own: compared within a tolerance). The
    // lane's two rows of A and two columns of B are read from the lanes holding them and
    // converted once, not once per output.
    unsigned mine[6] = {a[0], a[1], a[2], a[3], b[0], b[1]};
    const unsigned* all = emu::warp_exchange(mine, 6);
    constexpr unsigned W = emu::GATHER_WORDS;  // a lane's slot
    int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    auto half = [](unsigned w, int k) { return half_value<S>((unsigned short)(w >> (16 * (k & 1)))); };
    float av[2][16], bv[2][16];
    for (int k = 0; k < 16; k++) {
        const unsigned* la = all + W * (4 * g + ((k & 7) >> 1));
        av[0][k] = half(la[k >= 8 ? 2 : 0], k);
        av[1][k] = half(la[1 + (k >= 8 ? 2 : 0)], k);
        for (int c = 0; c < 2; c++)
            bv[c][k] = half(all[W * (4 * (2 * t + c) + ((k & 7) >> 1)) + 4 + (k >= 8 ? 1 : 0)], k);
    }
    for (int r = 0; r < 4; r++) {
        const float* x = av[r >> 1];
        const float* y = bv[r & 1];
        float acc = d[r];
        for (int k = 0; k < 16; k++) acc += x[k] * y[k];
        d[r] = acc;
    }
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    if (S == STORE_BF16)
        asm volatile(
            "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, "
            "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
            : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
    else
        asm volatile(
            "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, "
            "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
            : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#else
    // Before sm_80 there is no such instruction: the runtime never launches a kernel using it
    // there (Device::has_mma).
    __trap();
#endif
}

// A dropout site's Philox key and stream. The micro-batch's (seed, first stream) live in device
// memory as four 32-bit words, `key` (written once per micro-batch), and the site's offset from
// that stream is the launch's argument, so that a pass launches the same arguments for every
// micro-batch of a shape: a captured CUDA graph replays it (runtime/src/backend/mod.rs,
// `Dropout::site`). Read only where dropout applies (`key` may be null otherwise).
struct DropKey {
    unsigned long long seed, stream;
};
__device__ __forceinline__ DropKey drop_key(const unsigned* key, unsigned long long site) {
    DropKey k;
    k.seed = (unsigned long long)key[0] | ((unsigned long long)key[1] << 32);
    k.stream = ((unsigned long long)key[2] | ((unsigned long long)key[3] << 32)) + site;
    return k;
}
