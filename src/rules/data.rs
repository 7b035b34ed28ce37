//! Data rules: the local training, evaluation and test files against what the recipe says about
//! them — they exist, their rows are JSON objects with the named fields, their labels are the
//! classes `model.task` declares, their extensions agree with `data.format`.
//!
//! These rules follow what the training script does with the files (docs/rules/data-model-compat.md): HF `datasets`' json/csv loaders
//! (`load_dataset(format, data_files=…)`) read every file with the one format, and a text or
//! label column missing from a row, or a label outside `num_labels`, fails in tokenisation or in
//! the loss (`huggingface/transformers@v5.24.0:src/transformers/models/bert/modeling_bert.py:
//! BertForSequenceClassification.forward`: `CrossEntropyLoss` over `num_labels` classes).
//!
//! Which files are local: a path is read where `files::local_path` says (relative to the recipe).
//! When the training file is here, the data is local, and a named evaluation or test file that is
//! not here is an error (a typo, most likely). When the training file is not here, the recipe
//! describes data on the cluster (`samples` gives its size; without it R0204 says the steps are
//! unknown), and missing files are not reported. Content checks run on every file that is here.
//!
//! Files are read once per process (`files::scan_data`, shared with the row count of step
//! accounting), in one streaming pass that checks each JSONL row as the runtime's reader parses
//! it (serde_json into a value) without building the values. CSV/TSV files are read as the runtime reads them (the csv crate:
//! quoted fields, BOM, CRLF): the header's columns, each record's field count and labels.

use crate::diagnostics::Diagnostic;
use crate::resolve::files::{self, DataScan, Format, LabelSeen, LabelValue, NOT_UTF8};
use crate::resolve::{Resolved, Val};

use super::anchor;

/// A named data file is missing (or is a directory) while the data is local.
pub const FILE_MISSING: &str = "R0701";
/// A JSONL row is not a JSON object, or a CSV/TSV row is not one record of the header's fields.
pub const ROW_NOT_OBJECT: &str = "R0702";
/// A field the recipe names is missing from rows (or from the CSV/TSV header).
pub const FIELD_MISSING: &str = "R0703";
/// A label value outside the classes `model.task` declares.
pub const LABEL_OUT_OF_SET: &str = "R0704";
/// A file's extension says another format than `data.format`.
pub const FORMAT_MISMATCH: &str = "R0705";
/// Evaluation asked for without evaluation data: HF's Trainer refuses it.
pub const EVAL_WITHOUT_DATA: &str = "R0706";
/// `shuffle = false` with the recipe's own script, on a transformers without
/// `train_sampling_strategy`: the HF Trainer shuffles anyway.
pub const SHUFFLE_NOT_HONOURED: &str = "R0707";
/// A JSONL text field holds a number, a boolean, an array or an object rather than a string.
pub const TEXT_NOT_STRING: &str = "R0708";

/// `train.eval_every` other than `never` without `data.eval`: HF's Trainer raises at
/// construction (found by the conformance harness; huggingface/transformers@v5.24.0
/// src/transformers/trainer.py:Trainer.__init__).
fn eval_without_data(r: &Resolved, out: &mut Vec<Diagnostic>) {
    // reduce_lr_on_plateau and greedy step on an evaluation metric: TrainingArguments refuses
    // them without an evaluation strategy ("lr_scheduler_type reduce_lr_on_plateau requires an
    // eval strategy"; "lr_scheduler_type greedy requires an eval strategy" since greedy came, in
    // v5.4.0; huggingface/transformers@v5.24.0 src/transformers/training_args.py:__post_init__).
    let kind = r.word("schedule.kind");
    if let Some(kind) = kind.filter(|k| matches!(*k, "reduce_lr_on_plateau" | "greedy")) {
        let quote = format!("\"lr_scheduler_type {kind} requires an eval strategy\"");
        if r.get("data.eval").is_none() {
            out.push(
                Diagnostic::error(
                    EVAL_WITHOUT_DATA,
                    format!("`{kind}` steps on an evaluation metric, but there is no evaluation data: TrainingArguments stops with {quote}"),
                    super::anchor(r, "schedule.kind"),
                )
                .with_label("needs `data.eval`")
                .with_help("add `eval = \"…\"` to `data`, or choose a schedule that does not need a metric"),
            );
            return;
        }
        if r.word("train.eval_every") == Some("never") {
            let mut d = Diagnostic::error(
                EVAL_WITHOUT_DATA,
                format!("`{kind}` steps on an evaluation metric, but `eval_every = never` turns evaluation off: TrainingArguments stops with {quote}"),
                super::anchor(r, "train.eval_every"),
            )
            .with_label("no evaluation, so no metric");
            if let Some(span) = r.span("schedule.kind") {
                d = d.with_secondary(span, "steps on an evaluation metric");
            }
            out.push(d.with_help("evaluate (`eval_every = epoch`, or every N steps), or choose a schedule that does not need a metric"));
        }
        return;
    }
    if r.get("data.eval").is_some() {
        return;
    }
    if !r.is_given("train.eval_every") || r.word("train.eval_every") == Some("never") {
        return;
    }
    out.push(
        Diagnostic::error(
            EVAL_WITHOUT_DATA,
            "`eval_every` asks for evaluation, but there is no evaluation data: HF's Trainer stops with \"You have set `args.eval_strategy` to … but you didn't pass an `eval_dataset` to `Trainer`\"",
            super::anchor(r, "train.eval_every"),
        )
        .with_label("no `data.eval` to evaluate on")
        .with_help("add `eval = \"…\"` to `data`, or write `eval_every = never`"),
    );
}

