//! The CUDA device: cudarc with libraries loaded at run time.
//!
//! Nothing CUDA is linked: the binary builds and runs on machines without CUDA, and every entry
//! point checks that its library can be loaded before the first call (cudarc panics otherwise).
//! [`CudaDevice`] is a [`Device`]: memory on one GPU, one stream, the kernel program compiled by
//! NVRTC for the GPU's own architecture when the device opens, cuBLASLt for GEMMs ([`lt`]; fp32
//! with TF32 off, so the CPU reference's arithmetic), cuBLAS where cuBLASLt has no algorithm.
//! Errors inside a launch are recorded and reported by [`Device::sync`] (the
//! [`crate::backend::Backend`] methods cannot fail).
//!
//! Here: opening the GPU, memory, copies, launches, errors and waits. Beside it: what the
//! machine has ([`probe`]), the buffers ([`buffers`]), the environment settings ([`settings`]),
//! the GEMM calls ([`gemm_calls`], on cuBLASLt's plans in [`lt`] and cuBLAS's handle set up in
//! [`blas`]), the side stream ([`side`]), CUDA graphs ([`graphs`]) and the profile's timing
//! ([`timer`]).

pub mod compile;
pub mod gemm;
pub mod gemm_bench;
pub mod gemm_choice;
pub mod kernel_cache;
pub mod lt;
pub mod memo;
pub mod nccl;
pub mod ptxas;

mod blas;
mod buffers;
mod gemm_calls;
mod graphs;
mod probe;
mod settings;
mod side;
mod staging;
mod timer;

use blas::{fast_compute, lt_compute, lt_elem, set_math, set_workspace};
use buffers::{address, bind_ctx, narrow, size, widen};
pub use buffers::{DevBuf, DevIds, DevView, DevViewMut, Pinned};
use gemm_calls::{Batched, Packs, PACK_SLOTS};
use graphs::Captures;
pub use probe::{probe, require, CudaError, Probe};
pub use settings::{
    graphs_from_env, lt_from_env, pdl_from_env, rows_first_from_env, side_from_env,
    step_aside_from_env, HalfOperands, Pdl, SideStream,
};
use side::{Side, AHEAD};
use timer::Timer;

use std::collections::HashMap;
use std::ffi::c_void;
use std::marker::PhantomData;
use std::ops::Range;
use std::sync::{Arc, Mutex};

use cudarc::driver::{
    result as drv, sys as drv_sys, CudaContext, CudaEvent, CudaFunction, CudaSlice, CudaStream,
};
use cudarc::nvrtc::Ptx;

use super::device::{Arg, Device, DeviceMemory, Launch};
use super::kernels::{all_kernel_names, dtype_arg, gemm_pointers, grid1, int};
use super::profile::Profile;
use super::{Aside, Batch, Gemm};
use crate::precision::Dtype;
use memo::Memo;

/// One GPU (see the module docs).
pub struct CudaDevice {
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    functions: HashMap<&'static str, CudaFunction>,
    /// Never dropped as such: [`CudaDevice`]'s `Drop` destroys its handle (see there).
    blas: std::mem::ManuallyDrop<cudarc::cublas::CudaBlas>,
    /// cuBLAS's workspace ([`set_workspace`]), freed after the handle.
    _blas_workspace: CudaSlice<u8>,
    /// cuBLAS's version, as `cublasGetVersion` gives it (130000 and up for CUDA 13).
    blas_version: i32,
    /// The GEMMs' cuBLASLt handle and plans ([`lt`]), sharing cuBLAS's workspace; `None` with
    /// `RECIPE_GEMM_LIBRARY=cublas`.
    lt: Option<lt::Lt>,
    name: String,
    arch: String,
    /// The compute capability's major version (8 for sm_80).
    major: i32,
    error: Mutex<Option<String>>,
    /// Set by the first failed allocation: from then on nothing is queued (a buffer that was
    /// not allocated must not be written), and every [`Device::sync`] returns it.
    out_of_memory: Mutex<Option<String>>,
    /// Half-precision GEMMs' operands as fp16/bf16 bits ([`Device::gemm_half`]), each slot
    /// grown to the longest seen (the first step's shapes), and what each still holds.
    packed: Mutex<Packs>,
    /// [`Device::gemm_batched`]'s scratch.
    batched: Mutex<Batched>,
    /// With NCCL peers: how a wait keeps an eye on the group ([`CudaDevice::drain`]).
    watch: Mutex<Option<Arc<Watch>>>,
    /// The stream of [`Device::download_queued`]'s copies (non-blocking: it does not wait for
    /// the compute stream's later work), made at the first.
    copies: std::sync::OnceLock<Arc<CudaStream>>,
    /// Once [`Device::start_profile`] ran: each operation's events.
    timer: Mutex<Option<Timer>>,
    /// Whether `timer` is set: read before every operation, so that a run without a profile
    /// takes no lock for it.
    profiling: std::sync::atomic::AtomicBool,
    /// How a half-precision GEMM gets its fp16/bf16 operands ([`HalfOperands`]).
    operands: HalfOperands,
    /// Whether passes may be captured ([`graphs_from_env`]); then `stream` is a stream of its
    /// own, as the legacy default stream cannot be captured.
    graphs_on: bool,
    captures: Mutex<Captures>,
    /// The weight gradients' stream ([`Device::aside`]); `None` with `RECIPE_SIDE_STREAM=0` or
    /// without cuBLASLt (cuBLAS's handle is bound to the compute stream).
    side: Option<Side>,
    /// Whether the side stream is missing for want of memory for its workspace.
    side_missing: bool,
    /// Whether the compute and copy streams run ahead of the side stream
    /// ([`SideStream::Behind`], with graphs): their priority, and the graphs' per-node one.
    ahead: bool,
    /// Whether [`Device::update_aside`] uses the side stream ([`step_aside_from_env`]).
    step_aside: bool,
    /// Whether kernels go as programmatic dependent launches ([`pdl_from_env`], sm_90 on).
    pdl: bool,
    /// Whether a step by segments takes the word embeddings' rows first
    /// ([`rows_first_from_env`]; [`CudaDevice::rows_first`]).
    rows_first: bool,
    /// The free memory once the context was made, before anything of the run's
    /// ([`Device::memory`]'s `taken` is measured from it).
    free_at_open: Option<usize>,
    /// Pinned slots the token ids go up from ([`staging`]).
    ids_staging: Mutex<staging::IdsStaging>,
}

