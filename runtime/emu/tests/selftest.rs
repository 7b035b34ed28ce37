//! `recipe kernels --selftest` — the op-by-op comparison a GPU check runs — on the emulated
//! device, so the check itself is exercised where there is no GPU.

use recipe_kernel_emu::Emu;
use recipe_runtime::backend::kernels::Kernels;
use recipe_runtime::backend::selftest::{compare, compare_optim, compare_optim_against, OpCheck};
use recipe_runtime::precision::Dtype;

#[test]
fn every_operation_passes_the_gpu_self_test_on_the_emulated_device() {
    for store in [Dtype::F32, Dtype::F16, Dtype::Bf16] {
        let k = Kernels::new(Emu).with_store(store);
        let checks = compare(&k, store);
        assert!(checks.len() >= 30, "{} checks", checks.len());
        for c in &checks {
            eprintln!(
                "{:?} {:<28} {:.2e} (≤ {:.1e})",
                c.store, c.op, c.error, c.tolerance
            );
        }
        let bad: Vec<_> = checks.iter().filter(|c| !c.ok).collect();
        assert!(bad.is_empty(), "{bad:#?}");
    }
}

/// The same with 16-bit buffers (`EmuTyped`): the stored buffers' checks run their 16-bit
/// path, and every other operation is unchanged.
#[test]
fn the_self_test_passes_with_sixteen_bit_buffers() {
    use recipe_kernel_emu::EmuTyped;
    for store in [Dtype::F16, Dtype::Bf16] {
        let k = Kernels::new(EmuTyped).with_store(store);
        let checks = compare(&k, store);
        print(&checks);
        let stored = checks.iter().filter(|c| c.op.starts_with("stored."));
        assert_eq!(stored.count(), 79);
        // Heads of 64 and of 32: the forward fused into one kernel here (mma.sync emulated),
        // over one chunk of keys and over several (the long kernels).
        for d in [64, 32] {
            for at in ["", "long."] {
                let fused = checks
                    .iter()
                    .filter(|c| c.op.starts_with(&format!("stored.hd{d}.{at}attention_fwd")));
                assert_eq!(fused.count(), 3, "heads of {d} {at}");
            }
        }
        let bad: Vec<_> = checks.iter().filter(|c| !c.ok).collect();
        assert!(bad.is_empty(), "{bad:#?}");
    }
}

fn print(checks: &[OpCheck]) {
    for c in checks {
        eprintln!(
            "{:?} {:<28} {:.2e} (≤ {:.1e}){}",
            c.store,
            c.op,
            c.error,
            c.tolerance,
            if c.ok { "" } else { "  FAILS" }
        );
    }
}

#[test]
fn the_device_optimizer_passes_the_gpu_self_test_on_the_emulated_device() {
    for store in [Dtype::F32, Dtype::F16, Dtype::Bf16] {
        let k = Kernels::new(Emu).with_store(store);
        let checks = compare_optim(&k, store);
        print(&checks);
        // 5 norm checks, 3 outputs of each of the two Adam variants, 4 of the mixed step; the
        // resident SGD, Adagrad and LAMB: 2 + 2 + 4 outputs in fp32 (weights, state buffers,
        // trust ratios), one more each under a half store (the master beside the half copy);
        // AdamW in two parts: 3 outputs, 4 under a half store.
        let want = if store == Dtype::F32 {
            11 + 8 + 3
        } else {
            15 + 11 + 4
        };
        assert_eq!(checks.len(), want, "{checks:#?}");
        let bad: Vec<_> = checks.iter().filter(|c| !c.ok).collect();
        assert!(bad.is_empty(), "{bad:#?}");
        // The optimizer steps are bit-identical, so the emulation leaves no error at all.
        for c in checks.iter().filter(|c| c.tolerance == 0.0) {
            assert_eq!(c.error, 0.0, "{c:?}");
        }
    }
}

