//! Schema rules: blocks, labels, keys, duplicates, value types, required items.
//! Everything here is driven by the table in [`crate::schema`].

use std::collections::HashMap;

use crate::check::{raw, suggest};
use crate::diagnostics::codes;
use crate::diagnostics::Diagnostic;
use crate::schema::types::{words_list, Mismatch};
use crate::schema::{self, BlockSpec, BodySpec, KeySpec, LabelSpec, BLOCKS};
use crate::syntax::ast::{Block, Body, Entry, File, Span, ValueKind};
use crate::upstream::versions::{Library, Version};

/// Checks a parsed file against the schema, for the releases its `target` block names (else
/// the newest).
pub fn check(file: &File) -> Vec<Diagnostic> {
    check_for(file, &[])
}

/// Checks a parsed file against the schema; `targets` (`--target` flags) override the file's
/// own target for the raw `hf { }` fields and `deepspeed { }` keys.
pub fn check_for(file: &File, targets: &[(Library, Version)]) -> Vec<Diagnostic> {
    let target = |lib: Library| {
        targets
            .iter()
            .rev()
            .find(|(l, _)| *l == lib)
            .map(|(_, v)| *v)
            .or_else(|| written_target(file, lib))
    };
    let release = raw::Releases {
        transformers: target(Library::Transformers),
        deepspeed: target(Library::DeepSpeed),
    };
    let mut out = Vec::new();
    let mut seen: HashMap<&str, &Block> = HashMap::new();
    for block in &file.blocks {
        let name = block.name.name.as_str();
        let Some(spec) = schema::block(name) else {
            out.push(unknown_block(block));
            continue;
        };
        if let Some(first) = seen.get(name) {
            out.push(
                Diagnostic::error(
                    codes::DUPLICATE_BLOCK,
                    format!("the `{name}` block is given twice"),
                    block.header_span(),
                )
                .with_label("second one here")
                .with_secondary(first.header_span(), "first one here")
                .with_help(format!("merge them into one `{name}` block")),
            );
        } else {
            seen.insert(name, block);
        }
        check_block(file, release, spec, block, &mut out);
    }
    for spec in BLOCKS.iter().filter(|b| b.required) {
        if !seen.contains_key(spec.name) {
            out.push(missing_block(spec, file));
        }
    }
    out
}

fn unknown_block(block: &Block) -> Diagnostic {
    let name = &block.name.name;
    let names = BLOCKS.iter().map(|b| b.name);
    let best = suggest::closest(name, names.clone());
    let help = match best {
        Some(best) => format!("did you mean `{best}`?"),
        None => format!("the blocks are {}", words_list(&names.collect::<Vec<_>>())),
    };
    let d = Diagnostic::error(
        codes::UNKNOWN_BLOCK,
        format!("unknown block `{name}`"),
        block.name.span,
    )
    .with_label("not a block of the language")
    .with_help(help);
    replace_with(d, block.name.span, best)
}

fn missing_block(spec: &BlockSpec, file: &File) -> Diagnostic {
    // Point at the recipe's name if it has one, else at the first block, else the file start.
    let at = file
        .blocks
        .iter()
        .find(|b| b.name.name == "recipe")
        .or(file.blocks.first())
        .map_or(Span::new(0, 0), Block::header_span);
    let example = match spec.name {
        "model" => "model bert { from = \"...\", task = classify(labels: 2) }".to_string(),
        "data" | "batch" => {
            let items: Vec<String> = required_items(spec)
                .iter()
                .map(|(k, v)| format!("{k} = {v}"))
                .collect();
            format!("{} {{ {} }}", spec.name, items.join(", "))
        }
        other => other.to_string(),
    };
    let d = Diagnostic::error(
        codes::MISSING_BLOCK,
        format!("the recipe has no `{}` block", spec.name),
        at,
    )
    .with_label(format!("`{}` is needed to run", spec.name))
    .with_help(format!("add `{example}` ({})", lowercase_first(spec.doc)));
    // The model's path is the user's to name: no fix writes a placeholder for it.
    if spec.name == "model" {
        return d;
    }
    let end = file.blocks.last().map_or(0, |b| b.span.end);
    let text = if end == 0 {
        format!("{example}\n")
    } else {
        format!("\n{example}")
    };
    d.with_fix(format!("add `{example}`"), Span::new(end, end), text)
}

