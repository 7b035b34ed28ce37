//! A CUDA driver, NVRTC, cuBLAS, cuBLASLt and NCCL that run on the CPU, so that the CUDA backend's host
//! code (`runtime/src/backend/cuda`: cudarc's calls, streams, events, graphs, cuBLAS's
//! column-major mapping, NCCL's groups) runs end to end on a machine without a GPU.
//!
//! The library exports the C symbols cudarc loads (`cuInit`, `nvrtcCompileProgram`,
//! `cublasGemmEx`, `cublasLtMatmul`, `ncclAllReduce`, …); tests/fake_cuda.rs links `libcuda.so`,
//! `libnvrtc.so`, `libcublas.so`, `libcublasLt.so` and `libnccl.so` to it and runs `recipe` with that folder on
//! `LD_LIBRARY_PATH`. Device memory is host memory (an address is a host address); kernels run
//! the unchanged `.cu` sources through runtime/emu's emulation of the execution model; cuBLAS's
//! GEMMs are a plain column-major loop with f32 accumulation; every operation runs when it is
//! queued, in the calling thread, except on a stream being captured, where it is recorded and
//! runs when the graph is launched.
//!
//! Where a real driver would misbehave silently or later, this one refuses at once and says
//! why on stderr (`fake CUDA: …`), which is what makes it a test and not just a stand-in:
//! a kernel or copy whose device address is in no live allocation of the calling context's
//! GPU (use after free, a buffer of another GPU, a scalar passed where a pointer was
//! expected), a double or foreign free, an allocation or synchronisation on a stream being
//! captured, a capture ended with a forked stream not joined back, an event recorded in a
//! capture then waited on by the host. New allocations are filled with `0xFF` bytes (NaN in
//! f32, f16 and bf16), so a kernel reading memory nothing wrote shows it in the results.
//! What it cannot show: races between streams (everything runs in call order), the real
//! GPU's rounding (docs/cuda.md), performance.

// Every export is an `extern "C"` entry point whose contract is the CUDA library's own
// (documented by NVIDIA, not here).
#![allow(clippy::missing_safety_doc)]

use std::cell::Cell;
use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, MutexGuard};

pub mod cublas;
pub mod cublaslt;
pub mod driver;
pub mod nccl;
pub mod nvrtc;
pub mod streams;

/// One queued operation: runs now, or at each launch of the graph it was captured in.
pub type Op = Arc<dyn Fn() -> Result<(), String> + Send + Sync>;

/// The `CUresult` codes this driver returns (cuda.h).
pub mod code {
    pub const SUCCESS: i32 = 0;
    pub const INVALID_VALUE: i32 = 1;
    pub const OUT_OF_MEMORY: i32 = 2;
    pub const NOT_INITIALIZED: i32 = 3;
    pub const INVALID_DEVICE: i32 = 101;
    pub const INVALID_IMAGE: i32 = 200;
    pub const INVALID_CONTEXT: i32 = 201;
    pub const INVALID_HANDLE: i32 = 400;
    pub const ILLEGAL_STATE: i32 = 401;
    pub const NOT_FOUND: i32 = 500;
    pub const NOT_READY: i32 = 600;
    pub const ILLEGAL_ADDRESS: i32 = 700;
    pub const LAUNCH_FAILED: i32 = 719;
    pub const NOT_SUPPORTED: i32 = 801;
    pub const STREAM_CAPTURE_UNSUPPORTED: i32 = 900;
    pub const STREAM_CAPTURE_INVALIDATED: i32 = 901;
    pub const STREAM_CAPTURE_UNMATCHED: i32 = 903;
    pub const STREAM_CAPTURE_UNJOINED: i32 = 904;
    pub const STREAM_CAPTURE_ISOLATION: i32 = 905;
    pub const STREAM_CAPTURE_IMPLICIT: i32 = 906;
    pub const CAPTURED_EVENT: i32 = 907;
    pub const STREAM_CAPTURE_WRONG_THREAD: i32 = 908;
}

