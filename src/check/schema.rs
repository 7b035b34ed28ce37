//! Schema rules: blocks, labels, keys, duplicates, value types, required items.
//! Everything here is driven by the table in [`crate::schema`].

use std::collections::HashMap;

use crate::check::{raw, suggest};
use crate::diagnostics::codes;
use crate::diagnostics::Diagnostic;
use crate::schema::types::{words_list, Mismatch};
use crate::schema::{self, BlockSpec, BodySpec, KeySpec, LabelSpec, BLOCKS};
use crate::syntax::ast::{Block, Body, Entry, File, Span, ValueKind};

/// Checks a parsed file against the schema.
pub fn check(file: &File) -> Vec<Diagnostic> {
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
        check_block(spec, block, &mut out);
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
        "model" => "model bert { from = \"...\", task = classify(labels: 2) }",
        "data" => "data { train = \"data/train.jsonl\" }",
        "batch" => "batch { micro = 16 }",
        other => other,
    };
    Diagnostic::error(
        codes::MISSING_BLOCK,
        format!("the recipe has no `{}` block", spec.name),
        at,
    )
    .with_label(format!("`{}` is needed to run", spec.name))
    .with_help(format!("add `{example}` ({})", lowercase_first(spec.doc)))
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

fn check_block(spec: &BlockSpec, block: &Block, out: &mut Vec<Diagnostic>) {
    let name = spec.name;
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
            check_items(spec, block, kind.as_deref(), kind_known, body.as_ref(), out)
        }
        (BodySpec::Raw(kind), Some(body)) => raw::check(kind, body, out),
        _ => {}
    }
}

fn check_items(
    spec: &BlockSpec,
    block: &Block,
    kind: Option<&str>,
    kind_known: bool,
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
        let Some(key_spec) = spec.key(&key.text) else {
            out.push(unknown_key(spec, &title, kind, &key.text, key.span));
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
            out.push(not_for_kind(spec, &title, key_spec, key.span));
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
            out.push(
                Diagnostic::error(
                    codes::MISSING_ITEM,
                    format!("`{title}` needs `{}`", key_spec.name),
                    block.header_span(),
                )
                .with_label(format!("no `{}` in this block", key_spec.name))
                .with_help(format!("add `{} = …`: {}", key_spec.name, key_spec.doc)),
            );
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
            out.push(
                Diagnostic::error(
                    codes::MISSING_ITEM,
                    format!("`{title}` needs {}", names.join(" or ")),
                    block.header_span(),
                )
                .with_label(format!("neither {} in this block", names.join(" nor ")))
                .with_help(format!("add one of them: {}", docs.join("; "))),
            );
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