/// What a fix writes for a key a block needs: the usual training file, a two-label
/// classification, HF's usual per-device batch of 16 (for `micro` of the `micro`/`global` pair).
fn example_value(block: &str, key: &str) -> Option<&'static str> {
    match (block, key) {
        ("data", "train") => Some("\"data/train.jsonl\""),
        ("model", "task") => Some("classify(labels: 2)"),
        ("batch", "micro") => Some("16"),
        _ => None,
    }
}

/// The items a new block of this kind needs, with the values a fix writes for them.
fn required_items(spec: &BlockSpec) -> Vec<(&'static str, &'static str)> {
    let required = spec.keys.iter().filter(|k| k.required).map(|k| k.name);
    let first_of = spec.one_of.iter().filter_map(|g| g.first().copied());
    required
        .chain(first_of)
        .filter_map(|k| example_value(spec.name, k).map(|v| (k, v)))
        .collect()
}

/// The edit that adds `item` to a written block: after its last entry, into its empty braces,
/// or as a new body.
fn add_item(block: &Block, item: &str) -> crate::diagnostics::Edit {
    match &block.body {
        Some(body) => match body.entries.last() {
            Some(last) => crate::diagnostics::Edit {
                span: Span::new(last.span().end, last.span().end),
                text: format!(", {item}"),
            },
            None => crate::diagnostics::Edit {
                span: body.span,
                text: format!("{{ {item} }}"),
            },
        },
        None => crate::diagnostics::Edit {
            span: Span::new(block.header_span().end, block.header_span().end),
            text: format!(" {{ {item} }}"),
        },
    }
}

/// "a stage (0, 1, 2 or 3)" → "stage".
fn noun(what: &str) -> &str {
    let what = what.split(" (").next().unwrap_or(what);
    what.strip_prefix("an ")
        .or_else(|| what.strip_prefix("a "))
        .unwrap_or(what)
}

fn lowercase_first(s: &str) -> String {
    let mut c = s.chars();
    match c.next() {
        Some(f) => f
            .to_lowercase()
            .chain(c)
            .collect::<String>()
            .trim_end_matches('.')
            .to_string(),
        None => String::new(),
    }
}

/// `optimizer adamw`, `zero 2`, `data`: how messages name a block.
fn block_title(block: &Block) -> String {
    match &block.label {
        Some(label) => match &label.kind {
            ValueKind::Ident(w) => format!("{} {w}", block.name.name),
            ValueKind::Number(n) => format!("{} {}", block.name.name, n.raw),
            _ => block.name.name.clone(),
        },
        None => block.name.name.clone(),
    }
}

/// The block's kind for key applicability: its label word or number, if valid.
fn block_kind(spec: &BlockSpec, block: &Block) -> Option<String> {
    let label = block.label.as_ref()?;
    let ty = match spec.label {
        LabelSpec::Required { ty, .. } | LabelSpec::Optional { ty, .. } => ty,
        LabelSpec::None => return None,
    };
    ty.check(label).ok()?;
    match &label.kind {
        ValueKind::Ident(w) => Some(w.clone()),
        ValueKind::Number(n) => Some(n.raw.clone()),
        _ => None,
    }
}

/// The release of `lib` a `target` block names.
fn written_target(file: &File, lib: Library) -> Option<Version> {
    let target = file.blocks.iter().find(|b| b.name.name == "target")?;
    target.body.as_ref()?.entries.iter().find_map(|e| match e {
        Entry::Item(item) if item.key.text == lib.key() => match &item.value.kind {
            ValueKind::Str(s) => s.parse().ok(),
            _ => None,
        },
        _ => None,
    })
}

