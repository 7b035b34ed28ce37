//! Tests of the parser on every recipe in the repository, on corner cases and on generated and
//! mutated text: it never panics, every tree it builds is well formed (each node's span holds
//! exactly the text the node says, in source order), and every text it refuses gets at least one
//! diagnostic inside the text.

use proptest::prelude::*;

use super::ast::*;
use super::parse;
use crate::diagnostics::Diagnostic;

/// Checks `cond`, or fails with the message.
macro_rules! ensure {
    ($cond:expr, $($msg:tt)+) => {
        if !$cond {
            return Err(format!($($msg)+));
        }
    };
}

/// The text of `span`, checking that it lies inside `text` on character boundaries.
fn at(text: &str, span: Span) -> Result<&str, String> {
    text.get(span.start..span.end)
        .ok_or_else(|| format!("{span:?} is not a slice of a text of {} bytes", text.len()))
}

/// Where the comments of a text that parses are: each `#` outside a string runs to the end of its
/// line (a string runs from `"` to the next unescaped `"`).
fn comment_spans(text: &str) -> Vec<Span> {
    let bytes = text.as_bytes();
    let mut spans = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'"' => {
                i += 1;
                while i < bytes.len() && bytes[i] != b'"' {
                    i += if bytes[i] == b'\\' { 2 } else { 1 };
                }
                i += 1;
            }
            b'#' => {
                let end = text[i..].find(['\n', '\r']).map_or(text.len(), |k| i + k);
                spans.push(Span::new(i, end));
                i = end;
            }
            _ => i += 1,
        }
    }
    spans
}

/// Checks the tree of `text`: every comment, in order; spans in order and inside their parents,
/// and each node's text.
fn well_formed(text: &str, file: &File) -> Result<(), String> {
    let spans: Vec<Span> = file.comments.iter().map(|c| c.span).collect();
    ensure!(spans == comment_spans(text), "comments at {spans:?}");
    for c in &file.comments {
        let s = at(text, c.span)?;
        ensure!(
            c.text == s.trim_end(),
            "comment text {:?} for {s:?}",
            c.text
        );
    }
    let mut end = 0;
    for block in &file.blocks {
        ensure!(
            block.span.start >= end,
            "blocks out of order at {:?}",
            block.span
        );
        ident(text, &block.name)?;
        ensure!(
            block.span.start == block.name.span.start,
            "block {:?} does not start at its name",
            block.span
        );
        let last = match (&block.body, &block.label) {
            (Some(body), _) => body.span.end,
            (None, Some(label)) => label.span.end,
            (None, None) => block.name.span.end,
        };
        ensure!(
            block.span.end == last,
            "block {:?} does not end at its last part",
            block.span
        );
        if let Some(label) = &block.label {
            ensure!(
                matches!(
                    label.kind,
                    ValueKind::Str(_) | ValueKind::Number(_) | ValueKind::Ident(_)
                ),
                "label {label:?} is not a string, number or name"
            );
            value(text, label, block.name.span.end, block.span.end)?;
        }
        match (&block.body, block.form) {
            (Some(body), BlockForm::Target) => {
                ensure!(
                    block.name.name == "target",
                    "a target block named {}",
                    block.name.name
                );
                ensure!(!body.entries.is_empty(), "a target block without pairs");
                let first = body.entries[0].span();
                let last = body.entries[body.entries.len() - 1].span();
                ensure!(body.span == first.to(last), "target body {:?}", body.span);
                for entry in &body.entries {
                    let Entry::Item(item) = entry else {
                        return Err("a section in a target block".into());
                    };
                    ensure!(
                        !item.key.text.contains([' ', '.']),
                        "target key {:?}",
                        item.key.text
                    );
                }
                entries(text, &body.entries, body.span.start, body.span.end)?;
            }
            (Some(body), BlockForm::Generic) => self::body(text, body, block.name.span.end)?,
            (None, form) => ensure!(form == BlockForm::Generic, "a target block without pairs"),
        }
        end = block.span.end;
    }
    Ok(())
}

fn ident(text: &str, ident: &Ident) -> Result<(), String> {
    let s = at(text, ident.span)?;
    ensure!(
        s == ident.name,
        "name {:?} at {:?}, which holds {s:?}",
        ident.name,
        ident.span
    );
    ensure!(
        s.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_')
            && s.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'),
        "{s:?} is not a name"
    );
    Ok(())
}

