//! The activations a training micro-batch saves for its backward ([`Acts`], per encoder layer
//! [`LayerActs`]) and the evaluation forward's ([`EvalActs`]), sized per `(batch, seq)` and
//! regrown only for a longer batch; which rows the last layer keeps ([`tail_rows`]).

use super::layout::qkv_grad_rows;
use super::BertConfig;
use crate::backend::{AttnShape, Backend};

/// Activations of one encoder layer, saved by the forward for the backward.
pub(crate) struct LayerActs<B: Backend> {
    /// q, k and v one after another, `n·h` each: the three projections' one batched GEMM
    /// writes them ([`Backend::gemm_items_to_epilogue`]).
    pub(super) qkv: B::Buf,
    pub(super) probs: B::Buf,
    /// The dropped probabilities, with attention dropout where the device does not draw the
    /// mask again in the backward ([`Backend::attention_redraws_dropout`]).
    pub(super) probs_drop: Option<B::Buf>,
    pub(super) ctx: B::Buf,
    pub(super) res1: B::Buf,
    pub(super) mean1: B::Buf,
    pub(super) rstd1: B::Buf,
    pub(super) x1: B::Buf,
    /// The feed-forward's pre-activation: with its bias, or without it where the backend's
    /// `bias_gelu` leaves it out and its backward adds it again
    /// ([`Backend::gelu_bwd_adds_bias`]).
    pub(super) inter: B::Buf,
    pub(super) act: B::Buf,
    pub(super) res2: B::Buf,
    pub(super) mean2: B::Buf,
    pub(super) rstd2: B::Buf,
}

/// Every buffer of one forward + backward at a fixed `(batch, seq)`. The layers' outputs (`hs`),
/// the sums LayerNorm reads (`emb_sum`, `res1`, `res2`), the attention block's LayerNorm output
/// (`x1`), the FFN's activations (`inter`, `act`) and their gradients (`dact`, `dinter`),
/// attention's token tensors (`qkv`, `ctx`), their gradients (`dctx`, `dqkv`),
/// its probabilities (`probs`, `probs_drop`; the scores go to `dscratch` first) and the residual
/// stream's gradients (`dx`, `dx1`, `dres`) are
/// [`Backend::alloc_stored`]: only rounded values reach them (a GEMM writing one rounds as its
/// epilogue would), so a device storing fp16/bf16 keeps them in 16 bits (docs/cuda.md, "16-bit
/// buffers").
///
/// The last layer runs its attention output and feed-forward on the `[CLS]` rows only
/// ([`forward`]): its `res1`, `x1`, `inter`, `act`, `res2` and statistics, the last hidden
/// state (`hs[L]`) and the backward's gradients of that part ([`ClsGrads`]) have `batch` rows.
pub(crate) struct Acts<B: Backend> {
    pub batch: usize,
    pub seq: usize,
    pub(super) ids: B::Ids,
    pub(super) types: B::Ids,
    pub(super) mask: B::Ids,
    pub(super) labels: B::Ids,
    pub(super) emb_sum: B::Buf,
    pub(super) emb_mean: B::Buf,
    pub(super) emb_rstd: B::Buf,
    pub(super) hs: Vec<B::Buf>,
    pub(super) layers: Vec<LayerActs<B>>,
    pub(super) pool_pre: B::Buf,
    pub(super) pool: B::Buf,
    pub(super) pool_drop: B::Buf,
    pub logits: B::Buf,
    pub(super) dlogits: B::Buf,
    pub(super) dx: B::Buf,
    pub(super) dres: B::Buf,
    pub(super) dx1: B::Buf,
    pub(super) dctx: B::Buf,
    /// dq, dk and dv side by side in a token's row ([`qkv_grad_rows`]). The zero columns
    /// between them are zeroed when the buffer is sized and written by nothing.
    pub(super) dqkv: B::Buf,
    pub(super) dact: B::Buf,
    pub(super) dinter: B::Buf,
    pub(super) dscratch: B::Buf,
    pub(super) dpool: B::Buf,
    pub(super) dpool2: B::Buf,
    /// The last layer's input at the `[CLS]` rows (its residual), gathered by [`forward`].
    pub(super) cls: B::Buf,
    pub(super) cls_grads: ClsGrads<B>,
}

/// The backward's gradients in the last layer's `[CLS]`-rows part (`batch` rows each): the last
/// hidden state's (`dy`), its LayerNorms' outputs' and inputs' as `dres`, `dx1` and `dx` are in
/// the other layers, the feed-forward's (`dact`, `dinter`). The kernels that write them take
/// whole buffers, so these are apart from the full-height ones.
pub(super) struct ClsGrads<B: Backend> {
    pub(super) dy: B::Buf,
    pub(super) dres: B::Buf,
    pub(super) dx1: B::Buf,
    pub(super) dx: B::Buf,
    pub(super) dact: B::Buf,
    pub(super) dinter: B::Buf,
}

