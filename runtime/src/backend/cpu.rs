//! The CPU reference backend: plain loops (llm.c style) plus `matrixmultiply` for GEMMs.
//!
//! Deterministic by construction: every reduction runs in a fixed order, and the optional threads
//! split only independent work (rows of a GEMM's output, sequences of an attention call), so a
//! result does not depend on the thread count.

use std::ops::Range;

use super::{AttnShape, Backend, Dropout, Gemm};
use crate::rng::philox4x32;

/// The CPU backend. `threads` (≥ 1) bounds the worker threads of GEMMs and attention.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cpu {
    threads: usize,
}

impl Default for Cpu {
    /// Single-threaded.
    fn default() -> Cpu {
        Cpu { threads: 1 }
    }
}

impl Cpu {
    /// A backend using up to `threads` threads (0 is taken as 1).
    pub fn new(threads: usize) -> Cpu {
        Cpu {
            threads: threads.max(1),
        }
    }

    /// The thread bound.
    pub fn threads(&self) -> usize {
        self.threads
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
    // SAFETY: the asserts above keep every accessed element inside the slices; `c` is borrowed
    // mutably, so it cannot alias `a` or `b`. Strides fit in isize for any real allocation.
    unsafe {
        matrixmultiply::sgemm(
            m,
            k,
            n,
            alpha,
            a.as_ptr(),
            rsa as isize,
            csa as isize,
            b.as_ptr(),
            rsb as isize,
            csb as isize,
            beta,
            c.as_mut_ptr(),
            rsc as isize,
            csc as isize,
        );
    }
}

/// `erfc(x)` with fractional error below 1.2e-7 everywhere (the Chebyshev-fitted formula of
/// Press et al., *Numerical Recipes* §6.2), evaluated in f64: that is about one f32 ulp, as good
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

/// Φ(x), the standard normal CDF, via [`erfc`] (no cancellation for negative `x`).
fn phi_cdf(x: f64) -> f64 {
    0.5 * erfc(-x * std::f64::consts::FRAC_1_SQRT_2)
}

/// Dropout multipliers drawn from one [`Dropout`] key: element `idx` uses word `idx % 4` of the
/// Philox block `idx / 4` of stream `d.stream`. The last block is cached, so a sequential scan
/// costs one Philox call per four elements.
struct Mask {
    key: [u32; 2],
    stream: [u32; 2],
    /// Keep iff the word is at least this (= ⌈p · 2³²⌉, i.e. uniform ≥ p).
    threshold: u64,
    scale: f32,
    block: u64,
    words: [u32; 4],
}

impl Mask {
    fn new(d: &Dropout) -> Mask {
        Mask {
            key: [d.seed as u32, (d.seed >> 32) as u32],
            stream: [d.stream as u32, (d.stream >> 32) as u32],
            threshold: (f64::from(d.p) * 4_294_967_296.0).ceil() as u64,
            scale: 1.0 / (1.0 - d.p),
            block: u64::MAX,
            words: [0; 4],
        }
    }

    /// The multiplier of element `idx`: 0 (dropped) or `1 / (1 - p)`.
    fn at(&mut self, idx: u64) -> f32 {
        let block = idx / 4;
        if block != self.block {
            self.words = philox4x32(
                [
                    block as u32,
                    (block >> 32) as u32,
                    self.stream[0],
                    self.stream[1],
                ],
                self.key,
            );
            self.block = block;
        }
        if u64::from(self.words[(idx % 4) as usize]) >= self.threshold {
            self.scale
        } else {
            0.0
        }
    }
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
            for row in p.chunks_mut(t) {
                for (x, &m) in row.iter_mut().zip(mask) {
                    if m == 0 {
                        *x += f32::MIN;
                    }
                }
                let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                let mut sum = 0.0f32;
                for x in row.iter_mut() {
                    *x = (*x - max).exp();
                    sum += *x;
                }
                for x in row.iter_mut() {
                    *x /= sum;
                }
            }
            let used: &[f32] = match (probs_drop.as_deref_mut(), dropout) {
                (Some(pd), Some(dr)) => {
                    let pd = &mut pd[h * t * t..(h + 1) * t * t];
                    let first = ((bi * s.heads + h) * t * t) as u64;
                    let mut mask = Mask::new(dr);
                    for (j, (o, &x)) in pd.iter_mut().zip(p.iter()).enumerate() {
                        *o = x * mask.at(first + j as u64);
                    }
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
        }
    }

