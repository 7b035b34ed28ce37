//! NCCL between GPUs: [`NcclPeers`] is the [`Peers`] of each rank's [`CudaDevice`], so that
//! several GPUs sum their gradients device to device (`zero::Replica::attach_device`;
//! docs/cuda.md, "Several GPUs").
//!
//! In one process the communicators are made together by `ncclCommInitAll` ([`group`]: one per
//! GPU, ranks in the order of the devices); over several processes (nodes) each process makes
//! its own ranks' with `ncclCommInitRank` from the unique id node 0 drew and handed every rank
//! when the run gathered ([`unique_id`], [`group_across`]; docs/runtime.md, "Several nodes").
//! Either way on the thread that opened the devices, then each is driven by its rank's
//! thread: NCCL allows a communicator on any thread as long as its calls do not overlap, which
//! `model::OnDevice`'s lock ensures. A sum is queued on the device's compute stream, after the
//! backward's kernels and before the next launch, as NCCL orders it (`ncclAllReduce(...,
//! stream)`); nothing waits for it until the next copy to the host or sync. A queued sum
//! (`Peers::all_reduce_sum_queued`: a gradient segment summed while the backward computes the
//! next) goes on the device's copy stream after an event of the compute stream, which joins it
//! back by another (`Device::join_copies`); no direct call is made while queued ones are
//! pending, so a rank's calls reach NCCL in one order on one stream at a time.
//!
//! Like the rest of the CUDA backend, libnccl is loaded at run time (cudarc's dynamic loading):
//! without it [`group`] says so and the run exchanges through host memory instead.

use std::ffi::{c_void, CStr};
use std::sync::{Arc, Mutex};

use cudarc::driver::CudaContext;

use cudarc::nccl::{result, sys};

use super::{bind_ctx, CudaDevice, CudaError, DevViewMut, Watch};
use crate::backend::device::Peers;
use crate::precision::Dtype;

/// Whether libnccl can be loaded by one of cudarc's names for it: `libnccl.so`, `libnccl.so.13`
/// and older majors, but not `libnccl.so.2`, the only name NCCL's wheel and runtime package
/// install (cudarc 0.19.10 `get_lib_name_candidates`): a `libnccl.so` link is needed.
pub fn present() -> bool {
    // SAFETY: only tries to dlopen the library by its candidate names.
    unsafe { sys::is_culib_present() }
}

/// Whether `RECIPE_NCCL=0` keeps NCCL out: a run's ranks then exchange through host memory,
/// and `recipe kernels --selftest` skips its NCCL checks (docs/cuda.md).
pub fn switched_off() -> bool {
    std::env::var("RECIPE_NCCL").is_ok_and(|v| v == "0")
}

/// NCCL's version as `major.minor.patch`, when the library loads.
pub fn version() -> Option<String> {
    if !present() {
        return None;
    }
    let v = result::get_nccl_version().ok()?;
    // NCCL ≥ 2.9 encodes it as major·10000 + minor·100 + patch (`NCCL_VERSION_CODE`).
    Some(format!("{}.{}.{}", v / 10000, v / 100 % 100, v % 100))
}

/// One rank's communicator of a group made by [`group`] or [`group_across`].
#[derive(Debug)]
pub struct NcclPeers {
    comm: Arc<Comm>,
    rank: usize,
    world: usize,
    /// Open groups (`group_start` without its `group_end`): their calls are queued at the end,
    /// so only a call outside a group is timed on its own (`recipe run --profile`).
    groups: usize,
}

/// A communicator, shared by its rank's [`NcclPeers`] and its device's [`Watch`]: whichever
/// aborts it first releases it, and NCCL calls after that are refused.
#[derive(Debug)]
struct Comm {
    /// Null once aborted.
    raw: Mutex<sys::ncclComm_t>,
    /// The rank's GPU, bound when the communicator is released.
    ctx: Arc<CudaContext>,
}

