//! Value types of the schema, and checking a value against one.

use crate::syntax::ast::{NumberValue, Value, ValueKind};

/// The type of a key's value.
#[derive(Debug, Clone, Copy)]
pub enum Ty {
    /// Any string.
    Str,
    /// A file or directory path, as a string.
    Path,
    /// A release version such as `"0.19.8"`.
    Version,
    /// A whole number in `min..=max` (`1e9` and `60M` count as whole).
    Int {
        /// Smallest allowed.
        min: i64,
        /// Largest allowed.
        max: i64,
    },
    /// Any number in `min..=max`.
    Number {
        /// Smallest allowed.
        min: f64,
        /// Largest allowed.
        max: f64,
    },
    /// A non-negative count, usually of bytes or elements; size suffixes welcome (`60M`).
    Size,
    /// `true` or `false`.
    Bool,
    /// One of these bare words.
    Word(&'static [&'static str]),
    /// A fraction: a percentage (`6%`) or a number in `0..=1`.
    Fraction,
    /// Warmup length: whole steps (`100`), or a fraction of the total (`6%`, `0.06`).
    Steps,
    /// Two numbers in `min..=max`: `(0.9, 0.999)`.
    Pair {
        /// Smallest allowed.
        min: f64,
        /// Largest allowed.
        max: f64,
    },
    /// A number in `min..=max`, or a list of them, one per optimizer parameter group
    /// (`min_lr = [1e-5, 1e-6]`, as torch's ReduceLROnPlateau and HF's GreedyLR take).
    Numbers {
        /// Smallest allowed.
        min: f64,
        /// Largest allowed.
        max: f64,
    },
    /// A list of strings.
    StrList,
    /// One of these words, or a whole number in `min..=max` (`loss_scale = dynamic`).
    WordOrInt(&'static [&'static str], i64, i64),
    /// Class labels: how many (`2`) or their names (`["ham", "spam"]`).
    Labels,
    /// One of these calls; a bare word is a call without arguments (`cpu`).
    Call(&'static [CallSpec]),
    /// Anything (raw blocks).
    Any,
}

/// A callable value such as `nvme(path: "/local_nvme")`.
#[derive(Debug, Clone, Copy)]
pub struct CallSpec {
    /// The name.
    pub name: &'static str,
    /// One line for docs.
    pub doc: &'static str,
    /// Its named arguments.
    pub args: &'static [ArgSpec],
}

/// A named argument of a call.
#[derive(Debug, Clone, Copy)]
pub struct ArgSpec {
    /// The name.
    pub name: &'static str,
    /// Its type.
    pub ty: Ty,
    /// Whether the call needs it.
    pub required: bool,
    /// One line for docs.
    pub doc: &'static str,
    /// The upstream key it becomes, if any.
    pub upstream: Option<&'static str>,
}

/// Why a value does not fit a type.
#[derive(Debug, Clone, PartialEq)]
pub enum Mismatch {
    /// The wrong kind of value: "expected X, found Y".
    Type {
        /// What was expected, in words.
        expected: String,
        /// What was found, in words.
        found: String,
        /// Where exactly (the value or a part of it).
        at: crate::syntax::ast::Span,
    },
    /// A word that is not allowed.
    Word {
        /// The word.
        word: String,
        /// The allowed words.
        allowed: Vec<&'static str>,
        /// Where.
        at: crate::syntax::ast::Span,
    },
    /// A number out of range.
    Range {
        /// Why, in words.
        why: String,
        /// Where.
        at: crate::syntax::ast::Span,
    },
    /// A call argument problem.
    Argument {
        /// What is wrong.
        why: String,
        /// Where.
        at: crate::syntax::ast::Span,
        /// The arguments the call takes, for did-you-mean.
        known: Vec<&'static str>,
        /// The unknown name, if it is one.
        name: Option<String>,
    },
}

