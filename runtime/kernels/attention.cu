// Multi-head self-attention's softmax, forward and backward, with HF's additive padding mask and
// attention-probability dropout. The products around it (scores = q·kᵀ, ctx = p·v and the
// backward's four) are batched GEMMs on the tensor cores, one item per (sequence, head): see
// runtime/src/backend/kernels/attention.rs. The semantics are the CPU backend's
// (runtime/src/backend/cpu.rs, `attn_fwd_one` / `attn_bwd_one`); this is the approach of
// llm.c's attention (cuBLAS for the products, a kernel for the softmax), without its permutes:
// each GEMM reads a head's columns of [batch, seq, heads * head_dim] in place.
//
//   probs, probs_drop, ds: [batch, heads, seq, seq], row (b*heads + h)*seq + i;
//   mask:                  [batch, seq], 0 for a padding key.
//
// One warp per row (a block of BLOCK threads takes BLOCK / 32 rows); a row's reductions are the
// warp's fixed butterfly, so the same inputs give the same bits. Lane l takes the keys
// k · 128 + 4l + u (u < 4) for k = 0, 1, …: four consecutive keys, so that their scores load as
// one 16-byte access where the row allows (seq a multiple of 4, the buffer 16-byte aligned) and
// their dropout multipliers come from one Philox block (dropout_mult4); the scores are read in
// each pass and never written back (recomputing exp is cheaper than a pass over memory; on an
// H200 the kernel was bound by its instructions and its memory passes: docs/cuda.md,
// "Performance").
#include "common.cuh"

#define KEYS_LANE 4
#define KEYS_SPAN (32 * KEYS_LANE)

// Forward: `scores` holds scale · q·kᵀ from the GEMM, unrounded; + f32_lowest() for a masked key
// (added, not replaced: a fully masked row then softmaxes to a finite uniform row, as in
// PyTorch), the softmax rounded to `store` into probs; with dropout (`dropout` != 0) probs_drop
// is probs times the mask multiplier of its element index, rounded. probs and probs_drop are
// typed buffers (common.cuh's ld, sto: 16-bit ones on a device keeping the stored probabilities
// in two bytes); probs may be the scores themselves (an f32 buffer, in place: a lane writes only
// the keys it has just read).
#define masked(v, j) (m[j] == 0 ? (v) + f32_lowest() : (v))

// The vectorised path: seq a multiple of 4, `scores` 16-byte aligned, probs and probs_drop of
// one type PT.
template <int PT>
__device__ __forceinline__ void attention_softmax_v(const float* row, void* probs,
                                                    void* probs_drop, const unsigned* m,
                                                    long long at, int seq, int dropout,
                                                    DropKey k, unsigned threshold, float dscale,
                                                    int store, int lane) {
    float mx = -f32_inf();
    NO_UNROLL
    for (int j0 = lane * KEYS_LANE; j0 < seq; j0 += KEYS_SPAN) {
        unsigned w[4];
        ld16(w, row + j0);
        UNROLL
        for (int u = 0; u < KEYS_LANE; u++) mx = fmaxf(mx, masked(__uint_as_float(w[u]), j0 + u));
    }
    mx = warp_max(mx);
    float sum = 0.0f;
    NO_UNROLL
    for (int j0 = lane * KEYS_LANE; j0 < seq; j0 += KEYS_SPAN) {
        unsigned w[4];
        ld16(w, row + j0);
        UNROLL
        for (int u = 0; u < KEYS_LANE; u++)
            sum += expf(masked(__uint_as_float(w[u]), j0 + u) - mx);
    }
    sum = warp_sum(sum);
    NO_UNROLL
    for (int j0 = lane * KEYS_LANE; j0 < seq; j0 += KEYS_SPAN) {
        unsigned w[4];
        float mult[KEYS_LANE];
        ld16(w, row + j0);
        if (dropout)
            dropout_mult4(mult, (unsigned long long)((at + j0) / 4), k.seed, k.stream, threshold,
                          dscale);
        UNROLL
        for (int u = 0; u < KEYS_LANE; u++) {
            float p = st(expf(masked(__uint_as_float(w[u]), j0 + u) - mx) / sum, store);
            sto(probs, at + j0 + u, p, PT);
            if (dropout) sto(probs_drop, at + j0 + u, st(p * mult[u], store), PT);
        }
    }
}

extern "C" __global__ void attention_softmax(float* scores, void* probs, int probs_t,
                                             void* probs_drop, int pd_t, const unsigned* mask,
                                             int rows, int seq, int heads, int dropout,
                                             const unsigned* key, unsigned long long site,
                                             unsigned threshold, float dscale, int store) {
    GRID_WAIT();
    int r = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (r >= rows) return;  // a whole warp leaves together: the shuffles below stay full
    int lane = threadIdx.x & 31;
    long long at = (long long)r * seq;  // the element index of key 0
    const unsigned* m = mask + (long long)(r / (heads * seq)) * seq;  // this sequence's keys
    const float* row = scores + at;
    DropKey k = {0, 0};
    if (dropout) k = drop_key(key, site);
    if (seq % KEYS_LANE == 0 && aligned16(scores) && (!dropout || pd_t == probs_t)) {
        BY_TYPE(probs_t, attention_softmax_v, row, probs, probs_drop, m, at, seq, dropout, k,
                threshold, dscale, store, lane);
        return;
    }
    // The same operations in the same order, a key at a time.
#define each_key(j)                                                       \
    NO_UNROLL                                                             \
    for (int j0 = lane * KEYS_LANE; j0 < seq; j0 += KEYS_SPAN)            \
        NO_UNROLL                                                         \
        for (int j = j0; j < j0 + KEYS_LANE && j < seq; j++)
    float mx = -f32_inf();
    each_key(j) mx = fmaxf(mx, masked(row[j], j));
    mx = warp_max(mx);
    float sum = 0.0f;
    each_key(j) sum += expf(masked(row[j], j) - mx);
    sum = warp_sum(sum);
    each_key(j) {
        float p = st(expf(masked(row[j], j) - mx) / sum, store);
        sto(probs, at + j, p, probs_t);
        if (dropout) {
            float kept = p * dropout_mult(at + j, k.seed, k.stream, threshold, dscale);
            sto(probs_drop, at + j, st(kept, store), pd_t);
        }
    }
#undef each_key
}
#undef masked

