//! Asynchronous streams (`RECIPE_FAKE_CUDA_ASYNC=µs`): each stream's operations run in order on
//! a thread of its own, each after that many microseconds, while the host goes on, as a GPU's
//! do. Then a host that reads a download, or a stream that reads what another stream writes,
//! without waiting for it (`cuStreamSynchronize`, `cuEventSynchronize`, `cuStreamWaitEvent`)
//! reads it before it is there: the fresh memory's NaN, or the buffer's old values. Without
//! the variable every operation runs when it is queued, in the calling thread (the default:
//! deterministic, and simplest to debug).
//!
//! `RECIPE_FAKE_CUDA_LAZY` (with `RECIPE_FAKE_CUDA_ASYNC`) makes some streams run an operation
//! only once something waits for it or for a later one (the host, or another stream's
//! `cuStreamWaitEvent`; a query counts as a wait): `others`, every stream of a device but the
//! first to queue work on it (the compute stream), so that a second stream's work runs as late
//! as the waits allow and a missing wait lets the compute stream overwrite what it still
//! reads; `first`, the compute stream alone, so that a second stream's work runs as early as
//! they allow and a missing one lets it read what the compute stream has not written yet.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::time::Duration;

use crate::Op;

/// The delay before each operation of an asynchronous stream; `None`: synchronous streams.
pub fn delay() -> Option<Duration> {
    static D: OnceLock<Option<Duration>> = OnceLock::new();
    *D.get_or_init(|| {
        std::env::var("RECIPE_FAKE_CUDA_ASYNC")
            .ok()
            .and_then(|v| v.parse::<u64>().ok())
            .map(Duration::from_micros)
    })
}

/// Which streams run lazily (`RECIPE_FAKE_CUDA_LAZY`, see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Lazy {
    /// Every stream of a device but its first.
    Others,
    /// A device's first stream.
    First,
}

fn lazy() -> Option<Lazy> {
    static L: OnceLock<Option<Lazy>> = OnceLock::new();
    *L.get_or_init(|| match std::env::var("RECIPE_FAKE_CUDA_LAZY").ok().as_deref() {
        Some("others") => Some(Lazy::Others),
        Some("first") => Some(Lazy::First),
        None | Some("") => None,
        Some(other) => {
            eprintln!("fake CUDA: RECIPE_FAKE_CUDA_LAZY={other} ignored: expected `others` or `first`");
            None
        }
    })
}

/// A stream's queue: what waits to run, how many operations were queued and how many are done,
/// and, for a lazy stream, up to which one something waits.
#[derive(Default)]
struct Queue {
    ops: VecDeque<(String, Op)>,
    queued: u64,
    done: u64,
    demand: u64,
}

/// One stream's thread and its queue.
#[derive(Default)]
pub struct Worker {
    queue: Mutex<Queue>,
    changed: Condvar,
    /// Runs an operation only once something waits for it (`RECIPE_FAKE_CUDA_LAZY`).
    lazy: bool,
}

impl Worker {
    /// Queues `op`; returns its position (the count of operations queued with it).
    fn push(&self, what: &str, op: Op) -> u64 {
        let mut q = self.queue.lock().unwrap_or_else(|p| p.into_inner());
        q.ops.push_back((what.to_string(), op));
        q.queued += 1;
        self.changed.notify_all();
        q.queued
    }

    /// How many operations were queued so far.
    pub fn queued(&self) -> u64 {
        self.queue.lock().unwrap_or_else(|p| p.into_inner()).queued
    }

    /// Whether the operation at `position` has run. Asking counts as waiting for it: a host
    /// that polls a lazy stream gets there.
    pub fn reached(&self, position: u64) -> bool {
        let mut q = self.queue.lock().unwrap_or_else(|p| p.into_inner());
        if q.demand < position {
            q.demand = position;
            self.changed.notify_all();
        }
        q.done >= position
    }

