//! The raw escape hatches: `deepspeed { }` keys against DeepSpeed's key set, `hf { }` keys
//! against TrainingArguments' fields.
//!
//! DeepSpeed reads top-level keys with `dict.get` and silently ignores unknown ones, while a few
//! sections (ZeRO, offload, fp16, bf16) reject unknown fields only at launch (pydantic
//! `extra="forbid"`: `deepspeed/runtime/config_utils.py:DeepSpeedConfigModel`, the base of
//! `deepspeed/runtime/zero/config.py:DeepSpeedZeroConfig`). We catch both at check time.

use std::collections::{HashMap, HashSet};

use crate::check::suggest;
use crate::diagnostics::codes;
use crate::diagnostics::Diagnostic;
use crate::rules::compat;
use crate::schema::sampled::{self, Around, Release};
use crate::schema::upstream;
use crate::schema::upstream_versions;
use crate::schema::RawKind;
use crate::syntax::ast::{Body, Entry, Span};
use crate::upstream::versions::{Library, Version};

/// A raw key flattened to its dotted path (key words never hold a `.`, so the path's parts
/// are the dotted text's `.`-separated parts).
struct RawKey {
    dotted: String,
    span: Span,
}

/// Flattens `body`'s keys below `prefix` (a dotted path, empty at the top; restored on return).
fn flatten(body: &Body, prefix: &mut String, out: &mut Vec<RawKey>, diags: &mut Vec<Diagnostic>) {
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
        let len = prefix.len();
        if len > 0 {
            prefix.push('.');
        }
        prefix.push_str(&key.text);
        // A section's name is a key too (checked), before its contents.
        out.push(RawKey {
            dotted: prefix.clone(),
            span: key.span,
        });
        if let Entry::Section(section) = entry {
            flatten(&section.body, prefix, out, diags);
        }
        prefix.truncate(len);
    }
}

/// The target releases raw keys are checked against (None: the newest).
#[derive(Debug, Clone, Copy, Default)]
pub struct Releases {
    /// transformers, for `hf { }`.
    pub transformers: Option<Version>,
    /// DeepSpeed, for `deepspeed { }`.
    pub deepspeed: Option<Version>,
}

/// Checks a raw block's keys.
pub fn check(kind: RawKind, body: &Body, release: Releases, out: &mut Vec<Diagnostic>) {
    let mut keys = Vec::new();
    flatten(body, &mut String::new(), &mut keys, out);
    let mut seen: HashMap<&str, Span> = HashMap::with_capacity(keys.len());
    let mut sections: HashMap<&str, Span> = HashMap::new();
    let mut reported_renames: Vec<&str> = Vec::new();
    let mut reported_tops: Vec<&str> = Vec::new();
    // Every proper prefix of a key path is a section (`zero_optimization` of
    // `zero_optimization.stage`); collected once so the loop below stays linear.
    let prefixes: HashSet<&str> = keys
        .iter()
        .flat_map(|k| {
            k.dotted
                .bytes()
                .enumerate()
                .filter(|&(_, b)| b == b'.')
                .map(|(i, _)| &k.dotted[..i])
        })
        .collect();
    for entry in &keys {
        let dotted = entry.dotted.as_str();
        // A section header (`zero_optimization { }`) may be repeated by dotted keys below it;
        // only leaf keys given twice are duplicates.
        let is_prefix = prefixes.contains(dotted);
        if is_prefix {
            sections.entry(dotted).or_insert(entry.span);
        } else if let Some(first) = seen.get(dotted) {
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
            seen.insert(dotted, entry.span);
        }
        // Check each key once, at its first appearance as a section.
        if is_prefix && sections.get(dotted) != Some(&entry.span) {
            continue;
        }
        let finding = match kind {
            RawKind::DeepSpeed => {
                let renamed = renamed_deepspeed(dotted);
                // One report per renamed section, not one per key inside it.
                if let Some(&(old, ..)) = renamed {
                    if reported_renames.contains(&old) {
                        continue;
                    }
                    reported_renames.push(old);
                }
                deepspeed_key(dotted, renamed, entry.span, release.deepspeed)
            }
            RawKind::Hf => hf_key(dotted, entry.span, release.transformers),
        };
        // An unknown section is reported once, not again for each key inside it.
        let top = dotted.split('.').next().unwrap_or(dotted);
        if let Some(d) = &finding {
            let about_top = [
                format!("`{top}` is not a config key"),
                format!("`{top}` may not be a config key"),
            ];
            if d.code == codes::UNKNOWN_DEEPSPEED_KEY
                && about_top.iter().any(|m| d.message.starts_with(m))
            {
                if reported_tops.contains(&top) {
                    continue;
                }
                reported_tops.push(top);
            }
        }
        out.extend(finding);
    }
}

