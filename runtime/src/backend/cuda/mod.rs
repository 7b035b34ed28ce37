//! The CUDA device: cudarc with libraries loaded at run time.
//!
//! Nothing CUDA is linked: the binary builds and runs on machines without CUDA, and every entry
//! point checks that its library can be loaded before the first call (cudarc panics otherwise).
//! [`CudaDevice`] is a [`Device`]: memory on one GPU, one stream, the kernel program compiled by
//! NVRTC for the GPU's own architecture when the device opens, cuBLASLt for GEMMs ([`lt`]; fp32
//! with TF32 off, so the CPU reference's arithmetic), cuBLAS where cuBLASLt has no algorithm.
//! Errors inside a launch are recorded and reported by [`Device::sync`] (the
//! [`crate::backend::Backend`] methods cannot fail).

pub mod compile;
pub mod gemm;
pub mod gemm_bench;
pub mod gemm_choice;
pub mod kernel_cache;
pub mod lt;
pub mod memo;
pub mod nccl;
pub mod ptxas;

use std::collections::HashMap;
use std::ffi::c_void;
use std::marker::PhantomData;
use std::ops::Range;
use std::sync::{Arc, Mutex};

use cudarc::driver::{
    result as drv, sys as drv_sys, CudaContext, CudaEvent, CudaFunction, CudaSlice, CudaStream,
};
use cudarc::nvrtc::Ptx;

use super::device::{Arg, Device, Launch};
use super::kernels::{all_kernel_names, dtype_arg, gemm_pointers, grid1, int};
use super::profile::Profile;
use super::{Aside, Batch, Gemm};
use crate::precision::Dtype;
use memo::Memo;

/// Why the CUDA backend cannot run here.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CudaError {
    /// libcuda.so.1 cannot be loaded.
    #[error("no CUDA driver (libcuda.so.1) found; use --device cpu")]
    NoDriver,
    /// The driver loads but reports no device.
    #[error("the CUDA driver reports no GPU; use --device cpu")]
    NoDevice,
    /// The driver is older than the CUDA 13 the kernels and cuBLAS are built for.
    #[error(
        "the CUDA driver supports CUDA {0}.{1}; the kernels (NVRTC 13.0) and cuBLAS 13 need CUDA 13.0 or newer (driver 580 or newer): update the driver, or use --device cpu"
    )]
    OldDriver(i32, i32),
    /// libnvrtc cannot be loaded.
    #[error(
        "NVRTC (libnvrtc.so.13) not found: install the pinned wheel (`pip install nvidia-cuda-nvrtc==13.0.88`) and put its nvidia/cu13/lib folder on LD_LIBRARY_PATH (docs/cuda.md)"
    )]
    NoNvrtc,
    /// libcublas cannot be loaded.
    #[error(
        "cuBLAS (libcublas.so.13) not found: install `nvidia-cublas` and put its nvidia/cu13/lib folder on LD_LIBRARY_PATH (docs/cuda.md)"
    )]
    NoCublas,
    /// NVRTC refused the kernels (the log says where).
    #[error("the CUDA kernels did not compile: {0}")]
    Compile(String),
    /// A driver or cuBLAS call failed.
    #[error("CUDA: {0}")]
    Driver(String),
    /// An environment setting of the CUDA backend has a value it does not know.
    #[error("{0}")]
    Setting(String),
}

/// What this machine offers, without touching anything that could panic.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Probe {
    /// libcuda loads.
    pub driver: bool,
    /// GPUs the driver reports (0 without a driver).
    pub devices: usize,
    /// The CUDA version the driver supports, as `cuDriverGetVersion` gives it (13000 for 13.0;
    /// 0 without a driver).
    pub driver_version: i32,
    /// libnvrtc loads.
    pub nvrtc: bool,
    /// libcublas loads.
    pub cublas: bool,
}

/// Looks for the driver, GPUs, NVRTC and cuBLAS.
pub fn probe() -> Probe {
    // SAFETY: each check only tries to dlopen a library by its candidate names.
    let driver = unsafe { drv_sys::is_culib_present() };
    let init = driver && drv::init().is_ok();
    let devices = if init {
        drv::device::get_count().map_or(0, |n| n.max(0) as usize)
    } else {
        0
    };
    let mut driver_version = 0;
    if init {
        // SAFETY: the driver is loaded and initialised; the call writes one int.
        let r = unsafe { drv_sys::cuDriverGetVersion(&mut driver_version) };
        if r != drv_sys::CUresult::CUDA_SUCCESS {
            driver_version = 0;
        }
    }
    Probe {
        driver,
        devices,
        driver_version,
        nvrtc: compile::nvrtc_present(),
        cublas: unsafe { cudarc::cublas::sys::is_culib_present() },
    }
}

/// Everything a run needs, or the first thing missing.
pub fn require() -> Result<Probe, CudaError> {
    let p = probe();
    if !p.driver {
        return Err(CudaError::NoDriver);
    }
    if p.devices == 0 {
        return Err(CudaError::NoDevice);
    }
    if p.driver_version < 13000 {
        let v = p.driver_version;
        return Err(CudaError::OldDriver(v / 1000, v % 1000 / 10));
    }
    if !p.nvrtc {
        return Err(CudaError::NoNvrtc);
    }
    if !p.cublas {
        return Err(CudaError::NoCublas);
    }
    Ok(p)
}

/// A read-only view of device memory (a pointer and a length; `Copy`, as the backend needs).
#[derive(Debug, Clone, Copy)]
pub struct DevView<'a> {
    ptr: u64,
    len: usize,
    /// F32, or the half dtype of a 16-bit buffer ([`Device::alloc_half`]).
    elem: Dtype,
    _borrow: PhantomData<&'a CudaSlice<f32>>,
}

/// A writable view of device memory.
#[derive(Debug)]
pub struct DevViewMut<'a> {
    ptr: u64,
    len: usize,
    elem: Dtype,
    _borrow: PhantomData<&'a mut CudaSlice<f32>>,
}

/// Bytes per element of a buffer of `elem`.
fn size(elem: Dtype) -> u64 {
    if elem.is_half() {
        2
    } else {
        4
    }
}

/// `src` as the 16 bits of `half`, rounded to nearest even (exact for values stored rounded).
fn narrow(src: &[f32], half: Dtype) -> Vec<u16> {
    src.iter().map(|&x| half.bits(x)).collect()
}

/// 16-bit values of `half` as floats (exact).
fn widen(src: &[u16], dst: &mut [f32], half: Dtype) {
    for (d, &b) in dst.iter_mut().zip(src) {
        *d = half.from_bits(b);
    }
}

/// Token ids, labels or masks on the device: an allocation, of which a batch uses a prefix
/// (the kernels take their lengths as arguments).
#[derive(Debug)]
pub struct DevIds(Option<CudaSlice<u32>>);

/// Makes `ctx` the calling thread's current context. cudarc's `bind_to_thread` first returns
/// (and clears) an error an earlier asynchronous call left in the context, without binding, so
/// after such an error it is called a second time to bind; the first error is returned.
fn bind_ctx(ctx: &CudaContext) -> Result<(), drv::DriverError> {
    match ctx.bind_to_thread() {
        Ok(()) => Ok(()),
        Err(first) => {
            let _ = ctx.bind_to_thread();
            Err(first)
        }
    }
}

// Device memory is freed stream-ordered on the current context (cudarc's `CudaSlice::drop`,
// `cuMemFreeAsync` on the stream it was allocated on: the device's, the legacy default one or,
// with CUDA graphs, one of its own; `CudaDevice::outside_capture` keeps releases out of a
// capture), and a run on several GPUs drops every rank's buffers on
// the main thread, whose current context is the last GPU opened: each buffer binds its own
// context first.
impl Drop for DevIds {
    fn drop(&mut self) {
        if let Some(m) = &self.0 {
            let _ = bind_ctx(m.context());
        }
    }
}

/// A device buffer of `len` floats: its allocation may be longer, from a longer batch, so that a
/// workspace resized for a shorter one allocates nothing ([`Device::resize`]).
#[derive(Debug)]
pub struct DevBuf {
    /// `None` when the allocation failed (`CudaDevice::out_of_memory`: nothing runs on the
    /// device after that, so nothing reads it).
    mem: Option<CudaSlice<f32>>,
    len: usize,
    /// F32, or the half dtype of a 16-bit buffer (two elements per float of `mem`).
    elem: Dtype,
}

