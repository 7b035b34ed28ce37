//! Data files end to end: `recipe explain`, `recipe build` and `recipe run` count the rows of a
//! training file the same way, because the checker's row count and the runtime's reader share
//! one data layer (`recipe_runtime::data::format`). The case that once split them: a CSV of 100
//! examples whose text fields hold quoted newlines (200 lines of text) — with LF line ends,
//! with a byte order mark and CRLF line ends, and as TSV — against the same 100 rows as JSONL.

use crate::common;

use std::path::Path;

use common::*;
use serde_json::Value;

/// Rows in each file.
const ROWS: usize = 100;

/// 100 examples built from the committed SpamAssassin rows, each text cut in two lines (so a
/// line count says 200), labels as names and, every fifth row, as ids.
fn examples() -> Vec<(String, String)> {
    let rows = spam_rows();
    (0..ROWS)
        .map(|i| {
            let (text, label) = &rows[i % rows.len()];
            let words: Vec<&str> = text.split_whitespace().take(12).collect();
            let (a, b) = words.split_at(words.len() / 2);
            // A delimiter and a quote inside the text, too.
            let text = format!("{i}: {}, \"{}\"\n{}", a.join(" "), i % 7, b.join(" "));
            let label = match (i % 5, label) {
                (0, id) => id.to_string(),
                (_, 0) => "ham".to_string(),
                _ => "spam".to_string(),
            };
            (text, label)
        })
        .collect()
}

/// A delimited field, quoted as pandas writes it (quotes doubled).
fn quoted(field: &str) -> String {
    format!("\"{}\"", field.replace('"', "\"\""))
}

/// The examples as a file of the given layout.
fn file(layout: &str) -> Vec<u8> {
    let ex = examples();
    let mut out = String::new();
    match layout {
        "jsonl" => {
            for (text, label) in &ex {
                let label: Value = match label.parse::<u64>() {
                    Ok(id) => id.into(),
                    Err(_) => label.as_str().into(),
                };
                let row = serde_json::json!({"text": text, "label": label});
                out.push_str(&format!("{row}\n"));
            }
        }
        "csv" | "tsv" => {
            let sep = if layout == "csv" { "," } else { "\t" };
            out.push_str(&format!("text{sep}label\n"));
            for (text, label) in &ex {
                out.push_str(&format!("{}{sep}{label}\n", quoted(text)));
            }
        }
        "bom_crlf.csv" => {
            out.push('\u{feff}');
            out.push_str("text,label\r\n");
            for (text, label) in &ex {
                let text = text.replace('\n', "\r\n");
                out.push_str(&format!("{},{label}\r\n", quoted(&text)));
            }
        }
        other => panic!("no layout {other}"),
    }
    out.into_bytes()
}

/// What `explain`, `build` (DeepSpeed and native) and `run` say of `train`, in a workspace with
/// the tiny model: (explain's samples, explain's total steps, DeepSpeed's `total_num_steps`,
/// the native plan's samples and total, the run's rows, steps predicted and steps taken, the
/// run's losses).
struct Counts {
    explained: u64,
    steps: u64,
    ds_total: u64,
    plan: (u64, u64),
    run: (u64, u64, u64),
    losses: Vec<f64>,
}

