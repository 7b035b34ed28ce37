//! [`Backend`] over any [`Device`]: the launch side of the CUDA kernels in `runtime/kernels/`.
//!
//! Every method here decides a kernel's launch shape and passes its arguments in the order the
//! `.cu` source declares them; the [`Device`] only moves memory and runs launches. The same code
//! therefore drives the GPU (cudarc) and the CPU emulation the tests use (`runtime/emu`), and a
//! wrong grid or a swapped argument fails the emulation tests against the CPU backend.
//!
//! One file per kernel family, as in `runtime/kernels/`: [`elementwise`], [`embedding`],
//! [`layernorm`], [`attention`], [`loss`].

mod attention;
mod elementwise;
mod embedding;
mod layernorm;
mod loss;
mod optim;

pub use optim::{
    adagrad_step, adamw_rows, adamw_step, adamw_step_zeroing, grad_norm_sq, grad_norm_sq_blocks,
    grad_norm_sq_in, lamb_step, norm_partials, norm_scratch_len, norm_total, rows_mark,
    rows_unmark, sgd_step, AdamScalars, DecayMask, LambTensors, RowMarks, SegmentNorms,
    NORM_BLOCKS,
};

use std::ops::Range;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use super::device::{Arg, Device, Launch};
use super::{Aside, AttnShape, Backend, Batch, Dropout, Gemm, Loss, QkvRows, Stride, BIAS_ROWS};
use crate::precision::Dtype;

/// Threads per block of the 1-D kernels (`BLOCK` in common.cuh).
pub const BLOCK: u32 = 256;

/// The kernel sources, in the order they are concatenated into one program.
pub const SOURCES: &[(&str, &str)] = &[
    (
        "elementwise.cu",
        include_str!("../../../kernels/elementwise.cu"),
    ),
    (
        "embedding.cu",
        include_str!("../../../kernels/embedding.cu"),
    ),
    (
        "layernorm.cu",
        include_str!("../../../kernels/layernorm.cu"),
    ),
    (
        "attention.cu",
        include_str!("../../../kernels/attention.cu"),
    ),
    ("loss.cu", include_str!("../../../kernels/loss.cu")),
    ("optim.cu", include_str!("../../../kernels/optim.cu")),
];

/// The shared header every source includes.
pub const COMMON: &str = include_str!("../../../kernels/common.cuh");

/// All kernels as one NVRTC program: the header once, then every source with its
/// `#include "common.cuh"` line dropped (NVRTC is given no include path: nothing to install).
pub fn program() -> String {
    let mut out = String::with_capacity(64 * 1024);
    out.push_str(COMMON);
    for (name, text) in SOURCES {
        out.push_str(&format!("\n// ---- {name}\n"));
        for line in text.lines() {
            if line.trim() != "#include \"common.cuh\"" {
                out.push_str(line);
                out.push('\n');
            }
        }
    }
    out
}

/// The names of the kernels (`extern "C" __global__ void NAME(`) of one source text.
pub fn kernel_names(text: &str) -> Vec<&str> {
    const MARK: &str = "extern \"C\" __global__ void ";
    text.match_indices(MARK)
        .filter_map(|(i, _)| {
            let rest = &text[i + MARK.len()..];
            rest.find('(').map(|end| rest[..end].trim())
        })
        .collect()
}

/// Every kernel of every source.
pub fn all_kernel_names() -> Vec<&'static str> {
    SOURCES.iter().flat_map(|(_, t)| kernel_names(t)).collect()
}

/// The [`Backend`] of a [`Device`]: see the module docs.
#[derive(Debug, Clone)]
pub struct Kernels<D: Device> {
    dev: D,
    store: Dtype,
    /// Whether attention may run as fused kernels where it fits, the forward as one and the
    /// backward as two (attention.rs, `fused`; on by default, [`Kernels::with_fused_attention`]).
    fused_attention: bool,
    /// The most keys the short fused attention kernels take (attention.rs, `by_keys`): one
    /// chunk, or 0 where tests run the long ones at every length
    /// ([`Kernels::with_long_attention_only`]).
    short_keys: usize,
    /// Whether a step by segments may update the word embeddings' rows the next micro-batch
    /// reads first and the rest beside its forward (`model::on_device`; off by default,
    /// [`Kernels::with_rows_first`]).
    rows_first: bool,
    /// Device allocations made through these kernels ([`Kernels::allocations`]).
    allocations: Arc<AtomicU64>,
    /// A scratch buffer a kernel's launch code reuses (cross-entropy's per-row losses).
    scratch: Arc<Mutex<Option<D::Buf>>>,
    /// The per-chunk sums of [`Backend::bias_grad`] and of LayerNorm's `dw`/`db`, grown to the
    /// largest seen: one for the kernels queued in order with the rest, one for those queued
    /// [`Backend::aside`] (`aside_open`), which a device may run at the same time on another
    /// stream; the kernels of one run in stream order, one after another.
    bias_part: Arc<Lanes<D::Buf>>,
    /// Attention's softmax gradient `ds` on a device keeping 16-bit buffers (`attention.rs`),
    /// grown to the largest batch seen (sized before the first step by `reserve_batch`).
    ds: Arc<Mutex<Option<D::Buf>>>,
    /// The embedding backward's tokens in order of their rows (`embedding_order`), and its
    /// length in `u32`s, grown to the largest batch seen.
    order: Arc<Mutex<Option<Grown<D::Ids>>>>,
    /// The column sums' counters (common.cuh, `last_of_column`): one `u32` per block of
    /// columns, zero between launches (each launch's last block sets its counter back), grown
    /// to the widest sum seen; two, as `bias_part`.
    done: Arc<Lanes<Grown<D::Ids>>>,
    /// Whether an [`Backend::aside`] call is open: its column sums take the second scratch.
    aside_open: Arc<AtomicBool>,
    /// The dropout key in device memory (`drop_key` in common.cuh): the last micro-batch's
    /// `(seed, first stream)` as four 32-bit words, and a copy of them on the host.
    key: Arc<Mutex<Option<Key<D::Ids>>>>,
}

