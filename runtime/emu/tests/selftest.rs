//! `recipe kernels --selftest` — the op-by-op comparison a GPU check runs — on the emulated
//! device, so the check itself is exercised where there is no GPU.

use recipe_kernel_emu::Emu;
use recipe_runtime::backend::kernels::Kernels;
use recipe_runtime::backend::selftest::compare;
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
