//! Shared helpers of the emulation tests: random inputs and comparisons with the CPU backend.
#![allow(dead_code)]

use recipe_kernel_emu::Emu;
use recipe_runtime::backend::kernels::Kernels;
use recipe_runtime::backend::Cpu;
use recipe_runtime::precision::Dtype;
use recipe_runtime::rng::Rng;

/// The CUDA backend's launch code on the emulated device, and the CPU reference, both storing
/// `store`.
pub fn pair(store: Dtype) -> (Kernels<Emu>, Cpu) {
    (
        Kernels::new(Emu).with_store(store),
        Cpu::new(1).with_store(store),
    )
}

/// `n` values uniform in `[-scale, scale)`, drawn from stream `stream`.
pub fn rand(n: usize, scale: f32, stream: u64) -> Vec<f32> {
    let mut r = Rng::new(0x5eed, stream);
    (0..n)
        .map(|_| ((r.uniform() * 2.0 - 1.0) as f32) * scale)
        .collect()
}

/// `n` integers below `bound`.
pub fn rand_ids(n: usize, bound: u32, stream: u64) -> Vec<u32> {
    let mut r = Rng::new(0x1d5, stream);
    (0..n).map(|_| r.below(u64::from(bound)) as u32).collect()
}

/// Asserts `got` is within `atol + rtol·|want|` of `want`, element by element, naming the worst.
#[track_caller]
pub fn close(what: &str, got: &[f32], want: &[f32], atol: f32, rtol: f32) {
    assert_eq!(got.len(), want.len(), "{what}: lengths");
    let mut worst = (0usize, 0.0f32);
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        assert!(
            g.is_finite() == w.is_finite(),
            "{what}[{i}]: got {g}, want {w}"
        );
        let err = (g - w).abs() - (atol + rtol * w.abs());
        if err > worst.1 {
            worst = (i, err);
        }
    }
    assert!(
        worst.1 <= 0.0,
        "{what}[{}]: got {}, want {} (beyond atol {atol} + rtol {rtol})",
        worst.0,
        got[worst.0],
        want[worst.0]
    );
}

/// Odd sizes: not multiples of a warp or a block, one element, one block plus one.
pub const SIZES: &[usize] = &[1, 7, 31, 33, 255, 257, 1000];
