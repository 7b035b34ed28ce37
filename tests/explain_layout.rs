//! `recipe explain` fits the terminal: the settings grouped by block, provenance beside the value
//! or under it, every line within COLUMNS (`--wide` keeps the one-row-per-setting table).

use std::path::PathBuf;
use std::process::Command;

fn explain(file: &str, columns: Option<usize>, extra: &[&str]) -> String {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_recipe"));
    cmd.arg("explain")
        .arg(file)
        .args(extra)
        .current_dir(&root)
        // The same figures on every machine: no model files from a cache, no remembered scans.
        .env("RECIPE_CACHE", root.join("target/no-such-cache"))
        .env("RECIPE_SCAN_CACHE", "0")
        .env_remove("NO_COLOR");
    match columns {
        Some(c) => cmd.env("COLUMNS", c.to_string()),
        None => cmd.env_remove("COLUMNS"),
    };
    let out = cmd.output().unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

fn widest(text: &str) -> usize {
    text.lines().map(|l| l.chars().count()).max().unwrap_or(0)
}

#[test]
fn every_example_recipe_fits_the_columns() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("recipes");
    let mut recipes: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "rcp"))
        .map(|p| format!("recipes/{}", p.file_name().unwrap().to_string_lossy()))
        .collect();
    recipes.sort();
    assert!(recipes.len() >= 5);
    for file in &recipes {
        for columns in [80, 100, 120] {
            let text = explain(file, Some(columns), &[]);
            assert!(
                widest(&text) <= columns,
                "{file} at {columns} columns:\n{}",
                text.lines()
                    .filter(|l| l.chars().count() > columns)
                    .collect::<Vec<_>>()
                    .join("\n")
            );
            assert!(
                !text.contains('\x1b'),
                "no colour when stdout is not a terminal"
            );
        }
    }
    // Without COLUMNS and without a terminal: 100.
    assert!(widest(&explain("recipes/cls.rcp", None, &[])) <= 100);
}

#[test]
fn wide_keeps_the_full_table() {
    let text = explain("recipes/cls.rcp", Some(80), &["--wide"]);
    let header = text.lines().find(|l| l.starts_with("KEY")).unwrap();
    for column in ["VALUE", "FROM", "DEEPSPEED", "TRAININGARGUMENTS"] {
        assert!(header.contains(column));
    }
    assert!(widest(&text) > 200, "one row per setting, however wide");
}

#[test]
fn cls_at_80_columns() {
    insta::assert_snapshot!(explain("recipes/cls.rcp", Some(80), &[]));
}

#[test]
fn cls_at_120_columns() {
    insta::assert_snapshot!(explain("recipes/cls.rcp", Some(120), &[]));
}