/// `shuffle = false` reaches the HF Trainer as `train_sampling_strategy = "sequential"`
/// (transformers@v5.2.0 … v5.24.0 trainer.py:`Trainer._get_train_sampler` returns a
/// `SequentialSampler`; the field is absent in v5.1.0). Before 5.2.0 `_get_train_sampler` returns
/// a `RandomSampler` (or a `LengthGroupedSampler` with `group_by_length`) whatever the arguments
/// say (v4.46.0 … v5.1.0 trainer.py): the generated train.py then overrides it with a
/// `SequentialSampler`, but a script of the recipe's own (`train.script`) gets no argument that
/// says so, and shuffles.
fn shuffle_not_honoured(r: &Resolved, out: &mut Vec<Diagnostic>) {
    if r.bool("data.shuffle") != Some(false)
        || r.facts.hf_train_sampling_strategy
        || !r.is_given("train.script")
    {
        return;
    }
    let tf = r.targets.transformers;
    let mut d = Diagnostic::warning(
        SHUFFLE_NOT_HONOURED,
        format!(
            "`shuffle = false` cannot be passed to the training script: transformers {tf} has no TrainingArguments field for it (`train_sampling_strategy` comes in 5.2.0), so the HF Trainer of the recipe's own script shuffles the training data every epoch (Trainer._get_train_sampler: RandomSampler)"
        ),
        anchor(r, "data.shuffle"),
    )
    .with_label("not honoured by the DeepSpeed build");
    if let Some(span) = r.span("train.script") {
        d = d.with_secondary(span, "the recipe's own script");
    }
    out.push(d.with_help(
        "target transformers ≥ 5.2.0 (`recipe build` then passes train_sampling_strategy \"sequential\"), or remove `script` to run the generated train.py (it takes the rows in file order on every release), or make the script's Trainer return a SequentialSampler from _get_train_sampler",
    ));
}

/// This family's codes.
pub const CODES: &[(&str, &str, &str)] = &[
    (
        FILE_MISSING,
        "data-file-missing",
        "a named data file is not there while the training file is",
    ),
    (
        ROW_NOT_OBJECT,
        "row-not-object",
        "a JSONL row is not a JSON object, or a CSV/TSV row does not fit the header",
    ),
    (
        FIELD_MISSING,
        "field-missing",
        "a text or label field is missing from rows or from the header",
    ),
    (
        LABEL_OUT_OF_SET,
        "label-out-of-set",
        "a label is not one of the classes the task declares",
    ),
    (
        FORMAT_MISMATCH,
        "format-mismatch",
        "a data file's extension says another format than `data.format`",
    ),
    (
        EVAL_WITHOUT_DATA,
        "eval-without-data",
        "eval_every asks for evaluation, but data.eval is not given",
    ),
    (
        SHUFFLE_NOT_HONOURED,
        "shuffle-not-honoured",
        "`shuffle = false`, but the target transformers has no field for it and the script is the recipe's own",
    ),
    (
        TEXT_NOT_STRING,
        "text-not-string",
        "a JSONL text field holds a number, a boolean, an array or an object, not a string",
    ),
];

