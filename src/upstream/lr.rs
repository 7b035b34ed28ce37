//! Learning-rate schedules of HuggingFace transformers and DeepSpeed. The formulas live once,
//! in the runtime crate (`recipe_runtime::lr`), shared by `explain`, the rules and the native
//! training loop; this module adds what depends on the language side: the DeepSpeed behaviour
//! switches of a target release, read from the versions table.

pub use recipe_runtime::lr::*;

use crate::upstream::versions::Facts;

/// The DeepSpeed scheduler switches of the target release, from the versions table.
pub fn ds_flags(facts: &Facts) -> DsFlags {
    DsFlags {
        init_writes_lr: facts.ds_warmup_init_writes_lr,
        warmup_lr_max_defaults_to_optimizer_lr: facts.ds_warmup_lr_defaults_to_optimizer_lr,
        cosine_clamped: facts.ds_cosine_clamped,
        one_cycle_stairs: facts.ds_one_cycle_stairs,
    }
}

#[cfg(test)]
mod tests {
    //! Expected values are literals: the docs/upstream.md §7 table (as printed, 3 decimals) and
    //! numbers worked out by hand from the documented formulas (cross-checked by running the
    //! upstream Python with a stub `torch`), never produced by calling the functions under test.

    use super::*;

    fn flags_for(deepspeed: &str) -> DsFlags {
        let mut targets = crate::upstream::versions::Targets::newest();
        targets.deepspeed = deepspeed.parse().unwrap();
        ds_flags(&crate::upstream::versions::Facts::for_targets(&targets))
    }

    /// `got` prints as `want` to 3 decimals, the precision of the spec table.
    fn assert_row(got: &[f64], want: &[f64], what: &str) {
        assert_eq!(got.len(), want.len(), "{what}");
        for (k, (g, w)) in got.iter().zip(want).enumerate() {
            assert_eq!(
                format!("{g:.3}"),
                format!("{w:.3}"),
                "{what}: step k = {} got {g}, want {w}",
                k + 1
            );
        }
    }

    fn assert_close(got: f64, want: f64, what: &str) {
        assert!((got - want).abs() < 1e-9, "{what}: got {got}, want {want}");
    }

    fn hf_row(s: &HfSchedule, w: u64, t: u64, n: u64) -> Vec<f64> {
        (1..=n).map(|k| hf_lr(s, 1.0, w, t, k)).collect()
    }

    fn ds_row(s: &DsSchedule, n: u64) -> Vec<f64> {
        (1..=n)
            .map(|k| ds_lr(s, &DsFlags::LATEST, 1.0, k))
            .collect()
    }

    fn warmup_lr(w: u64, ty: DsWarmupType) -> DsSchedule {
        DsSchedule::WarmupLr {
            min_lr: 0.0,
            max_lr: Some(1.0),
            warmup_num_steps: w,
            warmup_type: ty,
        }
    }

    fn warmup_decay(w: u64, t: u64) -> DsSchedule {
        DsSchedule::WarmupDecayLr {
            total_num_steps: t,
            min_lr: 0.0,
            max_lr: Some(1.0),
            warmup_num_steps: w,
            warmup_type: DsWarmupType::Linear,
        }
    }

    fn warmup_cosine(w: u64, t: u64, cos_min_ratio: f64) -> DsSchedule {
        DsSchedule::WarmupCosineLr {
            total_num_steps: t,
            warmup_min_ratio: 0.0,
            cos_min_ratio,
            warmup_num_steps: w,
            warmup_type: DsWarmupType::Linear,
        }
    }

    // --- docs/upstream.md §7 table, W = 4, T = 10 ------------------------------------------------

    #[test]
    fn spec_table_ds_warmup_lr_log() {
        let got = ds_row(&warmup_lr(4, DsWarmupType::Log), 10);
        let want = [0.0, 0.0, 0.500, 0.792, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0];
        assert_row(&got, &want, "DS WarmupLR log");
    }

    #[test]
    fn spec_table_ds_warmup_lr_linear() {
        let got = ds_row(&warmup_lr(4, DsWarmupType::Linear), 10);
        let want = [0.0, 0.0, 0.250, 0.500, 0.750, 1.0, 1.0, 1.0, 1.0, 1.0];
        assert_row(&got, &want, "DS WarmupLR linear");
    }

