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
// The long kernels' chunk of keys (attention_fused_long, attention_bwd_dq_long): half of
// FUSED_KEYS, so that a chunk's scores and the f32 accumulators of its product fit the registers
// (at FUSED_KEYS ptxas spilled).
#define FUSED_CHUNK 64
// The kernel entry points' dispatch on the head size (attention.rs checks it is 32 or 64).
#define BY_HEAD(d, X, S) \
    do {                 \
        if ((d) == 32)   \
            X(S, 32);    \
        else             \
            X(S, 64);    \
    } while (0)
// And on the store's type (STORE_F16 or STORE_BF16) first.
#define BY_STORE_HEAD(store, d, X)          \
    do {                                    \
        if ((store) == STORE_F16)           \
            BY_HEAD(d, X, STORE_F16);       \
        else                                \
            BY_HEAD(d, X, STORE_BF16);      \
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

// Element u of 8 16-bit elements held as four words (the lower index in the low half), as a
// float, and its bits replaced by y.
template <int S>
__device__ __forceinline__ float half_at(const unsigned w[4], int u) {
    return half_value<S>((unsigned short)(w[u >> 1] >> (16 * (u & 1))));
}
__device__ __forceinline__ void set_half(unsigned w[4], int u, unsigned short y) {
    w[u >> 1] = (u & 1) ? (w[u >> 1] & 0xffffu) | ((unsigned)y << 16)
                        : (w[u >> 1] & 0xffff0000u) | y;
}

// The bias of dimensions d … d + n − 1 (n ≤ 8) added to the first n of 8 16-bit elements (four
// words), each sum rounded: add_bias's `st(x + b)` (elementwise.cu) on the projection's stored,
// rounded output, so the operand is the value the unfused path stores.
template <int S>
__device__ __forceinline__ void add_head_bias(unsigned w[4], HeadBias b, int d, int n) {
    UNROLL
    for (int u = 0; u < 8; u++)
        if (u < n) set_half(w, u, half_bits(half_at<S>(w, u) + ld(b.p, b.at + d + u, b.t), S));
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

// Whether elements idx … idx + 7 are kept (bit u for idx + u; dropout_mult's rule): two
// Philox blocks, three where the eight straddle them.
__device__ __forceinline__ unsigned keep8(unsigned long long idx, DropKey k, unsigned threshold) {
    const unsigned long long blk = idx >> 2;
    const int sh = (int)(idx & 3);
    unsigned bits = dropout_keep4(blk, k.seed, k.stream, threshold) |
                    (dropout_keep4(blk + 1, k.seed, k.stream, threshold) << 4);
    if (sh) bits |= dropout_keep4(blk + 2, k.seed, k.stream, threshold) << 8;
    return (bits >> sh) & 0xffu;
}

// The forward's dropout drawn again as a [seq, seq] block of probabilities is loaded
// (attention_bwd_dkv's dv operand, probs_drop, from probs): element (r, c) of the block is
// element `at + r·ld + c` of the probabilities' tensor, whose mask `key` and `threshold` draw;
// none where `on` is false.
struct DropAgain {
    bool on;
    long long at;
    DropKey key;
    unsigned threshold;
    float dscale;
};
__device__ __forceinline__ DropAgain no_drop() { return DropAgain{false, 0, {0, 0}, 0u, 1.0f}; }

// The first n (≤ 8) of 8 16-bit probabilities (four words), elements idx … of the tensor, times
// their dropout multipliers, rounded: the forward's store_probs, so each is the probs_drop value
// it stored (0 where dropped).
template <int S>
__device__ __forceinline__ void drop_again(unsigned w[4], const DropAgain& d, long long idx,
                                           int n) {
    const unsigned keep = keep8((unsigned long long)idx, d.key, d.threshold);
    UNROLL
    for (int u = 0; u < 8; u++)
        if (u < n)
            set_half(w, u, half_bits(half_at<S>(w, u) * ((keep >> u) & 1u ? d.dscale : 0.0f), S));
}

// A KEYS × 8·`groups` block of a 16-bit matrix (rows `ld` apart from src; `rows` and
// `cols` of them real, zeros past) transposed into shared words: dst row c, element r is
// src[r, c], FUSED_LDT elements a row. Two rows' 8 elements a step, paired per column into words.
// With `bias` (a head of a token tensor: columns are dimensions), each real element plus its
// column's bias; with `drop` (probabilities), each real element dropped as the forward dropped.
template <int S, int KEYS = FUSED_KEYS>
__device__ __forceinline__ void fused_transpose(unsigned* dst, const unsigned short* src,
                                                long long ld, int groups, int rows, int cols,
                                                HeadBias bias, DropAgain drop = no_drop()) {
    for (int c = threadIdx.x; c < KEYS / 2 * groups; c += blockDim.x) {
        int r = c / groups * 2, c0 = c % groups * 8;
        unsigned w0[4] = {0u, 0u, 0u, 0u}, w1[4] = {0u, 0u, 0u, 0u};
        if (r < rows) ld8_half_n(w0, src + r * ld + c0, cols - c0);
        if (r + 1 < rows) ld8_half_n(w1, src + (r + 1) * ld + c0, cols - c0);
        if (bias.p) {
            if (r < rows) add_head_bias<S>(w0, bias, c0, cols - c0);
            if (r + 1 < rows) add_head_bias<S>(w1, bias, c0, cols - c0);
        }
        if (drop.on) {
            if (r < rows) drop_again<S>(w0, drop, drop.at + r * ld + c0, cols - c0);
            if (r + 1 < rows) drop_again<S>(w1, drop, drop.at + (r + 1) * ld + c0, cols - c0);
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
template <int S, int D, int KT = FUSED_KEYS / 8>
__device__ __forceinline__ void mma_key_tiles(float acc[KT][4], const unsigned* as,
                                              const unsigned* bs, int r0, int g, int t,
                                              int tiles) {
    UNROLL
    for (int j = 0; j < KT; j++)
        UNROLL
        for (int e = 0; e < 4; e++) acc[j][e] = 0.0f;
    UNROLL
    for (int kk = 0; kk < D / 16; kk++) {
        const int qa = ((r0 + g) * FUSED_LD(D) + kk * 16) / 2 + t;
        unsigned a[4] = {as[qa], as[qa + 4 * FUSED_LD(D)], as[qa + 4],
                         as[qa + 4 * FUSED_LD(D) + 4]};
        UNROLL
        for (int j = 0; j < KT; j++) {
            if (j < tiles) {
                const int kb = ((j * 8 + g) * FUSED_LD(D) + kk * 16) / 2 + t;
                unsigned bb[2] = {bs[kb], bs[kb + 4]};
                mma_16816<S>(acc[j], a, bb);
            }
        }
    }
}

template <int D>
__device__ __forceinline__ void zero_dim_tiles(float o[D / 8][4]) {
    UNROLL
    for (int n = 0; n < D / 8; n++)
        UNROLL
        for (int e = 0; e < 4; e++) o[n][e] = 0.0f;
}
// A warp's products over the keys, 16 at a step (`steps` of them), into the D columns:
// o += p·bt, the A fragments from `p` (a key-tile accumulator of mma_key_tiles' layout, values
// already rounded: the accumulator tiles of two adjacent key tiles are an A fragment's halves)
// and bt the B operand transposed in shared memory (dimension rows of FUSED_LDT keys): p·v in
// the forward, ds·k in attention_bwd_dq. It adds to o (zero_dim_tiles clears it): the long
// kernels add one chunk of FUSED_KEYS keys at a time, in the keys' order.
template <int S, int D, int KT>
__device__ __forceinline__ void mma_dim_tiles(float o[D / 8][4], const float p[KT][4],
                                              const unsigned* bt, int g, int t, int steps) {
    UNROLL
    for (int kk = 0; kk < KT / 2; kk++) {
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

// Where a fused kernel's block and lane are: sequence b, head h, the block's first row q0 (of
// queries; of keys in attention_bwd_dkv), the head's first element tok0 of the token tensors
// (rows hid apart), the lane's quad g and its place t in it, the warp's first row r0 in the
// block, the lane's two rows i0 and i1, and the element of key 0 of each of those rows in the
// head's [seq, seq] tensors (at0, at1).
struct FusedAt {
    int b, h, q0, hid;
    long long tok0;
    int g, t, r0, i0, i1;
    long long at0, at1;
    bool live;  // the warp has rows in the sequence
};
template <int D>
__device__ __forceinline__ FusedAt fused_at(int seq, int heads) {
    FusedAt a;
    a.b = blockIdx.z;
    a.h = blockIdx.y;
    a.q0 = blockIdx.x * FUSED_Q;
    a.hid = heads * D;
    a.tok0 = (long long)a.b * seq * a.hid + a.h * D;  // (b, row 0, head h, dim 0)
    const int lane = threadIdx.x & 31;
    a.g = lane >> 2;
    a.t = lane & 3;
    a.r0 = (threadIdx.x >> 5) * 16;
    a.i0 = a.q0 + a.r0 + a.g;
    a.i1 = a.i0 + 8;
    a.at0 = ((long long)(a.b * heads + a.h) * seq + a.i0) * seq;
    a.at1 = a.at0 + 8LL * seq;
    a.live = a.q0 + a.r0 < seq;
    return a;
}
// q's (j 0), k's (1) or v's (2) bias for the block's head, or none.
template <int D>
__device__ __forceinline__ HeadBias bias_of(const void* bias, int bias_t, int bias_stride, int j,
                                            int h) {
    return bias ? head_bias(bias, bias_t, bias_stride, j, h, D) : no_bias();
}

// The softmax's steps on a warp's scores, one chunk of keys (`n` of them from key c0; rows i0
// in s[j][0..1] and i1 in s[j][2..3], key c0 + 8j + 2t + e), each the operations of
// attention_softmax per element in its order; keys past the chunk are left as they are.
// Scaled, and f32_lowest() added where the mask drops the key:
template <int KT>
__device__ __forceinline__ void scale_and_mask(float s[KT][4], const unsigned* m, int c0, int n,
                                               int t, float scale) {
    UNROLL
    for (int j = 0; j < KT; j++)
        UNROLL
        for (int e = 0; e < 2; e++) {
            const int kj = j * 8 + 2 * t + e;
            if (kj < n) {
                s[j][e] = scale * s[j][e];
                s[j][2 + e] = scale * s[j][2 + e];
                if (m[c0 + kj] == 0) {
                    s[j][e] += f32_lowest();
                    s[j][2 + e] += f32_lowest();
                }
            }
        }
}
// The lane's part of each row's max:
template <int KT>
__device__ __forceinline__ void rows_max(const float s[KT][4], int n, int t, float& mx0,
                                         float& mx1) {
    UNROLL
    for (int j = 0; j < KT; j++)
        UNROLL
        for (int e = 0; e < 2; e++)
            if (j * 8 + 2 * t + e < n) {
                mx0 = fmaxf(mx0, s[j][e]);
                mx1 = fmaxf(mx1, s[j][2 + e]);
            }
}
// Each score's exp against its row's max, in place; with `add`, added to the lane's part of each
// row's sum, by key:
template <int KT>
__device__ __forceinline__ void rows_exp(float s[KT][4], int n, int t, float mx0, float mx1,
                                         bool add, float& sum0, float& sum1) {
    UNROLL
    for (int j = 0; j < KT; j++)
        UNROLL
        for (int e = 0; e < 2; e++)
            if (j * 8 + 2 * t + e < n) {
                s[j][e] = expf(s[j][e] - mx0);
                s[j][2 + e] = expf(s[j][2 + e] - mx1);
                if (add) {
                    sum0 += s[j][e];
                    sum1 += s[j][2 + e];
                }
            }
}
// A row's max or sum over its quad's four lanes (the row's keys).
__device__ __forceinline__ float quad_max(float x) {
    x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
    return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
}
__device__ __forceinline__ float quad_sum(float x) {
    x += __shfl_xor_sync(0xffffffffu, x, 1);
    return x + __shfl_xor_sync(0xffffffffu, x, 2);
}
// Which of the lane's keys of the chunk dropout keeps, bit 2j + e for key 8j + 2t + e, rows at0
// and at1 (the elements of the chunk's first key): drawn in a rolled loop (unrolled, each tile's
// Philox rounds would be a copy of their own). Called by every lane of a warp (the shuffles).
// Where every row starts a Philox block (seq a multiple of 4; a chunk starts a multiple of 64
// keys in), a tile's keys 8j … 8j + 3 are one block and 8j + 4 … 8j + 7 the next, and lanes t and
// t ^ 1 of a quad need the same two (one a row): each draws one, the row its t & 1 names, and
// the two swap them — a draw a lane a tile instead of two. Otherwise a pair of keys may straddle
// two blocks, and each lane draws its own (keep_pair).
__device__ __forceinline__ void keep_bits(long long at0, long long at1, int n, int t, int seq,
                                          DropKey key, unsigned threshold, unsigned& keep0,
                                          unsigned& keep1) {
    keep0 = keep1 = 0u;
    if (seq % 4 == 0) {
        const int first = (threadIdx.x & 31) & ~1;  // the lane drawing row 0's block
        const long long at = t & 1 ? at1 : at0;
        NO_UNROLL
        for (int j = 0; j < ((n + 7) >> 3); j++) {
            const unsigned long long blk = (unsigned long long)(at + j * 8 + (t & 2) * 2) >> 2;
            const unsigned mine = dropout_keep4(blk, key.seed, key.stream, threshold);
            const unsigned b0 = __shfl_sync(0xffffffffu, mine, first);
            const unsigned b1 = __shfl_sync(0xffffffffu, mine, first + 1);
            if (j * 8 + 2 * t < n) {
                keep0 |= ((b0 >> (2 * (t & 1))) & 3u) << (2 * j);
                keep1 |= ((b1 >> (2 * (t & 1))) & 3u) << (2 * j);
            }
        }
        return;
    }
    NO_UNROLL
    for (int j = 0; j < ((n + 7) >> 3); j++) {
        const int kp = j * 8 + 2 * t;
        if (kp < n) {
            keep0 |= keep_pair(at0 + kp, key, threshold) << (2 * j);
            keep1 |= keep_pair(at1 + kp, key, threshold) << (2 * j);
        }
    }
}
// The chunk's probabilities from its exps (s), rounded, written to probs (rows at0 and at1 from
// the chunk's first key, where in the sequence: row0, row1) and, with dropout, times their
// multipliers, rounded, to probs_drop where given (the backward draws them again otherwise:
// Backend::attention_redraws_dropout); left in s as the product with v uses them (the dropped
// ones), zeros past the chunk.
template <int S, int KT>
__device__ __forceinline__ void store_probs(float s[KT][4], unsigned short* probs,
                                            unsigned short* probs_drop, long long at0,
                                            long long at1, int n, bool row0, bool row1, int t,
                                            float sum0, float sum1, int dropout, unsigned keep0,
                                            unsigned keep1, float dscale, bool pairs) {
    UNROLL
    for (int j = 0; j < KT; j++) {
        const int kp = j * 8 + 2 * t;  // the lane's pair of keys in this tile
        if (kp >= n) {
            s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.0f;
            continue;
        }
        const bool both = kp + 1 < n;  // the pair's second key is in the chunk
        float p0[2], p1[2];
        UNROLL
        for (int e = 0; e < 2; e++) {
            p0[e] = e == 0 || both ? st(s[j][e] / sum0, S) : 0.0f;
            p1[e] = e == 0 || both ? st(s[j][2 + e] / sum1, S) : 0.0f;
        }
        if (row0) st_half2<S>(probs, at0 + kp, p0[0], p0[1], both, pairs);
        if (row1) st_half2<S>(probs, at1 + kp, p1[0], p1[1], both, pairs);
        if (dropout) {
            UNROLL
            for (int e = 0; e < 2; e++) {
                p0[e] = st(p0[e] * ((keep0 >> (2 * j + e)) & 1u ? dscale : 0.0f), S);
                p1[e] = st(p1[e] * ((keep1 >> (2 * j + e)) & 1u ? dscale : 0.0f), S);
            }
            if (probs_drop && row0) st_half2<S>(probs_drop, at0 + kp, p0[0], p0[1], both, pairs);
            if (probs_drop && row1) st_half2<S>(probs_drop, at1 + kp, p1[0], p1[1], both, pairs);
        }
        s[j][0] = p0[0];
        s[j][1] = p0[1];
        s[j][2] = p1[0];
        s[j][3] = p1[1];
    }
}
// 32-bit stores of key pairs: an even row length puts every pair at an even index.
__device__ __forceinline__ bool fwd_pairs(int seq, const void* probs, const void* probs_drop,
                                          int dropout) {
    return seq % 2 == 0 && ((unsigned long long)probs & 3) == 0 &&
           (!dropout || ((unsigned long long)probs_drop & 3) == 0);
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
    const FusedAt a = fused_at<D>(seq, heads);
    // q (the block's) and k rows, v transposed; zeros past the sequence; each with its bias
    // when given.
    fused_rows<S, D>(qs, q, a.tok0, a.hid, a.q0, FUSED_Q, seq,
                     bias_of<D>(bias, bias_t, bias_stride, 0, a.h));
    fused_rows<S, D>(ks, k, a.tok0, a.hid, 0, FUSED_KEYS, seq,
                     bias_of<D>(bias, bias_t, bias_stride, 1, a.h));
    fused_transpose<S>(vt, v + a.tok0, a.hid, D / 8, seq, D,
                       bias_of<D>(bias, bias_t, bias_stride, 2, a.h));
    __syncthreads();
    if (!a.live) return;  // a whole warp without queries; no barrier follows

    // s = q·kᵀ, a tile of 8 keys at a time, 16 dimensions a step; then the softmax of rows i0
    // and i1, each exp computed once and kept for the probabilities; keys past the sequence
    // take no part and leave zeros for the product below.
    float s[FUSED_KEYS / 8][4];
    mma_key_tiles<S, D>(s, qs, ks, a.r0, a.g, a.t, (seq + 7) >> 3);
    const unsigned* m = mask + (long long)a.b * seq;
    scale_and_mask<FUSED_KEYS / 8>(s, m, 0, seq, a.t, scale);
    float mx0 = -f32_inf(), mx1 = -f32_inf(), sum0 = 0.0f, sum1 = 0.0f;
    rows_max<FUSED_KEYS / 8>(s, seq, a.t, mx0, mx1);
    mx0 = quad_max(mx0);
    mx1 = quad_max(mx1);
    rows_exp<FUSED_KEYS / 8>(s, seq, a.t, mx0, mx1, true, sum0, sum1);
    sum0 = quad_sum(sum0);
    sum1 = quad_sum(sum1);
    unsigned keep0 = 0u, keep1 = 0u;
    if (dropout) keep_bits(a.at0, a.at1, seq, a.t, seq, key, threshold, keep0, keep1);
    store_probs<S, FUSED_KEYS / 8>(s, probs, probs_drop, a.at0, a.at1, seq, a.i0 < seq,
                                   a.i1 < seq, a.t, sum0, sum1, dropout, keep0, keep1, dscale,
                                   fwd_pairs(seq, probs, probs_drop, dropout));

    // ctx = p·v: 16 keys a step, the A fragment from two key tiles' probabilities; rounded
    // once from f32, as the GEMM's output.
    float o[D / 8][4];
    zero_dim_tiles<D>(o);
    mma_dim_tiles<S, D, FUSED_KEYS / 8>(o, s, vt, a.g, a.t, (seq + 15) >> 4);
    store_head_rows<S, D>(ctx, o, 1.0f, a.b, a.h, seq, a.hid, a.i0, a.i1, a.t);
}

// A long kernel's next chunk of keys (c0 … c0 + FUSED_CHUNK − 1), once every warp is done with
// the last one: their rows of `src` into `rows` (k in the forward, v in attention_bwd_dq), and
// with `also` their rows of `tsrc` transposed into `trows` (v, k); then, for a warp with rows
// (`live`; every warp meets both barriers), the products of its rows of `as` (q, dctx) with the
// chunk's `n` keys into s, a tile of 8 keys at a time.
template <int S, int D>
__device__ __forceinline__ void chunk_products(float s[FUSED_CHUNK / 8][4], unsigned* rows,
                                               const unsigned short* src, HeadBias bias,
                                               unsigned* trows, const unsigned short* tsrc,
                                               HeadBias tbias, bool also, const unsigned* as,
                                               const FusedAt& a, int c0, int n, int seq) {
    __syncthreads();
    fused_rows<S, D>(rows, src, a.tok0, a.hid, c0, FUSED_CHUNK, seq, bias);
    if (also)
        fused_transpose<S, FUSED_CHUNK>(trows, tsrc + a.tok0 + (long long)c0 * a.hid, a.hid,
                                        D / 8, seq - c0, D, tbias);
    __syncthreads();
    if (a.live) mma_key_tiles<S, D, FUSED_CHUNK / 8>(s, as, rows, a.r0, a.g, a.t, (n + 7) >> 3);
}

// The forward for longer sequences (seq > FUSED_KEYS; attention.rs, `fused`): attention_fused's
// block, warps and shared rooms, the keys taken FUSED_CHUNK at a time into `ks` (and `vt`). The
// softmax keeps its exact row max and sum, the CPU's (flash attention's running rescale of the
// sum would round otherwise), so a warp computes its scores three times, one pass over the
// chunks each: the row max; the sum of the exps; then the probabilities, stored (and dropped,
// stored), and their product with v added chunk by chunk to ctx's f32 accumulators. q·kᵀ on the
// tensor cores costs less than the f32 scores the batched products write and the softmax reads
// back ([batch, heads, seq, seq], 16 times 128 keys' at 512). A lane adds its keys' exps and
// products in key order as attention_fused does, so where both fit they give the same bits.
template <int S, int D>
__device__ __forceinline__ void attention_fused_long_t(
    unsigned* qs, unsigned* ks, unsigned* vt, unsigned short* ctx, unsigned short* probs,
    unsigned short* probs_drop, const unsigned short* q, const unsigned short* k,
    const unsigned short* v, const unsigned* mask, int seq, int heads, float scale, int dropout,
    DropKey key, unsigned threshold, float dscale, const void* bias, int bias_t,
    int bias_stride) {
    const FusedAt a = fused_at<D>(seq, heads);
    const HeadBias kb = bias_of<D>(bias, bias_t, bias_stride, 1, a.h);
    const HeadBias vb = bias_of<D>(bias, bias_t, bias_stride, 2, a.h);
    fused_rows<S, D>(qs, q, a.tok0, a.hid, a.q0, FUSED_Q, seq,
                     bias_of<D>(bias, bias_t, bias_stride, 0, a.h));
    const unsigned* m = mask + (long long)a.b * seq;
    const bool pairs = fwd_pairs(seq, probs, probs_drop, dropout);
    float mx0 = -f32_inf(), mx1 = -f32_inf(), sum0 = 0.0f, sum1 = 0.0f;
    float o[D / 8][4];
    zero_dim_tiles<D>(o);
    // A warp without queries still meets every barrier.
    NO_UNROLL
    for (int pass = 0; pass < 3; pass++) {
        NO_UNROLL
        for (int c0 = 0; c0 < seq; c0 += FUSED_CHUNK) {
            // s = q·kᵀ of the chunk's keys; v's rows too for the last pass.
            const int n = min(seq - c0, FUSED_CHUNK);  // the chunk's keys
            float s[FUSED_CHUNK / 8][4];
            chunk_products<S, D>(s, ks, k, kb, vt, v, vb, pass == 2, qs, a, c0, n, seq);
            if (!a.live) continue;
            scale_and_mask<FUSED_CHUNK / 8>(s, m, c0, n, a.t, scale);
            if (pass == 0) {
                rows_max<FUSED_CHUNK / 8>(s, n, a.t, mx0, mx1);
                continue;
            }
            rows_exp<FUSED_CHUNK / 8>(s, n, a.t, mx0, mx1, pass == 1, sum0, sum1);
            if (pass == 1) continue;
            unsigned keep0 = 0u, keep1 = 0u;
            if (dropout)
                keep_bits(a.at0 + c0, a.at1 + c0, n, a.t, seq, key, threshold, keep0, keep1);
            store_probs<S, FUSED_CHUNK / 8>(s, probs, probs_drop, a.at0 + c0, a.at1 + c0, n,
                                            a.i0 < seq, a.i1 < seq, a.t, sum0, sum1, dropout,
                                            keep0, keep1, dscale, pairs);
            mma_dim_tiles<S, D, FUSED_CHUNK / 8>(o, s, vt, a.g, a.t, (n + 15) >> 4);
        }
        if (a.live && pass == 0) {
            mx0 = quad_max(mx0);
            mx1 = quad_max(mx1);
        } else if (a.live && pass == 1) {
            sum0 = quad_sum(sum0);
            sum1 = quad_sum(sum1);
        }
    }
    if (a.live) store_head_rows<S, D>(ctx, o, 1.0f, a.b, a.h, seq, a.hid, a.i0, a.i1, a.t);
}

// The two forward entry points' body: the dropout key and the dispatch on the types and head
// size, to attention_fused_t (one chunk of keys) or attention_fused_long_t.
template <bool LONG>
__device__ __forceinline__ void attention_fused_by(unsigned* qs, unsigned* ks, unsigned* vt,
                                                   void* ctx, void* probs, void* probs_drop,
                                                   const void* q, const void* k, const void* v,
                                                   const unsigned* mask, int seq, int heads,
                                                   int head_dim, float scale, int dropout,
                                                   const unsigned* key, unsigned long long site,
                                                   unsigned threshold, float dscale,
                                                   const void* bias, int bias_t, int bias_stride,
                                                   int store) {
    DropKey dk = {0, 0};
    if (dropout) dk = drop_key(key, site);
#define FUSED_ARGS                                                                              \
    qs, ks, vt, (unsigned short*)ctx, (unsigned short*)probs, (unsigned short*)probs_drop,      \
        (const unsigned short*)q, (const unsigned short*)k, (const unsigned short*)v, mask, seq, \
        heads, scale, dropout, dk, threshold, dscale, bias, bias_t, bias_stride
#define FUSED(S, D)                                          \
    do {                                                     \
        if (LONG)                                            \
            attention_fused_long_t<S, D>(FUSED_ARGS);        \
        else                                                 \
            attention_fused_t<S, D>(FUSED_ARGS);             \
    } while (0)
    BY_STORE_HEAD(store, head_dim, FUSED);
#undef FUSED
#undef FUSED_ARGS
}
// Grid (⌈seq / FUSED_Q⌉, heads, batch), FUSED_Q·2 threads; head_dim 32 or 64; probs_drop is
// written only with `dropout` and where not null (Backend::attention_redraws_dropout); `store`
// STORE_F16 or STORE_BF16, every buffer of it; `bias` (of type bias_t; null: none) q's, k's and
// v's biases, `bias_stride` elements apart, added as q, k and v are loaded. attention_fused for
// seq ≤ FUSED_KEYS, attention_fused_long past it.
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
    attention_fused_by<false>(qs, ks, vt, ctx, probs, probs_drop, q, k, v, mask, seq, heads,
                              head_dim, scale, dropout, key, site, threshold, dscale, bias,
                              bias_t, bias_stride, store);
}
extern "C" __global__ void attention_fused_long(void* ctx, void* probs, void* probs_drop,
                                                const void* q, const void* k, const void* v,
                                                const unsigned* mask, int seq, int heads,
                                                int head_dim, float scale, int dropout,
                                                const unsigned* key, unsigned long long site,
                                                unsigned threshold, float dscale,
                                                const void* bias, int bias_t, int bias_stride,
                                                int store) {
    GRID_WAIT();
    __shared__ unsigned qs[FUSED_Q * FUSED_LD(FUSED_D_MAX) / 2];
    __shared__ unsigned ks[FUSED_CHUNK * FUSED_LD(FUSED_D_MAX) / 2];
    __shared__ unsigned vt[FUSED_D_MAX * FUSED_LDT / 2];
    attention_fused_by<true>(qs, ks, vt, ctx, probs, probs_drop, q, k, v, mask, seq, heads,
                             head_dim, scale, dropout, key, site, threshold, dscale, bias,
                             bias_t, bias_stride, store);
}

// The backward for the shapes the fused forward takes (attention.rs, `fused`), in two launches
// where the unfused path takes four batched GEMMs, the softmax backward between them, their
// address lists and an f32 dp of the probabilities' size written and read back. The operations
// per element and the roundings are that path's (the CPU backend's `attn_bwd_one`):
//   dp = dctx·vᵀ (f32), x = dp, or with dropout dp · dscale where probs_drop is not 0 and 0
//   where it is; ds = p ⊙ (x − Σ_keys x·p) rounded; dq = scale · ds·k, dk = scale · dsᵀ·q and
//   dv = probs_dropᵀ·dctx (probs without dropout), each rounded once from f32.
// probs_drop is not read: the forward's mask is drawn again (the same Philox blocks of the same
// element indices: keep_bits, drop_again), so the forward need not store it. probs_drop is not
// 0 exactly where the element is kept and its probability is not 0 (a kept probability, at
// least the smallest subnormal, times dscale > 1 rounds to no less), which is the mask x takes;
// dv's operand is each probability times its multiplier, rounded, as store_probs rounds it.
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

// The dq backward's steps on one key tile of a warp's dp (x: rows i0 in x[0..1] and i1 in
// x[2..3], the lane's pair of keys kp and kp + 1, the second only with `both`; at0 and at1 the
// rows' elements of key kp, row0 and row1 whether the rows are in the sequence). dp as the
// backward uses it, in place: with dropout, masked as the forward dropped (`keep`, bit e for
// x[e]: tile_keep, where the probability is not 0: probs_drop's zeros); and the tile's
// probabilities p (0 for a row past the sequence):
template <int S>
__device__ __forceinline__ void dp_tile(float x[4], float p[4], const unsigned short* probs,
                                        long long at0, long long at1, bool both, bool pairs,
                                        bool row0, bool row1, int dropout, unsigned keep,
                                        float dscale) {
    if (row0) ld_half2<S>(probs, at0, both, pairs, p[0], p[1]);
    else p[0] = p[1] = 0.0f;
    if (row1) ld_half2<S>(probs, at1, both, pairs, p[2], p[3]);
    else p[2] = p[3] = 0.0f;
    if (dropout) {
        UNROLL
        for (int e = 0; e < 4; e++)
            x[e] = (keep >> e) & 1u && p[e] != 0.0f ? x[e] * dscale : 0.0f;
    }
}
// Key tile j's bits of keep_bits' rows, as dp_tile takes them: row 0's pair, then row 1's.
__device__ __forceinline__ unsigned tile_keep(unsigned keep0, unsigned keep1, int j) {
    return ((keep0 >> (2 * j)) & 3u) | (((keep1 >> (2 * j)) & 3u) << 2);
}
// The tile's terms of each row's Σ x·p, added by key:
__device__ __forceinline__ void dot_tile(const float x[4], const float p[4], bool both,
                                         float& dot0, float& dot1) {
    dot0 += x[0] * p[0];
    dot1 += x[2] * p[2];
    if (both) {
        dot0 += x[1] * p[1];
        dot1 += x[3] * p[3];
    }
}
// ds = p ⊙ (x − Σ x·p), rounded, in place of x (0 for a second key past the sequence), and
// stored:
template <int S>
__device__ __forceinline__ void ds_tile(float x[4], const float p[4], bool both, float dot0,
                                        float dot1, unsigned short* ds, long long at0,
                                        long long at1, bool row0, bool row1, bool pairs) {
    UNROLL
    for (int e = 0; e < 2; e++) {
        x[e] = e == 0 || both ? st(p[e] * (x[e] - dot0), S) : 0.0f;
        x[2 + e] = e == 0 || both ? st(p[2 + e] * (x[2 + e] - dot1), S) : 0.0f;
    }
    if (row0) st_half2<S>(ds, at0, x[0], x[1], both, pairs);
    if (row1) st_half2<S>(ds, at1, x[2], x[3], both, pairs);
}
// 32-bit loads and stores of key pairs: an even row length puts every pair at an even index.
__device__ __forceinline__ bool bwd_pairs(int seq, const void* probs, const void* ds) {
    return seq % 2 == 0 && ((unsigned long long)probs & 3) == 0 &&
           ((unsigned long long)ds & 3) == 0;
}

template <int S, int D>
__device__ __forceinline__ void attention_bwd_dq_t(unsigned* dcs, unsigned* vs, unsigned* kt,
                                                   unsigned short* dq, unsigned short* ds,
                                                   const unsigned short* dctx,
                                                   const unsigned short* k,
                                                   const unsigned short* v,
                                                   const unsigned short* probs, int seq,
                                                   int heads, int ld, float scale, int dropout,
                                                   DropKey key, unsigned threshold, float dscale,
                                                   const void* bias, int bias_t, int bias_stride) {
    const FusedAt a = fused_at<D>(seq, heads);
    fused_rows<S, D>(dcs, dctx, a.tok0, a.hid, a.q0, FUSED_Q, seq, no_bias());
    fused_rows<S, D>(vs, v, a.tok0, a.hid, 0, FUSED_KEYS, seq,
                     bias_of<D>(bias, bias_t, bias_stride, 2, a.h));
    fused_transpose<S>(kt, k + a.tok0, a.hid, D / 8, seq, D,
                       bias_of<D>(bias, bias_t, bias_stride, 1, a.h));
    __syncthreads();
    if (!a.live) return;  // a whole warp without queries; no barrier follows

    // dp = dctx·vᵀ, a tile of 8 keys at a time, 16 dimensions a step.
    float s[FUSED_KEYS / 8][4];
    mma_key_tiles<S, D>(s, dcs, vs, a.r0, a.g, a.t, (seq + 7) >> 3);

    // x (dp, dropped as the forward dropped) and each row's Σ x·p, the probabilities kept as
    // the 16-bit pairs they were loaded in.
    const bool pairs = bwd_pairs(seq, probs, ds);
    const bool row0 = a.i0 < seq, row1 = a.i1 < seq;
    unsigned keep0 = 0u, keep1 = 0u;
    if (dropout) keep_bits(a.at0, a.at1, seq, a.t, seq, key, threshold, keep0, keep1);
    unsigned pw[FUSED_KEYS / 8][2];
    float dot0 = 0.0f, dot1 = 0.0f;
    UNROLL
    for (int j = 0; j < FUSED_KEYS / 8; j++) {
        const int kp = j * 8 + 2 * a.t;  // the lane's pair of keys in this tile
        pw[j][0] = pw[j][1] = 0u;
        if (kp >= seq) continue;
        const bool both = kp + 1 < seq;
        float p[4];
        dp_tile<S>(s[j], p, probs, a.at0 + kp, a.at1 + kp, both, pairs, row0, row1, dropout,
                   tile_keep(keep0, keep1, j), dscale);
        pw[j][0] = pack_half2<S>(p[0], p[1]);
        pw[j][1] = pack_half2<S>(p[2], p[3]);
        dot_tile(s[j], p, both, dot0, dot1);
    }
    dot0 = quad_sum(dot0);
    dot1 = quad_sum(dot1);
    // ds, rounded, written and kept in s for the product; zeros past the sequence.
    UNROLL
    for (int j = 0; j < FUSED_KEYS / 8; j++) {
        const int kp = j * 8 + 2 * a.t;
        if (kp >= seq) {
            s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.0f;
            continue;
        }
        float p[4];
        UNROLL
        for (int e = 0; e < 4; e++)
            p[e] = half_value<S>((unsigned short)(pw[j][e >> 1] >> (16 * (e & 1))));
        ds_tile<S>(s[j], p, kp + 1 < seq, dot0, dot1, ds, a.at0 + kp, a.at1 + kp, row0, row1,
                   pairs);
    }

    // dq = scale · ds·k: 16 keys a step, the A fragment from two key tiles of ds.
    float o[D / 8][4];
    zero_dim_tiles<D>(o);
    mma_dim_tiles<S, D, FUSED_KEYS / 8>(o, s, kt, a.g, a.t, (seq + 15) >> 4);
    store_head_rows<S, D>(dq, o, scale, a.b, a.h, seq, ld, a.i0, a.i1, a.t);
}

// The dq backward for seq > FUSED_KEYS: attention_bwd_dq's block and rooms, the keys taken
// FUSED_CHUNK at a time into `vs` (and `kt`), in two passes over them: dp = dctx·vᵀ and each
// row's Σ x·p; then dp again, ds (stored) and ds·k added chunk by chunk to dq's accumulators.
// By key, as attention_bwd_dq adds them: where both fit, the same bits.
template <int S, int D>
__device__ __forceinline__ void attention_bwd_dq_long_t(
    unsigned* dcs, unsigned* vs, unsigned* kt, unsigned short* dq, unsigned short* ds,
    const unsigned short* dctx, const unsigned short* k, const unsigned short* v,
    const unsigned short* probs, int seq, int heads, int ld, float scale, int dropout,
    DropKey key, unsigned threshold, float dscale, const void* bias, int bias_t,
    int bias_stride) {
    const FusedAt a = fused_at<D>(seq, heads);
    const HeadBias kb = bias_of<D>(bias, bias_t, bias_stride, 1, a.h);
    const HeadBias vb = bias_of<D>(bias, bias_t, bias_stride, 2, a.h);
    fused_rows<S, D>(dcs, dctx, a.tok0, a.hid, a.q0, FUSED_Q, seq, no_bias());
    const bool pairs = bwd_pairs(seq, probs, ds);
    const bool row0 = a.i0 < seq, row1 = a.i1 < seq;
    float dot0 = 0.0f, dot1 = 0.0f;
    float o[D / 8][4];
    zero_dim_tiles<D>(o);
    // A warp without queries still meets every barrier.
    NO_UNROLL
    for (int pass = 0; pass < 2; pass++) {
        NO_UNROLL
        for (int c0 = 0; c0 < seq; c0 += FUSED_CHUNK) {
            // dp = dctx·vᵀ of the chunk's keys; k's rows too for the second pass.
            const int n = min(seq - c0, FUSED_CHUNK);  // the chunk's keys
            float s[FUSED_CHUNK / 8][4];
            chunk_products<S, D>(s, vs, v, vb, kt, k, kb, pass == 1, dcs, a, c0, n, seq);
            if (!a.live) continue;
            unsigned keep0 = 0u, keep1 = 0u;
            if (dropout)
                keep_bits(a.at0 + c0, a.at1 + c0, n, a.t, seq, key, threshold, keep0, keep1);
            UNROLL
            for (int j = 0; j < FUSED_CHUNK / 8; j++) {
                const int kp = j * 8 + 2 * a.t;  // the lane's pair of keys in this tile
                if (kp >= n) {
                    s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.0f;
                    continue;
                }
                const bool both = kp + 1 < n;
                const long long at0 = a.at0 + c0 + kp, at1 = a.at1 + c0 + kp;
                float p[4];
                dp_tile<S>(s[j], p, probs, at0, at1, both, pairs, row0, row1, dropout,
                           tile_keep(keep0, keep1, j), dscale);
                if (pass == 0)
                    dot_tile(s[j], p, both, dot0, dot1);
                else
                    ds_tile<S>(s[j], p, both, dot0, dot1, ds, at0, at1, row0, row1, pairs);
            }
            if (pass == 1)
                mma_dim_tiles<S, D, FUSED_CHUNK / 8>(o, s, kt, a.g, a.t, (n + 15) >> 4);
        }
        if (a.live && pass == 0) {
            dot0 = quad_sum(dot0);
            dot1 = quad_sum(dot1);
        }
    }
    if (a.live) store_head_rows<S, D>(dq, o, scale, a.b, a.h, seq, ld, a.i0, a.i1, a.t);
}

// The two dq entry points' body: the dispatch on the types and head size, to
// attention_bwd_dq_t (one chunk of keys) or attention_bwd_dq_long_t.
template <bool LONG>
__device__ __forceinline__ void attention_bwd_dq_by(unsigned* dcs, unsigned* vs, unsigned* kt,
                                                    void* dq, void* ds, const void* dctx,
                                                    const void* k, const void* v,
                                                    const void* probs, int seq, int heads,
                                                    int head_dim, int ld, float scale,
                                                    int dropout, const unsigned* key,
                                                    unsigned long long site, unsigned threshold,
                                                    float dscale, const void* bias, int bias_t,
                                                    int bias_stride, int store) {
    DropKey dk = {0, 0};
    if (dropout) dk = drop_key(key, site);
#define BWD_DQ_ARGS                                                                             \
    dcs, vs, kt, (unsigned short*)dq, (unsigned short*)ds, (const unsigned short*)dctx,         \
        (const unsigned short*)k, (const unsigned short*)v, (const unsigned short*)probs, seq,  \
        heads, ld, scale, dropout, dk, threshold, dscale, bias, bias_t, bias_stride
#define BWD_DQ(S, D)                                          \
    do {                                                      \
        if (LONG)                                             \
            attention_bwd_dq_long_t<S, D>(BWD_DQ_ARGS);       \
        else                                                  \
            attention_bwd_dq_t<S, D>(BWD_DQ_ARGS);            \
    } while (0)
    BY_STORE_HEAD(store, head_dim, BWD_DQ);
#undef BWD_DQ
#undef BWD_DQ_ARGS
}
// Grid (⌈seq / FUSED_Q⌉, heads, batch), FUSED_Q·2 threads; head_dim 32 or 64; with `dropout`,
// the forward's key, site, threshold and dscale (attention_fused's); ds: the 16-bit room for
// the softmax's gradient, [batch, heads, seq, seq]; dq's rows `ld` apart (Backend::attention_bwd's
// QkvRows); `bias` as attention_fused's (k's and v's are read). attention_bwd_dq for
// seq ≤ FUSED_KEYS, attention_bwd_dq_long past it.
extern "C" __global__ void attention_bwd_dq(void* dq, void* ds, const void* dctx, const void* k,
                                            const void* v, const void* probs, int seq, int heads,
                                            int head_dim, int ld, float scale, int dropout,
                                            const unsigned* key, unsigned long long site,
                                            unsigned threshold, float dscale, const void* bias,
                                            int bias_t, int bias_stride, int store) {
    GRID_WAIT();
    __shared__ unsigned dcs[FUSED_Q * FUSED_LD(FUSED_D_MAX) / 2];
    __shared__ unsigned vs[FUSED_KEYS * FUSED_LD(FUSED_D_MAX) / 2];
    __shared__ unsigned kt[FUSED_D_MAX * FUSED_LDT / 2];
    attention_bwd_dq_by<false>(dcs, vs, kt, dq, ds, dctx, k, v, probs, seq, heads, head_dim, ld,
                               scale, dropout, key, site, threshold, dscale, bias, bias_t,
                               bias_stride, store);
}
extern "C" __global__ void attention_bwd_dq_long(void* dq, void* ds, const void* dctx,
                                                 const void* k, const void* v, const void* probs,
                                                 int seq, int heads, int head_dim, int ld,
                                                 float scale, int dropout, const unsigned* key,
                                                 unsigned long long site, unsigned threshold,
                                                 float dscale, const void* bias, int bias_t,
                                                 int bias_stride, int store) {
    GRID_WAIT();
    __shared__ unsigned dcs[FUSED_Q * FUSED_LD(FUSED_D_MAX) / 2];
    __shared__ unsigned vs[FUSED_CHUNK * FUSED_LD(FUSED_D_MAX) / 2];
    __shared__ unsigned kt[FUSED_D_MAX * FUSED_LDT / 2];
    attention_bwd_dq_by<true>(dcs, vs, kt, dq, ds, dctx, k, v, probs, seq, heads, head_dim, ld,
                              scale, dropout, key, site, threshold, dscale, bias, bias_t,
                              bias_stride, store);
}

template <int S, int D, bool LONG>
__device__ __forceinline__ void attention_bwd_dkv_t(unsigned* at, unsigned* bt, unsigned short* dk,
                                                    unsigned short* dv, const unsigned short* ds,
                                                    const unsigned short* probs,
                                                    const unsigned short* q,
                                                    const unsigned short* dctx, int seq,
                                                    int heads, int ld, float scale, HeadBias qb,
                                                    DropAgain drop) {
    // The block's rows are keys: q0 the first, i0 and i1 the lane's two.
    const FusedAt a = fused_at<D>(seq, heads);
    const int b = a.b, h = a.h, k0 = a.q0, hid = a.hid, g = a.g, t = a.t, r0 = a.r0;
    const int i0 = a.i0, i1 = a.i1;
    const long long tok0 = a.tok0;
    const long long sq0 = (long long)(b * heads + h) * seq * seq;  // the head's [seq, seq]
    const bool live = a.live;  // the warp has keys
    // dk = scale · dsᵀ·q, then dv = probs_dropᵀ·dctx (probs dropped as they are loaded, with
    // `drop.on`), in the same shared room; LONG (seq >
    // FUSED_KEYS, attention_bwd_dkv_long) the queries FUSED_KEYS at a time, added to the f32
    // accumulators in order (a separate kernel: the loop cost the short one 27 registers).
    NO_UNROLL
    for (int phase = 0; phase < 2; phase++) {
        float o[D / 8][4];
        zero_dim_tiles<D>(o);
        NO_UNROLL
        for (int c0 = 0; c0 < (LONG ? seq : 1); c0 += FUSED_KEYS) {
            const long long blk = sq0 + (long long)c0 * seq + k0;  // the block's first element
            const DropAgain d = phase && drop.on
                                    ? DropAgain{true, blk, drop.key, drop.threshold, drop.dscale}
                                    : no_drop();
            if (phase || c0) __syncthreads();  // every warp is done with the last operands
            fused_transpose<S>(at, (phase ? probs : ds) + blk, seq, FUSED_Q / 8, seq - c0,
                               seq - k0, no_bias(), d);
            fused_transpose<S>(bt, (phase ? dctx : q) + tok0 + (long long)c0 * hid, hid, D / 8,
                               seq - c0, D, phase ? no_bias() : qb);
            __syncthreads();
            if (!live) continue;  // the barriers above are all this warp must meet
            const int steps = (min(seq - c0, FUSED_KEYS) + 15) >> 4;  // queries, 16 a step
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
        }
        if (live)
            store_head_rows<S, D>(phase ? dv : dk, o, phase ? 1.0f : scale, b, h, seq, ld, i0,
                                  i1, t);
    }
}
// The two entry points' body: the head's bias and the dispatch on the types and head size.
template <bool LONG>
__device__ __forceinline__ void attention_bwd_dkv_by(unsigned* at, unsigned* bt, void* dk,
                                                     void* dv, const void* ds,
                                                     const void* probs, const void* q,
                                                     const void* dctx, int seq, int heads,
                                                     int head_dim, int ld, float scale,
                                                     int dropout, const unsigned* key,
                                                     unsigned long long site, unsigned threshold,
                                                     float dscale, const void* bias, int bias_t,
                                                     int bias_stride, int store) {
    const HeadBias qb =
        bias ? head_bias(bias, bias_t, bias_stride, 0, blockIdx.y, head_dim) : no_bias();
    DropAgain drop = no_drop();
    if (dropout) drop = DropAgain{true, 0, drop_key(key, site), threshold, dscale};
#define BWD_DKV(S, D)                                                                           \
    attention_bwd_dkv_t<S, D, LONG>(at, bt, (unsigned short*)dk, (unsigned short*)dv,             \
                                    (const unsigned short*)ds, (const unsigned short*)probs,    \
                                    (const unsigned short*)q, (const unsigned short*)dctx, seq, \
                                    heads, ld, scale, qb, drop)
    BY_STORE_HEAD(store, head_dim, BWD_DKV);
#undef BWD_DKV
}
// Grid (⌈seq / FUSED_Q⌉, heads, batch), FUSED_Q·2 threads; probs and, with `dropout`, the
// forward's key, site, threshold and dscale make dv's operand; dk's and dv's rows `ld` apart;
// `bias` as attention_fused's (q's is read).
extern "C" __global__ void attention_bwd_dkv(void* dk, void* dv, const void* ds,
                                             const void* probs, const void* q, const void* dctx,
                                             int seq, int heads, int head_dim, int ld,
                                             float scale, int dropout, const unsigned* key,
                                             unsigned long long site, unsigned threshold,
                                             float dscale, const void* bias, int bias_t,
                                             int bias_stride, int store) {
    GRID_WAIT();
    __shared__ unsigned at[FUSED_Q * FUSED_LDT / 2];
    __shared__ unsigned bt[FUSED_D_MAX * FUSED_LDT / 2];
    attention_bwd_dkv_by<false>(at, bt, dk, dv, ds, probs, q, dctx, seq, heads, head_dim, ld,
                                scale, dropout, key, site, threshold, dscale, bias, bias_t,
                                bias_stride, store);
}
// attention_bwd_dkv's grid, block and arguments, for seq > FUSED_KEYS.
extern "C" __global__ void attention_bwd_dkv_long(void* dk, void* dv, const void* ds,
                                                  const void* probs, const void* q,
                                                  const void* dctx, int seq, int heads,
                                                  int head_dim, int ld, float scale, int dropout,
                                                  const unsigned* key, unsigned long long site,
                                                  unsigned threshold, float dscale,
                                                  const void* bias, int bias_t, int bias_stride,
                                                  int store) {
    GRID_WAIT();
    __shared__ unsigned at[FUSED_Q * FUSED_LDT / 2];
    __shared__ unsigned bt[FUSED_D_MAX * FUSED_LDT / 2];
    attention_bwd_dkv_by<true>(at, bt, dk, dv, ds, probs, q, dctx, seq, heads, head_dim, ld,
                               scale, dropout, key, site, threshold, dscale, bias, bias_t,
                               bias_stride, store);
}
