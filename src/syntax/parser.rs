//! From source text to [`File`]: the lexical pre-pass, the pest grammar, then the AST builder.

use pest::iterators::Pair;
use pest::Parser as _;

use crate::codes;
use crate::diagnostic::Diagnostic;
use crate::syntax::ast::*;
use crate::syntax::{delimiters, expected, number};

#[derive(pest_derive::Parser)]
#[grammar = "../grammar/recipe.pest"]
struct RecipeParser;

pub use self::Rule as GrammarRule;

/// Parses a recipe. On failure returns the syntax errors (at least one).
///
/// A text that parses cleanly is read by the hand-written parser in `fast.rs`, which builds the
/// same tree several times faster; anything else goes to the pest grammar, which finds and
/// explains the errors.
pub fn parse(text: &str) -> Result<File, Vec<Diagnostic>> {
    if let Some(d) = delimiters::scan(text) {
        return Err(vec![d]);
    }
    if let Some(file) = super::fast::parse(text) {
        return Ok(file);
    }
    parse_with_grammar(text)
}

/// [`parse`] by the pest grammar alone (after the lexical pre-pass).
pub(super) fn parse_with_grammar(text: &str) -> Result<File, Vec<Diagnostic>> {
    let mut pairs = RecipeParser::parse(Rule::file, text)
        .map_err(|e| vec![expected::syntax_error(text, &e)])?;
    let file_pair = pairs.next().expect("the file rule always yields one pair");
    let comments = file_pair
        .clone()
        .into_inner()
        .flatten()
        .filter(|p| p.as_rule() == Rule::COMMENT)
        .map(|p| Comment {
            text: p.as_str().trim_end().to_string(),
            span: span(&p),
        })
        .collect();
    let mut builder = Builder::default();
    let blocks = file_pair
        .into_inner()
        .filter(|p| p.as_rule() == Rule::block)
        .map(|p| builder.block(p))
        .collect();
    if builder.errors.is_empty() {
        Ok(File { blocks, comments })
    } else {
        Err(builder.errors)
    }
}

