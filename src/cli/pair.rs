//! `recipe check ds_config.json [--args training_args.json | -- <flags>]`: the pair linter.

use std::io::Write;
use std::path::{Path, PathBuf};

use recipe::diagnostics::{render_human_with, to_json_with};
use recipe::pair::{self as lint, ArgsInput, Options};
use recipe::SourceFile;

use super::{read, style, Format, RecipeFlags, FAILED, OK, USAGE};

/// The pair-only flags of `recipe check`.
pub struct PairFlags {
    pub args: Option<PathBuf>,
    pub hidden_size: Option<u64>,
    pub no_eval_data: bool,
    pub training_flags: Vec<String>,
}

/// A `.json` file is a DeepSpeed config to lint, not a recipe.
pub fn is_pair_file(path: &Path) -> bool {
    path.extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("json"))
}

/// The TrainingArguments file: JSON by its extension, else a file of flags (a launch script).
/// `None` when it cannot be read (the error is printed).
fn args_file(path: &Path) -> Option<ArgsInput> {
    let f = read(path)?;
    Some(if is_pair_file(path) {
        ArgsInput::Json(f)
    } else {
        ArgsInput::Flags(f)
    })
}

/// Quotes a word for the synthetic command line, so that its spans read back as written.
fn shell_quote(w: &str) -> String {
    if !w.is_empty()
        && w.chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_=.,/:+@%".contains(c))
    {
        w.to_string()
    } else {
        format!("'{}'", w.replace('\'', "'\\''"))
    }
}

/// The options of a pair check from the command line.
pub fn options(
    flags: &RecipeFlags,
    file: &Path,
    hidden_size: Option<u64>,
    no_eval_data: bool,
) -> Result<Options, String> {
    let options = flags.options(file)?;
    Ok(Options::from_recipe(
        &options,
        hidden_size,
        no_eval_data.then_some(false),
    ))
}

/// Prints a pair's findings: human on stderr, or JSON lines on stdout (on stderr with
/// `json_to_stderr`, when stdout carries something else).
pub fn print(report: &lint::Report, format: Format, json_to_stderr: bool) -> std::io::Result<()> {
    let stdout = std::io::stdout();
    let mut stdout = stdout.lock();
    for f in &report.findings {
        let (d, other) = report.split(f);
        let file = report.file(f.primary.side);
        let other = other.as_ref().map(|(f, l)| (*f, l.as_slice()));
        match format {
            Format::Human => eprint!("{}", render_human_with(&d, file, other, style())),
            Format::Json => {
                let line = serde_json::to_string(&to_json_with(&d, file, other))
                    .expect("diagnostics serialize to JSON");
                if json_to_stderr {
                    eprintln!("{line}");
                } else {
                    writeln!(stdout, "{line}")?;
                }
            }
        }
    }
    Ok(())
}

pub fn run(files: &[PathBuf], pf: PairFlags, flags: &RecipeFlags) -> i32 {
    let [file] = files else {
        eprintln!("error: check one ds_config.json at a time (with its --args)");
        return USAGE;
    };
    if pf.args.is_some() && !pf.training_flags.is_empty() {
        eprintln!("error: give the TrainingArguments once: --args FILE or `-- <flags>`, not both");
        return USAGE;
    }
    if !flags.set.is_empty() {
        eprintln!("error: --set changes recipe items; a ds_config.json has none");
        return USAGE;
    }
    let Some(ds) = read(file) else {
        return USAGE;
    };
    let args = match (&pf.args, pf.training_flags.is_empty()) {
        (Some(path), _) => match args_file(path) {
            Some(a) => Some(a),
            None => return USAGE,
        },
        (None, false) => {
            let line: Vec<String> = pf.training_flags.iter().map(|w| shell_quote(w)).collect();
            Some(ArgsInput::Flags(SourceFile::new(
                "<command line>",
                line.join(" "),
            )))
        }
        (None, true) => None,
    };
    let opts = match options(flags, file, pf.hidden_size, pf.no_eval_data) {
        Ok(o) => o,
        Err(e) => {
            eprintln!("error: {e}");
            return USAGE;
        }
    };
    let report = lint::check(ds, args, &opts);
    if print(&report, flags.format, false).is_err() {
        return USAGE;
    }
    if flags.format == Format::Human {
        let names = match &report.args {
            Some(a) => format!("{} + {}", report.ds.name, a.name),
            None => report.ds.name.clone(),
        };
        eprintln!(
            "{names}: {}",
            super::check::summary_of(
                &report
                    .findings
                    .iter()
                    .map(|f| f.severity)
                    .collect::<Vec<_>>()
            )
        );
    }
    if report.has_errors() {
        FAILED
    } else {
        OK
    }
}