fn counts(name: &str, train: &str, bytes: &[u8]) -> Counts {
    let recipe = tiny_with_data(&format!("data {{ train = \"{train}\", max_len = 24 }}"));
    let dir = workspace(&format!("data-{name}"), &recipe);
    std::fs::write(dir.join(train), bytes).unwrap();

    let o = recipe_in(&dir, &["check", "tiny.rcp"]);
    assert_eq!(o.status.code(), Some(0), "{name}: {}", stderr(&o));

    let explain = stdout_json(&recipe_in(
        &dir,
        &["explain", "--format", "json", "tiny.rcp"],
    ));
    let samples = explain["settings"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["key"] == "data.samples")
        .unwrap();
    assert_eq!(
        samples["from"],
        format!("read: {ROWS} rows of {train}"),
        "{name}"
    );
    assert_eq!(samples["json"], explain["steps"]["samples"], "{name}");

    // A DeepSpeed scheduler, so that ds_config.json carries the total steps.
    let o = recipe_in(
        &dir,
        &[
            "build",
            "tiny.rcp",
            "-o",
            "ds",
            "--set",
            "schedule.kind=WarmupDecayLR",
        ],
    );
    assert_eq!(o.status.code(), Some(0), "{name}: {}", stderr(&o));
    let ds: Value = read_json(&dir.join("ds/ds_config.json"));

    let o = recipe_in(
        &dir,
        &["build", "tiny.rcp", "--target", "native", "-o", "native"],
    );
    assert_eq!(o.status.code(), Some(0), "{name}: {}", stderr(&o));
    let plan: Value = read_json(&dir.join("native/plan.json"));

    let o = recipe_in(&dir, &["run", "--quiet", "tiny.rcp"]);
    assert_eq!(o.status.code(), Some(0), "{name}: {}", stderr(&o));
    let m = metrics(&dir.join("out"));
    let start = m.iter().find(|r| r["event"] == "start").unwrap();
    let end = m.iter().find(|r| r["event"] == "end").unwrap();
    let u = |v: &Value| {
        v.as_u64()
            .unwrap_or_else(|| panic!("{name}: not a count: {v}"))
    };
    Counts {
        explained: u(&explain["steps"]["samples"]),
        steps: u(&explain["steps"]["total"]),
        ds_total: u(&ds["scheduler"]["params"]["total_num_steps"]),
        plan: (u(&plan["data"]["samples"]), u(&plan["steps"]["total"])),
        run: (
            u(&start["train_rows"]),
            u(&end["steps"]["predicted"]),
            u(&end["steps"]["taken"]),
        ),
        losses: m.iter().filter_map(|r| r["loss"].as_f64()).collect(),
    }
}

fn read_json(path: &Path) -> Value {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap()
}

#[test]
fn a_csv_with_quoted_newlines_has_one_row_count_everywhere() {
    let jsonl = counts("jsonl", "train.jsonl", &file("jsonl"));
    // 100 rows, micro 5: 20 micro-batches an epoch, windows of 3: 7 steps, 14 in 2 epochs.
    assert_eq!(jsonl.explained, ROWS as u64);
    assert_eq!(jsonl.steps, 14);
    assert_eq!(jsonl.ds_total, 14);
    assert_eq!(jsonl.plan, (ROWS as u64, 14));
    assert_eq!(jsonl.run, (ROWS as u64, 14, 14));
    assert_eq!(jsonl.losses.len(), 14);

    for (name, train, layout) in [
        ("csv", "train.csv", "csv"),
        ("bom-crlf", "train.csv", "bom_crlf.csv"),
        ("tsv", "train.tsv", "tsv"),
    ] {
        let bytes = file(layout);
        let lines = bytes.iter().filter(|&&b| b == b'\n').count();
        assert_eq!(
            lines,
            2 * ROWS + 1,
            "{name}: the file must fool a line count"
        );
        let c = counts(name, train, &bytes);
        assert_eq!(c.explained, ROWS as u64, "{name}: explain's samples");
        assert_eq!(c.steps, jsonl.steps, "{name}: explain's steps");
        assert_eq!(c.ds_total, jsonl.ds_total, "{name}: total_num_steps");
        assert_eq!(c.plan, jsonl.plan, "{name}: the native plan");
        assert_eq!(c.run, jsonl.run, "{name}: the run");
        // The same examples in another layout train the same model: the reader saw the same
        // texts and labels (a CRLF inside a text is whitespace to the tokenizer).
        assert_eq!(c.losses, jsonl.losses, "{name}: losses");
    }
}

