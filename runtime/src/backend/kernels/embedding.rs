//! Launches of `runtime/kernels/embedding.cu` (placeholder until the kernels land).
#![allow(clippy::too_many_arguments, unused_variables)]
use super::Kernels;
use crate::backend::device::Device;

pub(super) fn fwd<D: Device>(
    k: &Kernels<D>,
    out: D::ViewMut<'_>,
    ids: &D::Ids,
    types: &D::Ids,
    word: D::View<'_>,
    pos: D::View<'_>,
    typ: D::View<'_>,
    batch: usize,
    seq: usize,
    hidden: usize,
) {
    unimplemented!("embedding_fwd kernel")
}

pub(super) fn bwd<D: Device>(
    k: &Kernels<D>,
    dword: D::ViewMut<'_>,
    dpos: D::ViewMut<'_>,
    dtyp: D::ViewMut<'_>,
    dout: D::View<'_>,
    ids: &D::Ids,
    types: &D::Ids,
    batch: usize,
    seq: usize,
    hidden: usize,
) {
    unimplemented!("embedding_bwd kernel")
}
