//! runtime/kernels/loss.cu on the emulated device against the CPU backend.
//!
//! Tolerances. The kernel takes exp in f32 (expf, within a few ulps), the CPU in double; all
//! else is double on both sides. So dlogits are within 1e-6 relative of the CPU's in f32 (measured
//! worst, printed with `--nocapture`: a few 1e-7), and for a half store within one ulp of the
//! storage dtype (a last-bit f32 difference can flip a half rounding). The loss: each row's loss
//! comes back as f32 (the CPU keeps f64 until the mean), then the same f64 mean; within 1e-6
//! relative in f32, one storage ulp for a half store.

use crate::common;

use common::{close, pair, rand, rand_ids};
use recipe_runtime::backend::Backend;
use recipe_runtime::precision::Dtype;

const STORES: [Dtype; 3] = [Dtype::F32, Dtype::F16, Dtype::Bf16];

/// (rows, classes): one class, two, widths off the warp and the block, a vocabulary-sized row.
const SHAPES: &[(usize, usize)] = &[
    (1, 1),
    (3, 2),
    (17, 7),
    (3, 33),
    (2, 257),
    (5, 1000),
    (1, 3001),
];

/// The relative slack: 1e-6 in f32, one ulp of a half storage dtype.
fn rtol(store: Dtype) -> f32 {
    match store {
        Dtype::F32 => 1e-6,
        Dtype::F16 => 1.0 / 1024.0,
        Dtype::Bf16 => 1.0 / 128.0,
    }
}

fn bits(x: &[f32]) -> Vec<u32> {
    x.iter().map(|v| v.to_bits()).collect()
}

fn rel_err(got: &[f32], want: &[f32]) -> f32 {
    got.iter()
        .zip(want)
        .map(|(g, w)| (g - w).abs() / w.abs().max(1e-30))
        .fold(0.0, f32::max)
}

/// Logits with the first row's label 0 and the last row's label the last class; row 1 (when
/// there is one) a confident correct prediction, whose loss is tiny and cancels in lse − x[y].
fn case(rows: usize, classes: usize, store: Dtype) -> (Vec<f32>, Vec<u32>) {
    let mut logits = rand(rows * classes, 4.0, 1);
    let mut labels = rand_ids(rows, classes as u32, 2);
    labels[0] = 0;
    labels[rows - 1] = classes as u32 - 1;
    if rows > 2 {
        logits[classes + labels[1] as usize] = 20.0;
    }
    store.round_slice(&mut logits);
    (logits, labels)
}

#[test]
fn cross_entropy_matches_the_cpu() {
    for store in STORES {
        let (g, c) = pair(store);
        for &(rows, classes) in SHAPES {
            for grad_scale in [1.0f32, 1024.0] {
                let (logits, labels) = case(rows, classes, store);
                let gl = g.upload_ids(&labels);
                let n = rows * classes;
                let (mut d1, mut d2) = (vec![9.0; n], vec![9.0; n]);
                let l1 = g.cross_entropy(&mut d1, &logits, &gl, rows, classes, grad_scale);
                let l2 = c.cross_entropy(&mut d2, &logits, &labels, rows, classes, grad_scale);
                let what = format!("{store:?} {rows}x{classes} scale {grad_scale}");
                eprintln!(
                    "cross_entropy {what}: dlogits {:e} loss {:e} ({l1} vs {l2})",
                    rel_err(&d1, &d2),
                    rel_err(&[l1], &[l2])
                );
                // atol: an f16 subnormal step of the gradient scale (probabilities ~1e-9 are
                // rounded to a grid 6e-8 apart).
                let atol = if store == Dtype::F16 {
                    6e-8 * grad_scale
                } else {
                    0.0
                };
                close(&format!("dlogits {what}"), &d1, &d2, atol, rtol(store));
                close(&format!("loss {what}"), &[l1], &[l2], 0.0, rtol(store));
                let mut d3 = vec![0.0; n];
                let l3 = g.cross_entropy(&mut d3, &logits, &gl, rows, classes, grad_scale);
                assert_eq!(bits(&d1), bits(&d3), "rerun {what}");
                assert_eq!(l1.to_bits(), l3.to_bits(), "rerun loss {what}");
            }
        }
    }
}

#[test]
fn one_class_has_zero_loss_and_gradient() {
    let (g, _) = pair(Dtype::F32);
    let labels = g.upload_ids(&[0, 0, 0]);
    let mut d = vec![9.0; 3];
    let loss = g.cross_entropy(&mut d, &[-3.0, 0.5, 80.0], &labels, 3, 1, 1.0);
    assert_eq!(loss, 0.0);
    assert!(d.iter().all(|&x| x == 0.0), "{d:?}");
}

#[test]
fn a_confident_prediction_keeps_its_small_loss() {
    // loss = lse − x[label] ≈ Σ exp(x − 12) ≈ 1e-4: in f32 the difference would keep ~3 digits;
    // the kernel takes it in double, as the CPU does.
    let (g, c) = pair(Dtype::F32);
    let (rows, classes) = (3, 50);
    let mut logits = rand(rows * classes, 1.0, 3);
    let labels = vec![0, 17, 49];
    for (r, &y) in labels.iter().enumerate() {
        logits[r * classes + y as usize] = 12.0;
    }
    let gl = g.upload_ids(&labels);
    let (mut d1, mut d2) = (vec![0.0; rows * classes], vec![0.0; rows * classes]);
    let l1 = g.cross_entropy(&mut d1, &logits, &gl, rows, classes, 1.0);
    let l2 = c.cross_entropy(&mut d2, &logits, &labels, rows, classes, 1.0);
    eprintln!(
        "confident: loss {l1:e} vs {l2:e}, dlogits {:e}",
        rel_err(&d1, &d2)
    );
    assert!(
        l2 > 1e-5 && l2 < 1e-3,
        "the case is not the intended one: {l2}"
    );
    close("confident loss", &[l1], &[l2], 0.0, 1e-6);
    close("confident dlogits", &d1, &d2, 0.0, 1e-6);
}
