//! The CUDA kernels of `runtime/kernels/` on the CPU: [`Emu`] is a [`Device`] whose launches run
//! the unchanged `.cu` sources under a C++ emulation of the CUDA execution model
//! (`cpp/cuda_emu.hpp`: a block's CUDA threads as fibers on one OS thread, `__syncthreads` as a
//! barrier, warp shuffles, static shared memory), and whose GEMM is the CPU backend's. `Kernels<Emu>` is thus
//! the CUDA backend's launch code with only the memory and cuBLAS swapped, and the tests compare
//! it with the CPU backend (docs/cuda.md, "How the kernels are proven").

use std::cell::RefCell;
use std::ffi::{c_char, c_int, c_uint, c_void, CStr, CString};
use std::time::Instant;

use recipe_runtime::backend::device::{Arg, Device, Launch, Peers};
use recipe_runtime::backend::profile::Profile;
use recipe_runtime::backend::{Backend, Cpu, Gemm};
use recipe_runtime::collective::{Collective, LocalCollective, ReduceOp};

mod graph;
mod typed;
pub use graph::graphs_replayed;
pub use typed::{EmuTyped, EmuTypedPeers, TypedBuf, TypedView, TypedViewMut};

extern "C" {
    fn recipe_emu_launch(
        name: *const c_char,
        grid: *const c_uint,
        block: *const c_uint,
        smem: c_uint,
        args: *mut *mut c_void,
        signature: *const c_char,
    ) -> c_int;
    fn recipe_emu_kernel_count() -> c_uint;
    fn recipe_emu_kernel_name(i: c_uint) -> *const c_char;
    fn recipe_emu_kernel_signature(i: c_uint) -> *const c_char;
    fn recipe_emu_shape_ok(grid: *const c_uint, block: *const c_uint, smem: c_uint) -> bool;
    fn recipe_emu_block_order(order: c_int);
}

/// Runs `f` with this thread's launches running their blocks in `order` (cuda_emu.hpp,
/// `block_order`: 1 last to first, 2 the grid's z fastest).
fn with_block_order<R>(order: c_int, f: impl FnOnce() -> R) -> R {
    struct Restore;
    impl Drop for Restore {
        fn drop(&mut self) {
            // SAFETY: sets a thread-local value.
            unsafe { recipe_emu_block_order(0) }
        }
    }
    // SAFETY: as above.
    unsafe { recipe_emu_block_order(order) };
    let _restore = Restore;
    f()
}

/// Runs `f` with this thread's launches running their blocks last to first. A GPU runs a grid's
/// blocks in any order; kernels whose blocks meet through a counter (common.cuh,
/// `last_of_column`) must give the same bits in either, which tests check by running them both
/// ways.
pub fn reversed_blocks<R>(f: impl FnOnce() -> R) -> R {
    with_block_order(1, f)
}

/// Runs `f` with this thread's launches running their blocks with the grid's z fastest: a
/// launch of several items (z) that should keep their own counters and sums, run one item after
/// another, would never meet where they share them; interleaved, they do.
pub fn interleaved_blocks<R>(f: impl FnOnce() -> R) -> R {
    with_block_order(2, f)
}

/// Whether a GPU accepts a launch of this shape (runtime/emu/cpp/launch.cpp's limits: 1024
/// threads per block, 48 KiB of dynamic shared memory, grid y and z up to 65535, nothing empty).
pub fn shape_ok(grid: [u32; 3], block: [u32; 3], smem: u32) -> bool {
    // SAFETY: two arrays of three, read only.
    unsafe { recipe_emu_shape_ok(grid.as_ptr(), block.as_ptr(), smem) }
}

thread_local! {
    /// [`Device::start_profile`]'s totals: per thread, since the emulator runs each launch on
    /// the calling thread (a rank's, in a run of several).
    /// And the first timed operation's start, which the span runs from.
    static PROFILE: RefCell<Option<(Profile, Option<Instant>)>> = const { RefCell::new(None) };
}

/// Runs `f`, timed by the host's clock as `name` when this thread profiles.
fn timed<T>(name: &'static str, f: impl FnOnce() -> T) -> T {
    if PROFILE.with(|p| p.borrow().is_none()) {
        return f();
    }
    let t = Instant::now();
    let r = f();
    let s = t.elapsed().as_secs_f64();
    PROFILE.with(|p| {
        if let Some((prof, first)) = p.borrow_mut().as_mut() {
            prof.add(name, s);
            prof.span = first.get_or_insert(t).elapsed().as_secs_f64();
        }
    });
    r
}

/// Runs kernel `name` on its parameters' slots ([`Arg::slots`]), whose types are `signature`
/// ([`Arg::signature`]): a kernel whose parameter list differs is refused, as a GPU would
/// silently read the wrong bytes.
fn launch_slots(name: &'static str, l: Launch, mut slots: Vec<u64>, signature: &CStr) {
    let mut ptrs: Vec<*mut c_void> = slots
        .iter_mut()
        .map(|s| s as *mut u64 as *mut c_void)
        .collect();
    let cname = CString::new(name).expect("kernel name");
    let grid = [l.grid.0, l.grid.1, l.grid.2];
    let block = [l.block.0, l.block.1, l.block.2];
    // SAFETY: the pointers in the slots come from live views the caller holds for this call
    // (or, replayed from a graph, that its capturer keeps alive); `ptrs` points at `slots`,
    // which outlive the call.
    let rc = timed(name, || unsafe {
        recipe_emu_launch(
            cname.as_ptr(),
            grid.as_ptr(),
            block.as_ptr(),
            l.smem,
            ptrs.as_mut_ptr(),
            signature.as_ptr(),
        )
    });
    match rc {
        0 => {}
        -1 => panic!("kernel `{name}` is not in runtime/kernels"),
        -3 => panic!(
            "kernel `{name}`: launched with parameters {signature:?}, which its parameter list \
             (runtime/kernels) does not match (p pointer, i int, u unsigned, U unsigned long \
             long, f float)"
        ),
        _ => panic!("kernel `{name}`: launch shape {l:?} would be refused by a GPU"),
    }
}

