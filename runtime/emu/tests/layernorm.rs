//! runtime/kernels/layernorm.cu on the emulated device against the CPU backend.
//!
//! Tolerances. The kernels sum the row statistics in double, as the CPU does, in another order
//! (strided, then a tree): an error near 1e-16 relative, so the f32 results normally come out as
//! the CPU's bits, and the comparisons allow one f32 ulp (2⁻²³ relative) of slack for an exact
//! value that falls within that error of a rounding boundary — plus, for a half store, one ulp of
//! the storage dtype for an output whose f32 value moved by that ulp across a half tie. Measured:
//! 0 on every shape here (bit-identical). dw/db are recomputed per column from mean/rstd in the
//! CPU's order; given the same mean/rstd they are bit-identical, which is asserted exactly.

use crate::common;

use common::{calls, close, pair, rand};
use recipe_runtime::backend::Backend;
use recipe_runtime::precision::Dtype;

const STORES: [Dtype; 3] = [Dtype::F32, Dtype::F16, Dtype::Bf16];

/// (rows, cols): one column (zero variance), widths off the warp and the block, BERT's 768,
/// and rows past one and two chunks of the backward's dw/db sums (64 rows).
const SHAPES: &[(usize, usize)] = &[
    (1, 1),
    (3, 7),
    (17, 33),
    (3, 257),
    (2, 768),
    (1, 1000),
    (65, 9),
    (150, 40),
    (130, 300),
];

/// One f32 ulp, relative.
const F32_ULP: f32 = 1.0 / (1 << 23) as f32;

/// One ulp of the storage dtype, relative (the slack for a half rounding that a last-bit f32
/// difference flips).
fn store_ulp(store: Dtype) -> f32 {
    match store {
        Dtype::F32 => F32_ULP,
        Dtype::F16 => 1.0 / 1024.0,
        Dtype::Bf16 => 1.0 / 128.0,
    }
}

fn bits(x: &[f32]) -> Vec<u32> {
    x.iter().map(|v| v.to_bits()).collect()
}

/// Largest |got − want| / max(|want|, tiny) (printed with `--nocapture`, for the record).
fn rel_err(got: &[f32], want: &[f32]) -> f32 {
    got.iter()
        .zip(want)
        .map(|(g, w)| (g - w).abs() / w.abs().max(1e-30))
        .fold(0.0, f32::max)
}

/// Rows with a large common offset (a one-pass variance would cancel) and a spread.
fn input(rows: usize, cols: usize, store: Dtype) -> Vec<f32> {
    let mut x = rand(rows * cols, 2.0, 1);
    for (i, v) in x.iter_mut().enumerate() {
        *v += 3.0 + (i / cols.max(1)) as f32;
    }
    store.round_slice(&mut x);
    x
}

/// A backward's inputs on `rows × cols`: the rows ([`input`]), a weight and an output gradient
/// drawn from streams `seeds` and rounded to `store`, and the mean and rstd of the CPU's
/// forward on them (zero bias, eps 1e-5).
struct BwdCase {
    x: Vec<f32>,
    w: Vec<f32>,
    dout: Vec<f32>,
    mean: Vec<f32>,
    rstd: Vec<f32>,
}

fn bwd_case(rows: usize, cols: usize, store: Dtype, seeds: (u64, u64)) -> BwdCase {
    let n = rows * cols;
    let x = input(rows, cols, store);
    let (mut w, mut dout) = (rand(cols, 1.0, seeds.0), rand(n, 1.0, seeds.1));
    store.round_slice(&mut w);
    store.round_slice(&mut dout);
    let (mut o, mut mean, mut rstd) = (vec![0.0; n], vec![0.0; rows], vec![0.0; rows]);
    let b = vec![0.0; cols];
    let c = recipe_runtime::backend::Cpu::new(1).with_store(store);
    c.layernorm_fwd(&mut o, &mut mean, &mut rstd, &x, &w, &b, rows, cols, 1e-5);
    BwdCase {
        x,
        w,
        dout,
        mean,
        rstd,
    }
}

