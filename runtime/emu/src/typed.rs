//! [`EmuTyped`]: the emulated device with 16-bit buffers ([`Device::alloc_half`]), so that the
//! kernels' typed buffers (`Arg::Typed`, `ld`/`sto` in runtime/kernels/common.cuh) run on their
//! 16-bit path, as on a GPU that keeps stored fp16/bf16 activations in two bytes. [`crate::Emu`]
//! keeps every buffer in f32 (its views are plain slices, which the kernel tests use directly);
//! this one's views carry their element type, and copies to and from the host convert. The
//! launches and the GEMM are [`crate::Emu`]'s (the GEMM on the operands widened to f32: a
//! 16-bit operand holds a half value exactly).
//!
//! Its queued copies ([`Device::download_queued`], [`Device::upload_queued`],
//! [`Device::upload_queued_bits`]) and its peers' queued sums ([`Peers::all_reduce_sum_queued`],
//! [`Peers::reduce_sum_queued`]) run as late as their contract allows: at
//! [`Device::wait_copies`] or [`Device::join_copies`], not when queued. A GPU runs them on a
//! second stream at some moment between the two; [`crate::Emu`] copies and sums at once, the
//! earliest. A caller that reads a download's host memory, lets the device read an upload's
//! buffer or a sum's, or writes a buffer being summed, before the wait or the join (which on a
//! GPU races) gets different values on the two emulators, and the runs that compare them bit
//! for bit (tests/run.rs) fail. A direct sum while queued ones are pending is refused (on a GPU
//! it would run unordered with them).

use std::cell::RefCell;
use std::marker::PhantomData;
use std::ops::Range;
use std::sync::{Arc, Mutex};

use recipe_runtime::backend::device::{Arg, Device, Launch, Peers};
use recipe_runtime::backend::Gemm;
use recipe_runtime::precision::Dtype;

use crate::{graph, Emu};

thread_local! {
    /// The copies queued on this thread and not yet waited for, in order (the emulated copy
    /// stream; see the module docs). A rank's device is driven by its rank's thread, which
    /// queues and waits; a queue left by a thread that ends is dropped unrun.
    static QUEUED: RefCell<Vec<Queued>> = const { RefCell::new(Vec::new()) };
}

/// A queued copy or sum, and whether it is a sum between the devices.
type Queued = (Box<dyn FnOnce() -> Result<(), String>>, bool);

/// Queues `copy` on the emulated copy stream.
fn queue(copy: impl FnOnce() + 'static) {
    let op = move || {
        copy();
        Ok(())
    };
    QUEUED.with(|q| q.borrow_mut().push((Box::new(op), false)));
}

/// Queues a sum between the devices on the emulated copy stream.
fn queue_sum(sum: impl FnOnce() -> Result<(), String> + 'static) {
    QUEUED.with(|q| q.borrow_mut().push((Box::new(sum), true)));
}

/// Runs this thread's queued copies and sums, in the order queued; the first error (the
/// operations after a failed sum are dropped: the group is broken).
fn run_queued() -> Result<(), String> {
    for (op, _) in QUEUED.with(|q| std::mem::take(&mut *q.borrow_mut())) {
        op()?;
    }
    Ok(())
}

/// Refuses a direct sum while queued ones are pending ([`Peers::all_reduce_sum_queued`]).
fn no_queued_sums(what: &str) -> Result<(), String> {
    if QUEUED.with(|q| q.borrow().iter().any(|(_, sum)| *sum)) {
        return Err(format!(
            "a direct {what} between the devices while queued sums are pending (join_copies first)"
        ));
    }
    Ok(())
}

/// The emulated device with 16-bit buffers (see the module docs).
#[derive(Debug, Clone, Copy, Default)]
pub struct EmuTyped;

/// A buffer: `len` elements of `elem` in 4-byte words (two 16-bit elements per word).
#[derive(Debug)]
pub struct TypedBuf {
    words: Vec<u32>,
    len: usize,
    elem: Dtype,
}

