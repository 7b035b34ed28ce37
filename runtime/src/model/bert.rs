//! The BERT classifier's forward and backward, written once over [`Backend`] trait calls.
//!
//! Parameter offsets come from [`Layout`] (layout.rs); activations live in [`Acts`] (acts.rs),
//! sized per `(batch, seq)`.

use super::acts::{cls_only, pick, pooled_dense, tail_rows, Acts, EvalActs, EvalTail};
use super::layout::{bias_then_ln, qkv_grad_cols, qkv_grad_rows, LayerLayout, Layout, Lin};
use super::{BertConfig, GradSink, ParamSource};
use crate::backend::{Aside, AttnShape, Backend, Dropout, Gemm, Loss};

/// Dropout keys of one micro-batch: site `s` uses Philox stream `base + s`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Drop {
    pub seed: u64,
    pub base: u64,
    pub hidden: f32,
    pub attn: f32,
    pub head: f32,
}

impl Drop {
    fn site(&self, p: f32, s: u64) -> Option<Dropout> {
        (p > 0.0).then_some(Dropout {
            p,
            seed: self.seed,
            stream: self.base + s,
            site: s,
        })
    }
}

/// Dropout sites: 0 embeddings; per layer 1 + 3l (attention probs), 2 + 3l (attention output),
/// 3 + 3l (feed-forward output); 1 + 3L the classifier head.
const fn site_layer(l: usize, k: u64) -> u64 {
    1 + 3 * l as u64 + k
}

/// `out[n × oc] = inp[n × ic] · wᵀ + b`, `inp` rows `lda` apart.
#[allow(clippy::too_many_arguments)]
fn linear_fwd<B: Backend>(
    be: &B,
    mut out: B::ViewMut<'_>,
    inp: B::View<'_>,
    p: B::View<'_>,
    l: Lin,
    n: usize,
    lda: usize,
) {
    linear_gemm(be, &mut out, inp, p, l, n, lda, true);
    be.bias_epilogue(out, be.sub(p, l.b()), n, l.out);
}

/// `out[n × oc] = inp[n × ic] · wᵀ`, the bias left to the caller: [`Backend::add_bias`], or a
/// fused epilogue ([`Backend::bias_dropout_add`], [`Backend::bias_gelu`]) when `to_epilogue`
/// ([`Backend::gemm_to_epilogue`]).
#[allow(clippy::too_many_arguments)]
fn linear_gemm<B: Backend>(
    be: &B,
    out: &mut B::ViewMut<'_>,
    inp: B::View<'_>,
    p: B::View<'_>,
    l: Lin,
    n: usize,
    lda: usize,
    to_epilogue: bool,
) {
    let g = Gemm {
        lda,
        ..Gemm::dense(n, l.out, l.inp, false, true, 0.0)
    };
    let (w, c) = (be.sub(p, l.w()), be.sub_mut(out, 0..n * l.out));
    if to_epilogue {
        be.gemm_to_epilogue(&g, inp, w, c);
    } else {
        be.gemm(&g, inp, w, c);
    }
}

