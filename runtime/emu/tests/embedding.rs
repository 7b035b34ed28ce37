//! runtime/kernels/embedding.cu on the emulated device against the CPU backend.
//!
//! Tolerance: none. The forward is the CPU's three additions per element; the backward adds each
//! table element's gradients in token order, as the CPU loop does, so both are bit-identical, and
//! the rows no token touched keep their bits (they are not rounded to the storage dtype).

use crate::common;

use common::{pair, rand, rand_ids};
use recipe_runtime::backend::Backend;
use recipe_runtime::precision::Dtype;

const STORES: [Dtype; 3] = [Dtype::F32, Dtype::F16, Dtype::Bf16];

/// (batch, seq, hidden): one token, one column, widths off the warp and the block, more tokens
/// than a block orders (300, in runs of about 60 per id).
const SHAPES: &[(usize, usize, usize)] = &[
    (1, 1, 1),
    (3, 100, 5),
    (1, 3, 7),
    (3, 1, 33),
    (2, 5, 257),
    (3, 17, 31),
    (2, 3, 768),
];

const VOCAB: usize = 13;
const TYPES: usize = 3;
/// Position rows beyond `seq` that no token uses.
const EXTRA_POS: usize = 2;

/// Ids with repeats (few distinct values) and the first id again at the end; some rows of the
/// table are never used.
fn ids(n: usize, bound: u32, stream: u64) -> Vec<u32> {
    let mut v = rand_ids(n, bound.min(5), stream);
    if n > 1 {
        v[n - 1] = v[0];
    }
    v
}

fn bits(x: &[f32]) -> Vec<u32> {
    x.iter().map(|v| v.to_bits()).collect()
}

#[test]
fn forward_matches_the_cpu_bit_for_bit() {
    for store in STORES {
        let (g, c) = pair(store);
        for &(batch, seq, hidden) in SHAPES {
            let n = batch * seq;
            let (id, ty) = (ids(n, VOCAB as u32, 1), ids(n, TYPES as u32, 2));
            let mut word = rand(VOCAB * hidden, 1.0, 3);
            let mut pos = rand((seq + EXTRA_POS) * hidden, 0.5, 4);
            let mut typ = rand(TYPES * hidden, 0.25, 5);
            for t in [&mut word, &mut pos, &mut typ] {
                store.round_slice(t);
            }
            let (gi, gt) = (g.upload_ids(&id), g.upload_ids(&ty));
            let (mut a, mut b) = (vec![7.0; n * hidden + 3], vec![7.0; n * hidden + 3]);
            g.embedding_fwd(&mut a, &gi, &gt, &word, &pos, &typ, batch, seq, hidden);
            c.embedding_fwd(&mut b, &id, &ty, &word, &pos, &typ, batch, seq, hidden);
            assert_eq!(bits(&a), bits(&b), "{store:?} {batch}x{seq}x{hidden}");
        }
    }
}

