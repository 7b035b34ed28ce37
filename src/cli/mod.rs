//! Command-line interface: argument parsing and the subcommands.
//!
//! Exit codes: 0 ok, 1 the recipe has errors (or `fmt --check` found work), 2 usage or I/O error.

mod build;
mod check;
mod diff;
mod explain;
mod fmt;
mod import;
mod lsp;
mod model_files;
mod pair;
mod run;
mod steps;
mod verify;

use std::io::IsTerminal;
use std::path::{Path, PathBuf};

use clap::{Parser, Subcommand, ValueEnum};
use recipe::diagnostics::Style;
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
    /// Parse and check recipes, or an existing DeepSpeed config with its TrainingArguments
    /// (`recipe check ds_config.json --args training_args.json`, or `-- --learning_rate …`);
    /// exit 1 if any has errors.
    Check {
        /// Recipe files (`-` reads standard input), or one ds_config.json.
        #[arg(required = true)]
        files: Vec<PathBuf>,
        /// With a ds_config.json: the TrainingArguments, as a JSON file or as a file of
        /// command-line flags (a launch script: the flags after the training script count).
        #[arg(long, value_name = "FILE")]
        args: Option<PathBuf>,
        /// With a ds_config.json: the model's hidden size, for the ZeRO "auto" bucket sizes.
        #[arg(long, value_name = "N")]
        hidden_size: Option<u64>,
        /// With a ds_config.json: the script passes no evaluation dataset (the Trainer then
        /// refuses any eval_strategy but "no").
        #[arg(long)]
        no_eval_data: bool,
        #[command(flatten)]
        flags: RecipeFlags,
        /// With a ds_config.json: TrainingArguments flags, as the launch command writes them.
        #[arg(last = true, value_name = "TRAINING_ARGUMENTS")]
        training_flags: Vec<String>,
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
    /// Every resolved value and where it came from; step accounting; LR per step; memory.
    Explain {
        /// Recipe file.
        file: PathBuf,
        /// Show only this setting (e.g. `batch.global`).
        key: Option<String>,
        /// Write the LR of every optimizer step (HF and DeepSpeed) to this CSV file.
        #[arg(long, value_name = "PATH")]
        lr_csv: Option<PathBuf>,
        /// With a ds_config.json: its TrainingArguments (JSON, or a file of flags); explain then
        /// shows the config DeepSpeed receives and where each value came from.
        #[arg(long, value_name = "FILE")]
        args: Option<PathBuf>,
        /// With a ds_config.json: the model's hidden size, for the ZeRO "auto" bucket sizes.
        #[arg(long, value_name = "N")]
        hidden_size: Option<u64>,
        #[command(flatten)]
        flags: RecipeFlags,
    },
    /// The micro-batch timeline: where HF and DeepSpeed take optimizer steps; exit 1 if they differ.
    Steps {
        /// Recipe file.
        file: PathBuf,
        /// Also show the timeline for other versions, e.g. `transformers=4.24.0,accelerate=1.7.0`
        /// (repeatable).
        #[arg(long, value_name = "LIB=VERSION,...")]
        versions: Vec<String>,
        /// Print every micro-batch (default: the first window, epoch ends and disagreements).
        #[arg(long)]
        all: bool,
        #[command(flatten)]
        flags: RecipeFlags,
    },
    /// Write ds_config.json, training_args.json, launch.sh and recipe.lock for the targets
    /// (`--target native`: plan.json for `recipe run`).
    Build {
        /// Recipe file.
        file: PathBuf,
        /// Output directory (default: build/<recipe name>).
        #[arg(short = 'o', long = "out", value_name = "DIR")]
        out: Option<PathBuf>,
        /// Write "auto" exactly where HF/accelerate fill the DeepSpeed key, instead of the value.
        #[arg(long)]
        auto: bool,
        #[command(flatten)]
        flags: RecipeFlags,
    },
    /// Run every recipe in DIR through the real transformers / accelerate / DeepSpeed of your
    /// Python (RECIPE_PYTHON, else python3) and compare with what recipe emits and predicts.
    Verify {
        /// A directory of recipes.
        dir: PathBuf,
    },
    /// Compare two recipe.lock files: what changed and where each value came from.
    Diff {
        /// The first lock.
        a: PathBuf,
        /// The second lock.
        b: PathBuf,
        /// Output: human or json.
        #[arg(long, value_enum, default_value_t = Format::Human)]
        format: Format,
    },
    /// Train natively: a recipe (compiled to a plan first) or a saved plan.json.
    Run {
        /// Recipe file or plan.json.
        file: PathBuf,
        /// Where to train: the CPU reference backend, or CUDA (not built yet).
        #[arg(long, value_enum, default_value_t = Device::Cpu)]
        device: Device,
        /// Continue from a checkpoint directory written by an earlier run.
        #[arg(long, value_name = "DIR")]
        resume: Option<PathBuf>,
        /// Stop (with a checkpoint) after this many optimizer steps, to resume later.
        #[arg(long, value_name = "N")]
        stop_after: Option<u64>,
        /// No progress bar (metrics still go to the metrics file).
        #[arg(long)]
        quiet: bool,
        #[command(flatten)]
        flags: RecipeFlags,
    },
    /// Run the language server on stdin/stdout, for editors (docs/editors.md).
    Lsp {
        /// Accepted for clients that pass it (stdio is the only transport).
        #[arg(long)]
        stdio: bool,
        /// Milliseconds the editor must be quiet before diagnostics are published.
        #[arg(long, value_name = "MS", default_value_t = 150)]
        debounce: u64,
        #[command(flatten)]
        flags: RecipeFlags,
    },
    /// Turn a DeepSpeed config (+ TrainingArguments) into a recipe on stdout, and check it.
    Import {
        /// ds_config.json.
        file: PathBuf,
        /// The TrainingArguments that go with it (JSON), for its "auto" values.
        #[arg(long, value_name = "training_args.json")]
        args: Option<PathBuf>,
        /// The model (hub id or directory); the configs do not say.
        #[arg(long)]
        model: Option<String>,
        /// The training file; the configs do not say.
        #[arg(long)]
        train: Option<String>,
        /// The evaluation file, if any.
        #[arg(long)]
        eval: Option<String>,
        /// Number of classes of the classifier.
        #[arg(long)]
        labels: Option<u64>,
        /// The model's hidden size, for the config's "auto" ZeRO sizes (HF computes them from
        /// the model; a local --model directory's config.json says it too).
        #[arg(long, value_name = "N")]
        hidden_size: Option<u64>,
        /// Write a recipe even for a pair the real stack refuses, marked where it conflicts.
        #[arg(long)]
        force: bool,
        #[command(flatten)]
        flags: RecipeFlags,
    },
}

