//! Attention on the emulated device (the batched GEMMs around runtime/kernels/attention.cu's
//! softmax kernels, as the GPU runs them) against the CPU backend.
//!
//! Forward: ctx, probs and probs_drop from the same inputs. Backward: dq, dk, dv and the ds left
//! in scratch, both sides given the CPU forward's probs / probs_drop, so a difference there is
//! the backward's own.
//!
//! Tolerances are `eps · (max|want| + |want|)` per element, eps 1e-5 for f32 (the softmax's sums
//! run in a warp's order rather than the CPU's; measured at most 8.6e-7 of the tensor's largest
//! value, seq 1024 among the shapes) and one storage ulp for half stores (a value a hair from a
//! rounding boundary rounds the other way on one side: f16 2⁻¹⁰, bf16 2⁻⁷; measured at most
//! 1.1e-4 for f16, 1.2e-3 for bf16). Each test prints its measured errors (`--nocapture`).

use crate::common;

use common::{calls, pair, rand};
use recipe_kernel_emu::EmuTyped;
use recipe_runtime::backend::device::Device;
use recipe_runtime::backend::kernels::Kernels;
use recipe_runtime::backend::{AttnShape, Backend, Cpu, Dropout, QkvRows};
use recipe_runtime::precision::Dtype;

const STORES: [Dtype; 3] = [Dtype::F32, Dtype::F16, Dtype::Bf16];

/// (batch, seq, heads, head_dim): one token, odd sizes, more than one warp of keys (33), more
/// than one stride of the block (130 keys over 128 threads).
const SHAPES: &[(usize, usize, usize, usize)] = &[
    (1, 1, 1, 1),
    (2, 3, 3, 5),
    (1, 17, 1, 16),
    (2, 17, 3, 5),
    (2, 33, 3, 16),
    (1, 33, 1, 1),
];

fn shape(&(batch, seq, heads, head_dim): &(usize, usize, usize, usize)) -> AttnShape {
    AttnShape {
        batch,
        seq,
        heads,
        head_dim,
    }
}

/// Padding masks: everything kept in the first sequence but its last third padded; the second
/// sequence (when there is one) fully masked, the case HF's additive mask keeps finite.
fn padding_mask(s: AttnShape) -> Vec<u32> {
    let mut m = vec![1u32; s.batch * s.seq];
    let keep = s.seq - s.seq / 3;
    m[keep..s.seq].fill(0);
    if s.batch > 1 {
        m[s.seq..2 * s.seq].fill(0);
    }
    m
}

/// The largest `|got − want|`, and that over `max|want|`.
fn max_err(got: &[f32], want: &[f32]) -> (f32, f32) {
    let abs = got
        .iter()
        .zip(want)
        .map(|(g, w)| (g - w).abs())
        .fold(0.0f32, f32::max);
    let big = want.iter().map(|w| w.abs()).fold(0.0f32, f32::max);
    (abs, if big > 0.0 { abs / big } else { abs })
}

fn eps(store: Dtype) -> f32 {
    match store {
        Dtype::F32 => 1e-5,
        Dtype::F16 => 1.0 / 1024.0,
        Dtype::Bf16 => 1.0 / 128.0,
    }
}

/// Asserts `got ≈ want` within `eps · (max|want| + |want|)` and returns the error relative to
/// `max|want|`.
#[track_caller]
fn check(what: &str, got: &[f32], want: &[f32], store: Dtype) -> f32 {
    assert_eq!(got.len(), want.len(), "{what}: lengths");
    let e = eps(store);
    let big = want.iter().map(|w| w.abs()).fold(0.0f32, f32::max);
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        assert!(
            g.is_finite() && w.is_finite(),
            "{what}[{i}]: got {g}, want {w}"
        );
        assert!(
            (g - w).abs() <= e * (big + w.abs()),
            "{what}[{i}]: got {g}, want {w} (max|want| {big}, eps {e})"
        );
    }
    max_err(got, want).1
}

/// Worst relative error seen per (store, tensor), printed at the end of a test.
#[derive(Default)]
struct Worst(Vec<(String, f32)>);

impl Worst {
    fn note(&mut self, key: String, e: f32) {
        match self.0.iter_mut().find(|(k, _)| *k == key) {
            Some((_, w)) => *w = w.max(e),
            None => self.0.push((key, e)),
        }
    }

    fn print(&self, test: &str) {
        for (k, e) in &self.0 {
            eprintln!("{test}: {k} max error {e:.3e} (relative to the tensor's largest value)");
        }
    }
}

struct Inputs {
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    dctx: Vec<f32>,
}

fn inputs(s: AttnShape, store: Dtype, salt: u64) -> Inputs {
    let n = s.batch * s.seq * s.heads * s.head_dim;
    // Scale 2 gives peaked softmax rows as well as flat ones.
    let mut x = Inputs {
        q: rand(n, 2.0, 10 + salt),
        k: rand(n, 2.0, 20 + salt),
        v: rand(n, 1.0, 30 + salt),
        dctx: rand(n, 1.0, 40 + salt),
    };
    for t in [&mut x.q, &mut x.k, &mut x.v, &mut x.dctx] {
        store.round_slice(t);
    }
    x
}

