//! Evaluation: mean cross-entropy, accuracy and F1 over a dataset, in file order.

use std::fmt;

use serde::Serialize;

use crate::data::Dataset;
use crate::model::Classifier;

/// Evaluation figures.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct EvalReport {
    /// Rows evaluated.
    pub rows: usize,
    /// Mean cross-entropy.
    pub loss: f64,
    /// Fraction of rows whose arg-max class is the label.
    pub accuracy: f64,
    /// Two classes: F1 of class 1 (the `f1` metric's binary default); more: macro F1.
    pub f1: f64,
    /// Wall-clock seconds of the evaluation: its batches' forward passes and the figures (HF's
    /// `eval_runtime`, transformers' `trainer_utils.speed_metrics`).
    pub seconds: f64,
    /// Rows per second (HF's `eval_samples_per_second`).
    pub samples_per_s: f64,
}

impl fmt::Display for EvalReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "loss {:.4}, accuracy {:.2}% ({} rows), F1 {:.4}, {:.3} s ({:.1} rows/s)",
            self.loss,
            self.accuracy * 100.0,
            self.rows,
            self.f1,
            self.seconds,
            self.samples_per_s
        )
    }
}

/// Cross-entropy of one row's logits against `label`, in f64 (log-sum-exp, max-shifted).
pub fn cross_entropy(logits: &[f32], label: usize) -> f64 {
    let max = logits.iter().fold(f32::NEG_INFINITY, |m, &x| m.max(x)) as f64;
    let lse = logits
        .iter()
        .map(|&x| (x as f64 - max).exp())
        .sum::<f64>()
        .ln()
        + max;
    lse - logits[label] as f64
}

/// Index of the largest logit (the first on ties, as `argmax` does).
pub fn argmax(logits: &[f32]) -> usize {
    let mut best = 0;
    for (i, &x) in logits.iter().enumerate() {
        if x > logits[best] {
            best = i;
        }
    }
    best
}

/// F1 from predictions and labels over `classes` classes (see [`EvalReport::f1`]).
pub fn f1(pred: &[usize], gold: &[usize], classes: usize) -> f64 {
    let per_class = |c: usize| {
        let tp = pred
            .iter()
            .zip(gold)
            .filter(|(p, g)| **p == c && **g == c)
            .count() as f64;
        let fp = pred
            .iter()
            .zip(gold)
            .filter(|(p, g)| **p == c && **g != c)
            .count() as f64;
        let fneg = pred
            .iter()
            .zip(gold)
            .filter(|(p, g)| **p != c && **g == c)
            .count() as f64;
        if tp == 0.0 {
            0.0
        } else {
            2.0 * tp / (2.0 * tp + fp + fneg)
        }
    };
    if classes == 2 {
        per_class(1)
    } else {
        (0..classes).map(per_class).sum::<f64>() / classes.max(1) as f64
    }
}

/// Evaluates `model` on every row of `data`, `micro` rows at a time.
pub fn evaluate(
    model: &Classifier,
    data: &Dataset,
    micro: usize,
) -> Result<EvalReport, crate::model::ModelError> {
    let started = std::time::Instant::now();
    let classes = model.num_labels();
    let (mut pred, mut gold) = (Vec::new(), Vec::new());
    let mut loss = 0.0;
    let order: Vec<usize> = (0..data.len()).collect();
    for chunk in order.chunks(micro.max(1)) {
        let batch = crate::train::model_batch(data.batch(chunk));
        let logits = model.forward(&batch)?;
        for (row, &label) in batch.labels.iter().enumerate() {
            let l = &logits[row * classes..(row + 1) * classes];
            loss += cross_entropy(l, label as usize);
            pred.push(argmax(l));
            gold.push(label as usize);
        }
    }
    let rows = gold.len();
    let correct = pred.iter().zip(&gold).filter(|(p, g)| p == g).count();
    let f1 = f1(&pred, &gold, classes);
    // The logits were downloaded, so a GPU's work is done.
    let seconds = started.elapsed().as_secs_f64();
    Ok(EvalReport {
        rows,
        loss: loss / rows.max(1) as f64,
        accuracy: correct as f64 / rows.max(1) as f64,
        f1,
        seconds,
        samples_per_s: rows as f64 / seconds.max(1e-9),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn f1_binary_and_macro() {
        // Class 1: tp 2, fp 1, fn 1 → 2·2 / (4 + 1 + 1) = 2/3.
        assert!((f1(&[1, 1, 1, 0, 0], &[1, 1, 0, 1, 0], 2) - 2.0 / 3.0).abs() < 1e-12);
        // Three classes, all right except one 2 predicted as 0:
        // class 0: tp 1, fp 1 → 2/3; class 1: 1; class 2: tp 1, fn 1 → 2/3.
        let m = f1(&[0, 1, 2, 0], &[0, 1, 2, 2], 3);
        assert!((m - (2.0 / 3.0 + 1.0 + 2.0 / 3.0) / 3.0).abs() < 1e-12);
    }

    #[test]
    fn cross_entropy_is_stable_for_large_logits() {
        // log(1 + e^-1000) ≈ 0 and 1000 + that for the other label.
        assert!(cross_entropy(&[1000.0, 0.0], 0).abs() < 1e-12);
        assert!((cross_entropy(&[1000.0, 0.0], 1) - 1000.0).abs() < 1e-9);
        assert!((cross_entropy(&[0.0, 0.0], 1) - std::f64::consts::LN_2).abs() < 1e-12);
        assert_eq!(argmax(&[0.5, 2.0, 2.0]), 1);
    }
}
