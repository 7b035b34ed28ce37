//! The BERT sequence classifier, numerically HF `BertForSequenceClassification`
//! (single-label: mean cross-entropy).
//!
//! API:
//! - [`Classifier::from_pretrained`]`(dir, num_labels, seed)` reads `config.json` +
//!   `model.safetensors` (names with or without the `bert.` prefix; integer buffers such as
//!   `position_ids` and `cls.*` pre-training heads skipped; a missing classifier head is
//!   initialised like HF, seeded).
//! - [`Classifier::random`]`(config, num_labels, seed)`: HF's `_init_weights`, seeded per tensor.
//! - [`Classifier::save_pretrained`]`(dir, id2label)`: an HF-loadable checkpoint, written atomically.
//! - [`Classifier::forward`]`(batch)` → logits `[batch × num_labels]` (eval: no dropout).
//! - [`Classifier::forward_backward`]`(ws, batch, loss_weight, grads, dropout)` → mean loss, and
//!   `grads += loss_weight · d(mean loss)/dθ` in the layout of [`Classifier::params`].
//!
//! Parameters live in one flat [`Params`] buffer in HF `named_parameters()` order. All arithmetic
//! goes through [`crate::backend::Backend`]; this type runs it on [`Cpu`].

mod acts;
mod bert;
mod config;
mod layout;
mod on_device;
mod pieces;
mod segments;

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use serde_json::{Map, Value};

use crate::backend::{Backend, Cpu, Loss};
use crate::checkpoint;
use crate::params::Params;
use crate::rng::Rng;

pub use config::BertConfig;
pub use on_device::{Executor, OnDevice};
pub use segments::{BufGrads, BufParams, GradSink, ParamSource, Whole, WholeGrads};

use acts::{Acts, EvalActs};
use bert::Drop;
use layout::Layout;

impl From<std::convert::Infallible> for ModelError {
    fn from(never: std::convert::Infallible) -> Self {
        match never {}
    }
}

/// Why a model could not be built, loaded, saved or run. Every variant names what was wrong.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum ModelError {
    /// Reading or writing a file failed.
    #[error("{path}: {message}")]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// The OS error.
        message: String,
    },
    /// `config.json` is malformed or unsupported.
    #[error("bad config: {0}")]
    Config(String),
    /// The device running the passes reported an error (e.g. a CUDA launch failed).
    #[error("device: {0}")]
    Device(String),
    /// The safetensors file is malformed.
    #[error("{path}: bad safetensors file: {message}")]
    Safetensors {
        /// The file.
        path: PathBuf,
        /// The parser's message.
        message: String,
    },
    /// A tensor has a dtype the loader cannot convert.
    #[error("tensor {name}: unsupported dtype {dtype}")]
    Dtype {
        /// The tensor.
        name: String,
        /// Its dtype.
        dtype: String,
    },
    /// Tensors the model needs are absent from the checkpoint.
    #[error("missing tensors: {}", .0.join(", "))]
    Missing(Vec<String>),
    /// A float tensor the model does not have.
    #[error("unexpected tensor {0} (not a BertForSequenceClassification parameter)")]
    Unexpected(String),
    /// A tensor appears twice (e.g. with and without the `bert.` prefix).
    #[error("tensor {0} appears twice")]
    Duplicate(String),
    /// A tensor's shape disagrees with the config.
    #[error("tensor {name}: shape {found:?}, the config implies {expected:?}")]
    Shape {
        /// The parameter name.
        name: String,
        /// Shape implied by the config.
        expected: Vec<usize>,
        /// Shape in the file.
        found: Vec<usize>,
    },
    /// A batch is inconsistent or out of range.
    #[error("bad batch: {0}")]
    Batch(String),
    /// An argument is inconsistent with the model (gradient length, label names, …).
    #[error("{0}")]
    Argument(String),
    /// The machine cannot hold the model (its size and what is available, in words).
    #[error("{0}")]
    Memory(String),
}

/// One batch of token sequences, row-major `[batch, seq]`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Batch {
    /// Token ids (< vocab_size).
    pub input_ids: Vec<u32>,
    /// Segment ids (< type_vocab_size).
    pub token_type_ids: Vec<u32>,
    /// 1 = real token, 0 = padding (padded keys are masked out of attention).
    pub attention_mask: Vec<u32>,
    /// One label per sequence (< num_labels).
    pub labels: Vec<u32>,
    /// Sequences.
    pub batch: usize,
    /// Tokens per sequence (≤ max_position_embeddings).
    pub seq: usize,
}

/// Which dropout masks a training micro-batch uses. Masks are a pure function of the key (Philox),
/// so a resumed run or another backend reproduces them; give every micro-batch its own
/// `micro_batch` number.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DropoutKey {
    /// The run's dropout seed.
    pub seed: u64,
    /// A number unique to this micro-batch (e.g. a global micro-batch counter).
    pub micro_batch: u64,
}

