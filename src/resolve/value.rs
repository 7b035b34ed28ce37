//! Resolved values and where each came from.

use std::fmt;

use serde::Serialize;

use crate::syntax::ast::{NumberValue, Span, Value, ValueKind};

/// A concrete value of a resolved setting.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(untagged)]
pub enum Val {
    /// A whole number.
    Int(i64),
    /// A number.
    Float(f64),
    /// A fraction written as a percentage (`6%` is `Percent(6.0)`).
    Percent(f64),
    /// `true` / `false`.
    Bool(bool),
    /// A string.
    Str(String),
    /// A bare word (enum value).
    Word(String),
    /// A list of values.
    List(Vec<Val>),
    /// A call: `nvme(path: "/x")`; a bare word of a call type has no arguments.
    Call {
        /// The name.
        name: String,
        /// Named arguments in source order.
        args: Vec<(String, Val)>,
    },
}

impl Val {
    /// The value as a float, if it is a number (`6%` is 0.06).
    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            Val::Int(i) => Some(i as f64),
            Val::Float(f) => Some(f),
            Val::Percent(p) => Some(p / 100.0),
            _ => None,
        }
    }

    /// The value as an integer, if it is a whole number.
    pub fn as_i64(&self) -> Option<i64> {
        match *self {
            Val::Int(i) => Some(i),
            Val::Float(f) if f.fract() == 0.0 && f.abs() < 9.0e18 => Some(f as i64),
            _ => None,
        }
    }

    /// The word, or a call's name.
    pub fn as_word(&self) -> Option<&str> {
        match self {
            Val::Word(w) => Some(w),
            Val::Call { name, .. } => Some(name),
            _ => None,
        }
    }

    /// The string.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            Val::Str(s) => Some(s),
            _ => None,
        }
    }

    /// The boolean.
    pub fn as_bool(&self) -> Option<bool> {
        match self {
            Val::Bool(b) => Some(*b),
            _ => None,
        }
    }

    /// A call argument by name.
    pub fn arg(&self, name: &str) -> Option<&Val> {
        match self {
            Val::Call { args, .. } => args.iter().find(|(n, _)| n == name).map(|(_, v)| v),
            _ => None,
        }
    }

    /// Converts a syntax value (already checked against the schema).
    pub fn from_ast(value: &Value) -> Val {
        match &value.kind {
            ValueKind::Str(s) => Val::Str(s.clone()),
            ValueKind::Number(n) => match n.value {
                NumberValue::Int(i) => Val::Int(i),
                NumberValue::Float(f) => Val::Float(f),
                NumberValue::Percent(p) => Val::Percent(p),
            },
            ValueKind::Bool(b) => Val::Bool(*b),
            ValueKind::Ident(w) => Val::Word(w.clone()),
            ValueKind::Tuple(items) | ValueKind::List(items) => {
                Val::List(items.iter().map(Val::from_ast).collect())
            }
            ValueKind::Call(call) => Val::Call {
                name: call.name.name.clone(),
                args: call
                    .args
                    .iter()
                    .map(|a| {
                        (
                            a.name.as_ref().map_or_else(String::new, |n| n.name.clone()),
                            Val::from_ast(&a.value),
                        )
                    })
                    .collect(),
            },
        }
    }
}

/// Formats a float the way people write it: `3e-5`, `0.9`, `1000000`.
pub fn fmt_f64(f: f64) -> String {
    if f == 0.0 {
        return "0".into();
    }
    if f.fract() == 0.0 && f.abs() < 1e15 {
        return format!("{}", f as i64);
    }
    let abs = f.abs();
    if !(1e-3..1e6).contains(&abs) {
        let s = format!("{f:e}");
        return s;
    }
    let s = format!("{f}");
    s
}

impl fmt::Display for Val {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Val::Int(i) => write!(f, "{i}"),
            Val::Float(x) => f.write_str(&fmt_f64(*x)),
            Val::Percent(p) => write!(f, "{}%", fmt_f64(*p)),
            Val::Bool(b) => write!(f, "{b}"),
            Val::Str(s) => f.write_str(&crate::commands::format::quote(s)),
            Val::Word(w) => f.write_str(w),
            Val::List(items) => {
                let parts: Vec<String> = items.iter().map(|v| v.to_string()).collect();
                write!(f, "[{}]", parts.join(", "))
            }
            Val::Call { name, args } if args.is_empty() => f.write_str(name),
            Val::Call { name, args } => {
                let parts: Vec<String> = args.iter().map(|(n, v)| format!("{n}: {v}")).collect();
                write!(f, "{name}({})", parts.join(", "))
            }
        }
    }
}

/// Where a resolved value came from.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
pub enum Source {
    /// Written in the recipe.
    Written {
        /// Where.
        #[serde(skip)]
        span: Span,
    },
    /// Given on the command line (`--gpus 4`, `--set batch.micro=8`).
    Flag {
        /// The flag as given.
        flag: String,
    },
    /// A default; `reason` says whose default it mirrors.
    Default {
        /// Why this value.
        reason: String,
    },
    /// Computed from other values by a rule.
    Derived {
        /// The rule, e.g. `micro × accumulate × world`.
        rule: String,
        /// The inputs with their values.
        inputs: Vec<String>,
    },
    /// Read from a file (rows counted, a model's config.json).
    File {
        /// What was read.
        what: String,
    },
}

impl Source {
    /// The recipe span, when written there.
    pub fn span(&self) -> Option<Span> {
        match self {
            Source::Written { span } => Some(*span),
            _ => None,
        }
    }

    /// One line for `explain`.
    pub fn describe(&self, file: Option<&crate::SourceFile>) -> String {
        match self {
            Source::Written { span } => match file {
                Some(f) => {
                    let (line, col) = f.line_col(span.start);
                    format!("written at {}:{line}:{col}", f.name)
                }
                None => "written in the recipe".into(),
            },
            Source::Flag { flag } => format!("flag {flag}"),
            Source::Default { reason } => format!("default: {reason}"),
            Source::Derived { rule, inputs } if inputs.is_empty() => format!("derived: {rule}"),
            Source::Derived { rule, inputs } => format!("derived: {rule} ({})", inputs.join(", ")),
            Source::File { what } => format!("read: {what}"),
        }
    }
}

/// One resolved setting: a key (`batch.micro`), its value, and where it came from.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Setting {
    /// `block.key`, as written in the recipe (`zero.offload optimizer`), or a derived name
    /// (`steps.per_epoch`).
    pub key: String,
    /// The value.
    pub value: Val,
    /// Its provenance.
    pub source: Source,
}
