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
//! (NCCL) against the host's collective.

mod optim;
mod peers;

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

    /// Attention forward and backward; with `stored`, attention's token tensors, their
    /// gradients and the probabilities are [`Backend::alloc_stored`] buffers, as the model keeps
    /// them (16-bit on a GPU storing fp16/bf16: the half products read and write them as they
    /// are, the f32 ones through widened copies, the softmax kernels through `ld`/`sto`), checked
    /// as `stored.attention_*`. With `head64` (stored buffers), heads of 64 over 77 keys,
    /// checked as `stored.hd64.attention_*`: the shape whose forward a GPU with `mma.sync`
    /// storing fp16/bf16 runs as one kernel (`attention_fused`) and whose backward as two
    /// (`attention_bwd_dq`, `attention_bwd_dkv`; kernels/attention.rs). Where the device's
    /// attention adds q's, k's and v's biases as it loads them ([`Backend::attention_adds_bias`]:
    /// the fused kernels), that shape's device side is given q, k and v without them and the
    /// biases, the CPU q, k and v with them added (rounded, as `add_bias`).
    fn attention(&mut self, stored: bool, head64: bool) {
        let st = self.store;
        let (be, cpu) = (self.be, self.cpu);
        let put = |host: &[f32]| {
            if stored {
                let mut b = be.alloc_stored(host.len());
                be.write(be.view_mut(&mut b), host);
                b
            } else {
                be.upload(host)
            }
        };
        let fresh = |n: usize| {
            if stored {
                be.alloc_stored(n)
            } else {
                be.alloc(n)
            }
        };
        let name = |n: &str| match (stored, head64) {
            (true, true) => format!("stored.hd64.{n}"),
            (true, false) => format!("stored.{n}"),
            _ => n.to_string(),
        };
        let s = if head64 {
            AttnShape {
                batch: 2,
                seq: 77,
                heads: 2,
                head_dim: 64,
            }
        } else {
            AttnShape {
                batch: 2,
                seq: 33,
                heads: 3,
                head_dim: 16,
            }
        };
        let tok = s.batch * s.seq * s.heads * s.head_dim;
        let pp = s.batch * s.heads * s.seq * s.seq;
        let (q, k, v) = (
            rand(tok, 1.0, 30, st),
            rand(tok, 1.0, 31, st),
            rand(tok, 1.0, 32, st),
        );
        // Biases 7 elements apart beyond a head row's width, as a layer's parameters lay q's,
        // k's and v's out with weights between them.
        let hid = s.heads * s.head_dim;
        let stride = hid + 7;
        let fold = stored && head64 && be.attention_adds_bias(s);
        let bias = rand(2 * stride + hid, 0.5, 34, st);
        let biased = |x: &[f32], j: usize| -> Vec<f32> {
            let mut out: Vec<f32> = x
                .iter()
                .enumerate()
                .map(|(i, &x)| x + bias[j * stride + i % hid])
                .collect();
            if st.is_half() {
                st.round_slice(&mut out);
            }
            out
        };
        // The device's q, k and v, then the CPU's.
        let (qb, kb, vb) = (put(&q), put(&k), put(&v));
        let bias_buf = put(&bias);
        let qkv_bias = fold.then(|| (be.view(&bias_buf), stride));
        let (q, k, v) = if fold {
            (biased(&q, 0), biased(&k, 1), biased(&v, 2))
        } else {
            (q, k, v)
        };
        // The second sequence is padded after 20 tokens.
        let mask: Vec<u32> = (0..s.batch * s.seq)
            .map(|i| u32::from(i < s.seq || i % s.seq < 20))
            .collect();
        let d = Dropout {
            p: 0.1,
            seed: 9,
            stream: 3,
            site: 1,
        };
        let mb = be.upload_ids(&mask);
        // Stored probabilities get f32 room for the scores; the others hold them in place.
        let (mut ctx, mut probs, mut pd) = (fresh(tok), fresh(pp), fresh(pp));
        let mut room = stored.then(|| be.alloc(pp));
        be.attention_fwd(
            be.view_mut(&mut ctx),
            be.view_mut(&mut probs),
            Some(be.view_mut(&mut pd)),
            room.as_mut().map(|r| be.view_mut(r)),
            be.view(&qb),
            be.view(&kb),
            be.view(&vb),
            qkv_bias,
            &mb,
            s,
            Some(&d),
        );
        let (mut wc, mut wp, mut wpd) = (vec![0.0; tok], vec![0.0; pp], vec![0.0; pp]);
        cpu.attention_fwd(
            &mut wc,
            &mut wp,
            Some(&mut wpd),
            None,
            &q,
            &k,
            &v,
            None,
            &mask,
            s,
            Some(&d),
        );
        self.compare_bufs(&[
            (&name("attention_fwd.ctx"), &ctx, &wc),
            (&name("attention_fwd.probs"), &probs, &wp),
            (&name("attention_fwd.probs_drop"), &pd, &wpd),
        ]);
        // The backward from the CPU's forward, so only the backward is compared.
        let (pb, pdb) = (put(&wp), put(&wpd));
        let dctx = rand(tok, 1.0, 33, st);
        let dcb = put(&dctx);
        // dq, dk and dv side by side in a token's row as BERT's backward lays them out: a zero
        // column after dq and after dk, the row padded to 8 (model/layout.rs, `qkv_grad_rows`).
        let out = QkvRows {
            ld: (3 * hid + 2).next_multiple_of(8),
            cols: [0, hid + 1, 2 * hid + 2],
        };
        let rows = s.batch * s.seq;
        let (mut dqkv, mut scratch) = (fresh(rows * out.ld), be.alloc(pp));
        be.attention_bwd(
            be.view_mut(&mut dqkv),
            out,
            be.view_mut(&mut scratch),
            be.view(&dcb),
            be.view(&qb),
            be.view(&kb),
            be.view(&vb),
            qkv_bias,
            be.view(&pb),
            Some(be.view(&pdb)),
            s,
            Some(&d),
        );
        let (mut want, mut ws) = (vec![0.0; rows * out.ld], vec![0.0; pp]);
        cpu.attention_bwd(
            &mut want,
            out,
            &mut ws,
            &dctx,
            &q,
            &k,
            &v,
            None,
            &wp,
            Some(&wpd),
            s,
            Some(&d),
        );
        let mut got = vec![0.0; rows * out.ld];
        be.download(be.view(&dqkv), &mut got);
        // Each gradient's columns, then the rest of the rows (left as they were: zero).
        let cols = |x: &[f32], c: usize| -> Vec<f32> {
            x.chunks(out.ld)
                .flat_map(|r| r[c..c + hid].to_vec())
                .collect()
        };
        for (j, g) in ["dq", "dk", "dv"].into_iter().enumerate() {
            let c = out.cols[j];
            self.compare(
                &name(&format!("attention_bwd.{g}")),
                &cols(&got, c),
                &cols(&want, c),
            );
        }
        let rest = |x: &[f32]| -> Vec<f32> {
            x.chunks(out.ld)
                .flat_map(|r| {
                    (0..out.ld)
                        .filter(|c| !out.cols.iter().any(|&o| (o..o + hid).contains(c)))
                        .map(|c| r[c])
                        .collect::<Vec<_>>()
                })
                .collect()
        };
        self.compare(&name("attention_bwd.untouched"), &rest(&got), &rest(&want));
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

impl<B: Backend> Checker<'_, B> {
    /// A buffer the backend may keep in 16 bits ([`Backend::alloc_stored`]) through its life:
    /// written from the host into a part of it, written by a kernel (`gelu_bwd`), read by
    /// kernels (`bias_grad`) and by GEMMs as either operand, and read back.
    fn stored(&mut self) {
        let (be, cpu, st) = (self.be, self.cpu, self.store);
        let (rows, cols, outs) = (37, 29, 11);
        let n = rows * cols;
        let x = rand(n, 2.0, 21, st);
        let dy = rand(n, 1.0, 22, st);
        let (xb, dyb) = (be.upload(&x), be.upload(&dy));
        // Host values into the middle of a stored buffer, then the whole read back.
        let mut s = be.alloc_stored(n);
        be.write(be.range_mut(&mut s, 5..5 + cols), &x[..cols]);
        let mut got = vec![0.0; cols];
        be.download(be.sub(be.view(&s), 5..5 + cols), &mut got);
        self.compare("stored.write", &got, &x[..cols]);
        be.gelu_bwd(be.view_mut(&mut s), be.view(&xb), be.view(&dyb));
        let mut d = vec![0.0; n];
        cpu.gelu_bwd(&mut d, &x, &dy);
        let mut got = vec![0.0; n];
        be.download(be.view(&s), &mut got);
        self.compare("stored.gelu_bwd", &got, &d);
        let bias = rand(cols, 1.0, 23, st);
        let got = self.on_backend(&bias, |b, o| {
            b.bias_grad(b.view_mut(o), b.view(&s), rows, cols)
        });
        let mut want = bias.clone();
        cpu.bias_grad(&mut want, &d, rows, cols);
        self.compare("stored.bias_grad", &got, &want);
        // As A: [rows × cols]·Wᵀ, W [outs × cols]; as B (transposed): dᵀ·x, [cols × cols].
        let w = rand(outs * cols, 1.0, 24, st);
        let wb = be.upload(&w);
        let g = Gemm::dense(rows, outs, cols, false, true, 0.0);
        let got = self.on_backend(&vec![0.0; rows * outs], |b, o| {
            b.gemm(&g, b.view(&s), b.view(&wb), b.view_mut(o))
        });
        let mut want = vec![0.0; rows * outs];
        cpu.gemm(&g, &d, &w, &mut want);
        self.compare("stored.gemm_a", &got, &want);
        // Added into a stored output (beta 1: the residual stream's gradient, which the Q, K
        // and V linears' input gradients add to), rounded once.
        let g1 = Gemm::dense(rows, outs, cols, false, true, 1.0);
        let c0 = rand(rows * outs, 1.0, 29, st);
        let mut acc = be.alloc_stored(rows * outs);
        be.write(be.view_mut(&mut acc), &c0);
        be.gemm(&g1, be.view(&s), be.view(&wb), be.view_mut(&mut acc));
        let mut want = c0.clone();
        cpu.gemm(&g1, &d, &w, &mut want);
        self.compare_bufs(&[("stored.gemm_accumulate", &acc, &want)]);
        let g = Gemm::dense(cols, cols, rows, true, false, 0.0);
        let got = self.on_backend(&vec![0.0; cols * cols], |b, o| {
            b.gemm(&g, b.view(&xb), b.view(&s), b.view_mut(o))
        });
        let mut want = vec![0.0; cols * cols];
        cpu.gemm(&g, &x, &d, &mut want);
        self.compare("stored.gemm_b", &got, &want);
        // LayerNorm's output into it, dropout in place, and it as a residual.
        let (lw, lb) = (rand(cols, 1.0, 25, st), rand(cols, 0.5, 26, st));
        let (wd, bd) = (be.upload(&lw), be.upload(&lb));
        let (mut mean, mut rstd) = (be.alloc(rows), be.alloc(rows));
        be.layernorm_fwd(
            be.view_mut(&mut s),
            be.view_mut(&mut mean),
            be.view_mut(&mut rstd),
            be.view(&xb),
            be.view(&wd),
            be.view(&bd),
            rows,
            cols,
            1e-12,
        );
        let (mut ln, mut cm, mut cr) = (vec![0.0; n], vec![0.0; rows], vec![0.0; rows]);
        cpu.layernorm_fwd(&mut ln, &mut cm, &mut cr, &x, &lw, &lb, rows, cols, 1e-12);
        let mut got = vec![0.0; n];
        be.download(be.view(&s), &mut got);
        self.compare("stored.layernorm_fwd", &got, &ln);
        let d = Dropout {
            p: 0.25,
            seed: 91,
            stream: 4,
            site: 1,
        };
        be.dropout(be.view_mut(&mut s), &d);
        cpu.dropout(&mut ln, &d);
        be.download(be.view(&s), &mut got);
        self.compare("stored.dropout", &got, &ln);
        let bias = rand(cols, 1.0, 27, st);
        let biasd = be.upload(&bias);
        let mut out = be.upload(&dy);
        be.bias_dropout_add(&mut out, be.view(&biasd), rows, cols, Some(&d), be.view(&s));
        let mut want = dy.clone();
        cpu.bias_dropout_add(&mut want, &bias, rows, cols, Some(&d), &ln);
        be.download(be.view(&out), &mut got);
        self.compare("stored.bias_dropout_add", &got, &want);
        // A GEMM writing a stored buffer (which rounds as its epilogue would), then the FFN's
        // bias and GELU from it into another.
        let g = Gemm::dense(rows, outs, cols, false, true, 0.0);
        let (mut inter, mut act) = (be.alloc_stored(rows * outs), be.alloc_stored(rows * outs));
        be.gemm_to_epilogue(&g, be.view(&xb), be.view(&wb), be.view_mut(&mut inter));
        let ob = rand(outs, 1.0, 28, st);
        let obb = be.upload(&ob);
        be.bias_gelu(&mut inter, &mut act, be.view(&obb), rows, outs);
        let (mut wi, mut wa) = (vec![0.0; rows * outs], vec![0.0; rows * outs]);
        cpu.gemm(&g, &x, &w, &mut wi);
        let unbiased = wi.clone();
        cpu.bias_gelu(&mut wi, &mut wa, &ob, rows, outs);
        let apart = be.gelu_bwd_adds_bias();
        self.compare_bufs(&[
            (
                "stored.gemm+bias_gelu.inter",
                &inter,
                if apart { &unbiased } else { &wi },
            ),
            ("stored.gemm+bias_gelu.act", &act, &wa),
        ]);
        // Its backward from stored buffers: GELU's gradient and the bias's sum, in one pass
        // where the device has it, the bias added again to `inter` where it was left out.
        let dact = rand(rows * outs, 1.0, 29, st);
        let mut dinter = be.alloc_stored(rows * outs);
        let mut dact_s = be.alloc_stored(rows * outs);
        be.write(be.view_mut(&mut dact_s), &dact);
        let mut dbias = be.upload(&vec![0.0; outs]);
        be.gelu_bwd_bias_grad(
            &mut dinter,
            be.view(&inter),
            apart.then(|| be.view(&obb)),
            be.view(&dact_s),
            be.view_mut(&mut dbias),
            rows,
            outs,
        );
        let (mut want_d, mut want_db) = (vec![0.0; rows * outs], vec![0.0; outs]);
        cpu.gelu_bwd_bias_grad(&mut want_d, &wi, None, &dact, &mut want_db, rows, outs);
        self.compare_bufs(&[
            ("stored.gelu_bwd_bias_grad.dinp", &dinter, &want_d),
            ("stored.gelu_bwd_bias_grad.db", &dbias, &want_db),
        ]);
        // The same GEMM, then its bias alone (the Q, K and V linears).
        let mut lin = be.alloc_stored(rows * outs);
        be.gemm_to_epilogue(&g, be.view(&xb), be.view(&wb), be.view_mut(&mut lin));
        be.bias_epilogue(be.view_mut(&mut lin), be.view(&be.upload(&ob)), rows, outs);
        let mut wl = vec![0.0; rows * outs];
        cpu.gemm(&g, &x, &w, &mut wl);
        cpu.add_bias(&mut wl, &ob, rows, outs);
        self.compare_bufs(&[("stored.gemm+bias_epilogue", &lin, &wl)]);
        // A stored sublayer sum: bias_dropout_add into it, LayerNorm forward and backward
        // reading it.
        let mut sum = be.alloc_stored(n);
        be.write(be.view_mut(&mut sum), &dy);
        be.bias_dropout_add(
            &mut sum,
            be.view(&biasd),
            rows,
            cols,
            Some(&d),
            be.view(&xb),
        );
        let mut ws = dy.clone();
        cpu.bias_dropout_add(&mut ws, &bias, rows, cols, Some(&d), &x);
        self.compare_bufs(&[("stored.bias_dropout_add.out", &sum, &ws)]);
        // LayerNorm reading a stored input.
        self.layernorm_round_trip(
            "inp",
            (&sum, &ws),
            (&wd, &lw),
            (&bd, &lb),
            (&dyb, &dy),
            rows,
        );
        // Parameters kept in stored buffers (when the device steps them): a bias, and
        // LayerNorm's weight and bias, forward and backward.
        let param = |host: &[f32]| {
            let mut b = be.alloc_stored(host.len());
            be.write(be.view_mut(&mut b), host);
            b
        };
        let (bs, lws, lbs) = (param(&bias), param(&lw), param(&lb));
        let got = self.on_backend(&dy, |b, o| {
            b.add_bias(b.view_mut(o), b.view(&bs), rows, cols)
        });
        let mut want = dy.clone();
        cpu.add_bias(&mut want, &bias, rows, cols);
        self.compare("stored.params.add_bias", &got, &want);
        self.layernorm_round_trip(
            "params",
            (&xb, &x),
            (&lws, &lw),
            (&lbs, &lb),
            (&dyb, &dy),
            rows,
        );
    }

    /// A post-LN sublayer's end at BERT-base's width (768: rows a multiple of the vectorised
    /// paths' 8 columns, within the LayerNorm kernels' registers) on stored buffers with stored
    /// parameters, as a GPU trains it: `bias_dropout_add_layernorm` (one kernel on a GPU keeping
    /// 16-bit buffers), then the residual split of its backward (`layernorm_bwd_dinp16` there),
    /// checked as `stored.wide.*`; and the feed-forward's bias and GELU, forward and backward
    /// (`gelu_bwd_bias_grad`'s one kernel there). The narrower `stored` checks take the
    /// generic paths.
    fn stored_wide(&mut self) {
        let (be, cpu, st) = (self.be, self.cpu, self.store);
        let (rows, cols) = (37, 768);
        let n = rows * cols;
        let put = |host: &[f32]| {
            let mut b = be.alloc_stored(host.len());
            be.write(be.view_mut(&mut b), host);
            b
        };
        let (y, x, dy) = (
            rand(n, 2.0, 70, st),
            rand(n, 2.0, 71, st),
            rand(n, 1.0, 72, st),
        );
        let (bias, lw, lb) = (
            rand(cols, 1.0, 73, st),
            rand(cols, 1.0, 74, st),
            rand(cols, 0.5, 75, st),
        );
        let d = Dropout {
            p: 0.1,
            seed: 17,
            stream: 6,
            site: 2,
        };
        let (mut res, xb, dyb) = (put(&y), put(&x), put(&dy));
        let (bb, wb, lbb) = (put(&bias), put(&lw), put(&lb));
        let (mut out, mut mean, mut rstd) = (be.alloc_stored(n), be.alloc(rows), be.alloc(rows));
        be.bias_dropout_add_layernorm(
            &mut res,
            be.view(&bb),
            Some(&d),
            be.view(&xb),
            (
                be.view_mut(&mut out),
                be.view_mut(&mut mean),
                be.view_mut(&mut rstd),
            ),
            be.view(&wb),
            be.view(&lbb),
            rows,
            cols,
            1e-12,
        );
        let mut wres = y.clone();
        let (mut wo, mut wm, mut wr) = (vec![0.0; n], vec![0.0; rows], vec![0.0; rows]);
        cpu.bias_dropout_add_layernorm(
            &mut wres,
            &bias,
            Some(&d),
            &x,
            (&mut wo, &mut wm, &mut wr),
            &lw,
            &lb,
            rows,
            cols,
            1e-12,
        );
        self.compare_bufs(&[
            ("stored.wide.bias_dropout_add_layernorm.res", &res, &wres),
            ("stored.wide.bias_dropout_add_layernorm.out", &out, &wo),
            ("stored.wide.bias_dropout_add_layernorm.mean", &mean, &wm),
            ("stored.wide.bias_dropout_add_layernorm.rstd", &rstd, &wr),
        ]);
        let (mut dinp, mut keep) = (be.alloc_stored(n), be.alloc_stored(n));
        let (mut dw, mut db) = (be.upload(&vec![0.5; cols]), be.upload(&vec![-0.25; cols]));
        // With the bias gradient of the linear below (`dl`), summed in the same column pass on
        // a GPU.
        let mut dl = be.upload(&vec![0.125; cols]);
        be.layernorm_bwd_split_bias_grad(
            (&mut dinp, &mut keep, Some(&d)),
            (
                be.view_mut(&mut dw),
                be.view_mut(&mut db),
                be.view_mut(&mut dl),
            ),
            be.view(&dyb),
            be.view(&res),
            be.view(&wb),
            be.view(&mean),
            be.view(&rstd),
            rows,
            cols,
        );
        let (mut wdi, mut wk) = (vec![0.0; n], vec![0.0; n]);
        let (mut wdw, mut wdb, mut wdl) = (vec![0.5; cols], vec![-0.25; cols], vec![0.125; cols]);
        cpu.layernorm_bwd_split_bias_grad(
            (&mut wdi, &mut wk, Some(&d)),
            (&mut wdw, &mut wdb, &mut wdl),
            &dy,
            &wres,
            &lw,
            &wm,
            &wr,
            rows,
            cols,
        );
        self.compare_bufs(&[
            ("stored.wide.layernorm_bwd_split.dinp", &dinp, &wdi),
            ("stored.wide.layernorm_bwd_split.keep", &keep, &wk),
            ("stored.wide.layernorm_bwd_split.dw", &dw, &wdw),
            ("stored.wide.layernorm_bwd_split.db", &db, &wdb),
            ("stored.wide.layernorm_bwd_split.dl", &dl, &wdl),
        ]);
        // The feed-forward's bias and GELU from a stored pre-activation, and their backward
        // with the bias's gradient (one kernel on a GPU keeping 16-bit buffers), the bias at
        // an odd place in a stored parameter buffer; where the forward leaves the bias out
        // of `inter`, the backward is given it to add again.
        let mut params = be.alloc_stored(cols + 1);
        be.write(
            be.sub_mut(&mut be.view_mut(&mut params), 1..cols + 1),
            &bias,
        );
        let pb = || be.sub(be.view(&params), 1..cols + 1);
        let mut act = be.alloc_stored(n);
        let mut inter = put(&x);
        be.bias_gelu(&mut inter, &mut act, pb(), rows, cols);
        let mut gi = be.alloc_stored(n);
        let mut gb = be.upload(&vec![0.5; cols]);
        be.gelu_bwd_bias_grad(
            &mut gi,
            be.view(&inter),
            be.gelu_bwd_adds_bias().then(pb),
            be.view(&dyb),
            be.view_mut(&mut gb),
            rows,
            cols,
        );
        let (mut wi, mut wa) = (x.clone(), vec![0.0; n]);
        cpu.bias_gelu(&mut wi, &mut wa, &bias, rows, cols);
        let (mut wgi, mut wgb) = (vec![0.0; n], vec![0.5; cols]);
        cpu.gelu_bwd_bias_grad(&mut wgi, &wi, None, &dy, &mut wgb, rows, cols);
        self.compare_bufs(&[
            ("stored.wide.bias_gelu.act", &act, &wa),
            ("stored.wide.gelu_bwd_bias_grad.dinp", &gi, &wgi),
            ("stored.wide.gelu_bwd_bias_grad.db", &gb, &wgb),
        ]);
    }

    /// LayerNorm's forward and backward (from its own saved statistics) on the backend and on
    /// the CPU, each input a backend buffer and its host values, compared as
    /// `stored.layernorm.{what}.*`.
    fn layernorm_round_trip(
        &mut self,
        what: &str,
        inp: (&B::Buf, &[f32]),
        w: (&B::Buf, &[f32]),
        b: (&B::Buf, &[f32]),
        dout: (&B::Buf, &[f32]),
        rows: usize,
    ) {
        let (be, cpu) = (self.be, self.cpu);
        let cols = w.1.len();
        let n = rows * cols;
        let (mut y, mut mean, mut rstd) = (be.alloc(n), be.alloc(rows), be.alloc(rows));
        be.layernorm_fwd(
            be.view_mut(&mut y),
            be.view_mut(&mut mean),
            be.view_mut(&mut rstd),
            be.view(inp.0),
            be.view(w.0),
            be.view(b.0),
            rows,
            cols,
            1e-12,
        );
        let (mut wy, mut cm, mut cr) = (vec![0.0; n], vec![0.0; rows], vec![0.0; rows]);
        cpu.layernorm_fwd(
            &mut wy, &mut cm, &mut cr, inp.1, w.1, b.1, rows, cols, 1e-12,
        );
        let (mut dinp, mut dw, mut db) = (be.alloc(n), be.alloc(cols), be.alloc(cols));
        be.layernorm_bwd(
            be.view_mut(&mut dinp),
            be.view_mut(&mut dw),
            be.view_mut(&mut db),
            be.view(dout.0),
            be.view(inp.0),
            be.view(w.0),
            be.view(&mean),
            be.view(&rstd),
            rows,
            cols,
        );
        let (mut wdi, mut wdw, mut wdb) = (vec![0.0; n], vec![0.0; cols], vec![0.0; cols]);
        cpu.layernorm_bwd(
            &mut wdi, &mut wdw, &mut wdb, dout.1, inp.1, w.1, &cm, &cr, rows, cols,
        );
        self.compare_bufs(&[
            (&format!("stored.layernorm.{what}.fwd"), &y, &wy),
            (&format!("stored.layernorm.{what}.dinp"), &dinp, &wdi),
            (&format!("stored.layernorm.{what}.dw"), &dw, &wdw),
            (&format!("stored.layernorm.{what}.db"), &db, &wdb),
        ]);
    }
}