/// Reusable activation buffers: reallocated only when the batch shape changes.
pub struct Workspace<B: Backend = Cpu> {
    acts: Option<Acts<B>>,
    /// The evaluation forward's (smaller) buffers.
    eval: Option<EvalActs<B>>,
}

impl<B: Backend> Default for Workspace<B> {
    fn default() -> Self {
        Workspace {
            acts: None,
            eval: None,
        }
    }
}

impl<B: Backend> Workspace<B> {
    /// An empty workspace; buffers are allocated by the first call that uses it.
    pub fn new() -> Self {
        Self::default()
    }

    /// The token ids [`Classifier::set_inputs_on`] last wrote (`batch · seq` of them), if any.
    pub(crate) fn input_ids(&self) -> Option<&B::Ids> {
        self.acts.as_ref().map(|a| &a.ids)
    }
}

/// The workspace's training buffers for `b`'s shape: the ones it has, resized (in place when
/// they are large enough, [`Acts::reshape`]), or new ones.
fn acts_for<'w, B: Backend>(
    be: &B,
    slot: &'w mut Option<Acts<B>>,
    c: &BertConfig,
    labels: usize,
    (batch, seq): (usize, usize),
) -> &'w mut Acts<B> {
    match slot {
        Some(a) => {
            if (a.batch, a.seq) != (batch, seq) {
                a.reshape(be, c, labels, batch, seq);
            }
            a
        }
        slot => slot.insert(Acts::new(be, c, labels, batch, seq)),
    }
}

/// The workspace's evaluation buffers for a `(batch, seq)` shape, as [`acts_for`].
fn eval_acts_for<'w, B: Backend>(
    be: &B,
    slot: &'w mut Option<EvalActs<B>>,
    c: &BertConfig,
    labels: usize,
    (batch, seq): (usize, usize),
) -> &'w mut EvalActs<B> {
    match slot {
        Some(a) => {
            if (a.batch, a.seq) != (batch, seq) {
                a.reshape(be, c, labels, batch, seq);
            }
            a
        }
        slot => slot.insert(EvalActs::new(be, c, labels, batch, seq)),
    }
}

/// 64-bit FNV-1a: a stable per-tensor RNG stream from the tensor's name.
fn name_stream(name: &str) -> u64 {
    name.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// HF `BertForSequenceClassification`: encoder + pooler + dropout + linear head.
#[derive(Debug, Clone)]
pub struct Classifier {
    config: BertConfig,
    num_labels: usize,
    params: Params,
    layout: Layout,
    backend: Cpu,
    /// Where the passes run when not on `backend` (a GPU).
    executor: Option<std::sync::Arc<dyn Executor>>,
    /// Changes whenever the parameter values may have (unique in the process), so an executor
    /// uploads them only when they did.
    stamp: u64,
}

/// A fresh [`Classifier`] parameter stamp.
fn new_stamp() -> u64 {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
    NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}

impl std::fmt::Debug for dyn Executor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Executor({})", self.describe())
    }
}

impl Classifier {
    fn zeros(config: BertConfig, num_labels: usize) -> Result<Classifier, ModelError> {
        config.validate()?;
        if num_labels < 2 {
            // One label would be HF's regression problem type, which this loss is not.
            return Err(ModelError::Argument(format!(
                "num_labels = {num_labels}: single-label classification needs at least 2"
            )));
        }
        let params = Params::try_zeros(layout::param_specs(&config, num_labels))
            .map_err(ModelError::Memory)?;
        let layout = Layout::of(&config, &params);
        Ok(Classifier {
            config,
            num_labels,
            params,
            layout,
            backend: Cpu::default(),
            executor: None,
            stamp: new_stamp(),
        })
    }

    /// HF's `_init_weights` for tensor `name`: Linear / Embedding weights normal(0,
    /// initializer_range) from the tensor's own RNG stream, biases 0, LayerNorm 1 / 0, the
    /// word-embedding row of `pad_token_id` 0.
    fn init_tensor(&mut self, name: &str, seed: u64) {
        let std = self.config.initializer_range;
        let hidden = self.config.hidden_size;
        let pad = self.config.pad_token_id;
        let data = self.params.get_mut(name).expect("own tensor");
        if name.contains("LayerNorm.") {
            let v = if name.ends_with(".weight") { 1.0 } else { 0.0 };
            data.fill(v);
        } else if name.ends_with(".bias") {
            data.fill(0.0);
        } else {
            let mut rng = Rng::new(seed, name_stream(name));
            for x in data.iter_mut() {
                *x = (rng.normal() * std) as f32;
            }
            if name == "bert.embeddings.word_embeddings.weight" {
                if let Some(p) = pad {
                    data[p * hidden..(p + 1) * hidden].fill(0.0);
                }
            }
        }
    }

    /// A randomly initialised model (HF `_init_weights`), reproducible from `seed`; each tensor
    /// draws from its own stream, so adding or reordering tensors does not change the others.
    pub fn random(
        config: BertConfig,
        num_labels: usize,
        seed: u64,
    ) -> Result<Classifier, ModelError> {
        let mut m = Classifier::zeros(config, num_labels)?;
        let names: Vec<String> = m.params.entries.iter().map(|e| e.name.clone()).collect();
        for n in &names {
            m.init_tensor(n, seed);
        }
        Ok(m)
    }