#[test]
fn forward_matches_the_cpu() {
    for store in STORES {
        let (g, c) = pair(store);
        for &(rows, cols) in SHAPES {
            for eps in [1e-12f32, 1e-5] {
                let x = input(rows, cols, store);
                let mut w = rand(cols, 1.0, 2);
                let mut b = rand(cols, 0.5, 3);
                store.round_slice(&mut w);
                store.round_slice(&mut b);
                let n = rows * cols;
                let (mut o1, mut m1, mut r1) = (vec![0.0; n], vec![0.0; rows], vec![0.0; rows]);
                let (mut o2, mut m2, mut r2) = (vec![0.0; n], vec![0.0; rows], vec![0.0; rows]);
                g.layernorm_fwd(&mut o1, &mut m1, &mut r1, &x, &w, &b, rows, cols, eps);
                c.layernorm_fwd(&mut o2, &mut m2, &mut r2, &x, &w, &b, rows, cols, eps);
                let what = format!("{store:?} {rows}x{cols} eps {eps}");
                eprintln!(
                    "layernorm_fwd {what}: out {:e} mean {:e} rstd {:e}",
                    rel_err(&o1, &o2),
                    rel_err(&m1, &m2),
                    rel_err(&r1, &r2)
                );
                close(&format!("mean {what}"), &m1, &m2, 0.0, F32_ULP);
                close(&format!("rstd {what}"), &r1, &r2, 0.0, F32_ULP);
                // xhat · w + b can cancel, so the slack is relative to the terms' size (≈ |w|
                // · |xhat| ≤ 2·√cols) rather than to the result.
                let atol = store_ulp(store) * 4.0 * (cols as f32).sqrt();
                close(&format!("out {what}"), &o1, &o2, atol, store_ulp(store));
                // Deterministic.
                let (mut o3, mut m3, mut r3) = (vec![0.0; n], vec![0.0; rows], vec![0.0; rows]);
                g.layernorm_fwd(&mut o3, &mut m3, &mut r3, &x, &w, &b, rows, cols, eps);
                assert_eq!(bits(&o1), bits(&o3), "rerun out {what}");
                assert_eq!(bits(&m1), bits(&m3), "rerun mean {what}");
                assert_eq!(bits(&r1), bits(&r3), "rerun rstd {what}");
            }
        }
    }
}

#[test]
fn backward_matches_the_cpu() {
    for store in STORES {
        let (g, c) = pair(store);
        for &(rows, cols) in SHAPES {
            let x = input(rows, cols, store);
            let mut w = rand(cols, 1.0, 4);
            let mut b = rand(cols, 0.5, 5);
            let mut dout = rand(rows * cols, 1.0, 6);
            for t in [&mut w, &mut b, &mut dout] {
                store.round_slice(t);
            }
            // The statistics of the CPU forward feed both backwards: dw/db then depend only on
            // the backward kernels' own arithmetic.
            let n = rows * cols;
            let (mut o, mut m, mut r) = (vec![0.0; n], vec![0.0; rows], vec![0.0; rows]);
            c.layernorm_fwd(&mut o, &mut m, &mut r, &x, &w, &b, rows, cols, 1e-12);
            let dw0 = rand(cols, 0.1, 7);
            let db0 = rand(cols, 0.1, 8);
            let run_gpu = || {
                let (mut di, mut dw, mut db) = (vec![0.0; n], dw0.clone(), db0.clone());
                g.layernorm_bwd(&mut di, &mut dw, &mut db, &dout, &x, &w, &m, &r, rows, cols);
                (di, dw, db)
            };
            let (di1, dw1, db1) = run_gpu();
            let (mut di2, mut dw2, mut db2) = (vec![0.0; n], dw0.clone(), db0.clone());
            c.layernorm_bwd(
                &mut di2, &mut dw2, &mut db2, &dout, &x, &w, &m, &r, rows, cols,
            );
            let what = format!("{store:?} {rows}x{cols}");
            eprintln!(
                "layernorm_bwd {what}: dinp {:e} dw {:e} db {:e}",
                rel_err(&di1, &di2),
                rel_err(&dw1, &dw2),
                rel_err(&db1, &db2)
            );
            assert_eq!(bits(&dw1), bits(&dw2), "dw {what}");
            assert_eq!(bits(&db1), bits(&db2), "db {what}");
            // dinp = rstd · (dxhat − mean_d − xhat · mean_dx) cancels; the slack is one ulp of
            // the storage dtype relative to the size of its terms (rstd · |dxhat| ≲ rstd).
            let scale = r.iter().fold(0.0f32, |a, &v| a.max(v));
            close(
                &format!("dinp {what}"),
                &di1,
                &di2,
                store_ulp(store) * 4.0 * scale,
                F32_ULP,
            );
            let (di3, dw3, db3) = run_gpu();
            assert_eq!(
                (bits(&di1), bits(&dw1), bits(&db1)),
                (bits(&di3), bits(&dw3), bits(&db3)),
                "rerun {what}"
            );
            // The blocks last to first: another block of each column is the last to finish
            // and adds the chunks' sums (common.cuh, `last_of_column`); the same bits. A
            // backward of other values first leaves other sums in the scratch, so a block that
            // added them before every chunk had written its own would show.
            let other = rand(n, 3.0, 9);
            let (mut di, mut dw, mut db) = (vec![0.0; n], dw0.clone(), db0.clone());
            g.layernorm_bwd(
                &mut di, &mut dw, &mut db, &other, &x, &w, &m, &r, rows, cols,
            );
            let (di4, dw4, db4) = recipe_kernel_emu::reversed_blocks(run_gpu);
            assert_eq!(
                (bits(&di1), bits(&dw1), bits(&db1)),
                (bits(&di4), bits(&dw4), bits(&db4)),
                "blocks reversed {what}"
            );
        }
    }
}

