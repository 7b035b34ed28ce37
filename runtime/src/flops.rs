//! Model FLOPs utilization (MFU): the training FLOPs a run's samples count for, over what its
//! devices could do at their dense peak.
//!
//! The count is llm.c's (`train_gpt2.cu`, `gpt2_estimate_mfu`), which issue 15's goal names:
//! `6·N + 6·L·C·T` FLOPs a token for a forward and backward, `N` every parameter, `L` layers of
//! width `C`, `T` tokens a row (the attention's scores and weighted sum). A run pads each batch
//! to its longest row (data/tokenize.rs), so `T` is the batch's. The count is the model's, not
//! what the backend executes: the CPU and CUDA backends run the last layer's attention output
//! and feed-forward on the `[CLS]` rows only (model/bert.rs, `tail_rows`), fewer FLOPs than it
//! counts, as llm.c's count ignores what an implementation saves.
//!
//! The peaks are NVIDIA's datasheet figures without sparsity: the tensor cores' bf16/fp16 with
//! f32 accumulation for a mixed-precision run, and plain fp32 for an fp32 run, whose GEMMs keep
//! TF32 off (docs/cuda.md, "GEMMs"). A GPU missing from the table gets no MFU rather than one
//! against another GPU's peak; `RECIPE_PEAK_TFLOPS` gives the peak for any device, the CPU too.

use crate::plan::Precision;

/// The environment variable that gives the devices' peak in TFLOP/s (a positive number).
pub const PEAK_ENV: &str = "RECIPE_PEAK_TFLOPS";

/// llm.c's training FLOPs of one micro-batch of `rows` rows of `seq` tokens, for a model of
/// `params` parameters and `layers` layers of width `hidden`.
pub fn train_flops(params: u64, layers: usize, hidden: usize, rows: usize, seq: usize) -> f64 {
    let per_token = 6.0 * params as f64 + 6.0 * (layers * hidden * seq) as f64;
    per_token * (rows * seq) as f64
}

/// A device's dense peak and where it came from.
#[derive(Debug, Clone, PartialEq)]
pub struct Peak {
    /// TFLOP/s of one device.
    pub tflops: f64,
    /// The device whose name gave it, or [`PEAK_ENV`].
    pub from: String,
}

/// Dense peaks, TFLOP/s, by a part of the GPU's name: (name, bf16/fp16 tensor cores, fp32).
/// The longer names first, and a name before any it contains: a plain "H100" is the SXM board
/// ("NVIDIA H100 80GB HBM3"), and "NVIDIA GB200" contains "B200". Sources: NVIDIA's H100 and H200
/// datasheets (the sparsity figures halved) and the A100 datasheet; the same bf16 figures as
/// scripts/gpu/throughput_summary.py's earlier table, so MFU figures in docs/gpu/ stay
/// comparable. Blackwell: the per-GPU rows of NVIDIA's GB200 NVL72 / HGX B200 datasheet
/// (FP16/BF16 tensor 5 and 4.5 PFLOPS with sparsity, halved; FP32 80 and 75 TFLOPS), the GB200's
/// at its 1,200 W and the HGX B200's at its 1,000 W.
const PEAKS: &[(&str, f64, f64)] = &[
    ("GB200", 2500.0, 80.0),
    ("B200", 2250.0, 75.0),
    ("H100 PCIe", 756.0, 51.0),
    ("H100 NVL", 835.0, 60.0),
    ("H200 NVL", 835.0, 60.0),
    ("H200", 989.0, 67.0),
    ("H100", 989.0, 67.0),
    ("A100", 312.0, 19.5),
];

/// The dense peak of the GPU named `device` (a CUDA executor's description, "NVIDIA H200
/// (sm_90)") for a run in `precision`; `None` for a device the table does not know.
pub fn device_peak(device: &str, precision: Precision) -> Option<Peak> {
    let &(_, half, single) = PEAKS.iter().find(|(key, ..)| device.contains(key))?;
    Some(Peak {
        tflops: if precision == Precision::Fp32 {
            single
        } else {
            half
        },
        from: device.to_string(),
    })
}

