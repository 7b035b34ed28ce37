//! runtime/kernels/elementwise.cu on the emulated device against the CPU backend.

use crate::common;

use common::{close, pair, rand, SIZES};
use recipe_runtime::backend::{Backend, Dropout, Gemm};
use recipe_runtime::precision::Dtype;

const STORES: [Dtype; 3] = [Dtype::F32, Dtype::F16, Dtype::Bf16];

#[test]
fn every_kernel_of_the_sources_is_in_the_emulation() {
    let mut built = recipe_kernel_emu::kernels();
    let mut listed: Vec<String> = recipe_runtime::backend::kernels::all_kernel_names()
        .into_iter()
        .map(String::from)
        .collect();
    built.sort();
    listed.sort();
    assert_eq!(built, listed);
    assert!(listed.iter().any(|k| k == "gelu_fwd"));
}

#[test]
fn unary_and_binary_kernels_match_the_cpu() {
    for store in STORES {
        let (g, c) = pair(store);
        // Rounding the inputs first keeps both sides on representable values.
        for &n in SIZES {
            let mut x = rand(n, 4.0, 1);
            let mut dy = rand(n, 1.0, 2);
            store.round_slice(&mut x);
            store.round_slice(&mut dy);
            let tol = if store.is_half() { 1e-2 } else { 2e-6 };
            let (mut a, mut b) = (vec![0.0; n], vec![0.0; n]);
            g.gelu_fwd(&mut a, &x);
            c.gelu_fwd(&mut b, &x);
            close("gelu_fwd", &a, &b, tol, tol);
            g.gelu_bwd(&mut a, &x, &dy);
            c.gelu_bwd(&mut b, &x, &dy);
            close("gelu_bwd", &a, &b, tol, tol);
            g.tanh_fwd(&mut a, &x);
            c.tanh_fwd(&mut b, &x);
            close("tanh_fwd", &a, &b, tol, tol);
            let y = a.clone();
            g.tanh_bwd(&mut a, &y, &dy);
            c.tanh_bwd(&mut b, &y, &dy);
            close("tanh_bwd", &a, &b, 0.0, 0.0);
            let (mut a, mut b) = (x.clone(), x.clone());
            g.add_assign(&mut a, &dy);
            c.add_assign(&mut b, &dy);
            close("add_assign", &a, &b, 0.0, 0.0);
        }
    }
}

#[test]
fn dropout_draws_the_cpu_mask_exactly() {
    for store in STORES {
        let (g, c) = pair(store);
        for &n in SIZES {
            let x = rand(n, 1.0, 3);
            for p in [0.1f32, 0.5, 0.9] {
                let d = Dropout {
                    p,
                    seed: 0xdead_beef_1234,
                    stream: 77 + n as u64,
                    site: 3,
                };
                let (mut a, mut b) = (x.clone(), x.clone());
                g.dropout(&mut a, &d);
                c.dropout(&mut b, &d);
                assert_eq!(a, b, "dropout n={n} p={p} {store:?}");
            }
        }
    }
}

#[test]
fn bias_kernels_match_the_cpu_bit_for_bit() {
    for store in STORES {
        let (g, c) = pair(store);
        // Rows around the bias gradient's chunk (64): one chunk, exactly one, one and a row,
        // several and a short one; and 33 chunks, more than the second pass loads at once (32).
        for (rows, cols) in [
            (0, 5),
            (1, 1),
            (1, 37),
            (13, 1),
            (9, 33),
            (40, 257),
            (64, 3),
            (65, 5),
            (200, 33),
            (300, 1),
            (2049, 3),
        ] {
            let out0 = rand(rows * cols, 2.0, 4);
            let bias = rand(cols, 1.0, 5);
            let (mut a, mut b) = (out0.clone(), out0.clone());
            g.add_bias(&mut a, &bias, rows, cols);
            c.add_bias(&mut b, &bias, rows, cols);
            close("add_bias", &a, &b, 0.0, 0.0);
            // After a GEMM left unrounded (`gemm_to_epilogue`): the CPU's GEMM rounds, then
            // adds the bias.
            let (mut a, mut b) = (out0.clone(), out0.clone());
            store.round_slice(&mut b);
            g.bias_epilogue(&mut a, &bias, rows, cols);
            c.add_bias(&mut b, &bias, rows, cols);
            close("bias_epilogue", &a, &b, 0.0, 0.0);
            let db0 = rand(cols, 1.0, 6);
            let (mut a, mut b) = (db0.clone(), db0.clone());
            g.bias_grad(&mut a, &out0, rows, cols);
            c.bias_grad(&mut b, &out0, rows, cols);
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&a), bits(&b), "bias_grad {store:?} {rows}×{cols}");
            // The blocks last to first: another block of each column adds the chunks' sums
            // (common.cuh, `last_of_column`), in the same order. A sum of other values first
            // leaves other chunk sums in the scratch, so a block that added them before every
            // chunk had written its own would show.
            let mut r = db0.clone();
            g.bias_grad(&mut r, &rand(rows * cols, 3.0, 9), rows, cols);
            let mut r = db0.clone();
            recipe_kernel_emu::reversed_blocks(|| g.bias_grad(&mut r, &out0, rows, cols));
            assert_eq!(
                bits(&r),
                bits(&b),
                "bias_grad reversed {store:?} {rows}×{cols}"
            );
            // The order is the documented one: chunks of 64 rows from zero, then added to db.
            let mut want = db0.clone();
            for chunk in out0.chunks(64 * cols) {
                let mut part = vec![0.0f32; cols];
                for row in chunk.chunks(cols) {
                    for (p, d) in part.iter_mut().zip(row) {
                        *p += d;
                    }
                }
                for (w, p) in want.iter_mut().zip(&part) {
                    *w += p;
                }
            }
            store.round_slice(&mut want);
            assert_eq!(
                bits(&b),
                bits(&want),
                "bias_grad order {store:?} {rows}×{cols}"
            );
        }
    }
}

