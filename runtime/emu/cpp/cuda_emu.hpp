// The CUDA execution model on the CPU, enough to run runtime/kernels/*.cu unchanged (C++20).
//
// One OS thread per CUDA thread of a block; the blocks of a launch run one after another on the
// same threads. `__syncthreads` is a std::barrier over the block, warp shuffles go through a
// per-thread slot and a per-warp barrier. `__shared__` variables are `static`: one block runs at a
// time and launches are serialised, so a static is exactly one block's shared memory. Built with
// -fsanitize=thread, a missing `__syncthreads` shows up as a data race (tests/tsan.rs).
//
// Why this exists: CI has no GPU (docs/cuda.md, "How the kernels are proven").
#pragma once

#include <algorithm>
#include <atomic>
#include <barrier>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#define RECIPE_EMU 1

struct dim3 {
    unsigned x = 1, y = 1, z = 1;
    dim3() = default;
    dim3(unsigned x_, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};

namespace emu {

struct Launch {
    dim3 grid, block;
    unsigned threads = 0;
    std::vector<unsigned char> dyn_smem;
    std::unique_ptr<std::barrier<>> block_bar;
    std::vector<std::unique_ptr<std::barrier<>>> warp_bars;
    std::vector<uint64_t> lanes;  // one shuffle slot per thread
};

inline Launch* cur = nullptr;
inline thread_local dim3 tid, bid;
inline thread_local unsigned linear = 0;
inline std::mutex launch_mu;

// Runs `body` as a kernel over `grid` × `block` threads with `smem` bytes of dynamic shared memory.
template <class F>
void launch(dim3 grid, dim3 block, size_t smem, F body) {
    std::lock_guard<std::mutex> guard(launch_mu);
    Launch l;
    l.grid = grid;
    l.block = block;
    l.threads = block.x * block.y * block.z;
    l.dyn_smem.assign(smem + 16, 0);
    l.block_bar = std::make_unique<std::barrier<>>(l.threads);
    for (unsigned w = 0; w * 32 < l.threads; w++) {
        unsigned n = std::min(32u, l.threads - w * 32);
        l.warp_bars.push_back(std::make_unique<std::barrier<>>(n));
    }
    l.lanes.assign(l.threads, 0);
    cur = &l;
    std::vector<std::thread> pool;
    pool.reserve(l.threads);
    for (unsigned t = 0; t < l.threads; t++) {
        pool.emplace_back([&l, &body, t] {
            linear = t;
            tid = dim3(t % l.block.x, (t / l.block.x) % l.block.y, t / (l.block.x * l.block.y));
            for (unsigned z = 0; z < l.grid.z; z++)
                for (unsigned y = 0; y < l.grid.y; y++)
                    for (unsigned x = 0; x < l.grid.x; x++) {
                        bid = dim3(x, y, z);
                        body();
                        // The end of a block: the next block reuses the shared memory.
                        l.block_bar->arrive_and_wait();
                    }
        });
    }
    for (auto& th : pool) th.join();
    cur = nullptr;
}

inline void* dyn_smem() { return cur->dyn_smem.data(); }

template <class T>
T shuffle(T v, unsigned src_lane_xor, bool is_xor, unsigned src_abs) {
    static_assert(sizeof(T) <= 8);
    unsigned me = linear, warp = me / 32;
    uint64_t bits = 0;
    std::memcpy(&bits, &v, sizeof(T));
    cur->lanes[me] = bits;
    cur->warp_bars[warp]->arrive_and_wait();
    unsigned lane = me & 31;
    unsigned src = warp * 32 + (is_xor ? (lane ^ src_lane_xor) : src_abs);
    T out = v;
    if (src < cur->threads) std::memcpy(&out, &cur->lanes[src], sizeof(T));
    cur->warp_bars[warp]->arrive_and_wait();
    return out;
}

}  // namespace emu

#define threadIdx (emu::tid)
#define blockIdx (emu::bid)
#define blockDim (emu::cur->block)
#define gridDim (emu::cur->grid)
#define warpSize 32

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __restrict__ __restrict
#define __shared__ static
#define DYN_SHARED(T, name) T* name = static_cast<T*>(emu::dyn_smem())

inline void __syncthreads() { emu::cur->block_bar->arrive_and_wait(); }
inline void __syncwarp(unsigned = 0xffffffffu) { emu::cur->warp_bars[emu::linear / 32]->arrive_and_wait(); }

template <class T>
T __shfl_xor_sync(unsigned, T v, int mask) { return emu::shuffle(v, (unsigned)mask, true, 0); }
template <class T>
T __shfl_sync(unsigned, T v, int lane) { return emu::shuffle(v, 0, false, (unsigned)lane & 31); }
template <class T>
T __shfl_down_sync(unsigned, T v, unsigned d) {
    unsigned lane = emu::linear & 31;
    return emu::shuffle(v, 0, false, lane + d < 32 ? lane + d : lane);
}

inline float __int_as_float(int i) { float f; std::memcpy(&f, &i, 4); return f; }
inline float __uint_as_float(unsigned i) { float f; std::memcpy(&f, &i, 4); return f; }
inline int __float_as_int(float f) { int i; std::memcpy(&i, &f, 4); return i; }
inline unsigned __float_as_uint(float f) { unsigned i; std::memcpy(&i, &f, 4); return i; }
inline unsigned __umulhi(unsigned a, unsigned b) { return (unsigned)(((uint64_t)a * b) >> 32); }
inline float rsqrtf(float x) { return 1.0f / std::sqrt(x); }
inline float __expf(float x) { return std::exp(x); }
inline float __fdividef(float a, float b) { return a / b; }
template <class T> inline T __ldg(const T* p) { return *p; }
using std::max;
using std::min;

inline float atomicAdd(float* p, float v) { return std::atomic_ref<float>(*p).fetch_add(v); }
inline unsigned atomicAdd(unsigned* p, unsigned v) { return std::atomic_ref<unsigned>(*p).fetch_add(v); }
inline int atomicOr(int* p, int v) { return std::atomic_ref<int>(*p).fetch_or(v); }
inline unsigned atomicOr(unsigned* p, unsigned v) { return std::atomic_ref<unsigned>(*p).fetch_or(v); }
