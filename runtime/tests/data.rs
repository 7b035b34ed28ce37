//! The data pipeline against committed fixtures: reading (and every error path), the compiler's
//! scan agreeing with the reader, labels, tokenizer parity with Python `tokenizers`, per-batch
//! padding, and sharding parity with the real accelerate `BatchSamplerShard`.

use std::path::{Path, PathBuf};

use recipe_runtime::accounting::{batches_per_rank, Sharding};
use recipe_runtime::data::scan::{scan_reader, DataScan, ScanSpec};
use recipe_runtime::data::{
    epoch_order, rank_batches, read_examples, DataError, DataSpec, Dataset, Format, LabelSet,
    TextTokenizer,
};
use serde_json::Value;

fn fixture(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(rel)
}

fn tokenizer_path() -> PathBuf {
    fixture("tokenizer/tokenizer.json")
}

fn spec(rel: &str, text: &str, label: &str) -> DataSpec {
    DataSpec {
        path: fixture(rel),
        format: Format::Auto,
        text: text.into(),
        text_pair: None,
        label: label.into(),
    }
}

fn ham_spam() -> LabelSet {
    LabelSet::names(["ham", "spam"]).unwrap()
}

/// The SpamAssassin rows as Python's json module reads them: (text, label).
fn spam48_python_view() -> Vec<(String, u32)> {
    std::fs::read_to_string(fixture("data/spam48.jsonl"))
        .unwrap()
        .lines()
        .map(|l| {
            let v: Value = serde_json::from_str(l).unwrap();
            (
                v["text"].as_str().unwrap().to_string(),
                v["label"].as_u64().unwrap() as u32,
            )
        })
        .collect()
}

// ---------------------------------------------------------------------------------------------
// Reading

#[test]
fn reads_spamassassin_jsonl_with_names_or_count() {
    let rows = spam48_python_view();
    for labels in [ham_spam(), LabelSet::count(2).unwrap()] {
        let ex = read_examples(&spec("data/spam48.jsonl", "text", "label"), &labels).unwrap();
        assert_eq!(ex.len(), 48);
        for (i, (e, (text, label))) in ex.iter().zip(&rows).enumerate() {
            assert_eq!(&e.text, text);
            assert_eq!(e.label, *label);
            assert_eq!(e.line, i + 1);
            assert_eq!(e.text_pair, None);
        }
    }
    let spam = rows.iter().filter(|r| r.1 == 1).count();
    assert!(spam > 0 && spam < 48, "the fixture must hold both classes");
}

#[test]
fn reads_csv_with_quotes_newlines_and_mixed_label_forms() {
    let rows = spam48_python_view();
    let ex = read_examples(&spec("data/spam6.csv", "body", "label"), &ham_spam()).unwrap();
    assert_eq!(ex.len(), 7);
    for (i, e) in ex.iter().take(6).enumerate() {
        let want: String = rows[i].0.chars().take(200).collect();
        assert_eq!(e.text, want);
        assert_eq!(e.label, rows[i].1, "row {i}");
        assert_eq!(e.line, i + 2, "header is line 1");
    }
    assert_eq!(
        ex[6].text,
        "He said \"hi\", then left.\nSecond line of the same row."
    );
    assert_eq!(ex[6].label, 0);
    assert_eq!(ex[6].line, 8);
}

#[test]
fn reads_tsv_and_agrees_with_the_jsonl() {
    let rows = spam48_python_view();
    let ex = read_examples(
        &spec("data/spam6.tsv", "body", "label"),
        &LabelSet::count(2).unwrap(),
    )
    .unwrap();
    assert_eq!(ex.len(), 6);
    for (i, e) in ex.iter().enumerate() {
        assert_eq!(e.text, rows[i].0.chars().take(200).collect::<String>());
        assert_eq!(e.label, rows[i].1);
        assert_eq!(e.line, i + 2);
    }
}

