// BERT embeddings, forward and backward. The semantics are the CPU backend's
// (runtime/src/backend/cpu.rs, `embedding_fwd` / `embedding_bwd`):
//
//   out[i, c] = (word[ids[i], c] + typ[types[i], c]) + pos[i % seq, c]   (HF's association)
//
// for the tokens i = b*seq + t of a [batch, seq] id matrix, every row `hidden` wide.
//
// The backward is a scatter-add into the tables. It uses no atomics: each (row, column) of a
// table is summed by one thread, which adds the tokens' gradients in token order, the CPU loop's
// order, so the sums are the same bits as the CPU's and the same on every run.
#include "common.cuh"

// Forward: one thread per element of out (tokens × hidden), 1-D grid of BLOCK threads.
// The tables are typed buffers (the model's parameters, 16 bits on a device keeping them so).
extern "C" __global__ void embedding_fwd(void* out, int out_t, const unsigned* ids,
                                         const unsigned* types, const void* word,
                                         const void* pos, const void* typ, int tables_t,
                                         int tokens, int seq, int hidden, int store) {
    GRID_WAIT();
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (long long)tokens * hidden) return;
    int tok = (int)(i / hidden), c = (int)(i % hidden);
    long long w = ids[tok], ty = types[tok], p = tok % seq;
    float wv = ld(word, w * hidden + c, tables_t), tv = ld(typ, ty * hidden + c, tables_t);
    sto(out, i, st((wv + tv) + ld(pos, p * hidden + c, tables_t), store), out_t);
}

// The backward into the word table (indexed by ids) and the token-type table (by types). Its
// sums must be the CPU's, dtable[row, c] += dout[i, c] for the tokens i of that row in token
// order, without atomics. So the tokens are first put in order of their row, ties in token order
// (a stable sort, `embedding_order`); then the tokens of each row (a run of the order) are summed
// per column, a chain of additions in token order. A short run is one thread's per column
// (`embedding_bwd_short`); a long one, such as the token-type table's single run of every token
// in a one-segment batch (4096 for BERT-base's 32 × 128), would keep that thread waiting on one
// round trip to memory per few tokens (0.28 ms a step on an H200 when every run went that way:
// docs/cuda.md, "Performance"), so a block loads a long run's rows into shared memory for one
// warp to add (`embedding_bwd_long`).
//
// Order: order[rank(i)] = i, rank(i) = #{j : key[j] < key[i]} + #{j < i : key[j] == key[i]},
// and run[rank(i)] = #{j : key[j] == key[i]} for the first token of a row (0 for the others),
// for the ids (blockIdx.y == 0) and the types (blockIdx.y == 1): `order` holds, per table,
// `tokens` positions then `tokens` run lengths. A warp per token counts over all of them, a lane
// every 32nd (tokens² compares, 17 M for 4096 tokens; one thread per token took 0.12 ms on an
// H200, its loop one token after another), the counts summed by the warp's butterfly (integers:
// exact). Ranks are distinct, so each slot is written once.
extern "C" __global__ void embedding_order(unsigned* order, const unsigned* ids,
                                           const unsigned* types, int tokens) {
    GRID_WAIT();
    int i = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (i >= tokens) return;  // a whole warp leaves together: the shuffles below stay full
    int lane = threadIdx.x & 31;
    const unsigned* key = blockIdx.y == 0 ? ids : types;
    unsigned* ord = order + 2 * (long long)blockIdx.y * tokens;
    unsigned k = key[i];
    int less = 0, before = 0, same = 0;
    for (int j = lane; j < tokens; j += 32) {
        unsigned kj = key[j];
        less += kj < k;
        same += kj == k;
        before += kj == k && j < i;
    }
    for (int m = 16; m > 0; m >>= 1) {
        less += __shfl_xor_sync(0xffffffffu, less, m);
        same += __shfl_xor_sync(0xffffffffu, same, m);
        before += __shfl_xor_sync(0xffffffffu, before, m);
    }
    if (lane == 0) {
        ord[less + before] = i;
        ord[tokens + less + before] = before == 0 ? same : 0;
    }
}

// Runs of at most EMB_SHORT tokens are summed by `embedding_bwd_short`, longer ones by
// `embedding_bwd_long`, EMB_TILE rows of the run at a time (EMB_PER per warp of a BLOCK).
#define EMB_SHORT 16
#define EMB_TILE 256
#define EMB_PER (EMB_TILE / (BLOCK / 32))