// Backward from `dp` (dctx·vᵀ from the GEMM, f32): with dropout, dp is masked by the forward's
// mask read back from `pd` (probs_drop: 0 where it is 0, else dp · dscale; a zero probability
// that was kept gives the same result, as the softmax backward multiplies by it); then
// ds_ij = p_ij (dp_ij − Σ_j dp_ij p_ij), rounded to `store` into the typed buffer `ds`: the half
// GEMMs for dq and dk read it as a stored value (the CPU's `attn_bwd_one`). `ds` may be `dp`
// itself (an f32 buffer: a lane writes only the keys it has just read).
//
// The vectorised path, probs (and probs_drop) of type PT. dp of keys j0 … j0 + 3 as the
// backward uses it (masked when `dropout`):
template <int PT>
__device__ __forceinline__ void dp_keys(float x[KEYS_LANE], const float* row, const void* pd,
                                        long long at, int j0, int dropout, float dscale) {
    unsigned v[KEYS_LANE];
    ld16(v, row + j0);
    UNROLL
    for (int u = 0; u < KEYS_LANE; u++) {
        x[u] = __uint_as_float(v[u]);
        if (dropout) x[u] = ldt<PT>(pd, at + j0 + u) != 0.0f ? x[u] * dscale : 0.0f;
    }
}
template <int PT>
__device__ __forceinline__ void attention_softmax_bwd_t(const float* row, void* ds, int ds_t,
                                                        const void* probs, const void* pd,
                                                        long long at, int seq, int dropout,
                                                        float dscale, int store, int lane) {
    float dot = 0.0f;
    NO_UNROLL
    for (int j0 = lane * KEYS_LANE; j0 < seq; j0 += KEYS_SPAN) {
        float x[KEYS_LANE];
        dp_keys<PT>(x, row, pd, at, j0, dropout, dscale);
        UNROLL
        for (int u = 0; u < KEYS_LANE; u++) dot = op_add(dot, op_mul(x[u], ldt<PT>(probs, at + j0 + u)));
    }
    dot = warp_sum(dot);
    NO_UNROLL
    for (int j0 = lane * KEYS_LANE; j0 < seq; j0 += KEYS_SPAN) {
        float x[KEYS_LANE];
        dp_keys<PT>(x, row, pd, at, j0, dropout, dscale);
        UNROLL
        for (int u = 0; u < KEYS_LANE; u++) {
            long long i = at + j0 + u;
            sto(ds, i, st(ldt<PT>(probs, i) * (x[u] - dot), store), ds_t);
        }
    }
}
extern "C" __global__ void attention_softmax_bwd(float* dp, void* ds, int ds_t, const void* probs,
                                                 int probs_t, const void* pd, int pd_t, int rows,
                                                 int seq, int dropout, float dscale, int store) {
    GRID_WAIT();
    int r = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (r >= rows) return;
    int lane = threadIdx.x & 31;
    long long at = (long long)r * seq;
    // The vectorised path: seq a multiple of 4, dp 16-byte aligned, probs and probs_drop of one
    // type whenever dropout reads the latter (the model's buffers).
    if (seq % KEYS_LANE == 0 && aligned16(dp) && (!dropout || pd_t == probs_t)) {
        BY_TYPE(probs_t, attention_softmax_bwd_t, dp + at, ds, ds_t, probs, pd, at, seq, dropout,
                dscale, store, lane);
        return;
    }
    float dot = 0.0f;
    NO_UNROLL
    for (int j0 = lane * KEYS_LANE; j0 < seq; j0 += KEYS_SPAN)
        for (int j = j0; j < j0 + KEYS_LANE && j < seq; j++) {
            float x = dp[at + j];
            if (dropout) x = ld(pd, at + j, pd_t) != 0.0f ? x * dscale : 0.0f;
            dot = op_add(dot, op_mul(x, ld(probs, at + j, probs_t)));
        }
    dot = warp_sum(dot);
    NO_UNROLL
    for (int j0 = lane * KEYS_LANE; j0 < seq; j0 += KEYS_SPAN)
        for (int j = j0; j < j0 + KEYS_LANE && j < seq; j++) {
            float x = dp[at + j];
            if (dropout) x = ld(pd, at + j, pd_t) != 0.0f ? x * dscale : 0.0f;
            sto(ds, at + j, st(ld(probs, at + j, probs_t) * (x - dot), store), ds_t);
        }
}

