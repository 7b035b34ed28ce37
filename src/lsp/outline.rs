//! Formatting (`recipe fmt`), document symbols (the blocks and their items), inlay hints (the
//! values the recipe does not write: derived, from flags, read from files, defaults), and go to
//! definition on data, model and other paths.

use lsp_types::{
    DocumentSymbol, GotoDefinitionResponse, InlayHint, InlayHintKind, InlayHintLabel,
    InlayHintTooltip, Location, Position, Range, SymbolKind, TextEdit,
};

use super::document::{Document, Encoding};
use super::Open;
use crate::check::Analysis;
use crate::resolve::Source;
use crate::schema::{self, Ty};
use crate::syntax::ast::{Block, Entry, Span, ValueKind};

/// `recipe fmt` as one edit of the whole text; nothing when it is formatted already or does
/// not parse (formatting never touches a broken file).
pub fn format(doc: &Document, enc: Encoding) -> Vec<TextEdit> {
    match crate::commands::format::format_source(doc.text()) {
        Ok(formatted) if formatted != doc.text() => vec![TextEdit::new(
            doc.range(Span::new(0, doc.text().len()), enc),
            formatted,
        )],
        _ => Vec::new(),
    }
}

/// The blocks, each with its items (raw sections nested).
pub fn symbols(doc: &Document, analysis: &Analysis, enc: Encoding) -> Vec<DocumentSymbol> {
    let Some(file) = &analysis.checked.file else {
        return Vec::new();
    };
    file.blocks
        .iter()
        .map(|b| {
            let name = match &b.label {
                Some(l) => format!("{} {}", b.name.name, crate::commands::format::value(l)),
                None => b.name.name.clone(),
            };
            #[allow(deprecated)] // `deprecated` is a required field of the struct
            DocumentSymbol {
                name,
                detail: schema::block(&b.name.name).map(|s| s.doc.to_string()),
                kind: SymbolKind::MODULE,
                tags: None,
                deprecated: None,
                range: doc.range(b.span, enc),
                selection_range: doc.range(b.header_span(), enc),
                children: b.body.as_ref().map(|body| entries(doc, &body.entries, enc)),
            }
        })
        .collect()
}

fn entries(doc: &Document, entries: &[Entry], enc: Encoding) -> Vec<DocumentSymbol> {
    entries
        .iter()
        .map(|e| {
            let (detail, children, kind) = match e {
                Entry::Item(i) => (
                    Some(crate::commands::format::value(&i.value)),
                    None,
                    SymbolKind::PROPERTY,
                ),
                Entry::Section(s) => (None, Some(entries_of(doc, s, enc)), SymbolKind::OBJECT),
            };
            #[allow(deprecated)]
            DocumentSymbol {
                name: e.key().text.clone(),
                detail,
                kind,
                tags: None,
                deprecated: None,
                range: doc.range(e.span(), enc),
                selection_range: doc.range(e.key().span, enc),
                children,
            }
        })
        .collect()
}

fn entries_of(
    doc: &Document,
    s: &crate::syntax::ast::Section,
    enc: Encoding,
) -> Vec<DocumentSymbol> {
    entries(doc, &s.body.entries, enc)
}

/// Hints for the settings a block does not write, at the end of the block's first line: what
/// was derived, given by a flag or read from a file, and the defaults that reach DeepSpeed or
/// HF. Settings of blocks the
/// recipe leaves out (`cluster`, `steps`) go on the first block's line. Only lines in `range`.
pub fn inlay_hints(
    doc: &Document,
    analysis: &Analysis,
    range: Span,
    enc: Encoding,
) -> Vec<InlayHint> {
    let (Some(file), Some(r)) = (&analysis.checked.file, &analysis.resolved) else {
        return Vec::new();
    };
    let Some(first) = file.blocks.first() else {
        return Vec::new();
    };
    let line_end = |b: &Block| {
        let text = doc.text();
        let start = b.span.start;
        text[start..]
            .find(['\n', '\r'])
            .map_or(text.len(), |i| start + i)
    };
    let report = crate::commands::explain::report(r, None);
    let mut hints = Vec::new();
    // Derived and flag values first (they are what a reader cannot see), then defaults.
    for pass in 0..2 {
        for row in &report.settings {
            let shown = matches!(
                (&row.source, pass),
                (
                    Source::Derived { .. } | Source::Flag { .. } | Source::File { .. },
                    0
                ) | (Source::Default { .. }, 1)
            );
            // Of the defaults, those that reach DeepSpeed or HF: the rest configure the
            // native runtime only (workers, drop_last, …) and would crowd the line.
            let upstream = row.deepspeed.is_some() || row.hf.is_some();
            if !shown || (pass == 1 && !upstream) {
                continue;
            }
            let (block_name, key) = row.key.split_once('.').unwrap_or(("", &row.key));
            let block = file.blocks.iter().find(|b| b.name.name == block_name);
            // Defaults only for the blocks the recipe writes: the others are all defaults.
            if pass == 1 && block.is_none() {
                continue;
            }
            let at = line_end(block.unwrap_or(first));
            if at < range.start || at > range.end {
                continue;
            }
            let kind = match &row.source {
                Source::Derived { .. } => "derived",
                Source::Flag { .. } => "flag",
                Source::File { .. } => "read",
                _ => "default",
            };
            let shown_key = if block.is_some() { key } else { &row.key };
            hints.push(InlayHint {
                position: doc.lsp_position(at, enc),
                label: InlayHintLabel::String(format!("{shown_key} = {} ({kind})", row.value)),
                kind: Some(InlayHintKind::PARAMETER),
                text_edits: None,
                tooltip: Some(InlayHintTooltip::String(row.from.clone())),
                padding_left: Some(true),
                padding_right: None,
                data: None,
            });
        }
    }
    hints
}

/// A path value's file: the data files, a model directory (its config.json), any key of path
/// type, when the file exists.
pub fn definition(
    open: &Open,
    analysis: &Analysis,
    offset: usize,
) -> Option<GotoDefinitionResponse> {
    let file = analysis.checked.file.as_ref()?;
    let r = analysis.resolved.as_ref()?;
    let super::locate::Spot::Value { block, path, item } = super::locate::locate(file, offset)?
    else {
        return None;
    };
    let ValueKind::Str(text) = &item.value.kind else {
        return None;
    };
    let is_path = matches!(
        schema::key_spec(&format!("{}.{path}", block.name.name)).map(|k| k.ty),
        Some(Ty::Path)
    ) || (block.name.name == "model" && path == "from");
    if !is_path {
        return None;
    }
    let mut local = crate::resolve::files::local_path(r, text);
    if local.is_relative() {
        if let Some(dir) = open.path.as_ref().and_then(|p| p.parent()) {
            local = dir.join(local);
        }
    }
    if local.is_dir() && local.join("config.json").is_file() {
        local = local.join("config.json");
    }
    if !local.is_file() {
        return None;
    }
    let uri = super::file_uri(&local)?;
    let start = Position::new(0, 0);
    Some(GotoDefinitionResponse::Scalar(Location::new(
        uri,
        Range::new(start, start),
    )))
}
