//! ZeRO memory estimates for **model states only** (parameters, gradients, optimizer states; no
//! activations, no temporary buffers, no CUDA context), for the memory rule
//! (docs/rules/precision-zero.md).
//!
//! Pure arithmetic, no I/O. Stages 2 and 3 reproduce DeepSpeed's own estimators:
//!
//! * `deepspeedai/DeepSpeed@v0.19.5:deepspeed/runtime/zero/stage_1_and_2.py:estimate_zero2_model_states_mem_needs`
//!   (present since v0.4.2, PR #965; its no-offload GPU formula changed in v0.14.3, PR #5099,
//!   commit `f4cb866c2`: before it, `deepspeedai/DeepSpeed@v0.14.2:deepspeed/runtime/zero/stage_1_and_2.py:estimate_zero2_model_states_mem_needs`),
//! * `deepspeedai/DeepSpeed@v0.19.5:deepspeed/runtime/zero/stage3.py:estimate_zero3_model_states_mem_needs`
//!   (same formula, modulo line wrapping, since v0.4.2).
//!
//! Stages 0 and 1 have no DeepSpeed estimator; they use the ZeRO paper's mixed-precision Adam
//! accounting (see [`estimate`]).
//!
//! Upstream computes with Python numbers: integer products, `/` as true (float) division, products
//! with `additional_buffer_factor = 1.5` (and ZeRO-3's `gpus_factor = 1 / num_nodes`) in double
//! precision, then `int()` (truncation). This module does the same operations in the same order
//! in `u128`/`f64`, so results are identical to upstream's for every input whose integer
//! intermediates stay below 2^53 (e.g. `18 * P < 2^53`, i.e. `P` below about 5e14 parameters);
//! results above `u64::MAX` bytes saturate.
//!
//! Bytes are converted with [`gib`] (2^30); DeepSpeed's printer labels the same quantity "GB".

/// Parameter counts of a model, as DeepSpeed's `model_to_params` (stage3.py, v0.19.5) defines them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ModelSize {
    /// `P`: total parameters, a shared (tied) tensor counted once
    /// (`sum(dict((p.data_ptr(), p.numel()) for p in model.parameters()).values())`).
    pub params: u64,
    /// `Lmax`: the largest single module's *own* parameters
    /// (`max over model.modules() of sum(p.numel() for p in m.parameters(recurse=False))`).
    pub largest_layer: u64,
}

/// The shape fields of a HF `BertConfig` that determine the parameter count of
/// `BertForSequenceClassification`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BertShape {
    pub vocab_size: u64,
    pub hidden_size: u64,
    pub num_hidden_layers: u64,
    pub intermediate_size: u64,
    pub max_position_embeddings: u64,
    pub type_vocab_size: u64,
    /// Width of the classifier head; `0` gives a head without parameters (a bare encoder).
    pub num_labels: u64,
    /// Whether the `BertPooler` dense layer is present (`BertForSequenceClassification` always
    /// builds it; `BertModel(add_pooling_layer=False)` does not).
    pub pooler: bool,
}

