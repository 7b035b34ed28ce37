//! What mixed precision's skipped steps do to a run: DeepSpeed skips an optimizer step whose
//! gradients hold an inf or NaN (fp16 overflow; bf16 too since 0.19.3), leaves the weights
//! alone and does not step the LR scheduler, while HF's `global_step` still counts the step
//! (docs/runtime.md, "Mixed precision"; `deepspeed/runtime/engine.py:_take_model_step`,
//! `deepspeed/runtime/fp16/loss_scaler.py`). `recipe explain` and `recipe steps` print this.

use crate::resolve::{Resolved, Val};

/// One paragraph on skipped steps for the recipe's precision, or None when nothing is skipped
/// (fp32; bf16 before DeepSpeed 0.19.3).
pub fn note(r: &Resolved) -> Option<String> {
    let total = r
        .uint("steps.total")
        .map_or_else(String::new, |t| format!(" toward the {t}"));
    let held = format!(
        "no weight update, and the LR scheduler is not stepped, so from then on the LR runs one \
         schedule step behind HF's global_step per skipped step (HF still counts the step{total})"
    );
    let record = "`recipe run` records every skipped step in metrics.jsonl";
    match r.word("train.precision")? {
        "fp16" => {
            let stage = r.count("zero.stage");
            let scale = match r.val("train.loss_scale") {
                Some(Val::Int(s)) if *s > 0 => {
                    return Some(format!(
                        "fp16 with a static loss scale of {s}: a step whose gradients overflow is \
                         still skipped: {held}; the scale never changes. {record}."
                    ))
                }
                // Resolution fills every fp16 default (resolve/defaults.rs).
                _ => (
                    r.uint("train.initial_scale_power")?,
                    r.uint("train.loss_scale_window")?,
                    r.uint("train.hysteresis")?,
                    r.f64("train.min_loss_scale")?,
                ),
            };
            let (power, window, hysteresis, min) = scale;
            let how = if stage == 0 {
                "ZeRO-0's FP16_Optimizer halves it on every overflow (it ignores hysteresis) and \
                 stays at the minimum; DeepSpeed 0.19.8 does not scale the loss at ZeRO-0 at all \
                 but still divides the gradients by the scale (docs/runtime.md)"
                    .to_string()
            } else {
                format!(
                    "the ZeRO optimizer's DynamicLossScaler lets {} overflow(s) pass before it \
                     halves the scale, and an overflow at the minimum stops the run",
                    hysteresis.saturating_sub(1)
                )
            };
            // The loss is a half tensor, so the backward starts from the scale as an fp16 value:
            // 2^16 and above is +inf (fp16's largest value is 65504), and those steps overflow
            // whatever the gradients are, until the scale is 2^15.
            let opening = if stage >= 1 && power >= 16 && min <= 32768.0 {
                let skipped = hysteresis.saturating_sub(1) + (power - 15);
                format!(
                    " The first {skipped} step(s) are skipped whatever the gradients: 2^{power} \
                     is +inf as an fp16 gradient, so the backward overflows until the scale is \
                     2^15."
                )
            } else {
                String::new()
            };
            Some(format!(
                "fp16 loss scale: 2^{power} at the start, ×2 after {window} steps without overflow, \
                 never below {min}; {how}. A step whose gradients overflow is skipped: {held}.\
                 {opening} {record}, with each step's scale."
            ))
        }
        "bf16" if r.facts.ds_bf16_skips_overflow => Some(format!(
            "bf16 has no loss scale, but DeepSpeed (≥ 0.19.3, bf16.check_grad_overflow) skips a \
             step whose gradients hold an inf or NaN like an fp16 overflow: {held}. {record}."
        )),
        _ => None,
    }
}