/// A read-only view of part of a [`TypedBuf`].
#[derive(Debug, Clone, Copy)]
pub struct TypedView<'a> {
    ptr: *const u8,
    len: usize,
    elem: Dtype,
    _borrow: PhantomData<&'a [u8]>,
}

/// A writable view of part of a [`TypedBuf`].
#[derive(Debug)]
pub struct TypedViewMut<'a> {
    ptr: *mut u8,
    len: usize,
    elem: Dtype,
    _borrow: PhantomData<&'a mut [u8]>,
}

/// Bytes per element.
fn size(elem: Dtype) -> usize {
    if elem.is_half() {
        2
    } else {
        4
    }
}

/// `x`'s 16 bits in `half`, rounded to nearest even (exact for a value already rounded to it).
fn narrow(x: f32, half: Dtype) -> u16 {
    half.bits(x)
}

fn widen(b: u16, half: Dtype) -> f32 {
    half.from_bits(b)
}

/// The `len` elements of `elem` at `p` as floats.
///
/// # Safety
/// `p` points at `len` live elements of `elem`.
unsafe fn read(p: *const u8, len: usize, elem: Dtype) -> Vec<f32> {
    if elem.is_half() {
        // SAFETY: the caller's contract; 16-bit elements are 2-aligned (words hold two).
        let s = unsafe { std::slice::from_raw_parts(p as *const u16, len) };
        s.iter().map(|&b| widen(b, elem)).collect()
    } else {
        // SAFETY: the caller's contract; f32 elements start at a word.
        unsafe { std::slice::from_raw_parts(p as *const f32, len) }.to_vec()
    }
}

/// Writes `src` as elements of `elem` at `p`.
///
/// # Safety
/// `p` points at `src.len()` live, writable elements of `elem` that nothing else borrows.
unsafe fn write_at(p: *mut u8, src: &[f32], elem: Dtype) {
    if elem.is_half() {
        // SAFETY: the caller's contract.
        let d = unsafe { std::slice::from_raw_parts_mut(p as *mut u16, src.len()) };
        for (d, &x) in d.iter_mut().zip(src) {
            *d = narrow(x, elem);
        }
    } else {
        // SAFETY: the caller's contract.
        unsafe { std::slice::from_raw_parts_mut(p as *mut f32, src.len()) }.copy_from_slice(src);
    }
}

impl EmuTyped {
    fn buf(n: usize, elem: Dtype) -> TypedBuf {
        TypedBuf {
            words: vec![0; (n * size(elem)).div_ceil(4).max(1)],
            len: n,
            elem,
        }
    }
}

impl Device for EmuTyped {
    type Buf = TypedBuf;
    type View<'a> = TypedView<'a>;
    type ViewMut<'a> = TypedViewMut<'a>;
    type Ids = Vec<u32>;
    type Pinned = Vec<f32>;

    fn alloc(&self, n: usize) -> TypedBuf {
        graph::host_op();
        Self::buf(n, Dtype::F32)
    }

    fn alloc_half(&self, n: usize, half: Dtype) -> TypedBuf {
        graph::host_op();
        assert!(half.is_half(), "alloc_half of {half:?}");
        Self::buf(n, half)
    }

    fn half_elem(&self, half: Dtype) -> Dtype {
        half
    }

    fn has_mma(&self) -> bool {
        true
    }

    fn elem(&self, v: TypedView<'_>) -> Dtype {
        v.elem
    }

    fn upload(&self, src: &[f32]) -> TypedBuf {
        let mut b = self.alloc(src.len());
        self.write(self.view_mut(&mut b), src);
        b
    }

    fn alloc_pinned(&self, n: usize) -> Vec<f32> {
        vec![0.0; n]
    }

    fn write(&self, dst: TypedViewMut<'_>, src: &[f32]) {
        graph::host_op();
        assert_eq!(dst.len, src.len(), "write length");
        // SAFETY: `dst` is a live, exclusively borrowed view of `len` elements.
        unsafe { write_at(dst.ptr, src, dst.elem) }
    }