/// A `{ }` body starting at or after `from`.
fn body(text: &str, body: &Body, from: usize) -> Result<(), String> {
    let s = at(text, body.span)?;
    ensure!(
        body.span.start >= from,
        "body {:?} before {from}",
        body.span
    );
    ensure!(
        s.starts_with('{') && s.ends_with('}'),
        "body {s:?} is not braced"
    );
    entries(text, &body.entries, body.span.start + 1, body.span.end - 1)
}

/// Entries in order inside `from..to`.
fn entries(text: &str, entries: &[Entry], mut from: usize, to: usize) -> Result<(), String> {
    for entry in entries {
        let span = entry.span();
        ensure!(
            span.start >= from && span.end <= to,
            "entry {span:?} outside {from}..{to}"
        );
        let key = entry.key();
        ensure!(
            span.start == key.span.start,
            "entry {span:?} does not start at its key"
        );
        // The key's text is its words, joined by one space, or by `.` without spaces; its span
        // runs from the first word to the last.
        let words = at(text, key.span)?;
        let word_char = |c: char| c.is_ascii_alphanumeric() || c == '_';
        ensure!(
            words.starts_with(word_char) && words.ends_with(word_char),
            "key {:?} at {:?}, which holds {words:?}",
            key.text,
            key.span
        );
        let mut expected = String::new();
        for (i, part) in words.split('.').enumerate() {
            if i > 0 {
                expected.push('.');
            }
            expected.push_str(
                &part
                    .split([' ', '\t'])
                    .filter(|w| !w.is_empty())
                    .collect::<Vec<_>>()
                    .join(" "),
            );
        }
        ensure!(
            key.text == expected,
            "key {:?} at {:?}, which holds {words:?}",
            key.text,
            key.span
        );
        match entry {
            Entry::Item(item) => {
                ensure!(
                    span.end == item.value.span.end,
                    "item {span:?} does not end at its value"
                );
                value(text, &item.value, key.span.end, span.end)?;
            }
            Entry::Section(section) => {
                ensure!(
                    span.end == section.body.span.end,
                    "section {span:?} does not end at its body"
                );
                body(text, &section.body, key.span.end)?;
            }
        }
        from = span.end;
    }
    Ok(())
}

/// A value inside `from..to`.
fn value(text: &str, value: &Value, from: usize, to: usize) -> Result<(), String> {
    let span = value.span;
    ensure!(
        span.start >= from && span.end <= to,
        "value {span:?} outside {from}..{to}"
    );
    let s = at(text, span)?;
    match &value.kind {
        ValueKind::Str(_) => ensure!(
            s.len() >= 2 && s.starts_with('"') && s.ends_with('"'),
            "string {s:?} is not quoted"
        ),
        ValueKind::Number(n) => ensure!(
            n.raw == s,
            "number {:?} at {span:?}, which holds {s:?}",
            n.raw
        ),
        ValueKind::Bool(b) => ensure!(
            s == b.to_string(),
            "boolean {b} at {span:?}, which holds {s:?}"
        ),
        ValueKind::Ident(name) => ident(
            text,
            &Ident {
                name: name.clone(),
                span,
            },
        )?,
        ValueKind::Tuple(items) => {
            ensure!(s.starts_with('(') && s.ends_with(')'), "tuple {s:?}");
            values(text, items.iter(), span)?;
        }
        ValueKind::List(items) => {
            ensure!(s.starts_with('[') && s.ends_with(']'), "list {s:?}");
            values(text, items.iter(), span)?;
        }
        ValueKind::Call(call) => {
            ident(text, &call.name)?;
            ensure!(
                call.name.span.start == span.start && s.ends_with(')'),
                "call {s:?}"
            );
            let mut from = call.name.span.end;
            for arg in &call.args {
                if let Some(name) = &arg.name {
                    ident(text, name)?;
                    ensure!(
                        name.span.start >= from,
                        "argument name {:?} out of order",
                        name.span
                    );
                    from = name.span.end;
                }
                self::value(text, &arg.value, from, span.end - 1)?;
                from = arg.value.span.end;
            }
        }
    }
    Ok(())
}