    /// The largest tensor a GPU would hold for this model, micro-batches of up to `batch` rows
    /// of `seq` tokens, its parameters in `shards` parts (ZeRO 3's ranks, else 1): its name,
    /// its shape in words and its elements (`None` past `usize::MAX`). The CUDA kernels index
    /// with 32-bit ints (kernels/mod.rs, `int`), so a device run refuses 2³¹ elements or more
    /// before it starts (train.rs) instead of stopping at a launch.
    pub fn largest_device_tensor(
        config: &BertConfig,
        num_labels: usize,
        batch: usize,
        seq: usize,
        shards: usize,
    ) -> (&'static str, String, Option<usize>) {
        let c = config;
        let tokens = batch.checked_mul(seq);
        let mul = |a: Option<usize>, b: usize| a.and_then(|a| a.checked_mul(b));
        let candidates = [
            (
                "attention probabilities",
                format!(
                    "micro {batch} × heads {} × {seq} × {seq} tokens",
                    c.num_attention_heads
                ),
                mul(mul(mul(Some(batch), c.num_attention_heads), seq), seq),
            ),
            (
                "feed-forward activations",
                format!(
                    "micro {batch} × {seq} tokens × intermediate {}",
                    c.intermediate_size
                ),
                mul(tokens, c.intermediate_size),
            ),
            (
                "q, k and v",
                format!(
                    "micro {batch} × {seq} tokens × 3 × hidden {}",
                    c.hidden_size
                ),
                mul(mul(tokens, 3), c.hidden_size),
            ),
            (
                "parameters",
                format!("the model's parameters in {} part(s)", shards.max(1)),
                Classifier::param_count(c, num_labels).map(|n| n.div_ceil(shards.max(1))),
            ),
        ];
        candidates
            .into_iter()
            .max_by_key(|(_, _, n)| n.unwrap_or(usize::MAX))
            .expect("four candidates")
    }

    /// The parameters a model of `config` with `num_labels` labels has, or `None` past
    /// `usize::MAX` (a config's sizes are the user's).
    pub fn param_count(config: &BertConfig, num_labels: usize) -> Option<usize> {
        crate::params::element_count(&layout::param_specs(config, num_labels))
    }

    /// Loads `dir/config.json` and `dir/model.safetensors` (see the module docs for the name
    /// rules). A missing `classifier.{weight,bias}` pair is initialised from `seed`; any other
    /// missing tensor, an unknown float tensor or a shape that disagrees with the config is an
    /// error naming the tensor.
    pub fn from_pretrained(
        dir: &Path,
        num_labels: usize,
        seed: u64,
    ) -> Result<Classifier, ModelError> {
        let cfg_path = dir.join("config.json");
        let text = std::fs::read_to_string(&cfg_path).map_err(|e| ModelError::Io {
            path: cfg_path.clone(),
            message: e.to_string(),
        })?;
        let config = BertConfig::from_json(&text)?;
        let mut m = Classifier::zeros(config, num_labels)?;
        let file = checkpoint::read_safetensors(&dir.join("model.safetensors"))?;
        let mut seen: HashMap<String, ()> = HashMap::new();
        for t in file.tensors {
            let name = if t.name.starts_with("bert.") || t.name.starts_with("classifier.") {
                t.name.clone()
            } else if t.name.starts_with("cls.") {
                continue; // pre-training (MLM/NSP) heads: not part of the classifier
            } else {
                format!("bert.{}", t.name)
            };
            let Some(e) = m.params.entry(&name) else {
                return Err(ModelError::Unexpected(t.name));
            };
            if e.shape != t.shape {
                return Err(ModelError::Shape {
                    name: t.name,
                    expected: e.shape.clone(),
                    found: t.shape,
                });
            }
            if seen.insert(name.clone(), ()).is_some() {
                return Err(ModelError::Duplicate(name));
            }
            let r = e.range();
            m.params.data[r].copy_from_slice(&t.data);
        }
        let missing: Vec<String> = m
            .params
            .entries
            .iter()
            .map(|e| e.name.clone())
            .filter(|n| !seen.contains_key(n))
            .collect();
        let head = ["classifier.weight", "classifier.bias"];
        if missing.iter().all(|n| head.contains(&n.as_str())) {
            // A bare encoder checkpoint: HF initialises the new head the same way.
            for n in &missing {
                m.init_tensor(n, seed);
            }
        } else {
            return Err(ModelError::Missing(missing));
        }
        Ok(m)
    }

