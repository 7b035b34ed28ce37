//! JSON as the real stack reads it (Python's `json.load`), keeping the span of every key and
//! value so that a finding points at its line and column.
//!
//! The parse is jsonc-parser's (dprint's span-keeping parser) with every extension switched off
//! but the one Python accepts too: `NaN`, `Infinity` and `-Infinity` (`json.loads` takes them by
//! default). Python's other reading rules are applied here: a number with a fraction or an
//! exponent is a float, others are ints; a key given twice keeps its last value (`dict`
//! semantics), which [`duplicate_keys`] reports.

use jsonc_parser::ast;
use jsonc_parser::{parse_to_ast, CollectOptions, ParseOptions};

use crate::syntax::ast::Span;

/// A JSON value with its span.
#[derive(Debug, Clone, PartialEq)]
pub struct Node {
    /// The value's text in the file.
    pub span: Span,
    /// What it is.
    pub kind: Kind,
}

/// The kinds of JSON value, as Python's `json` module reads them.
#[derive(Debug, Clone, PartialEq)]
pub enum Kind {
    /// `null` (Python `None`).
    Null,
    /// `true` / `false`.
    Bool(bool),
    /// A number without fraction or exponent (Python `int`); beyond i128 it is kept as a float.
    Int(i128),
    /// A number with a fraction or exponent, or `NaN` / `Infinity` (Python `float`).
    Float(f64),
    /// A string.
    Str(String),
    /// An array.
    Array(Vec<Node>),
    /// An object, members in file order (duplicates kept; the last one counts).
    Object(Vec<Member>),
}

/// One `"key": value` of an object.
#[derive(Debug, Clone, PartialEq)]
pub struct Member {
    /// The key, unquoted.
    pub key: String,
    /// The key's text, quotes included.
    pub key_span: Span,
    /// The value.
    pub value: Node,
}

/// Why a text is not JSON: where, and the parser's words.
#[derive(Debug, Clone, PartialEq)]
pub struct SyntaxError {
    /// Where the parser stopped.
    pub span: Span,
    /// What it expected.
    pub message: String,
}

/// Parses a whole JSON text.
pub fn parse(text: &str) -> Result<Node, SyntaxError> {
    let options = ParseOptions {
        allow_comments: false,
        allow_loose_object_property_names: false,
        allow_trailing_commas: false,
        allow_missing_commas: false,
        allow_single_quoted_strings: false,
        allow_hexadecimal_numbers: false,
        allow_unary_plus_numbers: false,
        allow_bare_decimal_point_numbers: false,
        allow_non_finite_numbers: true,
        allow_extended_string_escapes: false,
    };
    let parsed = parse_to_ast(text, &CollectOptions::default(), &options).map_err(|e| {
        let r = e.range();
        SyntaxError {
            span: Span::new(r.start, r.end.max(r.start)),
            message: e.kind().to_string(),
        }
    })?;
    match parsed.value {
        Some(v) => Ok(convert(v)),
        None => Err(SyntaxError {
            span: Span::new(0, text.len().min(1)),
            message: "the file holds no JSON value".into(),
        }),
    }
}

fn span(r: jsonc_parser::common::Range) -> Span {
    Span::new(r.start, r.end)
}

fn convert(v: ast::Value<'_>) -> Node {
    match v {
        ast::Value::NullKeyword(n) => Node {
            span: span(n.range),
            kind: Kind::Null,
        },
        ast::Value::BooleanLit(b) => Node {
            span: span(b.range),
            kind: Kind::Bool(b.value),
        },
        ast::Value::NumberLit(n) => Node {
            span: span(n.range),
            kind: number(n.value),
        },
        ast::Value::StringLit(s) => Node {
            span: span(s.range),
            kind: Kind::Str(s.value.into_owned()),
        },
        ast::Value::Array(a) => Node {
            span: span(a.range),
            kind: Kind::Array(a.elements.into_iter().map(convert).collect()),
        },
        ast::Value::Object(o) => Node {
            span: span(o.range),
            kind: Kind::Object(
                o.properties
                    .into_iter()
                    .map(|p| {
                        let (key, key_span) = match p.name {
                            ast::ObjectPropName::String(s) => (s.value.into_owned(), span(s.range)),
                            ast::ObjectPropName::Word(w) => (w.value.to_string(), span(w.range)),
                        };
                        Member {
                            key,
                            key_span,
                            value: convert(p.value),
                        }
                    })
                    .collect(),
            ),
        },
    }
}

