//! Checks of the device itself rather than of a [`Backend`] operation: queued copies, batched
//! GEMMs on wide operands, CUDA graphs replayed and the waits on a step's updates inside them.

use super::*;

/// The queued copy of an offloaded step's updated parameters into a stored buffer: in a half
/// store, their 16 bits from pinned memory (`Device::upload_queued_bits`) into part of it, the
/// rest left as it was; in fp32, the floats (`Device::upload_queued`). Exact: `copy.upload_queued`.
pub fn compare_queued_upload<D: Device>(k: &Kernels<D>, store: Dtype) -> OpCheck {
    let dev = k.device();
    let (n, at, m) = (1001, 3, 997);
    let before = rand(n, 2.0, 60, store);
    let up = rand(m, 2.0, 61, store);
    let mut buf = k.alloc_stored(n);
    k.write(k.view_mut(&mut buf), &before);
    let elem = dev.elem(k.view(&buf));
    let mut pinned = dev.alloc_pinned(m);
    let dst = dev.range_mut(&mut buf, at..at + m);
    if elem.is_half() {
        let bits = crate::backend::device::as_bits(&mut pinned, m);
        for (b, &x) in bits.iter_mut().zip(&up) {
            *b = elem.bits(x);
        }
        // SAFETY: `pinned` outlives the wait below, and nothing touches it or `buf` until then.
        unsafe { dev.upload_queued_bits(dst, bits.as_ptr()) };
    } else {
        pinned.copy_from_slice(&up);
        // SAFETY: as above.
        unsafe { dev.upload_queued(dst, pinned.as_ptr()) };
    }
    let waited = dev.wait_copies();
    let mut got = vec![0.0; n];
    k.download(k.view(&buf), &mut got);
    let mut want = before;
    want[at..at + m].copy_from_slice(&up);
    let same = same_bits(&got, &want);
    OpCheck {
        ok: same && waited.is_ok(),
        ..exact("copy.upload_queued", store, same)
    }
}

/// A batched f32 product of stored (in a half store, 16-bit) buffers into a stored buffer
/// (`Device::gemm_batched` with f32 operands: a GPU widens each operand into f32 room and rounds
/// the results into the output), three items of odd shapes with `B` transposed, against the
/// host's sums rounded to the store: `stored.gemm_batched_f32`. The model's attention runs its
/// products on half operands since `ds` is a stored value, so this checks the path on its own.
pub fn compare_wide_batched<D: Device>(k: &Kernels<D>, store: Dtype) -> OpCheck {
    let dev = k.device();
    let (count, m, n, kk) = (3, 5, 7, 9);
    let g = Gemm {
        alpha: 0.5,
        ..Gemm::dense(m, n, kk, false, true, 0.0)
    };
    let batch = Batch {
        count,
        inner: 1,
        a: Stride {
            outer: m * kk,
            inner: 0,
        },
        b: Stride {
            outer: n * kk,
            inner: 0,
        },
        c: Stride {
            outer: m * n,
            inner: 0,
        },
    };
    let (ha, hb) = (
        rand(count * m * kk, 2.0, 80, store),
        rand(count * n * kk, 2.0, 81, store),
    );
    let (mut a, mut b, mut c) = (
        k.alloc_stored(ha.len()),
        k.alloc_stored(hb.len()),
        k.alloc_stored(count * m * n),
    );
    k.write(k.view_mut(&mut a), &ha);
    k.write(k.view_mut(&mut b), &hb);
    // Garbage where the product writes: beta 0 must not read it.
    k.write(k.view_mut(&mut c), &vec![7.0; count * m * n]);
    dev.gemm_batched(
        &g,
        &batch,
        k.view(&a),
        k.view(&b),
        k.view_mut(&mut c),
        Dtype::F32,
    );
    let mut got = vec![0.0; count * m * n];
    k.download(k.view(&c), &mut got);
    let mut want = vec![0.0f32; count * m * n];
    for j in 0..count {
        for r in 0..m {
            for col in 0..n {
                let dot: f64 = (0..kk)
                    .map(|i| {
                        f64::from(ha[j * m * kk + r * kk + i])
                            * f64::from(hb[j * n * kk + col * kk + i])
                    })
                    .sum();
                want[j * m * n + r * n + col] = (0.5 * dot) as f32;
            }
        }
    }
    store.round_slice(&mut want);
    let scale = want.iter().fold(0.0f64, |s, &x| s.max(f64::from(x.abs())));
    let worst = got
        .iter()
        .zip(&want)
        .fold(0.0f64, |w, (&g, &x)| w.max(f64::from((g - x).abs())));
    let error = if got.iter().all(|x| x.is_finite()) {
        worst / scale
    } else {
        f64::INFINITY
    };
    let tolerance = tolerance(store);
    OpCheck {
        op: "stored.gemm_batched_f32".into(),
        store,
        error,
        tolerance,
        ok: error <= tolerance,
    }
}