// The forward in one launch for short sequences (attention.rs, `fused`): seq ≤ FUSED_KEYS,
// head_dim D of 32 (MiniLM's) or 64 (BERT-base's and -large's), every buffer 16-bit of the
// store's type S, a GPU with mma.sync (sm_80 on).
// It replaces the two batched GEMMs, the softmax between them and their address lists: the
// scores never go to memory. A block takes FUSED_Q queries of one head of one sequence, four
// warps of 16 queries each. q (the block's queries), k and v (the sequence's, v transposed) go
// to shared memory first, zeros past the sequence. A warp's scores, 16 × seq, are mma tiles in
// its registers (mma_16816, f32 accumulation): scale · q·kᵀ, then the operations of the softmax
// above in the same order per element — the mask added, each row's max and sum (a row lives in
// the four lanes of a quad: their own keys in order, then the quad's butterfly), the
// probability rounded, and with dropout its multiplier from the CPU's Philox mask — written to
// probs and probs_drop. The used probabilities, rounded, are then the A operand of ctx = p·v,
// straight from the registers (the accumulator tiles of two adjacent key tiles are an A
// fragment's halves), and ctx is rounded once from f32, as the GEMM's output. What differs from
// the unfused path is the order of the products' additions (the tensor cores'), within the
// tolerance the CPU comparison allows any GEMM.
#define FUSED_D_MAX 64
#define FUSED_KEYS 128
#define FUSED_Q 64
// Shared rows padded by 8 elements (4 words): the 8 rows a fragment load reads start on
// different banks (rows of D + 8 elements, 36 or 20 words, and of FUSED_LDT, 68 words).
#define FUSED_LD(D) ((D) + 8)
#define FUSED_LDT (FUSED_KEYS + 8)
// The kernel entry points' dispatch on the head size (attention.rs checks it is 32 or 64).
#define BY_HEAD(d, X, S) \
    do {                 \
        if ((d) == 32)   \
            X(S, 32);    \
        else             \
            X(S, 64);    \
    } while (0)

// 8 consecutive 16-bit elements at p as four words, 16 bytes at once where p is aligned.
__device__ __forceinline__ void ld8_half(unsigned w[4], const unsigned short* p) {
    if (aligned16(p)) {
        ld16(w, p);
        return;
    }
    UNROLL
    for (int u = 0; u < 4; u++) w[u] = (unsigned)p[2 * u] | ((unsigned)p[2 * u + 1] << 16);
}

// Elements at and at + 1 (x1 only with `both`) of a 16-bit buffer of type S, rounded: one
// 32-bit store with `pairs` (at even, the buffer 4-byte aligned), where two 16-bit ones would
// each fill a quarter of a memory sector.
template <int S>
__device__ __forceinline__ void st_half2(unsigned short* p, long long at, float x0, float x1,
                                         bool both, bool pairs) {
    if (both && pairs) {
        st_pair(p + at, pack_half2<S>(x0, x1));
        return;
    }
    p[at] = half_bits(x0, S);
    if (both) p[at + 1] = half_bits(x1, S);
}

// Whether elements idx and idx + 1 are kept (bits 0 and 1; dropout_mult's rule), one Philox
// block for both unless they straddle two.
__device__ __forceinline__ unsigned keep_pair(unsigned long long idx, DropKey k,
                                              unsigned threshold) {
    unsigned bits = dropout_keep4(idx >> 2, k.seed, k.stream, threshold) >> (idx & 3);
    if ((idx & 3) == 3) bits |= (dropout_keep4((idx >> 2) + 1, k.seed, k.stream, threshold) & 1u) << 1;
    return bits & 3u;
}

// n (at most 8; none when n ≤ 0) consecutive 16-bit elements at p as four words, zeros after.
__device__ __forceinline__ void ld8_half_n(unsigned w[4], const unsigned short* p, int n) {
    if (n >= 8) {
        ld8_half(w, p);
        return;
    }
    UNROLL
    for (int u = 0; u < 4; u++) {
        unsigned lo = 2 * u < n ? p[2 * u] : 0u, hi = 2 * u + 1 < n ? p[2 * u + 1] : 0u;
        w[u] = lo | (hi << 16);
    }
}

// A projection's bias that the fused kernels add to its output as they load it (attention.rs,
// `Bias`): q's, k's or v's, of type t, from element `at` (the head's first dimension); none where
// p is null. The projection's output was stored without it.
struct HeadBias {
    const void* p;
    long long at;
    int t;
};
__device__ __forceinline__ HeadBias no_bias() { return HeadBias{nullptr, 0, STORE_F32}; }
// q's (j 0), k's (1) or v's (2) bias for head h of d dimensions: the three `stride` elements
// apart from p.
__device__ __forceinline__ HeadBias head_bias(const void* p, int t, int stride, int j, int h,
                                              int d) {
    return HeadBias{p, (long long)j * stride + (long long)h * d, t};
}

// The bias of dimensions d … d + n − 1 (n ≤ 8) added to the first n of 8 16-bit elements (four
// words), each sum rounded: add_bias's `st(x + b)` (elementwise.cu) on the projection's stored,
// rounded output, so the operand is the value the unfused path stores.
template <int S>
__device__ __forceinline__ void add_head_bias(unsigned w[4], HeadBias b, int d, int n) {
    UNROLL
    for (int u = 0; u < 8; u++) {
        if (u < n) {
            unsigned short x = (unsigned short)(w[u >> 1] >> (16 * (u & 1)));
            unsigned short y = half_bits(half_value<S>(x) + ld(b.p, b.at + d + u, b.t), S);
            w[u >> 1] = (u & 1) ? (w[u >> 1] & 0xffffu) | ((unsigned)y << 16)
                                : (w[u >> 1] & 0xffff0000u) | y;
        }
    }
}

// Rows r0 … r0 + n − 1 of one head of a token tensor (its D columns from tok0, rows hid apart)
// into shared words, FUSED_LD(D) elements a row, zeros past the sequence; with `bias`, each
// loaded element plus its dimension's bias.
template <int S, int D>
__device__ __forceinline__ void fused_rows(unsigned* dst, const unsigned short* src, long long tok0,
                                           int hid, int r0, int n, int seq, HeadBias bias) {
    for (int c = threadIdx.x; c < n * (D / 8); c += blockDim.x) {
        int r = c / (D / 8), d0 = c % (D / 8) * 8;
        unsigned w[4] = {0u, 0u, 0u, 0u};
        if (r0 + r < seq) {
            ld8_half(w, src + tok0 + (long long)(r0 + r) * hid + d0);
            if (bias.p) add_head_bias<S>(w, bias, d0, 8);
        }
        UNROLL
        for (int u = 0; u < 4; u++) dst[(r * FUSED_LD(D) + d0) / 2 + u] = w[u];
    }
}