#[test]
fn gemm_output_is_rounded_to_the_storage_dtype() {
    // The emulated GEMM is the CPU's; what is tested is the rounding pass after it, on a C with
    // a wider row stride (only the first n columns of each row are C).
    for store in STORES {
        let (g, c) = pair(store);
        let (m, n, k) = (5, 7, 9);
        let a = rand(m * k, 1.0, 7);
        let b = rand(k * n, 1.0, 8);
        let mut gm = Gemm::dense(m, n, k, false, false, 0.0);
        gm.ldc = n + 3;
        let (mut x, mut y) = (vec![0.5; m * (n + 3)], vec![0.5; m * (n + 3)]);
        g.gemm(&gm, &a, &b, &mut x);
        c.gemm(&gm, &a, &b, &mut y);
        close("gemm", &x, &y, 0.0, 0.0);
    }
}

#[test]
#[should_panic(expected = "is not in runtime/kernels")]
fn an_unknown_kernel_is_refused() {
    use recipe_runtime::backend::device::{Device, Launch};
    recipe_kernel_emu::Emu.launch(
        "no_such_kernel",
        Launch {
            grid: (1, 1, 1),
            block: (1, 1, 1),
            smem: 0,
        },
        &[],
    );
}

/// A launch whose arguments are not the kernel's parameter list (here `add_assign(float* acc,
/// const float* x, int n, int store)` without its `store`, then with an `unsigned` for `n`)
/// is refused before it runs: a GPU would read the missing parameter's bytes from whatever
/// follows.
#[test]
fn a_launch_with_the_wrong_parameters_is_refused() {
    use recipe_runtime::backend::device::{Arg, Device, Launch};
    let mut acc = [1.0f32; 4];
    let x = [2.0f32; 4];
    let l = Launch {
        grid: (1, 1, 1),
        block: (4, 1, 1),
        smem: 0,
    };
    let (pa, px) = (acc.as_mut_ptr() as u64, x.as_ptr() as u64);
    let wrong: [&[Arg]; 2] = [
        &[Arg::Ptr(pa), Arg::Ptr(px), Arg::I32(4)],
        &[Arg::Ptr(pa), Arg::Ptr(px), Arg::U32(4), Arg::I32(0)],
    ];
    for args in wrong {
        let run = std::panic::catch_unwind(|| recipe_kernel_emu::Emu.launch("add_assign", l, args));
        let msg = run.expect_err("refused");
        let msg = msg.downcast_ref::<String>().expect("a message");
        assert!(msg.contains("does not match"), "{msg}");
    }
    assert_eq!(acc, [1.0; 4], "nothing ran");
    let right = [Arg::Ptr(pa), Arg::Ptr(px), Arg::I32(4), Arg::I32(0)];
    recipe_kernel_emu::Emu.launch("add_assign", l, &right);
    assert_eq!(acc, [3.0; 4]);
}

/// `xs` and the values where rounding to fp16/bf16 shows: fp16's and bf16's ties to even,
/// fp16's largest value and overflow to inf, subnormals, signed zeros and infinities.
fn half_edges(mut xs: Vec<f32>) -> Vec<f32> {
    xs.extend([
        0.0,
        -0.0,
        1.0 + 2f32.powi(-11),
        1.0 + 3.0 * 2f32.powi(-11),
        1.0 + 2f32.powi(-8),
        1.0 + 3.0 * 2f32.powi(-8),
        65504.0,
        65519.0,
        65520.0,
        -1e6,
        1e-7,
        -3e-5,
        1e-40,
        3.0e38,
        f32::INFINITY,
        f32::NEG_INFINITY,
    ]);
    xs
}

/// `pack_half` (the operands of the tensor-core GEMMs) writes the bits the `half` crate gives:
/// random values, fp16's and bf16's ties to even, fp16's largest value and overflow to inf,
/// subnormals, signed zeros and infinities, odd lengths; a NaN stays a NaN.
#[test]
fn pack_half_writes_the_half_crates_bits() {
    use recipe_runtime::backend::device::{Arg, Device, Launch};
    let mut xs = half_edges(rand(1000, 8.0, 5));
    xs.push(f32::NAN);
    for (store, code) in [(Dtype::F16, 1), (Dtype::Bf16, 2)] {
        for n in [1usize, 255, 257, xs.len()] {
            let mut out = vec![0xdeadu16; n + 1];
            let launch = Launch {
                grid: (n.div_ceil(256) as u32, 1, 1),
                block: (256, 1, 1),
                smem: 0,
            };
            let args = [
                Arg::Ptr(out.as_mut_ptr() as u64),
                Arg::Ptr(xs.as_ptr() as u64),
                Arg::I32(n as i32),
                Arg::I32(code),
            ];
            recipe_kernel_emu::Emu.launch("pack_half", launch, &args);
            assert_eq!(out[n], 0xdead, "{store:?}: wrote past n = {n}");
            for (i, (&x, &got)) in xs.iter().zip(&out[..n]).enumerate() {
                let (want, back) = match store {
                    Dtype::F16 => (
                        half::f16::from_f32(x).to_bits(),
                        half::f16::from_bits(got).to_f32(),
                    ),
                    _ => (
                        half::bf16::from_f32(x).to_bits(),
                        half::bf16::from_bits(got).to_f32(),
                    ),
                };
                if x.is_nan() {
                    assert!(back.is_nan(), "{store:?} [{i}]: NaN packed as {got:#06x}");
                } else {
                    assert_eq!(got, want, "{store:?} [{i}] {x:e}");
                    // A value the run already stores rounded packs exactly.
                    assert_eq!(back.to_bits(), store.round(x).to_bits(), "{store:?} {x:e}");
                }
            }
        }
    }
}

