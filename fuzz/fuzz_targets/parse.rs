//! Fuzzes the parser, the checker and the formatter: the property is fuzz/checks/parse.rs.

#![no_main]

#[path = "../checks/parse.rs"]
mod check;

libfuzzer_sys::fuzz_target!(|data: &[u8]| check::run(data));