#[test]
fn forward_then_backward_stays_on_the_cpu_bits() {
    // The whole chain on each side (the device backward from the device statistics): the
    // double statistics keep even dw/db, which depend on mean/rstd, bit-identical here.
    for store in STORES {
        let (g, c) = pair(store);
        let (rows, cols) = (5, 257);
        let x = input(rows, cols, store);
        let (w, b, dout) = (
            rand(cols, 1.0, 9),
            rand(cols, 0.5, 10),
            rand(rows * cols, 1.0, 11),
        );
        let n = rows * cols;
        let mut outs = Vec::new();
        for side in 0..2 {
            let (mut o, mut m, mut r) = (vec![0.0; n], vec![0.0; rows], vec![0.0; rows]);
            let (mut di, mut dw, mut db) = (vec![0.0; n], vec![0.0; cols], vec![0.0; cols]);
            if side == 0 {
                g.layernorm_fwd(&mut o, &mut m, &mut r, &x, &w, &b, rows, cols, 1e-12);
                g.layernorm_bwd(&mut di, &mut dw, &mut db, &dout, &x, &w, &m, &r, rows, cols);
            } else {
                c.layernorm_fwd(&mut o, &mut m, &mut r, &x, &w, &b, rows, cols, 1e-12);
                c.layernorm_bwd(&mut di, &mut dw, &mut db, &dout, &x, &w, &m, &r, rows, cols);
            }
            outs.push([o, m, r, di, dw, db].map(|v| bits(&v)));
        }
        assert_eq!(outs[0], outs[1], "{store:?}");
    }
}

/// `layernorm_bwd_split` (the residual branch's backward in one pass: `dinp` kept, then dropped)
/// is the backward, a copy and a dropout on the same device bit for bit, with and without
/// dropout, for every storage dtype; a buffer longer than the matrix takes the separate passes.
#[test]
fn the_residual_split_is_the_backward_copy_and_dropout_bit_for_bit() {
    use recipe_runtime::backend::Dropout;
    let drop = Dropout {
        p: 0.3,
        seed: 0x5eed,
        stream: 9,
        site: 2,
    };
    for store in STORES {
        let (g, _) = pair(store);
        for &(rows, cols) in SHAPES {
            for (d, extra) in [(None, 0), (Some(&drop), 0), (Some(&drop), 3)] {
                let n = rows * cols;
                let BwdCase {
                    x,
                    w,
                    dout,
                    mean: m,
                    rstd: r,
                } = bwd_case(rows, cols, store, (4, 6));
                let run = |fused: bool| {
                    let (mut di, mut keep) = (vec![0.0; n + extra], vec![0.0; n + extra]);
                    let (mut dw, mut db) = (vec![0.5; cols], vec![-0.25; cols]);
                    if fused {
                        g.layernorm_bwd_split(
                            (&mut di, &mut keep, d),
                            &mut dw,
                            &mut db,
                            &dout,
                            &x,
                            &w,
                            &m,
                            &r,
                            rows,
                            cols,
                        );
                    } else {
                        g.layernorm_bwd(
                            &mut di, &mut dw, &mut db, &dout, &x, &w, &m, &r, rows, cols,
                        );
                        g.copy(&mut keep, &di);
                        if let Some(d) = d {
                            g.dropout(&mut di, d);
                        }
                    }
                    [di, keep, dw, db].map(|v| bits(&v))
                };
                let what = format!("{store:?} {rows}x{cols} dropout {} +{extra}", d.is_some());
                assert_eq!(run(true), run(false), "{what}");
            }
        }
    }
}