/// Python's reading of a JSON number: `int` unless it has a fraction or an exponent.
fn number(text: &str) -> Kind {
    match text {
        "NaN" | "-NaN" => return Kind::Float(f64::NAN),
        "Infinity" => return Kind::Float(f64::INFINITY),
        "-Infinity" => return Kind::Float(f64::NEG_INFINITY),
        _ => {}
    }
    if !text.contains(['.', 'e', 'E']) {
        if let Ok(i) = text.parse::<i128>() {
            return Kind::Int(i);
        }
    }
    Kind::Float(text.parse().unwrap_or(f64::NAN))
}

impl Node {
    /// The members of an object (empty for anything else).
    pub fn members(&self) -> &[Member] {
        match &self.kind {
            Kind::Object(m) => m,
            _ => &[],
        }
    }

    /// The member `key` of an object, as Python's dict holds it (the last one given).
    pub fn member(&self, key: &str) -> Option<&Member> {
        self.members().iter().rev().find(|m| m.key == key)
    }

    /// The value at a dotted path (`zero_optimization.stage`).
    pub fn get(&self, path: &str) -> Option<&Node> {
        path.split('.')
            .try_fold(self, |node, part| node.member(part).map(|m| &m.value))
    }

    /// The member at a dotted path (for its key span).
    pub fn get_member(&self, path: &str) -> Option<&Member> {
        let (parent, last) = match path.rsplit_once('.') {
            Some((p, l)) => (self.get(p)?, l),
            None => (self, path),
        };
        parent.member(last)
    }

    /// True for the string `"auto"`.
    pub fn is_auto(&self) -> bool {
        matches!(&self.kind, Kind::Str(s) if s == "auto")
    }

    /// The value as Python holds it.
    pub fn to_py(&self) -> Py {
        match &self.kind {
            Kind::Null => Py::None,
            Kind::Bool(b) => Py::Bool(*b),
            Kind::Int(i) => Py::Int(*i),
            Kind::Float(f) => Py::Float(*f),
            Kind::Str(s) => Py::Str(s.clone()),
            Kind::Array(items) => Py::List(items.iter().map(Node::to_py).collect()),
            Kind::Object(members) => {
                let mut out: Vec<(String, Py)> = Vec::with_capacity(members.len());
                for m in members {
                    let v = m.value.to_py();
                    match out.iter_mut().find(|(k, _)| *k == m.key) {
                        Some(slot) => slot.1 = v,
                        None => out.push((m.key.clone(), v)),
                    }
                }
                Py::Dict(out)
            }
        }
    }
}

/// Every key given twice in an object: (the key, the earlier key's span, the later key's span).
pub fn duplicate_keys(node: &Node, out: &mut Vec<(String, Span, Span)>) {
    match &node.kind {
        Kind::Object(members) => {
            for (i, m) in members.iter().enumerate() {
                if let Some(later) = members[i + 1..].iter().find(|n| n.key == m.key) {
                    out.push((m.key.clone(), m.key_span, later.key_span));
                }
                duplicate_keys(&m.value, out);
            }
        }
        Kind::Array(items) => items.iter().for_each(|n| duplicate_keys(n, out)),
        _ => {}
    }
}

/// A value as Python holds it, with Python's `==` ([`Py::py_eq`]) and `str()` ([`Py::show`]).
#[derive(Debug, Clone, PartialEq)]
pub enum Py {
    /// `None`.
    None,
    /// `bool` (which Python compares equal to the ints 0 and 1).
    Bool(bool),
    /// `int`.
    Int(i128),
    /// `float`.
    Float(f64),
    /// `str`.
    Str(String),
    /// `list`.
    List(Vec<Py>),
    /// `dict`, insertion order.
    Dict(Vec<(String, Py)>),
}