// An FUSED_KEYS × 8·`groups` block of a 16-bit matrix (rows `ld` apart from src; `rows` and
// `cols` of them real, zeros past) transposed into shared words: dst row c, element r is
// src[r, c], FUSED_LDT elements a row. Two rows' 8 elements a step, paired per column into words.
// With `bias` (a head of a token tensor: columns are dimensions), each real element plus its
// column's bias.
template <int S>
__device__ __forceinline__ void fused_transpose(unsigned* dst, const unsigned short* src,
                                                long long ld, int groups, int rows, int cols,
                                                HeadBias bias) {
    for (int c = threadIdx.x; c < FUSED_KEYS / 2 * groups; c += blockDim.x) {
        int r = c / groups * 2, c0 = c % groups * 8;
        unsigned w0[4] = {0u, 0u, 0u, 0u}, w1[4] = {0u, 0u, 0u, 0u};
        if (r < rows) ld8_half_n(w0, src + r * ld + c0, cols - c0);
        if (r + 1 < rows) ld8_half_n(w1, src + (r + 1) * ld + c0, cols - c0);
        if (bias.p) {
            if (r < rows) add_head_bias<S>(w0, bias, c0, cols - c0);
            if (r + 1 < rows) add_head_bias<S>(w1, bias, c0, cols - c0);
        }
        UNROLL
        for (int u = 0; u < 8; u++) {
            unsigned lo = (w0[u >> 1] >> (16 * (u & 1))) & 0xffffu;
            unsigned hi = (w1[u >> 1] >> (16 * (u & 1))) & 0xffffu;
            dst[((c0 + u) * FUSED_LDT + r) / 2] = lo | (hi << 16);
        }
    }
}

// A warp's products over the D dimensions, 16 at a step, with keys as the columns:
// acc[j] = rows r0 + g and r0 + g + 8 of `as` times key tile j (keys 8j … 8j + 7) of `bs`, for
// the `tiles` key tiles the sequence has (the rest stay 0). Both operands are shared rows of
// FUSED_LD(D) elements as words: q·kᵀ in the forward, dctx·vᵀ in attention_bwd_dq.
template <int S, int D>
__device__ __forceinline__ void mma_key_tiles(float acc[FUSED_KEYS / 8][4], const unsigned* as,
                                              const unsigned* bs, int r0, int g, int t,
                                              int tiles) {
    UNROLL
    for (int j = 0; j < FUSED_KEYS / 8; j++)
        UNROLL
        for (int e = 0; e < 4; e++) acc[j][e] = 0.0f;
    UNROLL
    for (int kk = 0; kk < D / 16; kk++) {
        const int qa = ((r0 + g) * FUSED_LD(D) + kk * 16) / 2 + t;
        unsigned a[4] = {as[qa], as[qa + 4 * FUSED_LD(D)], as[qa + 4],
                         as[qa + 4 * FUSED_LD(D) + 4]};
        UNROLL
        for (int j = 0; j < FUSED_KEYS / 8; j++) {
            if (j < tiles) {
                const int kb = ((j * 8 + g) * FUSED_LD(D) + kk * 16) / 2 + t;
                unsigned bb[2] = {bs[kb], bs[kb + 4]};
                mma_16816<S>(acc[j], a, bb);
            }
        }
    }
}

// A warp's products over the keys, 16 at a step (`steps` of them), into the D columns:
// o = p·bt, the A fragments from `p` (a key-tile accumulator of mma_key_tiles' layout, values
// already rounded: the accumulator tiles of two adjacent key tiles are an A fragment's halves)
// and bt the B operand transposed in shared memory (dimension rows of FUSED_LDT keys): p·v in
// the forward, ds·k in attention_bwd_dq.
template <int S, int D>
__device__ __forceinline__ void mma_dim_tiles(float o[D / 8][4],
                                              const float p[FUSED_KEYS / 8][4],
                                              const unsigned* bt, int g, int t, int steps) {
    UNROLL
    for (int n = 0; n < D / 8; n++)
        UNROLL
        for (int e = 0; e < 4; e++) o[n][e] = 0.0f;
    UNROLL
    for (int kk = 0; kk < FUSED_KEYS / 16; kk++) {
        if (kk < steps) {
            unsigned a[4] = {pack_half2<S>(p[2 * kk][0], p[2 * kk][1]),
                             pack_half2<S>(p[2 * kk][2], p[2 * kk][3]),
                             pack_half2<S>(p[2 * kk + 1][0], p[2 * kk + 1][1]),
                             pack_half2<S>(p[2 * kk + 1][2], p[2 * kk + 1][3])};
            UNROLL
            for (int n = 0; n < D / 8; n++) {
                const int vb = ((n * 8 + g) * FUSED_LDT + kk * 16) / 2 + t;
                unsigned bb[2] = {bt[vb], bt[vb + 4]};
                mma_16816<S>(o[n], a, bb);
            }
        }
    }
}

// Rows i0 and i1 (when in the sequence) of head h of a token tensor `out` (sequence b, rows ld
// apart: `hid` for ctx, the backward's row of dq, dk and dv for those): alpha · o, rounded once
// from f32 as a GEMM's output; the pairs at even indices, one 32-bit store each where `out` is
// 4-byte aligned and ld even.
template <int S, int D>
__device__ __forceinline__ void store_head_rows(unsigned short* out, const float o[D / 8][4],
                                                float alpha, int b, int h, int seq, int ld,
                                                int i0, int i1, int t) {
    const bool pairs = ((unsigned long long)out & 3) == 0 && ld % 2 == 0;
    UNROLL
    for (int n = 0; n < D / 8; n++) {
        const long long d = (long long)h * D + n * 8 + 2 * t;
        if (i0 < seq)
            st_half2<S>(out, ((long long)b * seq + i0) * ld + d, alpha * o[n][0],
                        alpha * o[n][1], true, pairs);
        if (i1 < seq)
            st_half2<S>(out, ((long long)b * seq + i1) * ld + d, alpha * o[n][2],
                        alpha * o[n][3], true, pairs);
    }
}

