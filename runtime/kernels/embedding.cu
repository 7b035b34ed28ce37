// BERT embeddings, forward and backward. The semantics are the CPU backend's
// (runtime/src/backend/cpu.rs, `embedding_fwd` / `embedding_bwd`):
//
//   out[i, c] = (word[ids[i], c] + typ[types[i], c]) + pos[i % seq, c]   (HF's association)
//
// for the tokens i = b*seq + t of a [batch, seq] id matrix, every row `hidden` wide.
//
// The backward is a scatter-add into the tables. It uses no atomics: each thread owns whole
// columns of a table and adds the tokens' gradients in token order, which is the CPU loop's order,
// so the sums are the same bits as the CPU's and the same on every run.
#include "common.cuh"

// Forward: one thread per element of out (tokens × hidden), 1-D grid of BLOCK threads.
extern "C" __global__ void embedding_fwd(float* out, const unsigned* ids, const unsigned* types,
                                         const float* word, const float* pos, const float* typ,
                                         int tokens, int seq, int hidden, int store) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (long long)tokens * hidden) return;
    int tok = (int)(i / hidden), c = (int)(i % hidden);
    long long w = ids[tok], ty = types[tok], p = tok % seq;
    out[i] = st((word[w * hidden + c] + typ[ty * hidden + c]) + pos[p * hidden + c], store);
}

// Backward into the word table (blockIdx.y == 0, indexed by ids) and the token-type table
// (blockIdx.y == 1, indexed by types): dtable[row(i), c] += dout[i, c] for i = 0, 1, … in order.
// One thread per column c, grid (⌈hidden / BLOCK⌉, 2): a column of a table is only ever touched
// by its own thread, so repeated ids need no atomics and keep the CPU's order.
//
// Then the touched rows are rounded to the storage dtype, as the CPU does (it rounds only those:
// an untouched row keeps its bits). A row hit twice is rounded twice, which changes nothing, and
// only this thread wrote its column, so no barrier is needed between the two loops.
extern "C" __global__ void embedding_bwd_tables(float* dword, float* dtyp, const float* dout,
                                                const unsigned* ids, const unsigned* types,
                                                int tokens, int hidden, int store) {
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= hidden) return;
    float* dt = blockIdx.y == 0 ? dword : dtyp;
    const unsigned* row = blockIdx.y == 0 ? ids : types;
    for (int i = 0; i < tokens; i++)
        dt[(long long)row[i] * hidden + c] += dout[(long long)i * hidden + c];
    if (store != STORE_F32) {
        for (int i = 0; i < tokens; i++) {
            long long at = (long long)row[i] * hidden + c;
            dt[at] = st(dt[at], store);
        }
    }
}

// Backward into the position table: dpos[p, c] += Σ_b dout[b*seq + p, c], b in order (the tokens
// at position p, in token order). One thread per (p, c) of the first seq rows, 1-D grid of
// BLOCK threads; those are exactly the rows the CPU rounds.
extern "C" __global__ void embedding_bwd_pos(float* dpos, const float* dout, int batch, int seq,
                                             int hidden, int store) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (long long)seq * hidden) return;
    float acc = dpos[i];
    long long stride = (long long)seq * hidden;  // one sequence of dout
    for (int b = 0; b < batch; b++) acc += dout[b * stride + i];
    dpos[i] = st(acc, store);
}