/// A forward on one backend: (ctx, probs, probs_drop).
type FwdCall<'a> = &'a dyn Fn(&mut [f32], &mut [f32], Option<&mut [f32]>);
/// A backward on one backend: (dqkv, its layout, scratch).
type BwdCall<'a> = &'a dyn Fn(&mut [f32], QkvRows, &mut [f32]);

/// Where a backward writes dq, dk and dv (`Backend::attention_bwd`): side by side in a token's
/// row. `bert`: BERT's layout (bert.rs, `qkv_grad_rows`: a zero column after dq and after dk,
/// the row padded to 8, so dk starts at an odd column); else gaps of 1, 1 and 2 columns before
/// dq, dk and dv and after dv, an odd row length, so no row starts 4-byte aligned.
fn rows_for(hid: usize, bert: bool) -> QkvRows {
    if bert {
        QkvRows {
            ld: (3 * hid + 2).next_multiple_of(8),
            cols: [0, hid + 1, 2 * hid + 2],
        }
    } else {
        QkvRows {
            ld: 3 * hid + 5,
            cols: [1, hid + 2, 2 * hid + 4],
        }
    }
}

/// dq, dk and dv out of `dqkv`'s rows, and every other value of them (which a backward leaves
/// as it was).
fn split_rows(dqkv: &[f32], o: QkvRows, hid: usize) -> [Vec<f32>; 4] {
    let cols = |c: usize| -> Vec<f32> {
        dqkv.chunks(o.ld)
            .flat_map(|r| r[c..c + hid].to_vec())
            .collect()
    };
    let rest = dqkv
        .chunks(o.ld)
        .flat_map(|r| {
            (0..o.ld)
                .filter(|c| !o.cols.iter().any(|&a| (a..a + hid).contains(c)))
                .map(|c| r[c])
                .collect::<Vec<_>>()
        })
        .collect();
    [cols(o.cols[0]), cols(o.cols[1]), cols(o.cols[2]), rest]
}

/// One forward and backward on both backends, compared; returns the emulated outputs.
fn compare(
    store: Dtype,
    s: AttnShape,
    mask: &[u32],
    dropout: Option<&Dropout>,
    worst: &mut Worst,
) -> Vec<Vec<f32>> {
    let (g, c) = pair(store);
    let x = inputs(s, store, (s.seq * 7 + s.head_dim) as u64);
    let (tok, pp) = (
        s.batch * s.seq * s.heads * s.head_dim,
        s.batch * s.heads * s.seq * s.seq,
    );
    let mask = mask.to_vec();
    let drop = dropout.is_some();
    let tag = format!(
        "{store:?} {s:?} {}",
        if drop { "dropout" } else { "no dropout" }
    );

    // Forward. Garbage in the outputs shows a kernel that skips an element.
    let fwd = |b: FwdCall| {
        let (mut ctx, mut p, mut pd) = (vec![7.0; tok], vec![7.0; pp], vec![7.0; pp]);
        b(&mut ctx, &mut p, drop.then_some(&mut pd[..]));
        (ctx, p, pd)
    };
    // The emulated device computes the scores in room of their own (as the training forward
    // does), and in place in `probs` (as the evaluation's): the same bits either way.
    let (gctx, gp, gpd) = fwd(&|ctx, p, pd| {
        let mut room = vec![7.0; pp];
        let room = Some(&mut room[..]);
        g.attention_fwd(ctx, p, pd, room, &x.q, &x.k, &x.v, None, &mask, s, dropout)
    });
    let in_place = fwd(&|ctx, p, pd| {
        g.attention_fwd(ctx, p, pd, None, &x.q, &x.k, &x.v, None, &mask, s, dropout)
    });
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    assert_eq!(bits(&in_place.0), bits(&gctx), "ctx in place {tag}");
    assert_eq!(bits(&in_place.1), bits(&gp), "probs in place {tag}");
    if drop {
        assert_eq!(bits(&in_place.2), bits(&gpd), "probs_drop in place {tag}");
    }
    let (cctx, cp, cpd) = fwd(&|ctx, p, pd| {
        c.attention_fwd(ctx, p, pd, None, &x.q, &x.k, &x.v, None, &mask, s, dropout)
    });
    let st = format!("{store:?}");
    worst.note(
        format!("{st} probs"),
        check(&format!("probs {tag}"), &gp, &cp, store),
    );
    worst.note(
        format!("{st} ctx"),
        check(&format!("ctx {tag}"), &gctx, &cctx, store),
    );
    if drop {
        worst.note(
            format!("{st} probs_drop"),
            check(&format!("probs_drop {tag}"), &gpd, &cpd, store),
        );
        // The same mask: the same elements dropped.
        for (i, (a, b)) in gpd.iter().zip(&cpd).enumerate() {
            assert_eq!(
                *a == 0.0,
                *b == 0.0,
                "probs_drop[{i}] mask {tag}: {a} vs {b}"
            );
        }
    }

    // Backward, from the CPU forward's probabilities on both sides.
    let hid = s.heads * s.head_dim;
    let o = rows_for(hid, false);
    let bwd = |b: BwdCall| {
        let (mut dqkv, mut ds) = (vec![7.0; tok / hid.max(1) * o.ld], vec![7.0; pp]);
        b(&mut dqkv, o, &mut ds);
        let [dq, dk, dv, rest] = split_rows(&dqkv, o, hid);
        [dq, dk, dv, ds, rest]
    };
    let cpd_view = drop.then_some(&cpd[..]);
    let gb = bwd(&|dqkv, o, ds| {
        g.attention_bwd(
            dqkv, o, ds, &x.dctx, &x.q, &x.k, &x.v, None, &cp, cpd_view, s, dropout,
        )
    });
    let cb = bwd(&|dqkv, o, ds| {
        c.attention_bwd(
            dqkv, o, ds, &x.dctx, &x.q, &x.k, &x.v, None, &cp, cpd_view, s, dropout,
        )
    });
    for (name, (a, b)) in ["dq", "dk", "dv", "ds"].iter().zip(gb.iter().zip(&cb)) {
        // ds (the scratch) is rounded to the store on both sides, as every output is.
        let e = check(&format!("{name} {tag}"), a, b, store);
        worst.note(format!("{st} {name}"), e);
    }
    // The rows' other columns untouched on both sides.
    assert!(
        gb[4].iter().chain(&cb[4]).all(|&x| x == 7.0),
        "attention_bwd wrote outside dq, dk and dv {tag}"
    );

    let [dq, dk, dv, ds, _] = gb;
    vec![gctx, gp, gpd, dq, dk, dv, ds]
}