// SAFETY: an NCCL communicator may be used from any thread provided calls on it do not run
// concurrently (NCCL user guide, "Thread safety"): the rank's calls come from its thread
// behind `OnDevice`'s mutex, and the watch's (`ncclCommGetAsyncError`, which NCCL allows
// alongside, and `ncclCommAbort`, which takes it) from the same thread, inside a wait.
unsafe impl Send for Comm {}
unsafe impl Sync for Comm {}

impl Comm {
    fn new(raw: sys::ncclComm_t, ctx: Arc<CudaContext>) -> Arc<Comm> {
        Arc::new(Comm {
            raw: Mutex::new(raw),
            ctx,
        })
    }

    /// The communicator, unless aborted.
    fn get(&self) -> Result<sys::ncclComm_t, String> {
        let raw = *self.raw.lock().unwrap_or_else(|p| p.into_inner());
        if raw.is_null() {
            return Err("the NCCL communicator was aborted after an earlier failure".into());
        }
        Ok(raw)
    }

    /// Its asynchronous error, if any.
    fn async_error(&self) -> Option<String> {
        let raw = self.get().ok()?;
        let mut state = sys::ncclResult_t::ncclSuccess;
        // SAFETY: `raw` is a live communicator; `state` receives one result code.
        let r = unsafe { sys::ncclCommGetAsyncError(raw, &mut state) };
        match (r, state) {
            (sys::ncclResult_t::ncclSuccess, sys::ncclResult_t::ncclSuccess)
            | (sys::ncclResult_t::ncclSuccess, sys::ncclResult_t::ncclInProgress) => None,
            (sys::ncclResult_t::ncclSuccess, e) => {
                Some(nccl_err("the group", result::NcclError(e)))
            }
            (e, _) => Some(nccl_err("checking the group", result::NcclError(e))),
        }
    }

    /// Releases it (abort rather than destroy: `ncclCommDestroy` may wait for the other ranks,
    /// it finalises, which is collective; abort also ends its pending kernels). Once.
    fn abort(&self) {
        let mut raw = self.raw.lock().unwrap_or_else(|p| p.into_inner());
        if raw.is_null() {
            return;
        }
        let _ = bind_ctx(&self.ctx);
        // SAFETY: a communicator from `ncclCommInitAll` or `ncclCommInitRank`, released once
        // (the pointer is nulled under the lock).
        unsafe {
            let _ = result::comm_abort(*raw);
        }
        *raw = std::ptr::null_mut();
    }
}

impl NcclPeers {
    /// Rank `rank` of `world` on `dev`, through `raw`; `dev`'s waits watch the communicator
    /// from now on.
    fn new(raw: sys::ncclComm_t, dev: &CudaDevice, rank: usize, world: usize) -> NcclPeers {
        let comm = Comm::new(raw, dev.ctx.clone());
        let (check, abort) = (Arc::clone(&comm), Arc::clone(&comm));
        dev.set_watch(Watch {
            check: Box::new(move || check.async_error()),
            abort: Box::new(move || abort.abort()),
            timeout: crate::collective::timeout(),
        });
        NcclPeers {
            comm,
            rank,
            world,
            groups: 0,
        }
    }
}

impl Drop for NcclPeers {
    fn drop(&mut self) {
        // Every sum was waited for by the step that queued it, and a run's end waits for every
        // rank's device before any drops its peers (`Replica::gather_whole`'s barrier).
        self.comm.abort();
    }
}

/// NCCL's words for a failed call.
fn nccl_err(what: &str, e: result::NcclError) -> String {
    // SAFETY: NCCL returns a static NUL-terminated string for every result code.
    let text = unsafe {
        let p = sys::ncclGetErrorString(e.0);
        if p.is_null() {
            format!("{:?}", e.0)
        } else {
            CStr::from_ptr(p).to_string_lossy().into_owned()
        }
    };
    format!("NCCL {what}: {text}")
}