/// How a GPU that sums with others through NCCL waits for its stream: it polls the stream and
/// the communicator instead of blocking, so that a rank or node that fails mid-pass (whose
/// peers would otherwise wait inside an NCCL kernel forever) ends the wait with an error.
pub(crate) struct Watch {
    /// The communicator's asynchronous error, if it has one (`ncclCommGetAsyncError`).
    pub check: Box<dyn Fn() -> Option<String> + Send + Sync>,
    /// Aborts the communicator, which ends its pending kernels (`ncclCommAbort`).
    pub abort: Box<dyn Fn() + Send + Sync>,
    /// How long one wait may take before the group counts as failed (the collectives'
    /// timeout, `RECIPE_COLLECTIVE_TIMEOUT`).
    pub timeout: std::time::Duration,
}

impl std::fmt::Debug for CudaDevice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CudaDevice")
            .field("name", &self.name)
            .field("arch", &self.arch)
            .finish()
    }
}

fn driver_err(what: &str) -> impl Fn(drv::DriverError) -> CudaError + '_ {
    move |e| CudaError::Driver(format!("{what}: {e:?}"))
}

/// `bytes` as people read them.
fn human(bytes: usize) -> String {
    let b = bytes as f64;
    if b >= (1u64 << 30) as f64 {
        format!("{:.2} GiB", b / (1u64 << 30) as f64)
    } else {
        format!("{:.1} MiB", b / (1u64 << 20) as f64)
    }
}

/// `cuLaunchKernelEx` of `f` with `CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION`: a
/// programmatic dependent launch ([`pdl_from_env`]), which a capture records as a programmatic
/// edge of the graph.
///
/// # Safety
/// As `cuLaunchKernel`: `params` match `f`'s signature and `stream` is live.
unsafe fn launch_dependent(
    f: drv_sys::CUfunction,
    l: Launch,
    stream: drv_sys::CUstream,
    params: &mut [*mut c_void],
) -> Result<(), drv::DriverError> {
    // SAFETY: a plain C union; the attribute reads its `programmaticStreamSerializationAllowed`.
    let mut value: drv_sys::CUlaunchAttributeValue = unsafe { std::mem::zeroed() };
    value.programmaticStreamSerializationAllowed = 1;
    let mut attr = drv_sys::CUlaunchAttribute {
        id: drv_sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION,
        pad: [0; 4],
        value,
    };
    let config = drv_sys::CUlaunchConfig {
        gridDimX: l.grid.0,
        gridDimY: l.grid.1,
        gridDimZ: l.grid.2,
        blockDimX: l.block.0,
        blockDimY: l.block.1,
        blockDimZ: l.block.2,
        sharedMemBytes: l.smem,
        hStream: stream,
        attrs: &mut attr,
        numAttrs: 1,
    };
    // SAFETY: the caller's; `config` and `attr` outlive the call.
    unsafe {
        drv_sys::cuLaunchKernelEx(&config, f, params.as_mut_ptr(), std::ptr::null_mut()).result()
    }
}

impl CudaDevice {
    /// Opens GPU `ordinal`: checks the libraries, compiles the kernels for its architecture,
    /// loads them and creates the cuBLAS handle.
    pub fn open(ordinal: usize) -> Result<CudaDevice, CudaError> {
        let operands = HalfOperands::from_env()?;
        let graphs_on = graphs_from_env()?;
        let lt_on = lt_from_env()?;
        let side_on = side_from_env()?;
        let step_aside = step_aside_from_env()?;
        let rows_first = rows_first_from_env()?;
        let pdl = pdl_from_env()?;
        let algo = gemm_choice::Algo::from_env()?;
        if algo == gemm_choice::Algo::Fastest && !lt_on {
            return Err(CudaError::Setting(
                "RECIPE_GEMM_ALGO=fastest chooses among cuBLASLt's algorithms: unset RECIPE_GEMM_LIBRARY (docs/cuda.md, \"GEMMs\")".into(),
            ));
        }
        let p = require()?;
        if ordinal >= p.devices {
            return Err(CudaError::Driver(format!(
                "GPU {ordinal} asked for; the driver reports {}",
                p.devices
            )));
        }
        let ctx = CudaContext::new(ordinal).map_err(driver_err("opening the GPU"))?;
        // The context is current on this thread now.
        let free_at_open = drv::mem_get_info().ok().map(|(free, _)| free);
        let (major, minor) = ctx
            .compute_capability()
            .map_err(driver_err("compute capability"))?;
        let name = ctx.name().map_err(driver_err("device name"))?;
        let arch = format!("sm_{major}{minor}");
        let compiled = compile::compile_cached(&arch, compile::early_for(&arch, pdl))?;
        let module = ctx
            .load_module(Ptx::from_binary(compiled.cubin.clone()))
            .map_err(driver_err("loading the kernels"))?;
        let mut functions = HashMap::new();
        for k in all_kernel_names() {
            let f = module
                .load_function(k)
                .map_err(|e| CudaError::Driver(format!("kernel {k}: {e:?}")))?;
            functions.insert(k, f);
        }
        // One stream for the work, kernels in order: cudarc's per-buffer event tracking is not
        // needed. The copy stream (`download_queued`) is ordered after the work by an event.
        // SAFETY: the other stream of this context waits on explicit events.
        unsafe { ctx.disable_event_tracking() };
        // The legacy default stream cannot be captured: with graphs, a stream of its own (every
        // operation here names its stream; none relies on the default one's implicit order).
        // The compute stream ahead of the side stream: a priority needs a stream of its own,
        // so with graphs only (the legacy stream has the default priority).
        let ahead = graphs_on && lt_on && side_on == SideStream::Behind;
        let stream = match (graphs_on, ahead) {
            (true, true) => ctx.new_stream_with_priority(AHEAD),
            (true, false) => ctx.new_stream(),
            (false, _) => Ok(ctx.default_stream()),
        }
        .map_err(driver_err("creating a stream"))?;
        let blas = cudarc::cublas::CudaBlas::new(stream.clone())
            .map_err(|e| CudaError::Driver(format!("cuBLAS: {e:?}")))?;
        let blas_workspace = set_workspace(&blas, &stream, major)?;
        let blas_version = set_math(&blas)?;
        let lt = if lt_on {
            let at = cudarc::driver::DevicePtr::device_ptr(&blas_workspace, &stream).0;
            let mut lt = lt::Lt::new(at, blas_workspace.len()).map_err(|why| {
                CudaError::Driver(format!(
                    "cuBLASLt: {why} (RECIPE_GEMM_LIBRARY=cublas runs the GEMMs on cuBLAS alone)"
                ))
            })?;
            if algo == gemm_choice::Algo::Fastest {
                let key = lt.device_key(&name, &arch);
                lt.keep_choices(key);
            }
            Some(lt)
        } else {
            None
        };
        // Without room for its workspace, one stream: the run goes on as with
        // `RECIPE_SIDE_STREAM=0`, and `libraries` says so.
        let side_on = side_on != SideStream::Off;
        let side = if lt.is_some() && side_on {
            let stream = ctx
                .new_stream()
                .map_err(driver_err("creating the side stream"))?;
            let join = ctx
                .new_event(None)
                .map_err(driver_err("creating the side stream's event"))?;
            stream
                .alloc_zeros::<u8>(blas_workspace.len())
                .ok()
                .map(|workspace| Side {
                    stream,
                    workspace,
                    open: Default::default(),
                    state: Mutex::default(),
                    updates: Mutex::default(),
                    join,
                })
        } else {
            None
        };
        let side_missing = lt.is_some() && side_on && side.is_none();
        Ok(CudaDevice {
            ctx,
            stream,
            functions,
            blas: std::mem::ManuallyDrop::new(blas),
            _blas_workspace: blas_workspace,
            blas_version,
            lt,
            name,
            arch,
            major,
            error: Mutex::new(None),
            out_of_memory: Mutex::new(None),
            packed: Mutex::new(Packs {
                memo: Memo::new(PACK_SLOTS),
                bufs: (0..PACK_SLOTS).map(|_| None).collect(),
            }),
            batched: Mutex::default(),
            watch: Mutex::new(None),
            copies: std::sync::OnceLock::new(),
            timer: Mutex::new(None),
            profiling: std::sync::atomic::AtomicBool::new(false),
            operands,
            graphs_on,
            captures: Mutex::default(),
            ahead: ahead && side.is_some(),
            step_aside: step_aside && side.is_some(),
            // griddepcontrol is Hopper's (PTX ISA 7.8, sm_90).
            pdl: pdl.launches() && major >= 9,
            rows_first,
            side,
            side_missing,
            free_at_open,
            ids_staging: Mutex::default(),
        })
    }