    fn write_ids(&self, dst: &mut Vec<u32>, src: &[u32]) -> bool {
        graph::host_op();
        let grows = src.len() > dst.capacity();
        dst.clear();
        dst.extend_from_slice(src);
        grows
    }

    fn resize(&self, b: &mut TypedBuf, n: usize) -> bool {
        let grows = n * size(b.elem) > b.words.len() * 4;
        if grows {
            graph::host_op();
            // New elements are NaN, as `host_memory!`'s: a pass that read one before writing it
            // would show.
            let mut new = Self::buf(n, b.elem);
            let nan = vec![f32::NAN; n];
            // SAFETY: `new` holds `n` elements of its type.
            unsafe { write_at(new.words.as_mut_ptr() as *mut u8, &nan, b.elem) };
            let keep = b.len.min(n) * size(b.elem);
            // SAFETY: both hold at least `keep` bytes.
            unsafe {
                std::ptr::copy_nonoverlapping(
                    b.words.as_ptr() as *const u8,
                    new.words.as_mut_ptr() as *mut u8,
                    keep,
                )
            };
            *b = new;
        }
        b.len = n;
        grows
    }

    fn upload_ids(&self, src: &[u32]) -> Vec<u32> {
        graph::host_op();
        src.to_vec()
    }

    fn download(&self, src: TypedView<'_>, dst: &mut [f32]) {
        graph::host_op();
        assert_eq!(src.len, dst.len(), "download length");
        // SAFETY: `src` is a live view of `len` elements.
        dst.copy_from_slice(&unsafe { read(src.ptr, src.len, src.elem) });
    }

