//! The numeric kernels behind one trait, so the model code is written once for every executor.
//!
//! [`Backend`] names its buffers through associated types: the CPU backend ([`Cpu`]) uses
//! `Vec<f32>` / `&[f32]` / `&mut [f32]`, and a device backend can use device allocations and views
//! of them (cudarc's `CudaSlice` / `CudaView` / `CudaViewMut` have exactly this shape). The model
//! only ever calls trait methods, never indexes a buffer.
//!
//! Conventions for every kernel: matrices are row-major; "accumulate" means `+=` into the
//! destination (parameter gradients always accumulate, so gradient accumulation over micro-batches
//! is free); every reduction runs in a fixed order, so results are bit-for-bit reproducible and do
//! not depend on the thread count. Shapes are trusted: the model validates its inputs before
//! calling a kernel, and a kernel given inconsistent lengths panics (a bug, not bad input).

pub mod cpu;
pub mod cuda;
pub mod device;
pub mod kernels;
pub mod profile;
pub mod selftest;

pub use cpu::Cpu;

/// The memory half of a backend or device whose buffers are host memory (`Vec<f32>`, slices):
/// the associated types and the methods [`Backend`] and [`device::Device`] share, written once
/// for the CPU backend and the emulated GPU (`runtime/emu`). Expands inside their `impl` blocks.
#[doc(hidden)]
#[macro_export]
macro_rules! host_memory {
    () => {
        type Buf = Vec<f32>;
        type View<'a> = &'a [f32];
        type ViewMut<'a> = &'a mut [f32];
        type Ids = Vec<u32>;

        fn alloc(&self, n: usize) -> Vec<f32> {
            vec![0.0; n]
        }

        fn upload(&self, src: &[f32]) -> Vec<f32> {
            src.to_vec()
        }

        fn upload_ids(&self, src: &[u32]) -> Vec<u32> {
            src.to_vec()
        }

        fn range_mut<'a>(&self, b: &'a mut Vec<f32>, r: ::std::ops::Range<usize>) -> &'a mut [f32] {
            &mut b[r]
        }

        fn write(&self, dst: &mut [f32], src: &[f32]) {
            dst.copy_from_slice(src);
        }

        fn write_ids(&self, dst: &mut Vec<u32>, src: &[u32]) -> bool {
            let grows = src.len() > dst.capacity();
            dst.clear();
            dst.extend_from_slice(src);
            grows
        }

        fn resize(&self, b: &mut Vec<f32>, n: usize) -> bool {
            let grows = n > b.capacity();
            // New elements are NaN, not zero: a GPU's regrown buffer holds stale values, so a
            // pass that read one before writing it would differ there; here it shows as NaN.
            b.resize(n, f32::NAN);
            grows
        }

        fn download(&self, src: &[f32], dst: &mut [f32]) {
            dst.copy_from_slice(src);
        }

        fn view<'a>(&self, b: &'a Vec<f32>) -> &'a [f32] {
            b
        }

        fn view_mut<'a>(&self, b: &'a mut Vec<f32>) -> &'a mut [f32] {
            b
        }

        fn sub<'a>(&self, v: &'a [f32], r: ::std::ops::Range<usize>) -> &'a [f32]
        where
            Self: 'a,
        {
            &v[r]
        }

        fn sub_mut<'a, 'b>(
            &self,
            v: &'b mut &'a mut [f32],
            r: ::std::ops::Range<usize>,
        ) -> &'b mut [f32]
        where
            'a: 'b,
        {
            &mut v[r]
        }

        fn split_at_mut<'a, 'b>(
            &self,
            v: &'b mut &'a mut [f32],
            mid: usize,
        ) -> (&'b mut [f32], &'b mut [f32])
        where
            'a: 'b,
        {
            v.split_at_mut(mid)
        }

        fn zero(&self, dst: &mut [f32]) {
            dst.fill(0.0);
        }

        fn copy(&self, dst: &mut [f32], src: &[f32]) {
            dst.copy_from_slice(src);
        }
    };
}

use std::ops::Range;

/// One GEMM: `C[m×n] = alpha · op(A)[m×k] · op(B)[k×n] + beta · C`.
///
/// `op(A)` is `A` stored row-major with leading dimension `lda` (`trans_a == false`, `A` is m×k) or
/// the transpose of a row-major k×m `A` (`trans_a == true`); likewise for `B`. Leading dimensions
/// larger than the logical width select rows from a wider buffer (e.g. the `[CLS]` rows).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Gemm {
    /// Rows of `C`.
    pub m: usize,
    /// Columns of `C`.
    pub n: usize,
    /// The contracted dimension.
    pub k: usize,
    /// Whether `A` is stored transposed (k×m).
    pub trans_a: bool,
    /// Whether `B` is stored transposed (n×k).
    pub trans_b: bool,
    /// Row stride of the stored `A`.
    pub lda: usize,
    /// Row stride of the stored `B`.
    pub ldb: usize,
    /// Row stride of `C`.
    pub ldc: usize,
    /// Scale of the product.
    pub alpha: f32,
    /// Scale of the old `C` (0: `C` is not read, so it may hold garbage).
    pub beta: f32,
}

impl Gemm {
    /// Dense (contiguous) operands: leading dimensions follow from the shapes and transposes.
    pub fn dense(m: usize, n: usize, k: usize, trans_a: bool, trans_b: bool, beta: f32) -> Gemm {
        Gemm {
            m,
            n,
            k,
            trans_a,
            trans_b,
            lda: if trans_a { m } else { k },
            ldb: if trans_b { k } else { n },
            ldc: n,
            alpha: 1.0,
            beta,
        }
    }