    /// Whether `RECIPE_ROWS_FIRST=1` asked a step by segments for the word embeddings' rows
    /// first (`Kernels::with_rows_first`, which `recipe run` sets from it).
    pub fn rows_first(&self) -> bool {
        self.rows_first
    }

    /// The GPU's name and architecture, e.g. ("NVIDIA H200", "sm_90").
    pub fn describe(&self) -> (&str, &str) {
        (&self.name, &self.arch)
    }

    /// The libraries this device runs on, e.g. "driver 13.0, NVRTC 13.0, cuBLAS 130100, cuBLASLt
    /// 130100, weight gradients on a second stream": which copies the loader found (a CUDA 12
    /// cuBLAS found first by its unversioned name would show here), and, once GEMMs ran, how
    /// many of their shapes cuBLASLt had no algorithm for ([`lt::Lt::describe`]), and where the
    /// weight gradients run ([`SideStream`]).
    pub fn libraries(&self) -> String {
        let driver = probe().driver_version;
        let nvrtc = compile::nvrtc_version()
            .map_or_else(|e| format!("? ({e})"), |(a, b)| format!("{a}.{b}"));
        let lt = self
            .lt
            .as_ref()
            .map_or_else(|| "GEMMs on cuBLAS".to_string(), |lt| lt.describe());
        let streams = match (&self.side, self.side_missing) {
            (Some(_), _) if self.ahead => "weight gradients on a second stream, behind the rest",
            (Some(_), _) => "weight gradients on a second stream",
            (None, true) => "one stream (no memory for a second GEMM workspace)",
            (None, false) if self.lt.is_some() => "one stream (RECIPE_SIDE_STREAM=0)",
            (None, false) => "one stream",
        };
        let step = if self.step_aside {
            ", the step beside the next forward"
        } else {
            ""
        };
        format!(
            "driver {}.{}, NVRTC {nvrtc}, cuBLAS {}, {lt}, {streams}{step}",
            driver / 1000,
            driver % 1000 / 10,
            self.blas_version
        )
    }

    /// Makes this GPU's context the calling thread's current one. The raw driver and cuBLAS
    /// calls below act on the current context, and a run on several GPUs opens every device on
    /// the main thread but drives each from its rank's thread; cudarc's own stream calls bind
    /// themselves. Cheap when already bound (one `cuCtxGetCurrent`).
    fn bind(&self) {
        if let Err(e) = bind_ctx(&self.ctx) {
            self.record("the GPU's context (an earlier asynchronous error)", e);
        }
    }

    /// Waits for the stream's work. cudarc's `synchronize` returns an error an earlier
    /// asynchronous call left in the context without waiting, so after one it waits a second
    /// time: the host must not read a buffer a copy is still writing. With NCCL peers
    /// ([`Watch`]) it polls instead, and a communicator that reports an error, or a wait longer
    /// than the collectives' timeout, aborts the communicator (which ends its kernels), records
    /// why, and then waits.
    fn drain(&self, what: &str) {
        self.join_aside();
        let watch = self.watch.lock().unwrap_or_else(|p| p.into_inner()).clone();
        if let Some(w) = watch {
            self.watched(what, &w);
        }
        self.blocking(what);
    }

    /// Polls the stream until it is idle, the group reports an error, or the timeout passes.
    fn watched(&self, what: &str, w: &Watch) {
        self.watched_stream(what, w, &self.stream)
    }

    /// [`CudaDevice::watched`] for `stream` (the compute stream, or the copy stream, which may
    /// hold queued NCCL sums).
    fn watched_stream(&self, what: &str, w: &Watch, stream: &CudaStream) {
        // SAFETY: the stream is this device's, alive while `self` is.
        self.watched_query(what, w, || unsafe {
            drv_sys::cuStreamQuery(stream.cu_stream())
        })
    }

