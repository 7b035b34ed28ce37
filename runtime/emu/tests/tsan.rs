//! ThreadSanitizer over the emulation: every kernel with shared memory or a reduction across
//! threads (attention_softmax and attention_softmax_bwd's warp shuffles, attention_fused,
//! attention_bwd_dq and attention_bwd_dkv's shared operands and their long twins', layernorm_fwd,
//! layernorm_bwd_dinp, cross_entropy, grad_norm_partial, grad_norm_final, lamb_norms,
//! lamb_coeff, bias_grad, gelu_bwd_bias_grad, embedding_order, embedding_bwd_long, and
//! common.cuh's block_sum_d / block_max / last_of_column and optim.cu's lamb_tree they call)
//! built with `-fsanitize=thread` runs without a race report on blocks of two or more warps,
//! each result sanity-checked against the host (cpp/tsan_driver.cpp); and a copy with one
//! `__syncthreads()` removed on purpose is reported — so the emulation really turns a missing
//! barrier into a detectable race (cpp/cuda_emu.hpp), and the shipped kernels have none on these
//! shapes. The other kernels (elementwise, the rest of embedding, adamw_step, sgd_step,
//! adagrad_step, lamb_update, lamb_apply, gemm_pointers) have no shared memory and no barrier:
//! one thread per element or column; layernorm_bwd_dwdb shares bias_grad's `last_of_column`.
//!
//! One driver includes all those sources; it is built once per variant (the shipped sources, and
//! each mutation), which is most of the time these tests take.
//!
//! Needs a C++20 compiler with libtsan (`$CXX`, else `g++`); without one the tests fail with a
//! message rather than pass unchecked.

use crate::common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::{build_cpp, driver_ran_every_group, kernels_dir, mutant_sources};

/// Builds cpp/tsan_driver.cpp with the kernel sources found first in `kernels` into `dir`.
fn build(dir: &Path, kernels: &Path) -> PathBuf {
    let exe = dir.join("tsan_driver");
    let flags = [
        "-fsanitize=thread",
        // Unoptimised: every access stays a memory access TSan sees, and the 7 builds take half
        // the time of -O1's (4 s against 8), more than the runs lose.
        "-O0",
        // One OS thread per CUDA thread, which TSan sees (the header picks it under TSan anyway;
        // its fibers would show TSan one thread doing everything in order).
        "-DRECIPE_EMU_OS_THREADS",
    ];
    build_cpp(
        "tsan_driver.cpp",
        kernels,
        &flags,
        &exe,
        "a C++20 compiler with libtsan",
    );
    exe
}

/// What one run of the driver left: its exit code, stdout and stderr.
struct Run {
    code: Option<i32>,
    out: String,
    err: String,
}

/// Runs the driver on `groups` (all of them when empty).
fn run(exe: &Path, groups: &[&str]) -> Run {
    let go = |cmd: &mut Command| {
        let out = cmd
            .args(groups)
            .env("TSAN_OPTIONS", "halt_on_error=1 exitcode=66")
            .output()
            .expect("run the TSan driver");
        Run {
            code: out.status.code(),
            out: String::from_utf8_lossy(&out.stdout).into_owned(),
            err: String::from_utf8_lossy(&out.stderr).into_owned(),
        }
    };
    let r = go(&mut Command::new(exe));
    // Some kernels randomise mmap more than GCC 12's TSan runtime expects; it runs without ASLR.
    if r.err.contains("unexpected memory mapping") {
        let arch = std::env::consts::ARCH;
        return go(Command::new("setarch").args([arch, "-R"]).arg(exe));
    }
    r
}

