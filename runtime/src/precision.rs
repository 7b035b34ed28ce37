//! Mixed precision: the storage dtypes a device keeps tensors in, and DeepSpeed's fp16 loss
//! scaling.
//!
//! The CPU backend emulates half-precision storage: buffers stay `f32` containers, and every value
//! a kernel stores is rounded to the storage dtype ([`Dtype::round`], round to nearest even, the
//! `half` crate), while the arithmetic inside a kernel runs in `f32`, as a CUDA kernel or cuBLAS
//! with fp32 accumulation does. Which ops store what is in `docs/runtime.md` ("Mixed precision").
//!
//! The loss scaler reproduces DeepSpeed 0.19's two implementations exactly
//! (`deepspeed/runtime/fp16/loss_scaler.py`):
//! - ZeRO stages 1–3 use `DynamicLossScaler.update_scale` (hysteresis, optional consecutive
//!   hysteresis, an error when an overflow hits the minimum scale);
//! - ZeRO-0 runs `FP16_Optimizer` / `FP16_UnfusedOptimizer` (`runtime/fp16/fused_optimizer.py`,
//!   `unfused_optimizer.py`), whose `_update_scale` halves on every overflow (no hysteresis) and
//!   stops at the minimum without an error.
//!
//! Both skip the optimizer step on overflow, dynamic or static.

use serde::{Deserialize, Serialize};

/// How a device stores a tensor.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum Dtype {
    /// IEEE single precision (4 bytes).
    #[default]
    F32,
    /// IEEE half precision (2 bytes; max 65504).
    F16,
    /// bfloat16 (2 bytes; f32's range, 8 significant bits).
    Bf16,
}

impl Dtype {
    /// Bytes per element on a device.
    pub fn bytes(self) -> u64 {
        match self {
            Dtype::F32 => 4,
            Dtype::F16 | Dtype::Bf16 => 2,
        }
    }

    /// Whether values need rounding to be stored.
    pub fn is_half(self) -> bool {
        self != Dtype::F32
    }

    /// `x` rounded to this dtype (to nearest, ties to even), as an `f32`. Values beyond fp16's
    /// range become ±inf, as a device store does.
    #[inline(always)]
    pub fn round(self, x: f32) -> f32 {
        match self {
            Dtype::F32 => x,
            Dtype::F16 => half::f16::from_f32(x).to_f32(),
            Dtype::Bf16 => half::bf16::from_f32(x).to_f32(),
        }
    }

    /// `x`'s 16 bits in this half dtype, rounded to nearest even (exact for a value already
    /// rounded to it): an element of a 16-bit buffer. Panics for `F32`.
    pub fn bits(self, x: f32) -> u16 {
        match self {
            Dtype::F16 => half::f16::from_f32(x).to_bits(),
            Dtype::Bf16 => half::bf16::from_f32(x).to_bits(),
            Dtype::F32 => panic!("f32 has no 16-bit form"),
        }
    }

    /// The value of [`Dtype::bits`]' 16 bits (exact). Panics for `F32`.
    pub fn from_bits(self, b: u16) -> f32 {
        match self {
            Dtype::F16 => half::f16::from_bits(b).to_f32(),
            Dtype::Bf16 => half::bf16::from_bits(b).to_f32(),
            Dtype::F32 => panic!("f32 has no 16-bit form"),
        }
    }

    /// Rounds every element of `xs` in place (a no-op for `F32`).
    pub fn round_slice(self, xs: &mut [f32]) {
        match self {
            Dtype::F32 => {}
            Dtype::F16 => {
                // The slice conversions use F16C on whole vectors where the CPU has it (the
                // per-element call does not vectorise): through a small buffer and back.
                use half::slice::HalfFloatSliceExt;
                let mut buf = [half::f16::ZERO; 256];
                for chunk in xs.chunks_mut(256) {
                    let b = &mut buf[..chunk.len()];
                    b.convert_from_f32_slice(chunk);
                    b.convert_to_f32_slice(chunk);
                }
            }
            Dtype::Bf16 => xs
                .iter_mut()
                .for_each(|x| *x = half::bf16::from_f32(*x).to_f32()),
        }
    }

