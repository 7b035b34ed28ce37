//! The parser, the checker and the formatter on any text (the `parse` fuzz target; also run
//! over every committed recipe by tests/fuzz_checks.rs, which keeps this file compiling).
//!
//! For any UTF-8 input: `check_source` must not panic, and every diagnostic's spans must lie
//! inside the text, on char boundaries. When the input parses, `format_source` must succeed,
//! its output must parse again, and formatting must be idempotent.

use recipe::commands::format::format_source;
use recipe::diagnostics::Label;
use recipe::{check_source, Diagnostic};

fn check_label(text: &str, d: &Diagnostic, label: &Label, which: &str) {
    let s = label.span;
    assert!(
        s.start <= s.end && s.end <= text.len(),
        "{} {} span {}..{} out of bounds (text is {} bytes): {:?}",
        d.code,
        which,
        s.start,
        s.end,
        text.len(),
        d.message
    );
    assert!(
        text.is_char_boundary(s.start) && text.is_char_boundary(s.end),
        "{} {} span {}..{} not on char boundaries: {:?}",
        d.code,
        which,
        s.start,
        s.end,
        d.message
    );
}

fn check_spans(text: &str, diagnostics: &[Diagnostic]) {
    for d in diagnostics {
        check_label(text, d, &d.primary, "primary");
        for label in &d.secondary {
            check_label(text, d, label, "secondary");
        }
    }
}

pub fn run(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let checked = check_source(text);
    check_spans(text, &checked.diagnostics);
    if checked.file.is_none() {
        return;
    }

    let once = match format_source(text) {
        Ok(out) => out,
        Err(diags) => panic!("check_source parsed the text but format_source did not: {diags:?}"),
    };
    let rechecked = check_source(&once);
    check_spans(&once, &rechecked.diagnostics);
    assert!(
        rechecked.file.is_some(),
        "formatted text no longer parses: {:?}\n--- formatted ---\n{once}",
        rechecked.diagnostics
    );
    let twice = match format_source(&once) {
        Ok(out) => out,
        Err(diags) => {
            panic!("formatted text fails to format again: {diags:?}\n--- formatted ---\n{once}")
        }
    };
    assert_eq!(once, twice, "formatting is not idempotent");
}