/// The data files a recipe may name, and what each is for.
const FILES: [(&str, &str); 3] = [
    ("data.train", "training"),
    ("data.eval", "evaluation"),
    ("data.test", "test"),
];

/// Checks the data files.
pub fn check(r: &Resolved, out: &mut Vec<Diagnostic>) {
    eval_without_data(r, out);
    shuffle_not_honoured(r, out);
    let spec = files::scan_spec(r);
    let format = Some(spec.format);
    let train_here = r
        .str("data.train")
        .is_some_and(|p| files::local_path(r, p).is_file());
    let mut mismatches = Vec::new();
    for (key, what) in FILES {
        let Some(written) = r.str(key) else { continue };
        let path = files::local_path(r, written);
        let extension = Format::from_extension(written);
        let mismatch = matches!((format, extension), (Some(f), Some(e)) if f != e);
        if let (true, Some(e)) = (mismatch, extension) {
            mismatches.push((key, written, e));
        }
        if path.is_dir() {
            out.push(
                Diagnostic::error(
                    FILE_MISSING,
                    format!("the {what} data \"{written}\" is a directory, not a file"),
                    anchor(r, key),
                )
                .with_label("a directory")
                .with_help("name one JSONL, CSV or TSV file"),
            );
            continue;
        }
        if !path.is_file() {
            if key != "data.train" && train_here {
                out.push(missing_file(r, key, what, written, &path));
            }
            continue;
        }
        if mismatch {
            continue; // read with the wrong format, every row would be reported
        }
        let Ok(scan) = files::scan_data(&path, &spec) else {
            continue;
        };
        if let Some(d) = not_objects(r, key, written, spec.format, &scan) {
            out.push(d);
        }
        out.extend(missing_fields(r, key, written, &scan));
        out.extend(not_text(r, key, written, &scan));
        if let Some(d) = labels(r, key, written, &scan) {
            out.push(d);
        }
    }
    if let (Some(format), false) = (format, mismatches.is_empty()) {
        out.push(format_mismatch(r, format, &mismatches));
    }
}

fn missing_file(
    r: &Resolved,
    key: &str,
    what: &str,
    written: &str,
    path: &std::path::Path,
) -> Diagnostic {
    let mut d = Diagnostic::error(
        FILE_MISSING,
        format!("the {what} file \"{written}\" does not exist"),
        anchor(r, key),
    )
    .with_label(format!("no file at {}", path.display()));
    if let Some(span) = r.span("data.train") {
        d = d.with_secondary(span, "while the training file is here");
    }
    let help = match closest_sibling(written, path) {
        Some((best, fixed)) => {
            d = super::fix::with_set(d, r, key, &crate::commands::format::quote(&fixed));
            format!("did you mean \"{best}\"? (in the same directory)")
        }
        None => {
            "fix the path (relative paths are read from the recipe's directory), or remove the item"
                .into()
        }
    };
    d.with_help(help)
}

/// For a missing file whose directory exists: the closest name in that directory, and the path
/// as written with its file name replaced by it.
pub fn closest_sibling(written: &str, path: &std::path::Path) -> Option<(String, String)> {
    let dir = path.parent().filter(|p| p.is_dir())?;
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
    let siblings = sibling_names(dir);
    let best = crate::check::suggest::closest(name, siblings.iter().map(String::as_str))?;
    let fixed = match written.rfind('/') {
        Some(i) => format!("{}{best}", &written[..=i]),
        None => best.to_string(),
    };
    Some((best.to_string(), fixed))
}

fn sibling_names(dir: &std::path::Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .filter_map(|e| e.ok()?.file_name().into_string().ok())
                .take(1000)
                .collect()
        })
        .unwrap_or_default()
}