/// `bias_dropout_add_layernorm` (one kernel on a device keeping 16-bit buffers) against
/// `bias_dropout_add` then `layernorm_fwd` on the same device, bit for bit — `res` kept for the
/// backward, the LayerNorm's output, mean and rstd — with and without dropout, with the
/// parameters in f32 and in the storage dtype; and against the CPU's two calls. Widths of one
/// vector (8), BERT's 768, the widest the kernel takes (1024), and two it does not (1032, 12),
/// which take the two kernels; f32 storage always takes them.
#[test]
fn the_residual_layernorm_is_bias_dropout_add_then_the_forward_bit_for_bit() {
    use recipe_kernel_emu::EmuTyped;
    use recipe_runtime::backend::device::Device;
    use recipe_runtime::backend::kernels::Kernels;
    use recipe_runtime::backend::Dropout;
    let drop = Dropout {
        p: 0.25,
        seed: 0x5eed,
        stream: 4,
        site: 3,
    };
    for store in STORES {
        let k = Kernels::new(EmuTyped).with_store(store);
        let cpu = recipe_runtime::backend::Cpu::new(1).with_store(store);
        for (rows, cols) in [(1, 8), (9, 768), (3, 1024), (2, 1032), (5, 12)] {
            let n = rows * cols;
            let mut y = rand(n, 2.0, 21);
            let mut x = input(rows, cols, store);
            let mut p = [
                rand(cols, 0.5, 22),
                rand(cols, 1.0, 23),
                rand(cols, 0.5, 24),
            ];
            store.round_slice(&mut y);
            store.round_slice(&mut x);
            p.iter_mut().for_each(|v| store.round_slice(v));
            let put = |v: &[f32]| {
                let mut b = k.alloc_stored(v.len());
                k.write(k.view_mut(&mut b), v);
                b
            };
            let get = |b: &<Kernels<EmuTyped> as Backend>::Buf, len: usize| {
                let mut out = vec![0.0; len];
                k.download(k.view(b), &mut out);
                bits(&out)
            };
            for d in [None, Some(&drop)] {
                for p16 in [false, true] {
                    let params = p.clone().map(|v| if p16 { put(&v) } else { k.upload(&v) });
                    let [bias, w, b] = &params;
                    let xb = put(&x);
                    let run = |fused: bool| {
                        let mut res = put(&y);
                        let mut out = put(&vec![7.0; n]);
                        let (mut m, mut r) =
                            (k.upload(&vec![7.0; rows]), k.upload(&vec![7.0; rows]));
                        if fused {
                            k.bias_dropout_add_layernorm(
                                &mut res,
                                k.view(bias),
                                d,
                                k.view(&xb),
                                (k.view_mut(&mut out), k.view_mut(&mut m), k.view_mut(&mut r)),
                                k.view(w),
                                k.view(b),
                                rows,
                                cols,
                                1e-5,
                            );
                        } else {
                            k.bias_dropout_add(&mut res, k.view(bias), rows, cols, d, k.view(&xb));
                            k.layernorm_fwd(
                                k.view_mut(&mut out),
                                k.view_mut(&mut m),
                                k.view_mut(&mut r),
                                k.view(&res),
                                k.view(w),
                                k.view(b),
                                rows,
                                cols,
                                1e-5,
                            );
                        }
                        [get(&res, n), get(&out, n), get(&m, rows), get(&r, rows)]
                    };
                    let what = format!(
                        "{store:?} {rows}x{cols} dropout {} 16-bit parameters {p16}",
                        d.is_some()
                    );
                    assert!(EmuTyped.start_profile());
                    let fused = run(true);
                    let prof = EmuTyped.profile().expect("started");
                    // One kernel where its path applies; the two otherwise.
                    let fits = store != Dtype::F32 && cols % 8 == 0 && cols <= 1024;
                    let launched = ["bias_dropout_add_layernorm", "bias_dropout_add"]
                        .map(|name| calls(&prof, name));
                    assert_eq!(launched, [u64::from(fits), u64::from(!fits)], "{what}");
                    assert_eq!(fused, run(false), "{what}");
                    // And the CPU's two calls: its `res` bit for bit (the same roundings and
                    // Philox mask); the LayerNorm within forward_matches_the_cpu's slack.
                    let mut res = y.clone();
                    let (mut o, mut m, mut r) = (vec![0.0; n], vec![0.0; rows], vec![0.0; rows]);
                    cpu.bias_dropout_add_layernorm(
                        &mut res,
                        &p[0],
                        d,
                        &x,
                        (&mut o, &mut m, &mut r),
                        &p[1],
                        &p[2],
                        rows,
                        cols,
                        1e-5,
                    );
                    assert_eq!(fused[0], bits(&res), "res vs CPU {what}");
                    let f = |b: &[u32]| b.iter().map(|&u| f32::from_bits(u)).collect::<Vec<_>>();
                    let atol = store_ulp(store) * 4.0 * (cols as f32).sqrt();
                    close(
                        &format!("out vs CPU {what}"),
                        &f(&fused[1]),
                        &o,
                        atol,
                        store_ulp(store),
                    );
                    close(
                        &format!("mean vs CPU {what}"),
                        &f(&fused[2]),
                        &m,
                        0.0,
                        F32_ULP,
                    );
                    close(
                        &format!("rstd vs CPU {what}"),
                        &f(&fused[3]),
                        &r,
                        0.0,
                        F32_ULP,
                    );
                }
            }
        }
    }
}

