//! Checkpoints for exact resume: the model in HF layout (`config.json` with `id2label`,
//! `model.safetensors`, `tokenizer.json`; under ZeRO-3 gathered from the ranks' partitions), the
//! optimizer state and where the run was (`trainer_state.json`).
//!
//! The optimizer state is `optimizer.safetensors` (ZeRO-0: every rank holds it all, rank 0
//! writes it) or, under ZeRO-1/2/3, one file per rank, `optimizer/rank-R-of-N.safetensors`, with
//! the rank's optimizer buffers (`crate::optim::OptimState`: Adam's and LAMB's `exp_avg` and
//! `exp_avg_sq`, SGD's `momentum_buffer`, Adagrad's `sum`), which optimizer wrote them, and the
//! ranges of the flat buffer they cover (like DeepSpeed's
//! `zero_pp_rank_R_mp_rank_00_optim_states.pt`). Resuming on the same ranks and stage reads each
//! rank's own file; any other world size or stage assembles each rank's new partition from the
//! pieces of the saved ones ([`read_optimizer`]), which DeepSpeed cannot do without its
//! `zero_to_fp32` conversion. Under mixed precision each optimizer file also holds
//! its partition's fp32 master weights (`fp32_master`), and `trainer_state.json` the precision
//! and the fp16 loss scaler's state (scale, iteration, last overflow, hysteresis, skipped steps).
//! The RNG needs no state: dropout masks are counter-based on (seed, step, micro-batch).
//! A checkpoint is written into a temporary directory and renamed into place, so a crash never
//! leaves a half-written one.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::greedy::Greedy;
use crate::model::Classifier;
use crate::optim::{OptimError, OptimState};
use crate::plan::Precision;
use crate::plateau::{OnMetric, Plateau};
use crate::precision::ScalerState;
use crate::train::Position;
use crate::zero::Shard;

/// The state file's format.
const STATE_FORMAT: u32 = 1;

