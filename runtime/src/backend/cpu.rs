//! The CPU reference backend: plain loops (llm.c style) plus the `gemm` crate for GEMMs.
//!
//! Deterministic by construction: every reduction runs in a fixed order, and the optional threads
//! split only independent work (rows of a GEMM's output, sequences of an attention call, rows or
//! columns of the elementwise kernels, never one element's sum), so a result does not depend on the
//! thread count. Transcendental loops (GELU, softmax `exp`) use branch-free f32 approximations that
//! vectorise, and are compiled a second time for AVX2 (same bits, wider vectors).

use super::{Aside, AttnShape, Backend, Dropout, Gemm, QkvRows};
use crate::precision::Dtype;
use crate::rng::philox4x32_x8;

/// The CPU backend. `threads` (≥ 1) bounds the worker threads of GEMMs, attention, LayerNorm,
/// GELU and dropout.
///
/// `store` is the dtype a device would keep the model's tensors in (activations, parameters,
/// gradients): with fp16 or bf16 every value a kernel writes is rounded to it when the kernel
/// returns, while the kernel's own arithmetic stays in f32 (see [`crate::precision`]). The
/// exceptions are LayerNorm's saved mean and 1/std, which PyTorch keeps in fp32 for half inputs,
/// and the loss, which is returned in f32.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cpu {
    threads: usize,
    store: Dtype,
}

impl Default for Cpu {
    /// Single-threaded, fp32.
    fn default() -> Cpu {
        Cpu {
            threads: 1,
            store: Dtype::F32,
        }
    }
}

impl Cpu {
    /// A backend using up to `threads` threads (0 is taken as 1), storing fp32.
    pub fn new(threads: usize) -> Cpu {
        Cpu {
            threads: threads.max(1),
            store: Dtype::F32,
        }
    }

    /// The same backend storing `store`.
    pub fn with_store(self, store: Dtype) -> Cpu {
        Cpu { store, ..self }
    }

    /// The thread bound.
    pub fn threads(&self) -> usize {
        self.threads
    }

    /// The storage dtype.
    pub fn store(&self) -> Dtype {
        self.store
    }

    /// Rounds what a kernel wrote to the storage dtype.
    #[inline]
    fn st(&self, xs: &mut [f32]) {
        if self.store.is_half() {
            self.store.round_slice(xs);
        }
    }

    /// Rounds rows `0..rows`, columns `0..cols` of a matrix with row stride `ld`.
    fn st_rows(&self, xs: &mut [f32], rows: usize, cols: usize, ld: usize) {
        if self.store.is_half() {
            for r in 0..rows {
                self.store.round_slice(&mut xs[r * ld..r * ld + cols]);
            }
        }
    }

    /// Rounds the rows `idx` (each `width` wide, duplicates allowed) of a table.
    fn st_table_rows(&self, table: &mut [f32], idx: impl Iterator<Item = usize>, width: usize) {
        if self.store.is_half() {
            let mut rows: Vec<usize> = idx.collect();
            rows.sort_unstable();
            rows.dedup();
            for r in rows {
                self.store
                    .round_slice(&mut table[r * width..(r + 1) * width]);
            }
        }
    }
}

/// Runs `f` on every item, spreading contiguous groups of items over up to `threads` threads.
/// Items are independent, so the grouping cannot change any result.
fn par_each<T: Send>(threads: usize, items: Vec<T>, f: impl Fn(T) + Sync) {
    if threads <= 1 || items.len() <= 1 {
        items.into_iter().for_each(f);
        return;
    }
    let per = items.len().div_ceil(threads);
    let mut groups: Vec<Vec<T>> = Vec::new();
    let mut it = items.into_iter().peekable();
    while it.peek().is_some() {
        groups.push(it.by_ref().take(per).collect());
    }
    let f = &f;
    std::thread::scope(|s| {
        let mut groups = groups.into_iter();
        let first = groups.next();
        for g in groups {
            s.spawn(move || g.into_iter().for_each(f));
        }
        // The calling thread does a share too rather than idling.
        if let Some(g) = first {
            g.into_iter().for_each(f);
        }
    });
}

/// `C = alpha·A·B + beta·C` with arbitrary element strides, bounds-checked so the unsafe call
/// cannot read or write outside the slices.
///
/// A row of `C` comes out the same whatever other rows share the call: the threads split the rows
/// of one product, and the evaluation forward runs the last layer on the `[CLS]` rows only. The
/// `gemm` crate's general kernel has that property (its K blocking depends on `k` alone), but it
/// takes shape-dependent shortcuts for one row, small outputs and small `m` and `n` with long `k`
/// (other summation orders); a call that could take one is padded with rows until it cannot.
#[allow(clippy::too_many_arguments)]
fn sgemm(
    m: usize,
    k: usize,
    n: usize,
    alpha: f32,
    a: &[f32],
    (rsa, csa): (usize, usize),
    b: &[f32],
    (rsb, csb): (usize, usize),
    beta: f32,
    c: &mut [f32],
    (rsc, csc): (usize, usize),
) {
    if m == 0 || n == 0 {
        return;
    }
    let last = |r: usize, c: usize, rs: usize, cs: usize| (r - 1) * rs + (c - 1) * cs;
    assert!(last(m, n, rsc, csc) < c.len(), "gemm: C out of bounds");
    if k > 0 {
        assert!(last(m, k, rsa, csa) < a.len(), "gemm: A out of bounds");
        assert!(last(k, n, rsb, csb) < b.len(), "gemm: B out of bounds");
    }
    let rows = general_kernel_rows(n, k);
    if m >= rows || n <= 1 || k <= 2 {
        // SAFETY: the asserts above keep every accessed element inside the slices.
        unsafe {
            gemm_raw(
                m,
                k,
                n,
                alpha,
                a,
                (rsa, csa),
                b,
                (rsb, csb),
                beta,
                c,
                (rsc, csc),
            )
        };
        return;
    }
    let mut ap = vec![0.0f32; rows * k];
    let mut cp = vec![0.0f32; rows * n];
    for i in 0..m {
        for p in 0..k {
            ap[i * k + p] = a[i * rsa + p * csa];
        }
        if beta != 0.0 {
            for j in 0..n {
                cp[i * n + j] = c[i * rsc + j * csc];
            }
        }
    }
    // SAFETY: `ap` and `cp` are dense `rows × k` and `rows × n`; `b` was checked above.
    unsafe {
        gemm_raw(
            rows,
            k,
            n,
            alpha,
            &ap,
            (k, 1),
            b,
            (rsb, csb),
            beta,
            &mut cp,
            (n, 1),
        )
    };
    for i in 0..m {
        for j in 0..n {
            c[i * rsc + j * csc] = cp[i * n + j];
        }
    }
}

