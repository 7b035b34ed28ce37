//! AddressSanitizer over the emulation: a kernel that reads or writes outside its buffers, its
//! shared memory or its stack is reported, where on a GPU the read would return a neighbour's
//! bytes (or stop the kernel at an illegal address) and the write would corrupt a neighbour
//! silently. The tests' own comparisons do not see such a read when the stray value is masked
//! or equal, nor such a write into memory nobody compares.
//!
//! Here: cpp/tsan_driver.cpp (every kernel with shared memory or a reduction across threads, on
//! small shapes, each buffer exactly as long as the kernels may touch) built with
//! `-fsanitize=address` in the emulation's fiber mode runs clean, and a copy of
//! `cross_entropy` made to read one logit past its row is reported, naming the kernel: the
//! check is live in this build. `scripts/emu-asan.sh` (run by `.ci/run`) runs every other test
//! of this crate — every kernel, through the runtime's own launch code and buffer sizes — with
//! the kernels built the same way.
//!
//! Needs a C++20 compiler with libasan (`$CXX`, else `g++`); without one the tests fail with a
//! message rather than pass unchecked.

use crate::common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use common::{build_cpp, driver_ran_every_group, kernels_dir, mutant_sources, scratch};

/// Builds cpp/tsan_driver.cpp with AddressSanitizer and the kernel sources found first in
/// `kernels`, into `dir`.
fn build(dir: &Path, kernels: &Path) -> PathBuf {
    let exe = dir.join("asan_driver");
    // Unoptimised (every access a checked memory access): each test, build and run, took 9.5 s
    // with -O1 and takes 4.9 s so.
    build_cpp(
        "tsan_driver.cpp",
        kernels,
        &["-fsanitize=address", "-fno-omit-frame-pointer", "-O0"],
        &exe,
        "a C++20 compiler with libasan",
    );
    exe
}

fn run(exe: &Path, groups: &[&str]) -> Output {
    Command::new(exe)
        .args(groups)
        .env("ASAN_OPTIONS", "detect_leaks=0:halt_on_error=1:exitcode=67")
        .output()
        .expect("run the ASan driver")
}

#[test]
fn the_kernels_with_shared_memory_stay_inside_their_buffers() {
    let dir = scratch("asan-clean");
    let out = run(&build(&dir, &kernels_dir()), &[]);
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(
        !stderr.contains("AddressSanitizer"),
        "ASan reported on the shipped kernels:\n{stderr}"
    );
    assert_eq!(
        out.status.code(),
        Some(0),
        "the ASan driver failed:\n{stderr}"
    );
    driver_ran_every_group(&stdout, &stderr);
}

#[test]
fn a_read_past_a_row_is_reported() {
    // The row maximum's loop reads one class past each row: inside the logits but for the last
    // row, whose extra read is one float past the buffer's end.
    let dir = scratch("asan-past-row");
    mutant_sources(&dir, "loss.cu", |t| {
        let bound = "for (int c = threadIdx.x; c < classes; c += blockDim.x) mx = fmaxf(mx, l[c]);";
        assert!(
            t.contains(bound),
            "cross_entropy's max loop changed: update tests/asan.rs"
        );
        t.replacen(bound, &bound.replace("c < classes", "c <= classes"), 1)
    });
    let out = run(&build(&dir, &dir), &["loss"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("heap-buffer-overflow") && stderr.contains("cross_entropy"),
        "the read past the logits went unreported (exit {:?}):\n{stderr}",
        out.status.code()
    );
    assert_eq!(out.status.code(), Some(67), "ASan's exit code\n{stderr}");
}
