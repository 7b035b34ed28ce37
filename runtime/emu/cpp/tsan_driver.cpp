// A ThreadSanitizer driver for the emulation (tests/tsan.rs; tests/asan.rs builds it with
// AddressSanitizer, its buffers exactly as long as the kernels may touch): runs every kernel that uses shared
// memory or a reduction across threads (attention's softmax and fused kernels, LayerNorm,
// cross-entropy, the
// gradient norm, LAMB's per-tensor norms, the column sums' last block, the embedding backward's
// long runs) once on
// small shapes, built with -fsanitize=thread against one set of kernel sources. Under the
// emulation's OS-thread mode (RECIPE_EMU_OS_THREADS, which tests/tsan.rs sets and the header picks
// under TSan) every CUDA thread is an OS thread and `__shared__` is a static, so a missing
// __syncthreads between a shared-memory write and another thread's read is a data race TSan
// reports.
//
// The include path decides which sources are built: runtime/kernels (the real ones) or a temporary
// copy with a barrier removed on purpose (the tests that TSan catches it). Every block has at least
// two warps, so the block reductions (common.cuh) cross warps through shared memory.
//
// Usage: tsan_driver [GROUP...], GROUP one of attention, fused_attention, layernorm, loss, norm,
// lamb, column_sums, embedding (none: all). Each
// group checks its results loosely against a host computation (a sanity check that the kernels
// ran; the emulation tests compare them exactly), and a failed check exits 1.
#include "cuda_emu.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <vector>

#include "attention.cu"
#include "elementwise.cu"
#include "embedding.cu"
#include "layernorm.cu"
#include "loss.cu"
#include "optim.cu"