#[test]
fn reads_text_pairs() {
    let labels = LabelSet::names(["entailment", "neutral", "contradiction"]).unwrap();
    let mut s = spec("data/pairs.jsonl", "premise", "label");
    s.text_pair = Some("hypothesis".into());
    let ex = read_examples(&s, &labels).unwrap();
    let got: Vec<(&str, Option<&str>, u32)> = ex
        .iter()
        .map(|e| (e.text.as_str(), e.text_pair.as_deref(), e.label))
        .collect();
    assert_eq!(
        got,
        [
            (
                "A man is playing a guitar.",
                Some("A person plays music."),
                0
            ),
            ("A woman is slicing onions.", Some("Nobody is cooking."), 2),
            (
                "Kids play in the park.",
                Some("The children are at school."),
                2
            ),
            ("Der Hund schläft.", Some("A dog rests."), 1),
        ]
    );
}

#[test]
fn format_from_extension() {
    let r = |p: &str| Format::Auto.resolve(Path::new(p)).ok();
    assert_eq!(r("a/train.jsonl"), Some(Format::Jsonl));
    assert_eq!(r("train.json"), Some(Format::Jsonl));
    assert_eq!(r("TRAIN.CSV"), Some(Format::Csv));
    assert_eq!(r("x.tsv"), Some(Format::Tsv));
    assert_eq!(r("x.txt"), None);
    assert_eq!(r("noext"), None);
    // A declared format wins over the extension.
    assert_eq!(
        Format::Tsv.resolve(Path::new("x.txt")).ok(),
        Some(Format::Tsv)
    );
}

/// The error message of reading broken fixture `name` (under `data/broken/`).
fn read_error(name: &str, text: &str, pair: Option<&str>, labels: &LabelSet) -> String {
    let mut s = spec(&format!("data/broken/{name}"), text, "label");
    s.text_pair = pair.map(Into::into);
    match read_examples(&s, labels) {
        Ok(ex) => panic!("{name}: expected an error, read {} rows", ex.len()),
        Err(e) => e.to_string(),
    }
}

#[test]
fn every_read_error_names_file_and_line() {
    let b = |name: &str| {
        fixture(&format!("data/broken/{name}"))
            .display()
            .to_string()
    };
    let hs = ham_spam();
    let cases: Vec<(String, String)> = vec![
        (
            read_error("missing_text.jsonl", "text", None, &hs),
            format!(
                "{}:17: field \"text\" is missing (the recipe's data.text)",
                b("missing_text.jsonl")
            ),
        ),
        (
            read_error("bad_json.jsonl", "text", None, &hs),
            format!(
                "{}:3: not valid JSON (one object per line is expected): expected `,` or `}}` at line 1 column 26",
                b("bad_json.jsonl")
            ),
        ),
        (
            read_error("not_object.jsonl", "text", None, &hs),
            format!(
                "{}:2: expected a JSON object per row, found an array",
                b("not_object.jsonl")
            ),
        ),
        (
            read_error("text_number.jsonl", "text", None, &hs),
            format!(
                "{}:2: field \"text\" (the recipe's data.text) must be a string, not a number",
                b("text_number.jsonl")
            ),
        ),
        (
            read_error("bad_label.jsonl", "text", None, &hs),
            format!(
                "{}:4: label 2 is not one of the declared labels (\"ham\" or 0, \"spam\" or 1)",
                b("bad_label.jsonl")
            ),
        ),
        (
            read_error("bad_label.jsonl", "text", None, &LabelSet::count(2).unwrap()),
            format!(
                "{}:4: label 2 is not one of the declared labels (an id from 0 to 1)",
                b("bad_label.jsonl")
            ),
        ),
        (
            read_error("bad_label_name.jsonl", "text", None, &hs),
            format!(
                "{}:2: label \"eggs\" is not one of the declared labels (\"ham\" or 0, \"spam\" or 1)",
                b("bad_label_name.jsonl")
            ),
        ),
        (
            read_error("float_label.jsonl", "text", None, &hs),
            format!(
                "{}:1: label 1.0 is not one of the declared labels (\"ham\" or 0, \"spam\" or 1)",
                b("float_label.jsonl")
            ),
        ),
        (
            read_error("missing_label.jsonl", "text", None, &hs),
            format!(
                "{}:2: field \"label\" is missing (the recipe's data.label)",
                b("missing_label.jsonl")
            ),
        ),
        (
            read_error(
                "null_pair.jsonl",
                "premise",
                Some("hypothesis"),
                &LabelSet::names(["entailment", "neutral", "contradiction"]).unwrap(),
            ),
            format!(
                "{}:1: field \"hypothesis\" (the recipe's data.text_pair) must be a string, not null",
                b("null_pair.jsonl")
            ),
        ),
        (
            read_error("blank_only.jsonl", "text", None, &hs),
            format!("{}:3: the file has no examples", b("blank_only.jsonl")),
        ),
        (
            read_error("empty.jsonl", "text", None, &hs),
            format!("{}:1: the file has no examples", b("empty.jsonl")),
        ),
        (
            read_error("empty.csv", "text", None, &hs),
            format!("{}:1: the file has no examples", b("empty.csv")),
        ),
        (
            read_error("header_only.csv", "text", None, &hs),
            format!("{}:1: the file has no examples", b("header_only.csv")),
        ),
        (
            read_error("missing_column.csv", "text", None, &hs),
            format!(
                "{}:1: field \"text\" is missing (the recipe's data.text); the header has: body, label",
                b("missing_column.csv")
            ),
        ),
        (
            read_error("ragged.csv", "text", None, &hs),
            format!(
                "{}:3: the row has 4 fields but the header has 2",
                b("ragged.csv")
            ),
        ),
        (
            // CRLF line ends, a byte-order mark and a quoted field spanning lines 2-3.
            read_error("crlf_bad_label.csv", "text", None, &hs),
            format!(
                "{}:5: label \"eggs\" is not one of the declared labels (\"ham\" or 0, \"spam\" or 1)",
                b("crlf_bad_label.csv")
            ),
        ),
        (
            read_error("bad_label.tsv", "text", None, &hs),
            format!(
                "{}:4: label \"spam \" is not one of the declared labels (\"ham\" or 0, \"spam\" or 1)",
                b("bad_label.tsv")
            ),
        ),
        (
            read_error("data.txt", "text", None, &hs),
            format!(
                "{}: cannot tell the format from the extension; use .jsonl, .json, .csv or .tsv, or declare the format in the recipe",
                b("data.txt")
            ),
        ),
    ];
    for (got, want) in cases {
        assert_eq!(got, want);
    }

    // A bad row (as the checker's scan and a CSV/TSV record say), not an error of the file.
    let utf8 = read_error("not_utf8.jsonl", "text", None, &hs);
    assert_eq!(
        utf8,
        format!("{}:2: the row is not valid UTF-8", b("not_utf8.jsonl"))
    );

    let gone = read_error("no_such_file.jsonl", "text", None, &hs);
    let prefix = format!("{}: cannot read the file: ", b("no_such_file.jsonl"));
    assert!(gone.starts_with(&prefix), "{gone}");
}

