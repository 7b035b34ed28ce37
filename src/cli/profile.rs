//! `recipe run --profile`: starts timing each rank's GPU before the run and, after it, writes
//! the totals of every rank this process ran to `profile.json` in the output directory (node K
//! of several: `profile.node<K>.json`) and prints the table (docs/cuda.md, "Profiling").

use std::path::Path;
use std::sync::Arc;

use recipe_runtime::backend::profile::Profile;
use recipe_runtime::model::Executor;

/// The executors being timed (none when `--profile` was not given or nothing could be timed).
pub struct Profiled {
    executors: Vec<Arc<dyn Executor>>,
}

/// Starts the profile of every executor when `on`.
pub fn start(on: bool, executors: &[Arc<dyn Executor>]) -> Profiled {
    let mut timed = Vec::new();
    if on {
        if executors.is_empty() {
            eprintln!("note: --profile: this node's ranks open their GPUs once every node has joined (NCCL across nodes), which the profile does not reach yet; nothing is timed");
        }
        for ex in executors {
            if ex.start_profile() {
                timed.push(Arc::clone(ex));
            } else {
                eprintln!("note: --profile: {} cannot be timed", ex.describe());
            }
        }
    }
    Profiled { executors: timed }
}

/// Writes (and unless `quiet` prints) what the executors measured.
pub fn report(p: &Profiled, out: &Path, node: usize, quiet: bool) -> Result<(), String> {
    let mut total: Option<Profile> = None;
    for ex in &p.executors {
        if let Some(one) = ex.profile() {
            total.get_or_insert_with(Profile::default).merge(&one);
        }
    }
    let Some(total) = total else {
        return Ok(());
    };
    let name = if node == 0 {
        "profile.json".to_string()
    } else {
        format!("profile.node{node}.json")
    };
    let path = out.join(name);
    let mut json = total.to_json();
    json["ranks"] = p.executors.len().into();
    json["device"] = p.executors[0].describe().into();
    let text = serde_json::to_string_pretty(&json).map_err(|e| e.to_string())? + "\n";
    let tmp = path.with_extension("json.tmp");
    std::fs::write(&tmp, text)
        .and_then(|()| std::fs::rename(&tmp, &path))
        .map_err(|e| format!("cannot write {}: {e}", path.display()))?;
    if !quiet {
        eprintln!(
            "profile of {} rank(s) on {} (written to {}):\n{}",
            p.executors.len(),
            p.executors[0].describe(),
            path.display(),
            total.table(15)
        );
    }
    Ok(())
}