impl Py {
    /// The value as a number, for `bool`, `int` and `float` (Python's numeric tower).
    pub fn number(&self) -> Option<f64> {
        match self {
            Py::Bool(b) => Some(f64::from(u8::from(*b))),
            Py::Int(i) => Some(*i as f64),
            Py::Float(f) => Some(*f),
            _ => None,
        }
    }

    /// Python's `==`: numbers compare by value across bool/int/float (`1 == 1.0 == True`),
    /// NaN is unequal to itself, lists element-wise, dicts by their items.
    pub fn py_eq(&self, other: &Py) -> bool {
        match (self, other) {
            (Py::Int(a), Py::Int(b)) => a == b,
            (a, b) if a.number().is_some() && b.number().is_some() => a.number() == b.number(),
            (Py::None, Py::None) => true,
            (Py::Str(a), Py::Str(b)) => a == b,
            (Py::List(a), Py::List(b)) => {
                a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.py_eq(y))
            }
            (Py::Dict(a), Py::Dict(b)) => {
                a.len() == b.len()
                    && a.iter().all(|(k, v)| {
                        b.iter()
                            .find(|(k2, _)| k2 == k)
                            .is_some_and(|(_, w)| v.py_eq(w))
                    })
            }
            _ => false,
        }
    }

    /// True for the string `"auto"`.
    pub fn is_auto(&self) -> bool {
        matches!(self, Py::Str(s) if s == "auto")
    }

    /// Python's truth value.
    pub fn truthy(&self) -> bool {
        match self {
            Py::None => false,
            Py::Bool(b) => *b,
            Py::Int(i) => *i != 0,
            Py::Float(f) => *f != 0.0,
            Py::Str(s) => !s.is_empty(),
            Py::List(l) => !l.is_empty(),
            Py::Dict(d) => !d.is_empty(),
        }
    }

    /// Python's `str()` of the value, as HF's messages print it (`5e-05`, `True`, `[0.9, 0.999]`).
    pub fn show(&self) -> String {
        match self {
            Py::None => "None".into(),
            Py::Bool(true) => "True".into(),
            Py::Bool(false) => "False".into(),
            Py::Int(i) => i.to_string(),
            Py::Float(f) => py_float(*f),
            Py::Str(s) => s.clone(),
            Py::List(items) => format!(
                "[{}]",
                items.iter().map(Py::repr).collect::<Vec<_>>().join(", ")
            ),
            Py::Dict(items) => format!(
                "{{{}}}",
                items
                    .iter()
                    .map(|(k, v)| format!("'{k}': {}", v.repr()))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        }
    }

    /// Python's `repr()` (strings quoted).
    pub fn repr(&self) -> String {
        match self {
            Py::Str(s) => format!("'{s}'"),
            other => other.show(),
        }
    }

    /// The value as JSON (non-finite floats as Python writes them would not be JSON: strings).
    pub fn to_json(&self) -> serde_json::Value {
        use serde_json::Value;
        match self {
            Py::None => Value::Null,
            Py::Bool(b) => Value::Bool(*b),
            Py::Int(i) => i64::try_from(*i)
                .map(Value::from)
                .unwrap_or_else(|_| Value::from(*i as f64)),
            Py::Float(f) if f.is_finite() => Value::from(*f),
            Py::Float(f) => Value::String(py_float(*f)),
            Py::Str(s) => Value::String(s.clone()),
            Py::List(items) => Value::Array(items.iter().map(Py::to_json).collect()),
            Py::Dict(items) => Value::Object(
                items
                    .iter()
                    .map(|(k, v)| (k.clone(), v.to_json()))
                    .collect(),
            ),
        }
    }

    /// The member `key` of a dict.
    pub fn get(&self, key: &str) -> Option<&Py> {
        match self {
            Py::Dict(items) => items.iter().find(|(k, _)| k == key).map(|(_, v)| v),
            _ => None,
        }
    }

    /// The value at a dotted path.
    pub fn at(&self, path: &str) -> Option<&Py> {
        path.split('.').try_fold(self, |v, part| v.get(part))
    }

    /// Every key below a dict, dotted, with its value, parents before their children.
    pub fn entries(&self) -> Vec<(String, &Py)> {
        fn walk<'a>(v: &'a Py, prefix: &str, out: &mut Vec<(String, &'a Py)>) {
            if let Py::Dict(items) = v {
                for (k, v) in items {
                    let key = if prefix.is_empty() {
                        k.clone()
                    } else {
                        format!("{prefix}.{k}")
                    };
                    out.push((key.clone(), v));
                    walk(v, &key, out);
                }
            }
        }
        let mut out = Vec::new();
        walk(self, "", &mut out);
        out
    }

    /// The leaves of a dict (values that are not non-empty dicts), dotted.
    pub fn leaves(&self) -> Vec<(String, &Py)> {
        self.entries()
            .into_iter()
            .filter(|(_, v)| !matches!(v, Py::Dict(items) if !items.is_empty()))
            .collect()
    }
}

