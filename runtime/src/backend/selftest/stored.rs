//! The checks of buffers a backend may keep in 16 bits (`stored.*`, `stored.wide.*`): written,
//! read by kernels and GEMMs, and read back, at odd shapes and at BERT-base's widths where the
//! vectorised and fused kernels run.

use super::*;

impl<B: Backend> Checker<'_, B> {
    /// A buffer the backend may keep in 16 bits ([`Backend::alloc_stored`]) through its life:
    /// written from the host into a part of it, written by a kernel (`gelu_bwd`), read by
    /// kernels (`bias_grad`) and by GEMMs as either operand, and read back.
    pub(super) fn stored(&mut self) {
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
    pub(super) fn stored_wide(&mut self) {
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
    pub(super) fn layernorm_round_trip(
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
