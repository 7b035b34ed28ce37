//! Completion from the schema: block keywords; a block's labels (optimizer and schedule kinds
//! the target releases have); the keys of the block at the cursor with type, default and doc;
//! enum values; raw DeepSpeed keys and TrainingArguments fields; data column names read from the
//! training file's header (the same memoised scan the checker uses).

use lsp_types::{
    CompletionItem, CompletionItemKind, Documentation, MarkupContent, MarkupKind, Range, TextEdit,
};

use super::context::{context, Context};
use super::document::Encoding;
use super::Open;
use crate::check::Analysis;
use crate::resolve::Resolved;
use crate::schema::{self, BodySpec, KeySpec, LabelSpec, RawKind, Ty};
use crate::syntax::ast::{Entry, Span};
use crate::upstream::versions::{Facts, Targets};

/// The completion items at `offset`.
pub fn complete(
    open: &Open,
    analysis: &Analysis,
    last_resolved: Option<&Analysis>,
    offset: usize,
    enc: Encoding,
) -> Vec<CompletionItem> {
    let text = open.doc.text();
    let (ctx, start) = context(text, offset);
    let resolved = analysis
        .resolved
        .as_ref()
        .or_else(|| last_resolved.and_then(|a| a.resolved.as_ref()));
    let facts = match resolved {
        Some(r) => r.facts.clone(),
        None => Facts::for_targets(&Targets::newest()),
    };
    let replace = open.doc.range(Span::new(start, offset.max(start)), enc);
    let item = |label: &str, kind: CompletionItemKind, detail: String, doc: String| {
        completion(label, label, kind, detail, doc, replace)
    };
    match ctx {
        Context::Nothing => Vec::new(),
        Context::BlockName => {
            let present: Vec<&str> = analysis
                .checked
                .file
                .iter()
                .flat_map(|f| f.blocks.iter().map(|b| b.name.name.as_str()))
                .collect();
            schema::BLOCKS
                .iter()
                .filter(|b| !present.contains(&b.name))
                .map(|b| {
                    item(
                        b.name,
                        CompletionItemKind::MODULE,
                        if b.required {
                            "block (required)"
                        } else {
                            "block"
                        }
                        .into(),
                        b.doc.into(),
                    )
                })
                .collect()
        }
        Context::Label { block } => {
            let Some(spec) = schema::block(&block) else {
                return Vec::new();
            };
            let (LabelSpec::Required { ty, what, .. } | LabelSpec::Optional { ty, what }) =
                spec.label
            else {
                return Vec::new();
            };
            values(&ty, &block, "kind", &facts)
                .into_iter()
                .map(|v| {
                    item(
                        &v,
                        CompletionItemKind::ENUM_MEMBER,
                        what.into(),
                        String::new(),
                    )
                })
                .collect()
        }
        Context::Key {
            block,
            label,
            sections,
        } => {
            let Some(spec) = schema::block(&block) else {
                return Vec::new();
            };
            match spec.body {
                BodySpec::Items => {
                    let written = written_keys(analysis, &block);
                    spec.keys
                        .iter()
                        .filter(|k| k.applies_to(label.as_deref()))
                        .filter(|k| !written.contains(&k.name))
                        .map(|k| {
                            completion(
                                k.name,
                                &format!("{} = ", k.name),
                                CompletionItemKind::PROPERTY,
                                key_detail(k),
                                key_doc(k),
                                replace,
                            )
                        })
                        .collect()
                }
                BodySpec::Raw(RawKind::DeepSpeed) => deepspeed_keys(&sections)
                    .into_iter()
                    .map(|k| {
                        completion(
                            k,
                            &format!("{k} = "),
                            CompletionItemKind::PROPERTY,
                            "DeepSpeed config key".into(),
                            String::new(),
                            replace,
                        )
                    })
                    .collect(),
                BodySpec::Raw(RawKind::Hf) if sections.is_empty() => {
                    let tf =
                        resolved.map_or(Targets::newest().transformers, |r| r.targets.transformers);
                    schema::upstream::HfFields::for_target(tf)
                        .fields
                        .iter()
                        .map(|(name, default)| {
                            completion(
                                name,
                                &format!("{name} = "),
                                CompletionItemKind::PROPERTY,
                                match default {
                                    Some(d) => format!("TrainingArguments field (default {d})"),
                                    None => "TrainingArguments field".into(),
                                },
                                String::new(),
                                replace,
                            )
                        })
                        .collect()
                }
                _ => Vec::new(),
            }
        }
        Context::Value {
            block,
            label,
            sections,
            key,
            in_string,
        } => {
            if !sections.is_empty() {
                return Vec::new();
            }
            if block == "data" && matches!(key.as_str(), "text" | "text_pair" | "label") {
                return columns(resolved)
                    .into_iter()
                    .map(|c| {
                        let insert = if in_string {
                            c.clone()
                        } else {
                            crate::commands::format::quote(&c)
                        };
                        completion(
                            &c,
                            &insert,
                            CompletionItemKind::FIELD,
                            "a column of the training file".into(),
                            String::new(),
                            replace,
                        )
                    })
                    .collect();
            }
            if in_string {
                return Vec::new();
            }
            let Some(spec) = schema::block(&block).and_then(|b| {
                b.keys
                    .iter()
                    .find(|k| k.name == key && k.applies_to(label.as_deref()))
            }) else {
                return Vec::new();
            };
            values(&spec.ty, &block, &key, &facts)
                .into_iter()
                .map(|v| {
                    item(
                        &v,
                        CompletionItemKind::ENUM_MEMBER,
                        schema::docs::ty(&spec.ty),
                        String::new(),
                    )
                })
                .collect()
        }
    }
}

