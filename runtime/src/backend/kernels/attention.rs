//! Attention as batched GEMMs around the softmax kernels of `runtime/kernels/attention.cu`.
//!
//! Each product is one [`Device::gemm_batched`] over the (sequence, head) items, reading and
//! writing a head's columns of the `[batch, seq, heads·head_dim]` tensors in place (row stride
//! `hidden`), and a head's `[seq, seq]` block of the probabilities: on a GPU, one
//! `cublasGemmBatchedEx` on the tensor cores, rather than dot products on the CUDA cores. The
//! order of operations and the rounding are the CPU backend's (`attn_fwd_one`,
//! `attn_bwd_one`): the scores and `dp` stay f32; the probabilities, the softmax backward's `ds`
//! and every `[batch, seq, hidden]` output are rounded to the storage dtype. So every product's
//! operands are stored values (`q·kᵀ`, `p·v`, `dctx·vᵀ`, `pᵀ·dctx`, `ds·k`, `dsᵀ·q`), which take
//! half operands on the tensor cores in a half-precision run. The token tensors may be 16-bit
//! buffers ([`crate::backend::Backend::alloc_stored`]): the half products read them as they are
//! and write them rounded; `ds` goes to a 16-bit buffer of the kernels' own on a device keeping
//! them ([`Kernels::with_half_ds`]), else rounded into the f32 scratch.
#![allow(clippy::too_many_arguments)]

use super::{grid_vec, int, Kernels, BLOCK};
use crate::backend::device::{Arg, Device, Launch};
use crate::backend::{AttnShape, Batch, Dropout, Gemm, QkvRows, Stride};
use crate::precision::Dtype;

/// `(1 / √head_dim)` as the CPU backend computes it.
fn score_scale(s: AttnShape) -> f32 {
    (1.0 / (s.head_dim as f64).sqrt()) as f32
}

/// Floats of a token tensor (`[batch, seq, heads·head_dim]`) and of a probability tensor
/// (`[batch, heads, seq, seq]`).
pub(super) fn sizes(s: AttnShape) -> (usize, usize) {
    (
        s.batch * s.seq * s.heads * s.head_dim,
        s.batch * s.heads * s.seq * s.seq,
    )
}

/// Nothing to compute (and a grid of zero blocks is not a launch).
fn empty(s: AttnShape) -> bool {
    s.batch == 0 || s.seq == 0 || s.heads == 0 || s.head_dim == 0
}

/// A head's rows in a token tensor, and its block of a probability tensor.
fn strides(s: AttnShape) -> (Stride, Stride) {
    let hid = s.heads * s.head_dim;
    (
        Stride {
            outer: s.seq * hid,
            inner: s.head_dim,
        },
        Stride {
            outer: s.heads * s.seq * s.seq,
            inner: s.seq * s.seq,
        },
    )
}

/// The batch of one product: an item per (sequence, head), `a`, `b` and `c` each a token
/// tensor (`false`) or a probability tensor (`true`).
fn batch(s: AttnShape, a: bool, b: bool, c: bool) -> Batch {
    let (tok, prob) = strides(s);
    let pick = |p: bool| if p { prob } else { tok };
    Batch {
        count: s.batch * s.heads,
        inner: s.heads,
        a: pick(a),
        b: pick(b),
        c: pick(c),
    }
}

/// One item's `C[m×n] = alpha · op(A)·op(B)`, each operand a head's `seq` rows of a token tensor
/// (row stride `hidden`) or its `[seq, seq]` block (row stride `seq`).
fn product(
    s: AttnShape,
    (m, n, k): (usize, usize, usize),
    (trans_a, trans_b): (bool, bool),
    (a, b, c): (bool, bool, bool),
    alpha: f32,
) -> Gemm {
    let ld = |p: bool| if p { s.seq } else { s.heads * s.head_dim };
    Gemm {
        m,
        n,
        k,
        trans_a,
        trans_b,
        lda: ld(a),
        ldb: ld(b),
        ldc: ld(c),
        alpha,
        beta: 0.0,
    }
}

