//! Command-line interface: argument parsing and the subcommands.
//!
//! Exit codes: 0 ok, 1 the input has errors (or the command found what it reports: `fmt --check`
//! a file to format, `steps` a divergence, `diff` a difference), 2 usage or I/O error. Each
//! command's table, and every file and JSON it writes: docs/outputs.md.

mod build;
mod check;
mod diff;
mod explain;
mod fmt;
mod gpus;
mod import;
mod kernels;
mod lsp;
mod model_files;
mod pair;
mod profile;
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
/// Exit code: the input has errors, or the command found what it reports (docs/outputs.md).
pub const FAILED: i32 = 1;
/// Exit code: bad usage or an I/O error.
pub const USAGE: i32 = 2;

/// A count of at least 1 (`--gpus`, `--nodes`, `--samples`, …). clap's own range check would
/// say "0 is not in 1..18446744073709551615"; this says it as a person would.
pub fn positive(s: &str) -> Result<u64, String> {
    match whole(s)? {
        0 => Err("must be at least 1".into()),
        n => Ok(n),
    }
}

/// `--master`: `HOST:PORT` (an IPv6 host in brackets), a port from 1 to 65535.
pub fn master_addr(s: &str) -> Result<String, String> {
    let (host, port) = s
        .rsplit_once(':')
        .ok_or("must be HOST:PORT, e.g. node0.cluster:29500")?;
    if host.is_empty() {
        return Err("the host is missing: HOST:PORT, e.g. node0.cluster:29500".into());
    }
    match port.parse::<u16>() {
        Ok(p) if p > 0 => Ok(s.to_string()),
        _ => Err(format!(
            "`{port}` is not a port (1 to 65535): HOST:PORT, e.g. node0.cluster:29500"
        )),
    }
}

/// A whole number, 0 or more (`--debounce`).
pub fn whole(s: &str) -> Result<u64, String> {
    let t = s.trim();
    if t.starts_with('-') && t[1..].parse::<f64>().is_ok() {
        return Err("must not be negative".into());
    }
    t.parse::<u64>().map_err(|e| match e.kind() {
        std::num::IntErrorKind::PosOverflow => "is too large".into(),
        std::num::IntErrorKind::Empty => "expected a whole number, e.g. 4".into(),
        _ if t.parse::<f64>().is_ok() => "must be a whole number, e.g. 4".into(),
        _ => "expected a whole number, e.g. 4".into(),
    })
}

// What `--format` and `--target` mean differs by command: each command states its own (the
// `mut_arg` overrides below), and the commands that ignore `--format` hide it.

const FORMAT_CHECK: &str = "Output: `human`, each diagnostic drawn over its source and a \
    summary line per file, on stderr; `json`, one JSON object per diagnostic per line on stdout \
    and no summary (docs/diagnostics-json.md)";
const FORMAT_EXPLAIN: &str = "Output on stdout: `human`, the tables; `json`, the report as one \
    JSON object (with KEY: that setting's row; with a ds_config.json: one array of {key, value, \
    from}). The recipe's diagnostics go to stderr as text either way";
const FORMAT_STEPS: &str = "Output on stdout: `human`, the timelines; `json`, one JSON object \
    {timelines, native, skipped_steps}. The recipe's diagnostics and the divergence message go \
    to stderr as text either way";
const FORMAT_DIFF: &str = "Output on stdout: `human`, each changed key with its value before \
    and after; `json`, one JSON array of {key, before, after}";
const FORMAT_IMPORT: &str = "How the findings are printed, on stderr (the recipe itself always \
    goes to stdout): `human`, drawn over their source; `json`, one JSON object per line";
const IGNORED: &str = "Ignored: this command prints no report";

const TARGET_CHECK: &str = "A release to check against, LIB=VERSION (e.g. \
    `transformers=4.24.0`; repeatable; overrides the recipe's `target`), or, for a recipe, \
    `native`: also report what `recipe run` cannot train (R11xx)";
const TARGET_EXPLAIN: &str = "A release to resolve against, LIB=VERSION (e.g. \
    `transformers=4.24.0`; repeatable; overrides the recipe's `target`), or `native`: also \
    report what `recipe run` cannot train (R11xx)";
const TARGET_BUILD: &str = "What to write: `deepspeed` (the default: ds_config.json, \
    training_args.json, train.py, launch.sh, recipe.lock) or `native` (plan.json, for `recipe run`); or a \
    release to build for, LIB=VERSION (e.g. `transformers=4.24.0`; repeatable; overrides the \
    recipe's `target`)";
