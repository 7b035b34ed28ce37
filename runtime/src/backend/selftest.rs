//! Every [`Backend`] operation of one backend against the CPU reference, op by op, on odd shapes:
//! what `recipe kernels --selftest` runs on a GPU (scripts/gpu-check.sh), and what the emulation
//! tests run on the emulated device, so the check itself is tested where there is no GPU.
//!
//! Errors are measured relative to the largest reference value of each output (a kernel's float
//! differences scale with its magnitudes), against a tolerance per storage dtype: fp32 allows the
//! GPU's fused multiply-adds and another summation order (1e-5), fp16 and bf16 one rounding of
//! their own (2⁻¹⁰, 2⁻⁷) on top.
//!
//! [`compare_optim`] does the same for the device optimizer (`runtime/kernels/optim.cu`), which is
//! no [`Backend`] operation: the gradient norm and the Adam / AdamW step against the host
//! optimizer (`runtime/src/optim`), with tolerances of their own (see there).

use serde::Serialize;

use super::device::Device;
use super::kernels::{adamw_step, grad_norm_sq, grad_norm_sq_blocks, DecayMask, Kernels};
use super::{AttnShape, Backend, Cpu, Dropout, Gemm};
use crate::optim::{self, Adam, AdamConfig, GradScale, Optimizer, WeightDecay};
use crate::params::Entry;
use crate::precision::{self, Dtype};
use crate::rng::Rng;
use crate::zero::HostOptimizer;

/// One operation's comparison.
#[derive(Debug, Clone, Serialize)]
pub struct OpCheck {
    /// The operation and output, e.g. `attention_bwd.dq`.
    pub op: String,
    /// The storage dtype.
    pub store: Dtype,
    /// Largest `|got − want|` over the output, divided by the output's largest `|want|`.
    pub error: f64,
    /// The bound `error` must stay within.
    pub tolerance: f64,
    /// Whether the output is finite where the reference is, and within the tolerance.
    pub ok: bool,
}

fn tolerance(store: Dtype) -> f64 {
    match store {
        Dtype::F32 => 1e-5,
        Dtype::F16 => 1e-5 + 2f64.powi(-10),
        Dtype::Bf16 => 1e-5 + 2f64.powi(-7),
    }
}

fn rand(n: usize, scale: f32, stream: u64, store: Dtype) -> Vec<f32> {
    let mut r = Rng::new(0x5e1f, stream);
    let mut v: Vec<f32> = (0..n)
        .map(|_| ((r.uniform() * 2.0 - 1.0) as f32) * scale)
        .collect();
    store.round_slice(&mut v);
    v
}

fn ids(n: usize, bound: u64, stream: u64) -> Vec<u32> {
    let mut r = Rng::new(0x1d, stream);
    (0..n).map(|_| r.below(bound) as u32).collect()
}

struct Checker<'a, B: Backend> {
    be: &'a B,
    cpu: Cpu,
    store: Dtype,
    out: Vec<OpCheck>,
}