    fn view<'a>(&self, b: &'a TypedBuf) -> TypedView<'a> {
        TypedView {
            ptr: b.words.as_ptr() as *const u8,
            len: b.len,
            elem: b.elem,
            _borrow: PhantomData,
        }
    }

    fn view_mut<'a>(&self, b: &'a mut TypedBuf) -> TypedViewMut<'a> {
        TypedViewMut {
            ptr: b.words.as_mut_ptr() as *mut u8,
            len: b.len,
            elem: b.elem,
            _borrow: PhantomData,
        }
    }

    fn range_mut<'a>(&self, b: &'a mut TypedBuf, r: Range<usize>) -> TypedViewMut<'a> {
        let mut v = self.view_mut(b);
        let s = self.sub_mut(&mut v, r);
        TypedViewMut {
            ptr: s.ptr,
            len: s.len,
            elem: s.elem,
            _borrow: PhantomData,
        }
    }

    fn sub<'a>(&self, v: TypedView<'a>, r: Range<usize>) -> TypedView<'a>
    where
        Self: 'a,
    {
        assert!(r.start <= r.end && r.end <= v.len, "sub {r:?} of {}", v.len);
        TypedView {
            // SAFETY: inside the view (asserted).
            ptr: unsafe { v.ptr.add(r.start * size(v.elem)) },
            len: r.len(),
            elem: v.elem,
            _borrow: PhantomData,
        }
    }

    fn sub_mut<'a, 'b>(&self, v: &'b mut TypedViewMut<'a>, r: Range<usize>) -> TypedViewMut<'b>
    where
        'a: 'b,
    {
        assert!(
            r.start <= r.end && r.end <= v.len,
            "sub_mut {r:?} of {}",
            v.len
        );
        TypedViewMut {
            // SAFETY: inside the view (asserted).
            ptr: unsafe { v.ptr.add(r.start * size(v.elem)) },
            len: r.len(),
            elem: v.elem,
            _borrow: PhantomData,
        }
    }

    fn split_at_mut<'a, 'b>(
        &self,
        v: &'b mut TypedViewMut<'a>,
        mid: usize,
    ) -> (TypedViewMut<'b>, TypedViewMut<'b>)
    where
        'a: 'b,
    {
        assert!(mid <= v.len, "split_at_mut {mid} of {}", v.len);
        let at = |start: usize, len: usize| TypedViewMut {
            // SAFETY: inside the view (asserted).
            ptr: unsafe { v.ptr.add(start * size(v.elem)) },
            len,
            elem: v.elem,
            _borrow: PhantomData,
        };
        (at(0, mid), at(mid, v.len - mid))
    }

    fn as_view<'a, 'b>(&self, v: &'b TypedViewMut<'a>) -> TypedView<'b>
    where
        'a: 'b,
    {
        TypedView {
            ptr: v.ptr,
            len: v.len,
            elem: v.elem,
            _borrow: PhantomData,
        }
    }

    fn len(&self, v: TypedView<'_>) -> usize {
        v.len
    }

    fn len_mut(&self, v: &TypedViewMut<'_>) -> usize {
        v.len
    }

    fn ptr(&self, v: TypedView<'_>) -> u64 {
        v.ptr as u64
    }

    fn ptr_mut(&self, v: &mut TypedViewMut<'_>) -> u64 {
        v.ptr as u64
    }

    fn ids_ptr(&self, ids: &Vec<u32>) -> u64 {
        ids.as_ptr() as u64
    }

    fn zero(&self, dst: TypedViewMut<'_>) {
        let (p, bytes) = (dst.ptr, dst.len * size(dst.elem));
        // SAFETY: a live, exclusively borrowed view of `len` elements (replayed: kept alive by
        // the graph's capturer, as a GPU's graph needs its buffers).
        graph::device_op(move || unsafe { std::ptr::write_bytes(p, 0, bytes) });
    }

    fn copy(&self, dst: TypedViewMut<'_>, src: TypedView<'_>) {
        assert_eq!((dst.len, dst.elem), (src.len, src.elem), "copy");
        let (d, s, bytes) = (dst.ptr, src.ptr, src.len * size(src.elem));
        // SAFETY: both live views of `len` elements of one type; `dst` is exclusively
        // borrowed, so they do not overlap (replayed: as `zero`).
        graph::device_op(move || unsafe { std::ptr::copy_nonoverlapping(s, d, bytes) });
    }

    fn launch(&self, name: &'static str, l: Launch, args: &[Arg]) {
        let slots = Arg::slots(args);
        let sig = std::ffi::CString::new(Arg::signature(args)).expect("letters");
        graph::device_op(move || crate::launch_slots(name, l, slots.clone(), &sig));
    }

    /// The CPU backend's GEMM on the operands' spans widened to f32 (exact); a 16-bit output
    /// gets the f32 result rounded to nearest even, as a GPU's GEMM writes it (and as `st`
    /// rounds).
    fn gemm(&self, g: &Gemm, a: TypedView<'_>, b: TypedView<'_>, c: TypedViewMut<'_>) {
        let (span_a, span_b, span_c) = g.spans();
        assert!(
            span_a <= a.len && span_b <= b.len && span_c <= c.len,
            "GEMM spans"
        );
        let (g, a, b, c) = (*g, (a.ptr, a.elem), (b.ptr, b.elem), (c.ptr, c.elem));
        // SAFETY: the spans lie inside the live views (asserted); `c` is exclusively borrowed
        // (replayed: as `zero`).
        graph::device_op(move || unsafe {
            let (wa, wb) = (read(a.0, span_a, a.1), read(b.0, span_b, b.1));
            let mut wc = read(c.0, span_c, c.1);
            Emu.gemm(&g, &wa, &wb, &mut wc);
            write_at(c.0, &wc, c.1);
        });
    }

    fn sync(&self) -> Result<(), String> {
        graph::host_op();
        Ok(())
    }

    /// Recorded per thread (see `graph.rs`).
    fn begin_capture(&self) -> bool {
        graph::begin()
    }

    fn end_capture(&self) -> Option<u64> {
        graph::end()
    }

    fn launch_graph(&self, id: u64) -> bool {
        graph::launch(id)
    }

    fn drop_graph(&self, id: u64) {
        graph::drop_graph(id)
    }

    /// [`crate::Emu`]'s: its launches and GEMMs are timed.
    fn start_profile(&self) -> bool {
        Emu.start_profile()
    }

    fn profile(&self) -> Option<recipe_runtime::backend::profile::Profile> {
        Emu.profile()
    }

    /// Run at [`Device::wait_copies`] (see the module docs).
    unsafe fn download_queued(&self, src: TypedView<'_>, dst: *mut f32) {
        graph::host_op();
        let (p, n, elem) = (src.ptr, src.len, src.elem);
        queue(move || {
            // SAFETY: the caller's contract: `src`'s memory and `dst`'s `n` floats stay
            // allocated and untouched until `wait_copies`, which runs this.
            unsafe {
                let v = read(p, n, elem);
                std::ptr::copy_nonoverlapping(v.as_ptr(), dst, n);
            }
        });
    }

    /// Run at [`Device::wait_copies`] (see the module docs).
    unsafe fn upload_queued(&self, dst: TypedViewMut<'_>, src: *const f32) {
        graph::host_op();
        let (p, n, elem) = (dst.ptr, dst.len, dst.elem);
        // SAFETY (of the copy): the caller's contract, as `download_queued`'s.
        queue(move || unsafe { write_at(p, std::slice::from_raw_parts(src, n), elem) });
    }

    /// Run at [`Device::wait_copies`]: the bits as they are (see the module docs).
    unsafe fn upload_queued_bits(&self, dst: TypedViewMut<'_>, src: *const u16) {
        graph::host_op();
        assert!(dst.elem.is_half(), "16-bit upload into {:?}", dst.elem);
        let (p, n) = (dst.ptr, dst.len);
        // SAFETY (of the copy): the caller's contract, as `download_queued`'s; `dst` holds `n`
        // 16-bit elements.
        queue(move || unsafe { std::ptr::copy_nonoverlapping(src, p as *mut u16, n) });
    }

    /// Runs this thread's queued copies and sums, in the order queued.
    fn wait_copies(&self) -> Result<(), String> {
        graph::host_op();
        run_queued()
    }

    /// The same: the emulated device's later work runs after them. (Not inside a graph: a
    /// queued operation cannot be captured.)
    fn join_copies(&self) -> Result<(), String> {
        graph::host_op();
        run_queued()
    }
}

