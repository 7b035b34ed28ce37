//! `recipe check ds_config.json [--args training_args.json | -- <flags>]`: the pair linter.

use std::io::Write;
use std::path::{Path, PathBuf};

use recipe::diagnostics::{render_human_with, to_json_with};
use recipe::pair::{self as lint, ArgsInput, Options};
use recipe::upstream::versions::Targets;
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
    let mut targets = Targets::newest();
    for (lib, v) in &options.targets {
        targets.set(*lib, *v);
    }
    Ok(Options {
        world: flags.gpus.unwrap_or(1) * flags.nodes.unwrap_or(1),
        samples: flags.samples,
        hidden_size,
        has_eval: no_eval_data.then_some(false),
        targets,
    })
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
        (Some(path), _) => {
            let Some(f) = read(path) else {
                return USAGE;
            };
            Some(if is_pair_file(path) {
                ArgsInput::Json(f)
            } else {
                ArgsInput::Flags(f)
            })
        }
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
