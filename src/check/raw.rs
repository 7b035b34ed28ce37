//! The raw escape hatches: `deepspeed { }` keys against DeepSpeed's key set, `hf { }` keys
//! against TrainingArguments' fields.
//!
//! DeepSpeed reads top-level keys with `dict.get` and silently ignores unknown ones, while a few
//! sections (ZeRO, offload, fp16, bf16) reject unknown fields only at launch (pydantic
//! `extra="forbid"`); see ../shared/reference/ds_hf_rules.md §6.2. We catch both at check time.

use std::collections::HashMap;

use crate::check::suggest;
use crate::codes;
use crate::diagnostic::Diagnostic;
use crate::schema::upstream;
use crate::schema::RawKind;
use crate::syntax::ast::{Body, Entry, Span};

/// A raw key flattened to its dotted path.
struct RawKey {
    path: Vec<String>,
    span: Span,
}

fn flatten(body: &Body, prefix: &[String], out: &mut Vec<RawKey>, diags: &mut Vec<Diagnostic>) {
    for entry in &body.entries {
        let key = entry.key();
        if key.text.contains(' ') {
            diags.push(
                Diagnostic::error(
                    codes::SYNTAX,
                    format!(
                        "raw keys are single words or dotted paths, found `{}`",
                        key.text
                    ),
                    key.span,
                )
                .with_label("spaces in a raw key")
                .with_help("write the upstream key as it is spelt, e.g. `zero_optimization.stage`"),
            );
            continue;
        }
        let mut path = prefix.to_vec();
        path.extend(key.text.split('.').map(str::to_string));
        match entry {
            Entry::Item(_) => out.push(RawKey {
                path,
                span: key.span,
            }),
            Entry::Section(section) => {
                // The section name itself is a key too (checked), then its contents.
                out.push(RawKey {
                    path: path.clone(),
                    span: key.span,
                });
                flatten(&section.body, &path, out, diags);
            }
        }
    }
}

/// Checks a raw block's keys.
pub fn check(kind: RawKind, body: &Body, out: &mut Vec<Diagnostic>) {
    let mut keys = Vec::new();
    flatten(body, &[], &mut keys, out);
    let mut seen: HashMap<String, Span> = HashMap::new();
    let mut sections: HashMap<String, Span> = HashMap::new();
    let mut reported_renames: Vec<&str> = Vec::new();
    // Every proper prefix of a key path is a section (`zero_optimization` of
    // `zero_optimization.stage`); collected once so the loop below stays linear.
    let prefixes: std::collections::HashSet<String> = keys
        .iter()
        .flat_map(|k| (1..k.path.len()).map(|n| k.path[..n].join(".")))
        .collect();
    for entry in &keys {
        let dotted = entry.path.join(".");
        // A section header (`zero_optimization { }`) may be repeated by dotted keys below it;
        // only leaf keys given twice are duplicates.
        let is_prefix = prefixes.contains(dotted.as_str());
        if is_prefix {
            sections.entry(dotted.clone()).or_insert(entry.span);
        } else if let Some(first) = seen.get(&dotted) {
            out.push(
                Diagnostic::error(
                    codes::DUPLICATE_KEY,
                    format!("`{dotted}` is given twice"),
                    entry.span,
                )
                .with_label("given again here")
                .with_secondary(*first, "first given here")
                .with_help("keep one of them"),
            );
            continue;
        } else {
            seen.insert(dotted.clone(), entry.span);
        }
        // Check each key once, at its first appearance as a section.
        if is_prefix && sections.get(&dotted) != Some(&entry.span) {
            continue;
        }
        if kind == RawKind::DeepSpeed {
            // One report per renamed section, not one per key inside it.
            if let Some(old) = renamed_deepspeed(&dotted).map(|r| r.0) {
                if reported_renames.contains(&old) {
                    continue;
                }
                reported_renames.push(old);
            }
        }
        let finding = match kind {
            RawKind::DeepSpeed => deepspeed_key(&entry.path, &dotted, entry.span),
            RawKind::Hf => hf_key(&entry.path, entry.span),
        };
        out.extend(finding);
    }
}

/// The rename entry covering this key: a renamed section (`bfloat16`) also covers the keys
/// below it (`bfloat16.enabled`).
fn renamed_deepspeed(
    dotted: &str,
) -> Option<&'static (&'static str, &'static str, &'static str, bool)> {
    upstream::DEEPSPEED_RENAMED.iter().find(|(old, ..)| {
        dotted
            .strip_prefix(old)
            .is_some_and(|rest| rest.is_empty() || rest.starts_with('.'))
    })
}

