//! Where each BERT parameter lives in the flat buffer ([`Layout`]): the embeddings, each encoder
//! layer's linears and LayerNorms ([`LayerLayout`]), the pooler and the classifier, in the order
//! of HF's `state_dict`, each linear's weight followed by its bias.

use std::ops::Range;

use super::BertConfig;
use crate::backend::QkvRows;
use crate::params::Params;

/// A Linear layer's place in the flat buffer: weight `[out, in]` immediately followed by bias.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Lin {
    pub w: usize,
    pub inp: usize,
    pub out: usize,
}

impl Lin {
    pub(super) fn w(&self) -> Range<usize> {
        self.w..self.w + self.out * self.inp
    }
    pub(super) fn b(&self) -> Range<usize> {
        let s = self.w + self.out * self.inp;
        s..s + self.out
    }
}

/// The gradients' range of a linear's bias and the LayerNorm right after it in the segment, as
/// [`Backend::layernorm_bwd_split_bias_grad`] takes them (its `dl`, then `dw` and `db`).
pub(super) fn bias_then_ln(l: Lin, ln: Ln) -> Range<usize> {
    assert_eq!(
        l.b().end,
        ln.w,
        "a post-LN sublayer's linear bias just before its LayerNorm"
    );
    assert_eq!(l.out, ln.n, "the linear's width is the LayerNorm's");
    l.b().start..ln.wb().end
}

/// A LayerNorm's weight (then bias) offset.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Ln {
    pub w: usize,
    pub n: usize,
}

impl Ln {
    pub(super) fn w(&self) -> Range<usize> {
        self.w..self.w + self.n
    }
    pub(super) fn b(&self) -> Range<usize> {
        self.w + self.n..self.w + 2 * self.n
    }
    pub(super) fn wb(&self) -> Range<usize> {
        self.w..self.w + 2 * self.n
    }
}

#[derive(Debug, Clone)]
pub(crate) struct LayerLayout {
    pub q: Lin,
    pub k: Lin,
    pub v: Lin,
    pub o: Lin,
    pub ln1: Ln,
    pub inter: Lin,
    pub out: Lin,
    pub ln2: Ln,
}

impl LayerLayout {
    /// Elements from the query's weight to the key's, and from the key's to the value's: each
    /// projection's weight then bias, in [`param_specs`]' order, so the three weights (and the
    /// three biases) are one stride apart, which lets their GEMMs run as one batch
    /// ([`Backend::gemm_items_to_epilogue`]).
    pub(super) fn qkv_stride(&self) -> usize {
        let s = self.k.w - self.q.w;
        assert_eq!(self.v.w - self.k.w, s, "q, k and v one stride apart");
        assert!(
            self.q.out == self.k.out && self.k.out == self.v.out && self.q.inp == self.v.inp,
            "q, k and v of one shape"
        );
        s
    }

    /// q's, k's and v's biases, [`LayerLayout::qkv_stride`] apart (weights between them).
    pub(super) fn qkv_biases(&self) -> Range<usize> {
        self.q.b().start..self.v.b().end
    }

    /// q's, k's and v's weights read as one matrix of `inp`-wide rows from q's weight to the end
    /// of v's: each bias is one row more (a projection of BERT is square), so its rows are q's,
    /// q's bias, k's, k's bias, then v's, `3·out + 2` of them. Attention's backward writes dq, dk
    /// and dv into a token's row at the matching columns ([`qkv_grad_rows`]) with zeros at the
    /// two bias rows', so one GEMM over the row gives `d(x)` from all three (where three GEMMs of
    /// a third the depth each filled the GPU no better than one), and one the three weights'
    /// gradients (the bias rows' gradients get `+= 0`). Returns the range in the parameters.
    pub(super) fn qkv_matrix(&self) -> Range<usize> {
        let (s, rows) = (self.qkv_stride(), qkv_grad_rows(self.q.inp));
        assert!(
            self.q.out == self.q.inp && s == (self.q.out + 1) * self.q.inp,
            "q, k and v square, each bias one row after its weight"
        );
        assert_eq!(rows.cols, [0, s / self.q.inp, 2 * s / self.q.inp]);
        self.q.w..self.v.w().end
    }
}

/// Where attention's backward puts a token's dq, dk and dv (`Acts::dqkv`), `hidden` wide each:
/// at the columns of their weights' rows in [`LayerLayout::qkv_matrix`], a zero column after dq
/// and after dk (q's and k's bias rows), the row padded to 8 elements (16 bytes of 16-bit values,
/// the alignment cuBLASLt's fastest kernels want of a row).
pub(super) fn qkv_grad_rows(hidden: usize) -> QkvRows {
    let r = hidden + 1;
    QkvRows {
        ld: (3 * r - 1).next_multiple_of(8),
        cols: [0, r, 2 * r],
    }
}

/// Columns of [`qkv_grad_rows`]'s rows that the GEMMs over them read: through dv's.
pub(super) fn qkv_grad_cols(hidden: usize) -> usize {
    qkv_grad_rows(hidden).cols[2] + hidden
}

/// Offsets of every parameter, each relative to the start of its *segment*: the embeddings
/// (segment 0), encoder layer `l` (segment `1 + l`), then the pooler and the head (the last
/// segment). Each segment is a contiguous range of the flat buffer (`segs`), so the forward and
/// backward can read one segment's parameters and finish one segment's gradients at a time, which
/// is what ZeRO-2/3 reduce and gather (see [`super::ParamSource`]).
#[derive(Debug, Clone)]
pub(crate) struct Layout {
    /// Each segment's range in the flat buffer, in forward order.
    pub segs: Vec<Range<usize>>,
    pub word: usize,
    pub pos: usize,
    pub typ: usize,
    pub emb_end: usize,
    pub emb_ln: Ln,
    pub layers: Vec<LayerLayout>,
    pub pooler: Lin,
    pub head: Lin,
}