    /// How many elements of each stored operand the GEMM reads (`A`, `B`) or writes (`C`), from
    /// the first. A stored `r × c` operand with row stride `ld` spans `(r − 1)·ld + c` elements
    /// (0 when it is empty).
    pub fn spans(&self) -> (usize, usize, usize) {
        let span = |rows: usize, cols: usize, ld: usize| {
            if rows == 0 || cols == 0 {
                0
            } else {
                (rows - 1) * ld + cols
            }
        };
        let (ar, ac) = if self.trans_a {
            (self.k, self.m)
        } else {
            (self.m, self.k)
        };
        let (br, bc) = if self.trans_b {
            (self.n, self.k)
        } else {
            (self.k, self.n)
        };
        (
            span(ar, ac, self.lda),
            span(br, bc, self.ldb),
            span(self.m, self.n, self.ldc),
        )
    }
}

/// Which dropout mask to apply: element `i` of the buffer is kept iff the Philox draw
/// `(seed, stream, offset + i)` is at least `p`; kept elements are scaled by `1 / (1 - p)`.
///
/// The mask is a pure function of its key, so backward re-derives it instead of storing it, and a
/// device backend draws the same mask.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Dropout {
    /// Drop probability, in `[0, 1)`.
    pub p: f32,
    /// Philox key.
    pub seed: u64,
    /// Philox stream (one per dropout site and micro-batch).
    pub stream: u64,
    /// The site's offset from the micro-batch's first stream (`stream − site`): a device keeps
    /// `(seed, stream − site)` in its memory, once per micro-batch, and passes the kernels only
    /// the site, so that the launches of a pass are the same for every micro-batch of a shape
    /// (what a CUDA graph replays; docs/cuda.md "CUDA graphs").
    pub site: u64,
}

/// Where each GEMM of a [`Batch`] finds one operand: item `(o, i)` starts `o · outer + i · inner`
/// elements into the operand's view.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stride {
    /// Elements between items of consecutive outer indices.
    pub outer: usize,
    /// Elements between items of consecutive inner indices.
    pub inner: usize,
}

/// A batch of GEMMs of one [`Gemm`] shape over a two-level index: item `j` of `count` is
/// `(o, i) = (j / inner, j % inner)`, each operand's at its [`Stride`]. Attention's items are
/// (sequence, head): a head's `q` starts `b·seq·hidden + h·head_dim` into `[batch, seq, hidden]`,
/// its scores `(b·heads + h)·seq²` into `[batch, heads, seq, seq]`; no one stride reaches both,
/// so a GPU passes every item's address (`cublasGemmBatchedEx`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Batch {
    /// GEMMs in the batch.
    pub count: usize,
    /// Items per outer index (at least 1).
    pub inner: usize,
    /// `A`'s items.
    pub a: Stride,
    /// `B`'s items.
    pub b: Stride,
    /// `C`'s items.
    pub c: Stride,
}

impl Batch {
    /// Item `j`'s offset in an operand of stride `s`.
    pub fn offset(&self, s: Stride, j: usize) -> usize {
        (j / self.inner) * s.outer + (j % self.inner) * s.inner
    }

    /// Elements of an operand of stride `s` that the batch reads or writes, from the view's
    /// start, when one item spans `span` elements (0 for an empty batch or item).
    pub fn extent(&self, s: Stride, span: usize) -> usize {
        if self.count == 0 || span == 0 {
            return 0;
        }
        let last = self.count - 1;
        // The largest offset: the last item's, or (strides being non-negative) the last inner
        // item of the outer index before it.
        let full_row = match last / self.inner {
            0 => 0,
            o => (o - 1) * s.outer + (self.inner - 1) * s.inner,
        };
        self.offset(s, last).max(full_row) + span
    }

    /// Whether the batch of GEMMs `g` overwrites every element of its output's extent: none is
    /// added to (`beta` 0) and none is skipped (`m·n` per item over all the items fill the
    /// extent; items' outputs never overlap, which would race). Attention's `dq` and `dk` batches
    /// do, their heads side by side in each row. A GPU then need not start a scratch copy of the
    /// output from the output's values ([`device::Device::gemm_batched`] into a 16-bit buffer).
    pub fn overwrites_all(&self, g: &Gemm) -> bool {
        let (_, _, span_c) = g.spans();
        g.beta == 0.0 && self.count * g.m * g.n == self.extent(self.c, span_c)
    }
}

/// Shape of a multi-head attention call: `batch × seq` tokens, `heads × head_dim` = hidden.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AttnShape {
    /// Sequences.
    pub batch: usize,
    /// Tokens per sequence.
    pub seq: usize,
    /// Attention heads.
    pub heads: usize,
    /// Width of one head.
    pub head_dim: usize,
}

/// Where [`Backend::attention_bwd`] writes `dq`, `dk` and `dv`: one buffer of rows `ld` apart, a
/// token's row holding its three gradients (each `heads · head_dim` wide) at columns `cols`.
/// BERT's backward leaves a zero column after `dq` and after `dk`, where the weight matrix of
/// the three projections has q's and k's bias rows, so that one GEMM over the row takes
/// `d(x)` from all three (`model/layout.rs`, `LayerLayout::qkv_matrix` and `qkv_grad_rows`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QkvRows {
    /// Elements from one token's row to the next.
    pub ld: usize,
    /// Columns of `dq`, `dk` and `dv` in a row, ascending.
    pub cols: [usize; 3],
}