#[test]
fn attention_matches_the_cpu_without_dropout() {
    let mut worst = Worst::default();
    for store in STORES {
        for sh in SHAPES {
            let s = shape(sh);
            compare(store, s, &vec![1; s.batch * s.seq], None, &mut worst);
        }
    }
    worst.print("no dropout");
}

#[test]
fn attention_matches_the_cpu_with_padding_and_dropout() {
    let mut worst = Worst::default();
    for store in STORES {
        for (n, sh) in SHAPES.iter().enumerate() {
            let s = shape(sh);
            let mask = padding_mask(s);
            // Padding alone once (f32); the half stores with padding and dropout together.
            if store == Dtype::F32 {
                compare(store, s, &mask, None, &mut worst);
            }
            let d = Dropout {
                p: [0.1, 0.5][n % 2],
                seed: 0x0123_4567_89ab_cdef,
                stream: 5 + n as u64,
                site: 2,
            };
            compare(store, s, &mask, Some(&d), &mut worst);
        }
    }
    worst.print("padding + dropout");
}

#[test]
fn a_fully_masked_sequence_stays_finite_and_uniform() {
    let s = AttnShape {
        batch: 2,
        seq: 5,
        heads: 3,
        head_dim: 4,
    };
    let mut mask = [1; 10];
    mask[5..].fill(0);
    let mut worst = Worst::default();
    let out = compare(Dtype::F32, s, &mask, None, &mut worst);
    let probs = &out[1];
    // The second sequence: every row uniform over its 5 keys.
    for &p in &probs[s.heads * 25..] {
        assert!((p - 0.2).abs() < 1e-6, "fully masked row: {p}");
    }
    assert!(out.iter().flatten().all(|v| v.is_finite()));
}

#[test]
fn more_keys_than_threads() {
    // 130 keys: each lane of a row's warp takes four or five of them.
    let s = AttnShape {
        batch: 1,
        seq: 130,
        heads: 1,
        head_dim: 3,
    };
    let mut mask = [1; 130];
    mask[100..].fill(0);
    let d = Dropout {
        p: 0.2,
        seed: 99,
        stream: 3,
        site: 2,
    };
    let mut worst = Worst::default();
    compare(Dtype::F32, s, &mask, Some(&d), &mut worst);
    worst.print("130 keys");
}

#[test]
fn attention_is_deterministic() {
    let s = shape(&(2, 17, 3, 5));
    let mask = padding_mask(s);
    let d = Dropout {
        p: 0.3,
        seed: 7,
        stream: 11,
        site: 2,
    };
    let mut w = Worst::default();
    let a = compare(Dtype::F32, s, &mask, Some(&d), &mut w);
    let b = compare(Dtype::F32, s, &mask, Some(&d), &mut w);
    for (x, y) in a.iter().zip(&b) {
        let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(x), bits(y));
    }
}

#[test]
fn the_largest_supported_shape_launches() {
    // seq 512, head_dim 128: the BERT-base maximum; the emulation refuses a launch a GPU would.
    let s = AttnShape {
        batch: 1,
        seq: 512,
        heads: 1,
        head_dim: 128,
    };
    let mut worst = Worst::default();
    compare(Dtype::F32, s, &[1; 512], None, &mut worst);
    worst.print("seq 512");
}

#[test]
fn long_rows_and_wide_heads_match_the_cpu() {
    // Rows of 1024 keys (32 per lane), heads of 400 and 1100 columns (the GEMMs' shapes).
    let mut worst = Worst::default();
    for sh in [(1, 1024, 1, 16), (1, 40, 2, 400), (2, 3, 1, 1100)] {
        let s = shape(&sh);
        let mask = padding_mask(s);
        let d = Dropout {
            p: 0.25,
            seed: 17,
            stream: 2,
            site: 2,
        };
        compare(Dtype::F32, s, &mask, Some(&d), &mut worst);
    }
    worst.print("long rows, wide heads");
}