    /// Polls `query` (a stream's or an event's: done, not ready, or an error) as
    /// [`CudaDevice::watched_stream`] polls a stream.
    fn watched_query(&self, what: &str, w: &Watch, query: impl Fn() -> drv_sys::CUresult) {
        use drv_sys::CUresult;
        self.bind();
        let start = std::time::Instant::now();
        let mut pause = std::time::Duration::from_micros(10);
        loop {
            match query() {
                CUresult::CUDA_SUCCESS => return,
                CUresult::CUDA_ERROR_NOT_READY => {}
                // An error of the work itself: the blocking wait records it.
                _ => return,
            }
            if let Some(e) = (w.check)() {
                self.record_text(format!(
                    "{what}: NCCL reported an error while GPU {} waited for its work: {e}; another rank or node failed (its own output says why)",
                    self.ctx.ordinal()
                ));
                (w.abort)();
                return;
            }
            if start.elapsed() >= w.timeout {
                self.record_text(format!(
                    "{what}: GPU {} waited {:?} for its work, which includes NCCL sums with the other ranks: a rank or node stopped (its own output says why), so the communicator was aborted (RECIPE_COLLECTIVE_TIMEOUT sets the wait)",
                    self.ctx.ordinal(),
                    w.timeout
                ));
                (w.abort)();
                return;
            }
            std::thread::sleep(pause);
            pause = (pause * 2).min(std::time::Duration::from_millis(1));
        }
    }

    /// Queues `f`'s one operation on the stream between two timing events when profiling
    /// ([`Device::start_profile`]); just `f` otherwise. The lock is not held while `f` runs,
    /// which may queue operations of its own (timed apart).
    pub(crate) fn timed<T>(&self, name: &'static str, f: impl FnOnce() -> T) -> T {
        if !self.profiling.load(std::sync::atomic::Ordering::Relaxed) {
            return f();
        }
        let events = {
            let mut t = self.timer.lock().unwrap_or_else(|p| p.into_inner());
            t.as_mut()
                .and_then(|t| Some((t.event(&self.ctx)?, t.event(&self.ctx)?)))
        };
        let Some((start, end)) = events else {
            return f();
        };
        let recorded = start.record(&self.stream).is_ok();
        let r = f();
        let recorded = recorded && end.record(&self.stream).is_ok();
        let mut t = self.timer.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(t) = t.as_mut() {
            if recorded {
                t.pending.push((name, start, end));
                if t.pending.len() >= Timer::LIMIT {
                    t.resolve();
                }
            } else {
                t.free.extend([start, end]);
            }
        }
        r
    }

    /// Installs the watch of the communicator this device sums through ([`nccl`]).
    pub(crate) fn set_watch(&self, w: Watch) {
        *self.watch.lock().unwrap_or_else(|p| p.into_inner()) = Some(Arc::new(w));
    }

    fn blocking(&self, what: &str) {
        self.join_aside();
        if let Err(e) = self.stream.synchronize() {
            self.record(what, e);
            if let Err(e) = self.stream.synchronize() {
                self.record(what, e);
            }
        }
    }

    /// Whether an allocation failed ([`CudaDevice::out_of_memory`]).
    fn failed(&self) -> bool {
        self.out_of_memory
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .is_some()
    }

    /// Stops queueing work from now on, as a failed allocation does ([`CudaDevice::failed`]):
    /// every [`Device::sync`] returns `text`.
    fn stop(&self, text: String) {
        let mut slot = self.out_of_memory.lock().unwrap_or_else(|p| p.into_inner());
        slot.get_or_insert(text);
    }

    /// Records a failed allocation of `bytes` (the first one's words are kept): the run stops
    /// at the next [`Device::sync`] with what the GPU had free and what to change, rather than
    /// panicking or queueing work on a buffer that does not exist.
    fn out_of_memory(&self, what: &str, bytes: usize, e: drv::DriverError) {
        // An allocation also fails after the GPU faulted (every call of a dead context
        // returns the fault): then the fault, recorded earlier, is the run's error, not memory
        // (found by runtime/fake-cuda's review).
        if e.0 != drv_sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY {
            let earlier = self.error.lock().unwrap_or_else(|p| p.into_inner()).clone();
            let text =
                earlier.unwrap_or_else(|| format!("{what} of {} failed: {e:?}", human(bytes)));
            let mut slot = self.out_of_memory.lock().unwrap_or_else(|p| p.into_inner());
            slot.get_or_insert(text);
            return;
        }
        let mut slot = self.out_of_memory.lock().unwrap_or_else(|p| p.into_inner());
        if slot.is_some() {
            return;
        }
        self.bind();
        let free = match drv::mem_get_info() {
            Ok((free, total)) => format!("{} of {} free", human(free), human(total)),
            Err(_) => "its free memory unknown".into(),
        };
        *slot = Some(format!(
            "GPU {} ({}) is out of memory: {what} of {} failed ({e:?}) with {free}; lower \
             batch.micro or data.max_len, partition the model states over several GPUs \
             (zero 1–3), or offload the optimizer (offload optimizer = cpu)",
            self.ctx.ordinal(),
            self.name,
            human(bytes)
        ));
    }

    /// Queues the copy of `dst.len` elements of `T` (the view's element type) at `src` into
    /// `dst` on the copy stream ([`Device::upload_queued`], [`Device::upload_queued_bits`]).
    ///
    /// # Safety
    /// `src` points at `dst.len` `T`s of pinned host memory that stay allocated and unwritten,
    /// and nothing reads or writes `dst`, until [`Device::wait_copies`] has returned.
    unsafe fn queue_upload<T: cudarc::driver::DeviceRepr>(
        &self,
        dst: DevViewMut<'_>,
        src: *const T,
    ) {
        if self.failed() || dst.len == 0 {
            return;
        }
        self.wrote();
        let Some(copies) = self.copy_stream() else {
            return;
        };
        // SAFETY: `dst` is a live allocation of `dst.len` elements of `T`'s size, and `src`
        // pinned host memory of as many, both left alone until `wait_copies` (the caller's
        // contract).
        let r = unsafe {
            let src = std::slice::from_raw_parts(src, dst.len);
            drv::memcpy_htod_async(dst.ptr, src, copies.cu_stream())
        };
        if let Err(e) = r {
            self.record("a queued upload", e);
        }
    }