/// `convert` (a GPU's f32 batched GEMM on 16-bit buffers, `Device::gemm_batched`): f32 → fp16/bf16
/// writes `pack_half`'s bits (the `half` crate's, rounded to nearest even), fp16/bf16 → f32 the
/// exact value, f32 → f32 and a 16-bit buffer into another of its type copy; nothing past `n`.
#[test]
fn convert_rounds_as_the_half_crate_and_widens_exactly() {
    use recipe_runtime::backend::device::{Arg, Device, Launch};
    let xs = half_edges(rand(700, 8.0, 6));
    let n = xs.len();
    let launch = Launch {
        grid: (n.div_ceil(256) as u32, 1, 1),
        block: (256, 1, 1),
        smem: 0,
    };
    let run = |dst: u64, to: Dtype, src: u64, from: Dtype| {
        let args = [
            Arg::Typed(dst, to),
            Arg::Typed(src, from),
            Arg::I32(n as i32),
        ];
        recipe_kernel_emu::Emu.launch("convert", launch, &args);
    };
    for half in [Dtype::F16, Dtype::Bf16] {
        let bits = |x: f32| match half {
            Dtype::F16 => half::f16::from_f32(x).to_bits(),
            _ => half::bf16::from_f32(x).to_bits(),
        };
        let mut narrow = vec![0xdeadu16; n + 1];
        run(
            narrow.as_mut_ptr() as u64,
            half,
            xs.as_ptr() as u64,
            Dtype::F32,
        );
        assert_eq!(narrow[n], 0xdead, "{half:?}: wrote past n");
        for (i, (&x, &got)) in xs.iter().zip(&narrow).enumerate() {
            assert_eq!(got, bits(x), "{half:?} [{i}] {x:e}");
        }
        let mut wide = vec![f32::NAN; n + 1];
        run(
            wide.as_mut_ptr() as u64,
            Dtype::F32,
            narrow.as_ptr() as u64,
            half,
        );
        assert!(wide[n].is_nan(), "{half:?}: widened past n");
        for (i, (&x, &got)) in xs.iter().zip(&wide).enumerate() {
            assert_eq!(
                got.to_bits(),
                half.round(x).to_bits(),
                "{half:?} [{i}] {x:e}"
            );
        }
        let mut same = vec![0u16; n];
        run(same.as_mut_ptr() as u64, half, narrow.as_ptr() as u64, half);
        assert_eq!(same[..], narrow[..n], "{half:?} into {half:?}");
    }
    let mut copy = vec![0.0f32; n];
    run(
        copy.as_mut_ptr() as u64,
        Dtype::F32,
        xs.as_ptr() as u64,
        Dtype::F32,
    );
    assert_eq!(copy, xs);
}

/// `gemm_pointers` as the GPU launches it, the addresses its batched GEMM reads
/// (`cublasGemmBatchedEx`): item `j`
/// of each operand at its base plus `Batch::offset` elements of its own size (2 for fp16/bf16,
/// 4 for f32), `A`'s, then `B`'s, then `C`'s; nothing past them. Attention's batches
/// (an item per sequence and head) and batches of one outer index or one item per index.
#[test]
fn gemm_pointers_are_the_batchs_offsets() {
    use recipe_runtime::backend::device::Device;
    use recipe_runtime::backend::kernels::gemm_pointers;
    use recipe_runtime::backend::{Batch, Stride};
    let st = |outer, inner| Stride { outer, inner };
    let batches = [
        // (sequence, head) over [2, 7, 3·5] tokens and [2, 3, 7, 7] probabilities.
        Batch {
            count: 6,
            inner: 3,
            a: st(7 * 15, 5),
            b: st(3 * 49, 49),
            c: st(7 * 15, 5),
        },
        Batch {
            count: 4,
            inner: 4,
            a: st(0, 9),
            b: st(0, 0),
            c: st(0, 11),
        },
        Batch {
            count: 300,
            inner: 1,
            a: st(13, 0),
            b: st(0, 0),
            c: st(17, 0),
        },
    ];
    for b in batches {
        // Each operand's element size on its own (a 16-bit operand next to an f32 one).
        for sizes in [(2u64, 2, 4), (4, 4, 4), (2, 4, 2), (4, 2, 2)] {
            let n = b.count;
            let mut out = vec![0xdead_beef_u64; 3 * n + 1];
            let (pa, pb, pc) = (0x1000_0000_u64, 0x2000_0000_u64, 0x3000_0000_u64);
            let (launch, args) = gemm_pointers(out.as_mut_ptr() as u64, (pa, pb, pc), &b, sizes);
            recipe_kernel_emu::Emu.launch("gemm_pointers", launch, &args);
            assert_eq!(out[3 * n], 0xdead_beef, "{b:?}: wrote past the lists");
            for j in 0..n {
                assert_eq!(
                    out[j],
                    pa + sizes.0 * b.offset(b.a, j) as u64,
                    "{b:?} A {j}"
                );
                assert_eq!(
                    out[n + j],
                    pb + sizes.1 * b.offset(b.b, j) as u64,
                    "{b:?} B {j}"
                );
                assert_eq!(
                    out[2 * n + j],
                    pc + sizes.2 * b.offset(b.c, j) as u64,
                    "{b:?} C {j}"
                );
            }
        }
    }
}