/// A forward on `be` in buffers of its own (`alloc_stored`: 16-bit ones on a device keeping
/// them, which the fused forward needs), the scores given f32 room: (ctx, probs, probs_drop);
/// with `bias`, q's, k's and v's biases (`bias.1` elements apart in `bias.0`) given to the
/// device to add ([`Backend::attention_adds_bias`]).
fn fwd_on<B: Backend>(
    be: &B,
    s: AttnShape,
    x: &Inputs,
    mask: &[u32],
    dropout: Option<&Dropout>,
    bias: Option<(&[f32], usize)>,
) -> [Vec<f32>; 3] {
    fwd_given(be, s, x, mask, dropout, bias, true)
}

/// [`fwd_on`], with `probs_drop` given to the device (with dropout) only when `give_pd`: without
/// it, the third output is the garbage the buffer started as.
fn fwd_given<B: Backend>(
    be: &B,
    s: AttnShape,
    x: &Inputs,
    mask: &[u32],
    dropout: Option<&Dropout>,
    bias: Option<(&[f32], usize)>,
    give_pd: bool,
) -> [Vec<f32>; 3] {
    let (tok, pp) = (
        s.batch * s.seq * s.heads * s.head_dim,
        s.batch * s.heads * s.seq * s.seq,
    );
    let stored = |v: &[f32]| {
        let mut b = be.alloc_stored(v.len());
        be.write(be.view_mut(&mut b), v);
        b
    };
    let (q, k, v) = (stored(&x.q), stored(&x.k), stored(&x.v));
    let bias = bias.map(|(b, stride)| (stored(b), stride));
    // Garbage in the outputs shows a kernel that skips an element.
    let (mut ctx, mut probs, mut pd) = (
        stored(&vec![7.0; tok]),
        stored(&vec![7.0; pp]),
        stored(&vec![7.0; pp]),
    );
    let mut scores = be.alloc(pp);
    let m = be.upload_ids(mask);
    be.attention_fwd(
        be.view_mut(&mut ctx),
        be.view_mut(&mut probs),
        dropout.filter(|_| give_pd).map(|_| be.view_mut(&mut pd)),
        Some(be.view_mut(&mut scores)),
        be.view(&q),
        be.view(&k),
        be.view(&v),
        bias.as_ref().map(|(b, stride)| (be.view(b), *stride)),
        &m,
        s,
        dropout,
    );
    let down = |b: &B::Buf, n: usize| {
        let mut out = vec![0.0; n];
        be.download(be.view(b), &mut out);
        out
    };
    [down(&ctx, tok), down(&probs, pp), down(&pd, pp)]
}

/// The forward's kernels, as [`launched`] counts them: the fused one, its long twin and the
/// softmax between the batched products.
const FWD_KERNELS: [&str; 3] = [
    "attention_fused",
    "attention_fused_long",
    "attention_softmax",
];

/// The launches of [`FWD_KERNELS`] the fused forward makes on `s`: its `_long` twin past one
/// chunk of 128 keys.
fn fused_fwd(s: AttnShape) -> [u64; 3] {
    if s.seq <= 128 {
        [1, 0, 0]
    } else {
        [0, 1, 0]
    }
}

/// The backward's kernels, as [`launched`] counts them: the fused two, their long twins and the
/// softmax backward between the batched products.
const BWD_KERNELS: [&str; 5] = [
    "attention_bwd_dq",
    "attention_bwd_dkv",
    "attention_bwd_dq_long",
    "attention_bwd_dkv_long",
    "attention_softmax_bwd",
];

/// The launches of [`BWD_KERNELS`] the fused backward makes on `s`.
fn fused_bwd(s: AttnShape) -> [u64; 5] {
    if s.seq <= 128 {
        [1, 1, 0, 0, 0]
    } else {
        [0, 0, 1, 1, 0]
    }
}

/// Dropout of a quarter with this key: the fused kernels' tests.
fn quarter_dropout(seed: u64, stream: u64, site: u64) -> Dropout {
    Dropout {
        p: 0.25,
        seed,
        stream,
        site,
    }
}

/// The fused kernels' shapes (heads of 64 or 32): one token; 8 keys, fewer than a product's
/// step of 16; 77, a multiple of neither 4, 8 nor 16 (pairs of keys straddling Philox blocks);
/// 100 queries, a second block of them part empty; the full 128 of one chunk; heads of 32
/// (MiniLM's) at 33 keys and at the full 128 over 3 heads; and the long kernels' (more than one
/// chunk of 128 keys): 129, one key in the second chunk; 203, an odd length whose last chunk is
/// part of a tile; 256, two full chunks, at heads of 32; 300 over three chunks.
const FUSED_SHAPES: &[(usize, usize, usize, usize)] = &[
    (1, 1, 1, 64),
    (3, 8, 1, 64),
    (1, 77, 3, 64),
    (2, 100, 1, 64),
    (2, 128, 2, 64),
    (2, 33, 2, 32),
    (1, 128, 3, 32),
    (1, 129, 1, 64),
    (1, 203, 2, 64),
    (2, 256, 1, 32),
    (1, 300, 1, 64),
];