impl Ty {
    /// The type in words, as in "expected a whole number".
    pub fn describe(&self) -> String {
        match self {
            Ty::Str => "a string".into(),
            Ty::Path => "a path (a string)".into(),
            Ty::Version => "a version string such as \"0.19.8\"".into(),
            Ty::Int { .. } => "a whole number".into(),
            Ty::Number { .. } => "a number".into(),
            Ty::Size => "a size (a whole number such as 5e8 or 60M)".into(),
            Ty::Bool => "`true` or `false`".into(),
            Ty::Word(words) => format!("one of {}", words_list(words)),
            Ty::Fraction => "a fraction (a percentage such as 6% or a number from 0 to 1)".into(),
            Ty::Steps => "a number of steps (100) or a fraction of them (6%)".into(),
            Ty::Pair { .. } => "a pair of numbers such as (0.9, 0.999)".into(),
            Ty::Numbers { .. } => "a number, or one per parameter group such as [1e-5, 0.0]".into(),
            Ty::StrList => "a list of strings".into(),
            Ty::WordOrInt(words, _, _) => format!("{} or a whole number", words_list(words)),
            Ty::Labels => "a number of labels (2) or their names ([\"ham\", \"spam\"])".into(),
            Ty::Call(calls) => {
                let names: Vec<&str> = calls.iter().map(|c| c.name).collect();
                format!("one of {}", words_list(&names))
            }
            Ty::Any => "a value".into(),
        }
    }