/// `scale_round`, the devices' average of a sum over the ranks: bit for bit the host's
/// `ReduceOp::Avg` (× the f32 `1/N`) followed by `Storage::reduced` (the communication dtype,
/// then the module's), for every pair of dtypes, on odd lengths and values past fp16's range.
#[test]
fn scale_round_is_the_hosts_average_and_rounding_bit_for_bit() {
    use recipe_runtime::backend::kernels::Kernels;
    use recipe_runtime::zero::Storage;
    let k = Kernels::new(recipe_kernel_emu::Emu);
    for world in [2usize, 3, 7] {
        let inv = 1.0 / world as f32;
        for &n in SIZES {
            let mut xs = rand(n, 3e5, 9 + world as u64);
            xs[0] = 65519.0 * world as f32;
            for comm in STORES {
                for module in STORES {
                    let mut got = xs.clone();
                    k.scale_round(&mut got[..], inv, comm, module);
                    let mut want: Vec<f32> = xs.iter().map(|x| x * inv).collect();
                    Storage { module, comm }.reduced(&mut want);
                    let same = got
                        .iter()
                        .zip(&want)
                        .all(|(a, b)| a.to_bits() == b.to_bits());
                    assert!(
                        same,
                        "N = {world}, n = {n}, comm {comm:?}, module {module:?}"
                    );
                }
            }
        }
    }
}

/// The fused epilogues of a linear layer (`bias_dropout_add`, `bias_gelu`) are the separate
/// kernels' bits in one pass: with and without dropout, in every storage dtype, on shapes that
/// are not multiples of the block; and a buffer longer than the matrix takes the separate
/// kernels (as the default does). The CPU backend runs the composition, so this also keeps the
/// device equal to the CPU wherever the separate kernels are.
#[test]
fn fused_epilogues_are_the_separate_kernels_bit_for_bit() {
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    for store in STORES {
        let (g, _) = pair(store);
        for (rows, cols) in [(1, 1), (3, 7), (5, 33), (17, 256), (2, 300)] {
            let n = rows * cols;
            let mut out = rand(n, 3.0, 11);
            let mut bias = rand(cols, 1.0, 12);
            let mut res = rand(n, 2.0, 13);
            store.round_slice(&mut out);
            store.round_slice(&mut bias);
            store.round_slice(&mut res);
            for d in [
                None,
                Some(Dropout {
                    p: 0.3,
                    seed: 0x1234_5678_9abc,
                    stream: 9,
                    site: 3,
                }),
            ] {
                let ctx = format!("{store:?} {rows}×{cols} dropout {}", d.is_some());
                let mut fused = out.clone();
                g.bias_dropout_add(&mut fused, &bias, rows, cols, d.as_ref(), &res);
                let mut apart = out.clone();
                g.add_bias(&mut apart, &bias, rows, cols);
                if let Some(d) = &d {
                    g.dropout(&mut apart, d);
                }
                g.add_assign(&mut apart, &res);
                assert_eq!(bits(&fused), bits(&apart), "bias_dropout_add {ctx}");
                if d.is_some() && n >= 32 {
                    // A dropped element leaves the residual alone.
                    assert!(
                        fused.iter().zip(&res).any(|(f, r)| f == r),
                        "{ctx}: nothing dropped"
                    );
                }
            }
            let mut inter = out.clone();
            let mut act = vec![0.0; n];
            g.bias_gelu(&mut inter, &mut act, &bias, rows, cols);
            let mut inter2 = out.clone();
            let mut act2 = vec![0.0; n];
            g.add_bias(&mut inter2, &bias, rows, cols);
            g.gelu_fwd(&mut act2, &inter2);
            // The pre-activation is left without its bias: the backward adds it again.
            assert!(g.gelu_bwd_adds_bias());
            assert_eq!(bits(&inter), bits(&out), "bias_gelu's inter {store:?}");
            assert_eq!(bits(&act), bits(&act2), "bias_gelu {store:?} {rows}×{cols}");
        }
        // A buffer longer than the matrix (a workspace sized for longer batches): the separate
        // kernels over the whole buffer, as the default runs them.
        let (rows, cols) = (3, 5);
        let mut long = rand(20, 1.0, 14);
        store.round_slice(&mut long);
        let res = vec![0.25; 20];
        let bias = vec![0.5; cols];
        let mut fused = long.clone();
        g.bias_dropout_add(&mut fused, &bias, rows, cols, None, &res);
        let mut apart = long.clone();
        g.add_bias(&mut apart, &bias, rows, cols);
        g.add_assign(&mut apart, &res);
        assert_eq!(bits(&fused), bits(&apart), "{store:?}: a longer buffer");
    }
}

