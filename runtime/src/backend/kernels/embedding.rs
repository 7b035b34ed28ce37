//! Launches of `runtime/kernels/embedding.cu`: the forward one thread per output element, the
//! backward per (row, column) of the word and token-type tables (after ordering the tokens by
//! row; a row of many tokens staged through a block's shared memory) or per position-table
//! element, each summing its tokens in order (no atomics, the CPU backend's bits).
#![allow(clippy::too_many_arguments)]

use super::{dtype_arg, grid1, int, Kernels, BLOCK};
use crate::backend::device::{Arg, Device, Launch};

/// Warps in a block of [`BLOCK`] threads: `embedding_order` takes a token each.
const WARPS: usize = BLOCK as usize / 32;

pub(super) fn fwd<D: Device>(
    k: &Kernels<D>,
    mut out: D::ViewMut<'_>,
    ids: &D::Ids,
    types: &D::Ids,
    word: D::View<'_>,
    pos: D::View<'_>,
    typ: D::View<'_>,
    batch: usize,
    seq: usize,
    hidden: usize,
) {
    let n = batch * seq * hidden;
    assert!(k.dev.len_mut(&out) >= n, "embedding_fwd out");
    assert!(k.dev.len(pos) >= seq * hidden, "embedding_fwd positions");
    assert_eq!(
        k.dev.len(word) % hidden.max(1),
        0,
        "embedding_fwd word width"
    );
    assert_eq!(
        k.dev.len(typ) % hidden.max(1),
        0,
        "embedding_fwd type width"
    );
    // The tables are parts of one parameter buffer: one type.
    let tables = k.dev.elem(word);
    assert!(
        k.dev.elem(pos) == tables && k.dev.elem(typ) == tables,
        "embedding_fwd tables' types"
    );
    if n == 0 {
        return;
    }
    let o = k.typed_mut(&mut out);
    k.dev.launch(
        "embedding_fwd",
        grid1(n),
        &[
            o,
            Arg::Ptr(k.dev.ids_ptr(ids)),
            Arg::Ptr(k.dev.ids_ptr(types)),
            Arg::Ptr(k.dev.ptr(word)),
            Arg::Ptr(k.dev.ptr(pos)),
            Arg::Ptr(k.dev.ptr(typ)),
            dtype_arg(tables),
            int(batch * seq),
            int(seq),
            int(hidden),
            k.store_arg(),
        ],
    );
}

pub(super) fn bwd<D: Device>(
    k: &Kernels<D>,
    mut dword: D::ViewMut<'_>,
    mut dpos: D::ViewMut<'_>,
    mut dtyp: D::ViewMut<'_>,
    dout: D::View<'_>,
    ids: &D::Ids,
    types: &D::Ids,
    batch: usize,
    seq: usize,
    hidden: usize,
) {
    let tokens = batch * seq;
    assert!(k.dev.len(dout) >= tokens * hidden, "embedding_bwd dout");
    assert!(
        k.dev.len_mut(&dpos) >= seq * hidden,
        "embedding_bwd positions"
    );
    assert_eq!(
        k.dev.len_mut(&dword) % hidden.max(1),
        0,
        "embedding_bwd word"
    );
    assert_eq!(
        k.dev.len_mut(&dtyp) % hidden.max(1),
        0,
        "embedding_bwd type"
    );
    // No tokens: nothing is added and (as on the CPU) no row is rounded.
    if tokens == 0 || hidden == 0 {
        return;
    }
    let (w, t, p) = (
        k.dev.ptr_mut(&mut dword),
        k.dev.ptr_mut(&mut dtyp),
        k.dev.ptr_mut(&mut dpos),
    );
    // Word table and token-type table: the tokens in order of their rows, then each row's
    // tokens summed per column, a short run by one thread, a long one through a block's shared
    // memory (embedding.cu).
    k.with_order(4 * tokens, |ord| {
        k.dev.launch(
            "embedding_order",
            Launch {
                grid: (tokens.div_ceil(WARPS) as u32, 2, 1),
                block: (BLOCK, 1, 1),
                smem: 0,
            },
            &[
                Arg::Ptr(ord),
                Arg::Ptr(k.dev.ids_ptr(ids)),
                Arg::Ptr(k.dev.ids_ptr(types)),
                int(tokens),
            ],
        );
        let args = [
            Arg::Ptr(w),
            Arg::Ptr(t),
            k.typed(dout),
            Arg::Ptr(k.dev.ids_ptr(ids)),
            Arg::Ptr(k.dev.ids_ptr(types)),
            Arg::Ptr(ord),
            int(tokens),
            int(hidden),
            k.store_arg(),
        ];
        k.dev.launch(
            "embedding_bwd_short",
            Launch {
                grid: (
                    u32::try_from(tokens).expect("embedding tokens"),
                    hidden.div_ceil(BLOCK as usize) as u32,
                    2,
                ),
                block: (BLOCK, 1, 1),
                smem: 0,
            },
            &args,
        );
        k.dev.launch(
            "embedding_bwd_long",
            Launch {
                grid: (
                    hidden.div_ceil(32) as u32,
                    u32::try_from(tokens.div_ceil(BLOCK as usize)).expect("embedding tokens"),
                    2,
                ),
                block: (BLOCK, 1, 1),
                smem: 0,
            },
            &args,
        );
    });
    k.dev.launch(
        "embedding_bwd_pos",
        grid1(seq * hidden),
        &[
            Arg::Ptr(p),
            k.typed(dout),
            int(batch),
            int(seq),
            int(hidden),
            k.store_arg(),
        ],
    );
}