/// Where `recipe run` trains.
#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Device {
    /// The CPU reference backend.
    Cpu,
    /// CUDA through cudarc (not built yet).
    Cuda,
}

/// The flags every recipe command takes.
#[derive(clap::Args, Clone)]
pub struct RecipeFlags {
    /// GPUs per node (overrides `cluster.gpus`).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    pub gpus: Option<u64>,
    /// Nodes (overrides `cluster.nodes`).
    #[arg(long, value_name = "M", value_parser = clap::value_parser!(u64).range(1..))]
    pub nodes: Option<u64>,
    /// Training examples, instead of counting the training file's rows.
    #[arg(long, value_name = "N")]
    pub samples: Option<u64>,
    /// Target version, e.g. `transformers=4.24.0` (repeatable; overrides `target`); for
    /// `build`, also `native` (plan.json) or `deepspeed` (the default).
    #[arg(long, value_name = "LIB=VERSION")]
    pub target: Vec<String>,
    /// Any recipe item, e.g. `batch.micro=8` (repeatable).
    #[arg(long = "set", value_name = "BLOCK.KEY=VALUE")]
    pub set: Vec<String>,
    /// Output: human (on stderr) or json (on stdout).
    #[arg(long, value_enum, default_value_t = Format::Human)]
    pub format: Format,
    /// Set by `build`, which reads `--target native|deepspeed` itself.
    #[arg(skip)]
    pub build_target_allowed: bool,
}

/// What `recipe build --target …` can write.
pub const BUILD_TARGETS: &[&str] = &["native", "deepspeed"];