impl<B: Backend> Checker<'_, B> {
    fn compare(&mut self, op: &str, got: &[f32], want: &[f32]) {
        let scale = want.iter().fold(0.0f64, |m, &x| m.max(f64::from(x.abs())));
        let mut finite_agree = true;
        let mut worst = 0.0f64;
        for (&g, &w) in got.iter().zip(want) {
            if g.is_finite() != w.is_finite() {
                finite_agree = false;
            } else if w.is_finite() {
                worst = worst.max(f64::from((g - w).abs()));
            }
        }
        let error = if scale > 0.0 { worst / scale } else { worst };
        let tol = tolerance(self.store);
        self.out.push(OpCheck {
            op: op.to_string(),
            store: self.store,
            error,
            tolerance: tol,
            ok: finite_agree && got.len() == want.len() && error <= tol,
        });
    }

    /// [`Checker::compare`] for each `(name, backend buffer, reference)`.
    fn compare_bufs(&mut self, outputs: &[(&str, &B::Buf, &Vec<f32>)]) {
        for (name, buf, want) in outputs {
            let mut got = vec![0.0; want.len()];
            self.be.download(self.be.view(buf), &mut got);
            self.compare(name, &got, want);
        }
    }

    /// Uploads `host`, runs `f` on the backend's buffer and downloads it.
    fn on_backend(&self, host: &[f32], f: impl FnOnce(&B, &mut B::Buf)) -> Vec<f32> {
        let mut buf = self.be.upload(host);
        f(self.be, &mut buf);
        let mut out = vec![0.0; host.len()];
        self.be.download(self.be.view(&buf), &mut out);
        out
    }

    fn elementwise(&mut self) {
        let st = self.store;
        let n = 1000;
        let x = rand(n, 4.0, 1, st);
        let dy = rand(n, 1.0, 2, st);
        let (be, cpu) = (self.be, self.cpu);
        let xb = be.upload(&x);
        let dyb = be.upload(&dy);
        type Un<B> = fn(&B, <B as Backend>::ViewMut<'_>, <B as Backend>::View<'_>);
        let unary: [(&str, Un<B>, Un<Cpu>); 2] = [
            (
                "gelu_fwd",
                |b, o, i| b.gelu_fwd(o, i),
                |b, o, i| b.gelu_fwd(o, i),
            ),
            (
                "tanh_fwd",
                |b, o, i| b.tanh_fwd(o, i),
                |b, o, i| b.tanh_fwd(o, i),
            ),
        ];
        for (name, fb, fc) in unary {
            let got = self.on_backend(&vec![0.0; n], |b, o| fb(b, b.view_mut(o), b.view(&xb)));
            let mut want = vec![0.0; n];
            fc(&cpu, &mut want, &x);
            self.compare(name, &got, &want);
        }
        let got = self.on_backend(&vec![0.0; n], |b, o| {
            b.gelu_bwd(b.view_mut(o), b.view(&xb), b.view(&dyb))
        });
        let mut want = vec![0.0; n];
        cpu.gelu_bwd(&mut want, &x, &dy);
        self.compare("gelu_bwd", &got, &want);
        let got = self.on_backend(&vec![0.0; n], |b, o| {
            b.tanh_bwd(b.view_mut(o), b.view(&xb), b.view(&dyb))
        });
        let mut want = vec![0.0; n];
        cpu.tanh_bwd(&mut want, &x, &dy);
        self.compare("tanh_bwd", &got, &want);
        let got = self.on_backend(&x, |b, o| b.add_assign(b.view_mut(o), b.view(&dyb)));
        let mut want = x.clone();
        cpu.add_assign(&mut want, &dy);
        self.compare("add_assign", &got, &want);
        let d = Dropout {
            p: 0.3,
            seed: 77,
            stream: 5,
        };
        let got = self.on_backend(&x, |b, o| b.dropout(b.view_mut(o), &d));
        let mut want = x.clone();
        cpu.dropout(&mut want, &d);
        self.compare("dropout", &got, &want);
        let (rows, cols) = (37, 27);
        let bias = rand(cols, 1.0, 3, st);
        let bb = be.upload(&bias);
        let m = rand(rows * cols, 2.0, 4, st);
        let mb = be.upload(&m);
        let got = self.on_backend(&m, |b, o| {
            b.add_bias(b.view_mut(o), b.view(&bb), rows, cols)
        });
        let mut want = m.clone();
        cpu.add_bias(&mut want, &bias, rows, cols);
        self.compare("add_bias", &got, &want);
        let got = self.on_backend(&bias, |b, o| {
            b.bias_grad(b.view_mut(o), b.view(&mb), rows, cols)
        });
        let mut want = bias.clone();
        cpu.bias_grad(&mut want, &m, rows, cols);
        self.compare("bias_grad", &got, &want);
    }

    fn gemm(&mut self) {
        let st = self.store;
        let be = self.be;
        let (m, n, k) = (37, 29, 70);
        for (ta, tb) in [(false, false), (true, false), (false, true), (true, true)] {
            for beta in [0.0f32, 1.0] {
                let mut g = Gemm::dense(m, n, k, ta, tb, beta);
                g.ldc = n + 3;
                let a = rand(m * k, 1.0, 10, st);
                let b = rand(k * n, 1.0, 11, st);
                let c0 = rand(m * g.ldc, 1.0, 12, st);
                let (ab, bb) = (be.upload(&a), be.upload(&b));
                let got = self.on_backend(&c0, |x, c| {
                    x.gemm(&g, x.view(&ab), x.view(&bb), x.view_mut(c))
                });
                let mut want = c0.clone();
                self.cpu.gemm(&g, &a, &b, &mut want);
                let name = format!(
                    "gemm.{}{}{}",
                    if ta { "T" } else { "N" },
                    if tb { "T" } else { "N" },
                    if beta == 0.0 { "" } else { "+C" }
                );
                self.compare(&name, &got, &want);
            }
        }
    }

    fn embedding_and_layernorm(&mut self) {
        let st = self.store;
        let (be, cpu) = (self.be, self.cpu);
        let (batch, seq, hidden, vocab) = (3, 17, 33, 50);
        let n = batch * seq;
        let word = rand(vocab * hidden, 1.0, 20, st);
        let pos = rand(seq * hidden, 1.0, 21, st);
        let typ = rand(2 * hidden, 1.0, 22, st);
        let tok = ids(n, vocab as u64, 23);
        let types = ids(n, 2, 24);
        let (wb, pb, tb) = (be.upload(&word), be.upload(&pos), be.upload(&typ));
        let (ib, yb) = (be.upload_ids(&tok), be.upload_ids(&types));
        let got = self.on_backend(&vec![0.0; n * hidden], |b, o| {
            b.embedding_fwd(
                b.view_mut(o),
                &ib,
                &yb,
                b.view(&wb),
                b.view(&pb),
                b.view(&tb),
                batch,
                seq,
                hidden,
            )
        });
        let mut want = vec![0.0; n * hidden];
        cpu.embedding_fwd(
            &mut want,
            &tok.to_vec(),
            &types.to_vec(),
            &word,
            &pos,
            &typ,
            batch,
            seq,
            hidden,
        );
        self.compare("embedding_fwd", &got, &want);

        let dout = rand(n * hidden, 1.0, 25, st);
        let db = be.upload(&dout);
        let (mut gw, mut gp, mut gt) = (be.upload(&word), be.upload(&pos), be.upload(&typ));
        be.embedding_bwd(
            be.view_mut(&mut gw),
            be.view_mut(&mut gp),
            be.view_mut(&mut gt),
            be.view(&db),
            &ib,
            &yb,
            batch,
            seq,
            hidden,
        );
        let (mut ww, mut wp, mut wt) = (word.clone(), pos.clone(), typ.clone());
        cpu.embedding_bwd(
            &mut ww, &mut wp, &mut wt, &dout, &tok, &types, batch, seq, hidden,
        );
        self.compare_bufs(&[
            ("embedding_bwd.word", &gw, &ww),
            ("embedding_bwd.pos", &gp, &wp),
            ("embedding_bwd.type", &gt, &wt),
        ]);

        let (rows, cols) = (n, hidden);
        let x = rand(rows * cols, 3.0, 26, st);
        let w = rand(cols, 1.0, 27, st);
        let b = rand(cols, 1.0, 28, st);
        let (xb, wb2, bb) = (be.upload(&x), be.upload(&w), be.upload(&b));
        let (mut out, mut mean, mut rstd) = (be.alloc(rows * cols), be.alloc(rows), be.alloc(rows));
        be.layernorm_fwd(
            be.view_mut(&mut out),
            be.view_mut(&mut mean),
            be.view_mut(&mut rstd),
            be.view(&xb),
            be.view(&wb2),
            be.view(&bb),
            rows,
            cols,
            1e-12,
        );
        let (mut wo, mut wm, mut wr) = (vec![0.0; rows * cols], vec![0.0; rows], vec![0.0; rows]);
        cpu.layernorm_fwd(&mut wo, &mut wm, &mut wr, &x, &w, &b, rows, cols, 1e-12);
        self.compare_bufs(&[
            ("layernorm_fwd.out", &out, &wo),
            ("layernorm_fwd.mean", &mean, &wm),
            ("layernorm_fwd.rstd", &rstd, &wr),
        ]);
        // The backward from the CPU's saved statistics, so only the backward is compared.
        let (mb, rb) = (be.upload(&wm), be.upload(&wr));
        let (mut di, mut dw, mut dbb) = (be.alloc(rows * cols), be.upload(&w), be.upload(&b));
        let dout2 = rand(rows * cols, 1.0, 29, st);
        let d2 = be.upload(&dout2);
        be.layernorm_bwd(
            be.view_mut(&mut di),
            be.view_mut(&mut dw),
            be.view_mut(&mut dbb),
            be.view(&d2),
            be.view(&xb),
            be.view(&wb2),
            be.view(&mb),
            be.view(&rb),
            rows,
            cols,
        );
        let (mut wdi, mut wdw, mut wdb) = (vec![0.0; rows * cols], w.clone(), b.clone());
        cpu.layernorm_bwd(
            &mut wdi, &mut wdw, &mut wdb, &dout2, &x, &w, &wm, &wr, rows, cols,
        );
        self.compare_bufs(&[
            ("layernorm_bwd.dinp", &di, &wdi),
            ("layernorm_bwd.dw", &dw, &wdw),
            ("layernorm_bwd.db", &dbb, &wdb),
        ]);
    }

    fn attention(&mut self) {
        let st = self.store;
        let (be, cpu) = (self.be, self.cpu);
        let s = AttnShape {
            batch: 2,
            seq: 33,
            heads: 3,
            head_dim: 16,
        };
        let tok = s.batch * s.seq * s.heads * s.head_dim;
        let pp = s.batch * s.heads * s.seq * s.seq;
        let (q, k, v) = (
            rand(tok, 1.0, 30, st),
            rand(tok, 1.0, 31, st),
            rand(tok, 1.0, 32, st),
        );
        // The second sequence is padded after 20 tokens.
        let mask: Vec<u32> = (0..s.batch * s.seq)
            .map(|i| u32::from(i < s.seq || i % s.seq < 20))
            .collect();
        let d = Dropout {
            p: 0.1,
            seed: 9,
            stream: 3,
        };
        let (qb, kb, vb) = (be.upload(&q), be.upload(&k), be.upload(&v));
        let mb = be.upload_ids(&mask);
        let (mut ctx, mut probs, mut pd) = (be.alloc(tok), be.alloc(pp), be.alloc(pp));
        be.attention_fwd(
            be.view_mut(&mut ctx),
            be.view_mut(&mut probs),
            Some(be.view_mut(&mut pd)),
            be.view(&qb),
            be.view(&kb),
            be.view(&vb),
            &mb,
            s,
            Some(&d),
        );
        let (mut wc, mut wp, mut wpd) = (vec![0.0; tok], vec![0.0; pp], vec![0.0; pp]);
        cpu.attention_fwd(
            &mut wc,
            &mut wp,
            Some(&mut wpd),
            &q,
            &k,
            &v,
            &mask,
            s,
            Some(&d),
        );
        self.compare_bufs(&[
            ("attention_fwd.ctx", &ctx, &wc),
            ("attention_fwd.probs", &probs, &wp),
            ("attention_fwd.probs_drop", &pd, &wpd),
        ]);
        // The backward from the CPU's forward, so only the backward is compared.
        let (pb, pdb) = (be.upload(&wp), be.upload(&wpd));
        let dctx = rand(tok, 1.0, 33, st);
        let dcb = be.upload(&dctx);
        let (mut dq, mut dk, mut dv, mut scratch) =
            (be.alloc(tok), be.alloc(tok), be.alloc(tok), be.alloc(pp));
        be.attention_bwd(
            be.view_mut(&mut dq),
            be.view_mut(&mut dk),
            be.view_mut(&mut dv),
            be.view_mut(&mut scratch),
            be.view(&dcb),
            be.view(&qb),
            be.view(&kb),
            be.view(&vb),
            be.view(&pb),
            Some(be.view(&pdb)),
            s,
            Some(&d),
        );
        let (mut wq, mut wk, mut wv, mut ws) = (
            vec![0.0; tok],
            vec![0.0; tok],
            vec![0.0; tok],
            vec![0.0; pp],
        );
        cpu.attention_bwd(
            &mut wq,
            &mut wk,
            &mut wv,
            &mut ws,
            &dctx,
            &q,
            &k,
            &v,
            &wp,
            Some(&wpd),
            s,
            Some(&d),
        );
        self.compare_bufs(&[
            ("attention_bwd.dq", &dq, &wq),
            ("attention_bwd.dk", &dk, &wk),
            ("attention_bwd.dv", &dv, &wv),
        ]);
    }

    fn cross_entropy(&mut self) {
        let st = self.store;
        let (be, cpu) = (self.be, self.cpu);
        let (rows, classes) = (37, 5);
        let logits = rand(rows * classes, 4.0, 40, st);
        let labels = ids(rows, classes as u64, 41);
        let (lb, yb) = (be.upload(&logits), be.upload_ids(&labels));
        let mut dl = be.alloc(rows * classes);
        let loss = be.cross_entropy(be.view_mut(&mut dl), be.view(&lb), &yb, rows, classes, 0.5);
        let mut got = vec![0.0; rows * classes];
        be.download(be.view(&dl), &mut got);
        let mut want = vec![0.0; rows * classes];
        let wl = cpu.cross_entropy(&mut want, &logits, &labels, rows, classes, 0.5);
        self.compare("cross_entropy.dlogits", &got, &want);
        self.compare("cross_entropy.loss", &[loss], &[wl]);
    }
}

