//! Launches of `runtime/kernels/elementwise.cu`, and the GEMM (the device's BLAS, then rounding).

use super::{chunk_grid, dtype_arg, grid1, grid_vec, int, Kernels, BLOCK};
use crate::backend::device::{Arg, Device};
use crate::backend::{Dropout, Gemm, BIAS_ROWS};
use crate::precision::Dtype;

pub(super) fn add_assign<D: Device>(k: &Kernels<D>, mut acc: D::ViewMut<'_>, x: D::View<'_>) {
    let n = k.dev.len_mut(&acc);
    assert_eq!(n, k.dev.len(x), "add_assign lengths");
    let args = [k.dev.ptr_mut(&mut acc), k.dev.ptr(x)];
    k.dev.launch(
        "add_assign",
        grid1(n),
        &[Arg::Ptr(args[0]), Arg::Ptr(args[1]), int(n), k.store_arg()],
    );
}

/// The device's GEMM; in fp16/bf16 storage its fp32 output is then rounded (`round_rows`)
/// unless `round` is false ([`crate::backend::Backend::gemm_to_epilogue`]: what reads it next rounds it).
pub(super) fn gemm<D: Device>(
    k: &Kernels<D>,
    g: &Gemm,
    a: D::View<'_>,
    b: D::View<'_>,
    mut c: D::ViewMut<'_>,
    round: bool,
) {
    let p = k.dev.ptr_mut(&mut c);
    // A 16-bit output is rounded by the GEMM itself (to nearest even, as `st`).
    let sixteen = k.dev.elem(k.dev.as_view(&c)).is_half();
    if k.store.is_half() {
        k.dev.gemm_half(g, a, b, c, k.store);
    } else {
        k.dev.gemm(g, a, b, c);
    }
    if k.store.is_half() && round && !sixteen {
        round_rows(k, p, g.m, g.n, g.ldc);
    }
}

/// [`crate::backend::Backend::copy_rows`]: one `copy_rows` launch, the elements' bits as they
/// are (both views of one element type).
pub(super) fn copy_rows<D: Device>(
    k: &Kernels<D>,
    mut dst: D::ViewMut<'_>,
    src: D::View<'_>,
    rows: usize,
    cols: usize,
    ld_dst: usize,
    ld_src: usize,
) {
    if rows == 0 || cols == 0 {
        return;
    }
    let elem = k.dev.elem(src);
    assert_eq!(
        k.dev.elem(k.dev.as_view(&dst)),
        elem,
        "copy_rows between element types"
    );
    assert!(cols <= ld_dst && cols <= ld_src, "copy_rows: rows overlap");
    let span = |ld: usize| (rows - 1) * ld + cols;
    assert!(
        k.dev.len_mut(&dst) >= span(ld_dst) && k.dev.len(src) >= span(ld_src),
        "copy_rows: views shorter than their rows"
    );
    let d = k.dev.ptr_mut(&mut dst);
    k.dev.launch(
        "copy_rows",
        grid1(rows * cols),
        &[
            Arg::Ptr(d),
            Arg::Ptr(k.dev.ptr(src)),
            int(rows),
            int(cols),
            int(ld_dst),
            int(ld_src),
            Arg::I32(i32::from(elem == Dtype::F32)),
        ],
    );
}

/// Rounds `rows × cols` at `p` (rows `ld` apart) to the storage dtype.
fn round_rows<D: Device>(k: &Kernels<D>, p: u64, rows: usize, cols: usize, ld: usize) {
    k.dev.launch(
        "round_rows",
        grid_vec(rows * cols),
        &[Arg::Ptr(p), int(rows), int(cols), int(ld), k.store_arg()],
    );
}

