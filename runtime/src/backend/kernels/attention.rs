//! Launches of `runtime/kernels/attention.cu`: one block per query row (forward, backward rows)
//! or key row (backward columns), grid `(seq, heads, batch)`, the row in dynamic shared memory.
#![allow(clippy::too_many_arguments)]

use super::{dropout_args, int, Kernels};
use crate::backend::device::{Arg, Device, Launch};
use crate::backend::{AttnShape, Dropout};

/// Most threads per block: enough to cover seq 512 in four strides, few enough that many blocks
/// fit an SM.
const MAX_THREADS: usize = 128;

/// Dynamic shared memory a block may use without opting in: 48 KiB for static and dynamic
/// together (CUDA C++ Programming Guide, "Shared Memory"), less the kernels' static `red[32]`
/// floats (attention.cu).
const MAX_SMEM: usize = 48 * 1024 - 32 * 4;

/// `n` threads rounded up to whole warps, 32 to [`MAX_THREADS`].
fn threads(n: usize) -> u32 {
    (n.div_ceil(32) * 32).clamp(32, MAX_THREADS) as u32
}

/// Grid `(seq, heads, batch)` of `block` threads with `floats` of dynamic shared memory.
fn launch(s: AttnShape, block: u32, floats: usize) -> Launch {
    let smem = floats * 4;
    assert!(smem <= MAX_SMEM, "attention: seq {} too long", s.seq);
    let dim = |n: usize| u32::try_from(n).expect("attention grid");
    assert!(s.heads <= 65535 && s.batch <= 65535, "attention grid {s:?}");
    Launch {
        grid: (dim(s.seq), dim(s.heads), dim(s.batch)),
        block: (block, 1, 1),
        smem: smem as u32,
    }
}

/// `(1 / √head_dim)` as the CPU backend computes it.
fn score_scale(s: AttnShape) -> Arg {
    Arg::F32((1.0 / (s.head_dim as f64).sqrt()) as f32)
}

/// Floats of a token tensor (`[batch, seq, heads·head_dim]`) and of a probability tensor
/// (`[batch, heads, seq, seq]`).
fn sizes(s: AttnShape) -> (usize, usize) {
    (
        s.batch * s.seq * s.heads * s.head_dim,
        s.batch * s.heads * s.seq * s.seq,
    )
}

/// Nothing to compute (and a grid of zero blocks is not a launch).
fn empty(s: AttnShape) -> bool {
    s.batch == 0 || s.seq == 0 || s.heads == 0 || s.head_dim == 0
}

pub(super) fn fwd<D: Device>(
    k: &Kernels<D>,
    mut ctx: D::ViewMut<'_>,
    mut probs: D::ViewMut<'_>,
    probs_drop: Option<D::ViewMut<'_>>,
    q: D::View<'_>,
    kk: D::View<'_>,
    v: D::View<'_>,
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
    if empty(s) {
        return;
    }
    // The CPU backend applies dropout only when both the buffer and the key are given.
    let (pd, d) = match (probs_drop, dropout) {
        (Some(mut pd), Some(d)) => {
            assert!(dev.len_mut(&pd) >= pp, "attention_fwd probs_drop");
            (dev.ptr_mut(&mut pd), Some(d))
        }
        _ => (0, None),
    };
    let (seed, stream, threshold, dscale) = match d {
        Some(d) => dropout_args(d),
        None => (Arg::U64(0), Arg::U64(0), Arg::U32(0), Arg::F32(1.0)),
    };
    let l = launch(s, threads(s.seq.max(s.head_dim)), s.head_dim + s.seq);
    dev.launch(
        "attention_fwd",
        l,
        &[
            Arg::Ptr(dev.ptr_mut(&mut ctx)),
            Arg::Ptr(dev.ptr_mut(&mut probs)),
            Arg::Ptr(pd),
            Arg::Ptr(dev.ptr(q)),
            Arg::Ptr(dev.ptr(kk)),
            Arg::Ptr(dev.ptr(v)),
            Arg::Ptr(dev.ids_ptr(mask)),
            int(s.seq),
            int(s.heads),
            int(s.head_dim),
            score_scale(s),
            int(usize::from(d.is_some())),
            seed,
            stream,
            threshold,
            dscale,
            k.store_arg(),
        ],
    );
}

pub(super) fn bwd<D: Device>(
    k: &Kernels<D>,
    mut dq: D::ViewMut<'_>,
    mut dk: D::ViewMut<'_>,
    mut dv: D::ViewMut<'_>,
    mut scratch: D::ViewMut<'_>,
    dctx: D::View<'_>,
    q: D::View<'_>,
    kk: D::View<'_>,
    v: D::View<'_>,
    probs: D::View<'_>,
    probs_drop: Option<D::View<'_>>,
    s: AttnShape,
    dropout: Option<&Dropout>,
) {
    let dev = &k.dev;
    let (tok, pp) = sizes(s);
    for n in [dev.len_mut(&dq), dev.len_mut(&dk), dev.len_mut(&dv)] {
        assert!(n >= tok, "attention_bwd dq/dk/dv");
    }
    assert!(dev.len_mut(&scratch) >= pp, "attention_bwd scratch");
    for n in [dev.len(dctx), dev.len(q), dev.len(kk), dev.len(v)] {
        assert!(n >= tok, "attention_bwd dctx/q/k/v");
    }
    assert!(dev.len(probs) >= pp, "attention_bwd probs");
    if empty(s) {
        return;
    }
    // As the CPU backend: dv uses probs_drop when given, and the dropout key (only its scale)
    // masks dp by the zeros of that same buffer.
    let pd = match probs_drop {
        Some(pd) => {
            assert!(dev.len(pd) >= pp, "attention_bwd probs_drop");
            dev.ptr(pd)
        }
        None => dev.ptr(probs),
    };
    let dscale = match dropout {
        Some(d) => dropout_args(d).3,
        None => Arg::F32(1.0),
    };
    let ds = dev.ptr_mut(&mut scratch);
    dev.launch(
        "attention_bwd_rows",
        launch(s, threads(s.seq.max(s.head_dim)), s.head_dim + s.seq),
        &[
            Arg::Ptr(dev.ptr_mut(&mut dq)),
            Arg::Ptr(ds),
            Arg::Ptr(dev.ptr(dctx)),
            Arg::Ptr(dev.ptr(kk)),
            Arg::Ptr(dev.ptr(v)),
            Arg::Ptr(dev.ptr(probs)),
            Arg::Ptr(pd),
            int(s.seq),
            int(s.heads),
            int(s.head_dim),
            score_scale(s),
            int(usize::from(dropout.is_some())),
            dscale,
            k.store_arg(),
        ],
    );
    dev.launch(
        "attention_bwd_cols",
        launch(s, threads(s.head_dim), 2 * s.seq),
        &[
            Arg::Ptr(dev.ptr_mut(&mut dk)),
            Arg::Ptr(dev.ptr_mut(&mut dv)),
            Arg::Ptr(ds),
            Arg::Ptr(dev.ptr(dctx)),
            Arg::Ptr(dev.ptr(q)),
            Arg::Ptr(pd),
            int(s.seq),
            int(s.heads),
            int(s.head_dim),
            score_scale(s),
            k.store_arg(),
        ],
    );
}