/// A captured graph replayed on new inputs (`Device::begin_capture`; docs/cuda.md "CUDA
/// graphs"): a copy and a dropout captured once, then replayed for two micro-batches, each with
/// inputs written into the same buffer and its own dropout key (`Kernels::dropout_key`), against
/// the CPU's copy and dropout with that key. Exact: `graph.replay`. `None` when the device does
/// not capture (a GPU with `RECIPE_CUDA_GRAPHS=0`).
pub fn compare_graph_replay<D: Device>(k: &Kernels<D>, store: Dtype) -> Option<OpCheck> {
    let dev = k.device();
    let (n, seed, site) = (1001, 0x5eed_0000_0001, 3);
    let dropout = |base: u64| Dropout {
        p: 0.25,
        seed,
        stream: base + site,
        site,
    };
    let (mut x, mut y) = (k.alloc_stored(n), k.alloc_stored(n));
    k.write(k.view_mut(&mut x), &rand(n, 2.0, 70, store));
    k.dropout_key(seed, 1 << 40);
    if !dev.begin_capture() {
        return None;
    }
    k.copy(k.view_mut(&mut y), k.view(&x));
    k.dropout(k.view_mut(&mut y), &dropout(1 << 40));
    let id = dev.end_capture();
    let cpu = Cpu::new(1).with_store(store);
    let mut same = id.is_some();
    for (i, base) in [7u64, (1 << 33) + 5].into_iter().enumerate() {
        let xi = rand(n, 2.0, 71 + i as u64, store);
        k.write(k.view_mut(&mut x), &xi);
        k.dropout_key(seed, base);
        same &= id.is_some_and(|id| dev.launch_graph(id));
        let mut got = vec![0.0; n];
        k.download(k.view(&y), &mut got);
        let mut want = xi;
        cpu.dropout(&mut want, &dropout(base));
        same &= same_bits(&got, &want);
    }
    if let Some(id) = id {
        dev.drop_graph(id);
    }
    Some(exact("graph.replay", store, same))
}

/// A graph that waits for a parameter segment's update (`Kernels::update_aside`, on the side
/// stream; docs/cuda.md "The step beside the forward"): captured before the segment's first
/// update (a wait on an event never recorded, made in the capture), then replayed after each of
/// two updates — 16 additions into `x` queued aside — copying `x` into `y`, which must hold the
/// updated values. Without the graph's own wait node the copy would run beside the additions.
/// Exact: `graph.update_wait`. `None` when the device does not capture.
pub fn compare_update_wait<D: Device>(k: &Kernels<D>, store: Dtype) -> Option<OpCheck> {
    // A segment index no model of the self-test uses: its event is made here.
    const SEG: usize = 63;
    let dev = k.device();
    let n = 1 << 14;
    let cpu = Cpu::new(1).with_store(store);
    let (mut x, mut y, mut d) = (k.alloc(n), k.alloc(n), k.alloc(n));
    let mut want = rand(n, 2.0, 80, store);
    let step = rand(n, 0.01, 81, store);
    k.write(k.view_mut(&mut x), &want);
    k.write(k.view_mut(&mut d), &step);
    if !dev.begin_capture() {
        return None;
    }
    k.wait_update(SEG);
    k.copy(k.view_mut(&mut y), k.view(&x));
    let id = dev.end_capture();
    let mut same = id.is_some();
    for _ in 0..2 {
        k.update_aside(SEG, || {
            for _ in 0..16 {
                k.add_assign(k.view_mut(&mut x), k.view(&d));
            }
        });
        for _ in 0..16 {
            cpu.add_assign(&mut want, &step);
        }
        same &= id.is_some_and(|id| dev.launch_graph(id));
        let mut got = vec![0.0; n];
        k.download(k.view(&y), &mut got);
        same &= same_bits(&got, &want);
    }
    if let Some(id) = id {
        dev.drop_graph(id);
    }
    Some(exact("graph.update_wait", store, same))
}