/// The forward in one kernel (attention.cu, `attention_fused`: mma.sync, which the emulator
/// emulates) against the CPU and against the unfused path on the same device, with padding, with
/// and without dropout; launched in place of the softmax and its products.
#[test]
fn the_fused_forward_matches_the_cpu_and_the_batched_products() {
    let mut worst = Worst::default();
    for store in [Dtype::F16, Dtype::Bf16] {
        let fused = Kernels::new(EmuTyped).with_store(store);
        let unfused = Kernels::new(EmuTyped)
            .with_store(store)
            .with_fused_attention(false);
        let cpu = Cpu::new(1).with_store(store);
        for (n, sh) in FUSED_SHAPES.iter().enumerate() {
            let s = shape(sh);
            let mask = padding_mask(s);
            let x = inputs(s, store, 50 + n as u64);
            let d = quarter_dropout(0x0123_4567_89ab_cdef, 9 + n as u64, 3);
            for dropout in [None, Some(&d)] {
                let tag = format!("{store:?} {s:?} dropout {}", dropout.is_some());
                let (f, calls) =
                    launched(FWD_KERNELS, || fwd_on(&fused, s, &x, &mask, dropout, None));
                assert_eq!(calls, fused_fwd(s), "fused launches {tag}");
                let (u, calls) = launched(FWD_KERNELS, || {
                    fwd_on(&unfused, s, &x, &mask, dropout, None)
                });
                assert_eq!(calls, [0, 0, 1], "unfused launches {tag}");
                let c = fwd_on(&cpu, s, &x, &mask, dropout, None);
                let names = ["ctx", "probs", "probs_drop"];
                for (i, name) in names.iter().enumerate() {
                    if i == 2 && dropout.is_none() {
                        // Not written: still the garbage it started as, on every side.
                        assert!(f[2].iter().all(|&v| v == 7.0), "{name} written {tag}");
                        continue;
                    }
                    let e = check(&format!("{name} {tag}"), &f[i], &c[i], store);
                    worst.note(format!("{store:?} {name} vs CPU"), e);
                    let e = check(&format!("{name} vs unfused {tag}"), &f[i], &u[i], store);
                    worst.note(format!("{store:?} {name} vs unfused"), e);
                }
                if dropout.is_some() {
                    // The same mask: the same elements dropped.
                    for (i, (a, b)) in f[2].iter().zip(&c[2]).enumerate() {
                        assert_eq!(*a == 0.0, *b == 0.0, "probs_drop[{i}] mask {tag}");
                    }
                }
            }
        }
    }
    worst.print("fused forward");
}

/// Where the fused forward does not fit (another head size, however short; f32; 16-bit buffers
/// not kept), the batched products and the softmax run.
#[test]
fn shapes_the_fused_forward_does_not_fit_take_the_batched_products() {
    let bf16 = Kernels::new(EmuTyped).with_store(Dtype::Bf16);
    for sh in [(1, 129, 1, 48), (2, 16, 2, 16), (1, 16, 1, 80)] {
        let s = shape(&sh);
        let x = inputs(s, Dtype::Bf16, 3);
        let (_, calls) = launched(FWD_KERNELS, || {
            fwd_on(&bf16, s, &x, &padding_mask(s), None, None)
        });
        assert_eq!(calls, [0, 0, 1], "{s:?}");
    }
    let s = shape(&(1, 16, 1, 64));
    let f32s = Kernels::new(EmuTyped);
    let x = inputs(s, Dtype::F32, 4);
    let (_, calls) = launched(FWD_KERNELS, || {
        fwd_on(&f32s, s, &x, &padding_mask(s), None, None)
    });
    assert_eq!(calls, [0, 0, 1], "f32");
    // The emulated device keeping f32 buffers (`Emu`) never fuses: covered by every test above
    // through `pair`, whose forwards launch the softmax.
}

/// A backward on `be` in buffers of its own (`alloc_stored`, as [`fwd_on`]) from the given
/// probabilities (and dropped probabilities with `dropout`): (dq, dk, dv), written in the rows
/// of [`rows_for`]`(hid, bert_rows)`, whose other columns it checks untouched; `bias` as
/// [`fwd_on`]'s.
#[allow(clippy::too_many_arguments)]
fn bwd_on<B: Backend>(
    be: &B,
    s: AttnShape,
    x: &Inputs,
    probs: &[f32],
    pd: &[f32],
    dropout: Option<&Dropout>,
    bias: Option<(&[f32], usize)>,
    bert_rows: bool,
) -> [Vec<f32>; 3] {
    bwd_given(be, s, x, probs, Some(pd), dropout, bias, bert_rows)
}

