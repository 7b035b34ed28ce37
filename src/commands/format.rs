//! `recipe fmt`: canonical layout, comments kept, idempotent.
//!
//! Canonical means: one block per line group, two-space indentation, `=` aligned within runs of
//! consecutive items, one space after commas, strings re-escaped, numbers as written. A body
//! written on one line stays on one line when it fits and holds no comments; at most one blank
//! line is kept where the source had any. Comments stay where they were: on their own line
//! before what follows them, or at the end of the line they ended.

use crate::diagnostics::Diagnostic;
use crate::syntax::ast::*;

/// Lines longer than this are not produced by joining a body onto one line.
const MAX_INLINE: usize = 100;

/// Formats a recipe's text, or returns its syntax errors.
pub fn format_source(text: &str) -> Result<String, Vec<Diagnostic>> {
    let file = crate::syntax::parse(text)?;
    Ok(format_file(&file, text))
}

/// Formats a parsed file; `text` is the source it was parsed from (for comments and blank lines).
pub fn format_file(file: &File, text: &str) -> String {
    let mut p = Printer {
        src: text,
        comments: &file.comments,
        next: 0,
    };
    let mut lines: Vec<Line> = Vec::new();
    for block in &file.blocks {
        p.leading(block.span.start, &mut lines);
        let mut rendered = p.block(block);
        p.inner_leftovers(block.span.end, 0, &mut rendered);
        lines.push(Line::Raw(rendered));
    }
    p.leading(text.len(), &mut lines);
    let mut out = render(&lines, 0);
    if !out.ends_with('\n') && !out.is_empty() {
        out.push('\n');
    }
    out
}

/// One output line (or a pre-rendered group of lines).
enum Line {
    Blank,
    Comment(String),
    Item {
        key: String,
        value: String,
        trailing: Option<String>,
    },
    Raw(String),
}

struct Printer<'a> {
    src: &'a str,
    comments: &'a [Comment],
    next: usize,
}

fn indent(level: usize) -> String {
    "  ".repeat(level)
}

fn render(lines: &[Line], level: usize) -> String {
    let pad = indent(level);
    let mut out = String::new();
    let mut i = 0;
    while i < lines.len() {
        match &lines[i] {
            Line::Blank => out.push('\n'),
            Line::Comment(c) => {
                out.push_str(&pad);
                out.push_str(c);
                out.push('\n');
            }
            Line::Raw(r) => {
                out.push_str(r);
                out.push('\n');
            }
            Line::Item { .. } => {
                // A run of consecutive items shares one `=` column.
                let run_end = lines[i..]
                    .iter()
                    .position(|l| !matches!(l, Line::Item { .. }))
                    .map_or(lines.len(), |n| i + n);
                let width = lines[i..run_end]
                    .iter()
                    .map(|l| match l {
                        Line::Item { key, .. } => key.chars().count(),
                        _ => 0,
                    })
                    .max()
                    .unwrap_or(0);
                for line in &lines[i..run_end] {
                    if let Line::Item {
                        key,
                        value,
                        trailing,
                    } = line
                    {
                        let gap = width - key.chars().count();
                        out.push_str(&format!("{pad}{key}{} = {value}", " ".repeat(gap)));
                        if let Some(t) = trailing {
                            out.push_str("  ");
                            out.push_str(t);
                        }
                        out.push('\n');
                    }
                }
                i = run_end;
                continue;
            }
        }
        i += 1;
    }
    // Never end with blank lines.
    while out.ends_with("\n\n") {
        out.pop();
    }
    if out.ends_with('\n') {
        out.pop();
    }
    out
}

