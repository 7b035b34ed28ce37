//! Command-line interface: argument parsing and the subcommands.
//!
//! Exit codes: 0 ok, 1 the recipe has errors (or `fmt --check` found work), 2 usage or I/O error.

mod check;
mod fmt;

use std::io::IsTerminal;
use std::path::{Path, PathBuf};

use clap::{Parser, Subcommand, ValueEnum};
use recipe::diagnostic::Style;
use recipe::SourceFile;

/// Exit code: success.
pub const OK: i32 = 0;
/// Exit code: the recipe has errors.
pub const FAILED: i32 = 1;
/// Exit code: bad usage or an I/O error.
pub const USAGE: i32 = 2;

#[derive(Parser)]
#[command(
    name = "recipe",
    version,
    about = "Check training recipes and compile them to DeepSpeed + HF configs or a native plan",
    propagate_version = true
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Parse and check recipes; exit 1 if any has errors.
    Check {
        /// Recipe files (`-` reads standard input).
        #[arg(required = true)]
        files: Vec<PathBuf>,
        /// Output: human (diagnostics on stderr) or json (one object per line on stdout).
        #[arg(long, value_enum, default_value_t = Format::Human)]
        format: Format,
    },
    /// Rewrite recipes in canonical layout, keeping comments.
    Fmt {
        /// Recipe files (`-` formats standard input to standard output).
        #[arg(required = true)]
        files: Vec<PathBuf>,
        /// Change nothing; exit 1 if any file is not formatted.
        #[arg(long)]
        check: bool,
    },
    /// (not built yet) Every resolved value, where it came from, step accounting, memory.
    Explain {
        /// Recipe file.
        file: PathBuf,
    },
    /// (not built yet) Optimizer steps per epoch and the micro-batch timeline.
    Steps {
        /// Recipe file.
        file: PathBuf,
    },
    /// (not built yet) Write ds_config.json, training_args.json, launch.sh and recipe.lock.
    Build {
        /// Recipe file.
        file: PathBuf,
    },
    /// (not built yet) Train natively on CPU or CUDA.
    Run {
        /// Recipe file or plan.json.
        file: PathBuf,
    },
    /// (not built yet) Turn a DeepSpeed config (+ TrainingArguments) into a recipe.
    Import {
        /// ds_config.json.
        file: PathBuf,
    },
}

/// Output format of `check`.
#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Format {
    /// miette's graphical report on stderr.
    Human,
    /// One JSON object per diagnostic per line on stdout (docs/diagnostics-json.md).
    Json,
}

/// Parses the arguments, runs the command, returns the exit code.
pub fn main() -> i32 {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            let _ = e.print();
            return if e.use_stderr() { USAGE } else { OK };
        }
    };
    match cli.command {
        Command::Check { files, format } => check::run(&files, format),
        Command::Fmt { files, check } => fmt::run(&files, check),
        Command::Explain { .. } => not_built("explain", 3),
        Command::Steps { .. } => not_built("steps", 3),
        Command::Build { .. } => not_built("build", 4),
        Command::Run { .. } => not_built("run", 5),
        Command::Import { .. } => not_built("import", 4),
    }
}

fn not_built(command: &str, issue: u32) -> i32 {
    eprintln!(
        "error: `recipe {command}` is not built yet (planned in issue #{issue}); `recipe check` and `recipe fmt` work today"
    );
    USAGE
}

/// Reads a recipe file (or standard input for `-`); prints the error on failure.
pub fn read(path: &Path) -> Option<SourceFile> {
    SourceFile::read(path)
        .map_err(|e| eprintln!("error: {e}"))
        .ok()
}

/// Colours when stderr is a terminal and NO_COLOR is unset.
pub fn style() -> Style {
    if std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none() {
        Style::Color
    } else {
        Style::Plain
    }
}