/// The emulated device (host memory; see the crate docs).
#[derive(Debug, Clone, Copy, Default)]
pub struct Emu;

/// The kernels the emulation library was built with.
pub fn kernels() -> Vec<String> {
    // SAFETY: the library's table is static; each name is a NUL-terminated literal.
    unsafe {
        (0..recipe_emu_kernel_count())
            .map(|i| {
                CStr::from_ptr(recipe_emu_kernel_name(i))
                    .to_string_lossy()
                    .into_owned()
            })
            .collect()
    }
}

/// Every kernel with its parameter list as [`Arg::signature`] letters, in the table's order.
pub fn kernel_signatures() -> Vec<(String, String)> {
    let names = kernels();
    // SAFETY: as in `kernels`; each signature is a NUL-terminated static array.
    names
        .into_iter()
        .enumerate()
        .map(|(i, n)| {
            let sig = unsafe { CStr::from_ptr(recipe_emu_kernel_signature(i as c_uint)) };
            (n, sig.to_string_lossy().into_owned())
        })
        .collect()
}

/// Runs kernel `name` on the calling thread as `cuLaunchKernel` would: `params` points at
/// each parameter's value, whose types are the kernel's own (`signature`, from
/// [`kernel_signatures`]). 0 when it ran; -1 an unknown kernel; -2 a launch shape a GPU
/// refuses; -3 a signature that is not the kernel's (runtime/emu/cpp/launch.cpp).
///
/// # Safety
/// Each of `params` points at a live value of its parameter's type, and every address among
/// them is host memory the kernel may read and write as the GPU's would be.
pub unsafe fn launch_params(
    name: &CStr,
    grid: [u32; 3],
    block: [u32; 3],
    smem: u32,
    params: *mut *mut c_void,
    signature: &CStr,
) -> i32 {
    recipe_emu_launch(
        name.as_ptr(),
        grid.as_ptr(),
        block.as_ptr(),
        smem,
        params,
        signature.as_ptr(),
    )
}

impl Device for Emu {
    recipe_runtime::host_memory!();
    /// Host memory is all there is: the pinned buffers are ordinary ones.
    type Pinned = Vec<f32>;

    fn alloc_pinned(&self, n: usize) -> Vec<f32> {
        vec![0.0; n]
    }

    fn as_view<'a, 'b>(&self, v: &'b &'a mut [f32]) -> &'b [f32]
    where
        'a: 'b,
    {
        v
    }

    fn len(&self, v: &[f32]) -> usize {
        v.len()
    }

    fn len_mut(&self, v: &&mut [f32]) -> usize {
        v.len()
    }

    fn ptr(&self, v: &[f32]) -> u64 {
        v.as_ptr() as u64
    }

    fn ptr_mut(&self, v: &mut &mut [f32]) -> u64 {
        v.as_mut_ptr() as u64
    }

    fn ids_ptr(&self, ids: &Vec<u32>) -> u64 {
        ids.as_ptr() as u64
    }

    fn launch(&self, name: &'static str, l: Launch, args: &[Arg]) {
        let sig = CString::new(Arg::signature(args)).expect("letters");
        launch_slots(name, l, Arg::slots(args), &sig);
    }

    fn gemm(&self, g: &Gemm, a: &[f32], b: &[f32], c: &mut [f32]) {
        timed("gemm", || Cpu::new(1).gemm(g, a, b, c));
    }

    fn sync(&self) -> Result<(), String> {
        Ok(())
    }

    /// Timed by the host's clock, per thread (kernels and GEMMs; the host memory's copies are
    /// not operations here).
    fn start_profile(&self) -> bool {
        PROFILE.with(|p| *p.borrow_mut() = Some((Profile::default(), None)));
        true
    }

    fn profile(&self) -> Option<Profile> {
        PROFILE.with(|p| p.borrow().as_ref().map(|(prof, _)| prof.clone()))
    }
}

/// Emulated devices of one data-parallel group summing their buffers directly, as GPUs do through
/// NCCL: the buffers are host memory, so the sums are [`LocalCollective`]'s (rank order), which
/// makes a run with peers comparable bit for bit with the CPU's simulated ranks.
#[derive(Debug)]
pub struct EmuPeers(LocalCollective);

impl EmuPeers {
    /// One end per rank of a group of `world` emulated devices.
    pub fn group(world: usize) -> Vec<EmuPeers> {
        LocalCollective::group(world, std::time::Duration::from_secs(120))
            .into_iter()
            .map(EmuPeers)
            .collect()
    }
}

impl Peers<Emu> for EmuPeers {
    fn rank(&self) -> usize {
        self.0.rank()
    }

    fn world(&self) -> usize {
        self.0.world()
    }

    fn all_reduce_sum(&mut self, _: &Emu, buf: &mut [f32]) -> Result<(), String> {
        self.0
            .all_reduce(buf, ReduceOp::Sum)
            .map_err(|e| e.to_string())
    }

    fn reduce_sum(&mut self, _: &Emu, buf: &mut [f32], root: usize) -> Result<(), String> {
        self.0
            .reduce(buf, root, ReduceOp::Sum)
            .map_err(|e| e.to_string())
    }

    fn broadcast(&mut self, _: &Emu, buf: &mut [f32], root: usize) -> Result<(), String> {
        self.0.broadcast(buf, root).map_err(|e| e.to_string())
    }
}