    /// The name PyTorch gives the dtype.
    pub fn torch_name(self) -> &'static str {
        match self {
            Dtype::F32 => "float32",
            Dtype::F16 => "float16",
            Dtype::Bf16 => "bfloat16",
        }
    }
}

/// Whether any element is inf or NaN (DeepSpeed's overflow test on the gradients).
pub fn has_inf_or_nan(xs: &[f32]) -> bool {
    // A sum would do (DeepSpeed sums), but it can overflow on finite values; a scan cannot.
    xs.iter().any(|x| !x.is_finite())
}

/// The fp16 loss-scale settings (DeepSpeed's `fp16` section).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ScaleConfig {
    /// `loss_scale > 0`: a fixed scale (overflowing steps are still skipped).
    Static {
        /// The scale.
        scale: f64,
    },
    /// `loss_scale = 0`: dynamic scaling.
    Dynamic {
        /// The scale starts at `2^initial_scale_power`.
        initial_scale_power: u32,
        /// Good steps since the last overflow before the scale doubles.
        window: u64,
        /// Overflows tolerated before the scale halves (`hysteresis`; DeepSpeed's
        /// `delayed_shift`). ZeRO-0's fp16 optimizers ignore it.
        hysteresis: u64,
        /// Refill the hysteresis after every good step (`consecutive_hysteresis`).
        consecutive_hysteresis: bool,
        /// The scale never drops below this.
        min_scale: f64,
    },
}

impl ScaleConfig {
    /// DeepSpeed's defaults (`fp16` with `loss_scale: 0`): 2^16, window 1000, hysteresis 2,
    /// no consecutive hysteresis, minimum 1.
    pub fn deepspeed_default() -> ScaleConfig {
        ScaleConfig::Dynamic {
            initial_scale_power: 16,
            window: 1000,
            hysteresis: 2,
            consecutive_hysteresis: false,
            min_scale: 1.0,
        }
    }
}

/// Which DeepSpeed class scales the loss: the ZeRO optimizer's `DynamicLossScaler` (stages 1–3)
/// or `FP16_Optimizer`'s own update (stage 0).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ScalerImpl {
    /// `deepspeed.runtime.fp16.loss_scaler.DynamicLossScaler` (ZeRO-1/2/3).
    Zero,
    /// `FP16_Optimizer._update_scale` / `FP16_UnfusedOptimizer._update_scale` (ZeRO-0).
    Fp16Optimizer,
}

impl ScalerImpl {
    /// The implementation DeepSpeed uses at ZeRO `stage`.
    pub fn for_stage(stage: u8) -> ScalerImpl {
        if stage == 0 {
            ScalerImpl::Fp16Optimizer
        } else {
            ScalerImpl::Zero
        }
    }
}

/// The scaler's state: everything a checkpoint needs to continue bit-identically.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct ScalerState {
    /// The scale the next step multiplies the loss by.
    pub scale: f64,
    /// Steps seen (`cur_iter`).
    pub iter: u64,
    /// The last step that overflowed (`last_overflow_iter`, -1 for none).
    pub last_overflow_iter: i64,
    /// Overflows left before the scale halves (`cur_hysteresis`).
    pub hysteresis: u64,
    /// Steps skipped so far (DeepSpeed's `skipped_steps`).
    pub skipped: u64,
}

/// An overflow at the minimum scale: DeepSpeed's `DynamicLossScaler` raises
/// ("Current loss scale already at minimum - cannot decrease scale anymore. Exiting run.").
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("the gradients overflowed at the minimum loss scale {scale} (DeepSpeed stops the run here: \"Current loss scale already at minimum\")")]
pub struct AtMinimum {
    /// The scale.
    pub scale: f64,
}