/// The rows of layer `l`'s attention output and feed-forward in a training pass of `bsz`
/// sequences of `t` tokens: every token's, but in the last layer the `[CLS]` rows' only, the
/// only ones the pooler reads (each kernel treats rows independently, so the `[CLS]` rows'
/// values are those of the whole matrix's; the rows left out would get a zero gradient).
pub(super) fn tail_rows(layers: usize, l: usize, bsz: usize, t: usize) -> usize {
    if cls_only(layers, l, t) {
        bsz
    } else {
        bsz * t
    }
}

/// Whether layer `l`'s attention output and feed-forward run on the `[CLS]` rows only
/// ([`tail_rows`]): in the last layer, where there are other rows.
pub(super) fn cls_only(layers: usize, l: usize, t: usize) -> bool {
    l + 1 == layers && t > 1
}

/// Whether the last hidden state, which the pooler reads, holds the `[CLS]` rows only (dense,
/// [`cls_only`]); else it holds every row, row `b·t` the `[CLS]` one (no layers, or one token).
pub(super) fn pooled_dense(layers: usize, t: usize) -> bool {
    layers > 0 && cls_only(layers, layers - 1, t)
}

/// `cls` when `in_cls`, else `all`: a [`ClsGrads`] buffer in the last layer's `[CLS]`-rows
/// part, the full-height one elsewhere.
pub(super) fn pick<'a, T>(in_cls: bool, cls: &'a mut T, all: &'a mut T) -> &'a mut T {
    if in_cls {
        cls
    } else {
        all
    }
}

impl<B: Backend> Acts<B> {
    pub(crate) fn new(be: &B, c: &BertConfig, labels: usize, batch: usize, seq: usize) -> Self {
        let z = || be.alloc(0);
        let mut a = Acts {
            batch: 0,
            seq: 0,
            ids: be.upload_ids(&[]),
            types: be.upload_ids(&[]),
            mask: be.upload_ids(&[]),
            labels: be.upload_ids(&[]),
            emb_sum: be.alloc_stored(0),
            emb_mean: z(),
            emb_rstd: z(),
            hs: (0..=c.num_hidden_layers)
                .map(|_| be.alloc_stored(0))
                .collect(),
            layers: (0..c.num_hidden_layers)
                .map(|_| LayerActs {
                    qkv: be.alloc_stored(0),
                    probs: be.alloc_stored(0),
                    probs_drop: None,
                    ctx: be.alloc_stored(0),
                    res1: be.alloc_stored(0),
                    mean1: z(),
                    rstd1: z(),
                    x1: be.alloc_stored(0),
                    inter: be.alloc_stored(0),
                    act: be.alloc_stored(0),
                    res2: be.alloc_stored(0),
                    mean2: z(),
                    rstd2: z(),
                })
                .collect(),
            pool_pre: z(),
            pool: z(),
            pool_drop: z(),
            logits: z(),
            dlogits: z(),
            dx: be.alloc_stored(0),
            dres: be.alloc_stored(0),
            dx1: be.alloc_stored(0),
            dctx: be.alloc_stored(0),
            dqkv: be.alloc_stored(0),
            dact: be.alloc_stored(0),
            dinter: be.alloc_stored(0),
            dscratch: z(),
            dpool: z(),
            dpool2: z(),
            cls: be.alloc_stored(0),
            cls_grads: ClsGrads {
                dy: be.alloc_stored(0),
                dres: be.alloc_stored(0),
                dx1: be.alloc_stored(0),
                dx: be.alloc_stored(0),
                dact: be.alloc_stored(0),
                dinter: be.alloc_stored(0),
            },
        };
        a.reshape(be, c, labels, batch, seq);
        a
    }

    /// Allocates the attention-dropout buffers now, at the current shape (the forward allocates
    /// them at its first pass with attention dropout otherwise), where the device keeps them
    /// ([`Backend::attention_redraws_dropout`]).
    pub(crate) fn reserve_dropout(&mut self, be: &B, c: &BertConfig) {
        let s = crate::backend::AttnShape {
            batch: self.batch,
            seq: self.seq,
            heads: c.num_attention_heads,
            head_dim: c.head_dim(),
        };
        if be.attention_redraws_dropout(s) {
            return;
        }
        let pp = self.batch * c.num_attention_heads * self.seq * self.seq;
        for la in &mut self.layers {
            if la.probs_drop.is_none() {
                la.probs_drop = Some(be.alloc_stored(pp));
            }
        }
    }