/// One communicator per device of `devices`, rank r on `devices[r]`: each a different GPU
/// (NCCL refuses two ranks on one), at least one (a one-rank group sums nothing, but runs
/// NCCL's calls: `recipe kernels --selftest` on a machine with one GPU).
pub fn group(devices: &[&CudaDevice]) -> Result<Vec<NcclPeers>, CudaError> {
    if !present() {
        return Err(not_found());
    }
    let ordinals = distinct(devices, 1)?;
    let n = ordinals.len();
    let mut comms: Vec<sys::ncclComm_t> = vec![std::ptr::null_mut(); n];
    // SAFETY: `comms` has room for `n` communicators, `ordinals` holds `n` device ordinals.
    unsafe { result::comm_init_all(comms.as_mut_ptr(), n as i32, ordinals.as_ptr()) }
        .map_err(|e| CudaError::Driver(nccl_err("creating the communicators", e)))?;
    Ok(comms
        .into_iter()
        .zip(devices)
        .enumerate()
        .map(|(rank, (comm, dev))| NcclPeers::new(comm, dev, rank, n))
        .collect())
}

/// The bytes of an `ncclUniqueId`.
pub const ID_BYTES: usize = 128;

/// A fresh `ncclUniqueId` (node 0 draws it; every rank of every process then joins with it),
/// as its bytes.
pub fn unique_id() -> Result<Vec<u8>, CudaError> {
    if !present() {
        return Err(not_found());
    }
    let id = result::get_uniqueid()
        .map_err(|e| CudaError::Driver(nccl_err("drawing a unique id", e)))?;
    // `c_char` is i8 or u8 by platform: the bytes as they are.
    Ok(id.internal.iter().map(|&c| c as u8).collect())
}

/// This process's communicators in a group of `world` ranks spread over several processes:
/// `devices[i]` is rank `first + i`, each a different GPU, and `id` is node 0's
/// [`unique_id`]. NCCL's initialisation is collective: it returns once every rank of every
/// process has made its communicator (the processes get here together, after the run has
/// gathered, so a missing node is reported before this point rather than waited for here).
pub fn group_across(
    devices: &[&CudaDevice],
    first: usize,
    world: usize,
    id: &[u8],
) -> Result<Vec<NcclPeers>, CudaError> {
    if !present() {
        return Err(not_found());
    }
    if id.len() != ID_BYTES {
        return Err(CudaError::Driver(format!(
            "an NCCL unique id of {} bytes, where NCCL's has {ID_BYTES}: node 0 runs another build of recipe?",
            id.len()
        )));
    }
    distinct(devices, 1)?;
    if first + devices.len() > world {
        return Err(CudaError::Driver(format!(
            "ranks {first}..{} of a group of {world}",
            first + devices.len()
        )));
    }
    let mut uid = sys::ncclUniqueId {
        internal: [0; ID_BYTES],
    };
    for (c, b) in uid.internal.iter_mut().zip(id) {
        *c = *b as std::ffi::c_char;
    }
    let mut comms: Vec<sys::ncclComm_t> = vec![std::ptr::null_mut(); devices.len()];
    // Several devices from one thread: NCCL needs their inits inside one group, each with its
    // device current (NCCL user guide, "Creating a communicator with options" / "Group calls").
    result::group_start().map_err(|e| CudaError::Driver(nccl_err("opening a group", e)))?;
    let mut failed = None;
    for (i, (dev, comm)) in devices.iter().zip(comms.iter_mut()).enumerate() {
        if let Err(e) = bind_ctx(&dev.ctx) {
            failed = Some(CudaError::Driver(format!(
                "binding GPU {}: {e}",
                dev.ctx.ordinal()
            )));
            break;
        }
        // SAFETY: `comm` is a slot for one communicator; `uid` is node 0's id, the same in
        // every process; the rank is in range (checked above).
        if let Err(e) =
            unsafe { result::comm_init_rank(comm, world as i32, uid, (first + i) as i32) }
        {
            failed = Some(CudaError::Driver(nccl_err("creating a communicator", e)));
            break;
        }
    }
    let ended = result::group_end()
        .map_err(|e| CudaError::Driver(nccl_err("creating the communicators", e)));
    if let Some(e) = failed.or(ended.err()) {
        for (dev, comm) in devices.iter().zip(&comms) {
            if !comm.is_null() {
                let _ = bind_ctx(&dev.ctx);
                // SAFETY: a communicator NCCL made above, released once, here.
                unsafe {
                    let _ = result::comm_abort(*comm);
                }
            }
        }
        return Err(e);
    }
    Ok(comms
        .into_iter()
        .zip(devices)
        .enumerate()
        .map(|(i, (comm, dev))| NcclPeers::new(comm, dev, first + i, world))
        .collect())
}

