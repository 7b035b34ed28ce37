//! Launches of `runtime/kernels/layernorm.cu`: the forward (alone, or after its sublayer's
//! bias, dropout and residual: `bias_dropout_add_layernorm`) and the backward's `dinp` one warp
//! per row (a 16-bit store's vectorised `dinp` in a kernel of its own, `layernorm_bwd_dinp16`),
//! the backward's `dw`/`db` in [`Backend::bias_grad`]'s order (a grid of columns × chunks of
//! rows whose last block per column adds the chunks' sums).
#![allow(clippy::too_many_arguments)]

use super::{chunk_grid, dtype_arg, int, Kernels, BLOCK, VEC};
use crate::backend::device::{Arg, Device, Launch};
use crate::backend::{layernorm_bwd_apart, Aside, Backend, Dropout, BIAS_ROWS};
use crate::precision::Dtype;

/// layernorm.cu's `LN_CHUNKS · LN_SPAN`: the widest row its vectorised paths hold in registers.
const LN_MAX_COLS: usize = 4 * 32 * VEC;

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

/// [`crate::backend::Backend::bias_dropout_add_layernorm`] in one launch (layernorm.cu,
/// `bias_dropout_add_layernorm`) where its vectorised path applies: a 16-bit storage dtype, `res`,
/// `residual` and `out` of it and exactly `rows × cols`, the parameters of one dtype, every
/// buffer 16-byte aligned, rows a multiple of [`VEC`] and at most [`LN_MAX_COLS`] wide.
/// Otherwise `bias_dropout_add`, then the forward: the same bits.
pub(super) fn bias_dropout_add_fwd<D: Device>(
    k: &Kernels<D>,
    res: &mut D::Buf,
    bias: D::View<'_>,
    dropout: Option<&Dropout>,
    residual: D::View<'_>,
    (mut out, mut mean, mut rstd): (D::ViewMut<'_>, D::ViewMut<'_>, D::ViewMut<'_>),
    w: D::View<'_>,
    b: D::View<'_>,
    rows: usize,
    cols: usize,
    eps: f32,
) {
    let n = rows * cols;
    let stored = |v: D::View<'_>| k.dev.elem(v) == k.store && k.dev.len(v) == n;
    let p_t = k.dev.elem(w);
    let fits = k.store.is_half()
        && rows > 0
        && cols % VEC == 0
        && cols <= LN_MAX_COLS
        && stored(k.dev.view(res))
        && stored(residual)
        && stored(k.dev.as_view(&out))
        && k.dev.len(bias) == cols
        && k.dev.elem(bias) == p_t
        && k.dev.elem(b) == p_t
        && [
            k.dev.ptr(k.dev.view(res)),
            k.dev.ptr(residual),
            k.dev.ptr(k.dev.as_view(&out)),
            k.dev.ptr(bias),
            k.dev.ptr(w),
            k.dev.ptr(b),
        ]
        .iter()
        .all(|p| p % 16 == 0);
    if !fits {
        super::elementwise::bias_dropout_add(k, res, bias, rows, cols, dropout, residual);
        return fwd(k, out, mean, rstd, k.dev.view(res), w, b, rows, cols, eps);
    }
    assert!(k.dev.len_mut(&mean) >= rows, "layernorm_fwd mean");
    assert!(k.dev.len_mut(&rstd) >= rows, "layernorm_fwd rstd");
    assert_eq!(k.dev.len(w), cols, "layernorm_fwd weight");
    assert_eq!(k.dev.len(b), cols, "layernorm_fwd bias");
    let (key, site, threshold, scale) = k.dropout_args(dropout);
    let (pr, po) = (
        k.dev.ptr_mut(&mut k.dev.view_mut(res)),
        k.dev.ptr_mut(&mut out),
    );
    let (pm, ps) = (k.dev.ptr_mut(&mut mean), k.dev.ptr_mut(&mut rstd));
    k.dev.launch(
        "bias_dropout_add_layernorm",
        per_warp(rows),
        &[
            Arg::Ptr(pr),
            Arg::Ptr(k.dev.ptr(bias)),
            Arg::Ptr(k.dev.ptr(residual)),
            Arg::Ptr(po),
            Arg::Ptr(pm),
            Arg::Ptr(ps),
            Arg::Ptr(k.dev.ptr(w)),
            Arg::Ptr(k.dev.ptr(b)),
            dtype_arg(p_t),
            int(rows),
            int(cols),
            Arg::F32(eps),
            int(usize::from(dropout.is_some())),
            key,
            site,
            threshold,
            scale,
            k.store_arg(),
        ],
    );
}

/// The residual branch's split of [`crate::backend::Backend::layernorm_bwd_split`]: where
/// `dinp` is kept, and the dropout applied to it after.
pub(super) type Split<'a, 'd, D> = Option<(<D as Device>::ViewMut<'a>, Option<&'d Dropout>)>;

/// [`Backend::layernorm_bwd_split`] (`dl` `None`) and [`Backend::layernorm_bwd_split_bias_grad`]: one pass over the matrix where
/// `dinp` and `keep` are exactly its size, else the separate passes (which cover the whole
/// buffers), then the bias's.
pub(super) fn bwd_split<D: Device>(
    k: &Kernels<D>,
    (dinp, keep, dropout): (&mut D::Buf, &mut D::Buf, Option<&Dropout>),
    (dw, db, dl): (D::ViewMut<'_>, D::ViewMut<'_>, Option<D::ViewMut<'_>>),
    dout: D::View<'_>,
    inp: D::View<'_>,
    w: D::View<'_>,
    mean: D::View<'_>,
    rstd: D::View<'_>,
    rows: usize,
    cols: usize,
) -> Aside {
    let dev = &k.dev;
    let n = rows * cols;
    if dev.len(dev.view(dinp)) != n || dev.len(dev.view(keep)) != n {
        let split = (&mut *dinp, keep, dropout);
        let sums = layernorm_bwd_apart(k, split, dw, db, dout, inp, w, mean, rstd, rows, cols);
        if let Some(dl) = dl {
            k.bias_grad(dl, dev.view(dinp), rows, cols);
        }
        return sums;
    }
    let split = Some((dev.view_mut(keep), dropout));
    let sums = (dw, db, dl);
    bwd(
        k,
        (dev.view_mut(dinp), split),
        sums,
        dout,
        inp,
        w,
        mean,
        rstd,
        rows,
        cols,
    )
}

/// LayerNorm's backward; with `split = Some((keep, dropout))` also the residual branch's split
/// in the same pass ([`crate::backend::Backend::layernorm_bwd_split`]); with `dl` also the bias
/// gradient of `dinp` (the branch's, after the split) into it
/// ([`crate::backend::Backend::layernorm_bwd_split_bias_grad`]), in `dw` and `db`'s pass where
/// `dinp` has `dout`'s type. That pass over the columns goes [`Backend::aside`] (its sums feed
/// only the gradients; on a GPU it runs beside what follows): the returned ticket covers it.
pub(super) fn bwd<D: Device>(
    k: &Kernels<D>,
    (mut dinp, split): (D::ViewMut<'_>, Split<'_, '_, D>),
    (dw, db, dl): (D::ViewMut<'_>, D::ViewMut<'_>, Option<D::ViewMut<'_>>),
    dout: D::View<'_>,
    inp: D::View<'_>,
    w: D::View<'_>,
    mean: D::View<'_>,
    rstd: D::View<'_>,
    rows: usize,
    cols: usize,
) -> Aside {
    assert!(k.dev.len_mut(&dinp) >= rows * cols, "layernorm_bwd dinp");
    assert!(k.dev.len(dout) >= rows * cols, "layernorm_bwd dout");
    assert!(k.dev.len(inp) >= rows * cols, "layernorm_bwd inp");
    assert!(k.dev.len(mean) >= rows, "layernorm_bwd mean");
    assert!(k.dev.len(rstd) >= rows, "layernorm_bwd rstd");
    assert_eq!(k.dev.len(w), cols, "layernorm_bwd weight");
    assert_eq!(k.dev.len_mut(&dw), cols, "layernorm_bwd dw");
    assert_eq!(k.dev.len_mut(&db), cols, "layernorm_bwd db");
    if rows == 0 || cols == 0 {
        return Aside::DONE;
    }
    let di = k.typed_mut(&mut dinp);
    let (keep, d, kept) = match split {
        Some((mut keep, d)) => {
            assert!(k.dev.len_mut(&keep) >= rows * cols, "layernorm_bwd keep");
            (k.typed_mut(&mut keep), d, true)
        }
        None => (Arg::Typed(0, Dtype::F32), None, false),
    };
    // A 16-bit store's vectorised path is a kernel of its own (its registers: layernorm.cu,
    // `layernorm_bwd_dinp16`), taken where it applies: every activation buffer of the storage
    // dtype and 16-byte aligned, as the weight, rows a multiple of VEC and at most LN_MAX_COLS.
    let stored16 = |a: Arg| matches!(a, Arg::Typed(p, t) if p % 16 == 0 && t == k.store);
    let vec16 = k.store.is_half()
        && cols % VEC == 0
        && cols <= LN_MAX_COLS
        && [di, k.typed(dout), k.typed(inp)].into_iter().all(stored16)
        && (!kept || stored16(keep))
        && k.dev.ptr(w) % 16 == 0;
    let (key, site, threshold, dscale) = k.dropout_args(d);
    k.dev.launch(
        if vec16 {
            "layernorm_bwd_dinp16"
        } else {
            "layernorm_bwd_dinp"
        },
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
    // block of each column adds them (layernorm.cu, `layernorm_bwd_dwdb`); `dl` too where the
    // kernel reads `dinp` as it reads `dout`, else by a bias_grad launch after it. Aside.
    k.aside(move || sums_aside(k, dinp, (dw, db, dl), dout, inp, mean, rstd, rows, cols))
}

/// [`bwd`]'s sums over the rows, after its `dinp` pass.
#[allow(clippy::too_many_arguments)]
fn sums_aside<D: Device>(
    k: &Kernels<D>,
    dinp: D::ViewMut<'_>,
    (mut dw, mut db, dl): (D::ViewMut<'_>, D::ViewMut<'_>, Option<D::ViewMut<'_>>),
    dout: D::View<'_>,
    inp: D::View<'_>,
    mean: D::View<'_>,
    rstd: D::View<'_>,
    rows: usize,
    cols: usize,
) {
    let chunks = rows.div_ceil(BIAS_ROWS);
    let part_len = chunks * cols;
    let (tw, tb) = (k.dev.ptr_mut(&mut dw), k.dev.ptr_mut(&mut db));
    if let Some(dl) = &dl {
        assert_eq!(k.dev.len_mut(dl), cols, "layernorm_bwd's bias gradient");
    }
    let branch = k.dev.as_view(&dinp);
    let one_type = k.dev.elem(branch) == k.dev.elem(dout);
    let (fused, after) = match dl {
        Some(mut dl) if one_type => (Some(k.dev.ptr_mut(&mut dl)), None),
        other => (None, other),
    };
    let branch = k.dev.ptr(branch);
    let parts = if fused.is_some() { 3 } else { 2 };
    k.with_chunk_sums(parts * part_len, |whole| {
        let (ppw, ppb) = (
            k.dev.ptr(k.dev.sub(whole, 0..part_len)),
            k.dev.ptr(k.dev.sub(whole, part_len..2 * part_len)),
        );
        // dl null: no bias gradient (the kernel reads neither its sums nor the branch).
        let (dl, ppl, branch) = match fused {
            Some(p) => (
                p,
                k.dev.ptr(k.dev.sub(whole, 2 * part_len..3 * part_len)),
                branch,
            ),
            None => (0, 0, 0),
        };
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
                    Arg::Ptr(dl),
                    Arg::Ptr(ppl),
                    Arg::Ptr(branch),
                    k.store_arg(),
                ],
            );
        });
    });
    if let Some(dl) = after {
        super::elementwise::bias_grad(k, dl, k.dev.as_view(&dinp), rows, cols, cols, None);
    }
}