/// `out += bias` per row, rounded; `first`: the dtype `out` is rounded to before (the storage
/// dtype for a GEMM's output left unrounded, [`crate::backend::Backend::bias_epilogue`]; f32:
/// nothing). With `items` (count, bias stride), `out` is that many `rows × cols` matrices one
/// after another, matrix `j`'s bias `j · stride` elements into `bias`
/// ([`crate::backend::Backend::bias_epilogue_items`]).
pub(super) fn add_bias<D: Device>(
    k: &Kernels<D>,
    mut out: D::ViewMut<'_>,
    bias: D::View<'_>,
    rows: usize,
    cols: usize,
    first: Dtype,
    items: Option<(usize, usize)>,
) {
    let (count, stride) = items.unwrap_or((1, 0));
    match items {
        None => assert_eq!(k.dev.len(bias), cols, "add_bias width"),
        Some(_) => assert!(
            count >= 1 && k.dev.len(bias) >= (count - 1) * stride + cols,
            "add_bias width"
        ),
    }
    assert!(k.dev.len_mut(&out) >= count * rows * cols, "add_bias rows");
    let o = k.typed_mut(&mut out);
    k.dev.launch(
        "add_bias",
        grid_vec(count * rows * cols),
        &[
            o,
            k.typed(bias),
            int(count * rows),
            int(cols),
            int(rows),
            Arg::U64(stride as u64),
            dtype_arg(first),
            k.store_arg(),
        ],
    );
}

/// [`crate::backend::Backend::bias_grad`] (`dout`'s rows `ld` apart); with `items` (count,
/// dout stride, db stride), [`crate::backend::Backend::bias_grad_items`]: the items as the
/// grid's z.
pub(super) fn bias_grad<D: Device>(
    k: &Kernels<D>,
    mut db: D::ViewMut<'_>,
    dout: D::View<'_>,
    rows: usize,
    cols: usize,
    ld: usize,
    items: Option<(usize, usize, usize)>,
) {
    let (count, dout_stride, db_stride) = items.unwrap_or((1, 0, 0));
    assert!(count >= 1, "bias_grad items");
    assert!(
        k.dev.len_mut(&db) >= (count - 1) * db_stride + cols,
        "bias_grad width"
    );
    if items.is_none() {
        assert_eq!(k.dev.len_mut(&db), cols, "bias_grad width");
    }
    assert!(ld >= cols, "bias_grad row stride");
    assert!(
        rows == 0 || k.dev.len(dout) >= (count - 1) * dout_stride + (rows - 1) * ld + cols,
        "bias_grad rows"
    );
    // One launch: each chunk's sums, then the last block of each column adds them to db
    // (elementwise.cu, `bias_grad`); no rows is one chunk of none, whose sums are not added.
    let chunks = rows.div_ceil(BIAS_ROWS);
    let d = k.dev.ptr_mut(&mut db);
    let blocks = cols.div_ceil(BLOCK as usize);
    k.with_chunk_sums(count * chunks.max(1) * cols, |part| {
        k.with_counters(count * blocks * BLOCK as usize, |done| {
            let mut l = chunk_grid(cols, chunks.max(1));
            l.grid.2 = u32::try_from(count).expect("bias_grad items");
            k.dev.launch(
                "bias_grad",
                l,
                &[
                    Arg::Ptr(d),
                    Arg::Ptr(k.dev.ptr(part)),
                    Arg::Ptr(done),
                    k.typed(dout),
                    int(rows),
                    int(cols),
                    int(ld),
                    int(BIAS_ROWS),
                    int(chunks),
                    Arg::U64(dout_stride as u64),
                    Arg::U64(db_stride as u64),
                    k.store_arg(),
                ],
            );
        });
    });
}

/// `gelu_bwd` (elementwise.cu): `dinp = dout · gelu'(x)`, `x` the elements of `inp`, each row
/// plus `bias` (a value a column) where given
/// ([`crate::backend::Backend::gelu_bwd_bias_grad`]'s `inp_bias`).
pub(super) fn gelu_bwd<D: Device>(
    k: &Kernels<D>,
    mut dinp: D::ViewMut<'_>,
    inp: D::View<'_>,
    bias: Option<D::View<'_>>,
    dout: D::View<'_>,
) {
    let n = k.dev.len_mut(&dinp);
    assert!(
        k.dev.len(inp) == n && k.dev.len(dout) == n,
        "gelu_bwd lengths"
    );
    let (b, cols) = match bias {
        Some(b) => {
            let cols = k.dev.len(b);
            assert!(cols > 0 && n % cols == 0, "gelu_bwd's bias width");
            (k.typed(b), cols)
        }
        None => (Arg::Typed(0, Dtype::F32), 1),
    };
    let o = k.typed_mut(&mut dinp);
    k.dev.launch(
        "gelu_bwd",
        grid_vec(n),
        &[
            o,
            k.typed(inp),
            k.typed(dout),
            b,
            int(cols),
            int(n),
            k.store_arg(),
        ],
    );
}

