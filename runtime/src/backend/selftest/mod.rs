//! Every [`Backend`] operation of one backend against the CPU reference, op by op, on odd shapes:
//! what `recipe kernels --selftest` runs on a GPU (scripts/gpu-check.sh), and what the emulation
//! tests run on the emulated device, so the check itself is tested where there is no GPU.
//!
//! Errors are measured relative to the largest reference value of each output (a kernel's float
//! differences scale with its magnitudes), against a tolerance per storage dtype: fp32 allows the
//! GPU's fused multiply-adds and another summation order (1e-5), fp16 and bf16 one rounding of
//! their own (2⁻¹⁰, 2⁻⁷) on top.
//!
//! [`compare_optim`] (in `optim.rs`) does the same for the device optimizer
//! (`runtime/kernels/optim.cu`), which is no [`Backend`] operation: the gradient norm and the
//! Adam / AdamW step against the host optimizer (`runtime/src/optim`), with tolerances of their
//! own. [`compare_peers`] (in `peers.rs`) checks the sums between the devices of several ranks
//! (NCCL) against the host's collective. Attention's checks are in `attention.rs`, those of
//! 16-bit stored buffers in `stored.rs`, and the device's own (queued copies, graphs) in
//! `device_checks.rs`.

mod attention;
mod device_checks;
mod optim;
mod peers;
mod stored;

pub use device_checks::{
    compare_graph_replay, compare_queued_upload, compare_update_wait, compare_wide_batched,
};
pub use optim::{compare_optim, compare_optim_against, optim_layout, scaled_step_inputs};
pub use peers::compare_peers;

use serde::Serialize;