const TARGET_RUN: &str = "A release to resolve the recipe against, LIB=VERSION (e.g. \
    `deepspeed=0.14.0`; repeatable; overrides the recipe's `target`); the recipe is always \
    checked for the native runtime (R11xx). A saved plan.json runs as built and ignores this";
const TARGET_LSP: &str = "A release to check every document against, LIB=VERSION (e.g. \
    `transformers=4.24.0`; repeatable; overrides each recipe's `target`), or `native`: also \
    report what `recipe run` cannot train (R11xx)";
const TARGET_IMPORT: &str = "A release the pair is checked against and the recipe's `target` \
    line names, LIB=VERSION (e.g. `transformers=4.24.0`; repeatable; default: the newest \
    releases recipe knows), or `native`: also report what `recipe run` cannot train (R11xx)";

#[derive(Parser)]
#[command(
    name = "recipe",
    version,
    about = "Check training recipes and compile them to DeepSpeed + HF configs or a native plan",
    after_help = "Exit codes: 0 ok; 1 errors found (or what the command reports: a file to format, a \
                  divergence, a difference); 2 usage or I/O error. docs/outputs.md has each \
                  command's, and every file and JSON the commands write.",
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
    #[command(
        mut_arg("format", |a| a.help(FORMAT_CHECK)),
        mut_arg("target", |a| a.help(TARGET_CHECK))
    )]
    Check {
        /// Recipe files (`-` reads standard input), or one ds_config.json.
        #[arg(required = true)]
        files: Vec<PathBuf>,
        /// With a ds_config.json: the TrainingArguments, as a JSON file or as a file of
        /// command-line flags (a launch script: the flags after the training script count).
        #[arg(long, value_name = "FILE")]
        args: Option<PathBuf>,
        /// With a ds_config.json: the model's hidden size, for the ZeRO "auto" bucket sizes.
        #[arg(long, value_name = "N", value_parser = positive)]
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
    #[command(
        mut_arg("format", |a| a.help(FORMAT_EXPLAIN)),
        mut_arg("target", |a| a.help(TARGET_EXPLAIN))
    )]
    Explain {
        /// Recipe file.
        file: PathBuf,
        /// Show only this setting (e.g. `batch.global`).
        key: Option<String>,
        /// Write the LR of every optimizer step (HF and DeepSpeed) to this CSV file.
        #[arg(long, value_name = "PATH")]
        lr_csv: Option<PathBuf>,
        /// Draw the LR of every optimizer step as HF and as DeepSpeed would run it, with the
        /// epoch ends and the steps where they disagree marked, to this SVG file.
        #[arg(long, value_name = "FILE.svg")]
        plot: Option<PathBuf>,
        /// One table row per setting with every column, however wide (by default the settings
        /// are grouped by block and fitted to COLUMNS, the terminal, or 100 columns).
        #[arg(long)]
        wide: bool,
        /// With a ds_config.json: its TrainingArguments (JSON, or a file of flags); explain then
        /// shows the config DeepSpeed receives and where each value came from.
        #[arg(long, value_name = "FILE")]
        args: Option<PathBuf>,
        /// With a ds_config.json: the model's hidden size, for the ZeRO "auto" bucket sizes.
        #[arg(long, value_name = "N", value_parser = positive)]
        hidden_size: Option<u64>,
        #[command(flatten)]
        flags: RecipeFlags,
    },
    /// The micro-batch timeline: where HF and DeepSpeed take optimizer steps; exit 1 if they differ.
    #[command(
        mut_arg("format", |a| a.help(FORMAT_STEPS)),
        mut_arg("target", |a| a.help(TARGET_EXPLAIN))
    )]
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
        /// Draw the optimizer steps HF and DeepSpeed have taken after every micro-batch, with the
        /// epoch ends and the micro-batches where they step differently marked, to this SVG file.
        #[arg(long, value_name = "FILE.svg")]
        plot: Option<PathBuf>,
        #[command(flatten)]
        flags: RecipeFlags,
    },
    /// Write ds_config.json, training_args.json, train.py, launch.sh and recipe.lock for the targets
    /// (`--target native`: plan.json for `recipe run`).
    #[command(
        mut_arg("format", |a| a.help(IGNORED).hide(true)),
        mut_arg("target", |a| a.help(TARGET_BUILD))
    )]
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
    /// Compare two recipe.lock files: what changed and where each value came from; exit 1 if
    /// any value differs.
    Diff {
        /// The first lock.
        a: PathBuf,
        /// The second lock.
        b: PathBuf,
        #[arg(long, value_enum, default_value_t = Format::Human, help = FORMAT_DIFF)]
        format: Format,
    },
    /// Train natively: a recipe (compiled to a plan first) or a saved plan.json.
    #[command(
        mut_arg("format", |a| a.help(IGNORED).hide(true)),
        mut_arg("target", |a| a.help(TARGET_RUN))
    )]
    Run {
        /// Recipe file or plan.json.
        file: PathBuf,
        /// Where to train: the CPU reference backend (the default; a run left there on a
        /// machine whose GPUs could train says so), one CUDA GPU (docs/cuda.md), or auto (CUDA
        /// when a driver, a GPU, NVRTC and cuBLAS are all there).
        #[arg(long, value_enum)]
        device: Option<Device>,
        /// Continue from a checkpoint directory written by an earlier run.
        #[arg(long, value_name = "DIR")]
        resume: Option<PathBuf>,
        /// Stop (with a checkpoint) after this many optimizer steps, to resume later.
        #[arg(long, value_name = "N", value_parser = positive)]
        stop_after: Option<u64>,
        /// No progress bar (metrics still go to the metrics file).
        #[arg(long)]
        quiet: bool,
        /// Time every operation on the GPU (CUDA events around each kernel, GEMM, copy and
        /// NCCL call) and write the totals to profile.json in the output directory, with a
        /// table on stderr; slows the run a little (docs/cuda.md, "Profiling").
        #[arg(long)]
        profile: bool,
        /// In a run over several nodes (--nodes N, or cluster.nodes): this node, 0..N. Start the
        /// same recipe or plan on every node with its own --node-rank and the same --master
        /// (docs/runtime.md, "Several nodes").
        #[arg(long, value_name = "K")]
        node_rank: Option<usize>,
        /// With --node-rank: node 0's address as every node reaches it; node 0 listens on PORT
        /// (default: the recipe's cluster.master_addr and master_port).
        #[arg(long, value_name = "HOST:PORT", requires = "node_rank", value_parser = master_addr)]
        master: Option<String>,
        #[command(flatten)]
        flags: RecipeFlags,
    },
    /// Compile the CUDA kernels with NVRTC (no GPU needed) and report each kernel's registers,
    /// shared memory, stack and spills; exit 1 on a compile error or a spill (a spill only warns
    /// with --selftest or --gemm-candidates) (docs/cuda.md).
    Kernels {
        /// A GPU architecture, sm_XY (repeatable; default sm_80 and sm_90).
        #[arg(long = "arch", value_name = "sm_XY", value_parser = kernels::arch)]
        arch: Vec<String>,
        /// Write kernels.<arch>.ptx and kernels.<arch>.cubin into this directory.
        #[arg(long, value_name = "DIR")]
        out: Option<PathBuf>,
        /// On GPU 0: run every operation there and on the CPU backend and compare them, in fp32,
        /// fp16 and bf16 storage (with --out, also selftest.json); exit 1 on a difference beyond
        /// the tolerance.
        #[arg(long)]
        selftest: bool,
        /// On GPU 0: time up to N of cuBLASLt's algorithms for each of BERT-base's training
        /// GEMMs (32 × 128 tokens, bf16) against the one a run takes, the heuristic's first
        /// (with --out, also gemm-candidates.json; docs/cuda.md, "GEMMs").
        #[arg(long, value_name = "N")]
        gemm_candidates: Option<usize>,
    },
    /// Run the language server on stdin/stdout, for editors (docs/editors.md).
    #[command(
        mut_arg("format", |a| a.help(IGNORED).hide(true)),
        mut_arg("target", |a| a.help(TARGET_LSP))
    )]
    Lsp {
        /// Accepted for clients that pass it (stdio is the only transport).
        #[arg(long)]
        stdio: bool,
        /// Milliseconds the editor must be quiet before diagnostics are published.
        #[arg(long, value_name = "MS", default_value_t = 150, value_parser = whole)]
        debounce: u64,
        #[command(flatten)]
        flags: RecipeFlags,
    },
    /// Turn a DeepSpeed config (+ TrainingArguments) into a recipe on stdout, and check it.
    #[command(
        mut_arg("format", |a| a.help(FORMAT_IMPORT)),
        mut_arg("target", |a| a.help(TARGET_IMPORT))
    )]
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
        #[arg(long, value_name = "N", value_parser = positive)]
        labels: Option<u64>,
        /// The model's hidden size, for the config's "auto" ZeRO sizes (HF computes them from
        /// the model; a local --model directory's config.json says it too).
        #[arg(long, value_name = "N", value_parser = positive)]
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
    /// One CUDA GPU through cudarc.
    Cuda,
    /// CUDA when a driver and a GPU exist, else the CPU.
    Auto,
}