/// A GEMM into a fused epilogue (`gemm_to_epilogue`, whose half-precision output is rounded by
/// the epilogue instead of a pass of its own) gives the bits of the GEMM, its rounding pass and
/// the separate kernels, and the CPU's, in every storage dtype; so does the fallback for a
/// buffer longer than the matrix, and the backward's GEMM into `gelu_bwd`.
#[test]
fn a_gemm_into_a_fused_epilogue_is_the_separate_passes_bit_for_bit() {
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    for store in STORES {
        let (g, c) = pair(store);
        for (rows, cols, k) in [(1, 1, 1), (5, 33, 7), (17, 40, 64)] {
            let mut a = rand(rows * k, 1.0, 21);
            let mut w = rand(cols * k, 1.0, 22);
            let mut bias = rand(cols, 0.5, 23);
            let mut res = rand(rows * cols, 1.0, 24);
            for v in [&mut a, &mut w, &mut bias, &mut res] {
                store.round_slice(v);
            }
            let gm = Gemm::dense(rows, cols, k, false, true, 0.0);
            let d = Dropout {
                p: 0.2,
                seed: 99,
                stream: 3,
                site: 3,
            };
            for extra in [0, 6] {
                let n = rows * cols + extra;
                let ctx = format!("{store:?} {rows}×{cols}×{k} +{extra}");
                let res = {
                    let mut r = res.clone();
                    r.resize(n, 0.5);
                    r
                };
                // The separate passes on the device, and on the CPU.
                let mut want = vec![0.0; n];
                let mut cpu = vec![0.0; n];
                for (be_out, gemm) in [(&mut want, true), (&mut cpu, false)] {
                    if gemm {
                        g.gemm(&gm, &a, &w, &mut be_out[..rows * cols]);
                        g.add_bias(be_out, &bias, rows, cols);
                        g.dropout(be_out, &d);
                        g.add_assign(be_out, &res);
                    } else {
                        c.gemm(&gm, &a, &w, &mut be_out[..rows * cols]);
                        c.add_bias(be_out, &bias, rows, cols);
                        c.dropout(be_out, &d);
                        c.add_assign(be_out, &res);
                    }
                }
                let mut got = vec![0.0; n];
                g.gemm_to_epilogue(&gm, &a, &w, &mut got[..rows * cols]);
                if store.is_half() && k > 1 {
                    // The rounding pass was left to the epilogue: the GEMM's fp32 output is
                    // still there.
                    let mut rounded = got.clone();
                    store.round_slice(&mut rounded);
                    assert_ne!(
                        bits(&rounded),
                        bits(&got),
                        "{ctx}: the GEMM rounded its output"
                    );
                }
                g.bias_dropout_add(&mut got, &bias, rows, cols, Some(&d), &res);
                assert_eq!(bits(&got), bits(&want), "bias_dropout_add {ctx}");
                assert_eq!(bits(&got), bits(&cpu), "bias_dropout_add vs the CPU {ctx}");

                let m = rows * cols;
                let (mut inter, mut act) = (vec![0.0; n], vec![0.0; n]);
                g.gemm_to_epilogue(&gm, &a, &w, &mut inter[..m]);
                let product = inter.clone();
                g.bias_gelu(&mut inter, &mut act, &bias, rows, cols);
                let (mut inter2, mut act2) = (vec![0.0; n], vec![0.0; n]);
                g.gemm(&gm, &a, &w, &mut inter2[..m]);
                g.add_bias(&mut inter2, &bias, rows, cols);
                g.gelu_fwd(&mut act2, &inter2);
                // `inter` is the GEMM's output as it was (unrounded where the GEMM left the
                // rounding to the epilogue); `act` past the matrix is not written.
                assert_eq!(bits(&inter), bits(&product), "bias_gelu's inter {ctx}");
                assert_eq!(bits(&act[..m]), bits(&act2[..m]), "bias_gelu {ctx}");
                assert!(
                    act[m..].iter().all(|&x| x == 0.0),
                    "bias_gelu past the matrix {ctx}"
                );

                // The backward's d(act) straight into gelu_bwd.
                let (mut dact, mut dinter) = (vec![0.0; m], vec![0.0; m]);
                g.gemm_to_epilogue(&gm, &a, &w, &mut dact);
                g.gelu_bwd(&mut dinter, &inter2[..m], &dact);
                let (mut dact2, mut dinter2) = (vec![0.0; m], vec![0.0; m]);
                g.gemm(&gm, &a, &w, &mut dact2);
                g.gelu_bwd(&mut dinter2, &inter2[..m], &dact2);
                assert_eq!(bits(&dinter), bits(&dinter2), "gelu_bwd after a GEMM {ctx}");
                // And given the bias to add again to the unrounded product bias_gelu left,
                // with the bias's gradient: the same bits as from the biased pre-activation,
                // and the CPU's.
                let db0 = rand(cols, 0.5, 25);
                let (mut d3, mut db3) = (vec![0.0; m], db0.clone());
                g.gelu_bwd_bias_grad(
                    &mut d3,
                    &inter[..m],
                    Some(&bias),
                    &dact,
                    &mut db3,
                    rows,
                    cols,
                );
                let (mut d4, mut db4) = (vec![0.0; m], db0.clone());
                g.gelu_bwd_bias_grad(&mut d4, &inter2[..m], None, &dact2, &mut db4, rows, cols);
                assert_eq!(bits(&d3), bits(&d4), "gelu_bwd given the bias {ctx}");
                assert_eq!(bits(&db3), bits(&db4), "its bias gradient {ctx}");
                let (mut d5, mut db5) = (vec![0.0; m], db0);
                let mut pre = vec![0.0; m];
                c.gemm(&gm, &a, &w, &mut pre);
                c.add_bias(&mut pre, &bias, rows, cols);
                let mut dact5 = vec![0.0; m];
                c.gemm(&gm, &a, &w, &mut dact5);
                c.gelu_bwd_bias_grad(&mut d5, &pre, None, &dact5, &mut db5, rows, cols);
                let tol = if store == Dtype::F32 { 1e-5 } else { 1e-2 };
                close("gelu_bwd given the bias vs the CPU", &d3, &d5, tol, tol);
            }
        }
    }
}

/// `EmuTyped`'s queued copies run at `wait_copies`, not when queued (the latest a GPU's copy
/// stream may run them; `Emu` copies at once), so that a missing wait shows (tests/run.rs).
#[test]
fn the_typed_emulators_queued_copies_land_at_wait_copies() {
    use recipe_kernel_emu::EmuTyped;
    use recipe_runtime::backend::device::Device;
    let dev = EmuTyped;
    let mut buf = dev.upload(&[1.0, 2.0, 3.0]);
    let mut half = dev.alloc_half(2, Dtype::Bf16);
    let up = [7.0f32, 8.0, 9.0];
    let bits = [Dtype::Bf16.bits(0.5), Dtype::Bf16.bits(-4.0)];
    let mut down = vec![0.0f32; 3];
    let now = |b: &_| {
        let mut v = vec![0.0; 3];
        dev.download(dev.view(b), &mut v);
        v
    };
    // SAFETY: every buffer outlives the wait below and none is touched before it.
    unsafe {
        dev.download_queued(dev.view(&buf), down.as_mut_ptr());
        dev.upload_queued(dev.view_mut(&mut buf), up.as_ptr());
        dev.upload_queued_bits(dev.view_mut(&mut half), bits.as_ptr());
    }
    assert_eq!(now(&buf), [1.0, 2.0, 3.0], "the upload ran before the wait");
    let mut h = vec![0.0; 2];
    dev.download(dev.view(&half), &mut h);
    assert_eq!(h, [0.0, 0.0]);
    assert_eq!(down, [0.0; 3], "the download ran before the wait");
    dev.wait_copies().unwrap();
    // In the order queued: the download read the buffer before the upload wrote it.
    assert_eq!(down, [1.0, 2.0, 3.0]);
    assert_eq!(now(&buf), up);
    dev.download(dev.view(&half), &mut h);
    assert_eq!(h, [0.5, -4.0]);
}