/// A scratch buffer and how many elements it holds.
type Grown<T> = (T, usize);

/// A scratch for the work queued in order, and one for the work queued aside ([`Kernels::lane`]).
type Lanes<T> = [Mutex<Option<T>>; 2];

/// The dropout key's device buffer and its words.
type Key<T> = (T, [u32; 4]);

impl<D: Device> Kernels<D> {
    /// Kernels on `dev`, storing fp32.
    pub fn new(dev: D) -> Kernels<D> {
        Kernels {
            dev,
            store: Dtype::F32,
            fused_attention: true,
            short_keys: attention::FUSED_KEYS,
            rows_first: false,
            allocations: Arc::default(),
            scratch: Arc::default(),
            bias_part: Arc::default(),
            ds: Arc::default(),
            order: Arc::default(),
            done: Arc::default(),
            aside_open: Arc::default(),
            key: Arc::default(),
        }
    }

    /// Which column sums' scratch a sum queued now takes: 1 inside an [`Backend::aside`] call.
    fn lane(&self) -> usize {
        usize::from(self.aside_open.load(Ordering::Relaxed))
    }

    /// [`Device::update_aside`]: runs `f`, the update of parameter segment `seg`, where it
    /// may run beside what is queued after it until [`Backend::wait_update`]`(seg)`.
    pub fn update_aside(&self, seg: usize, f: impl FnOnce()) {
        let outer = self.aside_open.swap(true, Ordering::Relaxed);
        self.dev.update_aside(seg, f);
        self.aside_open.store(outer, Ordering::Relaxed);
    }

    /// [`Device::updates_aside`]: `f` queues [`Kernels::update_aside`] calls and nothing else.
    pub fn updates_aside(&self, f: impl FnOnce()) {
        self.dev.updates_aside(f);
    }

    /// The same kernels storing `store` (values rounded as a half-precision device stores them).
    /// The 16-bit `ds` scratch holds the old store's type: another store gets its own (`recipe
    /// kernels --selftest` runs fp16 then bf16 on one device; found by tests/fake_cuda.rs, where
    /// the bf16 attention backward was handed the fp16 scratch).
    pub fn with_store(self, store: Dtype) -> Kernels<D> {
        let ds = if store == self.store {
            self.ds
        } else {
            Arc::default()
        };
        Kernels { store, ds, ..self }
    }

    /// The same kernels, attention fused where it fits (the forward into one kernel, the
    /// backward into two) or never (`recipe run` reads `RECIPE_FUSED_ATTENTION=0` for never:
    /// docs/cuda.md).
    pub fn with_fused_attention(self, on: bool) -> Kernels<D> {
        Kernels {
            fused_attention: on,
            ..self
        }
    }

    /// The same kernels, a step by segments putting off the word embeddings' update to the
    /// next micro-batch, where the rows its tokens name are updated before its forward and the
    /// rest beside it, or not (`recipe run` reads `RECIPE_ROWS_FIRST=1`: docs/cuda.md, "The
    /// step beside the forward"). The same bits either way.
    pub fn with_rows_first(self, on: bool) -> Kernels<D> {
        Kernels {
            rows_first: on,
            ..self
        }
    }

    /// Whether [`Kernels::with_rows_first`] said so.
    pub fn rows_first(&self) -> bool {
        self.rows_first
    }

    /// The same kernels, fused attention taking its long kernels (the keys a chunk at a time)
    /// at every length: for tests, which check that where the short ones fit too both give the
    /// same bits (runtime/emu/tests/attention.rs).
    pub fn with_long_attention_only(self) -> Kernels<D> {
        Kernels {
            short_keys: 0,
            ..self
        }
    }

    /// The storage dtype (the module's: fp16/bf16 values are stored rounded to it).
    pub fn store(&self) -> Dtype {
        self.store
    }

    /// The device.
    pub fn device(&self) -> &D {
        &self.dev
    }