    /// The address of `slot`, grown to hold `n` elements of `T`; `None` when that allocation
    /// failed (recorded as an allocation of `what`).
    fn grow_scratch<T: cudarc::driver::DeviceRepr + cudarc::driver::ValidAsZeroBits>(
        &self,
        slot: &mut Option<CudaSlice<T>>,
        n: usize,
        what: &str,
    ) -> Option<u64> {
        if self.failed() {
            return None;
        }
        if slot.as_ref().is_none_or(|s| s.len() < n) {
            // A graph may hold the old address: outside a capture every graph goes (a replay
            // then finds none and the pass runs directly); inside one, the capture fails
            // without allocating (a captured allocation would be the graph's memory), and the
            // operation is skipped, as nothing captured runs.
            let old = {
                let mut c = self.captures.lock().unwrap_or_else(|p| p.into_inner());
                if let Some(first) = c.capturing.as_mut() {
                    first.get_or_insert_with(|| format!("{what} during a capture"));
                    return None;
                }
                std::mem::take(&mut c.graphs)
            };
            // Bound outside the lock: a failed bind records its error, which takes it.
            if !old.is_empty() {
                self.bind();
                drop(old);
            }
            match self.stream.alloc_zeros::<T>(n.max(1)) {
                Ok(s) => *slot = Some(s),
                Err(e) => {
                    self.out_of_memory(what, n * std::mem::size_of::<T>(), e);
                    return None;
                }
            }
        }
        let s = slot.as_mut()?;
        Some(cudarc::driver::DevicePtrMut::device_ptr_mut(s, &self.stream).0)
    }

    /// `n` elements of `src` (of type `from`) converted into `dst` (of type `to`) by the
    /// `convert` kernel: a scratch copy inside a GEMM, which the memo of packed operands need
    /// not hear of (its caller reports what the GEMM writes).
    fn convert_raw(&self, (dst, to): (u64, Dtype), (src, from): (u64, Dtype), n: usize) {
        if n > 0 {
            self.launch_raw(
                "convert",
                grid1(n),
                &[Arg::Typed(dst, to), Arg::Typed(src, from), int(n)],
            );
        }
    }

    /// The stream of the queued copies (made at the first), ordered after the work queued so
    /// far on the compute stream (an event it waits for; the compute stream goes on with the
    /// next kernels meanwhile); `None` when that failed (recorded).
    fn copy_stream(&self) -> Option<&Arc<CudaStream>> {
        self.bind();
        let copies = match self.copies.get() {
            Some(c) => c,
            None => match if self.ahead {
                self.ctx.new_stream_with_priority(AHEAD)
            } else {
                self.ctx.new_stream()
            } {
                Ok(c) => self.copies.get_or_init(|| c),
                Err(e) => {
                    self.record("creating the copy stream", e);
                    return None;
                }
            },
        };
        // After the side stream's work too: the copies read what they write.
        self.join_aside();
        if let Err(e) = copies.join(&self.stream) {
            self.record("ordering a copy after the work", e);
            return None;
        }
        Some(copies)
    }

    /// Keeps the first error for [`Device::sync`].
    fn record(&self, what: &str, e: impl std::fmt::Debug) {
        self.record_text(format!("{what}: {e:?}"));
    }

    /// Keeps the first error, in these words, for [`Device::sync`]; during a capture, for the
    /// capture (which then fails, and the pass runs directly: an operation a graph cannot hold
    /// is refused by the driver without running).
    fn record_text(&self, text: String) {
        if let Some(first) = self
            .captures
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .capturing
            .as_mut()
        {
            first.get_or_insert(text);
            return;
        }
        let mut slot = self.error.lock().unwrap_or_else(|p| p.into_inner());
        if slot.is_none() {
            *slot = Some(text);
        }
    }

    /// Host → device copy of any plain type into a new allocation; `None` when it failed.
    fn upload_plain<T: cudarc::driver::DeviceRepr>(&self, src: &[T]) -> Option<CudaSlice<T>> {
        if self.failed() {
            return None;
        }
        self.wrote(); // new memory, perhaps where a packed source was
        match self.outside_capture("an upload", || self.stream.clone_htod(src)) {
            Ok(s) => Some(s),
            Err(e) => {
                self.out_of_memory("an upload", std::mem::size_of_val(src), e);
                None
            }
        }
    }

    /// Copies `host` into `dst` (same length).
    pub fn upload_into(&self, dst: &mut DevViewMut<'_>, host: &[f32]) {
        if self.failed() {
            return;
        }
        self.bind();
        assert_eq!(dst.len, host.len(), "upload length");
        self.wrote();
        let r = if dst.elem.is_half() {
            let bits = narrow(host, dst.elem);
            // SAFETY: `dst` is a live allocation of `len` 16-bit values; the copy is staged
            // from pageable memory before this returns, so `bits` may go.
            self.timed("memcpy host→device", || unsafe {
                drv::memcpy_htod_async(dst.ptr, &bits[..], self.stream.cu_stream())
            })
        } else {
            // SAFETY: `dst` is a live allocation of `host.len()` floats.
            self.timed("memcpy host→device", || unsafe {
                drv::memcpy_htod_async(dst.ptr, host, self.stream.cu_stream())
            })
        };
        if let Err(e) = r {
            self.record("upload", e);
        }
    }

    /// A zero-filled buffer of `n` elements of `elem` (F32, or a half dtype: 16 bits each).
    fn alloc_as(&self, n: usize, elem: Dtype) -> DevBuf {
        if self.failed() {
            return DevBuf {
                mem: None,
                len: n,
                elem,
            };
        }
        self.wrote(); // new memory, perhaps where a packed source was
        let floats = (n as u64 * size(elem)).div_ceil(4) as usize;
        let mem = self.outside_capture("an allocation", || {
            self.stream.alloc_zeros::<f32>(floats.max(1))
        });
        match mem {
            Ok(mem) => DevBuf {
                mem: Some(mem),
                len: n,
                elem,
            },
            Err(e) => {
                self.out_of_memory("an allocation", 4 * floats, e);
                DevBuf {
                    mem: None,
                    len: n,
                    elem,
                }
            }
        }
    }