fn check_block(
    file: &File,
    release: raw::Releases,
    spec: &BlockSpec,
    block: &Block,
    out: &mut Vec<Diagnostic>,
) {
    let name = spec.name;
    // `zero { stage = 2 }`, `optimizer { kind = sgd }`: the label written as a key.
    let label_item = label_as_key(spec, block);
    match (spec.label, &block.label) {
        (LabelSpec::None, Some(label)) => out.push(
            Diagnostic::error(
                codes::BLOCK_SHAPE,
                format!("`{name}` takes no label"),
                label.span,
            )
            .with_label("unexpected label")
            .with_help(format!("write `{name} {{ … }}`")),
        ),
        (LabelSpec::Required { what, .. }, None) if label_item.is_some() => {
            out.push(label_written_as_key(
                file,
                block,
                what,
                label_item.expect("checked"),
            ));
        }
        (LabelSpec::Optional { what, .. }, None) if label_item.is_some() => {
            out.push(label_written_as_key(
                file,
                block,
                what,
                label_item.expect("checked"),
            ));
        }
        (LabelSpec::Required { what, example, .. }, None) => out.push(
            Diagnostic::error(
                codes::MISSING_LABEL,
                format!("`{name}` needs {what}"),
                block.name.span,
            )
            .with_label(format!("{what} should follow `{name}`"))
            .with_help(format!("for example `{example}`")),
        ),
        (LabelSpec::Required { ty, what, .. } | LabelSpec::Optional { ty, what }, Some(label)) => {
            if let Err(m) = ty.check(label) {
                out.push(mismatch(
                    m,
                    &format!("the {} of `{name}`", noun(what)),
                    what,
                    None,
                ));
            }
        }
        _ => {}
    }
    // With a missing or invalid label the kind is unknown: check keys against all kinds rather
    // than report every kind-specific key as misplaced.
    let kind = block_kind(spec, block);
    let kind_known = kind.is_some() || matches!(spec.label, LabelSpec::None);
    match (spec.body, &block.body) {
        (BodySpec::None, Some(body)) => out.push(
            Diagnostic::error(
                codes::BLOCK_SHAPE,
                format!("`{name}` takes no `{{ }}` body"),
                body.span,
            )
            .with_label("unexpected body")
            .with_help(match spec.label {
                LabelSpec::Required { example, .. } => format!("write it on one line: `{example}`"),
                _ => format!("write `{name}` alone"),
            }),
        ),
        (BodySpec::Items | BodySpec::Pairs, body) => {
            let skip = label_item.map(|i| i.key.text.as_str());
            check_items(
                file,
                spec,
                block,
                (kind.as_deref(), kind_known, skip),
                body.as_ref(),
                out,
            )
        }
        (BodySpec::Raw(kind), Some(body)) => raw::check(kind, body, release, out),
        _ => {}
    }
}

/// `(kind, kind_known, skip)`: the block's kind, whether it is known, and a key already
/// reported as the label written as a key.
type KindInfo<'a> = (Option<&'a str>, bool, Option<&'a str>);