template <int S, int D>
__device__ __forceinline__ void attention_fused_t(unsigned* qs, unsigned* ks, unsigned* vt,
                                                  unsigned short* ctx, unsigned short* probs,
                                                  unsigned short* probs_drop,
                                                  const unsigned short* q,
                                                  const unsigned short* k,
                                                  const unsigned short* v, const unsigned* mask,
                                                  int seq, int heads, float scale, int dropout,
                                                  DropKey key, unsigned threshold, float dscale,
                                                  const void* bias, int bias_t, int bias_stride) {
    const int b = blockIdx.z, h = blockIdx.y, q0 = blockIdx.x * FUSED_Q;
    const int hid = heads * D;
    const long long tok0 = (long long)b * seq * hid + h * D;  // (b, row 0, head h, dim 0)
    // q (the block's) and k rows, v transposed; zeros past the sequence; each with its bias
    // when given.
    fused_rows<S, D>(qs, q, tok0, hid, q0, FUSED_Q, seq,
                  bias ? head_bias(bias, bias_t, bias_stride, 0, h, D) : no_bias());
    fused_rows<S, D>(ks, k, tok0, hid, 0, FUSED_KEYS, seq,
                  bias ? head_bias(bias, bias_t, bias_stride, 1, h, D) : no_bias());
    fused_transpose<S>(vt, v + tok0, hid, D / 8, seq, D,
                       bias ? head_bias(bias, bias_t, bias_stride, 2, h, D) : no_bias());
    __syncthreads();
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const int r0 = warp * 16;            // the warp's first row in the block's queries
    if (q0 + r0 >= seq) return;          // a whole warp without queries; no barrier follows
    const int tiles = (seq + 7) >> 3;    // key tiles of 8
    const int i0 = q0 + r0 + g, i1 = i0 + 8;  // this lane's two queries

    // s = q·kᵀ, a tile of 8 keys at a time, 16 dimensions a step.
    float s[FUSED_KEYS / 8][4];
    mma_key_tiles<S, D>(s, qs, ks, r0, g, t, tiles);

    // The softmax of rows i0 (s[j][0..1]) and i1 (s[j][2..3]); keys past the sequence take no
    // part and leave zeros for the product below.
    const unsigned* m = mask + (long long)b * seq;
    float mx0 = -f32_inf(), mx1 = -f32_inf();
    UNROLL
    for (int j = 0; j < FUSED_KEYS / 8; j++)
        UNROLL
        for (int e = 0; e < 2; e++) {
            int kj = j * 8 + 2 * t + e;
            if (kj < seq) {
                s[j][e] = scale * s[j][e];
                s[j][2 + e] = scale * s[j][2 + e];
                if (m[kj] == 0) {
                    s[j][e] += f32_lowest();
                    s[j][2 + e] += f32_lowest();
                }
                mx0 = fmaxf(mx0, s[j][e]);
                mx1 = fmaxf(mx1, s[j][2 + e]);
            }
        }
    mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 1));
    mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 2));
    mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 1));
    mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 2));
    // Each exp once, kept for the probabilities (the same value the softmax above recomputes).
    float sum0 = 0.0f, sum1 = 0.0f;
    UNROLL
    for (int j = 0; j < FUSED_KEYS / 8; j++)
        UNROLL
        for (int e = 0; e < 2; e++)
            if (j * 8 + 2 * t + e < seq) {
                s[j][e] = expf(s[j][e] - mx0);
                s[j][2 + e] = expf(s[j][2 + e] - mx1);
                sum0 += s[j][e];
                sum1 += s[j][2 + e];
            }
    sum0 += __shfl_xor_sync(0xffffffffu, sum0, 1);
    sum0 += __shfl_xor_sync(0xffffffffu, sum0, 2);
    sum1 += __shfl_xor_sync(0xffffffffu, sum1, 1);
    sum1 += __shfl_xor_sync(0xffffffffu, sum1, 2);
    const long long at0 = ((long long)(b * heads + h) * seq + i0) * seq;  // element of key 0
    const long long at1 = at0 + 8LL * seq;
    // 32-bit stores of key pairs: an even row length puts every pair at an even index.
    const bool pairs = seq % 2 == 0 && ((unsigned long long)probs & 3) == 0 &&
                       (!dropout || ((unsigned long long)probs_drop & 3) == 0);
    // Which of the lane's keys dropout keeps, bit 2j + e for key 8j + 2t + e: drawn in a rolled
    // loop (unrolled, each tile's Philox rounds would be a copy of their own).
    unsigned keep0 = 0u, keep1 = 0u;
    if (dropout) {
        NO_UNROLL
        for (int j = 0; j < tiles; j++) {
            const int kp = j * 8 + 2 * t;
            if (kp < seq) {
                keep0 |= keep_pair(at0 + kp, key, threshold) << (2 * j);
                keep1 |= keep_pair(at1 + kp, key, threshold) << (2 * j);
            }
        }
    }
    UNROLL
    for (int j = 0; j < FUSED_KEYS / 8; j++) {
        const int kp = j * 8 + 2 * t;  // the lane's pair of keys in this tile
        if (kp >= seq) {
            s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.0f;
            continue;
        }
        const bool both = kp + 1 < seq;  // the pair's second key is in the sequence
        float p0[2], p1[2];
        UNROLL
        for (int e = 0; e < 2; e++) {
            p0[e] = e == 0 || both ? st(s[j][e] / sum0, S) : 0.0f;
            p1[e] = e == 0 || both ? st(s[j][2 + e] / sum1, S) : 0.0f;
        }
        if (i0 < seq) st_half2<S>(probs, at0 + kp, p0[0], p0[1], both, pairs);
        if (i1 < seq) st_half2<S>(probs, at1 + kp, p1[0], p1[1], both, pairs);
        if (dropout) {
            UNROLL
            for (int e = 0; e < 2; e++) {
                p0[e] = st(p0[e] * ((keep0 >> (2 * j + e)) & 1u ? dscale : 0.0f), S);
                p1[e] = st(p1[e] * ((keep1 >> (2 * j + e)) & 1u ? dscale : 0.0f), S);
            }
            if (i0 < seq) st_half2<S>(probs_drop, at0 + kp, p0[0], p0[1], both, pairs);
            if (i1 < seq) st_half2<S>(probs_drop, at1 + kp, p1[0], p1[1], both, pairs);
        }
        s[j][0] = p0[0];
        s[j][1] = p0[1];
        s[j][2] = p1[0];
        s[j][3] = p1[1];
    }

    // ctx = p·v: 16 keys a step, the A fragment from two key tiles' probabilities; rounded
    // once from f32, as the GEMM's output.
    float o[D / 8][4];
    mma_dim_tiles<S, D>(o, s, vt, g, t, (seq + 15) >> 4);
    store_head_rows<S, D>(ctx, o, 1.0f, b, h, seq, hid, i0, i1, t);
}
// Grid (⌈seq / FUSED_Q⌉, heads, batch), FUSED_Q·2 threads; head_dim 32 or 64; probs_drop is
// read only with `dropout`; `store` STORE_F16 or STORE_BF16, every buffer of it; `bias` (of type bias_t; null:
// none) q's, k's and v's biases, `bias_stride` elements apart, added as q, k and v are loaded.
extern "C" __global__ void attention_fused(void* ctx, void* probs, void* probs_drop,
                                           const void* q, const void* k, const void* v,
                                           const unsigned* mask, int seq, int heads, int head_dim,
                                           float scale, int dropout, const unsigned* key,
                                           unsigned long long site, unsigned threshold,
                                           float dscale, const void* bias, int bias_t,
                                           int bias_stride, int store) {
    GRID_WAIT();
    // Words of two elements each (the lower index in the low half), here so that both types'
    // code shares them.
    __shared__ unsigned qs[FUSED_Q * FUSED_LD(FUSED_D_MAX) / 2];
    __shared__ unsigned ks[FUSED_KEYS * FUSED_LD(FUSED_D_MAX) / 2];
    __shared__ unsigned vt[FUSED_D_MAX * FUSED_LDT / 2];
    DropKey dk = {0, 0};
    if (dropout) dk = drop_key(key, site);
#define FUSED(S, D)                                                                             \
    attention_fused_t<S, D>(qs, ks, vt, (unsigned short*)ctx, (unsigned short*)probs,             \
                         (unsigned short*)probs_drop, (const unsigned short*)q,                \
                         (const unsigned short*)k, (const unsigned short*)v, mask, seq, heads, \
                         scale, dropout, dk, threshold, dscale, bias, bias_t, bias_stride)
    if (store == STORE_F16)
        BY_HEAD(head_dim, FUSED, STORE_F16);
    else
        BY_HEAD(head_dim, FUSED, STORE_BF16);
#undef FUSED
}