/// The f32 elements of a writable view (what the group sums: gradients, f32 on a GPU too).
fn floats<'a>(v: TypedViewMut<'a>) -> &'a mut [f32] {
    assert_eq!(
        v.elem,
        Dtype::F32,
        "a sum between devices of a 16-bit buffer"
    );
    // SAFETY: a live, exclusively borrowed view of `len` f32 elements for `'a`.
    unsafe { std::slice::from_raw_parts_mut(v.ptr as *mut f32, v.len) }
}

/// [`crate::EmuPeers`] for devices with 16-bit buffers (their sums are of f32 buffers), whose
/// queued sums run at the join (see the module docs): shared with the queue.
#[derive(Debug)]
pub struct EmuTypedPeers(Arc<Mutex<crate::EmuPeers>>);

impl EmuTypedPeers {
    /// One end per rank of a group of `world` emulated devices.
    pub fn group(world: usize) -> Vec<EmuTypedPeers> {
        crate::EmuPeers::group(world)
            .into_iter()
            .map(|p| EmuTypedPeers(Arc::new(Mutex::new(p))))
            .collect()
    }

    fn peers(&self) -> std::sync::MutexGuard<'_, crate::EmuPeers> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Queues `sum` of the f32 elements of `buf` (see the module docs).
    ///
    /// # Safety
    /// [`Peers::all_reduce_sum_queued`]'s contract.
    unsafe fn queued(
        &self,
        buf: TypedViewMut<'_>,
        sum: impl FnOnce(&mut crate::EmuPeers, &mut [f32]) -> Result<(), String> + 'static,
    ) {
        graph::host_op();
        let floats = floats(buf);
        let (p, n) = (floats.as_mut_ptr(), floats.len());
        let peers = self.0.clone();
        queue_sum(move || {
            // SAFETY: the caller's contract keeps the `n` floats at `p` allocated and untouched
            // until the join or wait that runs this.
            let buf = unsafe { std::slice::from_raw_parts_mut(p, n) };
            sum(&mut peers.lock().unwrap_or_else(|p| p.into_inner()), buf)
        });
    }
}

