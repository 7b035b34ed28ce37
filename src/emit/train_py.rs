//! `train.py`: the training script `launch.sh` runs unless the recipe names its own
//! (`train.script`). A small program over the user's own torch, transformers, accelerate and
//! DeepSpeed: it reads the recipe's data files as `recipe run` reads them, tokenizes with the
//! model's tokenizer, builds `AutoModelForSequenceClassification` with the recipe's labels and
//! runs HF `Trainer`.
//!
//! What the recipe says about the model and the data is written into the script as constants
//! (one place to read them, beside the code that uses them); everything else arrives as the
//! TrainingArguments flags `launch.sh` passes, parsed by transformers' `HfArgumentParser`, so
//! field names that differ between releases stay the emitters' business. The program itself is
//! `train_template.py`, the same for every recipe.

use std::fmt::Write as _;

use crate::resolve::{files, Resolved};

/// The file name, beside `launch.sh`.
pub const FILE: &str = "train.py";

const TEMPLATE: &str = include_str!("train_template.py");

/// Whether `recipe build` writes `train.py` (and `launch.sh` runs it): the recipe names no
/// script of its own.
pub fn written(r: &Resolved) -> bool {
    !r.is_given("train.script")
}

/// A Python string literal (a JSON string is one: the same escapes, `\uXXXX` included).
fn py_str(s: &str) -> String {
    serde_json::to_string(s).expect("strings serialize")
}

fn py_opt(s: Option<&str>) -> String {
    s.map_or_else(|| "None".to_string(), py_str)
}

fn py_bool(b: bool) -> &'static str {
    if b {
        "True"
    } else {
        "False"
    }
}

/// The constants block: what the recipe says about the model and the data.
fn constants(r: &Resolved) -> String {
    let (labels, named) = super::plan::labels(r).unwrap_or_default();
    let labels: Vec<String> = labels.iter().map(|l| py_str(l)).collect();
    let dropout = r
        .f64("model.dropout")
        .map_or_else(|| "None".to_string(), |d| format!("{d:?}"));
    let mut s = String::new();
    let mut group = |comment: &str, lines: &[(&str, String)]| {
        for c in comment.lines() {
            let _ = writeln!(s, "# {c}");
        }
        for (name, value) in lines {
            let _ = writeln!(s, "{name} = {value}");
        }
    };
    group(
        "model.from (a local directory or a hub id), or model.config (a config.json: random weights)",
        &[
            ("MODEL_FROM", py_opt(r.str("model.from"))),
            ("MODEL_CONFIG", py_opt(r.str("model.config"))),
        ],
    );
    group(
        "model.task: the class names in id order. LABELS_NAMED is False for `classify(labels: N)`,\n\
         whose rows give ids only (LABEL_0, LABEL_1, ... are HF's names for them)",
        &[
            ("LABELS", format!("[{}]", labels.join(", "))),
            ("LABELS_NAMED", py_bool(named).to_string()),
        ],
    );
    group(
        "model.dropout: the hidden and attention dropout (None: the model config's)",
        &[("DROPOUT", dropout)],
    );
    group(
        "data.train, data.eval, data.test (None: not given), every file read as data.format says",
        &[
            ("TRAIN_FILE", py_opt(r.str("data.train"))),
            ("EVAL_FILE", py_opt(r.str("data.eval"))),
            ("TEST_FILE", py_opt(r.str("data.test"))),
            ("FORMAT", py_str(files::data_format(r).name())),
        ],
    );
    group(
        "data.text, data.text_pair, data.label: the fields (JSONL keys or CSV/TSV columns)",
        &[
            ("TEXT", py_str(r.text("data.text"))),
            ("TEXT_PAIR", py_opt(r.str("data.text_pair"))),
            ("LABEL", py_str(r.text("data.label"))),
        ],
    );
    group(
        "data.max_len: tokens per row after truncation, special tokens included",
        &[("MAX_LEN", r.integer("data.max_len").to_string())],
    );
    group(
        "data.shuffle: False takes the training rows in file order every epoch",
        &[(
            "SHUFFLE",
            py_bool(r.bool("data.shuffle") != Some(false)).to_string(),
        )],
    );
    s.pop(); // the template's blank lines follow
    s
}

/// The script for a resolved recipe; `recipe_file` is the recipe's name as the build was given
/// it (written into a docstring and comments: backslashes, quotes and control characters are
/// replaced so that it cannot end them).
pub fn script(r: &Resolved, recipe_file: &str) -> String {
    let name: String = recipe_file
        .chars()
        .map(|c| match c {
            '\\' => '/',
            '"' => '\'',
            c if c.is_control() => '?',
            c => c,
        })
        .collect();
    TEMPLATE
        .replace("@RECIPE@", &name)
        .replace("@CONSTANTS@", &constants(r))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn python_literals() {
        assert_eq!(py_str("a \"b\"\n\\ é"), r#""a \"b\"\n\\ é""#);
        assert_eq!(py_opt(None), "None");
        assert_eq!(py_bool(true), "True");
    }

    #[test]
    fn the_template_has_one_place_for_the_constants() {
        assert_eq!(TEMPLATE.matches("@CONSTANTS@").count(), 1);
        assert!(TEMPLATE.contains("HfArgumentParser(TrainingArguments)"));
    }
}
