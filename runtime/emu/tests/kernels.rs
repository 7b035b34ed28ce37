//! The emulated kernels' tests (runtime/kernels/*.cu on the CPU against the CPU backend), one
//! module per file, in one test binary; `scripts/emu-asan.sh` runs this binary again with the
//! kernels built with AddressSanitizer. `cargo test -p recipe-kernel-emu --test kernels
//! <file>::` runs one file's tests.

mod common;

mod attention;
mod elementwise;
mod embedding;
mod layernorm;
mod loss;
mod model;
mod optim;
mod peers;
mod profile;
mod selftest;