#[test]
fn bad_input_is_a_typed_error() {
    let e = read_examples(
        &spec("data/broken/missing_text.jsonl", "text", "label"),
        &ham_spam(),
    )
    .unwrap_err();
    match e {
        DataError::MissingField {
            line, field, role, ..
        } => assert_eq!((line, field.as_str(), role), (17, "text", "text")),
        other => panic!("unexpected {other:?}"),
    }
}

// ---------------------------------------------------------------------------------------------
// The compiler's scan and the reader agree

/// Scans `path` as the compiler does, naming `text`, `pair` and `label`.
fn scan_of(path: &Path, format: Format, text: &str, pair: Option<&str>) -> DataScan {
    let mut fields = vec![text.to_string()];
    fields.extend(pair.map(String::from));
    fields.push("label".into());
    let spec = ScanSpec {
        format,
        label: Some(fields.len() - 1),
        fields,
    };
    scan_reader(std::fs::File::open(path).unwrap(), &spec).unwrap()
}

/// What the reader says of `path` and what the scan says agree: a clean read has the scan's row
/// count, every scanned label's first line is a row's line, and nothing is reported; a read that
/// stops at a row the scan can judge (structure, missing field, empty file) stops where the scan
/// reports it.
fn assert_agree(path: &Path, text: &str, pair: Option<&str>, labels: &LabelSet) {
    let Ok(format) = Format::Auto.resolve(path) else {
        // No format to scan in: the compiler never scans it, the reader refuses it.
        let e = read_examples(&spec_at(path), labels).unwrap_err();
        assert!(matches!(e, DataError::UnknownFormat { .. }), "{e}");
        return;
    };
    let spec = DataSpec {
        path: path.to_path_buf(),
        format,
        text: text.into(),
        text_pair: pair.map(Into::into),
        label: "label".into(),
    };
    let scan = scan_of(path, format, text, pair);
    let name = path.display();
    match read_examples(&spec, labels) {
        Ok(ex) => {
            assert_eq!(scan.rows, ex.len() as u64, "{name}: rows");
            assert_eq!(scan.bad_rows, 0, "{name}: {:?}", scan.first_bad);
            assert!(scan.missing.is_empty(), "{name}: {:?}", scan.missing);
            let lines: Vec<u64> = ex.iter().map(|e| e.line as u64).collect();
            for seen in &scan.labels {
                assert!(lines.contains(&seen.first_line), "{name}: {seen:?}");
            }
        }
        Err(DataError::Json { line, .. } | DataError::Csv { line, .. }) => {
            let first = scan.first_bad.as_ref().map(|b| b.0);
            assert_eq!(first, Some(line as u64), "{name}: first bad row");
        }
        Err(DataError::MissingField { line, field, .. }) => {
            assert!(
                scan.missing
                    .iter()
                    .any(|m| m.field == field && m.first_line == line as u64),
                "{name}: {field} at {line}: {:?}",
                scan.missing
            );
        }
        Err(DataError::Empty { .. }) => assert_eq!(scan.rows, 0, "{name}"),
        Err(DataError::BadLabel { line, .. }) => {
            // A value the scan collected, or an empty CSV cell it counts as a missing label.
            let line = line as u64;
            assert!(
                scan.labels.iter().any(|l| l.first_line == line)
                    || scan.missing.iter().any(|m| m.first_line == line),
                "{name}: label at {line}: {:?} {:?}",
                scan.labels,
                scan.missing
            );
        }
        // Value types and encodings: the scan checks structure only.
        Err(DataError::NotText { .. } | DataError::IoAt { .. }) => {}
        Err(e) => panic!("{name}: {e}"),
    }
}