/// Where a value of the final config came from, for people.
fn origin_text(report: &lint::Report, origin: Option<&lint::stack::Origin>) -> String {
    use lint::stack::Origin;
    let at = |side: lint::Side, span: recipe::syntax::ast::Span| {
        let f = report.file(side);
        let (line, col) = f.line_col(span.start);
        format!("{}:{line}:{col}", f.name)
    };
    match origin {
        Some(Origin::Written(span)) => format!("written ({})", at(lint::Side::DeepSpeed, *span)),
        None => "written".into(),
        Some(Origin::Filled { by, from, given }) => match given {
            Some(span) => format!(
                "\"auto\", {by} fills it from {from} ({})",
                at(lint::Side::Args, *span)
            ),
            None if from.parse::<f64>().is_ok() => format!("\"auto\", {by} fills it with {from}"),
            None if from.chars().all(|c| c.is_ascii_lowercase() || c == '_') => {
                format!("\"auto\", {by} fills it from {from} (its default)")
            }
            None => format!("\"auto\", {by} fills it from {from}"),
        },
        Some(Origin::Inserted { by }) => format!("not in the file: {by} inserts it"),
        Some(Origin::Overwritten { by }) => format!("written, but {by} overwrites it"),
    }
}

/// `recipe explain ds_config.json --args …`: the config DeepSpeed receives, value by value,
/// with where each came from.
pub fn explain(
    file: &Path,
    args: Option<&PathBuf>,
    hidden_size: Option<u64>,
    key: Option<&str>,
    flags: &RecipeFlags,
) -> i32 {
    let Some(ds) = read(file) else {
        return USAGE;
    };
    let args = match args.map(|p| args_file(p)) {
        Some(None) => return USAGE,
        Some(a) => a,
        None => None,
    };
    let opts = match options(flags, file, hidden_size, false) {
        Ok(o) => o,
        Err(e) => {
            eprintln!("error: {e}");
            return USAGE;
        }
    };
    let report = lint::check(ds, args, &opts);
    let Some(outcome) = &report.outcome else {
        // Not JSON: the findings say why.
        let _ = print(&report, Format::Human, false);
        return FAILED;
    };
    let rows: Vec<(String, String, String)> = outcome
        .config
        .leaves()
        .into_iter()
        .filter(|(k, _)| key.is_none_or(|want| k == want || k.starts_with(&format!("{want}."))))
        .map(|(k, v)| {
            let origin = origin_text(&report, outcome.origins.get(&k));
            (k, v.show(), origin)
        })
        .collect();
    if rows.is_empty() {
        if let Some(want) = key {
            eprintln!("error: the final config has no `{want}`");
            return FAILED;
        }
    }
    match flags.format {
        Format::Json => {
            let items: Vec<serde_json::Value> = rows
                .iter()
                .map(|(k, _, o)| {
                    let value = outcome
                        .config
                        .at(k)
                        .map(|v| v.to_json())
                        .unwrap_or_default();
                    serde_json::json!({ "key": k, "value": value, "from": o })
                })
                .collect();
            println!("{}", serde_json::Value::Array(items));
        }
        Format::Human => {
            let names = match &report.args {
                Some(a) => format!("{} + {}", report.ds.name, a.name),
                None => format!("{} (TrainingArguments at their defaults)", report.ds.name),
            };
            println!(
                "The DeepSpeed config DeepSpeed receives from {names}, at {} process(es):",
                opts.world
            );
            let kw = rows.iter().map(|r| r.0.len()).max().unwrap_or(0).min(48);
            let vw = rows.iter().map(|r| r.1.len()).max().unwrap_or(0).min(16);
            for (k, v, o) in &rows {
                println!("  {k:<kw$}  {v:<vw$}  {o}");
            }
            let errors = report
                .findings
                .iter()
                .filter(|f| f.severity == recipe::Severity::Error)
                .count();
            let warnings = report.findings.len() - errors;
            if errors + warnings > 0 {
                println!(
                    "{errors} error(s), {warnings} other finding(s): `recipe check {}` shows them",
                    report.ds.name
                );
            }
        }
    }
    OK
}