/// The rename entry covering this key: a renamed section (`bfloat16`) also covers the keys
/// below it (`bfloat16.enabled`). The table is sorted, so a section sorts before the keys
/// below it and the shortest covering entry is the first in table order.
fn renamed_deepspeed(
    dotted: &str,
) -> Option<&'static (&'static str, &'static str, &'static str, bool)> {
    let top = dotted.split('.').next().unwrap_or(dotted);
    let first = upstream::DEEPSPEED_RENAMED.partition_point(|(old, ..)| *old < top);
    if !upstream::DEEPSPEED_RENAMED
        .get(first)
        .is_some_and(|(old, ..)| old.starts_with(top))
    {
        return None; // no entry under this top-level key (most keys)
    }
    let ends = dotted
        .bytes()
        .enumerate()
        .filter(|&(_, b)| b == b'.')
        .map(|(i, _)| i)
        .chain([dotted.len()]);
    ends.filter_map(|end| {
        let prefix = &dotted[..end];
        upstream::DEEPSPEED_RENAMED
            .binary_search_by(|(old, ..)| old.cmp(&prefix))
            .ok()
    })
    .map(|i| &upstream::DEEPSPEED_RENAMED[i])
    .next()
}

/// Checks one DeepSpeed key; `renamed` is its [`renamed_deepspeed`] entry.
fn deepspeed_key(
    dotted: &str,
    renamed: Option<&(&str, &str, &str, bool)>,
    span: Span,
    release: Option<Version>,
) -> Option<Diagnostic> {
    if let Some((old, new, note, honoured)) = renamed {
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
        let diagnostic = diagnostic
            .with_label(if *honoured {
                "deprecated"
            } else {
                "not applied"
            })
            .with_help(help);
        // The key written as the whole old path (`cpu_offload`, or dotted) is renamed in place.
        let rename = (!new.is_empty() && span.len() == old.len()).then_some(*new);
        return Some(rename_fix(diagnostic, span, rename));
    }
    let mut path = dotted.split('.');
    let top = path.next().expect("a key has one part at least");
    // The target release's top-level keys (the nearest sampled release, `schema::sampled`).
    let v = release.unwrap_or_else(|| Library::DeepSpeed.newest());
    let table = upstream_versions::DEEPSPEED_TOP_LEVEL_BY_VERSION;
    let keys = sampled::nearest(table, v).1;
    // Read by one neighbour of the target and not by the other (R0909's keys aside): said at
    // the key itself, or once for a section the nearest release does not read (the strict
    // checks below still run inside one it reads).
    let unsure = between(top, &DEEPSPEED_TOP, sampled::around(table, v), v, span)
        .filter(|_| compat::removed_key(top).is_none());
    if let Some(d) = unsure {
        if dotted == top || !keys.contains(&top) {
            return Some(d);
        }
    }
    if !keys.contains(&top) {
        // A section of a feature the target removed (an earlier sampled release reads it):
        // R0909 reports it (`rules::compat::REMOVED_KEYS`, "… has been removed").
        if compat::removed_key(top).is_some() && sampled::earlier_has(table, v, top) {
            return None;
        }
        // A key of a later release: the target is what is wrong, not the spelling.
        // Of the sampled releases, the first newer one that reads it and the one before it.
        let added = sampled::first_later_with(table, v, top).map(|(a, b)| (a.0, b.map(|b| b.0)));
        let best = added
            .is_none()
            .then(|| suggest::closest(top, keys.iter().copied()))
            .flatten();
        let help = match (added, best) {
            (Some((a, before)), _) => format!(
                "DeepSpeed {v} silently ignores it; DeepSpeed {a} reads it{}: target a release that does, or remove it",
                before.map(|b| format!(" ({b} does not)")).unwrap_or_default()
            ),
            (None, Some(best)) => format!("did you mean `{best}`? DeepSpeed silently ignores unknown top-level keys"),
            (None, None) => "DeepSpeed silently ignores unknown top-level keys; check the spelling against the DeepSpeed config docs".into(),
        };
        let d = Diagnostic::error(
            codes::UNKNOWN_DEEPSPEED_KEY,
            format!("`{top}` is not a config key of DeepSpeed {v}"),
            span,
        )
        .with_label(format!("unknown to DeepSpeed {v}"))
        .with_help(help);
        // Only where the key is written as that one word (a section, or a bare key).
        return Some(rename_fix(
            d,
            span,
            best.filter(|_| span.len() == top.len()),
        ));
    }
    // Strictly validated sections: every level we know must name a real field.
    // The section of each depth is a prefix of `dotted` (no allocation per key).
    let mut end = top.len();
    for field in path {
        let section = &dotted[..end];
        end += 1 + field.len();
        let Ok(i) =
            upstream::DEEPSPEED_STRICT_SECTIONS.binary_search_by(|(name, _)| name.cmp(&section))
        else {
            break;
        };
        let fields = upstream::DEEPSPEED_STRICT_SECTIONS[i].1;
        // The strict lists are the newest release's; a field of a removed feature
        // (`zero_optimization.mics_shard_size`) is R0909's where the target refuses it, and
        // still a field for the releases before.
        if !fields.contains(&field) && compat::removed_key(&dotted[..end]).is_some() {
            return None;
        }
        if section == "zero_optimization" && fields.contains(&field) {
            // A field of the newest release: the target's own (sampled) fields decide, said at
            // the field (not again for the keys inside a section-valued one).
            if let Some(d) = zero_field_of(field, &dotted[..end], v, span) {
                return (end == dotted.len()).then_some(d);
            }
        }
        if !fields.contains(&field) {
            let best = suggest::closest(field, fields.iter().copied());
            let help = match best {
                Some(best) => format!("did you mean `{best}`?"),
                None => format!("`{section}` has no such field"),
            };
            let d = Diagnostic::error(
                codes::UNKNOWN_DEEPSPEED_KEY,
                format!("`{field}` is not a field of DeepSpeed's `{section}`"),
                span,
            )
            .with_label("DeepSpeed rejects this at launch (\"Extra inputs are not permitted\")")
            .with_help(help);
            let whole = span.len() == field.len() && dotted.ends_with(field);
            return Some(rename_fix(d, span, best.filter(|_| whole)));
        }
    }
    None
}

