//! `recipe`: a compiler for training recipes.
//!
//! Data flows one way: source text → [`syntax`] (pest grammar, AST with spans) →
//! [`check`] (schema rules, later the upstream DeepSpeed/HF rules) → diagnostics
//! ([`diagnostic`]), and → [`format`] for `recipe fmt`.

// pest is used without its `std` feature (so without its per-rule stack probe: the lexical
// pre-pass already bounds nesting at 64); its generated parser then names `alloc` directly.
extern crate alloc;

pub mod atomic;
pub mod check;
pub mod codes;
pub mod diagnostic;
pub mod emit;
pub mod explain;
pub mod format;
pub mod import;
pub mod lr;
pub mod memory;
pub mod resolve;
pub mod rules;
pub mod schedules;
pub mod schema;
pub mod skips;
pub mod source;
pub mod steps;
pub mod syntax;
pub mod versions;

pub use check::{check_source, Checked};
pub use diagnostic::{Diagnostic, Severity};
pub use source::SourceFile;