/// The fewest rows for which `gemm` 0.18 runs its general kernel on an `n`-column, `k`-deep
/// product: more than one row (GEMV), more than 256 outputs (dot-product kernels) and, with
/// `n ≤ 64` and `k > 512`, more than 64 rows (a K blocking of its own).
fn general_kernel_rows(n: usize, k: usize) -> usize {
    let mut rows = (256 / n + 1).max(2);
    if n <= 64 && k > 512 {
        rows = rows.max(65);
    }
    rows
}

/// `gemm::gemm` single-threaded (the callers split rows themselves; it never splits K).
///
/// # Safety
/// Every element the strides reach must lie inside the slices.
#[allow(clippy::too_many_arguments)]
unsafe fn gemm_raw(
    m: usize,
    k: usize,
    n: usize,
    alpha: f32,
    a: &[f32],
    (rsa, csa): (usize, usize),
    b: &[f32],
    (rsb, csb): (usize, usize),
    beta: f32,
    c: &mut [f32],
    (rsc, csc): (usize, usize),
) {
    // `c` is borrowed mutably, so it cannot alias `a` or `b`; strides fit in isize for any real
    // allocation. gemm's own `alpha` scales the old C and its `beta` the product.
    gemm::gemm(
        m,
        n,
        k,
        c.as_mut_ptr(),
        csc as isize,
        rsc as isize,
        beta != 0.0,
        a.as_ptr(),
        csa as isize,
        rsa as isize,
        b.as_ptr(),
        csb as isize,
        rsb as isize,
        beta,
        alpha,
        false,
        false,
        false,
        gemm::Parallelism::None,
    );
}

/// `erfc(x)` with fractional error below 1.2e-7 everywhere (the Chebyshev-fitted formula of
/// Press et al., *Numerical Recipes*, section 6.2), evaluated in f64: that is about one f32 ulp, as good
/// as PyTorch's f32 `erf`, with one `exp` per call.
pub fn erfc(x: f64) -> f64 {
    let z = x.abs();
    let t = 1.0 / (1.0 + 0.5 * z);
    let poly = -z * z - 1.265_512_23
        + t * (1.000_023_68
            + t * (0.374_091_96
                + t * (0.096_784_18
                    + t * (-0.186_288_06
                        + t * (0.278_868_07
                            + t * (-1.135_203_98
                                + t * (1.488_515_87 + t * (-0.822_152_23 + t * 0.170_872_77))))))));
    let r = t * poly.exp();
    if x >= 0.0 {
        r
    } else {
        2.0 - r
    }
}