fn check_items(
    file: &File,
    spec: &BlockSpec,
    block: &Block,
    (kind, kind_known, skip): KindInfo<'_>,
    body: Option<&Body>,
    out: &mut Vec<Diagnostic>,
) {
    let applies = |k: &KeySpec| !kind_known || k.applies_to(kind);
    let title = block_title(block);
    let mut given: HashMap<&str, Span> = HashMap::new();
    for entry in body.map_or(&[][..], |b| &b.entries[..]) {
        let key = entry.key();
        let item = match entry {
            Entry::Section(section) => {
                out.push(
                    Diagnostic::error(
                        codes::SECTION_NOT_ALLOWED,
                        format!("nested `{} {{ }}` sections are not part of `{title}`", key.text),
                        section.key.span,
                    )
                    .with_label("a section")
                    .with_help("write items as `key = value`; nested sections only belong in `deepspeed { }` and `hf { }`"),
                );
                continue;
            }
            Entry::Item(item) => item,
        };
        if skip == Some(key.text.as_str()) {
            continue;
        }
        let Some(key_spec) = spec.key(&key.text) else {
            let d = unknown_key(spec, &title, kind, &key.text, key.span);
            out.push(elsewhere(file, block, item, d));
            continue;
        };
        if let Some(first) = given.get(key.text.as_str()) {
            out.push(
                Diagnostic::error(
                    codes::DUPLICATE_KEY,
                    format!("`{}` is given twice in `{title}`", key.text),
                    key.span,
                )
                .with_label("given again here")
                .with_secondary(*first, "first given here")
                .with_help("keep one of them"),
            );
            continue;
        }
        given.insert(&key.text, key.span);
        if !applies(key_spec) {
            let d = not_for_kind(spec, &title, key_spec, key.span);
            let span = removal(file, block, item);
            out.push(d.with_fix(format!("remove `{}`", key.text), span, ""));
            continue;
        }
        if let Err(m) = key_spec.ty.check(&item.value) {
            out.push(mismatch(
                m,
                &format!("`{}`", key.text),
                key_spec.doc,
                Some(key.span),
            ));
        }
    }
    for key_spec in spec
        .keys
        .iter()
        .filter(|k| k.required && k.applies_to(kind))
    {
        if !given.contains_key(key_spec.name) {
            let d = Diagnostic::error(
                codes::MISSING_ITEM,
                format!("`{title}` needs `{}`", key_spec.name),
                block.header_span(),
            )
            .with_label(format!("no `{}` in this block", key_spec.name))
            .with_help(format!("add `{} = …`: {}", key_spec.name, key_spec.doc));
            let d = match example_value(spec.name, key_spec.name) {
                Some(v) => {
                    let item = format!("{} = {v}", key_spec.name);
                    let edit = add_item(block, &item);
                    d.with_fix(format!("add `{item}`"), edit.span, edit.text)
                }
                None => d,
            };
            out.push(d);
        }
    }
    for group in spec.exclusive {
        let both: Vec<(&str, Span)> = group
            .iter()
            .filter_map(|k| given.get(k).map(|s| (*k, *s)))
            .collect();
        if let [(first, first_span), (second, second_span), ..] = both[..] {
            out.push(
                Diagnostic::error(
                    codes::EXCLUSIVE_KEYS,
                    format!("`{title}` takes `{first}` or `{second}`, not both"),
                    second_span,
                )
                .with_label(format!("`{second}` given here"))
                .with_secondary(first_span, format!("`{first}` given here"))
                .with_help(format!(
                    "keep one of them: {}",
                    group
                        .iter()
                        .filter_map(|k| spec.key(k))
                        .map(|k| format!("`{}` is {}", k.name, k.doc))
                        .collect::<Vec<_>>()
                        .join("; ")
                )),
            );
        }
    }
    for group in spec.one_of {
        if !group.iter().any(|k| given.contains_key(k)) {
            let names: Vec<String> = group.iter().map(|k| format!("`{k}`")).collect();
            let docs: Vec<String> = group
                .iter()
                .filter_map(|k| spec.key(k))
                .map(|k| format!("`{}` is {}", k.name, k.doc))
                .collect();
            let mut d = Diagnostic::error(
                codes::MISSING_ITEM,
                format!("`{title}` needs {}", names.join(" or ")),
                block.header_span(),
            )
            .with_label(format!("neither {} in this block", names.join(" nor ")))
            .with_help(format!("add one of them: {}", docs.join("; ")));
            for key in group.iter() {
                if let Some(v) = example_value(spec.name, key) {
                    let item = format!("{key} = {v}");
                    let edit = add_item(block, &item);
                    d = d.with_fix(format!("add `{item}`"), edit.span, edit.text);
                }
            }
            out.push(d);
        }
    }
}

fn unknown_key(
    spec: &BlockSpec,
    title: &str,
    kind: Option<&str>,
    key: &str,
    span: Span,
) -> Diagnostic {
    let applicable: Vec<&str> = spec
        .keys
        .iter()
        .filter(|k| k.applies_to(kind))
        .map(|k| k.name)
        .collect();
    let best = suggest::closest(key, applicable.iter().copied());
    let help = match best {
        Some(best) => format!("did you mean `{best}`?"),
        None if applicable.is_empty() => format!("`{title}` takes no keys"),
        None => format!("the keys of `{title}` are {}", words_list(&applicable)),
    };
    let d = Diagnostic::error(
        codes::UNKNOWN_KEY,
        format!("unknown key `{key}` in `{title}`"),
        span,
    )
    .with_label("not a key of this block")
    .with_help(help);
    replace_with(d, span, best)
}

fn not_for_kind(spec: &BlockSpec, title: &str, key: &KeySpec, span: Span) -> Diagnostic {
    Diagnostic::error(
        codes::KEY_NOT_FOR_KIND,
        format!("`{}` does not apply to `{title}`", key.name),
        span,
    )
    .with_label(format!("only for {}", words_list(key.kinds)))
    .with_help(format!(
        "remove it, or use `{} {}` if that is what you meant",
        spec.name, key.kinds[0]
    ))
}