// Short runs: one thread per (position p of the order, column c), grid (tokens,
// ⌈hidden / BLOCK⌉, 2), blockIdx.z the table as above. The thread at the first position of a
// run of at most EMB_SHORT tokens loads the run's token indices, then their rows (two round trips
// to memory), adds them to the table's row in token order, and rounds the row to the storage
// dtype, as the CPU does (it rounds only the rows a token touched: an untouched row keeps its
// bits). The others have nothing to do. dout is a typed buffer (common.cuh's ld).
template <int T>
__device__ __forceinline__ void embedding_bwd_short_t(float* dword, float* dtyp, const void* dout,
                                                      const unsigned* ids, const unsigned* types,
                                                      const unsigned* order, int tokens,
                                                      int hidden, int store) {
    int p = blockIdx.x, c = blockIdx.y * blockDim.x + threadIdx.x;
    if (c >= hidden) return;
    const unsigned* ord = order + 2 * (long long)blockIdx.z * tokens;
    int n = ord[tokens + p];
    if (n == 0 || n > EMB_SHORT) return;  // not a run's first, or a long run's
    float* dt = blockIdx.z == 0 ? dword : dtyp;
    const unsigned* key = blockIdx.z == 0 ? ids : types;
    unsigned tok[EMB_SHORT];
    UNROLL
    for (int u = 0; u < EMB_SHORT; u++) tok[u] = u < n ? ord[p + u] : 0u;
    float v[EMB_SHORT];
    UNROLL
    for (int u = 0; u < EMB_SHORT; u++)
        v[u] = u < n ? ldt<T>(dout, (long long)tok[u] * hidden + c) : 0.0f;
    long long at = (long long)key[tok[0]] * hidden + c;
    float acc = dt[at];
    UNROLL
    for (int u = 0; u < EMB_SHORT; u++)
        if (u < n) acc += v[u];
    dt[at] = st(acc, store);
}
extern "C" __global__ void embedding_bwd_short(float* dword, float* dtyp, const void* dout,
                                               int dout_t, const unsigned* ids,
                                               const unsigned* types, const unsigned* order,
                                               int tokens, int hidden, int store) {
    GRID_WAIT();
    BY_TYPE(dout_t, embedding_bwd_short_t, dword, dtyp, dout, ids, types, order, tokens, hidden,
            store);
}

