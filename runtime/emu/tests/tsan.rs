//! ThreadSanitizer over the emulation: the attention kernels (and common.cuh's block reductions
//! they call) built with `-fsanitize=thread` run without a race report, and a copy with one
//! `__syncthreads()` removed on purpose is reported — so the emulation really turns a missing
//! barrier into a detectable race (cpp/cuda_emu.hpp), and the shipped kernels have none on these
//! shapes.
//!
//! Needs a C++20 compiler with libtsan (`$CXX`, else `g++`); without one the tests fail with a
//! message rather than pass unchecked.

use std::path::{Path, PathBuf};
use std::process::Command;

/// runtime/emu.
fn emu_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn kernels_dir() -> PathBuf {
    emu_dir().join("../kernels")
}

/// Builds cpp/tsan_driver.cpp with the kernel sources found first in `kernels` into `dir`.
fn build(dir: &Path, kernels: &Path) -> PathBuf {
    let cxx = std::env::var("CXX").unwrap_or_else(|_| "g++".into());
    let exe = dir.join("tsan_driver");
    let out = Command::new(&cxx)
        .args(["-std=c++20", "-fsanitize=thread", "-O1", "-g", "-pthread"])
        .arg("-I")
        .arg(kernels)
        .arg("-I")
        .arg(emu_dir().join("cpp"))
        .arg(emu_dir().join("cpp/tsan_driver.cpp"))
        .arg("-o")
        .arg(&exe)
        .output()
        .unwrap_or_else(|e| {
            panic!("the TSan test needs a C++20 compiler with libtsan; running `{cxx}` failed: {e}")
        });
    assert!(
        out.status.success(),
        "building the TSan driver with `{cxx}` failed (is libtsan installed?):\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    exe
}

/// Runs the driver; returns (exit code, stderr).
fn run(exe: &Path) -> (Option<i32>, String) {
    let go = |cmd: &mut Command| {
        let out = cmd
            .env("TSAN_OPTIONS", "halt_on_error=1 exitcode=66")
            .output()
            .expect("run the TSan driver");
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (code, err) = go(&mut Command::new(exe));
    // Some kernels randomise mmap more than GCC 12's TSan runtime expects; it runs without ASLR.
    if err.contains("unexpected memory mapping") {
        let arch = std::env::consts::ARCH;
        return go(Command::new("setarch").args([arch, "-R"]).arg(exe));
    }
    (code, err)
}

/// A fresh directory for one test's files.
fn scratch(name: &str) -> PathBuf {
    let d = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("tsan-{name}"));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).expect("create a temp dir");
    d
}

/// `text` without the first `__syncthreads();` after `anchor`, itself searched after `func`.
fn drop_sync(text: &str, func: &str, anchor: &str) -> String {
    const SYNC: &str = "__syncthreads();";
    let f = text
        .find(func)
        .unwrap_or_else(|| panic!("`{func}` not in the source: update tests/tsan.rs"));
    let a = f + text[f..]
        .find(anchor)
        .unwrap_or_else(|| panic!("`{anchor}` not in `{func}`: update tests/tsan.rs"));
    let s = a + text[a..]
        .find(SYNC)
        .expect("a __syncthreads after the anchor");
    format!("{}{}", &text[..s], &text[s + SYNC.len()..])
}

/// Copies common.cuh and attention.cu into a temp dir, `edit` applied to `file`, and runs the
/// driver built against the copy; returns its stderr after asserting the race was reported.
fn assert_race_caught(name: &str, file: &str, edit: impl Fn(&str) -> String) {
    let dir = scratch(name);
    for f in ["common.cuh", "attention.cu"] {
        let text = std::fs::read_to_string(kernels_dir().join(f)).expect("read a kernel source");
        let text = if f == file { edit(&text) } else { text };
        assert_ne!(text.len(), 0, "{f} is empty");
        std::fs::write(dir.join(f), text).expect("write the copy");
    }
    let exe = build(&dir, &dir);
    let (code, err) = run(&exe);
    assert!(
        err.contains("ThreadSanitizer: data race"),
        "{name}: the removed __syncthreads went unreported (exit {code:?}):\n{err}"
    );
}

#[test]
fn the_attention_kernels_run_clean_under_tsan() {
    let dir = scratch("clean");
    let exe = build(&dir, &kernels_dir());
    let (code, err) = run(&exe);
    assert!(
        !err.contains("ThreadSanitizer"),
        "TSan reported on the shipped kernels:\n{err}"
    );
    assert_eq!(code, Some(0), "the TSan driver failed:\n{err}");
}

#[test]
fn a_missing_barrier_in_block_sum_is_caught() {
    // Warp 0 reads the other warps' totals: without the barrier, before or while they write them.
    assert_race_caught("block-sum", "common.cuh", |t| {
        drop_sync(t, "float block_sum(", "scratch[warp] = v;")
    });
}

#[test]
fn a_missing_barrier_in_attention_fwd_is_caught() {
    // Every thread reads the whole q row that threads 0..head_dim load into shared memory.
    assert_race_caught("attention-fwd", "attention.cu", |t| {
        drop_sync(t, "void attention_fwd(", "qi[c] = q[")
    });
}