/// Runs every operation on `be` (which stores `store`) and on the CPU backend storing the same,
/// and compares each output.
pub fn compare<B: Backend>(be: &B, store: Dtype) -> Vec<OpCheck> {
    let mut c = Checker {
        be,
        cpu: Cpu::new(1).with_store(store),
        store,
        out: Vec::new(),
    };
    c.elementwise();
    c.gemm();
    c.embedding_and_layernorm();
    c.attention();
    c.cross_entropy();
    c.out
}

// ---- The device optimizer.

/// Relative bound on `Σ g²` summed in another order than the host's: both orders are within
/// `(n − 1) · 2⁻⁵³` of the exact sum of `n` terms, so `n · 2⁻⁵²` apart (2.2e-13 at the size
/// checked here); 1e-12 leaves room and still fails on a single lost or doubled term.
pub const NORM_SQ_TOLERANCE: f64 = 1e-12;

/// Relative bound on the f32 norm `√Σg²`: one f32 ulp, where `Σ g²` sits within the bound above
/// of a rounding boundary of its square root (the same bits otherwise).
pub const NORM_TOLERANCE: f64 = f32::EPSILON as f64;

/// Elements of the optimizer checks: off every multiple of 32 and 256.
const OPTIM_N: usize = 1000;

/// `n` elements as four tensors named so that HF's no-decay rule decays only the two weights (a
/// sub-range: `[0, n/2)` and the last tensor), as runtime/emu/tests/optim.rs lays them out.
fn optim_layout(n: usize) -> (Vec<Entry>, Vec<bool>) {
    let a = n / 2;
    let b = (n / 8).max(1);
    let c = (n - a - b) / 2;
    let d = n - a - b - c;
    let mut entries = Vec::new();
    let mut at = 0;
    for (name, len) in [
        ("l0.dense.weight", a),
        ("l0.dense.bias", b),
        ("l0.LayerNorm.weight", c),
        ("l1.dense.weight", d),
    ] {
        entries.push(Entry {
            name: name.into(),
            shape: vec![len],
            offset: at,
        });
        at += len;
    }
    let decay = entries
        .iter()
        .map(|e| !optim::hf_no_decay(&e.name))
        .collect();
    (entries, decay)
}