impl Drop for DevBuf {
    fn drop(&mut self) {
        // As `DevIds`: freed on its own GPU's context.
        if let Some(m) = &self.mem {
            let _ = bind_ctx(m.context());
        }
    }
}

/// A buffer's device address, 0 for a failed allocation.
fn address<T>(mem: &Option<CudaSlice<T>>, stream: &Arc<CudaStream>) -> u64 {
    mem.as_ref()
        .map_or(0, |m| cudarc::driver::DevicePtr::device_ptr(m, stream).0)
}

/// Page-locked host memory ([`Device::Pinned`]), allocated by
/// [`CudaContext::alloc_pinned_with_flags`]; ordinary memory when the system refuses to lock
/// more (the copies are then staged by the driver: slower, the same bytes).
pub struct Pinned {
    /// Owns the allocation (freed on drop); read through `ptr`.
    _slice: Option<cudarc::driver::PinnedHostSlice<f32>>,
    /// The fallback's memory, when not page-locked.
    _pageable: Vec<f32>,
    ptr: *mut f32,
    /// The floats asked for (the allocation has at least one).
    len: usize,
}

// SAFETY: `ptr` points into `_slice`'s allocation, which `Pinned` owns (cudarc marks
// `PinnedHostSlice` Send and Sync); it is moved, never shared, between threads.
unsafe impl Send for Pinned {}

impl std::ops::Deref for Pinned {
    type Target = [f32];
    fn deref(&self) -> &[f32] {
        // SAFETY: `ptr` points at `_slice`'s (or `_pageable`'s) `len` or more floats, alive
        // while `self` is (a Vec's heap buffer does not move with it).
        // Copies into or out of it go through [`Device::download`]/[`Device::write`], which the
        // caller synchronises before reading (the runtime's device calls sync at every step).
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }
}

impl std::ops::DerefMut for Pinned {
    fn deref_mut(&mut self) -> &mut [f32] {
        // SAFETY: as `deref`, and `&mut self` makes it the only view.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }
}

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
}

/// How [`Device::gemm_half`] and [`Device::gemm_batched`] hand their operands, f32 buffers
/// holding fp16/bf16 values, to the tensor cores. Both give the same products (the values
/// convert exactly) with f32 accumulation; which is faster is the GPU's and cuBLAS's to say, so
/// `RECIPE_HALF_GEMM` picks it and `scripts/gpu-throughput.sh` measures both (docs/cuda.md,
/// "Half-precision GEMMs").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HalfOperands {
    /// `pack_half` writes each operand's 16-bit copy (a pass over it: 4 bytes read, 2 written)
    /// and cuBLAS runs its fp16/bf16 GEMM on the copies (`RECIPE_HALF_GEMM=pack`, the default).
    Pack,
    /// cuBLAS reads the f32 operands and converts them itself (`CUBLAS_COMPUTE_32F_FAST_16F` /
    /// `_16BF`: "automatic down-conversion" to fp16/bf16, or to TF32, which holds fp16 and bf16
    /// values exactly too), no pass of ours (`RECIPE_HALF_GEMM=convert`).
    Convert,
}

impl HalfOperands {
    /// `RECIPE_HALF_GEMM`'s choice; `Err` names a value it does not know.
    pub fn from_env() -> Result<HalfOperands, CudaError> {
        Self::parse(std::env::var("RECIPE_HALF_GEMM").ok().as_deref())
    }

    /// The choice a value of `RECIPE_HALF_GEMM` (`None`: unset) makes.
    pub fn parse(v: Option<&str>) -> Result<HalfOperands, CudaError> {
        match v {
            None | Some("" | "pack") => Ok(HalfOperands::Pack),
            Some("convert") => Ok(HalfOperands::Convert),
            Some(other) => Err(CudaError::Setting(format!(
                "RECIPE_HALF_GEMM={other}: expected `pack` (the default) or `convert` (docs/cuda.md, \"Half-precision GEMMs\")"
            ))),
        }
    }
}

/// Whether the device captures passes as CUDA graphs ([`Device::begin_capture`]): yes unless
/// `RECIPE_CUDA_GRAPHS=0`. On by default since they paid on an H200 (1.08× on BERT-base, 1.16×
/// on the main job, the same losses bit for bit: docs/cuda.md, "CUDA graphs"). `Err` names a
/// value it does not know.
pub fn graphs_from_env() -> Result<bool, CudaError> {
    graphs_parse(std::env::var("RECIPE_CUDA_GRAPHS").ok().as_deref())
}

/// The choice a value of `RECIPE_CUDA_GRAPHS` (`None`: unset) makes.
fn graphs_parse(v: Option<&str>) -> Result<bool, CudaError> {
    switch(
        ("RECIPE_CUDA_GRAPHS", v),
        ["1", "0"],
        "`1` (capture, the default) or `0` (direct launches) (docs/cuda.md, \"CUDA graphs\")",
    )
}

/// A two-way setting `(name, value)`: `on` (or unset, or empty) is true, `off` false, and
/// anything else refused by name with what `expected` says.
fn switch(
    (name, v): (&str, Option<&str>),
    [on, off]: [&str; 2],
    expected: &str,
) -> Result<bool, CudaError> {
    match v {
        None | Some("") => Ok(true),
        Some(x) if x == on => Ok(true),
        Some(x) if x == off => Ok(false),
        Some(other) => Err(CudaError::Setting(format!(
            "{name}={other}: expected {expected}"
        ))),
    }
}

/// Whether the GEMMs run through cuBLASLt ([`lt`]): yes unless `RECIPE_GEMM_LIBRARY=cublas`,
/// which runs them through cuBLAS's `cublasGemmEx` family as before (for an A/B on a GPU,
/// `scripts/gpu-throughput.sh`). `Err` names a value it does not know.
pub fn lt_from_env() -> Result<bool, CudaError> {
    lt_parse(std::env::var("RECIPE_GEMM_LIBRARY").ok().as_deref())
}

/// The choice a value of `RECIPE_GEMM_LIBRARY` (`None`: unset) makes.
fn lt_parse(v: Option<&str>) -> Result<bool, CudaError> {
    switch(
        ("RECIPE_GEMM_LIBRARY", v),
        ["cublaslt", "cublas"],
        "`cublaslt` (the default) or `cublas` (docs/cuda.md, \"GEMMs\")",
    )
}

/// Whether a step's parameter updates run on the side stream beside the next forward
/// ([`Device::update_aside`]): yes unless `RECIPE_STEP_ASIDE=0` (an A/B for
/// `scripts/gpu-throughput.sh`; docs/cuda.md, "The step beside the forward"). Without a side
/// stream they run on the compute stream either way. `Err` names a value it does not know.
pub fn step_aside_from_env() -> Result<bool, CudaError> {
    step_aside_parse(std::env::var("RECIPE_STEP_ASIDE").ok().as_deref())
}

/// The choice a value of `RECIPE_STEP_ASIDE` (`None`: unset) makes.
fn step_aside_parse(v: Option<&str>) -> Result<bool, CudaError> {
    switch(
        ("RECIPE_STEP_ASIDE", v),
        ["1", "0"],
        "`1` (the optimizer's step beside the next forward, the default) or `0` (before it) (docs/cuda.md, \"The step beside the forward\")",
    )
}

/// How our kernels are launched (`RECIPE_PDL`; docs/cuda.md, "Programmatic dependent
/// launch"; off by default until timed: A/Bs for `scripts/gpu-throughput.sh`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pdl {
    /// Each after the kernel ahead of it in its stream has finished (`0`, the default).
    Off,
    /// As programmatic dependent launches on sm_90 and newer (`1`): a kernel may be scheduled
    /// while the kernel ahead of it finishes (its blocks exiting), and waits for it in its
    /// first statement (`GRID_WAIT` in common.cuh).
    On,
    /// As `On`, and each kernel signals right after that wait that the next may be scheduled
    /// (`early`: `griddepcontrol.launch_dependents`, the program compiled with
    /// `RECIPE_PDL_EARLY`), so that the next kernel's blocks take the SMs the last of this
    /// one's leave, instead of being launched once those have exited.
    Early,
}

impl Pdl {
    /// Whether kernels go as programmatic dependent launches.
    pub fn launches(self) -> bool {
        self != Pdl::Off
    }
}

/// [`Pdl`]'s choice. `Err` names a value it does not know.
pub fn pdl_from_env() -> Result<Pdl, CudaError> {
    pdl_parse(std::env::var("RECIPE_PDL").ok().as_deref())
}

