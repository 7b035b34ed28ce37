//! `recipe run FILE [--device cpu|cuda] [--resume DIR]`: compiles a recipe to a plan (or reads a
//! saved `plan.json`) and trains it with the native runtime.

use std::path::Path;

use recipe_runtime::plan::{ModelSource, Plan};
use recipe_runtime::train::{self, NodeOptions, RunOptions};

use super::{load_except, profile, Device, RecipeFlags, FAILED, OK, USAGE};

/// `--node-rank K` and `--master HOST:PORT` as given.
pub struct Node {
    pub rank: usize,
    pub master: Option<String>,
}

/// `recipe run`'s options besides the file, the device and the recipe flags.
pub struct Options<'a> {
    pub resume: Option<&'a Path>,
    pub stop_after: Option<u64>,
    pub quiet: bool,
    /// Time every GPU operation and write `profile.json` (docs/cuda.md, "Profiling").
    pub profile: bool,
    pub node: Option<Node>,
}

pub fn run(file: &Path, device: Option<Device>, opts: Options<'_>, flags: &RecipeFlags) -> i32 {
    let Options {
        resume,
        stop_after,
        quiet,
        profile,
        node,
    } = opts;
    let given = device.is_some();
    let device = device.unwrap_or(Device::Cpu);
    // The devices' peak for the MFU the run reports, where their own is not known.
    let peak_tflops = match std::env::var_os(recipe_runtime::flops::PEAK_ENV) {
        Some(text) => match recipe_runtime::flops::parse_peak(&text.to_string_lossy()) {
            Ok(v) => Some(v),
            Err(e) => {
                eprintln!("error: {e}");
                return USAGE;
            }
        },
        None => None,
    };
    let want_gpu = match choose_device(device) {
        Ok(g) => g,
        Err(code) => return code,
    };
    if profile && !want_gpu {
        if device == Device::Cpu {
            eprintln!("error: --profile times the GPU's operations (CUDA events); this run trains on the CPU: pass --device cuda");
            return USAGE;
        }
        eprintln!("note: no GPU here, so --profile has nothing to time; training on the CPU");
    }
    let is_plan = file.extension().is_some_and(|e| e == "json");
    let mut resolved_recipe = None;
    let plan = if is_plan {
        if !flags.set.is_empty() || flags.gpus.is_some() || flags.nodes.is_some() {
            eprintln!("error: a saved plan is run as built; pass --set/--gpus/--nodes to `recipe build --target native` instead");
            return USAGE;
        }
        match Plan::read(file) {
            Ok(p) => p,
            Err(e) => {
                eprintln!("error: {e}");
                return USAGE;
            }
        }
    } else {
        // Checked for the native target: its refusals (R11xx) are reported with the rest.
        let mut flags = flags.clone();
        flags.target.push("native".into());
        // R1001 is about DeepSpeed's launcher (and launch-native.sh) reading /job/hostfile;
        // `recipe run` starts its own node's ranks and reads no hostfile.
        let moot = [recipe::rules::launch::HOSTFILE_DEFAULT];
        let (source, resolved, options) = match load_except(file, &flags, &moot) {
            Ok(loaded) => loaded,
            Err(code) => return code,
        };
        let checked = recipe::check::check_source_with(&source.text, &options);
        if checked.has_errors() {
            eprintln!("{}: has errors; not running", source.name);
            return FAILED;
        }
        let plan = match super::build::native_plan(&resolved, &source) {
            Ok(p) => p,
            Err(code) => return code,
        };
        resolved_recipe = Some(resolved);
        plan
    };
    // `--master`, else the recipe's.
    let node = match node {
        None => None,
        Some(n) => match n.master.or_else(|| plan.batch.master.clone()) {
            Some(master) => Some(NodeOptions {
                rank: n.rank,
                master,
                ..Default::default()
            }),
            None => {
                eprintln!("error: --node-rank needs node 0's address: --master HOST:PORT, or cluster.master_addr in the recipe");
                return USAGE;
            }
        },
    };
    if let Err(e) = train::local_ranks(&plan, node.as_ref()) {
        eprintln!("error: {e}");
        return USAGE;
    }
    let nodes = plan.batch.nodes.max(1);
    if nodes > 1 && node.is_none() && !quiet {
        eprintln!(
            "note: the plan's {} ranks over {nodes} nodes all run in this process; start it on each node with --node-rank K --master HOST:PORT to spread them (docs/runtime.md, \"Several nodes\")",
            plan.batch.world
        );
    }
    if !given && !quiet {
        say_gpus_here(&plan);
    }
    let mut node = node;
    let executors = if want_gpu {
        match super::gpus::open(&plan, device, node.as_mut()) {
            Ok(x) => x,
            Err(code) => return code,
        }
    } else {
        Vec::new()
    };
    if let (Some(x), None, false) = (executors.first(), peak_tflops, quiet) {
        let gpu = x.describe();
        if recipe_runtime::flops::device_peak(&gpu, plan.train.precision).is_none() {
            eprintln!(
                "note: no MFU: recipe does not know the dense peak of {gpu}; {}=TFLOPS gives one GPU's for this run's precision (docs/cuda.md)",
                recipe_runtime::flops::PEAK_ENV
            );
        }
    }
    let profiled = profile::start(profile && want_gpu, &executors);
    let node_rank = node.as_ref().map_or(0, |n| n.rank);
    let options = RunOptions {
        resume: resume.map(Path::to_path_buf),
        stop_after,
        progress: !quiet && std::io::IsTerminal::is_terminal(&std::io::stderr()),
        quiet,
        executors,
        node,
        peak_tflops,
    };
    match train::run(&plan, &options) {
        Ok(summary) => {
            if let Err(e) = profile::report(&profiled, &plan.train.output_dir, node_rank, quiet) {
                eprintln!("error: {e}");
                return FAILED;
            }
            if !quiet {
                eprintln!("{summary}");
                // Node 0's process reports the run; the others their share.
                let lead = summary.node.as_ref().is_none_or(|n| n.node == 0);
                if let Some(line) = resolved_recipe
                    .as_ref()
                    .filter(|_| lead)
                    .and_then(|r| estimate_line(r, &plan, plan.batch.world as usize))
                {
                    eprintln!("{line}");
                }
            }
            OK
        }
        Err(e) => {
            eprintln!("error: {e}");
            if e.is_not_built() {
                USAGE
            } else {
                FAILED
            }
        }
    }
}