/// The gradient of step `k`: random (rounded to `store`), with some exact zeros.
fn optim_grads(n: usize, k: usize, store: Dtype) -> Vec<f32> {
    let mut g = rand(n, 0.5 + k as f32, 60 + k as u64, Dtype::F32);
    for x in g.iter_mut().skip(3).step_by(7) {
        *x = 0.0;
    }
    store.round_slice(&mut g);
    g
}

/// One comparison of a buffer: the error as [`compare`]'s (largest difference over the largest
/// reference value); a tolerance of 0 asks for the same bits, element by element.
fn buffer_check(op: &str, store: Dtype, got: &[f32], want: &[f32], tol: f64) -> OpCheck {
    let scale = want.iter().fold(0.0f64, |m, &x| m.max(f64::from(x.abs())));
    let (mut worst, mut finite_agree, mut same_bits) = (0.0f64, true, true);
    for (&g, &w) in got.iter().zip(want) {
        same_bits &= g.to_bits() == w.to_bits();
        if g.is_finite() != w.is_finite() {
            finite_agree = false;
        } else if w.is_finite() {
            worst = worst.max(f64::from((g - w).abs()));
        }
    }
    let error = if scale > 0.0 { worst / scale } else { worst };
    let ok = finite_agree && got.len() == want.len() && error <= tol && (tol > 0.0 || same_bits);
    OpCheck {
        op: op.to_string(),
        store,
        error: if ok || error > 0.0 {
            error
        } else {
            f64::INFINITY
        },
        tolerance: tol,
        ok,
    }
}

