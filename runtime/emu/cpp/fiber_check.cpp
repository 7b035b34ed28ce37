// Checks of the emulation's own scheduling in its fiber mode (tests/fibers.rs), on kernels written
// for it: what cuda_emu.hpp promises about threads, barriers and exits, which the shipped kernels
// alone do not exercise (none returns early before a barrier).
//
// Usage: fiber_check GROUP, GROUP one of
//   early      threads that returned are not waited for at their block's later __syncthreads,
//              over several blocks (each block's shared memory its own in turn), whether they
//              are the block's last threads, its first or both;
//   shapes     3-D blocks and grids, a 1024-thread block: thread and block indices, block_max,
//              block_sum_d and the shuffles give the exact values;
//   lane-exit  a warp shuffle after a lane of its warp returned cannot complete: reported on
//              stderr, and the process aborts;
//   misaligned-16, misaligned-pair
//              a 16-byte load (common.cuh's ld16) one float past a 16-byte boundary, a 32-bit
//              pair (ld_pair) one 16-bit element past a word: a misaligned address on a GPU,
//              reported on stderr, and the process aborts (after the same access aligned runs).
// Exits 0 when the group's results are right, 1 when not.
#include "cuda_emu.hpp"

#include <cstdio>
#include <cstring>
#include <utility>
#include <vector>

#include "common.cuh"

#ifdef RECIPE_EMU_OS_THREADS
#error "fiber_check tests the fiber mode"
#endif