impl Printer<'_> {
    /// True when the source has a blank line right before `pos`.
    fn blank_before(&self, pos: usize) -> bool {
        let before = &self.src[..pos.min(self.src.len())];
        let ws = before.len() - before.trim_end().len();
        before[before.len() - ws..].matches('\n').count() >= 2
    }

    /// Own-line comments before `pos` (and blank lines between them) become lines.
    fn leading(&mut self, pos: usize, lines: &mut Vec<Line>) {
        while let Some(c) = self.comments.get(self.next).filter(|c| c.span.start < pos) {
            self.blank(c.span.start, lines);
            lines.push(Line::Comment(c.text.clone()));
            self.next += 1;
        }
        if pos < self.src.len() {
            self.blank(pos, lines);
        }
    }

    fn blank(&self, pos: usize, lines: &mut Vec<Line>) {
        if !lines.is_empty() && !matches!(lines.last(), Some(Line::Blank)) && self.blank_before(pos)
        {
            lines.push(Line::Blank);
        }
    }

    /// The next comment, if it starts on the same line as `end` (after it).
    fn trailing(&mut self, end: usize) -> Option<String> {
        let c = self.comments.get(self.next)?;
        if c.span.start >= end && !self.src[end..c.span.start].contains(['\n', '\r']) {
            self.next += 1;
            Some(c.text.clone())
        } else {
            None
        }
    }

    /// Comments left inside `..end` (e.g. inside a multi-line list) go on their own lines after.
    fn inner_leftovers(&mut self, end: usize, level: usize, rendered: &mut String) {
        if let Some(t) = self.trailing(end) {
            rendered.push_str("  ");
            rendered.push_str(&t);
        }
        while let Some(c) = self.comments.get(self.next).filter(|c| c.span.start < end) {
            rendered.push('\n');
            rendered.push_str(&indent(level));
            rendered.push_str(&c.text);
            self.next += 1;
        }
        if let Some(t) = self.trailing(end) {
            rendered.push_str("  ");
            rendered.push_str(&t);
        }
    }

    fn has_comment_within(&self, span: Span) -> bool {
        self.comments[self.next..]
            .iter()
            .any(|c| c.span.start >= span.start && c.span.start < span.end)
    }

    fn block(&mut self, block: &Block) -> String {
        let mut head = block.name.name.clone();
        if block.form == BlockForm::Target {
            let pairs: Vec<String> = block
                .body
                .iter()
                .flat_map(|b| &b.entries)
                .filter_map(|e| match e {
                    Entry::Item(item) => Some(format!("{} {}", item.key.text, value(&item.value))),
                    Entry::Section(_) => None,
                })
                .collect();
            return format!("{head} {}", pairs.join(", "));
        }
        if let Some(label) = &block.label {
            head.push(' ');
            head.push_str(&value(label));
        }
        match &block.body {
            None => head,
            Some(body) => self.body(head, body, 0),
        }
    }

    /// `head { ... }` at indentation `level`.
    fn body(&mut self, head: String, body: &Body, level: usize) -> String {
        let pad = indent(level);
        let one_line_in_source = !self.src[body.span.start..body.span.end].contains(['\n', '\r']);
        if body.entries.is_empty() && !self.has_comment_within(body.span) {
            return format!("{pad}{head} {{}}");
        }
        if one_line_in_source
            && !self.has_comment_within(body.span)
            && body.entries.iter().all(|e| matches!(e, Entry::Item(_)))
        {
            let items: Vec<String> = body
                .entries
                .iter()
                .filter_map(|e| match e {
                    Entry::Item(item) => {
                        Some(format!("{} = {}", item.key.text, value(&item.value)))
                    }
                    Entry::Section(_) => None,
                })
                .collect();
            let line = format!("{pad}{head} {{ {} }}", items.join(", "));
            if line.chars().count() <= MAX_INLINE {
                return line;
            }
        }
        let mut out = format!("{pad}{head} {{");
        let first = body
            .entries
            .first()
            .map_or(body.span.end, |e| e.span().start);
        // A comment on the `{` line, before the first entry, stays on that line.
        let before_first = self
            .comments
            .get(self.next)
            .is_some_and(|c| c.span.start < first);
        if before_first {
            if let Some(t) = self.trailing(body.span.start + 1) {
                out.push_str("  ");
                out.push_str(&t);
            }
        }
        let mut lines = Vec::new();
        for entry in &body.entries {
            self.leading(entry.span().start, &mut lines);
            match entry {
                Entry::Item(item) => {
                    let v = value(&item.value);
                    // In a body written on one line, a comment can only follow the `}`.
                    let mut trailing = if one_line_in_source {
                        None
                    } else {
                        self.trailing(item.span.end)
                    };
                    // Comments inside a multi-line value follow the item on their own lines.
                    let mut inner = Vec::new();
                    while let Some(c) = self
                        .comments
                        .get(self.next)
                        .filter(|c| c.span.start < item.span.end)
                    {
                        inner.push(Line::Comment(c.text.clone()));
                        self.next += 1;
                    }
                    if trailing.is_none() && !inner.is_empty() && !one_line_in_source {
                        trailing = self.trailing(item.span.end);
                    }
                    lines.push(Line::Item {
                        key: item.key.text.clone(),
                        value: v,
                        trailing,
                    });
                    lines.extend(inner);
                }
                Entry::Section(section) => {
                    let mut rendered =
                        self.body(section.key.text.clone(), &section.body, level + 1);
                    self.inner_leftovers(section.span.end, level + 1, &mut rendered);
                    lines.push(Line::Raw(rendered));
                }
            }
        }
        // Comments after the last entry, before `}`.
        let close = body.span.end.saturating_sub(1);
        self.leading(close, &mut lines);
        let inner = render(&lines, level + 1);
        if !inner.is_empty() {
            out.push('\n');
            out.push_str(&inner);
        }
        out.push('\n');
        out.push_str(&pad);
        out.push('}');
        out
    }
}

/// A value in canonical form.
pub fn value(v: &Value) -> String {
    match &v.kind {
        ValueKind::Str(s) => quote(s),
        ValueKind::Number(n) => n.raw.clone(),
        ValueKind::Bool(b) => b.to_string(),
        ValueKind::Ident(w) => w.clone(),
        ValueKind::Tuple(items) => format!("({})", join(items)),
        ValueKind::List(items) => format!("[{}]", join(items)),
        ValueKind::Call(call) => {
            let args: Vec<String> = call
                .args
                .iter()
                .map(|a| match &a.name {
                    Some(n) => format!("{}: {}", n.name, value(&a.value)),
                    None => value(&a.value),
                })
                .collect();
            format!("{}({})", call.name.name, args.join(", "))
        }
    }
}

fn join(items: &[Value]) -> String {
    items.iter().map(value).collect::<Vec<_>>().join(", ")
}

/// A string literal for `s`, escaped so that it parses back to `s`.
pub fn quote(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\t' => out.push_str("\\t"),
            '\r' => out.push_str("\\r"),
            c if c.is_control() => out.push_str(&format!("\\u{{{:x}}}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}