/// `EmuTyped`'s graphs: a capture records device work without running it, a replay runs it on
/// the memory as it is then (new inputs, the same addresses and arguments), and host work
/// during a capture fails it.
#[test]
fn the_typed_emulator_captures_and_replays_device_work() {
    use recipe_kernel_emu::{graphs_replayed, EmuTyped};
    use recipe_runtime::backend::device::Device;
    use recipe_runtime::backend::kernels::Kernels;
    let k = Kernels::new(EmuTyped);
    let dev = k.device();
    let (mut x, mut y) = (dev.upload(&[1.0, -2.0]), dev.upload(&[0.0; 2]));
    let read = |b: &_| {
        let mut v = vec![0.0; 2];
        dev.download(dev.view(b), &mut v);
        v
    };
    assert!(dev.begin_capture());
    assert!(!dev.begin_capture(), "one capture at a time");
    k.copy(k.view_mut(&mut y), k.view(&x));
    k.add_assign(k.view_mut(&mut y), k.view(&x));
    let id = dev.end_capture().expect("device work only");
    assert_eq!(read(&y), [0.0, 0.0], "captured work ran");
    let replayed = graphs_replayed();
    assert!(dev.launch_graph(id));
    assert_eq!(read(&y), [2.0, -4.0]);
    // New inputs in the same buffer: the replay reads them.
    dev.write(dev.view_mut(&mut x), &[3.0, 0.5]);
    assert!(dev.launch_graph(id));
    assert_eq!(read(&y), [6.0, 1.0]);
    assert_eq!(graphs_replayed(), replayed + 2);
    dev.drop_graph(id);
    assert!(!dev.launch_graph(id));
    // A copy from the host inside a capture fails it.
    assert!(dev.begin_capture());
    dev.write(dev.view_mut(&mut x), &[1.0, 1.0]);
    assert_eq!(dev.end_capture(), None);
}

/// Several GEMM outputs' biases in one launch (`Backend::bias_epilogue_items`: attention's q, k
/// and v), each item's bias a stride apart, against the CPU's one call per item: 12 columns and
/// a stride of 20 (the one-at-a-time path), 16 and 24 (the vectorised one on a device keeping
/// 16-bit buffers), f32 and 16-bit buffers.
#[test]
fn biases_of_several_items_in_one_launch_match_the_cpu() {
    use recipe_kernel_emu::EmuTyped;
    use recipe_runtime::backend::kernels::Kernels;
    for store in STORES {
        let (g, c) = pair(store);
        let typed = Kernels::new(EmuTyped).with_store(store);
        for (rows, cols, stride) in [(5, 12, 20), (7, 16, 24)] {
            let out0 = rand(3 * rows * cols, 2.0, 7);
            // Parameters of the store (a device keeps them in 16 bits).
            let mut bias = rand(2 * stride + cols, 1.0, 8);
            store.round_slice(&mut bias);
            let mut want = out0.clone();
            store.round_slice(&mut want);
            c.bias_epilogue_items(&mut want, &bias, rows, cols, 3, stride);
            let mut a = out0.clone();
            g.bias_epilogue_items(&mut a, &bias, rows, cols, 3, stride);
            close("bias_epilogue_items", &a, &want, 0.0, 0.0);
            // 16-bit buffers hold what the GEMM rounded.
            let mut o = typed.alloc_stored(out0.len());
            let mut rounded = out0.clone();
            store.round_slice(&mut rounded);
            typed.write(typed.view_mut(&mut o), &rounded);
            let mut b = typed.alloc_stored(bias.len());
            typed.write(typed.view_mut(&mut b), &bias);
            typed.bias_epilogue_items(
                typed.view_mut(&mut o),
                typed.view(&b),
                rows,
                cols,
                3,
                stride,
            );
            let mut got = vec![0.0; out0.len()];
            typed.download(typed.view(&o), &mut got);
            close("bias_epilogue_items 16-bit", &got, &want, 0.0, 0.0);
        }
    }
}

