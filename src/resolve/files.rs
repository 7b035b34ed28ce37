//! Values read from files next to the recipe: the training rows (for step accounting) and the
//! model's config.json (for the hidden-size dependent DeepSpeed buckets), and the one scan of
//! each data file that the row count and the data rules share. Relative paths are taken from
//! the recipe's directory.

use std::path::{Path, PathBuf};

pub use recipe_runtime::data::format::NOT_UTF8;
pub use recipe_runtime::data::scan::{
    count_rows, scan_file, scan_reader, DataScan, LabelSeen, LabelValue, MissingField, NotText,
    ScanSpec, MAX_LABELS,
};
pub use recipe_runtime::data::Format;

use super::value::{Source, Val};
use super::{Options, Resolved};

fn local(path: &str, options: &Options) -> PathBuf {
    let p = Path::new(path);
    match &options.base_dir {
        Some(base) if p.is_relative() => base.join(p),
        _ => p.to_path_buf(),
    }
}

/// Training rows: `--samples`, else `data.samples`, else the rows of a local training file.
pub fn samples(r: &mut Resolved, options: &Options) {
    if let Some(n) = options.samples {
        r.set(
            "data.samples",
            Val::Int(n as i64),
            Source::Flag {
                flag: format!("--samples {n}"),
            },
        );
        return;
    }
    if r.is_given("data.samples") {
        return;
    }
    let Some(train) = r.str("data.train").map(str::to_string) else {
        return;
    };
    let path = local(&train, options);
    // The same scan the data rules use (memoised): one read of the file per process.
    let Ok(scan) = scan_data(&path, &scan_spec(r)) else {
        return;
    };
    let rows = scan.rows;
    r.set(
        "data.samples",
        Val::Int(rows as i64),
        Source::File {
            // The path as the recipe writes it: the lock must not depend on where it was built.
            what: format!("{rows} rows of {train}"),
        },
    );
}

/// From a local model directory's config.json: `model.hidden_size`, unless written, and the
/// model's size (`model.params`, `model.largest_layer`).
pub fn model_config(r: &mut Resolved, options: &Options) {
    let dir = r
        .str("model.from")
        .or_else(|| r.str("model.config"))
        .map(str::to_string);
    let Some(dir) = dir else { return };
    let mut path = local(&dir, options);
    let mut shown = dir.clone();
    if path.is_dir() {
        path = path.join("config.json");
        shown = format!("{}/config.json", dir.trim_end_matches('/'));
    }
    let Ok(text) = std::fs::read_to_string(&path) else {
        return;
    };
    let Ok(json) = serde_json::from_str::<serde_json::Value>(&text) else {
        return;
    };
    model_size(r, &shown, &json);
    if r.is_given("model.hidden_size") {
        return;
    }
    // The lookup order HF uses (`transformers/integrations/deepspeed.py:
    // HfTrainerDeepSpeedConfig.trainer_config_finalize`): hidden_size, max(hidden_sizes), then
    // text_config.
    let pick = |v: &serde_json::Value| {
        v.get("hidden_size").and_then(|h| h.as_i64()).or_else(|| {
            v.get("hidden_sizes")
                .and_then(|a| a.as_array())
                .and_then(|a| a.iter().filter_map(|x| x.as_i64()).max())
        })
    };
    let hidden = pick(&json).or_else(|| json.get("text_config").and_then(pick));
    if let Some(h) = hidden {
        r.set(
            "model.hidden_size",
            Val::Int(h),
            Source::File {
                what: format!("hidden_size of {shown}"),
            },
        );
    }
}

/// `model.params` and `model.largest_layer`: the parameters of the sequence-classification model
/// HF builds from a BERT-shaped config.json (`memory::bert_size`, with the task's labels), for
/// the ZeRO memory estimate (docs/rules/precision-zero.md). Nothing when a shape field is missing.
fn model_size(r: &mut Resolved, shown: &str, json: &serde_json::Value) {
    let labels = match r.val("model.task").and_then(|t| t.arg("labels")) {
        Some(Val::List(items)) => items.len() as u64,
        Some(v) => v.as_i64().map_or(2, |n| n.max(0) as u64),
        None => 2,
    };
    let Some(size) = config_size(json, labels) else {
        return;
    };
    let what = format!("a {labels}-label BERT classifier from {shown}");
    for (key, n, of) in [
        ("model.params", size.params, "parameters"),
        (
            "model.largest_layer",
            size.largest_layer,
            "largest module's parameters",
        ),
    ] {
        r.set(
            key,
            Val::Int(i64::try_from(n).unwrap_or(i64::MAX)),
            Source::File {
                what: format!("{of} of {what}"),
            },
        );
    }
}

