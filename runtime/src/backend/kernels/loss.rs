//! Launches of `runtime/kernels/loss.cu`: one block per row; the rows' losses stay in a small
//! device buffer until [`mean`] copies them back and averages them on the host in the CPU
//! backend's order — after the backward, so that a pass waits for the device once, at its end.

use super::{int, Kernels, BLOCK};
use crate::backend::device::{Arg, Device, Launch};
use crate::backend::{Backend, Loss};

/// Queues the cross-entropy kernel: `dlogits` written, each row's loss in the kernels' scratch
/// buffer (one buffer, reused: no allocation per micro-batch).
pub(super) fn queue<D: Device>(
    k: &Kernels<D>,
    mut dlogits: D::ViewMut<'_>,
    logits: D::View<'_>,
    labels: &D::Ids,
    rows: usize,
    classes: usize,
    grad_scale: f32,
) -> Loss {
    assert!(classes > 0, "cross_entropy: no classes");
    assert!(
        k.dev.len_mut(&dlogits) >= rows * classes,
        "cross_entropy dlogits"
    );
    assert!(k.dev.len(logits) >= rows * classes, "cross_entropy logits");
    if rows > 0 {
        let mut scratch = k.scratch.lock().unwrap_or_else(|p| p.into_inner());
        let buf = match scratch.as_mut() {
            // Grown, never shortened: a replayed graph skips this host code, and [`keep`] after
            // it must still find the captured batch's rows (tests/fake_cuda.rs found a shorter
            // last batch of an epoch shortening it under the graphs of the longer one).
            Some(b) => {
                if k.dev.len(k.dev.view(b)) < rows {
                    k.resize(b, rows);
                }
                b
            }
            None => scratch.insert(k.alloc(rows)),
        };
        let d = k.dev.ptr_mut(&mut dlogits);
        let l = k.dev.ptr_mut(&mut k.dev.view_mut(buf));
        k.dev.launch(
            "cross_entropy",
            Launch {
                grid: (u32::try_from(rows).expect("cross_entropy rows"), 1, 1),
                block: ((classes.div_ceil(32) * 32).min(BLOCK as usize) as u32, 1, 1),
                smem: 0,
            },
            &[
                Arg::Ptr(d),
                Arg::Ptr(l),
                Arg::Ptr(k.dev.ptr(logits)),
                Arg::Ptr(k.dev.ids_ptr(labels)),
                int(rows),
                int(classes),
                Arg::F32(grad_scale),
                k.store_arg(),
            ],
        );
    }
    Loss::Queued { rows }
}

/// Copies the rows' losses of the last [`queue`] into `dst` (its length), on the device.
pub(super) fn keep<D: Device>(k: &Kernels<D>, dst: D::ViewMut<'_>) {
    let rows = k.dev.len_mut(&dst);
    if rows == 0 {
        return;
    }
    let scratch = k.scratch.lock().unwrap_or_else(|p| p.into_inner());
    let buf = scratch.as_ref().expect("a queued cross-entropy");
    k.dev.copy(dst, k.dev.sub(k.dev.view(buf), 0..rows));
}

/// The CPU's reduction of per-row losses: summed in f64 in order, the mean rounded to the
/// storage dtype (0 rows give NaN there too).
pub(super) fn mean_of<D: Device>(k: &Kernels<D>, losses: &[f32]) -> f32 {
    let total: f64 = losses.iter().map(|&x| f64::from(x)).sum();
    k.store.round((total / losses.len() as f64) as f32)
}

/// The mean loss of the last [`queue`]: the rows' losses copied back (waiting for the device),
/// then [`mean_of`].
pub(super) fn mean<D: Device>(k: &Kernels<D>, l: Loss) -> f32 {
    let rows = match l {
        Loss::Ready(x) => return x,
        Loss::Queued { rows } => rows,
    };
    let mut losses = vec![0.0f32; rows];
    if rows > 0 {
        let scratch = k.scratch.lock().unwrap_or_else(|p| p.into_inner());
        match scratch.as_ref() {
            Some(buf) if k.dev.len(k.dev.view(buf)) >= rows => {
                k.dev
                    .download(k.dev.sub(k.dev.view(buf), 0..rows), &mut losses);
            }
            _ => return f32::NAN,
        }
    }
    mean_of(k, &losses)
}