/// `gelu_bwd_bias_grad` (one kernel on a device keeping 16-bit buffers, or for f32) against
/// `gelu_bwd` then `bias_grad` on the same device, bit for bit, with its blocks in order and
/// last to first: widths of one pair, of three pairs, past one block of pairs (514), and odd
/// (7, which takes the two kernels); rows in one chunk, past one, and past two.
#[test]
fn gelu_backward_with_its_bias_gradient_is_the_two_kernels_bit_for_bit() {
    use recipe_kernel_emu::EmuTyped;
    use recipe_runtime::backend::kernels::Kernels;
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    for store in STORES {
        let k = Kernels::new(EmuTyped).with_store(store);
        let cpu = recipe_runtime::backend::Cpu::new(1).with_store(store);
        for (rows, cols) in [(1, 2), (65, 6), (130, 514), (9, 7)] {
            let n = rows * cols;
            let (mut x, mut dy) = (rand(n, 3.0, 11), rand(n, 1.0, 12));
            store.round_slice(&mut x);
            store.round_slice(&mut dy);
            let db0 = rand(cols, 0.5, 13);
            let put = |v: &[f32]| {
                let mut b = k.alloc_stored(v.len());
                k.write(k.view_mut(&mut b), v);
                b
            };
            let (xb, dyb) = (put(&x), put(&dy));
            let get = |b: &<Kernels<EmuTyped> as Backend>::Buf, len: usize| {
                let mut out = vec![0.0; len];
                k.download(k.view(b), &mut out);
                out
            };
            // The two kernels.
            let (mut d2, mut db2) = (put(&vec![7.0; n]), k.upload(&db0));
            k.gelu_bwd(k.view_mut(&mut d2), k.view(&xb), k.view(&dyb));
            k.bias_grad(k.view_mut(&mut db2), k.view(&d2), rows, cols);
            let (want_d, want_db) = (get(&d2, n), get(&db2, cols));
            // The pre-activation without its bias, as bias_gelu leaves it, and the bias at an
            // odd place in a 16-bit buffer (as in the parameters): the kernel adds it again
            // as it loads `inp`, st(x + b), the same bits as from `x` biased by `add_bias`.
            let mut bias = rand(cols, 1.0, 14);
            store.round_slice(&mut bias);
            let mut params = k.alloc_stored(cols + 3);
            k.write(k.sub_mut(&mut k.view_mut(&mut params), 3..cols + 3), &bias);
            let mut biased = put(&x);
            let bias_view = || k.sub(k.view(&params), 3..cols + 3);
            k.add_bias(k.view_mut(&mut biased), bias_view(), rows, cols);
            let (mut d3, mut db3) = (put(&vec![7.0; n]), k.upload(&db0));
            k.gelu_bwd(k.view_mut(&mut d3), k.view(&biased), k.view(&dyb));
            k.bias_grad(k.view_mut(&mut db3), k.view(&d3), rows, cols);
            let (want_bd, want_bdb) = (get(&d3, n), get(&db3, cols));
            for (with_bias, want_d, want_db) in
                [(false, &want_d, &want_db), (true, &want_bd, &want_bdb)]
            {
                for reversed in [false, true] {
                    let (mut d, mut db) = (put(&vec![7.0; n]), k.upload(&db0));
                    let mut run = || {
                        k.gelu_bwd_bias_grad(
                            &mut d,
                            k.view(&xb),
                            with_bias.then(bias_view),
                            k.view(&dyb),
                            k.view_mut(&mut db),
                            rows,
                            cols,
                        )
                    };
                    if reversed {
                        recipe_kernel_emu::reversed_blocks(run);
                    } else {
                        run();
                    }
                    let what =
                        format!("{store:?} {rows}×{cols} reversed {reversed} bias {with_bias}");
                    assert_eq!(bits(&get(&d, n)), bits(want_d), "dinp {what}");
                    assert_eq!(bits(&get(&db, cols)), bits(want_db), "db {what}");
                }
            }
            // And the CPU's, within GELU's tolerance (its erf and exp are the CPU's own).
            let (mut cd, mut cdb) = (vec![0.0; n], db0.clone());
            cpu.gelu_bwd_bias_grad(&mut cd, &x, None, &dy, &mut cdb, rows, cols);
            let tol = if store == Dtype::F32 { 1e-5 } else { 1e-2 };
            close("gelu_bwd vs CPU", &want_d, &cd, tol, tol);
            close("db vs CPU", &want_db, &cdb, tol * rows as f32, tol);
        }
    }
}

/// Several bias gradients in one launch (`Backend::bias_grad_items`: attention's q and v, the
/// columns of dq and dv in one buffer's rows), against the CPU's one `bias_grad` per item (on a
/// dense copy of its rows) bit for bit, with the launch's blocks in order, last to first, and
/// the items' blocks interleaved (each item's last block of a column adds its chunks, from sums
/// and a counter of its own): rows in one chunk and past two, widths in one block and past it
/// (300), dense rows and rows further apart than their width, f32 and 16-bit buffers, and the
/// bias rows left between the items untouched; the CPU's own `bias_grad_items` too.
#[test]
fn bias_gradients_of_several_items_in_one_launch_are_the_cpus_bit_for_bit() {
    use recipe_kernel_emu::EmuTyped;
    use recipe_runtime::backend::kernels::Kernels;
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    for store in STORES {
        let (g, c) = pair(store);
        for (rows, cols, ld, db_stride) in [
            (5, 12, 12, 20),
            (150, 300, 300, 310),
            (5, 12, 41, 20),
            (150, 300, 913, 310),
        ] {
            // Dense items one after another, or columns of one buffer's rows as bert.rs's.
            let (count, dout_stride) = (
                2,
                if ld == cols {
                    2 * rows * cols + 3
                } else {
                    2 * cols + 2
                },
            );
            let mut dout = rand((count - 1) * dout_stride + (rows - 1) * ld + cols, 1.0, 14);
            store.round_slice(&mut dout);
            let db0 = rand((count - 1) * db_stride + cols, 0.5, 15);
            let mut want = db0.clone();
            for j in 0..count {
                let dense: Vec<f32> = (0..rows)
                    .flat_map(|r| {
                        let at = j * dout_stride + r * ld;
                        dout[at..at + cols].to_vec()
                    })
                    .collect();
                let b = j * db_stride;
                c.bias_grad(&mut want[b..b + cols], &dense, rows, cols);
            }
            let mut cpu = db0.clone();
            c.bias_grad_items(
                &mut cpu,
                &dout,
                rows,
                cols,
                ld,
                count,
                dout_stride,
                db_stride,
            );
            assert_eq!(
                bits(&cpu),
                bits(&want),
                "the CPU's items {store:?} {rows}×{cols}/{ld}"
            );
            for order in ["forward", "reversed", "interleaved"] {
                let what = format!("{store:?} {rows}×{cols}/{ld} blocks {order}");
                // A device of its own each time: no chunk sums left from another run.
                let run = || {
                    let typed = Kernels::new(EmuTyped).with_store(store);
                    let mut a = db0.clone();
                    g.bias_grad_items(&mut a, &dout, rows, cols, ld, count, dout_stride, db_stride);
                    let d = {
                        let mut b = typed.alloc_stored(dout.len());
                        typed.write(typed.view_mut(&mut b), &dout);
                        b
                    };
                    let mut db = typed.upload(&db0);
                    typed.bias_grad_items(
                        typed.view_mut(&mut db),
                        typed.view(&d),
                        rows,
                        cols,
                        ld,
                        count,
                        dout_stride,
                        db_stride,
                    );
                    let mut got = vec![0.0; db0.len()];
                    typed.download(typed.view(&db), &mut got);
                    (a, got)
                };
                let (a, got) = match order {
                    "reversed" => recipe_kernel_emu::reversed_blocks(run),
                    "interleaved" => recipe_kernel_emu::interleaved_blocks(run),
                    _ => run(),
                };
                assert_eq!(bits(&a), bits(&want), "f32 buffers {what}");
                assert_eq!(bits(&got), bits(&want), "16-bit buffers {what}");
            }
            // The items' sums are not the first item's: the stride moves them.
            let mut first = db0.clone();
            c.bias_grad_items(&mut first, &dout, rows, cols, ld, 1, 0, 0);
            assert_ne!(bits(&first[db_stride..]), bits(&want[db_stride..]));
        }
    }
}

