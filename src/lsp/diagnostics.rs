//! Diagnostics as the editor gets them: the primary span as the range, the help appended to the
//! message, secondary labels as related information, the code linked to its documentation.
//! The documentation of every code travels in the binary (the `### CODE name` sections of
//! docs/), so a hover on a diagnostic can show it with no network and no checkout.

use lsp_types::{
    CodeDescription, DiagnosticRelatedInformation, DiagnosticSeverity, DiagnosticTag, Location,
    NumberOrString, Uri,
};

use super::document::{Document, Encoding};
use crate::diagnostics::{Diagnostic, Severity};

/// The documentation pages that hold `### CODE name` sections, by path under docs/.
const PAGES: &[(&str, &str)] = &[
    ("diagnostics.md", include_str!("../../docs/diagnostics.md")),
    (
        "rules/data-model-compat.md",
        include_str!("../../docs/rules/data-model-compat.md"),
    ),
    (
        "rules/launch.md",
        include_str!("../../docs/rules/launch.md"),
    ),
    (
        "rules/native.md",
        include_str!("../../docs/rules/native.md"),
    ),
    ("rules/pairs.md", include_str!("../../docs/rules/pairs.md")),
    (
        "rules/precision-zero.md",
        include_str!("../../docs/rules/precision-zero.md"),
    ),
    (
        "rules/schedule-optimizer.md",
        include_str!("../../docs/rules/schedule-optimizer.md"),
    ),
];

/// A code's documentation: the page, the heading (`R0101 batch-mismatch`) and the section's
/// text up to the next heading.
pub struct CodeDoc {
    /// The page under docs/.
    pub page: &'static str,
    /// The heading's text.
    pub heading: &'static str,
    /// The section's text.
    pub body: &'static str,
}

impl CodeDoc {
    /// GitHub's anchor for the heading (lowercase, spaces as dashes).
    pub fn anchor(&self) -> String {
        self.heading
            .chars()
            .filter(|c| c.is_alphanumeric() || *c == ' ' || *c == '-' || *c == '_')
            .map(|c| {
                if c == ' ' {
                    '-'
                } else {
                    c.to_ascii_lowercase()
                }
            })
            .collect()
    }
}

/// The documentation of `code`, if a page has its section.
pub fn code_doc(code: &str) -> Option<CodeDoc> {
    for (page, text) in PAGES {
        let mut offset = 0;
        for line in text.split_inclusive('\n') {
            let start = offset;
            offset += line.len();
            let Some(heading) = line.strip_prefix("### ") else {
                continue;
            };
            let heading = heading.trim_end();
            if heading.split_whitespace().next() != Some(code) {
                continue;
            }
            let rest = &text[offset..];
            let end = rest
                .find("\n#")
                .map_or(rest.len(), |i| i + 1)
                .min(rest.len());
            let _ = start;
            return Some(CodeDoc {
                page,
                heading,
                body: rest[..end].trim(),
            });
        }
    }
    None
}

/// The codes whose finding is an outdated spelling (shown struck through by editors).
const DEPRECATED: &[&str] = &[
    crate::diagnostics::codes::RENAMED_DEEPSPEED_KEY,
    crate::diagnostics::codes::RENAMED_HF_FIELD,
];

/// One diagnostic in the protocol's form.
pub fn to_lsp(
    d: &Diagnostic,
    doc: &Document,
    uri: &Uri,
    enc: Encoding,
    docs_url: Option<&str>,
) -> lsp_types::Diagnostic {
    let mut message = d.message.clone();
    if !d.primary.text.is_empty() && !d.message.contains(&d.primary.text) {
        message.push_str(&format!(" ({})", d.primary.text));
    }
    if let Some(help) = &d.help {
        message.push_str("\nhelp: ");
        message.push_str(help);
    }
    let related: Vec<DiagnosticRelatedInformation> = d
        .secondary
        .iter()
        .map(|l| DiagnosticRelatedInformation {
            location: Location::new(uri.clone(), doc.range(l.span, enc)),
            message: if l.text.is_empty() {
                "related".into()
            } else {
                l.text.clone()
            },
        })
        .collect();
    let code_description = docs_url.and_then(|base| {
        let doc = code_doc(d.code)?;
        let href = format!(
            "{}/{}#{}",
            base.trim_end_matches('/'),
            doc.page,
            doc.anchor()
        );
        Some(CodeDescription {
            href: href.parse().ok()?,
        })
    });
    lsp_types::Diagnostic {
        range: doc.range(d.primary.span, enc),
        severity: Some(match d.severity {
            Severity::Error => DiagnosticSeverity::ERROR,
            Severity::Warning => DiagnosticSeverity::WARNING,
            Severity::Note => DiagnosticSeverity::INFORMATION,
        }),
        code: Some(NumberOrString::String(d.code.to_string())),
        code_description,
        source: Some("recipe".into()),
        message,
        related_information: (!related.is_empty()).then_some(related),
        tags: DEPRECATED
            .contains(&d.code)
            .then(|| vec![DiagnosticTag::DEPRECATED]),
        data: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_code_has_its_documentation_in_the_binary() {
        for (code, name, _) in crate::diagnostics::codes::all() {
            let doc = code_doc(code).unwrap_or_else(|| panic!("{code} has no docs section"));
            assert_eq!(doc.heading, format!("{code} {name}"));
            assert!(!doc.body.is_empty(), "{code}");
            assert!(
                !doc.body.contains("\n### "),
                "{code}: runs into the next section"
            );
        }
        assert_eq!(code_doc("R0101").unwrap().anchor(), "r0101-batch-mismatch");
    }
}
