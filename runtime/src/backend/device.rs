//! What a kernel executor must provide: memory, views, a kernel launch and a GEMM.
//!
//! [`super::kernels::Kernels`] implements the whole [`super::Backend`] once over this trait, so
//! the launch code (grid sizes, argument order, the storage-dtype rounding) is the same for the
//! real GPU ([`super::cuda::CudaDevice`], cudarc) and for the CPU emulation of the CUDA execution
//! model the tests run the same `.cu` sources on (`runtime/emu`, docs/cuda.md).

use std::ops::Range;

use super::profile::Profile;
use super::{Aside, Batch, Gemm};
use crate::precision::Dtype;

/// A device's memory as its driver reports it (`cuMemGetInfo`), in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct DeviceMemory {
    /// What the device's free memory fell by since it was opened (after its context was made):
    /// the run's buffers, kernels, library workspaces and graphs, and anything another process
    /// took meanwhile.
    pub taken: u64,
    /// Free now.
    pub free: u64,
    /// The device's whole memory.
    pub total: u64,
}

/// One kernel argument, passed by value as `cuLaunchKernel` takes them: a device address or a
/// scalar of the kernel's parameter type.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Arg {
    /// A pointer (`float*`, `const unsigned*`, …).
    Ptr(u64),
    /// `int`.
    I32(i32),
    /// `unsigned`.
    U32(u32),
    /// `unsigned long long`.
    U64(u64),
    /// `float`.
    F32(f32),
    /// A buffer's address and its element type ([`Device::elem`]): two parameters, `void*`
    /// then `int` (`STORE_F32`, `STORE_F16` or `STORE_BF16`, runtime/kernels/common.cuh), which
    /// the kernel reads and writes it through (`ld`, `sto`).
    Typed(u64, Dtype),
}

/// A dtype as the kernels' `int` (`STORE_*` in runtime/kernels/common.cuh).
pub fn dtype_code(d: Dtype) -> i32 {
    match d {
        Dtype::F32 => 0,
        Dtype::F16 => 1,
        Dtype::Bf16 => 2,
    }
}

impl Arg {
    /// The argument's kernel parameters' bytes, each little-endian and padded to 8 (a kernel
    /// reads the first `sizeof(parameter)` of them), appended to `out`.
    pub fn push_slots(self, out: &mut Vec<u64>) {
        match self {
            Arg::Ptr(p) | Arg::U64(p) => out.push(p),
            Arg::I32(x) => out.push(u64::from(x as u32)),
            Arg::U32(x) => out.push(u64::from(x)),
            Arg::F32(x) => out.push(u64::from(x.to_bits())),
            Arg::Typed(p, d) => out.extend([p, u64::from(dtype_code(d) as u32)]),
        }
    }

    /// Every argument's parameter types, one letter each, in order: `p` a pointer, `i` an
    /// `int`, `u` an `unsigned`, `U` an `unsigned long long`, `f` a `float` (`Typed`: `pi`).
    /// The emulator checks it against the kernel's own parameter list
    /// (runtime/emu/cpp/launch.cpp), which a GPU's `cuLaunchKernel` cannot: it reads each
    /// parameter's bytes whatever was passed.
    pub fn signature(args: &[Arg]) -> String {
        args.iter()
            .map(|a| match a {
                Arg::Ptr(_) => "p",
                Arg::I32(_) => "i",
                Arg::U32(_) => "u",
                Arg::U64(_) => "U",
                Arg::F32(_) => "f",
                Arg::Typed(..) => "pi",
            })
            .collect()
    }

    /// Every argument's parameters, in order.
    pub fn slots(args: &[Arg]) -> Vec<u64> {
        let mut out = Vec::with_capacity(args.len() + 2);
        for a in args {
            a.push_slots(&mut out);
        }
        out
    }
}

/// A launch shape: `grid` blocks of `block` threads, `smem` bytes of dynamic shared memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Launch {
    /// Blocks (x, y, z).
    pub grid: (u32, u32, u32),
    /// Threads per block (x, y, z).
    pub block: (u32, u32, u32),
    /// Dynamic shared memory per block, in bytes.
    pub smem: u32,
}