    /// How many device buffers these kernels (and their clones) have allocated: new buffers,
    /// and resizes past what a buffer held. A run's step loop should add none once the longest
    /// batch has been seen (docs/cuda.md; runtime/emu/tests/model.rs).
    pub fn allocations(&self) -> u64 {
        self.allocations.load(Ordering::Relaxed)
    }

    /// Runs `f` with the address of the token-order scratch ([`Kernels::order`]), grown to at
    /// least `n` `u32`s (kept for the next call).
    fn with_order(&self, n: usize, f: impl FnOnce(u64)) {
        let mut order = self.order.lock().unwrap_or_else(|p| p.into_inner());
        let ids = match order.as_mut() {
            Some((ids, len)) if *len >= n => ids,
            _ => {
                self.count(true);
                &mut order.insert((self.dev.upload_ids(&vec![0; n.max(1)]), n)).0
            }
        };
        f(self.dev.ids_ptr(ids));
    }

    /// Runs `f` with the address of the column sums' counters ([`Kernels::done`]) for a sum
    /// `cols` wide: zeros, grown (new, so zero) when wider than any before.
    fn with_counters(&self, cols: usize, f: impl FnOnce(u64)) {
        let n = cols.div_ceil(BLOCK as usize).max(1);
        let mut done = self.done[self.lane()]
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        let ids = match done.as_mut() {
            Some((ids, len)) if *len >= n => ids,
            _ => {
                self.count(true);
                &mut done.insert((self.dev.upload_ids(&vec![0; n]), n)).0
            }
        };
        f(self.dev.ids_ptr(ids));
    }

