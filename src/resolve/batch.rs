//! The batch triple, inferred the way DeepSpeed does it
//! (`deepspeed/runtime/config.py:DeepSpeedConfig._set_batch_related_parameters`):
//! from the given ones, with integer (floor) division. Whether the result is consistent is the
//! batch rule's business (rules/batch.rs); here we only compute what DeepSpeed would.

use super::value::{Source, Val};
use super::Resolved;

/// Fills in the missing members of `global = micro × accumulate × world`.
pub fn infer(r: &mut Resolved) {
    let world = r.int("cluster.world_size").unwrap_or(1).max(1);
    let mb = r.int("batch.micro");
    let gas = r.int("batch.accumulate");
    let tb = r.int("batch.global");
    let w = format!("cluster.world_size = {world}");
    let derive = |r: &mut Resolved, key: &str, v: i64, rule: &str, inputs: Vec<String>| {
        r.set(
            key,
            Val::Int(v),
            Source::Derived {
                rule: rule.to_string(),
                inputs,
            },
        )
    };
    match (mb, gas, tb) {
        (Some(_), Some(_), Some(_)) => {}
        (Some(mb), None, Some(tb)) => derive(
            r,
            "batch.accumulate",
            tb / mb / world,
            "global // micro // world (DeepSpeed)",
            vec![
                format!("batch.global = {tb}"),
                format!("batch.micro = {mb}"),
                w,
            ],
        ),
        (None, Some(gas), Some(tb)) => derive(
            r,
            "batch.micro",
            tb / world / gas.max(1),
            "global // world // accumulate (DeepSpeed)",
            vec![
                format!("batch.global = {tb}"),
                w,
                format!("batch.accumulate = {gas}"),
            ],
        ),
        (Some(mb), Some(gas), None) => derive(
            r,
            "batch.global",
            // Saturating: a product past i64 is R0103's (rules/batch.rs) to report.
            mb.saturating_mul(gas).saturating_mul(world),
            "micro × accumulate × world",
            vec![
                format!("batch.micro = {mb}"),
                format!("batch.accumulate = {gas}"),
                w,
            ],
        ),
        (None, None, Some(tb)) => {
            derive(
                r,
                "batch.accumulate",
                1,
                "1 when only global is given (DeepSpeed)",
                vec![],
            );
            derive(
                r,
                "batch.micro",
                tb / world,
                "global // world (DeepSpeed)",
                vec![format!("batch.global = {tb}"), w],
            );
        }
        (Some(mb), None, None) => {
            r.set(
                "batch.accumulate",
                Val::Int(1),
                Source::Default {
                    reason: "no accumulation (HF gradient_accumulation_steps and DeepSpeed's)"
                        .into(),
                },
            );
            derive(
                r,
                "batch.global",
                mb.saturating_mul(world),
                "micro × accumulate × world",
                vec![
                    format!("batch.micro = {mb}"),
                    "batch.accumulate = 1".into(),
                    w,
                ],
            );
        }
        // Neither micro nor global: the schema already reported it.
        (None, _, None) => {}
    }
    // The eval batch defaults to the (possibly derived) micro batch.
    if !r.is_given("batch.eval_micro") {
        if let Some(mb) = r.int("batch.micro") {
            derive(
                r,
                "batch.eval_micro",
                mb,
                "the training micro batch",
                vec![format!("batch.micro = {mb}")],
            );
        }
    }
}