fn not_found() -> CudaError {
    CudaError::Driver(
        "NCCL not found as libnccl.so: cudarc looks for libnccl.so (or .so.13), and the nvidia-nccl-cu13 wheel and the libnccl2 package ship libnccl.so.2 only; link it as libnccl.so in a folder on LD_LIBRARY_PATH (docs/cuda.md)".into(),
    )
}

/// Refuses two ranks on one GPU (NCCL does) or fewer than `min` devices.
fn distinct(devices: &[&CudaDevice], min: usize) -> Result<Vec<i32>, CudaError> {
    let ordinals: Vec<i32> = devices.iter().map(|d| d.ctx.ordinal() as i32).collect();
    let mut unique = ordinals.clone();
    unique.sort_unstable();
    unique.dedup();
    if ordinals.len() < min || unique.len() != ordinals.len() {
        return Err(CudaError::Driver(format!(
            "NCCL needs {} different GPUs, one per rank; got ordinals {ordinals:?}",
            if min > 1 {
                "two or more"
            } else {
                "one or more"
            }
        )));
    }
    Ok(ordinals)
}

/// One in-place collective of [`NcclPeers::queue`].
#[derive(Clone, Copy)]
enum Op {
    /// `ncclAllReduce` (sum).
    AllReduce,
    /// `ncclReduce` (sum) to the root.
    Reduce(usize),
    /// `ncclBroadcast` from the root.
    Broadcast(usize),
}

impl NcclPeers {
    /// Queues `op` on `buf` (in place) on `dev`'s stream, or with `side` on its copy stream
    /// after the work queued so far ([`Peers::all_reduce_sum_queued`]): a sum of f32 values, or
    /// a broadcast of f32 or 16-bit ones (the half parameters a device keeps in 16 bits).
    fn queue(
        &mut self,
        dev: &CudaDevice,
        buf: DevViewMut<'_>,
        op: Op,
        side: bool,
    ) -> Result<(), String> {
        let broadcast = matches!(op, Op::Broadcast(_));
        assert!(
            buf.elem == Dtype::F32 || broadcast,
            "an NCCL sum of a 16-bit buffer"
        );
        if buf.len == 0 {
            // Every rank has the same lengths, so every rank skips it.
            return Ok(());
        }
        if dev.failed() {
            // A buffer is missing: the rank stops here, and the host barrier before the next
            // collective stops the others (zero/replica.rs).
            return crate::backend::device::Device::sync(dev);
        }
        dev.bind();
        dev.wrote(); // a sum or a broadcast writes `buf`
        let comm = self.comm.get()?;
        let (ptr, n) = (buf.ptr as *mut c_void, buf.len);
        let stream = if side {
            match dev.copy_stream() {
                Some(copies) => copies.cu_stream() as sys::cudaStream_t,
                // Recorded: the rank stops here, as above.
                None => return crate::backend::device::Device::sync(dev),
            }
        } else {
            dev.stream.cu_stream() as sys::cudaStream_t
        };
        let sum = sys::ncclRedOp_t::ncclSum;
        // A broadcast copies bits: a 16-bit buffer goes as fp16 elements whatever its half
        // dtype (ncclBfloat16 needs NCCL 2.10; nothing is added).
        let f32_ = if buf.elem.is_half() {
            sys::ncclDataType_t::ncclFloat16
        } else {
            sys::ncclDataType_t::ncclFloat32
        };
        // SAFETY: `buf` is a live device allocation of `n` elements on `dev`, whose stream orders
        // the collective with the kernels that wrote it and those that read it; send and receive
        // are the same buffer (in place, which NCCL allows for all three).
        let call = || unsafe {
            match op {
                Op::AllReduce => result::all_reduce(ptr, ptr, n, f32_, sum, comm, stream),
                Op::Reduce(root) => {
                    result::reduce(ptr, ptr, n, f32_, sum, root as i32, comm, stream)
                }
                Op::Broadcast(root) => {
                    result::broadcast(ptr, ptr, n, f32_, root as i32, comm, stream)
                }
            }
        };
        // A queued call is not timed: its events would be on the compute stream, which goes on
        // meanwhile (the profile is the compute stream's).
        let r = if self.groups > 0 || side {
            call()
        } else {
            let name = match op {
                Op::AllReduce => "nccl all_reduce",
                Op::Reduce(_) => "nccl reduce",
                Op::Broadcast(_) => "nccl broadcast",
            };
            dev.timed(name, call)
        };
        let what = match op {
            Op::Broadcast(_) => "broadcast",
            _ => "sum",
        };
        r.map(|_| ()).map_err(|e| nccl_err(what, e))
    }
}

