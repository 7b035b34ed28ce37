//! TrainingArguments as users give them: a JSON file (`HfArgumentParser.parse_json_file`) or
//! command-line flags (`deepspeed train.py --deepspeed ds.json --learning_rate 2e-5 …`), read
//! into the effective value of every field of the target release, each with where it came from.
//!
//! Field names and defaults come from the generated per-release tables
//! (`schema::upstream_versions`, extracted from transformers' own `training_args.py`); a field's
//! type is its default's (`False` → bool, `8` → int, `5e-05` → float, `'linear'` → str); fields
//! whose default is `None` take what is written (a number when it reads as one, as argparse's
//! `Optional[int|float]` types do).

use std::collections::BTreeMap;

use crate::pair::json::{Kind, Node, Py};
use crate::schema::upstream::HfFields;
use crate::syntax::ast::Span;

/// Where a field's value came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum From {
    /// Written by the user: the key (or flag) and the value.
    Given { key: Span, value: Span },
    /// The release's default.
    Default,
}

/// One field's effective value.
#[derive(Debug, Clone, PartialEq)]
pub struct Field {
    /// The value, as TrainingArguments holds it.
    pub value: Py,
    /// Where it came from.
    pub from: From,
}

/// A name that is not a field of the release, with its span.
#[derive(Debug, Clone, PartialEq)]
pub struct Unknown {
    /// As written (without `--`).
    pub name: String,
    /// The key or flag.
    pub span: Span,
}

/// A value that cannot be read as the field's type (argparse's "invalid int value").
#[derive(Debug, Clone, PartialEq)]
pub struct BadValue {
    /// The field.
    pub field: String,
    /// What was written.
    pub text: String,
    /// The type it needs.
    pub expected: &'static str,
    /// Where.
    pub span: Span,
}

/// The TrainingArguments of a pair.
#[derive(Debug, Clone, Default)]
pub struct Args {
    /// Every field of the release, effective value.
    pub fields: BTreeMap<String, Field>,
    /// Names that are not fields.
    pub unknown: Vec<Unknown>,
    /// Values of the wrong type.
    pub bad: Vec<BadValue>,
    /// `--deepspeed PATH` / `"deepspeed": PATH` as given.
    pub deepspeed: Option<(String, Span)>,
    /// True when read from flags (argparse), false from JSON.
    pub from_flags: bool,
}

/// The type argparse gives a field, read off its default.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ty {
    Bool,
    Int,
    Float,
    Str,
    /// Default `None`, a list or a dict: taken as written.
    Any,
}

/// Fields annotated `float` whose default is written as an int (`warmup_steps: float = 0`):
/// argparse reads them as floats (transformers v5.24.0 `training_args.py`).
const FLOAT_FIELDS: &[&str] = &["eval_delay", "logging_steps", "save_steps", "warmup_steps"];

fn ty_of(name: &str, default: Option<&str>) -> Ty {
    if FLOAT_FIELDS.contains(&name) {
        return Ty::Float;
    }
    match default {
        Some("True" | "False") => Ty::Bool,
        Some(d) if d.starts_with('\'') || d.starts_with('"') => Ty::Str,
        Some(d) if d.parse::<i64>().is_ok() => Ty::Int,
        Some(d) if d.parse::<f64>().is_ok() => Ty::Float,
        _ => Ty::Any,
    }
}

/// A Python literal default (`repr`) as a value; `None` for non-literal defaults.
fn default_value(repr: Option<&str>) -> Py {
    let Some(r) = repr else { return Py::None };
    match r {
        "None" => Py::None,
        "True" => Py::Bool(true),
        "False" => Py::Bool(false),
        "[]" => Py::List(Vec::new()),
        "{}" => Py::Dict(Vec::new()),
        _ if r.starts_with('\'') || r.starts_with('"') => Py::Str(r[1..r.len() - 1].to_string()),
        _ => r
            .parse::<i128>()
            .map(Py::Int)
            .or_else(|_| r.parse::<f64>().map(Py::Float))
            .unwrap_or(Py::None),
    }
}