/// The queued copy of an offloaded step's updated parameters into a stored buffer: in a half
/// store, their 16 bits from pinned memory (`Device::upload_queued_bits`) into part of it, the
/// rest left as it was; in fp32, the floats (`Device::upload_queued`). Exact: `copy.upload_queued`.
pub fn compare_queued_upload<D: Device>(k: &Kernels<D>, store: Dtype) -> OpCheck {
    let dev = k.device();
    let (n, at, m) = (1001, 3, 997);
    let before = rand(n, 2.0, 60, store);
    let up = rand(m, 2.0, 61, store);
    let mut buf = k.alloc_stored(n);
    k.write(k.view_mut(&mut buf), &before);
    let elem = dev.elem(k.view(&buf));
    let mut pinned = dev.alloc_pinned(m);
    let dst = dev.range_mut(&mut buf, at..at + m);
    if elem.is_half() {
        let bits = super::device::as_bits(&mut pinned, m);
        for (b, &x) in bits.iter_mut().zip(&up) {
            *b = elem.bits(x);
        }
        // SAFETY: `pinned` outlives the wait below, and nothing touches it or `buf` until then.
        unsafe { dev.upload_queued_bits(dst, bits.as_ptr()) };
    } else {
        pinned.copy_from_slice(&up);
        // SAFETY: as above.
        unsafe { dev.upload_queued(dst, pinned.as_ptr()) };
    }
    let waited = dev.wait_copies();
    let mut got = vec![0.0; n];
    k.download(k.view(&buf), &mut got);
    let mut want = before;
    want[at..at + m].copy_from_slice(&up);
    let same = same_bits(&got, &want);
    OpCheck {
        ok: same && waited.is_ok(),
        ..exact("copy.upload_queued", store, same)
    }
}

