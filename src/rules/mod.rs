//! The upstream rules (docs/diagnostics.md and docs/rules/), one file per family. Each reads
//! the [`Resolved`] recipe only, and reports diagnostics with spans from the values' provenance.
//! Each family lists its codes (`CODES`); [`crate::diagnostics::codes::all`] gathers them.

pub mod batch;
pub mod compat;
pub mod data;
pub mod fix;
pub mod launch;
pub mod model;
pub mod native;
pub mod optimizer;
pub mod precision;
pub mod schedule;
pub mod steps;
pub mod zero;

use crate::diagnostics::Diagnostic;
use crate::resolve::{Resolved, Source};
use crate::syntax::ast::Span;

/// Codes below this are syntax and schema codes; from it on, upstream rules.
pub const FIRST_RULE_CODE: &str = "R0100";

/// A rule family: its name, its codes, its check.
pub struct Family {
    /// The family's name (its file under src/rules/).
    pub name: &'static str,
    /// Code, short name, summary of each diagnostic it reports.
    pub codes: &'static [(&'static str, &'static str, &'static str)],
    /// Runs the family's rules.
    pub check: fn(&Resolved, &mut Vec<Diagnostic>),
}

/// Every rule family, in the order they run.
pub static FAMILIES: &[Family] = &[
    Family {
        name: "batch",
        codes: batch::CODES,
        check: batch::check,
    },
    Family {
        name: "steps",
        codes: steps::CODES,
        check: steps::check,
    },
    Family {
        name: "schedule",
        codes: schedule::CODES,
        check: schedule::check,
    },
    Family {
        name: "optimizer",
        codes: optimizer::CODES,
        check: optimizer::check,
    },
    Family {
        name: "precision",
        codes: precision::CODES,
        check: precision::check,
    },
    Family {
        name: "zero",
        codes: zero::CODES,
        check: zero::check,
    },
    Family {
        name: "data",
        codes: data::CODES,
        check: data::check,
    },
    Family {
        name: "model",
        codes: model::CODES,
        check: model::check,
    },
    Family {
        name: "compat",
        codes: compat::CODES,
        check: compat::check,
    },
    Family {
        name: "launch",
        codes: launch::CODES,
        check: launch::check,
    },
];

/// Runs every rule family.
pub fn check(r: &Resolved) -> Vec<Diagnostic> {
    let mut out = Vec::new();
    for family in FAMILIES {
        (family.check)(r, &mut out);
    }
    for d in &mut out {
        fix::add_target_upgrade(d, r);
        fix::add_named_edits(d, r);
    }
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

/// How a value was set, for labels: "" when written, " (from --gpus 4)", " (default)", ….
pub fn origin(r: &Resolved, key: &str) -> String {
    match r.get(key).map(|s| &s.source) {
        Some(Source::Flag { flag }) => format!(" (from {flag})"),
        Some(Source::Default { .. }) => " (default)".into(),
        Some(Source::Derived { .. }) => " (derived)".into(),
        Some(Source::File { what }) => format!(" ({what})"),
        _ => String::new(),
    }
}