/// Parses a lone value (the right-hand side of `--set key=value`).
pub fn parse_value(text: &str) -> Result<Value, Vec<Diagnostic>> {
    if let Some(d) = delimiters::scan(text) {
        return Err(vec![d]);
    }
    let mut pairs = RecipeParser::parse(Rule::lone_value, text)
        .map_err(|e| vec![expected::syntax_error(text, &e)])?;
    let pair = pairs
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

/// Pairs that carry meaning (punctuation and comments are skipped).
fn meaningful(pair: Pair<Rule>) -> impl Iterator<Item = Pair<Rule>> {
    pair.into_inner().filter(|p| {
        !matches!(
            p.as_rule(),
            Rule::COMMENT
                | Rule::lbrace
                | Rule::rbrace
                | Rule::lparen
                | Rule::rparen
                | Rule::lbracket
                | Rule::rbracket
                | Rule::comma
                | Rule::colon
                | Rule::eq
                | Rule::dot
                | Rule::kw_target
        )
    })
}

#[derive(Default)]
pub(super) struct Builder {
    pub(super) errors: Vec<Diagnostic>,
}

impl Builder {
    fn ident(&self, pair: Pair<Rule>) -> Ident {
        Ident {
            name: pair.as_str().to_string(),
            span: span(&pair),
        }
    }

    fn block(&mut self, pair: Pair<Rule>) -> Block {
        let mut block = self.block_parts(pair);
        // pest's span can run over trailing blanks and a trailing comment; end at the last part.
        block.span.end = match (&block.body, &block.label) {
            (Some(body), _) => body.span.end,
            (None, Some(label)) => label.span.end,
            (None, None) => block.name.span.end,
        };
        block
    }

    fn block_parts(&mut self, pair: Pair<Rule>) -> Block {
        let inner = pair.into_inner().next().expect("block has one alternative");
        let block_span = span(&inner);
        match inner.as_rule() {
            Rule::target_block => {
                let kw = inner
                    .clone()
                    .into_inner()
                    .find(|p| p.as_rule() == Rule::kw_target)
                    .expect("target block starts with its keyword");
                let name = self.ident(kw);
                let entries: Vec<Entry> = meaningful(inner)
                    .map(|pair| {
                        let pair_span = span(&pair);
                        let mut parts = meaningful(pair);
                        let word = parts.next().expect("target pair has a word");
                        let key = Key {
                            text: word.as_str().to_string(),
                            span: span(&word),
                        };
                        let value = self.value(parts.next().expect("target pair has a value"));
                        Entry::Item(Item {
                            key,
                            value,
                            span: pair_span,
                        })
                    })
                    .collect();
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
            _ => {
                let mut name = None;
                let mut label = None;
                let mut body = None;
                for part in meaningful(inner) {
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
        }
    }

    fn body(&mut self, pair: Pair<Rule>) -> Body {
        let body_span = span(&pair);
        let entries_pair = meaningful(pair)
            .find(|p| p.as_rule() == Rule::entries)
            .expect("body has entries");
        let entries = meaningful(entries_pair)
            .filter(|p| p.as_rule() == Rule::entry)
            .map(|p| self.entry(p))
            .collect();
        Body {
            entries,
            span: body_span,
        }
    }

    fn entry(&mut self, pair: Pair<Rule>) -> Entry {
        let entry_span = span(&pair);
        let mut parts = meaningful(pair);
        let key = self.key(parts.next().expect("entry has a key"));
        let rest = parts.next().expect("entry has a value or body");
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

    fn key(&self, pair: Pair<Rule>) -> Key {
        // pest's span of `key` can include whitespace after the last word; use the words'.
        let mut key_span = span(&pair);
        let words: Vec<Span> = pair
            .clone()
            .into_inner()
            .filter(|p| p.as_rule() == Rule::key_word)
            .map(|p| span(&p))
            .collect();
        if let (Some(first), Some(last)) = (words.first(), words.last()) {
            key_span = first.to(*last);
        }
        let mut text = String::new();
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
                }
                _ => {}
            }
        }
        Key {
            text,
            span: key_span,
        }
    }

    fn value(&mut self, pair: Pair<Rule>) -> Value {
        let inner = if pair.as_rule() == Rule::value {
            pair.into_inner()
                .find(|p| p.as_rule() != Rule::COMMENT)
                .expect("value has one alternative")
        } else {
            pair
        };
        let value_span = span(&inner);
        let kind = match inner.as_rule() {
            Rule::tuple => ValueKind::Tuple(self.values(inner)),
            Rule::list => ValueKind::List(self.values(inner)),
            Rule::call => {
                let mut parts = meaningful(inner);
                let name = self.ident(parts.next().expect("call has a name"));
                let args = parts
                    .filter(|p| p.as_rule() == Rule::arg)
                    .map(|arg| {
                        let a = arg.into_inner().next().expect("arg has one alternative");
                        if a.as_rule() == Rule::named_arg {
                            let mut p = meaningful(a);
                            let name = self.ident(p.next().expect("named arg has a name"));
                            let value = self.value(p.next().expect("named arg has a value"));
                            Arg {
                                name: Some(name),
                                value,
                            }
                        } else {
                            Arg {
                                name: None,
                                value: self.value(a),
                            }
                        }
                    })
                    .collect();
                ValueKind::Call(Call { name, args })
            }
            _ => return self.scalar(inner),
        };
        Value {
            kind,
            span: value_span,
        }
    }

    fn values(&mut self, pair: Pair<Rule>) -> Vec<Value> {
        meaningful(pair)
            .filter(|p| p.as_rule() == Rule::value)
            .map(|p| self.value(p))
            .collect()
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
    pub(super) fn unescape(&mut self, raw: &str, offset: usize) -> String {
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
