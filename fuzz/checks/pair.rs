//! The pair linter and `recipe import` on any pair of texts (the `pair` fuzz target; also run over
//! every committed pair by tests/fuzz_checks.rs, which keeps this file compiling).
//!
//! The input is `ds_config text`, optionally followed by a NUL and the TrainingArguments text.
//! For any UTF-8 input, whatever the bytes (broken JSON, comments, odd numbers and strings):
//! `pair::check` must not panic with the arguments read as JSON, as flags or not given; every
//! finding's spans must lie inside the file they point into, on char boundaries; every finding
//! must render. When the config is a JSON object (and the arguments one, or absent), the recipe
//! `import` writes must parse.

use recipe::commands::import::{import, Inputs};
use recipe::diagnostics::{render_human_with, Label, Style};
use recipe::pair::{self, ArgsInput, Options, Report};
use recipe::upstream::versions::Targets;
use recipe::{check_source, SourceFile};

fn check_label(file: &SourceFile, code: &str, label: &Label) {
    let (s, text) = (label.span, &file.text);
    assert!(
        s.start <= s.end && s.end <= text.len(),
        "{code} span {}..{} out of bounds of {} ({} bytes)",
        s.start,
        s.end,
        file.name,
        text.len()
    );
    assert!(
        text.is_char_boundary(s.start) && text.is_char_boundary(s.end),
        "{code} span {}..{} not on char boundaries of {}",
        s.start,
        s.end,
        file.name
    );
}

fn check_report(report: &Report) {
    for f in &report.findings {
        check_label(report.file(f.primary.side), f.code, &f.primary.label);
        for at in &f.secondary {
            check_label(report.file(at.side), f.code, &at.label);
        }
        let (d, other) = report.split(f);
        let other = other
            .as_ref()
            .map(|(file, labels)| (*file, labels.as_slice()));
        let _ = render_human_with(&d, report.file(f.primary.side), other, Style::Plain);
    }
}

pub fn run(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let (ds_text, args_text) = match text.split_once('\0') {
        Some((ds, args)) => (ds, Some(args)),
        None => (text, None),
    };
    let opts = Options {
        world: 1 + (data.len() as u64 % 8),
        samples: Some(1000),
        hidden_size: Some(64),
        has_eval: None,
        targets: Targets::newest(),
    };
    let ds = SourceFile::new("ds_config.json", ds_text);
    check_report(&pair::check(ds.clone(), None, &opts));
    if let Some(args) = args_text {
        let json = ArgsInput::Json(SourceFile::new("training_args.json", args));
        check_report(&pair::check(ds.clone(), Some(json), &opts));
        let flags = ArgsInput::Flags(SourceFile::new("launch.sh", args));
        check_report(&pair::check(ds, Some(flags), &opts));
    }

    // `recipe import` takes what serde_json reads as an object (src/cli/import.rs).
    let object = |t: &str| {
        serde_json::from_str::<serde_json::Value>(t)
            .ok()
            .filter(|v| v.is_object())
    };
    let Some(ds_value) = object(ds_text) else {
        return;
    };
    let args_value = match args_text {
        Some(t) => match object(t) {
            Some(v) => Some(v),
            None => return,
        },
        None => None,
    };
    let inputs = Inputs {
        model: None,
        train: None,
        eval: None,
        samples: Some(1000),
        labels: None,
        hidden_size: Some(64),
        model_is_local: false,
        gpus: None,
        nodes: None,
        targets: Vec::new(),
        origin: "fuzz".into(),
    };
    let recipe = import(&ds_value, args_value.as_ref(), &inputs);
    let checked = check_source(&recipe);
    assert!(
        checked.file.is_some(),
        "the imported recipe does not parse: {:?}\n--- recipe ---\n{recipe}",
        checked.diagnostics
    );
}