/// The backward's vectorised path for 16-bit buffers (`layernorm_bwd_dinp16`, a kernel of its
/// own) against the generic path the same device takes for f32 buffers holding the same values
/// (the emulated device `Emu`), bit for bit: `dinp`, the residual split's `keep`, `dw` and `db`,
/// with and without the split and its dropout, the weight in f32 and in the storage dtype.
/// Widths the path takes (8, 768, 1024) and two it does not (1032, 12).
#[test]
fn the_sixteen_bit_backward_kernel_is_the_generic_path_bit_for_bit() {
    use recipe_kernel_emu::EmuTyped;
    use recipe_runtime::backend::device::Device;
    use recipe_runtime::backend::kernels::Kernels;
    use recipe_runtime::backend::Dropout;
    let drop = Dropout {
        p: 0.3,
        seed: 0x5eed,
        stream: 5,
        site: 1,
    };
    for store in [Dtype::F16, Dtype::Bf16] {
        let k = Kernels::new(EmuTyped).with_store(store);
        let (g, _) = pair(store);
        for (rows, cols) in [(1, 8), (9, 768), (3, 1024), (2, 1032), (5, 12)] {
            let n = rows * cols;
            let BwdCase {
                x,
                w,
                dout,
                mean: m,
                rstd: r,
            } = bwd_case(rows, cols, store, (31, 32));
            let put = |v: &[f32]| {
                let mut b = k.alloc_stored(v.len());
                k.write(k.view_mut(&mut b), v);
                b
            };
            let get = |b: &<Kernels<EmuTyped> as Backend>::Buf, len: usize| {
                let mut out = vec![0.0; len];
                k.download(k.view(b), &mut out);
                bits(&out)
            };
            for (split, d) in [(false, None), (true, None), (true, Some(&drop))] {
                for w16 in [false, true] {
                    let what = format!(
                        "{store:?} {rows}x{cols} split {split} dropout {} 16-bit weight {w16}",
                        d.is_some()
                    );
                    // The 16-bit buffers.
                    let (xb, gb) = (put(&x), put(&dout));
                    let wb = if w16 { put(&w) } else { k.upload(&w) };
                    let (mb, rb) = (k.upload(&m), k.upload(&r));
                    let (mut di, mut keep) = (put(&vec![7.0; n]), put(&vec![7.0; n]));
                    let (mut dw, mut db) =
                        (k.upload(&vec![0.5; cols]), k.upload(&vec![-0.25; cols]));
                    let args = (
                        k.view(&gb),
                        k.view(&xb),
                        k.view(&wb),
                        k.view(&mb),
                        k.view(&rb),
                    );
                    assert!(EmuTyped.start_profile());
                    if split {
                        k.layernorm_bwd_split(
                            (&mut di, &mut keep, d),
                            k.view_mut(&mut dw),
                            k.view_mut(&mut db),
                            args.0,
                            args.1,
                            args.2,
                            args.3,
                            args.4,
                            rows,
                            cols,
                        );
                    } else {
                        k.layernorm_bwd(
                            k.view_mut(&mut di),
                            k.view_mut(&mut dw),
                            k.view_mut(&mut db),
                            args.0,
                            args.1,
                            args.2,
                            args.3,
                            args.4,
                            rows,
                            cols,
                        );
                    }
                    let prof = EmuTyped.profile().expect("started");
                    let fits = cols % 8 == 0 && cols <= 1024;
                    let launched = ["layernorm_bwd_dinp16", "layernorm_bwd_dinp"]
                        .map(|name| calls(&prof, name));
                    assert_eq!(launched, [u64::from(fits), u64::from(!fits)], "{what}");
                    let got = [get(&di, n), get(&keep, n), get(&dw, cols), get(&db, cols)];
                    // The f32 buffers.
                    let (mut di, mut keep) = (vec![7.0; n], vec![7.0; n]);
                    let (mut dw, mut db) = (vec![0.5; cols], vec![-0.25; cols]);
                    if split {
                        g.layernorm_bwd_split(
                            (&mut di, &mut keep, d),
                            &mut dw,
                            &mut db,
                            &dout,
                            &x,
                            &w,
                            &m,
                            &r,
                            rows,
                            cols,
                        );
                    } else {
                        g.layernorm_bwd(
                            &mut di, &mut dw, &mut db, &dout, &x, &w, &m, &r, rows, cols,
                        );
                    }
                    assert_eq!(got, [di, keep, dw, db].map(|v| bits(&v)), "{what}");
                }
            }
        }
    }
}

