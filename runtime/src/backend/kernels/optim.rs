//! Launches of `runtime/kernels/optim.cu`: the gradient norm and one step per optimizer (Adam /
//! AdamW, SGD, Adagrad, LAMB), the device side of [`crate::optim`] (the host optimizers the
//! emulation tests compare them with, bit for bit).
//!
//! - [`grad_norm_sq`]: `Σ g²` in f64, as [`crate::optim::sum_squares`], in two fixed passes (at
//!   most [`NORM_BLOCKS`] block partials, then one block adds them in order): the same bits on
//!   every run and every GPU. Non-finite exactly when some `g` is inf or NaN, so it is also the
//!   overflow check ([`crate::precision::has_inf_or_nan`]): a double sum of f32 squares cannot
//!   overflow.
//! - [`adamw_step`]: one update of a flat buffer (or a ZeRO partition) with
//!   [`crate::optim::Adam::step`]'s arithmetic, the gradient first multiplied by one host-computed
//!   factor (clip coefficient, or `f32(1 / combined scale)`), weight decay on the ranges of a
//!   [`DecayMask`], and optionally the result stored rounded into the module's half copy.
//! - [`sgd_step`], [`adagrad_step`], [`lamb_step`]: the same for [`crate::optim::Sgd`],
//!   [`crate::optim::Adagrad`] and [`crate::optim::Lamb`], their f32 scalars formed by the host
//!   optimizers' own `scalars` (one formula for both sides). LAMB's per-tensor norms are f32 sums
//!   in the order `lamb.rs` fixes (FusedLamb's), over the layout of a [`LambTensors`].

#![allow(clippy::too_many_arguments)]

use std::ops::Range;

use super::{dtype_arg, grid1, int, Kernels, BLOCK};
use crate::backend::device::{Arg, Device, Launch};
pub use crate::optim::AdamScalars;
use crate::optim::{
    self, AdagradConfig, AdagradImpl, AdamConfig, LambConfig, OptimError, SgdConfig,
};
use crate::params::Entry;
use crate::precision::Dtype;

/// Most blocks of the norm's first pass (`NORM_BLOCKS` in optim.cu): fixed, so the partial sums
/// (and the result's bits) depend only on the gradient's length.
pub const NORM_BLOCKS: usize = 1024;

/// `Σ g²` over `g` in f64 (see the module docs). Its square root rounded to f32 is the norm
/// [`crate::optim::clip_grad_norm`] computes; partitions add their sums as the host's do.
pub fn grad_norm_sq<D: Device>(k: &Kernels<D>, g: D::View<'_>) -> f64 {
    grad_norm_sq_blocks(k, g, NORM_BLOCKS)
}

/// [`grad_norm_sq`] with at most `max_blocks` first-pass blocks instead of [`NORM_BLOCKS`] (the
/// bits depend on it; the tests use small caps to run the grid-stride loop cheaply).
pub fn grad_norm_sq_blocks<D: Device>(k: &Kernels<D>, g: D::View<'_>, max_blocks: usize) -> f64 {
    let mut scratch = k.dev.alloc(norm_scratch_len(k.dev.len(g), max_blocks));
    norm_sq_in(k, g, &mut scratch, max_blocks)
}

/// The floats of scratch [`grad_norm_sq_in`] needs for `n` elements with at most `max_blocks`
/// first-pass blocks: the total and one partial per block, each double as two floats.
pub fn norm_scratch_len(n: usize, max_blocks: usize) -> usize {
    2 + 2 * n.div_ceil(BLOCK as usize).clamp(1, max_blocks)
}

/// [`grad_norm_sq`] in a caller's `scratch` of at least [`norm_scratch_len`]`(n, NORM_BLOCKS)`
/// floats: a training loop allocates it once per run, not once per step.
pub fn grad_norm_sq_in<D: Device>(k: &Kernels<D>, g: D::View<'_>, scratch: &mut D::Buf) -> f64 {
    norm_sq_in(k, g, scratch, NORM_BLOCKS)
}

fn norm_sq_in<D: Device>(
    k: &Kernels<D>,
    g: D::View<'_>,
    scratch: &mut D::Buf,
    max_blocks: usize,
) -> f64 {
    let need = norm_scratch_len(k.dev.len(g), max_blocks);
    // [total (2 floats), partials (2 floats per block)]: each double travels as its two words.
    let parts = {
        let partials = k.dev.range_mut(scratch, 2..need);
        norm_partials(k, g, partials, max_blocks)
    };
    norm_total(k, scratch, parts)
}