namespace {

// A deterministic value in [-0.5, 0.5) for index i of stream s.
float val(int i, int s) { return (float)((i * (7 + 2 * s) + s) % (13 + 4 * s)) / (13 + 4 * s) - 0.5f; }

bool fail(const char* what, int at, double got, double want) {
    std::fprintf(stderr, "%s [%d]: got %.17g, want %.17g\n", what, at, got, want);
    return false;
}

bool close(const char* what, int at, double got, double want, double tol) {
    if (std::fabs(got - want) <= tol * (1.0 + std::fabs(want))) return true;
    return fail(what, at, got, want);
}

bool attention() {
    // The softmax kernels (the products around them are GEMMs): two heads over 36 keys, blocks of
    // 64 threads (two warps, a row each, their shuffles crossing lanes), the last block half
    // idle (2·2·36 = 144 rows).
    const int batch = 2, seq = 36, heads = 2;
    const int rows = batch * heads * seq, pp = rows * seq;
    std::vector<float> probs(pp), pdrop(pp), ds(pp);
    std::vector<unsigned> mask(batch * seq, 1);
    for (int i = 0; i < pp; i++) {
        probs[i] = 4.0f * val(i, 4);
        ds[i] = val(i, 5);
    }
    for (int j = seq - 5; j < seq; j++) mask[j] = 0;             // padding
    for (int j = seq; j < 2 * seq; j++) mask[j] = 0;             // a fully masked sequence
    const float dscale = 1.0f / 0.9f;
    const unsigned threshold = 429496730u;                       // p = 0.1
    dim3 grid((rows + 1) / 2), block(64);

    // Dropout key (seed 42, first stream 5) and site 2: stream 7 (common.cuh, drop_key).
    const unsigned key[4] = {42u, 0u, 5u, 0u};
    emu::launch(grid, block, 0, [&] {
        // In place: the scores are the probabilities' f32 buffer.
        attention_softmax(probs.data(), probs.data(), 0, pdrop.data(), 0, mask.data(), rows, seq,
                          heads, 1, key, 2ull, threshold, dscale, 0);
    });
    emu::launch(grid, block, 0, [&] {
        attention_softmax_bwd(ds.data(), ds.data(), 0, probs.data(), 0, pdrop.data(), 0, rows, seq,
                              1, dscale, 0);
    });

    for (int r = 0; r < rows; r++) {
        // Every probability row sums to 1, and (the softmax backward's) every ds row to 0.
        double s = 0.0, d = 0.0;
        for (int j = 0; j < seq; j++) {
            s += probs[r * seq + j];
            d += ds[r * seq + j];
        }
        if (!close("attention probability row sum", r, s, 1.0, 1e-3)) return false;
        if (!close("attention ds row sum", r, d, 0.0, 1e-3)) return false;
    }
    return true;
}

// bf16 bits of x and back (the fused kernels' buffers are 16-bit).
unsigned short bf(float x) { return bf16_bits_int(x); }
float unbf(unsigned short b) { return half_value<STORE_BF16>(b); }

bool fused_attention_of(int d, int seq) {
    // The fused forward and the two backward kernels (attention.cu), bf16, one head of d (64,
    // then 32) over 40 keys: one block of four warps, the last without queries (or keys); the
    // backward from the forward's probabilities. attention_bwd_dkv's two products share its
    // shared memory. q's, k's and v's biases (bf16, d + 4 elements apart) are added as the
    // kernels load them. Over 150 keys, their long twins: three blocks, the last with one warp of
    // queries and three without, the keys (or queries) through the shared rooms in chunks.
    const bool longer = seq > FUSED_KEYS;
    const int tok = seq * d, pp = seq * seq;
    const float scale = 1.0f / std::sqrt((float)d);
    std::vector<unsigned short> q(tok), k(tok), v(tok), dctx(tok), ctx(tok), probs(pp), ds(pp);
    std::vector<unsigned short> dq(tok), dk(tok), dv(tok);
    std::vector<unsigned> mask(seq, 1);
    const int bias_stride = d + 4;
    std::vector<unsigned short> bias(2 * bias_stride + d);
    for (int i = 0; i < (int)bias.size(); i++) bias[i] = bf(0.5f * val(i, 5));
    for (int i = 0; i < tok; i++) {
        q[i] = bf(2.0f * val(i, 6));
        k[i] = bf(2.0f * val(i, 7));
        v[i] = bf(val(i, 8));
        dctx[i] = bf(val(i, 9));
    }
    dim3 grid((seq + FUSED_Q - 1) / FUSED_Q, 1, 1), block(2 * FUSED_Q);
    emu::launch(grid, block, 0, [&] {
        (longer ? attention_fused_long : attention_fused)(
            ctx.data(), probs.data(), nullptr, q.data(), k.data(), v.data(), mask.data(), seq, 1,
            d, scale, 0, nullptr, 0ull, 0u, 1.0f, bias.data(), STORE_BF16, bias_stride,
            STORE_BF16);
    });
    emu::launch(grid, block, 0, [&] {
        (longer ? attention_bwd_dq_long : attention_bwd_dq)(
            dq.data(), ds.data(), dctx.data(), k.data(), v.data(), probs.data(), seq, 1, d, d,
            scale, 0, nullptr, 0ull, 0u, 1.0f, bias.data(), STORE_BF16, bias_stride, STORE_BF16);
    });
    emu::launch(grid, block, 0, [&] {
        (longer ? attention_bwd_dkv_long : attention_bwd_dkv)(
            dk.data(), dv.data(), ds.data(), probs.data(), q.data(), dctx.data(), seq, 1, d, d,
            scale, 0, nullptr, 0ull, 0u, 1.0f, bias.data(), STORE_BF16, bias_stride, STORE_BF16);
    });
    for (int r = 0; r < seq; r++) {
        double sum = 0.0;
        for (int j = 0; j < seq; j++) sum += unbf(probs[r * seq + j]);
        if (!close("fused probability row sum", r, sum, 1.0, 2e-2)) return false;
    }
    // dv = pᵀ·dctx, from the rounded probabilities.
    for (int j = 0; j < seq; j++)
        for (int c = 0; c < d; c++) {
            double want = 0.0;
            for (int r = 0; r < seq; r++) want += unbf(probs[r * seq + j]) * unbf(dctx[r * d + c]);
            if (!close("fused dv", j * d + c, unbf(dv[j * d + c]), want, 2e-2)) return false;
        }
    return true;
}

bool fused_attention() {
    return fused_attention_of(64, 40) && fused_attention_of(32, 40) && fused_attention_of(64, 150) &&
           fused_attention_of(32, 150);
}

bool layernorm() {
    // 70 columns, a warp per row (the runtime's shape; lanes stride over the columns), two rows
    // plus one constant row (variance 0: eps alone), and a fourth warp without a row.
    const int rows = 3, cols = 70;
    const float eps = 1e-5f;
    std::vector<float> x(rows * cols), w(cols), b(cols), out(rows * cols), mean(rows), rstd(rows);
    std::vector<float> dout(rows * cols), dinp(rows * cols), keep(rows * cols);
    for (int i = 0; i < rows * cols; i++) {
        x[i] = i / cols == 2 ? 1.25f : 3.0f * val(i, 1) + 0.75f;
        dout[i] = val(i, 2);
    }
    for (int c = 0; c < cols; c++) {
        w[c] = 1.0f + 0.5f * val(c, 3);
        b[c] = val(c, 4);
    }
    dim3 grid(1), block(128);
    emu::launch(grid, block, 0, [&] {
        layernorm_fwd(out.data(), STORE_F32, mean.data(), rstd.data(), x.data(), STORE_F32, w.data(),
                      b.data(), STORE_F32, rows, cols, eps, STORE_F32);
    });
    emu::launch(grid, block, 0, [&] {
        // With the residual split's copy (keep), which the check below compares too.
        layernorm_bwd_dinp(dinp.data(), STORE_F32, dout.data(), STORE_F32, x.data(), STORE_F32,
                           w.data(), STORE_F32, mean.data(), rstd.data(), rows, cols, STORE_F32,
                           keep.data(), STORE_F32, 0, nullptr, 0ull, 0u, 1.0f);
    });

    for (int r = 0; r < rows; r++) {
        const float* xr = &x[r * cols];
        double m = 0.0, var = 0.0;
        for (int c = 0; c < cols; c++) m += xr[c];
        m /= cols;
        for (int c = 0; c < cols; c++) var += (xr[c] - m) * (xr[c] - m);
        var /= cols;
        double rs = 1.0 / std::sqrt(var + eps);
        if (!close("layernorm mean", r, mean[r], m, 1e-6)) return false;
        if (!close("layernorm rstd", r, rstd[r], rs, 1e-6)) return false;
        // Before the affine, the row has mean 0 and (but for eps) variance 1.
        double s = 0.0, s2 = 0.0;
        for (int c = 0; c < cols; c++) {
            double xh = (out[r * cols + c] - b[c]) / w[c];
            s += xh;
            s2 += xh * xh;
        }
        if (!close("layernorm row mean of xhat", r, s / cols, 0.0, 1e-5)) return false;
        double want_var = var / (var + eps);
        if (!close("layernorm row variance of xhat", r, s2 / cols, want_var, 1e-4)) return false;
        // dinp = rstd · (dxhat − mean(dxhat) − xhat · mean(dxhat · xhat)), from the saved stats.
        double md = 0.0, mdx = 0.0;
        for (int c = 0; c < cols; c++) {
            double xh = (xr[c] - (double)mean[r]) * rstd[r];
            double dxh = (double)dout[r * cols + c] * w[c];
            md += dxh;
            mdx += dxh * xh;
        }
        md /= cols;
        mdx /= cols;
        for (int c = 0; c < cols; c++) {
            double xh = (xr[c] - (double)mean[r]) * rstd[r];
            double want = rstd[r] * ((double)dout[r * cols + c] * w[c] - md - xh * mdx);
            if (!close("layernorm dinp", r * cols + c, dinp[r * cols + c], want, 1e-4))
                return false;
            if (keep[r * cols + c] != dinp[r * cols + c])
                return fail("layernorm keep", r * cols + c, keep[r * cols + c], dinp[r * cols + c]);
        }
    }
    return true;
}

bool loss() {
    // 45 classes on 64 threads (two warps, the runtime's shape): block_max, then block_sum_d.
    const int rows = 3, classes = 45;
    const float grad_scale = 0.5f;
    std::vector<float> logits(rows * classes), dlogits(rows * classes), losses(rows);
    std::vector<unsigned> labels = {0, 44, 17};
    for (int i = 0; i < rows * classes; i++) logits[i] = 8.0f * val(i, 5);
    emu::launch(dim3(rows), dim3(64), 0, [&] {
        cross_entropy(dlogits.data(), losses.data(), logits.data(), labels.data(), rows, classes,
                      grad_scale, STORE_F32);
    });

    for (int r = 0; r < rows; r++) {
        const float* l = &logits[r * classes];
        double mx = l[0], s = 0.0;
        for (int c = 1; c < classes; c++) mx = std::fmax(mx, l[c]);
        for (int c = 0; c < classes; c++) s += std::exp(l[c] - mx);
        double want = mx + std::log(s) - l[labels[r]];
        if (!close("cross-entropy loss", r, losses[r], want, 1e-5)) return false;
        // softmax − onehot sums to 0 over the row.
        double ds = 0.0;
        for (int c = 0; c < classes; c++) ds += dlogits[r * classes + c];
        if (!close("cross-entropy dlogits row sum", r, ds, 0.0, 1e-6)) return false;
        double g = (double)grad_scale / rows;
        double p = std::exp(l[labels[r]] - mx) / s;
        if (!close("cross-entropy dlogits at the label", r, dlogits[r * classes + labels[r]],
                   (p - 1.0) * g, 1e-5))
            return false;
    }
    return true;
}

bool norm() {
    // 1000 values over 3 blocks of 64 threads (a grid-stride loop, two warps a block), then one
    // block of 64 adding the 3 partials: the two passes of kernels/optim.rs `grad_norm_sq`.
    const int n = 1000, blocks = 3;
    std::vector<float> g(n), partial(2 * blocks), total(2);
    for (int i = 0; i < n; i++) g[i] = std::ldexp(std::round(val(i, 6) * 2048.0f), -10);
    emu::launch(dim3(blocks), dim3(64), 0,
                [&] { grad_norm_partial(partial.data(), g.data(), n, STORE_F32); });
    emu::launch(dim3(1), dim3(64), 0, [&] { grad_norm_final(total.data(), partial.data(), blocks); });

    // Multiples of 2⁻¹⁰ below 1: every partial sum is exact, so the totals are equal.
    double want = 0.0;
    for (int i = 0; i < n; i++) want += (double)g[i] * g[i];
    unsigned long long u = (unsigned long long)__float_as_uint(total[0]) |
                           ((unsigned long long)__float_as_uint(total[1]) << 32);
    double got;
    std::memcpy(&got, &u, 8);
    if (got != want || want == 0.0) return fail("gradient norm Σg²", 0, got, want);
    return true;
}

bool lamb() {
    // Two tensors, 1100 and 5 elements: the first takes 3 norm blocks of 512 threads (its threads
    // stride over it), the second one; then one block per tensor adds the blocks' sums. The
    // launches of kernels/optim.rs `lamb_step`.
    const int n = 1105, ntensors = 2, nblocks = 4;
    std::vector<unsigned> tensors = {0, 1100, 1105}, blocks = {0, 3, 4}, decays = {0, 1100};
    std::vector<float> p(n), g(n), m(n, 0.0f), v(n, 0.0f), upd(n), partial(2 * nblocks);
    std::vector<float> coeff(ntensors);
    for (int i = 0; i < n; i++) {
        p[i] = val(i, 7);
        g[i] = val(i, 8);
    }
    const float wd = 0.01f, max_coeff = 10.0f, min_coeff = 0.01f;
    emu::launch(dim3((n + BLOCK - 1) / BLOCK), dim3(BLOCK), 0, [&] {
        lamb_update(upd.data(), p.data(), g.data(), m.data(), v.data(), decays.data(), 2, n,
                    1.0f, 1.0f, 0.9f, 0.1f, 0.999f, 0.001f, 1e-8f, wd);
    });
    emu::launch(dim3(nblocks), dim3(LAMB_THREADS), 0, [&] {
        lamb_norms(partial.data(), p.data(), upd.data(), tensors.data(), blocks.data(), ntensors);
    });
    emu::launch(dim3(ntensors), dim3(LAMB_THREADS), 0, [&] {
        lamb_coeff(coeff.data(), partial.data(), blocks.data(), max_coeff, min_coeff);
    });

    // Each tensor's ratio ‖w‖/‖u‖ (clamped), from sums in double.
    for (int k = 0; k < ntensors; k++) {
        double sp = 0.0, su = 0.0;
        for (unsigned i = tensors[k]; i < tensors[k + 1]; i++) {
            sp += (double)p[i] * p[i];
            su += (double)upd[i] * upd[i];
        }
        double want = std::fmin(std::fmax(std::sqrt(sp) / std::sqrt(su), min_coeff), max_coeff);
        if (!close("LAMB trust ratio", k, coeff[k], want, 1e-5)) return false;
    }
    return true;
}

bool column_sums() {
    // Two items of 150 rows of 100 columns: 3 chunks of rows by 2 blocks of 64 columns (the last
    // one part empty) each, whose last block per column adds the chunks' sums (common.cuh,
    // last_of_column), item z's blocks at grid z with their own sums and counters.
    const int rows = 150, cols = 100, chunk = 64, chunks = 3, items = 2;
    std::vector<float> dout(items * rows * cols), db(items * cols), part(items * chunks * cols);
    std::vector<unsigned> done(items * 2, 0);
    for (int i = 0; i < items * rows * cols; i++) dout[i] = val(i, 9);
    for (int c = 0; c < items * cols; c++) db[c] = val(c, 10);
    std::vector<float> db0 = db;
    emu::launch(dim3(2, chunks, items), dim3(64), 0, [&] {
        bias_grad(db.data(), part.data(), done.data(), dout.data(), STORE_F32, rows, cols, cols,
                  chunk, chunks, (unsigned long long)rows * cols, cols, STORE_F32);
    });
    for (int c = 0; c < items * cols; c++) {
        double want = db0[c];
        for (int r = 0; r < rows; r++) want += dout[(c / cols * rows + r) * cols + c % cols];
        if (!close("bias gradient", c, db[c], want, 1e-5)) return false;
    }
    for (int b = 0; b < items * 2; b++)
        if (done[b] != 0) return fail("column counter left set", b, done[b], 0);
    // gelu_bwd_bias_grad: two columns a thread, so one block of 64 threads spans the 100.
    // The pre-activation without its bias, which the kernel adds as it loads it.
    std::vector<float> x(rows * cols), dinp(rows * cols), dbg(cols, 0.0f), xb(cols);
    for (int i = 0; i < rows * cols; i++) x[i] = 2.0f * val(i, 11);
    for (int c = 0; c < cols; c++) xb[c] = val(c, 12);
    emu::launch(dim3(1, chunks), dim3(64), 0, [&] {
        gelu_bwd_bias_grad(dinp.data(), x.data(), dout.data(), xb.data(), STORE_F32, dbg.data(),
                           part.data(), done.data(), rows, cols, chunk, chunks, STORE_F32);
    });
    for (int c = 0; c < cols; c++) {
        double want = 0.0;
        for (int r = 0; r < rows; r++) want += dinp[r * cols + c];
        if (!close("gelu bias gradient", c, dbg[c], want, 1e-5)) return false;
    }
    if (done[0] != 0) return fail("column counter left set", 0, done[0], 0);
    return true;
}

// embedding_order's output for one table (`tokens` positions in order of key, ties in token
// order, then each row's run length at its first position, 0 elsewhere), computed on the host.
void order_on_host(unsigned* ord, const std::vector<unsigned>& key) {
    int tokens = (int)key.size();
    std::vector<unsigned> pos(tokens);
    for (int i = 0; i < tokens; i++) pos[i] = i;
    std::stable_sort(pos.begin(), pos.end(), [&](unsigned a, unsigned b) { return key[a] < key[b]; });
    for (int r = 0; r < tokens; r++) {
        ord[r] = pos[r];
        bool first = r == 0 || key[pos[r - 1]] != key[pos[r]];
        int run = 0;
        while (first && r + run < tokens && key[pos[r + run]] == key[pos[r]]) run++;
        ord[tokens + r] = run;
    }
}

bool embedding() {
    // embedding_order (a warp per token, its counts summed by shuffles) on 40 tokens of three
    // word rows and two types, against the host's order.
    {
        const int tokens = 40;
        std::vector<unsigned> ids(tokens), types(tokens), order(4 * tokens), want(4 * tokens);
        for (int i = 0; i < tokens; i++) {
            ids[i] = (i * 7) % 3;
            types[i] = i >= 25;
        }
        emu::launch(dim3((tokens + 7) / 8, 2), dim3(BLOCK), 0,
                    [&] { embedding_order(order.data(), ids.data(), types.data(), tokens); });
        order_on_host(want.data(), ids);
        order_on_host(want.data() + 2 * tokens, types);
        for (int i = 0; i < 4 * tokens; i++)
            if (order[i] != want[i]) return fail("embedding order", i, order[i], want[i]);
    }
    // 600 tokens of one token type: a long run of three tiles (embedding.cu,
    // embedding_bwd_long), over 40 columns (two blocks of 32, the last part empty); the word
    // ids alternate between two rows, runs of 300. Their order is the host's: embedding_order's
    // 600 warps of OS threads took most of the driver's time under TSan.
    const int tokens = 600, hidden = 40;
    std::vector<unsigned> ids(tokens), types(tokens, 0), order(4 * tokens);
    for (int i = 0; i < tokens; i++) ids[i] = i % 2;
    std::vector<float> dout(tokens * hidden), dword(2 * hidden), dtyp(hidden);
    for (int i = 0; i < tokens * hidden; i++) dout[i] = val(i, 11);
    for (int c = 0; c < 2 * hidden; c++) dword[c] = val(c, 12);
    for (int c = 0; c < hidden; c++) dtyp[c] = val(c, 13);
    std::vector<float> dword0 = dword, dtyp0 = dtyp;
    order_on_host(order.data(), ids);
    order_on_host(order.data() + 2 * tokens, types);
    emu::launch(dim3((hidden + 31) / 32, (tokens + BLOCK - 1) / BLOCK, 2), dim3(BLOCK),
                0, [&] {
                    embedding_bwd_long(dword.data(), dtyp.data(), dout.data(), STORE_F32,
                                       ids.data(), types.data(), order.data(), tokens, hidden,
                                       STORE_F32);
                });
    for (int c = 0; c < hidden; c++) {
        double t = dtyp0[c], w0 = dword0[c], w1 = dword0[hidden + c];
        for (int i = 0; i < tokens; i++) {
            t += dout[i * hidden + c];
            (i % 2 ? w1 : w0) += dout[i * hidden + c];
        }
        if (!close("token-type gradient", c, dtyp[c], t, 1e-4)) return false;
        if (!close("word gradient", c, dword[c], w0, 1e-4)) return false;
        if (!close("word gradient", hidden + c, dword[hidden + c], w1, 1e-4)) return false;
    }
    return true;
}

struct Group {
    const char* name;
    bool (*run)();
};

const Group GROUPS[] = {
    {"attention", attention},
    {"fused_attention", fused_attention},
    {"layernorm", layernorm},
    {"loss", loss},
    {"norm", norm},
    {"lamb", lamb},
    {"column_sums", column_sums},
    {"embedding", embedding},
};

}  // namespace

int main(int argc, char** argv) {
    int ran = 0;
    for (const Group& g : GROUPS) {
        bool wanted = argc == 1;
        for (int a = 1; a < argc; a++) wanted |= std::strcmp(argv[a], g.name) == 0;
        if (!wanted) continue;
        if (!g.run()) {
            std::fprintf(stderr, "%s: wrong result\n", g.name);
            return 1;
        }
        std::printf("%s ran\n", g.name);
        ran++;
    }
    int asked = argc == 1 ? (int)(sizeof(GROUPS) / sizeof(GROUPS[0])) : argc - 1;
    if (ran != asked) {
        std::fprintf(stderr, "unknown group among the arguments\n");
        return 2;
    }
    return 0;
}
