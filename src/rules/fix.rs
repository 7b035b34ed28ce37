//! Edits that carry out a help line which names one ("set accumulate = 6", "write `owner =
//! deepspeed`"): the editor offers them as quick fixes ([`crate::diagnostics::Fix`]).

use crate::diagnostics::Diagnostic;
use crate::resolve::{label_key, Insert, Resolved, Source};
use crate::syntax::ast::Span;
use crate::upstream::versions::Library;

/// The edit that makes the recipe say `key = value` (`block.key`, or a block's label such as
/// `optimizer.kind`): the written value replaced, or the item added to its block, or the block
/// added. None when the value comes from a command-line flag (the recipe is not where it is
/// set) or when the key lives in a block that cannot take it.
pub fn set(r: &Resolved, key: &str, value: &str) -> Option<(Span, String)> {
    let (block, name) = key.split_once('.')?;
    // DeepSpeed's optimizer next to an HF schedule is refused by old transformers (R0413): there
    // the edit would trade one error for another.
    if key == "optimizer.owner"
        && value == "deepspeed"
        && r.facts.hf_ds_optimizer_hf_scheduler_error.is_some()
        && r.word("schedule.kind")
            .is_some_and(|k| !super::schedule::is_deepspeed_schedule(k))
    {
        return None;
    }
    match r.get(key).map(|s| &s.source) {
        Some(Source::Written { span }) => return Some((*span, value.to_string())),
        Some(Source::Flag { .. }) => return None,
        _ => {}
    }
    let is_label = label_key(block) == name && crate::schema::key_spec(key).is_none();
    if is_label {
        return match r.block_inserts.get(block) {
            // The block is written without its label: nothing to replace safely.
            Some(_) => None,
            None => Some((
                Span::new(r.text_end, r.text_end),
                format!("\n{block} {value}"),
            )),
        };
    }
    let item = format!("{name} = {value}");
    Some(match r.block_inserts.get(block) {
        Some(Insert::AfterEntry(end)) => (Span::new(*end, *end), format!(", {item}")),
        Some(Insert::EmptyBody(span)) => (*span, format!("{{ {item} }}")),
        Some(Insert::NoBody(end)) => (Span::new(*end, *end), format!(" {{ {item} }}")),
        None => (
            Span::new(r.text_end, r.text_end),
            format!("\n{block} {{ {item} }}"),
        ),
    })
}

/// The edit that makes the recipe target `library` at `version`: the written version replaced,
/// or the pair added to the `target` block, or a `target` line added at the top. None when the
/// target comes from a `--target` flag.
pub fn set_target(r: &Resolved, library: Library, version: &str) -> Option<(Span, String)> {
    let i = Library::ALL.iter().position(|l| *l == library)?;
    let quoted = crate::commands::format::quote(version);
    match &r.target_sources[i] {
        Source::Written { span } => Some((*span, quoted)),
        Source::Flag { .. } => None,
        _ => Some(match r.block_inserts.get("target") {
            Some(Insert::AfterEntry(end)) => (
                Span::new(*end, *end),
                format!(", {} {quoted}", library.key()),
            ),
            _ => (
                Span::new(0, 0),
                format!("target {} {quoted}\n", library.key()),
            ),
        }),
    }
}

/// Where a help names a release to target (`target transformers ≥ 4.54.0`, the wording every
/// rule's `first_release` help uses), adds the fix that targets exactly that release.
pub fn add_target_upgrade(d: &mut Diagnostic, r: &Resolved) {
    let Some(help) = &d.help else {
        return;
    };
    let Some(at) = help.find("target ") else {
        return;
    };
    let rest = &help[at + "target ".len()..];
    let Some((lib, rest)) = rest.split_once(' ') else {
        return;
    };
    let Some(library) = Library::ALL
        .into_iter()
        .find(|l| l.key().eq_ignore_ascii_case(lib))
    else {
        return;
    };
    let Some(rest) = rest.strip_prefix("≥ ") else {
        return;
    };
    let version: String = rest
        .chars()
        .take_while(|c| c.is_ascii_digit() || *c == '.')
        .collect();
    let version = version.trim_end_matches('.');
    if version
        .parse::<crate::upstream::versions::Version>()
        .is_err()
    {
        return;
    }
    if let Some((span, text)) = set_target(r, library, version) {
        let title = format!("target {} \"{version}\"", library.key());
        if !d.fixes.iter().any(|f| f.title == title) {
            d.fixes.push(crate::diagnostics::Fix {
                title,
                edits: vec![crate::diagnostics::Edit { span, text }],
            });
        }
    }
}