/// The first pass of [`grad_norm_sq`]: `Σ g²` of each of at most `max_blocks` blocks' elements,
/// into `partials` (two floats a block, at least [`norm_scratch_len`]` − 2`). Returns the
/// blocks. A [`SegmentNorms`] slot takes one segment's.
pub fn norm_partials<D: Device>(
    k: &Kernels<D>,
    g: D::View<'_>,
    partials: D::ViewMut<'_>,
    max_blocks: usize,
) -> usize {
    let n = k.dev.len(g);
    launch_partials(k, (k.dev.ptr(g), n), partials, max_blocks, Dtype::F32)
}

/// [`norm_partials`] of `g` rounded to `store` first, in place (`grad_norm_partial`'s `store`):
/// `Backend::round_stored` and the sum in one pass, the same values and the same sums.
pub fn norm_partials_rounding<D: Device>(
    k: &Kernels<D>,
    mut g: D::ViewMut<'_>,
    partials: D::ViewMut<'_>,
    max_blocks: usize,
    store: Dtype,
) -> usize {
    assert!(
        !k.dev.elem(k.dev.as_view(&g)).is_half(),
        "rounding in place needs f32 values"
    );
    let n = k.dev.len_mut(&g);
    launch_partials(k, (k.dev.ptr_mut(&mut g), n), partials, max_blocks, store)
}

fn launch_partials<D: Device>(
    k: &Kernels<D>,
    (g, n): (u64, usize),
    mut partials: D::ViewMut<'_>,
    max_blocks: usize,
    store: Dtype,
) -> usize {
    assert!(
        (1..=65_535).contains(&max_blocks),
        "grad_norm_sq: {max_blocks} blocks"
    );
    let blocks = n.div_ceil(BLOCK as usize).clamp(1, max_blocks);
    assert!(k.dev.len_mut(&partials) >= 2 * blocks, "norm partials");
    k.dev.launch(
        "grad_norm_partial",
        Launch {
            grid: (blocks as u32, 1, 1),
            block: (BLOCK, 1, 1),
            smem: 0,
        },
        &[
            Arg::Ptr(k.dev.ptr_mut(&mut partials)),
            Arg::Ptr(g),
            int(n),
            dtype_arg(store),
        ],
    );
    blocks
}

/// The second pass of [`grad_norm_sq`]: one block adds the first `parts` partial sums of
/// `scratch` (after its first two floats) in order into those two floats, which are read back.
pub fn norm_total<D: Device>(k: &Kernels<D>, scratch: &mut D::Buf, parts: usize) -> f64 {
    let mut all = k.dev.range_mut(scratch, 0..2 + 2 * parts);
    let mut words = [0.0f32; 2];
    {
        let (mut total, mut partial) = k.dev.split_at_mut(&mut all, 2);
        let (t, p) = (k.dev.ptr_mut(&mut total), k.dev.ptr_mut(&mut partial));
        k.dev.launch(
            "grad_norm_final",
            Launch {
                grid: (1, 1, 1),
                block: (BLOCK, 1, 1),
                smem: 0,
            },
            &[Arg::Ptr(t), Arg::Ptr(p), int(parts)],
        );
    }
    drop(all);
    k.dev
        .download(k.dev.sub(k.dev.view(scratch), 0..2), &mut words);
    f64::from_bits(u64::from(words[0].to_bits()) | (u64::from(words[1].to_bits()) << 32))
}

/// `Σ g²` of a buffer cut into segments whose sums are taken one segment at a time, each as the
/// backward finishes it ([`SegmentNorms::partials`]), then added at once
/// ([`SegmentNorms::total`]): the first pass per segment (at most [`NORM_BLOCKS`] blocks each),
/// every segment's partials in segment order in one scratch, the second pass over all of them.
/// A fixed order for fixed segments, so the same bits run after run (not the whole buffer's
/// [`grad_norm_sq`] bits: other blocks).
pub struct SegmentNorms<D: Device> {
    scratch: D::Buf,
    /// Each segment's range of the buffer and its first partial's index.
    slots: Vec<(Range<usize>, usize)>,
    parts: usize,
}

