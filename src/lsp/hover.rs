//! Hovers: what a key or value resolves to, where it came from, the upstream key and field it
//! feeds (`recipe explain`'s row), the key's schema entry; for batch and schedule keys the step
//! accounting and an LR summary; on a diagnostic, its code's documentation.

use std::fmt::Write;

use lsp_types::{Hover, HoverContents, MarkupContent, MarkupKind};

use super::document::Encoding;
use super::locate::{locate, Spot};
use super::Open;
use crate::check::Analysis;
use crate::commands::explain::{self, Report};
use crate::resolve::label_key;
use crate::resolve::value::fmt_f64;
use crate::schema::{self, BodySpec, LabelSpec, RawKind};
use crate::syntax::ast::Span;

/// The hover at `offset`, if there is anything to say.
pub fn hover(open: &Open, analysis: &Analysis, offset: usize, enc: Encoding) -> Option<Hover> {
    let mut text = String::new();
    let mut range: Option<Span> = None;
    if let Some(file) = &analysis.checked.file {
        if let Some(spot) = locate(file, offset) {
            let report = analysis.resolved.as_ref().map(|r| explain::report(r, None));
            let (md, span) = spot_text(&spot, report.as_ref());
            text = md;
            range = Some(span);
        }
    }
    // The documentation of the codes reported here.
    for d in &analysis.checked.diagnostics {
        let s = d.primary.span;
        if !(s.start <= offset && offset <= s.end.max(s.start + 1)) {
            continue;
        }
        if let Some(doc) = super::diagnostics::code_doc(d.code) {
            if !text.is_empty() {
                text.push_str("\n\n---\n\n");
            }
            let _ = write!(text, "**{}**\n\n{}", doc.heading, shorten(doc.body, 1500));
            range.get_or_insert(s);
        }
    }
    if text.is_empty() {
        return None;
    }
    Some(Hover {
        contents: HoverContents::Markup(MarkupContent {
            kind: MarkupKind::Markdown,
            value: text,
        }),
        range: range.map(|s| open.doc.range(s, enc)),
    })
}

fn shorten(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_string();
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    // End at a paragraph if one is near.
    let cut = s[..end]
        .rfind("\n\n")
        .filter(|&i| i > max / 2)
        .unwrap_or(end);
    format!("{}\n\n…", &s[..cut])
}

fn spot_text(spot: &Spot<'_>, report: Option<&Report>) -> (String, Span) {
    match spot {
        Spot::BlockName(block) => {
            let name = block.name.name.as_str();
            let mut md = String::new();
            match schema::block(name) {
                Some(spec) => {
                    let _ = write!(md, "**{name}** — {}", spec.doc);
                    let kind = block.label.as_ref().and_then(|l| match &l.kind {
                        crate::syntax::ast::ValueKind::Ident(w) => Some(w.as_str()),
                        _ => None,
                    });
                    let keys: Vec<String> = spec
                        .keys
                        .iter()
                        .filter(|k| k.applies_to(kind))
                        .map(|k| format!("`{}`", k.name))
                        .collect();
                    if !keys.is_empty() {
                        let _ = write!(md, "\n\nkeys: {}", keys.join(", "));
                    }
                }
                None => {
                    let _ = write!(md, "`{name}` is not a block of the language");
                }
            }
            (md, block.name.span)
        }
        Spot::Label(block) => {
            let name = block.name.name.as_str();
            let key = format!("{name}.{}", label_key(name));
            let span = block.label.as_ref().map_or(block.name.span, |l| l.span);
            let mut md = setting_text(&key, report);
            if let Some(spec) = schema::block(name) {
                if let LabelSpec::Required { ty, what, .. } | LabelSpec::Optional { ty, what } =
                    spec.label
                {
                    let _ = write!(md, "\n\n{what}: {}", schema::docs::ty(&ty));
                }
            }
            (md, span)
        }
        Spot::Key { block, path, span } => (key_text(block, path, report), *span),
        Spot::Value { block, path, item } => (key_text(block, path, report), item.value.span),
    }
}

fn key_text(block: &crate::syntax::ast::Block, path: &str, report: Option<&Report>) -> String {
    let name = block.name.name.as_str();
    match schema::block(name).map(|b| b.body) {
        Some(BodySpec::Raw(RawKind::DeepSpeed)) => {
            let mut md =
                format!("**DeepSpeed config key** `{path}`: passed to DeepSpeed as written");
            let top = path.split('.').next().unwrap_or(path);
            for (key, note) in schema::upstream::DEEPSPEED_KEY_NOTES {
                if *key == path || *key == top {
                    let _ = write!(md, "\n\n{note}");
                }
            }
            md
        }
        Some(BodySpec::Raw(RawKind::Hf)) => {
            let field = path.split('.').next().unwrap_or(path);
            let mut md = format!(
                "**TrainingArguments field** `{field}`: passed to HF's TrainingArguments as written"
            );
            for (key, note) in schema::upstream::TRAINING_ARGUMENTS_FIELD_NOTES {
                if *key == field {
                    let _ = write!(md, "\n\n{note}");
                }
            }
            md
        }
        _ => setting_text(&format!("{name}.{path}"), report),
    }
}