    /// Device memory may have been written: no packed operand is current any more.
    pub(crate) fn wrote(&self) {
        self.packed
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .memo
            .bump();
    }

    /// A GEMM wrote `elems` floats at `c`: packed copies of what it overlaps are stale.
    fn gemm_wrote(&self, c: u64, elems: usize) {
        self.packed
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .memo
            .written(c, 4 * elems as u64);
    }

    /// Launches kernel `name` (see [`Device::launch`], which also tells the memo of packed
    /// operands that memory may have changed; this does not, for the GEMMs' own packs and
    /// address lists).
    fn launch_raw(&self, name: &'static str, l: Launch, args: &[Arg]) {
        self.launch_on(name, l, args, &self.stream)
    }

    /// [`CudaDevice::launch_raw`] on `stream` (the compute stream, or the side stream).
    fn launch_on(&self, name: &'static str, l: Launch, args: &[Arg], stream: &CudaStream) {
        let Some(f) = self.functions.get(name) else {
            panic!("kernel `{name}` is not in runtime/kernels");
        };
        if self.failed() {
            return;
        }
        self.bind();
        let mut slots = Arg::slots(args);
        let mut params: Vec<*mut c_void> = slots
            .iter_mut()
            .map(|s| s as *mut u64 as *mut c_void)
            .collect();
        // SAFETY: the parameters match the kernel's signature (the emulation tests run the same
        // launch code against the same source); device pointers come from live views.
        let r = self.timed(name, || unsafe {
            if self.pdl {
                launch_dependent(f.cu_function(), l, stream.cu_stream(), &mut params)
            } else {
                drv::launch_kernel(
                    f.cu_function(),
                    l.grid,
                    l.block,
                    l.smem,
                    stream.cu_stream(),
                    &mut params,
                )
            }
        });
        if let Err(e) = r {
            self.record(name, e);
        }
    }

    /// `(free, total)` bytes of this GPU's memory, as the driver reports them.
    pub fn mem_info(&self) -> Option<(usize, usize)> {
        self.bind();
        drv::mem_get_info().ok()
    }

    /// The context (for collectives and pinned memory).
    pub fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }
}

impl Drop for CudaDevice {
    fn drop(&mut self) {
        // cuBLAS's handle is destroyed on its own GPU's context (the main thread drops every
        // rank's device), and its error ignored: cudarc's own drop unwraps it, which would end
        // a finished run with a panic after a sticky GPU error. The `CudaBlas` shell (a stream
        // reference) is left undropped, so the handle is not destroyed twice.
        let _ = bind_ctx(&self.ctx);
        // SAFETY: the handle came from `CudaBlas::new`, every GEMM using it was synchronised by
        // the step that queued it, and it is not used after this.
        let _ = unsafe { cudarc::cublas::result::destroy_handle(*self.blas.handle()) };
    }
}

impl Device for CudaDevice {
    type Buf = DevBuf;
    type View<'a> = DevView<'a>;
    type ViewMut<'a> = DevViewMut<'a>;
    type Ids = DevIds;
    type Pinned = Pinned;

    fn alloc(&self, n: usize) -> DevBuf {
        self.alloc_as(n, Dtype::F32)
    }

    /// 16 bits per value where the GEMMs read them as they are: fp16 anywhere, bf16 from sm_80
    /// on (before, `gemm_half` runs the f32 GEMM, which needs f32 operands).
    fn has_mma(&self) -> bool {
        self.major >= 8
    }

    fn alloc_half(&self, n: usize, half: Dtype) -> DevBuf {
        self.alloc_as(n, self.half_elem(half))
    }

    /// fp16 on every GPU; bf16 from sm_80 on, where the tensor cores take it (before, the
    /// GEMMs run in f32 and read f32 buffers).
    fn half_elem(&self, half: Dtype) -> Dtype {
        let sixteen = half == Dtype::F16 || (half == Dtype::Bf16 && self.major >= 8);
        if sixteen {
            half
        } else {
            Dtype::F32
        }
    }

    fn elem(&self, v: DevView<'_>) -> Dtype {
        v.elem
    }

    fn resize(&self, b: &mut DevBuf, n: usize) -> bool {
        let capacity = b
            .mem
            .as_ref()
            .map_or(0, |m| 4 * m.len() as u64 / size(b.elem));
        if n as u64 <= capacity {
            b.len = n;
            return false;
        }
        // The old memory is released outside a capture too (a captured release of memory the
        // graph did not allocate is an error).
        self.outside_capture("an allocation", || *b = self.alloc_as(n, b.elem));
        true
    }

    fn alloc_pinned(&self, n: usize) -> Pinned {
        // Flags 0, not cudarc's default `alloc_pinned` (write-combined): the host reads the
        // gradients and writes the parameters, and reading write-combined memory is uncached.
        // SAFETY: the memory is zero-filled below before anything reads it.
        let locked = unsafe { self.ctx.alloc_pinned_with_flags::<f32>(n.max(1), 0) }
            .ok()
            .and_then(|mut s| s.as_mut_ptr().ok().map(|p| (s, p)));
        let mut p = match locked {
            Some((slice, ptr)) => Pinned {
                _slice: Some(slice),
                _pageable: Vec::new(),
                ptr,
                len: n,
            },
            // The system would not lock more memory: ordinary memory, copied through the
            // driver's staging buffer.
            None => {
                let mut v = vec![0.0f32; n.max(1)];
                Pinned {
                    _slice: None,
                    ptr: v.as_mut_ptr(),
                    _pageable: v,
                    len: n,
                }
            }
        };
        p.fill(0.0);
        p
    }

    fn upload(&self, src: &[f32]) -> DevBuf {
        if src.is_empty() || self.failed() {
            return self.alloc(src.len());
        }
        DevBuf {
            mem: self.upload_plain(src),
            len: src.len(),
            elem: Dtype::F32,
        }
    }