    /// Runs `f` on the chunk sums' scratch ([`Kernels::bias_part`]; an [`Backend::aside`]
    /// call's own), grown to at least `n` floats (kept for the next call: sized by the first
    /// step's shapes).
    fn with_chunk_sums(&self, n: usize, f: impl FnOnce(D::View<'_>)) {
        let mut part = self.bias_part[self.lane()]
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        let buf = match part.as_mut() {
            Some(b) if self.dev.len(self.dev.view(b)) >= n => b,
            _ => part.insert(Backend::alloc(self, n.max(1))),
        };
        f(self.dev.view(buf));
    }

    /// Runs `f` on the 16-bit `ds` scratch ([`Kernels::ds`]), grown to at least `n` elements,
    /// when the device keeps the store's values in 16 bits; else on `None` (`ds` then stays in
    /// the f32 scratch the caller gives).
    pub(super) fn with_half_ds<R>(&self, n: usize, f: impl FnOnce(Option<&D::Buf>) -> R) -> R {
        if !self.stored_elem().is_half() {
            return f(None);
        }
        let mut ds = self.ds.lock().unwrap_or_else(|p| p.into_inner());
        let buf = match ds.as_mut() {
            Some(b) if self.dev.len(self.dev.view(b)) >= n => b,
            _ => ds.insert(Backend::alloc_stored(self, n.max(1))),
        };
        f(Some(buf))
    }

    fn count(&self, allocated: bool) {
        if allocated {
            self.allocations.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// The storage dtype as the kernels' `store` argument.
    fn store_arg(&self) -> Arg {
        dtype_arg(self.store)
    }

    /// A view as a kernel's typed buffer argument (`void*`, then its element type).
    pub(crate) fn typed(&self, v: D::View<'_>) -> Arg {
        Arg::Typed(self.dev.ptr(v), self.dev.elem(v))
    }

    /// The element type of [`Backend::alloc_stored`]'s buffers: the storage dtype when the device
    /// keeps it in 16 bits, else f32.
    pub fn stored_elem(&self) -> Dtype {
        if self.store.is_half() {
            self.dev.half_elem(self.store)
        } else {
            Dtype::F32
        }
    }

    /// A writable view as a kernel's typed buffer argument.
    pub(crate) fn typed_mut(&self, v: &mut D::ViewMut<'_>) -> Arg {
        let elem = self.dev.elem(self.dev.as_view(v));
        Arg::Typed(self.dev.ptr_mut(v), elem)
    }

    /// Rounds `v` to `dtype` in place (`round_rows` over one row), as
    /// [`Dtype::round_slice`] does on the host: for a value held in another dtype than the
    /// stored one (ZeRO's communication dtype, `zero::Storage::reduced`).
    pub fn round_to(&self, mut v: D::ViewMut<'_>, dtype: Dtype) {
        let n = self.dev.len_mut(&v);
        if dtype == Dtype::F32 || n == 0 {
            return;
        }
        let p = self.dev.ptr_mut(&mut v);
        self.dev.launch(
            "round_rows",
            grid_vec(n),
            &[Arg::Ptr(p), int(1), int(n), int(n), dtype_arg(dtype)],
        );
    }

    /// Copies the per-row losses of the last [`Backend::cross_entropy_queued`] (`dst`'s length
    /// of them) into `dst`, on the device: a window keeps its micro-batches' losses there and
    /// reads them once ([`Kernels::mean_loss`] on each).
    pub fn keep_loss(&self, dst: D::ViewMut<'_>) {
        loss::keep(self, dst)
    }

    /// One micro-batch's mean loss from its per-row losses, as [`Backend::cross_entropy`]
    /// reduces them.
    pub fn mean_loss(&self, rows: &[f32]) -> f32 {
        loss::mean_of(self, rows)
    }

    /// `v[i] = v[i] · factor` rounded to `comm`, then to `store` (`scale_round`): a sum over
    /// the ranks turned into [`crate::collective::ReduceOp::Avg`]'s average (`factor` = the f32
    /// `1 / N`) and rounded as `zero::Storage::reduced` rounds it.
    pub fn scale_round(&self, mut v: D::ViewMut<'_>, factor: f32, comm: Dtype, store: Dtype) {
        let n = self.dev.len_mut(&v);
        if n == 0 {
            return;
        }
        let p = self.dev.ptr_mut(&mut v);
        self.dev.launch(
            "scale_round",
            grid1(n),
            &[
                Arg::Ptr(p),
                int(n),
                Arg::F32(factor),
                dtype_arg(comm),
                dtype_arg(store),
            ],
        );
    }
}

/// A dtype as the kernels' `store` argument.
pub(crate) fn dtype_arg(d: Dtype) -> Arg {
    Arg::I32(crate::backend::device::dtype_code(d))
}

/// `n` as a kernel's `int`: the runtime never builds a tensor of 2³¹ elements or more on a
/// device (a bug if it does, so a panic).
pub(crate) fn int(n: usize) -> Arg {
    Arg::I32(i32::try_from(n).expect("a kernel dimension does not fit an int"))
}

/// A (columns × chunks) grid of [`BLOCK`]-thread blocks: the first pass of a sum over rows in
/// [`crate::backend::Backend::bias_grad`]'s order.
pub(crate) fn chunk_grid(cols: usize, chunks: usize) -> Launch {
    Launch {
        grid: (
            cols.div_ceil(BLOCK as usize) as u32,
            u32::try_from(chunks).expect("row chunks"),
            1,
        ),
        block: (BLOCK, 1, 1),
        smem: 0,
    }
}

/// One thread per element, [`BLOCK`] per block.
pub(crate) fn grid1(n: usize) -> Launch {
    Launch {
        grid: (n.div_ceil(BLOCK as usize).max(1) as u32, 1, 1),
        block: (BLOCK, 1, 1),
        smem: 0,
    }
}

/// Elements a thread of the vectorised elementwise kernels takes (`VEC` in common.cuh).
pub const VEC: usize = 8;

/// One thread per [`VEC`] elements (the last thread's may be fewer), [`BLOCK`] per block.
pub(crate) fn grid_vec(n: usize) -> Launch {
    grid1(n.div_ceil(VEC))
}

/// The launch of `gemm_pointers` (elementwise.cu): `batch`'s item addresses into `list` (`A`'s,
/// `B`'s, then `C`'s), the operands at `a`, `b` and `c`, whose elements are `sizes` bytes each (2
/// for fp16/bf16, 4 for f32). A GPU's [`Device::gemm_batched`] runs it before
/// `cublasGemmBatchedEx`.
pub fn gemm_pointers(
    list: u64,
    (a, b, c): (u64, u64, u64),
    batch: &crate::backend::Batch,
    sizes: (u64, u64, u64),
) -> (Launch, Vec<Arg>) {
    let bytes = |x: usize, size: u64| Arg::U64(x as u64 * size);
    let args = vec![
        Arg::Ptr(list),
        // The operands' addresses as numbers: the kernel adds byte offsets to them.
        Arg::U64(a),
        Arg::U64(b),
        Arg::U64(c),
        int(batch.count),
        int(batch.inner),
        bytes(batch.a.outer, sizes.0),
        bytes(batch.a.inner, sizes.0),
        bytes(batch.b.outer, sizes.1),
        bytes(batch.b.inner, sizes.1),
        bytes(batch.c.outer, sizes.2),
        bytes(batch.c.inner, sizes.2),
    ];
    (grid1(batch.count), args)
}

/// `⌈p · 2³²⌉` and `1 / (1 − p)` of a dropout (the CPU backend's `MaskKey`).
impl<D: Device> Kernels<D> {
    /// A dropout kernel's `key, site, threshold, scale` (no dropout: a null key). The key's
    /// words are written to the device only when they change, once per micro-batch; inside a
    /// pass every launch's arguments are then the same for every micro-batch of its shape.
    pub(crate) fn dropout_args(&self, d: Option<&Dropout>) -> (Arg, Arg, Arg, Arg) {
        let Some(d) = d else {
            return (Arg::Ptr(0), Arg::U64(0), Arg::U32(0), Arg::F32(1.0));
        };
        (
            Arg::Ptr(self.dropout_key(d.seed, d.stream.wrapping_sub(d.site))),
            Arg::U64(d.site),
            Arg::U32((f64::from(d.p) * 4_294_967_296.0).ceil() as u32),
            Arg::F32(1.0 / (1.0 - d.p)),
        )
    }

    /// Makes `(seed, stream)` the device's dropout key (written only when it differs from the
    /// last), and returns its address. A pass's first dropout site writes it, unless it was
    /// set before the pass (as a captured pass's replay needs: nothing inside a graph may copy
    /// from the host).
    pub fn dropout_key(&self, seed: u64, stream: u64) -> u64 {
        let words = [
            seed as u32,
            (seed >> 32) as u32,
            stream as u32,
            (stream >> 32) as u32,
        ];
        let mut key = self.key.lock().unwrap_or_else(|p| p.into_inner());
        match key.as_mut() {
            Some((ids, w)) => {
                if *w != words {
                    self.dev.write_ids(ids, &words);
                    *w = words;
                }
            }
            None => {
                self.count(true);
                *key = Some((self.dev.upload_ids(&words), words));
            }
        }
        self.dev.ids_ptr(&key.as_ref().expect("set above").0)
    }
}

impl<D: Device> Backend for Kernels<D> {
    type Buf = D::Buf;
    type View<'a>
        = D::View<'a>
    where
        D: 'a;
    type ViewMut<'a>
        = D::ViewMut<'a>
    where
        D: 'a;
    type Ids = D::Ids;

    fn alloc(&self, n: usize) -> D::Buf {
        self.count(true);
        self.dev.alloc(n)
    }

    fn alloc_stored(&self, n: usize) -> D::Buf {
        self.count(true);
        if self.store.is_half() {
            self.dev.alloc_half(n, self.store)
        } else {
            self.dev.alloc(n)
        }
    }

    fn upload(&self, src: &[f32]) -> D::Buf {
        self.count(true);
        self.dev.upload(src)
    }

    fn upload_ids(&self, src: &[u32]) -> D::Ids {
        self.count(true);
        self.dev.upload_ids(src)
    }

    fn resize(&self, b: &mut D::Buf, n: usize) -> bool {
        let grew = self.dev.resize(b, n);
        self.count(grew);
        grew
    }

    fn range_mut<'a>(&self, b: &'a mut D::Buf, r: Range<usize>) -> D::ViewMut<'a> {
        self.dev.range_mut(b, r)
    }

    fn write(&self, dst: D::ViewMut<'_>, src: &[f32]) {
        self.dev.write(dst, src)
    }

    fn write_ids(&self, dst: &mut D::Ids, src: &[u32]) -> bool {
        let grew = self.dev.write_ids(dst, src);
        self.count(grew);
        grew
    }

    fn download(&self, src: D::View<'_>, dst: &mut [f32]) {
        self.dev.download(src, dst)
    }

    fn view<'a>(&self, b: &'a D::Buf) -> D::View<'a> {
        self.dev.view(b)
    }

    fn view_mut<'a>(&self, b: &'a mut D::Buf) -> D::ViewMut<'a> {
        self.dev.view_mut(b)
    }

    fn sub<'a>(&self, v: D::View<'a>, r: Range<usize>) -> D::View<'a>
    where
        Self: 'a,
    {
        self.dev.sub(v, r)
    }

    fn sub_mut<'a, 'b>(&self, v: &'b mut D::ViewMut<'a>, r: Range<usize>) -> D::ViewMut<'b>
    where
        'a: 'b,
    {
        self.dev.sub_mut(v, r)
    }

    fn split_at_mut<'a, 'b>(
        &self,
        v: &'b mut D::ViewMut<'a>,
        mid: usize,
    ) -> (D::ViewMut<'b>, D::ViewMut<'b>)
    where
        'a: 'b,
    {
        self.dev.split_at_mut(v, mid)
    }

    fn zero(&self, dst: D::ViewMut<'_>) {
        self.dev.zero(dst)
    }

    fn copy(&self, dst: D::ViewMut<'_>, src: D::View<'_>) {
        self.dev.copy(dst, src)
    }

    fn copy_rows(
        &self,
        dst: D::ViewMut<'_>,
        src: D::View<'_>,
        rows: usize,
        cols: usize,
        ld_dst: usize,
        ld_src: usize,
    ) {
        elementwise::copy_rows(self, dst, src, rows, cols, ld_dst, ld_src)
    }

    fn add_assign(&self, acc: D::ViewMut<'_>, x: D::View<'_>) {
        elementwise::add_assign(self, acc, x)
    }

    fn gemm(&self, g: &Gemm, a: D::View<'_>, b: D::View<'_>, c: D::ViewMut<'_>) {
        elementwise::gemm(self, g, a, b, c, true)
    }

    fn gemm_to_epilogue(&self, g: &Gemm, a: D::View<'_>, b: D::View<'_>, c: D::ViewMut<'_>) {
        elementwise::gemm(self, g, a, b, c, false)
    }

    fn gemm_items_to_epilogue(
        &self,
        g: &Gemm,
        count: usize,
        strides: [usize; 3],
        a: D::View<'_>,
        b: D::View<'_>,
        c: D::ViewMut<'_>,
    ) {
        // One batched call, one stride an operand (`Device::gemm_batched`; on a GPU a strided
        // batch); its outputs left unrounded as `gemm_to_epilogue`'s.
        let [sa, sb, sc] = strides.map(|outer| Stride { outer, inner: 0 });
        let batch = Batch {
            count,
            inner: 1,
            a: sa,
            b: sb,
            c: sc,
        };
        let operands = if self.store.is_half() {
            self.store
        } else {
            Dtype::F32
        };
        self.dev.gemm_batched(g, &batch, a, b, c, operands);
    }

    fn aside(&self, f: impl FnOnce()) -> Aside {
        // Column sums queued inside take the second scratch: on a GPU they may run while the
        // compute stream's sums use the first.
        let outer = self.aside_open.swap(true, Ordering::Relaxed);
        let t = self.dev.aside(f);
        self.aside_open.store(outer, Ordering::Relaxed);
        t
    }

    fn wait_aside(&self, t: Aside) {
        self.dev.wait_aside(t)
    }

    fn join_aside(&self) {
        self.dev.join_aside()
    }

    fn wait_update(&self, seg: usize) {
        self.dev.wait_update(seg)
    }

    fn round_stored(&self, v: D::ViewMut<'_>) {
        // A 16-bit buffer holds rounded values only.
        if !self.dev.elem(self.dev.as_view(&v)).is_half() {
            self.round_to(v, self.store);
        }
    }

    fn reserve_gemm(&self, elems: usize) {
        if self.store.is_half() {
            self.dev.reserve_gemm_half(elems);
        }
    }

    fn reserve_batch(&self, s: AttnShape, backward: bool) {
        let (tok, pp) = attention::sizes(s);
        if self.store.is_half() {
            self.dev.reserve_gemm_half(tok.max(pp));
        }
        // Every product is in one dtype with its operands (attention.rs): none widens.
        self.dev.reserve_gemm_batched(s.batch * s.heads, 0);
        if backward {
            self.with_half_ds(pp, |_| {});
            self.with_order(4 * s.batch * s.seq, |_| {});
        }
    }

    fn reserve_sums(&self, tokens: usize, width: usize, rows: usize, dropout: bool) {
        // Both scratches: the compute stream's and an aside call's.
        for open in [false, true] {
            let outer = self.aside_open.swap(open, Ordering::Relaxed);
            self.with_chunk_sums(tokens.div_ceil(BIAS_ROWS).max(1) * width, |_| {});
            // Counters for two items of up to `width` columns (bias_grad_items: a counter per
            // block of columns of each), which covers one item of `width`.
            self.with_counters(2 * width.div_ceil(BLOCK as usize) * BLOCK as usize, |_| {});
            self.aside_open.store(outer, Ordering::Relaxed);
        }
        // The per-row losses, as `cross_entropy_queued` sizes them (loss.rs).
        let mut losses = self.scratch.lock().unwrap_or_else(|p| p.into_inner());
        match losses.as_mut() {
            // Grown only, as `loss::queue` does.
            Some(b) => {
                if self.dev.len(self.dev.view(b)) < rows {
                    self.resize(b, rows);
                }
            }
            None => *losses = Some(Backend::alloc(self, rows)),
        }
        drop(losses);
        if dropout {
            // Any key: each pass sets its own before its first dropout site reads it.
            self.dropout_key(0, 0);
        }
    }

    fn add_bias(&self, out: D::ViewMut<'_>, bias: D::View<'_>, rows: usize, cols: usize) {
        elementwise::add_bias(self, out, bias, rows, cols, Dtype::F32, None)
    }

    fn bias_epilogue(&self, out: D::ViewMut<'_>, bias: D::View<'_>, rows: usize, cols: usize) {
        elementwise::add_bias(self, out, bias, rows, cols, self.store, None)
    }

    fn bias_epilogue_items(
        &self,
        out: D::ViewMut<'_>,
        bias: D::View<'_>,
        rows: usize,
        cols: usize,
        count: usize,
        bias_stride: usize,
    ) {
        // One launch for the items (elementwise.cu, `add_bias`).
        let items = Some((count, bias_stride));
        elementwise::add_bias(self, out, bias, rows, cols, self.store, items)
    }

    fn bias_grad(&self, db: D::ViewMut<'_>, dout: D::View<'_>, rows: usize, cols: usize) {
        elementwise::bias_grad(self, db, dout, rows, cols, cols, None)
    }

    fn bias_grad_items(
        &self,
        db: D::ViewMut<'_>,
        dout: D::View<'_>,
        rows: usize,
        cols: usize,
        ld: usize,
        count: usize,
        dout_stride: usize,
        db_stride: usize,
    ) {
        elementwise::bias_grad(
            self,
            db,
            dout,
            rows,
            cols,
            ld,
            Some((count, dout_stride, db_stride)),
        )
    }

    fn embedding_fwd(
        &self,
        out: D::ViewMut<'_>,
        ids: &D::Ids,
        types: &D::Ids,
        word: D::View<'_>,
        pos: D::View<'_>,
        typ: D::View<'_>,
        batch: usize,
        seq: usize,
        hidden: usize,
    ) {
        embedding::fwd(self, out, ids, types, word, pos, typ, batch, seq, hidden)
    }

    fn embedding_bwd(
        &self,
        dword: D::ViewMut<'_>,
        dpos: D::ViewMut<'_>,
        dtyp: D::ViewMut<'_>,
        dout: D::View<'_>,
        ids: &D::Ids,
        types: &D::Ids,
        batch: usize,
        seq: usize,
        hidden: usize,
    ) {
        embedding::bwd(
            self, dword, dpos, dtyp, dout, ids, types, batch, seq, hidden,
        )
    }

    fn layernorm_fwd(
        &self,
        out: D::ViewMut<'_>,
        mean: D::ViewMut<'_>,
        rstd: D::ViewMut<'_>,
        inp: D::View<'_>,
        w: D::View<'_>,
        b: D::View<'_>,
        rows: usize,
        cols: usize,
        eps: f32,
    ) {
        layernorm::fwd(self, out, mean, rstd, inp, w, b, rows, cols, eps)
    }

    fn layernorm_bwd(
        &self,
        dinp: D::ViewMut<'_>,
        dw: D::ViewMut<'_>,
        db: D::ViewMut<'_>,
        dout: D::View<'_>,
        inp: D::View<'_>,
        w: D::View<'_>,
        mean: D::View<'_>,
        rstd: D::View<'_>,
        rows: usize,
        cols: usize,
    ) -> Aside {
        layernorm::bwd(
            self,
            (dinp, None),
            (dw, db, None),
            dout,
            inp,
            w,
            mean,
            rstd,
            rows,
            cols,
        )
    }

    fn layernorm_bwd_split(
        &self,
        split: (&mut D::Buf, &mut D::Buf, Option<&Dropout>),
        dw: D::ViewMut<'_>,
        db: D::ViewMut<'_>,
        dout: D::View<'_>,
        inp: D::View<'_>,
        w: D::View<'_>,
        mean: D::View<'_>,
        rstd: D::View<'_>,
        rows: usize,
        cols: usize,
    ) -> Aside {
        let sums = (dw, db, None);
        layernorm::bwd_split(self, split, sums, dout, inp, w, mean, rstd, rows, cols)
    }

    fn layernorm_bwd_split_bias_grad(
        &self,
        split: (&mut D::Buf, &mut D::Buf, Option<&Dropout>),
        (dw, db, dl): (D::ViewMut<'_>, D::ViewMut<'_>, D::ViewMut<'_>),
        dout: D::View<'_>,
        inp: D::View<'_>,
        w: D::View<'_>,
        mean: D::View<'_>,
        rstd: D::View<'_>,
        rows: usize,
        cols: usize,
    ) -> Aside {
        let sums = (dw, db, Some(dl));
        layernorm::bwd_split(self, split, sums, dout, inp, w, mean, rstd, rows, cols)
    }

    fn gelu_fwd(&self, out: D::ViewMut<'_>, inp: D::View<'_>) {
        elementwise::unary(self, "gelu_fwd", out, inp)
    }

    fn gelu_bwd(&self, dinp: D::ViewMut<'_>, inp: D::View<'_>, dout: D::View<'_>) {
        elementwise::gelu_bwd(self, dinp, inp, None, dout)
    }

    fn gelu_bwd_bias_grad(
        &self,
        dinp: &mut D::Buf,
        inp: D::View<'_>,
        inp_bias: Option<D::View<'_>>,
        dout: D::View<'_>,
        db: D::ViewMut<'_>,
        rows: usize,
        cols: usize,
    ) {
        let d = self.dev.view_mut(dinp);
        elementwise::gelu_bwd_bias_grad(self, d, inp, inp_bias, dout, db, rows, cols)
    }

    fn gelu_bwd_adds_bias(&self) -> bool {
        // bias_gelu never writes `inter` (elementwise.cu).
        true
    }

    fn tanh_fwd(&self, out: D::ViewMut<'_>, inp: D::View<'_>) {
        elementwise::unary(self, "tanh_fwd", out, inp)
    }

    fn tanh_bwd(&self, dinp: D::ViewMut<'_>, y: D::View<'_>, dout: D::View<'_>) {
        elementwise::binary(self, "tanh_bwd", dinp, y, dout, 1)
    }

    fn dropout(&self, x: D::ViewMut<'_>, d: &Dropout) {
        elementwise::dropout(self, x, d, 0)
    }

    fn bias_dropout_add(
        &self,
        out: &mut D::Buf,
        bias: D::View<'_>,
        rows: usize,
        cols: usize,
        dropout: Option<&Dropout>,
        residual: D::View<'_>,
    ) {
        elementwise::bias_dropout_add(self, out, bias, rows, cols, dropout, residual)
    }

    fn bias_dropout_add_layernorm(
        &self,
        res: &mut D::Buf,
        bias: D::View<'_>,
        dropout: Option<&Dropout>,
        residual: D::View<'_>,
        out: (D::ViewMut<'_>, D::ViewMut<'_>, D::ViewMut<'_>),
        w: D::View<'_>,
        b: D::View<'_>,
        rows: usize,
        cols: usize,
        eps: f32,
    ) {
        layernorm::bias_dropout_add_fwd(
            self, res, bias, dropout, residual, out, w, b, rows, cols, eps,
        )
    }

    fn bias_gelu(
        &self,
        inter: &mut D::Buf,
        act: &mut D::Buf,
        bias: D::View<'_>,
        rows: usize,
        cols: usize,
    ) {
        elementwise::bias_gelu(self, inter, act, bias, rows, cols)
    }

    fn attention_fwd(
        &self,
        ctx: D::ViewMut<'_>,
        probs: D::ViewMut<'_>,
        probs_drop: Option<D::ViewMut<'_>>,
        scores: Option<D::ViewMut<'_>>,
        q: D::View<'_>,
        k: D::View<'_>,
        v: D::View<'_>,
        qkv_bias: Option<(D::View<'_>, usize)>,
        mask: &D::Ids,
        s: AttnShape,
        dropout: Option<&Dropout>,
    ) {
        attention::fwd(
            self, ctx, probs, probs_drop, scores, q, k, v, qkv_bias, mask, s, dropout,
        )
    }

    fn attention_adds_bias(&self, s: AttnShape) -> bool {
        // The fused kernels' condition for buffers of `alloc_stored`, which a training pass's
        // q, k, v and probabilities are.
        attention::fused(self, s, &[self.stored_elem()])
    }

    fn attention_redraws_dropout(&self, s: AttnShape) -> bool {
        // The fused kernels draw the mask again (attention.cu, keep_bits and drop_again).
        attention::fused(self, s, &[self.stored_elem()])
    }

    fn attention_needs_scores(&self, s: AttnShape) -> bool {
        // The batched products write the scores before the softmax rounds them; the fused
        // kernel keeps them in registers.
        self.stored_elem().is_half() && !attention::fused(self, s, &[self.stored_elem()])
    }

    fn attention_bwd(
        &self,
        dqkv: D::ViewMut<'_>,
        out: QkvRows,
        scratch: D::ViewMut<'_>,
        dctx: D::View<'_>,
        q: D::View<'_>,
        k: D::View<'_>,
        v: D::View<'_>,
        qkv_bias: Option<(D::View<'_>, usize)>,
        probs: D::View<'_>,
        probs_drop: Option<D::View<'_>>,
        s: AttnShape,
        dropout: Option<&Dropout>,
    ) {
        attention::bwd(
            self, dqkv, out, scratch, dctx, q, k, v, qkv_bias, probs, probs_drop, s, dropout,
        )
    }

    fn cross_entropy(
        &self,
        dlogits: D::ViewMut<'_>,
        logits: D::View<'_>,
        labels: &D::Ids,
        rows: usize,
        classes: usize,
        grad_scale: f32,
    ) -> f32 {
        let queued = loss::queue(self, dlogits, logits, labels, rows, classes, grad_scale);
        loss::mean(self, queued)
    }

    fn cross_entropy_queued(
        &self,
        dlogits: D::ViewMut<'_>,
        logits: D::View<'_>,
        labels: &D::Ids,
        rows: usize,
        classes: usize,
        grad_scale: f32,
    ) -> Loss {
        loss::queue(self, dlogits, logits, labels, rows, classes, grad_scale)
    }

    fn loss(&self, l: Loss) -> f32 {
        loss::mean(self, l)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every kernel's body begins with `GRID_WAIT();` (common.cuh): a programmatic dependent
    /// launch (`RECIPE_PDL=1`) may start a kernel before the one ahead of it in its stream has
    /// finished, and only that wait, before any access to memory, keeps their order (and, each
    /// kernel waiting so, the order along the whole stream).
    #[test]
    fn every_kernel_waits_for_the_one_ahead_before_anything_else() {
        let mut kernels = 0;
        for (file, text) in SOURCES {
            for (i, _) in text.match_indices("extern \"C\" __global__") {
                let rest = &text[i..];
                let Some(end) = rest.find(['{', ';']) else {
                    continue;
                };
                if rest.as_bytes()[end] == b';' {
                    continue; // a declaration (`__launch_bounds__`)
                }
                let head = rest[..end].split_whitespace().collect::<Vec<_>>().join(" ");
                assert!(
                    rest[end + 1..].trim_start().starts_with("GRID_WAIT();"),
                    "{file}: `{head}` does not begin with GRID_WAIT();"
                );
                kernels += 1;
            }
        }
        assert_eq!(kernels, all_kernel_names().len());
    }
}