    #[test]
    fn spec_table_hf_constant_with_warmup() {
        let got = hf_row(&HfSchedule::ConstantWithWarmup, 4, 10, 10);
        let want = [0.0, 0.250, 0.500, 0.750, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0];
        assert_row(&got, &want, "HF constant_with_warmup");
    }

    #[test]
    fn spec_table_ds_warmup_decay_lr_linear() {
        let got = ds_row(&warmup_decay(4, 10), 10);
        let want = [
            0.0, 0.0, 0.250, 0.500, 0.750, 1.0, 0.833, 0.667, 0.500, 0.333,
        ];
        assert_row(&got, &want, "DS WarmupDecayLR linear");
    }

    #[test]
    fn spec_table_hf_linear() {
        let got = hf_row(&HfSchedule::Linear, 4, 10, 10);
        let want = [
            0.0, 0.250, 0.500, 0.750, 1.0, 0.833, 0.667, 0.500, 0.333, 0.167,
        ];
        assert_row(&got, &want, "HF linear");
    }

    #[test]
    fn spec_table_ds_warmup_cosine_lr_linear() {
        let got = ds_row(&warmup_cosine(4, 10, 0.0), 10);
        let want = [
            0.0, 0.0, 0.250, 0.500, 0.750, 0.933, 0.750, 0.500, 0.250, 0.067,
        ];
        assert_row(&got, &want, "DS WarmupCosineLR linear");
    }

    #[test]
    fn spec_table_hf_cosine() {
        let got = hf_row(&HfSchedule::Cosine { num_cycles: 0.5 }, 4, 10, 10);
        let want = [
            0.0, 0.250, 0.500, 0.750, 1.0, 0.933, 0.750, 0.500, 0.250, 0.067,
        ];
        assert_row(&got, &want, "HF cosine");
    }

    // --- docs/upstream.md §7, W = 1, T = 6 -------------------------------------------------------

    #[test]
    fn spec_w1_t6() {
        assert_row(
            &hf_row(&HfSchedule::Linear, 1, 6, 6),
            &[0.0, 1.0, 0.8, 0.6, 0.4, 0.2],
            "HF linear W=1",
        );
        assert_row(
            &hf_row(&HfSchedule::Linear, 0, 6, 6),
            &[1.0, 0.833, 0.667, 0.5, 0.333, 0.167],
            "HF linear W=0",
        );
        assert_row(
            &ds_row(&warmup_decay(1, 6), 6),
            &[0.0, 0.0, 0.5, 1.0, 0.75, 0.5],
            "DS WarmupDecayLR linear W=1 (W'=2)",
        );
        // warmup_num_steps 0 (accepted before v0.19.3) is the same W' = 2.
        assert_row(
            &ds_row(&warmup_decay(0, 6), 6),
            &[0.0, 0.0, 0.5, 1.0, 0.75, 0.5],
            "DS WarmupDecayLR linear W=0",
        );
    }

    #[test]
    fn ds_iteration_offset() {
        assert_eq!(ds_iteration(1), -1);
        assert_eq!(ds_iteration(2), 0);
        assert_eq!(ds_iteration(10), 8);
        assert_eq!(ds_effective_warmup(1), 2);
        assert_eq!(ds_effective_warmup(7), 7);
    }

    // --- HF, hand-computed -------------------------------------------------------------------

    #[test]
    fn hf_polynomial_decays_to_absolute_lr_end() {
        // peak 2, lr_end 0.1, power 2, W = 2, T = 6; s = k − 1.
        // s < 2: 2·s/2; 2 <= s <= 6: (2 − 0.1)(1 − (s − 2)/4)^2 + 0.1; s > 6: 0.1.
        let s = HfSchedule::Polynomial {
            lr_end: 0.1,
            power: 2.0,
        };
        let want = [0.0, 1.0, 2.0, 1.16875, 0.575, 0.21875, 0.1, 0.1, 0.1];
        for (k, w) in (1..).zip(want) {
            assert_close(hf_lr(&s, 2.0, 2, 6, k), w, &format!("polynomial k={k}"));
        }
        // Constructor rejects lr_end >= peak; T == W divides by zero at s == T.
        assert!(hf_lr(&s, 0.1, 2, 6, 4).is_nan());
        assert!(hf_lr(&s, 2.0, 3, 3, 4).is_nan());
        assert_close(
            hf_lr(&s, 2.0, 3, 3, 5),
            0.1,
            "polynomial past T with T == W",
        );
    }