/// How many GPUs the driver reports: `RECIPE_FAKE_CUDA_GPUS`, 1 by default.
pub fn devices() -> i32 {
    std::env::var("RECIPE_FAKE_CUDA_GPUS")
        .ok()
        .and_then(|v| v.parse().ok())
        // The unit tests use eight (some for sticky faults of their own).
        .unwrap_or(if cfg!(test) { 8 } else { 1 })
}

/// Each GPU's memory: `RECIPE_FAKE_CUDA_MEMORY` bytes, 8 GiB by default (allocations past it
/// fail with `CUDA_ERROR_OUT_OF_MEMORY`, as the out-of-memory paths expect).
pub fn memory_per_device() -> usize {
    std::env::var("RECIPE_FAKE_CUDA_MEMORY")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(8 << 30)
}

/// A refusal, on stderr, where a real GPU would misbehave.
pub fn complain(what: &str, why: &str) {
    eprintln!("fake CUDA: {what}: {why}");
}

/// A device allocation.
#[derive(Debug)]
pub struct Alloc {
    pub size: usize,
    pub device: i32,
    pub layout: std::alloc::Layout,
}

/// A stream's state.
#[derive(Debug, Default)]
pub struct Stream {
    pub device: i32,
    /// The capture it records into: its origin, or one it joined by waiting on an event
    /// recorded in it.
    pub capture: Option<usize>,
    /// Operations recorded in its capture so far, and how many of them the origin stream
    /// has waited for (a joined stream must be waited for by the end).
    pub recorded: usize,
    pub joined_back: usize,
}

/// A capture in progress.
#[derive(Default)]
pub struct Capture {
    pub origin: usize,
    pub thread: Option<std::thread::ThreadId>,
    /// Thread-local or global mode (not relaxed): the capturing thread may not allocate or
    /// synchronise.
    pub strict: bool,
    pub ops: Vec<Op>,
    pub invalidated: Option<String>,
}

/// An event's last record.
#[derive(Default, Clone)]
pub struct Event {
    pub device: i32,
    /// Recorded in a capture (with the stream and its count of recorded operations then).
    pub captured: Option<(usize, usize, usize)>,
    /// When it was reached (for `cuEventElapsedTime`).
    pub at: Option<std::time::Instant>,
    /// With asynchronous streams: the recording stream's worker and the event's place in it.
    pub pending: Option<(Arc<streams::Worker>, u64)>,
}

/// Everything the driver tracks, behind one lock.
#[derive(Default)]
pub struct State {
    /// Live device allocations by base address.
    pub allocs: BTreeMap<u64, Alloc>,
    /// Bytes allocated per device.
    pub used: HashMap<i32, usize>,
    /// Freed device memory not yet given back to the host allocator, and its bytes
    /// (`driver::release_on`).
    pub graveyard: std::collections::VecDeque<(u64, std::alloc::Layout)>,
    pub buried: usize,
    /// Live pinned host allocations.
    pub hosts: HashMap<u64, std::alloc::Layout>,
    /// Streams by handle (the legacy default stream, handle 0, is each device's own).
    pub streams: HashMap<usize, Stream>,
    pub events: HashMap<usize, Event>,
    pub captures: HashMap<usize, Capture>,
    /// Captured graphs and their instantiations, by handle.
    pub graphs: HashMap<usize, Vec<Op>>,
    /// A device's sticky error: after a fault every call on its context fails, as on a GPU.
    pub sticky: HashMap<i32, i32>,
    /// What ran, for `RECIPE_FAKE_CUDA_STATS` ([`Stats`]).
    pub stats: Stats,
    /// The streams cuBLASLt GEMMs were queued on, by device ([`Stats::lt_streams`]).
    pub lt_streams: std::collections::HashSet<(i32, usize)>,
    next: usize,
}