/// [`bwd_on`], `probs_drop` given (with dropout) only where `pd` is.
#[allow(clippy::too_many_arguments)]
fn bwd_given<B: Backend>(
    be: &B,
    s: AttnShape,
    x: &Inputs,
    probs: &[f32],
    pd: Option<&[f32]>,
    dropout: Option<&Dropout>,
    bias: Option<(&[f32], usize)>,
    bert_rows: bool,
) -> [Vec<f32>; 3] {
    let (tok, pp) = (
        s.batch * s.seq * s.heads * s.head_dim,
        s.batch * s.heads * s.seq * s.seq,
    );
    let stored = |v: &[f32]| {
        let mut b = be.alloc_stored(v.len());
        be.write(be.view_mut(&mut b), v);
        b
    };
    let (q, k, v, dctx) = (stored(&x.q), stored(&x.k), stored(&x.v), stored(&x.dctx));
    let bias = bias.map(|(b, stride)| (stored(b), stride));
    let (p, pdb) = (stored(probs), pd.map(stored));
    let (hid, rows) = (s.heads * s.head_dim, s.batch * s.seq);
    let o = rows_for(hid, bert_rows);
    let mut dqkv = stored(&vec![7.0; rows * o.ld]);
    let mut scratch = be.alloc(pp);
    be.attention_bwd(
        be.view_mut(&mut dqkv),
        o,
        be.view_mut(&mut scratch),
        be.view(&dctx),
        be.view(&q),
        be.view(&k),
        be.view(&v),
        bias.as_ref().map(|(b, stride)| (be.view(b), *stride)),
        be.view(&p),
        pdb.as_ref()
            .filter(|_| dropout.is_some())
            .map(|b| be.view(b)),
        s,
        dropout,
    );
    let mut out = vec![0.0; rows * o.ld];
    be.download(be.view(&dqkv), &mut out);
    let [dq, dk, dv, rest] = split_rows(&out, o, hid);
    assert!(
        rest.iter().all(|&x| x == 7.0),
        "attention_bwd wrote outside dq, dk and dv ({s:?}, {o:?})"
    );
    assert!(dq.len() == tok && dk.len() == tok && dv.len() == tok);
    [dq, dk, dv]
}

/// `f`'s result and how many times it launched each of `names` (the emulator's profile).
fn launched<T, const N: usize>(names: [&str; N], f: impl FnOnce() -> T) -> (T, [u64; N]) {
    assert!(EmuTyped.start_profile());
    let out = f();
    let p = EmuTyped.profile().expect("started");
    (out, names.map(|n| calls(&p, n)))
}

/// The backward in two kernels (attention.cu, `attention_bwd_dq`, `attention_bwd_dkv`) against
/// the CPU and the unfused path on the same device, on the fused forward's shapes, with padding,
/// with and without dropout, from the CPU forward's probabilities; launched in place of the
/// softmax backward and its products.
#[test]
fn the_fused_backward_matches_the_cpu_and_the_batched_products() {
    let mut worst = Worst::default();
    let names = BWD_KERNELS;
    for store in [Dtype::F16, Dtype::Bf16] {
        let fused = Kernels::new(EmuTyped).with_store(store);
        let unfused = Kernels::new(EmuTyped)
            .with_store(store)
            .with_fused_attention(false);
        let cpu = Cpu::new(1).with_store(store);
        for (n, sh) in FUSED_SHAPES.iter().enumerate() {
            let s = shape(sh);
            let mask = padding_mask(s);
            let x = inputs(s, store, 70 + n as u64);
            let d = quarter_dropout(0x0fed_cba9_8765_4321, 4 + n as u64, 1);
            for dropout in [None, Some(&d)] {
                let tag = format!("{store:?} {s:?} dropout {}", dropout.is_some());
                let [_, p, pd] = fwd_on(&cpu, s, &x, &mask, dropout, None);
                let (f, calls) = launched(names, || {
                    bwd_on(&fused, s, &x, &p, &pd, dropout, None, dropout.is_none())
                });
                assert_eq!(calls, fused_bwd(s), "fused launches {tag}");
                let (u, calls) = launched(names, || {
                    bwd_on(&unfused, s, &x, &p, &pd, dropout, None, dropout.is_none())
                });
                assert_eq!(calls, [0, 0, 0, 0, 1], "unfused launches {tag}");
                let c = bwd_on(&cpu, s, &x, &p, &pd, dropout, None, dropout.is_none());
                for (i, name) in ["dq", "dk", "dv"].iter().enumerate() {
                    let e = check(&format!("{name} {tag}"), &f[i], &c[i], store);
                    worst.note(format!("{store:?} {name} vs CPU"), e);
                    let e = check(&format!("{name} vs unfused {tag}"), &f[i], &u[i], store);
                    worst.note(format!("{store:?} {name} vs unfused"), e);
                }
            }
        }
    }
    worst.print("fused backward");
}

/// The long kernels (`attention_fused_long`, `attention_bwd_dq_long`: the keys 128 at a time,
/// the forward's scores computed in three passes, dq's in two) give the short kernels' bits
/// where both fit: a lane adds its keys' terms in key order in both. Forced at every length
/// ([`Kernels::with_long_attention_only`]), on the fused shapes up to one chunk, with padding,
/// with and without dropout, with q's, k's and v's biases.
#[test]
fn the_long_kernels_give_the_short_ones_bits_where_both_fit() {
    let bits = |v: &[Vec<f32>]| -> Vec<Vec<u32>> {
        v.iter()
            .map(|t| t.iter().map(|x| x.to_bits()).collect())
            .collect()
    };
    for store in [Dtype::F16, Dtype::Bf16] {
        let short = Kernels::new(EmuTyped).with_store(store);
        let long = Kernels::new(EmuTyped)
            .with_store(store)
            .with_long_attention_only();
        for (n, sh) in FUSED_SHAPES.iter().filter(|s| s.1 <= 128).enumerate() {
            let s = shape(sh);
            let hid = s.heads * s.head_dim;
            let stride = hid + 5;
            let mut bias = rand(2 * stride + hid, 1.0, 110 + n as u64);
            store.round_slice(&mut bias);
            let x = inputs(s, store, 100 + n as u64);
            let mask = padding_mask(s);
            let d = quarter_dropout(0x1357_9bdf_2468_ace0, 5 + n as u64, 4);
            for dropout in [None, Some(&d)] {
                let tag = format!("{store:?} {s:?} dropout {}", dropout.is_some());
                let b = Some((&bias[..], stride));
                let (got, calls) =
                    launched(FWD_KERNELS, || fwd_on(&long, s, &x, &mask, dropout, b));
                assert_eq!(calls, [0, 1, 0], "long launches {tag}");
                let want = fwd_on(&short, s, &x, &mask, dropout, b);
                assert_eq!(bits(&got), bits(&want), "forward {tag}");
                let [_, p, pd] = want;
                let (got, calls) = launched(BWD_KERNELS, || {
                    bwd_on(&long, s, &x, &p, &pd, dropout, b, dropout.is_none())
                });
                assert_eq!(calls, [0, 0, 1, 1, 0], "long launches {tag}");
                let want = bwd_on(&short, s, &x, &p, &pd, dropout, b, dropout.is_none());
                assert_eq!(bits(&got), bits(&want), "backward {tag}");
            }
        }
    }
}