/// One comparison of a scalar, relative to `|want|`; a tolerance of 0 asks for the same bits.
fn scalar_check(op: &str, store: Dtype, got: f64, want: f64, tol: f64) -> OpCheck {
    let diff = (got - want).abs();
    let error = if want != 0.0 { diff / want.abs() } else { diff };
    // (The device's empty sum is +0.0 where Rust's is −0.0: equal values.)
    let ok = error <= tol && (tol > 0.0 || got.to_bits() == (want + 0.0).to_bits());
    OpCheck {
        op: op.to_string(),
        store,
        error: if ok || error > 0.0 {
            error
        } else {
            f64::INFINITY
        },
        tolerance: tol,
        ok,
    }
}

/// Checks of the same op over several steps as one row: the worst error, ok when every step is.
fn merge(checks: Vec<OpCheck>) -> Vec<OpCheck> {
    let mut out: Vec<OpCheck> = Vec::new();
    for c in checks {
        match out.iter_mut().find(|o| o.op == c.op) {
            Some(o) => {
                o.error = o.error.max(c.error);
                o.ok &= c.ok;
            }
            None => out.push(c),
        }
    }
    out
}

/// The device optimizer (`runtime/kernels/optim.cu` through `kernels/optim.rs`) against the host
/// optimizer, on [`OPTIM_N`] elements: what `recipe kernels --selftest` adds to [`compare`].
/// `store` must be the kernels' storage dtype (what [`Kernels::with_store`] set): it decides the
/// rounding of the half working copy, checked when it is fp16 or bf16.
///
/// - `optim.grad_norm_sq` (and `.strided`: three first-pass blocks, so each thread loops over
///   several elements): `Σ g²` of values spread over 40 binades against
///   [`optim::sum_squares`], within [`NORM_SQ_TOLERANCE`] relative (another summation order;
///   FMA contraction changes nothing: each `g²` is exact in f64). `optim.grad_norm`: its f32
///   square root, within [`NORM_TOLERANCE`]. `optim.grad_norm_sq.exact`: values whose every
///   partial sum is exact, so the **same bits** in any order. `optim.grad_norm_sq.nonfinite`: an
///   inf (and a NaN) gradient gives an inf (a NaN) sum, the overflow check.
/// - `optim.adamw.*` (decoupled decay on a sub-range, each step's gradient clipped by the host's
///   `clip_grad_norm` coefficient, < 1) and `optim.adam_l2.*` (L2 decay, other betas and eps, a
///   multiplier < 1): two steps each, parameters and both moments after every step, against
///   [`Optimizer::step_scaled`] — the **same bits** (tolerance 0): the kernel's arithmetic is
///   adam.rs's operation for operation, with `__f*_rn` intrinsics on a GPU so NVRTC cannot fuse
///   them, and IEEE f32 operations round the same everywhere.
/// - `optim.mixed.*` (half stores only): the mixed-precision step as `HostOptimizer` takes it —
///   gradients at a loss scale, `f32(1 / combined scale)` as the multiplier, fp32 master weights
///   and the half working copy rounded from them — the same bits too.
pub fn compare_optim<D: Device>(k: &Kernels<D>, store: Dtype) -> Vec<OpCheck> {
    compare_optim_against(k, store, 1.0)
}