/// The defaults that the tables cannot give as literals (computed in the dataclass).
fn computed_default(name: &str) -> Option<Py> {
    // transformers 5.x `default_optim`: adamw_torch_fused on torch ≥ 2.8 (the pinned stack).
    (name == "optim").then(|| Py::Str("adamw_torch_fused".into()))
}

/// Arguments of the training script itself (HF's example scripts' ModelArguments /
/// DataTrainingArguments), which a TrainingArguments file or command line often carries too.
pub const SCRIPT_ARGUMENTS: &[&str] = &[
    "cache_dir",
    "config_name",
    "dataset_config_name",
    "dataset_name",
    "label_column_name",
    "max_eval_samples",
    "max_predict_samples",
    "max_seq_length",
    "max_train_samples",
    "model_name_or_path",
    "model_revision",
    "pad_to_max_length",
    "preprocessing_num_workers",
    "test_file",
    "text_column_names",
    "tokenizer_name",
    "train_file",
    "trust_remote_code",
    "validation_file",
];

/// A field's default in `release` (`None` for a field the release does not have).
pub fn default_of(release: &HfFields, name: &str) -> Option<Py> {
    let (_, repr) = release.fields.iter().find(|(n, _)| *n == name)?;
    Some(computed_default(name).unwrap_or_else(|| default_value(*repr)))
}

impl Args {
    /// Every field at its default for `release`.
    pub fn defaults(release: &HfFields) -> Args {
        let fields = release
            .fields
            .iter()
            .map(|(name, repr)| {
                let value = computed_default(name).unwrap_or_else(|| default_value(*repr));
                (
                    name.to_string(),
                    Field {
                        value,
                        from: From::Default,
                    },
                )
            })
            .collect();
        Args {
            fields,
            ..Args::default()
        }
    }

    /// The effective value of a field (`None` for a field the release does not have).
    pub fn get(&self, name: &str) -> Option<&Py> {
        self.fields.get(name).map(|f| &f.value)
    }

    /// The field's number (bool/int/float), else `default`.
    pub fn num(&self, name: &str, default: f64) -> f64 {
        self.get(name).and_then(Py::number).unwrap_or(default)
    }

    /// The field's truth value.
    pub fn flag(&self, name: &str) -> bool {
        self.get(name).is_some_and(Py::truthy)
    }

    /// The field's text (`""` when unset or not a string).
    pub fn text(&self, name: &str) -> &str {
        match self.get(name) {
            Some(Py::Str(s)) => s,
            _ => "",
        }
    }

    /// Where the field was written, if it was.
    pub fn given(&self, name: &str) -> Option<(Span, Span)> {
        match self.fields.get(name)?.from {
            From::Given { key, value } => Some((key, value)),
            From::Default => None,
        }
    }

    /// Reads a JSON object of fields (as `parse_json_file`, then the dataclass, would).
    pub fn from_json(root: &Node, release: &HfFields) -> Args {
        let mut args = Args::defaults(release);
        for m in root.members() {
            if m.key == "deepspeed" {
                if let Kind::Str(s) = &m.value.kind {
                    args.deepspeed = Some((s.clone(), m.value.span));
                }
                continue;
            }
            let Some(field) = args.fields.get_mut(&m.key) else {
                args.unknown.push(Unknown {
                    name: m.key.clone(),
                    span: m.key_span,
                });
                continue;
            };
            field.value = m.value.to_py();
            field.from = From::Given {
                key: m.key_span,
                value: m.value.span,
            };
        }
        args
    }