impl<D: Device> SegmentNorms<D> {
    /// The scratch for `segs` (ascending, disjoint), allocated once.
    pub fn new(k: &Kernels<D>, segs: &[Range<usize>]) -> SegmentNorms<D> {
        let mut slots = Vec::with_capacity(segs.len());
        let mut parts = 0;
        for s in segs {
            slots.push((s.clone(), parts));
            parts += s.len().div_ceil(BLOCK as usize).clamp(1, NORM_BLOCKS);
        }
        SegmentNorms {
            scratch: k.dev.alloc(2 + 2 * parts),
            slots,
            parts,
        }
    }

    /// Segment `seg`'s range of the buffer and its slots of the scratch.
    fn slot<'s>(&'s mut self, k: &Kernels<D>, seg: usize) -> (Range<usize>, D::ViewMut<'s>) {
        let (r, first) = self.slots[seg].clone();
        let blocks = r.len().div_ceil(BLOCK as usize).clamp(1, NORM_BLOCKS);
        let at = 2 + 2 * first;
        (r, k.dev.range_mut(&mut self.scratch, at..at + 2 * blocks))
    }

    /// Queues the first pass over segment `seg` of `g` (the whole buffer).
    pub fn partials(&mut self, k: &Kernels<D>, g: D::View<'_>, seg: usize) {
        let (r, out) = self.slot(k, seg);
        norm_partials(k, k.dev.sub(g, r), out, NORM_BLOCKS);
    }

    /// [`SegmentNorms::partials`] of segment `seg` of `g` (the whole f32 buffer) rounded to the
    /// storage dtype first, in place: `Backend::round_stored` over the segment fused with its
    /// first pass (the same values and sums as the two one after the other).
    pub fn partials_rounding(&mut self, k: &Kernels<D>, mut g: D::ViewMut<'_>, seg: usize) {
        let (r, out) = self.slot(k, seg);
        norm_partials_rounding(k, k.dev.sub_mut(&mut g, r), out, NORM_BLOCKS, k.store);
    }

    /// The scratch's address (a graph that queues the partials writes there).
    pub fn address(&self, k: &Kernels<D>) -> u64 {
        k.dev.ptr(k.dev.view(&self.scratch))
    }

    /// The total of every segment's partials (each queued since the buffer last changed).
    pub fn total(&mut self, k: &Kernels<D>) -> f64 {
        norm_total(k, &mut self.scratch, self.parts)
    }
}

/// Which elements of an optimizer's buffer get weight decay, on the device: the bounds of the
/// decaying ranges (`[b0, b1), [b2, b3), …`, adjacent ranges merged), which the kernel
/// binary-searches. Built once per optimizer from the same layout [`crate::optim::Adam`] keeps.
pub struct DecayMask<D: Device> {
    bounds: D::Ids,
    count: usize,
    len: usize,
}

impl<D: Device> DecayMask<D> {
    /// The mask of [`crate::optim::Adam::shard`]`(_, entries, decay, ranges)`: the elements
    /// `ranges` of the buffer laid out as `entries` (use `[0..total]` for
    /// [`crate::optim::Adam::new`]'s whole buffer), in the layout of the ranges' concatenation.
    pub fn new(
        k: &Kernels<D>,
        entries: &[Entry],
        decay: &[bool],
        ranges: &[Range<usize>],
    ) -> Result<DecayMask<D>, OptimError> {
        let (full, total) = optim::layout(entries, decay)?;
        let (segments, n) = optim::partition(&full, total, ranges)?;
        Ok(Self::from_segments(k, &segments, n))
    }

    /// The mask of a buffer of `len` elements whose ranges `segments` (ascending, disjoint) decay
    /// when flagged; elements outside every segment do not decay (the host never steps those).
    pub fn from_segments(
        k: &Kernels<D>,
        segments: &[(Range<usize>, bool)],
        len: usize,
    ) -> DecayMask<D> {
        let mut bounds: Vec<u32> = Vec::new();
        for (r, d) in segments {
            if !*d || r.is_empty() {
                continue;
            }
            assert!(r.end <= len, "decay range {r:?} beyond {len} elements");
            let (s, e) = (u32::try_from(r.start), u32::try_from(r.end));
            let (s, e) = (s.expect("range start"), e.expect("range end"));
            // A range that starts where the previous one ended extends it.
            if bounds.last() == Some(&s) {
                bounds.pop();
            } else {
                assert!(
                    bounds.last().is_none_or(|&b| b < s),
                    "segments out of order"
                );
                bounds.push(s);
            }
            bounds.push(e);
        }
        DecayMask {
            count: bounds.len(),
            bounds: k.dev.upload_ids(&bounds),
            len,
        }
    }