/// A checkpoint that cannot be written or read.
#[derive(Debug, thiserror::Error)]
pub enum ResumeError {
    /// File system.
    #[error("checkpoint `{path}`: {source}")]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// A file of the checkpoint is malformed or does not fit the model.
    #[error("checkpoint `{path}`: {what}")]
    Bad {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        what: String,
    },
    /// The model could not be saved.
    #[error(transparent)]
    Model(#[from] crate::model::ModelError),
    /// The optimizer state could not be encoded or decoded.
    #[error(transparent)]
    Optim(#[from] OptimError),
}

#[derive(Serialize, Deserialize)]
struct TrainerState {
    format: u32,
    position: Position,
    /// `reduce_lr_on_plateau`'s state, when the run uses it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    plateau: Option<Plateau>,
    /// `greedy`'s state, when the run uses it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    greedy: Option<Greedy>,
    /// Ranks of the run that wrote it.
    #[serde(default)]
    world: Option<u64>,
    /// Its ZeRO stage.
    #[serde(default)]
    zero_stage: Option<u8>,
    /// Its precision (absent: fp32, from before mixed precision).
    #[serde(default)]
    precision: Option<Precision>,
    /// The fp16 loss scaler's state.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    loss_scaler: Option<ScalerState>,
}

/// What a checkpoint holds besides the model and the optimizer state.
#[derive(Debug, Clone)]
pub struct TrainingState {
    /// Where the run was.
    pub position: Position,
    /// The metric-driven scheduler's state, if any.
    pub on_metric: Option<OnMetric>,
    /// Ranks of the run that wrote the checkpoint.
    pub world: Option<u64>,
    /// The ZeRO stage of that run.
    pub zero_stage: Option<u8>,
    /// Its precision (None: written before mixed precision existed, so fp32).
    pub precision: Option<Precision>,
    /// The fp16 loss scaler's state.
    pub scaler: Option<ScalerState>,
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> ResumeError + '_ {
    move |source| ResumeError::Io {
        path: path.to_path_buf(),
        source,
    }
}

fn bad(path: &Path, what: impl Into<String>) -> ResumeError {
    ResumeError::Bad {
        path: path.to_path_buf(),
        what: what.into(),
    }
}

/// Writes `dir` by filling a sibling temporary directory and renaming it over `dir`.
fn atomically(
    dir: &Path,
    fill: impl FnOnce(&Path) -> Result<(), ResumeError>,
) -> Result<(), ResumeError> {
    let parent = dir.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(parent).map_err(io(parent))?;
    let name = dir
        .file_name()
        .map_or_else(|| "checkpoint".into(), |n| n.to_string_lossy().into_owned());
    let tmp = parent.join(format!(".{name}.tmp-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&tmp);
    std::fs::create_dir_all(&tmp).map_err(io(&tmp))?;
    if let Err(e) = fill(&tmp) {
        let _ = std::fs::remove_dir_all(&tmp);
        return Err(e);
    }
    if dir.exists() {
        std::fs::remove_dir_all(dir).map_err(io(dir))?;
    }
    std::fs::rename(&tmp, dir).map_err(io(dir))
}

fn write_model(
    dir: &Path,
    model: &Classifier,
    labels: &[String],
    tokenizer: &Path,
) -> Result<(), ResumeError> {
    model.save_pretrained(dir, labels)?;
    let t = dir.join("tokenizer.json");
    std::fs::copy(tokenizer, &t).map_err(io(&t))?;
    Ok(())
}

/// Saves the model alone, in HF layout (what `from_pretrained` loads).
pub fn save_model(
    dir: &Path,
    model: &Classifier,
    labels: &[String],
    tokenizer: &Path,
) -> Result<(), ResumeError> {
    atomically(dir, |tmp| write_model(tmp, model, labels, tokenizer))
}

/// Where a run is, besides its weights and optimizer state.
#[derive(Debug, Clone)]
pub struct Progress {
    /// Steps and data position.
    pub position: Position,
    /// The metric-driven scheduler's state, if any.
    pub on_metric: Option<OnMetric>,
    /// Ranks of the run.
    pub world: u64,
    /// Its ZeRO stage.
    pub zero_stage: u8,
    /// Its precision.
    pub precision: Precision,
    /// The fp16 loss scaler's state.
    pub scaler: Option<ScalerState>,
}

/// The temporary directory a checkpoint `dir` is assembled in before [`finish`] renames it,
/// named for rank 0's process `pid` (every rank writes into the same one, whichever process or
/// node it runs in).
pub fn staging(dir: &Path, pid: u32) -> PathBuf {
    let parent = dir.parent().unwrap_or(Path::new("."));
    let name = dir
        .file_name()
        .map_or_else(|| "checkpoint".into(), |n| n.to_string_lossy().into_owned());
    parent.join(format!(".{name}.tmp-{pid}"))
}

/// Starts assembling a checkpoint (rank 0, before the other ranks write): the model in HF
/// layout in a fresh [`staging`] directory, with an `optimizer/` folder for the ranks' shards.
pub fn begin(
    tmp: &Path,
    model: &Classifier,
    labels: &[String],
    tokenizer: &Path,
) -> Result<(), ResumeError> {
    let _ = std::fs::remove_dir_all(tmp);
    let fill = || -> Result<(), ResumeError> {
        write_model(tmp, model, labels, tokenizer)?;
        let shards = tmp.join("optimizer");
        std::fs::create_dir_all(&shards).map_err(io(&shards))
    };
    fill().inspect_err(|_| abandon(tmp))
}

/// Removes a staging directory after a failure.
pub fn abandon(tmp: &Path) {
    let _ = std::fs::remove_dir_all(tmp);
}

fn shard_name(rank: usize, world: usize) -> String {
    format!("rank-{rank}-of-{world}.safetensors")
}

/// Writes one rank's optimizer partition into a staging directory.
pub fn write_shard(tmp: &Path, shard: &Shard, state: &OptimState) -> Result<(), ResumeError> {
    let ranges: Vec<[usize; 2]> = shard.ranges.iter().map(|r| [r.start, r.end]).collect();
    let meta = [
        ("stage", shard.stage.to_string()),
        ("world", shard.world.to_string()),
        ("rank", shard.rank.to_string()),
        ("total", shard.total.to_string()),
        (
            "ranges",
            serde_json::to_string(&ranges).expect("integers serialise"),
        ),
    ];
    let bytes = state.to_safetensors_with(meta.into_iter().map(|(k, v)| (k.to_string(), v)))?;
    let path = tmp
        .join("optimizer")
        .join(shard_name(shard.rank, shard.world));
    std::fs::write(&path, bytes).map_err(io(&path))
}

/// Completes a checkpoint (rank 0, after every rank's [`write_shard`]): the whole optimizer
/// state when one rank holds it all (`whole`, ZeRO-0), the run's position; then renames the
/// staging directory over `dir`.
pub fn finish(
    tmp: &Path,
    dir: &Path,
    whole: Option<&OptimState>,
    progress: Progress,
) -> Result<(), ResumeError> {
    let fill = || -> Result<(), ResumeError> {
        if let Some(state) = whole {
            let path = tmp.join("optimizer.safetensors");
            std::fs::write(&path, state.to_safetensors()?).map_err(io(&path))?;
            let shards = tmp.join("optimizer");
            std::fs::remove_dir(&shards).map_err(io(&shards))?;
        }
        let path = tmp.join("trainer_state.json");
        let s = TrainerState {
            format: STATE_FORMAT,
            position: progress.position,
            plateau: match &progress.on_metric {
                Some(OnMetric::Plateau(p)) => Some(*p),
                _ => None,
            },
            greedy: match progress.on_metric {
                Some(OnMetric::Greedy(g)) => Some(g),
                _ => None,
            },
            world: Some(progress.world),
            zero_stage: Some(progress.zero_stage),
            precision: Some(progress.precision),
            loss_scaler: progress.scaler,
        };
        let text = serde_json::to_string_pretty(&s).expect("the state serialises");
        std::fs::write(&path, text).map_err(io(&path))?;
        if dir.exists() {
            std::fs::remove_dir_all(dir).map_err(io(dir))?;
        }
        std::fs::rename(tmp, dir).map_err(io(dir))
    };
    fill().inspect_err(|_| abandon(tmp))
}

/// Reads where a checkpoint's run was (the model is read by `Classifier::from_pretrained` from
/// the same directory, the optimizer state by [`read_optimizer`]).
pub fn read_training_state(dir: &Path) -> Result<TrainingState, ResumeError> {
    let path = dir.join("trainer_state.json");
    let text = std::fs::read_to_string(&path).map_err(io(&path))?;
    let s: TrainerState = serde_json::from_str(&text).map_err(|e| bad(&path, e.to_string()))?;
    if s.format != STATE_FORMAT {
        return Err(bad(
            &path,
            format!(
                "state format {}; this runtime reads {STATE_FORMAT}",
                s.format
            ),
        ));
    }
    Ok(TrainingState {
        position: s.position,
        on_metric: s
            .plateau
            .map(OnMetric::Plateau)
            .or(s.greedy.map(OnMetric::Greedy)),
        world: s.world,
        zero_stage: s.zero_stage,
        precision: s.precision,
        scaler: s.loss_scaler,
    })
}

/// One saved optimizer file: its state and the ranges of the flat buffer it covers.
struct Saved {
    path: PathBuf,
    state: OptimState,
    ranges: Vec<std::ops::Range<usize>>,
    rank: Option<usize>,
    world: Option<usize>,
}

fn read_saved(path: &Path, total: usize) -> Result<Saved, ResumeError> {
    let bytes = std::fs::read(path).map_err(io(path))?;
    let (state, meta) =
        OptimState::from_safetensors_with(&bytes).map_err(|e| bad(path, e.to_string()))?;
    let num = |k: &str| meta.get(k).and_then(|v| v.parse::<usize>().ok());
    let ranges = match meta.get("ranges") {
        Some(text) => {
            let pairs: Vec<[usize; 2]> =
                serde_json::from_str(text).map_err(|e| bad(path, format!("ranges: {e}")))?;
            pairs.into_iter().map(|[a, b]| a..b).collect()
        }
        // The whole-state file covers everything.
        None => std::iter::once(0..state.len).collect::<Vec<_>>(),
    };
    let mut end = 0;
    for r in &ranges {
        if r.start < end || r.end < r.start || r.end > total {
            return Err(bad(
                path,
                format!("range {r:?} is out of order or outside the model's {total} parameters"),
            ));
        }
        end = r.end;
    }
    let n: usize = ranges.iter().map(|r| r.len()).sum();
    if n != state.len {
        return Err(bad(
            path,
            format!("holds {} elements for ranges of {n}", state.len),
        ));
    }
    Ok(Saved {
        path: path.to_path_buf(),
        state,
        ranges,
        rank: num("rank"),
        world: num("world"),
    })
}

/// The optimizer state of `want`'s partition from a checkpoint, and whether it had to be
/// re-partitioned (assembled from other partitions: another world size or ZeRO stage).
pub fn read_optimizer(dir: &Path, want: &Shard) -> Result<(OptimState, bool), ResumeError> {
    let whole = dir.join("optimizer.safetensors");
    let mut files = Vec::new();
    if whole.exists() {
        files.push(whole);
    } else {
        let shards = dir.join("optimizer");
        // This rank's own file first: with the same layout it is the only one read.
        let own = shards.join(shard_name(want.rank, want.world));
        if own.exists() {
            let saved = read_saved(&own, want.total)?;
            if saved.ranges == want.ranges
                && saved.rank == Some(want.rank)
                && saved.world == Some(want.world)
            {
                return Ok((saved.state, false));
            }
        }
        let entries = std::fs::read_dir(&shards).map_err(io(&shards))?;
        for e in entries {
            let p = e.map_err(io(&shards))?.path();
            if p.extension().is_some_and(|x| x == "safetensors") {
                files.push(p);
            }
        }
        files.sort();
        if files.is_empty() {
            return Err(bad(&shards, "no optimizer state in the checkpoint"));
        }
    }
    let n = want.len();
    // Shaped like the first file read (the optimizer and its buffers), filled from every file.
    let mut local: Option<OptimState> = None;
    let mut masters = None;
    let mut covered = 0usize;
    let mut step = None;
    let mut same = files.len() == 1 && want.ranges.len() == 1 && want.len() == want.total;
    for path in &files {
        let saved = read_saved(path, want.total)?;
        if *step.get_or_insert(saved.state.step) != saved.state.step {
            return Err(bad(
                &saved.path,
                "the ranks' optimizer files are from different steps",
            ));
        }
        let has_master = !saved.state.master.is_empty();
        if *masters.get_or_insert(has_master) != has_master {
            return Err(bad(
                &saved.path,
                "some ranks' optimizer files hold fp32 master weights and some do not",
            ));
        }
        let local = local.get_or_insert_with(|| {
            let names: Vec<&str> = saved.state.buffers.keys().map(String::as_str).collect();
            let mut s = OptimState::new(&saved.state.optimizer, n, &names, 0.0);
            if has_master {
                s.master = vec![0.0; n];
            }
            s
        });
        if saved.state.optimizer != local.optimizer
            || !saved.state.buffers.keys().eq(local.buffers.keys())
        {
            return Err(bad(
                &saved.path,
                format!(
                    "the ranks' optimizer files are of different optimizers ({} and {})",
                    local.optimizer, saved.state.optimizer
                ),
            ));
        }
        // Copy every overlap of a saved range with a wanted one into the local layout.
        let mut from = 0;
        for sr in &saved.ranges {
            let mut to = 0;
            for wr in &want.ranges {
                let (lo, hi) = (sr.start.max(wr.start), sr.end.min(wr.end));
                if lo < hi {
                    let (a, b) = (from + lo - sr.start, to + lo - wr.start);
                    let k = hi - lo;
                    for (name, dst) in local.buffers.iter_mut() {
                        dst[b..b + k].copy_from_slice(&saved.state.buffers[name][a..a + k]);
                    }
                    if has_master {
                        local.master[b..b + k].copy_from_slice(&saved.state.master[a..a + k]);
                    }
                    covered += k;
                }
                to += wr.len();
            }
            from += sr.len();
        }
        same &= saved.ranges == want.ranges;
    }
    if covered != n {
        return Err(bad(
            dir,
            format!(
                "the optimizer files cover {covered} of the {n} elements rank {} needs (a missing or overlapping rank file)",
                want.rank
            ),
        ));
    }
    let mut local = local.ok_or_else(|| bad(dir, "no optimizer state in the checkpoint"))?;
    local.step = step.unwrap_or(0);
    Ok((local, !same))
}