/// DeepSpeed's fp16 loss scaler (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct LossScaler {
    /// The settings.
    pub config: ScaleConfig,
    /// Which DeepSpeed class's rules apply.
    pub imp: ScalerImpl,
    /// Where it is.
    pub state: ScalerState,
}

impl LossScaler {
    /// A fresh scaler.
    pub fn new(config: ScaleConfig, imp: ScalerImpl) -> LossScaler {
        let (scale, hysteresis) = match config {
            ScaleConfig::Static { scale } => (scale, 1),
            ScaleConfig::Dynamic {
                initial_scale_power,
                hysteresis,
                ..
            } => (2f64.powi(initial_scale_power as i32), hysteresis),
        };
        LossScaler {
            config,
            imp,
            state: ScalerState {
                scale,
                iter: 0,
                last_overflow_iter: -1,
                hysteresis,
                skipped: 0,
            },
        }
    }

    /// The current scale.
    pub fn scale(&self) -> f64 {
        self.state.scale
    }

    /// Steps skipped so far.
    pub fn skipped(&self) -> u64 {
        self.state.skipped
    }

    /// After a step: `overflow` says whether its gradients had an inf or NaN (then the step was
    /// skipped). Updates the scale as DeepSpeed does.
    pub fn update(&mut self, overflow: bool) -> Result<(), AtMinimum> {
        let s = &mut self.state;
        if overflow {
            s.skipped += 1;
        }
        let ScaleConfig::Dynamic {
            window,
            hysteresis,
            consecutive_hysteresis,
            min_scale,
            ..
        } = self.config
        else {
            // A static scale: the step is skipped, the scale stays (`LossScaler.update_scale` is
            // a no-op; the fp16 optimizers only count the iteration).
            s.iter += 1;
            return Ok(());
        };
        match self.imp {
            ScalerImpl::Fp16Optimizer => {
                if overflow {
                    s.scale = (s.scale / 2.0).max(min_scale);
                    s.last_overflow_iter = s.iter as i64;
                } else {
                    let stable = s.iter as i64 - s.last_overflow_iter - 1;
                    if stable > 0 && stable % window as i64 == 0 {
                        s.scale *= 2.0;
                    }
                }
            }
            ScalerImpl::Zero => {
                if overflow {
                    if hysteresis == 1 || s.hysteresis == 1 {
                        if s.scale == min_scale {
                            return Err(AtMinimum { scale: s.scale });
                        }
                        s.scale = (s.scale / 2.0).max(min_scale);
                    } else {
                        s.hysteresis -= 1;
                    }
                    s.last_overflow_iter = s.iter as i64;
                } else {
                    if consecutive_hysteresis {
                        s.hysteresis = hysteresis;
                    }
                    let stable = s.iter as i64 - s.last_overflow_iter - 1;
                    if stable > 0 && stable % window as i64 == 0 {
                        if !consecutive_hysteresis {
                            s.hysteresis = hysteresis;
                        }
                        s.scale *= 2.0;
                    }
                }
            }
        }
        s.iter += 1;
        Ok(())
    }
}