    /// Elements covered.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True when it covers nothing.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

/// One Adam / AdamW step on the device: `params`, `m`, `v` updated in place from `grads · mult`
/// exactly as [`crate::optim::Adam::step`] updates them (`step` is the step count after this
/// step, 1 first; `mult` the one factor the host multiplies the gradients by, see optim.cu).
/// With `work`, the updated values are also stored there rounded to the kernels' storage dtype
/// (the half parameters of a mixed-precision module, whose fp32 master is `params`).
///
/// Errors as the host's: buffers of the wrong length, a non-finite learning rate.
pub fn adamw_step<D: Device>(
    k: &Kernels<D>,
    cfg: &AdamConfig,
    step: u64,
    lr: f64,
    mult: f32,
    mask: &DecayMask<D>,
    params: D::ViewMut<'_>,
    grads: D::View<'_>,
    m: D::ViewMut<'_>,
    v: D::ViewMut<'_>,
    work: Option<D::ViewMut<'_>>,
) -> Result<(), OptimError> {
    let g = (k.dev.ptr(grads), k.dev.len(grads), false);
    adamw_launch(k, (cfg, step, lr, mult), mask, params, g, m, v, work)
}

/// [`adamw_step`], each gradient set to 0 once read: the update and the zeroing of the next
/// window's accumulator in one pass (`Resident::step`'s segments), where a memset followed.
pub fn adamw_step_zeroing<D: Device>(
    k: &Kernels<D>,
    cfg: &AdamConfig,
    step: u64,
    lr: f64,
    mult: f32,
    mask: &DecayMask<D>,
    params: D::ViewMut<'_>,
    mut grads: D::ViewMut<'_>,
    m: D::ViewMut<'_>,
    v: D::ViewMut<'_>,
    work: Option<D::ViewMut<'_>>,
) -> Result<(), OptimError> {
    let g = (k.dev.ptr_mut(&mut grads), k.dev.len_mut(&grads), true);
    adamw_launch(k, (cfg, step, lr, mult), mask, params, g, m, v, work)
}

/// `adamw_step`'s launch, the gradient as `(address, length, zeroed once read)`.
fn adamw_launch<D: Device>(
    k: &Kernels<D>,
    (cfg, step, lr, mult): (&AdamConfig, u64, f64, f32),
    mask: &DecayMask<D>,
    mut params: D::ViewMut<'_>,
    (grads, grads_len, zero): (u64, usize, bool),
    mut m: D::ViewMut<'_>,
    mut v: D::ViewMut<'_>,
    work: Option<D::ViewMut<'_>>,
) -> Result<(), OptimError> {
    let n = mask.len;
    check_adam(k, n, lr, &params, grads_len, &m, &v, work.as_ref())?;
    let work = opt_typed(k, work);
    let head = [
        Arg::Ptr(k.dev.ptr_mut(&mut params)),
        Arg::Ptr(grads),
        Arg::Ptr(k.dev.ptr_mut(&mut m)),
        Arg::Ptr(k.dev.ptr_mut(&mut v)),
        work,
        Arg::Ptr(k.dev.ids_ptr(&mask.bounds)),
        int(mask.count),
        int(n),
        Arg::I32(i32::from(zero)),
    ];
    let args = [&head[..], &adam_scalars(k, cfg, step, lr, mult)].concat();
    // ADAM_VEC (optim.cu) elements a thread.
    k.dev.launch("adamw_step", grid1(n.div_ceil(4)), &args);
    Ok(())
}

/// The lengths [`adamw_step`] and [`adamw_rows`] require of their buffers (`n`, the mask's:
/// parameters, gradients, both moments and the optional half copy), and a finite rate.
fn check_adam<D: Device>(
    k: &Kernels<D>,
    n: usize,
    lr: f64,
    params: &D::ViewMut<'_>,
    grads_len: usize,
    m: &D::ViewMut<'_>,
    v: &D::ViewMut<'_>,
    work: Option<&D::ViewMut<'_>>,
) -> Result<(), OptimError> {
    check_lens(
        n,
        lr,
        &[
            ("params", k.dev.len_mut(params)),
            ("grads", grads_len),
            ("exp_avg", k.dev.len_mut(m)),
            ("exp_avg_sq", k.dev.len_mut(v)),
            ("work", work.map_or(n, |w| k.dev.len_mut(w))),
        ],
    )
}

/// The last parameters of optim.cu's Adam kernels (`adam_chunk`'s): the gradient multiplier,
/// the step's scalars as [`AdamScalars`] forms them, and the store.
fn adam_scalars<D: Device>(
    k: &Kernels<D>,
    cfg: &AdamConfig,
    step: u64,
    lr: f64,
    mult: f32,
) -> [Arg; 11] {
    let s = AdamScalars::new(cfg, step, lr);
    [
        Arg::F32(mult),
        Arg::F32(s.step_size),
        Arg::F32(s.w1),
        Arg::F32(s.b2),
        Arg::F32(s.w2),
        Arg::F32(s.bc2_sqrt),
        Arg::F32(s.eps),
        Arg::I32(s.decay_mode),
        Arg::F32(s.decay_mul),
        Arg::F32(s.wd),
        k.store_arg(),
    ]
}

/// For each row of a table read by token id, the first token of a batch that names it
/// (`u32::MAX` for none): what [`adamw_rows`] updates first and what it leaves for later
/// (docs/cuda.md, "The step beside the forward"). Every row unmarked between steps.
pub struct RowMarks<D: Device> {
    first: D::Ids,
    rows: usize,
}

impl<D: Device> RowMarks<D> {
    /// Marks for a table of `rows` rows, none marked (allocated once, at upload).
    pub fn new(k: &Kernels<D>, rows: usize) -> RowMarks<D> {
        RowMarks {
            first: k.dev.upload_ids(&vec![u32::MAX; rows.max(1)]),
            rows,
        }
    }

