//! Which of cuBLASLt's algorithms a GEMM shape runs (`RECIPE_GEMM_ALGO`; docs/cuda.md,
//! "Choosing among cuBLASLt's algorithms").
//!
//! By default a shape takes the heuristic's first answer ([`super::lt`]). With `fastest`, the
//! first call of a shape outside a capture times up to [`CANDIDATES`] of the heuristic's
//! answers on the call's own operands (into scratch, so the call's output is untouched) and the
//! shape keeps the fastest — the heuristic's first unless another is faster by more than
//! [`MARGIN`], so that timing noise between near-equals does not move a choice. PyTorch's
//! TunableOp does the same for its GEMMs (aten/src/ATen/cuda/tunable).
//!
//! Two algorithms may add a product's terms in different orders, so the choice is part of a
//! run's numerics: for the same bits run after run it is made once and kept. A choice is the
//! answer's rank in the heuristic's list, which is the same for the same shape on the same GPU,
//! library and workspace; it is kept per process in a book per such device (every rank of a run
//! on several GPUs of one kind takes the first rank's choice), and with the cache on
//! (`recipe` enables it in `$RECIPE_CACHE/gemms`, as the kernel cache) in one JSON file per
//! device, which a later run reads before it times anything. A file is written to a temporary
//! name and renamed into place; an unreadable one, or one of another device or format, is
//! ignored (its shapes are timed again).

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock};

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use std::ffi::c_void;

use cudarc::driver::{sys as drv_sys, DevicePtr};

use super::lt::{self, Lt, Shape};
use super::{CudaDevice, CudaError};

/// How many of the heuristic's answers a shape's first call times.
pub const CANDIDATES: usize = 8;

/// Calls timed per candidate, after one untimed call.
pub const REPS: usize = 5;

/// How much faster (relative) another answer must be than the heuristic's first to be chosen.
pub const MARGIN: f64 = 0.03;

/// The file's format, checked when it is read.
const FORMAT: &str = "recipe-gemm-choices 1";

/// `RECIPE_GEMM_ALGO`'s choice.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Algo {
    /// The heuristic's first answer (`first`, the default).
    First,
    /// The fastest of the heuristic's answers, timed once per shape and device (`fastest`).
    Fastest,
}

impl Algo {
    /// `RECIPE_GEMM_ALGO`'s choice; `Err` names a value it does not know.
    pub fn from_env() -> Result<Algo, CudaError> {
        Self::parse(std::env::var("RECIPE_GEMM_ALGO").ok().as_deref())
    }

    /// The choice a value of `RECIPE_GEMM_ALGO` (`None`: unset) makes.
    pub fn parse(v: Option<&str>) -> Result<Algo, CudaError> {
        let first = super::settings::switch(
            ("RECIPE_GEMM_ALGO", v),
            ["first", "fastest"],
            &format!("`first` (the heuristic's first algorithm, the default) or `fastest` (the fastest of its first {CANDIDATES}, timed once per GEMM shape and kept) (docs/cuda.md, \"GEMMs\")"),
        )?;
        Ok(if first { Algo::First } else { Algo::Fastest })
    }
}

/// One shape's choice: the rank chosen among `of` answers, and each answer's µs a call
/// (`None`: it refused to run).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Choice {
    pub rank: usize,
    pub of: usize,
    pub us: Vec<Option<f64>>,
}

/// The rank to choose among timings in the heuristic's order: the fastest, unless it is not
/// faster than the first by more than [`MARGIN`] (or the first refused: then the fastest).
pub fn pick(us: &[Option<f64>]) -> usize {
    let best = us
        .iter()
        .enumerate()
        .filter_map(|(i, t)| t.map(|t| (i, t)))
        .fold(None, |b: Option<(usize, f64)>, (i, t)| match b {
            Some((_, bt)) if bt <= t => b,
            _ => Some((i, t)),
        });
    match (us.first().copied().flatten(), best) {
        (Some(first), Some((i, t))) if t < first * (1.0 - MARGIN) => i,
        (Some(_), _) | (None, None) => 0,
        (None, Some((i, _))) => i,
    }
}

/// A device's choices by shape, as its file holds them.
#[derive(Debug, Default, Serialize, Deserialize)]
struct Book {
    format: String,
    device: String,
    choices: BTreeMap<String, Choice>,
}

/// Every device's book in this process (read from its file at the first question).
fn books() -> &'static Mutex<HashMap<String, Book>> {
    static BOOKS: OnceLock<Mutex<HashMap<String, Book>>> = OnceLock::new();
    BOOKS.get_or_init(Default::default)
}