/// What an uncertain key is, for [`uncertain`]'s warning.
struct Unsure {
    code: &'static str,
    /// What the key would be: "a config key of DeepSpeed".
    what: &'static str,
    /// The library.
    lib: &'static str,
    /// How a release has the key, and how it lacks it: ("reads", "does not read").
    verbs: (&'static str, &'static str),
    /// What becomes of the key where the target lacks it.
    effect: &'static str,
}

/// The top-level keys of DeepSpeed.
const DEEPSPEED_TOP: Unsure = Unsure {
    code: codes::UNKNOWN_DEEPSPEED_KEY,
    what: "a config key of DeepSpeed",
    lib: "DeepSpeed",
    verbs: ("reads", "does not read"),
    effect: "it is silently ignored",
};

/// The fields of DeepSpeed's `zero_optimization`.
const DEEPSPEED_ZERO: Unsure = Unsure {
    what: "a field of `zero_optimization` in DeepSpeed",
    verbs: ("takes", "does not take"),
    effect: "it is rejected at launch (or, before v0.7.0, ignored)",
    ..DEEPSPEED_TOP
};

/// The fields of transformers' `TrainingArguments`.
const HF_FIELD: Unsure = Unsure {
    code: codes::UNKNOWN_HF_FIELD,
    what: "a TrainingArguments field in transformers",
    lib: "transformers",
    verbs: ("has", "does not have"),
    effect: "HF's argument parser refuses it at launch",
};