    #[test]
    fn hf_inverse_sqrt() {
        let s = HfSchedule::InverseSqrt { timescale: None };
        // W = 4, τ = W = 4: s >= 4 → 1/sqrt(s/4).
        assert_close(hf_lr(&s, 1.0, 4, 100, 3), 0.5, "warmup s=2");
        assert_close(hf_lr(&s, 1.0, 4, 100, 5), 1.0, "s=4");
        assert_close(hf_lr(&s, 1.0, 4, 100, 10), 2.0 / 3.0, "s=9");
        assert_close(hf_lr(&s, 1.0, 4, 100, 17), 0.5, "s=16");
        // W = 0 → τ = 10 000: s = 30 000 → 1/sqrt(4).
        assert_close(hf_lr(&s, 1.0, 0, 0, 1), 1.0, "W=0 s=0");
        assert_close(hf_lr(&s, 1.0, 0, 0, 30_001), 0.5, "W=0 s=30000");
        // Explicit τ = 100, W = 0: s = 300 → 1/sqrt(400/100).
        let t = HfSchedule::InverseSqrt {
            timescale: Some(100),
        };
        assert_close(hf_lr(&t, 1.0, 0, 0, 301), 0.5, "tau=100 s=300");
    }

    #[test]
    fn hf_cosine_with_restarts() {
        // W = 0, T = 8, 2 cycles: p = s/8, λ = ½(1 + cos(π·((2p) mod 1))), 0 once p >= 1.
        let s = HfSchedule::CosineWithRestarts { num_cycles: 2.0 };
        let want = [
            1.0,
            0.853_553_390_593_273_8,
            0.5,
            0.146_446_609_406_726_24,
            1.0,
            0.853_553_390_593_273_8,
            0.5,
            0.146_446_609_406_726_24,
            0.0,
            0.0,
        ];
        for (k, w) in (1..).zip(want) {
            assert_close(hf_lr(&s, 1.0, 0, 8, k), w, &format!("restarts k={k}"));
        }
    }

    #[test]
    fn hf_min_lr_and_wsd() {
        // cosine_with_min_lr, W = 0, T = 4, rate 0.1: s = 2 → ½·0.9 + 0.1.
        let rate = HfSchedule::CosineWithMinLr {
            num_cycles: 0.5,
            min_lr: MinLr::Rate(0.1),
        };
        assert_close(hf_lr(&rate, 1.0, 0, 4, 3), 0.55, "min_lr_rate");
        let abs = HfSchedule::CosineWithMinLr {
            num_cycles: 0.5,
            min_lr: MinLr::Absolute(0.2),
        };
        assert_close(hf_lr(&abs, 2.0, 0, 4, 3), 1.1, "min_lr absolute");
        assert_close(hf_lr(&abs, 2.0, 0, 4, 5), 0.2, "ends at min_lr");
        assert!(hf_lambda(&abs, 0.0, 0, 4, 2).is_nan(), "min_lr / 0");
        // cosine_warmup_with_min_lr, W = 2, T = 6, rate 0: warmup (s+1)/2, p = (s − 1)/4.
        let cw = HfSchedule::CosineWarmupWithMinLr {
            num_cycles: 0.5,
            min_lr: MinLr::Rate(0.0),
            warmup_lr_rate: None,
        };
        assert_close(hf_lr(&cw, 1.0, 2, 6, 1), 0.5, "cw s=0");
        assert_close(hf_lr(&cw, 1.0, 2, 6, 2), 1.0, "cw s=1");
        assert_close(hf_lr(&cw, 1.0, 2, 6, 4), 0.5, "cw s=3 (p=1/2)");
        // warmup_stable_decay: W = 2, stable 2, decay 4, min ratio 0.1; s = k − 1.
        let wsd = |decay_type| HfSchedule::WarmupStableDecay {
            num_stable_steps: Some(2),
            num_decay_steps: 4,
            warmup_type: WsdShape::Linear,
            decay_type,
            min_lr_ratio: 0.1,
            num_cycles: 0.5,
        };
        let want = [0.1, 0.55, 1.0, 1.0, 1.0, 0.775, 0.55, 0.325, 0.1, 0.1];
        let lin = wsd(WsdShape::Linear);
        for (k, w) in (1..).zip(want) {
            assert_close(hf_lr(&lin, 1.0, 2, 0, k), w, &format!("wsd linear k={k}"));
        }
        // s = 5 (p = 1/4): 1-sqrt → 1 − ½; s = 6 (p = 1/2): cosine → ½.
        assert_close(
            hf_lr(&wsd(WsdShape::OneMinusSqrt), 1.0, 2, 0, 6),
            0.55,
            "1-sqrt",
        );
        assert_close(hf_lr(&wsd(WsdShape::Cosine), 1.0, 2, 0, 7), 0.55, "cosine");
    }

