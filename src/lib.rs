//! `recipe`: a compiler for training recipes.
//!
//! The folders read as the pipeline; data flows one way:
//!
//! 1. [`syntax`]: source text → AST with spans (the pest grammar in `grammar/recipe.pest` is the
//!    only parser).
//! 2. [`check`]: the AST against the [`schema`] (every block and key as data: type, default,
//!    the DeepSpeed key and TrainingArguments field it feeds, the stages and kinds it applies
//!    to).
//! 3. [`resolve`]: every value made concrete, with where it came from (written, a flag, a schema
//!    default, derived), plus the batch triple, the sample count and the step accounting.
//! 4. [`rules`]: the upstream rules (DeepSpeed, transformers, accelerate, per target release)
//!    and the native runtime's refusals, one family per file, run on the resolved recipe.
//! 5. [`emit`]: the artefacts — DeepSpeed config JSON, TrainingArguments, the launch command,
//!    the lock file, the native plan that `recipe run` hands to the runtime crate.
//!
//! Beside the pipeline: [`upstream`] holds what the real stack does (per-release facts, step
//! and LR formulas, memory estimators) for the rules, emitters and `recipe explain`;
//! [`diagnostics`] renders every finding (codes, spans, help); [`commands`] is the library side
//! of `recipe explain`, `fmt` and `import`.

// pest is used without its `std` feature (so without its per-rule stack probe: the lexical
// pre-pass already bounds nesting at 64); its generated parser then names `alloc` directly.
extern crate alloc;

pub mod syntax;

pub mod check;
pub mod schema;

pub mod resolve;

pub mod rules;

pub mod emit;

pub mod commands;
pub mod diagnostics;
pub mod upstream;

/// Beside the pipeline: the linter for configs people already have (a DeepSpeed config and its
/// TrainingArguments), replaying the real stack's order of events.
pub mod pair;

/// Beside the pipeline: `recipe lsp`, the language server (diagnostics, hovers, completion,
/// quick fixes and formatting in the editor, all from the stages above).
pub mod lsp;

pub use check::{check_source, Checked};
pub use diagnostics::source::SourceFile;
pub use diagnostics::{Diagnostic, Severity};