/// One warp per row of `[batch, heads, seq, seq]`, [`BLOCK`] threads per block.
fn softmax_launch(s: AttnShape) -> (Launch, Arg) {
    let rows = s.batch * s.heads * s.seq;
    let per_block = BLOCK as usize / 32;
    let l = Launch {
        grid: (
            u32::try_from(rows.div_ceil(per_block)).expect("attention rows"),
            1,
            1,
        ),
        block: (BLOCK, 1, 1),
        smem: 0,
    };
    (l, int(rows))
}

/// The fused kernels' head sizes (attention.cu, `BY_HEAD`: MiniLM's 32, BERT-base's and
/// -large's 64), the most keys the short ones take (`FUSED_KEYS`; the long ones take any number,
/// `FUSED_CHUNK` at a time) and queries per block (`FUSED_Q`).
const FUSED_HEADS: [usize; 2] = [32, 64];
pub(super) const FUSED_KEYS: usize = 128;
const FUSED_Q: usize = 64;

/// Whether the forward runs as one kernel (attention.cu, `attention_fused`, or
/// `attention_fused_long` past [`FUSED_KEYS`] keys) and the backward as two: a half store whose
/// buffers (`elems`: q, k, v, ctx, probs and the dropped probabilities) are all 16-bit of its
/// type, heads of one of [`FUSED_HEADS`], a device with `mma.sync` ([`Device::has_mma`]), and
/// the kernels not told otherwise ([`Kernels::with_fused_attention`]). BERT-base and MiniLM fit
/// at any length; other head sizes take the batched GEMMs.
pub(super) fn fused<D: Device>(k: &Kernels<D>, s: AttnShape, elems: &[Dtype]) -> bool {
    k.fused_attention
        && k.store.is_half()
        && FUSED_HEADS.contains(&s.head_dim)
        && k.dev.has_mma()
        && elems.iter().all(|&e| e == k.store)
}

/// `short`, the fused kernel whose warps hold their scores in registers once, where the keys
/// fit one chunk of [`FUSED_KEYS`]; else `long`, its twin taking the keys a chunk at a time
/// (the forward in three passes over them, the backward's `dq` in two, its `dk` and `dv` a
/// chunk of queries at a time; attention.cu). Tests may take the long ones at every length
/// ([`Kernels::with_long_attention_only`]).
fn by_keys<D: Device>(
    k: &Kernels<D>,
    s: AttnShape,
    short: &'static str,
    long: &'static str,
) -> &'static str {
    if s.seq <= k.short_keys {
        short
    } else {
        long
    }
}

