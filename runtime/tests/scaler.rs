//! The fp16 loss scaler against DeepSpeed's own classes: `fixtures/scaler/scalers.json` holds, for
//! a grid of configurations (initial power, window, hysteresis, consecutive hysteresis, minimum,
//! static scales) and overflow sequences, the scale after every step as DeepSpeed 0.19.8's
//! `DynamicLossScaler` (ZeRO-1/2/3) and `FP16_Optimizer` / `FP16_UnfusedOptimizer` (ZeRO-0)
//! computed it, and where the ZeRO scaler raised at the minimum scale
//! (`runtime/reference/make_scaler_fixtures.py` wrote it; no Python runs here).

use recipe_runtime::precision::{AtMinimum, LossScaler, ScaleConfig, ScalerImpl};
use serde_json::Value;

fn config(c: &Value) -> ScaleConfig {
    match c["static"].as_f64() {
        Some(scale) => ScaleConfig::Static { scale },
        None => ScaleConfig::Dynamic {
            initial_scale_power: c["power"].as_u64().unwrap() as u32,
            window: c["window"].as_u64().unwrap(),
            hysteresis: c["hysteresis"].as_u64().unwrap(),
            consecutive_hysteresis: c["consecutive"].as_bool().unwrap(),
            min_scale: c["min"].as_f64().unwrap(),
        },
    }
}

#[test]
fn the_scale_after_every_step_is_deepspeeds() {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/scaler/scalers.json"
    );
    let doc: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    assert_eq!(doc["deepspeed"], "0.19.8");
    let cases = doc["cases"].as_array().unwrap();
    assert!(cases.len() > 1000, "{} cases", cases.len());
    let (mut errors, mut steps) = (0, 0);
    for (i, case) in cases.iter().enumerate() {
        let imp = match case["imp"].as_str().unwrap() {
            "zero" => ScalerImpl::Zero,
            "fp16_optimizer" => ScalerImpl::Fp16Optimizer,
            other => panic!("case {i}: unknown implementation {other}"),
        };
        let mut s = LossScaler::new(config(&case["config"]), imp);
        let overflows: Vec<bool> = case["overflows"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_bool().unwrap())
            .collect();
        let scales = case["scales"].as_array().unwrap();
        let error_at = case["error_at"].as_u64().map(|e| e as usize);
        for (k, &overflow) in overflows.iter().enumerate() {
            let r = s.update(overflow);
            if Some(k) == error_at {
                assert!(
                    matches!(r, Err(AtMinimum { .. })),
                    "case {i} step {k}: DeepSpeed raised at the minimum scale, we did not"
                );
                errors += 1;
                break;
            }
            r.unwrap_or_else(|e| panic!("case {i} step {k}: {e}"));
            let want = scales[k].as_f64().unwrap();
            assert_eq!(
                s.scale(),
                want,
                "case {i} ({:?}) step {k}: scale",
                case["config"]
            );
            if let Some(h) = case["hysteresis"].as_array().and_then(|h| h[k].as_u64()) {
                assert_eq!(s.state.hysteresis, h, "case {i} step {k}: hysteresis");
            }
            steps += 1;
        }
        if error_at.is_none() {
            let skipped = overflows.iter().filter(|&&o| o).count() as u64;
            assert_eq!(s.skipped(), skipped, "case {i}");
        }
    }
    // The grid must exercise the minimum-scale error and many steps, or it proves little.
    assert!(errors > 50, "{errors} cases raised at the minimum");
    assert!(steps > 20_000, "{steps} steps compared");
}