    /// Sizes every buffer for `(batch, seq)`, in the memory it already has when that is enough
    /// (the batches of a run are padded to their longest row, so their lengths vary: sized once
    /// for the longest, the workspace allocates nothing for the others — docs/cuda.md). The
    /// passes overwrite every value they read.
    pub(crate) fn reshape(
        &mut self,
        be: &B,
        c: &BertConfig,
        labels: usize,
        batch: usize,
        seq: usize,
    ) {
        let n = batch * seq;
        let (h, i) = (c.hidden_size, c.intermediate_size);
        let pp = batch * c.num_attention_heads * seq * seq;
        let r = |b: &mut B::Buf, len: usize| {
            be.resize(b, len);
        };
        let layers = self.layers.len();
        r(&mut self.emb_sum, n * h);
        r(&mut self.emb_mean, n);
        r(&mut self.emb_rstd, n);
        for (l, x) in self.hs.iter_mut().enumerate() {
            // hs[l] is layer l − 1's output; the embeddings' (l = 0) has every row.
            let rows = if l == 0 {
                n
            } else {
                tail_rows(layers, l - 1, batch, seq)
            };
            r(x, rows * h);
        }
        for (l, la) in self.layers.iter_mut().enumerate() {
            let rows = tail_rows(layers, l, batch, seq);
            r(&mut la.qkv, 3 * n * h);
            r(&mut la.ctx, n * h);
            for x in [&mut la.res1, &mut la.x1, &mut la.res2] {
                r(x, rows * h);
            }
            r(&mut la.probs, pp);
            if let Some(pd) = la.probs_drop.as_mut() {
                r(pd, pp);
            }
            for x in [&mut la.mean1, &mut la.rstd1, &mut la.mean2, &mut la.rstd2] {
                r(x, rows);
            }
            r(&mut la.inter, rows * i);
            r(&mut la.act, rows * i);
        }
        r(&mut self.cls, batch * h);
        let cg = &mut self.cls_grads;
        for x in [&mut cg.dy, &mut cg.dres, &mut cg.dx1, &mut cg.dx] {
            r(x, batch * h);
        }
        r(&mut cg.dact, batch * i);
        r(&mut cg.dinter, batch * i);
        for x in [
            &mut self.pool_pre,
            &mut self.pool,
            &mut self.pool_drop,
            &mut self.dpool,
            &mut self.dpool2,
        ] {
            r(x, batch * h);
        }
        r(&mut self.logits, batch * labels);
        r(&mut self.dlogits, batch * labels);
        for x in [&mut self.dx, &mut self.dres, &mut self.dx1, &mut self.dctx] {
            r(x, n * h);
        }
        r(&mut self.dqkv, n * qkv_grad_rows(h).ld);
        // The only values of a pass's buffers that no kernel writes (the zero columns of
        // `qkv_grad_rows`): zeroed here, at each new shape (a regrown buffer holds stale values).
        be.zero(be.view_mut(&mut self.dqkv));
        r(&mut self.dact, n * i);
        r(&mut self.dinter, n * i);
        r(&mut self.dscratch, pp);
        self.batch = batch;
        self.seq = seq;
    }

    /// Uploads one batch's integer inputs (already validated).
    pub(crate) fn set_inputs(
        &mut self,
        be: &B,
        ids: &[u32],
        types: &[u32],
        mask: &[u32],
        labels: &[u32],
    ) {
        // Into the same buffers while the shape holds: no allocation per micro-batch.
        be.write_ids(&mut self.ids, ids);
        be.write_ids(&mut self.types, types);
        be.write_ids(&mut self.mask, mask);
        be.write_ids(&mut self.labels, labels);
    }
}

/// Buffers of the evaluation forward ([`forward_eval`]): one layer's worth, reused by every layer,
/// since no backward follows and nothing has to be kept.
pub(crate) struct EvalActs<B: Backend> {
    pub batch: usize,
    pub seq: usize,
    pub(super) ids: B::Ids,
    pub(super) types: B::Ids,
    pub(super) mask: B::Ids,
    /// The current layer's input.
    pub(super) x: B::Buf,
    /// The embedding sum, then each layer's output (swapped with `x`).
    pub(super) y: B::Buf,
    /// q, k and v side by side, as the training pass's [`LayerActs`] `qkv`.
    pub(super) qkv: B::Buf,
    pub(super) ctx: B::Buf,
    pub(super) probs: B::Buf,
    /// The scores' f32 room, where the attention needs it
    /// ([`Backend::attention_needs_scores`]; a training pass has the backward's scratch).
    pub(super) scores: Option<B::Buf>,
    /// Every layer's but the last, on every token.
    pub(super) tail: EvalTail<B>,
    /// The last layer's, on the `[CLS]` rows (the fused epilogues take whole buffers).
    pub(super) cls_tail: EvalTail<B>,
    /// The last layer's input at the `[CLS]` rows.
    pub(super) cls: B::Buf,
    pub(super) pool_pre: B::Buf,
    pub(super) pool: B::Buf,
    pub logits: B::Buf,
}