// The backward for the shapes the fused forward takes (attention.rs, `fused`), in two launches
// where the unfused path takes four batched GEMMs, the softmax backward between them, their
// address lists and an f32 dp of the probabilities' size written and read back. The operations
// per element and the roundings are that path's (the CPU backend's `attn_bwd_one`):
//   dp = dctx·vᵀ (f32), x = dp, or with dropout dp · dscale where probs_drop is not 0 and 0
//   where it is; ds = p ⊙ (x − Σ_keys x·p) rounded; dq = scale · ds·k, dk = scale · dsᵀ·q and
//   dv = probs_dropᵀ·dctx (probs without dropout), each rounded once from f32.
// `attention_bwd_dq` takes the rows of queries, as the forward (a block per FUSED_Q queries of
// one head of one sequence, a warp per 16): dp as mma tiles in registers, then ds — written to
// memory for the second launch, and used from the registers as the A operand of ds·k.
// `attention_bwd_dkv` takes FUSED_Q keys a block, a warp per 16: dk and dv are products over the
// queries, their A operands dsᵀ and probs_dropᵀ and their B operands qᵀ and dctxᵀ transposed
// into shared memory (the two products one after the other, in the same room). A row's dot
// product Σ x·p is added in another order than the unfused kernel's (a lane's keys in order,
// then the quad's butterfly), and the products' additions in the tensor cores' order: within
// the tolerance the CPU comparison allows any GEMM (runtime/emu/tests/attention.rs).

// Elements at and at + 1 (x1 only with `both`, else 0) of a 16-bit buffer of type S: one 32-bit
// load with `pairs` (st_half2's condition).
template <int S>
__device__ __forceinline__ void ld_half2(const unsigned short* p, long long at, bool both,
                                         bool pairs, float& x0, float& x1) {
    if (both && pairs) {
        unsigned w = ld_pair(p + at);
        x0 = half_value<S>((unsigned short)(w & 0xffffu));
        x1 = half_value<S>((unsigned short)(w >> 16));
        return;
    }
    x0 = half_value<S>(p[at]);
    x1 = both ? half_value<S>(p[at + 1]) : 0.0f;
}