    /// Rows of the table.
    pub fn rows(&self) -> usize {
        self.rows
    }
}

/// Marks the rows that `ids[..ntok]` name (each with the first token naming it). The ids must
/// be rows of the table, as the embedding forward that reads them requires.
pub fn rows_mark<D: Device>(k: &Kernels<D>, marks: &RowMarks<D>, ids: &D::Ids, ntok: usize) {
    rows_marking(k, "rows_mark", marks, ids, ntok);
}

/// Clears the marks [`rows_mark`] set for the same `ids[..ntok]`, after [`adamw_rows`]'s
/// second part has read them.
pub fn rows_unmark<D: Device>(k: &Kernels<D>, marks: &RowMarks<D>, ids: &D::Ids, ntok: usize) {
    rows_marking(k, "rows_unmark", marks, ids, ntok);
}

fn rows_marking<D: Device>(
    k: &Kernels<D>,
    name: &'static str,
    marks: &RowMarks<D>,
    ids: &D::Ids,
    ntok: usize,
) {
    if ntok == 0 {
        return;
    }
    k.dev.launch(
        name,
        grid1(ntok),
        &[
            Arg::Ptr(k.dev.ids_ptr(&marks.first)),
            Arg::Ptr(k.dev.ids_ptr(ids)),
            int(ntok),
        ],
    );
}

/// [`adamw_step`] over the rows of a `marks.rows() × row_len` table at the start of the buffers
/// (the mask and every view as `adamw_step`'s, the table its first elements), in two parts:
/// with `ids` `Some((ids, ntok))`, the rows those tokens name, marked by [`rows_mark`], each once
/// however many tokens repeat it; with `None`, every row not marked. The two parts together
/// update each element of the table once, with `adamw_step`'s operations (one device function
/// in optim.cu), so they are its bits; the elements past the table are left to the caller.
pub fn adamw_rows<D: Device>(
    k: &Kernels<D>,
    cfg: &AdamConfig,
    step: u64,
    lr: f64,
    mult: f32,
    mask: &DecayMask<D>,
    mut params: D::ViewMut<'_>,
    grads: D::View<'_>,
    mut m: D::ViewMut<'_>,
    mut v: D::ViewMut<'_>,
    work: Option<D::ViewMut<'_>>,
    (marks, row_len): (&RowMarks<D>, usize),
    ids: Option<(&D::Ids, usize)>,
) -> Result<(), OptimError> {
    let n = mask.len;
    check_adam(k, n, lr, &params, k.dev.len(grads), &m, &v, work.as_ref())?;
    if marks.rows * row_len > n {
        return Err(OptimError::Length {
            what: "rows-first table",
            found: marks.rows * row_len,
            expected: n,
        });
    }
    let (count, rest, ids_ptr) = match ids {
        Some((ids, ntok)) => (ntok, 0, k.dev.ids_ptr(ids)),
        None => (marks.rows, 1, 0),
    };
    if count == 0 || row_len == 0 {
        return Ok(());
    }
    let work = opt_typed(k, work);
    let head = [
        Arg::Ptr(k.dev.ptr_mut(&mut params)),
        Arg::Ptr(k.dev.ptr(grads)),
        Arg::Ptr(k.dev.ptr_mut(&mut m)),
        Arg::Ptr(k.dev.ptr_mut(&mut v)),
        work,
        Arg::Ptr(k.dev.ids_ptr(&mask.bounds)),
        int(mask.count),
        Arg::Ptr(k.dev.ids_ptr(&marks.first)),
        Arg::Ptr(ids_ptr),
        int(count),
        int(row_len),
        Arg::I32(rest),
    ];
    let args = [&head[..], &adam_scalars(k, cfg, step, lr, mult)].concat();
    // ADAM_VEC (optim.cu) elements a thread, ⌈row_len / 4⌉ threads a row.
    k.dev
        .launch("adamw_rows", grid1(count * row_len.div_ceil(4)), &args);
    Ok(())
}

/// Refuses buffers that are not `n` long and a non-finite learning rate, as the host optimizers
/// do (`optim::check_step`).
fn check_lens(n: usize, lr: f64, lens: &[(&'static str, usize)]) -> Result<(), OptimError> {
    for &(what, found) in lens {
        if found != n {
            return Err(OptimError::Length {
                what,
                found,
                expected: n,
            });
        }
    }
    if !lr.is_finite() {
        return Err(OptimError::Config(format!("learning rate {lr}")));
    }
    Ok(())
}

/// The device pointer of an optional buffer (null when absent), e.g. SGD's momentum buffer.
fn opt_ptr<D: Device>(k: &Kernels<D>, v: Option<D::ViewMut<'_>>) -> u64 {
    v.map_or(0, |mut v| k.dev.ptr_mut(&mut v))
}

/// An optional typed buffer (null when absent): the half parameters a step writes.
fn opt_typed<D: Device>(k: &Kernels<D>, v: Option<D::ViewMut<'_>>) -> Arg {
    v.map_or(Arg::Typed(0, Dtype::F32), |mut v| k.typed_mut(&mut v))
}

/// One SGD step on the device: `params` (and the momentum buffer, when μ ≠ 0) updated from
/// `grads · mult` exactly as [`crate::optim::Sgd::step`] updates them. `step` counts this step
/// (1 first: torch starts the buffer from the gradient then). `mult`, `work`: as
/// [`adamw_step`].
pub fn sgd_step<D: Device>(
    k: &Kernels<D>,
    cfg: &SgdConfig,
    step: u64,
    lr: f64,
    mult: f32,
    mask: &DecayMask<D>,
    mut params: D::ViewMut<'_>,
    grads: D::View<'_>,
    momentum: Option<D::ViewMut<'_>>,
    work: Option<D::ViewMut<'_>>,
) -> Result<(), OptimError> {
    let n = mask.len;
    let s = cfg.scalars(lr);
    let buf_len = momentum.as_ref().map(|b| k.dev.len_mut(b));
    if buf_len.is_some() != s.momentum {
        return Err(OptimError::Config(format!(
            "momentum {} with{} a momentum buffer",
            cfg.momentum,
            if buf_len.is_some() { "" } else { "out" }
        )));
    }
    check_lens(
        n,
        lr,
        &[
            ("params", k.dev.len_mut(&params)),
            ("grads", k.dev.len(grads)),
            ("momentum_buffer", buf_len.unwrap_or(n)),
            ("work", work.as_ref().map_or(n, |w| k.dev.len_mut(w))),
        ],
    )?;
    k.dev.launch(
        "sgd_step",
        grid1(n),
        &[
            Arg::Ptr(k.dev.ptr_mut(&mut params)),
            Arg::Ptr(k.dev.ptr(grads)),
            Arg::Ptr(opt_ptr(k, momentum)),
            opt_typed(k, work),
            Arg::Ptr(k.dev.ids_ptr(&mask.bounds)),
            int(mask.count),
            int(n),
            Arg::F32(mult),
            Arg::I32(s.decay.into()),
            Arg::F32(s.wd),
            Arg::I32(s.momentum.into()),
            Arg::F32(s.mu),
            Arg::F32(s.keep),
            Arg::I32((step == 1).into()),
            Arg::I32(cfg.nesterov.into()),
            Arg::F32(s.neg_lr),
            k.store_arg(),
        ],
    );
    Ok(())
}

/// One Adagrad step on the device (either class of [`crate::optim::AdagradImpl`]): `params` and
/// `sum` updated from `grads · mult` exactly as [`crate::optim::Adagrad::step`] updates them.
/// `step` counts this step (1 first); `mult`, `work`: as [`adamw_step`].
pub fn adagrad_step<D: Device>(
    k: &Kernels<D>,
    cfg: &AdagradConfig,
    step: u64,
    lr: f64,
    mult: f32,
    mask: &DecayMask<D>,
    mut params: D::ViewMut<'_>,
    grads: D::View<'_>,
    mut sum: D::ViewMut<'_>,
    work: Option<D::ViewMut<'_>>,
) -> Result<(), OptimError> {
    let n = mask.len;
    check_lens(
        n,
        lr,
        &[
            ("params", k.dev.len_mut(&params)),
            ("grads", k.dev.len(grads)),
            ("sum", k.dev.len_mut(&sum)),
            ("work", work.as_ref().map_or(n, |w| k.dev.len_mut(w))),
        ],
    )?;
    let s = cfg.scalars(step, lr);
    k.dev.launch(
        "adagrad_step",
        grid1(n),
        &[
            Arg::Ptr(k.dev.ptr_mut(&mut params)),
            Arg::Ptr(k.dev.ptr(grads)),
            Arg::Ptr(k.dev.ptr_mut(&mut sum)),
            opt_typed(k, work),
            Arg::Ptr(k.dev.ids_ptr(&mask.bounds)),
            int(mask.count),
            int(n),
            Arg::F32(mult),
            Arg::I32(s.decay.into()),
            Arg::F32(s.wd),
            Arg::F32(s.eps),
            Arg::F32(s.neg_lr),
            Arg::I32((cfg.imp == AdagradImpl::DeepSpeedCpu).into()),
            k.store_arg(),
        ],
    );
    Ok(())
}

/// Threads of LAMB's norm blocks (`LAMB_THREADS` in optim.cu; lamb.rs `THREADS`, FusedLamb's
/// `threadsPerBlock`), also the most blocks one tensor's norm takes.
const LAMB_THREADS: usize = 512;

/// LAMB's per-tensor layout on the device and the scratch of its step, built once per optimizer:
/// the tensors' bounds, the first norm block of each (`min(⌈len/512⌉, 512)` blocks per tensor,
/// as lamb.rs sums), the update `u`, the blocks' partial sums and the trust ratios.
pub struct LambTensors<D: Device> {
    /// Each tensor's start, then the buffer's end.
    tensors: D::Ids,
    /// Each tensor's first norm block, then the total.
    blocks: D::Ids,
    count: usize,
    total_blocks: usize,
    update: D::Buf,
    partial: D::Buf,
    coeffs: D::Buf,
}

impl<D: Device> LambTensors<D> {
    /// The layout of a buffer of `len` elements tiled by `segments` (LAMB's: one per tensor,
    /// ascending, covering it all: [`crate::optim::Lamb`] refuses partitions).
    pub fn new(
        k: &Kernels<D>,
        segments: &[(Range<usize>, bool)],
        len: usize,
    ) -> Result<LambTensors<D>, OptimError> {
        let (mut tensors, mut blocks) = (Vec::new(), Vec::new());
        let (mut end, mut total) = (0usize, 0usize);
        for (r, _) in segments {
            if r.start != end {
                return Err(OptimError::Config(format!(
                    "LAMB's tensors must tile the buffer: {r:?} after {end}"
                )));
            }
            tensors.push(r.start);
            blocks.push(total);
            total += r.len().div_ceil(LAMB_THREADS).min(LAMB_THREADS);
            end = r.end;
        }
        if end != len {
            return Err(OptimError::Config(format!(
                "LAMB's tensors cover {end} of {len} elements"
            )));
        }
        tensors.push(len);
        blocks.push(total);
        let ids = |v: Vec<usize>| -> Result<Vec<u32>, OptimError> {
            v.into_iter()
                .map(|x| u32::try_from(x).map_err(|_| OptimError::Config(format!("{x} elements"))))
                .collect()
        };
        Ok(LambTensors {
            tensors: k.dev.upload_ids(&ids(tensors)?),
            blocks: k.dev.upload_ids(&ids(blocks)?),
            count: segments.len(),
            total_blocks: total,
            update: k.dev.alloc(len.max(1)),
            partial: k.dev.alloc(2 * total.max(1)),
            coeffs: k.dev.alloc(segments.len().max(1)),
        })
    }

    /// The trust ratio each tensor got at the last step ([`crate::optim::Lamb::coefficients`]).
    pub fn coefficients(&self, k: &Kernels<D>) -> Vec<f32> {
        let mut c = vec![0.0f32; self.count.max(1)];
        k.dev.download(k.dev.view(&self.coeffs), &mut c);
        c.truncate(self.count);
        c
    }
}

/// One LAMB step on the device: `params`, `m` and `v` updated from `(grads · mult) / div`
/// exactly as [`crate::optim::Lamb::step_with_scale`]`(…, div)` updates them from gradients
/// already multiplied by `mult` ([`crate::optim::Optimizer::grad_factors`]), every tensor's trust
/// ratio left in `tensors`. `step` counts this step (1 first); `work`: as [`adamw_step`].
pub fn lamb_step<D: Device>(
    k: &Kernels<D>,
    cfg: &LambConfig,
    step: u64,
    lr: f64,
    (mult, div): (f32, f32),
    mask: &DecayMask<D>,
    tensors: &mut LambTensors<D>,
    mut params: D::ViewMut<'_>,
    grads: D::View<'_>,
    mut m: D::ViewMut<'_>,
    mut v: D::ViewMut<'_>,
    work: Option<D::ViewMut<'_>>,
) -> Result<(), OptimError> {
    let n = mask.len;
    check_lens(
        n,
        lr,
        &[
            ("params", k.dev.len_mut(&params)),
            ("grads", k.dev.len(grads)),
            ("exp_avg", k.dev.len_mut(&m)),
            ("exp_avg_sq", k.dev.len_mut(&v)),
            ("work", work.as_ref().map_or(n, |w| k.dev.len_mut(w))),
        ],
    )?;
    if !(div > 0.0 && div.is_finite()) {
        return Err(OptimError::Config(format!("gradient scale {div}")));
    }
    if n == 0 {
        return Ok(());
    }
    let s = cfg.scalars(step, lr);
    let t = &mut *tensors;
    let param = k.dev.ptr_mut(&mut params);
    let update = k.dev.ptr_mut(&mut k.dev.range_mut(&mut t.update, 0..n));
    let partial = k
        .dev
        .ptr_mut(&mut k.dev.range_mut(&mut t.partial, 0..2 * t.total_blocks));
    let coeffs = k
        .dev
        .ptr_mut(&mut k.dev.range_mut(&mut t.coeffs, 0..t.count));
    let (tensor_at, block_at) = (k.dev.ids_ptr(&t.tensors), k.dev.ids_ptr(&t.blocks));
    k.dev.launch(
        "lamb_update",
        grid1(n),
        &[
            Arg::Ptr(update),
            Arg::Ptr(param),
            Arg::Ptr(k.dev.ptr(grads)),
            Arg::Ptr(k.dev.ptr_mut(&mut m)),
            Arg::Ptr(k.dev.ptr_mut(&mut v)),
            Arg::Ptr(k.dev.ids_ptr(&mask.bounds)),
            int(mask.count),
            int(n),
            Arg::F32(mult),
            Arg::F32(div),
            Arg::F32(s.b1),
            Arg::F32(s.w1),
            Arg::F32(s.b2),
            Arg::F32(s.w2),
            Arg::F32(s.eps),
            Arg::F32(s.wd),
        ],
    );
    let per_block = |grid: usize| Launch {
        grid: (grid as u32, 1, 1),
        block: (LAMB_THREADS as u32, 1, 1),
        smem: 0,
    };
    k.dev.launch(
        "lamb_norms",
        per_block(t.total_blocks),
        &[
            Arg::Ptr(partial),
            Arg::Ptr(param),
            Arg::Ptr(update),
            Arg::Ptr(tensor_at),
            Arg::Ptr(block_at),
            int(t.count),
        ],
    );
    k.dev.launch(
        "lamb_coeff",
        per_block(t.count),
        &[
            Arg::Ptr(coeffs),
            Arg::Ptr(partial),
            Arg::Ptr(block_at),
            Arg::F32(s.max_coeff),
            Arg::F32(s.min_coeff),
        ],
    );
    k.dev.launch(
        "lamb_apply",
        grid1(n),
        &[
            Arg::Ptr(param),
            Arg::Ptr(update),
            opt_typed(k, work),
            Arg::Ptr(coeffs),
            Arg::Ptr(tensor_at),
            int(t.count),
            int(n),
            Arg::F32(s.step_size),
            k.store_arg(),
        ],
    );
    Ok(())
}
