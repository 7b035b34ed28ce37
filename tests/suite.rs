//! The root crate's integration tests, one module per file of tests/, in one test binary (32
//! binaries, one per file, each linked the whole compiler and its dependencies: about 100 s of
//! CI's two cores). `cargo test --test suite fake_cuda::` runs one file's tests. The files' tests
//! run side by side in one process, so the shared scratch folders (common/mod.rs) take a
//! per-process counter into their names.

mod common;

mod agreement;
mod cli;
mod cli_help;
mod conformance;
mod data_files;
mod diagnostics;
mod doc_examples;
mod docs;
mod docs_tables;
mod editors;
mod emit;
mod examples;
mod explain_layout;
mod fake_cuda;
mod fuzz_checks;
mod gpu_scripts;
mod hf_optimizers;
mod import;
mod lsp;
mod lsp_edits;
mod mixed;
mod nodes;
mod optimizers;
mod outputs;
mod owners;
mod pairs;
mod plots;
mod properties;
mod resolve_properties;
mod run;
mod schema_defaults;
mod upstream_tables;
