//! Checking a recipe: parse, then the schema rules; every problem found in one run, in source order.

pub mod raw;
pub mod schema;
pub mod suggest;

use crate::diagnostics::{self, Diagnostic};
use crate::resolve::{self, Options, Resolved};
use crate::rules;
use crate::syntax::{self, ast::File};

/// The outcome of checking one source text.
#[derive(Debug)]
pub struct Checked {
    /// The syntax tree, when the text parsed.
    pub file: Option<File>,
    /// Every finding, in source order.
    pub diagnostics: Vec<Diagnostic>,
}

impl Checked {
    /// True when any finding is an error.
    pub fn has_errors(&self) -> bool {
        self.diagnostics.iter().any(Diagnostic::is_error)
    }
}

/// Parses and checks a recipe's text with no command-line options.
pub fn check_source(text: &str) -> Checked {
    check_source_with(text, &Options::default())
}

/// Parses and checks a recipe's text: syntax, schema, then (when those are clean) resolution
/// and the upstream rules.
pub fn check_source_with(text: &str, options: &Options) -> Checked {
    analyze(text, options).checked
}

/// A check together with the resolved recipe it ran the rules on (for the editor's hovers and
/// hints, which show resolved values without resolving twice).
#[derive(Debug)]
pub struct Analysis {
    /// The check's outcome.
    pub checked: Checked,
    /// The resolved recipe, when syntax and schema were clean.
    pub resolved: Option<Resolved>,
}

/// Like [`check_source_with`], keeping the resolved recipe.
pub fn analyze(text: &str, options: &Options) -> Analysis {
    match syntax::parse(text) {
        Ok(file) => {
            let mut diagnostics = schema::check_for(&file, &options.targets);
            let mut resolved = None;
            if !diagnostics.iter().any(Diagnostic::is_error) {
                let r = resolve::resolve(&file, options);
                diagnostics.extend(rules::check(&r));
                if options.native {
                    rules::native::check(&r, &mut diagnostics);
                }
                resolved = Some(r);
            }
            diagnostics::sort(&mut diagnostics);
            Analysis {
                checked: Checked {
                    file: Some(file),
                    diagnostics,
                },
                resolved,
            }
        }
        Err(mut diagnostics) => {
            diagnostics::sort(&mut diagnostics);
            Analysis {
                checked: Checked {
                    file: None,
                    diagnostics,
                },
                resolved: None,
            }
        }
    }
}