static DIR: OnceLock<PathBuf> = OnceLock::new();

/// Keeps the choices in `dir` (created on first write) across runs. Once per process; later
/// calls are ignored.
pub fn enable(dir: PathBuf) {
    let _ = DIR.set(dir);
}

fn file_of(dir: &Path, device: &str) -> PathBuf {
    let hash = Sha256::digest(device.as_bytes());
    let hex: String = hash[..8].iter().map(|b| format!("{b:02x}")).collect();
    dir.join(format!("{hex}.json"))
}

/// `device`'s book from `dir`, or an empty one.
fn read(dir: Option<&Path>, device: &str) -> Book {
    let read = dir
        .and_then(|d| std::fs::read_to_string(file_of(d, device)).ok())
        .and_then(|t| serde_json::from_str::<Book>(&t).ok())
        .filter(|b| b.format == FORMAT && b.device == device);
    read.unwrap_or_else(|| Book {
        format: FORMAT.into(),
        device: device.into(),
        choices: BTreeMap::new(),
    })
}

/// Writes `book` into `dir`, best effort (a book that cannot be written costs the timing of
/// its shapes in the next run).
fn write(dir: &Path, book: &Book) {
    if let Ok(text) = serde_json::to_string_pretty(book) {
        super::kernel_cache::put_file(dir, &file_of(dir, &book.device), text.as_bytes());
    }
}

fn with_book<R>(device: &str, f: impl FnOnce(&mut Book) -> R) -> R {
    let mut all = books().lock().unwrap_or_else(|p| p.into_inner());
    let book = all
        .entry(device.to_string())
        .or_insert_with(|| read(DIR.get().map(PathBuf::as_path), device));
    f(book)
}

/// The rank chosen for `shape` on `device`, if one was.
pub fn chosen(device: &str, shape: &str) -> Option<usize> {
    with_book(device, |b| b.choices.get(shape).map(|c| c.rank))
}

/// Keeps `choice` for `shape` on `device` unless one is kept already (another rank's, timed
/// meanwhile), and returns the rank in force; with the cache on, the book is written.
pub fn record(device: &str, shape: &str, choice: Choice) -> usize {
    with_book(device, |b| {
        if let Some(c) = b.choices.get(shape) {
            return c.rank;
        }
        let rank = choice.rank;
        b.choices.insert(shape.to_string(), choice);
        if let Some(dir) = DIR.get() {
            write(dir, b);
        }
        rank
    })
}

/// How many shapes `device`'s book holds.
pub fn known(device: &str) -> usize {
    with_book(device, |b| b.choices.len())
}