/// A fresh directory for one test's files.
fn scratch(name: &str) -> PathBuf {
    common::scratch(&format!("tsan-{name}"))
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

/// Copies the kernel sources into a temp dir, `edit` applied to `file`, and builds the driver
/// against the copy.
fn build_mutant(name: &str, file: &str, edit: impl Fn(&str) -> String) -> PathBuf {
    let dir = scratch(name);
    mutant_sources(&dir, file, edit);
    build(&dir, &dir)
}

/// Runs `groups` of a mutant driver and asserts TSan reported a data race whose report names
/// `culprit` (the function the barrier was removed from).
fn assert_race_caught(exe: &Path, name: &str, groups: &[&str], culprit: &str) {
    let r = run(exe, groups);
    assert!(
        r.err.contains("ThreadSanitizer: data race"),
        "{name} {groups:?}: the removed __syncthreads went unreported (exit {:?}):\n{}",
        r.code,
        r.err
    );
    assert_eq!(
        r.code,
        Some(66),
        "{name} {groups:?}: TSan's exit code\n{}",
        r.err
    );
    assert!(
        r.err.contains(culprit),
        "{name} {groups:?}: the race report does not name `{culprit}`:\n{}",
        r.err
    );
}

#[test]
fn every_kernel_with_shared_memory_runs_clean_under_tsan() {
    let dir = scratch("clean");
    let exe = build(&dir, &kernels_dir());
    let r = run(&exe, &[]);
    assert!(
        !r.err.contains("ThreadSanitizer"),
        "TSan reported on the shipped kernels:\n{}",
        r.err
    );
    assert_eq!(r.code, Some(0), "the TSan driver failed:\n{}", r.err);
    driver_ran_every_group(&r.out, &r.err);
}

#[test]
fn a_missing_barrier_in_block_sum_d_is_caught() {
    // The double reduction (cross-entropy's Σexp, the gradient norm's passes): the same missing
    // barrier, caught through each kernel family that calls it.
    let exe = build_mutant("block-sum-d", "common.cuh", |t| {
        drop_sync(t, "double block_sum_d(", "scratch[warp] = v;")
    });
    for group in ["loss", "norm"] {
        assert_race_caught(&exe, "block_sum_d", &[group], "block_sum_d");
    }
    // Attention and LayerNorm reduce within warps only: the mutant runs clean there, so the
    // reports above come from block_sum_d, not from the driver.
    for group in ["attention", "layernorm"] {
        let r = run(&exe, &[group]);
        assert!(!r.err.contains("ThreadSanitizer"), "{group}: {}", r.err);
    }
}

#[test]
fn a_missing_barrier_in_lamb_tree_is_caught() {
    // Each level of LAMB's halving tree reads slots other threads wrote at the level before.
    let exe = build_mutant("lamb-tree", "optim.cu", |t| {
        drop_sync(t, "void lamb_tree(", "for (int h")
    });
    assert_race_caught(&exe, "lamb_tree", &["lamb"], "lamb_tree");
}

#[test]
fn a_missing_barrier_in_last_of_column_is_caught() {
    // Thread 0 writes whether its block is the last of its column; the others read it after the
    // barrier.
    let exe = build_mutant("last-of-column", "common.cuh", |t| {
        drop_sync(t, "bool last_of_column(", "if (threadIdx.x == 0)")
    });
    assert_race_caught(&exe, "last_of_column", &["column_sums"], "last_of_column");
}

#[test]
fn a_missing_barrier_in_embedding_bwd_long_is_caught() {
    // Warp 0 adds a tile's rows from shared memory while the other warps wait to store the next
    // tile's over them.
    let exe = build_mutant("embedding-long", "embedding.cu", |t| {
        drop_sync(
            t,
            "void embedding_bwd_long_t(",
            "for (int t = 0; t < tiles; t++)",
        )
    });
    assert_race_caught(
        &exe,
        "embedding_bwd_long",
        &["embedding"],
        "embedding_bwd_long",
    );
}

#[test]
fn a_missing_barrier_between_the_long_attentions_chunks_is_caught() {
    // attention_fused_long's warps read a chunk's keys from shared memory while the next chunk
    // is loaded over them, unless every warp has met the barrier before the load
    // (`chunk_products`, which attention_bwd_dq_long shares).
    let exe = build_mutant("attention-long", "attention.cu", |t| {
        drop_sync(
            t,
            "void chunk_products(",
            "const FusedAt& a, int c0, int n, int seq) {",
        )
    });
    assert_race_caught(
        &exe,
        "attention_fused_long",
        &["fused_attention"],
        "attention_fused_long",
    );
}

#[test]
fn a_missing_barrier_between_attention_bwd_dkvs_products_is_caught() {
    // The second product's operands are transposed into the room the first one's warps read.
    let exe = build_mutant("attention-dkv", "attention.cu", |t| {
        drop_sync(t, "void attention_bwd_dkv_t(", "for (int phase = 0;")
    });
    assert_race_caught(
        &exe,
        "attention_bwd_dkv",
        &["fused_attention"],
        "attention_bwd_dkv",
    );
}
