//! Launches of `runtime/kernels/attention.cu`: a block per `rows` query rows (forward, backward
//! rows) or key rows (backward columns) of one head, grid `(ceil(seq / rows), heads, batch)`, the
//! keys streamed through shared memory `kt` rows at a time (see the kernel file).
#![allow(clippy::too_many_arguments)]

use super::{dropout_args, int, Kernels};
use crate::backend::device::{Arg, Device, Launch};
use crate::backend::{AttnShape, Dropout};

/// Threads per block: four warps, each taking one softmax row at a time.
const THREADS: u32 = 128;

/// Output elements a thread accumulates per pass (`ATTN_OUT` in attention.cu): a block's rows
/// should have at most `THREADS × ATTN_OUT` outputs, so that one pass over the keys serves them.
const OUTPUTS: usize = 8 * THREADS as usize;

/// Query (key) rows per block at most, and keys per shared-memory tile at most.
const ROWS: usize = 16;
const TILE: usize = 32;

/// Dynamic shared memory a block may use without opting in: 48 KiB (CUDA C++ Programming
/// Guide, "Shared Memory"; the kernels declare no static shared memory).
const MAX_SMEM: usize = 48 * 1024;

/// `(rows, kt)` for a block of `shape`'s kernel whose dynamic shared memory is `floats(rows,
/// kt)`: as many rows as one pass of outputs covers (up to [`ROWS`]) and [`TILE`] keys, halved
/// (rows first) until it fits.
fn tiles(s: AttnShape, floats: impl Fn(usize, usize) -> usize) -> (usize, usize) {
    let mut rows = (OUTPUTS / s.head_dim.max(1))
        .clamp(1, ROWS)
        .min(s.seq.max(1));
    let mut kt = TILE.min(s.seq.max(1));
    while 4 * floats(rows, kt) > MAX_SMEM {
        if rows > 1 {
            rows = rows.div_ceil(2);
        } else if kt > 1 {
            kt = kt.div_ceil(2);
        } else {
            panic!("attention: seq {} too long for shared memory", s.seq);
        }
    }
    (rows, kt)
}

/// Shared memory of the forward and of the backward's rows kernel.
fn row_tiles(s: AttnShape) -> (usize, usize) {
    tiles(s, |rows, kt| row_floats(s, rows, kt))
}

/// Dynamic shared memory of the forward and of the backward's rows kernel, in floats: the
/// block's rows, the key tile (rows padded by one float, `tile_ld` in attention.cu) and the
/// score rows.
fn row_floats(s: AttnShape, rows: usize, kt: usize) -> usize {
    rows * s.head_dim + kt * (s.head_dim + 1) + rows * s.seq
}

/// Shared memory of the backward's columns kernel.
fn col_tiles(s: AttnShape) -> (usize, usize) {
    tiles(s, |rows, kt| 2 * kt * (s.head_dim + rows))
}

/// Grid `(ceil(seq / rows), heads, batch)` of [`THREADS`] threads with `floats` of dynamic
/// shared memory.
fn launch(s: AttnShape, rows: usize, floats: usize) -> Launch {
    let dim = |n: usize| u32::try_from(n).expect("attention grid");
    assert!(s.heads <= 65535 && s.batch <= 65535, "attention grid {s:?}");
    Launch {
        grid: (dim(s.seq.div_ceil(rows)), dim(s.heads), dim(s.batch)),
        block: (THREADS, 1, 1),
        smem: dim(4 * floats),
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
    let (rows, kt) = row_tiles(s);
    let l = launch(s, rows, row_floats(s, rows, kt));
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
            int(rows),
            int(kt),
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
    let (rows, kt) = row_tiles(s);
    dev.launch(
        "attention_bwd_rows",
        launch(s, rows, row_floats(s, rows, kt)),
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
            int(rows),
            int(kt),
        ],
    );
    let (rows, kt) = col_tiles(s);
    dev.launch(
        "attention_bwd_cols",
        launch(s, rows, 2 * kt * (s.head_dim + rows)),
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
            int(rows),
            int(kt),
        ],
    );
}