    /// Reads command-line flags (`--name value`, `--name=value`, `--flag` for booleans), as
    /// `HfArgumentParser.parse_args_into_dataclasses` does. `tokens` are (text, span).
    pub fn from_flags(tokens: &[(String, Span)], release: &HfFields) -> Args {
        let types: BTreeMap<&str, Ty> = release
            .fields
            .iter()
            .map(|(n, d)| (*n, ty_of(n, *d)))
            .collect();
        let mut args = Args::defaults(release);
        args.from_flags = true;
        let mut i = 0;
        while i < tokens.len() {
            let (tok, span) = (&tokens[i].0, tokens[i].1);
            i += 1;
            let Some(flag) = tok.strip_prefix("--") else {
                continue; // a positional (the script's own), not ours
            };
            let (name, inline) = match flag.split_once('=') {
                Some((n, v)) => (n.to_string(), Some(v.to_string())),
                None => (flag.to_string(), None),
            };
            let takes_value = |j: usize| j < tokens.len() && !tokens[j].0.starts_with("--");
            let ty = types.get(name.as_str()).copied();
            // The value's text and span: inline, the next token, or none (a bare bool flag).
            let (text, vspan) = match inline {
                Some(v) => (Some(v), span),
                None if ty != Some(Ty::Bool) && takes_value(i) => {
                    i += 1;
                    (Some(tokens[i - 1].0.clone()), tokens[i - 1].1)
                }
                None if ty == Some(Ty::Bool)
                    && takes_value(i)
                    && bool_text(&tokens[i].0).is_some() =>
                {
                    i += 1;
                    (Some(tokens[i - 1].0.clone()), tokens[i - 1].1)
                }
                None => (None, span),
            };
            if name == "deepspeed" {
                args.deepspeed = text.map(|t| (t, vspan));
                continue;
            }
            let Some(ty) = ty else {
                args.unknown.push(Unknown { name, span });
                continue;
            };
            let value = match (ty, text) {
                (Ty::Bool, None) => Some(Py::Bool(true)),
                (Ty::Bool, Some(t)) => bool_text(&t).map(Py::Bool),
                (Ty::Int, Some(t)) => t.parse().ok().map(Py::Int),
                (Ty::Float, Some(t)) => t.parse().ok().map(Py::Float),
                (Ty::Str, Some(t)) => Some(Py::Str(t)),
                (Ty::Any, Some(t)) => Some(any_value(&t)),
                (_, None) => None,
            };
            match value {
                Some(value) => {
                    let f = args.fields.get_mut(&name).expect("typed fields exist");
                    f.value = value;
                    f.from = From::Given {
                        key: span,
                        value: vspan,
                    };
                }
                None => args.bad.push(BadValue {
                    text: tokens
                        .get(i.saturating_sub(1))
                        .map(|t| t.0.clone())
                        .unwrap_or_default(),
                    field: name,
                    expected: match ty {
                        Ty::Bool => "a boolean (true/false, yes/no, 1/0)",
                        Ty::Int => "an int",
                        Ty::Float => "a float",
                        _ => "a value",
                    },
                    span: vspan,
                }),
            }
        }
        args
    }
}

/// transformers' `string_to_bool`.
fn bool_text(t: &str) -> Option<bool> {
    match t.to_ascii_lowercase().as_str() {
        "yes" | "true" | "t" | "y" | "1" => Some(true),
        "no" | "false" | "f" | "n" | "0" => Some(false),
        _ => None,
    }
}

/// A flag value for a field whose type the default does not tell: a number when it reads as
/// one, a JSON object for dict fields (`--lr_scheduler_kwargs '{"min_lr": 1e-6}'`), else text.
fn any_value(t: &str) -> Py {
    if let Ok(i) = t.parse::<i128>() {
        return Py::Int(i);
    }
    if let Ok(f) = t.parse::<f64>() {
        if t.chars().any(|c| c.is_ascii_digit()) {
            return Py::Float(f);
        }
    }
    if t.starts_with('{') {
        if let Ok(node) = crate::pair::json::parse(t) {
            return node.to_py();
        }
    }
    Py::Str(t.to_string())
}