/// Where a help names an edit of the recipe in the words every rule uses — "write `owner =
/// hf`", "set `format = jsonl`", "remove `fp16_backend`", "use `zero 3`" — adds it as a fix: the
/// key is the recipe's one key of that name (written, for a removal), a label change only for
/// `zero` and `optimizer` (whose kinds share their keys). Help text naming anything else (`…`
/// placeholders, raw keys, other files) adds nothing.
pub fn add_named_edits(d: &mut Diagnostic, r: &Resolved) {
    let Some(help) = d.help.clone() else {
        return;
    };
    let mut rest = help.as_str();
    while let Some(open) = rest.find('`') {
        let before = &rest[..open];
        let Some(close) = rest[open + 1..].find('`') else {
            break;
        };
        let snippet = &rest[open + 1..open + 1 + close];
        rest = &rest[open + close + 2..];
        // "write `owner = deepspeed` with `torch_adam = true`": two edits, not this one alone.
        let compound = rest.starts_with(" with `") || rest.starts_with(" and `");
        // "remove `seed` from `hf { }`": a raw key, not the typed one of that name.
        let raw = ["deepspeed", "hf"]
            .into_iter()
            .find(|b| rest.starts_with(&format!(" from `{b} {{")));
        let before = before.trim_end();
        let verb = before.rsplit(' ').next().unwrap_or("");
        // Only an edit the help offers as a way to fix it: at the start of the help or of an
        // alternative ("…, or set `x = 1`"), not one mentioned in an explanation after a colon.
        let lead = before[..before.len() - verb.len()].trim_end();
        let offered = lead.is_empty()
            || lead.ends_with(" or")
            || lead.ends_with(';')
            || lead.ends_with(',')
            || lead == "or";
        if snippet.contains('…') || !offered || compound {
            continue;
        }
        let fix = match verb {
            "remove" | "drop" => removal_of(r, snippet, raw),
            "write" | "set" | "use" => setting_of(r, snippet),
            _ => None,
        };
        if let Some((title, span, text)) = fix {
            if !d.fixes.iter().any(|f| f.title == title) {
                d.fixes.push(crate::diagnostics::Fix {
                    title,
                    edits: vec![crate::diagnostics::Edit { span, text }],
                });
            }
        }
    }
}

/// The written item named `name` (one only), as a removal; in a raw block, the entry at that
/// dotted path.
fn removal_of(r: &Resolved, name: &str, raw: Option<&str>) -> Option<(String, Span, String)> {
    if let Some(block) = raw {
        let span = r.raw_item_spans.get(&format!("{block}.{name}"))?;
        return Some((
            format!("remove `{name}` from `{block} {{ }}`"),
            *span,
            String::new(),
        ));
    }
    let mut found = r
        .item_spans
        .iter()
        .filter(|(k, _)| k.split_once('.').is_some_and(|(_, n)| n == name));
    let (_, span) = found.next()?;
    if found.next().is_some() {
        return None;
    }
    Some((format!("remove `{name}`"), *span, String::new()))
}

