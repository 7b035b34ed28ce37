//! Fuzzes the pair linter and `recipe import`: the property is fuzz/checks/pair.rs.

#![no_main]

#[path = "../checks/pair.rs"]
mod check;

libfuzzer_sys::fuzz_target!(|data: &[u8]| check::run(data));
