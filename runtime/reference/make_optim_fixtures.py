#!/usr/bin/env python3
"""Reference updates of SGD, Adagrad and LAMB for `runtime/tests/optim.rs`.

Run from the repository root with the conformance venv (torch 2.15, DeepSpeed 0.19.8):
    conformance/.venv/bin/python runtime/reference/make_optim_fixtures.py
It rewrites runtime/tests/fixtures/optim/<case>.safetensors. No GPU is needed.

What computes each case:
  sgd_*              torch.optim.SGD itself, with two param groups (decay / no decay) as HF's
                     grouping makes them. Both torch code paths run (foreach=False, and
                     foreach=True, which CUDA parameters take by default under DeepSpeed); the
                     script asserts they agree bit for bit on CPU and stores one.
  adagrad_torch_*    torch.optim.Adagrad itself, likewise both paths.
  adagrad_cpu        DeepSpeed's own DeepSpeedCPUAdagrad (the class ZeRO-Offload builds), its C++
                     op JIT-compiled on this machine. That needs a C++ compiler and the `ninja`
                     Python package importable (e.g. `pip install --target <dir> ninja` and
                     PYTHONPATH=<dir> PATH=<dir>/bin:$PATH); without them the case is skipped
                     with a message and the old fixture is kept. The op's SIMD width (16 floats
                     with AVX-512, 8 with AVX2) is recorded as `simd_width`: the last
                     n mod width elements of each tensor go through its scalar loop, which
                     rounds `grad * step_size` before adding it (the vector loop fuses it).
  lamb_*             FusedLamb runs on CUDA only, so this is a transcription, written here in
                     numpy float32, of the kernel in DeepSpeed 0.19.8's
                     csrc/lamb/fused_lamb_cuda_kernel.cu (`fused_lamb_cuda`, parts 1-3) as
                     FusedLamb.step calls it once per tensor: the f32 scalars (bias corrections
                     from std::pow(float, int) in double, rounded to float), the element formulas
                     in the kernel's order, the per-thread strided partial sums and the 512-wide
                     halving trees of both reductions, the trust-ratio special cases (1 when
                     either norm is 0, else clamped to [min_coeff, max_coeff]). What it cannot
                     know is where nvcc contracts a*b + c into an FMA; it uses none. The script
                     checks the transcription against a float64 LAMB written from the paper's
                     formula (relative 1e-5), so a transcription slip shows here.

Inputs are deterministic and shared with the Rust test, so only results are stored: a splitmix64
hash of (case seed, step, tensor, index) gives uniform values u in [-1, 1) with 24-bit mantissas
(exact in float32); initial weights are 0.5*u (one tensor starts at zero), gradients u times a
per-(step, tensor) scale from SCALES, with one tensor's gradient all zero at one step. The learning
rate of step k is LR * (0.5 + 0.5 * (k % 4) / 3).

Layout of a case file: F32 tensors `param.<name>` (weights after the last step) and
`<buffer>.<name>` (the optimizer's state after the last step: momentum_buffer, sum, exp_avg,
exp_avg_sq); tensors longer than VIEW elements are stored as every STRIDE-th element (the Rust
test takes the same view). Metadata `case` (JSON): kind, hyper-parameters, seed, steps, lr list,
tensors [name, numel, decays], and for LAMB `coeffs` (the trust ratio of every tensor at every
step).
"""
import json
import os
import sys

import numpy as np
import torch
from safetensors.numpy import save_file

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "fixtures", "optim")
STEPS = 10
VIEW = 4096
STRIDE = 97
SCALES = [1.0, 0.01, 3.0, 1e-4, 0.5, 250.0, 0.03]
M64 = np.uint64(0xFFFFFFFFFFFFFFFF)

# Tensor sets: (name, numel, decays). Sizes straddle the SIMD widths (8, 16, 64 for
# DeepSpeedCPUAdagrad's AVX tiles) and, for LAMB, the kernel's grid (512 threads, up to 512
# blocks: beyond 262144 elements threads sum several).
SMALL = [("a.weight", 67, True), ("a.bias", 5, False), ("b.weight", 1000, True),
         ("zero.weight", 33, True), ("LayerNorm.weight", 64, False)]
LAMB = SMALL + [("big.weight", 263_171, True)]


def splitmix(x):
    z = (x + np.uint64(0x9E3779B97F4A7C15)) & M64
    z = ((z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)) & M64
    z = ((z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)) & M64
    return z ^ (z >> np.uint64(31))