template <int S, int D>
__device__ __forceinline__ void attention_bwd_dq_t(unsigned* dcs, unsigned* vs, unsigned* kt,
                                                   unsigned short* dq, unsigned short* ds,
                                                   const unsigned short* dctx,
                                                   const unsigned short* k,
                                                   const unsigned short* v,
                                                   const unsigned short* probs,
                                                   const unsigned short* pd, int seq, int heads,
                                                   int ld, float scale, int dropout, float dscale,
                                                   const void* bias, int bias_t, int bias_stride) {
    const int b = blockIdx.z, h = blockIdx.y, q0 = blockIdx.x * FUSED_Q;
    const int hid = heads * D;
    const long long tok0 = (long long)b * seq * hid + h * D;  // (b, row 0, head h, dim 0)
    fused_rows<S, D>(dcs, dctx, tok0, hid, q0, FUSED_Q, seq, no_bias());
    fused_rows<S, D>(vs, v, tok0, hid, 0, FUSED_KEYS, seq,
                  bias ? head_bias(bias, bias_t, bias_stride, 2, h, D) : no_bias());
    fused_transpose<S>(kt, k + tok0, hid, D / 8, seq, D,
                       bias ? head_bias(bias, bias_t, bias_stride, 1, h, D) : no_bias());
    __syncthreads();
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const int r0 = warp * 16;            // the warp's first row in the block's queries
    if (q0 + r0 >= seq) return;          // a whole warp without queries; no barrier follows
    const int tiles = (seq + 7) >> 3;    // key tiles of 8
    const int i0 = q0 + r0 + g, i1 = i0 + 8;  // this lane's two queries

    // dp = dctx·vᵀ, a tile of 8 keys at a time, 16 dimensions a step.
    float s[FUSED_KEYS / 8][4];
    mma_key_tiles<S, D>(s, dcs, vs, r0, g, t, tiles);

    // x (dp, dropped as the forward dropped) and each row's Σ x·p: rows i0 (s[j][0..1]) and i1
    // (s[j][2..3]), the probabilities kept as the 16-bit pairs they were loaded in.
    const long long at0 = ((long long)(b * heads + h) * seq + i0) * seq;  // element of key 0
    const long long at1 = at0 + 8LL * seq;
    const bool pairs = seq % 2 == 0 && ((unsigned long long)probs & 3) == 0 &&
                       ((unsigned long long)ds & 3) == 0 &&
                       (!dropout || ((unsigned long long)pd & 3) == 0);
    unsigned pw[FUSED_KEYS / 8][2];
    float dot0 = 0.0f, dot1 = 0.0f;
    UNROLL
    for (int j = 0; j < FUSED_KEYS / 8; j++) {
        const int kp = j * 8 + 2 * t;  // the lane's pair of keys in this tile
        pw[j][0] = pw[j][1] = 0u;
        if (kp >= seq) continue;
        const bool both = kp + 1 < seq;
        float p[4], m[4];
        if (i0 < seq) ld_half2<S>(probs, at0 + kp, both, pairs, p[0], p[1]);
        else p[0] = p[1] = 0.0f;
        if (i1 < seq) ld_half2<S>(probs, at1 + kp, both, pairs, p[2], p[3]);
        else p[2] = p[3] = 0.0f;
        if (dropout) {
            if (i0 < seq) ld_half2<S>(pd, at0 + kp, both, pairs, m[0], m[1]);
            else m[0] = m[1] = 0.0f;
            if (i1 < seq) ld_half2<S>(pd, at1 + kp, both, pairs, m[2], m[3]);
            else m[2] = m[3] = 0.0f;
            UNROLL
            for (int e = 0; e < 4; e++) s[j][e] = m[e] != 0.0f ? s[j][e] * dscale : 0.0f;
        }
        pw[j][0] = pack_half2<S>(p[0], p[1]);
        pw[j][1] = pack_half2<S>(p[2], p[3]);
        dot0 += s[j][0] * p[0];
        dot1 += s[j][2] * p[2];
        if (both) {
            dot0 += s[j][1] * p[1];
            dot1 += s[j][3] * p[3];
        }
    }
    dot0 += __shfl_xor_sync(0xffffffffu, dot0, 1);
    dot0 += __shfl_xor_sync(0xffffffffu, dot0, 2);
    dot1 += __shfl_xor_sync(0xffffffffu, dot1, 1);
    dot1 += __shfl_xor_sync(0xffffffffu, dot1, 2);
    // ds, rounded, written and kept in s for the product; zeros past the sequence.
    UNROLL
    for (int j = 0; j < FUSED_KEYS / 8; j++) {
        const int kp = j * 8 + 2 * t;
        if (kp >= seq) {
            s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.0f;
            continue;
        }
        const bool both = kp + 1 < seq;
        UNROLL
        for (int e = 0; e < 2; e++) {
            float p0 = half_value<S>((unsigned short)(pw[j][0] >> (16 * e)));
            float p1 = half_value<S>((unsigned short)(pw[j][1] >> (16 * e)));
            s[j][e] = e == 0 || both ? st(p0 * (s[j][e] - dot0), S) : 0.0f;
            s[j][2 + e] = e == 0 || both ? st(p1 * (s[j][2 + e] - dot1), S) : 0.0f;
        }
        if (i0 < seq) st_half2<S>(ds, at0 + kp, s[j][0], s[j][1], both, pairs);
        if (i1 < seq) st_half2<S>(ds, at1 + kp, s[j][2], s[j][3], both, pairs);
    }

    // dq = scale · ds·k: 16 keys a step, the A fragment from two key tiles of ds.
    float o[D / 8][4];
    mma_dim_tiles<S, D>(o, s, kt, g, t, (seq + 15) >> 4);
    store_head_rows<S, D>(dq, o, scale, b, h, seq, ld, i0, i1, t);
}
// Grid (⌈seq / FUSED_Q⌉, heads, batch), FUSED_Q·2 threads; head_dim 32 or 64; pd (probs_drop)
// read only with `dropout`; ds: the 16-bit room for the softmax's gradient, [batch, heads, seq, seq]; dq's rows
// `ld` apart (Backend::attention_bwd's QkvRows); `bias` as attention_fused's (k's and v's are
// read).
extern "C" __global__ void attention_bwd_dq(void* dq, void* ds, const void* dctx, const void* k,
                                            const void* v, const void* probs, const void* pd,
                                            int seq, int heads, int head_dim, int ld, float scale,
                                            int dropout, float dscale, const void* bias,
                                            int bias_t, int bias_stride, int store) {
    GRID_WAIT();
    __shared__ unsigned dcs[FUSED_Q * FUSED_LD(FUSED_D_MAX) / 2];
    __shared__ unsigned vs[FUSED_KEYS * FUSED_LD(FUSED_D_MAX) / 2];
    __shared__ unsigned kt[FUSED_D_MAX * FUSED_LDT / 2];
#define BWD_DQ(S, D)                                                                           \
    attention_bwd_dq_t<S, D>(dcs, vs, kt, (unsigned short*)dq, (unsigned short*)ds,              \
                          (const unsigned short*)dctx, (const unsigned short*)k,              \
                          (const unsigned short*)v, (const unsigned short*)probs,              \
                          (const unsigned short*)pd, seq, heads, ld, scale, dropout, dscale,     \
                          bias, bias_t, bias_stride)
    if (store == STORE_F16)
        BY_HEAD(head_dim, BWD_DQ, STORE_F16);
    else
        BY_HEAD(head_dim, BWD_DQ, STORE_BF16);
#undef BWD_DQ
}

