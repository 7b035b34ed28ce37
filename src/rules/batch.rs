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
                    mb.max(1) * world
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