    /// Writes `dir/config.json` (with `id2label` / `label2id` / `architectures`) and
    /// `dir/model.safetensors` (F32, `bert.`-prefixed HF names), loadable by
    /// `transformers.BertForSequenceClassification.from_pretrained(dir)`. The directory is
    /// replaced atomically.
    pub fn save_pretrained(&self, dir: &Path, id2label: &[String]) -> Result<(), ModelError> {
        if id2label.len() != self.num_labels {
            return Err(ModelError::Argument(format!(
                "{} label names for {} labels",
                id2label.len(),
                self.num_labels
            )));
        }
        let mut cfg = self.config.clone();
        let id2: Map<String, Value> = id2label
            .iter()
            .enumerate()
            .map(|(i, l)| (i.to_string(), Value::from(l.clone())))
            .collect();
        let l2i: Map<String, Value> = id2label
            .iter()
            .enumerate()
            .map(|(i, l)| (l.clone(), Value::from(i)))
            .collect();
        if l2i.len() != id2label.len() {
            return Err(ModelError::Argument("label names are not distinct".into()));
        }
        cfg.extra.insert("id2label".into(), Value::Object(id2));
        cfg.extra.insert("label2id".into(), Value::Object(l2i));
        cfg.extra.insert(
            "architectures".into(),
            Value::from(vec!["BertForSequenceClassification"]),
        );
        cfg.extra.insert("model_type".into(), Value::from("bert"));
        cfg.extra.insert(
            "problem_type".into(),
            Value::from("single_label_classification"),
        );
        // HF derives num_labels from id2label; a stale explicit value would contradict it.
        cfg.extra.remove("num_labels");
        let json = serde_json::to_vec_pretty(&cfg)
            .map_err(|e| ModelError::Config(format!("serialising config: {e}")))?;
        let tensors: Vec<(String, Vec<usize>, &[f32])> = self
            .params
            .entries
            .iter()
            .map(|e| {
                (
                    e.name.clone(),
                    e.shape.clone(),
                    &self.params.data[e.range()],
                )
            })
            .collect();
        let meta = HashMap::from([("format".to_string(), "pt".to_string())]);
        let st = checkpoint::safetensors_bytes(&tensors, meta)?;
        checkpoint::write_dir_atomically(dir, &[("config.json", json), ("model.safetensors", st)])
    }

    /// Overrides the hidden and attention dropout (the recipe's `model.dropout`; 0 for exact
    /// parity runs). The head follows the hidden dropout unless the config sets its own.
    pub fn set_dropout(&mut self, p: f64) -> Result<(), ModelError> {
        if !(0.0..1.0).contains(&p) {
            return Err(ModelError::Argument(format!(
                "dropout {p} is not in [0, 1)"
            )));
        }
        self.config.hidden_dropout_prob = p;
        self.config.attention_probs_dropout_prob = p;
        Ok(())
    }

    /// The configuration.
    pub fn config(&self) -> &BertConfig {
        &self.config
    }

    /// Number of classes.
    pub fn num_labels(&self) -> usize {
        self.num_labels
    }

    /// The parameters (flat buffer + entries in HF order).
    pub fn params(&self) -> &Params {
        &self.params
    }

    /// The parameter values, writable (the layout itself is fixed).
    pub fn params_mut(&mut self) -> &mut [f32] {
        self.stamp = new_stamp();
        &mut self.params.data
    }

    /// Runs on `backend` (e.g. `Cpu::new(2)` for two threads) from now on.
    pub fn set_backend(&mut self, backend: Cpu) {
        self.backend = backend;
    }

    /// Runs [`Classifier::forward`] and [`Classifier::forward_backward`] on `executor` (a GPU)
    /// from now on; the CPU backend stays for what the executor does not run (ZeRO-2/3's
    /// segment-wise passes).
    pub fn set_executor(&mut self, executor: std::sync::Arc<dyn Executor>) {
        self.executor = Some(executor);
    }

    /// Changes whenever the parameter values may have changed (process-unique): equal stamps
    /// mean equal parameters.
    pub fn params_stamp(&self) -> u64 {
        self.stamp
    }

    /// The executor set by [`Classifier::set_executor`], if any.
    pub fn executor(&self) -> Option<&std::sync::Arc<dyn Executor>> {
        self.executor.as_ref()
    }

    /// Checks a batch against the model; the error says which field is wrong.
    pub fn check_batch(&self, b: &Batch) -> Result<(), ModelError> {
        let bad = |m: String| Err(ModelError::Batch(m));
        let c = &self.config;
        if b.batch == 0 || b.seq == 0 {
            return bad(format!("empty batch {} × {}", b.batch, b.seq));
        }
        if b.seq > c.max_position_embeddings {
            return bad(format!(
                "seq {} exceeds max_position_embeddings {}",
                b.seq, c.max_position_embeddings
            ));
        }
        let n = b.batch * b.seq;
        for (name, v, bound) in [
            ("input_ids", &b.input_ids, c.vocab_size),
            ("token_type_ids", &b.token_type_ids, c.type_vocab_size),
            ("attention_mask", &b.attention_mask, 2),
        ] {
            if v.len() != n {
                return bad(format!("{name} has {} entries, batch × seq = {n}", v.len()));
            }
            if let Some((i, x)) = v.iter().enumerate().find(|(_, &x)| x as usize >= bound) {
                return bad(format!("{name}[{i}] = {x} is not below {bound}"));
            }
        }
        if b.labels.len() != b.batch {
            return bad(format!(
                "labels has {} entries for {} sequences",
                b.labels.len(),
                b.batch
            ));
        }
        if let Some((i, x)) = b
            .labels
            .iter()
            .enumerate()
            .find(|(_, &x)| x as usize >= self.num_labels)
        {
            return bad(format!(
                "labels[{i}] = {x} is not below {}",
                self.num_labels
            ));
        }
        Ok(())
    }

