//! A hand-written parser for recipes that parse cleanly: one pass over the bytes, building the
//! same [`File`] that the pest grammar and the AST builder build (the same nodes, spans and
//! comments), several times faster.
//!
//! It follows grammar/recipe.pest rule by rule, including pest's implicit whitespace: in every
//! non-atomic rule spaces, tabs and a comment may come between two parts, never a newline. It
//! never reports an error: on anything it does not accept (any syntax error, a bad number or
//! escape, `target` not followed by a pair, a byte it does not expect) it returns `None` and
//! [`super::parse`] runs the pest grammar, whose diagnostics are the ones users see. So it only
//! has to agree with pest on what it accepts; `tests` below compares the two trees on every
//! recipe in the repository and on generated text.

use super::ast::*;
use super::parser::Builder;

/// The tree of `text`, or `None` when pest must decide (see the module comment).
pub(super) fn parse(text: &str) -> Option<File> {
    let mut p = Fast {
        text,
        s: text.as_bytes(),
        i: 0,
        comments: Vec::new(),
        builder: Builder::default(),
    };
    let blocks = p.file()?;
    p.builder.errors.is_empty().then_some(File {
        blocks,
        comments: p.comments,
    })
}

fn ident_start(c: u8) -> bool {
    c.is_ascii_alphabetic() || c == b'_'
}

fn ident_char(c: u8) -> bool {
    c.is_ascii_alphanumeric() || c == b'_'
}

struct Fast<'a> {
    text: &'a str,
    s: &'a [u8],
    /// The next byte to read.
    i: usize,
    comments: Vec<Comment>,
    /// For string escapes (its errors make the parse fall back to pest).
    builder: Builder,
}