/// [`compare_optim`] with the host's Adam steps taken at `host_lr_factor` times the device's
/// learning rate: 1 is the self-test; anything else must fail it (how the tests show that the
/// check can fail).
#[doc(hidden)]
pub fn compare_optim_against<D: Device>(
    k: &Kernels<D>,
    store: Dtype,
    host_lr_factor: f64,
) -> Vec<OpCheck> {
    let mut out = norm_checks(k, store);
    out.extend(adam_checks(k, store, host_lr_factor));
    if store.is_half() {
        out.extend(mixed_checks(k, store, host_lr_factor));
    }
    out
}

fn norm_checks<D: Device>(k: &Kernels<D>, store: Dtype) -> Vec<OpCheck> {
    let dev = k.device();
    let n = OPTIM_N;
    let sq = |g: &[f32], cap: Option<usize>| {
        let b = dev.upload(g);
        match cap {
            Some(c) => grad_norm_sq_blocks(k, dev.view(&b), c),
            None => grad_norm_sq(k, dev.view(&b)),
        }
    };
    let mut out = Vec::new();
    let spread: Vec<f32> = rand(n, 1.0, 50, Dtype::F32)
        .iter()
        .zip(rand(n, 1.0, 51, Dtype::F32))
        .map(|(x, e)| x * 2f32.powi((e * 20.0) as i32))
        .collect();
    let want = optim::sum_squares(&spread);
    let got = sq(&spread, None);
    out.push(scalar_check(
        "optim.grad_norm_sq",
        store,
        got,
        want,
        NORM_SQ_TOLERANCE,
    ));
    out.push(scalar_check(
        "optim.grad_norm",
        store,
        f64::from(got.sqrt() as f32),
        f64::from(want.sqrt() as f32),
        NORM_TOLERANCE,
    ));
    out.push(scalar_check(
        "optim.grad_norm_sq.strided",
        store,
        sq(&spread, Some(3)),
        want,
        NORM_SQ_TOLERANCE,
    ));
    // Multiples of 2⁻¹⁰ up to 2 in magnitude: the squares are multiples of 2⁻²⁰ and their sum
    // stays below 2¹³, so every partial sum is exact.
    let exact: Vec<f32> = rand(n, 1.0, 52, Dtype::F32)
        .iter()
        .map(|x| (x * 2048.0).round() / 1024.0)
        .collect();
    out.push(scalar_check(
        "optim.grad_norm_sq.exact",
        store,
        sq(&exact, None),
        optim::sum_squares(&exact),
        0.0,
    ));
    let mut nonfinite_ok = true;
    for bad in [f32::INFINITY, f32::NAN] {
        let mut g = exact.clone();
        g[n / 2 + 1] = bad;
        let s = sq(&g, None);
        nonfinite_ok &= !s.is_finite() && s.is_nan() == bad.is_nan();
        nonfinite_ok &= precision::has_inf_or_nan(&g);
    }
    out.push(OpCheck {
        op: "optim.grad_norm_sq.nonfinite".into(),
        store,
        error: if nonfinite_ok { 0.0 } else { f64::INFINITY },
        tolerance: 0.0,
        ok: nonfinite_ok,
    });
    out
}

