//! Turns pest's "expected one of these rules" into a sentence a person reads.

use pest::error::{Error, ErrorVariant, InputLocation};

use crate::diagnostics::codes;
use crate::diagnostics::Diagnostic;
use crate::syntax::ast::Span;
use crate::syntax::parser::GrammarRule as Rule;

/// Words for a grammar rule; `None` for rules that never need to be named.
fn words(rule: Rule) -> Option<&'static str> {
    Some(match rule {
        // After a complete block, the file may end or the line must.
        Rule::EOI => "the end of the line",
        Rule::file | Rule::block | Rule::generic_block | Rule::block_name | Rule::kw_target => {
            "a block such as `model` or `data`"
        }
        Rule::target_pair => "a component and its version, as in `deepspeed \"0.19.8\"`",
        Rule::block_label => "a label such as `bert`, `2` or `\"name\"`",
        Rule::body | Rule::lbrace => "`{`",
        Rule::rbrace => "`}`",
        Rule::entries | Rule::entry | Rule::key | Rule::key_word => "an item (`key = value`)",
        Rule::eq => "`=`",
        Rule::dot => "`.`",
        Rule::value | Rule::call | Rule::tuple | Rule::list | Rule::arg => "a value",
        Rule::named_arg => "an argument (`name: value`)",
        Rule::string => "a string",
        Rule::number => "a number",
        Rule::boolean => "`true` or `false`",
        Rule::ident => "a name",
        Rule::lparen => "`(`",
        Rule::rparen => "`)`",
        Rule::lbracket => "`[`",
        Rule::rbracket => "`]`",
        Rule::comma => "`,`",
        Rule::colon => "`:`",
        _ => return None,
    })
}

/// What sits at `pos`, in words.
fn found(text: &str, pos: usize) -> (String, Span) {
    let rest = &text[pos..];
    let Some(c) = rest.chars().next() else {
        return ("the end of the file".into(), Span::new(pos, pos));
    };
    if c == '\n' || c == '\r' {
        return (
            "the end of the line".into(),
            Span::new(pos, pos + c.len_utf8()),
        );
    }
    if c.is_alphanumeric() || c == '_' {
        let len: usize = rest
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_' || *c == '.' || *c == '%')
            .map(char::len_utf8)
            .sum();
        return (format!("`{}`", &rest[..len]), Span::new(pos, pos + len));
    }
    if c == '"' {
        let len = rest[1..].find('"').map_or(rest.len(), |i| i + 2);
        return (format!("`{}`", &rest[..len]), Span::new(pos, pos + len));
    }
    (format!("`{c}`"), Span::new(pos, pos + c.len_utf8()))
}

fn join(items: &[&str]) -> String {
    match items {
        [] => String::new(),
        [one] => one.to_string(),
        [init @ .., last] => format!("{} or {}", init.join(", "), last),
    }
}

/// The diagnostic for a grammar failure.
pub fn syntax_error(text: &str, error: &Error<Rule>) -> Diagnostic {
    let pos = match error.location {
        InputLocation::Pos(p) => p,
        InputLocation::Span((s, _)) => s,
    }
    .min(text.len());
    let mut expected: Vec<&str> = match &error.variant {
        ErrorVariant::ParsingError { positives, .. } => {
            positives.iter().filter_map(|r| words(*r)).collect()
        }
        ErrorVariant::CustomError { .. } => Vec::new(),
    };
    // pest does not report the built-in NEWLINE rule: where an item or a block may end, a line
    // break is also allowed, so say so.
    if expected.iter().any(|e| *e == "`}`" || *e == "`{`") {
        expected.push("the end of the line");
    }
    // Inside a key, `=` is what people mean; more words or a dot are possible but unhelpful.
    if expected.contains(&"`=`") {
        expected.retain(|e| *e == "`=`");
    }
    expected.sort_unstable();
    expected.dedup();
    let (what, at) = found(text, pos);
    let message = if expected.is_empty() {
        format!("unexpected {what}")
    } else {
        format!("expected {}, found {what}", join(&expected))
    };
    let help = if expected.contains(&"`=`") {
        "an item is written `key = value`; items are separated by new lines or commas"
    } else if expected.contains(&"a value") {
        "values are strings (\"...\"), numbers (16, 3e-5, 6%, 60M), true/false, words (bf16), tuples (0.9, 0.999), lists [..] or calls (classify(labels: 2))"
    } else if expected.iter().any(|e| e.starts_with("a block"))
        || expected == ["the end of the line"]
    {
        "each block starts on its own line, and its `{` must be on the same line as its name"
    } else if expected.contains(&"`}`") {
        "items are separated by new lines or commas; `}` closes the block"
    } else if expected.contains(&"`)`") || expected.contains(&"`]`") {
        "elements are separated by commas; call arguments are written `name: value`"
    } else {
        "see docs/language.md for the syntax"
    };
    Diagnostic::error(codes::SYNTAX, message, at)
        .with_label("unexpected here")
        .with_help(help)
}