/// One warning for every file whose extension names another format than the one the loader
/// will use (`data.format`, written or derived from the training file's extension).
fn format_mismatch(r: &Resolved, format: Format, files: &[(&str, &str, Format)]) -> Diagnostic {
    let names: Vec<String> = files
        .iter()
        .map(|(_, written, e)| format!("\"{written}\" ({})", e.name()))
        .collect();
    // `format = auto` says what the default says: the training file's extension.
    let written = r.is_given("data.format") && r.word("data.format") != Some("auto");
    let message = if written {
        format!(
            "`format = {}`, but the extension says otherwise for {}",
            format.name(),
            names.join(", ")
        )
    } else {
        format!(
            "the data format is {} (from the training file's extension), but the extension says otherwise for {}",
            format.name(),
            names.join(", ")
        )
    };
    let (primary, label) = match r.span("data.format") {
        Some(span) => (
            span,
            "the loader reads every data file in this format".to_string(),
        ),
        None => (anchor(r, files[0].0), format!("read as {}", format.name())),
    };
    let mut d = Diagnostic::warning(FORMAT_MISMATCH, message, primary).with_label(label);
    for (i, (key, _, e)) in files.iter().enumerate() {
        if let Some(span) = r.span(key).filter(|s| written || i > 0 || *s != primary) {
            d = d.with_secondary(span, format!("a {} file by its extension", e.name()));
        }
    }
    let first = files[0].2.name();
    d.with_help(if written {
        format!("set `format = {first}` (or remove it: `auto` takes the training file's extension), or convert the files")
    } else {
        format!(
            "give all data files one format: convert the {first} file(s) to {}",
            format.name()
        )
    })
}

fn not_objects(
    r: &Resolved,
    key: &str,
    written: &str,
    format: Format,
    scan: &DataScan,
) -> Option<Diagnostic> {
    let (line, what) = scan.first_bad.as_ref()?;
    let more = if scan.bad_rows > 1 {
        format!(" ({} rows in all)", scan.bad_rows)
    } else {
        String::new()
    };
    let (message, help) = if what == NOT_UTF8 {
        (
            format!("{written}:{line}: {what}{more}"),
            format!(
                "data files are read as UTF-8; save the file as UTF-8 (for a Latin-1 file: `iconv -f latin1 -t utf-8`), or fix or remove the row at line {line}"
            ),
        )
    } else if format.has_header() {
        let name = format.name().to_uppercase();
        (
            format!("{written}:{line} is not a {name} row: {what}{more}"),
            format!(
                "every row of a {name} file has the header's fields; quote a field that holds the delimiter, a quote (doubled) or a line break; fix or remove the row at line {line}"
            ),
        )
    } else {
        (
            format!("{written}:{line} is not a JSON object: {what}{more}"),
            format!(
                "every line of a JSONL file must be one JSON object, such as {{\"{}\": \"…\", \"{}\": 0}}; fix or remove line {line}",
                r.text("data.text"),
                r.text("data.label")
            ),
        )
    };
    Some(
        Diagnostic::error(ROW_NOT_OBJECT, message, anchor(r, key))
            .with_label(format!("line {line} of this file"))
            .with_help(help),
    )
}

/// A label as the recipe would write it (a class name quoted as a recipe string).
fn shown(value: &LabelValue) -> String {
    match value {
        LabelValue::Int(i) => i.to_string(),
        LabelValue::Str(s) => crate::commands::format::quote(s),
        LabelValue::Other(s) => s.clone(),
    }
}

/// The `data` key that names a field (for its span).
fn field_key(r: &Resolved, field: &str) -> &'static str {
    ["data.text", "data.text_pair", "data.label"]
        .into_iter()
        .find(|k| r.str(k) == Some(field))
        .unwrap_or("data.text")
}

/// "all 20 rows" / "10 of 20 rows".
fn share(some: u64, all: u64) -> String {
    if some == all {
        format!("all {some} rows")
    } else {
        format!("{some} of {all} rows")
    }
}