    /// One sequence of [`Backend::attention_bwd`].
    #[allow(clippy::too_many_arguments)]
    fn attn_bwd_one(
        &self,
        bi: usize,
        (dq, dk, dv, scratch): (&mut [f32], &mut [f32], &mut [f32], &mut [f32]),
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
                &mut dv[h * d..],
                (hid, 1),
            );
            if let Some(dr) = dropout {
                // The forward's mask, read back from probs_drop instead of redrawn: a zero there
                // is either dropped or a zero probability, and for the latter the softmax
                // backward below multiplies by that zero anyway, so the result is the same.
                let scale = 1.0 / (1.0 - dr.p);
                for (x, &q) in ds.iter_mut().zip(pd) {
                    *x = if q != 0.0 { *x * scale } else { 0.0 };
                }
            }
            // softmax backward: ds = p ⊙ (dp − Σ_j dp·p)
            for (drow, prow) in ds.chunks_mut(t).zip(p.chunks(t)) {
                let dot: f32 = drow.iter().zip(prow).map(|(a, b)| a * b).sum();
                for (x, &pv) in drow.iter_mut().zip(prow) {
                    *x = pv * (*x - dot);
                }
            }
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
                &mut dq[h * d..],
                (hid, 1),
            );
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
                &mut dk[h * d..],
                (hid, 1),
            );
        }
    }
}

impl Backend for Cpu {
    type Buf = Vec<f32>;
    type View<'a> = &'a [f32];
    type ViewMut<'a> = &'a mut [f32];
    type Ids = Vec<u32>;

    fn alloc(&self, n: usize) -> Vec<f32> {
        vec![0.0; n]
    }

    fn upload_ids(&self, src: &[u32]) -> Vec<u32> {
        src.to_vec()
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

    fn sub<'a>(&self, v: &'a [f32], r: Range<usize>) -> &'a [f32]
    where
        Self: 'a,
    {
        &v[r]
    }

    fn sub_mut<'a, 'b>(&self, v: &'b mut &'a mut [f32], r: Range<usize>) -> &'b mut [f32]
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

    fn add_assign(&self, acc: &mut [f32], x: &[f32]) {
        assert_eq!(acc.len(), x.len());
        for (a, b) in acc.iter_mut().zip(x) {
            *a += b;
        }
    }