/// Compiles `$body` (an `#[inline(always)]` fn) a second time with AVX2 enabled and calls that
/// copy when the CPU has it. Only the vector width changes: Rust never contracts `a·b + c` into an
/// FMA on its own, so both copies compute the same bits.
macro_rules! wide_dispatch {
    ($(#[$m:meta])* fn $name:ident => $body:ident ($($arg:ident : $ty:ty),* $(,)?)) => {
        $(#[$m])*
        fn $name($($arg: $ty),*) {
            #[cfg(target_arch = "x86_64")]
            {
                #[target_feature(enable = "avx2")]
                unsafe fn wide($($arg: $ty),*) {
                    $body($($arg),*)
                }
                if std::arch::is_x86_feature_detected!("avx2") {
                    // SAFETY: the CPU supports AVX2, the only feature `wide` was compiled for.
                    unsafe { wide($($arg),*) };
                    return;
                }
            }
            $body($($arg),*)
        }
    };
}

/// `e^x` in f32, branch-free so loops of it vectorise (Cephes `expf`: Cody–Waite reduction by
/// ln 2, degree-6 polynomial, about 1 ulp). Below −87 the result is exactly 0.
#[inline(always)]
fn exp_f32(x: f32) -> f32 {
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    const C1: f32 = 0.693_359_4; // ln 2 split: C1 has 9 significant bits, so n·C1 is exact
    const C2: f32 = -2.121_944_400_546_905_8e-4_f64 as f32;
    const MAGIC: f32 = 12_582_912.0; // 1.5·2²³: adding it rounds to an integer
    const P: [f32; 6] = [
        1.987_569_150_0e-4_f64 as f32,
        1.398_199_950_7e-3_f64 as f32,
        8.333_451_907_3e-3_f64 as f32,
        4.166_579_589_4e-2_f64 as f32,
        1.666_666_545_9e-1_f64 as f32,
        5.000_000_120_1e-1_f64 as f32,
    ];
    let xc = x.clamp(-87.0, 88.0);
    let t = xc * LOG2E + MAGIC;
    let n = t - MAGIC;
    let r = xc - n * C1 - n * C2;
    let mut p = P[0];
    for c in &P[1..] {
        p = p * r + c;
    }
    let y = p * r * r + r + 1.0;
    let ni = (t.to_bits() as i32).wrapping_sub(0x4B40_0000);
    let v = y * f32::from_bits(((ni + 127) << 23) as u32);
    if x < -87.0 {
        0.0
    } else {
        v
    }
}

/// `erfc(z)` for `z ≥ 0` in f32: the formula of [`erfc`] (fractional error 1.2e-7) evaluated in
/// f32 with [`exp_f32`], a few ulp in all.
#[inline(always)]
fn erfc_pos_f32(z: f32) -> f32 {
    const C: [f32; 10] = [
        0.170_872_77_f64 as f32,
        -0.822_152_23_f64 as f32,
        1.488_515_87_f64 as f32,
        -1.135_203_98_f64 as f32,
        0.278_868_07_f64 as f32,
        -0.186_288_06_f64 as f32,
        0.096_784_18_f64 as f32,
        0.374_091_96_f64 as f32,
        1.000_023_68_f64 as f32,
        -1.265_512_23_f64 as f32,
    ];
    let t = 1.0 / (1.0 + 0.5 * z);
    let mut p = C[0];
    for c in &C[1..] {
        p = p * t + c;
    }
    t * exp_f32(p - z * z)
}

/// Φ(x) in f32 via [`erfc_pos_f32`] (no cancellation for negative `x`).
#[inline(always)]
fn phi_cdf_f32(x: f32) -> f32 {
    let r = erfc_pos_f32(x.abs() * std::f32::consts::FRAC_1_SQRT_2);
    if x > 0.0 {
        1.0 - 0.5 * r
    } else {
        0.5 * r
    }
}

#[inline(always)]
fn gelu_fwd_body(out: &mut [f32], inp: &[f32]) {
    for (o, &x) in out.iter_mut().zip(inp) {
        *o = x * phi_cdf_f32(x);
    }
}

#[inline(always)]
fn gelu_bwd_body(dinp: &mut [f32], inp: &[f32], dout: &[f32]) {
    let inv_sqrt_2pi =
        (0.5 * std::f64::consts::FRAC_2_SQRT_PI * std::f64::consts::FRAC_1_SQRT_2) as f32;
    for ((di, &x), &g) in dinp.iter_mut().zip(inp).zip(dout) {
        let pdf = exp_f32(-0.5 * x * x) * inv_sqrt_2pi;
        *di = g * (phi_cdf_f32(x) + x * pdf);
    }
}

wide_dispatch!(fn gelu_fwd_f32 => gelu_fwd_body(out: &mut [f32], inp: &[f32]));
wide_dispatch!(fn gelu_bwd_f32 => gelu_bwd_body(dinp: &mut [f32], inp: &[f32], dout: &[f32]));

/// Softmax of each `t`-wide row of `p` in place, after adding `f32::MIN` to the scores of masked
/// keys (HF's additive mask).
#[inline(always)]
fn softmax_rows_body(p: &mut [f32], t: usize, mask: &[u32]) {
    for row in p.chunks_mut(t) {
        for (x, &m) in row.iter_mut().zip(mask) {
            if m == 0 {
                *x += f32::MIN;
            }
        }
        let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        for x in row.iter_mut() {
            *x = exp_f32(*x - max);
        }
        let sum: f32 = row.iter().sum();
        for x in row.iter_mut() {
            *x /= sum;
        }
    }
}

wide_dispatch!(fn softmax_rows => softmax_rows_body(p: &mut [f32], t: usize, mask: &[u32]));

/// The key of one dropout mask: element `idx` is kept iff word `idx % 4` of the Philox block
/// `idx / 4` of stream `d.stream` is at least `⌈p · 2³²⌉` (i.e. uniform ≥ p).
#[derive(Clone, Copy)]
struct MaskKey {
    key: [u32; 2],
    stream: u64,
    /// `⌈p · 2³²⌉`; below 2³² for every f32 `p < 1`.
    threshold: u32,
    scale: f32,
}

impl MaskKey {
    fn new(d: &Dropout) -> MaskKey {
        MaskKey {
            key: [d.seed as u32, (d.seed >> 32) as u32],
            stream: d.stream,
            threshold: (f64::from(d.p) * 4_294_967_296.0).ceil() as u32,
            scale: 1.0 / (1.0 - d.p),
        }
    }
}

/// `x[i] *= multiplier(first + i)`: 0 (dropped) or `1 / (1 - p)`. Draws eight Philox blocks (32
/// elements) at a time.
#[inline(always)]
fn dropout_body(x: &mut [f32], first: u64, m: MaskKey) {
    let end = first + x.len() as u64;
    let mut words = [0u32; 32];
    let mut e0 = first / 32 * 32;
    while e0 < end {
        philox4x32_x8(e0 / 4, m.stream, m.key, &mut words);
        let (lo, hi) = (e0.max(first), (e0 + 32).min(end));
        let xs = &mut x[(lo - first) as usize..(hi - first) as usize];
        let ws = &words[(lo - e0) as usize..(hi - e0) as usize];
        for (v, &w) in xs.iter_mut().zip(ws) {
            *v *= if w >= m.threshold { m.scale } else { 0.0 };
        }
        e0 += 32;
    }
}

wide_dispatch!(fn dropout_at => dropout_body(x: &mut [f32], first: u64, m: MaskKey));

/// Elements per thread below which an elementwise kernel stays on one thread.
const PAR_MIN: usize = 1 << 15;

/// Runs `f(first_unit, chunk)` over contiguous chunks of `data` (whole `unit`s each), on up to
/// `threads` threads when there is enough work. Units are independent, so the split cannot
/// change any result.
fn par_chunks<T: Send>(
    threads: usize,
    data: &mut [T],
    unit: usize,
    f: impl Fn(usize, &mut [T]) + Sync,
) {
    let units = data.len() / unit.max(1);
    let threads = threads.min(data.len() / PAR_MIN).max(1);
    if threads <= 1 || units <= 1 {
        f(0, data);
        return;
    }
    let per = units.div_ceil(threads);
    let items: Vec<_> = data.chunks_mut(per * unit).enumerate().collect();
    par_each(threads, items, |(i, c)| f(i * per, c));
}

impl Cpu {
    /// One sequence of [`Backend::attention_fwd`].
    #[allow(clippy::too_many_arguments)]
    fn attn_fwd_one(
        &self,
        bi: usize,
        ctx: &mut [f32],
        probs: &mut [f32],
        mut probs_drop: Option<&mut [f32]>,
        q: &[f32],
        k: &[f32],
        v: &[f32],
        mask: &[u32],
        s: AttnShape,
        dropout: Option<&Dropout>,
    ) {
        let (t, d, hid) = (s.seq, s.head_dim, s.heads * s.head_dim);
        let scale = (1.0 / (d as f64).sqrt()) as f32;
        let base = bi * t * hid;
        let mask = &mask[bi * t..(bi + 1) * t];
        for h in 0..s.heads {
            let p = &mut probs[h * t * t..(h + 1) * t * t];
            let off = base + h * d;
            // scores = (q · kᵀ) · scale
            sgemm(
                t,
                d,
                t,
                scale,
                &q[off..],
                (hid, 1),
                &k[off..],
                (1, hid),
                0.0,
                p,
                (t, 1),
            );
            softmax_rows(p, t, mask);
            // The scores stay in f32 inside the (fused) kernel; the saved probabilities are stored.
            self.st(p);
            let used: &[f32] = match (probs_drop.as_deref_mut(), dropout) {
                (Some(pd), Some(dr)) => {
                    let pd = &mut pd[h * t * t..(h + 1) * t * t];
                    let first = ((bi * s.heads + h) * t * t) as u64;
                    pd.copy_from_slice(p);
                    dropout_at(pd, first, MaskKey::new(dr));
                    self.st(pd);
                    pd
                }
                _ => p,
            };
            sgemm(
                t,
                t,
                d,
                1.0,
                used,
                (t, 1),
                &v[off..],
                (hid, 1),
                0.0,
                &mut ctx[h * d..],
                (hid, 1),
            );
            self.st_rows(&mut ctx[h * d..], t, d, hid);
        }
    }

    /// One sequence of [`Backend::attention_bwd`].
    /// [`Backend::bias_grad`]'s sums over `rows` rows `ld` apart: each chunk of
    /// [`super::BIAS_ROWS`] rows in order from zero, then the chunks' sums added to `db` in
    /// order, and `db` rounded.
    fn bias_grad_rows(&self, db: &mut [f32], dout: &[f32], rows: usize, cols: usize, ld: usize) {
        assert_eq!(db.len(), cols);
        assert!(ld >= cols, "bias_grad: rows {ld} apart, {cols} wide");
        let mut part = vec![0.0f32; cols];
        for r0 in (0..rows).step_by(super::BIAS_ROWS) {
            part.fill(0.0);
            for r in r0..rows.min(r0 + super::BIAS_ROWS) {
                for (p, d) in part.iter_mut().zip(&dout[r * ld..r * ld + cols]) {
                    *p += d;
                }
            }
            for (g, p) in db.iter_mut().zip(&part) {
                *g += p;
            }
        }
        self.st(db);
    }

    /// Sequence `bi`'s attention backward: `out` its rows of [`Backend::attention_bwd`]'s
    /// `dqkv` (`seq` of them, `o.ld` apart), `scratch` its `[heads, seq, seq]` room.
    #[allow(clippy::too_many_arguments)]
    fn attn_bwd_one(
        &self,
        bi: usize,
        (out, o, scratch): (&mut [f32], QkvRows, &mut [f32]),
        dctx: &[f32],
        q: &[f32],
        k: &[f32],
        v: &[f32],
        probs: &[f32],
        probs_drop: Option<&[f32]>,
        s: AttnShape,
        dropout: Option<&Dropout>,
    ) {
        let (t, d, hid) = (s.seq, s.head_dim, s.heads * s.head_dim);
        let scale = (1.0 / (d as f64).sqrt()) as f32;
        let base = bi * t * hid;
        for h in 0..s.heads {
            let hp = (bi * s.heads + h) * t * t;
            let p = &probs[hp..hp + t * t];
            let pd = probs_drop.map_or(p, |x| &x[hp..hp + t * t]);
            let ds = &mut scratch[h * t * t..(h + 1) * t * t];
            let off = base + h * d;
            // d(probs_drop) = dctx · vᵀ
            sgemm(
                t,
                d,
                t,
                1.0,
                &dctx[off..],
                (hid, 1),
                &v[off..],
                (1, hid),
                0.0,
                ds,
                (t, 1),
            );
            // dv = probs_dropᵀ · dctx
            let [cq, ck, cv] = o.cols.map(|c| c + h * d);
            sgemm(
                t,
                t,
                d,
                1.0,
                pd,
                (1, t),
                &dctx[off..],
                (hid, 1),
                0.0,
                &mut out[cv..],
                (o.ld, 1),
            );
            self.st_rows(&mut out[cv..], t, d, o.ld);
            if let Some(dr) = dropout {
                // The forward's mask, read back from probs_drop instead of redrawn: a zero there
                // is either dropped or a zero probability, and for the latter the softmax
                // backward below multiplies by that zero anyway, so the result is the same.
                let scale = 1.0 / (1.0 - dr.p);
                for (x, &q) in ds.iter_mut().zip(pd) {
                    *x = if q != 0.0 { *x * scale } else { 0.0 };
                }
            }
            // softmax backward: ds = p ⊙ (dp − Σ_j dp·p), stored (rounded to the half type in
            // fp16/bf16) for the two products below, as PyTorch's half module stores the
            // softmax's gradient (eager attention) and flash attention converts dS to half for
            // its dQ and dK products (docs/runtime.md, "Mixed precision").
            for (drow, prow) in ds.chunks_mut(t).zip(p.chunks(t)) {
                let dot: f32 = drow.iter().zip(prow).map(|(a, b)| a * b).sum();
                for (x, &pv) in drow.iter_mut().zip(prow) {
                    *x = pv * (*x - dot);
                }
            }
            self.st_rows(ds, t, t, t);
            // dq = scale · ds · k ;  dk = scale · dsᵀ · q
            sgemm(
                t,
                t,
                d,
                scale,
                ds,
                (t, 1),
                &k[off..],
                (hid, 1),
                0.0,
                &mut out[cq..],
                (o.ld, 1),
            );
            self.st_rows(&mut out[cq..], t, d, o.ld);
            sgemm(
                t,
                t,
                d,
                scale,
                ds,
                (1, t),
                &q[off..],
                (hid, 1),
                0.0,
                &mut out[ck..],
                (o.ld, 1),
            );
            self.st_rows(&mut out[ck..], t, d, o.ld);
        }
    }
}

/// The CPU's projections add their biases themselves ([`Backend::attention_adds_bias`]).
const NO_QKV_BIAS: &str = "the CPU's attention takes q, k and v with their biases";

impl Backend for Cpu {
    crate::host_memory!();

    fn add_assign(&self, acc: &mut [f32], x: &[f32]) {
        assert_eq!(acc.len(), x.len());
        for (a, b) in acc.iter_mut().zip(x) {
            *a += b;
        }
        self.st(acc);
    }

    fn gemm(&self, g: &Gemm, a: &[f32], b: &[f32], c: &mut [f32]) {
        let sa = if g.trans_a { (1, g.lda) } else { (g.lda, 1) };
        let sb = if g.trans_b { (1, g.ldb) } else { (g.ldb, 1) };
        // Split the rows of C over threads only when each share is a sizeable GEMM of its own.
        let work = g.m * g.n * g.k;
        let threads = if work >= 1 << 21 { self.threads } else { 1 };
        if threads <= 1 || g.m < 64 * threads {
            sgemm(g.m, g.k, g.n, g.alpha, a, sa, b, sb, g.beta, c, (g.ldc, 1));
            self.st_rows(c, g.m, g.n, g.ldc);
            return;
        }
        let rows = g.m.div_ceil(threads).next_multiple_of(16);
        let mut parts = Vec::new();
        let mut rest: &mut [f32] = c;
        let mut r0 = 0;
        while r0 < g.m {
            let r = rows.min(g.m - r0);
            let take = if r0 + r == g.m { rest.len() } else { r * g.ldc };
            let (head, tail) = std::mem::take(&mut rest).split_at_mut(take);
            parts.push((r0, r, head));
            rest = tail;
            r0 += r;
        }
        par_each(threads, parts, |(r0, r, cpart)| {
            sgemm(
                r,
                g.k,
                g.n,
                g.alpha,
                &a[r0 * sa.0..],
                sa,
                b,
                sb,
                g.beta,
                cpart,
                (g.ldc, 1),
            );
            self.st_rows(cpart, r, g.n, g.ldc);
        });
    }

    // add_bias, bias_grad and add_assign stay on one thread: they are memory-bound, and each
    // thread fork/join is a barrier that costs more than it saves on a loaded machine.
    fn add_bias(&self, out: &mut [f32], bias: &[f32], rows: usize, cols: usize) {
        assert_eq!(bias.len(), cols);
        for row in out[..rows * cols].chunks_mut(cols) {
            for (o, b) in row.iter_mut().zip(bias) {
                *o += b;
            }
        }
        self.st(&mut out[..rows * cols]);
    }

    fn bias_grad(&self, db: &mut [f32], dout: &[f32], rows: usize, cols: usize) {
        self.bias_grad_rows(db, dout, rows, cols, cols);
    }

    fn bias_grad_items(
        &self,
        db: &mut [f32],
        dout: &[f32],
        rows: usize,
        cols: usize,
        ld: usize,
        count: usize,
        dout_stride: usize,
        db_stride: usize,
    ) {
        for j in 0..count {
            let (o, b) = (j * dout_stride, j * db_stride);
            self.bias_grad_rows(&mut db[b..b + cols], &dout[o..], rows, cols, ld);
        }
    }

    fn embedding_fwd(
        &self,
        out: &mut [f32],
        ids: &Vec<u32>,
        types: &Vec<u32>,
        word: &[f32],
        pos: &[f32],
        typ: &[f32],
        batch: usize,
        seq: usize,
        hidden: usize,
    ) {
        for i in 0..batch * seq {
            let (w, t) = (ids[i] as usize, types[i] as usize);
            let p = i % seq;
            let o = &mut out[i * hidden..(i + 1) * hidden];
            for c in 0..hidden {
                // Same association as HF: (word + token_type) + position.
                o[c] = (word[w * hidden + c] + typ[t * hidden + c]) + pos[p * hidden + c];
            }
        }
        self.st(&mut out[..batch * seq * hidden]);
    }

    fn embedding_bwd(
        &self,
        dword: &mut [f32],
        dpos: &mut [f32],
        dtyp: &mut [f32],
        dout: &[f32],
        ids: &Vec<u32>,
        types: &Vec<u32>,
        batch: usize,
        seq: usize,
        hidden: usize,
    ) {
        for i in 0..batch * seq {
            let (w, t, p) = (ids[i] as usize, types[i] as usize, i % seq);
            let g = &dout[i * hidden..(i + 1) * hidden];
            for c in 0..hidden {
                dword[w * hidden + c] += g[c];
                dtyp[t * hidden + c] += g[c];
                dpos[p * hidden + c] += g[c];
            }
        }
        let n = batch * seq;
        self.st_table_rows(dword, ids[..n].iter().map(|&i| i as usize), hidden);
        self.st_table_rows(dtyp, types[..n].iter().map(|&i| i as usize), hidden);
        self.st_table_rows(dpos, 0..seq.min(n), hidden);
    }

    fn layernorm_fwd(
        &self,
        out: &mut [f32],
        mean: &mut [f32],
        rstd: &mut [f32],
        inp: &[f32],
        w: &[f32],
        b: &[f32],
        rows: usize,
        cols: usize,
        eps: f32,
    ) {
        let (out, mean, rstd) = (
            &mut out[..rows * cols],
            &mut mean[..rows],
            &mut rstd[..rows],
        );
        let threads = self.threads.min(rows * cols / PAR_MIN).max(1);
        let per = rows.div_ceil(threads).max(1);
        let items: Vec<_> = out
            .chunks_mut(per * cols)
            .zip(mean.chunks_mut(per))
            .zip(rstd.chunks_mut(per))
            .enumerate()
            .collect();
        par_each(threads, items, |(i, ((out, mean), rstd))| {
            let r0 = i * per;
            for (r, ((o, mr), rr)) in out
                .chunks_mut(cols)
                .zip(mean.iter_mut())
                .zip(rstd.iter_mut())
                .enumerate()
            {
                let x = &inp[(r0 + r) * cols..(r0 + r + 1) * cols];
                // Two passes in f64: exact enough that the result is the correctly rounded f32.
                let m = x.iter().map(|&v| f64::from(v)).sum::<f64>() / cols as f64;
                let var = x.iter().map(|&v| (f64::from(v) - m).powi(2)).sum::<f64>() / cols as f64;
                let rs = 1.0 / (var + f64::from(eps)).sqrt();
                for c in 0..cols {
                    let xhat = ((f64::from(x[c]) - m) * rs) as f32;
                    o[c] = xhat * w[c] + b[c];
                }
                *mr = m as f32;
                *rr = rs as f32;
            }
        });
        self.st(out);
    }

    fn layernorm_bwd(
        &self,
        dinp: &mut [f32],
        dw: &mut [f32],
        db: &mut [f32],
        dout: &[f32],
        inp: &[f32],
        w: &[f32],
        mean: &[f32],
        rstd: &[f32],
        rows: usize,
        cols: usize,
    ) -> Aside {
        // Rows are independent for dinp; dw and db sum over rows, so they are split by columns
        // instead.
        par_chunks(self.threads, &mut dinp[..rows * cols], cols, |r0, di| {
            for (r, di) in (r0..).zip(di.chunks_mut(cols)) {
                let x = &inp[r * cols..(r + 1) * cols];
                let g = &dout[r * cols..(r + 1) * cols];
                let (m, rs) = (mean[r], rstd[r]);
                let mut sum_d = 0.0f64;
                let mut sum_dx = 0.0f64;
                for c in 0..cols {
                    let xhat = (x[c] - m) * rs;
                    let dxhat = g[c] * w[c];
                    sum_d += f64::from(dxhat);
                    sum_dx += f64::from(dxhat * xhat);
                }
                let (mean_d, mean_dx) =
                    ((sum_d / cols as f64) as f32, (sum_dx / cols as f64) as f32);
                for c in 0..cols {
                    let xhat = (x[c] - m) * rs;
                    di[c] = rs * (g[c] * w[c] - mean_d - xhat * mean_dx);
                }
            }
        });
        let threads = self.threads.min(rows * cols / PAR_MIN).max(1);
        let per = cols.div_ceil(threads).next_multiple_of(8);
        let items: Vec<_> = dw[..cols]
            .chunks_mut(per)
            .zip(db[..cols].chunks_mut(per))
            .enumerate()
            .collect();
        // dw and db in `Backend::bias_grad`'s order: each chunk of rows summed from zero, then
        // the chunks' sums added in order (the GPU sums the chunks in parallel).
        par_each(threads, items, |(i, (dw, db))| {
            let c0 = i * per;
            let cs = c0..c0 + dw.len();
            let (mut pw, mut pb) = (vec![0.0f32; dw.len()], vec![0.0f32; dw.len()]);
            for r0 in (0..rows).step_by(super::BIAS_ROWS) {
                pw.fill(0.0);
                pb.fill(0.0);
                for r in r0..(r0 + super::BIAS_ROWS).min(rows) {
                    let x = &inp[r * cols..(r + 1) * cols][cs.clone()];
                    let g = &dout[r * cols..(r + 1) * cols][cs.clone()];
                    let (m, rs) = (mean[r], rstd[r]);
                    for c in 0..dw.len() {
                        let xhat = (x[c] - m) * rs;
                        pw[c] += g[c] * xhat;
                        pb[c] += g[c];
                    }
                }
                for c in 0..dw.len() {
                    dw[c] += pw[c];
                    db[c] += pb[c];
                }
            }
        });
        self.st(&mut dinp[..rows * cols]);
        self.st(&mut dw[..cols]);
        self.st(&mut db[..cols]);
        Aside::DONE
    }

    fn gelu_fwd(&self, out: &mut [f32], inp: &[f32]) {
        assert_eq!(out.len(), inp.len());
        par_chunks(self.threads, out, 1, |i, o| {
            gelu_fwd_f32(o, &inp[i..i + o.len()]);
            self.st(o);
        });
    }

    fn gelu_bwd(&self, dinp: &mut [f32], inp: &[f32], dout: &[f32]) {
        assert_eq!(dinp.len(), inp.len());
        assert_eq!(dinp.len(), dout.len());
        par_chunks(self.threads, dinp, 1, |i, d| {
            let r = i..i + d.len();
            gelu_bwd_f32(d, &inp[r.clone()], &dout[r]);
            self.st(d);
        });
    }

    fn tanh_fwd(&self, out: &mut [f32], inp: &[f32]) {
        for (o, &x) in out.iter_mut().zip(inp) {
            *o = x.tanh();
        }
        self.st(out);
    }

    fn tanh_bwd(&self, dinp: &mut [f32], y: &[f32], dout: &[f32]) {
        for ((di, &y), &g) in dinp.iter_mut().zip(y).zip(dout) {
            *di = g * (1.0 - y * y);
        }
        self.st(dinp);
    }

    fn dropout(&self, x: &mut [f32], d: &Dropout) {
        let m = MaskKey::new(d);
        par_chunks(self.threads, x, 32, |i, c| {
            dropout_at(c, 32 * i as u64, m);
            self.st(c);
        });
    }

    fn attention_fwd(
        &self,
        ctx: &mut [f32],
        probs: &mut [f32],
        probs_drop: Option<&mut [f32]>,
        _scores: Option<&mut [f32]>,
        q: &[f32],
        k: &[f32],
        v: &[f32],
        qkv_bias: Option<(&[f32], usize)>,
        mask: &Vec<u32>,
        s: AttnShape,
        dropout: Option<&Dropout>,
    ) {
        assert!(qkv_bias.is_none(), "{NO_QKV_BIAS}");
        let (tok, pp) = (s.seq * s.heads * s.head_dim, s.heads * s.seq * s.seq);
        let pds: Vec<Option<&mut [f32]>> = match probs_drop {
            Some(pd) => pd.chunks_mut(pp).map(Some).collect(),
            None => (0..s.batch).map(|_| None).collect(),
        };
        let items: Vec<_> = ctx
            .chunks_mut(tok)
            .zip(probs.chunks_mut(pp))
            .zip(pds)
            .enumerate()
            .take(s.batch)
            .collect();
        par_each(self.threads, items, |(bi, ((c, p), pd))| {
            self.attn_fwd_one(bi, c, p, pd, q, k, v, mask, s, dropout);
        });
    }

    fn attention_bwd(
        &self,
        dqkv: &mut [f32],
        out: QkvRows,
        scratch: &mut [f32],
        dctx: &[f32],
        q: &[f32],
        k: &[f32],
        v: &[f32],
        qkv_bias: Option<(&[f32], usize)>,
        probs: &[f32],
        probs_drop: Option<&[f32]>,
        s: AttnShape,
        dropout: Option<&Dropout>,
    ) {
        assert!(qkv_bias.is_none(), "{NO_QKV_BIAS}");
        let pp = s.heads * s.seq * s.seq;
        let span = out.span(s.batch * s.seq, s.heads * s.head_dim);
        let items: Vec<_> = dqkv[..span]
            .chunks_mut(s.seq * out.ld)
            .zip(scratch.chunks_mut(pp))
            .enumerate()
            .take(s.batch)
            .collect();
        par_each(self.threads, items, |(bi, (a, d))| {
            self.attn_bwd_one(
                bi,
                (a, out, d),
                dctx,
                q,
                k,
                v,
                probs,
                probs_drop,
                s,
                dropout,
            );
        });
    }

    fn cross_entropy(
        &self,
        dlogits: &mut [f32],
        logits: &[f32],
        labels: &Vec<u32>,
        rows: usize,
        classes: usize,
        grad_scale: f32,
    ) -> f32 {
        let mut total = 0.0f64;
        let g = f64::from(grad_scale) / rows as f64;
        for r in 0..rows {
            let l = &logits[r * classes..(r + 1) * classes];
            let y = labels[r] as usize;
            let max = l.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let sum: f64 = l.iter().map(|&x| f64::from(x - max).exp()).sum();
            let lse = f64::from(max) + sum.ln();
            total += lse - f64::from(l[y]);
            let d = &mut dlogits[r * classes..(r + 1) * classes];
            for c in 0..classes {
                let p = f64::from(l[c] - max).exp() / sum;
                let onehot = if c == y { 1.0 } else { 0.0 };
                d[c] = ((p - onehot) * g) as f32;
            }
        }
        self.st(&mut dlogits[..rows * classes]);
        // The loss is a tensor of the module's dtype too (what HF logs under mixed precision).
        self.store.round((total / rows as f64) as f32)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn erfc_matches_known_values() {
        // Reference values from the closed forms tabulated in Abramowitz & Stegun, table 7.1.
        for (x, want) in [
            (0.0, 1.0),
            (0.5, 0.479_500_122_186_953_5),
            (1.0, 0.157_299_207_050_285_1),
            (2.0, 0.004_677_734_981_047_266),
            (3.0, 2.209_049_699_858_544e-5),
            (-1.0, 1.842_700_792_949_715),
        ] {
            let got = erfc(x);
            assert!(
                ((got - want) / want).abs() < 1.3e-7,
                "erfc({x}) = {got}, want {want}"
            );
        }
    }

    #[test]
    fn f32_gelu_and_exp_match_f64() {
        let mut worst_exp = 0.0f64;
        let mut worst_gelu = 0.0f64;
        let mut worst_dgelu = 0.0f64;
        let xs: Vec<f32> = (-200_000..=200_000).map(|i| i as f32 * 5e-5).collect();
        let mut g = vec![0.0f32; xs.len()];
        let mut dg = vec![0.0f32; xs.len()];
        Cpu::default().gelu_fwd(&mut g, &xs);
        Cpu::default().gelu_bwd(&mut dg, &xs, &vec![1.0; xs.len()]);
        for (i, &x) in xs.iter().enumerate() {
            let xd = f64::from(x);
            let e = f64::from(exp_f32(x * 8.0));
            worst_exp = worst_exp.max((e / (xd * 8.0).exp() - 1.0).abs());
            let phi = 0.5 * erfc(-xd * std::f64::consts::FRAC_1_SQRT_2);
            let want = xd * phi;
            let pdf = (-0.5 * xd * xd).exp() / (2.0 * std::f64::consts::PI).sqrt();
            let dwant = phi + xd * pdf;
            // Relative to max(|value|, 1): PyTorch's f32 `x · (1 + erf)/2` has that absolute
            // error in the tails too.
            worst_gelu = worst_gelu.max((f64::from(g[i]) - want).abs() / want.abs().max(1.0));
            worst_dgelu = worst_dgelu.max((f64::from(dg[i]) - dwant).abs() / dwant.abs().max(1.0));
        }
        assert!(worst_exp < 3e-7, "exp {worst_exp:e}");
        assert!(worst_gelu < 3e-7, "gelu {worst_gelu:e}");
        assert!(worst_dgelu < 3e-7, "dgelu {worst_dgelu:e}");
        assert_eq!(exp_f32(-1e30), 0.0);
        assert_eq!(exp_f32(f32::MIN), 0.0);
    }

    #[test]
    fn threaded_elementwise_kernels_match_one_thread() {
        let mut rng = crate::rng::Rng::new(5, 1);
        let (rows, cols) = (700, 130);
        let x: Vec<f32> = (0..rows * cols).map(|_| rng.normal() as f32).collect();
        let g: Vec<f32> = (0..rows * cols).map(|_| rng.normal() as f32).collect();
        let w: Vec<f32> = (0..cols).map(|_| rng.normal() as f32).collect();
        let d = Dropout {
            p: 0.1,
            seed: 3,
            stream: 17,
            site: 0,
        };
        let run = |cpu: Cpu| {
            let mut out = vec![0.0; rows * cols];
            let (mut mean, mut rstd) = (vec![0.0; rows], vec![0.0; rows]);
            cpu.layernorm_fwd(
                &mut out, &mut mean, &mut rstd, &x, &w, &w, rows, cols, 1e-12,
            );
            let mut di = vec![0.0; rows * cols];
            let (mut dw, mut db) = (vec![0.5; cols], vec![0.25; cols]);
            cpu.layernorm_bwd(
                &mut di, &mut dw, &mut db, &g, &x, &w, &mean, &rstd, rows, cols,
            );
            let mut bg = vec![0.0; cols];
            cpu.bias_grad(&mut bg, &g, rows, cols);
            let mut dr = x.clone();
            cpu.dropout(&mut dr, &d);
            let mut ge = vec![0.0; rows * cols];
            cpu.gelu_bwd(&mut ge, &x, &g);
            (out, mean, rstd, di, dw, db, bg, dr, ge)
        };
        assert!(run(Cpu::new(1)) == run(Cpu::new(3)));
    }

    fn naive_gemm(g: &Gemm, a: &[f32], b: &[f32], c: &mut [f32]) {
        for i in 0..g.m {
            for j in 0..g.n {
                let mut acc = 0.0f64;
                for p in 0..g.k {
                    let av = if g.trans_a {
                        a[p * g.lda + i]
                    } else {
                        a[i * g.lda + p]
                    };
                    let bv = if g.trans_b {
                        b[j * g.ldb + p]
                    } else {
                        b[p * g.ldb + j]
                    };
                    acc += f64::from(av) * f64::from(bv);
                }
                let old = c[i * g.ldc + j];
                c[i * g.ldc + j] = (f64::from(g.alpha) * acc + f64::from(g.beta * old)) as f32;
            }
        }
    }

    #[test]
    fn gemm_all_transposes_and_threads_agree() {
        let mut rng = crate::rng::Rng::new(3, 0);
        let (m, n, k) = (300, 70, 129);
        let a: Vec<f32> = (0..m * k).map(|_| rng.normal() as f32).collect();
        let b: Vec<f32> = (0..k * n).map(|_| rng.normal() as f32).collect();
        let c0: Vec<f32> = (0..m * n).map(|_| rng.normal() as f32).collect();
        for (ta, tb) in [(false, false), (true, false), (false, true), (true, true)] {
            let mut g = Gemm::dense(m, n, k, ta, tb, 0.5);
            g.alpha = 1.5;
            let mut want = c0.clone();
            naive_gemm(&g, &a, &b, &mut want);
            let mut one = c0.clone();
            Cpu::new(1).gemm(&g, &a, &b, &mut one);
            let mut three = c0.clone();
            // Force the threaded path on a small problem by lying about nothing: the work bound
            // is 2^21, which m·n·k = 2.7e6 exceeds.
            Cpu::new(3).gemm(&g, &a, &b, &mut three);
            assert_eq!(one, three, "thread count changed bits ({ta},{tb})");
            let err = one
                .iter()
                .zip(&want)
                .map(|(x, y)| (x - y).abs())
                .fold(0.0, f32::max);
            assert!(err < 1e-4, "({ta},{tb}) err {err}");
        }
    }

    #[test]
    fn gemm_rows_do_not_depend_on_the_rows_beside_them() {
        let mut rng = crate::rng::Rng::new(4, 0);
        let m = 200;
        for (n, k) in [
            (2, 384),
            (16, 129),
            (40, 700),
            (70, 129),
            (384, 384),
            (130, 1536),
        ] {
            let a: Vec<f32> = (0..m * k).map(|_| rng.normal() as f32).collect();
            let b: Vec<f32> = (0..k * n).map(|_| rng.normal() as f32).collect();
            let c0: Vec<f32> = (0..m * n).map(|_| rng.normal() as f32).collect();
            for (ta, tb) in [(false, false), (true, false), (false, true), (true, true)] {
                let sa = if ta { (1, m) } else { (k, 1) };
                let sb = if tb { (1, k) } else { (n, 1) };
                let mut full = c0.clone();
                sgemm(m, k, n, 0.5, &a, sa, &b, sb, 1.5, &mut full, (n, 1));
                for piece in [1, 3, 16, 70] {
                    let mut c = c0.clone();
                    for r0 in (0..m).step_by(piece) {
                        let r = piece.min(m - r0);
                        let (a_off, c_off) = (r0 * sa.0, r0 * n);
                        let cs = &mut c[c_off..];
                        sgemm(r, k, n, 0.5, &a[a_off..], sa, &b, sb, 1.5, cs, (n, 1));
                    }
                    assert!(
                        c == full,
                        "n {n} k {k} ta {ta} tb {tb}: {piece}-row calls differ"
                    );
                }
            }
        }
    }

    #[test]
    fn dropout_is_its_own_backward_and_drops_about_p() {
        let d = Dropout {
            p: 0.25,
            seed: 9,
            stream: 4,
            site: 0,
        };
        let mut x = vec![1.0f32; 40_000];
        Cpu::default().dropout(&mut x, &d);
        let dropped = x.iter().filter(|&&v| v == 0.0).count();
        assert!((9_500..10_500).contains(&dropped), "{dropped}");
        assert!(x.iter().all(|&v| v == 0.0 || v == 1.0 / 0.75));
        let mut y = vec![2.0f32; 40_000];
        Cpu::default().dropout(&mut y, &d);
        assert!(x.iter().zip(&y).all(|(a, b)| (*a == 0.0) == (*b == 0.0)));
    }

    #[test]
    fn fully_masked_rows_stay_finite() {
        let s = AttnShape {
            batch: 1,
            seq: 3,
            heads: 1,
            head_dim: 2,
        };
        let q = vec![1.0, 2.0, -1.0, 0.5, 3.0, 1.0];
        let mut ctx = vec![0.0; 6];
        let mut probs = vec![0.0; 9];
        Cpu::default().attention_fwd(
            &mut ctx,
            &mut probs,
            None,
            None,
            &q,
            &q,
            &q,
            None,
            &vec![0, 0, 0],
            s,
            None,
        );
        assert!(ctx.iter().chain(&probs).all(|v| v.is_finite()));
    }
}