/// Elements in order inside the brackets of `outer`.
fn values<'a>(
    text: &str,
    items: impl Iterator<Item = &'a Value>,
    outer: Span,
) -> Result<(), String> {
    let mut from = outer.start + 1;
    for item in items {
        value(text, item, from, outer.end - 1)?;
        from = item.span.end;
    }
    Ok(())
}

/// Diagnostics of a refused text: at least one, each with a message and spans inside the text.
fn refused(text: &str, diagnostics: &[Diagnostic]) -> Result<(), String> {
    ensure!(!diagnostics.is_empty(), "refused without a diagnostic");
    for d in diagnostics {
        ensure!(
            !d.message.is_empty(),
            "a diagnostic without a message: {d:?}"
        );
        for label in std::iter::once(&d.primary).chain(&d.secondary) {
            at(text, label.span).map_err(|e| format!("{e} in {d:?}"))?;
        }
    }
    Ok(())
}

/// Parses `text` and checks what comes back; returns whether it parsed.
fn check(text: &str) -> Result<bool, String> {
    match parse(text) {
        Ok(file) => well_formed(text, &file).map(|()| true),
        Err(diagnostics) => refused(text, &diagnostics).map(|()| false),
    }
    .map_err(|e| format!("{e}\ntext: {text:?}"))
}

/// The `.rcp` files under `dir`, leaving out hidden folders (`conformance/.venv`) and what runs
/// leave in the tree (`recipes/out/`).
fn rcp_files(dir: &std::path::Path, out: &mut Vec<std::path::PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            let name = entry.file_name();
            let name = name.to_string_lossy();
            if !name.starts_with('.') && name != "out" {
                rcp_files(&path, out);
            }
        } else if path.extension().is_some_and(|e| e == "rcp") {
            out.push(path);
        }
    }
}

/// Every `.rcp` file in the repository (recipes, tests, conformance cases, fuzz seeds).
fn repository_recipes() -> Vec<(std::path::PathBuf, String)> {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = Vec::new();
    for dir in ["recipes", "tests", "conformance", "fuzz/seeds"] {
        if root.join(dir).is_dir() {
            rcp_files(&root.join(dir), &mut files);
        }
    }
    files.sort();
    files
        .into_iter()
        .filter_map(|p| Some((p.clone(), std::fs::read_to_string(&p).ok()?)))
        .collect()
}