/// Counts of what the process did on its fake GPUs, written as JSON to the file
/// `RECIPE_FAKE_CUDA_STATS` names (if set) at each capture's end and graph launch (and at a
/// stream's first cuBLASLt GEMM), so that a
/// test can tell a replayed pass from a direct one.
#[derive(Debug, Default, Clone, Copy)]
pub struct Stats {
    pub kernels: u64,
    pub captures: u64,
    pub graph_launches: u64,
    pub allocations: u64,
    /// GEMM calls queued through `cublasLtMatmul`.
    pub lt_matmuls: u64,
    /// Dense and strided GEMM calls queued through cuBLAS (`cublasSgemm`, `cublasGemmEx`,
    /// `cublasGemmStridedBatchedEx`), which a run on cuBLASLt makes none of.
    pub blas_gemms: u64,
    /// Batches of pointer lists queued through `cublasGemmBatchedEx` (cuBLASLt has none).
    pub blas_pointer_batches: u64,
    /// How many streams cuBLASLt GEMMs were queued on, all devices together: a run whose
    /// weight gradients go to a second stream on one GPU counts 2.
    pub lt_streams: u64,
    /// Waits captured on an event recorded outside the capture (`CU_EVENT_WAIT_EXTERNAL`): a
    /// graph node that waits at each replay for the event's latest record.
    pub external_waits: u64,
    /// Kernels queued as programmatic dependent launches (`cuLaunchKernelEx`).
    pub dependent_launches: u64,
    /// Host→device copies from pageable memory queued on an asynchronous stream that still had
    /// work to run: a GPU's driver may wait for that work before it stages such a copy (the
    /// CUDA runtime API's "API synchronization behavior"), so the host stalls there.
    pub pageable_uploads_behind: u64,
}

impl Stats {
    /// Writes the counts to `RECIPE_FAKE_CUDA_STATS` (whole, through a temporary file).
    pub fn save(&self) {
        let Some(path) = std::env::var_os("RECIPE_FAKE_CUDA_STATS") else {
            return;
        };
        let path = std::path::PathBuf::from(path);
        let tmp = path.with_extension("tmp");
        let text = format!(
            "{{\"kernels\": {}, \"captures\": {}, \"graph_launches\": {}, \"allocations\": {}, \
             \"lt_matmuls\": {}, \"blas_gemms\": {}, \"blas_pointer_batches\": {}, \
             \"lt_streams\": {}, \"external_waits\": {}, \"dependent_launches\": {}, \
             \"pageable_uploads_behind\": {}}}\n",
            self.kernels,
            self.captures,
            self.graph_launches,
            self.allocations,
            self.lt_matmuls,
            self.blas_gemms,
            self.blas_pointer_batches,
            self.lt_streams,
            self.external_waits,
            self.dependent_launches,
            self.pageable_uploads_behind
        );
        if std::fs::write(&tmp, text).is_ok() {
            let _ = std::fs::rename(&tmp, &path);
        }
    }
}

impl State {
    /// A fresh handle (never 0, never reused).
    pub fn handle(&mut self) -> usize {
        self.next += 1;
        0x1000 + self.next * 16
    }

    /// The capture `stream` records into, if any.
    pub fn capture_of(&self, stream: usize) -> Option<usize> {
        self.streams.get(&stream).and_then(|s| s.capture)
    }

    /// The capture the calling thread began in a mode that forbids it to allocate or
    /// synchronise, if any.
    pub fn strict_capture_here(&self) -> Option<usize> {
        let me = std::thread::current().id();
        self.captures
            .iter()
            .find(|(_, c)| c.strict && c.thread == Some(me) && c.invalidated.is_none())
            .map(|(id, _)| *id)
    }

    /// Invalidates capture `id` (its end then fails), as a GPU does after an illegal call.
    pub fn invalidate(&mut self, id: usize, why: &str) {
        if let Some(c) = self.captures.get_mut(&id) {
            c.invalidated.get_or_insert_with(|| why.to_string());
        }
        complain("capture invalidated", why);
    }

    /// Whether `[p, p + bytes)` lies in one live pinned host allocation.
    pub fn pinned(&self, p: u64, bytes: usize) -> bool {
        self.hosts
            .iter()
            .any(|(b, l)| p >= *b && p + bytes as u64 <= *b + l.size() as u64)
    }

