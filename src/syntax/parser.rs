//! From source text to [`File`]: the lexical pre-pass, the pest grammar, then the AST builder.

use pest::iterators::{Pair, Pairs};
use pest::Parser as _;

use crate::diagnostics::codes;
use crate::diagnostics::Diagnostic;
use crate::syntax::ast::*;
use crate::syntax::{delimiters, expected, number};

#[derive(pest_derive::Parser)]
#[grammar = "../grammar/recipe.pest"]
struct RecipeParser;

pub use self::Rule as GrammarRule;

/// Parses a recipe. On failure returns the syntax errors (at least one).
pub fn parse(text: &str) -> Result<File, Vec<Diagnostic>> {
    if let Some(d) = delimiters::scan(text) {
        return Err(vec![d]);
    }
    let file_pair = RecipeParser::parse(Rule::file, text)
        .map_err(|e| vec![expected::syntax_error(text, &e)])?
        .next()
        .expect("the file rule always yields one pair");
    let mut builder = Builder::default();
    let mut blocks = Vec::new();
    for part in file_pair.into_inner() {
        match part.as_rule() {
            Rule::block => blocks.push(builder.block(part)),
            Rule::COMMENT => builder.comment(&part),
            _ => {}
        }
    }
    if builder.errors.is_empty() {
        Ok(File {
            blocks,
            comments: builder.comments,
        })
    } else {
        Err(builder.errors)
    }
}

/// Parses a lone value (the right-hand side of `--set key=value`).
pub fn parse_value(text: &str) -> Result<Value, Vec<Diagnostic>> {
    if let Some(d) = delimiters::scan(text) {
        return Err(vec![d]);
    }
    let pair = RecipeParser::parse(Rule::lone_value, text)
        .map_err(|e| vec![expected::syntax_error(text, &e)])?
        .next()
        .expect("the lone_value rule always yields one pair");
    let value_pair = pair
        .into_inner()
        .find(|p| p.as_rule() == Rule::value)
        .expect("lone_value holds a value");
    let mut builder = Builder::default();
    let value = builder.value(value_pair);
    if builder.errors.is_empty() {
        Ok(value)
    } else {
        Err(builder.errors)
    }
}

fn span(pair: &Pair<Rule>) -> Span {
    let s = pair.as_span();
    Span::new(s.start(), s.end())
}

/// Builds the AST from pest's pairs in one pass, in source order: every function walks the
/// children of its pair once, recording the comments it meets (pest puts a comment under the
/// innermost rule whose implicit whitespace holds it) and skipping punctuation.
#[derive(Default)]
struct Builder {
    errors: Vec<Diagnostic>,
    comments: Vec<Comment>,
}

impl Builder {
    fn comment(&mut self, pair: &Pair<Rule>) {
        self.comments.push(Comment {
            text: pair.as_str().trim_end().to_string(),
            span: span(pair),
        });
    }