/// DeepSpeed's `unscale_and_clip_grads` factor: gradients computed at loss scale `scale` with
/// global (scaled) norm `scaled_norm` are divided by this, which unscales them and applies
/// `clip` (> 0) in one multiplication: `clip_ratio = (scaled_norm / scale + 1e-6) / clip`, and
/// the factor is `clip_ratio · scale` when `clip_ratio > 1`, else `scale`
/// (`runtime/zero/stage_1_and_2.py`, `runtime/fp16/fused_optimizer.py`).
pub fn combined_scale(scale: f64, scaled_norm: f64, clip: f64) -> f64 {
    if clip > 0.0 {
        let ratio = (scaled_norm / scale + 1e-6) / clip;
        if ratio > 1.0 {
            return ratio * scale;
        }
    }
    scale
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rounding_is_to_nearest_even_and_saturates_to_inf() {
        // 1 + 2^-11 is halfway between two fp16 values: ties to even (1.0).
        assert_eq!(Dtype::F16.round(1.0 + 2f32.powi(-11)), 1.0);
        assert_eq!(
            Dtype::F16.round(1.0 + 3.0 * 2f32.powi(-11)),
            1.0 + 2f32.powi(-9)
        );
        assert_eq!(Dtype::F16.round(65504.0), 65504.0);
        assert_eq!(Dtype::F16.round(65520.0), f32::INFINITY);
        assert_eq!(Dtype::Bf16.round(1.0 + 2f32.powi(-8)), 1.0);
        // bf16 keeps f32's exponent: large values stay finite, with the low 16 bits cleared.
        let big = Dtype::Bf16.round(3.0e38);
        assert!(
            big.is_finite() && big.to_bits() & 0xffff == 0 && (big / 3.0e38 - 1.0).abs() < 4e-3
        );
        assert_eq!(Dtype::F32.round(0.1), 0.1);
        let mut v = vec![0.1f32, 1e-8, 70000.0];
        Dtype::F16.round_slice(&mut v);
        assert_eq!(v[0], half::f16::from_f32(0.1).to_f32());
        assert_eq!(v[1], half::f16::from_f32(1e-8).to_f32()); // a subnormal
        assert!(v[2].is_infinite());
        assert!(has_inf_or_nan(&v));
        assert!(!has_inf_or_nan(&[1.0, f32::MAX]));
    }

    fn dynamic(hysteresis: u64, consecutive: bool, window: u64, min: f64) -> ScaleConfig {
        ScaleConfig::Dynamic {
            initial_scale_power: 4,
            window,
            hysteresis,
            consecutive_hysteresis: consecutive,
            min_scale: min,
        }
    }

    #[test]
    fn zero_scaler_uses_hysteresis_before_halving() {
        let mut s = LossScaler::new(dynamic(2, false, 3, 1.0), ScalerImpl::Zero);
        assert_eq!(s.scale(), 16.0);
        s.update(true).unwrap(); // hysteresis 2 → 1, scale kept
        assert_eq!((s.scale(), s.state.hysteresis), (16.0, 1));
        s.update(true).unwrap(); // now halves
        assert_eq!(s.scale(), 8.0);
        // Three good steps after the last overflow (iter 1): doubles at iter 5 (stable 3).
        for want in [8.0, 8.0, 8.0, 16.0] {
            s.update(false).unwrap();
            assert_eq!(s.scale(), want);
        }
        assert_eq!(s.state.hysteresis, 2, "refilled when the scale grows");
        assert_eq!(s.skipped(), 2);
    }

    #[test]
    fn fp16_optimizer_scaler_halves_every_overflow_and_stops_at_the_minimum() {
        let mut s = LossScaler::new(dynamic(2, false, 1000, 4.0), ScalerImpl::Fp16Optimizer);
        for want in [8.0, 4.0, 4.0] {
            s.update(true).unwrap();
            assert_eq!(s.scale(), want);
        }
        let mut z = LossScaler::new(dynamic(1, false, 1000, 4.0), ScalerImpl::Zero);
        z.update(true).unwrap();
        z.update(true).unwrap();
        assert_eq!(z.update(true), Err(AtMinimum { scale: 4.0 }));
    }

    #[test]
    fn static_scale_never_moves() {
        let mut s = LossScaler::new(ScaleConfig::Static { scale: 128.0 }, ScalerImpl::Zero);
        s.update(true).unwrap();
        s.update(false).unwrap();
        assert_eq!((s.scale(), s.skipped(), s.state.iter), (128.0, 1, 2));
    }

    #[test]
    fn combined_scale_unscales_and_clips_in_one_factor() {
        assert_eq!(combined_scale(1024.0, 512.0, 1.0), 1024.0); // norm 0.5: no clipping
        let f = combined_scale(1024.0, 4096.0, 1.0); // norm 4: clip by (4 + 1e-6)
        assert!((f - 1024.0 * (4.0 + 1e-6)).abs() < 1e-9);
        assert_eq!(combined_scale(8.0, 1e9, 0.0), 8.0);
    }
}