impl RecipeFlags {
    /// The resolution options for a recipe at `path`; a bad flag is a usage error.
    pub fn options(&self, path: &Path) -> Result<recipe::resolve::Options, String> {
        let mut targets = Vec::new();
        for t in &self.target {
            // `native` adds the native runtime's refusals to any check; `deepspeed` only
            // selects what `recipe build` writes.
            if t == "native" || (t == "deepspeed" && self.build_target_allowed) {
                continue;
            }
            if BUILD_TARGETS.contains(&t.as_str()) {
                return Err(format!(
                    "`--target {t}` selects what `recipe build` writes; here --target takes LIB=VERSION or native"
                ));
            }
            let (lib, version) = t.split_once('=').ok_or_else(|| {
                format!("`--target {t}`: expected LIB=VERSION, e.g. transformers=4.24.0")
            })?;
            let lib = recipe::upstream::versions::Library::ALL
                .into_iter()
                .find(|l| l.key() == lib.trim())
                .ok_or_else(|| {
                    format!(
                        "`--target {t}`: the libraries are transformers, accelerate and deepspeed"
                    )
                })?;
            let version = version
                .parse()
                .map_err(|e| format!("`--target {t}`: {e}"))?;
            targets.push((lib, version));
        }
        let sets = self
            .set
            .iter()
            .map(|s| recipe::resolve::overrides::parse(s))
            .collect::<Result<Vec<_>, _>>()?;
        let base_dir = if path.as_os_str() == "-" {
            None
        } else {
            // `tiny.rcp` has the parent "", which is the working directory.
            Some(
                path.parent()
                    .filter(|p| !p.as_os_str().is_empty())
                    .map_or_else(|| PathBuf::from("."), Path::to_path_buf),
            )
        };
        Ok(recipe::resolve::Options {
            gpus: self.gpus,
            nodes: self.nodes,
            samples: self.samples,
            targets,
            sets,
            base_dir,
            native: self.target.iter().any(|t| t == "native"),
        })
    }
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
    // Clean data-file scans are remembered across runs (resolve::scan_cache).
    if std::env::var_os("RECIPE_SCAN_CACHE").is_none_or(|v| v != "0") {
        recipe::resolve::scan_cache::enable(model_files::cache_root().join("scans"));
    }
    match cli.command {
        Command::Check {
            files,
            args,
            hidden_size,
            no_eval_data,
            flags,
            training_flags,
        } => {
            if files.iter().any(|f| pair::is_pair_file(f)) {
                pair::run(
                    &files,
                    pair::PairFlags {
                        args,
                        hidden_size,
                        no_eval_data,
                        training_flags,
                    },
                    &flags,
                )
            } else if args.is_some()
                || hidden_size.is_some()
                || no_eval_data
                || !training_flags.is_empty()
            {
                eprintln!(
                    "error: --args, --hidden-size, --no-eval-data and `-- flags` go with a ds_config.json, not a recipe"
                );
                USAGE
            } else {
                check::run(&files, &flags)
            }
        }
        Command::Fmt { files, check } => fmt::run(&files, check),
        Command::Explain {
            file,
            key,
            lr_csv,
            args,
            hidden_size,
            flags,
        } => {
            if pair::is_pair_file(&file) {
                if lr_csv.is_some() {
                    eprintln!("error: --lr-csv goes with a recipe (a pair's schedule is not modelled by explain yet)");
                    return USAGE;
                }
                pair::explain(&file, args.as_ref(), hidden_size, key.as_deref(), &flags)
            } else if args.is_some() || hidden_size.is_some() {
                eprintln!("error: --args and --hidden-size go with a ds_config.json, not a recipe");
                USAGE
            } else {
                explain::run(&file, key.as_deref(), lr_csv.as_ref(), &flags)
            }
        }
        Command::Steps {
            file,
            versions,
            all,
            flags,
        } => steps::run(&file, &versions, all, &flags),
        Command::Build {
            file,
            out,
            auto,
            flags,
        } => {
            let mut flags = flags;
            flags.build_target_allowed = true;
            build::run(&file, out.as_ref(), auto, &flags)
        }
        Command::Diff { a, b, format } => diff::run(&a, &b, format),
        Command::Verify { dir } => verify::run(&dir),
        Command::Run {
            file,
            device,
            resume,
            stop_after,
            quiet,
            flags,
        } => run::run(&file, device, resume.as_deref(), stop_after, quiet, &flags),
        Command::Lsp {
            stdio: _,
            debounce,
            flags,
        } => lsp::run(debounce, &flags),
        Command::Import {
            file,
            args,
            model,
            train,
            eval,
            labels,
            hidden_size,
            force,
            flags,
        } => import::run(
            &file,
            args.as_ref(),
            import::Given {
                model,
                train,
                eval,
                labels,
                hidden_size,
            },
            force,
            &flags,
        ),
    }
}

/// Reads a recipe file (or standard input for `-`); prints the error on failure.
pub fn read(path: &Path) -> Option<SourceFile> {
    SourceFile::read(path)
        .map_err(|e| eprintln!("error: {e}"))
        .ok()
}

/// Reads, checks and resolves a recipe for the commands that need it resolved. Diagnostics go
/// to stderr. A recipe that does not parse or breaks the schema (exit 1), or a bad flag or file
/// (exit 2), stops here; errors of the upstream rules do not: `explain` and `steps` exist to
/// show them.
pub fn load(
    path: &Path,
    flags: &RecipeFlags,
) -> Result<
    (
        SourceFile,
        recipe::resolve::Resolved,
        recipe::resolve::Options,
    ),
    i32,
> {
    let file = read(path).ok_or(USAGE)?;
    let options = flags.options(path).map_err(|e| {
        eprintln!("error: {e}");
        USAGE
    })?;
    let checked = recipe::check::check_source_with(&file.text, &options);
    for d in &checked.diagnostics {
        eprint!("{}", recipe::diagnostics::render_human(d, &file, style()));
    }
    let blocking = checked
        .diagnostics
        .iter()
        .any(|d| d.is_error() && d.code < recipe::rules::FIRST_RULE_CODE);
    let Some(parsed) = checked.file.filter(|_| !blocking) else {
        eprintln!("{}: has errors; fix them first", file.name);
        return Err(FAILED);
    };
    let resolved = recipe::resolve::resolve(&parsed, &options);
    Ok((file, resolved, options))
}

/// Colours when stderr is a terminal and NO_COLOR is unset.
pub fn style() -> Style {
    if std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none() {
        Style::Color
    } else {
        Style::Plain
    }
}