/// Memory and launches of one kernel executor (see the module docs).
pub trait Device {
    /// An owned `f32` buffer.
    type Buf;
    /// A read-only view of part of a buffer.
    type View<'a>: Copy
    where
        Self: 'a;
    /// A writable view of part of a buffer.
    type ViewMut<'a>
    where
        Self: 'a;
    /// An owned `u32` buffer.
    type Ids;
    /// Host memory the device copies to and from directly: page-locked on a GPU (a copy is one
    /// DMA, not staged through the driver's bounce buffer), ordinary memory on the emulator.
    /// Optimizer offload moves the gradients and the parameters through it once per step.
    type Pinned: std::ops::DerefMut<Target = [f32]> + Send + 'static;

    /// A zero-filled buffer of `n` floats.
    fn alloc(&self, n: usize) -> Self::Buf;
    /// A zero-filled buffer of `n` values of the half dtype `half`, kept in 16 bits each when
    /// this device can (its views then say so, [`Device::elem`], and the kernels read and write
    /// it through [`Arg::Typed`]); by default an f32 buffer, which holds the same values.
    fn alloc_half(&self, n: usize, half: Dtype) -> Self::Buf {
        debug_assert!(half.is_half());
        self.alloc(n)
    }
    /// The element type of the buffers [`Device::alloc_half`] makes for `half`: `half` when
    /// this device keeps them in 16 bits, else [`Dtype::F32`] (the default).
    fn half_elem(&self, _half: Dtype) -> Dtype {
        Dtype::F32
    }
    /// What a view's elements are: [`Dtype::F32`], or the half dtype of an
    /// [`Device::alloc_half`] buffer kept in 16 bits. Copies to and from the host convert.
    fn elem(&self, _v: Self::View<'_>) -> Dtype {
        Dtype::F32
    }
    /// Whether kernels may use PTX's `mma.sync.aligned.m16n8k16` on fp16/bf16 operands
    /// (common.cuh, `mma_16816`): a GPU from sm_80 on, and the emulator, which emulates it.
    fn has_mma(&self) -> bool {
        false
    }
    /// A copy of `src` on the device.
    fn upload(&self, src: &[f32]) -> Self::Buf;
    /// `n` zeroed floats of [`Device::Pinned`] host memory (allocated once per run: pinning
    /// is slow).
    fn alloc_pinned(&self, n: usize) -> Self::Pinned;
    /// Copies `src` into `dst` (the same length).
    fn write(&self, dst: Self::ViewMut<'_>, src: &[f32]);
    /// Copies `src` into `dst`, reusing its memory when `src` fits what `dst` has held; returns
    /// whether it had to allocate.
    fn write_ids(&self, dst: &mut Self::Ids, src: &[u32]) -> bool;
    /// Makes `b` `n` floats long, reusing its memory when `n` fits (see
    /// [`super::Backend::resize`]); returns whether it had to allocate.
    fn resize(&self, b: &mut Self::Buf, n: usize) -> bool;
    /// A copy of `src` on the device.
    fn upload_ids(&self, src: &[u32]) -> Self::Ids;
    /// Copies `src` to the host.
    fn download(&self, src: Self::View<'_>, dst: &mut [f32]);
    /// The whole of `b`, read-only.
    fn view<'a>(&self, b: &'a Self::Buf) -> Self::View<'a>;
    /// The whole of `b`, writable.
    fn view_mut<'a>(&self, b: &'a mut Self::Buf) -> Self::ViewMut<'a>;
    /// Elements `r` of a buffer, writable for the buffer's borrow.
    fn range_mut<'a>(&self, b: &'a mut Self::Buf, r: Range<usize>) -> Self::ViewMut<'a>;
    /// Elements `r` of a view.
    fn sub<'a>(&self, v: Self::View<'a>, r: Range<usize>) -> Self::View<'a>
    where
        Self: 'a;
    /// Elements `r` of a writable view.
    fn sub_mut<'a, 'b>(&self, v: &'b mut Self::ViewMut<'a>, r: Range<usize>) -> Self::ViewMut<'b>
    where
        'a: 'b;
    /// Splits a writable view at `mid`.
    fn split_at_mut<'a, 'b>(
        &self,
        v: &'b mut Self::ViewMut<'a>,
        mid: usize,
    ) -> (Self::ViewMut<'b>, Self::ViewMut<'b>)
    where
        'a: 'b;
    /// A writable view, read-only for its borrow (a GEMM reading what a kernel wrote).
    fn as_view<'a, 'b>(&self, v: &'b Self::ViewMut<'a>) -> Self::View<'b>
    where
        'a: 'b;
    /// Elements in a view.
    fn len(&self, v: Self::View<'_>) -> usize;
    /// Elements in a writable view.
    fn len_mut(&self, v: &Self::ViewMut<'_>) -> usize;
    /// The address of a view's first element, for [`Arg::Ptr`].
    fn ptr(&self, v: Self::View<'_>) -> u64;
    /// The address of a writable view's first element.
    fn ptr_mut(&self, v: &mut Self::ViewMut<'_>) -> u64;
    /// The address of an id buffer.
    fn ids_ptr(&self, ids: &Self::Ids) -> u64;

    /// `dst = 0`.
    fn zero(&self, dst: Self::ViewMut<'_>);
    /// `dst = src` (the same length).
    fn copy(&self, dst: Self::ViewMut<'_>, src: Self::View<'_>);
    /// Runs kernel `name` (an `extern "C"` function of runtime/kernels/) with `args`.
    fn launch(&self, name: &'static str, l: Launch, args: &[Arg]);
    /// One fp32 GEMM (see [`Gemm`]), unrounded.
    fn gemm(&self, g: &Gemm, a: Self::View<'_>, b: Self::View<'_>, c: Self::ViewMut<'_>);
    /// One GEMM whose operands hold values of the half dtype `half` (each exactly representable:
    /// a half-precision run stores them rounded), with f32 accumulation and an unrounded f32
    /// result. A GPU feeds the operands to its tensor cores as fp16/bf16 (the products of two
    /// half values are exact in f32, so only the order of the f32 sums differs from
    /// [`Device::gemm`]); by default, [`Device::gemm`] on the same values.
    fn gemm_half(
        &self,
        g: &Gemm,
        a: Self::View<'_>,
        b: Self::View<'_>,
        c: Self::ViewMut<'_>,
        half: crate::precision::Dtype,
    ) {
        debug_assert!(half.is_half());
        self.gemm(g, a, b, c)
    }
    /// A [`Batch`] of GEMMs of shape `g`, item `j` on the operands at the batch's offsets in `a`,
    /// `b` and `c`: with `operands` fp16/bf16 as [`Device::gemm_half`] (values of that dtype),
    /// with f32 as [`Device::gemm`] on the operands' values (a 16-bit buffer's widened, which is
    /// exact). Unrounded f32 results, as those, but in a 16-bit `c` ([`Device::alloc_half`]),
    /// which gets them rounded to nearest even. By default, one call per item; a GPU issues the
    /// batch as one call.
    fn gemm_batched(
        &self,
        g: &Gemm,
        batch: &Batch,
        a: Self::View<'_>,
        b: Self::View<'_>,
        mut c: Self::ViewMut<'_>,
        operands: crate::precision::Dtype,
    ) {
        let (sa, sb, sc) = g.spans();
        assert!(
            batch.extent(batch.a, sa) <= self.len(a)
                && batch.extent(batch.b, sb) <= self.len(b)
                && batch.extent(batch.c, sc) <= self.len_mut(&c),
            "batched GEMM operands shorter than their batch"
        );
        for j in 0..batch.count {
            let (oa, ob, oc) = (
                batch.offset(batch.a, j),
                batch.offset(batch.b, j),
                batch.offset(batch.c, j),
            );
            let (ai, bi) = (self.sub(a, oa..oa + sa), self.sub(b, ob..ob + sb));
            let ci = self.sub_mut(&mut c, oc..oc + sc);
            if operands.is_half() {
                self.gemm_half(g, ai, bi, ci, operands);
            } else {
                self.gemm(g, ai, bi, ci);
            }
        }
    }
    /// [`crate::backend::Backend::aside`]: runs `f`, whose kernels and GEMMs a GPU may queue on
    /// a second stream, each after everything queued before it (a GEMM whose operands are packed
    /// or widened into scratch stays on the compute stream, with its packs: later packs reuse
    /// the scratch). By default `f` runs in order with the rest.
    fn aside(&self, f: impl FnOnce()) -> Aside {
        f();
        Aside::DONE
    }
    /// [`crate::backend::Backend::wait_aside`].
    fn wait_aside(&self, _t: Aside) {}
    /// [`crate::backend::Backend::join_aside`].
    fn join_aside(&self) {}
    /// Runs `f`, the update of parameter segment `seg` (the optimizer's step of it, and the
    /// zeroing of its gradient), whose work a GPU may queue on the second stream as
    /// [`Device::aside`] does, after everything queued before it, marked by an event of the
    /// segment's own that the next passes wait for ([`Device::wait_update`]), in a capture too:
    /// the graph then waits for each replay's updates. What is queued after it must not touch
    /// the segment's parameters, optimizer state or gradient before that wait or a
    /// [`Device::join_aside`]. By default `f` runs in order with the rest.
    fn update_aside(&self, _seg: usize, f: impl FnOnce()) {
        f();
    }
    /// Runs `f`, a run of [`Device::update_aside`] calls and nothing else queued (a step's
    /// segments one after another): a GPU orders their work after what was queued before once,
    /// not before each of their launches, since no other work comes between them. By default
    /// `f` runs as it is.
    fn updates_aside(&self, f: impl FnOnce()) {
        f();
    }
    /// [`crate::backend::Backend::wait_update`].
    fn wait_update(&self, _seg: usize) {}
    /// Sizes [`Device::gemm_half`]'s operand scratch for spans of up to `elems` elements.
    fn reserve_gemm_half(&self, _elems: usize) {}
    /// Sizes [`Device::gemm_batched`]'s scratch for batches of up to `count` GEMMs, and, when
    /// `wide` > 0, its f32 room for the 16-bit operands and output of an f32 batch whose
    /// extents reach `wide` elements.
    fn reserve_gemm_batched(&self, _count: usize, _wide: usize) {}
    /// Queues a copy of `src` into host memory at `dst` that starts once the work queued so far
    /// is done, on a stream of its own, so that the device goes on computing meanwhile (a
    /// window's gradient segments, each copied down as the backward finishes it); finished by
    /// [`Device::wait_copies`]. By default, copied at once.
    ///
    /// # Safety
    /// `dst` points at `len(src)` floats of [`Device::Pinned`] memory that stay allocated, and
    /// that nothing reads or writes, until [`Device::wait_copies`] has returned; the device
    /// memory of `src` is not written until then either.
    unsafe fn download_queued(&self, src: Self::View<'_>, dst: *mut f32) {
        let n = self.len(src);
        // SAFETY: the caller's contract.
        self.download(src, unsafe { std::slice::from_raw_parts_mut(dst, n) });
    }
    /// Queues a copy of the host memory at `src` into `dst` on the stream of
    /// [`Device::download_queued`], after the work queued so far; finished by
    /// [`Device::wait_copies`]. By default, copied at once.
    ///
    /// # Safety
    /// `src` points at `len(dst)` floats of [`Device::Pinned`] memory that stay allocated and
    /// unwritten, and nothing reads or writes `dst`, until [`Device::wait_copies`] has returned.
    unsafe fn upload_queued(&self, dst: Self::ViewMut<'_>, src: *const f32) {
        let n = self.len_mut(&dst);
        // SAFETY: the caller's contract.
        self.write(dst, unsafe { std::slice::from_raw_parts(src, n) });
    }
    /// [`Device::upload_queued`] into a 16-bit `dst` ([`Device::alloc_half`]) from the 16-bit
    /// patterns of its dtype at `src` ([`Dtype::bits`]): half the bytes of floats. By default,
    /// widened and written at once.
    ///
    /// # Safety
    /// As [`Device::upload_queued`], `src` pointing at `len(dst)` `u16`s of [`Device::Pinned`]
    /// memory.
    unsafe fn upload_queued_bits(&self, dst: Self::ViewMut<'_>, src: *const u16) {
        let n = self.len_mut(&dst);
        let elem = self.elem(self.as_view(&dst));
        // SAFETY: the caller's contract.
        let bits = unsafe { std::slice::from_raw_parts(src, n) };
        let wide: Vec<f32> = bits.iter().map(|&b| elem.from_bits(b)).collect();
        self.write(dst, &wide);
    }
    /// Waits for every queued copy ([`Device::download_queued`], [`Device::upload_queued`]);
    /// `Ok` unless one failed.
    fn wait_copies(&self) -> Result<(), String> {
        Ok(())
    }
    /// Orders the device's later work after every queued copy and queued collective
    /// ([`Peers::all_reduce_sum_queued`]) without the host waiting: what the compute stream
    /// queues next starts once they are done. `Ok` unless one failed (a GPU reports its errors
    /// at the next [`Device::sync`]). By default, [`Device::wait_copies`].
    fn join_copies(&self) -> Result<(), String> {
        self.wait_copies()
    }
    /// Waits for all launched work; `Ok` unless the device reported an error.
    fn sync(&self) -> Result<(), String>;
    /// Starts capturing the device work this thread queues into a graph (a CUDA graph), rather
    /// than running it; false when this device does not capture (the default), or a capture is
    /// under way. Until [`Device::end_capture`] only device work may be queued (launches,
    /// GEMMs, device copies and memsets): a copy to or from the host, a synchronisation or an
    /// allocation fails the capture (docs/cuda.md, "CUDA graphs").
    fn begin_capture(&self) -> bool {
        false
    }
    /// Ends the capture: the graph's id, or `None` when it failed. Nothing captured has run.
    fn end_capture(&self) -> Option<u64> {
        None
    }
    /// Queues graph `id`'s work, as it was captured (the same kernels, addresses and arguments);
    /// false when there is no such graph (nothing queued).
    fn launch_graph(&self, _id: u64) -> bool {
        false
    }
    /// Releases graph `id`.
    fn drop_graph(&self, _id: u64) {}
    /// Starts timing every operation ([`Device::profile`]); false when this device cannot.
    fn start_profile(&self) -> bool {
        false
    }
    /// What [`Device::start_profile`] measured so far (waits for the work queued); `None` when
    /// it was not started.
    fn profile(&self) -> Option<Profile> {
        None
    }
    /// This device's memory now, where it has memory of its own (a GPU).
    fn memory(&self) -> Option<DeviceMemory> {
        None
    }
}

/// The devices of a data-parallel group summing their buffers directly, one device per rank
/// (NCCL between GPUs, [`super::cuda::nccl`]; the emulator's sum in host memory). Every rank
/// calls the same sums in the same order with views of the same lengths, as with
/// [`crate::collective::Collective`]; a sum is queued on the device's stream, ordered with its
/// launches, and finished by the next [`Device::download`] or [`Device::sync`].
///
/// The sums are element-wise f32 additions over the ranks; a broadcast copies bits. The emulator adds in rank order 0,
/// 1, …, N−1, as [`crate::collective::LocalCollective`]; NCCL in its ring's order, the same bits
/// for two ranks (one addition, commutative), a different rounding order for more.
pub trait Peers<D: Device>: Send {
    /// This device's rank, `0..world()`.
    fn rank(&self) -> usize;
    /// The devices in the group.
    fn world(&self) -> usize;
    /// `buf` ← the element-wise sum of every rank's `buf`, on every rank.
    fn all_reduce_sum(&mut self, dev: &D, buf: D::ViewMut<'_>) -> Result<(), String>;
    /// Rank `root`'s `buf` ← the element-wise sum of every rank's `buf`; the other ranks' `buf`
    /// is left as it was.
    fn reduce_sum(&mut self, dev: &D, buf: D::ViewMut<'_>, root: usize) -> Result<(), String>;
    /// Every rank's `buf` ← rank `root`'s `buf`: one per owner, ZeRO 1–2 gather the parameters
    /// after each rank stepped its partition, and ZeRO-3 each segment's pieces.
    fn broadcast(&mut self, dev: &D, buf: D::ViewMut<'_>, root: usize) -> Result<(), String>;
    /// Opens a group: the calls until [`Peers::group_end`] are issued together (NCCL launches
    /// them as one; `ncclGroupStart`), on buffers that stay alive until then. By default,
    /// nothing: each call runs as it is made.
    fn group_start(&mut self) -> Result<(), String> {
        Ok(())
    }
    /// Closes the group [`Peers::group_start`] opened, issuing its calls.
    fn group_end(&mut self) -> Result<(), String> {
        Ok(())
    }
    /// [`Peers::all_reduce_sum`] queued with the device's copies ([`Device::download_queued`]):
    /// it starts once the work queued so far is done, and the device goes on computing
    /// meanwhile (a segment's gradient summed while the backward computes the next; DeepSpeed's
    /// `overlap_comm`). Finished by [`Device::join_copies`] or [`Device::wait_copies`]. By
    /// default, summed at once.
    ///
    /// # Safety
    /// Nothing reads or writes `buf`, and its memory stays allocated, until
    /// [`Device::join_copies`] or [`Device::wait_copies`] has returned; and no direct
    /// collective ([`Peers::all_reduce_sum`], …) is called before then: a GPU would run it on
    /// the compute stream, unordered with the queued ones, and NCCL needs every rank's calls in
    /// one order.
    unsafe fn all_reduce_sum_queued(&mut self, dev: &D, buf: D::ViewMut<'_>) -> Result<(), String> {
        self.all_reduce_sum(dev, buf)
    }
    /// [`Peers::reduce_sum`] queued as [`Peers::all_reduce_sum_queued`].
    ///
    /// # Safety
    /// As [`Peers::all_reduce_sum_queued`].
    unsafe fn reduce_sum_queued(
        &mut self,
        dev: &D,
        buf: D::ViewMut<'_>,
        root: usize,
    ) -> Result<(), String> {
        self.reduce_sum(dev, buf, root)
    }
    /// [`Peers::broadcast`] queued as [`Peers::all_reduce_sum_queued`] (ZeRO-3's gather of the
    /// next segment while the pass computes with this one).
    ///
    /// # Safety
    /// As [`Peers::all_reduce_sum_queued`].
    unsafe fn broadcast_queued(
        &mut self,
        dev: &D,
        buf: D::ViewMut<'_>,
        root: usize,
    ) -> Result<(), String> {
        self.broadcast(dev, buf, root)
    }
}

/// The first `n` `u16`s of `floats`' memory (which holds two per float): 16-bit patterns in
/// [`Device::Pinned`] memory for [`Device::upload_queued_bits`].
pub fn as_bits(floats: &mut [f32], n: usize) -> &mut [u16] {
    assert!(
        n <= 2 * floats.len(),
        "{n} 16-bit values in {} floats",
        floats.len()
    );
    // SAFETY: the floats' memory holds 2·len `u16`s (u16's alignment 2 divides f32's 4), and the
    // exclusive borrow passes to the result.
    unsafe { std::slice::from_raw_parts_mut(floats.as_mut_ptr().cast::<u16>(), n) }
}

/// `calls` (one per owner, say) in one group of `peers`, which is closed even when a call
/// fails (NCCL keeps a thread's group open otherwise).
pub fn grouped<D: Device, P: Peers<D> + ?Sized>(
    peers: &mut P,
    calls: impl FnOnce(&mut P) -> Result<(), String>,
) -> Result<(), String> {
    peers.group_start()?;
    let done = calls(peers);
    let ended = peers.group_end();
    done.and(ended)
}