fn missing_fields(r: &Resolved, key: &str, written: &str, scan: &DataScan) -> Vec<Diagnostic> {
    let mut out = Vec::new();
    for m in &scan.missing {
        let item = field_key(r, &m.field);
        let item_name = item.trim_start_matches("data.");
        let (message, label, known) = match &scan.header {
            // The column is there, but some cells are empty (pandas reads them as NaN).
            Some((_, columns)) if m.rows > 0 => {
                let rows = share(m.rows, scan.rows);
                (
                    format!(
                        "`{}` is empty in {rows}, first at {written}:{}",
                        m.field, m.first_line
                    ),
                    format!("line {} has an empty `{}`", m.first_line, m.field),
                    columns.clone(),
                )
            }
            Some((line, columns)) => (
                format!(
                    "\"{written}\" has no `{}` column (header at line {line}: {})",
                    m.field,
                    columns.join(", ")
                ),
                format!("the header at line {line} lacks `{}`", m.field),
                columns.clone(),
            ),
            None => {
                let rows = share(m.rows, scan.rows);
                (
                    format!(
                        "`{}` is missing or null in {rows}, first at {written}:{}",
                        m.field, m.first_line
                    ),
                    format!("line {} has no `{}` (or it is null)", m.first_line, m.field),
                    scan.first_fields.clone(),
                )
            }
        };
        let mut d = Diagnostic::error(FIELD_MISSING, message, anchor(r, key)).with_label(label);
        if let Some(span) = r.span(item) {
            d = d.with_secondary(span, format!("`{item_name}` names the field"));
        }
        let named: Vec<&str> = ["data.text", "data.text_pair", "data.label"]
            .iter()
            .filter_map(|k| r.str(k))
            .collect();
        let candidates: Vec<&str> = known
            .iter()
            .map(String::as_str)
            .filter(|k| !named.contains(k))
            .collect();
        // The field is absent everywhere: a CSV/TSV header without the column, or no row has it.
        let everywhere = (scan.header.is_some() && m.rows == 0) || m.rows == scan.rows;
        if scan.strings_array {
            // The one field is HF's, not the file's: naming it would not make the rows right.
            out.push(d.with_help(strings_array_help(r, written)));
            continue;
        }
        let suggestion = crate::check::suggest::closest(&m.field, candidates.iter().copied())
            .or_else(|| (candidates.len() == 1).then(|| candidates[0]));
        if let Some(best) = suggestion.filter(|_| everywhere) {
            d = super::fix::with_set(d, r, item, &crate::commands::format::quote(best));
        }
        let help = match suggestion {
            Some(best) if everywhere => format!(
                "the file has the fields {}: set `{item_name} = \"{best}\"` in `data` if that is the one, or fix the data",
                known.join(", ")
            ),
            _ if !everywhere => format!(
                "fix line {} and the other rows without a `{}`, or remove them",
                m.first_line, m.field
            ),
            _ => format!("set `{item_name}` in `data` to the field that holds it, or fix the data"),
        };
        out.push(d.with_help(help));
    }
    out
}

/// Text fields that hold something other than a string in some JSONL rows: the runtime's reader
/// stops at the first (data::read, `NotText`), and HF's tokenizer takes text only (a column of
/// numbers reaches `tokenizer(batch["text"])` as integers; mixed types fail in `datasets`' JSON
/// loader as Arrow casts the column).
fn not_text(r: &Resolved, key: &str, written: &str, scan: &DataScan) -> Vec<Diagnostic> {
    scan.not_text
        .iter()
        .map(|t| {
            let item = field_key(r, &t.field);
            let rows = share(t.rows, scan.rows);
            let mut d = Diagnostic::error(
                TEXT_NOT_STRING,
                format!(
                    "`{}` must be a string, but it is {} at {written}:{} (not a string in {rows})",
                    t.field, t.found, t.first_line
                ),
                anchor(r, key),
            )
            .with_label(format!("line {} holds {}", t.first_line, t.found));
            if let Some(span) = r.span(item) {
                d = d.with_secondary(
                    span,
                    format!("`{}` names a text field", item.trim_start_matches("data.")),
                );
            }
            d.with_help(if scan.strings_array {
                strings_array_help(r, written)
            } else {
                format!(
                    "text fields are JSON strings: quote the value (`\"{}\": \"42\"`), or fix or remove line {} and the other such rows",
                    t.field, t.first_line
                )
            })
        })
        .collect()
}

/// Why the rows of a JSON array file have one field, `text`, whatever its elements are: HF
/// `datasets` reads it as a list of strings (`scan::array_of_strings`, which cites the loader).
fn strings_array_help(r: &Resolved, written: &str) -> String {
    format!(
        "HF `datasets` reads {written} as a list of strings (a JSON array with no `{{` before the first `\"` in its first 100 bytes): each element becomes a row whose one field is `text`; write each element as an object, such as {{\"{}\": \"…\", \"{}\": 0}}, and begin the file with `[{{`",
        r.text("data.text"),
        r.text("data.label")
    )
}