/// A type mismatch as a diagnostic; `what` names the slot, `doc` explains it.
fn mismatch(m: Mismatch, what: &str, doc: &str, key_span: Option<Span>) -> Diagnostic {
    let with_key = |d: Diagnostic| match key_span {
        Some(k) => d.with_secondary(k, format!("{what}: {doc}")),
        None => d,
    };
    match m {
        Mismatch::Type {
            expected,
            found,
            at,
        } => with_key(
            Diagnostic::error(
                codes::WRONG_TYPE,
                format!("expected {expected} for {what}, found {found}"),
                at,
            )
            .with_label(format!("this is {found}")),
        )
        .with_help(type_help(&expected)),
        Mismatch::Word { word, allowed, at } => {
            let best = suggest::closest(&word, allowed.iter().copied());
            let help = match best {
                Some(best) => format!(
                    "did you mean `{best}`? The values are {}",
                    words_list(&allowed)
                ),
                None => format!("the values are {}", words_list(&allowed)),
            };
            let d = with_key(
                Diagnostic::error(
                    codes::UNKNOWN_VALUE,
                    format!("`{word}` is not a valid value for {what}"),
                    at,
                )
                .with_label("unknown value"),
            )
            .with_help(help);
            replace_with(d, at, best)
        }
        Mismatch::Range { why, at } => with_key(
            Diagnostic::error(
                codes::OUT_OF_RANGE,
                format!("invalid value for {what}: {why}"),
                at,
            )
            .with_label("out of range"),
        )
        .with_help(format!("{what}: {doc}")),
        Mismatch::Argument {
            why,
            at,
            known,
            name,
        } => {
            let help = match name
                .as_deref()
                .and_then(|n| suggest::closest(n, known.iter().copied()))
            {
                Some(best) => format!("did you mean `{best}`?"),
                None if known.is_empty() => "remove the arguments".to_string(),
                None => format!("the arguments are {}", words_list(&known)),
            };
            with_key(Diagnostic::error(codes::BAD_ARGUMENT, why, at).with_label("here"))
                .with_help(help)
        }
    }
}

/// The item that writes a block's label as a key (`stage = 2` in `zero { }`), when its value is
/// a valid label.
fn label_as_key<'a>(spec: &BlockSpec, block: &'a Block) -> Option<&'a crate::syntax::ast::Item> {
    if block.label.is_some() {
        return None;
    }
    let ty = match spec.label {
        LabelSpec::Required { ty, .. } | LabelSpec::Optional { ty, .. } => ty,
        LabelSpec::None => return None,
    };
    let key = crate::resolve::label_key(spec.name);
    block.body.as_ref()?.entries.iter().find_map(|e| match e {
        Entry::Item(item) if item.key.text == key && ty.check(&item.value).is_ok() => Some(item),
        _ => None,
    })
}

/// R0020 (or R0011 for an optional label) for `zero { stage = 2 }`: one error, whose fix moves
/// the value after the keyword.
fn label_written_as_key(
    file: &File,
    block: &Block,
    what: &str,
    item: &crate::syntax::ast::Item,
) -> Diagnostic {
    let name = &block.name.name;
    let value = crate::commands::format::value(&item.value);
    let key = &item.key.text;
    let d = Diagnostic::error(
        codes::MISSING_LABEL,
        format!("`{name}` takes {what} after the keyword, not as a `{key}` key"),
        item.span,
    )
    .with_label(format!("write `{name} {value}`"))
    .with_secondary(block.name.span, format!("{what} should follow `{name}`"))
    .with_help(format!(
        "write `{name} {value} {{ … }}`, without `{key} = {value}` inside"
    ));
    let mut fix = crate::diagnostics::Fix {
        title: format!("write `{name} {value}`"),
        edits: vec![
            crate::diagnostics::Edit {
                span: Span::new(block.name.span.end, block.name.span.end),
                text: format!(" {value}"),
            },
            crate::diagnostics::Edit {
                span: removal(file, block, item),
                text: String::new(),
            },
        ],
    };
    fix.edits.sort_by_key(|e| e.span.start);
    let mut d = d;
    d.fixes.push(fix);
    d
}

