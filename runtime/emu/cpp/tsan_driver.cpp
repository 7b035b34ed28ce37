// A ThreadSanitizer driver for the emulation (tests/tsan.rs): runs the attention kernels once on
// small shapes, built with -fsanitize=thread against one kernel source. Under the emulation every
// CUDA thread is an OS thread and `__shared__` is a static, so a missing __syncthreads between a
// shared-memory write and another thread's read is a data race TSan reports.
//
// The include path decides which source is built: runtime/kernels (the real one) or a temporary
// copy with a barrier removed on purpose (the test that TSan catches it).
#include "cuda_emu.hpp"

#include <cstdio>
#include <vector>

#include "attention.cu"

int main() {
    // Two heads over 36 keys: blocks of 64 threads (two warps, so block_sum crosses warps).
    const int batch = 2, seq = 36, heads = 2, dim = 4;
    const int tok = batch * seq * heads * dim, pp = batch * heads * seq * seq;
    std::vector<float> q(tok), k(tok), v(tok), dctx(tok), ctx(tok), dq(tok), dk(tok), dv(tok);
    std::vector<float> probs(pp), pdrop(pp), ds(pp);
    std::vector<unsigned> mask(batch * seq, 1);
    for (int i = 0; i < tok; i++) {
        q[i] = (float)((i * 37) % 17) / 17.0f - 0.5f;
        k[i] = (float)((i * 11) % 13) / 13.0f - 0.5f;
        v[i] = (float)((i * 7) % 19) / 19.0f - 0.5f;
        dctx[i] = (float)((i * 5) % 23) / 23.0f - 0.5f;
    }
    for (int j = seq - 5; j < seq; j++) mask[j] = 0;             // padding
    for (int j = seq; j < 2 * seq; j++) mask[j] = 0;             // a fully masked sequence
    const float scale = 0.5f, dscale = 1.0f / 0.9f;
    const unsigned threshold = 429496730u;                       // p = 0.1
    dim3 grid(seq, heads, batch), block(64);
    size_t smem = (dim + seq) * sizeof(float);

    emu::launch(grid, block, smem, [&] {
        attention_fwd(ctx.data(), probs.data(), pdrop.data(), q.data(), k.data(), v.data(),
                      mask.data(), seq, heads, dim, scale, 1, 42ull, 7ull, threshold, dscale, 0);
    });
    emu::launch(grid, block, smem, [&] {
        attention_bwd_rows(dq.data(), ds.data(), dctx.data(), k.data(), v.data(), probs.data(),
                           pdrop.data(), seq, heads, dim, scale, 1, dscale, 0);
    });
    emu::launch(grid, dim3(32), 2 * seq * sizeof(float), [&] {
        attention_bwd_cols(dk.data(), dv.data(), ds.data(), dctx.data(), q.data(), pdrop.data(),
                           seq, heads, dim, scale, 0);
    });

    // A sanity check that the kernels ran: every probability row sums to 1.
    for (int r = 0; r < pp / seq; r++) {
        float s = 0.0f;
        for (int j = 0; j < seq; j++) s += probs[r * seq + j];
        if (s < 0.999f || s > 1.001f) {
            std::fprintf(stderr, "probability row %d sums to %f\n", r, s);
            return 1;
        }
    }
    std::printf("attention ran\n");
    return 0;
}
