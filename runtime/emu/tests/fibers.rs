//! The emulation's scheduler itself (cpp/cuda_emu.hpp, fiber mode), on the kernels of
//! cpp/fiber_check.cpp: threads that return early are not waited for at later `__syncthreads`;
//! 3-D blocks, the largest block and several blocks get the right indices, reductions and
//! shuffles; and a shuffle missing an exited lane is reported and aborts rather than hanging or
//! reading a stale value, as does a shuffle whose mask names lanes a partial warp lacks, and
//! so does a 16-byte or 32-bit access at an address a GPU would refuse as misaligned. Both context switches are checked: the x86-64 assembly the library uses
//! there, and the ucontext one it uses elsewhere (forced with `RECIPE_EMU_UCONTEXT`).

use crate::common;

use std::path::PathBuf;
use std::process::Command;

use common::{build_cpp, kernels_dir, scratch};

/// The checker built with `flags`, in a directory of its own.
fn build(name: &str, flags: &[&str]) -> PathBuf {
    let exe = scratch(&format!("fibers-{name}")).join("fiber_check");
    build_cpp(
        "fiber_check.cpp",
        &kernels_dir(),
        flags,
        &exe,
        "a C++20 compiler",
    );
    exe
}

fn check(flags: &[&str], name: &str) {
    let exe = build(name, flags);
    for group in ["early", "shapes"] {
        let out = Command::new(&exe)
            .arg(group)
            .output()
            .expect("run fiber_check");
        assert!(
            out.status.success(),
            "{name} {group}: {:?}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
    }
    // A lane that exited before a shuffle; a full-mask shuffle in a block of 48 threads (its
    // second warp has 16 lanes); a 16-byte load and a 32-bit pair at misaligned addresses.
    for (group, words) in [
        ("lane-exit", "cannot finish"),
        ("partial-warp", "undefined on a GPU"),
        ("misaligned-16", "ld16 of 16 bytes"),
        ("misaligned-pair", "ld_pair of 4 bytes"),
    ] {
        let out = Command::new(&exe)
            .arg(group)
            .output()
            .expect("run fiber_check");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success(),
            "{name} {group}: the launch returned\n{err}"
        );
        assert!(
            err.contains(words),
            "{name} {group}: {:?}\n{err}",
            out.status
        );
    }
}

#[test]
fn the_fiber_scheduler_keeps_the_execution_model() {
    check(&["-O1"], "default");
}

#[test]
fn the_ucontext_fallback_keeps_it_too() {
    check(&["-O1", "-DRECIPE_EMU_UCONTEXT"], "ucontext");
}