    /// The next child of `parts` that carries meaning; comments are recorded, punctuation skipped.
    fn next<'i>(&mut self, parts: &mut Pairs<'i, Rule>) -> Option<Pair<'i, Rule>> {
        for part in parts.by_ref() {
            match part.as_rule() {
                Rule::COMMENT => self.comment(&part),
                Rule::lbrace
                | Rule::rbrace
                | Rule::lparen
                | Rule::rparen
                | Rule::lbracket
                | Rule::rbracket
                | Rule::comma
                | Rule::colon
                | Rule::eq
                | Rule::dot => {}
                _ => return Some(part),
            }
        }
        None
    }

    fn ident(&self, pair: Pair<Rule>) -> Ident {
        Ident {
            name: pair.as_str().to_string(),
            span: span(&pair),
        }
    }

    fn block(&mut self, pair: Pair<Rule>) -> Block {
        let inner = pair.into_inner().next().expect("block has one alternative");
        let mut block = match inner.as_rule() {
            Rule::target_block => self.target_block(inner),
            _ => self.generic_block(inner),
        };
        // pest's span can run over trailing blanks and a trailing comment; end at the last part.
        block.span.end = match (&block.body, &block.label) {
            (Some(body), _) => body.span.end,
            (None, Some(label)) => label.span.end,
            (None, None) => block.name.span.end,
        };
        block
    }

    fn target_block(&mut self, pair: Pair<Rule>) -> Block {
        let block_span = span(&pair);
        let mut parts = pair.into_inner();
        let kw = self
            .next(&mut parts)
            .expect("target block starts with its keyword");
        let name = self.ident(kw);
        let mut entries = Vec::new();
        while let Some(target_pair) = self.next(&mut parts) {
            let pair_span = span(&target_pair);
            let mut inner = target_pair.into_inner();
            let word = self.next(&mut inner).expect("target pair has a word");
            let key = Key {
                text: word.as_str().to_string(),
                span: span(&word),
            };
            let value = self.next(&mut inner).expect("target pair has a value");
            let value = self.value(value);
            entries.push(Entry::Item(Item {
                key,
                value,
                span: pair_span,
            }));
        }
        let body_span = match (entries.first(), entries.last()) {
            (Some(a), Some(b)) => a.span().to(b.span()),
            _ => name.span,
        };
        Block {
            name,
            label: None,
            body: Some(Body {
                entries,
                span: body_span,
            }),
            form: BlockForm::Target,
            span: block_span,
        }
    }

    fn generic_block(&mut self, pair: Pair<Rule>) -> Block {
        let block_span = span(&pair);
        let mut parts = pair.into_inner();
        let mut name = None;
        let mut label = None;
        let mut body = None;
        while let Some(part) = self.next(&mut parts) {
            match part.as_rule() {
                Rule::block_name => name = Some(self.ident(part)),
                Rule::block_label => {
                    let v = part.into_inner().next().expect("label has a value");
                    label = Some(self.scalar(v));
                }
                Rule::body => body = Some(self.body(part)),
                other => unreachable!("unexpected {other:?} in a block"),
            }
        }
        Block {
            name: name.expect("generic block has a name"),
            label,
            body,
            form: BlockForm::Generic,
            span: block_span,
        }
    }

    fn body(&mut self, pair: Pair<Rule>) -> Body {
        let body_span = span(&pair);
        let mut parts = pair.into_inner();
        let mut entries = Vec::new();
        while let Some(part) = self.next(&mut parts) {
            // `entries`, the only child that is not punctuation or a comment.
            let mut inner = part.into_inner();
            while let Some(entry) = self.next(&mut inner) {
                entries.push(self.entry(entry));
            }
        }
        Body {
            entries,
            span: body_span,
        }
    }

    fn entry(&mut self, pair: Pair<Rule>) -> Entry {
        let entry_span = span(&pair);
        let mut parts = pair.into_inner();
        let key = self.next(&mut parts).expect("entry has a key");
        let key = self.key(key);
        let rest = self.next(&mut parts).expect("entry has a value or body");
        if rest.as_rule() == Rule::body {
            Entry::Section(Section {
                key,
                body: self.body(rest),
                span: entry_span,
            })
        } else {
            Entry::Item(Item {
                key,
                value: self.value(rest),
                span: entry_span,
            })
        }
    }

    /// Words joined by a space, dotted parts by `.`; the span runs from the first word to the
    /// last (pest's span of `key` can include the blanks after it).
    fn key(&mut self, pair: Pair<Rule>) -> Key {
        let mut text = String::new();
        let mut key_span: Option<Span> = None;
        let mut after_dot = false;
        for part in pair.into_inner() {
            match part.as_rule() {
                Rule::dot => {
                    text.push('.');
                    after_dot = true;
                }
                Rule::key_word => {
                    if !text.is_empty() && !after_dot {
                        text.push(' ');
                    }
                    text.push_str(part.as_str());
                    after_dot = false;
                    let word = span(&part);
                    key_span = Some(key_span.map_or(word, |k| k.to(word)));
                }
                Rule::COMMENT => self.comment(&part),
                _ => {}
            }
        }
        Key {
            text,
            span: key_span.expect("a key has a word"),
        }
    }

    fn value(&mut self, pair: Pair<Rule>) -> Value {
        let inner = if pair.as_rule() == Rule::value {
            let mut parts = pair.into_inner();
            self.next(&mut parts).expect("value has one alternative")
        } else {
            pair
        };
        let value_span = span(&inner);
        let kind = match inner.as_rule() {
            Rule::tuple => ValueKind::Tuple(self.values(inner)),
            Rule::list => ValueKind::List(self.values(inner)),
            Rule::call => ValueKind::Call(self.call(inner)),
            _ => return self.scalar(inner),
        };
        Value {
            kind,
            span: value_span,
        }
    }

    fn call(&mut self, pair: Pair<Rule>) -> Call {
        let mut parts = pair.into_inner();
        let name = self.next(&mut parts).expect("call has a name");
        let name = self.ident(name);
        let mut args = Vec::new();
        while let Some(arg) = self.next(&mut parts) {
            let a = arg.into_inner().next().expect("arg has one alternative");
            args.push(if a.as_rule() == Rule::named_arg {
                let mut inner = a.into_inner();
                let name = self.next(&mut inner).expect("named arg has a name");
                let name = self.ident(name);
                let value = self.next(&mut inner).expect("named arg has a value");
                let value = self.value(value);
                Arg {
                    name: Some(name),
                    value,
                }
            } else {
                Arg {
                    name: None,
                    value: self.value(a),
                }
            });
        }
        Call { name, args }
    }

    fn values(&mut self, pair: Pair<Rule>) -> Vec<Value> {
        let mut parts = pair.into_inner();
        let mut values = Vec::new();
        while let Some(value) = self.next(&mut parts) {
            values.push(self.value(value));
        }
        values
    }

    fn scalar(&mut self, pair: Pair<Rule>) -> Value {
        let value_span = span(&pair);
        let kind = match pair.as_rule() {
            Rule::string => {
                let inner = pair.into_inner().next().expect("string has an inner part");
                ValueKind::Str(self.unescape(inner.as_str(), span(&inner).start))
            }
            Rule::number => {
                let raw = pair.as_str().to_string();
                let value = match number::parse(&raw) {
                    Ok(v) => v,
                    Err(why) => {
                        self.errors.push(
                            Diagnostic::error(
                                codes::BAD_NUMBER,
                                format!("bad number `{raw}`"),
                                value_span,
                            )
                            .with_label(why)
                            .with_help(
                                "numbers look like `16`, `0.9`, `3e-5`, `6%` or `60M` (suffixes k, M, G, T; Ki, Mi, Gi, Ti)",
                            ),
                        );
                        NumberValue::Int(0)
                    }
                };
                ValueKind::Number(Number { raw, value })
            }
            Rule::boolean => ValueKind::Bool(pair.as_str() == "true"),
            Rule::ident => ValueKind::Ident(pair.as_str().to_string()),
            other => unreachable!("{other:?} is not a scalar"),
        };
        Value {
            kind,
            span: value_span,
        }
    }

    /// Resolves the escapes of a string's text starting at byte `offset`.
    fn unescape(&mut self, raw: &str, offset: usize) -> String {
        let mut out = String::with_capacity(raw.len());
        let mut chars = raw.char_indices().peekable();
        while let Some((i, c)) = chars.next() {
            if c != '\\' {
                out.push(c);
                continue;
            }
            let Some((j, e)) = chars.next() else { break };
            match e {
                '"' => out.push('"'),
                '\\' => out.push('\\'),
                'n' => out.push('\n'),
                't' => out.push('\t'),
                'r' => out.push('\r'),
                'u' => {
                    let rest = &raw[j + 1..];
                    let decoded = rest
                        .strip_prefix('{')
                        .and_then(|r| r.split_once('}'))
                        .and_then(|(hex, _)| {
                            let ch = u32::from_str_radix(hex, 16).ok().and_then(char::from_u32)?;
                            Some((ch, hex.len() + 2))
                        });
                    match decoded {
                        Some((ch, len)) => {
                            out.push(ch);
                            for _ in 0..len {
                                chars.next();
                            }
                        }
                        None => self.bad_escape(offset + i, offset + j + e.len_utf8(), "\\u"),
                    }
                }
                _ => {
                    let end = offset + j + e.len_utf8();
                    self.bad_escape(offset + i, end, &format!("\\{e}"));
                }
            }
        }
        out
    }

    fn bad_escape(&mut self, start: usize, end: usize, what: &str) {
        self.errors.push(
            Diagnostic::error(
                codes::BAD_ESCAPE,
                format!("unknown escape `{what}` in a string"),
                Span::new(start, end),
            )
            .with_label("not an escape")
            .with_help(r#"the escapes are \" \\ \n \t \r and \u{hex}; write \\ for a backslash"#),
        );
    }
}
