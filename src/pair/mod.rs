//! The pair linter: an existing `ds_config.json` and the TrainingArguments that go with it (a
//! JSON file, or command-line flags), checked the way the real stack would take them at launch
//! (`recipe check ds_config.json --args training_args.json`).
//!
//! Data flows one way: the files → spanned JSON ([`json`]) and effective TrainingArguments
//! ([`args`]) → the replay of the stack's order of events ([`stack`]) → findings pointing into
//! either file. Codes are in [`codes`]; docs/diagnostics.md, "Pairs", explains each.

pub mod args;
pub mod codes;
pub mod json;
pub mod stack;

use crate::diagnostics::source::SourceFile;
use crate::diagnostics::{Diagnostic, Label, Severity};
use crate::schema::upstream::{self, HfFields};
use crate::upstream::versions::Library;

pub use stack::{At, Finding, Options, Outcome, Side};

/// How the TrainingArguments are given.
#[derive(Debug, Clone)]
pub enum ArgsInput {
    /// A JSON object of fields (`HfArgumentParser.parse_json_file`).
    Json(SourceFile),
    /// Command-line flags, or a launch script holding them.
    Flags(SourceFile),
}

/// A checked pair.
#[derive(Debug, Clone)]
pub struct Report {
    /// ds_config.json.
    pub ds: SourceFile,
    /// The TrainingArguments source, if given.
    pub args: Option<SourceFile>,
    /// Every finding, in the order the real stack meets them.
    pub findings: Vec<Finding>,
    /// The replay (absent when a file is not JSON).
    pub outcome: Option<Outcome>,
}

impl Report {
    /// True when the real stack would refuse the pair.
    pub fn has_errors(&self) -> bool {
        self.findings.iter().any(|f| f.severity == Severity::Error)
    }

    /// The source file of a side.
    pub fn file(&self, side: Side) -> &SourceFile {
        match side {
            Side::DeepSpeed => &self.ds,
            Side::Args => self.args.as_ref().unwrap_or(&self.ds),
        }
    }

    /// A finding as a diagnostic of its primary file, and its labels in the other file.
    pub fn split(&self, f: &Finding) -> (Diagnostic, Option<(&SourceFile, Vec<Label>)>) {
        let side = f.primary.side;
        let d = Diagnostic {
            code: f.code,
            severity: f.severity,
            message: f.message.clone(),
            primary: f.primary.label.clone(),
            secondary: f
                .secondary
                .iter()
                .filter(|a| a.side == side)
                .map(|a| a.label.clone())
                .collect(),
            help: f.help.clone(),
            fixes: Vec::new(),
        };
        let others: Vec<Label> = f
            .secondary
            .iter()
            .filter(|a| a.side != side)
            .map(|a| a.label.clone())
            .collect();
        let other_side = match side {
            Side::DeepSpeed => Side::Args,
            Side::Args => Side::DeepSpeed,
        };
        let other = (!others.is_empty()).then(|| (self.file(other_side), others));
        (d, other)
    }
}

fn finding(code: &'static str, severity: Severity, message: String, at: At) -> Finding {
    Finding {
        code,
        severity,
        message,
        primary: at,
        secondary: Vec::new(),
        help: None,
    }
}

/// Parses one JSON file of the pair; a syntax error or a non-object is a finding.
fn parse_object(file: &SourceFile, side: Side, out: &mut Vec<Finding>) -> Option<json::Node> {
    let at = |span, text: &str| At {
        side,
        label: Label::new(span, text),
    };
    match json::parse(&file.text) {
        Err(e) => {
            let mut f = finding(
                codes::JSON_SYNTAX,
                Severity::Error,
                format!("`{}` is not JSON: {}", file.name, e.message),
                at(e.span, "here"),
            );
            f.help = Some(
                "the stack reads it with Python's json module, which takes strict JSON (no \
                 comments, no trailing commas, double quotes)"
                    .into(),
            );
            out.push(f);
            None
        }
        Ok(node) if !matches!(node.kind, json::Kind::Object(_)) => {
            let mut f = finding(
                codes::JSON_NOT_OBJECT,
                Severity::Error,
                format!("`{}` is JSON but not an object of settings", file.name),
                at(node.span, "not `{ … }`"),
            );
            f.help = Some("the file must hold one object: { \"key\": value, … }".into());
            out.push(f);
            None
        }
        Ok(node) => {
            let mut dups = Vec::new();
            json::duplicate_keys(&node, &mut dups);
            for (key, first, later) in dups {
                let mut f = finding(
                    codes::JSON_DUPLICATE_KEY,
                    Severity::Warning,
                    format!("`{key}` is given twice in the same object; the last one counts"),
                    at(first, "ignored"),
                );
                f.secondary.push(at(later, "this one counts"));
                f.help =
                    Some("Python's json keeps the last value of a repeated key; remove one".into());
                out.push(f);
            }
            Some(node)
        }
    }
}