/// The device's optimizer buffers: parameters (the fp32 master under mixed precision), moments.
struct DeviceAdam<D: Device> {
    p: D::Buf,
    m: D::Buf,
    v: D::Buf,
}

impl<D: Device> DeviceAdam<D> {
    fn new(dev: &D, p0: &[f32]) -> DeviceAdam<D> {
        let zeros = vec![0.0f32; p0.len()];
        DeviceAdam {
            p: dev.upload(p0),
            m: dev.upload(&zeros),
            v: dev.upload(&zeros),
        }
    }

    fn download(dev: &D, b: &D::Buf) -> Vec<f32> {
        let mut out = vec![0.0; dev.len(dev.view(b))];
        dev.download(dev.view(b), &mut out);
        out
    }
}

/// AdamW with clipping and Adam with L2 decay, two steps each, against the host's `Optimizer`.
fn adam_checks<D: Device>(k: &Kernels<D>, store: Dtype, host_lr_factor: f64) -> Vec<OpCheck> {
    let dev = k.device();
    let n = OPTIM_N;
    let (entries, flags) = optim_layout(n);
    let mask =
        DecayMask::new(k, &entries, &flags, std::slice::from_ref(&(0..n))).expect("a valid layout");
    let l2 = AdamConfig {
        beta1: 0.8,
        beta2: 0.99,
        eps: 1e-6,
        weight_decay: 0.1,
        mode: WeightDecay::L2,
        bias_correction: true,
    };
    let mut out = Vec::new();
    for (name, cfg, lr0, clip) in [
        ("optim.adamw", AdamConfig::adamw(0.01), 1e-3, true),
        ("optim.adam_l2", l2, 3e-3, false),
    ] {
        let mut host = Optimizer::from(Adam::new(cfg, &entries, &flags).expect("a valid layout"));
        let p0 = rand(n, 1.0, 53, Dtype::F32);
        let mut hp = p0.clone();
        let mut d = DeviceAdam::<D>::new(dev, &p0);
        let mut checks = Vec::new();
        for step in 0..2 {
            let g = optim_grads(n, step, Dtype::F32);
            let lr = lr0 * (1 + step) as f64;
            let mut hg = g.clone();
            // The multiplier, < 1 either way: fp32 clipping's coefficient (the gradients' norm
            // is about 9 here), or an unscale factor.
            let mult = if clip {
                let norm = optim::sum_squares(&g).sqrt() as f32;
                optim::clip_coef(norm, 1.0).expect("the gradients are clipped")
            } else {
                0.37
            };
            let scale = GradScale {
                unscale: mult,
                combined: None,
            };
            host.step_scaled(&mut hp, &mut hg, lr * host_lr_factor, scale)
                .expect("a host step");
            let gb = dev.upload(&g);
            adamw_step(
                k,
                &cfg,
                step as u64 + 1,
                lr,
                mult,
                &mask,
                dev.view_mut(&mut d.p),
                dev.view(&gb),
                dev.view_mut(&mut d.m),
                dev.view_mut(&mut d.v),
                None,
            )
            .expect("a device step");
            let state = host.state();
            for (what, buf, want) in [
                ("param", &d.p, &hp[..]),
                ("exp_avg", &d.m, state.buffer("exp_avg")),
                ("exp_avg_sq", &d.v, state.buffer("exp_avg_sq")),
            ] {
                let got = DeviceAdam::<D>::download(dev, buf);
                checks.push(buffer_check(
                    &format!("{name}.{what}"),
                    store,
                    &got,
                    want,
                    0.0,
                ));
            }
        }
        out.extend(merge(checks));
    }
    out
}