#[test]
fn a_broken_csv_row_is_reported_by_check_and_run_at_the_same_line() {
    // Row 3 (lines 6-7) has an unquoted comma: three fields under a two-column header.
    let mut text = String::from("text,label\n");
    let ex = examples();
    for (i, (t, label)) in ex.iter().take(10).enumerate() {
        if i == 2 {
            text.push_str(&format!("{},extra,{label}\n", quoted(t)));
        } else {
            text.push_str(&format!("{},{label}\n", quoted(t)));
        }
    }
    let recipe = tiny_with_data("data { train = \"train.csv\", max_len = 24 }");
    let dir = workspace("data-ragged", &recipe);
    std::fs::write(dir.join("train.csv"), &text).unwrap();
    let o = recipe_in(&dir, &["check", "tiny.rcp"]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    let err = stderr(&o);
    assert!(
        err.contains("R0702")
            && err.contains(
                "train.csv:6 is not a CSV row: the row has 3 fields but the header has 2"
            ),
        "{err}"
    );
    // `run` refuses a recipe that does not check; the reader names the same line.
    let o = recipe_in(&dir, &["run", "--quiet", "tiny.rcp"]);
    assert_ne!(o.status.code(), Some(0));
    let spec = recipe_runtime::data::DataSpec {
        path: dir.join("train.csv"),
        format: recipe_runtime::data::Format::Auto,
        text: "text".into(),
        text_pair: None,
        label: "label".into(),
    };
    let labels = recipe_runtime::data::LabelSet::names(["ham", "spam"]).unwrap();
    let e = recipe_runtime::data::read_examples(&spec, &labels).unwrap_err();
    assert!(
        e.to_string()
            .ends_with("train.csv:6: the row has 3 fields but the header has 2"),
        "{e}"
    );
}

/// Tricky files whose every other row has only empty fields (conformance/data_rows.py).
const BLANK_ROWS: &[&str] = &["delimiter_only_lines.csv", "whitespace_lines.tsv"];

/// JSON arrays that datasets takes for lists of strings, each element a row's `text`
/// (conformance/data_rows.py; data::scan, `array_of_strings`).
const STRINGS_ARRAYS: &[&str] = &["array_strings.json", "array_padded.json"];

#[test]
fn tricky_files_have_the_rows_hf_datasets_finds() {
    use recipe::resolve::files::{scan_file, Format, ScanSpec};
    let fixture = read_json(&root().join("conformance/fixtures/data-rows.json"));
    let files = fixture["files"].as_array().unwrap();
    assert!(files.len() >= 10, "{fixture}");
    let labels = recipe_runtime::data::LabelSet::names(["ham", "spam"]).unwrap();
    for f in files {
        let path = root().join("conformance").join(f["file"].as_str().unwrap());
        let hf = f["datasets_rows"].as_u64().unwrap();
        assert_eq!(
            f["recipe_rows"],
            hf,
            "{}: recorded disagreement",
            path.display()
        );
        let format = Format::from_extension(&path).unwrap();
        let spec = ScanSpec {
            format,
            fields: vec!["text".into(), "label".into()],
            label: Some(1),
        };
        let len = std::fs::metadata(&path).unwrap().len();
        let scan = scan_file(&path, len, &spec).unwrap();
        assert_eq!(scan.rows, hf, "{}: the scan", path.display());
        // The columns datasets made: a CSV/TSV header, the first JSON row's fields.
        let columns = match &scan.header {
            Some((_, names)) => names.clone(),
            None => scan.first_fields.clone(),
        };
        assert_eq!(
            serde_json::json!(columns),
            f["datasets_columns"],
            "{}: the columns",
            path.display()
        );
        let read = recipe_runtime::data::read_examples(
            &recipe_runtime::data::DataSpec {
                path: path.clone(),
                format,
                text: "text".into(),
                text_pair: None,
                label: "label".into(),
            },
            &labels,
        );
        let name = path.file_name().unwrap().to_string_lossy();
        if BLANK_ROWS.contains(&name.as_ref()) {
            // datasets counts the rows of blank fields (their label is empty or a space, which
            // the training script's label mapping then fails on); the checker counts them too
            // and sees the label missing (CSV) or a third label value (TSV: " "), which
            // rules/data.rs reports; the reader refuses the first one with its file and line.
            let missing = scan.missing.iter().find(|m| m.field == "label");
            assert!(
                missing.is_some_and(|m| m.rows == hf / 2 && m.first_line == 3)
                    || scan.labels.len() == 3,
                "{}: {scan:?}",
                path.display()
            );
            let e = read.expect_err("a row without a label").to_string();
            assert!(e.contains(&format!("{name}:3:")), "{e}");
            continue;
        }
        assert_eq!(
            scan.strings_array,
            STRINGS_ARRAYS.contains(&name.as_ref()),
            "{name}"
        );
        if scan.strings_array {
            // No row has a label (nor, from the padded objects, a text that is a string): the
            // checker says so of every row (rules/data.rs adds why), and the reader stops at
            // the first, on the line its element starts.
            assert_eq!(scan.bad_rows, 0, "{name}: {:?}", scan.first_bad);
            let missing = scan.missing.iter().find(|m| m.field == "label");
            assert_eq!(missing.map(|m| m.rows), Some(hf), "{name}: {scan:?}");
            let first = missing.unwrap().first_line;
            let e = read.expect_err("rows without a label").to_string();
            assert!(e.contains(&format!("{name}:{first}:")), "{e}");
            continue;
        }
        assert_eq!(scan.bad_rows, 0, "{}: {:?}", path.display(), scan.first_bad);
        let read = read.unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(read.len() as u64, hf, "{}: the reader", path.display());
    }
}

/// The `data` fuzz target's property (fuzz/checks/data.rs, a module of fuzz_checks.rs).
use crate::fuzz_checks::data as data_check;

mod agreement {
    //! Any CSV-ish text: the scan and the reader never panic, and they agree on the rows (the
    //! `data` fuzz target's property, fuzz/checks/data.rs, on the texts that make CSV hard).

    use super::data_check as check;
    use proptest::prelude::*;

    /// Texts from the bytes that make CSV hard: quotes, delimiters, CR, LF, spaces, a BOM.
    fn csvish() -> impl Strategy<Value = String> {
        let piece = prop_oneof![
            Just("\"".to_string()),
            Just(",".to_string()),
            Just("\t".to_string()),
            Just("\n".to_string()),
            Just("\r\n".to_string()),
            Just("\r".to_string()),
            Just(" ".to_string()),
            Just("ham".to_string()),
            Just("spam".to_string()),
            Just("1".to_string()),
            Just("x".to_string()),
            Just("\u{feff}".to_string()),
        ];
        prop::collection::vec(piece, 0..60).prop_map(|p| format!("text,label\n{}", p.concat()))
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(300))]

        #[test]
        fn scan_and_reader_agree_on_any_csv(text in csvish(), tsv in any::<bool>()) {
            // The check's first byte picks the format: 1 CSV, 2 TSV.
            let (pick, text) = if tsv {
                (2u8, text.replacen(',', "\t", 1))
            } else {
                (1u8, text)
            };
            let mut input = vec![pick];
            input.extend(text.as_bytes());
            check::run(&input);
        }

        #[test]
        fn scan_and_reader_agree_on_any_jsonl(rows in prop::collection::vec(jsonish(), 1..6)) {
            // The check's first byte picks the format: 0 JSON Lines.
            let mut input = vec![0u8];
            input.extend(rows.join(&b"\n"[..]));
            check::run(&input);
        }

        #[test]
        fn scan_and_reader_agree_on_any_json_array(
            rows in prop::collection::vec(jsonish(), 0..5),
            sep in prop_oneof![Just(",\n"), Just(", "), Just("\n"), Just(",,"), Just(",\r\n  ")],
            head in prop_oneof![Just("["), Just("\u{feff}[\n"), Just("[\r\n")],
            tail in prop_oneof![Just("]"), Just("\n]\n"), Just(""), Just("] {}"), Just("]\n\n")],
        ) {
            // A file that is one JSON array of rows (`[` first, after a BOM).
            let mut input = vec![0u8];
            input.extend(head.as_bytes());
            input.extend(rows.join(sep.as_bytes()));
            input.extend(tail.as_bytes());
            check::run(&input);
        }

        #[test]
        fn scan_and_reader_agree_on_any_json_array_of_values(
            values in prop::collection::vec(value(), 0..5),
            sep in prop_oneof![Just(",\n"), Just(", "), Just(",,")],
            head in prop_oneof![Just("["), Just("\u{feff}[\n"), Just("[\"ham\", ")],
        ) {
            // What HF reads as a list of strings when no `{` comes before the first `"` in the
            // first 100 bytes (data::scan, `array_of_strings`): each element a row's `text`.
            let mut input = vec![0u8];
            input.extend(head.as_bytes());
            input.extend(values.join(sep.as_bytes()));
            input.extend(b"]");
            check::run(&input);
        }
    }

    /// Rows that are objects with a text and a label and a value ([`value`]).
    fn jsonish() -> impl Strategy<Value = Vec<u8>> {
        // The value is the text itself (of any type: R0708's), or a field beside it.
        (value(), any::<bool>(), any::<bool>()).prop_map(|(value, ham, as_text)| {
            let mut row = Vec::new();
            let (key, text) = if as_text {
                (&b"text"[..], &b"\"v\": 0"[..])
            } else {
                (&b"v"[..], &b"\"text\": \"a\""[..])
            };
            row.extend(b"{\"");
            row.extend(key);
            row.extend(b"\": ");
            row.extend(&value);
            row.extend(b", ");
            row.extend(text);
            row.extend(if ham {
                &b", \"label\": \"ham\"}"[..]
            } else {
                &b", \"label\": \"spam\"}"[..]
            });
            row
        })
    }

    /// A value built from the pieces where JSON readers differ: escapes (surrogates, a lone
    /// one, a bad one), control characters, numbers (leading zeros, exponents, out of an f64's
    /// range), literals, nesting (deep too, to serde_json's limit), commas and brackets out of
    /// place, bytes that are not UTF-8.
    fn value() -> impl Strategy<Value = Vec<u8>> {
        let piece = prop_oneof![
            Just(&b"\"\\ud83d\\ude00\""[..]),
            Just(&b"\"\\ud83d\""[..]),
            Just(&b"\"\\ude00x\""[..]),
            Just(&b"\"\\ud83d\\u0041\""[..]),
            Just(&b"\"\\u00e9\\n\\/\""[..]),
            Just(&b"\"\\x\""[..]),
            Just(&b"\"\\u12g4\""[..]),
            Just(&b"\"a\tb\""[..]),
            Just(&b"\"\x7f\""[..]),
            Just("\"é€😀\"".as_bytes()),
            Just(&b"\"\xff\""[..]),
            Just(&b"\"\xe2\x82\""[..]),
            Just(&b"0"[..]),
            Just(&b"-0.5e-3"[..]),
            Just(&b"01"[..]),
            Just(&b"1."[..]),
            Just(&b"1e"[..]),
            Just(&b"-"[..]),
            Just(&b"1e308"[..]),
            Just(&b"1e309"[..]),
            Just(&b"-1E+400"[..]),
            Just(&b"0e99999"[..]),
            Just(&b"1e-400"[..]),
            Just(&b"true"[..]),
            Just(&b"nul"[..]),
            Just(&b"nullx"[..]),
            Just(&b"["[..]),
            Just(&b"]"[..]),
            Just(&b"{"[..]),
            Just(&b"}"[..]),
            Just(&b"{\"k\":"[..]),
            Just(&b","[..]),
            Just(&b":"[..]),
            Just(&b" "[..]),
            Just(&b"\r"[..]),
        ];
        let deep = prop_oneof![Just(126usize), Just(127), Just(128)].prop_map(|n| {
            let mut v = "[".repeat(n).into_bytes();
            v.extend("]".repeat(n).bytes());
            v
        });
        prop_oneof![
            prop::collection::vec(piece, 1..8).prop_map(|p| p.concat()),
            deep,
        ]
    }
}
