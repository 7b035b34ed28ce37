// Softmax cross-entropy with integer labels. The semantics are the CPU backend's
// (runtime/src/backend/cpu.rs, `cross_entropy`): per row, lse = max + ln Σ exp(x − max),
// loss = lse − x[label], dlogits = grad_scale / rows · (softmax − onehot(label)).
//
// Precision: exp is the f32 expf (the CPU takes exp in double of the same f32 difference x − max),
// so each term is within a few f32 ulps of the CPU's. Everything after it is double: the row sum
// (terms of very different sizes), ln, lse − x[label] (which cancels when the prediction is
// confident: a loss of 1e-4 would keep only ~3 digits in f32), and softmax − 1 at the label
// (which cancels the same way). So dlogits and the loss are within ~1e-6 relative of the CPU's.
#include "common.cuh"

// One block per row (grid rows), whole warps striding over the classes. Writes the row's
// dlogits (rounded to `store`) and its loss to losses[row] (f32, unrounded: the host sums the
// rows in double in row order, divides by rows and rounds, as the CPU does).
extern "C" __global__ void cross_entropy(float* dlogits, float* losses, const float* logits,
                                         const unsigned* labels, int rows, int classes,
                                         float grad_scale, int store) {
    GRID_WAIT();
    __shared__ float redf[32];
    __shared__ double redd[32];
    long long r = blockIdx.x;
    const float* l = logits + r * classes;
    float* d = dlogits + r * classes;
    int y = (int)labels[r];

    float mx = -f32_inf();
    for (int c = threadIdx.x; c < classes; c += blockDim.x) mx = fmaxf(mx, l[c]);
    mx = block_max(mx, redf);

    double s = 0.0;
    for (int c = threadIdx.x; c < classes; c += blockDim.x) s += (double)expf(l[c] - mx);
    double sum = block_sum_d(s, redd);

    // The CPU's scale, grad_scale / rows, in double; one division per row, not per class.
    double g = (double)grad_scale / rows, inv = 1.0 / sum;
    for (int c = threadIdx.x; c < classes; c += blockDim.x) {
        double p = (double)expf(l[c] - mx) * inv;
        d[c] = st((float)((p - (c == y ? 1.0 : 0.0)) * g), store);
    }
    if (threadIdx.x == 0) losses[r] = (float)((double)mx + log(sum) - (double)l[y]);
}