/// Exact parameter count and `Lmax` of HF `BertForSequenceClassification`.
///
/// Module structure read from `huggingface/transformers:src/transformers/models/bert/modeling_bert.py`
/// (`BertEmbeddings`, `BertSelfAttention`, `BertSelfOutput`, `BertIntermediate`, `BertOutput`,
/// `BertPooler`, `BertForSequenceClassification`), assuming `position_embedding_type="absolute"`
/// (the relative types add a `distance_embedding` this does not count) and
/// `hidden_size % num_attention_heads == 0` (otherwise HF raises), so that q/k/v are `H x H`:
///
/// * embeddings: word `V*H`, position `max_pos*H`, token type `type_vocab*H`, LayerNorm `2H`
///   (`position_ids`/`token_type_ids` are buffers, not parameters);
/// * per layer: query, key, value, attention output dense `4(H*H + H)`, LayerNorm `2H`,
///   intermediate `H*I + I`, output `I*H + H`, LayerNorm `2H`;
/// * pooler `H*H + H` if present; classifier `H*num_labels + num_labels`.
///
/// `Lmax` is the maximum over these modules' own parameters (each `nn.Embedding`, `nn.Linear`
/// and `nn.LayerNorm` holds its tensors directly; the container modules hold none). For real BERT
/// shapes that is the word embedding, `V*H`.
pub fn bert_size(cfg: &BertShape) -> ModelSize {
    let h = cfg.hidden_size;
    let i = cfg.intermediate_size;
    let linear = |fan_in: u64, fan_out: u64| fan_in * fan_out + fan_out;
    let layer_norm = 2 * h;

    let word = cfg.vocab_size * h;
    let position = cfg.max_position_embeddings * h;
    let token_type = cfg.type_vocab_size * h;
    let embeddings = word + position + token_type + layer_norm;

    let attention_dense = linear(h, h); // query, key, value and BertSelfOutput.dense
    let intermediate = linear(h, i);
    let output = linear(i, h);
    let per_layer = 4 * attention_dense + layer_norm + intermediate + output + layer_norm;

    let pooler = if cfg.pooler { linear(h, h) } else { 0 };
    let classifier = linear(h, cfg.num_labels);

    let params = embeddings + cfg.num_hidden_layers * per_layer + pooler + classifier;

    let mut modules = vec![word, position, token_type, layer_norm, classifier];
    if cfg.num_hidden_layers > 0 {
        modules.extend([attention_dense, intermediate, output]);
    }
    if cfg.pooler {
        modules.push(pooler);
    }
    let largest_layer = modules.into_iter().max().unwrap_or(0);

    ModelSize {
        params,
        largest_layer,
    }
}

/// Where a ZeRO offload section sends its tensors (`offload_optimizer.device` /
/// `offload_param.device`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Offload {
    None,
    Cpu,
    Nvme,
}

impl Offload {
    /// DeepSpeed's estimators take a boolean "cpu offload" per section and have no NVMe case
    /// (v0.19.5; the printer's `format_options` only ever writes `cpu`/`none`). NVMe is therefore
    /// counted like CPU: same GPU figure, same host figure. For ZeRO-1/2 that is exact, since
    /// stages 1/2 treat any device other than `none` as CPU offload (docs/upstream.md §6, R-Z04).
    /// For ZeRO-3 the host figure is an upper bound: with NVMe the offloaded states live on disk
    /// and host RAM holds only pinned staging buffers, which upstream does not estimate.
    fn is_offloaded(self) -> bool {
        !matches!(self, Offload::None)
    }
}

/// Which ZeRO-2 no-offload GPU formula to use. A parameter, not a version check: the caller
/// decides which DeepSpeed it targets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Zero2Formula {
    /// DeepSpeed >= v0.14.3 (PR #5099): `2P + int(18P / N)`.
    Since0_14_3,
    /// DeepSpeed v0.4.2 - v0.14.2: `4P + int(16P / N)`. Still what DeepSpeed's own docs
    /// (`docs/code-docs/source/memory.rst`, v0.19.5) print.
    Before0_14_3,
}

/// A model-states memory estimate, in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Estimate {
    /// Per GPU (DeepSpeed's "per GPU" column).
    pub per_gpu: u64,
    /// Host memory per node (DeepSpeed's "per CPU" column is per node: it scales with
    /// `num_gpus_per_node` and `1 / num_nodes`).
    pub per_node_cpu: u64,
}

/// DeepSpeed's `additional_buffer_factor` default (both estimators).
pub const ADDITIONAL_BUFFER_FACTOR: f64 = 1.5;