def uniform(key, n):
    """n float32 values in [-1, 1): 24-bit fractions of splitmix64((key << 32) + i)."""
    i = np.arange(n, dtype=np.uint64)
    h = splitmix((np.uint64(key) << np.uint64(32)) + i)
    u = (h >> np.uint64(40)).astype(np.float64) / float(1 << 24)
    return (2.0 * u - 1.0).astype(np.float32)


def key(seed, step, tensor):
    # step = 0 is the initial weights, k + 1 the gradient of step k.
    return (seed * 7919 + step * 131 + tensor) & 0x7FFFFFFF


def initial(seed, tensors):
    out = []
    for t, (name, n, _) in enumerate(tensors):
        if name.startswith("zero"):
            out.append(np.zeros(n, np.float32))
        else:
            out.append(uniform(key(seed, 0, t), n) * np.float32(0.5))
    return out


def grads(seed, k, tensors):
    out = []
    for t, (_, n, _) in enumerate(tensors):
        if k == 4 and t == 0:
            out.append(np.zeros(n, np.float32))
            continue
        scale = np.float32(SCALES[(k + 2 * t) % len(SCALES)])
        out.append(uniform(key(seed, k + 1, t), n) * scale)
    return out


def lrs(base):
    return [base * (0.5 + 0.5 * (k % 4) / 3) for k in range(STEPS)]


def view(x):
    """The stored part of a tensor, contiguous (safetensors writes a strided view's raw buffer)."""
    x = np.asarray(x, np.float32)
    return np.ascontiguousarray(x if x.size <= VIEW else x[::STRIDE])


def groups(params, tensors, wd):
    decay = [p for p, (_, _, d) in zip(params, tensors) if d]
    rest = [p for p, (_, _, d) in zip(params, tensors) if not d]
    return [{"params": decay, "weight_decay": wd}, {"params": rest, "weight_decay": 0.0}]


def run_torch(make, seed, tensors, wd, base_lr, **kw):
    """Drives a torch optimizer class over the tensors; returns weights and state per tensor."""
    params = [torch.nn.Parameter(torch.from_numpy(p.copy())) for p in initial(seed, tensors)]
    opt = make(groups(params, tensors, wd), lr=base_lr, **kw)
    for k, lr in enumerate(lrs(base_lr)):
        for g in opt.param_groups:
            g["lr"] = lr
        for p, g in zip(params, grads(seed, k, tensors)):
            p.grad = torch.from_numpy(g.copy())
        opt.step()
    weights = [p.detach().numpy().copy() for p in params]
    state = [{k: v.numpy().copy() for k, v in opt.state[p].items()
              if torch.is_tensor(v) and v.numel() == p.numel()} for p in params]
    return weights, state


def both_paths(make, seed, tensors, wd, base_lr, **kw):
    a = run_torch(make, seed, tensors, wd, base_lr, foreach=False, **kw)
    b = run_torch(make, seed, tensors, wd, base_lr, foreach=True, **kw)
    for (wa, wb) in zip(a[0], b[0]):
        assert np.array_equal(wa.view(np.uint32), wb.view(np.uint32)), "foreach and for-loop differ"
    return a


# ---- LAMB: the FusedLamb kernel, transcribed ---------------------------------------------------

THREADS = 512


def tree(s):
    """reduce_block_in_shared_memory for a 512-wide block: s[t] += s[t + h], h = 256 .. 1."""
    s = s.copy()
    h = s.shape[-1] // 2
    while h >= 1:
        s[..., :h] = s[..., :h] + s[..., h:2 * h]
        h //= 2
    return s[..., 0]


