//! Batch rules: DeepSpeed's `train_batch_size == micro × accumulate × world` assertion, evaluated
//! at check time with the target world size (docs/upstream.md R-B01; DeepSpeed@v0.19.5
//! runtime/config.py:DeepSpeedConfig._batch_assertion).

use crate::diagnostics::Diagnostic;
use crate::resolve::Resolved;

use super::{anchor, origin};

/// The batch triple does not satisfy `global = micro × accumulate × world`
/// (docs/upstream.md R-B01).
pub const BATCH_MISMATCH: &str = "R0101";
/// A batch size inferred the way DeepSpeed does comes out as zero.
pub const BATCH_ZERO: &str = "R0102";
/// `micro × accumulate × world` (or `gpus × nodes`) does not fit 64 bits.
pub const BATCH_OVERFLOW: &str = "R0103";

/// This family's codes.
pub const CODES: &[(&str, &str, &str)] = &[
    (
        BATCH_MISMATCH,
        "batch-mismatch",
        "global != micro x accumulate x world after DeepSpeed's inference",
    ),
    (
        BATCH_ZERO,
        "batch-zero",
        "an inferred batch size comes out as zero",
    ),
    (
        BATCH_OVERFLOW,
        "batch-overflow",
        "micro x accumulate x world is past what 64 bits count",
    ),
];

/// Checks the batch triple.
pub fn check(r: &Resolved, out: &mut Vec<Diagnostic>) {
    let (Some(mb), Some(gas), Some(tb), Some(world)) = (
        r.int("batch.micro"),
        r.int("batch.accumulate"),
        r.int("batch.global"),
        r.int("cluster.world_size"),
    ) else {
        return;
    };
    // Python's integers do not overflow, but no sampler, tensor or dataset holds that many
    // samples a step; the products below would wrap (resolve saturates them at i64::MAX).
    if world == i64::MAX
        || mb
            .checked_mul(gas)
            .and_then(|p| p.checked_mul(world))
            .is_none()
    {
        out.push(batch_overflow(r, mb, gas, world));
        return;
    }
    for (name, v) in [("micro", mb), ("accumulate", gas), ("global", tb)] {
        if v <= 0 {
            let given: Vec<String> = ["batch.micro", "batch.accumulate", "batch.global"]
                .iter()
                .filter(|k| r.is_given(k))
                .map(|k| format!("{} = {}", k, r.int(k).unwrap_or(0)))
                .collect();
            out.push(
                Diagnostic::error(
                    BATCH_ZERO,
                    format!("`{name}` comes out as {v}: DeepSpeed requires it to be greater than 0"),
                    anchor(r, "batch.global"),
                )
                .with_label(format!("from {} on {world} GPU(s)", given.join(", ")))
                .with_help(format!(
                    "DeepSpeed derives `{name}` by integer division; make `global` at least micro × world = {}",
                    mb.max(1).saturating_mul(world)
                )),
            );
            return;
        }
    }
    let product = mb * gas * world;
    if product == tb {
        return;
    }
    // Label every value that was written; say where the others came from.
    let mut d = Diagnostic::error(
        BATCH_MISMATCH,
        format!(
            "the batch sizes do not add up: global {tb} ≠ micro {mb} × accumulate {gas} × world {world} = {product}"
        ),
        anchor(r, "batch.global"),
    )
    .with_label(format!("global = {tb}{}", origin(r, "batch.global")));
    for (key, what) in [("batch.micro", "micro"), ("batch.accumulate", "accumulate")] {
        if let Some(span) = r.span(key) {
            d = d.with_secondary(
                span,
                format!("{what} = {}{}", r.int(key).unwrap_or(0), origin(r, key)),
            );
        }
    }
    if let Some(span) = r.span("cluster.gpus").or_else(|| r.span("cluster.nodes")) {
        d = d.with_secondary(span, format!("world size {world}"));
    }
    // No product here overflows: mb × gas × world fits (checked above).
    let (fix, key, value) = if tb % (mb * world) == 0 {
        let v = tb / (mb * world);
        (
            format!("set accumulate = {v} (= {tb} / ({mb} × {world}))"),
            "batch.accumulate",
            v,
        )
    } else if tb % (gas * world) == 0 {
        let v = tb / (gas * world);
        (
            format!("set micro = {v} (= {tb} / ({gas} × {world}))"),
            "batch.micro",
            v,
        )
    } else {
        (
            format!("set global = {product}, or remove `global` and let it be derived"),
            "batch.global",
            product,
        )
    };
    let d = d.with_help(format!(
        "DeepSpeed asserts train_batch_size == micro_batch_per_gpu × gradient_acc_step × world_size at launch ({world} GPU(s){}); {fix}",
        origin(r, "cluster.world_size").replace(" (derived)", "")
    ));
    out.push(super::fix::with_set(d, r, key, &value.to_string()));
}

/// R0103: the batch sizes multiply past `i64::MAX` (9.2 × 10¹⁸ samples a step).
fn batch_overflow(r: &Resolved, mb: i64, gas: i64, world: i64) -> Diagnostic {
    let world = if world == i64::MAX {
        format!(
            "world {} × {}",
            r.int("cluster.gpus").unwrap_or(0),
            r.int("cluster.nodes").unwrap_or(0)
        )
    } else {
        format!("world {world}")
    };
    // The largest factor, wherever it was set (a flag's has no span: the batch block then).
    let key = [
        "batch.micro",
        "batch.accumulate",
        "cluster.gpus",
        "cluster.nodes",
    ]
    .into_iter()
    .max_by_key(|k| r.int(k).unwrap_or(0))
    .unwrap_or("batch.micro");
    let at = r.span(key).unwrap_or_else(|| anchor(r, "batch.micro"));
    Diagnostic::error(
        BATCH_OVERFLOW,
        format!(
            "the batch sizes multiply past 2⁶³ − 1 samples a step: micro {mb} × accumulate {gas} × {world}"
        ),
        at,
    )
    .with_label(format!(
        "{} = {}{}",
        key.rsplit('.').next().unwrap_or(key),
        r.int(key).unwrap_or(0),
        origin(r, key)
    ))
    .with_help(
        "a global batch is the samples of one optimizer step on every GPU: no dataset, sampler or GPU holds this many; give the sizes the run really uses",
    )
}