/// Scratch of [`eval_tail`].
pub(super) struct EvalTail<B: Backend> {
    pub(super) res: B::Buf,
    pub(super) x1: B::Buf,
    pub(super) inter: B::Buf,
    pub(super) act: B::Buf,
    pub(super) mean: B::Buf,
    pub(super) rstd: B::Buf,
}

impl<B: Backend> EvalTail<B> {
    pub(super) fn new(be: &B) -> Self {
        EvalTail {
            res: be.alloc_stored(0),
            x1: be.alloc_stored(0),
            inter: be.alloc_stored(0),
            act: be.alloc_stored(0),
            mean: be.alloc(0),
            rstd: be.alloc(0),
        }
    }

    /// Sizes it for `rows` tokens, in the memory it has when that is enough.
    pub(super) fn reshape(&mut self, be: &B, rows: usize, h: usize, inter: usize) {
        for (b, len) in [
            (&mut self.res, rows * h),
            (&mut self.x1, rows * h),
            (&mut self.inter, rows * inter),
            (&mut self.act, rows * inter),
            (&mut self.mean, rows),
            (&mut self.rstd, rows),
        ] {
            be.resize(b, len);
        }
    }
}

impl<B: Backend> EvalActs<B> {
    pub(crate) fn new(be: &B, c: &BertConfig, labels: usize, batch: usize, seq: usize) -> Self {
        // Every activation a kernel stores rounded is [`Backend::alloc_stored`], as the
        // training pass's (16 bits on a GPU storing fp16/bf16), the probabilities included;
        // the f32 ones: the scores' room, the LayerNorm statistics, and the pooler's and
        // classifier's rows.
        let z = || be.alloc(0);
        let s = || be.alloc_stored(0);
        let mut a = EvalActs {
            batch: 0,
            seq: 0,
            ids: be.upload_ids(&[]),
            types: be.upload_ids(&[]),
            mask: be.upload_ids(&[]),
            x: s(),
            y: s(),
            qkv: s(),
            ctx: s(),
            probs: s(),
            scores: None,
            tail: EvalTail::new(be),
            cls_tail: EvalTail::new(be),
            cls: s(),
            pool_pre: z(),
            pool: z(),
            logits: z(),
        };
        a.reshape(be, c, labels, batch, seq);
        a
    }

    /// Sizes every buffer for `(batch, seq)` in the memory it has when that is enough, as
    /// [`Acts::reshape`].
    pub(crate) fn reshape(
        &mut self,
        be: &B,
        c: &BertConfig,
        labels: usize,
        batch: usize,
        seq: usize,
    ) {
        let n = batch * seq;
        let (h, i) = (c.hidden_size, c.intermediate_size);
        let r = |b: &mut B::Buf, len: usize| {
            be.resize(b, len);
        };
        for x in [&mut self.x, &mut self.y, &mut self.ctx] {
            r(x, n * h);
        }
        r(&mut self.qkv, 3 * n * h);
        let pp = batch * c.num_attention_heads * seq * seq;
        r(&mut self.probs, pp);
        let shape = AttnShape {
            batch,
            seq,
            heads: c.num_attention_heads,
            head_dim: c.head_dim(),
        };
        // Made when a shape needs it and kept for the shapes that do not (the reservation's
        // longest batch needs it whenever a shorter one does): no pass allocates after it.
        if be.attention_needs_scores(shape) || self.scores.is_some() {
            r(self.scores.get_or_insert_with(|| be.alloc(0)), pp);
        }
        self.tail.reshape(be, n, h, i);
        self.cls_tail.reshape(be, batch, h, i);
        for x in [&mut self.cls, &mut self.pool_pre, &mut self.pool] {
            r(x, batch * h);
        }
        r(&mut self.logits, batch * labels);
        self.batch = batch;
        self.seq = seq;
    }

    /// Uploads one batch's integer inputs (already validated).
    pub(crate) fn set_inputs(&mut self, be: &B, ids: &[u32], types: &[u32], mask: &[u32]) {
        be.write_ids(&mut self.ids, ids);
        be.write_ids(&mut self.types, types);
        be.write_ids(&mut self.mask, mask);
    }
}