    /// Checks a value against this type.
    pub fn check(&self, value: &Value) -> Result<(), Mismatch> {
        let wrong = || Mismatch::Type {
            expected: self.describe(),
            found: value.describe(),
            at: value.span,
        };
        let num = match &value.kind {
            ValueKind::Number(n) => Some(n.value),
            _ => None,
        };
        match *self {
            Ty::Any => Ok(()),
            Ty::Str | Ty::Path => match value.kind {
                ValueKind::Str(_) => Ok(()),
                _ => Err(wrong()),
            },
            Ty::Version => match &value.kind {
                ValueKind::Str(s) if is_version(s) => Ok(()),
                ValueKind::Str(s) => Err(Mismatch::Range {
                    why: format!("`{s}` is not a version; write it as \"major.minor.patch\""),
                    at: value.span,
                }),
                _ => Err(wrong()),
            },
            Ty::Bool => match value.kind {
                ValueKind::Bool(_) => Ok(()),
                _ => Err(wrong()),
            },
            Ty::Int { min, max } => match num {
                Some(n @ (NumberValue::Int(_) | NumberValue::Float(_))) => match n.as_i64() {
                    Some(i) => in_range(i as f64, min as f64, max as f64, value),
                    None => Err(Mismatch::Type {
                        expected: "a whole number".into(),
                        found: format!("`{}`", raw(value)),
                        at: value.span,
                    }),
                },
                _ => Err(wrong()),
            },
            Ty::Size => match num {
                Some(n @ (NumberValue::Int(_) | NumberValue::Float(_))) => match n.as_i64() {
                    Some(i) => in_range(i as f64, 0.0, i64::MAX as f64, value),
                    None => Err(Mismatch::Type {
                        expected: "a whole number".into(),
                        found: format!("`{}`", raw(value)),
                        at: value.span,
                    }),
                },
                _ => Err(wrong()),
            },
            Ty::Number { min, max } => match num {
                Some(n @ (NumberValue::Int(_) | NumberValue::Float(_))) => {
                    in_range(n.as_f64(), min, max, value)
                }
                _ => Err(wrong()),
            },
            Ty::Fraction => match num {
                Some(NumberValue::Percent(p)) => in_range_pct(p, value),
                Some(n) => in_range(n.as_f64(), 0.0, 1.0, value),
                None => Err(wrong()),
            },
            Ty::Steps => match num {
                Some(NumberValue::Percent(p)) => in_range_pct(p, value),
                Some(NumberValue::Int(i)) => in_range(i as f64, 0.0, i64::MAX as f64, value),
                Some(NumberValue::Float(f)) if (0.0..1.0).contains(&f) => Ok(()),
                Some(NumberValue::Float(f)) if f >= 1.0 && f.fract() == 0.0 => Ok(()),
                Some(NumberValue::Float(_)) => Err(Mismatch::Range {
                    why: "a warmup is whole steps (100) or a fraction below 1 (0.06 or 6%)".into(),
                    at: value.span,
                }),
                None => Err(wrong()),
            },
            Ty::Pair { min, max } => match &value.kind {
                ValueKind::Tuple(items) if items.len() == 2 => {
                    for item in items {
                        match &item.kind {
                            ValueKind::Number(n) if !matches!(n.value, NumberValue::Percent(_)) => {
                                in_range(n.value.as_f64(), min, max, item)?
                            }
                            _ => {
                                return Err(Mismatch::Type {
                                    expected: "a number".into(),
                                    found: item.describe(),
                                    at: item.span,
                                })
                            }
                        }
                    }
                    Ok(())
                }
                _ => Err(wrong()),
            },
            Ty::Numbers { min, max } => match &value.kind {
                ValueKind::List(items) if items.is_empty() => Err(Mismatch::Range {
                    why: "an empty list names no parameter group".into(),
                    at: value.span,
                }),
                ValueKind::List(items) => items
                    .iter()
                    .try_for_each(|item| Ty::Number { min, max }.check(item)),
                _ => Ty::Number { min, max }.check(value),
            },
            Ty::StrList => match &value.kind {
                ValueKind::List(items) => items.iter().try_for_each(|item| match item.kind {
                    ValueKind::Str(_) => Ok(()),
                    _ => Err(Mismatch::Type {
                        expected: "a string".into(),
                        found: item.describe(),
                        at: item.span,
                    }),
                }),
                _ => Err(wrong()),
            },
            Ty::Labels => match &value.kind {
                ValueKind::List(items) => {
                    Ty::StrList.check(value)?;
                    if items.len() < 2 {
                        return Err(Mismatch::Range {
                            why: "a classifier needs at least 2 labels".into(),
                            at: value.span,
                        });
                    }
                    let mut seen = std::collections::HashSet::new();
                    for item in items {
                        if let ValueKind::Str(s) = &item.kind {
                            if !seen.insert(s.as_str()) {
                                return Err(Mismatch::Range {
                                    why: format!("the label \"{s}\" is listed twice"),
                                    at: item.span,
                                });
                            }
                        }
                    }
                    Ok(())
                }
                ValueKind::Number(_) => Ty::Int {
                    min: 2,
                    max: 1_000_000,
                }
                .check(value),
                _ => Err(wrong()),
            },
            Ty::Word(words) => match &value.kind {
                ValueKind::Ident(w) if words.contains(&w.as_str()) => Ok(()),
                ValueKind::Ident(w) => Err(Mismatch::Word {
                    word: w.clone(),
                    allowed: words.to_vec(),
                    at: value.span,
                }),
                ValueKind::Str(s) if words.contains(&s.as_str()) => Err(Mismatch::Type {
                    expected: format!("the bare word `{s}` (without quotes)"),
                    found: "a string".into(),
                    at: value.span,
                }),
                _ => Err(wrong()),
            },
            Ty::WordOrInt(words, min, max) => match &value.kind {
                ValueKind::Number(_) => Ty::Int { min, max }.check(value),
                _ => Ty::Word(words).check(value).map_err(|e| match e {
                    Mismatch::Type { at, found, .. } => Mismatch::Type {
                        expected: self.describe(),
                        found,
                        at,
                    },
                    other => other,
                }),
            },
            Ty::Call(calls) => check_call(calls, value, self),
        }
    }
}