/// Linear backward: accumulates `dW += doutᵀ·inp`, left unrounded for the caller to round with
/// the rest of its segment's gradients ([`Backend::gemm_to_epilogue`], then
/// [`Backend::round_stored`] over the segment), and,
/// when `with_db`, `db += Σ dout`; with
/// `dinp = Some((buf, beta, ldc, to_epilogue))` also `dinp = dout·W + beta·dinp` (rows `ldc`
/// apart), left for a kernel that rounds it when `to_epilogue` ([`Backend::gemm_to_epilogue`]:
/// `beta` 0, rows dense). The two GEMMs run back to back, the bias's sum after them: a GPU
/// that packs its operands to fp16/bf16 reads `dout`'s packed copy twice
/// (`backend/cuda/memo.rs`). The weight gradient's GEMM goes [`Backend::aside`], beside the
/// input gradient's and what follows: the returned ticket orders a later write of `dout` or
/// `inp` after it ([`Backend::wait_aside`]); the segment's rounding goes aside after it.
#[allow(clippy::too_many_arguments)]
#[must_use = "a later write of `dout` or `inp` waits for the weight gradient's GEMM"]
fn linear_bwd<B: Backend>(
    be: &B,
    dinp: Option<(B::ViewMut<'_>, f32, usize, bool)>,
    grads: &mut B::ViewMut<'_>,
    dout: B::View<'_>,
    inp: B::View<'_>,
    p: B::View<'_>,
    l: Lin,
    n: usize,
    lda: usize,
    with_db: bool,
) -> Aside {
    let weights = be.aside(|| {
        let mut gw = be.sub_mut(grads, l.w());
        let g = Gemm {
            ldb: lda,
            ..Gemm::dense(l.out, l.inp, n, true, false, 1.0)
        };
        be.gemm_to_epilogue(&g, dout, inp, be.sub_mut(&mut gw, 0..l.out * l.inp));
    });
    if let Some((d, beta, ldc, to_epilogue)) = dinp {
        let g = Gemm {
            ldc,
            ..Gemm::dense(n, l.inp, l.out, false, false, beta)
        };
        if to_epilogue && beta == 0.0 && ldc == l.inp {
            be.gemm_to_epilogue(&g, dout, be.sub(p, l.w()), d);
        } else {
            be.gemm(&g, dout, be.sub(p, l.w()), d);
        }
    }
    if with_db {
        be.bias_grad(be.sub_mut(grads, l.b()), dout, n, l.out);
    }
    weights
}

/// The forward pass; leaves logits in `a.logits` and everything the backward needs in `a`.
pub(crate) fn forward<B: Backend, W: ParamSource<B>>(
    be: &B,
    c: &BertConfig,
    lay: &Layout,
    src: &mut W,
    a: &mut Acts<B>,
    drop: Option<Drop>,
) -> Result<(), W::Error> {
    let (bsz, t) = (a.batch, a.seq);
    let n = bsz * t;
    let (h, eps) = (c.hidden_size, c.layer_norm_eps as f32);
    let shape = AttnShape {
        batch: bsz,
        seq: t,
        heads: c.num_attention_heads,
        head_dim: c.head_dim(),
    };
    let site = |p: fn(&Drop) -> f32, s: u64| drop.and_then(|d| d.site(p(&d), s));

    let p = src.fetch(0)?;
    be.embedding_fwd(
        be.view_mut(&mut a.emb_sum),
        &a.ids,
        &a.types,
        be.sub(p, lay.word..lay.pos),
        be.sub(p, lay.pos..lay.typ),
        be.sub(p, lay.typ..lay.emb_end),
        bsz,
        t,
        h,
    );
    be.layernorm_fwd(
        be.view_mut(&mut a.hs[0]),
        be.view_mut(&mut a.emb_mean),
        be.view_mut(&mut a.emb_rstd),
        be.view(&a.emb_sum),
        be.sub(p, lay.emb_ln.w()),
        be.sub(p, lay.emb_ln.b()),
        n,
        h,
        eps,
    );
    src.release(0)?;
    if let Some(d) = site(|d| d.hidden, 0) {
        be.dropout(be.view_mut(&mut a.hs[0]), &d);
    }

    let layers = lay.layers.len();
    for (l, (ll, la)) in lay.layers.iter().zip(a.layers.iter_mut()).enumerate() {
        let p = src.fetch(1 + l)?;
        let (before, after) = a.hs.split_at_mut(l + 1);
        let x = be.view(&before[l]);
        let y = &mut after[0];
        let ad = site(|d| d.attn, site_layer(l, 0));
        // The dropped probabilities, unless the backward draws the mask again.
        if ad.is_some() && la.probs_drop.is_none() && !be.attention_redraws_dropout(shape) {
            la.probs_drop = Some(be.alloc_stored(bsz * shape.heads * t * t));
        }
        self_attention(
            be,
            ll,
            p,
            x,
            &mut la.qkv,
            (
                be.view_mut(&mut la.ctx),
                be.view_mut(&mut la.probs),
                match (&ad, la.probs_drop.as_mut()) {
                    (Some(_), Some(pd)) => Some(be.view_mut(pd)),
                    _ => None,
                },
            ),
            // The backward's scratch, idle until then: f32 room for the scores.
            Some(be.view_mut(&mut a.dscratch)),
            &a.mask,
            shape,
            ad.as_ref(),
        );
        // The rest of the layer on `rows` rows: in the last layer only the [CLS] rows (row b·t),
        // the pooler's, as the evaluation forward does (`tail_rows`): their residual input
        // gathered, their context rows read t·h apart. Every kernel below treats rows
        // independently, so those rows are what the whole matrix's would be, but for the
        // dropout draws: the two sites below draw by the gathered matrix's element index (row
        // b's mask is the full matrix's row b's, not row b·t's), other bits of the same
        // distribution than a pass over every row (docs/cuda.md, "Not yet timed").
        let rows = tail_rows(layers, l, bsz, t);
        let (x, ld_ctx) = if !cls_only(layers, l, t) {
            (x, h)
        } else {
            be.copy_rows(be.view_mut(&mut a.cls), x, bsz, h, h, t * h);
            (be.view(&a.cls), t * h)
        };
        // res1 = dropout(ctx · Woᵀ + b) + x: the GEMM, then one fused pass.
        linear_gemm(
            be,
            &mut be.view_mut(&mut la.res1),
            be.view(&la.ctx),
            p,
            ll.o,
            rows,
            ld_ctx,
            true,
        );
        // x1 = LN1(res1), in the same pass.
        be.bias_dropout_add_layernorm(
            &mut la.res1,
            be.sub(p, ll.o.b()),
            site(|d| d.hidden, site_layer(l, 1)).as_ref(),
            x,
            (
                be.view_mut(&mut la.x1),
                be.view_mut(&mut la.mean1),
                be.view_mut(&mut la.rstd1),
            ),
            be.sub(p, ll.ln1.w()),
            be.sub(p, ll.ln1.b()),
            rows,
            h,
            eps,
        );
        let im = c.intermediate_size;
        linear_gemm(
            be,
            &mut be.view_mut(&mut la.inter),
            be.view(&la.x1),
            p,
            ll.inter,
            rows,
            h,
            true,
        );
        be.bias_gelu(
            &mut la.inter,
            &mut la.act,
            be.sub(p, ll.inter.b()),
            rows,
            im,
        );
        linear_gemm(
            be,
            &mut be.view_mut(&mut la.res2),
            be.view(&la.act),
            p,
            ll.out,
            rows,
            im,
            true,
        );
        be.bias_dropout_add_layernorm(
            &mut la.res2,
            be.sub(p, ll.out.b()),
            site(|d| d.hidden, site_layer(l, 2)).as_ref(),
            be.view(&la.x1),
            (
                be.view_mut(y),
                be.view_mut(&mut la.mean2),
                be.view_mut(&mut la.rstd2),
            ),
            be.sub(p, ll.ln2.w()),
            be.sub(p, ll.ln2.b()),
            rows,
            h,
            eps,
        );
        src.release(1 + l)?;
    }

    // Pooler on the [CLS] rows of the last hidden state (`pooled_dense`).
    let tail = lay.tail();
    let p = src.fetch(tail)?;
    let last = be.view(&a.hs[layers]);
    linear_fwd(
        be,
        be.view_mut(&mut a.pool_pre),
        last,
        p,
        lay.pooler,
        bsz,
        if pooled_dense(layers, t) { h } else { t * h },
    );
    be.tanh_fwd(be.view_mut(&mut a.pool), be.view(&a.pool_pre));
    be.copy(be.view_mut(&mut a.pool_drop), be.view(&a.pool));
    if let Some(d) = site(|d| d.head, site_layer(c.num_hidden_layers, 0)) {
        be.dropout(be.view_mut(&mut a.pool_drop), &d);
    }
    linear_fwd(
        be,
        be.view_mut(&mut a.logits),
        be.view(&a.pool_drop),
        p,
        lay.head,
        bsz,
        h,
    );
    src.release(tail)
}

/// A layer's self-attention on `x` (`shape`'s tokens), into `out` (the context, the
/// probabilities and, with `dropout`, the dropped ones): q, k and v as one batched GEMM into
/// `qkv` (side by side, `n·h` apart), their biases added in one pass or, where the device's
/// attention adds them as it loads q, k and v ([`Backend::attention_adds_bias`]), left to it.
/// `scores` is [`Backend::attention_fwd`]'s f32 room. The training and the evaluation forward
/// both run it, so their bits agree on every backend.
#[allow(clippy::too_many_arguments)]
fn self_attention<B: Backend>(
    be: &B,
    ll: &LayerLayout,
    p: B::View<'_>,
    x: B::View<'_>,
    qkv: &mut B::Buf,
    out: (B::ViewMut<'_>, B::ViewMut<'_>, Option<B::ViewMut<'_>>),
    scores: Option<B::ViewMut<'_>>,
    mask: &B::Ids,
    shape: AttnShape,
    dropout: Option<&Dropout>,
) {
    let (n, h) = (shape.batch * shape.seq, ll.q.out);
    let ws = ll.qkv_stride();
    let g = Gemm {
        lda: ll.q.inp,
        ..Gemm::dense(n, ll.q.out, ll.q.inp, false, true, 0.0)
    };
    let w = be.sub(p, ll.q.w..ll.v.w().end);
    be.gemm_items_to_epilogue(&g, 3, [0, ws, n * h], x, w, be.view_mut(qkv));
    let b = be.sub(p, ll.qkv_biases());
    let qkv_bias = be.attention_adds_bias(shape).then_some((b, ws));
    if qkv_bias.is_none() {
        be.bias_epilogue_items(be.view_mut(qkv), b, n, h, 3, ws);
    }
    let qkv = be.view(qkv);
    let (ctx, probs, probs_drop) = out;
    be.attention_fwd(
        ctx,
        probs,
        probs_drop,
        scores,
        be.sub(qkv, 0..n * h),
        be.sub(qkv, n * h..2 * n * h),
        be.sub(qkv, 2 * n * h..3 * n * h),
        qkv_bias,
        mask,
        shape,
        dropout,
    );
}

/// The rest of an encoder layer after attention, on `rows` tokens whose attention context is
/// `ctx`'s rows `ld_ctx` apart and whose input is row `r` of `x`: `y = LN2(x1 + FFN(x1))` with
/// `x1 = LN1(x + ctx · Woᵀ)`. The same kernels in the same order as [`forward`] without dropout,
/// so every row's bits are the training forward's.
#[allow(clippy::too_many_arguments)]
fn eval_tail<B: Backend>(
    be: &B,
    c: &BertConfig,
    ll: &LayerLayout,
    p: B::View<'_>,
    a: &mut EvalTail<B>,
    ctx: B::View<'_>,
    x: B::View<'_>,
    y: B::ViewMut<'_>,
    rows: usize,
    ld_ctx: usize,
) {
    let (h, im, eps) = (c.hidden_size, c.intermediate_size, c.layer_norm_eps as f32);
    let (nh, ni) = (rows * h, rows * im);
    // The training forward's fused epilogues, on buffers of exactly these rows.
    linear_gemm(
        be,
        &mut be.range_mut(&mut a.res, 0..nh),
        ctx,
        p,
        ll.o,
        rows,
        ld_ctx,
        true,
    );
    be.bias_dropout_add_layernorm(
        &mut a.res,
        be.sub(p, ll.o.b()),
        None,
        be.sub(x, 0..nh),
        (
            be.range_mut(&mut a.x1, 0..nh),
            be.view_mut(&mut a.mean),
            be.view_mut(&mut a.rstd),
        ),
        be.sub(p, ll.ln1.w()),
        be.sub(p, ll.ln1.b()),
        rows,
        h,
        eps,
    );
    linear_gemm(
        be,
        &mut be.range_mut(&mut a.inter, 0..ni),
        be.view(&a.x1),
        p,
        ll.inter,
        rows,
        h,
        true,
    );
    be.bias_gelu(&mut a.inter, &mut a.act, be.sub(p, ll.inter.b()), rows, im);
    linear_gemm(
        be,
        &mut be.range_mut(&mut a.res, 0..nh),
        be.view(&a.act),
        p,
        ll.out,
        rows,
        im,
        true,
    );
    be.bias_dropout_add_layernorm(
        &mut a.res,
        be.sub(p, ll.out.b()),
        None,
        be.sub(be.view(&a.x1), 0..nh),
        (y, be.view_mut(&mut a.mean), be.view_mut(&mut a.rstd)),
        be.sub(p, ll.ln2.w()),
        be.sub(p, ll.ln2.b()),
        rows,
        h,
        eps,
    );
}

/// The evaluation forward (no dropout): the logits of [`forward`] bit for bit, leaving them in
/// `a.logits`, with one layer's buffers instead of every layer's. The last layer runs its
/// attention output and feed-forward on the `[CLS]` rows only: nothing else reaches the pooler,
/// and every kernel treats rows independently, so those rows come out the same.
pub(crate) fn forward_eval<B: Backend, W: ParamSource<B>>(
    be: &B,
    c: &BertConfig,
    lay: &Layout,
    src: &mut W,
    a: &mut EvalActs<B>,
) -> Result<(), W::Error> {
    let (bsz, t) = (a.batch, a.seq);
    let n = bsz * t;
    let (h, eps) = (c.hidden_size, c.layer_norm_eps as f32);
    let shape = AttnShape {
        batch: bsz,
        seq: t,
        heads: c.num_attention_heads,
        head_dim: c.head_dim(),
    };

    let p = src.fetch(0)?;
    be.embedding_fwd(
        be.view_mut(&mut a.y),
        &a.ids,
        &a.types,
        be.sub(p, lay.word..lay.pos),
        be.sub(p, lay.pos..lay.typ),
        be.sub(p, lay.typ..lay.emb_end),
        bsz,
        t,
        h,
    );
    be.layernorm_fwd(
        be.view_mut(&mut a.x),
        be.view_mut(&mut a.tail.mean),
        be.view_mut(&mut a.tail.rstd),
        be.view(&a.y),
        be.sub(p, lay.emb_ln.w()),
        be.sub(p, lay.emb_ln.b()),
        n,
        h,
        eps,
    );
    src.release(0)?;

    let layers = lay.layers.len();
    for (l, ll) in lay.layers.iter().enumerate() {
        let p = src.fetch(1 + l)?;
        let x = be.view(&a.x);
        self_attention(
            be,
            ll,
            p,
            x,
            &mut a.qkv,
            (be.view_mut(&mut a.ctx), be.view_mut(&mut a.probs), None),
            a.scores.as_mut().map(|s| be.view_mut(s)),
            &a.mask,
            shape,
            None,
        );
        let ctx = be.view(&a.ctx);
        if l + 1 < layers {
            eval_tail(
                be,
                c,
                ll,
                p,
                &mut a.tail,
                ctx,
                x,
                be.view_mut(&mut a.y),
                n,
                h,
            );
        } else {
            // Only the [CLS] rows (row b·t) reach the pooler: gather their residual input and
            // read their context rows t·h apart.
            for b in 0..bsz {
                let row = be.sub(x, b * t * h..b * t * h + h);
                be.copy(be.range_mut(&mut a.cls, b * h..(b + 1) * h), row);
            }
            let y = be.range_mut(&mut a.y, 0..bsz * h);
            eval_tail(
                be,
                c,
                ll,
                p,
                &mut a.cls_tail,
                ctx,
                be.view(&a.cls),
                y,
                bsz,
                t * h,
            );
        }
        std::mem::swap(&mut a.x, &mut a.y);
        src.release(1 + l)?;
    }

    // Pooler on the [CLS] rows, compacted by the last layer (all rows when there are no layers).
    let tail = lay.tail();
    let p = src.fetch(tail)?;
    let ld = if layers > 0 { h } else { t * h };
    linear_fwd(
        be,
        be.view_mut(&mut a.pool_pre),
        be.view(&a.x),
        p,
        lay.pooler,
        bsz,
        ld,
    );
    be.tanh_fwd(be.view_mut(&mut a.pool), be.view(&a.pool_pre));
    linear_fwd(
        be,
        be.view_mut(&mut a.logits),
        be.view(&a.pool),
        p,
        lay.head,
        bsz,
        h,
    );
    src.release(tail)
}

/// The backward pass after [`forward`] with the same `drop`: returns the mean cross-entropy (on a
/// device still queued: [`Backend::loss`] reads it) and accumulates
/// `loss_weight · d(mean loss)/dθ` into `grads`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn backward<B, W, G, E>(
    be: &B,
    c: &BertConfig,
    lay: &Layout,
    src: &mut W,
    a: &mut Acts<B>,
    drop: Option<Drop>,
    loss_weight: f32,
    sink: &mut G,
) -> Result<Loss, E>
where
    B: Backend,
    W: ParamSource<B>,
    G: GradSink<B>,
    E: From<W::Error> + From<G::Error>,
{
    let (bsz, t) = (a.batch, a.seq);
    let n = bsz * t;
    let (h, im) = (c.hidden_size, c.intermediate_size);
    let layers = c.num_hidden_layers;
    let shape = AttnShape {
        batch: bsz,
        seq: t,
        heads: c.num_attention_heads,
        head_dim: c.head_dim(),
    };
    let site = |p: fn(&Drop) -> f32, s: u64| drop.and_then(|d| d.site(p(&d), s));

    // Read back after the backward is queued: a device waits for the pass once, at its end.
    let loss = be.cross_entropy_queued(
        be.view_mut(&mut a.dlogits),
        be.view(&a.logits),
        &a.labels,
        bsz,
        lay.head.out,
        loss_weight,
    );
    let tail = lay.tail();
    {
        let p = src.fetch(tail)?;
        let sink_rounds = sink.rounds(tail);
        let mut g = sink.fetch(tail)?;
        // Neither weight gradient's inputs (a.dlogits, a.pool_drop; a.dpool2, the last hidden
        // states) are written again in the pass.
        let _ = linear_bwd(
            be,
            Some((be.view_mut(&mut a.dpool), 0.0, h, false)),
            &mut g,
            be.view(&a.dlogits),
            be.view(&a.pool_drop),
            p,
            lay.head,
            bsz,
            h,
            true,
        );
        if let Some(d) = site(|d| d.head, site_layer(layers, 0)) {
            be.dropout(be.view_mut(&mut a.dpool), &d);
        }
        be.tanh_bwd(
            be.view_mut(&mut a.dpool2),
            be.view(&a.pool),
            be.view(&a.dpool),
        );
        // Only the [CLS] rows receive a gradient from the pooler: the last layer's own
        // (`pooled_dense`), or rows b·t of the last hidden state, the others zero.
        let (dy, ld) = if pooled_dense(layers, t) {
            (&mut a.cls_grads.dy, h)
        } else {
            be.zero(be.view_mut(&mut a.dx));
            (&mut a.dx, t * h)
        };
        let _ = linear_bwd(
            be,
            Some((be.view_mut(dy), 0.0, ld, false)),
            &mut g,
            be.view(&a.dpool2),
            be.view(&a.hs[layers]),
            p,
            lay.pooler,
            bsz,
            ld,
            true,
        );
        // The segment's weight gradients, left unrounded by `linear_bwd`, in one pass, aside
        // after their GEMMs (a sink that reads them joins first), unless the sink rounds them
        // in a pass of its own.
        if !sink_rounds {
            let _ = be.aside(|| be.round_stored(g));
        }
    }
    src.release(tail)?;
    sink.done(tail)?;

    // The layer above's aside work, in the side stream's order (a ticket covers every aside
    // call before it): its first LayerNorm backward's sums over the rows, the feed-forward's
    // two weight gradients, the second LayerNorm backward's sums, the attention output's weight
    // gradient, q, k and v's, their biases' sums, then the rounding. This layer writes again
    // what it reads: a.dres and a.dx1 first (its first LayerNorm backward), so that waits for
    // the attention output's weight gradient (`above`), which covers the feed-forward input's
    // before gelu_bwd writes a.dinter; q, k and v's weight gradients, their biases' sums and
    // the rounding (a.dqkv) are covered by this layer's own wait before its second LayerNorm
    // backward, queued after them, before the attention backward writes a.dqkv. So the layer
    // above's last GEMMs and sums run beside this layer's first kernels (tests/fake_cuda.rs's
    // lazy schedules find any write that overtakes them).
    let mut above = Aside::DONE;
    for l in (0..layers).rev() {
        let (ll, la) = (&lay.layers[l], &a.layers[l]);
        // The attention output's and feed-forward's rows (`tail_rows`): in the last layer the
        // [CLS] rows only, whose gradients are `a.cls_grads`'s (the full-height buffers' in the
        // other layers), their context rows t·h apart in la.ctx and a.dctx.
        let cls = cls_only(layers, l, t);
        let rows = tail_rows(layers, l, bsz, t);
        let ld_ctx = if cls { t * h } else { h };
        let cg = &mut a.cls_grads;
        {
            let p = src.fetch(1 + l)?;
            let sink_rounds = sink.rounds(1 + l);
            let mut g = sink.fetch(1 + l)?;
            // dy (a.dx, or cls_grads.dy in the last layer) holds d(output of layer l).
            {
                // d(res2): kept for the residual (dx1), dropped for the feed-forward, whose
                // output linear's bias gradient is summed in the same pass.
                let mut gl = be.sub_mut(&mut g, bias_then_ln(ll.out, ll.ln2));
                let (dl, mut gln) = be.split_at_mut(&mut gl, h);
                let (dw, db) = be.split_at_mut(&mut gln, h);
                let d = site(|d| d.hidden, site_layer(l, 2));
                be.wait_aside(above);
                // Its sums over the rows (dw, db, the bias's) may go aside, reading dy,
                // la.res2 and dres: the attention block's LayerNorm backward, which writes
                // a.dx and dres again, waits for `out_weights`, queued after them.
                let _ = be.layernorm_bwd_split_bias_grad(
                    (
                        pick(cls, &mut cg.dres, &mut a.dres),
                        pick(cls, &mut cg.dx1, &mut a.dx1),
                        d.as_ref(),
                    ),
                    (dw, db, dl),
                    be.view(if cls { &cg.dy } else { &a.dx }),
                    be.view(&la.res2),
                    be.sub(p, ll.ln2.w()),
                    be.view(&la.mean2),
                    be.view(&la.rstd2),
                    rows,
                    h,
                );
            }
            // Its weight gradient reads dres, which the attention block's LayerNorm below
            // writes again: that waits for it.
            let out_weights = linear_bwd(
                be,
                Some((
                    be.view_mut(pick(cls, &mut cg.dact, &mut a.dact)),
                    0.0,
                    im,
                    true,
                )),
                &mut g,
                be.view(if cls { &cg.dres } else { &a.dres }),
                be.view(&la.act),
                p,
                ll.out,
                rows,
                im,
                false,
            );
            // d(act) straight from its GEMM: gelu_bwd rounds it; the intermediate linear's bias
            // gradient in the same pass; and the bias added again to la.inter where bias_gelu
            // left it out.
            let inter_bias = be.gelu_bwd_adds_bias().then(|| be.sub(p, ll.inter.b()));
            be.gelu_bwd_bias_grad(
                pick(cls, &mut cg.dinter, &mut a.dinter),
                be.view(&la.inter),
                inter_bias,
                be.view(if cls { &cg.dact } else { &a.dact }),
                be.sub_mut(&mut g, ll.inter.b()),
                rows,
                im,
            );
            // Its inputs: dinter (written again by the next layer's gelu_bwd, after `above`)
            // and la.x1.
            let _ = linear_bwd(
                be,
                Some((
                    be.view_mut(pick(cls, &mut cg.dx1, &mut a.dx1)),
                    1.0,
                    h,
                    false,
                )),
                &mut g,
                be.view(if cls { &cg.dinter } else { &a.dinter }),
                be.view(&la.x1),
                p,
                ll.inter,
                rows,
                h,
                false,
            );
            {
                // Residual: d(layer input) starts as d(res1) (a.dx; the q/k/v paths add to it
                // below), dropped for the attention output, whose linear's bias gradient is
                // summed in the same pass.
                let mut gl = be.sub_mut(&mut g, bias_then_ln(ll.o, ll.ln1));
                let (dl, mut gln) = be.split_at_mut(&mut gl, h);
                let (dw, db) = be.split_at_mut(&mut gln, h);
                let d = site(|d| d.hidden, site_layer(l, 1));
                be.wait_aside(out_weights);
                // Its sums aside read dx1, la.res1 and dres: the next layer's first LayerNorm
                // backward, which writes a.dx1 and a.dres again, waits for `above`, queued
                // after them.
                let _ = be.layernorm_bwd_split_bias_grad(
                    (
                        pick(cls, &mut cg.dres, &mut a.dres),
                        pick(cls, &mut cg.dx, &mut a.dx),
                        d.as_ref(),
                    ),
                    (dw, db, dl),
                    be.view(if cls { &cg.dx1 } else { &a.dx1 }),
                    be.view(&la.res1),
                    be.sub(p, ll.ln1.w()),
                    be.view(&la.mean1),
                    be.view(&la.rstd1),
                    rows,
                    h,
                );
            }
            if cls {
                // Every row's gradient for the attention below: the [CLS] rows' residual
                // gradient scattered to rows b·t of a.dx, and the output projection's input
                // gradient written to rows b·t of a.dctx; the other rows zero (what the whole
                // matrix's backward would give them). Neither buffer is read by work queued
                // before (the pass's first layer).
                be.zero(be.view_mut(&mut a.dx));
                be.copy_rows(be.view_mut(&mut a.dx), be.view(&cg.dx), bsz, h, t * h, h);
                be.zero(be.view_mut(&mut a.dctx));
            }
            // Its inputs: dres (written again by the next layer's first LayerNorm backward,
            // which waits) and la.ctx.
            let attn_out = linear_bwd(
                be,
                Some((be.view_mut(&mut a.dctx), 0.0, ld_ctx, false)),
                &mut g,
                be.view(if cls { &cg.dres } else { &a.dres }),
                be.view(&la.ctx),
                p,
                ll.o,
                rows,
                ld_ctx,
                false,
            );
            let ad = site(|d| d.attn, site_layer(l, 0));
            let qm = ll.qkv_matrix();
            let (o, kq) = (qkv_grad_rows(h), qkv_grad_cols(h));
            {
                let qkv = be.view(&la.qkv);
                be.attention_bwd(
                    be.view_mut(&mut a.dqkv),
                    o,
                    be.view_mut(&mut a.dscratch),
                    be.view(&a.dctx),
                    be.sub(qkv, 0..n * h),
                    be.sub(qkv, n * h..2 * n * h),
                    be.sub(qkv, 2 * n * h..3 * n * h),
                    // As the forward (the same shape): the biases it added as it loaded them.
                    be.attention_adds_bias(shape)
                        .then(|| (be.sub(p, ll.qkv_biases()), ll.qkv_stride())),
                    be.view(&la.probs),
                    match (&ad, la.probs_drop.as_ref()) {
                        (Some(_), Some(pd)) => Some(be.view(pd)),
                        _ => None,
                    },
                    shape,
                    ad.as_ref(),
                );
            }
            let x = be.view(&a.hs[l]);
            // The key bias has an exactly zero gradient (adding a constant to every score of a query
            // row leaves its softmax unchanged); summing dk would only produce rounding noise, which
            // Adam's normalisation would turn into a random walk. So it is not accumulated.
            // The three weight gradients as one GEMM over the rows of dq, dk and dv
            // (`qkv_matrix`; left unrounded, as `linear_bwd` leaves them; aside, as its weight
            // gradients, reading a.dqkv, which the next layer's attention backward writes again
            // after waits that cover it, and the layer's input), then d(x) += [dq dk dv]·W, one
            // GEMM too (`linear_bwd`'s input gradients), then the biases' sums.
            let (ws, dqkv) = (ll.qkv_stride(), be.view(&a.dqkv));
            let _ = be.aside(|| {
                let gw = Gemm {
                    lda: o.ld,
                    ..Gemm::dense(kq, h, n, true, false, 1.0)
                };
                be.gemm_to_epilogue(&gw, dqkv, x, be.sub_mut(&mut g, qm.clone()));
            });
            let gx = Gemm {
                lda: o.ld,
                ..Gemm::dense(n, h, kq, false, false, 1.0)
            };
            be.gemm(&gx, dqkv, be.sub(p, qm), be.view_mut(&mut a.dx));
            // q's and v's biases in one call: dq's and dv's columns, their biases two strides
            // apart; aside, as the weight gradients that read dqkv.
            let _ = be.aside(|| {
                be.bias_grad_items(
                    be.sub_mut(&mut g, ll.qkv_biases()),
                    dqkv,
                    n,
                    h,
                    o.ld,
                    2,
                    o.cols[2],
                    2 * ws,
                )
            });
            // The layer's six weight gradients, left unrounded by `linear_bwd`, in one pass,
            // aside after their GEMMs (the biases' and LayerNorms' are rounded already, and
            // stay as they are; a sink that reads them joins first), unless the sink rounds
            // them in a pass of its own.
            if !sink_rounds {
                let _ = be.aside(|| be.round_stored(g));
            }
            above = attn_out;
        }
        src.release(1 + l)?;
        sink.done(1 + l)?;
    }

    if let Some(d) = site(|d| d.hidden, 0) {
        be.dropout(be.view_mut(&mut a.dx), &d);
    }
    {
        let p = src.fetch(0)?;
        let mut g = sink.fetch(0)?;
        {
            let mut gl = be.sub_mut(&mut g, lay.emb_ln.wb());
            let (dw, db) = be.split_at_mut(&mut gl, h);
            // It writes a.dres, which the first layer's attention output gradient reads. Its
            // sums aside read a.dx and a.emb_sum, which nothing writes again before the
            // backward's final join.
            be.wait_aside(above);
            let _ = be.layernorm_bwd(
                be.view_mut(&mut a.dres),
                dw,
                db,
                be.view(&a.dx),
                be.view(&a.emb_sum),
                be.sub(p, lay.emb_ln.w()),
                be.view(&a.emb_mean),
                be.view(&a.emb_rstd),
                n,
                h,
            );
        }
        let mut ge = be.sub_mut(&mut g, lay.word..lay.emb_end);
        let (dword, mut rest) = be.split_at_mut(&mut ge, lay.pos - lay.word);
        let (dpos, dtyp) = be.split_at_mut(&mut rest, lay.typ - lay.pos);
        be.embedding_bwd(
            dword,
            dpos,
            dtyp,
            be.view(&a.dres),
            &a.ids,
            &a.types,
            bsz,
            t,
            h,
        );
    }
    src.release(0)?;
    sink.done(0)?;
    // Whoever reads the gradients next (the optimizer's norm, a sum) finds them done.
    be.join_aside();
    Ok(loss)
}