namespace {

// Threads in [lo, hi) swap values through shared memory twice; the others return first. With
// lo > 0 the first live thread starts on the stack of the threads that returned before it (the
// scheduler runs a thread there when every thread started so far has returned) and is then
// suspended and resumed at the barriers like the others.
__global__ void early_exit(int* out, int lo, int hi) {
    __shared__ int s[128];
    int t = threadIdx.x;
    if (t < lo || t >= hi) return;
    s[t] = t + 1000 * (int)blockIdx.x;
    __syncthreads();
    int a = s[lo + hi - 1 - t];
    __syncthreads();
    s[t] = 2 * a;
    __syncthreads();
    out[blockIdx.x * blockDim.x + t] = s[lo + hi - 1 - t];
}

bool early() {
    const int blocks = 3, threads = 96;
    for (auto [lo, hi] : {std::pair{0, 40}, std::pair{37, 96}, std::pair{5, 70}}) {
        std::vector<int> out(blocks * threads, -1);
        emu::launch(dim3(blocks), dim3(threads), 0, [&] { early_exit(out.data(), lo, hi); });
        for (int b = 0; b < blocks; b++)
            for (int t = 0; t < threads; t++) {
                int want = t >= lo && t < hi ? 2 * (t + 1000 * b) : -1;
                if (out[b * threads + t] != want) {
                    std::fprintf(stderr, "early [%d, %d): block %d thread %d: %d, want %d\n", lo,
                                 hi, b, t, out[b * threads + t], want);
                    return false;
                }
            }
    }
    return true;
}

// Per thread: its linear index within the block and the block's, the block's largest and summed
// linear index (common.cuh's float max and double sum reductions, on 1-D blocks: they take
// threadIdx.x for the index; else -1), lane 3's value broadcast, and the value from one lane down.
__global__ void indices(double* out) {
    __shared__ float red[32];
    __shared__ double redd[32];
    unsigned t = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
    unsigned b = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
    unsigned n = blockDim.x * blockDim.y * blockDim.z;
    bool flat = blockDim.y * blockDim.z == 1;  // the same for every thread of the block
    float mf = flat ? block_max((float)t, red) : -1.0f;
    double sd = flat ? block_sum_d((double)t, redd) : -1.0;
    float bcast = __shfl_sync(0xffffffffu, (float)t, 3);
    float down = __shfl_down_sync(0xffffffffu, (float)t, 1);
    double* o = out + 6 * (b * n + t);
    o[0] = t;
    o[1] = b;
    o[2] = mf;
    o[3] = sd;
    o[4] = bcast;
    o[5] = down;
}

bool shapes() {
    struct Shape {
        dim3 grid, block;
    };
    const Shape cases[] = {
        {dim3(2, 2, 2), dim3(8, 4, 2)}, {dim3(1), dim3(1024)}, {dim3(3), dim3(64)}};
    for (const Shape& c : cases) {
        unsigned n = c.block.x * c.block.y * c.block.z, blocks = c.grid.x * c.grid.y * c.grid.z;
        std::vector<double> out(6 * n * blocks, -1.0);
        emu::launch(c.grid, c.block, 0, [&] { indices(out.data()); });
        bool flat = c.block.y * c.block.z == 1;
        double sum = flat ? (double)n * (n - 1) / 2 : -1.0, max = flat ? n - 1.0 : -1.0;
        for (unsigned b = 0; b < blocks; b++)
            for (unsigned t = 0; t < n; t++) {
                const double* o = &out[6 * (b * n + t)];
                unsigned lane = t & 31, warp0 = t - lane;
                double want[6] = {(double)t, (double)b, max, sum, (double)(warp0 + 3),
                                  (double)(lane < 31 ? t + 1 : t)};
                for (int k = 0; k < 6; k++)
                    if (o[k] != want[k]) {
                        std::fprintf(stderr, "shapes: %u threads, block %u thread %u value %d: %g, "
                                     "want %g\n", n, b, t, k, o[k], want[k]);
                        return false;
                    }
            }
    }
    return true;
}

__global__ void exit_then_shuffle(float* out) {
    if (threadIdx.x == 5) return;
    out[threadIdx.x] = warp_sum(1.0f);
}

bool lane_exit() {
    std::vector<float> out(64);
    emu::launch(dim3(1), dim3(64), 0, [&] { exit_then_shuffle(out.data()); });
    std::fprintf(stderr, "lane-exit: the launch returned\n");
    return false;
}

__global__ void partial_warp_shuffle(float* out) { out[threadIdx.x] = warp_sum(1.0f); }

bool partial_warp() {
    std::vector<float> out(48);
    emu::launch(dim3(1), dim3(48), 0, [&] { partial_warp_shuffle(out.data()); });
    std::fprintf(stderr, "partial-warp: the launch returned\n");
    return false;
}

// Thread 0 loads 16 bytes (`pair` 0) or a 16-bit pair at element `at` of p.
__global__ void wide_load(const float* p, int at, int pair, unsigned* out) {
    if (threadIdx.x != 0) return;
    if (pair) {
        out[0] = ld_pair((const unsigned short*)p + at);
    } else {
        ld16(out, p + at);
    }
}

bool misaligned(int pair) {
    alignas(16) float in[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    unsigned out[4] = {0, 0, 0, 0};
    int aligned = pair ? 2 : 4;
    emu::launch(dim3(1), dim3(32), 0, [&] { wide_load(in, aligned, pair, out); });
    if (out[0] != __float_as_uint(in[pair ? 1 : 4])) {
        std::fprintf(stderr, "misaligned: the aligned load read %#x\n", out[0]);
        return false;
    }
    emu::launch(dim3(1), dim3(32), 0, [&] { wide_load(in, 1, pair, out); });
    std::fprintf(stderr, "misaligned: the launch returned\n");
    return false;
}

}  // namespace

int main(int argc, char** argv) {
    if (argc != 2) return 2;
    bool ok;
    if (std::strcmp(argv[1], "early") == 0) ok = early();
    else if (std::strcmp(argv[1], "shapes") == 0) ok = shapes();
    else if (std::strcmp(argv[1], "lane-exit") == 0) ok = lane_exit();
    else if (std::strcmp(argv[1], "partial-warp") == 0) ok = partial_warp();
    else if (std::strcmp(argv[1], "misaligned-16") == 0) ok = misaligned(0);
    else if (std::strcmp(argv[1], "misaligned-pair") == 0) ok = misaligned(1);
    else return 2;
    return ok ? 0 : 1;
}