/// Splits a command line (or a launch script) into words with their spans, as a POSIX shell
/// would: quotes, backslash escapes, `\`-newline continuations, `#` comments. Variables are not
/// expanded (kept as written).
pub fn shell_words(text: &str) -> Vec<(String, Span)> {
    let mut out = Vec::new();
    let mut chars = text.char_indices().peekable();
    let mut word = String::new();
    let mut start: Option<usize> = None;
    let mut end = 0;
    while let Some((i, c)) = chars.next() {
        match c {
            '\\' => {
                if let Some(&(j, n)) = chars.peek() {
                    chars.next();
                    if n != '\n' {
                        start.get_or_insert(i);
                        word.push(n);
                        end = j + n.len_utf8();
                    }
                }
            }
            '\'' | '"' => {
                start.get_or_insert(i);
                end = i + 1;
                while let Some((j, n)) = chars.next() {
                    end = j + n.len_utf8();
                    if n == c {
                        break;
                    }
                    if n == '\\' && c == '"' {
                        if let Some(&(k, m)) = chars.peek() {
                            chars.next();
                            word.push(m);
                            end = k + m.len_utf8();
                            continue;
                        }
                    }
                    word.push(n);
                }
            }
            '#' if start.is_none() => {
                // A comment runs to the end of the line.
                for (_, n) in chars.by_ref() {
                    if n == '\n' {
                        break;
                    }
                }
            }
            c if c.is_whitespace() => {
                if let Some(s) = start.take() {
                    out.push((std::mem::take(&mut word), Span::new(s, end)));
                }
            }
            c => {
                start.get_or_insert(i);
                word.push(c);
                end = i + c.len_utf8();
            }
        }
    }
    if let Some(s) = start {
        out.push((word, Span::new(s, end)));
    }
    out
}

/// The TrainingArguments words of a command line: after the training script (the last word
/// ending in `.py`) when there is one, else all of them.
pub fn script_flags(words: Vec<(String, Span)>) -> Vec<(String, Span)> {
    match words.iter().rposition(|(w, _)| w.ends_with(".py")) {
        Some(i) => words.into_iter().skip(i + 1).collect(),
        None => words,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::upstream::versions::Library;

    fn release() -> &'static HfFields {
        HfFields::for_target(Library::Transformers.newest())
    }

    #[test]
    fn flags_are_read_like_argparse() {
        let text = "deepspeed --num_gpus 4 train.py --deepspeed ds.json \\\n  --learning_rate 2e-5 --fp16 --per_device_train_batch_size=16 --bf16 false --model_name_or_path bert";
        let words = script_flags(shell_words(text));
        let a = Args::from_flags(&words, release());
        assert_eq!(a.get("learning_rate"), Some(&Py::Float(2e-5)));
        assert_eq!(a.get("fp16"), Some(&Py::Bool(true)));
        assert_eq!(a.get("bf16"), Some(&Py::Bool(false)));
        assert_eq!(a.get("per_device_train_batch_size"), Some(&Py::Int(16)));
        assert_eq!(a.deepspeed.as_ref().unwrap().0, "ds.json");
        assert_eq!(a.unknown.len(), 1);
        assert_eq!(
            &text[a.given("learning_rate").unwrap().1.start..][..4],
            "2e-5"
        );
    }

    #[test]
    fn defaults_come_from_the_release() {
        let a = Args::from_json(&crate::pair::json::parse("{}").unwrap(), release());
        assert_eq!(a.get("learning_rate"), Some(&Py::Float(5e-5)));
        assert_eq!(a.get("gradient_accumulation_steps"), Some(&Py::Int(1)));
        assert_eq!(a.get("lr_scheduler_type"), Some(&Py::Str("linear".into())));
    }

    #[test]
    fn shell_quotes() {
        let w = shell_words("a 'b c' \"d\\\"e\" # x\n f");
        let words: Vec<_> = w.iter().map(|(s, _)| s.as_str()).collect();
        assert_eq!(words, ["a", "b c", "d\"e", "f"]);
    }
}