/// With `classify(labels: N)` (a count), the distinct label names of the local training file,
/// sorted as HF's text-classification script numbers them (`label_list.sort()`); None when the
/// task names its classes, the file is not local, or its labels are ids.
pub fn names_under_a_count(r: &Resolved) -> Option<Vec<String>> {
    let Classes::Count(_) = Classes::of(r)? else {
        return None;
    };
    let path = files::local_path(r, r.str("data.train")?);
    let scan = files::scan_data(&path, &files::scan_spec(r)).ok()?;
    let mut names: Vec<String> = scan
        .labels
        .iter()
        .filter_map(|s| match &s.value {
            LabelValue::Str(n) => Some(n.clone()),
            _ => None,
        })
        .collect();
    names.sort();
    (!names.is_empty()).then_some(names)
}

/// The classes a task declares.
#[derive(Debug, Clone, Copy)]
enum Classes<'a> {
    /// `classify(labels: N)`: ids 0..N-1 (or up to N distinct names, mapped by the script).
    Count(i64),
    /// `classify(labels: ["ham", "spam"])`: these names, or their ids.
    Names(&'a [Val]),
}

impl Classes<'_> {
    fn of(r: &Resolved) -> Option<Classes<'_>> {
        match r.val("model.task")?.arg("labels")? {
            Val::List(names) => Some(Classes::Names(names)),
            v => v.as_i64().map(Classes::Count),
        }
    }

    fn count(&self) -> i64 {
        match self {
            Classes::Count(n) => *n,
            Classes::Names(names) => names.len() as i64,
        }
    }

    fn describe(&self) -> String {
        match self {
            Classes::Count(n) => format!(
                "the {n} classes of `classify(labels: {n})` (ids 0–{})",
                n - 1
            ),
            Classes::Names(names) => {
                let list: Vec<String> = names.iter().map(Val::to_string).collect();
                format!(
                    "the classes {} (or their ids 0–{})",
                    list.join(", "),
                    names.len() - 1
                )
            }
        }
    }
}

/// The label values outside the declared classes, in order of first appearance; with a class
/// count and string labels, the strings beyond the first `N` distinct ones.
fn outside<'s>(classes: Classes<'_>, labels: &'s [LabelSeen]) -> Vec<&'s LabelSeen> {
    let n = classes.count();
    let mut strings = 0;
    let mut bad: Vec<&LabelSeen> = Vec::new();
    for seen in labels {
        let ok = match (&seen.value, classes) {
            (LabelValue::Int(i), _) => (0..n).contains(i),
            (LabelValue::Str(s), Classes::Names(names)) => {
                names.iter().any(|v| v.as_str() == Some(s.as_str()))
            }
            (LabelValue::Str(_), Classes::Count(_)) => {
                strings += 1;
                strings <= n
            }
            (LabelValue::Other(_), _) => false,
        };
        if !ok {
            bad.push(seen);
        }
    }
    bad
}

fn labels(r: &Resolved, key: &str, written: &str, scan: &DataScan) -> Option<Diagnostic> {
    let classes = Classes::of(r)?;
    let bad = outside(classes, &scan.labels);
    let first = bad.iter().min_by_key(|s| s.first_line)?;
    let field = r.text("data.label");
    let rows: u64 = bad.iter().map(|s| s.rows).sum();
    let string_overflow = matches!(
        (classes, &first.value),
        (Classes::Count(_), LabelValue::Str(_))
    );
    let message = if string_overflow {
        let distinct = scan
            .labels
            .iter()
            .filter(|s| matches!(s.value, LabelValue::Str(_)))
            .count();
        format!(
            "\"{written}\" has {distinct} distinct `{field}` names, more than the {} classes the task declares; the first one too many is {} at {written}:{}",
            classes.count(),
            shown(&first.value),
            first.first_line
        )
    } else {
        let what = match &first.value {
            LabelValue::Other(_) => " (not an integer id or a class name)",
            _ => "",
        };
        format!(
            "`{field}` {}{what} at {written}:{} is not one of {}",
            shown(&first.value),
            first.first_line,
            classes.describe()
        )
    };
    let values: Vec<String> = bad.iter().take(5).map(|s| shown(&s.value)).collect();
    let label = if bad.len() > 5 {
        format!(
            "{rows} rows with labels outside the classes ({}, …)",
            values.join(", ")
        )
    } else if rows > 1 {
        format!(
            "{rows} rows with labels outside the classes ({})",
            values.join(", ")
        )
    } else {
        format!("line {} of this file", first.first_line)
    };
    let mut d = Diagnostic::error(LABEL_OUT_OF_SET, message, anchor(r, key)).with_label(label);
    if let Some(span) = r.span("model.task") {
        d = d.with_secondary(span, format!("declares {} classes", classes.count()));
    }
    Some(d.with_help(label_help(classes, &scan.labels)))
}