/// `layernorm_bwd_split_bias_grad` (the bias gradient of the linear below the LayerNorm summed
/// in the LayerNorm's column pass) against `layernorm_bwd_split` then `bias_grad` on the same
/// device, bit for bit — `dinp`, the kept copy, `dw`, `db` and the bias's — and against the
/// CPU's (the trait's default: those two calls); with and without dropout, buffers longer than
/// the matrix (the separate passes), the blocks in order and last to first.
#[test]
fn the_split_with_the_bias_below_is_the_split_then_its_bias_grad_bit_for_bit() {
    use recipe_runtime::backend::Dropout;
    let drop = Dropout {
        p: 0.3,
        seed: 0x5eed,
        stream: 11,
        site: 3,
    };
    for store in STORES {
        let (g, c) = pair(store);
        for &(rows, cols) in SHAPES {
            for (d, extra) in [(None, 0), (Some(&drop), 0), (Some(&drop), 3)] {
                let n = rows * cols;
                let BwdCase {
                    x,
                    w,
                    dout,
                    mean: m,
                    rstd: r,
                } = bwd_case(rows, cols, store, (41, 42));
                // `dinp`, `keep`, `dw`, `db` and the bias's after `be`.
                let run = |be: &dyn Fn(&mut [Vec<f32>; 5])| {
                    let mut v = [
                        vec![0.0; n + extra],
                        vec![0.0; n + extra],
                        vec![0.5; cols],
                        vec![-0.25; cols],
                        vec![0.125; cols],
                    ];
                    be(&mut v);
                    v.map(|x| bits(&x))
                };
                macro_rules! one_call {
                    ($be:expr) => {
                        |v: &mut [Vec<f32>; 5]| {
                            let [di, keep, dw, db, dl] = v;
                            let _ = $be.layernorm_bwd_split_bias_grad(
                                (di, keep, d),
                                (dw, db, dl),
                                &dout,
                                &x,
                                &w,
                                &m,
                                &r,
                                rows,
                                cols,
                            );
                        }
                    };
                }
                let two_calls = |v: &mut [Vec<f32>; 5]| {
                    let [di, keep, dw, db, dl] = v;
                    g.layernorm_bwd_split((di, keep, d), dw, db, &dout, &x, &w, &m, &r, rows, cols);
                    g.bias_grad(dl, di, rows, cols);
                };
                let what = format!("{store:?} {rows}x{cols} dropout {} +{extra}", d.is_some());
                let want = run(&two_calls);
                assert_eq!(run(&one_call!(g)), want, "{what}");
                let reversed = recipe_kernel_emu::reversed_blocks(|| run(&one_call!(g)));
                assert_eq!(reversed, want, "{what}, blocks reversed");
                assert_eq!(run(&one_call!(c)), want, "{what}: not the CPU's");
            }
        }
    }
}