/// With dropout, the fused kernels need no `probs_drop` ([`Backend::attention_redraws_dropout`]):
/// the forward without one gives the bits of the forward with one (ctx from the same dropped
/// probabilities) and leaves the buffer alone, and the backward draws the mask again. Its dv,
/// the product of the probabilities dropped again (attention.cu, `drop_again`) with dctx, has
/// the bits of the same kernel without dropout given the forward's stored `probs_drop` as its
/// probabilities (dq's and dk's mask: the backward test above, against the CPU, which reads
/// `probs_drop`). On the fused shapes, short and long, with padding.
#[test]
fn the_fused_kernels_draw_the_dropout_mask_again_instead_of_storing_it() {
    let bits = |v: &[f32]| -> Vec<u32> { v.iter().map(|x| x.to_bits()).collect() };
    for store in [Dtype::F16, Dtype::Bf16] {
        let fused = Kernels::new(EmuTyped).with_store(store);
        for (n, sh) in FUSED_SHAPES.iter().enumerate() {
            let s = shape(sh);
            assert!(fused.attention_redraws_dropout(s), "{s:?}");
            let x = inputs(s, store, 120 + n as u64);
            let mask = padding_mask(s);
            let d = quarter_dropout(0x2468_ace0_1357_9bdf, 6 + n as u64, 2);
            let tag = format!("{store:?} {s:?}");
            let with = fwd_given(&fused, s, &x, &mask, Some(&d), None, true);
            let without = fwd_given(&fused, s, &x, &mask, Some(&d), None, false);
            assert_eq!(bits(&without[0]), bits(&with[0]), "ctx {tag}");
            assert_eq!(bits(&without[1]), bits(&with[1]), "probs {tag}");
            assert!(
                without[2].iter().all(|&v| v == 7.0),
                "probs_drop written {tag}"
            );
            let [_, p, pd] = with;
            // A quarter dropped: some of 64 elements, but perhaps not the one token's one.
            assert!(pd.len() < 64 || pd.contains(&0.0), "nothing dropped {tag}");
            let redrawn = bwd_given(&fused, s, &x, &p, None, Some(&d), None, false);
            let [_, _, dv] = bwd_given(&fused, s, &x, &pd, None, None, None, false);
            assert_eq!(
                bits(&redrawn[2]),
                bits(&dv),
                "dv from the stored probs_drop {tag}"
            );
        }
    }
}

/// Where the fused kernels do not fit, the backward takes the batched products too.
#[test]
fn shapes_the_fused_backward_does_not_fit_take_the_batched_products() {
    let bf16 = Kernels::new(EmuTyped).with_store(Dtype::Bf16);
    for sh in [(1, 129, 1, 48), (2, 16, 2, 16), (1, 16, 1, 48)] {
        let s = shape(&sh);
        let x = inputs(s, Dtype::Bf16, 5);
        let pp = s.batch * s.heads * s.seq * s.seq;
        let p = vec![1.0 / s.seq as f32; pp];
        let (_, calls) = launched(BWD_KERNELS, || {
            bwd_on(&bf16, s, &x, &p, &p, None, None, true)
        });
        assert_eq!(calls, [0, 0, 0, 0, 1], "{s:?}");
    }
}

