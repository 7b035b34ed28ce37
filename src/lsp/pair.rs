//! The pair linter in the editor: a `ds_config*.json` and the `training_args.json` beside it (the
//! names `recipe build` writes, and HF's examples use) are checked together as `recipe check
//! ds_config.json --args training_args.json` checks them; each file shows the findings whose
//! place is in it, with the other file's labels as related information. The text of an open
//! file is the editor's; a file that is not open is read from disk.

use std::path::{Path, PathBuf};

use lsp_types::{DiagnosticRelatedInformation, Location};

use super::document::{Document, Encoding};
use crate::diagnostics::source::SourceFile;
use crate::pair::{self, ArgsInput, Side};

/// A DeepSpeed config the server lints: `ds_config*.json`.
pub fn is_ds_config(path: &Path) -> bool {
    path.file_name()
        .and_then(|n| n.to_str())
        .is_some_and(|n| n.starts_with("ds_config") && n.ends_with(".json"))
}

/// The TrainingArguments that go with the DeepSpeed configs of their directory.
pub fn is_training_args(path: &Path) -> bool {
    path.file_name().is_some_and(|n| n == "training_args.json")
}

/// The pair a JSON file belongs to: (ds_config, training_args if present). For a
/// training_args.json, the first `ds_config*.json` of its directory (by name).
pub fn pair_of(path: &Path, open: &dyn Fn(&Path) -> bool) -> Option<(PathBuf, Option<PathBuf>)> {
    let dir = path.parent()?;
    let args = dir.join("training_args.json");
    let args = (open(&args) || args.is_file()).then_some(args);
    if is_ds_config(path) {
        return Some((path.to_path_buf(), args));
    }
    if !is_training_args(path) {
        return None;
    }
    let mut configs: Vec<PathBuf> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path())
        .filter(|p| is_ds_config(p))
        .collect();
    configs.sort();
    Some((configs.into_iter().next()?, args))
}

/// The diagnostics of `path` (one side of a pair), given how to read each file.
pub fn diagnostics(
    path: &Path,
    read: &dyn Fn(&Path) -> Option<String>,
    open: &dyn Fn(&Path) -> bool,
    options: &crate::resolve::Options,
    enc: Encoding,
) -> Vec<lsp_types::Diagnostic> {
    let Some((ds_path, args_path)) = pair_of(path, open) else {
        return Vec::new();
    };
    let Some(ds_text) = read(&ds_path) else {
        return Vec::new();
    };
    let args_text = args_path.as_ref().and_then(|p| read(p).map(|t| (p, t)));
    let side = if is_ds_config(path) {
        Side::DeepSpeed
    } else {
        Side::Args
    };
    let name = |p: &Path| p.display().to_string();
    let ds = SourceFile::new(name(&ds_path), ds_text);
    let args = args_text
        .as_ref()
        .map(|(p, t)| ArgsInput::Json(SourceFile::new(name(p), t.clone())));
    let opts = pair::Options::from_recipe(options, None, None);
    let report = pair::check(ds, args, &opts);
    let (Some(here_uri), other_path) = (
        super::file_uri(path),
        match side {
            Side::DeepSpeed => args_path.clone(),
            Side::Args => Some(ds_path.clone()),
        },
    ) else {
        return Vec::new();
    };
    let here = Document::new(report.file(side).text.clone(), 0);
    let other_side = match side {
        Side::DeepSpeed => Side::Args,
        Side::Args => Side::DeepSpeed,
    };
    let other = report
        .args
        .as_ref()
        .map(|_| Document::new(report.file(other_side).text.clone(), 0));
    let other_uri = other_path.as_deref().and_then(super::file_uri);
    report
        .findings
        .iter()
        .filter(|f| f.primary.side == side)
        .map(|f| {
            let (d, labels) = report.split(f);
            let mut lsp = super::diagnostics::to_lsp(&d, &here, &here_uri, enc, None);
            if let (Some((_, labels)), Some(doc), Some(uri)) = (labels, &other, &other_uri) {
                let related = lsp.related_information.get_or_insert_with(Vec::new);
                related.extend(labels.iter().map(|l| DiagnosticRelatedInformation {
                    location: Location::new(uri.clone(), doc.range(l.span, enc)),
                    message: if l.text.is_empty() {
                        "related".into()
                    } else {
                        l.text.clone()
                    },
                }));
            }
            lsp
        })
        .collect()
}