impl Peers<CudaDevice> for NcclPeers {
    fn rank(&self) -> usize {
        self.rank
    }

    fn world(&self) -> usize {
        self.world
    }

    fn all_reduce_sum(&mut self, dev: &CudaDevice, buf: DevViewMut<'_>) -> Result<(), String> {
        self.queue(dev, buf, Op::AllReduce, false)
    }

    fn reduce_sum(
        &mut self,
        dev: &CudaDevice,
        buf: DevViewMut<'_>,
        root: usize,
    ) -> Result<(), String> {
        self.queue(dev, buf, Op::Reduce(root), false)
    }

    fn broadcast(
        &mut self,
        dev: &CudaDevice,
        buf: DevViewMut<'_>,
        root: usize,
    ) -> Result<(), String> {
        self.queue(dev, buf, Op::Broadcast(root), false)
    }

    fn group_start(&mut self) -> Result<(), String> {
        result::group_start()
            .map(|_| self.groups += 1)
            .map_err(|e| nccl_err("opening a group", e))
    }

    fn group_end(&mut self) -> Result<(), String> {
        self.groups = self.groups.saturating_sub(1);
        // The calling thread's group (each rank has its own thread).
        let _ = bind_ctx(&self.comm.ctx);
        result::group_end()
            .map(|_| ())
            .map_err(|e| nccl_err("a group of calls", e))
    }

    /// On the copy stream, ordered after the compute stream's work by an event, as the queued
    /// copies are; joined by [`Device::join_copies`](crate::backend::device::Device::join_copies).
    unsafe fn all_reduce_sum_queued(
        &mut self,
        dev: &CudaDevice,
        buf: DevViewMut<'_>,
    ) -> Result<(), String> {
        self.queue(dev, buf, Op::AllReduce, true)
    }

    unsafe fn reduce_sum_queued(
        &mut self,
        dev: &CudaDevice,
        buf: DevViewMut<'_>,
        root: usize,
    ) -> Result<(), String> {
        self.queue(dev, buf, Op::Reduce(root), true)
    }

    unsafe fn broadcast_queued(
        &mut self,
        dev: &CudaDevice,
        buf: DevViewMut<'_>,
        root: usize,
    ) -> Result<(), String> {
        self.queue(dev, buf, Op::Broadcast(root), true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Without libnccl the group says how to provide it; with it, a group needs two GPUs.
    #[test]
    fn no_group_without_nccl_or_without_a_gpu() {
        let e = group(&[]).unwrap_err().to_string();
        if present() {
            assert!(e.contains("one or more different GPUs"), "{e}");
        } else {
            assert!(e.contains("link it as libnccl.so"), "{e}");
        }
    }
}
