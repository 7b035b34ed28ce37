//! The syntax tree of a recipe. Every node keeps the byte span it was parsed from.
//!
//! Spans are skipped when a tree is serialized, so two trees that differ only in layout
//! serialize to the same JSON (`parse(fmt(x)) == parse(x)` is tested that way).

use serde::Serialize;

/// A half-open byte range `start..end` into the source text.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize)]
pub struct Span {
    /// First byte.
    pub start: usize,
    /// One past the last byte.
    pub end: usize,
}

impl Span {
    /// A span from `start` to `end`.
    pub fn new(start: usize, end: usize) -> Self {
        Span { start, end }
    }

    /// The smallest span covering both.
    pub fn to(self, other: Span) -> Span {
        Span::new(self.start.min(other.start), self.end.max(other.end))
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.end - self.start
    }

    /// True for an empty span.
    pub fn is_empty(&self) -> bool {
        self.start == self.end
    }
}

/// A parsed `.rcp` file.
#[derive(Debug, Clone, Serialize)]
pub struct File {
    /// The top-level blocks, in source order.
    pub blocks: Vec<Block>,
    /// Every comment, in source order (kept for `recipe fmt`).
    #[serde(skip)]
    pub comments: Vec<Comment>,
}

/// A `# ...` comment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Comment {
    /// The comment text including the leading `#`, without the line break.
    pub text: String,
    /// Where it is.
    pub span: Span,
}

/// An identifier with its span.
#[derive(Debug, Clone, Serialize)]
pub struct Ident {
    /// The identifier.
    pub name: String,
    /// Where it is.
    #[serde(skip)]
    pub span: Span,
}

/// How a block was written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum BlockForm {
    /// `name [label] [{ ... }]`
    Generic,
    /// `target component "version", ...`: the pairs are stored as the body's items.
    Target,
}

/// A top-level block: `model bert { ... }`, `zero 2`, `recipe "cls"`, `target deepspeed "0.19.8"`.
#[derive(Debug, Clone, Serialize)]
pub struct Block {
    /// The block keyword (`model`, `zero`, ...).
    pub name: Ident,
    /// The word after the keyword: `bert`, `2`, `"cls"`, `adamw`.
    pub label: Option<Value>,
    /// The `{ ... }` part, if any.
    pub body: Option<Body>,
    /// How it was written.
    pub form: BlockForm,
    /// The whole block.
    #[serde(skip)]
    pub span: Span,
}

impl Block {
    /// The span of the header: keyword and label.
    pub fn header_span(&self) -> Span {
        match &self.label {
            Some(label) => self.name.span.to(label.span),
            None => self.name.span,
        }
    }
}

/// The braces and what is between them.
#[derive(Debug, Clone, Serialize)]
pub struct Body {
    /// Items and nested sections, in source order.
    pub entries: Vec<Entry>,
    /// From `{` to `}` inclusive (for a `target` block: the pairs).
    #[serde(skip)]
    pub span: Span,
}

/// One entry of a body.
#[derive(Debug, Clone, Serialize)]
pub enum Entry {
    /// `key = value`
    Item(Item),
    /// `key { ... }` (raw blocks only)
    Section(Section),
}

impl Entry {
    /// The entry's key.
    pub fn key(&self) -> &Key {
        match self {
            Entry::Item(item) => &item.key,
            Entry::Section(section) => &section.key,
        }
    }

    /// The whole entry.
    pub fn span(&self) -> Span {
        match self {
            Entry::Item(item) => item.span,
            Entry::Section(section) => section.span,
        }
    }
}

/// `key = value`
#[derive(Debug, Clone, Serialize)]
pub struct Item {
    /// The key.
    pub key: Key,
    /// The value.
    pub value: Value,
    /// The whole item.
    #[serde(skip)]
    pub span: Span,
}