    /// Checks that `[ptr, ptr + bytes)` lies in one live allocation of `device`.
    pub fn check_range(&self, device: i32, ptr: u64, bytes: usize) -> Result<(), String> {
        let Some((base, a)) = self.allocs.range(..=ptr).next_back() else {
            return Err(format!("address {ptr:#x} is in no live allocation"));
        };
        if ptr + bytes as u64 > base + a.size as u64 {
            return Err(format!(
                "[{ptr:#x}, +{bytes}) is in no live allocation (the nearest below, {base:#x}, has {} bytes)",
                a.size
            ));
        }
        if a.device != device {
            return Err(format!(
                "address {ptr:#x} belongs to GPU {}, used from GPU {device}'s context",
                a.device
            ));
        }
        Ok(())
    }
}

static STATE: Mutex<Option<State>> = Mutex::new(None);

/// The driver's state, locked.
pub fn state() -> StateGuard {
    let mut g = STATE.lock().unwrap_or_else(|p| p.into_inner());
    g.get_or_insert_with(State::default);
    StateGuard(g)
}

/// [`state`]'s guard.
pub struct StateGuard(MutexGuard<'static, Option<State>>);

impl std::ops::Deref for StateGuard {
    type Target = State;
    fn deref(&self) -> &State {
        self.0.as_ref().expect("initialised by state()")
    }
}

impl std::ops::DerefMut for StateGuard {
    fn deref_mut(&mut self) -> &mut State {
        self.0.as_mut().expect("initialised by state()")
    }
}

thread_local! {
    /// The calling thread's current context: its device, if one is bound.
    static CURRENT: Cell<Option<i32>> = const { Cell::new(None) };
}

/// The calling thread's current device.
pub fn current() -> Option<i32> {
    CURRENT.with(|c| c.get())
}

pub(crate) fn set_current(d: Option<i32>) {
    CURRENT.with(|c| c.set(d));
}

/// The device `stream` belongs to (the legacy stream, 0, is the current context's).
pub fn stream_device(st: &State, stream: usize) -> Option<i32> {
    if stream == 0 {
        return current();
    }
    st.streams.get(&stream).map(|s| s.device)
}

/// Queues `op` on `stream`: records it when the stream is being captured, runs it now
/// otherwise (a failure is a fault: the device's context fails from then on). Returns the
/// `CUresult`.
pub fn enqueue(stream: usize, what: &str, op: Op) -> i32 {
    let mut st = state();
    let Some(device) = stream_device(&st, stream) else {
        complain(what, "an unknown stream, or no current context");
        return code::INVALID_HANDLE;
    };
    if let Some(&e) = st.sticky.get(&device) {
        return e;
    }
    if stream == 0 {
        // The legacy stream synchronises with every blocking stream; with one being captured
        // that is an error (and invalidates the capture).
        if let Some(id) = st.strict_capture_here() {
            st.invalidate(
                id,
                &format!("{what} on the legacy default stream during a capture"),
            );
            return code::STREAM_CAPTURE_IMPLICIT;
        }
    }
    if let Some(id) = st.capture_of(stream) {
        if let Some(s) = st.streams.get_mut(&stream) {
            s.recorded += 1;
        }
        if let Some(c) = st.captures.get_mut(&id) {
            c.ops.push(op);
        }
        return code::SUCCESS;
    }
    drop(st);
    if streams::push(device, stream, what, &op).is_some() {
        return code::SUCCESS;
    }
    run(device, what, &op)
}

/// Runs `op` for `device` now; a failure is the device's fault.
pub fn run(device: i32, what: &str, op: &Op) -> i32 {
    match op() {
        Ok(()) => code::SUCCESS,
        Err(why) => fault(device, what, &why),
    }
}

/// A fault on `device`: said on stderr, and every later call on its context fails.
pub fn fault(device: i32, what: &str, why: &str) -> i32 {
    complain(what, why);
    let mut st = state();
    *st.sticky.entry(device).or_insert(code::ILLEGAL_ADDRESS)
}

/// The device of `stream` as the calling thread sees it, for an operation to check its ranges
/// against when it runs ([`State::check_range`]).
pub fn device_of(stream: usize) -> Option<i32> {
    stream_device(&state(), stream)
}

/// Checks a device range for the calling context (see [`State::check_range`]).
pub fn check_device(ptr: u64, bytes: usize) -> Result<(), String> {
    let Some(d) = current() else {
        return Err("no current context".into());
    };
    state().check_range(d, ptr, bytes)
}