#[test]
fn the_scan_counts_the_rows_the_reader_reads() {
    let hs = ham_spam();
    assert_agree(&fixture("data/spam48.jsonl"), "text", None, &hs);
    assert_agree(&fixture("data/spam6.csv"), "body", None, &hs);
    assert_agree(&fixture("data/spam6.tsv"), "body", None, &hs);
    let nli = LabelSet::names(["entailment", "neutral", "contradiction"]).unwrap();
    assert_agree(
        &fixture("data/pairs.jsonl"),
        "premise",
        Some("hypothesis"),
        &nli,
    );
    let broken = fixture("data/broken");
    let mut names: Vec<_> = std::fs::read_dir(&broken)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    for name in names {
        let pair = (name == "null_pair.jsonl").then_some("hypothesis");
        let text = if pair.is_some() { "premise" } else { "text" };
        let labels = if pair.is_some() { &nli } else { &hs };
        assert_agree(&broken.join(&name), text, pair, labels);
    }
}

#[test]
fn tricky_delimited_files_have_one_row_count() {
    // Quoted newlines (LF, CRLF, several in a row), doubled quotes, a quoted delimiter in a
    // field and in a column name, a BOM, CRLF line ends, blank lines between rows, a lone CR
    // line end, a last row without a newline: the scan and the reader see the same rows on the
    // same lines.
    let dir = tempfile::tempdir().unwrap();
    let cases: &[(&str, &str)] = &[
        ("lf.csv", "text,label\n\"a\nb\",spam\n\"c\",ham\n"),
        (
            "bom_crlf.csv",
            "\u{feff}text,label\r\n\"a\r\n\r\nb\",1\r\n\r\n\"say \"\"hi\"\"\",0\r\n",
        ),
        (
            "columns.csv",
            "\"id, really\",text,label\n7,\"x, y\",ham\n8,\"\n\",spam",
        ),
        ("cr.csv", "text,label\rone,ham\rtwo,spam\r"),
        (
            "quoted.tsv",
            "text\tlabel\n\"tab\there\nnewline\"\tham\nplain\t1\n",
        ),
        ("ragged_late.csv", "text,label\n\"a\nb\",ham\nc,ham,extra\n"),
        (
            "bad_label_late.csv",
            "text,label\n\"a\n\nb\",ham\n\"c\",eggs\n",
        ),
        ("empty_label.csv", "text,label\n\"a\nb\",ham\nc,\n"),
        // A line of spaces is blank (pandas skips it); inside quotes it is text.
        (
            "spaces.csv",
            "text,label\n  \n\"a\n \t\nb\",ham\n \t \nc,spam\n",
        ),
    ];
    let hs = ham_spam();
    for (name, text) in cases {
        let path = dir.path().join(name);
        std::fs::write(&path, text).unwrap();
        assert_agree(&path, "text", None, &hs);
    }
    // A hundred rows, each with a quoted newline: a hundred rows, not two hundred lines.
    let mut text = String::from("text,label\r\n");
    for i in 0..100 {
        text.push_str(&format!("\"row {i}\r\nsecond line\",{}\r\n", i % 2));
    }
    let path = dir.path().join("hundred.csv");
    std::fs::write(&path, &text).unwrap();
    assert_agree(&path, "text", None, &hs);
    assert_eq!(scan_of(&path, Format::Csv, "text", None).rows, 100);
    let ex = read_examples(&spec_at(&path), &hs).unwrap();
    assert_eq!(ex.len(), 100);
    assert_eq!((ex[0].line, ex[99].line), (2, 200));
}