/// A resolved setting: value, provenance, schema entry, upstream names, and for batch and
/// schedule settings the step accounting and LR summary.
fn setting_text(key: &str, report: Option<&Report>) -> String {
    let mut md = String::new();
    let row = report.and_then(|r| r.settings.iter().find(|s| s.key == key));
    match row {
        Some(row) => {
            let _ = write!(md, "**{key}** = `{}`\n\n{}", row.value, row.from);
        }
        None => {
            let _ = write!(md, "**{key}**");
        }
    }
    if let Some(spec) = schema::key_spec(key) {
        let _ = write!(
            md,
            "\n\n{}\n\ntype: {} · default: {}",
            spec.doc,
            schema::docs::ty(&spec.ty),
            schema::docs::default(spec)
        );
    }
    if let Some(row) = row {
        let mut feeds = Vec::new();
        if let Some(ds) = row.deepspeed {
            feeds.push(format!("DeepSpeed `{ds}`"));
        }
        if let Some(hf) = row.hf {
            feeds.push(format!("TrainingArguments `{hf}`"));
        }
        if !feeds.is_empty() {
            let _ = write!(md, "\n\nfeeds: {}", feeds.join(" · "));
        }
        if let Some(note) = &row.upstream {
            let _ = write!(md, "\n\nupstream: {note}");
        }
    }
    let Some(report) = report else {
        return md;
    };
    let block = key.split('.').next().unwrap_or("");
    if matches!(block, "batch" | "train" | "data" | "cluster") {
        if let Some(s) = &report.steps {
            let _ = write!(
                md,
                "\n\nsteps: {} samples → {} micro-batches per rank per epoch → {} optimizer steps per epoch (last window {}) → {} in all, {} warmup",
                s.samples, s.batches_per_epoch, s.per_epoch, s.last_window, s.total, s.warmup
            );
        }
    }
    if matches!(block, "schedule" | "optimizer" | "train") || key.starts_with("steps.") {
        if let Some(summary) = lr_summary(report) {
            let _ = write!(md, "\n\n{summary}");
        }
    }
    md
}

/// "LR (HF linear, DeepSpeed WarmupDecayLR): step 1 …, peak … at step …, last …; the two agree".
fn lr_summary(report: &Report) -> Option<String> {
    let first = report.lr.first()?;
    let last = report.lr.last()?;
    let side = |s: &crate::upstream::schedules::LrStep| match report.schedule_owner {
        Some(crate::upstream::schedules::Owner::DeepSpeed) => s.deepspeed.or(s.hf),
        _ => s.hf.or(s.deepspeed),
    };
    let (peak_step, peak) = report
        .lr
        .iter()
        .filter_map(|s| side(s).map(|v| (s.step, v)))
        .fold((0, f64::MIN), |a, b| if b.1 > a.1 { b } else { a });
    let owner = match report.schedule_owner {
        Some(crate::upstream::schedules::Owner::DeepSpeed) => "DeepSpeed builds it",
        _ => "HF builds it",
    };
    let mut out = format!(
        "LR over {} optimizer steps ({owner}): step 1 {}, peak {} at step {peak_step}, step {} {}",
        report.lr_steps,
        fmt_f64(side(first)?),
        fmt_f64(peak),
        last.step,
        fmt_f64(side(last)?),
    );
    let differ = report
        .lr
        .iter()
        .filter(|s| matches!((s.hf, s.deepspeed), (Some(a), Some(b)) if (a - b).abs() > 1e-12 * a.abs().max(b.abs())))
        .count();
    if report.hf_schedule.is_some() && report.deepspeed_schedule.is_some() {
        if differ == 0 && report.lr_sampled {
            let _ = write!(
                out,
                "; HF's and DeepSpeed's curves agree at each of the {} steps sampled",
                report.lr.len()
            );
        } else if differ == 0 {
            out.push_str("; HF's and DeepSpeed's curves agree at every step");
        } else {
            let of = if report.lr_sampled {
                format!(" of the {} sampled", report.lr.len())
            } else {
                String::new()
            };
            let _ = write!(
                out,
                "; HF's {} and DeepSpeed's {} differ at {differ}{of} steps (`recipe explain` lists them)",
                report.hf_schedule.unwrap_or("?"),
                report.deepspeed_schedule.unwrap_or("?")
            );
        }
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report_for(samples: u64) -> Report {
        let text = format!(
            "model bert {{ from = \"m\", task = classify(labels: 2) }}\n\
             data {{ train = \"t.jsonl\", samples = {samples} }}\n\
             batch {{ micro = 1 }}\ntrain {{ epochs = 1 }}\n\
             schedule WarmupDecayLR {{ warmup = 10 }}\n"
        );
        let r = crate::resolve::resolve(
            &crate::syntax::parse(&text).unwrap(),
            &crate::resolve::Options::default(),
        );
        explain::report(&r, None)
    }

    /// A run of more steps than the report lists says how many it has and that the count of
    /// differing steps is the sample's; a shorter one counts every step.
    #[test]
    fn the_lr_summary_names_a_sample_as_one() {
        let short = lr_summary(&report_for(500)).unwrap();
        assert!(short.starts_with("LR over 500 optimizer steps"), "{short}");
        assert!(
            short.contains("differ at 499 steps (`recipe explain`"),
            "{short}"
        );
        let long = lr_summary(&report_for(2_000_000_000)).unwrap();
        assert!(
            long.starts_with("LR over 2000000000 optimizer steps"),
            "{long}"
        );
        assert!(long.contains("step 2000000000 "), "{long}");
        assert!(long.contains("of the 100000 sampled steps"), "{long}");
    }
}
