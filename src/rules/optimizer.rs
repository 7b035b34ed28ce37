//! Optimizer rules (being written).

use crate::diagnostic::Diagnostic;
use crate::resolve::Resolved;

/// This family's codes.
pub const CODES: &[(&str, &str, &str)] = &[];

/// Checks the optimizer rules.
pub fn check(_r: &Resolved, _out: &mut Vec<Diagnostic>) {}