    #[test]
    fn hf_metric_driven_and_constant_are_flat() {
        for s in [
            HfSchedule::Constant,
            HfSchedule::ReduceLrOnPlateau,
            HfSchedule::Greedy,
        ] {
            assert_eq!(hf_lr(&s, 3e-4, 100, 1000, 1), 3e-4, "{}", s.name());
            assert_eq!(hf_lr(&s, 3e-4, 100, 1000, 1000), 3e-4, "{}", s.name());
        }
        assert!(HfSchedule::ReduceLrOnPlateau.is_metric_driven());
        assert_eq!(
            HfSchedule::with_defaults("cosine"),
            Some(HfSchedule::Cosine { num_cycles: 0.5 })
        );
        assert_eq!(HfSchedule::with_defaults("warmup_stable_decay"), None);
    }

    // --- DeepSpeed, hand-computed ------------------------------------------------------------

    #[test]
    fn ds_warmup_cosine_pre_0_19_3_rises_after_total() {
        // W' = 4, T = 10, cos_min 0. After T: unclamped p = (it − 3)/6 keeps growing, so the
        // LR comes back up (k = 12: p = 7/6 → ½(1 + cos(7π/6)); k = 17: p = 2 → 1).
        let s = warmup_cosine(4, 10, 0.0);
        let old = flags_for("0.19.2");
        let new = flags_for("0.19.3");
        let old_want = [
            (11, 0.0),
            (12, 0.066_987_298_107_780_68),
            (13, 0.25),
            (16, 0.933_012_701_892_219_3),
            (17, 1.0),
        ];
        for (k, w) in old_want {
            assert_close(ds_lr(&s, &old, 1.0, k), w, &format!("unclamped k={k}"));
            assert_close(ds_lr(&s, &new, 1.0, k), 0.0, &format!("clamped k={k}"));
        }
        // T == W': upstream divided by zero before v0.19.3; since then the floor (1e-4) holds.
        let eq = warmup_cosine(4, 4, 1e-4);
        assert_close(ds_lr(&eq, &old, 1.0, 5), 0.75, "warmup unaffected");
        assert!(ds_lr(&eq, &old, 1.0, 6).is_nan());
        assert_close(ds_lr(&eq, &new, 1.0, 6), 1e-4, "clamped floor");
        assert_close(ds_lr(&eq, &new, 1.0, 8), 1e-4, "clamped floor");
    }

    #[test]
    fn ds_init_and_max_lr_defaults_by_version() {
        // Optimizer lr 0.5, WarmupLR linear W = 4 without warmup_max_lr.
        let s = DsSchedule::WarmupLr {
            min_lr: 0.0,
            max_lr: None,
            warmup_num_steps: 4,
            warmup_type: DsWarmupType::Linear,
        };
        let old = flags_for("0.15.2");
        // Before v0.15.3 step 1 runs at the optimizer lr, and the peak is 0.001.
        let want_old = [0.5, 0.0, 0.00025, 0.0005, 0.00075, 0.001];
        let want_new = [0.0, 0.0, 0.125, 0.25, 0.375, 0.5];
        for (k, (a, b)) in (1..).zip(want_old.into_iter().zip(want_new)) {
            assert_close(ds_lr(&s, &old, 0.5, k), a, &format!("v0.15.2 k={k}"));
            assert_close(
                ds_lr(&s, &DsFlags::LATEST, 0.5, k),
                b,
                &format!("latest k={k}"),
            );
        }
        // WarmupDecayLR without warmup_max_lr peaks at 0.001 in every version.
        let d = DsSchedule::WarmupDecayLr {
            total_num_steps: 10,
            min_lr: 0.0,
            max_lr: None,
            warmup_num_steps: 4,
            warmup_type: DsWarmupType::Linear,
        };
        assert_close(ds_lr(&d, &DsFlags::LATEST, 0.5, 6), 0.001, "decay peak");
        assert_eq!(DsFlags::default(), flags_for("0.19.5"));
    }

