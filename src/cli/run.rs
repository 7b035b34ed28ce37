//! `recipe run FILE [--device cpu|cuda] [--resume DIR]`: compiles a recipe to a plan (or reads a
//! saved `plan.json`) and trains it with the native runtime.

use std::path::Path;

use recipe_runtime::plan::{ModelSource, Plan};
use recipe_runtime::train::{self, NodeOptions, RunOptions};

use super::{load, Device, RecipeFlags, FAILED, OK, USAGE};

pub fn run(
    file: &Path,
    device: Device,
    resume: Option<&Path>,
    stop_after: Option<u64>,
    quiet: bool,
    node: Option<NodeOptions>,
    flags: &RecipeFlags,
) -> i32 {
    let want_gpu = match choose_device(device) {
        Ok(g) => g,
        Err(code) => return code,
    };
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
        let (source, resolved, options) = match load(file, &flags) {
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
    let executors = if want_gpu {
        match open_gpus(&plan, device, node.is_some()) {
            Ok(x) => x,
            Err(code) => return code,
        }
    } else {
        Vec::new()
    };
    let options = RunOptions {
        resume: resume.map(Path::to_path_buf),
        stop_after,
        progress: !quiet && std::io::IsTerminal::is_terminal(&std::io::stderr()),
        quiet,
        executors,
        node,
    };
    match train::run(&plan, &options) {
        Ok(summary) => {
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

/// Settles `--device`: whether to train on a GPU. `cuda` without a driver, a GPU, NVRTC or
/// cuBLAS is a usage error naming what is missing; `auto` takes the GPU only when all are there.
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
        Device::Auto => Ok(cuda::require().is_ok()),
    }
}

/// One device per rank of the plan (GPU r for rank r), each with the kernels compiled for it and
/// storing the plan's module dtype. A plan of more ranks than the machine has GPUs shares them
/// round-robin (rank r on GPU r mod N), with a note: the same numbers as one GPU per rank, for
/// checking a multi-GPU recipe on a smaller machine, not for speed. Under `auto` a GPU that
/// cannot be opened falls back to the CPU with a note.
fn open_gpus(
    plan: &Plan,
    device: Device,
    one_node: bool,
) -> Result<Vec<std::sync::Arc<dyn recipe_runtime::model::Executor>>, i32> {
    use recipe_runtime::backend::cuda::{self, CudaDevice};
    use recipe_runtime::backend::kernels::Kernels;
    use recipe_runtime::model::{Executor, OnDevice};
    // One node of several opens the GPUs of its own ranks.
    let world = if one_node {
        (plan.batch.world.max(1) / plan.batch.nodes.max(1)).max(1) as usize
    } else {
        plan.batch.world.max(1) as usize
    };
    let fail = |e: String| {
        if device == Device::Auto {
            eprintln!("note: {e}; training on the CPU");
            Ok(Vec::new())
        } else {
            eprintln!("error: {e}");
            Err(USAGE)
        }
    };
    let found = cuda::probe().devices.max(1);
    if world > found {
        eprintln!(
            "note: {world} ranks on {found} GPU(s): rank r runs on GPU r mod {found}, so the GPUs are shared (the same numbers as one GPU per rank, not the speed)"
        );
    }
    let store = plan.train.precision.module_dtype();
    let mut devices = Vec::with_capacity(world);
    for rank in 0..world {
        let ordinal = rank % found;
        match CudaDevice::open(ordinal) {
            Ok(dev) => devices.push(dev),
            Err(e) => return fail(format!("GPU {ordinal}: {e}")),
        }
    }
    let (name, arch) = match devices.first() {
        Some(d) => (d.describe().0.to_string(), d.describe().1.to_string()),
        None => return fail("no GPU opened".into()),
    };
    let what = if world == 1 {
        format!("{name} ({arch})")
    } else {
        format!("{world} ranks on {}× {name} ({arch})", world.min(found))
    };
    // One GPU per rank: the ranks sum their gradients GPU to GPU through NCCL when it loads
    // (RECIPE_NCCL=0 turns it off); otherwise through host memory, the same numbers.
    let mut peers = Vec::new();
    if one_node {
        eprintln!("note: between nodes the ranks exchange gradients through host memory and node 0's hub (NCCL across nodes is not built yet)");
    } else if world > 1 && world <= found {
        if std::env::var("RECIPE_NCCL").is_ok_and(|v| v == "0") {
            eprintln!("note: RECIPE_NCCL=0: the ranks exchange gradients through host memory");
        } else {
            match cuda::nccl::group(&devices.iter().collect::<Vec<_>>()) {
                Ok(p) => {
                    let v = cuda::nccl::version().unwrap_or_else(|| "?".into());
                    eprintln!("note: the ranks sum their gradients GPU to GPU through NCCL {v}");
                    peers = p;
                }
                Err(e) => {
                    eprintln!("note: {e}; the ranks exchange gradients through host memory instead")
                }
            }
        }
    }
    let mut peers = peers.into_iter();
    let executors = devices
        .into_iter()
        .map(|dev| -> std::sync::Arc<dyn Executor> {
            let kernels = Kernels::new(dev).with_store(store);
            match peers.next() {
                Some(p) => OnDevice::with_peers(kernels, what.clone(), Box::new(p)),
                None => OnDevice::new(kernels, what.clone()),
            }
        })
        .collect();
    Ok(executors)
}