#[test]
fn the_optimizer_self_test_finds_a_wrong_step() {
    // The host stepping at a learning rate off by 2⁻²⁰ relative (about an ulp of each update):
    // the fp32 parameters of every optimizer check must fail, the norms (no learning rate) still
    // pass.
    // (The moments may go either way: Adam-L2's see the parameters; and the bf16 working copy
    // rounds an f32 ulp away.)
    for store in [Dtype::F32, Dtype::Bf16] {
        let k = Kernels::new(Emu).with_store(store);
        let checks = compare_optim_against(&k, store, 1.0 + 2f64.powi(-20));
        print(&checks);
        let mut params = 0;
        for c in &checks {
            if c.op.starts_with("optim.grad_norm") {
                assert!(c.ok, "{c:?}");
            } else if [".param", ".master"].iter().any(|s| c.op.ends_with(s)) {
                assert!(!c.ok, "{c:?}");
                params += 1;
            }
        }
        // Adam's two (and the mixed step's master), SGD's, Adagrad's and LAMB's, and AdamW's
        // in two parts (its parameters, or its master weights).
        assert_eq!(
            params,
            if store == Dtype::F32 {
                2 + 3 + 1
            } else {
                3 + 3 + 1
            }
        );
    }
    // Kernels storing bf16 checked as if they stored fp16: the half working copy is rounded
    // differently from the host's, and only it fails.
    let k = Kernels::new(Emu).with_store(Dtype::Bf16);
    let checks = compare_optim(&k, Dtype::F16);
    let bad: Vec<_> = checks
        .iter()
        .filter(|c| !c.ok)
        .map(|c| c.op.as_str())
        .collect();
    assert_eq!(
        bad,
        [
            "optim.mixed.work",
            "optim.sgd.work",
            "optim.adagrad.work",
            "optim.lamb.work",
            "optim.adamw_rows.work"
        ],
        "{checks:#?}"
    );
}

#[test]
fn the_self_test_finds_a_wrong_kernel() {
    // The CPU backend storing bf16 checked as if it stored fp32: its rounding is far beyond the
    // fp32 tolerance, so the comparison must fail on the outputs it rounds.
    let cpu = recipe_runtime::backend::Cpu::new(1).with_store(Dtype::Bf16);
    let checks = compare(&cpu, Dtype::F32);
    assert!(
        checks.iter().any(|c| !c.ok && c.op == "gelu_fwd"),
        "{checks:#?}"
    );
}

/// A captured copy and dropout replayed for two micro-batches with their own inputs and keys:
/// on the emulated device that captures; none on the one that does not.
#[test]
fn a_captured_graph_replays_new_inputs_and_dropout_keys_exactly() {
    use recipe_kernel_emu::{Emu, EmuTyped};
    use recipe_runtime::backend::selftest::compare_graph_replay;
    for store in [Dtype::F32, Dtype::F16, Dtype::Bf16] {
        let c = compare_graph_replay(&Kernels::new(EmuTyped).with_store(store), store);
        assert!(c.as_ref().is_some_and(|c| c.ok), "{c:?}");
        assert!(compare_graph_replay(&Kernels::new(Emu).with_store(store), store).is_none());
    }
}

/// A captured graph that waits for a parameter segment's update copies the values of each
/// replay's update (the emulated device runs the update in order; the fake driver's
/// asynchronous streams put it on a stream of its own: tests/fake_cuda.rs).
#[test]
fn a_captured_graph_reads_each_update_it_waits_for() {
    use recipe_kernel_emu::{Emu, EmuTyped};
    use recipe_runtime::backend::selftest::compare_update_wait;
    for store in [Dtype::F32, Dtype::F16, Dtype::Bf16] {
        let c = compare_update_wait(&Kernels::new(EmuTyped).with_store(store), store);
        assert!(c.as_ref().is_some_and(|c| c.ok), "{c:?}");
        assert!(compare_update_wait(&Kernels::new(Emu).with_store(store), store).is_none());
    }
}

/// A batched f32 product of stored buffers, 16-bit ones on the emulated device keeping half
/// buffers, into a stored buffer, against the host's sums.
#[test]
fn a_batched_f32_product_of_stored_buffers_matches_the_host() {
    use recipe_kernel_emu::{Emu, EmuTyped};
    use recipe_runtime::backend::selftest::compare_wide_batched;
    for store in [Dtype::F32, Dtype::F16, Dtype::Bf16] {
        let c = compare_wide_batched(&Kernels::new(Emu).with_store(store), store);
        assert!(c.ok, "{c:?}");
        let c = compare_wide_batched(&Kernels::new(EmuTyped).with_store(store), store);
        assert!(c.ok, "{c:?}");
    }
}

/// The queued upload of an offloaded step's parameters into a stored buffer: floats on the f32
/// emulated device, 16 bits on the one keeping half buffers (`Device::upload_queued_bits`).
#[test]
fn the_queued_parameter_upload_lands_its_range_exactly() {
    use recipe_kernel_emu::{Emu, EmuTyped};
    use recipe_runtime::backend::selftest::compare_queued_upload;
    for store in [Dtype::F32, Dtype::F16, Dtype::Bf16] {
        let c = compare_queued_upload(&Kernels::new(Emu).with_store(store), store);
        assert!(c.ok, "{c:?}");
    }
    for store in [Dtype::F16, Dtype::Bf16] {
        let c = compare_queued_upload(&Kernels::new(EmuTyped).with_store(store), store);
        assert!(c.ok, "{c:?}");
    }
}