    fn prepare<'w>(&self, ws: &'w mut Workspace, b: &Batch) -> &'w mut Acts<Cpu> {
        let a = acts_for(
            &self.backend,
            &mut ws.acts,
            &self.config,
            self.num_labels,
            (b.batch, b.seq),
        );
        a.set_inputs(
            &self.backend,
            &b.input_ids,
            &b.token_type_ids,
            &b.attention_mask,
            &b.labels,
        );
        a
    }

    /// Sizes `ws` for training micro-batches of up to `batch` rows and evaluation batches of up
    /// to `eval_batch`, `seq` tokens each (the plan's `max_len`): called once before a run's
    /// first step, so that no pass allocates afterwards — the shorter batches fit the same
    /// memory ([`Backend::resize`]; docs/cuda.md).
    pub fn reserve_on<B: Backend>(
        &self,
        be: &B,
        ws: &mut Workspace<B>,
        batch: usize,
        eval_batch: usize,
        seq: usize,
    ) {
        let (c, labels) = (&self.config, self.num_labels);
        let zeros = vec![0u32; batch.max(eval_batch) * seq];
        let n = batch * seq;
        let a = acts_for(be, &mut ws.acts, c, labels, (batch, seq));
        a.set_inputs(be, &zeros[..n], &zeros[..n], &zeros[..n], &zeros[..batch]);
        if c.attention_probs_dropout_prob > 0.0 {
            a.reserve_dropout(be, c);
        }
        let n = eval_batch * seq;
        let e = eval_acts_for(be, &mut ws.eval, c, labels, (eval_batch, seq));
        e.set_inputs(be, &zeros[..n], &zeros[..n], &zeros[..n]);
        // The widest GEMM operand: a token-rows activation of the FFN's (or the fused QKV's)
        // width, or the FFN's weight.
        let (h, inter) = (c.hidden_size, c.intermediate_size);
        let rows = batch.max(eval_batch) * seq;
        be.reserve_gemm((rows * inter.max(3 * h)).max(inter * h).max(3 * h * h));
        for (b, backward) in [(batch, true), (eval_batch, false)] {
            let s = crate::backend::AttnShape {
                batch: b,
                seq,
                heads: c.num_attention_heads,
                head_dim: c.head_dim(),
            };
            be.reserve_batch(s, backward);
        }
        // The gradients' sums over a micro-batch's token rows (the widest: the FFN's bias, or
        // LayerNorm's two of `h` with the bias below it, three), its per-row losses and the
        // dropout key.
        let dropout = c.hidden_dropout_prob > 0.0
            || c.attention_probs_dropout_prob > 0.0
            || c.head_dropout() > 0.0;
        be.reserve_sums(batch * seq, inter.max(3 * h), batch, dropout);
    }

    /// The evaluation buffers of `ws` for `b`'s shape, holding `b`'s inputs.
    fn prepare_eval<'w, B: Backend>(
        &self,
        be: &B,
        ws: &'w mut Workspace<B>,
        b: &Batch,
    ) -> &'w mut EvalActs<B> {
        let (c, labels) = (&self.config, self.num_labels);
        let a = eval_acts_for(be, &mut ws.eval, c, labels, (b.batch, b.seq));
        a.set_inputs(be, &b.input_ids, &b.token_type_ids, &b.attention_mask);
        a
    }

    /// Logits `[batch × num_labels]`, row-major, in eval mode (no dropout).
    pub fn forward(&self, batch: &Batch) -> Result<Vec<f32>, ModelError> {
        self.forward_ws(&mut Workspace::new(), batch)
    }

    /// [`Classifier::forward`] reusing the buffers of `ws`.
    pub fn forward_ws(&self, ws: &mut Workspace, batch: &Batch) -> Result<Vec<f32>, ModelError> {
        // Labels are not used by the forward; accept a batch without them.
        let mut probe = batch.clone();
        if probe.labels.is_empty() {
            probe.labels = vec![0; batch.batch];
        }
        self.check_batch(&probe)?;
        self.require_params()?;
        if let Some(x) = &self.executor {
            return x.forward(self, &probe);
        }
        let be = self.backend;
        let a = self.prepare_eval(&be, ws, &probe);
        let mut src = Whole::new(&self.params.data, &self.layout.segs);
        let Ok(()) = bert::forward_eval(&be, &self.config, &self.layout, &mut src, a);
        let mut out = vec![0.0; batch.batch * self.num_labels];
        be.download(&a.logits, &mut out);
        Ok(out)
    }

    /// One training micro-batch: returns its mean cross-entropy and adds
    /// `loss_weight · d(mean loss)/dθ` into `grads` (same layout as [`Classifier::params`]), so
    /// gradient accumulation over `k` micro-batches is `loss_weight = 1/k`. With `dropout`,
    /// the config's dropout probabilities apply with masks drawn from the key; `None` is eval-mode
    /// numerics (as HF with `model.eval()` but with gradients).
    pub fn forward_backward(
        &self,
        ws: &mut Workspace,
        batch: &Batch,
        loss_weight: f32,
        grads: &mut [f32],
        dropout: Option<DropoutKey>,
    ) -> Result<f32, ModelError> {
        self.require_params()?;
        if grads.len() != self.params.len() {
            return Err(ModelError::Argument(format!(
                "gradient buffer has {} elements, the model {}",
                grads.len(),
                self.params.len()
            )));
        }
        if let Some(x) = &self.executor {
            self.check_batch(batch)?;
            return x.forward_backward(self, batch, loss_weight, grads, dropout);
        }
        let segs = &self.layout.segs;
        self.forward_backward_with(
            ws,
            batch,
            loss_weight,
            &mut Whole::new(&self.params.data, segs),
            &mut WholeGrads::new(grads, segs),
            dropout,
        )
    }

    /// [`Classifier::forward_backward`] with parameters read from `params` and gradients left
    /// in `grads`, segment by segment (see [`Classifier::segments`]): how ZeRO-2/3 gather
    /// parameters and reduce gradients one layer at a time. The model's own parameter buffer is
    /// not read, so it may be empty ([`Classifier::take_params`]).
    pub fn forward_backward_with<P, G, E>(
        &self,
        ws: &mut Workspace,
        batch: &Batch,
        loss_weight: f32,
        params: &mut P,
        grads: &mut G,
        dropout: Option<DropoutKey>,
    ) -> Result<f32, E>
    where
        P: ParamSource<Cpu>,
        G: GradSink<Cpu>,
        E: From<P::Error> + From<G::Error> + From<ModelError>,
    {
        self.check_batch(batch)?;
        let c = &self.config;
        let drop = self.dropout_keys(dropout);
        let a = self.prepare(ws, batch);
        let be = self.backend;
        bert::forward(&be, c, &self.layout, params, a, drop)?;
        let loss = bert::backward::<_, _, _, E>(
            &be,
            c,
            &self.layout,
            params,
            a,
            drop,
            loss_weight,
            grads,
        )?;
        Ok(be.loss(loss))
    }

    /// [`Classifier::forward_backward`] on any backend `be` (a GPU's, or the emulated one the
    /// kernel tests use), with the parameters and the gradient accumulator in `be`'s buffers
    /// (both laid out as [`Classifier::params`]). The model's own parameters are not read.
    #[allow(clippy::too_many_arguments)]
    pub fn forward_backward_on<B: Backend>(
        &self,
        be: &B,
        ws: &mut Workspace<B>,
        batch: &Batch,
        loss_weight: f32,
        params: &B::Buf,
        grads: &mut B::Buf,
        dropout: Option<DropoutKey>,
    ) -> Result<f32, ModelError> {
        let segs = &self.layout.segs;
        let mut src = BufParams::new(be, params, segs);
        let mut sink = BufGrads::new(be, grads, segs);
        let loss = self.forward_backward_on_with::<_, _, _, ModelError>(
            be,
            ws,
            batch,
            loss_weight,
            &mut src,
            &mut sink,
            dropout,
        )?;
        Ok(be.loss(loss))
    }

    /// [`Classifier::forward_backward_on`] with the parameters read from `src` and the
    /// gradients left in `sink` segment by segment, on `be`: how ZeRO-3 gathers each segment
    /// and reduces its gradient between GPUs inside the pass ([`Classifier::forward_backward_with`]
    /// on the CPU). The loss is returned as the backend left it (on a device, still queued:
    /// [`Backend::loss`] reads it), so that the caller decides when to wait for the device.
    #[allow(clippy::too_many_arguments)]
    pub fn forward_backward_on_with<B, P, G, E>(
        &self,
        be: &B,
        ws: &mut Workspace<B>,
        batch: &Batch,
        loss_weight: f32,
        src: &mut P,
        sink: &mut G,
        dropout: Option<DropoutKey>,
    ) -> Result<Loss, E>
    where
        B: Backend,
        P: ParamSource<B>,
        G: GradSink<B>,
        E: From<P::Error> + From<G::Error> + From<ModelError>,
    {
        self.set_inputs_on(be, ws, batch)?;
        self.pass_on_with(be, ws, batch, loss_weight, src, sink, dropout)
    }

    /// The first half of [`Classifier::forward_backward_on_with`]: checks `batch` and copies its
    /// token ids, segments, mask and labels into the workspace (sized for its shape).
    pub fn set_inputs_on<B: Backend>(
        &self,
        be: &B,
        ws: &mut Workspace<B>,
        batch: &Batch,
    ) -> Result<(), ModelError> {
        self.check_batch(batch)?;
        let a = acts_for(
            be,
            &mut ws.acts,
            &self.config,
            self.num_labels,
            (batch.batch, batch.seq),
        );
        a.set_inputs(
            be,
            &batch.input_ids,
            &batch.token_type_ids,
            &batch.attention_mask,
            &batch.labels,
        );
        Ok(())
    }

    /// The second half of [`Classifier::forward_backward_on_with`]: the forward and backward on
    /// the inputs [`Classifier::set_inputs_on`] left for `batch`. With the workspace sized for
    /// the shape and the dropout key set ([`Classifier::dropout_key`]), nothing here but the
    /// backend's device work and the sources' and sinks' own: what a CUDA graph captures
    /// (`model::on_device`).
    #[allow(clippy::too_many_arguments)]
    pub fn pass_on_with<B, P, G, E>(
        &self,
        be: &B,
        ws: &mut Workspace<B>,
        batch: &Batch,
        loss_weight: f32,
        src: &mut P,
        sink: &mut G,
        dropout: Option<DropoutKey>,
    ) -> Result<Loss, E>
    where
        B: Backend,
        P: ParamSource<B>,
        G: GradSink<B>,
        E: From<P::Error> + From<G::Error> + From<ModelError>,
    {
        let c = &self.config;
        let drop = self.dropout_keys(dropout);
        // Sized by `set_inputs_on` for this shape: nothing to do.
        let a = acts_for(
            be,
            &mut ws.acts,
            c,
            self.num_labels,
            (batch.batch, batch.seq),
        );
        bert::forward(be, c, &self.layout, src, a, drop)?;
        bert::backward::<B, _, _, E>(be, c, &self.layout, src, a, drop, loss_weight, sink)
    }

    /// A micro-batch's dropout key as a device keeps it: `(seed, first stream)`, each site's
    /// stream that plus its site (`Dropout::site`); `None` without dropout.
    pub fn dropout_key(&self, dropout: Option<DropoutKey>) -> Option<(u64, u64)> {
        self.dropout_keys(dropout).map(|d| (d.seed, d.base))
    }

    /// Eval-mode logits `[batch × num_labels]` on any backend, the parameters in `be`'s buffer.
    pub fn forward_on<B: Backend>(
        &self,
        be: &B,
        ws: &mut Workspace<B>,
        batch: &Batch,
        params: &B::Buf,
    ) -> Result<Vec<f32>, ModelError> {
        let mut src = BufParams::new(be, params, &self.layout.segs);
        self.forward_on_with(be, ws, batch, &mut src)
    }

    /// [`Classifier::forward_on`] with the parameters read from `src` segment by segment.
    pub fn forward_on_with<B, P>(
        &self,
        be: &B,
        ws: &mut Workspace<B>,
        batch: &Batch,
        src: &mut P,
    ) -> Result<Vec<f32>, ModelError>
    where
        B: Backend,
        P: ParamSource<B>,
        ModelError: From<P::Error>,
    {
        self.set_eval_inputs_on(be, ws, batch)?;
        self.eval_pass_on_with(be, ws, batch, src)?;
        Ok(self.eval_logits_on(be, ws, batch))
    }

    /// The first part of [`Classifier::forward_on_with`]: checks an evaluation `batch` (its
    /// labels are not needed) and copies its token ids, segments and mask into the workspace's
    /// evaluation buffers (sized for its shape).
    pub fn set_eval_inputs_on<B: Backend>(
        &self,
        be: &B,
        ws: &mut Workspace<B>,
        batch: &Batch,
    ) -> Result<(), ModelError> {
        if batch.labels.is_empty() {
            let probe = Batch {
                labels: vec![0; batch.batch],
                ..batch.clone()
            };
            self.check_batch(&probe)?;
        } else {
            self.check_batch(batch)?;
        }
        self.prepare_eval(be, ws, batch);
        Ok(())
    }

    /// The second part of [`Classifier::forward_on_with`]: the evaluation forward on the inputs
    /// [`Classifier::set_eval_inputs_on`] left for `batch`, as on the CPU (one layer's buffers,
    /// the last layer on the `[CLS]` rows only; runtime/emu/tests/model.rs checks it against the
    /// CPU's logits). Nothing here but the backend's device work and the source's own: what a
    /// CUDA graph captures (`model::on_device`).
    pub fn eval_pass_on_with<B, P>(
        &self,
        be: &B,
        ws: &mut Workspace<B>,
        batch: &Batch,
        src: &mut P,
    ) -> Result<(), ModelError>
    where
        B: Backend,
        P: ParamSource<B>,
        ModelError: From<P::Error>,
    {
        let (c, labels) = (&self.config, self.num_labels);
        // Sized by `set_eval_inputs_on` for this shape: nothing to do.
        let a = eval_acts_for(be, &mut ws.eval, c, labels, (batch.batch, batch.seq));
        bert::forward_eval(be, c, &self.layout, src, a)?;
        Ok(())
    }

    /// The last part of [`Classifier::forward_on_with`]: the logits the evaluation forward left
    /// for `batch`, `[batch × num_labels]` (a download: it waits for the device).
    pub fn eval_logits_on<B: Backend>(
        &self,
        be: &B,
        ws: &mut Workspace<B>,
        batch: &Batch,
    ) -> Vec<f32> {
        let (c, labels) = (&self.config, self.num_labels);
        let a = eval_acts_for(be, &mut ws.eval, c, labels, (batch.batch, batch.seq));
        let mut out = vec![0.0; batch.batch * labels];
        be.download(be.view(&a.logits), &mut out);
        out
    }

    fn dropout_keys(&self, dropout: Option<DropoutKey>) -> Option<Drop> {
        let c = &self.config;
        dropout.map(|k| Drop {
            seed: k.seed,
            base: k.micro_batch.wrapping_mul(4096),
            hidden: c.hidden_dropout_prob as f32,
            attn: c.attention_probs_dropout_prob as f32,
            head: c.head_dropout() as f32,
        })
    }

    /// The segments of the flat parameter buffer in forward order: the embeddings, each encoder
    /// layer, then the pooler with the head. They tile [`Classifier::params`].
    pub fn segments(&self) -> &[std::ops::Range<usize>] {
        &self.layout.segs
    }

    /// The word embeddings as `(rows, row_len)`: the table at the start of the first segment
    /// that the forward reads by token id, row `ids[t]` for token `t` (a device's step may
    /// update those rows first: `model::on_device`).
    pub fn token_table(&self) -> Option<(usize, usize)> {
        let c = &self.config;
        let first = self.layout.segs.first()?;
        (self.layout.word == 0 && first.start == 0 && c.vocab_size * c.hidden_size <= first.len())
            .then_some((c.vocab_size, c.hidden_size))
    }

    /// Elements of the whole parameter buffer (also while it is taken out).
    pub fn num_params(&self) -> usize {
        self.layout.segs.last().map_or(0, |r| r.end)
    }

    fn require_params(&self) -> Result<(), ModelError> {
        if self.params.data.len() != self.num_params() {
            return Err(ModelError::Argument(
                "the model's parameters are partitioned (ZeRO-3): gather them first".into(),
            ));
        }
        Ok(())
    }

    /// Takes the parameter values out, leaving the model without them (a ZeRO-3 rank keeps only
    /// its partition; [`Classifier::forward_backward_with`] still runs, the other passes refuse
    /// until [`Classifier::put_params`]).
    pub fn take_params(&mut self) -> Vec<f32> {
        self.stamp = new_stamp();
        std::mem::take(&mut self.params.data)
    }

    /// Puts a whole parameter buffer back (same length as the layout).
    pub fn put_params(&mut self, data: Vec<f32>) -> Result<(), ModelError> {
        let n = self.num_params();
        if data.len() != n {
            return Err(ModelError::Argument(format!(
                "parameter buffer has {} elements, the model {n}",
                data.len()
            )));
        }
        self.params.data = data;
        self.stamp = new_stamp();
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::precision::Dtype;

    #[test]
    fn eval_forward_is_the_training_forward_bit_for_bit() {
        // Big enough that the GEMMs and elementwise kernels take their threaded paths.
        let cfg = BertConfig::from_json(
            r#"{"vocab_size": 50, "hidden_size": 64, "num_hidden_layers": 2,
                "num_attention_heads": 4, "intermediate_size": 256,
                "max_position_embeddings": 64, "type_vocab_size": 2, "initializer_range": 0.3}"#,
        )
        .unwrap();
        let (batch, seq) = (5, 40);
        let mut r = Rng::new(11, 1);
        let mut b = Batch {
            batch,
            seq,
            labels: vec![0; batch],
            ..Batch::default()
        };
        for i in 0..batch {
            let len = if i == 0 {
                seq
            } else {
                1 + r.below(seq as u64) as usize
            };
            for t in 0..seq {
                let real = t < len;
                b.input_ids
                    .push(if real { 1 + r.below(49) as u32 } else { 0 });
                b.token_type_ids.push(u32::from(real && t >= len / 2));
                b.attention_mask.push(u32::from(real));
            }
        }
        for (threads, store) in [(1, Dtype::F32), (3, Dtype::F32), (2, Dtype::Bf16)] {
            let mut m = Classifier::random(cfg.clone(), 3, 5).unwrap();
            m.set_backend(Cpu::new(threads).with_store(store));
            let got = m.forward(&b).unwrap();
            let be = m.backend;
            let mut a = Acts::new(&be, &m.config, 3, batch, seq);
            a.set_inputs(
                &be,
                &b.input_ids,
                &b.token_type_ids,
                &b.attention_mask,
                &b.labels,
            );
            let mut src = Whole::new(&m.params.data, &m.layout.segs);
            let Ok(()) = bert::forward(&be, &m.config, &m.layout, &mut src, &mut a, None);
            assert_eq!(got, a.logits, "{threads} threads, {store:?}");
        }
    }
}
