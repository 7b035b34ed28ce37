//! A lexical pre-pass over the source: strings, comments and bracket nesting.
//!
//! It runs before the grammar so that the commonest mistakes get a precise diagnostic
//! (an unterminated string where it starts, an unclosed `{` where it opens) instead of
//! the parser's "expected ..." at a later position, and so that absurdly deep nesting is
//! refused before the recursive-descent parser could exhaust the stack. It knows only what
//! grammar/recipe.pest says about strings (`"` to `"` on one line, `\` escapes) and comments
//! (`#` to the end of the line).

use crate::diagnostics::codes;
use crate::diagnostics::Diagnostic;
use crate::syntax::ast::Span;

/// Deeper nesting than this is refused (R0007); real recipes nest two or three levels.
pub const MAX_DEPTH: usize = 64;

fn closer(open: u8) -> u8 {
    match open {
        b'{' => b'}',
        b'(' => b')',
        _ => b']',
    }
}

/// Returns the first lexical problem, if any.
pub fn scan(text: &str) -> Option<Diagnostic> {
    let bytes = text.as_bytes();
    let mut stack: Vec<(u8, usize)> = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'#' => {
                while i < bytes.len() && bytes[i] != b'\n' && bytes[i] != b'\r' {
                    i += 1;
                }
                continue;
            }
            b'"' => {
                let start = i;
                i += 1;
                loop {
                    match bytes.get(i) {
                        None | Some(b'\n') | Some(b'\r') => {
                            return Some(unterminated_string(text, start, i));
                        }
                        Some(b'"') => break,
                        Some(b'\\') if matches!(bytes.get(i + 1), Some(b'\n' | b'\r') | None) => {
                            return Some(unterminated_string(text, start, i + 1));
                        }
                        Some(b'\\') => i += 2,
                        Some(_) => i += 1,
                    }
                }
            }
            open @ (b'{' | b'(' | b'[') => {
                stack.push((open, i));
                if stack.len() > MAX_DEPTH {
                    return Some(
                        Diagnostic::error(
                            codes::NESTING_TOO_DEEP,
                            format!("nesting deeper than {MAX_DEPTH} levels"),
                            Span::new(i, i + 1),
                        )
                        .with_label("too deep here")
                        .with_help(
                            "recipes nest a few levels at most; check for a runaway bracket",
                        ),
                    );
                }
            }
            close @ (b'}' | b')' | b']') => match stack.pop() {
                Some((open, _)) if closer(open) == close => {}
                Some((open, at)) => {
                    return Some(
                        Diagnostic::error(
                            codes::UNEXPECTED_CLOSER,
                            format!("mismatched closing delimiter `{}`", close as char),
                            Span::new(i, i + 1),
                        )
                        .with_label(format!("expected `{}` here", closer(open) as char))
                        .with_secondary(
                            Span::new(at, at + 1),
                            format!("this `{}` is still open", open as char),
                        )
                        .with_help(format!(
                            "close the `{}` with `{}` before this `{}`",
                            open as char,
                            closer(open) as char,
                            close as char
                        )),
                    );
                }
                None => {
                    return Some(
                        Diagnostic::error(
                            codes::UNEXPECTED_CLOSER,
                            format!("unexpected closing delimiter `{}`", close as char),
                            Span::new(i, i + 1),
                        )
                        .with_label("nothing is open here")
                        .with_help("remove it, or add the opening delimiter it belongs to"),
                    );
                }
            },
            _ => {}
        }
        i += 1;
    }
    // The innermost open delimiter is the one that is missing its closer.
    stack.pop().map(|(open, at)| {
        let end = text.len();
        Diagnostic::error(
            codes::UNCLOSED_DELIMITER,
            format!("this `{}` is never closed", open as char),
            Span::new(at, at + 1),
        )
        .with_label("opened here")
        .with_secondary(
            Span::new(end, end),
            format!(
                "expected `{}` before the end of the file",
                closer(open) as char
            ),
        )
        .with_help(format!("add the missing `{}`", closer(open) as char))
    })
}

fn unterminated_string(text: &str, start: usize, end: usize) -> Diagnostic {
    let end = end.min(text.len());
    // The quote goes after the line's last character that is not a space.
    let close = start + text[start..end].trim_end().len();
    Diagnostic::error(
        codes::UNTERMINATED_STRING,
        "unterminated string",
        Span::new(start, end),
    )
    .with_label("this string has no closing `\"`")
    .with_help("close it with `\"` on the same line; strings cannot span lines (write `\\n` for a line break)")
    .with_fix("close the string at the end of the line", Span::new(close, close), "\"")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn balanced_source_passes() {
        assert!(scan("a { b = (1, [2]) } # { not counted\nc = \"}\"").is_none());
    }

    #[test]
    fn finds_the_innermost_unclosed_brace() {
        let d = scan("a {\n b { x = 1 \n}").unwrap();
        assert_eq!(d.code, codes::UNCLOSED_DELIMITER);
        assert_eq!(d.primary.span, Span::new(2, 3));
    }

    #[test]
    fn unterminated_string_spans_to_line_end() {
        let d = scan("x = \"abc\ny").unwrap();
        assert_eq!(d.code, codes::UNTERMINATED_STRING);
        assert_eq!(d.primary.span, Span::new(4, 8));
    }

    #[test]
    fn deep_nesting_is_refused() {
        let d = scan(&"[".repeat(1000)).unwrap();
        assert_eq!(d.code, codes::NESTING_TOO_DEEP);
    }
}