    fn range_mut<'a>(&self, b: &'a mut DevBuf, r: Range<usize>) -> DevViewMut<'a> {
        let mut v = self.view_mut(b);
        let s = self.sub_mut(&mut v, r);
        DevViewMut {
            ptr: s.ptr,
            len: s.len,
            elem: s.elem,
            _borrow: PhantomData,
        }
    }

    fn write(&self, mut dst: DevViewMut<'_>, src: &[f32]) {
        self.upload_into(&mut dst, src);
    }

    fn write_ids(&self, dst: &mut DevIds, src: &[u32]) -> bool {
        self.bind();
        if src.is_empty() || self.failed() {
            return false; // nothing a kernel reads (or runs)
        }
        let Some(mem) = dst.0.as_mut().filter(|m| m.len() >= src.len()) else {
            // The old ids released outside a capture too, as `resize`'s.
            self.outside_capture("an upload", || *dst = self.upload_ids(src));
            return true;
        };
        let (ptr, _sync) = cudarc::driver::DevicePtrMut::device_ptr_mut(mem, &self.stream);
        self.wrote();
        // SAFETY: `dst` is a live allocation of at least `src.len()` ids.
        let r = self.timed("memcpy host→device", || unsafe {
            self.copy_ids_up(ptr, src)
        });
        if let Err(e) = r {
            self.record("upload", e);
        }
        false
    }

    fn upload_ids(&self, src: &[u32]) -> DevIds {
        if src.is_empty() {
            return DevIds(self.upload_plain(&[0u32]));
        }
        DevIds(self.upload_plain(src))
    }

    fn download(&self, src: DevView<'_>, dst: &mut [f32]) {
        if self.failed() {
            return;
        }
        self.bind();
        assert_eq!(src.len, dst.len(), "download length");
        if src.elem.is_half() {
            let mut bits = vec![0u16; src.len];
            // SAFETY: `src` is a live allocation of `len` 16-bit values; the stream is
            // synchronised before `bits` is read.
            let r = self.timed("memcpy device→host", || unsafe {
                drv::memcpy_dtoh_async(&mut bits[..], src.ptr, self.stream.cu_stream())
            });
            if let Err(e) = r {
                self.record("download", e);
            }
            self.drain("download");
            widen(&bits, dst, src.elem);
            return;
        }
        // SAFETY: `src` is a live allocation of `dst.len()` floats; the stream is synchronised
        // before `dst` is read.
        let r = self.timed("memcpy device→host", || unsafe {
            drv::memcpy_dtoh_async(dst, src.ptr, self.stream.cu_stream())
        });
        if let Err(e) = r {
            self.record("download", e);
        }
        self.drain("download");
    }

    fn view<'a>(&self, b: &'a DevBuf) -> DevView<'a> {
        DevView {
            ptr: address(&b.mem, &self.stream),
            len: b.len,
            elem: b.elem,
            _borrow: PhantomData,
        }
    }

    fn view_mut<'a>(&self, b: &'a mut DevBuf) -> DevViewMut<'a> {
        let ptr = b.mem.as_mut().map_or(0, |m| {
            cudarc::driver::DevicePtrMut::device_ptr_mut(m, &self.stream).0
        });
        DevViewMut {
            ptr,
            len: b.len,
            elem: b.elem,
            _borrow: PhantomData,
        }
    }

    fn sub<'a>(&self, v: DevView<'a>, r: Range<usize>) -> DevView<'a>
    where
        Self: 'a,
    {
        assert!(r.start <= r.end && r.end <= v.len, "sub {r:?} of {}", v.len);
        DevView {
            ptr: v.ptr + size(v.elem) * r.start as u64,
            len: r.len(),
            elem: v.elem,
            _borrow: PhantomData,
        }
    }

    fn as_view<'a, 'b>(&self, v: &'b DevViewMut<'a>) -> DevView<'b>
    where
        'a: 'b,
    {
        DevView {
            ptr: v.ptr,
            len: v.len,
            elem: v.elem,
            _borrow: PhantomData,
        }
    }

    fn sub_mut<'a, 'b>(&self, v: &'b mut DevViewMut<'a>, r: Range<usize>) -> DevViewMut<'b>
    where
        'a: 'b,
    {
        assert!(
            r.start <= r.end && r.end <= v.len,
            "sub_mut {r:?} of {}",
            v.len
        );
        DevViewMut {
            ptr: v.ptr + size(v.elem) * r.start as u64,
            len: r.len(),
            elem: v.elem,
            _borrow: PhantomData,
        }
    }

    fn split_at_mut<'a, 'b>(
        &self,
        v: &'b mut DevViewMut<'a>,
        mid: usize,
    ) -> (DevViewMut<'b>, DevViewMut<'b>)
    where
        'a: 'b,
    {
        assert!(mid <= v.len, "split_at_mut {mid} of {}", v.len);
        (
            DevViewMut {
                ptr: v.ptr,
                len: mid,
                elem: v.elem,
                _borrow: PhantomData,
            },
            DevViewMut {
                ptr: v.ptr + size(v.elem) * mid as u64,
                len: v.len - mid,
                elem: v.elem,
                _borrow: PhantomData,
            },
        )
    }

    fn len(&self, v: DevView<'_>) -> usize {
        v.len
    }

    fn len_mut(&self, v: &DevViewMut<'_>) -> usize {
        v.len
    }

    fn ptr(&self, v: DevView<'_>) -> u64 {
        v.ptr
    }

    fn ptr_mut(&self, v: &mut DevViewMut<'_>) -> u64 {
        v.ptr
    }

    fn ids_ptr(&self, ids: &DevIds) -> u64 {
        address(&ids.0, &self.stream)
    }

    fn zero(&self, dst: DevViewMut<'_>) {
        if self.failed() {
            return;
        }
        self.bind();
        self.wrote();
        // Inside an `aside` call (a segment's update zeroing its gradient) on the side stream.
        let stream = self
            .side_lane(true)
            .map_or(&self.stream, |side| &side.stream);
        // SAFETY: `dst` is a live allocation of `len` floats.
        let bytes = size(dst.elem) as usize * dst.len;
        let r = self.timed("memset", || unsafe {
            drv::memset_d8_async(dst.ptr, 0, bytes, stream.cu_stream())
        });
        if let Err(e) = r {
            self.record("zero", e);
        }
    }

    fn copy(&self, dst: DevViewMut<'_>, src: DevView<'_>) {
        if self.failed() {
            return;
        }
        self.bind();
        assert_eq!(dst.len, src.len, "copy lengths");
        assert_eq!(dst.elem, src.elem, "copy between element types");
        let bytes = size(src.elem) as usize * src.len;
        self.wrote();
        // SAFETY: both are live allocations of `len` floats.
        let r = self.timed("memcpy device→device", || unsafe {
            drv::memcpy_dtod_async(dst.ptr, src.ptr, bytes, self.stream.cu_stream())
        });
        if let Err(e) = r {
            self.record("copy", e);
        }
    }

    fn launch(&self, name: &'static str, l: Launch, args: &[Arg]) {
        self.wrote();
        // Inside an `aside` call the model's kernels go to the side stream too (the packs and
        // address lists of GEMMs stay on the compute stream: `launch_raw`).
        match self.side_lane(true) {
            Some(side) => self.launch_on(name, l, args, &side.stream),
            None => self.launch_raw(name, l, args),
        }
    }

    fn aside(&self, f: impl FnOnce()) -> Aside {
        self.run_aside(f)
    }

    fn wait_aside(&self, t: Aside) {
        self.run_wait_aside(t);
    }

    fn update_aside(&self, seg: usize, f: impl FnOnce()) {
        self.run_update_aside(seg, f);
    }

    fn updates_aside(&self, f: impl FnOnce()) {
        self.run_updates_aside(f);
    }

    fn wait_update(&self, seg: usize) {
        self.run_wait_update(seg);
    }

    fn join_aside(&self) {
        self.run_join_aside();
    }

    fn gemm(&self, g: &Gemm, a: DevView<'_>, b: DevView<'_>, c: DevViewMut<'_>) {
        self.run_gemm(g, a, b, c);
    }

    fn gemm_half(&self, g: &Gemm, a: DevView<'_>, b: DevView<'_>, c: DevViewMut<'_>, half: Dtype) {
        self.run_gemm_half(g, a, b, c, half);
    }

    fn gemm_batched(
        &self,
        g: &Gemm,
        batch: &Batch,
        a: DevView<'_>,
        b: DevView<'_>,
        c: DevViewMut<'_>,
        operands: Dtype,
    ) {
        self.run_gemm_batched(g, batch, a, b, c, operands);
    }

    fn reserve_gemm_batched(&self, count: usize, wide: usize) {
        self.run_reserve_gemm_batched(count, wide);
    }

    fn reserve_gemm_half(&self, elems: usize) {
        self.run_reserve_gemm_half(elems);
    }

    unsafe fn download_queued(&self, src: DevView<'_>, dst: *mut f32) {
        assert_eq!(src.elem, Dtype::F32, "a queued download of a 16-bit buffer");
        if self.failed() || src.len == 0 {
            return;
        }
        let Some(copies) = self.copy_stream() else {
            return;
        };
        // SAFETY: `src` is a live allocation of `src.len` floats that the caller's contract
        // keeps unwritten, and `dst` pinned host memory of as many floats that it keeps
        // untouched, until `wait_copies`.
        let r = unsafe {
            let dst = std::slice::from_raw_parts_mut(dst, src.len);
            drv::memcpy_dtoh_async(dst, src.ptr, copies.cu_stream())
        };
        if let Err(e) = r {
            self.record("a queued download", e);
        }
    }

    unsafe fn upload_queued(&self, dst: DevViewMut<'_>, src: *const f32) {
        assert_eq!(dst.elem, Dtype::F32, "a queued upload into a 16-bit buffer");
        // SAFETY: the caller's contract.
        unsafe { self.queue_upload(dst, src) }
    }

    unsafe fn upload_queued_bits(&self, dst: DevViewMut<'_>, src: *const u16) {
        assert!(
            dst.elem.is_half(),
            "a queued upload of 16 bits into an f32 buffer"
        );
        // SAFETY: the caller's contract.
        unsafe { self.queue_upload(dst, src) }
    }

    fn wait_copies(&self) -> Result<(), String> {
        if let Some(c) = self.copies.get() {
            self.bind();
            // The copy stream may hold NCCL sums (`Peers::all_reduce_sum_queued`): watched as
            // the compute stream's waits are.
            let watch = self.watch.lock().unwrap_or_else(|p| p.into_inner()).clone();
            if let Some(w) = watch {
                self.watched_stream("the queued copies and sums", &w, c);
            }
            if let Err(e) = c.synchronize() {
                self.record("the queued copies and sums", e);
            }
        }
        self.sync()
    }

    /// The compute stream waits for an event recorded on the copy stream after what is queued
    /// there; the host does not wait.
    fn join_copies(&self) -> Result<(), String> {
        if let Some(c) = self.copies.get() {
            self.bind();
            if let Err(e) = self.stream.join(c) {
                self.record("ordering the work after the queued copies and sums", e);
            }
        }
        // Errors surface at the next sync, as every queued operation's.
        Ok(())
    }

    fn start_profile(&self) -> bool {
        let mut t = self.timer.lock().unwrap_or_else(|p| p.into_inner());
        *t = Some(Timer {
            pending: Vec::new(),
            free: Vec::new(),
            profile: Profile::default(),
            first: None,
        });
        self.profiling
            .store(true, std::sync::atomic::Ordering::Relaxed);
        true
    }

    fn profile(&self) -> Option<Profile> {
        self.bind();
        let mut t = self.timer.lock().unwrap_or_else(|p| p.into_inner());
        let t = t.as_mut()?;
        t.resolve();
        Some(t.profile.clone())
    }

    fn memory(&self) -> Option<DeviceMemory> {
        let (free, total) = self.mem_info()?;
        Some(DeviceMemory {
            taken: self.free_at_open?.saturating_sub(free) as u64,
            free: free as u64,
            total: total as u64,
        })
    }

    fn sync(&self) -> Result<(), String> {
        self.drain("synchronize");
        let oom = self.out_of_memory.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(e) = &*oom {
            // For good: the buffers it did not allocate stay missing.
            return Err(e.clone());
        }
        drop(oom);
        match self.error.lock().unwrap_or_else(|p| p.into_inner()).take() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    fn begin_capture(&self) -> bool {
        self.run_begin_capture()
    }

    fn end_capture(&self) -> Option<u64> {
        self.run_end_capture()
    }

    fn launch_graph(&self, id: u64) -> bool {
        self.run_launch_graph(id)
    }

    fn drop_graph(&self, id: u64) {
        self.run_drop_graph(id);
    }
}