#[test]
fn every_recipe_in_the_repository() {
    let recipes = repository_recipes();
    assert!(recipes.len() > 100, "found {} recipes", recipes.len());
    let mut parsed = 0;
    for (path, text) in &recipes {
        let ok = check(text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        parsed += usize::from(ok);
    }
    // Most recipes parse; the rest are the syntax-error fixtures of tests/diagnostics.
    assert!(
        parsed * 10 >= recipes.len() * 8,
        "{parsed} of {} recipes parse",
        recipes.len()
    );
}

#[test]
fn corners() {
    // (text, the code of the first diagnostic, or "" when it parses)
    for (text, code) in [
        ("", ""),
        ("\n\n", ""),
        ("# only a comment", ""),
        ("a\r\nb\rc\n", ""),
        ("a {}", ""),
        ("a { , b = 1,, c = 2 , }", ""),
        (
            "a {\n  b = 1 # one\n  # two\n\n  c { d.e f . g = [1,\n 2, # x\n ] }\n}",
            "",
        ),
        (
            "model bert { task = classify ( labels : [\"a\", \"b\"], 2 ,) }",
            "",
        ),
        (
            "x 2 { y = (0.9 , 0.999), z = f(), w = f( a: g(b: 1) ) }",
            "",
        ),
        ("recipe \"cls\" # c", ""),
        ("zero -2", ""),
        (
            "target transformers \"5.24.0\", accelerate \"1.15.0\",\n   deepspeed \"0.19.8\"",
            "",
        ),
        ("target transformers \"5\" # c\nmodel x", ""),
        ("target { }", ""),
        ("target\nx \"1\"", ""),
        ("a { b = \"x\\\"y\\\\z\\n\\u{e9}é\" }", ""),
        ("a { b = \"bad \\q\" }", "R0006"),
        ("a { b = 1.2.3 }", "R0005"),
        (
            "a { b = 3e-5, c = 6%, d = 60M, e = 1_000, f = -1, g = +2, h = 2E+3 }",
            "",
        ),
        ("a { b = true, c = false, d = truex, e = true(1) }", "R0001"),
        ("a { b = \"x\ry\" }", "R0002"),
        ("a { b = \"x\\\ry\" }", "R0002"),
        ("a { b c = 1 }", ""),
        ("a { b. = 1 }", "R0001"),
        ("a { b = - 1 }", "R0001"),
        ("a b c", "R0001"),
        ("a { b = 1 } c", "R0001"),
        ("a {\r\n b = 1\r\n}\r\n", ""),
        ("a { b = f (1) }", ""),
        ("a { b = [] , c = () , d = [\n] }", ""),
        ("a\u{a0}{ }", "R0001"),
        ("\u{feff}a", "R0001"),
    ] {
        let parsed = check(text).unwrap();
        match parse(text) {
            Ok(_) => assert_eq!(code, "", "{text:?} parses"),
            Err(d) => assert_eq!(d[0].code, code, "{text:?}: {}", d[0].message),
        }
        assert_eq!(parsed, code.is_empty());
    }
}

#[test]
fn tree_details() {
    let text = "a {\n  b = 1 # one\n  # two\n\n  c { d.e f . g = [1,\n 2, # x\n ] }\n}\ntarget x \"1\", y \"2\"  # t\n";
    let file = parse(text).unwrap();
    let comments: Vec<&str> = file.comments.iter().map(|c| c.text.as_str()).collect();
    assert_eq!(comments, ["# one", "# two", "# x", "# t"]);
    let Some(Entry::Section(c)) = file.blocks[0].body.as_ref().unwrap().entries.get(1) else {
        panic!("no section");
    };
    assert_eq!(c.body.entries[0].key().text, "d.e f.g");
    let target = &file.blocks[1];
    assert_eq!(target.form, BlockForm::Target);
    let keys: Vec<&str> = target
        .body
        .as_ref()
        .unwrap()
        .entries
        .iter()
        .map(|e| e.key().text.as_str())
        .collect();
    assert_eq!(keys, ["x", "y"]);
    // The block ends at its last pair, before the blanks and the comment.
    assert_eq!(
        &text[target.span.start..target.span.end],
        "target x \"1\", y \"2\""
    );
}

/// Pieces of recipes, whole and broken, that generated texts are made of.
const FRAGMENTS: &[&str] = &[
    "model",
    "bert",
    "target",
    "transformers",
    "zero",
    "x_1",
    "true",
    "false",
    "f",
    "a:",
    " ",
    " ",
    "\t",
    "\n",
    "\n",
    "\r\n",
    "\r",
    "# c\n",
    "#",
    "{",
    "}",
    "{",
    "}",
    "(",
    ")",
    "[",
    "]",
    ",",
    ",",
    "=",
    "=",
    ":",
    ".",
    "\"5.1\"",
    "\"a\\\"b\"",
    "\"\\q\"",
    "\"",
    "\\",
    "1",
    "-2",
    "+",
    "-",
    "3e-5",
    "6%",
    "60M",
    "1.2.3",
    "12abc",
    "é",
    "\u{a0}",
];

fn soup() -> impl Strategy<Value = String> {
    prop::collection::vec(prop::sample::select(FRAGMENTS), 0..40).prop_map(|v| v.concat())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(3000))]

    #[test]
    fn token_soup(text in soup()) {
        check(&text).map_err(TestCaseError::fail)?;
    }

    #[test]
    fn mutated_recipes(
        pick in any::<prop::sample::Index>(),
        edits in prop::collection::vec(
            (any::<prop::sample::Index>(), prop::sample::select(FRAGMENTS), 0usize..3),
            1..4,
        ),
    ) {
        static RECIPES: std::sync::OnceLock<Vec<String>> = std::sync::OnceLock::new();
        let recipes = RECIPES.get_or_init(|| {
            repository_recipes().into_iter().map(|(_, t)| t).collect()
        });
        let mut text = pick.get(recipes).clone();
        for (at, fragment, deleted) in edits {
            let mut i = at.index(text.len() + 1);
            while !text.is_char_boundary(i) {
                i -= 1;
            }
            let mut j = i;
            for _ in 0..deleted {
                if let Some(c) = text[j..].chars().next() {
                    j += c.len_utf8();
                }
            }
            text.replace_range(i..j, fragment);
        }
        check(&text).map_err(TestCaseError::fail)?;
    }
}