/// The mixed-precision step: half gradients at a loss scale, the fp32 master and the half working
/// copy (rounded to `store` by the kernel), against `HostOptimizer`.
fn mixed_checks<D: Device>(k: &Kernels<D>, store: Dtype, host_lr_factor: f64) -> Vec<OpCheck> {
    let dev = k.device();
    let n = OPTIM_N;
    let (entries, flags) = optim_layout(n);
    let mask =
        DecayMask::new(k, &entries, &flags, std::slice::from_ref(&(0..n))).expect("a valid layout");
    let cfg = AdamConfig::adamw(0.01);
    let p0 = rand(n, 1.0, 54, store);
    let adam = Adam::new(cfg, &entries, &flags).expect("a valid layout");
    let mut host = HostOptimizer::new(adam, false, store, &p0);
    let mut hp = p0.clone();
    let mut d = DeviceAdam::<D>::new(dev, &p0);
    let mut work = dev.upload(&p0);
    let loss_scale = 1024.0f64;
    let mut checks = Vec::new();
    for step in 0..2 {
        let mut g: Vec<f32> = optim_grads(n, step, Dtype::F32)
            .iter()
            .map(|x| x * loss_scale as f32)
            .collect();
        store.round_slice(&mut g);
        let combined = precision::combined_scale(loss_scale, optim::sum_squares(&g).sqrt(), 1.0);
        let unscale = (1.0 / combined) as f32;
        let lr = 1e-3 * (1 + step) as f64;
        host.step(&mut hp, &mut g.clone(), lr * host_lr_factor, unscale)
            .expect("a host step");
        let gb = dev.upload(&g);
        adamw_step(
            k,
            &cfg,
            step as u64 + 1,
            lr,
            unscale,
            &mask,
            dev.view_mut(&mut d.p),
            dev.view(&gb),
            dev.view_mut(&mut d.m),
            dev.view_mut(&mut d.v),
            Some(dev.view_mut(&mut work)),
        )
        .expect("a device step");
        let state = host.state();
        for (what, buf, want) in [
            ("master", &d.p, &state.master[..]),
            ("work", &work, &hp[..]),
            ("exp_avg", &d.m, state.buffer("exp_avg")),
            ("exp_avg_sq", &d.v, state.buffer("exp_avg_sq")),
        ] {
            let got = DeviceAdam::<D>::download(dev, buf);
            checks.push(buffer_check(
                &format!("optim.mixed.{what}"),
                store,
                &got,
                want,
                0.0,
            ));
        }
    }
    merge(checks)
}