impl Peers<EmuTyped> for EmuTypedPeers {
    fn rank(&self) -> usize {
        self.peers().rank()
    }

    fn world(&self) -> usize {
        self.peers().world()
    }

    fn all_reduce_sum(&mut self, _: &EmuTyped, buf: TypedViewMut<'_>) -> Result<(), String> {
        no_queued_sums("sum")?;
        self.peers().all_reduce_sum(&crate::Emu, floats(buf))
    }

    fn reduce_sum(
        &mut self,
        _: &EmuTyped,
        buf: TypedViewMut<'_>,
        root: usize,
    ) -> Result<(), String> {
        no_queued_sums("sum")?;
        self.peers().reduce_sum(&crate::Emu, floats(buf), root)
    }

    /// A 16-bit buffer (the half parameters) through its values widened to f32 and back,
    /// which copies its bits.
    fn broadcast(
        &mut self,
        _: &EmuTyped,
        buf: TypedViewMut<'_>,
        root: usize,
    ) -> Result<(), String> {
        no_queued_sums("broadcast")?;
        if !buf.elem.is_half() {
            return self.peers().broadcast(&crate::Emu, floats(buf), root);
        }
        // SAFETY: a live, exclusively borrowed view of `len` elements of its type.
        let mut wide = unsafe { read(buf.ptr, buf.len, buf.elem) };
        self.peers().broadcast(&crate::Emu, &mut wide, root)?;
        // SAFETY: as above.
        unsafe { write_at(buf.ptr, &wide, buf.elem) };
        Ok(())
    }

    /// Run at the join or wait (see the module docs).
    unsafe fn all_reduce_sum_queued(
        &mut self,
        _: &EmuTyped,
        buf: TypedViewMut<'_>,
    ) -> Result<(), String> {
        // SAFETY: the caller's contract.
        unsafe { self.queued(buf, |p, b| p.all_reduce_sum(&crate::Emu, b)) };
        Ok(())
    }

    /// Run at the join or wait (see the module docs).
    unsafe fn reduce_sum_queued(
        &mut self,
        _: &EmuTyped,
        buf: TypedViewMut<'_>,
        root: usize,
    ) -> Result<(), String> {
        // SAFETY: the caller's contract.
        unsafe { self.queued(buf, move |p, b| p.reduce_sum(&crate::Emu, b, root)) };
        Ok(())
    }

    /// Run at the join or wait (see the module docs); a 16-bit buffer as `broadcast` sends it.
    unsafe fn broadcast_queued(
        &mut self,
        _: &EmuTyped,
        buf: TypedViewMut<'_>,
        root: usize,
    ) -> Result<(), String> {
        graph::host_op();
        let (p, n, elem) = (buf.ptr, buf.len, buf.elem);
        let peers = self.0.clone();
        queue_sum(move || {
            let mut peers = peers.lock().unwrap_or_else(|p| p.into_inner());
            // SAFETY: the caller's contract keeps the `n` elements at `p` allocated and
            // untouched until the join or wait that runs this.
            let mut wide = unsafe { read(p, n, elem) };
            peers.broadcast(&crate::Emu, &mut wide, root)?;
            // SAFETY: as above.
            unsafe { write_at(p, &wide, elem) };
            Ok(())
        });
        Ok(())
    }
}