/// The `(name, shape)` list of `BertForSequenceClassification.named_parameters()`, in order.
pub(crate) fn param_specs(c: &BertConfig, num_labels: usize) -> Vec<(String, Vec<usize>)> {
    let (h, i) = (c.hidden_size, c.intermediate_size);
    let mut v: Vec<(String, Vec<usize>)> = Vec::new();
    let lin = |v: &mut Vec<(String, Vec<usize>)>, name: &str, out: usize, inp: usize| {
        v.push((format!("{name}.weight"), vec![out, inp]));
        v.push((format!("{name}.bias"), vec![out]));
    };
    let ln = |v: &mut Vec<(String, Vec<usize>)>, name: &str| {
        v.push((format!("{name}.weight"), vec![h]));
        v.push((format!("{name}.bias"), vec![h]));
    };
    v.push((
        "bert.embeddings.word_embeddings.weight".into(),
        vec![c.vocab_size, h],
    ));
    v.push((
        "bert.embeddings.position_embeddings.weight".into(),
        vec![c.max_position_embeddings, h],
    ));
    v.push((
        "bert.embeddings.token_type_embeddings.weight".into(),
        vec![c.type_vocab_size, h],
    ));
    ln(&mut v, "bert.embeddings.LayerNorm");
    for l in 0..c.num_hidden_layers {
        let p = format!("bert.encoder.layer.{l}");
        lin(&mut v, &format!("{p}.attention.self.query"), h, h);
        lin(&mut v, &format!("{p}.attention.self.key"), h, h);
        lin(&mut v, &format!("{p}.attention.self.value"), h, h);
        lin(&mut v, &format!("{p}.attention.output.dense"), h, h);
        ln(&mut v, &format!("{p}.attention.output.LayerNorm"));
        lin(&mut v, &format!("{p}.intermediate.dense"), i, h);
        lin(&mut v, &format!("{p}.output.dense"), h, i);
        ln(&mut v, &format!("{p}.output.LayerNorm"));
    }
    lin(&mut v, "bert.pooler.dense", h, h);
    lin(&mut v, "classifier", num_labels, h);
    v
}

impl Layout {
    /// Offsets of a store built from [`param_specs`] (same config and label count).
    pub(crate) fn of(c: &BertConfig, p: &Params) -> Layout {
        let (h, i) = (c.hidden_size, c.intermediate_size);
        let off = |name: &str| {
            p.entry(name)
                .expect("param_specs names every tensor")
                .offset
        };
        let lin = |name: &str, out: usize, inp: usize| Lin {
            w: off(&format!("{name}.weight")),
            inp,
            out,
        };
        let ln = |name: &str| Ln {
            w: off(&format!("{name}.weight")),
            n: h,
        };
        let layers = (0..c.num_hidden_layers)
            .map(|l| {
                let p = format!("bert.encoder.layer.{l}");
                LayerLayout {
                    q: lin(&format!("{p}.attention.self.query"), h, h),
                    k: lin(&format!("{p}.attention.self.key"), h, h),
                    v: lin(&format!("{p}.attention.self.value"), h, h),
                    o: lin(&format!("{p}.attention.output.dense"), h, h),
                    ln1: ln(&format!("{p}.attention.output.LayerNorm")),
                    inter: lin(&format!("{p}.intermediate.dense"), i, h),
                    out: lin(&format!("{p}.output.dense"), h, i),
                    ln2: ln(&format!("{p}.output.LayerNorm")),
                }
            })
            .collect();
        let typ = off("bert.embeddings.token_type_embeddings.weight");
        let mut lay = Layout {
            segs: Vec::new(),
            word: off("bert.embeddings.word_embeddings.weight"),
            pos: off("bert.embeddings.position_embeddings.weight"),
            typ,
            emb_end: typ + c.type_vocab_size * h,
            emb_ln: ln("bert.embeddings.LayerNorm"),
            layers,
            pooler: lin("bert.pooler.dense", h, h),
            head: lin(
                "classifier",
                p.entry("classifier.weight")
                    .expect("classifier present")
                    .shape[0],
                h,
            ),
        };
        lay.rebase();
        lay
    }

    /// Cuts the buffer into segments and makes every offset relative to its segment's start.
    pub(super) fn rebase(&mut self) {
        let lin_end = |l: &Lin| l.b().end;
        let emb = self.word..self.emb_ln.wb().end;
        let mut segs = vec![emb.clone()];
        for ll in &mut self.layers {
            let start = ll.q.w;
            segs.push(start..ll.ln2.wb().end);
            for lin in [
                &mut ll.q,
                &mut ll.k,
                &mut ll.v,
                &mut ll.o,
                &mut ll.inter,
                &mut ll.out,
            ] {
                lin.w -= start;
            }
            ll.ln1.w -= start;
            ll.ln2.w -= start;
        }
        let tail = self.pooler.w..lin_end(&self.head);
        segs.push(tail.clone());
        self.pooler.w -= tail.start;
        self.head.w -= tail.start;
        for x in [
            &mut self.word,
            &mut self.pos,
            &mut self.typ,
            &mut self.emb_end,
        ] {
            *x -= emb.start;
        }
        self.emb_ln.w -= emb.start;
        self.segs = segs;
    }

    /// The index of the pooler-and-head segment.
    pub(crate) fn tail(&self) -> usize {
        self.segs.len() - 1
    }
}