    #[test]
    fn ds_constant_warmup_lr() {
        // min == max: exact constant from step 1 (docs/upstream.md §7, `constant`).
        let s = DsSchedule::WarmupLr {
            min_lr: 2e-5,
            max_lr: Some(2e-5),
            warmup_num_steps: 1000,
            warmup_type: DsWarmupType::Log,
        };
        for k in [1, 2, 3, 500, 5000] {
            assert_eq!(ds_lr(&s, &DsFlags::LATEST, 1.0, k), 2e-5);
        }
    }

    fn one_cycle_small() -> OneCycle {
        // min 0.1, max 1, halves of 4, decay 0.5 every 2 iterations after the cycle.
        OneCycle {
            decay_lr_rate: 0.5,
            cycle_first_step_size: 4.0,
            decay_step_size: 2.0,
            ..OneCycle::new(0.1, 1.0)
        }
    }

    #[test]
    fn ds_one_cycle_triangle_then_decay() {
        // b = it + 1 = k − 1; scale = b/4 rising, (8 − b)/4 falling; lr = 0.1 + 0.9·scale.
        // After the cycle (it >= 8): 0.1 / (1 + 0.5·(it − 7)/2).
        let s = DsSchedule::OneCycle(one_cycle_small());
        let want = [
            0.1,
            0.325,
            0.55,
            0.775,
            1.0,
            0.775,
            0.55,
            0.325,
            0.1,
            0.08,
            0.1 / 1.5,
            0.1 / 1.75,
        ];
        for (k, w) in (1..).zip(want) {
            assert_close(
                ds_lr(&s, &DsFlags::LATEST, 1.0, k),
                w,
                &format!("one cycle k={k}"),
            );
        }
        // β1 = 0.9 − 0.1·scale, except step 1 (constructor: min mom); after the cycle, with no
        // momentum decay, 0.9. β2 = 0.99.
        let want_mom = [
            (1, 0.8),
            (2, 0.875),
            (3, 0.85),
            (5, 0.8),
            (6, 0.825),
            (9, 0.9),
            (12, 0.9),
        ];
        for (k, w) in want_mom {
            let (b1, b2) = ds_momentum(&s, &DsFlags::LATEST, k).unwrap();
            assert_close(b1, w, &format!("beta1 k={k}"));
            assert_eq!(b2, 0.99);
        }
        let no_mom = DsSchedule::OneCycle(OneCycle {
            cycle_momentum: false,
            ..one_cycle_small()
        });
        assert_eq!(ds_momentum(&no_mom, &DsFlags::LATEST, 3), None);
        assert_eq!(
            ds_momentum(&warmup_lr(4, DsWarmupType::Log), &DsFlags::LATEST, 3),
            None
        );
    }

    #[test]
    fn ds_one_cycle_momentum_decay_grows() {
        // Halves 2 and 4, decay_mom_rate 0.1 every iteration: after the cycle (it >= 6)
        // β1 = 0.9·(1 + 0.1·(it − 5)).
        let s = DsSchedule::OneCycle(OneCycle {
            cycle_first_step_size: 2.0,
            cycle_second_step_size: Some(4.0),
            decay_mom_rate: 0.1,
            decay_step_size: 1.0,
            ..OneCycle::new(0.1, 1.0)
        });
        let lr_want = [0.1, 0.55, 1.0, 0.775, 0.55, 0.325, 0.1, 0.1];
        for (k, w) in (1..).zip(lr_want) {
            assert_close(ds_lr(&s, &DsFlags::LATEST, 1.0, k), w, &format!("lr k={k}"));
        }
        for (k, w) in [(7, 0.9), (8, 0.99), (9, 1.08), (12, 1.35)] {
            let (b1, _) = ds_momentum(&s, &DsFlags::LATEST, k).unwrap();
            assert_close(b1, w, &format!("beta1 k={k}"));
        }
    }