    fn gemm(&self, g: &Gemm, a: &[f32], b: &[f32], c: &mut [f32]) {
        let sa = if g.trans_a { (1, g.lda) } else { (g.lda, 1) };
        let sb = if g.trans_b { (1, g.ldb) } else { (g.ldb, 1) };
        // Split the rows of C over threads only when each share is a sizeable GEMM of its own.
        let work = g.m * g.n * g.k;
        let threads = if work >= 1 << 21 { self.threads } else { 1 };
        if threads <= 1 || g.m < 64 * threads {
            sgemm(g.m, g.k, g.n, g.alpha, a, sa, b, sb, g.beta, c, (g.ldc, 1));
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
        });
    }

    fn add_bias(&self, out: &mut [f32], bias: &[f32], rows: usize, cols: usize) {
        assert_eq!(bias.len(), cols);
        for row in out[..rows * cols].chunks_mut(cols) {
            for (o, b) in row.iter_mut().zip(bias) {
                *o += b;
            }
        }
    }

    fn bias_grad(&self, db: &mut [f32], dout: &[f32], rows: usize, cols: usize) {
        assert_eq!(db.len(), cols);
        for row in dout[..rows * cols].chunks(cols) {
            for (g, d) in db.iter_mut().zip(row) {
                *g += d;
            }
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
        for r in 0..rows {
            let x = &inp[r * cols..(r + 1) * cols];
            // Two passes in f64: exact enough that the result is the correctly rounded f32.
            let m = x.iter().map(|&v| f64::from(v)).sum::<f64>() / cols as f64;
            let var = x.iter().map(|&v| (f64::from(v) - m).powi(2)).sum::<f64>() / cols as f64;
            let rs = 1.0 / (var + f64::from(eps)).sqrt();
            let o = &mut out[r * cols..(r + 1) * cols];
            for c in 0..cols {
                let xhat = ((f64::from(x[c]) - m) * rs) as f32;
                o[c] = xhat * w[c] + b[c];
            }
            mean[r] = m as f32;
            rstd[r] = rs as f32;
        }
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
    ) {
        for r in 0..rows {
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
                dw[c] += g[c] * xhat;
                db[c] += g[c];
            }
            let (mean_d, mean_dx) = ((sum_d / cols as f64) as f32, (sum_dx / cols as f64) as f32);
            let di = &mut dinp[r * cols..(r + 1) * cols];
            for c in 0..cols {
                let xhat = (x[c] - m) * rs;
                di[c] = rs * (g[c] * w[c] - mean_d - xhat * mean_dx);
            }
        }
    }

    fn gelu_fwd(&self, out: &mut [f32], inp: &[f32]) {
        assert_eq!(out.len(), inp.len());
        for (o, &x) in out.iter_mut().zip(inp) {
            let x = f64::from(x);
            *o = (x * phi_cdf(x)) as f32;
        }
    }

    fn gelu_bwd(&self, dinp: &mut [f32], inp: &[f32], dout: &[f32]) {
        assert_eq!(dinp.len(), inp.len());
        let inv_sqrt_2pi = 0.5 * std::f64::consts::FRAC_2_SQRT_PI * std::f64::consts::FRAC_1_SQRT_2;
        for ((di, &x), &g) in dinp.iter_mut().zip(inp).zip(dout) {
            let x = f64::from(x);
            let pdf = (-0.5 * x * x).exp() * inv_sqrt_2pi;
            *di = (f64::from(g) * (phi_cdf(x) + x * pdf)) as f32;
        }
    }

    fn tanh_fwd(&self, out: &mut [f32], inp: &[f32]) {
        for (o, &x) in out.iter_mut().zip(inp) {
            *o = x.tanh();
        }
    }

    fn tanh_bwd(&self, dinp: &mut [f32], y: &[f32], dout: &[f32]) {
        for ((di, &y), &g) in dinp.iter_mut().zip(y).zip(dout) {
            *di = g * (1.0 - y * y);
        }
    }

    fn dropout(&self, x: &mut [f32], d: &Dropout) {
        let mut mask = Mask::new(d);
        for (i, v) in x.iter_mut().enumerate() {
            *v *= mask.at(i as u64);
        }
    }

    fn attention_fwd(
        &self,
        ctx: &mut [f32],
        probs: &mut [f32],
        probs_drop: Option<&mut [f32]>,
        q: &[f32],
        k: &[f32],
        v: &[f32],
        mask: &Vec<u32>,
        s: AttnShape,
        dropout: Option<&Dropout>,
    ) {
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
        dq: &mut [f32],
        dk: &mut [f32],
        dv: &mut [f32],
        scratch: &mut [f32],
        dctx: &[f32],
        q: &[f32],
        k: &[f32],
        v: &[f32],
        probs: &[f32],
        probs_drop: Option<&[f32]>,
        s: AttnShape,
        dropout: Option<&Dropout>,
    ) {
        let (tok, pp) = (s.seq * s.heads * s.head_dim, s.heads * s.seq * s.seq);
        let items: Vec<_> = dq
            .chunks_mut(tok)
            .zip(dk.chunks_mut(tok))
            .zip(dv.chunks_mut(tok))
            .zip(scratch.chunks_mut(pp))
            .enumerate()
            .take(s.batch)
            .collect();
        par_each(self.threads, items, |(bi, (((a, b), c), d))| {
            self.attn_bwd_one(
                bi,
                (a, b, c, d),
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
        (total / rows as f64) as f32
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
    fn dropout_is_its_own_backward_and_drops_about_p() {
        let d = Dropout {
            p: 0.25,
            seed: 9,
            stream: 4,
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
            &q,
            &q,
            &q,
            &vec![0, 0, 0],
            s,
            None,
        );
        assert!(ctx.iter().chain(&probs).all(|v| v.is_finite()));
    }
}