fn deepspeed_key(path: &[String], dotted: &str, span: Span) -> Option<Diagnostic> {
    if let Some((old, new, note, honoured)) = renamed_deepspeed(dotted) {
        let help = if new.is_empty() {
            format!("remove it: {note}")
        } else {
            format!("use `{new}` instead ({note})")
        };
        let message = if *honoured {
            format!("`{old}` is a deprecated DeepSpeed key")
        } else {
            format!("`{old}` is an old DeepSpeed key that current DeepSpeed ignores or rejects")
        };
        let diagnostic = if *honoured {
            Diagnostic::warning(codes::RENAMED_DEEPSPEED_KEY, message, span)
        } else {
            Diagnostic::error(codes::RENAMED_DEEPSPEED_KEY, message, span)
        };
        return Some(
            diagnostic
                .with_label(if *honoured {
                    "deprecated"
                } else {
                    "not applied"
                })
                .with_help(help),
        );
    }
    let top = path[0].as_str();
    if !upstream::DEEPSPEED_TOP_LEVEL.contains(&top) {
        let help = match suggest::closest(top, upstream::DEEPSPEED_TOP_LEVEL.iter().copied()) {
            Some(best) => format!("did you mean `{best}`? DeepSpeed silently ignores unknown top-level keys"),
            None => "DeepSpeed silently ignores unknown top-level keys; check the spelling against the DeepSpeed config docs".into(),
        };
        return Some(
            Diagnostic::error(
                codes::UNKNOWN_DEEPSPEED_KEY,
                format!("`{top}` is not a DeepSpeed config key"),
                span,
            )
            .with_label("unknown to DeepSpeed")
            .with_help(help),
        );
    }
    // Strictly validated sections: every level we know must name a real field.
    // The section of each depth is a prefix of `dotted` (no allocation per key).
    let mut end = 0;
    for depth in 1..path.len() {
        end += path[depth - 1].len() + usize::from(depth > 1);
        let section = &dotted[..end];
        let Some((_, fields)) = upstream::DEEPSPEED_STRICT_SECTIONS
            .iter()
            .find(|(name, _)| *name == section)
        else {
            break;
        };
        let field = path[depth].as_str();
        if !fields.contains(&field) {
            let help = match suggest::closest(field, fields.iter().copied()) {
                Some(best) => format!("did you mean `{best}`?"),
                None => format!("`{section}` has no such field"),
            };
            return Some(
                Diagnostic::error(
                    codes::UNKNOWN_DEEPSPEED_KEY,
                    format!("`{field}` is not a field of DeepSpeed's `{section}`"),
                    span,
                )
                .with_label("DeepSpeed rejects this at launch (\"Extra inputs are not permitted\")")
                .with_help(help),
            );
        }
    }
    None
}

fn hf_key(path: &[String], span: Span) -> Option<Diagnostic> {
    let field = path[0].as_str();
    if let Some((old, new, note)) = upstream::TRAINING_ARGUMENTS_RENAMED
        .iter()
        .find(|(old, _, _)| *old == field)
    {
        let help = if new.is_empty() {
            format!("remove it: {note}")
        } else {
            format!("use `{new}` instead ({note})")
        };
        return Some(
            Diagnostic::error(
                codes::RENAMED_HF_FIELD,
                format!("`{old}` is not a TrainingArguments field in transformers 5.24.0"),
                span,
            )
            .with_label("renamed or removed")
            .with_help(help),
        );
    }
    if let Some((old, new, note)) = upstream::TRAINING_ARGUMENTS_DEPRECATED_ALIASES
        .iter()
        .find(|(old, _, _)| *old == field)
    {
        return Some(
            Diagnostic::warning(
                codes::RENAMED_HF_FIELD,
                format!("`{old}` is a deprecated TrainingArguments field"),
                span,
            )
            .with_label("deprecated alias")
            .with_help(format!("use `{new}` instead ({note})")),
        );
    }
    if upstream::TRAINING_ARGUMENTS_FIELDS.contains(&field) {
        return None;
    }
    let help = match suggest::closest(field, upstream::TRAINING_ARGUMENTS_FIELDS.iter().copied()) {
        Some(best) => format!("did you mean `{best}`?"),
        None => "see transformers' TrainingArguments for the field names".into(),
    };
    Some(
        Diagnostic::error(
            codes::UNKNOWN_HF_FIELD,
            format!("`{field}` is not a TrainingArguments field"),
            span,
        )
        .with_label("unknown to transformers")
        .with_help(help),
    )
}