// Long runs: a block of BLOCK threads per (32 columns, BLOCK positions of the order), grid
// (⌈hidden / 32⌉, ⌈tokens / BLOCK⌉, 2). Each thread checks one position; since a run longer than
// EMB_SHORT covers the next EMB_SHORT positions, two long runs start at least EMB_SHORT + 1 apart,
// so the first positions of the block's long runs have a slot each, (position − the block's
// first) / (EMB_SHORT + 1), and the block takes them in order with no list to build. (A block per
// possible first position left most of 11 thousand blocks idle for BERT-base, at two blocks an
// SM.) Then, EMB_TILE rows at a time, every warp loads EMB_PER of the run's rows (lane: column)
// into shared memory and warp 0 adds them to its columns' sums in token order. The loads are a
// step ahead of the additions (the next tile's rows while warp 0 adds this one's, their token
// indices two steps ahead), so a step costs about one round trip to memory for EMB_TILE rows
// where a thread alone would wait for one every few rows. The same additions in the same order
// as the CPU's: the same bits.
// (Shared memory is declared in the kernel, once: in each instantiation of the template it would
// be another array.)
template <int T>
__device__ __forceinline__ void embedding_bwd_long_t(float (*tile)[32], int p, float* dword,
                                                     float* dtyp, const void* dout,
                                                     const unsigned* ids, const unsigned* types,
                                                     const unsigned* order, int tokens,
                                                     int hidden, int store) {
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const unsigned* ord = order + 2 * (long long)blockIdx.z * tokens;
    int n = ord[tokens + p];
    int c = blockIdx.x * 32 + lane;
    bool mine = c < hidden;  // a lane past the last column loads and adds nothing
    float* dt = blockIdx.z == 0 ? dword : dtyp;
    const unsigned* key = blockIdx.z == 0 ? ids : types;
    long long at = (long long)key[ord[p]] * hidden + c;
    float acc = warp == 0 && mine ? dt[at] : 0.0f;
    int tiles = (n + EMB_TILE - 1) / EMB_TILE;
    // Row u of this warp's share of tile t is the run's row t · EMB_TILE + warp · EMB_PER + u.
#define EMB_ROW(t, u) ((t) * EMB_TILE + warp * EMB_PER + (u))
    unsigned tok[EMB_PER];
    float v[EMB_PER];
    UNROLL
    for (int u = 0; u < EMB_PER; u++) tok[u] = EMB_ROW(0, u) < n ? ord[p + EMB_ROW(0, u)] : 0u;
    UNROLL
    for (int u = 0; u < EMB_PER; u++)
        v[u] = EMB_ROW(0, u) < n && mine ? ldt<T>(dout, (long long)tok[u] * hidden + c) : 0.0f;
    if (tiles > 1) {
        UNROLL
        for (int u = 0; u < EMB_PER; u++)
            tok[u] = EMB_ROW(1, u) < n ? ord[p + EMB_ROW(1, u)] : 0u;
    }
    for (int t = 0; t < tiles; t++) {
        __syncthreads();  // warp 0 has added the tile before
        UNROLL
        for (int u = 0; u < EMB_PER; u++) tile[warp * EMB_PER + u][lane] = v[u];
        __syncthreads();  // the tile is whole
        if (t + 1 < tiles) {
            UNROLL
            for (int u = 0; u < EMB_PER; u++)
                v[u] = EMB_ROW(t + 1, u) < n && mine
                           ? ldt<T>(dout, (long long)tok[u] * hidden + c)
                           : 0.0f;
        }
        if (t + 2 < tiles) {
            UNROLL
            for (int u = 0; u < EMB_PER; u++)
                tok[u] = EMB_ROW(t + 2, u) < n ? ord[p + EMB_ROW(t + 2, u)] : 0u;
        }
        if (warp == 0 && mine) {
            int rows = min(EMB_TILE, n - t * EMB_TILE);
            for (int r = 0; r < rows; r++) acc += tile[r][lane];
        }
    }
#undef EMB_ROW
    if (warp == 0 && mine) dt[at] = st(acc, store);
}
#define EMB_SLOTS ((BLOCK + EMB_SHORT) / (EMB_SHORT + 1))
extern "C" __global__ void embedding_bwd_long(float* dword, float* dtyp, const void* dout,
                                              int dout_t, const unsigned* ids,
                                              const unsigned* types, const unsigned* order,
                                              int tokens, int hidden, int store) {
    GRID_WAIT();
    __shared__ float tile[EMB_TILE][32];
    __shared__ int starts[EMB_SLOTS];
    const unsigned* run = order + (2 * (long long)blockIdx.z + 1) * tokens;
    if (threadIdx.x < EMB_SLOTS) starts[threadIdx.x] = -1;
    __syncthreads();
    int q = blockIdx.y * BLOCK + threadIdx.x;
    if (q < tokens && (int)run[q] > EMB_SHORT) starts[threadIdx.x / (EMB_SHORT + 1)] = q;
    __syncthreads();
    for (int j = 0; j < EMB_SLOTS; j++) {
        int p = starts[j];  // the same for every thread
        if (p >= 0)
            BY_TYPE(dout_t, embedding_bwd_long_t, tile, p, dword, dtyp, dout, ids, types, order,
                    tokens, hidden, store);
    }
}
#undef EMB_SLOTS

// Backward into the position table: dpos[p, c] += Σ_b dout[b*seq + p, c], b in order (the tokens
// at position p, in token order). One thread per (p, c) of the first seq rows, 1-D grid of
// BLOCK threads; those are exactly the rows the CPU rounds.
extern "C" __global__ void embedding_bwd_pos(float* dpos, const void* dout, int dout_t,
                                             int batch, int seq, int hidden, int store) {
    GRID_WAIT();
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (long long)seq * hidden) return;
    float acc = dpos[i];
    long long stride = (long long)seq * hidden;  // one sequence of dout
    for (int b = 0; b < batch; b++) acc += ld(dout, b * stride + i, dout_t);
    dpos[i] = st(acc, store);
}