/// Python's `str(float)`: the shortest text that reads back to the same float, in Python's
/// layout (`5e-05`, `0.0001`, `1.0`, `1e+16`, `inf`, `nan`).
pub fn py_float(f: f64) -> String {
    if f.is_nan() {
        return "nan".into();
    }
    if f.is_infinite() {
        return if f > 0.0 { "inf" } else { "-inf" }.into();
    }
    if f == 0.0 {
        return if f.is_sign_negative() { "-0.0" } else { "0.0" }.into();
    }
    // Rust's `{:e}` is the shortest round-trip digits; Python switches to exponent form when
    // the decimal exponent is < -4 or >= 16.
    let sci = format!("{f:e}");
    let (mantissa, exp) = sci.split_once('e').expect("`{:e}` has an exponent");
    let exp: i32 = exp.parse().expect("an integer exponent");
    if !(-4..16).contains(&exp) {
        let sign = if exp < 0 { '-' } else { '+' };
        return format!("{mantissa}e{sign}{:02}", exp.abs());
    }
    let s = format!("{f}");
    if s.contains('.') {
        s
    } else {
        format!("{s}.0")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn python_float_text() {
        assert_eq!(py_float(5e-5), "5e-05");
        assert_eq!(py_float(0.0001), "0.0001");
        assert_eq!(py_float(1.0), "1.0");
        assert_eq!(py_float(3e-5), "3e-05");
        assert_eq!(py_float(1e16), "1e+16");
        assert_eq!(py_float(123456.5), "123456.5");
        assert_eq!(py_float(0.999), "0.999");
    }

    #[test]
    fn numbers_are_read_like_python() {
        let n = parse(r#"{"a": 1, "b": 1.0, "c": 1e3, "d": NaN, "a": 2}"#).unwrap();
        assert_eq!(n.get("a").unwrap().kind, Kind::Int(2));
        assert_eq!(n.get("b").unwrap().kind, Kind::Float(1.0));
        assert_eq!(n.get("c").unwrap().kind, Kind::Float(1000.0));
        assert!(Py::Int(1).py_eq(&Py::Float(1.0)));
        assert!(Py::Bool(true).py_eq(&Py::Int(1)));
        assert!(!Py::Str("1".into()).py_eq(&Py::Int(1)));
        let mut d = Vec::new();
        duplicate_keys(&n, &mut d);
        assert_eq!(d.len(), 1);
    }

    #[test]
    fn strict_json_only() {
        assert!(parse("{\"a\": 1,}").is_err());
        assert!(parse("{// c\n}").is_err());
        assert!(parse("{'a': 1}").is_err());
        assert!(parse("").is_err());
        assert!(parse("{\"a\": 1").is_err());
    }
}