/// The warning for `key` when the sampled releases around the target `v` (`sampled::around`)
/// do not agree on it, so that recipe cannot tell whether `v` has it.
fn between<T: Release>(
    key: &str,
    u: &Unsure,
    around: Around<T>,
    v: Version,
    span: Span,
) -> Option<Diagnostic> {
    let (at, next) = (around.at?, around.next?);
    let (a, has_at) = (at.version(), at.has(key));
    let (n, has_next) = (next.version(), next.has(key));
    if has_at == has_next {
        return None;
    }
    let (yes, no) = u.verbs;
    let (turn, label) = if has_next {
        ("added", format!("{a} {no} it, {n} {yes} it"))
    } else {
        ("dropped", format!("{a} {yes} it, {n} {no} it"))
    };
    let lib = u.lib;
    Some(
        Diagnostic::warning(u.code, format!("`{key}` may not be {} {v}", u.what), span)
            .with_label(label)
            .with_help(format!(
                "{lib} {turn} it in a release between {a} and {n}, which recipe has not sampled \
                 (conformance/extract_upstream.py); where {v} {no} it, {}: target {a} or {n} to be \
                 told for sure",
                u.effect
            )),
    )
}

/// Whether DeepSpeed `v` validates `zero_optimization` strictly (the pydantic
/// `DeepSpeedZeroConfig`, unknown fields rejected at launch) rather than reading it as a plain
/// dict (unknown keys ignored): from v0.7.0 on ([`upstream`]'s notes; the sampled 0.5.10 reads a
/// dict, 0.8.3 validates).
fn zero_is_strict(v: Version) -> bool {
    v >= Version::new(0, 7, 0)
}

/// A field of the newest release's `zero_optimization` (`dotted` its path) that the target `v`
/// may not take: not a field of the newest sampled release up to `v` (an error, unless the next
/// sampled release takes it: then a warning), or taken by it and not by the next one (a warning).
fn zero_field_of(field: &str, dotted: &str, v: Version, span: Span) -> Option<Diagnostic> {
    let table = upstream_versions::DEEPSPEED_ZERO_KEYS_BY_VERSION;
    let around = sampled::around(table, v);
    if let Some(d) = between(field, &DEEPSPEED_ZERO, around, v, span) {
        return compat::removed_key(dotted).is_none().then_some(d);
    }
    if sampled::nearest(table, v).has(field) {
        return None;
    }
    // The first sampled release after the target that takes it, and the one before that.
    let (first, before) = sampled::first_later_with(table, v, field)?;
    let (first, before) = (first.0, before?.0);
    let (label, effect) = if zero_is_strict(v) {
        (
            format!("DeepSpeed {v} rejects this at launch (\"Extra inputs are not permitted\")"),
            "rejects it",
        )
    } else {
        (format!("DeepSpeed {v} ignores it"), "silently ignores it")
    };
    let since = format!("{first} takes it ({before} does not)");
    Some(
        Diagnostic::error(
            codes::UNKNOWN_DEEPSPEED_KEY,
            format!("`{field}` is not a field of `zero_optimization` in DeepSpeed {v}"),
            span,
        )
        .with_label(label)
        .with_help(format!(
            "DeepSpeed {v} {effect}; DeepSpeed {since}: target a release that takes it, or remove it"
        )),
    )
}

/// Adds the fix "rename to `new`" (the key's span replaced).
fn rename_fix(d: Diagnostic, span: Span, new: Option<&str>) -> Diagnostic {
    match new {
        Some(new) => d.with_fix(format!("rename to `{new}`"), span, new),
        None => d,
    }
}

/// Checks one key of a ds_config.json file, where DeepSpeed's own reading decides the severity
/// (unlike a recipe's `deepspeed { }` block, whose every unknown key is an error): an unknown
/// top-level key, and an old key DeepSpeed no longer reads, are silently ignored (warnings); a
/// key a strict section rejects is an error, except an `"auto"` value in a section built by
/// keyword, which DeepSpeed drops before validating (docs/upstream.md, schema/upstream.rs).
pub fn deepspeed_finding(dotted: &str, span: Span, is_auto: bool) -> Option<Diagnostic> {
    let renamed = renamed_deepspeed(dotted);
    // Keys below a renamed section are covered by the section's report.
    if renamed.is_some_and(|(old, ..)| *old != dotted) {
        return None;
    }
    let mut d = deepspeed_key(dotted, renamed, span, None)?;
    let (section, field) = dotted.rsplit_once('.').unwrap_or(("", dotted));
    let strict = upstream::DEEPSPEED_STRICT_SECTIONS
        .binary_search_by(|(name, _)| name.cmp(&section))
        .ok()
        .map(|i| upstream::DEEPSPEED_STRICT_SECTIONS[i].1);
    let rejected = strict.is_some_and(|fields| !fields.contains(&field));
    let keyword_built = !section.contains('.');
    d.severity = if rejected && !(is_auto && keyword_built) {
        crate::diagnostics::Severity::Error
    } else if renamed.is_some_and(|(.., honoured)| *honoured) || !rejected {
        crate::diagnostics::Severity::Warning
    } else {
        crate::diagnostics::Severity::Error
    };
    if d.code == codes::UNKNOWN_DEEPSPEED_KEY && !rejected {
        d.primary.text = "DeepSpeed ignores it".into();
    }
    if d.code == codes::RENAMED_DEEPSPEED_KEY && d.severity == crate::diagnostics::Severity::Warning
    {
        d.primary.text = if renamed.is_some_and(|(.., honoured)| *honoured) {
            "deprecated, still applied".into()
        } else {
            "ignored".into()
        };
    }
    Some(d)
}