fn spec_at(path: &Path) -> DataSpec {
    DataSpec {
        path: path.to_path_buf(),
        format: Format::Auto,
        text: "text".into(),
        text_pair: None,
        label: "label".into(),
    }
}

// ---------------------------------------------------------------------------------------------
// Labels

#[test]
fn label_sets() {
    let hs = ham_spam();
    assert_eq!(hs.id2label(), ["ham", "spam"]);
    assert_eq!(hs.id_of_str("spam"), Some(1));
    assert_eq!(
        hs.id_of_str("1"),
        Some(1),
        "ids written as text (CSV) are accepted"
    );
    assert_eq!(hs.id_of_str("2"), None);
    assert_eq!(hs.id_of_str("Spam"), None, "names are case-sensitive");
    assert_eq!(hs.id_of_int(0), Some(0));
    assert_eq!(hs.id_of_int(-1), None);
    assert_eq!(hs.id_of_int(2), None);

    let n3 = LabelSet::count(3).unwrap();
    assert_eq!(n3.id2label(), ["LABEL_0", "LABEL_1", "LABEL_2"]);
    assert_eq!(n3.id_of_str("2"), Some(2));
    assert_eq!(n3.id_of_str("LABEL_1"), None);
    assert_eq!(n3.id_of_int(3), None);
    assert!(!n3.is_named());

    // A declared name wins over an id that reads the same.
    let odd = LabelSet::names(["1", "0"]).unwrap();
    assert_eq!(odd.id_of_str("0"), Some(1));
    assert_eq!(odd.id_of_int(0), Some(0));

    assert_eq!(
        LabelSet::count(0).unwrap_err().to_string(),
        "labels: the number of labels must be at least 1"
    );
    assert_eq!(
        LabelSet::names(["a", "b", "a"]).unwrap_err().to_string(),
        "labels: label \"a\" is declared twice"
    );
    assert!(LabelSet::names(Vec::<String>::new()).is_err());
}

// ---------------------------------------------------------------------------------------------
// Tokenization

#[test]
fn tokenizer_ids_equal_python_tokenizers() {
    let doc: Value =
        serde_json::from_str(&std::fs::read_to_string(fixture("tokenizer/parity.json")).unwrap())
            .unwrap();
    let cases = doc["cases"].as_array().unwrap();
    assert!(cases.len() >= 20);
    let ids = |v: &Value| -> Vec<u32> {
        v.as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_u64().unwrap() as u32)
            .collect()
    };
    let mut truncated = 0;
    for c in cases {
        let max_len = c["max_len"].as_u64().unwrap() as usize;
        let tok = TextTokenizer::from_file(tokenizer_path(), max_len).unwrap();
        let text = c["text"].as_str().unwrap();
        let pair = c["text_pair"].as_str();
        let got = tok.encode(text, pair).unwrap();
        assert_eq!(got.ids, ids(&c["ids"]), "ids of {text:?} / {pair:?}");
        assert_eq!(got.type_ids, ids(&c["type_ids"]), "type ids of {text:?}");
        assert!(got.ids.len() <= max_len);
        truncated += usize::from(got.ids.len() == max_len);
    }
    assert!(truncated >= 3, "the fixture must exercise truncation");
}