template <int S, int D>
__device__ __forceinline__ void attention_bwd_dkv_t(unsigned* at, unsigned* bt, unsigned short* dk,
                                                    unsigned short* dv, const unsigned short* ds,
                                                    const unsigned short* pd,
                                                    const unsigned short* q,
                                                    const unsigned short* dctx, int seq,
                                                    int heads, int ld, float scale, HeadBias qb) {
    const int b = blockIdx.z, h = blockIdx.y, k0 = blockIdx.x * FUSED_Q;
    const int hid = heads * D;
    const long long tok0 = (long long)b * seq * hid + h * D;
    const long long sq0 = (long long)(b * heads + h) * seq * seq;  // the head's [seq, seq]
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const int r0 = warp * 16;                 // the warp's first row in the block's keys
    const bool live = k0 + r0 < seq;          // the warp has keys
    const int i0 = k0 + r0 + g, i1 = i0 + 8;  // this lane's two keys
    const int steps = (seq + 15) >> 4;        // queries, 16 a step
    // dk = scale · dsᵀ·q, then dv = probs_dropᵀ·dctx, in the same shared room.
    NO_UNROLL
    for (int phase = 0; phase < 2; phase++) {
        if (phase) __syncthreads();  // every warp is done with dsᵀ and qᵀ
        fused_transpose<S>(at, (phase ? pd : ds) + sq0 + k0, seq, FUSED_Q / 8, seq, seq - k0,
                           no_bias());
        fused_transpose<S>(bt, (phase ? dctx : q) + tok0, hid, D / 8, seq, D,
                           phase ? no_bias() : qb);
        __syncthreads();
        if (!live) continue;  // the barrier above is the last this warp must meet
        float o[D / 8][4];
        UNROLL
        for (int n = 0; n < D / 8; n++)
            UNROLL
            for (int e = 0; e < 4; e++) o[n][e] = 0.0f;
        UNROLL
        for (int kk = 0; kk < FUSED_KEYS / 16; kk++) {
            if (kk < steps) {
                const int qa = ((r0 + g) * FUSED_LDT + kk * 16) / 2 + t;
                unsigned a[4] = {at[qa], at[qa + 4 * FUSED_LDT], at[qa + 4],
                                 at[qa + 4 * FUSED_LDT + 4]};
                UNROLL
                for (int n = 0; n < D / 8; n++) {
                    const int kb = ((n * 8 + g) * FUSED_LDT + kk * 16) / 2 + t;
                    unsigned bb[2] = {bt[kb], bt[kb + 4]};
                    mma_16816<S>(o[n], a, bb);
                }
            }
        }
        store_head_rows<S, D>(phase ? dv : dk, o, phase ? 1.0f : scale, b, h, seq, ld, i0, i1, t);
    }
}
// Grid (⌈seq / FUSED_Q⌉, heads, batch), FUSED_Q·2 threads; pd: probs_drop, or probs without
// dropout (dv's operand); dk's and dv's rows `ld` apart; `bias` as attention_fused's (q's is
// read).
extern "C" __global__ void attention_bwd_dkv(void* dk, void* dv, const void* ds, const void* pd,
                                             const void* q, const void* dctx, int seq, int heads,
                                             int head_dim, int ld, float scale, const void* bias,
                                             int bias_t, int bias_stride, int store) {
    GRID_WAIT();
    const HeadBias qb =
        bias ? head_bias(bias, bias_t, bias_stride, 0, blockIdx.y, head_dim) : no_bias();
    __shared__ unsigned at[FUSED_Q * FUSED_LDT / 2];
    __shared__ unsigned bt[FUSED_D_MAX * FUSED_LDT / 2];
#define BWD_DKV(S, D)                                                                           \
    attention_bwd_dkv_t<S, D>(at, bt, (unsigned short*)dk, (unsigned short*)dv,                   \
                           (const unsigned short*)ds, (const unsigned short*)pd,               \
                           (const unsigned short*)q, (const unsigned short*)dctx, seq, heads, \
                           ld, scale, qb)
    if (store == STORE_F16)
        BY_HEAD(head_dim, BWD_DKV, STORE_F16);
    else
        BY_HEAD(head_dim, BWD_DKV, STORE_BF16);
#undef BWD_DKV
}