#[test]
fn backward_matches_the_cpu_bit_for_bit_and_leaves_untouched_rows() {
    for store in STORES {
        let (g, c) = pair(store);
        for &(batch, seq, hidden) in SHAPES {
            let n = batch * seq;
            let (id, ty) = (ids(n, VOCAB as u32, 6), ids(n, TYPES as u32, 7));
            let mut dout = rand(n * hidden, 1.0, 8);
            store.round_slice(&mut dout);
            // Accumulators not on the storage grid: a row that is rounded when it should not be
            // (or not rounded when it should) shows.
            let dword0 = rand(VOCAB * hidden, 0.1, 9);
            let dpos0 = rand((seq + EXTRA_POS) * hidden, 0.1, 10);
            let dtyp0 = rand(TYPES * hidden, 0.1, 11);
            let (gi, gt) = (g.upload_ids(&id), g.upload_ids(&ty));
            let run_gpu = || {
                let (mut w, mut p, mut t) = (dword0.clone(), dpos0.clone(), dtyp0.clone());
                g.embedding_bwd(&mut w, &mut p, &mut t, &dout, &gi, &gt, batch, seq, hidden);
                (w, p, t)
            };
            let (w, p, t) = run_gpu();
            let (mut w2, mut p2, mut t2) = (dword0.clone(), dpos0.clone(), dtyp0.clone());
            c.embedding_bwd(
                &mut w2, &mut p2, &mut t2, &dout, &id, &ty, batch, seq, hidden,
            );
            let what = format!("{store:?} {batch}x{seq}x{hidden}");
            assert_eq!(bits(&w), bits(&w2), "dword {what}");
            assert_eq!(bits(&p), bits(&p2), "dpos {what}");
            assert_eq!(bits(&t), bits(&t2), "dtyp {what}");
            // The tables' unused rows are the inputs, bit for bit.
            for r in (0..VOCAB).filter(|r| !id.contains(&(*r as u32))) {
                let row = r * hidden..(r + 1) * hidden;
                assert_eq!(
                    bits(&w[row.clone()]),
                    bits(&dword0[row]),
                    "word row {r} {what}"
                );
            }
            let unused = seq * hidden..;
            assert_eq!(bits(&p[unused.clone()]), bits(&dpos0[unused]), "pos {what}");
            // Deterministic: the same call again gives the same bits.
            let (w3, p3, t3) = run_gpu();
            assert_eq!(
                (bits(&w), bits(&p), bits(&t)),
                (bits(&w3), bits(&p3), bits(&t3)),
                "rerun {what}"
            );
        }
    }
}

/// Runs of every length that matters to the two summing kernels (embedding.cu): a token-type
/// table whose one row takes all 1100 tokens (five tiles of a long run's 256, the last part
/// full); word rows of 17 tokens (the shortest run a block stages), twice, so that two long runs
/// start as close as they can, then 16 (the longest one thread sums) and 1, the rest one long
/// run; 45 columns, a block's 32 and part of another.
#[test]
fn runs_short_and_long_sum_in_token_order() {
    let (batch, seq, hidden) = (4, 275, 45);
    let n = batch * seq;
    // Tokens 7, 14, … hold ids 0 (17 of them), 1 (17), 2 (16) and 3 (one); every other token 4.
    let mut id = vec![4u32; n];
    for (j, slot) in (0..51).map(|j| (j, 7 * (j + 1))) {
        id[slot] = match j {
            0..=16 => 0,
            17..=33 => 1,
            34..=49 => 2,
            _ => 3,
        };
    }
    let ty = vec![0u32; n];
    for store in STORES {
        let (g, c) = pair(store);
        let mut dout = rand(n * hidden, 1.0, 12);
        store.round_slice(&mut dout);
        let dword0 = rand(VOCAB * hidden, 0.1, 13);
        let dpos0 = rand(seq * hidden, 0.1, 14);
        let dtyp0 = rand(TYPES * hidden, 0.1, 15);
        let (gi, gt) = (g.upload_ids(&id), g.upload_ids(&ty));
        let (mut w, mut p, mut t) = (dword0.clone(), dpos0.clone(), dtyp0.clone());
        g.embedding_bwd(&mut w, &mut p, &mut t, &dout, &gi, &gt, batch, seq, hidden);
        let (mut w2, mut p2, mut t2) = (dword0.clone(), dpos0.clone(), dtyp0.clone());
        c.embedding_bwd(
            &mut w2, &mut p2, &mut t2, &dout, &id, &ty, batch, seq, hidden,
        );
        assert_eq!(bits(&w), bits(&w2), "dword {store:?}");
        assert_eq!(bits(&t), bits(&t2), "dtyp {store:?}");
        assert_eq!(bits(&p), bits(&p2), "dpos {store:?}");
        // The rows no token took kept their bits.
        let untouched = 5 * hidden..;
        assert_eq!(bits(&w[untouched.clone()]), bits(&dword0[untouched]));
        assert_eq!(bits(&t[hidden..]), bits(&dtyp0[hidden..]));
    }
}