/// With 16-bit buffers the bias gradient is summed in `layernorm_bwd_dwdb`'s launch (no
/// `bias_grad` launch); with `dinp` in f32 and `dout` in 16 bits (another type than the
/// kernel reads it as) it takes a `bias_grad` launch after; both give the CPU's bits.
#[test]
fn the_bias_below_takes_no_launch_of_its_own_where_dinp_is_douts_type() {
    use recipe_kernel_emu::EmuTyped;
    use recipe_runtime::backend::device::Device;
    use recipe_runtime::backend::kernels::Kernels;
    for store in [Dtype::F16, Dtype::Bf16] {
        let k = Kernels::new(EmuTyped).with_store(store);
        let (_, c) = pair(store);
        let (rows, cols) = (130, 96);
        let n = rows * cols;
        let BwdCase {
            x,
            w,
            dout,
            mean: m,
            rstd: r,
        } = bwd_case(rows, cols, store, (51, 52));
        let (mut di, mut keep) = (vec![0.0; n], vec![0.0; n]);
        let (mut dw, mut db, mut dl) = (vec![0.5; cols], vec![-0.25; cols], vec![0.125; cols]);
        c.layernorm_bwd_split_bias_grad(
            (&mut di, &mut keep, None),
            (&mut dw, &mut db, &mut dl),
            &dout,
            &x,
            &w,
            &m,
            &r,
            rows,
            cols,
        );
        let want = [dw, db, dl].map(|v| bits(&v));
        let put = |v: &[f32]| {
            let mut b = k.alloc_stored(v.len());
            k.write(k.view_mut(&mut b), v);
            b
        };
        for dinp16 in [true, false] {
            let what = format!("{store:?}, dinp in 16 bits {dinp16}");
            let (xb, gb, wb) = (put(&x), put(&dout), put(&w));
            let (mb, rb) = (k.upload(&m), k.upload(&r));
            let (mut di, mut keep) = if dinp16 {
                (put(&vec![0.0; n]), put(&vec![0.0; n]))
            } else {
                (k.upload(&vec![0.0; n]), k.upload(&vec![0.0; n]))
            };
            let mut sums =
                [vec![0.5; cols], vec![-0.25; cols], vec![0.125; cols]].map(|v| k.upload(&v));
            let [dw, db, dl] = &mut sums;
            assert!(EmuTyped.start_profile());
            k.layernorm_bwd_split_bias_grad(
                (&mut di, &mut keep, None),
                (k.view_mut(dw), k.view_mut(db), k.view_mut(dl)),
                k.view(&gb),
                k.view(&xb),
                k.view(&wb),
                k.view(&mb),
                k.view(&rb),
                rows,
                cols,
            );
            let prof = EmuTyped.profile().expect("started");
            assert_eq!(calls(&prof, "bias_grad"), u64::from(!dinp16), "{what}");
            assert_eq!(calls(&prof, "layernorm_bwd_dwdb"), 1, "{what}");
            let got = sums.each_ref().map(|b| {
                let mut out = vec![0.0; cols];
                k.download(k.view(b), &mut out);
                bits(&out)
            });
            assert_eq!(got, want, "{what}");
        }
    }
}