/// Checks one raw `hf { }` key against the fields of the target transformers release
/// (`release`; None: the newest), whose `HfArgumentParser` refuses any other.
fn hf_key(dotted: &str, span: Span, release: Option<Version>) -> Option<Diagnostic> {
    let field = dotted
        .split('.')
        .next()
        .expect("a key has one part at least");
    let v = release.unwrap_or_else(|| Library::Transformers.newest());
    let table = upstream_versions::TRAINING_ARGUMENTS_BY_VERSION;
    let fields = sampled::nearest(table, v);
    // The target between two sampled releases that disagree about the field: a warning.
    let unsure = between(field, &HF_FIELD, sampled::around(table, v), v, span);
    if fields.has(field) {
        let Some((old, new, note)) = upstream::TRAINING_ARGUMENTS_DEPRECATED_ALIASES
            .iter()
            .find(|(old, _, _)| *old == field)
        else {
            return unsure;
        };
        let d = Diagnostic::warning(
            codes::RENAMED_HF_FIELD,
            format!("`{old}` is a deprecated TrainingArguments field"),
            span,
        )
        .with_label("deprecated alias")
        .with_help(format!("use `{new}` instead ({note})"));
        return Some(rename_fix(
            d,
            span,
            (span.len() == old.len()).then_some(*new),
        ));
    }
    if unsure.is_some() {
        return unsure;
    }
    if let Some((old, new, note)) = upstream::TRAINING_ARGUMENTS_RENAMED
        .iter()
        .find(|(old, new, _)| *old == field && (new.is_empty() || fields.has(new)))
    {
        let help = if new.is_empty() {
            format!("remove it: {note}")
        } else {
            format!("use `{new}` instead ({note})")
        };
        let d = Diagnostic::error(
            codes::RENAMED_HF_FIELD,
            format!("`{old}` is not a TrainingArguments field in transformers {v}"),
            span,
        )
        .with_label("renamed or removed")
        .with_help(help);
        let rename = (!new.is_empty() && span.len() == old.len()).then_some(*new);
        return Some(rename_fix(d, span, rename));
    }
    // A later release's new name for a field this release has under its old name.
    if let Some((old, new, _)) = upstream::TRAINING_ARGUMENTS_RENAMED
        .iter()
        .find(|(old, new, _)| *new == field && fields.has(old))
    {
        let d = Diagnostic::error(
            codes::UNKNOWN_HF_FIELD,
            format!("`{new}` is not a TrainingArguments field in transformers {v}"),
            span,
        )
        .with_label(format!("unknown to transformers {v}"))
        .with_help(format!(
            "transformers {v} calls it `{old}` (renamed `{new}` later): write `{old}`, or target a release with `{new}`"
        ));
        return Some(rename_fix(
            d,
            span,
            (span.len() == new.len()).then_some(*old),
        ));
    }
    // A field of a later release: the target is what is wrong, not the spelling.
    // Of the sampled releases, the first newer one that has it and the one before it.
    let added =
        sampled::first_later_with(table, v, field).map(|(a, b)| (a.version, b.map(|b| b.version)));
    let names = fields.fields.iter().map(|(n, _)| *n);
    let best = added
        .is_none()
        .then(|| suggest::closest(field, names))
        .flatten();
    let help = match (added, best) {
        (Some((a, before)), _) => format!(
            "transformers {a} has `{field}`{}: target a release that has it, or remove it",
            before
                .map(|b| format!(" ({b} does not)"))
                .unwrap_or_default()
        ),
        (None, Some(best)) => format!("did you mean `{best}`?"),
        (None, None) => "see transformers' TrainingArguments for the field names".into(),
    };
    let d = Diagnostic::error(
        codes::UNKNOWN_HF_FIELD,
        format!("`{field}` is not a TrainingArguments field in transformers {v}"),
        span,
    )
    .with_label(format!("unknown to transformers {v}"))
    .with_help(help);
    Some(rename_fix(
        d,
        span,
        best.filter(|_| span.len() == field.len()),
    ))
}