/// Model-states memory for a ZeRO `stage` (0-3), `g = gpus_per_node`, `n = nodes`, `N = g*n`,
/// `f = 1.5`.
///
/// * **Stage 0** (no ZeRO; not a DeepSpeed estimator): the ZeRO paper's mixed-precision Adam
///   accounting, nothing sharded: `2P` fp16 params + `2P` fp16 grads + `12P` fp32 params,
///   momentum and variance = `16P` per GPU. Host: `int(P*4*g * f)`, borrowed from DeepSpeed's
///   ZeRO-2 no-offload row (every rank first materialises the fp32 model on CPU).
/// * **Stage 1** (DeepSpeed ships no ZeRO-1 estimator): the ZeRO paper's `P_os` formula
///   `2P + 2P + int(12P / N)` per GPU; host as stage 0.
/// * **Stage 2**: DeepSpeed's `estimate_zero2_model_states_mem_needs` (v0.19.5):
///   offload: GPU `2P`, host `int(P*max(4N, 16) * f)`; no offload: GPU `2P + int(18P/N)`
///   ([`Zero2Formula::Since0_14_3`]) or `4P + int(16P/N)` ([`Zero2Formula::Before0_14_3`]),
///   host `int(P*4*g * f)`.
/// * **Stage 3**: DeepSpeed's `estimate_zero3_model_states_mem_needs` (v0.19.5), with
///   `largest_layer_memory = 4*Lmax` and `gpus_factor = 1/n`:
///
///   | offload_param | offload_optimizer | per GPU | host, zero_init | host, no zero_init |
///   |---|---|---|---|---|
///   | cpu  | cpu  | `4Lmax`               | `P*18*(1/n)*f` | `P*max(4g, 18/n)*f` |
///   | none | cpu  | `4Lmax + int(2P/N)`   | `P*16*(1/n)*f` | `P*max(4g, 16/n)*f` |
///   | none | none | `4Lmax + int(18P/N)`  | `Lmax*4*g*f`   | `P*4*g*f`           |
///
/// `zero_init` matters only for stage 3. [`Offload::Nvme`] counts as [`Offload::Cpu`] (see
/// `Offload::is_offloaded`). `offload_param` is ignored for stages 0-2, as DeepSpeed ignores it
/// there (docs/upstream.md §6: `offload_param` is stage 3 only, no error).
///
/// Returns `None` where no formula is modelled:
/// * `stage > 3`, or `gpus_per_node == 0`, or `nodes == 0` (upstream divides by zero);
/// * stage 0 or 1 with an offloaded optimizer (DeepSpeed prints nothing for ZeRO-1 and the paper
///   formula has no offload case; stage 0 has no offload);
/// * stage 3 with `offload_param` offloaded but `offload_optimizer = none`: upstream's printer
///   skips that row, and its function does not model it either: with `cpu_offload=False` it
///   takes the no-offload branch and ignores `cpu_offload_params`, so it would report the
///   all-on-GPU figures for a configuration that offloads parameters.
#[allow(clippy::too_many_arguments)] // the signature mirrors the spec's inputs one to one
pub fn estimate(
    stage: u8,
    offload_optimizer: Offload,
    offload_param: Offload,
    size: ModelSize,
    gpus_per_node: u64,
    nodes: u64,
    zero_init: bool,
    formula: Zero2Formula,
) -> Option<Estimate> {
    if gpus_per_node == 0 || nodes == 0 {
        return None;
    }
    let p = u128::from(size.params);
    let lmax = u128::from(size.largest_layer);
    let g = u128::from(gpus_per_node);
    let n = u128::from(nodes);
    let total_gpus = n * g;
    let f = ADDITIONAL_BUFFER_FACTOR;
    let opt = offload_optimizer.is_offloaded();
    let par = offload_param.is_offloaded();

    // Host memory to build the fp32 model on every rank of a node: `P * 4 * g * f`.
    let model_on_cpu = py_int(float(p * 4 * g) * f);

    let (per_gpu, per_node_cpu) = match stage {
        0 | 1 if opt => return None,
        0 => (sat(16 * p), model_on_cpu),
        1 => (
            sat(4 * p + u128::from(py_true_div(12 * p, total_gpus))),
            model_on_cpu,
        ),
        2 if opt => (sat(2 * p), py_int(float(p * (4 * total_gpus).max(16)) * f)),
        2 => {
            let gpu = match formula {
                Zero2Formula::Since0_14_3 => 2 * p + u128::from(py_true_div(18 * p, total_gpus)),
                Zero2Formula::Before0_14_3 => 4 * p + u128::from(py_true_div(16 * p, total_gpus)),
            };
            (sat(gpu), model_on_cpu)
        }
        3 => {
            let largest_layer_memory = 4 * lmax;
            let gpus_factor = 1.0 / float(n);
            // `total_params * max(4 * num_gpus_per_node, k * gpus_factor) * f`, with Python's
            // int/float `max` (the int wins ties) and its int-or-float product.
            let host_without_init = |k: f64| {
                let per_gpu_bytes = k * gpus_factor;
                if per_gpu_bytes > float(4 * g) {
                    py_int(float(p) * per_gpu_bytes * f)
                } else {
                    py_int(float(p * 4 * g) * f)
                }
            };
            match (opt, par) {
                (true, true) => {
                    let cpu = if zero_init {
                        py_int(float(p * 18) * gpus_factor * f)
                    } else {
                        host_without_init(18.0)
                    };
                    (sat(largest_layer_memory), cpu)
                }
                (true, false) => {
                    let gpu = largest_layer_memory + u128::from(py_true_div(2 * p, total_gpus));
                    let cpu = if zero_init {
                        py_int(float(p * 16) * gpus_factor * f)
                    } else {
                        host_without_init(16.0)
                    };
                    (sat(gpu), cpu)
                }
                (false, true) => return None,
                (false, false) => {
                    let gpu = largest_layer_memory + u128::from(py_true_div(18 * p, total_gpus));
                    let cpu = if zero_init {
                        py_int(float(lmax * 4 * g) * f)
                    } else {
                        model_on_cpu
                    };
                    (sat(gpu), cpu)
                }
            }
        }
        _ => return None,
    };
    Some(Estimate {
        per_gpu,
        per_node_cpu,
    })
}

