//! Launches of `runtime/kernels/layernorm.cu`: the forward and the backward's `dinp` one warp
//! per row, the backward's `dw`/`db` in [`Backend::bias_grad`]'s order (a grid of columns ×
//! chunks of rows, then `bias_grad` over the chunks' sums).
#![allow(clippy::too_many_arguments)]

use super::{chunk_grid, dtype_arg, int, Kernels, BLOCK};
use crate::backend::device::{Arg, Device, Launch};
use crate::backend::{Dropout, BIAS_ROWS};
use crate::precision::Dtype;

/// One warp per row, [`BLOCK`] threads (BLOCK / 32 rows) per block.
fn per_warp(rows: usize) -> Launch {
    let per_block = BLOCK as usize / 32;
    Launch {
        grid: (
            u32::try_from(rows.div_ceil(per_block)).expect("layernorm rows"),
            1,
            1,
        ),
        block: (BLOCK, 1, 1),
        smem: 0,
    }
}

pub(super) fn fwd<D: Device>(
    k: &Kernels<D>,
    mut out: D::ViewMut<'_>,
    mut mean: D::ViewMut<'_>,
    mut rstd: D::ViewMut<'_>,
    inp: D::View<'_>,
    w: D::View<'_>,
    b: D::View<'_>,
    rows: usize,
    cols: usize,
    eps: f32,
) {
    assert!(k.dev.len_mut(&out) >= rows * cols, "layernorm_fwd out");
    assert!(k.dev.len(inp) >= rows * cols, "layernorm_fwd inp");
    assert!(k.dev.len_mut(&mean) >= rows, "layernorm_fwd mean");
    assert!(k.dev.len_mut(&rstd) >= rows, "layernorm_fwd rstd");
    assert_eq!(k.dev.len(w), cols, "layernorm_fwd weight");
    assert_eq!(k.dev.len(b), cols, "layernorm_fwd bias");
    assert_eq!(
        k.dev.elem(w),
        k.dev.elem(b),
        "layernorm_fwd weight and bias types"
    );
    if rows == 0 {
        return;
    }
    let (o, m, r) = (
        k.typed_mut(&mut out),
        k.dev.ptr_mut(&mut mean),
        k.dev.ptr_mut(&mut rstd),
    );
    k.dev.launch(
        "layernorm_fwd",
        per_warp(rows),
        &[
            o,
            Arg::Ptr(m),
            Arg::Ptr(r),
            k.typed(inp),
            Arg::Ptr(k.dev.ptr(w)),
            Arg::Ptr(k.dev.ptr(b)),
            dtype_arg(k.dev.elem(w)),
            int(rows),
            int(cols),
            Arg::F32(eps),
            k.store_arg(),
        ],
    );
}

/// The residual branch's split of [`crate::backend::Backend::layernorm_bwd_split`]: where
/// `dinp` is kept, and the dropout applied to it after.
pub(super) type Split<'a, 'd, D> = Option<(<D as Device>::ViewMut<'a>, Option<&'d Dropout>)>;

/// LayerNorm's backward; with `split = Some((keep, dropout))` also the residual branch's split
/// in the same pass ([`crate::backend::Backend::layernorm_bwd_split`]).
pub(super) fn bwd<D: Device>(
    k: &Kernels<D>,
    (mut dinp, split): (D::ViewMut<'_>, Split<'_, '_, D>),
    mut dw: D::ViewMut<'_>,
    mut db: D::ViewMut<'_>,
    dout: D::View<'_>,
    inp: D::View<'_>,
    w: D::View<'_>,
    mean: D::View<'_>,
    rstd: D::View<'_>,
    rows: usize,
    cols: usize,
) {
    assert!(k.dev.len_mut(&dinp) >= rows * cols, "layernorm_bwd dinp");
    assert!(k.dev.len(dout) >= rows * cols, "layernorm_bwd dout");
    assert!(k.dev.len(inp) >= rows * cols, "layernorm_bwd inp");
    assert!(k.dev.len(mean) >= rows, "layernorm_bwd mean");
    assert!(k.dev.len(rstd) >= rows, "layernorm_bwd rstd");
    assert_eq!(k.dev.len(w), cols, "layernorm_bwd weight");
    assert_eq!(k.dev.len_mut(&dw), cols, "layernorm_bwd dw");
    assert_eq!(k.dev.len_mut(&db), cols, "layernorm_bwd db");
    if rows == 0 || cols == 0 {
        return;
    }
    let di = k.typed_mut(&mut dinp);
    let (keep, d) = match split {
        Some((mut keep, d)) => {
            assert!(k.dev.len_mut(&keep) >= rows * cols, "layernorm_bwd keep");
            (k.typed_mut(&mut keep), d)
        }
        None => (Arg::Typed(0, Dtype::F32), None),
    };
    let (key, site, threshold, dscale) = k.dropout_args(d);
    k.dev.launch(
        "layernorm_bwd_dinp",
        per_warp(rows),
        &[
            di,
            k.typed(dout),
            k.typed(inp),
            k.typed(w),
            Arg::Ptr(k.dev.ptr(mean)),
            Arg::Ptr(k.dev.ptr(rstd)),
            int(rows),
            int(cols),
            k.store_arg(),
            keep,
            int(usize::from(d.is_some())),
            key,
            site,
            threshold,
            dscale,
        ],
    );
    // dw and db in Backend::bias_grad's order, in one launch: each chunk's sums, then the last
    // block of each column adds them (layernorm.cu, `layernorm_bwd_dwdb`).
    let chunks = rows.div_ceil(BIAS_ROWS);
    let part_len = chunks * cols;
    let (tw, tb) = (k.dev.ptr_mut(&mut dw), k.dev.ptr_mut(&mut db));
    k.with_chunk_sums(2 * part_len, |whole| {
        let (ppw, ppb) = (
            k.dev.ptr(k.dev.sub(whole, 0..part_len)),
            k.dev.ptr(k.dev.sub(whole, part_len..2 * part_len)),
        );
        k.with_counters(cols, |done| {
            k.dev.launch(
                "layernorm_bwd_dwdb",
                chunk_grid(cols, chunks),
                &[
                    Arg::Ptr(tw),
                    Arg::Ptr(tb),
                    Arg::Ptr(ppw),
                    Arg::Ptr(ppb),
                    Arg::Ptr(done),
                    k.typed(dout),
                    k.typed(inp),
                    Arg::Ptr(k.dev.ptr(mean)),
                    Arg::Ptr(k.dev.ptr(rstd)),
                    int(rows),
                    int(cols),
                    int(BIAS_ROWS),
                    int(chunks),
                    k.store_arg(),
                ],
            );
        });
    });
}