/// A column sum queued inside `Backend::aside` takes scratch of its own (chunk sums and
/// counters), not the one the sums queued in order use: on a GPU the side stream's sums (a
/// LayerNorm's `dw`/`db`, q's and v's biases) run while the compute stream's use theirs. Seen
/// here as the first aside sum's allocations (two buffers, once); the same sums either way.
#[test]
fn column_sums_aside_take_their_own_scratch() {
    use recipe_kernel_emu::EmuTyped;
    use recipe_runtime::backend::kernels::Kernels;
    let k = Kernels::new(EmuTyped);
    let (rows, cols) = (70, 5);
    let d = k.upload(&rand(rows * cols, 2.0, 4));
    let sums = |b: &_| {
        let mut v = vec![0.0; cols];
        k.download(k.view(b), &mut v);
        v
    };
    let mut a = k.upload(&[0.0; 5]);
    k.bias_grad(k.view_mut(&mut a), k.view(&d), rows, cols);
    let before = k.allocations();
    let mut b = k.upload(&[0.0; 5]);
    let _ = k.aside(|| k.bias_grad(k.view_mut(&mut b), k.view(&d), rows, cols));
    assert_eq!(
        k.allocations(),
        before + 3,
        "aside: chunk sums and counters of its own (and b)"
    );
    assert_eq!(sums(&a), sums(&b));
    let (mut c, mut e) = (k.upload(&[0.0; 5]), k.upload(&[0.0; 5]));
    let _ = k.aside(|| k.bias_grad(k.view_mut(&mut c), k.view(&d), rows, cols));
    k.bias_grad(k.view_mut(&mut e), k.view(&d), rows, cols);
    assert_eq!(
        k.allocations(),
        before + 5,
        "each scratch kept (c and e only)"
    );
    assert_eq!(sums(&c), sums(&a));
    assert_eq!(sums(&e), sums(&a));
}

/// `copy_rows` (the last layer's [CLS] rows gathered and scattered: `Backend::copy_rows`) in one
/// launch against the trait's default, a `copy` per row, on the CPU: the bits as they are (NaN,
/// −0 and a 16-bit buffer's patterns included), rows from one to past a block, gathered from
/// rows `ld` apart and scattered back, everything between the rows left as it was.
#[test]
fn copy_rows_copies_each_rows_bits_and_nothing_else() {
    use recipe_kernel_emu::EmuTyped;
    use recipe_runtime::backend::kernels::Kernels;
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    for store in STORES {
        let k = Kernels::new(EmuTyped).with_store(store);
        let cpu = recipe_runtime::backend::Cpu::new(1).with_store(store);
        for (rows, cols, ld) in [(1, 1, 3), (3, 7, 7), (5, 6, 13), (300, 3, 5), (2, 257, 300)] {
            let span = (rows - 1) * ld + cols;
            let mut src = rand(span, 2.0, 21);
            src[0] = -0.0;
            src[span - 1] = f32::NAN;
            store.round_slice(&mut src);
            let fill = vec![5.0; span];
            let put = |v: &[f32]| {
                let mut b = k.alloc_stored(v.len());
                k.write(k.view_mut(&mut b), v);
                b
            };
            let get = |b: &<Kernels<EmuTyped> as Backend>::Buf, len: usize| {
                let mut out = vec![0.0; len];
                k.download(k.view(b), &mut out);
                out
            };
            // The CPU's values as the device's buffer holds them (a NaN's 16-bit pattern).
            let held = |v: &[f32]| get(&put(v), v.len());
            // Gathered: rows `ld` apart into a dense block.
            let (sb, mut db) = (put(&src), put(&vec![5.0; rows * cols]));
            k.copy_rows(k.view_mut(&mut db), k.view(&sb), rows, cols, cols, ld);
            let mut want = vec![5.0; rows * cols];
            cpu.copy_rows(&mut want, &src, rows, cols, cols, ld);
            let what = format!("{store:?} {rows}×{cols} ld {ld}");
            assert_eq!(
                bits(&get(&db, rows * cols)),
                bits(&held(&want)),
                "gathered {what}"
            );
            // Scattered back into rows `ld` apart: the values between them untouched.
            let mut back = put(&fill);
            k.copy_rows(k.view_mut(&mut back), k.view(&db), rows, cols, ld, cols);
            let mut want_back = fill.clone();
            cpu.copy_rows(&mut want_back, &want, rows, cols, ld, cols);
            assert_eq!(
                bits(&get(&back, span)),
                bits(&held(&want_back)),
                "scattered {what}"
            );
            assert!(want_back.iter().filter(|&&x| x == 5.0).count() >= span - rows * cols);
        }
    }
}