/// The choice a value of `RECIPE_PDL` (`None`: unset) makes.
fn pdl_parse(v: Option<&str>) -> Result<Pdl, CudaError> {
    match v {
        None | Some("") | Some("0") => Ok(Pdl::Off),
        Some("1") => Ok(Pdl::On),
        Some("early") => Ok(Pdl::Early),
        Some(other) => Err(CudaError::Setting(format!(
            "RECIPE_PDL={other}: expected `0` (each kernel launched after the one ahead of it, the default), `1` (programmatic dependent launches on sm_90 and newer) or `early` (those, each kernel letting the next be scheduled once it has waited) (docs/cuda.md, \"Programmatic dependent launch\")"
        ))),
    }
}

/// Where [`Device::aside`]'s work runs (`RECIPE_SIDE_STREAM`; docs/cuda.md, "GEMMs").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SideStream {
    /// On a second stream, behind the compute stream: with CUDA graphs the compute and copy
    /// streams get a higher priority than the side stream's default one (kernel nodes keep
    /// their stream's priority from the capture: `CUDA_GRAPH_INSTANTIATE_FLAG_USE_NODE_PRIORITY`),
    /// so the block scheduler starts the critical path's pending blocks first and the side
    /// stream's fill the SMs left over (`1`, the default).
    Behind,
    /// On a second stream of the same priority (`equal`, for an A/B on a GPU).
    Equal,
    /// On the compute stream (`0`).
    Off,
}

/// [`SideStream`]'s choice (`scripts/gpu-throughput.sh` times each). `Err` names a value it
/// does not know.
pub fn side_from_env() -> Result<SideStream, CudaError> {
    side_parse(std::env::var("RECIPE_SIDE_STREAM").ok().as_deref())
}

/// The choice a value of `RECIPE_SIDE_STREAM` (`None`: unset) makes.
fn side_parse(v: Option<&str>) -> Result<SideStream, CudaError> {
    match v {
        None | Some("" | "1") => Ok(SideStream::Behind),
        Some("equal") => Ok(SideStream::Equal),
        Some("0") => Ok(SideStream::Off),
        Some(other) => Err(CudaError::Setting(format!(
            "RECIPE_SIDE_STREAM={other}: expected `1` (weight gradients on a second stream behind the compute stream, the default), `equal` (a second stream of the same priority) or `0` (one stream) (docs/cuda.md, \"GEMMs\")"
        ))),
    }
}

/// The priority of the compute and copy streams when the side stream runs behind them
/// ([`SideStream::Behind`]): above the default 0 (a lower number is a higher priority; CUDA
/// clamps a value outside the device's range, `cuCtxGetStreamPriorityRange`, to it).
const AHEAD: i32 = -1;

/// The second stream of [`Device::aside`]'s work, with a cuBLASLt workspace of its own (two
/// GEMMs running at once must not share one; cuBLAS's documentation asks the same of a handle
/// used on several streams for its results to be reproducible), both made when the GPU opens:
/// nothing is allocated in the step loop or in a capture.
struct Side {
    stream: Arc<CudaStream>,
    workspace: CudaSlice<u8>,
    /// Inside a [`Device::aside`] call: its work may go to the side stream. Outside one (every
    /// forward kernel), a launch reads this flag and takes no lock.
    open: std::sync::atomic::AtomicBool,
    state: Mutex<SideState>,
    /// [`Device::update_aside`]'s event of each parameter segment, made at its first use and
    /// then recorded again at each update: a graph captured with a wait on it
    /// ([`Device::wait_update`]) waits on its latest record at every replay.
    updates: Mutex<Vec<Option<CudaEvent>>>,
}

/// What [`Side`]'s stream holds that the compute stream has not waited for.
struct SideState {
    /// A GEMM or kernel of the open call went there.
    used: bool,
    /// Work went there since the compute stream last waited for all of it.
    pending: bool,
    /// Each ticket's event (ticket `i + 1`), recorded on the side stream after its call's
    /// work; cleared when the compute stream waits for everything.
    events: Vec<cudarc::driver::CudaEvent>,
    /// The ticket of `events[0]`: tickets count from 1 ([`Aside::DONE`] is 0).
    first: usize,
}

impl Default for SideState {
    fn default() -> SideState {
        SideState {
            used: false,
            pending: false,
            events: Vec::new(),
            first: 1,
        }
    }
}

/// How the device captures: thread-local, so that other ranks' threads, driving other GPUs,
/// may allocate and synchronise meanwhile.
const CAPTURE_MODE: drv_sys::CUstreamCaptureMode =
    drv_sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL;

/// A captured graph. cudarc's `CudaGraph` holds raw driver handles, which CUDA lets any thread
/// use as long as the calls on one graph are serialised (driver API, "Graph object thread
/// safety"): it is only used under [`Captures`]' lock.
struct Graph(cudarc::driver::CudaGraph);

// SAFETY: see above; every use is under the `captures` mutex.
unsafe impl Send for Graph {}

/// The device's CUDA graphs ([`Device::begin_capture`]).
#[derive(Default)]
struct Captures {
    /// A capture under way, and the first error in it (which fails it instead of the run).
    capturing: Option<Option<String>>,
    graphs: HashMap<u64, Graph>,
    next: u64,
}

/// Packed operand slots: a GEMM's two, and two more so that the operands a following GEMM
/// reads again (the output gradient of a linear, the input of Q, K and V) are still there
/// ([`memo`]).
const PACK_SLOTS: usize = 4;

/// [`Device::gemm_half`]'s packed operands.
struct Packs {
    memo: Memo,
    bufs: Vec<Option<CudaSlice<u16>>>,
}

/// [`Device::gemm_batched`]'s scratch, each grown to the largest seen.
#[derive(Default)]
struct Batched {
    /// The operand addresses of the last batch: `A`'s, `B`'s, then `C`'s.
    list: Option<CudaSlice<u64>>,
    /// An f32 batch's 16-bit `A`, `B` and `C` widened to f32 (each operand's extent, its
    /// layout kept, so the items' offsets stay the same).
    wide: [Option<CudaSlice<f32>>; 3],
}

/// [`Device::profile`] on a GPU: every operation on the stream between two events, whose
/// elapsed time is read once the GPU has passed them (at a synchronisation, or after
/// [`Timer::LIMIT`] operations), then the events are reused.
struct Timer {
    pending: Vec<(&'static str, CudaEvent, CudaEvent)>,
    free: Vec<CudaEvent>,
    profile: Profile,
    /// The first operation's start: the profile's span runs from it to the latest end.
    first: Option<CudaEvent>,
}

impl Timer {
    /// Operations kept pending before the oldest are read (a wait for the GPU to reach them).
    const LIMIT: usize = 8192;

    /// A timing event (a new one when none is free); `None` when the driver would not make one.
    fn event(&mut self, ctx: &Arc<CudaContext>) -> Option<CudaEvent> {
        self.free.pop().or_else(|| {
            ctx.new_event(Some(drv_sys::CUevent_flags::CU_EVENT_DEFAULT))
                .ok()
        })
    }