/// `name = value` for the recipe's one key of that name, or `zero N` / `optimizer KIND`.
fn setting_of(r: &Resolved, snippet: &str) -> Option<(String, Span, String)> {
    let key = if let Some((name, value)) = snippet.split_once(" = ") {
        let name = name.trim();
        // The written one, else the one block of the schema that has it.
        let written: Vec<&String> = r
            .item_spans
            .keys()
            .filter(|k| k.split_once('.').is_some_and(|(_, n)| n == name))
            .collect();
        let key = match written[..] {
            [k] => k.clone(),
            [] => {
                let blocks: Vec<&str> = crate::schema::BLOCKS
                    .iter()
                    .filter(|b| b.key(name).is_some())
                    .map(|b| b.name)
                    .collect();
                match blocks[..] {
                    [b] => format!("{b}.{name}"),
                    _ => return None,
                }
            }
            _ => return None,
        };
        (key, value.trim().to_string())
    } else {
        let (block, label) = snippet.split_once(' ')?;
        if !matches!(block, "zero" | "optimizer") || label.contains(' ') {
            return None;
        }
        (format!("{block}.{}", label_key(block)), label.to_string())
    };
    let (span, text) = set(r, &key.0, &key.1)?;
    Some((format!("write `{snippet}`"), span, text))
}

/// Adds the fix "remove `key = value`" when the item is written in the recipe (the separators
/// around it stay: `{ a = 1, }` is valid, and `recipe fmt` tidies it).
pub fn with_removal(d: Diagnostic, r: &Resolved, key: &str) -> Diagnostic {
    match r.item_spans.get(key) {
        Some(span) => {
            let name = key.split_once('.').map_or(key, |(_, n)| n);
            d.with_fix(format!("remove `{name}`"), *span, "")
        }
        None => d,
    }
}

/// Adds the fix "write `key = value`" to `d` when [`set`] finds where.
pub fn with_set(d: Diagnostic, r: &Resolved, key: &str, value: &str) -> Diagnostic {
    let name = key.split_once('.').map_or(key, |(_, n)| n);
    let title = if name == label_key(key.split('.').next().unwrap_or("")) {
        format!("write `{} {value}`", key.split('.').next().unwrap_or(""))
    } else {
        format!("write `{name} = {value}`")
    };
    match set(r, key, value) {
        Some((span, text)) => d.with_fix(title, span, text),
        None => d,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn apply(text: &str, key: &str, value: &str) -> String {
        let file = crate::syntax::parse(text).unwrap();
        let r = crate::resolve::resolve(&file, &Default::default());
        let (span, new) = set(&r, key, value).unwrap();
        let mut out = text.to_string();
        out.replace_range(span.start..span.end, &new);
        out
    }

    #[test]
    fn replaces_written_values_and_adds_missing_ones() {
        let base = "recipe \"x\"\nbatch { micro = 16 }\n";
        assert_eq!(
            apply(base, "batch.micro", "8"),
            "recipe \"x\"\nbatch { micro = 8 }\n"
        );
        assert_eq!(
            apply(base, "batch.accumulate", "4"),
            "recipe \"x\"\nbatch { micro = 16, accumulate = 4 }\n"
        );
        assert_eq!(
            apply("recipe \"x\"\nzero 2\n", "zero.overlap_comm", "true"),
            "recipe \"x\"\nzero 2 { overlap_comm = true }\n"
        );
        assert_eq!(
            apply("recipe \"x\"\ntrain { }\n", "train.clip", "1.0"),
            "recipe \"x\"\ntrain { clip = 1.0 }\n"
        );
        assert_eq!(
            apply(base, "train.precision", "fp16"),
            "recipe \"x\"\nbatch { micro = 16 }\ntrain { precision = fp16 }\n"
        );
        assert_eq!(
            apply(base, "zero.stage", "0"),
            "recipe \"x\"\nbatch { micro = 16 }\nzero 0\n"
        );
        assert_eq!(
            apply(
                "recipe \"x\"\noptimizer adamw { lr = 1e-4 }\n",
                "optimizer.kind",
                "adam"
            ),
            "recipe \"x\"\noptimizer adam { lr = 1e-4 }\n"
        );
    }
}