/// [`PEAK_ENV`]'s value as TFLOP/s: a positive, finite number.
pub fn parse_peak(text: &str) -> Result<f64, String> {
    match text.trim().parse::<f64>() {
        Ok(v) if v.is_finite() && v > 0.0 => Ok(v),
        _ => Err(format!(
            "{PEAK_ENV}={text:?} is not a peak: give the device's dense TFLOP/s as a positive number (989 for an H100 SXM or H200 in bf16)"
        )),
    }
}

/// The fraction of `devices` devices' peak that `flops` model FLOPs in `seconds` make.
pub fn mfu(flops: f64, seconds: f64, devices: usize, peak: &Peak) -> f64 {
    flops / seconds.max(1e-9) / (devices.max(1) as f64 * peak.tflops * 1e12)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_count_is_llm_cs_for_bert_base() {
        // 6N + 6·L·C·T a token, T tokens a row: the figure docs/gpu/ divides by the peak.
        let n = 109_483_778u64;
        let per_row = (6.0 * n as f64 + 6.0 * 12.0 * 768.0 * 128.0) * 128.0;
        assert_eq!(train_flops(n, 12, 768, 1, 128), per_row);
        assert_eq!(train_flops(n, 12, 768, 32, 128), 32.0 * per_row);
        // The attention's share grows with the batch's length.
        let short = train_flops(n, 12, 768, 1, 64) / 64.0;
        let long = train_flops(n, 12, 768, 1, 128) / 128.0;
        assert_eq!(long - short, 6.0 * 12.0 * 768.0 * 64.0);
    }

    #[test]
    fn each_gpu_gets_its_own_peak_for_the_runs_precision() {
        for (name, half, single) in [
            ("NVIDIA H200 (sm_90)", 989.0, 67.0),
            ("NVIDIA H200 NVL (sm_90)", 835.0, 60.0),
            ("NVIDIA H100 80GB HBM3 (sm_90)", 989.0, 67.0),
            ("NVIDIA H100 PCIe (sm_90)", 756.0, 51.0),
            ("NVIDIA H100 NVL (sm_90)", 835.0, 60.0),
            ("NVIDIA A100-SXM4-80GB (sm_80)", 312.0, 19.5),
            ("NVIDIA B200 (sm_100)", 2250.0, 75.0),
            ("NVIDIA GB200 (sm_100)", 2500.0, 80.0),
        ] {
            for (precision, want) in [
                (Precision::Bf16, half),
                (Precision::Fp16, half),
                (Precision::Fp32, single),
            ] {
                let p = device_peak(name, precision).expect(name);
                assert_eq!(p.tflops, want, "{name} {precision:?}");
                assert_eq!(p.from, name);
            }
        }
        assert_eq!(device_peak("NVIDIA L4 (sm_89)", Precision::Bf16), None);
        // Blackwell Ultra's figures are not in the table: no MFU rather than the B200's.
        assert_eq!(device_peak("NVIDIA B300 (sm_103)", Precision::Bf16), None);
        assert_eq!(device_peak("cpu", Precision::Fp32), None);
    }

    #[test]
    fn a_peak_must_be_a_positive_number() {
        assert_eq!(parse_peak("989"), Ok(989.0));
        assert_eq!(parse_peak(" 0.5 "), Ok(0.5));
        for bad in ["", "0", "-3", "inf", "NaN", "989 TFLOP/s"] {
            let e = parse_peak(bad).unwrap_err();
            assert!(e.contains(PEAK_ENV) && e.contains("positive"), "{bad}: {e}");
        }
    }

    #[test]
    fn mfu_divides_by_every_devices_peak() {
        let p = Peak {
            tflops: 100.0,
            from: PEAK_ENV.into(),
        };
        assert!((mfu(50e12, 1.0, 1, &p) - 0.5).abs() < 1e-12);
        assert!((mfu(50e12, 1.0, 2, &p) - 0.25).abs() < 1e-12);
        assert!((mfu(50e12, 2.0, 1, &p) - 0.25).abs() < 1e-12);
    }
}