fn completion(
    label: &str,
    insert: &str,
    kind: CompletionItemKind,
    detail: String,
    doc: String,
    range: Range,
) -> CompletionItem {
    CompletionItem {
        label: label.into(),
        kind: Some(kind),
        detail: Some(detail),
        documentation: (!doc.is_empty()).then_some(Documentation::MarkupContent(MarkupContent {
            kind: MarkupKind::Markdown,
            value: doc,
        })),
        text_edit: Some(lsp_types::CompletionTextEdit::Edit(TextEdit::new(
            range,
            insert.into(),
        ))),
        ..Default::default()
    }
}

fn key_detail(k: &KeySpec) -> String {
    format!(
        "{} · default {}",
        schema::docs::ty(&k.ty),
        schema::docs::default(k)
    )
}

fn key_doc(k: &KeySpec) -> String {
    let mut doc = k.doc.to_string();
    if let Some(ds) = k.deepspeed {
        doc.push_str(&format!("\n\nDeepSpeed: `{ds}`"));
    }
    if let Some(hf) = k.hf {
        doc.push_str(&format!("\n\nTrainingArguments: `{hf}`"));
    }
    doc
}

/// The words a value of type `ty` can be; schedule kinds filtered to those the target
/// transformers has (DeepSpeed's own kinds exist in every supported release), optimizer kinds to
/// those DeepSpeed or HF can build on the target releases.
fn values(ty: &Ty, block: &str, key: &str, facts: &Facts) -> Vec<String> {
    let words: Vec<String> = match ty {
        Ty::Word(ws) | Ty::WordOrInt(ws, ..) => ws.iter().map(|w| w.to_string()).collect(),
        Ty::Bool => vec!["true".into(), "false".into()],
        Ty::Call(specs) => specs.iter().map(|c| c.name.to_string()).collect(),
        Ty::Int { min, max } if max - min <= 8 => (*min..=*max).map(|i| i.to_string()).collect(),
        _ => Vec::new(),
    };
    if block == "optimizer" && key == "kind" {
        return words
            .into_iter()
            .filter(|w| crate::rules::optimizer::buildable(w, facts))
            .collect();
    }
    if block == "schedule" && key == "kind" {
        return words
            .into_iter()
            .filter(|w| {
                !schema::blocks::HF_SCHEDULES.contains(&w.as_str())
                    || facts.hf_scheduler_kinds.contains(&w.as_str())
            })
            .collect();
    }
    words
}

/// The keys already written in the first block named `block`.
fn written_keys<'a>(analysis: &'a Analysis, block: &str) -> Vec<&'a str> {
    analysis
        .checked
        .file
        .iter()
        .flat_map(|f| f.blocks.iter())
        .filter(|b| b.name.name == block)
        .take(1)
        .flat_map(|b| b.body.iter().flat_map(|body| body.entries.iter()))
        .filter_map(|e| match e {
            Entry::Item(i) => Some(i.key.text.as_str()),
            Entry::Section(_) => None,
        })
        .collect()
}

/// DeepSpeed keys at a raw section path: the top level, or a strictly validated section's
/// fields.
fn deepspeed_keys(sections: &[String]) -> Vec<&'static str> {
    if sections.is_empty() {
        return schema::upstream::DEEPSPEED_TOP_LEVEL.to_vec();
    }
    let path = sections.join(".");
    schema::upstream::DEEPSPEED_STRICT_SECTIONS
        .iter()
        .find(|(name, _)| *name == path)
        .map(|(_, fields)| fields.to_vec())
        .unwrap_or_default()
}

/// The training file's columns: a CSV/TSV header, or a JSONL file's first object's fields.
fn columns(resolved: Option<&Resolved>) -> Vec<String> {
    let Some(r) = resolved else {
        return Vec::new();
    };
    let Some(train) = r.str("data.train") else {
        return Vec::new();
    };
    let path = crate::resolve::files::local_path(r, train);
    let spec = crate::resolve::files::scan_spec(r);
    match crate::resolve::files::scan_data(&path, &spec) {
        Ok(scan) => match &scan.header {
            Some((_, names)) => names.clone(),
            None => scan.first_fields.clone(),
        },
        Err(_) => Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::upstream::versions::Version;

    fn kinds(transformers: Version, deepspeed: Version) -> Vec<String> {
        let targets = Targets {
            transformers,
            accelerate: Version::new(1, 15, 0),
            deepspeed,
        };
        let spec = schema::block("optimizer").unwrap();
        let (LabelSpec::Optional { ty, .. } | LabelSpec::Required { ty, .. }) = &spec.label else {
            panic!("optimizer has a label");
        };
        values(ty, "optimizer", "kind", &Facts::for_targets(&targets))
    }

    #[test]
    fn optimizer_kinds_follow_the_targets() {
        // DeepSpeed 0.5.10 has no Lion and transformers 4.24.0's `optim` has no lion_32bit.
        let old = kinds(Version::new(4, 24, 0), Version::new(0, 5, 10));
        assert!(!old.iter().any(|k| k == "lion"), "{old:?}");
        assert!(
            old.iter().any(|k| k == "adafactor" || k == "sgd"),
            "{old:?}"
        );
        // Either side builds it on the newest releases.
        let new = kinds(Version::new(5, 24, 0), Version::new(0, 19, 8));
        assert!(new.iter().any(|k| k == "lion"), "{new:?}");
    }
}