use super::device::Device;
use super::kernels::Kernels;
use super::{AttnShape, Backend, Batch, Cpu, Dropout, Gemm, QkvRows, Stride};
use crate::precision::Dtype;
use crate::rng::Rng;

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
            site: 1,
        };
        let got = self.on_backend(&x, |b, o| b.dropout(b.view_mut(o), &d));
        let mut want = x.clone();
        cpu.dropout(&mut want, &d);
        self.compare("dropout", &got, &want);
        // More rows than one chunk of the bias gradient (BIAS_ROWS).
        let (rows, cols) = (137, 27);
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
        self.epilogues(rows, cols, &bias, &d);
    }

    /// A linear layer's GEMM into the fused epilogues of the forward (its bias alone, with
    /// dropout and the residual, with GELU; and `gelu_bwd` of the
    /// backward), which round its output themselves ([`Backend::gemm_to_epilogue`]), against
    /// the CPU's GEMM and separate operations.
    fn epilogues(&mut self, rows: usize, cols: usize, bias: &[f32], d: &Dropout) {
        let (st, be, cpu) = (self.store, self.be, self.cpu);
        let k = 70;
        let g = Gemm::dense(rows, cols, k, false, true, 0.0);
        let a = rand(rows * k, 1.0, 20, st);
        let w = rand(cols * k, 1.0, 21, st);
        let res = rand(rows * cols, 1.0, 22, st);
        let (ab, wb, bb, rb) = (
            be.upload(&a),
            be.upload(&w),
            be.upload(bias),
            be.upload(&res),
        );
        let gemm = |b: &B, out: &mut B::Buf| {
            b.gemm_to_epilogue(&g, b.view(&ab), b.view(&wb), b.view_mut(out));
        };
        let cpu_gemm = || {
            let mut c = vec![0.0; rows * cols];
            cpu.gemm(&g, &a, &w, &mut c);
            c
        };
        let zeros = vec![0.0; rows * cols];
        let got = self.on_backend(&zeros, |b, o| {
            gemm(b, o);
            b.bias_dropout_add(o, b.view(&bb), rows, cols, Some(d), b.view(&rb));
        });
        let mut want = cpu_gemm();
        cpu.add_bias(&mut want, bias, rows, cols);
        cpu.dropout(&mut want, d);
        cpu.add_assign(&mut want, &res);
        self.compare("gemm+bias_dropout_add", &got, &want);

        let got = self.on_backend(&zeros, |b, o| {
            gemm(b, o);
            b.bias_epilogue(b.view_mut(o), b.view(&bb), rows, cols);
        });
        let mut want = cpu_gemm();
        cpu.add_bias(&mut want, bias, rows, cols);
        self.compare("gemm+bias_epilogue", &got, &want);

        let mut inter = be.upload(&zeros);
        let mut act = be.upload(&zeros);
        gemm(be, &mut inter);
        be.bias_gelu(&mut inter, &mut act, be.view(&bb), rows, cols);
        let unbiased = cpu_gemm();
        let mut want_inter = unbiased.clone();
        cpu.add_bias(&mut want_inter, bias, rows, cols);
        let mut want_act = vec![0.0; rows * cols];
        cpu.gelu_fwd(&mut want_act, &want_inter);
        // Where the backward adds the bias again, the forward leaves `inter` without it.
        let apart = be.gelu_bwd_adds_bias();
        let kept = if apart { &unbiased } else { &want_inter };
        self.compare_bufs(&[
            ("gemm+bias_gelu.inter", &inter, kept),
            ("gemm+bias_gelu.act", &act, &want_act),
        ]);

        // The backward: d(act) from a GEMM, GELU's gradient and its bias's sum, given the bias
        // where the forward left it out.
        let db0 = rand(cols, 0.5, 23, st);
        let mut db = be.upload(&db0);
        let got = self.on_backend(&zeros, |b, o| {
            let mut dact = b.upload(&zeros);
            gemm(b, &mut dact);
            let inter_bias = apart.then(|| b.view(&bb));
            b.gelu_bwd_bias_grad(
                o,
                b.view(&inter),
                inter_bias,
                b.view(&dact),
                b.view_mut(&mut db),
                rows,
                cols,
            );
        });
        let (mut want, mut want_db) = (vec![0.0; rows * cols], db0);
        cpu.gelu_bwd_bias_grad(
            &mut want,
            &want_inter,
            None,
            &cpu_gemm(),
            &mut want_db,
            rows,
            cols,
        );
        self.compare("gemm+gelu_bwd", &got, &want);
        self.compare_bufs(&[("gemm+gelu_bwd.bias_grad", &db, &want_db)]);
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
        // A weight gradient's GEMM aside (a second stream on a GPU), its input then zeroed on
        // the compute stream after `wait_aside`, its output rounded after `join_aside`: the
        // product of the values before the zeroing.
        let g = Gemm::dense(m, n, k, true, false, 1.0);
        let (a, b) = (rand(k * m, 1.0, 13, st), rand(k * n, 1.0, 14, st));
        let c0 = rand(m * n, 1.0, 15, st);
        let bb = be.upload(&b);
        let got = self.on_backend(&c0, |x, c| {
            let mut ab = x.upload(&a);
            let t = x.aside(|| x.gemm_to_epilogue(&g, x.view(&ab), x.view(&bb), x.view_mut(c)));
            x.wait_aside(t);
            x.zero(x.view_mut(&mut ab));
            x.join_aside();
            x.round_stored(x.view_mut(c));
        });
        let mut want = c0;
        self.cpu.gemm(&g, &a, &b, &mut want);
        self.compare("gemm.aside", &got, &want);
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
        // Into a stored buffer (the embeddings' sum LayerNorm reads).
        let mut sum = be.alloc_stored(n * hidden);
        let (w, p, t) = (be.view(&wb), be.view(&pb), be.view(&tb));
        be.embedding_fwd(be.view_mut(&mut sum), &ib, &yb, w, p, t, batch, seq, hidden);
        self.compare_bufs(&[("stored.embedding_fwd", &sum, &want)]);
        // From tables kept in one stored buffer (the parameters, when the device steps them).
        let mut tables = be.alloc_stored(word.len() + pos.len() + typ.len());
        let (wl, pl) = (word.len(), word.len() + pos.len());
        be.write(be.range_mut(&mut tables, 0..wl), &word);
        be.write(be.range_mut(&mut tables, wl..pl), &pos);
        be.write(be.range_mut(&mut tables, pl..pl + typ.len()), &typ);
        let t = be.view(&tables);
        let (w, p, t) = (
            be.sub(t, 0..wl),
            be.sub(t, wl..pl),
            be.sub(t, pl..pl + typ.len()),
        );
        let mut out = be.alloc(n * hidden);
        be.embedding_fwd(be.view_mut(&mut out), &ib, &yb, w, p, t, batch, seq, hidden);
        self.compare_bufs(&[("stored.params.embedding_fwd", &out, &want)]);

        let dout = rand(n * hidden, 1.0, 25, st);
        let (mut ww, mut wp, mut wt) = (word.clone(), pos.clone(), typ.clone());
        cpu.embedding_bwd(
            &mut ww, &mut wp, &mut wt, &dout, &tok, &types, batch, seq, hidden,
        );
        // From an f32 gradient, and from a stored one (the embeddings' LayerNorm backward
        // writes one).
        for stored in [false, true] {
            let db = if stored {
                let mut b = be.alloc_stored(n * hidden);
                be.write(be.view_mut(&mut b), &dout);
                b
            } else {
                be.upload(&dout)
            };
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
            let prefix = if stored { "stored." } else { "" };
            self.compare_bufs(&[
                (&format!("{prefix}embedding_bwd.word"), &gw, &ww),
                (&format!("{prefix}embedding_bwd.pos"), &gp, &wp),
                (&format!("{prefix}embedding_bwd.type"), &gt, &wt),
            ]);
        }

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
        // The residual branch's split in one pass: kept, then dropped; in f32 buffers, and in
        // stored ones as the model keeps the residual stream's gradients (the output gradient,
        // the branch's and the kept one).
        let d = Dropout {
            p: 0.2,
            seed: 11,
            stream: 4,
            site: 1,
        };
        let (mut wdi, mut wkeep) = (vec![0.0; rows * cols], vec![0.0; rows * cols]);
        let (mut wdw, mut wdb) = (w.clone(), b.clone());
        cpu.layernorm_bwd_split(
            (&mut wdi, &mut wkeep, Some(&d)),
            &mut wdw,
            &mut wdb,
            &dout2,
            &x,
            &w,
            &wm,
            &wr,
            rows,
            cols,
        );
        for stored in [false, true] {
            let fresh = |n: usize| {
                if stored {
                    be.alloc_stored(n)
                } else {
                    be.alloc(n)
                }
            };
            let mut dout = fresh(rows * cols);
            be.write(be.view_mut(&mut dout), &dout2);
            let (mut di, mut keep) = (fresh(rows * cols), fresh(rows * cols));
            let (mut dw, mut dbb) = (be.upload(&w), be.upload(&b));
            be.layernorm_bwd_split(
                (&mut di, &mut keep, Some(&d)),
                be.view_mut(&mut dw),
                be.view_mut(&mut dbb),
                be.view(&dout),
                be.view(&xb),
                be.view(&wb2),
                be.view(&mb),
                be.view(&rb),
                rows,
                cols,
            );
            let prefix = if stored { "stored." } else { "" };
            self.compare_bufs(&[
                (&format!("{prefix}layernorm_bwd_split.dinp"), &di, &wdi),
                (&format!("{prefix}layernorm_bwd_split.keep"), &keep, &wkeep),
                (&format!("{prefix}layernorm_bwd_split.dw"), &dw, &wdw),
            ]);
        }
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

/// Whether `got` holds `want`'s bits, element for element.
fn same_bits(got: &[f32], want: &[f32]) -> bool {
    got.len() == want.len()
        && got
            .iter()
            .zip(want)
            .all(|(a, b)| a.to_bits() == b.to_bits())
}

/// An exact check's result: error 1 when it failed, 0 when it passed.
fn exact(op: &str, store: Dtype, ok: bool) -> OpCheck {
    OpCheck {
        op: op.into(),
        store,
        error: if ok { 0.0 } else { 1.0 },
        tolerance: 0.0,
        ok,
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
    c.attention(false, None);
    c.attention(true, None);
    c.attention(true, Some((64, 77)));
    c.attention(true, Some((32, 77)));
    c.attention(true, Some((64, 203)));
    c.attention(true, Some((32, 203)));
    c.cross_entropy();
    c.stored();
    c.stored_wide();
    c.out
}