fn check_call(calls: &'static [CallSpec], value: &Value, ty: &Ty) -> Result<(), Mismatch> {
    let (name, name_span, args) = match &value.kind {
        ValueKind::Ident(w) => (w.as_str(), value.span, &[][..]),
        ValueKind::Call(c) => (c.name.name.as_str(), c.name.span, &c.args[..]),
        _ => {
            return Err(Mismatch::Type {
                expected: ty.describe(),
                found: value.describe(),
                at: value.span,
            })
        }
    };
    let Some(spec) = calls.iter().find(|c| c.name == name) else {
        return Err(Mismatch::Word {
            word: name.to_string(),
            allowed: calls.iter().map(|c| c.name).collect(),
            at: name_span,
        });
    };
    let known: Vec<&'static str> = spec.args.iter().map(|a| a.name).collect();
    let mut given: Vec<&str> = Vec::new();
    for arg in args {
        let Some(arg_name) = &arg.name else {
            return Err(Mismatch::Argument {
                why: format!("arguments of `{name}` are named, as in `{name}(name: value)`"),
                at: arg.value.span,
                known,
                name: None,
            });
        };
        let Some(arg_spec) = spec.args.iter().find(|a| a.name == arg_name.name) else {
            return Err(Mismatch::Argument {
                why: if spec.args.is_empty() {
                    format!("`{name}` takes no arguments")
                } else {
                    format!("`{name}` has no argument `{}`", arg_name.name)
                },
                at: arg_name.span,
                known,
                name: Some(arg_name.name.clone()),
            });
        };
        if given.contains(&arg_name.name.as_str()) {
            return Err(Mismatch::Argument {
                why: format!("the argument `{}` is given twice", arg_name.name),
                at: arg_name.span,
                known,
                name: None,
            });
        }
        given.push(&arg_name.name);
        arg_spec.ty.check(&arg.value)?;
    }
    if let Some(missing) = spec
        .args
        .iter()
        .find(|a| a.required && !given.contains(&a.name))
    {
        return Err(Mismatch::Argument {
            why: format!(
                "`{name}` needs the argument `{}`: {}",
                missing.name, missing.doc
            ),
            at: value.span,
            known,
            name: None,
        });
    }
    Ok(())
}

fn raw(value: &Value) -> String {
    match &value.kind {
        ValueKind::Number(n) => n.raw.clone(),
        _ => value.describe(),
    }
}

fn fmt_bound(x: f64) -> String {
    if x.fract() == 0.0 && x.abs() < 1e15 {
        format!("{}", x as i64)
    } else {
        format!("{x}")
    }
}

fn in_range(x: f64, min: f64, max: f64, value: &Value) -> Result<(), Mismatch> {
    if x >= min && x <= max {
        return Ok(());
    }
    let why = if max >= i64::MAX as f64 || max == f64::INFINITY {
        format!("must be at least {}", fmt_bound(min))
    } else {
        format!("must be from {} to {}", fmt_bound(min), fmt_bound(max))
    };
    Err(Mismatch::Range {
        why: format!("`{}` is out of range ({why})", raw(value)),
        at: value.span,
    })
}

fn in_range_pct(p: f64, value: &Value) -> Result<(), Mismatch> {
    if (0.0..=100.0).contains(&p) {
        Ok(())
    } else {
        Err(Mismatch::Range {
            why: format!(
                "`{}` is out of range (a percentage must be from 0% to 100%)",
                raw(value)
            ),
            at: value.span,
        })
    }
}

fn is_version(s: &str) -> bool {
    let parts: Vec<&str> = s.split('.').collect();
    (1..=4).contains(&parts.len())
        && parts
            .iter()
            .all(|p| !p.is_empty() && p.chars().all(|c| c.is_ascii_digit()))
}

/// `a`, `a or b`, `a, b or c` with backticks.
pub fn words_list(words: &[&str]) -> String {
    let quoted: Vec<String> = words.iter().map(|w| format!("`{w}`")).collect();
    match quoted.as_slice() {
        [] => String::new(),
        [one] => one.clone(),
        [init @ .., last] => format!("{} or {}", init.join(", "), last),
    }
}