impl QkvRows {
    /// Elements of the buffer `rows` tokens of width `hid` span; panics unless the three fit
    /// in a row without overlapping.
    pub fn span(&self, rows: usize, hid: usize) -> usize {
        let [q, k, v] = self.cols;
        assert!(
            q + hid <= k && k + hid <= v && v + hid <= self.ld,
            "attention_bwd: dq, dk and dv overlap or overrun their row ({self:?}, width {hid})"
        );
        if rows == 0 || hid == 0 {
            0
        } else {
            (rows - 1) * self.ld + v + hid
        }
    }
}

/// A ticket for [`Backend::wait_aside`]: which [`Backend::aside`] call to wait for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Aside(pub usize);

impl Aside {
    /// Nothing to wait for: `aside`'s GEMMs ran in order with the rest.
    pub const DONE: Aside = Aside(0);
}

/// Rows per chunk of [`Backend::bias_grad`]'s summation order.
pub const BIAS_ROWS: usize = 64;

/// The kernel set of a training executor. See the module docs for the conventions.
pub trait Backend {
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
    /// An owned `u32` buffer (token ids, labels, masks).
    type Ids;

    /// A zero-filled buffer of `n` floats.
    fn alloc(&self, n: usize) -> Self::Buf;
    /// A zero-filled buffer of `n` values that every kernel writing them rounds to the storage
    /// dtype (an activation, or its gradient, that nothing reads unrounded): a device storing
    /// fp16/bf16 may keep it in 16 bits each (docs/cuda.md, "16-bit buffers"). By default
    /// [`Backend::alloc`].
    fn alloc_stored(&self, n: usize) -> Self::Buf {
        self.alloc(n)
    }
    /// A buffer holding a copy of `src` (host to backend).
    fn upload(&self, src: &[f32]) -> Self::Buf;
    /// A buffer holding a copy of `src` (host to backend).
    fn upload_ids(&self, src: &[u32]) -> Self::Ids;
    /// Copies `src` into `dst` (the same length), reusing the allocation.
    fn write(&self, dst: Self::ViewMut<'_>, src: &[f32]);
    /// Copies `src` into `dst`, reusing its memory when `src` fits what `dst` has held; returns
    /// whether it had to allocate.
    fn write_ids(&self, dst: &mut Self::Ids, src: &[u32]) -> bool;
    /// Makes `b` `n` floats long, reusing its memory when `n` fits what `b` has held (a
    /// workspace sized for the longest batch so far allocates nothing for shorter ones); returns
    /// whether it had to allocate. The values are unspecified (new elements are NaN on the host,
    /// stale on a GPU): a workspace's passes overwrite them.
    fn resize(&self, b: &mut Self::Buf, n: usize) -> bool;
    /// Copies `src` out to the host.
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
    /// Elements `r` of a writable view (reborrowed for the returned lifetime).
    fn sub_mut<'a, 'b>(&self, v: &'b mut Self::ViewMut<'a>, r: Range<usize>) -> Self::ViewMut<'b>
    where
        'a: 'b;

    /// Splits a writable view at element `mid` into two disjoint views.
    fn split_at_mut<'a, 'b>(
        &self,
        v: &'b mut Self::ViewMut<'a>,
        mid: usize,
    ) -> (Self::ViewMut<'b>, Self::ViewMut<'b>)
    where
        'a: 'b;

    /// `dst = 0`.
    fn zero(&self, dst: Self::ViewMut<'_>);
    /// `dst = src`.
    fn copy(&self, dst: Self::ViewMut<'_>, src: Self::View<'_>);
    /// Row `r` of `dst` (rows `ld_dst` apart) `=` row `r` of `src` (rows `ld_src` apart), for
    /// `rows` rows of `cols` values, the values as they are: the `[CLS]` rows of a
    /// sequence-major matrix gathered into a dense one, or scattered back (the training
    /// forward's and backward's last layer, [`crate::model`]'s `bert.rs`). By default one
    /// [`Backend::copy`] a row; a device copies them in one launch.
    fn copy_rows(
        &self,
        mut dst: Self::ViewMut<'_>,
        src: Self::View<'_>,
        rows: usize,
        cols: usize,
        ld_dst: usize,
        ld_src: usize,
    ) {
        for r in 0..rows {
            self.copy(
                self.sub_mut(&mut dst, r * ld_dst..r * ld_dst + cols),
                self.sub(src, r * ld_src..r * ld_src + cols),
            );
        }
    }
    /// `acc += x`, elementwise.
    fn add_assign(&self, acc: Self::ViewMut<'_>, x: Self::View<'_>);

    /// One GEMM, see [`Gemm`].
    fn gemm(&self, g: &Gemm, a: Self::View<'_>, b: Self::View<'_>, c: Self::ViewMut<'_>);
    /// A GEMM whose `c` something after it rounds to the storage dtype before anything else
    /// reads it: (`m × n`, dense) [`Backend::bias_dropout_add`], [`Backend::bias_gelu`],
    /// [`Backend::bias_epilogue`] or (as `dout`) [`Backend::gelu_bwd`], which round that input
    /// first; or [`Backend::round_stored`] over a range holding several (a layer's weight
    /// gradients). A device may leave to them the rounding a half-precision GEMM's output
    /// otherwise gets in a pass of its own. By default [`Backend::gemm`] (the CPU rounds in the
    /// GEMM, and rounding twice changes nothing).
    fn gemm_to_epilogue(
        &self,
        g: &Gemm,
        a: Self::View<'_>,
        b: Self::View<'_>,
        c: Self::ViewMut<'_>,
    ) {
        self.gemm(g, a, b, c);
    }
    /// `count` GEMMs of shape `g`, each as [`Backend::gemm_to_epilogue`]: item `j` reads `a` and
    /// `b` from `j · strides[0]` and `j · strides[1]` elements into their views and writes `c`
    /// from `j · strides[2]` (a stride of 0: every item reads the same operand). Attention's
    /// three projections of one input: a device runs them as one batched call, three times the
    /// tiles of one of them at once. By default one call each, in order.
    fn gemm_items_to_epilogue(
        &self,
        g: &Gemm,
        count: usize,
        strides: [usize; 3],
        a: Self::View<'_>,
        b: Self::View<'_>,
        mut c: Self::ViewMut<'_>,
    ) {
        let (sa, sb, sc) = g.spans();
        for j in 0..count {
            let [oa, ob, oc] = strides.map(|s| j * s);
            self.gemm_to_epilogue(
                g,
                self.sub(a, oa..oa + sa),
                self.sub(b, ob..ob + sb),
                self.sub_mut(&mut c, oc..oc + sc),
            );
        }
    }

    /// Runs `f`, whose work (a layer's weight gradients and their rounding) a device may queue
    /// where it runs beside what is queued after it: a second stream on a GPU, whose GEMMs and
    /// kernels start after everything queued before them and fill the SMs the other stream's
    /// leave idle. Nothing queued after `f` may write what its work reads, nor read what it
    /// writes, before [`Backend::wait_aside`] with the returned ticket (which covers every
    /// `aside` call before it too) or [`Backend::join_aside`]. The results are the same bits
    /// either way. By default `f` simply runs.
    fn aside(&self, f: impl FnOnce()) -> Aside {
        f();
        Aside::DONE
    }
    /// Orders what is queued from now on after the GEMMs of the [`Backend::aside`] call that
    /// returned `t`.
    fn wait_aside(&self, _t: Aside) {}
    /// Orders what is queued from now on after every [`Backend::aside`] GEMM so far.
    fn join_aside(&self) {}
    /// Orders what is queued from now on after the last update of parameter segment `seg`
    /// queued beside the rest (`Kernels::update_aside`: the optimizer's step of that segment,
    /// which the next pass's reads of it wait for, one segment at a time, so that the step runs
    /// beside the forward). A pass calls it before it reads the segment. By default nothing
    /// (the update ran in order with the rest).
    fn wait_update(&self, _seg: usize) {}

    /// in it, and values already rounded (which it leaves as they are). By default nothing (the
    /// CPU's GEMM has rounded them).
    fn round_stored(&self, _v: Self::ViewMut<'_>) {}
    /// Sizes the scratch a GEMM needs for operands spanning up to `elems` elements, before a
    /// run's first step (a GPU's half-precision operands: `device::Device::gemm_half`). The CPU
    /// needs none.
    fn reserve_gemm(&self, _elems: usize) {}
    /// Sizes the scratch a batch of shape `s` needs, before a run's first step (a GPU's:
    /// attention's batched GEMMs, their operands' addresses and half operands; with `backward`,
    /// a training batch's, also the softmax gradient's 16-bit room and the embedding backward's
    /// order of the tokens). The CPU needs none.
    fn reserve_batch(&self, _s: AttnShape, _backward: bool) {}
    /// Sizes the scratch of a training pass's sums over rows, before a run's first step (a
    /// GPU's): the chunk sums of the bias and LayerNorm gradients over up to `tokens` rows of up
    /// to `width` columns, and their counters ([`Backend::bias_grad`]; LayerNorm's `dw` and `db`
    /// take two of `h`, three with [`Backend::layernorm_bwd_split_bias_grad`]'s bias, as
    /// [`Backend::bias_grad_items`] q's and v's two),
    /// the per-row losses of up to `rows` rows, and with `dropout` the dropout key. The CPU
    /// needs none.
    fn reserve_sums(&self, _tokens: usize, _width: usize, _rows: usize, _dropout: bool) {}
    /// `out[r, c] += bias[c]` for a `rows × cols` matrix.
    fn add_bias(&self, out: Self::ViewMut<'_>, bias: Self::View<'_>, rows: usize, cols: usize);
    /// [`Backend::add_bias`] on the output of a [`Backend::gemm_to_epilogue`], which it rounds
    /// to the storage dtype first: a linear layer's bias (a GPU's one pass where the GEMM's
    /// rounding would be another). By default [`Backend::add_bias`].
    fn bias_epilogue(
        &self,
        out: Self::ViewMut<'_>,
        bias: Self::View<'_>,
        rows: usize,
        cols: usize,
    ) {
        self.add_bias(out, bias, rows, cols);
    }
    /// `count` [`Backend::bias_epilogue`]s: item `j` on the `rows × cols` block at
    /// `j · rows · cols` in `out`, its bias the `cols` values at `j · bias_stride` in `bias` (the
    /// outputs of one [`Backend::gemm_items_to_epilogue`]). By default one call each.
    fn bias_epilogue_items(
        &self,
        mut out: Self::ViewMut<'_>,
        bias: Self::View<'_>,
        rows: usize,
        cols: usize,
        count: usize,
        bias_stride: usize,
    ) {
        for j in 0..count {
            let o = j * rows * cols;
            self.bias_epilogue(
                self.sub_mut(&mut out, o..o + rows * cols),
                self.sub(bias, j * bias_stride..j * bias_stride + cols),
                rows,
                cols,
            );
        }
    }
    /// Accumulates `db[c] += Σ_r dout[r, c]` in a fixed two-level order: the rows of each chunk
    /// of [`BIAS_ROWS`] summed in order from zero, then the chunks' sums added to `db[c]` in
    /// order, and the result rounded to the storage dtype. Every backend adds in this order, so
    /// they agree bit for bit; a GPU sums the chunks in parallel (one thread per column over
    /// every row would leave it nearly idle).
    fn bias_grad(&self, db: Self::ViewMut<'_>, dout: Self::View<'_>, rows: usize, cols: usize);
    /// [`Backend::bias_grad`] of `count` items: item `j`'s `rows × cols` gradient starts
    /// `j · dout_stride` elements into `dout`, its rows `ld` apart, and its bias `j · db_stride`
    /// into `db` (attention's q and v biases, `LayerLayout::qkv_stride` apart, from the rows of
    /// [`Backend::attention_bwd`]'s one buffer). The CPU sums each item as `bias_grad`; a GPU
    /// makes them one launch (the same sums, so the same bits).
    #[allow(clippy::too_many_arguments)]
    fn bias_grad_items(
        &self,
        db: Self::ViewMut<'_>,
        dout: Self::View<'_>,
        rows: usize,
        cols: usize,
        ld: usize,
        count: usize,
        dout_stride: usize,
        db_stride: usize,
    );

    /// BERT embeddings: `out[b, t] = word[ids[b, t]] + pos[t] + typ[types[b, t]]`, `hidden` wide.
    #[allow(clippy::too_many_arguments)]
    fn embedding_fwd(
        &self,
        out: Self::ViewMut<'_>,
        ids: &Self::Ids,
        types: &Self::Ids,
        word: Self::View<'_>,
        pos: Self::View<'_>,
        typ: Self::View<'_>,
        batch: usize,
        seq: usize,
        hidden: usize,
    );
    /// Accumulates the embedding-table gradients of [`Backend::embedding_fwd`] (tokens in order).
    #[allow(clippy::too_many_arguments)]
    fn embedding_bwd(
        &self,
        dword: Self::ViewMut<'_>,
        dpos: Self::ViewMut<'_>,
        dtyp: Self::ViewMut<'_>,
        dout: Self::View<'_>,
        ids: &Self::Ids,
        types: &Self::Ids,
        batch: usize,
        seq: usize,
        hidden: usize,
    );

    /// LayerNorm over the last dimension (biased variance, `eps` inside the square root); saves
    /// each row's mean and 1/std for the backward.
    #[allow(clippy::too_many_arguments)]
    fn layernorm_fwd(
        &self,
        out: Self::ViewMut<'_>,
        mean: Self::ViewMut<'_>,
        rstd: Self::ViewMut<'_>,
        inp: Self::View<'_>,
        w: Self::View<'_>,
        b: Self::View<'_>,
        rows: usize,
        cols: usize,
        eps: f32,
    );
    /// LayerNorm backward: overwrites `dinp`, accumulates `dw` and `db` (summed over the rows
    /// in [`Backend::bias_grad`]'s order). A device may queue the sums [`Backend::aside`] (they
    /// feed nothing but the gradients): the returned ticket covers them, so a later write of
    /// `dout` or `inp` (or of `dinp`, which the split forms below read for a bias gradient)
    /// waits for it, or for a later ticket, or a join.
    #[allow(clippy::too_many_arguments)]
    fn layernorm_bwd(
        &self,
        dinp: Self::ViewMut<'_>,
        dw: Self::ViewMut<'_>,
        db: Self::ViewMut<'_>,
        dout: Self::View<'_>,
        inp: Self::View<'_>,
        w: Self::View<'_>,
        mean: Self::View<'_>,
        rstd: Self::View<'_>,
        rows: usize,
        cols: usize,
    ) -> Aside;
    /// [`Backend::layernorm_bwd`] at the top of a residual branch `LN(x + dropout(f(x)))`: its
    /// `dinp` (the gradient of that sum, `rows × cols`, the whole buffer) is copied into `keep`
    /// (as long) for the residual path, and `dinp` is then dropped with `dropout`'s mask for the
    /// branch, when there is one. By default the backward, a copy and a [`Backend::dropout`];
    /// a GPU does all three in one pass (the same bits).
    #[allow(clippy::too_many_arguments)]
    fn layernorm_bwd_split(
        &self,
        (dinp, keep, dropout): (&mut Self::Buf, &mut Self::Buf, Option<&Dropout>),
        dw: Self::ViewMut<'_>,
        db: Self::ViewMut<'_>,
        dout: Self::View<'_>,
        inp: Self::View<'_>,
        w: Self::View<'_>,
        mean: Self::View<'_>,
        rstd: Self::View<'_>,
        rows: usize,
        cols: usize,
    ) -> Aside {
        let split = (dinp, keep, dropout);
        layernorm_bwd_apart(self, split, dw, db, dout, inp, w, mean, rstd, rows, cols)
    }

    /// [`Backend::layernorm_bwd_split`], then [`Backend::bias_grad`] into `dl` of the branch's
    /// gradient it leaves in `dinp` (`rows × cols`): the bias of the linear whose output the
    /// residual sum took, as `linear_bwd` would sum it. By default those two calls; a GPU sums
    /// it in the LayerNorm's pass over the columns (the same additions in the same order),
    /// where a launch of its own read `dinp` back.
    #[allow(clippy::too_many_arguments)]
    fn layernorm_bwd_split_bias_grad(
        &self,
        (dinp, keep, dropout): (&mut Self::Buf, &mut Self::Buf, Option<&Dropout>),
        (dw, db, dl): (Self::ViewMut<'_>, Self::ViewMut<'_>, Self::ViewMut<'_>),
        dout: Self::View<'_>,
        inp: Self::View<'_>,
        w: Self::View<'_>,
        mean: Self::View<'_>,
        rstd: Self::View<'_>,
        rows: usize,
        cols: usize,
    ) -> Aside {
        let split = (&mut *dinp, keep, dropout);
        let sums = self.layernorm_bwd_split(split, dw, db, dout, inp, w, mean, rstd, rows, cols);
        self.bias_grad(dl, self.view(dinp), rows, cols);
        sums
    }

    /// Exact (erf) GELU, HF's `"gelu"`: `out = x · Φ(x)`.
    fn gelu_fwd(&self, out: Self::ViewMut<'_>, inp: Self::View<'_>);
    /// GELU backward: `dinp = dout · (Φ(x) + x φ(x))` (overwrites). `dout` may come from
    /// [`Backend::gemm_to_epilogue`]: a device rounds it first.
    fn gelu_bwd(&self, dinp: Self::ViewMut<'_>, inp: Self::View<'_>, dout: Self::View<'_>);
    /// [`Backend::gelu_bwd`] into `dinp` (`rows × cols`), then [`Backend::bias_grad`] of it into
    /// `db`: the feed-forward's first linear, whose input gradient is its bias's. By default
    /// those two calls; a GPU makes them one pass (the same values and additions), where the
    /// bias gradient would read `dinp` back. With `inp_bias` (only where
    /// [`Backend::gelu_bwd_adds_bias`]), `inp` is [`Backend::bias_gelu`]'s `inter` without the
    /// bias, and the GELU's input is `inp + inp_bias` per row, rounded as `bias_gelu` rounds it.
    #[allow(clippy::too_many_arguments)]
    fn gelu_bwd_bias_grad(
        &self,
        dinp: &mut Self::Buf,
        inp: Self::View<'_>,
        inp_bias: Option<Self::View<'_>>,
        dout: Self::View<'_>,
        db: Self::ViewMut<'_>,
        rows: usize,
        cols: usize,
    ) {
        assert!(
            inp_bias.is_none(),
            "gelu_bwd_bias_grad: a bias for a backend whose bias_gelu adds it in place"
        );
        self.gelu_bwd(self.view_mut(dinp), inp, dout);
        self.bias_grad(db, self.view(dinp), rows, cols);
    }
    /// `out = tanh(inp)`.
    fn tanh_fwd(&self, out: Self::ViewMut<'_>, inp: Self::View<'_>);
    /// tanh backward from the forward's output `y`: `dinp = dout · (1 − y²)` (overwrites).
    fn tanh_bwd(&self, dinp: Self::ViewMut<'_>, y: Self::View<'_>, dout: Self::View<'_>);
    /// Dropout in place (see [`Dropout`]); the same call with the same key is its own backward.
    fn dropout(&self, x: Self::ViewMut<'_>, d: &Dropout);

    /// A linear layer's bias, then dropout and the residual, on the `rows × cols` GEMM output
    /// `out` (from [`Backend::gemm_to_epilogue`]; rounded to the storage dtype first): `out +=
    /// bias`, then [`Backend::dropout`] when `dropout` is given, then
    /// `out += residual`, each step rounded as [`Backend::add_bias`], `dropout` and
    /// [`Backend::add_assign`] round it. By default those three calls; a GPU makes them one
    /// pass over `out` (the same arithmetic, so the same bits), where three would read and
    /// write it three times.
    fn bias_dropout_add(
        &self,
        out: &mut Self::Buf,
        bias: Self::View<'_>,
        rows: usize,
        cols: usize,
        dropout: Option<&Dropout>,
        residual: Self::View<'_>,
    ) {
        self.add_bias(self.view_mut(out), bias, rows, cols);
        if let Some(d) = dropout {
            self.dropout(self.view_mut(out), d);
        }
        self.add_assign(self.view_mut(out), residual);
    }

    /// [`Backend::bias_dropout_add`] on `res`, then [`Backend::layernorm_fwd`] of it into
    /// `out`: a post-LN residual branch, `out = LN(residual + dropout(res + bias))`, with `res`
    /// kept for the backward. By default those two calls; a GPU makes them one pass (the same
    /// bits), where two would read `res` twice.
    #[allow(clippy::too_many_arguments)]
    fn bias_dropout_add_layernorm(
        &self,
        res: &mut Self::Buf,
        bias: Self::View<'_>,
        dropout: Option<&Dropout>,
        residual: Self::View<'_>,
        (out, mean, rstd): (Self::ViewMut<'_>, Self::ViewMut<'_>, Self::ViewMut<'_>),
        w: Self::View<'_>,
        b: Self::View<'_>,
        rows: usize,
        cols: usize,
        eps: f32,
    ) {
        self.bias_dropout_add(res, bias, rows, cols, dropout, residual);
        self.layernorm_fwd(out, mean, rstd, self.view(res), w, b, rows, cols, eps);
    }

    /// A linear layer's bias, then GELU, on the `rows × cols` GEMM output `inter` (from
    /// [`Backend::gemm_to_epilogue`]; rounded first): `inter += bias` (kept: the backward
    /// reads the pre-activation), then `act = gelu(inter)`, each
    /// rounded as [`Backend::add_bias`] and [`Backend::gelu_fwd`] round it. By default those two
    /// calls; a GPU makes them one pass (the same bits of `act`) which leaves `inter` as it is
    /// ([`Backend::gelu_bwd_adds_bias`]).
    fn bias_gelu(
        &self,
        inter: &mut Self::Buf,
        act: &mut Self::Buf,
        bias: Self::View<'_>,
        rows: usize,
        cols: usize,
    ) {
        self.add_bias(self.view_mut(inter), bias, rows, cols);
        self.gelu_fwd(self.view_mut(act), self.view(inter));
    }

    /// Whether [`Backend::bias_gelu`] leaves `inter` as the GEMM wrote it (rounded), without
    /// the bias, so that the backward's [`Backend::gelu_bwd_bias_grad`] is given the bias
    /// (`inp_bias`) and adds it again as it loads `inter`: the biased pre-activation is then
    /// never written, a pass over the feed-forward's widest matrix less a layer, with the same
    /// values. A GPU's kernels do; the CPU adds the bias in place (its add costs what the
    /// backward's would).
    fn gelu_bwd_adds_bias(&self) -> bool {
        false
    }

    /// Multi-head self-attention core with HF's additive padding mask (`finfo(f32).min` added to
    /// the scores of keys whose `mask` is 0). `q`, `k`, `v`, `ctx` are `[batch, seq, heads·dim]`;
    /// saves the softmax `probs` `[batch, heads, seq, seq]` and, with dropout, the dropped
    /// `probs_drop` used for `ctx = probs_drop · v` (dropout needs it, unless
    /// [`Backend::attention_redraws_dropout`]). The unrounded scores are computed in
    /// `scores` (an f32 buffer of `probs`' size, overwritten) when given, else in `probs`; a
    /// `probs` kept in 16 bits ([`Backend::alloc_stored`]) needs it. The CPU backend computes
    /// them in `probs`, head by head. With `qkv_bias` (only where
    /// [`Backend::attention_adds_bias`]), `q`, `k` and `v` are their projections' outputs without
    /// their biases, which are `qkv_bias.1` elements apart in `qkv_bias.0` (q's first), and the
    /// device adds them, rounded as [`Backend::add_bias`] rounds, as it loads q, k and v.
    #[allow(clippy::too_many_arguments)]
    fn attention_fwd(
        &self,
        ctx: Self::ViewMut<'_>,
        probs: Self::ViewMut<'_>,
        probs_drop: Option<Self::ViewMut<'_>>,
        scores: Option<Self::ViewMut<'_>>,
        q: Self::View<'_>,
        k: Self::View<'_>,
        v: Self::View<'_>,
        qkv_bias: Option<(Self::View<'_>, usize)>,
        mask: &Self::Ids,
        s: AttnShape,
        dropout: Option<&Dropout>,
    );
    /// Whether [`Backend::attention_fwd`] and [`Backend::attention_bwd`] of a training pass of
    /// shape `s` (its q, k, v and probabilities in [`Backend::alloc_stored`] buffers, the scores'
    /// f32 room given) take `qkv_bias`: attention's q, k and v projections may then leave their
    /// biases to them, a pass over q, k and v less ([`Backend::bias_epilogue_items`]), with the
    /// same values. A GPU's fused attention kernels do; the CPU does not.
    fn attention_adds_bias(&self, _s: AttnShape) -> bool {
        false
    }
    /// Whether [`Backend::attention_fwd`] and [`Backend::attention_bwd`] of a training pass of
    /// shape `s` (as [`Backend::attention_adds_bias`]'s) apply attention's dropout from its key
    /// alone, `probs_drop` not given: the backward draws the forward's mask again (the same
    /// Philox blocks of the same elements), so the dropped probabilities are never stored, a
    /// `[batch, heads, seq, seq]` buffer less a layer, written once and read twice a step. A
    /// GPU's fused attention kernels do; the CPU and the batched products read `probs_drop`.
    fn attention_redraws_dropout(&self, _s: AttnShape) -> bool {
        false
    }
    /// Whether [`Backend::attention_fwd`] of shape `s`, its probabilities in an
    /// [`Backend::alloc_stored`] buffer, needs the scores' f32 room: a GPU storing 16-bit
    /// probabilities does unless its fused kernel runs (the evaluation forward allocates the
    /// room only then; a training pass always has it, the backward's scratch). The CPU computes
    /// the scores in `probs`.
    fn attention_needs_scores(&self, _s: AttnShape) -> bool {
        false
    }
    /// Attention backward: overwrites `dq`, `dk`, `dv`, the columns `out` gives of `dqkv`'s rows
    /// (nothing else of them); `scratch` is f32 room of
    /// `[batch, heads, seq, seq]` for `dp = dctx·vᵀ` and the softmax's gradient `ds` (left
    /// holding `ds`, except on a device keeping 16-bit buffers, which computes `ds` into one of
    /// its own). With dropout, `probs_drop` (from the forward) must be given: it carries the
    /// mask (unless [`Backend::attention_redraws_dropout`], which draws it again from the key).
    /// `qkv_bias` as [`Backend::attention_fwd`]'s, the same as the forward's.
    #[allow(clippy::too_many_arguments)]
    fn attention_bwd(
        &self,
        dqkv: Self::ViewMut<'_>,
        out: QkvRows,
        scratch: Self::ViewMut<'_>,
        dctx: Self::View<'_>,
        q: Self::View<'_>,
        k: Self::View<'_>,
        v: Self::View<'_>,
        qkv_bias: Option<(Self::View<'_>, usize)>,
        probs: Self::View<'_>,
        probs_drop: Option<Self::View<'_>>,
        s: AttnShape,
        dropout: Option<&Dropout>,
    );

    /// Softmax cross-entropy over `rows × classes` logits with integer labels: returns the mean
    /// loss and overwrites `dlogits` with `grad_scale · d(mean loss)/d logits`.
    fn cross_entropy(
        &self,
        dlogits: Self::ViewMut<'_>,
        logits: Self::View<'_>,
        labels: &Self::Ids,
        rows: usize,
        classes: usize,
        grad_scale: f32,
    ) -> f32;

    /// [`Backend::cross_entropy`] whose mean loss is read later, by [`Backend::loss`]: a device
    /// queues the kernel and goes on to the backward rather than waiting for the forward to
    /// finish to copy one number back. By default, computed at once.
    fn cross_entropy_queued(
        &self,
        dlogits: Self::ViewMut<'_>,
        logits: Self::View<'_>,
        labels: &Self::Ids,
        rows: usize,
        classes: usize,
        grad_scale: f32,
    ) -> Loss {
        Loss::Ready(self.cross_entropy(dlogits, logits, labels, rows, classes, grad_scale))
    }

    /// The mean loss of a [`Backend::cross_entropy_queued`], the same value
    /// [`Backend::cross_entropy`] returns; the last queued one's for [`Loss::Queued`].
    fn loss(&self, l: Loss) -> f32 {
        match l {
            Loss::Ready(x) => x,
            Loss::Queued { .. } => f32::NAN,
        }
    }
}

/// [`Backend::layernorm_bwd_split`] as three calls: the backward, a copy and a dropout (the
/// default, and a device's way with buffers longer than the matrix).
#[allow(clippy::too_many_arguments)]
pub fn layernorm_bwd_apart<B: Backend + ?Sized>(
    be: &B,
    (dinp, keep, dropout): (&mut B::Buf, &mut B::Buf, Option<&Dropout>),
    dw: B::ViewMut<'_>,
    db: B::ViewMut<'_>,
    dout: B::View<'_>,
    inp: B::View<'_>,
    w: B::View<'_>,
    mean: B::View<'_>,
    rstd: B::View<'_>,
    rows: usize,
    cols: usize,
) -> Aside {
    let d = be.view_mut(dinp);
    // Its sums, if aside, read `dout` and `inp` only (no bias gradient of `dinp`), so the
    // copy and the dropout below may rewrite `dinp` before them.
    let sums = be.layernorm_bwd(d, dw, db, dout, inp, w, mean, rstd, rows, cols);
    be.copy(be.view_mut(keep), be.view(dinp));
    if let Some(d) = dropout {
        be.dropout(be.view_mut(dinp), d);
    }
    sums
}

/// A mean cross-entropy, computed or still on the device ([`Backend::cross_entropy_queued`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Loss {
    /// The value.
    Ready(f32),
    /// `rows` per-row losses in the device's scratch, read by [`Backend::loss`].
    Queued {
        /// Rows of the batch.
        rows: usize,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Attention's `dq` batch (an item per sequence and head, `[seq × head_dim]` blocks of the
    /// `[batch, seq, hidden]` output side by side) overwrites its whole extent; one head fewer,
    /// or a `beta` that adds, or rows with columns left between them, does not.
    #[test]
    fn attentions_output_batches_overwrite_their_extent() {
        let s = AttnShape {
            batch: 3,
            seq: 5,
            heads: 4,
            head_dim: 2,
        };
        let hid = s.heads * s.head_dim;
        let tok = Stride {
            outer: s.seq * hid,
            inner: s.head_dim,
        };
        let batch = |heads: usize| Batch {
            count: s.batch * heads,
            inner: heads,
            a: tok,
            b: tok,
            c: tok,
        };
        let g = Gemm {
            ldc: hid,
            ..Gemm::dense(s.seq, s.head_dim, s.seq, false, false, 0.0)
        };
        assert_eq!(
            batch(s.heads).extent(tok, g.spans().2),
            s.batch * s.seq * hid
        );
        assert!(batch(s.heads).overwrites_all(&g));
        // The last sequence's last head is the extent's end: with 3 of 4 heads the extent
        // still has each row's fourth head between the items.
        assert!(!batch(3).overwrites_all(&g));
        assert!(!batch(s.heads).overwrites_all(&Gemm { beta: 1.0, ..g }));
        let wide = Gemm { ldc: hid + 1, ..g };
        assert!(!batch(s.heads).overwrites_all(&wide));
    }
}
