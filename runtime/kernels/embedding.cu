// BERT embeddings, forward and backward. The semantics are the CPU backend's
// (runtime/src/backend/cpu.rs, `embedding_fwd` / `embedding_bwd`):
//
//   out[i, c] = (word[ids[i], c] + typ[types[i], c]) + pos[i % seq, c]   (HF's association)
//
// for the tokens i = b*seq + t of a [batch, seq] id matrix, every row `hidden` wide.
//
// The backward is a scatter-add into the tables. It uses no atomics: each (row, column) of a
// table is one thread's, which adds the tokens' gradients in token order, the CPU loop's order,
// so the sums are the same bits as the CPU's and the same on every run.
#include "common.cuh"

// Forward: one thread per element of out (tokens × hidden), 1-D grid of BLOCK threads.
// The tables are typed buffers (the model's parameters, 16 bits on a device keeping them so).
extern "C" __global__ void embedding_fwd(void* out, int out_t, const unsigned* ids,
                                         const unsigned* types, const void* word,
                                         const void* pos, const void* typ, int tables_t,
                                         int tokens, int seq, int hidden, int store) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (long long)tokens * hidden) return;
    int tok = (int)(i / hidden), c = (int)(i % hidden);
    long long w = ids[tok], ty = types[tok], p = tok % seq;
    float wv = ld(word, w * hidden + c, tables_t), tv = ld(typ, ty * hidden + c, tables_t);
    sto(out, i, st((wv + tv) + ld(pos, p * hidden + c, tables_t), store), out_t);
}

// The backward into the word table (indexed by ids) and the token-type table (by types) runs in
// two kernels. Its sums must be the CPU's, dtable[row, c] += dout[i, c] for the tokens i of that
// row in token order, without atomics; a thread per column looping over every token (the first
// version) kept 2·hidden threads busy for the whole batch. So the tokens are first put in order
// of their row, ties in token order (a stable sort), and then every (row, column) pair sums its
// own tokens.
//
// Order: order[rank(i)] = i, rank(i) = #{j : key[j] < key[i]} + #{j < i : key[j] == key[i]},
// and run[rank(i)] = #{j : key[j] == key[i]} for the first token of a row (0 for the others),
// for the ids (blockIdx.y == 0) and the types (blockIdx.y == 1): `order` holds, per table,
// `tokens` positions then `tokens` run lengths. One thread per token counts over all of them:
// tokens² compares, 17 M for BERT's 32 × 128, microseconds on a GPU; ranks are distinct, so
// each slot is written once.
extern "C" __global__ void embedding_order(unsigned* order, const unsigned* ids,
                                           const unsigned* types, int tokens) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= tokens) return;
    const unsigned* key = blockIdx.y == 0 ? ids : types;
    unsigned* ord = order + 2 * (long long)blockIdx.y * tokens;
    unsigned k = key[i];
    int less = 0, before = 0, same = 0;
    for (int j = 0; j < tokens; j++) {
        unsigned kj = key[j];
        less += kj < k;
        same += kj == k;
        before += kj == k && j < i;
    }
    ord[less + before] = i;
    ord[tokens + less + before] = before == 0 ? same : 0;
}

// Sums: one thread per (position p of the order, column c), grid (tokens, ⌈hidden / BLOCK⌉, 2),
// blockIdx.z the table as above. The thread at the first position of a row's run adds that
// run's tokens to the row in order, then rounds the row to the storage dtype, as the CPU does
// (it rounds only the rows a token touched: an untouched row keeps its bits); the others have
// nothing to do. The same additions in the same order as the CPU's loop: the same bits.
// dout is a typed buffer (common.cuh's ld).
template <int T>
__device__ __forceinline__ void embedding_bwd_tables_t(float* dword, float* dtyp, const void* dout,
                                                       const unsigned* ids, const unsigned* types,
                                                       const unsigned* order, int tokens,
                                                       int hidden, int store) {
    int p = blockIdx.x, c = blockIdx.y * blockDim.x + threadIdx.x;
    if (c >= hidden) return;
    const unsigned* ord = order + 2 * (long long)blockIdx.z * tokens;
    int n = ord[tokens + p];
    if (n == 0) return;  // not the first of its row's run
    float* dt = blockIdx.z == 0 ? dword : dtyp;
    const unsigned* key = blockIdx.z == 0 ? ids : types;
    long long at = (long long)key[ord[p]] * hidden + c;
    float acc = dt[at];
    // A run can be every token (the token-type table, all zeros): its rows' loads are issued
    // ROWS_AHEAD at a time (common.cuh), added in token order.
    int q = p, end = p + n;
    for (; q + ROWS_AHEAD <= end; q += ROWS_AHEAD) {
        float v[ROWS_AHEAD];
        UNROLL
        for (int u = 0; u < ROWS_AHEAD; u++) v[u] = ldt<T>(dout, (long long)ord[q + u] * hidden + c);
        UNROLL
        for (int u = 0; u < ROWS_AHEAD; u++) acc += v[u];
    }
    for (; q < end; q++) acc += ldt<T>(dout, (long long)ord[q] * hidden + c);
    dt[at] = st(acc, store);
}
extern "C" __global__ void embedding_bwd_tables(float* dword, float* dtyp, const void* dout,
                                                int dout_t, const unsigned* ids,
                                                const unsigned* types, const unsigned* order,
                                                int tokens, int hidden, int store) {
    BY_TYPE(dout_t, embedding_bwd_tables_t, dword, dtyp, dout, ids, types, order, tokens, hidden,
            store);
}

// Backward into the position table: dpos[p, c] += Σ_b dout[b*seq + p, c], b in order (the tokens
// at position p, in token order). One thread per (p, c) of the first seq rows, 1-D grid of
// BLOCK threads; those are exactly the rows the CPU rounds.
extern "C" __global__ void embedding_bwd_pos(float* dpos, const void* dout, int dout_t,
                                             int batch, int seq, int hidden, int store) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (long long)seq * hidden) return;
    float acc = dpos[i];
    long long stride = (long long)seq * hidden;  // one sequence of dout
    for (int b = 0; b < batch; b++) acc += ld(dout, b * stride + i, dout_t);
    dpos[i] = st(acc, store);
}