/// The fused kernels' `bias`, `bias_t` and `bias_stride` arguments (attention.cu, `HeadBias`):
/// q's, k's and v's biases (`heads · head_dim` each) `stride` elements apart; a null pointer for
/// none.
fn bias_args<D: Device>(
    k: &Kernels<D>,
    qkv_bias: Option<(D::View<'_>, usize)>,
    s: AttnShape,
) -> [Arg; 2] {
    match qkv_bias {
        Some((b, stride)) => {
            let hid = s.heads * s.head_dim;
            assert!(
                k.dev.len(b) >= 2 * stride + hid && stride >= hid,
                "attention q/k/v biases"
            );
            [k.typed(b), int(stride)]
        }
        None => [Arg::Typed(0, Dtype::F32), int(0)],
    }
}

/// A block per ([`FUSED_Q`] queries, head, sequence), four warps.
fn fused_launch(s: AttnShape) -> Launch {
    Launch {
        grid: (
            s.seq.div_ceil(FUSED_Q) as u32,
            u32::try_from(s.heads).expect("heads"),
            u32::try_from(s.batch).expect("batch"),
        ),
        block: (2 * FUSED_Q as u32, 1, 1),
        smem: 0,
    }
}

/// Rounds the first `n` elements of a product's output `v` to the storage dtype: an f32 buffer's
/// (a 16-bit one got its values rounded by the GEMM, [`Device::gemm_batched`]).
fn round<D: Device>(k: &Kernels<D>, mut v: D::ViewMut<'_>, n: usize) {
    if k.dev.elem(k.dev.as_view(&v)).is_half() {
        return;
    }
    let first = k.dev.sub_mut(&mut v, 0..n);
    k.round_to(first, k.store);
}

pub(super) fn fwd<D: Device>(
    k: &Kernels<D>,
    mut ctx: D::ViewMut<'_>,
    mut probs: D::ViewMut<'_>,
    probs_drop: Option<D::ViewMut<'_>>,
    mut scores: Option<D::ViewMut<'_>>,
    q: D::View<'_>,
    kk: D::View<'_>,
    v: D::View<'_>,
    qkv_bias: Option<(D::View<'_>, usize)>,
    mask: &D::Ids,
    s: AttnShape,
    dropout: Option<&Dropout>,
) {
    let dev = &k.dev;
    let (tok, pp) = sizes(s);
    assert!(dev.len_mut(&ctx) >= tok, "attention_fwd ctx");
    assert!(dev.len_mut(&probs) >= pp, "attention_fwd probs");
    for n in [dev.len(q), dev.len(kk), dev.len(v)] {
        assert!(n >= tok, "attention_fwd q/k/v");
    }
    if let Some(sc) = &scores {
        assert!(
            dev.len_mut(sc) >= pp && dev.elem(dev.as_view(sc)) == Dtype::F32,
            "attention_fwd scores: f32, the probabilities' size"
        );
    }
    if empty(s) {
        return;
    }
    if let Some(pd) = &probs_drop {
        assert!(dev.len_mut(pd) >= pp, "attention_fwd probs_drop");
    }
    // Dropout as the CPU backend applies it (both the buffer and the key given), or with the
    // key alone where the fused kernel runs: the backward draws the mask again
    // (Backend::attention_redraws_dropout).
    let mut pd = probs_drop.filter(|_| dropout.is_some());
    let (key, site, threshold, dscale) = k.dropout_args(dropout);
    let mut elems = vec![
        dev.elem(q),
        dev.elem(kk),
        dev.elem(v),
        dev.elem(dev.as_view(&ctx)),
        dev.elem(dev.as_view(&probs)),
    ];
    elems.extend(pd.as_ref().map(|b| dev.elem(dev.as_view(b))));
    let [bias, bias_stride] = bias_args(k, qkv_bias, s);
    let fused = fused(k, s, &elems);
    assert!(
        fused || dropout.is_none() || pd.is_some(),
        "attention_fwd: dropout without probs_drop needs the fused kernel \
         (Backend::attention_redraws_dropout)"
    );
    assert!(
        qkv_bias.is_none() || fused,
        "attention_fwd: only the fused kernel adds q/k/v biases (Backend::attention_adds_bias)"
    );
    assert!(
        fused || scores.is_some() || !dev.elem(dev.as_view(&probs)).is_half(),
        "attention_fwd: 16-bit probabilities need f32 room for the scores \
         (Backend::attention_needs_scores)"
    );
    if fused {
        let pd_ptr = pd.as_mut().map_or(0, |b| dev.ptr_mut(b));
        dev.launch(
            by_keys(k, s, "attention_fused", "attention_fused_long"),
            fused_launch(s),
            &[
                Arg::Ptr(dev.ptr_mut(&mut ctx)),
                Arg::Ptr(dev.ptr_mut(&mut probs)),
                Arg::Ptr(pd_ptr),
                Arg::Ptr(dev.ptr(q)),
                Arg::Ptr(dev.ptr(kk)),
                Arg::Ptr(dev.ptr(v)),
                Arg::Ptr(dev.ids_ptr(mask)),
                int(s.seq),
                int(s.heads),
                int(s.head_dim),
                Arg::F32(score_scale(s)),
                int(usize::from(dropout.is_some())),
                key,
                site,
                threshold,
                dscale,
                bias,
                bias_stride,
                k.store_arg(),
            ],
        );
        return;
    }
    let (t, d) = (s.seq, s.head_dim);
    // scores = scale · q·kᵀ, into their room or probs (which the softmax then overwrites).
    let room = match scores.as_mut() {
        Some(sc) => dev.sub_mut(sc, 0..pp),
        None => dev.sub_mut(&mut probs, 0..pp),
    };
    let scores_ptr = dev.ptr(dev.as_view(&room));
    dev.gemm_batched(
        &product(
            s,
            (t, t, d),
            (false, true),
            (false, false, true),
            score_scale(s),
        ),
        &batch(s, false, false, true),
        q,
        kk,
        room,
        k.store,
    );
    let pd_arg = pd
        .as_mut()
        .map_or(Arg::Typed(0, Dtype::F32), |b| k.typed_mut(b));
    let (l, rows) = softmax_launch(s);
    dev.launch(
        "attention_softmax",
        l,
        &[
            Arg::Ptr(scores_ptr),
            k.typed_mut(&mut probs),
            pd_arg,
            Arg::Ptr(dev.ids_ptr(mask)),
            rows,
            int(s.seq),
            int(s.heads),
            int(usize::from(pd.is_some())),
            key,
            site,
            threshold,
            dscale,
            k.store_arg(),
        ],
    );
    // ctx = used probabilities · v, then rounded.
    match &pd {
        Some(b) => probs_times(k, s, dev.as_view(b), false, v, &mut ctx),
        None => probs_times(k, s, dev.as_view(&probs), false, v, &mut ctx),
    }
    round(k, ctx, tok);
}

/// Rounds column `col`'s `heads · head_dim` wide block of every token's row of `out` (rows
/// `ld` apart) to the storage dtype: an f32 buffer's (a 16-bit one got its values rounded by
/// the GEMM, [`Device::gemm_batched`]).
fn round_cols<D: Device>(
    k: &Kernels<D>,
    out: &mut D::ViewMut<'_>,
    col: usize,
    o: QkvRows,
    s: AttnShape,
) {
    let dev = &k.dev;
    if k.store == Dtype::F32 || dev.elem(dev.as_view(out)).is_half() {
        return;
    }
    let (rows, hid) = (s.batch * s.seq, s.heads * s.head_dim);
    let p = dev.ptr_mut(&mut dev.sub_mut(out, col..col + (rows - 1) * o.ld + hid));
    dev.launch(
        "round_rows",
        grid_vec(rows * hid),
        &[Arg::Ptr(p), int(rows), int(hid), int(o.ld), k.store_arg()],
    );
}

/// A product's output into column `col` of `out`'s rows (`o.ld` apart) instead of a token
/// tensor's own: its `ldc` and its items' offsets.
fn into_rows(g: Gemm, b: Batch, o: QkvRows, s: AttnShape) -> (Gemm, Batch) {
    (
        Gemm { ldc: o.ld, ..g },
        Batch {
            c: Stride {
                outer: s.seq * o.ld,
                inner: s.head_dim,
            },
            ..b
        },
    )
}

pub(super) fn bwd<D: Device>(
    k: &Kernels<D>,
    mut dqkv: D::ViewMut<'_>,
    o: QkvRows,
    mut scratch: D::ViewMut<'_>,
    dctx: D::View<'_>,
    q: D::View<'_>,
    kk: D::View<'_>,
    v: D::View<'_>,
    qkv_bias: Option<(D::View<'_>, usize)>,
    probs: D::View<'_>,
    probs_drop: Option<D::View<'_>>,
    s: AttnShape,
    dropout: Option<&Dropout>,
) {
    let dev = &k.dev;
    let (tok, pp) = sizes(s);
    assert!(
        dev.len_mut(&dqkv) >= o.span(s.batch * s.seq, s.heads * s.head_dim),
        "attention_bwd dq/dk/dv"
    );
    assert!(dev.len_mut(&scratch) >= pp, "attention_bwd scratch");
    for n in [dev.len(dctx), dev.len(q), dev.len(kk), dev.len(v)] {
        assert!(n >= tok, "attention_bwd dctx/q/k/v");
    }
    assert!(dev.len(probs) >= pp, "attention_bwd probs");
    if empty(s) {
        return;
    }
    // As the CPU backend: dv uses probs_drop when given, and the dropout key (only its scale)
    // masks dp by the zeros of that same buffer. The fused kernels draw the forward's mask
    // again from the key instead (attention.cu): probs_drop is not read, and need not exist.
    if let Some(pd) = probs_drop {
        assert!(dev.len(pd) >= pp, "attention_bwd probs_drop");
    }
    let pd_arg = match probs_drop {
        Some(pd) => k.typed(pd),
        None => k.typed(probs),
    };
    let dscale = Arg::F32(dropout.map_or(1.0, |d| 1.0 / (1.0 - d.p)));
    let (t, d) = (s.seq, s.head_dim);
    let scale = score_scale(s);
    let elems = [
        dev.elem(dctx),
        dev.elem(q),
        dev.elem(kk),
        dev.elem(v),
        dev.elem(probs),
        dev.elem(dev.as_view(&dqkv)),
    ];
    let [bias, bias_stride] = bias_args(k, qkv_bias, s);
    assert!(
        qkv_bias.is_none() || fused(k, s, &elems),
        "attention_bwd: only the fused kernels add q/k/v biases (Backend::attention_adds_bias)"
    );
    if fused(k, s, &elems) {
        // Two launches (attention.cu, `attention_bwd_dq`, `attention_bwd_dkv`), `ds` through
        // the 16-bit scratch; the f32 scratch is not used.
        let (key, site, threshold, _) = k.dropout_args(dropout);
        let on = int(usize::from(dropout.is_some()));
        let ptrs = o.cols.map(|c| {
            let end = dev.len_mut(&dqkv);
            dev.ptr_mut(&mut dev.sub_mut(&mut dqkv, c..end))
        });
        let done = k.with_half_ds(pp, |half| {
            let Some(ds) = half else {
                return false;
            };
            let ds = dev.ptr(dev.view(ds));
            dev.launch(
                by_keys(k, s, "attention_bwd_dq", "attention_bwd_dq_long"),
                fused_launch(s),
                &[
                    Arg::Ptr(ptrs[0]),
                    Arg::Ptr(ds),
                    Arg::Ptr(dev.ptr(dctx)),
                    Arg::Ptr(dev.ptr(kk)),
                    Arg::Ptr(dev.ptr(v)),
                    Arg::Ptr(dev.ptr(probs)),
                    int(s.seq),
                    int(s.heads),
                    int(s.head_dim),
                    int(o.ld),
                    Arg::F32(scale),
                    on,
                    key,
                    site,
                    threshold,
                    dscale,
                    bias,
                    bias_stride,
                    k.store_arg(),
                ],
            );
            dev.launch(
                by_keys(k, s, "attention_bwd_dkv", "attention_bwd_dkv_long"),
                fused_launch(s),
                &[
                    Arg::Ptr(ptrs[1]),
                    Arg::Ptr(ptrs[2]),
                    Arg::Ptr(ds),
                    Arg::Ptr(dev.ptr(probs)),
                    Arg::Ptr(dev.ptr(q)),
                    Arg::Ptr(dev.ptr(dctx)),
                    int(s.seq),
                    int(s.heads),
                    int(s.head_dim),
                    int(o.ld),
                    Arg::F32(scale),
                    on,
                    key,
                    site,
                    threshold,
                    dscale,
                    bias,
                    bias_stride,
                    k.store_arg(),
                ],
            );
            true
        });
        assert!(
            done || qkv_bias.is_none(),
            "attention_bwd: q/k/v biases without the fused kernels' room"
        );
        if done {
            return;
        }
    }
    assert!(
        dropout.is_none() || probs_drop.is_some(),
        "attention_bwd: dropout without probs_drop needs the fused kernels \
         (Backend::attention_redraws_dropout)"
    );
    // dp = dctx · vᵀ, into the scratch.
    dev.gemm_batched(
        &product(s, (t, t, d), (false, true), (false, false, true), 1.0),
        &batch(s, false, false, true),
        dctx,
        v,
        dev.sub_mut(&mut scratch, 0..pp),
        k.store,
    );
    // dv = probs_dropᵀ · dctx
    let [cq, ck, cv] = o.cols;
    let end = dev.len_mut(&dqkv);
    let (g, b) = into_rows(
        product(s, (t, d, t), (true, false), (true, false, false), 1.0),
        batch(s, true, false, false),
        o,
        s,
    );
    let dv = dev.sub_mut(&mut dqkv, cv..end);
    match probs_drop {
        Some(pd) => dev.gemm_batched(&g, &b, dev.sub(pd, 0..pp), dctx, dv, k.store),
        None => dev.gemm_batched(&g, &b, dev.sub(probs, 0..pp), dctx, dv, k.store),
    }
    round_cols(k, &mut dqkv, cv, o, s);
    // ds = p ⊙ (dp − Σ_j dp·p), a stored value: into the 16-bit scratch where the device keeps
    // 16-bit buffers (read by the half products as it is, no pack), else in place.
    let (l, rows) = softmax_launch(s);
    let dp = dev.ptr_mut(&mut scratch);
    k.with_half_ds(pp, |half| {
        let ds_arg = match half {
            Some(b) => k.typed(dev.view(b)),
            None => Arg::Typed(dp, Dtype::F32),
        };
        dev.launch(
            "attention_softmax_bwd",
            l,
            &[
                Arg::Ptr(dp),
                ds_arg,
                k.typed(probs),
                pd_arg,
                rows,
                int(s.seq),
                int(usize::from(dropout.is_some())),
                dscale,
                k.store_arg(),
            ],
        );
        // dq = scale · ds · k ;  dk = scale · dsᵀ · q.
        let ds = match half {
            Some(b) => dev.sub(dev.view(b), 0..pp),
            None => dev.sub(dev.as_view(&scratch), 0..pp),
        };
        let (g, b) = into_rows(
            product(s, (t, d, t), (false, false), (true, false, false), scale),
            batch(s, true, false, false),
            o,
            s,
        );
        dev.gemm_batched(&g, &b, ds, kk, dev.sub_mut(&mut dqkv, cq..end), k.store);
        round_cols(k, &mut dqkv, cq, o, s);
        let (g, b) = into_rows(
            product(s, (t, d, t), (true, false), (true, false, false), scale),
            batch(s, true, false, false),
            o,
            s,
        );
        dev.gemm_batched(&g, &b, ds, q, dev.sub_mut(&mut dqkv, ck..end), k.store);
        round_cols(k, &mut dqkv, ck, o, s);
    });
}

/// `out = p · x` (the forward's `ctx = p·v`), or `pᵀ · x` (`transposed`: the backward's
/// `dv = pᵀ·dctx`), `p` the used probabilities (dropped, or not), `x` and `out` token tensors;
/// unrounded.
fn probs_times<D: Device>(
    k: &Kernels<D>,
    s: AttnShape,
    p: D::View<'_>,
    transposed: bool,
    x: D::View<'_>,
    out: &mut D::ViewMut<'_>,
) {
    let (t, d) = (s.seq, s.head_dim);
    let (tok, pp) = sizes(s);
    k.dev.gemm_batched(
        &product(s, (t, d, t), (transposed, false), (true, false, false), 1.0),
        &batch(s, true, false, false),
        k.dev.sub(p, 0..pp),
        x,
        k.dev.sub_mut(out, 0..tok),
        k.store,
    );
}