def kernel_sum_sq(x):
    """Part 1's per-thread sums (thread t adds x[t]^2, x[t+T]^2, ... in order), the blocks'
    trees, and part 2's tree over the block sums (512 slots, unused ones 0)."""
    n = x.size
    if n == 0:
        return np.float32(0.0)
    blocks = min((n + THREADS - 1) // THREADS, THREADS)
    threads = blocks * THREADS
    partial = np.zeros(threads, np.float32)
    sq = (x * x).astype(np.float32)
    for start in range(0, n, threads):
        chunk = sq[start:start + threads]
        partial[:chunk.size] = partial[:chunk.size] + chunk
    sums = np.zeros(THREADS, np.float32)
    sums[:blocks] = tree(partial.reshape(blocks, THREADS))
    return np.float32(tree(sums))


def lamb_tensor(p, m, v, g, lr, beta1, beta2, max_coeff, min_coeff, eps, grad_scale, step,
                bias_correction, decay):
    f = np.float32
    b1, b2, lr32, eps32, decay32, scale32 = f(beta1), f(beta2), f(lr), f(eps), f(decay), f(grad_scale)
    if bias_correction:
        bc1 = f(1.0 - float(b1) ** step)  # std::pow(float, int) is computed in double
        bc2 = f(1.0 - float(b2) ** step)
        step_size = f(f(lr32 * np.sqrt(bc2, dtype=np.float32)) / bc1)
    else:
        step_size = lr32
    s = (g / scale32).astype(f)
    m[:] = b1 * m + (f(1) - b1) * s
    v[:] = b2 * v + ((f(1) - b2) * s) * s
    update = (m / (np.sqrt(v) + eps32) + decay32 * p).astype(f)
    w = np.sqrt(kernel_sum_sq(p), dtype=f)
    u = np.sqrt(kernel_sum_sq(update), dtype=f)
    coeff = f(1.0)
    if w != 0 and u != 0:
        coeff = f(w / u)
        if coeff > f(max_coeff):
            coeff = f(max_coeff)
        if coeff < f(min_coeff):
            coeff = f(min_coeff)
    p[:] = p - f(step_size * coeff) * update
    return coeff


def lamb_f64(p, m, v, g, lr, beta1, beta2, max_coeff, min_coeff, eps, step, bias_correction, decay):
    """LAMB from the paper's formula in float64 (the transcription's sanity check)."""
    m[:] = beta1 * m + (1 - beta1) * g
    v[:] = beta2 * v + (1 - beta2) * g * g
    size = lr * np.sqrt(1 - beta2 ** step) / (1 - beta1 ** step) if bias_correction else lr
    u = m / (np.sqrt(v) + eps) + decay * p
    wn, un = np.linalg.norm(p), np.linalg.norm(u)
    r = 1.0 if wn == 0 or un == 0 else min(max(wn / un, min_coeff), max_coeff)
    p[:] = p - size * r * u


def run_lamb(seed, tensors, c):
    params = initial(seed, tensors)
    ms = [np.zeros_like(p) for p in params]
    vs = [np.zeros_like(p) for p in params]
    ref = [p.astype(np.float64) for p in params]
    rm = [np.zeros_like(p) for p in ref]
    rv = [np.zeros_like(p) for p in ref]
    coeffs = []
    for k, lr in enumerate(lrs(c["lr"])):
        row = []
        for t, (p, m, v, g) in enumerate(zip(params, ms, vs, grads(seed, k, tensors))):
            decay = c["weight_decay"] if tensors[t][2] else 0.0
            scaled = (g * np.float32(c["grad_scale"])).astype(np.float32)
            row.append(float(lamb_tensor(p, m, v, scaled, lr, c["betas"][0], c["betas"][1],
                                         c["max_coeff"], c["min_coeff"], c["eps"],
                                         c["grad_scale"], k + 1, c["bias_correction"], decay)))
            lamb_f64(ref[t], rm[t], rv[t], g.astype(np.float64), lr, c["betas"][0], c["betas"][1],
                     c["max_coeff"], c["min_coeff"], c["eps"], k + 1, c["bias_correction"], decay)
        coeffs.append(row)
    for t, (p, r) in enumerate(zip(params, ref)):
        err = np.linalg.norm(p - r) / max(np.linalg.norm(r), 1e-30)
        assert err < 1e-5, f"LAMB transcription vs float64 LAMB, tensor {t}: {err:e}"
    state = [{"exp_avg": m, "exp_avg_sq": v} for m, v in zip(ms, vs)]
    return params, state, coeffs


# ---- cases -------------------------------------------------------------------------------------

def cpu_adagrad():
    try:
        from deepspeed.ops.adagrad import DeepSpeedCPUAdagrad
        probe = torch.nn.Parameter(torch.zeros(1))
        DeepSpeedCPUAdagrad([probe])
        return DeepSpeedCPUAdagrad
    except Exception as e:  # the op needs ninja and a compiler
        print(f"adagrad_cpu skipped: DeepSpeedCPUAdagrad cannot be built here ({e})", file=sys.stderr)
        return None


SEEDS = {"sgd_plain": 1, "sgd_momentum": 2, "sgd_nesterov": 3, "adagrad_torch": 4,
         "adagrad_torch_decay": 5, "adagrad_cpu": 6, "lamb": 7, "lamb_clamped": 8,
         "lamb_fp16_scale": 9}


def cases():
    s = []
    for name, mom, nest, wd in [("sgd_plain", 0.0, False, 0.0),
                                ("sgd_momentum", 0.9, False, 0.01),
                                ("sgd_nesterov", 0.9, True, 0.05)]:
        c = {"kind": "sgd", "lr": 0.05, "momentum": mom, "nesterov": nest, "weight_decay": wd}
        s.append((name, c, lambda seed, c=c: both_paths(
            torch.optim.SGD, seed, SMALL, c["weight_decay"], c["lr"], momentum=c["momentum"],
            nesterov=c["nesterov"])))
    c = {"kind": "adagrad", "impl": "torch", "lr": 0.02, "eps": 1e-8, "weight_decay": 0.01,
         "lr_decay": 0.0, "initial_accumulator_value": 0.0}
    s.append(("adagrad_torch", c, lambda seed, c=c: both_paths(
        torch.optim.Adagrad, seed, SMALL, c["weight_decay"], c["lr"], eps=c["eps"])))
    c = {"kind": "adagrad", "impl": "torch", "lr": 0.02, "eps": 1e-10, "weight_decay": 0.0,
         "lr_decay": 0.05, "initial_accumulator_value": 0.1}
    s.append(("adagrad_torch_decay", c, lambda seed, c=c: both_paths(
        torch.optim.Adagrad, seed, SMALL, c["weight_decay"], c["lr"], eps=c["eps"],
        lr_decay=c["lr_decay"], initial_accumulator_value=c["initial_accumulator_value"])))
    cls = cpu_adagrad()
    if cls is not None:
        c = {"kind": "adagrad", "impl": "deepspeed_cpu", "lr": 0.02, "eps": 1e-8,
             "weight_decay": 0.01, "lr_decay": 0.0, "initial_accumulator_value": 0.0}

        from deepspeed.ops.op_builder import CPUAdagradBuilder
        flag = CPUAdagradBuilder().simd_width()
        c["simd_width"] = {"-D__AVX512__": 16, "-D__AVX256__": 8}.get(flag, 1)

        def run(seed, c=c):
            w, st = run_torch(cls, seed, SMALL, c["weight_decay"], c["lr"], eps=c["eps"])
            # DeepSpeedCPUAdagrad names the accumulator exp_avg_sq; the runtime, like torch, sum.
            return w, [{"sum": d["exp_avg_sq"]} for d in st]
        s.append(("adagrad_cpu", c, run))
    base = {"kind": "lamb", "lr": 0.01, "betas": [0.9, 0.999], "eps": 1e-8, "weight_decay": 0.01,
            "bias_correction": True, "max_coeff": 10.0, "min_coeff": 0.01, "grad_scale": 1.0}
    s.append(("lamb", base, None))
    s.append(("lamb_clamped", dict(base, bias_correction=False, weight_decay=0.0, max_coeff=2.0,
                                   min_coeff=0.5, betas=[0.8, 0.99], eps=1e-6), None))
    s.append(("lamb_fp16_scale", dict(base, grad_scale=1536.75), None))
    return s


def main():
    os.makedirs(OUT, exist_ok=True)
    torch.set_num_threads(1)
    for name, c, run in cases():
        seed = SEEDS[name]
        c = dict(c, seed=seed, steps=STEPS, lrs=lrs(c["lr"]))
        if c["kind"] == "lamb":
            tensors = LAMB
            weights, state, coeffs = run_lamb(seed, tensors, c)
            c["coeffs"] = coeffs
        else:
            tensors = SMALL
            weights, state = run(seed)
        c["tensors"] = [[n, size, d] for n, size, d in tensors]
        out = {}
        for (tname, _, _), w, st in zip(tensors, weights, state):
            out[f"param.{tname}"] = view(w)
            for b, x in st.items():
                out[f"{b}.{tname}"] = view(x)
        path = os.path.join(OUT, f"{name}.safetensors")
        save_file(out, path, metadata={"case": json.dumps(c)})
        os.chmod(path, 0o644)
        print(f"wrote {path}: {len(out)} tensors")


if __name__ == "__main__":
    main()
