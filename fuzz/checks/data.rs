//! The data reader against the checker's scan of the same bytes (the `data` fuzz target; also run
//! over every committed data file by tests/fuzz_checks.rs, which keeps this file compiling): one
//! data reader for the checker and the runtime, so that `recipe check` counts the rows `recipe run`
//! reads.
//!
//! The input's first byte picks the format (JSON Lines, CSV or TSV), the rest is the file. For
//! any bytes: neither the scan (`resolve::files::scan_reader`, what `recipe check` reads) nor
//! the runtime's reader (`data::read_examples`) panics, and they agree: a file the reader takes
//! has the scan's row count and no bad row; a row the reader stops at is the scan's first bad
//! row, or the first line of a label, of a missing field or of a text that is not a string the
//! scan saw.

use std::path::PathBuf;
use std::sync::OnceLock;

use recipe::resolve::files::{scan_reader, Format, ScanSpec};
use recipe_runtime::data::{read_examples, DataError, DataSpec, LabelSet};

/// One scratch folder per process; each thread writes its own file in it (libFuzzer runs the
/// inputs one after another, the test harness on several threads).
fn scratch() -> &'static PathBuf {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let dir = std::env::temp_dir().join(format!("recipe-fuzz-data-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        dir
    })
}

pub fn run(data: &[u8]) {
    let Some((&pick, bytes)) = data.split_first() else {
        return;
    };
    let (format, name) = match pick % 3 {
        0 => (Format::Jsonl, "any.jsonl"),
        1 => (Format::Csv, "any.csv"),
        _ => (Format::Tsv, "any.tsv"),
    };
    let path = scratch().join(format!("{:?}-{name}", std::thread::current().id()));
    std::fs::write(&path, bytes).unwrap();
    let spec = ScanSpec {
        format,
        fields: vec!["text".into(), "label".into()],
        label: Some(1),
    };
    let scan = scan_reader(bytes, &spec).unwrap();
    let labels = LabelSet::names(["ham", "spam"]).unwrap();
    let read = read_examples(
        &DataSpec {
            path: path.clone(),
            format,
            text: "text".into(),
            text_pair: None,
            label: "label".into(),
        },
        &labels,
    );
    let first_bad = scan.first_bad.as_ref().map(|b| b.0);
    let seen_at = |line: usize| {
        let line = line as u64;
        scan.labels.iter().any(|l| l.first_line == line)
            || scan.missing.iter().any(|m| m.first_line == line)
    };
    match &read {
        Ok(rows) => {
            assert_eq!(scan.rows, rows.len() as u64, "rows: {scan:?}");
            assert_eq!(scan.bad_rows, 0, "bad rows the reader took: {scan:?}");
        }
        Err(DataError::Csv { line, .. } | DataError::Json { line, .. }) => {
            assert_eq!(
                first_bad,
                Some(*line as u64),
                "{}: {scan:?}",
                read.unwrap_err()
            );
        }
        Err(DataError::Empty { .. }) => assert_eq!(scan.rows, 0, "{scan:?}"),
        Err(DataError::BadLabel { line, .. } | DataError::MissingField { line, .. }) => {
            assert!(seen_at(*line), "{}: {scan:?}", read.unwrap_err());
        }
        // A null text is missing to the scan (R0703), not a text of another type (R0708).
        Err(DataError::NotText { line, found, .. }) if *found == "null" => {
            assert!(seen_at(*line), "{}: {scan:?}", read.unwrap_err());
        }
        Err(DataError::NotText { line, found, .. }) => {
            let line = *line as u64;
            assert!(
                scan.not_text
                    .iter()
                    .any(|t| t.first_line == line && t.found == *found),
                "{}: {scan:?}",
                read.unwrap_err()
            );
        }
        Err(e) => panic!("{e}: {scan:?}"),
    }
}