fn label_help(classes: Classes<'_>, labels: &[LabelSeen]) -> String {
    let max_int = labels
        .iter()
        .filter_map(|s| match s.value {
            LabelValue::Int(i) => Some(i),
            _ => None,
        })
        .max();
    let names: Vec<String> = labels
        .iter()
        .filter_map(|s| match &s.value {
            LabelValue::Str(s) => Some(crate::commands::format::quote(s)),
            _ => None,
        })
        .collect();
    let others = labels.iter().any(|s| {
        matches!(s.value, LabelValue::Other(_)) || matches!(s.value, LabelValue::Int(i) if i < 0)
    });
    let declare = match classes {
        _ if others => None,
        Classes::Count(_) if names.is_empty() => {
            max_int.map(|m| format!("classify(labels: {})", m + 1))
        }
        Classes::Names(declared) if max_int.is_none() && names.len() <= 64 => {
            let mut all: Vec<String> = declared.iter().map(Val::to_string).collect();
            for n in &names {
                if !all.contains(n) {
                    all.push(n.clone());
                }
            }
            Some(format!("classify(labels: [{}])", all.join(", ")))
        }
        Classes::Count(_) if max_int.is_none() && names.len() <= 64 => {
            Some(format!("classify(labels: [{}])", names.join(", ")))
        }
        _ => None,
    };
    match declare {
        Some(task) => format!(
            "fix the labels in the data, or declare the classes the data uses: `task = {task}`"
        ),
        None => {
            "labels must be class ids 0 to N-1 or the declared class names: fix the data".into()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seen(values: &[LabelValue]) -> Vec<LabelSeen> {
        values
            .iter()
            .enumerate()
            .map(|(i, v)| LabelSeen {
                value: v.clone(),
                first_line: i as u64 + 1,
                rows: 1,
            })
            .collect()
    }

    fn bad(classes: Classes<'_>, values: &[LabelValue]) -> Vec<LabelValue> {
        outside(classes, &seen(values))
            .into_iter()
            .map(|s| s.value.clone())
            .collect()
    }

    use LabelValue::{Int, Other, Str};

    #[test]
    fn class_count_takes_ids_or_that_many_names() {
        let c = Classes::Count(2);
        assert!(bad(c, &[Int(0), Int(1)]).is_empty());
        assert_eq!(bad(c, &[Int(0), Int(2), Int(-1)]), [Int(2), Int(-1)]);
        assert!(bad(c, &[Str("neg".into()), Str("pos".into())]).is_empty());
        assert_eq!(
            bad(c, &[Str("a".into()), Str("b".into()), Str("c".into())]),
            [Str("c".into())]
        );
        assert_eq!(
            bad(c, &[Other("1.0".into()), Other("true".into())]).len(),
            2
        );
    }

    #[test]
    fn class_names_take_names_or_ids() {
        let names = [Val::Str("ham".into()), Val::Str("spam".into())];
        let c = Classes::Names(&names);
        assert!(bad(c, &[Str("ham".into()), Int(1), Int(0)]).is_empty());
        assert_eq!(
            bad(c, &[Str("eggs".into()), Int(2)]),
            [Str("eggs".into()), Int(2)]
        );
        assert_eq!(bad(c, &[Str("Ham".into())]), [Str("Ham".into())]);
    }

    #[test]
    fn help_declares_what_the_data_uses() {
        let names = [Val::Str("ham".into()), Val::Str("spam".into())];
        assert!(
            label_help(Classes::Count(2), &seen(&[Int(0), Int(2)])).contains("classify(labels: 3)")
        );
        assert!(label_help(
            Classes::Names(&names),
            &seen(&[Str("ham".into()), Str("eggs".into())])
        )
        .contains("classify(labels: [\"ham\", \"spam\", \"eggs\"])"));
        assert!(label_help(Classes::Count(2), &seen(&[Int(0), Int(-1)])).contains("fix the data"));
    }
}