/// For a key unknown to its block: the other blocks that have a key of that name, or whose
/// key feeds a TrainingArguments field / DeepSpeed key of that name (`gradient_accumulation_steps`
/// is `batch.accumulate`). With one such place, the help names it and the fix moves the item.
fn elsewhere(
    file: &File,
    block: &Block,
    item: &crate::syntax::ast::Item,
    d: Diagnostic,
) -> Diagnostic {
    let key = item.key.text.as_str();
    let here = block.name.name.as_str();
    let upstream_name = |k: &KeySpec| {
        k.hf == Some(key)
            || k.deepspeed
                .is_some_and(|ds| ds == key || ds.rsplit('.').next() == Some(key))
    };
    let mut homes: Vec<(&str, &str)> = Vec::new();
    for b in BLOCKS.iter().filter(|b| matches!(b.body, BodySpec::Items)) {
        for k in b.keys {
            let same = k.name == key && b.name != here;
            if (same || upstream_name(k)) && !homes.contains(&(b.name, k.name)) {
                homes.push((b.name, k.name));
            }
        }
    }
    let [(home, name)] = homes[..] else {
        if homes.is_empty() {
            return d;
        }
        let places: Vec<String> = homes.iter().map(|(b, k)| format!("`{b}.{k}`")).collect();
        let help = format!("`{key}` is written {} in a recipe", places.join(" or "));
        return Diagnostic {
            help: Some(help),
            fixes: Vec::new(),
            ..d
        };
    };
    let value = crate::commands::format::value(&item.value);
    let target = file.blocks.iter().find(|b| b.name.name == home);
    // How the block reads in the help: as written, or as it would be added.
    let home_title = match target {
        Some(b) => block_title(b),
        None => absent_title(home).unwrap_or_else(|| home.to_string()),
    };
    let help = if name == key {
        format!("`{key}` is a key of `{home}`, not of `{here}`: move it there (`{home_title} {{ {key} = {value} }}`)")
    } else {
        format!("`{key}` is the upstream name; the recipe writes `{name}` in `{home}` (`{home_title} {{ {name} = {value} }}`)")
    };
    let mut d = Diagnostic {
        help: Some(help),
        fixes: Vec::new(),
        ..d
    };
    let new_item = format!("{name} = {value}");
    let insert = match target {
        Some(b) if std::ptr::eq(b, block) => Some(crate::diagnostics::Edit {
            span: item.key.span,
            text: name.to_string(),
        }),
        Some(b) => Some(add_item(b, &new_item)),
        // An absent block is added, with the label it has when absent (`optimizer adamw`);
        // not one whose label has no such default.
        None => absent_title(home).map(|title| {
            let end = file.blocks.last().map_or(0, |b| b.span.end);
            crate::diagnostics::Edit {
                span: Span::new(end, end),
                text: format!("\n{title} {{ {new_item} }}"),
            }
        }),
    };
    if let Some(insert) = insert {
        let mut edits = vec![insert];
        let same_block = target.is_some_and(|b| std::ptr::eq(b, block));
        if !same_block {
            edits.push(crate::diagnostics::Edit {
                span: removal(file, block, item),
                text: String::new(),
            });
        }
        edits.sort_by_key(|e| e.span.start);
        d.fixes.push(crate::diagnostics::Fix {
            title: if same_block {
                format!("rename to `{name}`")
            } else {
                format!("move to `{home_title} {{ {name} = {value} }}`")
            },
            edits,
        });
    }
    d
}

/// How an absent block is written when a fix adds it: its keyword, and the label it has when
/// absent (`optimizer adamw`); None for a block whose label has no such default (`model`).
fn absent_title(name: &str) -> Option<String> {
    let spec = schema::block(name)?;
    match (spec.label, spec.absent.literal()) {
        (LabelSpec::None, _) => Some(name.to_string()),
        (_, Some(crate::schema::Lit::Word(w))) => Some(format!("{name} {w}")),
        (_, Some(crate::schema::Lit::Int(i))) => Some(format!("{name} {i}")),
        (LabelSpec::Optional { .. }, _) => Some(name.to_string()),
        _ => None,
    }
}

/// What to delete to remove `item` from `block` (with its separator; syntax::edit).
fn removal(file: &File, block: &Block, item: &crate::syntax::ast::Item) -> Span {
    let Some(body) = &block.body else {
        return item.span;
    };
    match body
        .entries
        .iter()
        .position(|e| matches!(e, Entry::Item(i) if std::ptr::eq(i, item)))
    {
        Some(index) => crate::syntax::edit::removal_span(body, index, &file.comments),
        None => item.span,
    }
}

/// Adds the fix "replace with `best`" for a did-you-mean.
fn replace_with(d: Diagnostic, span: Span, best: Option<&str>) -> Diagnostic {
    match best {
        Some(best) => d.with_fix(format!("replace with `{best}`"), span, best),
        None => d,
    }
}

fn type_help(expected: &str) -> String {
    if expected.contains("without quotes") {
        "enum values are bare words: remove the quotes".into()
    } else {
        format!("write {expected}")
    }
}