/// Bytes in GiB (2^30 bytes), as DeepSpeed's printer divides (`cpu_mem/2**30`, labelled "GB").
pub fn gib(bytes: u64) -> f64 {
    bytes as f64 / (1u64 << 30) as f64
}

/// Python's int-to-float conversion (round to nearest, ties to even; exact below 2^53).
fn float(x: u128) -> f64 {
    x as f64
}

/// Python's `int(x)` for a non-negative float: truncation toward zero (saturating at `u64::MAX`).
fn py_int(x: f64) -> u64 {
    x as u64
}

/// Python's `int(a / b)` for non-negative ints: true division in double precision, then
/// truncation. Identical to Python's correctly rounded int division while `a < 2^53`.
fn py_true_div(a: u128, b: u128) -> u64 {
    py_int(float(a) / float(b))
}

/// A byte count that no longer fits `u64`, saturated.
fn sat(x: u128) -> u64 {
    u64::try_from(x).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    const SINCE: Zero2Formula = Zero2Formula::Since0_14_3;
    const BEFORE: Zero2Formula = Zero2Formula::Before0_14_3;

    /// GiB printed with `decimals` digits, as DeepSpeed prints (`{:7.2f}`) and as the spec quotes.
    fn shown(bytes: u64, decimals: usize) -> String {
        format!("{:.*}", decimals, gib(bytes))
    }

    fn size(params: u64, largest_layer: u64) -> ModelSize {
        ModelSize {
            params,
            largest_layer,
        }
    }

    fn z3(opt: Offload, par: Offload, s: ModelSize, g: u64, n: u64, zero_init: bool) -> Estimate {
        estimate(3, opt, par, s, g, n, zero_init, SINCE).unwrap()
    }

    const MINILM: BertShape = BertShape {
        vocab_size: 30522,
        hidden_size: 384,
        num_hidden_layers: 6,
        intermediate_size: 1536,
        max_position_embeddings: 512,
        type_vocab_size: 2,
        num_labels: 0,
        pooler: true,
    };

    #[test]
    fn minilm_l6_matches_safetensors_count() {
        let s = bert_size(&MINILM);
        assert_eq!(s.params, 22_713_216);
        assert_eq!(s.largest_layer, 30522 * 384);
        assert_eq!(s.largest_layer, 11_720_448);
        // The pooler is part of that count.
        let no_pooler = bert_size(&BertShape {
            pooler: false,
            ..MINILM
        });
        assert_eq!(no_pooler.params, 22_713_216 - (384 * 384 + 384));
    }

    #[test]
    fn bert_base_sequence_classification() {
        // bert-base-uncased: the well-known 109,482,240 of BertModel plus a 768x2 classifier.
        let s = bert_size(&BertShape {
            vocab_size: 30522,
            hidden_size: 768,
            num_hidden_layers: 12,
            intermediate_size: 3072,
            max_position_embeddings: 512,
            type_vocab_size: 2,
            num_labels: 2,
            pooler: true,
        });
        assert_eq!(s.params, 109_482_240 + 768 * 2 + 2);
        assert_eq!(s.largest_layer, 30522 * 768);
    }

    #[test]
    fn largest_layer_is_the_largest_module_not_always_the_embedding() {
        let s = bert_size(&BertShape {
            vocab_size: 10,
            hidden_size: 8,
            num_hidden_layers: 1,
            intermediate_size: 100,
            max_position_embeddings: 4,
            type_vocab_size: 2,
            num_labels: 3,
            pooler: true,
        });
        // Intermediate dense 8x100 + 100 beats output dense 100x8 + 8 and the 10x8 embedding.
        assert_eq!(s.largest_layer, 900);
    }

    /// `bigscience/T0_3B` loaded with `AutoModel` (a `T5Model`, no `lm_head`): T5 v1.1 XL,
    /// d_model 2048, d_ff 5120 (gated: wi_0, wi_1, wo), 32 heads x d_kv 64, 24 + 24 layers,
    /// vocab 32128, one shared embedding, a 32x32 relative attention bias in the first layer of
    /// each stack. DeepSpeed prints it as "2783M total params, 65M largest layer params".
    fn t0_3b() -> ModelSize {
        let (d, ff, v, layers) = (2048u64, 5120u64, 32128u64, 24u64);
        let attention = 4 * d * d;
        let gated_ff = 2 * d * ff + ff * d;
        let encoder = layers * (attention + gated_ff + 2 * d) + 32 * 32 + d;
        let decoder = layers * (2 * attention + gated_ff + 3 * d) + 32 * 32 + d;
        let shared = v * d;
        let s = size(shared + encoder + decoder, shared);
        assert_eq!(s.params / 1_000_000, 2783);
        assert_eq!(s.largest_layer / 1_000_000, 65);
        s
    }

    /// docs/upstream.md §8 sanity check, 1 GPU: the transformers docs table for T0_3B, which is the
    /// output of `estimate_zero3_model_states_mem_needs_all_cold` (ZeRO-3), per CPU / per GPU:
    /// 70.00/0.25 (param cpu, optimizer cpu, zero_init 1 and 0), 62.23/5.43 (param none, optimizer
    /// cpu, zero_init 1 and 0), 0.37/46.91 (none, none, zero_init 1), 15.56/46.91 (none, none,
    /// zero_init 0). docs/upstream.md's figures, at its precision.
    #[test]
    fn t0_3b_one_gpu_spec_figures() {
        use Offload::{Cpu, None as No};
        let s = t0_3b();
        for zi in [true, false] {
            let e = z3(Cpu, Cpu, s, 1, 1, zi);
            assert_eq!(
                (shown(e.per_node_cpu, 1), shown(e.per_gpu, 2)),
                ("70.0".into(), "0.25".into())
            );
            let e = z3(Cpu, No, s, 1, 1, zi);
            assert_eq!(
                (shown(e.per_node_cpu, 1), shown(e.per_gpu, 2)),
                ("62.2".into(), "5.43".into())
            );
        }
        let e = z3(No, No, s, 1, 1, true);
        assert_eq!(
            (shown(e.per_node_cpu, 2), shown(e.per_gpu, 1)),
            ("0.37".into(), "46.9".into())
        );
        let e = z3(No, No, s, 1, 1, false);
        assert_eq!(
            (shown(e.per_node_cpu, 1), shown(e.per_gpu, 1)),
            ("15.6".into(), "46.9".into())
        );
    }

    /// The same table at DeepSpeed's printed precision (`{:7.2f}`), 1 GPU and 2 GPUs (the latter
    /// from the transformers docs' 2-GPU example).
    #[test]
    fn t0_3b_transformers_docs_tables() {
        use Offload::{Cpu, None as No};
        let s = t0_3b();
        let rows = |g: u64| {
            let mut out = Vec::new();
            for (opt, par) in [(Cpu, Cpu), (Cpu, No), (No, No)] {
                for zi in [true, false] {
                    let e = z3(opt, par, s, g, 1, zi);
                    out.push(format!(
                        "{}/{}",
                        shown(e.per_node_cpu, 2),
                        shown(e.per_gpu, 2)
                    ));
                }
            }
            out
        };
        assert_eq!(
            rows(1),
            [
                "70.00/0.25",
                "70.00/0.25",
                "62.23/5.43",
                "62.23/5.43",
                "0.37/46.91",
                "15.56/46.91"
            ]
        );
        assert_eq!(
            rows(2),
            [
                "70.00/0.25",
                "70.00/0.25",
                "62.23/2.84",
                "62.23/2.84",
                "0.74/23.58",
                "31.11/23.58"
            ]
        );
    }

    /// The spec's literal inputs (P = 2783e6, Lmax = 65e6) are the *printed, truncated* header
    /// values; with them the two Lmax-only figures land one hundredth low (0.24 for 0.25,
    /// 0.36 for 0.37). The other figures agree at the spec's precision.
    #[test]
    fn t0_3b_with_rounded_header_inputs() {
        use Offload::{Cpu, None as No};
        let s = size(2_783_000_000, 65_000_000);
        let e = z3(Cpu, Cpu, s, 1, 1, true);
        assert_eq!(
            (shown(e.per_node_cpu, 1), shown(e.per_gpu, 2)),
            ("70.0".into(), "0.24".into())
        );
        let e = z3(Cpu, No, s, 1, 1, true);
        assert_eq!(
            (shown(e.per_node_cpu, 1), shown(e.per_gpu, 2)),
            ("62.2".into(), "5.43".into())
        );
        let e = z3(No, No, s, 1, 1, true);
        assert_eq!(
            (shown(e.per_node_cpu, 2), shown(e.per_gpu, 1)),
            ("0.36".into(), "46.9".into())
        );
        let e = z3(No, No, s, 1, 1, false);
        assert_eq!(
            (shown(e.per_node_cpu, 1), shown(e.per_gpu, 1)),
            ("15.6".into(), "46.9".into())
        );
    }

    /// docs/upstream.md §8 worked example: P = 7e9, 8 GPUs x 1 node.
    #[test]
    fn seven_billion_on_eight_gpus_spec_figures() {
        use Offload::{Cpu, None as No};
        let p = 7_000_000_000;
        let s2 = size(p, 0);
        let e = estimate(2, Cpu, No, s2, 8, 1, false, SINCE).unwrap();
        assert_eq!(shown(e.per_gpu, 2), "13.04");
        assert_eq!(shown(e.per_node_cpu, 1), "312.9");
        let e = estimate(2, No, No, s2, 8, 1, false, SINCE).unwrap();
        assert_eq!(shown(e.per_gpu, 2), "27.71");

        let s3 = size(p, 131_072_000);
        let e = z3(No, No, s3, 8, 1, true);
        assert_eq!(shown(e.per_gpu, 2), "15.16");
        assert_eq!(shown(e.per_node_cpu, 2), "5.86");
        let e = z3(Cpu, No, s3, 8, 1, true);
        assert_eq!(shown(e.per_gpu, 2), "2.12");
        assert_eq!(shown(e.per_node_cpu, 1), "156.5");
        let e = z3(Cpu, Cpu, s3, 8, 1, true);
        assert_eq!(shown(e.per_gpu, 2), "0.49");
        assert_eq!(shown(e.per_node_cpu, 1), "176.0");
        // Without zero.Init the host side is bounded by every rank loading the fp32 model.
        assert_eq!(
            shown(z3(Cpu, Cpu, s3, 8, 1, false).per_node_cpu, 1),
            "312.9"
        );
    }

    /// DeepSpeed's own docs (`docs/code-docs/source/memory.rst`, v0.19.5): the `_all_cold`
    /// examples for t5-3b, `total_params=2851e6, largest_layer_params=32e6`, 8 GPUs x 1 node.
    /// Their ZeRO-2 table predates v0.14.3.
    #[test]
    fn deepspeed_docs_t5_3b_cold_tables() {
        use Offload::{Cpu, None as No};
        let s = size(2_851_000_000, 32_000_000);
        let z2 = |opt, formula| {
            let e = estimate(2, opt, No, s, 8, 1, false, formula).unwrap();
            format!("{}/{}", shown(e.per_node_cpu, 2), shown(e.per_gpu, 2))
        };
        assert_eq!(z2(Cpu, BEFORE), "127.45/5.31");
        assert_eq!(z2(No, BEFORE), "127.45/15.93");
        assert_eq!(z2(Cpu, SINCE), "127.45/5.31");
        assert_eq!(z2(No, SINCE), "127.45/11.28");

        let mut rows = Vec::new();
        for (opt, par) in [(Cpu, Cpu), (Cpu, No), (No, No)] {
            for zi in [true, false] {
                let e = z3(opt, par, s, 8, 1, zi);
                rows.push(format!(
                    "{}/{}",
                    shown(e.per_node_cpu, 2),
                    shown(e.per_gpu, 2)
                ));
            }
        }
        assert_eq!(
            rows,
            [
                "71.69/0.12",
                "127.45/0.12",
                "63.72/0.78",
                "127.45/0.78",
                "1.43/6.09",
                "127.45/6.09"
            ]
        );
    }

    #[test]
    fn exact_bytes() {
        use Offload::{Cpu, None as No};
        let p = 7_000_000_000u64;
        let s = size(p, 131_072_000);
        let e = |stage, opt, formula| estimate(stage, opt, No, s, 8, 1, false, formula).unwrap();
        assert_eq!(
            e(0, No, SINCE),
            Estimate {
                per_gpu: 16 * p,
                per_node_cpu: p * 48
            }
        );
        assert_eq!(e(1, No, SINCE).per_gpu, 4 * p + 12 * p / 8);
        assert_eq!(
            e(2, Cpu, SINCE),
            Estimate {
                per_gpu: 2 * p,
                per_node_cpu: p * 48
            }
        );
        assert_eq!(
            e(2, No, SINCE),
            Estimate {
                per_gpu: 2 * p + 18 * p / 8,
                per_node_cpu: p * 48
            }
        );
        assert_eq!(e(2, No, BEFORE).per_gpu, 4 * p + 16 * p / 8);
        // ZeRO-2 offload host: `max(4N, 16)` uses the *total* GPU count.
        let two_nodes = estimate(2, Cpu, No, s, 8, 2, false, SINCE).unwrap();
        assert_eq!(two_nodes.per_node_cpu, p * 64 * 3 / 2);
    }

    /// `int()` truncation and the float path of `1 / num_nodes` (3 nodes: 1/3 is inexact).
    #[test]
    fn truncation_and_float_order() {
        use Offload::{Cpu, None as No};
        let s = size(1_000_000_001, 7);
        // int(18 * P / 3) = 6000000006; int(2 * P / 3) = int(666666667.33) = 666666667.
        assert_eq!(z3(No, No, s, 1, 3, true).per_gpu, 28 + 6_000_000_006);
        assert_eq!(z3(Cpu, No, s, 1, 3, true).per_gpu, 28 + 666_666_667);
        // P * 18 * (1/3) * 1.5 in doubles, then int(): 9000000009 (exact here).
        assert_eq!(z3(Cpu, Cpu, s, 1, 3, true).per_node_cpu, 9_000_000_009);
        // max(4*1, 18 * (1/3)) = 6.0 (float wins), then P * 6.0 * 1.5.
        assert_eq!(z3(Cpu, Cpu, s, 1, 3, false).per_node_cpu, 9_000_000_009);
        // max(4*2, 16 * (1/3)) = 8 (int wins): int(P*8 * 1.5).
        assert_eq!(z3(Cpu, No, s, 2, 3, false).per_node_cpu, 12_000_000_012);
        // zero_init, no offload: Lmax*4*g*1.5 = 42.
        assert_eq!(z3(No, No, s, 1, 3, true).per_node_cpu, 42);
        // Double rounding shows: P = 7, 3 nodes: 7*16 * (1/3) * 1.5 = 55.99.. in doubles, so
        // upstream prints int() = 55 where exact arithmetic gives 56.
        assert_eq!(z3(Cpu, No, size(7, 0), 1, 3, true).per_node_cpu, 55);
    }

    #[test]
    fn nvme_counts_like_cpu() {
        use Offload::{Cpu, None as No, Nvme};
        let s = size(7_000_000_000, 131_072_000);
        for zi in [true, false] {
            assert_eq!(z3(Nvme, Nvme, s, 8, 2, zi), z3(Cpu, Cpu, s, 8, 2, zi));
            assert_eq!(z3(Nvme, No, s, 8, 2, zi), z3(Cpu, No, s, 8, 2, zi));
            assert_eq!(z3(Nvme, Cpu, s, 8, 2, zi), z3(Cpu, Nvme, s, 8, 2, zi));
        }
        assert_eq!(
            estimate(2, Nvme, No, s, 8, 2, false, SINCE),
            estimate(2, Cpu, No, s, 8, 2, false, SINCE)
        );
    }

    #[test]
    fn unmodelled_combinations_are_none() {
        use Offload::{Cpu, None as No, Nvme};
        let s = size(7_000_000_000, 131_072_000);
        assert_eq!(estimate(3, No, Cpu, s, 8, 1, true, SINCE), None);
        assert_eq!(estimate(3, No, Nvme, s, 8, 1, false, SINCE), None);
        assert_eq!(estimate(4, No, No, s, 8, 1, true, SINCE), None);
        assert_eq!(estimate(1, Cpu, No, s, 8, 1, true, SINCE), None);
        assert_eq!(estimate(0, Nvme, No, s, 8, 1, true, SINCE), None);
        assert_eq!(estimate(2, No, No, s, 0, 1, true, SINCE), None);
        assert_eq!(estimate(3, No, No, s, 8, 0, true, SINCE), None);
        // offload_param is ignored below stage 3, as DeepSpeed ignores it there.
        assert_eq!(
            estimate(2, No, Cpu, s, 8, 1, true, SINCE),
            estimate(2, No, No, s, 8, 1, true, SINCE)
        );
    }

    #[test]
    fn zero_init_only_matters_for_stage_3_and_stage_1_equals_stage_0_on_one_gpu() {
        use Offload::None as No;
        let s = size(1_234_567, 89);
        for stage in 0..=2 {
            assert_eq!(
                estimate(stage, No, No, s, 4, 2, true, SINCE),
                estimate(stage, No, No, s, 4, 2, false, SINCE)
            );
        }
        assert_eq!(
            estimate(1, No, No, s, 1, 1, true, SINCE),
            estimate(0, No, No, s, 1, 1, true, SINCE)
        );
    }

    #[test]
    fn gib_is_binary() {
        assert_eq!(gib(1 << 30), 1.0);
        assert_eq!(gib(3 << 29), 1.5);
    }
}
