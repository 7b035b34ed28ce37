//! Fuzzes the data reader against the checker's scan: the property is fuzz/checks/data.rs.

#![no_main]

#[path = "../checks/data.rs"]
mod check;

libfuzzer_sys::fuzz_target!(|data: &[u8]| check::run(data));
