//! `recipe run FILE [--device cpu|cuda] [--resume DIR]`: compiles a recipe to a plan (or reads a
//! saved `plan.json`) and trains it with the native runtime.

use std::path::Path;

use recipe_runtime::plan::Plan;
use recipe_runtime::train::{self, RunOptions};

use super::{load, Device, RecipeFlags, FAILED, OK, USAGE};

pub fn run(
    file: &Path,
    device: Device,
    resume: Option<&Path>,
    stop_after: Option<u64>,
    quiet: bool,
    flags: &RecipeFlags,
) -> i32 {
    if device == Device::Cuda {
        eprintln!("error: the CUDA backend is not built yet; `--device cpu` (the default) trains on the CPU reference backend");
        return USAGE;
    }
    let is_plan = file.extension().is_some_and(|e| e == "json");
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
        let (source, resolved, options) = match load(file, flags) {
            Ok(loaded) => loaded,
            Err(code) => return code,
        };
        let checked = recipe::check::check_source_with(&source.text, &options);
        if checked.has_errors() {
            eprintln!("{}: has errors; not running", source.name);
            return FAILED;
        }
        match super::build::native_plan(&resolved) {
            Ok(p) => p,
            Err(code) => return code,
        }
    };
    let options = RunOptions {
        resume: resume.map(Path::to_path_buf),
        stop_after,
        progress: !quiet && std::io::IsTerminal::is_terminal(&std::io::stderr()),
        quiet,
    };
    match train::run(&plan, &options) {
        Ok(summary) => {
            if !quiet {
                eprintln!("{summary}");
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