/// `key { ... }`
#[derive(Debug, Clone, Serialize)]
pub struct Section {
    /// The key.
    pub key: Key,
    /// The nested body.
    pub body: Body,
    /// The whole section.
    #[serde(skip)]
    pub span: Span,
}

/// A key: one or more words (`offload optimizer`) or a dotted path (`zero_optimization.stage`).
#[derive(Debug, Clone, Serialize)]
pub struct Key {
    /// Canonical text: words joined by one space, dotted parts by `.`.
    pub text: String,
    /// Where it is.
    #[serde(skip)]
    pub span: Span,
}

/// A value with its span.
#[derive(Debug, Clone, Serialize)]
pub struct Value {
    /// What it is.
    pub kind: ValueKind,
    /// Where it is.
    #[serde(skip)]
    pub span: Span,
}

/// The kinds of values.
#[derive(Debug, Clone, Serialize)]
pub enum ValueKind {
    /// `"text"` (escapes resolved).
    Str(String),
    /// `3`, `3e-5`, `6%`, `60M`.
    Number(Number),
    /// `true`, `false`.
    Bool(bool),
    /// A bare word: an enum value such as `bf16` or `cpu`.
    Ident(String),
    /// `(0.9, 0.999)`
    Tuple(Vec<Value>),
    /// `[1, 2]`
    List(Vec<Value>),
    /// `classify(labels: 2)`
    Call(Call),
}

/// A number literal: the text as written and its value.
#[derive(Debug, Clone, Serialize)]
pub struct Number {
    /// The literal as written (kept by `recipe fmt`).
    pub raw: String,
    /// Its value.
    pub value: NumberValue,
}

/// The value of a number literal.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub enum NumberValue {
    /// An integer: `16`, `60M` (size suffixes are decimal: k = 1e3, M = 1e6, G = 1e9, T = 1e12;
    /// `Ki`/`Mi`/`Gi`/`Ti` are binary).
    Int(i64),
    /// A number with a fraction or exponent: `0.9`, `3e-5`, `1e9`.
    Float(f64),
    /// A percentage: `6%` is `Percent(6.0)`.
    Percent(f64),
}

impl NumberValue {
    /// The value as a float (`6%` is 0.06).
    pub fn as_f64(self) -> f64 {
        match self {
            NumberValue::Int(i) => i as f64,
            NumberValue::Float(f) => f,
            NumberValue::Percent(p) => p / 100.0,
        }
    }

    /// The value as an integer, when it is one (`1e9` and `2.0` are).
    pub fn as_i64(self) -> Option<i64> {
        match self {
            NumberValue::Int(i) => Some(i),
            NumberValue::Float(f) if f.fract() == 0.0 && f.abs() < 9.0e18 => Some(f as i64),
            _ => None,
        }
    }
}

/// `name(arg, name: arg)`
#[derive(Debug, Clone, Serialize)]
pub struct Call {
    /// The function name.
    pub name: Ident,
    /// The arguments in order.
    pub args: Vec<Arg>,
}

/// One call argument.
#[derive(Debug, Clone, Serialize)]
pub struct Arg {
    /// `labels` in `labels: 2`, or none for a positional argument.
    pub name: Option<Ident>,
    /// The value.
    pub value: Value,
}

impl Value {
    /// Words for the kind of this value, for "expected X, found Y" messages.
    pub fn describe(&self) -> String {
        match &self.kind {
            ValueKind::Str(_) => "a string".into(),
            ValueKind::Number(n) => match n.value {
                NumberValue::Int(_) => "an integer".into(),
                NumberValue::Float(_) => "a number".into(),
                NumberValue::Percent(_) => "a percentage".into(),
            },
            ValueKind::Bool(_) => "a boolean".into(),
            ValueKind::Ident(name) => format!("the word `{name}`"),
            ValueKind::Tuple(items) => format!("a tuple of {}", items.len()),
            ValueKind::List(_) => "a list".into(),
            ValueKind::Call(call) => format!("a call `{}(…)`", call.name.name),
        }
    }
}