/// The size of the `labels`-way BERT classifier HF builds from a config.json, or `None` when a
/// shape field is missing.
pub fn config_size(
    json: &serde_json::Value,
    labels: u64,
) -> Option<crate::upstream::memory::ModelSize> {
    let get = |k: &str| json.get(k).and_then(serde_json::Value::as_u64);
    Some(crate::upstream::memory::bert_size(
        &crate::upstream::memory::BertShape {
            vocab_size: get("vocab_size")?,
            hidden_size: get("hidden_size")?,
            num_hidden_layers: get("num_hidden_layers")?,
            intermediate_size: get("intermediate_size")?,
            max_position_embeddings: get("max_position_embeddings")?,
            type_vocab_size: get("type_vocab_size").unwrap_or(2),
            num_labels: labels,
            pooler: true,
        },
    ))
}

// ---- Data files: one streaming pass per file --------------------------------------------------
//
// The rules see only the [`Resolved`] recipe, so resolution records the recipe's directory
// (`Resolved::base_dir`) and [`local_path`] resolves paths the way [`samples`] does. The scan
// itself is the runtime's (`recipe_runtime::data::scan`: rows counted, each row's structure,
// fields and label checked, in 64 KiB chunks), so `data.samples` is the number of rows
// `recipe run` reads, CSV quoted newlines included. A data file is read once per process:
// [`scan_data`] memoises the summary on the file's path, size and mtime, so the row count here
// and the data rules (rules/data.rs) share one read, and the `recipe` binary keeps clean scans
// across processes (`scan_cache`), keyed on the file's identity and change times.

/// Where a path written in the recipe is read from: a relative path from the recipe's directory
/// (when resolution was given one), anything else as written.
pub fn local_path(r: &Resolved, path: &str) -> PathBuf {
    let p = Path::new(path);
    match &r.base_dir {
        Some(base) if p.is_relative() => base.join(p),
        _ => p.to_path_buf(),
    }
}

/// The format the loader reads every data file in: `data.format`, or for `auto` the training
/// file's extension (JSONL when it names none, as the `data.format` default says).
pub fn data_format(r: &Resolved) -> Format {
    match r.word("data.format").and_then(Format::from_word) {
        Some(Format::Auto) | None => r
            .str("data.train")
            .and_then(Format::from_extension)
            .unwrap_or(Format::Jsonl),
        Some(f) => f,
    }
}

/// The fields and format the recipe's `data` block names.
pub fn scan_spec(r: &Resolved) -> ScanSpec {
    let mut fields = Vec::new();
    for key in ["data.text", "data.text_pair"] {
        if let Some(f) = r.str(key) {
            if !fields.iter().any(|x| x == f) {
                fields.push(f.to_string());
            }
        }
    }
    let label = r
        .str("data.label")
        .map(|f| match fields.iter().position(|x| x == f) {
            Some(i) => i,
            None => {
                fields.push(f.to_string());
                fields.len() - 1
            }
        });
    ScanSpec {
        format: data_format(r),
        fields,
        label,
    }
}

type MemoKey = (PathBuf, u64, Option<std::time::SystemTime>, ScanSpec);

static MEMO: std::sync::Mutex<Vec<(MemoKey, std::sync::Arc<DataScan>)>> =
    std::sync::Mutex::new(Vec::new());

/// Scans a local data file (memoised on path, size, mtime and spec; see the section comment).
pub fn scan_data(path: &Path, spec: &ScanSpec) -> std::io::Result<std::sync::Arc<DataScan>> {
    let meta = std::fs::metadata(path)?;
    if !meta.is_file() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "not a file",
        ));
    }
    let key: MemoKey = (
        path.to_path_buf(),
        meta.len(),
        meta.modified().ok(),
        spec.clone(),
    );
    let memo = |m: &Vec<(MemoKey, std::sync::Arc<DataScan>)>| {
        m.iter().find(|(k, _)| *k == key).map(|(_, s)| s.clone())
    };
    if let Some(hit) = MEMO.lock().ok().and_then(|m| memo(&m)) {
        return Ok(hit);
    }
    // A previous process's scan of the same unchanged file, else a fresh one.
    let scan = match super::scan_cache::get(path, &meta, spec) {
        Some(s) => s,
        None => {
            let s = scan_file(path, meta.len(), spec)?;
            super::scan_cache::put(path, &meta, spec, &s);
            s
        }
    };
    let scan = std::sync::Arc::new(scan);
    if let Ok(mut m) = MEMO.lock() {
        if m.len() >= 8 {
            m.remove(0);
        }
        m.push((key, scan.clone()));
    }
    Ok(scan)
}