impl CudaDevice {
    /// Before `shape`'s first call (alpha, beta and the column-major call's operands `ptrs`:
    /// our `B`, our `A`, C), with `RECIPE_GEMM_ALGO=fastest` and no choice kept for it: times
    /// up to [`CANDIDATES`] of the heuristic's answers on the compute stream, once the device's
    /// work is done (nothing else runs meanwhile), each into a scratch C (zeroed) so that the
    /// call's own output is untouched, and keeps the one [`pick`] takes. Not inside a capture
    /// (the shape then takes the heuristic's first, unrecorded), and not on a failure (no
    /// scratch memory, an event that fails): the same.
    pub(super) fn choose_algorithm(
        &self,
        lt: &Lt,
        shape: &Shape,
        alpha_beta: (f32, f32),
        [first, second, _]: [u64; 3],
    ) {
        let Some(device) = lt.needs_choice(shape) else {
            return;
        };
        if self.capturing() || self.failed() {
            return;
        }
        let key = lt::shape_key(shape);
        // No algorithm at all: the plan notes why, and cuBLAS runs the shape.
        let Ok((descs, list)) = lt.candidates(shape, CANDIDATES) else {
            return;
        };
        if list.len() < 2 {
            record(
                device,
                &key,
                Choice {
                    rank: 0,
                    of: list.len(),
                    us: Vec::new(),
                },
            );
            return;
        }
        self.drain("timing a GEMM's algorithms");
        let Ok(scratch) = self.stream.alloc_zeros::<u8>(shape.c_bytes().max(1)) else {
            return;
        };
        let c = scratch.device_ptr(&self.stream).0;
        let flags = Some(drv_sys::CUevent_flags::CU_EVENT_DEFAULT);
        let (Ok(start), Ok(end)) = (self.ctx.new_event(flags), self.ctx.new_event(flags)) else {
            return;
        };
        let stream = self.stream.cu_stream() as *mut c_void;
        let mut us = Vec::with_capacity(list.len());
        for cand in &list {
            // SAFETY: the operands are the call's own (their extents and alignments the
            // shape's, checked by the caller); C is scratch as long as the shape's, from an
            // allocation's start (aligned past any alignment the shape states); this device's
            // stream, its workspace unused by anything else (the device's work is done).
            let run = || unsafe {
                lt.matmul_with((&descs, cand), alpha_beta, [first, second, c], stream)
            };
            // An answer that refuses to run is not chosen.
            if run().is_err() {
                us.push(None);
                continue;
            }
            if start.record(&self.stream).is_err() {
                return;
            }
            let ran = (0..REPS).all(|_| run().is_ok());
            if end.record(&self.stream).is_err() || self.stream.synchronize().is_err() {
                return;
            }
            let Ok(ms) = start.elapsed_ms(&end) else {
                return;
            };
            us.push(ran.then(|| f64::from(ms) * 1e3 / REPS as f64));
        }
        let rank = pick(&us);
        let of = list.len();
        record(device, &key, Choice { rank, of, us });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_is_kept_unless_another_is_clearly_faster() {
        assert_eq!(pick(&[Some(10.0), Some(9.8), Some(9.9)]), 0, "within 3 %");
        assert_eq!(pick(&[Some(10.0), Some(9.0), Some(8.0)]), 2);
        assert_eq!(pick(&[Some(10.0), None, Some(9.0)]), 2);
        assert_eq!(
            pick(&[None, Some(12.0), Some(11.0)]),
            2,
            "the first refused"
        );
        assert_eq!(
            pick(&[Some(10.0), Some(8.0), Some(8.0)]),
            1,
            "ties: the earlier"
        );
        assert_eq!(pick(&[None, None]), 0);
        assert_eq!(pick(&[]), 0);
    }

    #[test]
    fn settings_are_parsed_and_others_refused() {
        assert_eq!(Algo::parse(None).unwrap(), Algo::First);
        assert_eq!(Algo::parse(Some("first")).unwrap(), Algo::First);
        assert_eq!(Algo::parse(Some("fastest")).unwrap(), Algo::Fastest);
        let e = Algo::parse(Some("tuned")).unwrap_err().to_string();
        assert!(
            e.contains("RECIPE_GEMM_ALGO=tuned: expected `first`"),
            "{e}"
        );
    }

    /// A book comes back from its file for its device only; a damaged or foreign file is an
    /// empty book; no temporary file is left.
    #[test]
    fn a_book_is_read_back_for_its_device_only() {
        let dir = tempfile::tempdir().unwrap();
        let mut b = read(Some(dir.path()), "GPU A");
        assert!(b.choices.is_empty());
        let c = Choice {
            rank: 2,
            of: 3,
            us: vec![Some(10.0), None, Some(8.0)],
        };
        b.choices.insert("shape".into(), c.clone());
        write(dir.path(), &b);
        assert_eq!(read(Some(dir.path()), "GPU A").choices["shape"], c);
        assert!(read(Some(dir.path()), "GPU B").choices.is_empty());
        // Another device's book under this one's name: ignored.
        std::fs::copy(file_of(dir.path(), "GPU A"), file_of(dir.path(), "GPU B")).unwrap();
        assert!(read(Some(dir.path()), "GPU B").choices.is_empty());
        let path = file_of(dir.path(), "GPU A");
        let whole = std::fs::read_to_string(&path).unwrap();
        std::fs::write(&path, &whole[..whole.len() / 2]).unwrap();
        assert!(read(Some(dir.path()), "GPU A").choices.is_empty());
        let names: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        assert!(names.iter().all(|n| n.ends_with(".json")), "{names:?}");
    }

    /// The first choice recorded for a shape stands: a second rank's own timing adopts it.
    #[test]
    fn the_first_recorded_choice_stands() {
        let device = "the first recorded choice stands (test device)";
        assert_eq!(chosen(device, "s"), None);
        let c = |rank| Choice {
            rank,
            of: 3,
            us: vec![Some(1.0); 3],
        };
        assert_eq!(record(device, "s", c(1)), 1);
        assert_eq!(record(device, "s", c(2)), 1);
        assert_eq!(chosen(device, "s"), Some(1));
        assert_eq!(known(device), 1);
    }
}
