//! Shared helpers of the emulation tests: random inputs and comparisons with the CPU backend, and
//! building the C++ test drivers of `cpp/`.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;

use recipe_kernel_emu::Emu;
use recipe_runtime::backend::kernels::Kernels;
use recipe_runtime::backend::profile::Profile;
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

/// runtime/emu.
pub fn emu_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// runtime/kernels.
pub fn kernels_dir() -> PathBuf {
    emu_dir().join("../kernels")
}

/// Builds the C++20 program `cpp/<source>` into `exe` with `$CXX` (else `g++`) and `flags`, the
/// kernel sources found first in `kernels`; `needs` says what the compiler must have, for the
/// message when it fails.
pub fn build_cpp(source: &str, kernels: &Path, flags: &[&str], exe: &Path, needs: &str) {
    let cxx = std::env::var("CXX").unwrap_or_else(|_| "g++".into());
    let out = Command::new(&cxx)
        // Line tables only (`-g1`): the sanitizers' reports name each frame's function, file and
        // line, which is all they read; full debug information took half as long again to build.
        .args(["-std=c++20", "-g1", "-pthread"])
        .args(flags)
        .arg("-I")
        .arg(kernels)
        .arg("-I")
        .arg(emu_dir().join("cpp"))
        .arg(emu_dir().join("cpp").join(source))
        .arg("-o")
        .arg(exe)
        .output()
        .unwrap_or_else(|e| panic!("this test needs {needs}; running `{cxx}` failed: {e}"));
    assert!(
        out.status.success(),
        "building {source} with `{cxx}` failed (this test needs {needs}):\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Copies runtime/kernels' sources (`.cu`, `.cuh`) into `dir`, `edit` applied to `file`, which
/// it must change: a mutant for a test showing that a check catches what the edit breaks.
pub fn mutant_sources(dir: &Path, file: &str, edit: impl Fn(&str) -> String) {
    let mut edited = false;
    for e in std::fs::read_dir(kernels_dir()).expect("read runtime/kernels") {
        let path = e.expect("a directory entry").path();
        let f = path.file_name().unwrap().to_string_lossy().into_owned();
        if !(f.ends_with(".cu") || f.ends_with(".cuh")) {
            continue;
        }
        let text = std::fs::read_to_string(&path).expect("read a kernel source");
        let text = if f == file {
            edited = true;
            let t = edit(&text);
            assert_ne!(t, text, "{file}: the edit changed nothing");
            t
        } else {
            text
        };
        std::fs::write(dir.join(&f), text).expect("write the copy");
    }
    assert!(edited, "{file} not in runtime/kernels: update the test");
}

/// Asserts that cpp/tsan_driver.cpp, run on all its groups, ran each and passed its sanity check
/// (it stops at the first that fails), from its standard output and error.
pub fn driver_ran_every_group(stdout: &str, stderr: &str) {
    for g in [
        "attention",
        "fused_attention",
        "layernorm",
        "loss",
        "norm",
        "lamb",
        "column_sums",
        "embedding",
    ] {
        assert!(
            stdout.contains(&format!("{g} ran")),
            "{g} did not run:\n{stdout}{stderr}"
        );
    }
}

/// A fresh directory `name` for one test's files.
pub fn scratch(name: &str) -> PathBuf {
    let d = Path::new(env!("CARGO_TARGET_TMPDIR")).join(name);
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).expect("create a temp dir");
    d
}

/// How many times a profile counted operation `name` (0 when it never ran).
pub fn calls(p: &Profile, name: &str) -> u64 {
    p.rows()
        .iter()
        .find(|r| r.0 == name)
        .map_or(0, |r| r.1.calls)
}
