//! Checkpoints for exact resume: the model in HF layout (`config.json` with `id2label`,
//! `model.safetensors`, `tokenizer.json`), the optimizer state (`optimizer.safetensors`) and
//! where the run was (`trainer_state.json`). The loss scaler and RNG need no state today: the
//! CPU backend trains in fp32, and dropout masks are counter-based on (seed, step, micro-batch).
//! A checkpoint is written into a temporary directory and renamed into place, so a crash never
//! leaves a half-written one.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::model::Classifier;
use crate::optim::{AdamState, OptimError};
use crate::plateau::Plateau;
use crate::train::Position;

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
    /// Ranks of the run that wrote it.
    #[serde(default)]
    world: Option<u64>,
}

/// What a checkpoint holds besides the model.
#[derive(Debug, Clone)]
pub struct TrainingState {
    /// The whole optimizer state.
    pub adam: AdamState,
    /// Where the run was.
    pub position: Position,
    /// The plateau scheduler's state, if any.
    pub plateau: Option<Plateau>,
    /// Ranks of the run that wrote the checkpoint.
    pub world: Option<u64>,
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
#[derive(Debug, Clone, Copy)]
pub struct Progress {
    /// Steps and data position.
    pub position: Position,
    /// The plateau scheduler's state, if any.
    pub plateau: Option<Plateau>,
    /// Ranks of the run.
    pub world: u64,
}

/// Saves everything a bit-identical resume needs.
pub fn save(
    dir: &Path,
    model: &Classifier,
    labels: &[String],
    tokenizer: &Path,
    state: &AdamState,
    progress: Progress,
) -> Result<(), ResumeError> {
    atomically(dir, |tmp| {
        write_model(tmp, model, labels, tokenizer)?;
        let path = tmp.join("optimizer.safetensors");
        std::fs::write(&path, state.to_safetensors()?).map_err(io(&path))?;
        let path = tmp.join("trainer_state.json");
        let s = TrainerState {
            format: STATE_FORMAT,
            position: progress.position,
            plateau: progress.plateau,
            world: Some(progress.world),
        };
        let text = serde_json::to_string_pretty(&s).expect("the state serialises");
        std::fs::write(&path, text).map_err(io(&path))
    })
}

/// Reads the optimizer state and position of a checkpoint (the model is read by
/// `Classifier::from_pretrained` from the same directory).
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
    let path = dir.join("optimizer.safetensors");
    let bytes = std::fs::read(&path).map_err(io(&path))?;
    let state = AdamState::from_safetensors(&bytes).map_err(|e| bad(&path, e.to_string()))?;
    Ok(TrainingState {
        adam: state,
        position: s.position,
        plateau: s.plateau,
        world: s.world,
    })
}