/// q's, k's and v's biases added by the fused kernels as they load q, k and v
/// ([`Backend::attention_adds_bias`]; attention.cu, `HeadBias`) give the bits of the same kernels
/// on q, k and v with the biases added and rounded first (what `add_bias` stores): forward
/// (ctx, probs, probs_drop) and backward (dq, dk, dv), on the fused shapes, with padding, with
/// and without dropout. The biases lie 3 elements further apart than a row is wide, as a
/// layer's parameters lay them out with weights between.
#[test]
fn the_fused_kernels_add_the_projections_biases_as_they_load_them() {
    for store in [Dtype::F16, Dtype::Bf16] {
        let fused = Kernels::new(EmuTyped).with_store(store);
        for (n, sh) in FUSED_SHAPES.iter().enumerate() {
            let s = shape(sh);
            assert!(fused.attention_adds_bias(s), "{s:?}");
            let hid = s.heads * s.head_dim;
            let stride = hid + 3;
            let mut bias = rand(2 * stride + hid, 1.0, 90 + n as u64);
            store.round_slice(&mut bias);
            let x = inputs(s, store, 80 + n as u64);
            let add = |t: &[f32], j: usize| {
                let mut out: Vec<f32> = t
                    .iter()
                    .enumerate()
                    .map(|(i, v)| v + bias[j * stride + i % hid])
                    .collect();
                store.round_slice(&mut out);
                out
            };
            let xb = Inputs {
                q: add(&x.q, 0),
                k: add(&x.k, 1),
                v: add(&x.v, 2),
                dctx: x.dctx.clone(),
            };
            let mask = padding_mask(s);
            let d = quarter_dropout(0x0bad_5eed_0bad_5eed, 2 + n as u64, 2);
            for dropout in [None, Some(&d)] {
                let tag = format!("{store:?} {s:?} dropout {}", dropout.is_some());
                let bits = |v: &[Vec<f32>]| -> Vec<Vec<u32>> {
                    v.iter()
                        .map(|t| t.iter().map(|x| x.to_bits()).collect())
                        .collect()
                };
                let got = fwd_on(&fused, s, &x, &mask, dropout, Some((&bias, stride)));
                let want = fwd_on(&fused, s, &xb, &mask, dropout, None);
                assert_eq!(bits(&got), bits(&want), "forward {tag}");
                let [_, p, pd] = want;
                let got = bwd_on(
                    &fused,
                    s,
                    &x,
                    &p,
                    &pd,
                    dropout,
                    Some((&bias, stride)),
                    dropout.is_some(),
                );
                let want = bwd_on(&fused, s, &xb, &p, &pd, dropout, None, dropout.is_some());
                assert_eq!(bits(&got), bits(&want), "backward {tag}");
            }
        }
    }
    // Only where the fused kernels run: not on the CPU, not where they are turned off or the
    // shape does not fit.
    let s = shape(&FUSED_SHAPES[2]);
    let unfused = Kernels::new(EmuTyped)
        .with_store(Dtype::Bf16)
        .with_fused_attention(false);
    assert!(!unfused.attention_adds_bias(s));
    assert!(!Cpu::new(1).with_store(Dtype::Bf16).attention_adds_bias(s));
    let bf16 = Kernels::new(EmuTyped).with_store(Dtype::Bf16);
    assert!(!bf16.attention_adds_bias(shape(&(1, 129, 1, 48))));
    assert!(
        bf16.attention_adds_bias(shape(&(1, 513, 1, 64))),
        "any length"
    );
    assert!(!Kernels::new(EmuTyped).attention_adds_bias(s), "f32");
}

/// The unfused backward (`attention_softmax_bwd` between the batched products) on f32 buffers
/// holding the stored values (`Emu`) and on 16-bit buffers (`EmuTyped`, as a GPU keeps them)
/// gives the same bits: the kernel's two paths (its probabilities of either type) sum
/// `Σ dp·p` with `op_add`/`op_mul`. Written `dot += x * p`, the compiler fused the product
/// into an FMA in one path and not in the other (as NVRTC may), so `ds`, rounded from a `dot`
/// one f32 ulp apart, came out one storage ulp apart now and then. Many random rows (every
/// `ds` near a rounding boundary is a chance), padding and dropout, f16 and bf16.
#[test]
fn the_unfused_backward_has_the_same_bits_in_f32_and_16_bit_buffers() {
    use recipe_kernel_emu::Emu;
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    let mut compared = 0usize;
    for store in [Dtype::F16, Dtype::Bf16] {
        let wide = Kernels::new(Emu).with_store(store);
        let narrow = Kernels::new(EmuTyped).with_store(store);
        let cpu = Cpu::new(1).with_store(store);
        for (n, sh) in [(2, 48, 4, 16), (3, 33, 2, 8), (2, 64, 3, 12)]
            .iter()
            .enumerate()
        {
            let s = shape(sh);
            let mask = padding_mask(s);
            for salt in 0..4u64 {
                let x = inputs(s, store, 90 + 10 * n as u64 + salt);
                let d = quarter_dropout(0x5eed_0000 + salt, 9 + n as u64, 2);
                for dropout in [None, Some(&d)] {
                    let tag = format!("{store:?} {s:?} salt {salt} dropout {}", dropout.is_some());
                    let [_, p, pd] = fwd_on(&cpu, s, &x, &mask, dropout, None);
                    let a = bwd_on(&wide, s, &x, &p, &pd, dropout, None, salt % 2 == 0);
                    let b = bwd_on(&narrow, s, &x, &p, &pd, dropout, None, salt % 2 == 0);
                    for (i, name) in ["dq", "dk", "dv"].iter().enumerate() {
                        let (x, y) = (bits(&a[i]), bits(&b[i]));
                        let differ = x.iter().zip(&y).filter(|(p, q)| p != q).count();
                        let first = x.iter().zip(&y).position(|(p, q)| p != q);
                        assert_eq!(differ, 0, "{name} {tag}: first at {first:?}");
                    }
                    compared += s.batch * s.heads * s.seq * s.seq;
                }
            }
        }
    }
    eprintln!("{compared} ds values through both paths");
}