    /// Waits until the operation at `position` has run (a failed one counts: it faulted the
    /// device, which the caller then reports).
    pub fn wait(&self, position: u64) {
        let mut q = self.queue.lock().unwrap_or_else(|p| p.into_inner());
        if q.demand < position {
            q.demand = position;
            self.changed.notify_all();
        }
        while q.done < position {
            q = self.changed.wait(q).unwrap_or_else(|p| p.into_inner());
        }
    }

    /// The stream's thread: runs each operation in order, after the delay.
    fn serve(self: Arc<Self>, device: i32, pause: Duration) {
        loop {
            let (what, op) = {
                let mut q = self.queue.lock().unwrap_or_else(|p| p.into_inner());
                loop {
                    // A lazy stream's next operation waits until something waits for it.
                    let wanted = !self.lazy || q.demand > q.done;
                    if wanted {
                        if let Some(next) = q.ops.pop_front() {
                            break next;
                        }
                    }
                    q = self.changed.wait(q).unwrap_or_else(|p| p.into_inner());
                }
            };
            std::thread::sleep(pause);
            // After a fault nothing more runs on the device, as on a GPU.
            if !crate::state().sticky.contains_key(&device) {
                crate::run(device, &what, &op);
            }
            let mut q = self.queue.lock().unwrap_or_else(|p| p.into_inner());
            q.done += 1;
            self.changed.notify_all();
        }
    }
}

type Workers = HashMap<(i32, usize), Arc<Worker>>;

/// Every stream's worker by (device, stream handle): the legacy stream, handle 0, is each
/// device's own.
fn workers() -> &'static Mutex<Workers> {
    static W: OnceLock<Mutex<Workers>> = OnceLock::new();
    W.get_or_init(Default::default)
}

/// The worker of `stream` on `device` (started on first use); `None` with synchronous streams.
pub fn worker(device: i32, stream: usize) -> Option<Arc<Worker>> {
    let pause = delay()?;
    let mut all = workers().lock().unwrap_or_else(|p| p.into_inner());
    let first = !all.keys().any(|(d, _)| *d == device);
    let w = all.entry((device, stream)).or_insert_with(|| {
        let w = Arc::new(Worker {
            lazy: match lazy() {
                Some(Lazy::Others) => !first,
                Some(Lazy::First) => first,
                None => false,
            },
            ..Worker::default()
        });
        let serving = w.clone();
        std::thread::Builder::new()
            .name(format!("fake-cuda-{device}-{stream:#x}"))
            .spawn(move || serving.serve(device, pause))
            .expect("a stream's thread");
        w
    });
    Some(w.clone())
}

/// Queues `op` on `stream`'s worker; `None` (nothing queued) with synchronous streams.
pub fn push(device: i32, stream: usize, what: &str, op: &Op) -> Option<u64> {
    worker(device, stream).map(|w| w.push(what, op.clone()))
}

/// Waits for everything queued so far on `stream` (all of `device`'s streams with `None`).
pub fn drain(device: i32, stream: Option<usize>) {
    if delay().is_none() {
        return;
    }
    let list: Vec<Arc<Worker>> = {
        let all = workers().lock().unwrap_or_else(|p| p.into_inner());
        all.iter()
            .filter(|((d, s), _)| *d == device && stream.is_none_or(|x| x == *s))
            .map(|(_, w)| w.clone())
            .collect()
    };
    for w in list {
        let at = w.queued();
        w.wait(at);
    }
}

/// Whether `stream` still has work to run, without waiting for it (as [`idle`]'s query would
/// for a lazy stream).
pub fn behind(device: i32, stream: usize) -> bool {
    let all = workers().lock().unwrap_or_else(|p| p.into_inner());
    all.get(&(device, stream)).is_some_and(|w| {
        let q = w.queue.lock().unwrap_or_else(|p| p.into_inner());
        q.done < q.queued
    })
}

/// Whether everything queued on `stream` has run (always, with synchronous streams).
pub fn idle(device: i32, stream: usize) -> bool {
    if delay().is_none() {
        return true;
    }
    let all = workers().lock().unwrap_or_else(|p| p.into_inner());
    all.get(&(device, stream))
        .is_none_or(|w| w.reached(w.queued()))
}
