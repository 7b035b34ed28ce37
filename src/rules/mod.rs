//! The upstream rules (../shared/reference/ds_hf_rules.md §10), one file per family. Each reads
//! the [`Resolved`] recipe only, and reports diagnostics with spans from the values' provenance.

pub mod batch;
pub mod steps;

use crate::diagnostic::Diagnostic;
use crate::resolve::Resolved;
use crate::syntax::ast::Span;

/// Runs every rule family.
pub fn check(r: &Resolved) -> Vec<Diagnostic> {
    let mut out = Vec::new();
    batch::check(r, &mut out);
    steps::check(r, &mut out);
    out
}

/// Where to point for a value: where it was written, else the block it belongs to, else the
/// start of the file (values from flags and defaults have no span of their own).
pub fn anchor(r: &Resolved, key: &str) -> Span {
    r.span(key)
        .or_else(|| {
            key.split('.')
                .next()
                .and_then(|b| r.block_spans.get(b).copied())
        })
        .unwrap_or_default()
}

/// "`batch.micro` = 16 (written)" style: the value and how it was set, for messages.
pub fn origin(r: &Resolved, key: &str) -> String {
    match r.get(key).map(|s| &s.source) {
        Some(crate::resolve::Source::Flag { flag }) => format!(" (from {flag})"),
        Some(crate::resolve::Source::Default { .. }) => " (default)".into(),
        Some(crate::resolve::Source::Derived { .. }) => " (derived)".into(),
        Some(crate::resolve::Source::File { what }) => format!(" ({what})"),
        _ => String::new(),
    }
}