/// [`crate::backend::Backend::gelu_bwd_bias_grad`]: one launch (elementwise.cu,
/// `gelu_bwd_bias_grad`) where every buffer is of the storage dtype, the rows are of an even
/// width and the buffers aligned for pairs; else `gelu_bwd`, then `bias_grad`.
#[allow(clippy::too_many_arguments)]
pub(super) fn gelu_bwd_bias_grad<D: Device>(
    k: &Kernels<D>,
    mut dinp: D::ViewMut<'_>,
    inp: D::View<'_>,
    inp_bias: Option<D::View<'_>>,
    dout: D::View<'_>,
    mut db: D::ViewMut<'_>,
    rows: usize,
    cols: usize,
) {
    let n = rows * cols;
    assert!(
        k.dev.len_mut(&dinp) == n && k.dev.len(inp) == n && k.dev.len(dout) == n,
        "gelu_bwd_bias_grad lengths"
    );
    assert_eq!(k.dev.len_mut(&db), cols, "gelu_bwd_bias_grad width");
    if let Some(b) = inp_bias {
        assert_eq!(k.dev.len(b), cols, "gelu_bwd_bias_grad's bias width");
    }
    let pair = if k.store == Dtype::F32 { 8 } else { 4 };
    let ok = |elem: Dtype, ptr: u64| elem == k.store && ptr % pair == 0;
    let fits = cols % 2 == 0
        && ok(
            k.dev.elem(k.dev.as_view(&dinp)),
            k.dev.ptr(k.dev.as_view(&dinp)),
        )
        && ok(k.dev.elem(inp), k.dev.ptr(inp))
        && ok(k.dev.elem(dout), k.dev.ptr(dout));
    if !fits {
        gelu_bwd(k, k.dev.sub_mut(&mut dinp, 0..n), inp, inp_bias, dout);
        return bias_grad(k, db, k.dev.as_view(&dinp), rows, cols, cols, None);
    }
    let bias = inp_bias.map_or(Arg::Typed(0, Dtype::F32), |b| k.typed(b));
    let chunks = rows.div_ceil(BIAS_ROWS);
    let (pd, pdb) = (k.dev.ptr_mut(&mut dinp), k.dev.ptr_mut(&mut db));
    k.with_chunk_sums(chunks.max(1) * cols, |part| {
        k.with_counters(cols, |done| {
            let mut l = chunk_grid(cols.div_ceil(2), chunks.max(1));
            l.grid.0 = cols.div_ceil(2 * BLOCK as usize) as u32;
            k.dev.launch(
                "gelu_bwd_bias_grad",
                l,
                &[
                    Arg::Ptr(pd),
                    Arg::Ptr(k.dev.ptr(inp)),
                    Arg::Ptr(k.dev.ptr(dout)),
                    bias,
                    Arg::Ptr(pdb),
                    Arg::Ptr(k.dev.ptr(part)),
                    Arg::Ptr(done),
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

/// `out = f(inp)` with kernel `name(out, inp, n, store)`.
pub(super) fn unary<D: Device>(
    k: &Kernels<D>,
    name: &'static str,
    mut out: D::ViewMut<'_>,
    inp: D::View<'_>,
) {
    let n = k.dev.len_mut(&out);
    assert_eq!(n, k.dev.len(inp), "{name} lengths");
    let o = k.dev.ptr_mut(&mut out);
    k.dev.launch(
        name,
        grid1(n),
        &[Arg::Ptr(o), Arg::Ptr(k.dev.ptr(inp)), int(n), k.store_arg()],
    );
}

/// `out = f(a, b)` with kernel `name(out, out_t, a, a_t, b, b_t, n, store)`: every buffer typed
/// (`Arg::Typed`), `per_thread` elements a thread (1, or [`super::VEC`] for a vectorised kernel).
pub(super) fn binary<D: Device>(
    k: &Kernels<D>,
    name: &'static str,
    mut out: D::ViewMut<'_>,
    a: D::View<'_>,
    b: D::View<'_>,
    per_thread: usize,
) {
    let n = k.dev.len_mut(&out);
    assert_eq!(n, k.dev.len(a), "{name} lengths");
    assert_eq!(n, k.dev.len(b), "{name} lengths");
    let o = k.typed_mut(&mut out);
    k.dev.launch(
        name,
        grid1(n.div_ceil(per_thread)),
        &[o, k.typed(a), k.typed(b), int(n), k.store_arg()],
    );
}

/// Dropout of a buffer whose first element has mask index `first`.
pub(crate) fn dropout<D: Device>(k: &Kernels<D>, mut x: D::ViewMut<'_>, d: &Dropout, first: u64) {
    let n = k.dev.len_mut(&x);
    let (key, site, threshold, scale) = k.dropout_args(Some(d));
    let p = k.typed_mut(&mut x);
    k.dev.launch(
        "dropout",
        grid1(n),
        &[
            p,
            int(n),
            key,
            site,
            threshold,
            scale,
            Arg::U64(first),
            k.store_arg(),
        ],
    );
}

/// [`crate::backend::Backend::bias_dropout_add`] in one pass (`bias_dropout_add` of elementwise.cu), when `out`
/// and `residual` are exactly `rows × cols`; otherwise the rounding the GEMM left
/// ([`crate::backend::Backend::gemm_to_epilogue`]) and the three kernels.
pub(super) fn bias_dropout_add<D: Device>(
    k: &Kernels<D>,
    out: &mut D::Buf,
    bias: D::View<'_>,
    rows: usize,
    cols: usize,
    dropout: Option<&Dropout>,
    residual: D::View<'_>,
) {
    let n = rows * cols;
    if k.dev.len(k.dev.view(out)) != n || k.dev.len(residual) != n || k.dev.len(bias) != cols {
        // add_assign takes floats (not 16-bit buffers, which the model sizes to fit).
        assert_eq!(
            k.dev.elem(residual),
            Dtype::F32,
            "bias_dropout_add's residual"
        );
        assert_eq!(
            k.dev.elem(k.dev.view(out)),
            Dtype::F32,
            "bias_dropout_add's out"
        );
        add_bias(k, k.dev.view_mut(out), bias, rows, cols, k.store, None);
        if let Some(d) = dropout {
            self::dropout(k, k.dev.view_mut(out), d, 0);
        }
        add_assign(k, k.dev.view_mut(out), residual);
        return;
    }
    let (key, site, threshold, scale) = k.dropout_args(dropout);
    let p = k.typed_mut(&mut k.dev.view_mut(out));
    k.dev.launch(
        "bias_dropout_add",
        grid_vec(n),
        &[
            p,
            k.typed(bias),
            k.typed(residual),
            int(rows),
            int(cols),
            int(usize::from(dropout.is_some())),
            key,
            site,
            threshold,
            scale,
            k.store_arg(),
        ],
    );
}

/// [`crate::backend::Backend::bias_gelu`] in one pass (`bias_gelu` of elementwise.cu) over the
/// first `rows × cols` elements of `inter` and `act`; `inter` is read only
/// ([`crate::backend::Backend::gelu_bwd_adds_bias`]).
pub(super) fn bias_gelu<D: Device>(
    k: &Kernels<D>,
    inter: &D::Buf,
    act: &mut D::Buf,
    bias: D::View<'_>,
    rows: usize,
    cols: usize,
) {
    let n = rows * cols;
    assert!(
        k.dev.len(k.dev.view(inter)) >= n && k.dev.len(k.dev.view(act)) >= n,
        "bias_gelu lengths"
    );
    assert_eq!(k.dev.len(bias), cols, "bias_gelu width");
    let act = k.typed_mut(&mut k.dev.view_mut(act));
    k.dev.launch(
        "bias_gelu",
        grid_vec(n),
        &[
            k.typed(k.dev.view(inter)),
            act,
            k.typed(bias),
            int(rows),
            int(cols),
            k.store_arg(),
        ],
    );
}