#[test]
fn tokenizer_file_padding_and_truncation_are_overridden() {
    // The file says pad to 128 and truncate at 128; the recipe's max_len must rule instead.
    let tok = TextTokenizer::from_file(tokenizer_path(), 512).unwrap();
    assert_eq!(
        tok.encode("hello world", None).unwrap().ids,
        [101, 7592, 2088, 102]
    );
    let long = "word ".repeat(400);
    assert_eq!(tok.encode(&long, None).unwrap().ids.len(), 402);
    assert_eq!(tok.pad_id(), 0);
    assert_eq!(tok.max_len(), 512);
    assert_eq!(tok.vocab_size(), 30522);
}

#[test]
fn pad_id_comes_from_the_file() {
    let dir = std::env::temp_dir().join(format!("recipe-data-pad-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let mut doc: Value =
        serde_json::from_str(&std::fs::read_to_string(tokenizer_path()).unwrap()).unwrap();
    // A file whose padding names another pad token (as RoBERTa's `<pad>` = 1 does).
    doc["padding"]["pad_id"] = 7.into();
    doc["padding"]["pad_token"] = "[unused6]".into();
    let with = dir.join("with.json");
    std::fs::write(&with, doc.to_string()).unwrap();
    assert_eq!(TextTokenizer::from_file(&with, 16).unwrap().pad_id(), 7);
    // Without a padding section, the id of `[PAD]`: moved to 5 (swapped with `[unused4]`) so
    // that the answer cannot be the fallback 0.
    doc["padding"] = Value::Null;
    let vocab = &mut doc["model"]["vocab"];
    vocab["[PAD]"] = 5.into();
    vocab["[unused4]"] = 0.into();
    for t in doc["added_tokens"].as_array_mut().unwrap() {
        if t["content"] == "[PAD]" {
            t["id"] = 5.into();
        }
    }
    let without = dir.join("without.json");
    std::fs::write(&without, doc.to_string()).unwrap();
    assert_eq!(TextTokenizer::from_file(&without, 16).unwrap().pad_id(), 5);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn tokenizer_errors() {
    let e = TextTokenizer::from_file(tokenizer_path(), 3).unwrap_err();
    assert_eq!(
        e.to_string(),
        format!(
            "{}: cannot load the tokenizer: max_len 3 leaves no room for text next to the 3 special tokens",
            tokenizer_path().display()
        )
    );
    let missing = fixture("tokenizer/nope.json");
    let e = TextTokenizer::from_file(&missing, 64).unwrap_err();
    assert!(
        e.to_string().starts_with(&format!(
            "{}: cannot load the tokenizer: ",
            missing.display()
        )),
        "{e}"
    );
    // A spam row as the tokenizer file: not a tokenizer.
    let e = TextTokenizer::from_file(fixture("data/spam48.jsonl"), 64).unwrap_err();
    assert!(matches!(e, DataError::Tokenizer { .. }), "{e:?}");
}

// ---------------------------------------------------------------------------------------------
// Dataset and batches

#[test]
fn dataset_pads_each_batch_to_its_longest_row() {
    let tok = TextTokenizer::from_file(tokenizer_path(), 128).unwrap();
    let ds = Dataset::load(
        &spec("data/spam48.jsonl", "text", "label"),
        &ham_spam(),
        &tok,
    )
    .unwrap();
    assert_eq!(ds.len(), 48);
    assert_eq!(ds.line(47), 48);
    assert_eq!(
        ds.longest(),
        128,
        "some SpamAssassin mails are longer than 128 tokens"
    );
    let rows = spam48_python_view();
    for (i, (text, label)) in rows.iter().enumerate() {
        assert_eq!(ds.ids(i), tok.encode(text, None).unwrap().ids);
        assert_eq!(ds.labels()[i], *label);
    }

    // Short rows only: the batch is as wide as the longest of them, not max_len.
    let short: Vec<usize> = {
        let mut by_len: Vec<usize> = (0..ds.len()).collect();
        by_len.sort_by_key(|&i| ds.ids(i).len());
        by_len[..3].to_vec()
    };
    let mut indices = short.clone();
    indices.push(short[0]); // wrap-around sharding repeats samples
    let b = ds.batch(&indices);
    let widest = short.iter().map(|&i| ds.ids(i).len()).max().unwrap();
    assert!(widest < 128, "the fixture needs rows shorter than max_len");
    assert_eq!((b.batch, b.seq), (4, widest));
    assert_eq!(b.input_ids.len(), 4 * widest);
    assert_eq!(b.token_type_ids.len(), 4 * widest);
    assert_eq!(b.attention_mask.len(), 4 * widest);
    for (r, &i) in indices.iter().enumerate() {
        let ids = ds.ids(i);
        let row = &b.input_ids[r * widest..(r + 1) * widest];
        let mask = &b.attention_mask[r * widest..(r + 1) * widest];
        assert_eq!(&row[..ids.len()], ids);
        assert!(row[ids.len()..].iter().all(|&x| x == tok.pad_id()));
        assert!(mask[..ids.len()].iter().all(|&m| m == 1));
        assert!(mask[ids.len()..].iter().all(|&m| m == 0));
        assert_eq!(b.labels[r], ds.labels()[i]);
    }
    assert!(b.token_type_ids.iter().all(|&t| t == 0));

    let empty = ds.batch(&[]);
    assert_eq!((empty.batch, empty.seq, empty.input_ids.len()), (0, 0, 0));
}

#[test]
fn pair_dataset_has_segment_ids() {
    let tok = TextTokenizer::from_file(tokenizer_path(), 128).unwrap();
    let labels = LabelSet::names(["entailment", "neutral", "contradiction"]).unwrap();
    let mut s = spec("data/pairs.jsonl", "premise", "label");
    s.text_pair = Some("hypothesis".into());
    let ds = Dataset::load(&s, &labels, &tok).unwrap();
    let b = ds.batch(&[0, 1, 2, 3]);
    assert_eq!(b.labels, [0, 2, 2, 1]);
    for r in 0..4 {
        let types = &b.token_type_ids[r * b.seq..(r + 1) * b.seq];
        let mask = &b.attention_mask[r * b.seq..(r + 1) * b.seq];
        let real = mask.iter().filter(|&&m| m == 1).count();
        // [CLS] a [SEP] are segment 0, b [SEP] segment 1, padding 0.
        let first_one = types.iter().position(|&t| t == 1).unwrap();
        assert!(types[first_one..real].iter().all(|&t| t == 1));
        assert!(types[real..].iter().all(|&t| t == 0));
        assert_eq!(
            b.input_ids[r * b.seq + first_one - 1],
            102,
            "[SEP] ends segment 0"
        );
    }
}

#[test]
fn dataset_load_reports_read_errors() {
    let tok = TextTokenizer::from_file(tokenizer_path(), 32).unwrap();
    let e = Dataset::load(
        &spec("data/broken/bad_label.jsonl", "text", "label"),
        &ham_spam(),
        &tok,
    )
    .unwrap_err();
    assert!(matches!(e, DataError::BadLabel { line: 4, .. }), "{e:?}");
}

// ---------------------------------------------------------------------------------------------
// Order and sharding

fn as_batches(v: &Value) -> Vec<Vec<usize>> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|b| {
            b.as_array()
                .unwrap()
                .iter()
                .map(|x| x.as_u64().unwrap() as usize)
                .collect()
        })
        .collect()
}

#[test]
fn sharding_equals_accelerate_batch_sampler_shard() {
    let doc: Value =
        serde_json::from_str(&std::fs::read_to_string(fixture("data/shard_cases.json")).unwrap())
            .unwrap();
    assert_eq!(doc["accelerate"], "1.15.0");
    let cases = doc["cases"].as_array().unwrap();
    assert!(cases.len() > 1000);
    let mut shuffled = 0;
    for c in cases {
        let n = c["n"].as_u64().unwrap() as usize;
        let micro = c["micro"].as_u64().unwrap() as usize;
        let world = c["world"].as_u64().unwrap() as usize;
        let drop_last = c["drop_last"].as_bool().unwrap();
        let order: Vec<usize> = match c["order"].as_array() {
            Some(o) => {
                shuffled += 1;
                o.iter().map(|x| x.as_u64().unwrap() as usize).collect()
            }
            None => (0..n).collect(),
        };
        let ranks = c["ranks"].as_array().unwrap();
        assert_eq!(ranks.len(), world);
        for (rank, want) in ranks.iter().enumerate() {
            let got = rank_batches(&order, micro, world, rank, drop_last).unwrap();
            assert_eq!(
                got,
                as_batches(want),
                "n={n} micro={micro} world={world} rank={rank} drop_last={drop_last} order={order:?}"
            );
        }
    }
    assert!(shuffled > 0);
}

#[test]
fn sharding_agrees_with_step_accounting() {
    let sizes = (0..=23).chain([37, 64, 100, 4708]);
    for n in sizes {
        let order: Vec<usize> = (0..n).collect();
        for micro in [1, 2, 3, 5, 8] {
            for world in 1..=4 {
                for drop_last in [false, true] {
                    let l = batches_per_rank(
                        n as u64,
                        micro as u64,
                        world as u64,
                        drop_last,
                        Sharding::BatchSamplerShard,
                    );
                    let mut seen = vec![false; n];
                    for rank in 0..world {
                        let batches = rank_batches(&order, micro, world, rank, drop_last).unwrap();
                        assert_eq!(
                            batches.len() as u64,
                            l,
                            "n={n} micro={micro} world={world} drop_last={drop_last}"
                        );
                        for b in &batches {
                            assert_eq!(b.len(), micro, "every batch is full");
                            for &i in b {
                                seen[i] = true;
                            }
                        }
                    }
                    if !drop_last {
                        assert!(seen.iter().all(|&s| s), "every sample is used");
                    }
                }
            }
        }
    }
}

#[test]
fn sharding_rejects_impossible_parameters() {
    let order: Vec<usize> = (0..10).collect();
    assert_eq!(
        rank_batches(&order, 0, 2, 0, false)
            .unwrap_err()
            .to_string(),
        "sharding: the per-device batch size must be at least 1"
    );
    assert_eq!(
        rank_batches(&order, 2, 0, 0, false)
            .unwrap_err()
            .to_string(),
        "sharding: the number of ranks must be at least 1"
    );
    assert_eq!(
        rank_batches(&order, 2, 2, 2, false)
            .unwrap_err()
            .to_string(),
        "sharding: rank 2 is outside a world of 2 ranks"
    );
}

#[test]
fn epoch_orders_are_seeded_permutations() {
    let a = epoch_order(100, 42, 0, true);
    assert_eq!(
        a,
        epoch_order(100, 42, 0, true),
        "same seed and epoch, same order"
    );
    let mut sorted = a.clone();
    sorted.sort_unstable();
    assert_eq!(sorted, (0..100).collect::<Vec<_>>());
    assert_ne!(a, (0..100).collect::<Vec<_>>());
    assert_ne!(a, epoch_order(100, 42, 1, true), "each epoch reshuffles");
    assert_ne!(a, epoch_order(100, 43, 0, true), "the seed matters");
    assert_eq!(epoch_order(5, 42, 3, false), [0, 1, 2, 3, 4]);
    assert!(epoch_order(0, 1, 0, true).is_empty());
}

#[test]
fn one_process_keeps_the_short_last_batch_as_the_trainer_does() {
    // 48 rows in batches of 5: torch's BatchSampler gives nine batches of 5 and one of 3; accelerate
    // shards (and pads) only across several processes.
    let order: Vec<usize> = (0..48).collect();
    let b = recipe_runtime::data::trainer_batches(&order, 5, 1, 0, false).unwrap();
    assert_eq!(b.len(), 10);
    assert_eq!(b[9], vec![45, 46, 47]);
    assert!(b[..9].iter().all(|x| x.len() == 5));
    let b = recipe_runtime::data::trainer_batches(&order, 5, 1, 0, true).unwrap();
    assert_eq!(b.len(), 9);
    // Several processes: accelerate's BatchSamplerShard, padded.
    let b = recipe_runtime::data::trainer_batches(&order, 5, 2, 1, false).unwrap();
    assert_eq!(b, rank_batches(&order, 5, 2, 1, false).unwrap());
    assert!(b.iter().all(|x| x.len() == 5));
}
