//! The fuzz targets' properties (fuzz/checks, run by `cargo fuzz`, fuzz/README.md) over every
//! committed input of their kind, and over the inputs the fuzzer found that once failed
//! (fuzz/regressions/<target>/). This keeps the checks compiling with the crate (the fuzz crate
//! is not built in CI) and holds each committed recipe, pair and data file to them.

use crate::common;

#[path = "../fuzz/checks/data.rs"]
pub mod data;
#[path = "../fuzz/checks/pair.rs"]
mod pair;
#[path = "../fuzz/checks/parse.rs"]
mod parse;

use std::path::{Path, PathBuf};

use common::root;

/// The files under `dir` (recursively), sorted.
fn files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for e in std::fs::read_dir(&d).unwrap_or_else(|e| panic!("{}: {e}", d.display())) {
            let p = e.unwrap().path();
            if p.is_dir() {
                todo.push(p);
            } else {
                out.push(p);
            }
        }
    }
    out.sort();
    out
}

/// The inputs the fuzzer found for `target` that once failed, if any are committed.
fn regressions(target: &str) -> Vec<PathBuf> {
    let dir = root().join("fuzz/regressions").join(target);
    if dir.is_dir() {
        files(&dir)
    } else {
        Vec::new()
    }
}

fn run_each(what: &str, inputs: &[(PathBuf, Vec<u8>)], check: fn(&[u8])) {
    assert!(!inputs.is_empty(), "no {what} inputs found");
    for (path, bytes) in inputs {
        let r = std::panic::catch_unwind(|| check(bytes));
        if r.is_err() {
            panic!("the {what} check fails on {}", path.display());
        }
    }
}

#[test]
fn every_committed_recipe_holds_to_the_parse_check() {
    let mut inputs = Vec::new();
    for dir in [
        "recipes",
        "tests/diagnostics",
        "conformance/corpus",
        "fuzz/seeds",
    ] {
        for p in files(&root().join(dir)) {
            if p.extension().is_some_and(|e| e == "rcp") || dir == "fuzz/seeds" {
                inputs.push((p.clone(), std::fs::read(&p).unwrap()));
            }
        }
    }
    for p in regressions("parse") {
        inputs.push((p.clone(), std::fs::read(&p).unwrap()));
    }
    assert!(inputs.len() > 200, "{} recipes", inputs.len());
    run_each("parse", &inputs, parse::run);
}

#[test]
fn every_committed_pair_holds_to_the_pair_check() {
    let mut inputs = Vec::new();
    for case in files(&root().join("tests/pairs")) {
        if case.file_name().is_some_and(|n| n == "ds_config.json") {
            let dir = case.parent().unwrap();
            let mut bytes = std::fs::read(&case).unwrap();
            for args in ["training_args.json", "args.txt"] {
                if let Ok(a) = std::fs::read(dir.join(args)) {
                    bytes.push(0);
                    bytes.extend(a);
                    break;
                }
            }
            inputs.push((case.clone(), bytes));
        }
    }
    for p in regressions("pair") {
        inputs.push((p.clone(), std::fs::read(&p).unwrap()));
    }
    assert!(inputs.len() >= 20, "{} pairs", inputs.len());
    run_each("pair", &inputs, pair::run);
}

#[test]
fn every_committed_data_file_holds_to_the_data_check() {
    let mut inputs = Vec::new();
    for p in files(&root().join("runtime/tests/fixtures/data")) {
        // The first byte picks the format (fuzz/checks/data.rs): 0 JSON Lines, 1 CSV, 2 TSV.
        let pick = match p.extension().and_then(|e| e.to_str()) {
            Some("jsonl") => 0,
            Some("csv") => 1,
            Some("tsv") => 2,
            _ => continue,
        };
        let mut bytes = vec![pick];
        bytes.extend(std::fs::read(&p).unwrap());
        inputs.push((p.clone(), bytes));
    }
    for p in regressions("data") {
        inputs.push((p.clone(), std::fs::read(&p).unwrap()));
    }
    assert!(inputs.len() >= 15, "{} data files", inputs.len());
    run_each("data", &inputs, data::run);
}
