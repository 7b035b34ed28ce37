//! The runtime's integration tests, one module per file of runtime/tests/, in one test binary
//! (one link of the runtime instead of one per file). `cargo test -p recipe-runtime --test suite
//! <file>::` runs one file's tests.

mod common;

mod collective;
mod data;
mod mixed_parity;
mod model;
mod optim;
mod parity;
mod scaler;