/// The flags every recipe command takes.
#[derive(clap::Args, Clone)]
pub struct RecipeFlags {
    /// GPUs per node (overrides `cluster.gpus`).
    #[arg(long, value_name = "N", value_parser = positive)]
    pub gpus: Option<u64>,
    /// Nodes (overrides `cluster.nodes`).
    #[arg(long, value_name = "M", value_parser = positive)]
    pub nodes: Option<u64>,
    /// Training examples, instead of counting the training file's rows.
    #[arg(long, value_name = "N", value_parser = positive)]
    pub samples: Option<u64>,
    /// A release, LIB=VERSION (repeatable; overrides the recipe's `target`). Each command
    /// states its own meaning, and what else it takes (`native`, `deepspeed`).
    #[arg(long, value_name = "LIB=VERSION")]
    pub target: Vec<String>,
    /// Any recipe item, e.g. `batch.micro=8` (repeatable).
    #[arg(long = "set", value_name = "BLOCK.KEY=VALUE")]
    pub set: Vec<String>,
    /// Output: human or json (each command states where each goes).
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

/// The `--format` of `check`, `explain`, `steps`, `diff` and `import`: where each goes is the
/// command's (its `--help`, docs/outputs.md).
#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Format {
    /// For people.
    Human,
    /// For programs.
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
    // So is the compiled CUDA kernel program (backend/cuda/kernel_cache.rs).
    if std::env::var_os("RECIPE_KERNEL_CACHE").is_none_or(|v| v != "0") {
        recipe_runtime::backend::cuda::kernel_cache::enable(
            model_files::cache_root().join("kernels"),
        );
    }
    // And the GEMM algorithms RECIPE_GEMM_ALGO=fastest chose (backend/cuda/gemm_choice.rs).
    recipe_runtime::backend::cuda::gemm_choice::enable(model_files::cache_root().join("gemms"));
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
            plot,
            wide,
            args,
            hidden_size,
            flags,
        } => {
            if pair::is_pair_file(&file) {
                if lr_csv.is_some() || plot.is_some() {
                    eprintln!("error: --lr-csv and --plot go with a recipe (a pair's schedule is not modelled by explain yet)");
                    return USAGE;
                }
                pair::explain(&file, args.as_ref(), hidden_size, key.as_deref(), &flags)
            } else if args.is_some() || hidden_size.is_some() {
                eprintln!("error: --args and --hidden-size go with a ds_config.json, not a recipe");
                USAGE
            } else {
                explain::run(
                    &file,
                    key.as_deref(),
                    explain::Files {
                        lr_csv: lr_csv.as_deref(),
                        plot: plot.as_deref(),
                        layout: explain::Layout::detect(wide),
                    },
                    &flags,
                )
            }
        }
        Command::Steps {
            file,
            versions,
            all,
            plot,
            flags,
        } => steps::run(&file, &versions, all, plot.as_deref(), &flags),
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
            profile,
            node_rank,
            master,
            flags,
        } => {
            let node = node_rank.map(|rank| run::Node { rank, master });
            let opts = run::Options {
                resume: resume.as_deref(),
                stop_after,
                quiet,
                profile,
                node,
            };
            run::run(&file, device, opts, &flags)
        }
        Command::Kernels {
            arch,
            out,
            selftest,
            gemm_candidates,
        } => kernels::run(&arch, out.as_deref(), (selftest, gemm_candidates)),
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
    load_except(path, flags, &[])
}

/// [`load`], leaving out the diagnostics whose codes are in `moot`: rules about something the
/// command does not do (`recipe run` starts its ranks itself: no launcher reads a hostfile).
pub fn load_except(
    path: &Path,
    flags: &RecipeFlags,
    moot: &[&str],
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
    for d in checked
        .diagnostics
        .iter()
        .filter(|d| !moot.contains(&d.code))
    {
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
