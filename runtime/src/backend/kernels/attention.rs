//! Launches of `runtime/kernels/attention.cu` (placeholder until the kernels land).
#![allow(clippy::too_many_arguments, unused_variables)]
use super::Kernels;
use crate::backend::device::Device;
use crate::backend::{AttnShape, Dropout};

pub(super) fn fwd<D: Device>(
    k: &Kernels<D>,
    ctx: D::ViewMut<'_>,
    probs: D::ViewMut<'_>,
    probs_drop: Option<D::ViewMut<'_>>,
    q: D::View<'_>,
    kk: D::View<'_>,
    v: D::View<'_>,
    mask: &D::Ids,
    s: AttnShape,
    dropout: Option<&Dropout>,
) {
    unimplemented!("attention_fwd kernel")
}

pub(super) fn bwd<D: Device>(
    k: &Kernels<D>,
    dq: D::ViewMut<'_>,
    dk: D::ViewMut<'_>,
    dv: D::ViewMut<'_>,
    scratch: D::ViewMut<'_>,
    dctx: D::View<'_>,
    q: D::View<'_>,
    kk: D::View<'_>,
    v: D::View<'_>,
    probs: D::View<'_>,
    probs_drop: Option<D::View<'_>>,
    s: AttnShape,
    dropout: Option<&Dropout>,
) {
    unimplemented!("attention_bwd kernel")
}