/// `recipe explain`'s model-states estimate for the stage the run used, to print next to what
/// the ranks held (the estimate counts mixed-precision Adam).
fn estimate_line(r: &recipe::resolve::Resolved, plan: &Plan, ranks: usize) -> Option<String> {
    use recipe::rules::zero::{estimate, to_offload, Choice};
    use recipe::upstream::memory::ModelSize;
    // From the recipe's resolution, else from the config.json the run loaded (a hub model in
    // the cache, which `check` does not read).
    let size = match (r.uint("model.params"), r.uint("model.largest_layer")) {
        (Some(params), Some(largest_layer)) => ModelSize {
            params,
            largest_layer,
        },
        _ => {
            let config = match &plan.model.source {
                ModelSource::Pretrained { dir } => dir.join("config.json"),
                ModelSource::Config { config } => config.clone(),
            };
            let json = serde_json::from_str(&std::fs::read_to_string(config).ok()?).ok()?;
            recipe::resolve::files::config_size(&json, plan.model.labels.len() as u64)?
        }
    };
    let stage = plan.train.zero_stage;
    let e = estimate(
        r,
        Choice {
            stage,
            optimizer: to_offload(r.word("zero.offload optimizer")),
            param: to_offload(r.word("zero.offload param")),
        },
        size,
    )?;
    let basis = if plan.train.precision == recipe_runtime::plan::Precision::Fp32 {
        "DeepSpeed's mixed-precision accounting: fp16 weights and gradients, fp32 master, Adam moments; this run held fp32"
    } else {
        "DeepSpeed's mixed-precision accounting: half weights and gradients, fp32 master, Adam moments; docs/runtime.md compares"
    };
    Some(format!(
        "recipe explain's estimate for ZeRO-{stage} on {ranks} rank(s): {:.1} MiB per GPU ({basis})",
        e.per_gpu as f64 / (1024.0 * 1024.0)
    ))
}

/// A run on the CPU because `--device` was left out says so when this machine has everything a
/// GPU run needs (`cuda::require`): the CPU reference is the default, so that a run's numbers do
/// not change with the machine, but a recipe of several ranks (`--gpus N`) on a machine with GPUs
/// most likely meant them.
fn say_gpus_here(plan: &Plan) {
    if let Ok(p) = recipe_runtime::backend::cuda::require() {
        let ranks = plan.batch.world.max(1);
        eprintln!(
            "note: this machine has {} CUDA GPU(s) that could train; without --device the run's {ranks} rank(s) train on the CPU (the reference backend): --device cuda trains on them (docs/cuda.md)",
            p.devices
        );
    }
}

/// Settles `--device`: whether to train on a GPU. `cuda` without a driver, a GPU, NVRTC or
/// cuBLAS is a usage error naming what is missing; `auto` takes the GPU only when all are there,
/// and says what is missing where there is a driver.
fn choose_device(device: Device) -> Result<bool, i32> {
    use recipe_runtime::backend::cuda;
    match device {
        Device::Cpu => Ok(false),
        Device::Cuda => match cuda::require() {
            Ok(_) => Ok(true),
            Err(e) => {
                eprintln!("error: {e}");
                Err(USAGE)
            }
        },
        // A machine without a driver has no GPU to miss. One whose driver cannot run the
        // backend is told why: a run meant for its GPU would otherwise train on the CPU unnoticed.
        Device::Auto => match cuda::require() {
            Ok(_) => Ok(true),
            Err(cuda::CudaError::NoDriver) => Ok(false),
            Err(e) => {
                eprintln!("note: --device auto trains on the CPU: {e}");
                Ok(false)
            }
        },
    }
}