impl Fast<'_> {
    fn peek(&self) -> Option<u8> {
        self.s.get(self.i).copied()
    }

    fn at_end(&self) -> bool {
        self.i == self.s.len()
    }

    /// pest's implicit skip, `WHITESPACE* (COMMENT WHITESPACE*)*`, recording the comments.
    fn skip(&mut self) {
        loop {
            while matches!(self.peek(), Some(b' ' | b'\t')) {
                self.i += 1;
            }
            if self.peek() != Some(b'#') {
                return;
            }
            let start = self.i;
            let end =
                memchr::memchr2(b'\n', b'\r', &self.s[start..]).map_or(self.s.len(), |k| start + k);
            self.comments.push(Comment {
                text: self.text[start..end].trim_end().to_string(),
                span: Span::new(start, end),
            });
            self.i = end;
        }
    }

    /// Where the skip from `j` would end, recording nothing (a look-ahead).
    fn skipped(&self, mut j: usize) -> usize {
        while matches!(self.s.get(j), Some(b' ' | b'\t')) {
            j += 1;
        }
        if self.s.get(j) == Some(&b'#') {
            // A comment runs to the end of the line: what follows it is a newline or the end.
            j = memchr::memchr2(b'\n', b'\r', &self.s[j..]).map_or(self.s.len(), |k| j + k);
        }
        j
    }

    /// One `NEWLINE` (`\n`, `\r\n` or `\r`).
    fn newline(&mut self) -> bool {
        match self.peek() {
            Some(b'\n') => self.i += 1,
            Some(b'\r') => {
                self.i += if self.s.get(self.i + 1) == Some(&b'\n') {
                    2
                } else {
                    1
                }
            }
            _ => return false,
        }
        true
    }

    /// Skips, then `NEWLINE*` with skips around each.
    fn skip_lines(&mut self) {
        self.skip();
        while self.newline() {
            self.skip();
        }
    }

    /// The end of the identifier starting at `j` (which is an identifier's first byte).
    fn ident_end(&self, mut j: usize) -> usize {
        j += 1;
        while self.s.get(j).copied().is_some_and(ident_char) {
            j += 1;
        }
        j
    }

    /// An identifier at the current byte.
    fn ident(&mut self) -> Option<Ident> {
        if !ident_start(self.peek()?) {
            return None;
        }
        let start = self.i;
        self.i = self.ident_end(start);
        Some(Ident {
            name: self.text[start..self.i].to_string(),
            span: Span::new(start, self.i),
        })
    }

    /// `file = { SOI ~ NEWLINE* ~ (block ~ (NEWLINE+ ~ block)*)? ~ NEWLINE* ~ EOI }`
    fn file(&mut self) -> Option<Vec<Block>> {
        let mut blocks = Vec::new();
        self.skip_lines();
        while !self.at_end() {
            blocks.push(self.block()?);
            self.skip();
            if self.at_end() {
                break;
            }
            if !self.newline() {
                return None;
            }
            self.skip_lines();
        }
        Some(blocks)
    }

    /// `block = { target_block | generic_block }`, with the builder's span fix-up.
    fn block(&mut self) -> Option<Block> {
        let start = self.i;
        let name = self.ident()?;
        if name.name == "target" {
            // `target_block`; when it does not match, pest tries `generic_block`: leave that
            // rare case to pest.
            return self.target_block(name);
        }
        self.skip();
        let label = match self.peek() {
            Some(b'"') => Some(self.string()?),
            Some(b'-' | b'+' | b'0'..=b'9') => Some(self.number()?),
            Some(c) if ident_start(c) => {
                let ident = self.ident()?;
                Some(Value {
                    kind: ValueKind::Ident(ident.name),
                    span: ident.span,
                })
            }
            _ => None,
        };
        if label.is_some() {
            self.skip();
        }
        let body = if self.peek() == Some(b'{') {
            Some(self.body()?)
        } else {
            None
        };
        let end = match (&body, &label) {
            (Some(body), _) => body.span.end,
            (None, Some(label)) => label.span.end,
            (None, None) => name.span.end,
        };
        Some(Block {
            name,
            label,
            body,
            form: BlockForm::Generic,
            span: Span::new(start, end),
        })
    }

    /// `target_block = { kw_target ~ target_pair ~ (comma ~ NEWLINE* ~ target_pair)* }`
    fn target_block(&mut self, name: Ident) -> Option<Block> {
        let mut entries = Vec::new();
        loop {
            self.skip();
            // `target_pair = { key_word ~ value }`
            let word = self.ident()?;
            self.skip();
            let value = self.value()?;
            entries.push(Entry::Item(Item {
                span: Span::new(word.span.start, value.span.end),
                key: Key {
                    text: word.name,
                    span: word.span,
                },
                value,
            }));
            if self.s[self.skipped(self.i)..].first() != Some(&b',') {
                break;
            }
            self.skip();
            self.i += 1; // the comma
            self.skip_lines();
        }
        let first = entries.first().expect("one pair at least").span();
        let body_span = first.to(entries.last().expect("one pair at least").span());
        Some(Block {
            span: Span::new(name.span.start, body_span.end),
            name,
            label: None,
            body: Some(Body {
                entries,
                span: body_span,
            }),
            form: BlockForm::Target,
        })
    }

    /// `body = { lbrace ~ entries ~ rbrace }`, `entries = { sep* ~ (entry ~ (sep+ ~ entry)*)? ~ sep* }`
    fn body(&mut self) -> Option<Body> {
        let start = self.i;
        self.i += 1; // `{`
        let mut entries = Vec::new();
        let mut after_entry = false;
        loop {
            self.skip();
            match self.peek()? {
                b',' => {
                    self.i += 1;
                    after_entry = false;
                }
                b'\n' | b'\r' => {
                    self.newline();
                    after_entry = false;
                }
                b'}' => {
                    self.i += 1;
                    return Some(Body {
                        entries,
                        span: Span::new(start, self.i),
                    });
                }
                _ if after_entry => return None,
                _ => {
                    entries.push(self.entry()?);
                    after_entry = true;
                }
            }
        }
    }

    /// `entry = { key ~ (eq ~ value | body) }`
    fn entry(&mut self) -> Option<Entry> {
        let start = self.i;
        let key = self.key()?;
        self.skip();
        match self.peek()? {
            b'=' => {
                self.i += 1;
                self.skip();
                let value = self.value()?;
                Some(Entry::Item(Item {
                    span: Span::new(start, value.span.end),
                    key,
                    value,
                }))
            }
            b'{' => {
                let body = self.body()?;
                Some(Entry::Section(Section {
                    span: Span::new(start, body.span.end),
                    key,
                    body,
                }))
            }
            _ => None,
        }
    }

    /// `key = { key_word ~ ((dot ~ key_word) | key_word)* }`: words joined by a space, dotted
    /// parts by `.`; the span runs from the first word to the last.
    fn key(&mut self) -> Option<Key> {
        let first = self.ident()?;
        let start = first.span.start;
        let mut text = first.name;
        loop {
            let j = self.skipped(self.i);
            match self.s.get(j) {
                Some(b'.') => {
                    let k = self.skipped(j + 1);
                    if !self.s.get(k).copied().is_some_and(ident_start) {
                        break;
                    }
                    let end = self.ident_end(k);
                    text.push('.');
                    text.push_str(&self.text[k..end]);
                    self.i = end;
                }
                Some(&c) if ident_start(c) => {
                    let end = self.ident_end(j);
                    text.push(' ');
                    text.push_str(&self.text[j..end]);
                    self.i = end;
                }
                _ => break,
            }
        }
        Some(Key {
            text,
            span: Span::new(start, self.i),
        })
    }

    /// `value = { string | number | boolean | call | ident | tuple | list }`
    fn value(&mut self) -> Option<Value> {
        let start = self.i;
        match self.peek()? {
            b'"' => self.string(),
            b'-' | b'+' | b'0'..=b'9' => self.number(),
            b'(' => {
                let items = self.values(b')')?;
                Some(Value {
                    kind: ValueKind::Tuple(items),
                    span: Span::new(start, self.i),
                })
            }
            b'[' => {
                let items = self.values(b']')?;
                Some(Value {
                    kind: ValueKind::List(items),
                    span: Span::new(start, self.i),
                })
            }
            c if ident_start(c) => {
                let end = self.ident_end(start);
                let word = &self.text[start..end];
                if word == "true" || word == "false" {
                    self.i = end;
                    return Some(Value {
                        kind: ValueKind::Bool(word == "true"),
                        span: Span::new(start, end),
                    });
                }
                if self.s.get(self.skipped(end)) == Some(&b'(') {
                    return self.call();
                }
                self.i = end;
                Some(Value {
                    kind: ValueKind::Ident(word.to_string()),
                    span: Span::new(start, end),
                })
            }
            _ => None,
        }
    }

    /// The items of a tuple or list, from its opening bracket to `close` (consumed):
    /// `NEWLINE* ~ (item ~ NEWLINE* ~ (comma ~ NEWLINE* ~ item ~ NEWLINE*)* ~ (comma ~ NEWLINE*)?)?`
    fn items<T>(
        &mut self,
        close: u8,
        mut item: impl FnMut(&mut Self) -> Option<T>,
    ) -> Option<Vec<T>> {
        self.i += 1; // the opening bracket
        let mut items = Vec::new();
        self.skip_lines();
        loop {
            if self.peek()? == close {
                self.i += 1;
                return Some(items);
            }
            items.push(item(self)?);
            self.skip_lines();
            match self.peek()? {
                b',' => {
                    self.i += 1;
                    self.skip_lines();
                }
                c if c == close => {}
                _ => return None,
            }
        }
    }

    fn values(&mut self, close: u8) -> Option<Vec<Value>> {
        self.items(close, Self::value)
    }

    /// `call = { ident ~ lparen ~ … ~ rparen }`, `arg = { named_arg | value }`,
    /// `named_arg = { ident ~ colon ~ value }`
    fn call(&mut self) -> Option<Value> {
        let start = self.i;
        let name = self.ident()?;
        self.skip();
        let args = self.items(b')', |p| {
            if p.peek().is_some_and(ident_start) {
                let end = p.ident_end(p.i);
                let colon = p.skipped(end);
                if p.s.get(colon) == Some(&b':') {
                    let name = p.ident()?;
                    p.skip();
                    p.i += 1; // the colon
                    p.skip();
                    let value = p.value()?;
                    return Some(Arg {
                        name: Some(name),
                        value,
                    });
                }
            }
            Some(Arg {
                name: None,
                value: p.value()?,
            })
        })?;
        Some(Value {
            kind: ValueKind::Call(Call { name, args }),
            span: Span::new(start, self.i),
        })
    }

    /// `string = ${ quote ~ string_inner ~ quote }`: on one line, `\` escaping any character
    /// but a newline; escapes resolved by the builder.
    fn string(&mut self) -> Option<Value> {
        let start = self.i;
        let inner = start + 1;
        let mut j = inner;
        loop {
            let k = j + memchr::memchr3(b'"', b'\\', b'\n', &self.s[j..])?;
            match self.s[k] {
                b'"' => {
                    j = k;
                    break;
                }
                b'\\' if !matches!(self.s.get(k + 1), None | Some(b'\n' | b'\r')) => j = k + 2,
                _ => return None,
            }
        }
        let raw = &self.text[inner..j];
        if raw.contains('\r') {
            return None; // a carriage return ends the line (and the string) for pest
        }
        self.i = j + 1;
        let text = self.builder.unescape(raw, inner);
        Some(Value {
            kind: ValueKind::Str(text),
            span: Span::new(start, self.i),
        })
    }

    /// `number = @{ ("-" | "+")? ~ ASCII_DIGIT ~ ((^"e" ~ ("-" | "+")) | ASCII_ALPHANUMERIC | "." | "_")* ~ "%"? }`,
    /// validated as the builder does.
    fn number(&mut self) -> Option<Value> {
        let start = self.i;
        let mut j = start;
        if matches!(self.s[j], b'-' | b'+') {
            j += 1;
        }
        if !self.s.get(j)?.is_ascii_digit() {
            return None;
        }
        j += 1;
        loop {
            match self.s.get(j) {
                Some(b'e' | b'E') if matches!(self.s.get(j + 1), Some(b'-' | b'+')) => j += 2,
                Some(&c) if c.is_ascii_alphanumeric() || c == b'.' || c == b'_' => j += 1,
                _ => break,
            }
        }
        if self.s.get(j) == Some(&b'%') {
            j += 1;
        }
        let raw = &self.text[start..j];
        let value = super::number::parse(raw).ok()?;
        self.i = j;
        Some(Value {
            kind: ValueKind::Number(Number {
                raw: raw.to_string(),
                value,
            }),
            span: Span::new(start, j),
        })
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::super::{delimiters, parser};

    /// The fast parser accepts no text that pest rejects, and builds pest's tree (spans and
    /// comments included) for every text it accepts. Returns whether it accepted.
    fn agrees(text: &str) -> Result<bool, TestCaseError> {
        if delimiters::scan(text).is_some() {
            return Ok(false); // neither parser sees the text
        }
        let fast = super::parse(text);
        match (parser::parse_with_grammar(text), &fast) {
            (Ok(slow), Some(fast)) => {
                prop_assert_eq!(
                    format!("{slow:#?}"),
                    format!("{fast:#?}"),
                    "text: {:?}",
                    text
                );
                Ok(true)
            }
            (Err(_), Some(_)) => Err(TestCaseError::fail(format!(
                "the fast parser accepts text that pest rejects: {text:?}"
            ))),
            (_, None) => Ok(false),
        }
    }

    fn rcp_files(dir: &std::path::Path, out: &mut Vec<std::path::PathBuf>) {
        for entry in std::fs::read_dir(dir).unwrap().flatten() {
            let path = entry.path();
            if path.is_dir() {
                rcp_files(&path, out);
            } else if path.extension().is_some_and(|e| e == "rcp") {
                out.push(path);
            }
        }
    }

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
        let (mut fast, mut clean) = (0, 0);
        for (path, text) in &recipes {
            let accepted = agrees(text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            let parses =
                delimiters::scan(text).is_none() && parser::parse_with_grammar(text).is_ok();
            fast += usize::from(accepted);
            clean += usize::from(parses);
            // Every recipe that parses takes the fast path, bar `target` written unusually.
            assert!(
                accepted || !parses || text.contains("target"),
                "{}: parses, but not by the fast parser",
                path.display()
            );
        }
        assert!(
            fast * 10 >= clean * 9,
            "{fast} of {clean} clean recipes took the fast path"
        );
    }

    #[test]
    fn corners() {
        for text in [
            "",
            "\n\n",
            "# only a comment",
            "a\r\nb\rc\n",
            "a {}",
            "a { , b = 1,, c = 2 , }",
            "a {\n  b = 1 # one\n  # two\n\n  c { d.e f . g = [1,\n 2, # x\n ] }\n}",
            "model bert { task = classify ( labels : [\"a\", \"b\"], 2 ,) }",
            "x 2 { y = (0.9 , 0.999), z = f(), w = f( a: g(b: 1) ) }",
            "recipe \"cls\" # c",
            "zero -2",
            "target transformers \"5.24.0\", accelerate \"1.15.0\",\n   deepspeed \"0.19.8\"",
            "target transformers \"5\" # c\nmodel x",
            "target { }",
            "target\nx \"1\"",
            "a { b = \"x\\\"y\\\\z\\n\\u{e9}é\" }",
            "a { b = \"bad \\q\" }",
            "a { b = 1.2.3 }",
            "a { b = 3e-5, c = 6%, d = 60M, e = 1_000, f = -1, g = +2, h = 2E+3 }",
            "a { b = true, c = false, d = truex, e = true(1) }",
            "a { b = \"x\ry\" }",
            "a { b = \"x\\\ry\" }",
            "a { b c = 1 }",
            "a { b. = 1 }",
            "a { b = - 1 }",
            "a b c",
            "a { b = 1 } c",
            "a {\r\n b = 1\r\n}\r\n",
            "a { b = f (1) }",
            "a { b = [] , c = () , d = [\n] }",
            "a\u{a0}{ }",
            "\u{feff}a",
        ] {
            agrees(text).unwrap();
        }
    }

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
            agrees(&text)?;
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
            agrees(&text)?;
        }
    }
}