/// TrainingArguments names the target release does not have: renamed (R0033) or unknown
/// (R0032); the refusal is HfArgumentParser's.
fn unknown_fields(a: &args::Args, release: &HfFields, out: &mut Vec<Finding>) {
    for u in &a.unknown {
        if args::SCRIPT_ARGUMENTS.contains(&u.name.as_str()) {
            continue; // the training script's own argument
        }
        let at = At {
            side: Side::Args,
            label: Label::new(u.span, "not a TrainingArguments field"),
        };
        let refusal = if a.from_flags {
            "HfArgumentParser refuses it (\"Some specified arguments are not used by the HfArgumentParser\")"
        } else {
            "HfArgumentParser refuses it (\"Some keys are not used by the HfArgumentParser\")"
        };
        let renamed = upstream::TRAINING_ARGUMENTS_RENAMED
            .iter()
            .find(|(old, ..)| *old == u.name);
        let mut f = match renamed {
            Some((old, new, note)) => {
                let mut f = finding(
                    crate::diagnostics::codes::RENAMED_HF_FIELD,
                    Severity::Error,
                    format!(
                        "`{old}` is not a TrainingArguments field in transformers {}",
                        release.version
                    ),
                    at,
                );
                f.help = Some(if new.is_empty() {
                    format!("{refusal}; remove it: {note}")
                } else {
                    format!("{refusal}; use `{new}` instead ({note})")
                });
                f
            }
            None => {
                let names = release.fields.iter().map(|(n, _)| *n);
                let hint = match crate::check::suggest::closest(&u.name, names) {
                    Some(best) => format!("; did you mean `{best}`?"),
                    None => String::new(),
                };
                let mut f = finding(
                    crate::diagnostics::codes::UNKNOWN_HF_FIELD,
                    Severity::Error,
                    format!("`{}` is not a TrainingArguments field", u.name),
                    at,
                );
                f.help = Some(format!("{refusal}{hint}"));
                f
            }
        };
        f.primary.label.text = "unknown to transformers".into();
        out.push(f);
    }
    for b in &a.bad {
        let mut f = finding(
            codes::ARGS_BAD_VALUE,
            Severity::Error,
            format!("`{}` takes {}, found `{}`", b.field, b.expected, b.text),
            At {
                side: Side::Args,
                label: Label::new(b.span, "not readable as the field's type"),
            },
        );
        f.help = Some(format!(
            "HfArgumentParser refuses it (\"argument --{}: invalid … value\")",
            b.field
        ));
        out.push(f);
    }
}

/// Checks a pair.
pub fn check(ds: SourceFile, args_input: Option<ArgsInput>, opts: &Options) -> Report {
    let mut findings = Vec::new();
    let release = HfFields::for_target(opts.targets.get(Library::Transformers));
    let ds_node = parse_object(&ds, Side::DeepSpeed, &mut findings);
    let (args_file, parsed_args) = match args_input {
        None => (None, Some(args::Args::defaults(release))),
        Some(ArgsInput::Json(file)) => {
            let a = parse_object(&file, Side::Args, &mut findings)
                .map(|node| args::Args::from_json(&node, release));
            (Some(file), a)
        }
        Some(ArgsInput::Flags(file)) => {
            let words = args::script_flags(args::shell_words(&file.text));
            let a = args::Args::from_flags(&words, release);
            (Some(file), Some(a))
        }
    };
    if let Some(a) = &parsed_args {
        unknown_fields(a, release, &mut findings);
    }
    let outcome = match (&ds_node, &parsed_args) {
        (Some(node), Some(a)) => {
            let outcome = stack::replay(node, a, opts);
            findings.extend(outcome.findings.iter().cloned());
            Some(outcome)
        }
        _ => None,
    };
    Report {
        ds,
        args: args_file,
        findings,
        outcome,
    }
}