    /// Adds every pending operation's time to the profile (waiting for the GPU to finish
    /// them); an event the driver cannot time is skipped.
    fn resolve(&mut self) {
        let mut last = None;
        for (name, start, end) in self.pending.drain(..) {
            if let Ok(ms) = start.elapsed_ms(&end) {
                self.profile.add(name, f64::from(ms) / 1e3);
            }
            match self.first {
                None => self.first = Some(start),
                Some(_) => self.free.push(start),
            }
            // The stream runs them in order: the last end is the latest.
            if let Some(before) = last.replace(end) {
                self.free.push(before);
            }
        }
        if let Some(end) = last {
            if let Some(Ok(ms)) = self.first.as_ref().map(|f| f.elapsed_ms(&end)) {
                self.profile.span = self.profile.span.max(f64::from(ms) / 1e3);
            }
            self.free.push(end);
        }
    }
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

/// The compute type with which cuBLAS converts f32 operands to `half` itself
/// ([`HalfOperands::Convert`]).
fn fast_compute(half: Dtype) -> cudarc::cublas::sys::cublasComputeType_t {
    use cudarc::cublas::sys::cublasComputeType_t as C;
    if half == Dtype::F16 {
        C::CUBLAS_COMPUTE_32F_FAST_16F
    } else {
        C::CUBLAS_COMPUTE_32F_FAST_16BF
    }
}

/// cuBLAS's element type as [`lt::Elem`] (the GEMMs here use these three).
fn lt_elem(t: cudarc::cublas::sys::cudaDataType) -> lt::Elem {
    use cudarc::cublas::sys::cudaDataType as T;
    match t {
        T::CUDA_R_16F => lt::Elem::F16,
        T::CUDA_R_16BF => lt::Elem::Bf16,
        _ => lt::Elem::F32,
    }
}

/// cuBLAS's compute type as [`lt::Compute`].
fn lt_compute(c: cudarc::cublas::sys::cublasComputeType_t) -> lt::Compute {
    use cudarc::cublas::sys::cublasComputeType_t as C;
    match c {
        C::CUBLAS_COMPUTE_32F_FAST_16F => lt::Compute::Fast16F,
        C::CUBLAS_COMPUTE_32F_FAST_16BF => lt::Compute::Fast16Bf,
        _ => lt::Compute::F32,
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

/// Gives cuBLAS a workspace of its own, allocated once: the size cuBLAS's documentation
/// recommends (`cublasSetWorkspace`: 32 MiB on Hopper, 4 MiB before). Without one cuBLAS
/// allocates its own when it needs it, in the step loop, and inside a CUDA graph's capture
/// once per graph (PyTorch sets one for that reason, pytorch/pytorch#83461).
fn set_workspace(
    blas: &cudarc::cublas::CudaBlas,
    stream: &Arc<CudaStream>,
    major: i32,
) -> Result<CudaSlice<u8>, CudaError> {
    let bytes: usize = if major >= 9 { 32 << 20 } else { 4 << 20 };
    let workspace = stream
        .alloc_zeros::<u8>(bytes)
        .map_err(driver_err("cuBLAS's workspace"))?;
    let ptr = cudarc::driver::DevicePtr::device_ptr(&workspace, stream).0;
    // SAFETY: the handle is live, and the workspace a device allocation of `bytes` on its
    // context that outlives it (`CudaDevice` frees it after destroying the handle).
    let status = unsafe {
        cudarc::cublas::sys::cublasSetWorkspace_v2(
            *blas.handle(),
            ptr as *mut std::ffi::c_void,
            bytes,
        )
    };
    if status != cudarc::cublas::sys::cublasStatus_t::CUBLAS_STATUS_SUCCESS {
        return Err(CudaError::Driver(format!(
            "cuBLAS's workspace (cublasSetWorkspace): {status:?}"
        )));
    }
    Ok(workspace)
}

/// Sets the handle's math mode to the default's (no TF32: fp32 GEMMs stay exact fp32) with
/// `CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION`: without it cuBLAS may sum a split-K
/// GEMM's partial results in its fp16/bf16 output type, so a 16-bit output would be rounded
/// more than once, where the CPU rounds the fp32 sum once (docs/cuda.md "16-bit buffers";
/// PyTorch sets the same flag when `allow_fp16_reduced_precision_reduction` is off). Returns
/// cuBLAS's version.
fn set_math(blas: &cudarc::cublas::CudaBlas) -> Result<i32, CudaError> {
    use cudarc::cublas::sys;
    let ok = sys::cublasStatus_t::CUBLAS_STATUS_SUCCESS;
    // SAFETY: the handle is live.
    let status = unsafe {
        sys::cublasSetMathMode(
            *blas.handle(),
            sys::cublasMath_t::CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION,
        )
    };
    if status != ok {
        return Err(CudaError::Driver(format!(
            "cuBLAS's math mode (cublasSetMathMode): {status:?}"
        )));
    }
    let mut version = 0;
    // SAFETY: the handle is live; the call writes one int.
    let status = unsafe { sys::cublasGetVersion_v2(*blas.handle(), &mut version) };
    if status != ok {
        return Err(CudaError::Driver(format!(
            "cuBLAS's version (cublasGetVersion): {status:?}"
        )));
    }
    Ok(version)
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
            stream
                .alloc_zeros::<u8>(blas_workspace.len())
                .ok()
                .map(|workspace| Side {
                    stream,
                    workspace,
                    open: Default::default(),
                    state: Mutex::default(),
                    updates: Mutex::default(),
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
            side,
            side_missing,
        })
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

    /// Runs a GEMM through cuBLASLt ([`lt`]) and says so, or says it did not: no cuBLASLt
    /// (`RECIPE_GEMM_LIBRARY=cublas`), an empty GEMM (cuBLAS's quick return), no algorithm for
    /// the shape, or a `cublasLtMatmul` that refused the call (a status, nothing queued: the
    /// shape then stays on cuBLAS, and the self-test names it); the caller then runs cuBLAS's
    /// call. `ptrs` are the column-major call's first operand (our `B`), second (our `A`) and
    /// C.
    ///
    /// `direct`: the operands are the caller's buffers, not scratch a later GEMM's packs may
    /// overwrite, so inside an [`Device::aside`] call the GEMM may go to the side stream
    /// ([`CudaDevice::side_lane`]).
    fn through_lt(
        &self,
        shape: &lt::Shape,
        g: &Gemm,
        ptrs: [u64; 3],
        name: &'static str,
        direct: bool,
    ) -> bool {
        let Some(lt) = &self.lt else {
            return false;
        };
        if shape.cm.m == 0 || shape.cm.n == 0 || shape.cm.k == 0 {
            return false;
        }
        self.choose_algorithm(lt, shape, (g.alpha, g.beta), ptrs);
        if !lt.ready(shape) {
            return false;
        }
        let (stream, workspace) = match self.side_lane(direct) {
            Some(side) => (
                side.stream.cu_stream(),
                Some(cudarc::driver::DevicePtr::device_ptr(&side.workspace, &side.stream).0),
            ),
            None => (self.stream.cu_stream(), None),
        };
        // SAFETY: the callers check that the operands hold every item's extent for the shape,
        // whose alignments are their addresses' (`lt::alignment`); the stream is this device's
        // (the compute stream, or the side stream with its own workspace, as long as the
        // main one), its context bound by the caller.
        let r = self.timed(name, || unsafe {
            lt.matmul(
                shape,
                (g.alpha, g.beta),
                ptrs,
                stream as *mut c_void,
                workspace,
            )
        });
        match r {
            Ok(()) => true,
            Err(lt::Refused::Failed(e)) => {
                lt.refuse(shape, format!("cublasLtMatmul: {e:?}"));
                false
            }
            // `ready` made the plan, so not reached; cuBLAS would run it.
            Err(lt::Refused::NoAlgorithm) => false,
        }
    }

    /// The side stream for a kernel, or a GEMM that reads its operands as they are (`direct`),
    /// inside an open [`Device::aside`] call, ordered after everything queued on the compute
    /// stream so far (an event it waits for). `None`: no side stream, no open call, or a
    /// profile, whose events time the compute stream's operations one after another.
    fn side_lane(&self, direct: bool) -> Option<&Side> {
        use std::sync::atomic::Ordering::Relaxed;
        let side = self.side.as_ref()?;
        if !direct || !side.open.load(Relaxed) || self.profiling.load(Relaxed) {
            return None;
        }
        let mut st = side.state.lock().unwrap_or_else(|p| p.into_inner());
        if let Err(e) = side.stream.join(&self.stream) {
            self.record("ordering work on the side stream", e);
            return None;
        }
        st.used = true;
        st.pending = true;
        Some(side)
    }

    /// Runs `f` with the side stream open to its launches ([`CudaDevice::side_lane`]): whether
    /// any went there, for the caller to mark. False inside an open call (whose mark covers
    /// `f`'s work) and when nothing went aside (profiling, a failed device: in order with the
    /// rest).
    fn open_side(&self, side: &Side, f: impl FnOnce()) -> bool {
        use std::sync::atomic::Ordering::Relaxed;
        if side.open.swap(true, Relaxed) {
            f();
            return false;
        }
        side.state.lock().unwrap_or_else(|p| p.into_inner()).used = false;
        f();
        side.open.store(false, Relaxed);
        side.state.lock().unwrap_or_else(|p| p.into_inner()).used
    }

    /// `f` on segment `seg`'s event of [`Device::update_aside`], made at its first use.
    fn on_update_event(
        &self,
        side: &Side,
        seg: usize,
        f: impl FnOnce(&CudaEvent) -> Result<(), cudarc::driver::DriverError>,
    ) -> Result<(), cudarc::driver::DriverError> {
        let mut all = side.updates.lock().unwrap_or_else(|p| p.into_inner());
        if all.len() <= seg {
            all.resize_with(seg + 1, || None);
        }
        if all[seg].is_none() {
            all[seg] = Some(self.ctx.new_event(None)?);
        }
        f(all[seg].as_ref().expect("made above"))
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
        use drv_sys::{cuStreamQuery, CUresult};
        self.bind();
        let start = std::time::Instant::now();
        let mut pause = std::time::Duration::from_micros(10);
        loop {
            // SAFETY: the stream is this device's, alive while `self` is.
            match unsafe { cuStreamQuery(stream.cu_stream()) } {
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

    /// Runs `f` (an allocation, or the release of memory) for real even during a capture: the
    /// capture is ended and its graph discarded (failing the capture, as `what`), `f` runs on
    /// the stream, and a new capture begins, which records the rest of the pass for nothing;
    /// [`Device::end_capture`] then reports the failure and the pass runs directly
    /// (`model/graphs.rs`), with the new memory. Inside the capture the driver would make the
    /// allocation a node of the graph, an address with no memory behind it outside the graph's
    /// replays, and a release of memory the graph did not allocate is an error. A pass captured
    /// after its shape's direct run allocates nothing; this keeps an exception from writing
    /// through such an address.
    fn outside_capture<R>(&self, what: &str, f: impl FnOnce() -> R) -> R {
        let failing = {
            let mut c = self.captures.lock().unwrap_or_else(|p| p.into_inner());
            match c.capturing.as_mut() {
                Some(first) => {
                    first.get_or_insert_with(|| format!("{what} during a capture"));
                    true
                }
                None => false,
            }
        };
        if !failing {
            return f();
        }
        self.bind();
        if !self.discard_capture() {
            return f(); // already outside (a nested call)
        }
        let r = f();
        // SAFETY: this device's stream, no longer capturing.
        if let Err(e) = unsafe { drv::stream::begin_capture(self.stream.cu_stream(), CAPTURE_MODE) }
        {
            // The rest of the pass would run directly, and then again: stop queueing instead.
            self.stop(format!(
                "GPU {}: resuming a CUDA graph's capture after {what}: {e:?} (RECIPE_CUDA_GRAPHS=0 runs without graphs)",
                self.ctx.ordinal()
            ));
        }
        r
    }

    /// Ends the stream's capture, if it is capturing (or cannot say), and destroys what it
    /// recorded; whether it was capturing. Raw driver calls: cudarc's would return early on an
    /// error left in the context and leave the stream capturing. The context must be bound.
    fn discard_capture(&self) -> bool {
        self.join_aside();
        let stream = self.stream.cu_stream();
        // SAFETY: this device's stream, on its bound context.
        let status = unsafe { drv::stream::is_capturing(stream) };
        if status.is_ok_and(|s| s == drv_sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE)
        {
            return false;
        }
        // SAFETY: as above; the graph it returns is destroyed here, once.
        if let Ok(g) = unsafe { drv::stream::end_capture(stream) } {
            if !g.is_null() {
                let _ = unsafe { drv::graph::destroy(g) };
            }
        }
        true
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

    /// Whether a capture is under way ([`Device::begin_capture`]).
    fn capturing(&self) -> bool {
        self.captures
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .capturing
            .is_some()
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

    /// The address of the half bits of the `n` floats at `src`, and its slot: a slot that
    /// still holds them ([`Memo`]), else the least recently used one but `keep` (grown when
    /// shorter), packed now. Address 0 when that allocation failed (recorded).
    fn pack(
        &self,
        packs: &mut Packs,
        src: u64,
        n: usize,
        half: Dtype,
        keep: &[usize],
    ) -> (u64, usize) {
        let found = packs.memo.find(src, n, half, keep);
        let slot = &mut packs.bufs[found.slot];
        if !found.hit
            && self
                .grow_scratch(slot, n, "an allocation of half operands")
                .is_none()
        {
            packs.memo.forget(found.slot);
            return (0, found.slot);
        }
        let Some(dst) = slot.as_mut() else {
            packs.memo.forget(found.slot);
            return (0, found.slot);
        };
        let (ptr, _sync) = cudarc::driver::DevicePtrMut::device_ptr_mut(dst, &self.stream);
        if !found.hit && n > 0 {
            // Writes only the slot: not a write the memo must hear of.
            self.launch_raw(
                "pack_half",
                grid1(n),
                &[Arg::Ptr(ptr), Arg::Ptr(src), int(n), dtype_arg(half)],
            );
        }
        (ptr, found.slot)
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
    pub fn memory(&self) -> Option<(usize, usize)> {
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
            drv::memcpy_htod_async(ptr, src, self.stream.cu_stream())
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
        let Some(side) = &self.side else {
            f();
            return Aside::DONE;
        };
        if !self.open_side(side, f) {
            return Aside::DONE;
        }
        let mut st = side.state.lock().unwrap_or_else(|p| p.into_inner());
        match side.stream.record_event(None) {
            Ok(e) => {
                st.events.push(e);
                Aside(st.first + st.events.len() - 1)
            }
            Err(e) => {
                drop(st);
                self.record("marking the side stream's work", e);
                self.join_aside();
                Aside::DONE
            }
        }
    }

    fn wait_aside(&self, t: Aside) {
        let Some(side) = &self.side else {
            return;
        };
        let st = side.state.lock().unwrap_or_else(|p| p.into_inner());
        // A ticket before `first` was joined already.
        let Some(e) = t.0.checked_sub(st.first).and_then(|i| st.events.get(i)) else {
            return;
        };
        if let Err(e) = self.stream.wait(e) {
            drop(st);
            self.record("waiting for the side stream's work", e);
        }
    }

    fn update_aside(&self, seg: usize, f: impl FnOnce()) {
        let Some(side) = self.side.as_ref().filter(|_| self.step_aside) else {
            f();
            return;
        };
        if !self.open_side(side, f) {
            return;
        }
        let recorded = self.on_update_event(side, seg, |e| e.record(&side.stream));
        if let Err(e) = recorded {
            self.record("marking a parameter segment's update", e);
            self.join_aside();
        }
    }

    fn wait_update(&self, seg: usize) {
        let Some(side) = self.side.as_ref().filter(|_| self.step_aside) else {
            return;
        };
        let capturing = self.capturing();
        let waited = self.on_update_event(side, seg, |e| {
            if !capturing {
                return self.stream.wait(e);
            }
            // In a capture the wait is the graph's own node, on the event's latest record
            // at each replay (an event recorded outside a capture may not be waited on
            // otherwise: CUDA_ERROR_STREAM_CAPTURE_ISOLATION). A wait on an event never
            // recorded waits for nothing.
            self.bind();
            // SAFETY: the stream and the event are this device's, alive while `self` is.
            unsafe {
                drv_sys::cuStreamWaitEvent(
                    self.stream.cu_stream(),
                    e.cu_event(),
                    drv_sys::CUevent_wait_flags::CU_EVENT_WAIT_EXTERNAL as u32,
                )
                .result()
            }
        });
        if let Err(e) = waited {
            self.record("waiting for a parameter segment's update", e);
        }
    }

    fn join_aside(&self) {
        let Some(side) = &self.side else {
            return;
        };
        let mut st = side.state.lock().unwrap_or_else(|p| p.into_inner());
        if !st.pending {
            return;
        }
        st.pending = false;
        st.first += st.events.len();
        st.events.clear();
        if let Err(e) = self.stream.join(&side.stream) {
            drop(st);
            self.record("joining the side stream", e);
        }
    }

    fn gemm(&self, g: &Gemm, a: DevView<'_>, b: DevView<'_>, c: DevViewMut<'_>) {
        let f32s = [a.elem, b.elem, c.elem] == [Dtype::F32; 3];
        assert!(f32s, "an f32 GEMM on a 16-bit buffer");
        if self.failed() {
            return;
        }
        self.bind();
        let cm = gemm::col_major(g);
        let shape = lt::Shape {
            cm,
            types: [lt::Elem::F32; 3],
            compute: lt::Compute::F32,
            count: 1,
            strides: [0; 3],
            align: [b.ptr, a.ptr, c.ptr].map(|p| lt::alignment(p, 0)),
        };
        // The views are live allocations large enough for the shapes (the model checks its
        // shapes before calling).
        if self.through_lt(&shape, g, [b.ptr, a.ptr, c.ptr], "cublasLt gemm f32", true) {
            self.gemm_wrote(c.ptr, g.spans().2);
            return;
        }
        let (op, int) = (gemm::op, gemm::dim);
        // SAFETY: the views are live allocations large enough for the shapes (the model checks
        // its shapes before calling); cuBLAS runs on this device's stream.
        let r = self.timed("cublas gemm f32", || unsafe {
            cudarc::cublas::result::sgemm(
                *self.blas.handle(),
                op(cm.trans_first),
                op(cm.trans_second),
                int(cm.m),
                int(cm.n),
                int(cm.k),
                &g.alpha,
                b.ptr as *const f32,
                int(cm.ld_first),
                a.ptr as *const f32,
                int(cm.ld_second),
                &g.beta,
                c.ptr as *mut f32,
                int(cm.ldc),
            )
        });
        self.gemm_wrote(c.ptr, g.spans().2);
        if let Err(e) = r {
            self.record("cublasSgemm", e);
        }
    }

    fn gemm_half(&self, g: &Gemm, a: DevView<'_>, b: DevView<'_>, c: DevViewMut<'_>, half: Dtype) {
        use cudarc::cublas::sys::{cublasComputeType_t, cublasGemmAlgo_t, cudaDataType};
        if self.failed() {
            return;
        }
        self.bind();
        let dtype = match half {
            Dtype::F16 => cudaDataType::CUDA_R_16F,
            // Tensor cores take bf16 from sm_80 (Ampere) on; before, the fp32 GEMM on the same
            // values gives what the f32 accumulation would.
            Dtype::Bf16 if self.major >= 8 => cudaDataType::CUDA_R_16BF,
            Dtype::Bf16 | Dtype::F32 => return self.gemm(g, a, b, c),
        };
        let (span_a, span_b, _) = g.spans();
        assert!(
            span_a <= a.len && span_b <= b.len,
            "GEMM operands shorter than their shapes"
        );
        let sixteen = |elem: Dtype| {
            assert!(elem == Dtype::F32 || elem == half, "a {elem:?} operand");
            elem == half
        };
        let (a16, b16, c16) = (sixteen(a.elem), sixteen(b.elem), sixteen(c.elem));
        let mut packs = self.packed.lock().unwrap_or_else(|p| p.into_inner());
        // The operands as cuBLAS reads them, their type, the compute type and the profile's name.
        // cuBLAS converts the f32 operands itself (HalfOperands::Convert) only when both are
        // f32 and so is the output: it reads both in one type, and writes 16 bits only from
        // 16-bit operands.
        let convert = self.operands == HalfOperands::Convert && !a16 && !b16 && !c16;
        // The profile's names: on cuBLAS, on cuBLASLt.
        let ((pa, pb), operand, compute, (name, lt_name)) = if convert {
            (
                (a.ptr, b.ptr),
                cudaDataType::CUDA_R_32F,
                fast_compute(half),
                if half == Dtype::F16 {
                    ("cublas gemm fp16←f32", "cublasLt gemm fp16←f32")
                } else {
                    ("cublas gemm bf16←f32", "cublasLt gemm bf16←f32")
                },
            )
        } else {
            // A 16-bit buffer is read as it is, an f32 one packed. The same stream runs the
            // packs and the GEMM in order, so the next GEMM's packs cannot overwrite operands
            // this one still reads.
            let (pa, kept) = if a16 {
                (a.ptr, None)
            } else {
                let (p, slot) = self.pack(&mut packs, a.ptr, span_a, half, &[]);
                (p, Some(slot))
            };
            let pb = if b16 {
                b.ptr
            } else {
                let keep: Vec<usize> = kept.into_iter().collect();
                self.pack(&mut packs, b.ptr, span_b, half, &keep).0
            };
            (
                (pa, pb),
                dtype,
                cublasComputeType_t::CUBLAS_COMPUTE_32F,
                if half == Dtype::F16 {
                    ("cublas gemm fp16", "cublasLt gemm fp16")
                } else {
                    ("cublas gemm bf16", "cublasLt gemm bf16")
                },
            )
        };
        if pa == 0 || pb == 0 {
            return; // out of memory for the packed operands: recorded
        }
        let cm = gemm::col_major(g);
        let lt_operand = lt_elem(operand);
        let shape = lt::Shape {
            cm,
            types: [
                lt_operand,
                lt_operand,
                if c16 { lt_elem(dtype) } else { lt::Elem::F32 },
            ],
            compute: lt_compute(compute),
            count: 1,
            strides: [0; 3],
            align: [pb, pa, c.ptr].map(|p| lt::alignment(p, 0)),
        };
        // The operands hold the spans the shapes read (asserted above).
        let direct = pa == a.ptr && pb == b.ptr;
        if self.through_lt(&shape, g, [pb, pa, c.ptr], lt_name, direct) {
            packs.memo.written(c.ptr, size(c.elem) * g.spans().2 as u64);
            return;
        }
        let (op, int) = (gemm::op, gemm::dim);
        // SAFETY: the operands (packed, or the views themselves) hold the spans the shapes read
        // (asserted above), `c` is a live allocation large enough for the shape; cuBLAS runs on
        // this device's stream. f32 output and accumulation on the tensor cores.
        let r = self.timed(name, || unsafe {
            cudarc::cublas::result::gemm_ex(
                *self.blas.handle(),
                op(cm.trans_first),
                op(cm.trans_second),
                int(cm.m),
                int(cm.n),
                int(cm.k),
                (&g.alpha as *const f32).cast(),
                pb as *const c_void,
                operand,
                int(cm.ld_first),
                pa as *const c_void,
                operand,
                int(cm.ld_second),
                (&g.beta as *const f32).cast(),
                c.ptr as *mut c_void,
                // A 16-bit output: the f32 result rounded to nearest even (`st`'s rounding).
                if c16 { dtype } else { cudaDataType::CUDA_R_32F },
                int(cm.ldc),
                compute,
                cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
            )
        });
        packs.memo.written(c.ptr, size(c.elem) * g.spans().2 as u64);
        if let Err(e) = r {
            self.record("cublasGemmEx", e);
        }
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
        use cudarc::cublas::sys::{cublasComputeType_t, cublasGemmAlgo_t, cudaDataType};
        if self.failed() || batch.count == 0 {
            return;
        }
        self.bind();
        let (span_a, span_b, span_c) = g.spans();
        let ext = (
            batch.extent(batch.a, span_a),
            batch.extent(batch.b, span_b),
            batch.extent(batch.c, span_c),
        );
        assert!(
            ext.0 <= a.len && ext.1 <= b.len && ext.2 <= c.len,
            "batched GEMM operands shorter than their batch"
        );
        // A 16-bit buffer holds the run's half dtype: the operands' in a half batch.
        let sixteen = |elem: Dtype| {
            assert!(
                !elem.is_half() || operands == Dtype::F32 || elem == operands,
                "a {elem:?} operand of a {operands:?} batch"
            );
            elem.is_half()
        };
        let (a16, b16, c16) = (sixteen(a.elem), sixteen(b.elem), sixteen(c.elem));
        let half = match operands {
            Dtype::F16 => Some(cudaDataType::CUDA_R_16F),
            // As in `gemm_half`: bf16 tensor cores from sm_80 on, else the f32 GEMM (whose
            // buffers are all f32 there: 16-bit bf16 buffers need sm_80 too).
            Dtype::Bf16 if self.major >= 8 => Some(cudaDataType::CUDA_R_16BF),
            Dtype::Bf16 | Dtype::F32 => None,
        };
        let f32t = cudaDataType::CUDA_R_32F;
        let mut packs = self.packed.lock().unwrap_or_else(|p| p.into_inner());
        let mut scratch = self.batched.lock().unwrap_or_else(|p| p.into_inner());
        // What cuBLAS reads and writes: addresses, types and element sizes of A, B and C, the
        // compute type, and the f32 room C's results go through to a 16-bit `c`.
        let (ptrs, types, compute, through) = match half {
            // cuBLAS converts f32 operands itself (HalfOperands::Convert) only when nothing is
            // 16-bit: it reads both operands in one type, and writes 16 bits only from 16-bit
            // operands.
            Some(_) if self.operands == HalfOperands::Convert && !(a16 || b16 || c16) => (
                (a.ptr, b.ptr, c.ptr),
                [f32t; 3],
                fast_compute(operands),
                None,
            ),
            // A 16-bit buffer is read as it is, an f32 one packed (the half bits of its extent,
            // the layout kept); a 16-bit `c` gets the results rounded by cuBLAS.
            Some(t) => {
                let (pa, kept) = if a16 {
                    (a.ptr, None)
                } else {
                    let (p, slot) = self.pack(&mut packs, a.ptr, ext.0, operands, &[]);
                    (p, Some(slot))
                };
                let pb = if b16 {
                    b.ptr
                } else {
                    let keep: Vec<usize> = kept.into_iter().collect();
                    self.pack(&mut packs, b.ptr, ext.1, operands, &keep).0
                };
                (
                    (pa, pb, c.ptr),
                    [t, t, if c16 { t } else { f32t }],
                    cublasComputeType_t::CUBLAS_COMPUTE_32F,
                    None,
                )
            }
            // f32 products of 16-bit buffers (the model has none since attention's `ds` is a
            // stored value; `recipe kernels --selftest` checks the path,
            // `stored.gemm_batched_f32`): each through an
            // f32 copy of its extent (widening is exact); a 16-bit `c` gets the f32 results
            // rounded into it afterwards, as the kernels would round an f32 output. Its room
            // starts as `c`'s values unless the batch overwrites them all
            // (`Batch::overwrites_all`).
            None => {
                let mut wide = |i: usize, v: (u64, Dtype), n: usize, fill: bool| -> u64 {
                    let what = "an allocation of f32 GEMM operands";
                    let Some(room) = self.grow_scratch(&mut scratch.wide[i], n, what) else {
                        return 0;
                    };
                    if fill {
                        self.convert_raw((room, Dtype::F32), v, n);
                    }
                    room
                };
                let pa = if a16 {
                    wide(0, (a.ptr, a.elem), ext.0, true)
                } else {
                    a.ptr
                };
                let pb = if b16 {
                    wide(1, (b.ptr, b.elem), ext.1, true)
                } else {
                    b.ptr
                };
                let (pc, through) = if c16 {
                    let room = wide(2, (c.ptr, c.elem), ext.2, !batch.overwrites_all(g));
                    (room, Some(room))
                } else {
                    (c.ptr, None)
                };
                (
                    (pa, pb, pc),
                    [f32t; 3],
                    cublasComputeType_t::CUBLAS_COMPUTE_32F,
                    through,
                )
            }
        };
        if ptrs.0 == 0 || ptrs.1 == 0 || ptrs.2 == 0 {
            return; // out of memory for the packed or widened operands: recorded
        }
        let cm = gemm::col_major(g);
        let (op, dim) = (gemm::op, gemm::dim);
        // The profile's names: on cuBLAS, on cuBLASLt.
        let (name, lt_name) = match (types[0], compute) {
            (cudaDataType::CUDA_R_16F, _) => ("cublas batched fp16", "cublasLt batched fp16"),
            (cudaDataType::CUDA_R_16BF, _) => ("cublas batched bf16", "cublasLt batched bf16"),
            (_, cublasComputeType_t::CUBLAS_COMPUTE_32F_FAST_16F) => {
                ("cublas batched fp16←f32", "cublasLt batched fp16←f32")
            }
            (_, cublasComputeType_t::CUBLAS_COMPUTE_32F_FAST_16BF) => {
                ("cublas batched bf16←f32", "cublasLt batched bf16←f32")
            }
            _ => ("cublas batched f32", "cublasLt batched f32"),
        };
        let lt_shape = |count: usize| lt::Shape {
            cm,
            types: [lt_elem(types[1]), lt_elem(types[0]), lt_elem(types[2])],
            compute: lt_compute(compute),
            count,
            strides: [batch.b.outer, batch.a.outer, batch.c.outer].map(|s| s as i64),
            align: [
                (ptrs.1, batch.b.outer, types[1]),
                (ptrs.0, batch.a.outer, types[0]),
                (ptrs.2, batch.c.outer, types[2]),
            ]
            .map(|(p, s, t)| lt::alignment(p, (s as u64 * lt_elem(t).bytes()) as i64)),
        };
        // A strided batch (one stride per operand) through cuBLASLt; item j's operands start j
        // strides into the operands (or their copies), inside their extents (asserted above).
        let in_lt = batch.inner == 1
            && self.through_lt(
                &lt_shape(batch.count),
                g,
                [ptrs.1, ptrs.0, ptrs.2],
                lt_name,
                (ptrs.0, ptrs.1, ptrs.2) == (a.ptr, b.ptr, c.ptr),
            );
        let r = if in_lt {
            Ok(())
        } else if batch.inner == 1 {
            // One stride per operand (a linear layer's projections of one input, their weight
            // gradients): a strided batch, no address list to write first. A packed or widened
            // copy keeps its operand's layout, so the strides hold for it too.
            let stride = |s: crate::backend::Stride| s.outer as std::ffi::c_longlong;
            // SAFETY: item j's operands start j strides into the operands (or their copies),
            // inside their extents (asserted above); cuBLAS runs on this device's stream. f32
            // accumulation; with half operands, cuBLAS's tensor-core path.
            self.timed(name, || unsafe {
                cudarc::cublas::sys::cublasGemmStridedBatchedEx(
                    *self.blas.handle(),
                    op(cm.trans_first),
                    op(cm.trans_second),
                    dim(cm.m),
                    dim(cm.n),
                    dim(cm.k),
                    (&g.alpha as *const f32).cast(),
                    ptrs.1 as *const c_void,
                    types[1],
                    dim(cm.ld_first),
                    stride(batch.b),
                    ptrs.0 as *const c_void,
                    types[0],
                    dim(cm.ld_second),
                    stride(batch.a),
                    (&g.beta as *const f32).cast(),
                    ptrs.2 as *mut c_void,
                    types[2],
                    dim(cm.ldc),
                    stride(batch.c),
                    dim(batch.count),
                    compute,
                    cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
                )
                .result()
            })
        } else {
            let bytes = |t: cudaDataType| if t == f32t { 4 } else { 2 };
            let sizes = (bytes(types[0]), bytes(types[1]), bytes(types[2]));
            let what = "an allocation of GEMM addresses";
            let Some(list) = self.grow_scratch(&mut scratch.list, 3 * batch.count, what) else {
                return;
            };
            let (l, args) = gemm_pointers(list, ptrs, batch, sizes);
            // Writes only the address list.
            self.launch_raw("gemm_pointers", l, &args);
            let n = batch.count as u64;
            let (list_a, list_b, list_c) = (list, list + 8 * n, list + 16 * n);
            // SAFETY: `gemm_pointers` (queued before, on this stream) wrote every item's
            // addresses into `list`, each inside the operands' extents (asserted above) or their
            // packed or widened copies; cuBLAS runs on this device's stream, and the next
            // batch's addresses are written after this call has read them (stream order). f32
            // accumulation; with half operands, cuBLAS's tensor-core path.
            self.timed(name, || unsafe {
                cudarc::cublas::sys::cublasGemmBatchedEx(
                    *self.blas.handle(),
                    op(cm.trans_first),
                    op(cm.trans_second),
                    dim(cm.m),
                    dim(cm.n),
                    dim(cm.k),
                    (&g.alpha as *const f32).cast(),
                    list_b as *const *const c_void,
                    types[1],
                    dim(cm.ld_first),
                    list_a as *const *const c_void,
                    types[0],
                    dim(cm.ld_second),
                    (&g.beta as *const f32).cast(),
                    list_c as *const *mut c_void,
                    types[2],
                    dim(cm.ldc),
                    dim(batch.count),
                    compute,
                    cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
                )
                .result()
            })
        };
        if let Some(room) = through {
            self.convert_raw((c.ptr, c.elem), (room, Dtype::F32), ext.2);
        }
        packs.memo.written(c.ptr, size(c.elem) * ext.2 as u64);
        if let Err(e) = r {
            self.record(
                if batch.inner == 1 {
                    "cublasGemmStridedBatchedEx"
                } else {
                    "cublasGemmBatchedEx"
                },
                e,
            );
        }
    }

    fn reserve_gemm_batched(&self, count: usize, wide: usize) {
        let mut scratch = self.batched.lock().unwrap_or_else(|p| p.into_inner());
        self.grow_scratch(
            &mut scratch.list,
            3 * count,
            "an allocation of GEMM addresses",
        );
        if wide > 0 {
            for slot in &mut scratch.wide {
                self.grow_scratch(slot, wide, "an allocation of f32 GEMM operands");
            }
        }
    }

    fn reserve_gemm_half(&self, elems: usize) {
        if self.operands == HalfOperands::Convert {
            return; // nothing packed
        }
        let mut packs = self.packed.lock().unwrap_or_else(|p| p.into_inner());
        for s in 0..packs.bufs.len() {
            let before = packs.bufs[s].as_ref().map(|b| b.len());
            self.grow_scratch(&mut packs.bufs[s], elems, "an allocation of half operands");
            if packs.bufs[s].as_ref().map(|b| b.len()) != before {
                packs.memo.forget(s); // a new buffer: its old contents are gone
            }
        }
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

    /// Unless `RECIPE_CUDA_GRAPHS=0`, and not while profiling (the events around each operation
    /// would be captured too). Thread-local mode: other ranks' threads, driving other GPUs,
    /// may allocate and synchronise meanwhile.
    fn begin_capture(&self) -> bool {
        if !self.graphs_on
            || self.failed()
            || self.profiling.load(std::sync::atomic::Ordering::Relaxed)
        {
            return false;
        }
        // Every operand a captured GEMM reads is packed inside the graph: a pack made before
        // the capture and found current in it would be missing from the graph's replays.
        self.wrote();
        // An error left in the context is the run's (cudarc's begin checks for one first and
        // would return it without capturing, and it would be lost): taken here, recorded.
        self.bind();
        // Side work queued before (a step's updates, `update_aside`) is joined outside the
        // capture: the capture's own join at its end may not wait on work outside it. Only the
        // capturing pass waits for all of it; the graph waits for each segment's update
        // (`wait_update`).
        self.join_aside();
        let mut c = self.captures.lock().unwrap_or_else(|p| p.into_inner());
        if c.capturing.is_some() {
            return false;
        }
        if self.stream.begin_capture(CAPTURE_MODE).is_err() {
            return false;
        }
        c.capturing = Some(None);
        true
    }

    fn end_capture(&self) -> Option<u64> {
        // The packs recorded in the capture never ran: a pass run directly after a failed
        // capture must not find them current.
        self.wrote();
        // A stream forked into the capture must be joined back before it ends.
        self.join_aside();
        if !self.capturing() {
            return None;
        }
        // An error an earlier asynchronous call left in the context (cudarc checks for one
        // before ending a capture, and would return it without ending): taken here, as this
        // capture's failure.
        self.bind();
        let failed = self
            .captures
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .capturing
            .take()?;
        // Each kernel node with its stream's priority (the side stream's behind the rest).
        let flags = if self.ahead {
            cudarc::driver::sys::CUgraphInstantiate_flags::CUDA_GRAPH_INSTANTIATE_FLAG_USE_NODE_PRIORITY
        } else {
            cudarc::driver::sys::CUgraphInstantiate_flags(0)
        };
        // An invalidated capture ends in an error, which fails it rather than the run.
        let graph = self.stream.end_capture(flags).ok().flatten();
        // Still capturing only if cudarc returned before ending it (an error left meanwhile).
        if self.discard_capture() {
            return None;
        }
        let (None, Some(graph)) = (failed, graph) else {
            return None;
        };
        let mut c = self.captures.lock().unwrap_or_else(|p| p.into_inner());
        let id = c.next;
        c.next += 1;
        c.graphs.insert(id, Graph(graph));
        Some(id)
    }

    fn launch_graph(&self, id: u64) -> bool {
        if self.failed() {
            return true; // nothing is queued after a failed allocation; `sync` reports it
        }
        // A replay rewrites what the graph's kernels write; a pass run directly instead of a
        // missing graph must not find earlier packs current either.
        self.wrote();
        // An error left in the context is the run's (cudarc's launch checks for one first and
        // would return it without launching): taken here, outside the lock it records under.
        self.bind();
        let c = self.captures.lock().unwrap_or_else(|p| p.into_inner());
        let Some(g) = c.graphs.get(&id) else {
            return false;
        };
        if let Err(e) = self.timed("cuda graph", || g.0.launch()) {
            drop(c);
            self.record("launching a CUDA graph", e);
        }
        true
    }

    fn drop_graph(&self, id: u64) {
        let g = self
            .captures
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .graphs
            .remove(&id);
        if g.is_some() {
            self.bind();
        }
        drop(g);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Graphs are on unless `RECIPE_CUDA_GRAPHS=0`; another value is refused by name.
    #[test]
    fn graphs_are_on_unless_turned_off() {
        assert!(graphs_parse(None).unwrap());
        assert!(graphs_parse(Some("")).unwrap());
        assert!(!graphs_parse(Some("0")).unwrap());
        assert!(graphs_parse(Some("1")).unwrap());
        let e = graphs_parse(Some("yes")).unwrap_err().to_string();
        assert!(e.contains("RECIPE_CUDA_GRAPHS=yes: expected `1`"), "{e}");
    }

    /// GEMMs run on cuBLASLt unless `RECIPE_GEMM_LIBRARY=cublas`; another value is refused by
    /// name.
    #[test]
    fn gemms_run_on_cublaslt_unless_told_cublas() {
        assert!(lt_parse(None).unwrap());
        assert!(lt_parse(Some("")).unwrap());
        assert!(lt_parse(Some("cublaslt")).unwrap());
        assert!(!lt_parse(Some("cublas")).unwrap());
        let e = lt_parse(Some("lt")).unwrap_err().to_string();
        assert!(
            e.contains("RECIPE_GEMM_LIBRARY=lt: expected `cublaslt`"),
            "{e}"
        );
    }

    /// Weight gradients go to a second stream unless `RECIPE_SIDE_STREAM=0`; another value is
    /// refused by name.
    #[test]
    fn weight_gradients_go_aside_unless_told_0() {
        assert_eq!(side_parse(None).unwrap(), SideStream::Behind);
        assert_eq!(side_parse(Some("")).unwrap(), SideStream::Behind);
        assert_eq!(side_parse(Some("1")).unwrap(), SideStream::Behind);
        assert_eq!(side_parse(Some("equal")).unwrap(), SideStream::Equal);
        assert_eq!(side_parse(Some("0")).unwrap(), SideStream::Off);
        let e = side_parse(Some("off")).unwrap_err().to_string();
        assert!(e.contains("RECIPE_SIDE_STREAM=off: expected `1`"), "{e}");
    }

    /// A step's updates go beside the next forward unless `RECIPE_STEP_ASIDE=0`; another value
    /// is refused by name.
    #[test]
    fn the_step_goes_aside_unless_told_0() {
        assert_eq!(pdl_parse(None).unwrap(), Pdl::Off);
        assert_eq!(pdl_parse(Some("0")).unwrap(), Pdl::Off);
        assert_eq!(pdl_parse(Some("1")).unwrap(), Pdl::On);
        assert_eq!(pdl_parse(Some("early")).unwrap(), Pdl::Early);
        assert!(Pdl::Early.launches() && Pdl::On.launches() && !Pdl::Off.launches());
        // The early signal is compiled in for sm_90 and newer only.
        assert!(
            compile::early_for("sm_90", Pdl::Early) && compile::early_for("sm_100a", Pdl::Early)
        );
        assert!(!compile::early_for("sm_80", Pdl::Early) && !compile::early_for("sm_90", Pdl::On));
        let e = pdl_parse(Some("on")).unwrap_err().to_string();
        assert!(e.contains("RECIPE_PDL=on") && e.contains("`early`"), "{e}");
        assert!(step_aside_parse(None).unwrap());
        assert!(step_aside_parse(Some("1")).unwrap());
        assert!(!step_aside_parse(Some("0")).unwrap());
        let e = step_aside_parse(Some("no")).unwrap_err().to_string();
        assert!(e.contains("RECIPE_STEP_ASIDE=no: expected `1`"), "{e}");
    }

    /// Unset or empty packs; `convert` converts in cuBLAS; anything else is refused by name.
    #[test]
    fn half_gemm_setting_parses_its_two_values_and_names_a_third() {
        assert_eq!(HalfOperands::parse(None), Ok(HalfOperands::Pack));
        assert_eq!(HalfOperands::parse(Some("")), Ok(HalfOperands::Pack));
        assert_eq!(HalfOperands::parse(Some("pack")), Ok(HalfOperands::Pack));
        assert_eq!(
            HalfOperands::parse(Some("convert")),
            Ok(HalfOperands::Convert)
        );
        let e = HalfOperands::parse(Some("tf32")).unwrap_err().to_string();
        assert!(
            e.starts_with("RECIPE_HALF_GEMM=tf32: expected `pack` (the default) or `convert`"),
            "{e}"
        );
    }
}
