//! Attention's checks (`attention.*`, `stored.attention.*`, `stored.hd64.attention_*`,
//! `stored.hd32.attention_*`, `stored.hd64.long.attention_*`, `stored.hd32.long.attention_*`):
//! the forward and backward on f32 and stored buffers, and at heads of 64 and 32 where the
//! fused kernels run, over one chunk of keys and over several.

use super::*;

impl<B: Backend> Checker<'_, B> {
    /// Attention forward and backward; with `stored`, attention's token tensors, their
    /// gradients and the probabilities are [`Backend::alloc_stored`] buffers, as the model keeps
    /// them (16-bit on a GPU storing fp16/bf16: the half products read and write them as they
    /// are, the f32 ones through widened copies, the softmax kernels through `ld`/`sto`), checked
    /// as `stored.attention_*`. With `fused` = (head size 64 or 32, keys) (stored buffers),
    /// heads of that size over 77 keys, checked as `stored.hd64.attention_*` or
    /// `stored.hd32.attention_*`, or over 203, as `stored.hd64.long.attention_*` or
    /// `stored.hd32.long.attention_*`: the shapes whose forward a GPU with `mma.sync` storing
    /// fp16/bf16 runs as one kernel (`attention_fused`, past 128 keys `attention_fused_long`)
    /// and whose backward as two (`attention_bwd_dq`, `attention_bwd_dkv`, or their `_long`
    /// twins; kernels/attention.rs). Where the device's
    /// attention adds q's, k's and v's biases as it loads them ([`Backend::attention_adds_bias`]:
    /// the fused kernels), that shape's device side is given q, k and v without them and the
    /// biases, the CPU q, k and v with them added (rounded, as `add_bias`).
    pub(super) fn attention(&mut self, stored: bool, fused: Option<(usize, usize)>) {
        let st = self.store;
        let (be, cpu) = (self.be, self.cpu);
        let put = |host: &[f32]| {
            if stored {
                let mut b = be.alloc_stored(host.len());
                be.write(be.view_mut(&mut b), host);
                b
            } else {
                be.upload(host)
            }
        };
        let fresh = |n: usize| {
            if stored {
                be.alloc_stored(n)
            } else {
                be.alloc(n)
            }
        };
        let name = |n: &str| match (stored, fused) {
            (true, Some((d, seq))) if seq > 128 => format!("stored.hd{d}.long.{n}"),
            (true, Some((d, _))) => format!("stored.hd{d}.{n}"),
            (true, None) => format!("stored.{n}"),
            _ => n.to_string(),
        };
        let s = if let Some((d, seq)) = fused {
            AttnShape {
                batch: 2,
                seq,
                heads: 2,
                head_dim: d,
            }
        } else {
            AttnShape {
                batch: 2,
                seq: 33,
                heads: 3,
                head_dim: 16,
            }
        };
        let tok = s.batch * s.seq * s.heads * s.head_dim;
        let pp = s.batch * s.heads * s.seq * s.seq;
        let (q, k, v) = (
            rand(tok, 1.0, 30, st),
            rand(tok, 1.0, 31, st),
            rand(tok, 1.0, 32, st),
        );
        // Biases 7 elements apart beyond a head row's width, as a layer's parameters lay q's,
        // k's and v's out with weights between them.
        let hid = s.heads * s.head_dim;
        let stride = hid + 7;
        let fold = stored && fused.is_some() && be.attention_adds_bias(s);
        // The backward given no dropped probabilities where the device draws the mask again,
        // as a training pass gives it none.
        let redraw = stored && fused.is_some() && be.attention_redraws_dropout(s);
        let bias = rand(2 * stride + hid, 0.5, 34, st);
        let biased = |x: &[f32], j: usize| -> Vec<f32> {
            let mut out: Vec<f32> = x
                .iter()
                .enumerate()
                .map(|(i, &x)| x + bias[j * stride + i % hid])
                .collect();
            if st.is_half() {
                st.round_slice(&mut out);
            }
            out
        };
        // The device's q, k and v, then the CPU's.
        let (qb, kb, vb) = (put(&q), put(&k), put(&v));
        let bias_buf = put(&bias);
        let qkv_bias = fold.then(|| (be.view(&bias_buf), stride));
        let (q, k, v) = if fold {
            (biased(&q, 0), biased(&k, 1), biased(&v, 2))
        } else {
            (q, k, v)
        };
        // The second sequence is padded after 20 tokens.
        let mask: Vec<u32> = (0..s.batch * s.seq)
            .map(|i| u32::from(i < s.seq || i % s.seq < 20))
            .collect();
        let d = Dropout {
            p: 0.1,
            seed: 9,
            stream: 3,
            site: 1,
        };
        let mb = be.upload_ids(&mask);
        // Stored probabilities get f32 room for the scores; the others hold them in place.
        let (mut ctx, mut probs, mut pd) = (fresh(tok), fresh(pp), fresh(pp));
        let mut room = stored.then(|| be.alloc(pp));
        be.attention_fwd(
            be.view_mut(&mut ctx),
            be.view_mut(&mut probs),
            Some(be.view_mut(&mut pd)),
            room.as_mut().map(|r| be.view_mut(r)),
            be.view(&qb),
            be.view(&kb),
            be.view(&vb),
            qkv_bias,
            &mb,
            s,
            Some(&d),
        );
        let (mut wc, mut wp, mut wpd) = (vec![0.0; tok], vec![0.0; pp], vec![0.0; pp]);
        cpu.attention_fwd(
            &mut wc,
            &mut wp,
            Some(&mut wpd),
            None,
            &q,
            &k,
            &v,
            None,
            &mask,
            s,
            Some(&d),
        );
        self.compare_bufs(&[
            (&name("attention_fwd.ctx"), &ctx, &wc),
            (&name("attention_fwd.probs"), &probs, &wp),
            (&name("attention_fwd.probs_drop"), &pd, &wpd),
        ]);
        // The backward from the CPU's forward, so only the backward is compared.
        let (pb, pdb) = (put(&wp), put(&wpd));
        let dctx = rand(tok, 1.0, 33, st);
        let dcb = put(&dctx);
        // dq, dk and dv side by side in a token's row as BERT's backward lays them out: a zero
        // column after dq and after dk, the row padded to 8 (model/layout.rs, `qkv_grad_rows`).
        let out = QkvRows {
            ld: (3 * hid + 2).next_multiple_of(8),
            cols: [0, hid + 1, 2 * hid + 2],
        };
        let rows = s.batch * s.seq;
        let (mut dqkv, mut scratch) = (fresh(rows * out.ld), be.alloc(pp));
        be.attention_bwd(
            be.view_mut(&mut dqkv),
            out,
            be.view_mut(&mut scratch),
            be.view(&dcb),
            be.view(&qb),
            be.view(&kb),
            be.view(&vb),
            qkv_bias,
            be.view(&pb),
            (!redraw).then(|| be.view(&pdb)),
            s,
            Some(&d),
        );
        let (mut want, mut ws) = (vec![0.0; rows * out.ld], vec![0.0; pp]);
        cpu.attention_bwd(
            &mut want,
            out,
            &mut ws,
            &dctx,
            &q,
            &k,
            &v,
            None,
            &wp,
            Some(&wpd),
            s,
            Some(&d),
        );
        let mut got = vec![0.0; rows * out.ld];
        be.download(be.view(&dqkv), &mut got);
        // Each gradient's columns, then the rest of the rows (left as they were: zero).
        let cols = |x: &[f32], c: usize| -> Vec<f32> {
            x.chunks(out.ld)
                .flat_map(|r| r[c..c + hid].to_vec())
                .collect()
        };
        for (j, g) in ["dq", "dk", "dv"].into_iter().enumerate() {
            let c = out.cols[j];
            self.compare(
                &name(&format!("attention_bwd.{g}")),
                &cols(&got, c),
                &cols(&want, c),
            );
        }
        let rest = |x: &[f32]| -> Vec<f32> {
            x.chunks(out.ld)
                .flat_map(|r| {
                    (0..out.ld)
                        .filter(|c| !out.cols.iter().any(|&o| (o..o + hid).contains(c)))
                        .map(|c| r[c])
                        .collect::<Vec<_>>()
                })
                .collect()
        };
        self.compare(&name("attention_bwd.untouched"), &rest(&got), &rest(&want));
    }
}