/// A batched f32 product of stored (in a half store, 16-bit) buffers into a stored buffer
/// (`Device::gemm_batched` with f32 operands: a GPU widens each operand into f32 room and rounds
/// the results into the output), three items of odd shapes with `B` transposed, against the
/// host's sums rounded to the store: `stored.gemm_batched_f32`. The model's attention runs its
/// products on half operands since `ds` is a stored value, so this checks the path on its own.
pub fn compare_wide_batched<D: Device>(k: &Kernels<D>, store: Dtype) -> OpCheck {
    let dev = k.device();
    let (count, m, n, kk) = (3, 5, 7, 9);
    let g = Gemm {
        alpha: 0.5,
        ..Gemm::dense(m, n, kk, false, true, 0.0)
    };
    let batch = Batch {
        count,
        inner: 1,
        a: Stride {
            outer: m * kk,
            inner: 0,
        },
        b: Stride {
            outer: n * kk,
            inner: 0,
        },
        c: Stride {
            outer: m * n,
            inner: 0,
        },
    };
    let (ha, hb) = (
        rand(count * m * kk, 2.0, 80, store),
        rand(count * n * kk, 2.0, 81, store),
    );
    let (mut a, mut b, mut c) = (
        k.alloc_stored(ha.len()),
        k.alloc_stored(hb.len()),
        k.alloc_stored(count * m * n),
    );
    k.write(k.view_mut(&mut a), &ha);
    k.write(k.view_mut(&mut b), &hb);
    // Garbage where the product writes: beta 0 must not read it.
    k.write(k.view_mut(&mut c), &vec![7.0; count * m * n]);
    dev.gemm_batched(
        &g,
        &batch,
        k.view(&a),
        k.view(&b),
        k.view_mut(&mut c),
        Dtype::F32,
    );
    let mut got = vec![0.0; count * m * n];
    k.download(k.view(&c), &mut got);
    let mut want = vec![0.0f32; count * m * n];
    for j in 0..count {
        for r in 0..m {
            for col in 0..n {
                let dot: f64 = (0..kk)
                    .map(|i| {
                        f64::from(ha[j * m * kk + r * kk + i])
                            * f64::from(hb[j * n * kk + col * kk + i])
                    })
                    .sum();
                want[j * m * n + r * n + col] = (0.5 * dot) as f32;
            }
        }
    }
    store.round_slice(&mut want);
    let scale = want.iter().fold(0.0f64, |s, &x| s.max(f64::from(x.abs())));
    let worst = got
        .iter()
        .zip(&want)
        .fold(0.0f64, |w, (&g, &x)| w.max(f64::from((g - x).abs())));
    let error = if got.iter().all(|x| x.is_finite()) {
        worst / scale
    } else {
        f64::INFINITY
    };
    let tolerance = tolerance(store);
    OpCheck {
        op: "stored.gemm_batched_f32".into(),
        store,
        error,
        tolerance,
        ok: error <= tolerance,
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

/// A captured graph replayed on new inputs (`Device::begin_capture`; docs/cuda.md "CUDA
/// graphs"): a copy and a dropout captured once, then replayed for two micro-batches, each with
/// inputs written into the same buffer and its own dropout key (`Kernels::dropout_key`), against
/// the CPU's copy and dropout with that key. Exact: `graph.replay`. `None` when the device does
/// not capture (a GPU with `RECIPE_CUDA_GRAPHS=0`).
pub fn compare_graph_replay<D: Device>(k: &Kernels<D>, store: Dtype) -> Option<OpCheck> {
    let dev = k.device();
    let (n, seed, site) = (1001, 0x5eed_0000_0001, 3);
    let dropout = |base: u64| Dropout {
        p: 0.25,
        seed,
        stream: base + site,
        site,
    };
    let (mut x, mut y) = (k.alloc_stored(n), k.alloc_stored(n));
    k.write(k.view_mut(&mut x), &rand(n, 2.0, 70, store));
    k.dropout_key(seed, 1 << 40);
    if !dev.begin_capture() {
        return None;
    }
    k.copy(k.view_mut(&mut y), k.view(&x));
    k.dropout(k.view_mut(&mut y), &dropout(1 << 40));
    let id = dev.end_capture();
    let cpu = Cpu::new(1).with_store(store);
    let mut same = id.is_some();
    for (i, base) in [7u64, (1 << 33) + 5].into_iter().enumerate() {
        let xi = rand(n, 2.0, 71 + i as u64, store);
        k.write(k.view_mut(&mut x), &xi);
        k.dropout_key(seed, base);
        same &= id.is_some_and(|id| dev.launch_graph(id));
        let mut got = vec![0.0; n];
        k.download(k.view(&y), &mut got);
        let mut want = xi;
        cpu.dropout(&mut want, &dropout(base));
        same &= same_bits(&got, &want);
    }
    if let Some(id) = id {
        dev.drop_graph(id);
    }
    Some(exact("graph.replay", store, same))
}

/// A graph that waits for a parameter segment's update (`Kernels::update_aside`, on the side
/// stream; docs/cuda.md "The step beside the forward"): captured before the segment's first
/// update (a wait on an event never recorded, made in the capture), then replayed after each of
/// two updates — 16 additions into `x` queued aside — copying `x` into `y`, which must hold the
/// updated values. Without the graph's own wait node the copy would run beside the additions.
/// Exact: `graph.update_wait`. `None` when the device does not capture.
pub fn compare_update_wait<D: Device>(k: &Kernels<D>, store: Dtype) -> Option<OpCheck> {
    // A segment index no model of the self-test uses: its event is made here.
    const SEG: usize = 63;
    let dev = k.device();
    let n = 1 << 14;
    let cpu = Cpu::new(1).with_store(store);
    let (mut x, mut y, mut d) = (k.alloc(n), k.alloc(n), k.alloc(n));
    let mut want = rand(n, 2.0, 80, store);
    let step = rand(n, 0.01, 81, store);
    k.write(k.view_mut(&mut x), &want);
    k.write(k.view_mut(&mut d), &step);
    if !dev.begin_capture() {
        return None;
    }
    k.wait_update(SEG);
    k.copy(k.view_mut(&mut y), k.view(&x));
    let id = dev.end_capture();
    let mut same = id.is_some();
    for _ in 0..2 {
        k.update_aside(SEG, || {
            for _ in 0..16 {
                k.add_assign(k.view_mut(&mut x), k.view(&d));
            }
        });
        for _ in 0..16 {
            cpu.add_assign(&mut want, &step);
        }
        same &= id.is_some_and(|id| dev.launch_graph(id));
        let mut got = vec![0.0; n];
        k.download(k.view(&y), &mut got);
        same &= same_bits(&got, &want);
    }
    if let Some(id) = id {
        dev.drop_graph(id);
    }
    Some(exact("graph.update_wait", store, same))
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
    c.attention(false, false);
    c.attention(true, false);
    c.attention(true, true);
    c.cross_entropy();
    c.stored();
    c.stored_wide();
    c.out
}