#[cfg(test)]
mod tests {
    fn codes(text: &str) -> Vec<&'static str> {
        crate::check::check_source(text)
            .diagnostics
            .iter()
            .map(|d| d.code)
            .collect()
    }

    const HEAD: &str = "recipe \"x\"\nmodel bert { from = \"bert-base-uncased\", task = classify(labels: 2) }\ndata { train = \"t.jsonl\", samples = 100 }\nbatch { micro = 8 }\n";

    /// DeepSpeed 0.19.8's keys (docs/upstream.md §0.4) pass at the default target, 0.19.5 does not
    /// read its new top-level keys, and a removed feature's keys are R0909's where the target
    /// refuses them and still keys for 0.19.5.
    #[test]
    fn deepspeed_0_19_8_keys_are_known_and_removed_features_are_r0909s() {
        let new = "deepspeed {\n  gradient_allreduce_op = \"mean\"\n  disable_python_gc = 1\n  zero_optimization { compute_grad_norm = true, parameter_alignment = false }\n  compile { offload_activation_pin_memory = true }\n  hybrid_engine { enable_cuda_graph = false }\n  tensor_parallel { vocab_parallel_lm_head = false }\n}\n";
        let now = codes(&format!("{HEAD}{new}"));
        assert!(!now.contains(&"R0030"), "{now:?}");
        let then = codes(&format!("{HEAD}target deepspeed \"0.19.5\"\n{new}"));
        assert_eq!(
            then.iter().filter(|c| **c == "R0030").count(),
            4,
            "gradient_allreduce_op, disable_python_gc, and the zero fields compute_grad_norm and \
             parameter_alignment: {then:?}"
        );
        let removed = "deepspeed {\n  sparse_attention { mode = \"fixed\" }\n  zero_optimization { mics_shard_size = 2 }\n}\n";
        let now = codes(&format!("{HEAD}{removed}"));
        assert_eq!(now.iter().filter(|c| **c == "R0909").count(), 2, "{now:?}");
        assert!(!now.contains(&"R0030"), "{now:?}");
        let then = codes(&format!("{HEAD}target deepspeed \"0.19.5\"\n{removed}"));
        assert!(
            !then.contains(&"R0909") && !then.contains(&"R0030"),
            "{then:?}"
        );
    }

    /// (severity, message) of each R0030 for `deepspeed` at `target`.
    fn r0030(target: &str, deepspeed: &str) -> Vec<(crate::diagnostics::Severity, String)> {
        let text = format!("{HEAD}target deepspeed \"{target}\"\ndeepspeed {{ {deepspeed} }}\n");
        crate::check::check_source(&text)
            .diagnostics
            .into_iter()
            .filter(|d| d.code == "R0030")
            .map(|d| (d.severity, d.message))
            .collect()
    }

    /// A target between two sampled releases that disagree about a key is told recipe cannot
    /// tell (a warning), whichever way they disagree; a sampled target, or one whose neighbours
    /// agree, is told for sure. `zero_optimization`'s fields follow the target too: an error
    /// where the nearest sampled release rejects a field (strict from v0.7.0) or ignores it
    /// (before), a warning between two that disagree.
    #[test]
    fn keys_between_sampled_releases_are_uncertain_and_zero_fields_follow_the_target() {
        use crate::diagnostics::Severity::{Error, Warning};
        // `torch_autocast`: 0.17.0 does not read it, 0.17.6 does.
        let w = r0030("0.17.2", "torch_autocast { enabled = true }");
        assert_eq!(w.len(), 1, "{w:?}");
        assert_eq!(w[0].0, Warning);
        assert!(
            w[0].1
                .contains("may not be a config key of DeepSpeed 0.17.2"),
            "{w:?}"
        );
        assert!(r0030("0.17.6", "torch_autocast { enabled = true }").is_empty());
        assert_eq!(
            r0030("0.17.0", "torch_autocast { enabled = true }")[0].0,
            Error
        );
        // `compile`: read by 0.14.2, not by 0.14.5: uncertain for 0.14.3, said once for the
        // section, and a field inside it is still checked against the strict section.
        let w = r0030(
            "0.14.3",
            "compile { deepcompile = true, offload_activatoin = 1 }",
        );
        let sevs: Vec<_> = w.iter().map(|(s, _)| *s).collect();
        assert_eq!(sevs, [Warning, Error], "{w:?}");
        assert!(w[0].1.starts_with("`compile` may not be"), "{w:?}");
        assert!(w[1].1.contains("offload_activatoin"), "{w:?}");
        // zero: `leaf_module` from 0.18.0; `allgather_sequential` between 0.18.0 and 0.18.9.
        let e = r0030(
            "0.17.6",
            "zero_optimization { leaf_module { classes = [] } }",
        );
        assert_eq!(e.len(), 1, "{e:?}");
        assert_eq!(e[0].0, Error);
        assert!(e[0].1.contains("in DeepSpeed 0.17.6"), "{e:?}");
        assert!(r0030(
            "0.18.0",
            "zero_optimization { leaf_module { classes = [] } }"
        )
        .is_empty());
        let w = r0030(
            "0.18.5",
            "zero_optimization { allgather_sequential = true }",
        );
        assert_eq!(w.len(), 1, "{w:?}");
        assert_eq!(w[0].0, Warning);
        // Before v0.7.0 the section is a plain dict: ignored, still an error (nothing applies it).
        let e = r0030(
            "0.5.10",
            "zero_optimization { stage = 2, prefetch_bucket_size = 5 }",
        );
        assert_eq!(e.len(), 1, "{e:?}");
        assert!(e[0].1.contains("prefetch_bucket_size"), "{e:?}");
        // Older than every sample: the oldest sample's keys, as the emitter writes them (not
        // the newest release's, which once let a 0.2.0 target pass with `torch_autocast`).
        let e = r0030("0.2.0", "torch_autocast { enabled = true }");
        assert_eq!(e.len(), 1, "{e:?}");
        assert_eq!(e[0].0, Error);
        let e = r0030(
            "0.2.0",
            "zero_optimization { stage = 2, round_robin_gradients = true }",
        );
        assert_eq!(e.len(), 1, "{e:?}");
        assert!(e[0].1.contains("round_robin_gradients"), "{e:?}");
    }

    /// (code, severity, message) of each finding for `hf { … }` at transformers `target`.
    fn hf(target: &str, hf: &str) -> Vec<(&'static str, crate::diagnostics::Severity, String)> {
        let text = format!("{HEAD}target transformers \"{target}\"\nhf {{ {hf} }}\n");
        crate::check::check_source(&text)
            .diagnostics
            .into_iter()
            .filter(|d| d.code.starts_with("R003"))
            .map(|d| (d.code, d.severity, d.message))
            .collect()
    }

    /// TrainingArguments' fields between two sampled transformers releases that disagree: one
    /// added inside the 4.46 series (sampled at 4.46.0 and 4.46.3: a warning for 4.46.1, an
    /// error at 4.46.0), one dropped between 5.14.1 and 5.15.1 (a warning for 5.15.0); sure at
    /// the sampled releases, and between two that agree (4.55.0: 4.54.1 and 4.55.4 both have
    /// `hub_revision`).
    #[test]
    fn hf_fields_between_sampled_releases_are_uncertain() {
        use crate::diagnostics::Severity::{Error, Warning};
        let field = "average_tokens_across_devices = true";
        let w = hf("4.46.1", field);
        assert_eq!(w.len(), 1, "{w:?}");
        assert_eq!((w[0].0, w[0].1), ("R0032", Warning), "{w:?}");
        assert!(
            w[0].2.contains("may not be a TrainingArguments field"),
            "{w:?}"
        );
        assert_eq!(hf("4.46.0", field)[0].1, Error);
        assert!(hf("4.46.3", field).is_empty());
        assert!(hf("4.55.0", "hub_revision = \"main\"").is_empty());
        let w = hf("5.15.0", "logging_dir = \"logs\"");
        assert_eq!(w.len(), 1, "{w:?}");
        assert_eq!(w[0].1, Warning, "{w:?}");
        assert!(hf("5.14.1", "logging_dir = \"logs\"").is_empty());
        assert_eq!(hf("5.15.1", "logging_dir = \"logs\"")[0].1, Error);
    }
}