    #[test]
    fn ds_one_cycle_stairs() {
        // 2 stairs per half of 4: the position b·2/4 (rising) or (8 − b)·2/4 (falling) is
        // floored to halves. Without the v0.19.4 flag the stair count is ignored.
        let s = DsSchedule::OneCycle(OneCycle {
            cycle_first_step_size: 4.0,
            cycle_first_stair_count: 2,
            ..OneCycle::new(0.1, 1.0)
        });
        let stairs = [0.1, 0.1, 0.55, 0.55, 1.0, 0.55, 0.55, 0.1, 0.1];
        let smooth = [0.1, 0.325, 0.55, 0.775, 1.0, 0.775, 0.55, 0.325, 0.1];
        let new = flags_for("0.19.4");
        let old = flags_for("0.19.3");
        for (k, (a, b)) in (1..).zip(stairs.into_iter().zip(smooth)) {
            assert_close(ds_lr(&s, &new, 1.0, k), a, &format!("stairs k={k}"));
            assert_close(ds_lr(&s, &old, 1.0, k), b, &format!("no stairs k={k}"));
        }
        let (b1, _) = ds_momentum(&s, &new, 3).unwrap();
        assert_close(b1, 0.85, "stair momentum");
    }

    #[test]
    fn ds_one_cycle_pr_8179_reproduction() {
        // Numbers printed in DeepSpeed PR #8179 (min 0.001, max 0.01, halves of 8), which list
        // the LR after each scheduler step, i.e. at optimizer steps k = 2, 3, ….
        let mk = |stairs| {
            DsSchedule::OneCycle(OneCycle {
                cycle_first_step_size: 8.0,
                cycle_first_stair_count: stairs,
                ..OneCycle::new(0.001, 0.01)
            })
        };
        let cont = [
            0.002125, 0.00325, 0.004375, 0.0055, 0.006625, 0.00775, 0.008875, 0.01,
        ];
        let two = [0.001, 0.001, 0.001, 0.0055, 0.0055, 0.0055, 0.0055, 0.01];
        let four = [
            0.001, 0.00325, 0.00325, 0.0055, 0.0055, 0.00775, 0.00775, 0.01,
        ];
        for (stairs, want) in [(0, cont), (2, two), (4, four), (8, cont)] {
            for (k, w) in (2..).zip(want) {
                let got = ds_lr(&mk(stairs), &DsFlags::LATEST, 1.0, k);
                assert!(
                    (got - w).abs() < 1e-12,
                    "stairs {stairs} k={k}: {got} vs {w}"
                );
            }
        }
    }

    #[test]
    fn ds_lr_range_test() {
        // min 0.01, step_size 10, rate 2: lr = 0.01·(1 + 2·(k − 1)/10), floored x for staircase.
        let mk = |staircase| DsSchedule::LrRangeTest {
            min_lr: 0.01,
            step_size: 10.0,
            step_rate: 2.0,
            staircase,
        };
        let f = DsFlags::LATEST;
        for (k, w) in [(1, 0.01), (2, 0.012), (6, 0.02), (11, 0.03), (12, 0.032)] {
            assert_close(ds_lr(&mk(false), &f, 1.0, k), w, &format!("lrrt k={k}"));
        }
        for (k, w) in [(1, 0.01), (6, 0.01), (10, 0.01), (11, 0.03), (12, 0.03)] {
            assert_close(ds_lr(&mk(true), &f, 1.0, k), w, &format!("stair k={k}"));
        }
        // Not stepped by the Warmup* init flag: step 1 is min_lr in every version.
        let old = flags_for("0.10.0");
        assert_close(ds_lr(&mk(false), &old, 5.0, 1), 0.01, "old init");
        assert_eq!(mk(false).type_name(), "LRRangeTest");
    }
}
