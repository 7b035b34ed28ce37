//! `BertConfig`: the fields of HF's `config.json` that the runtime uses, keeping every other field
//! so that a loaded config is written back unchanged.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::ModelError;

fn d_gelu() -> String {
    "gelu".into()
}
fn d_max_pos() -> usize {
    512
}
fn d_type_vocab() -> usize {
    2
}
fn d_eps() -> f64 {
    1e-12
}
fn d_drop() -> f64 {
    0.1
}
fn d_init() -> f64 {
    0.02
}

/// A BERT encoder configuration, read from / written to HF `config.json`.
///
/// The five size fields are required; the others default to HF `BertConfig`'s defaults when absent.
/// Unknown fields are kept in [`BertConfig::extra`] and written back unchanged.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BertConfig {
    /// Rows of the word-embedding table.
    pub vocab_size: usize,
    /// Model width.
    pub hidden_size: usize,
    /// Encoder layers.
    pub num_hidden_layers: usize,
    /// Attention heads (must divide `hidden_size`).
    pub num_attention_heads: usize,
    /// Width of the feed-forward layer.
    pub intermediate_size: usize,
    /// Activation; only `"gelu"` (exact erf GELU) is supported.
    #[serde(default = "d_gelu")]
    pub hidden_act: String,
    /// Rows of the position-embedding table (the longest sequence).
    #[serde(default = "d_max_pos")]
    pub max_position_embeddings: usize,
    /// Rows of the token-type table.
    #[serde(default = "d_type_vocab")]
    pub type_vocab_size: usize,
    /// LayerNorm epsilon.
    #[serde(default = "d_eps")]
    pub layer_norm_eps: f64,
    /// Dropout after embeddings, attention output, feed-forward output (and the head by default).
    #[serde(default = "d_drop")]
    pub hidden_dropout_prob: f64,
    /// Dropout on attention probabilities.
    #[serde(default = "d_drop")]
    pub attention_probs_dropout_prob: f64,
    /// Dropout before the classifier head; `None` means `hidden_dropout_prob` (HF's rule).
    #[serde(default)]
    pub classifier_dropout: Option<f64>,
    /// Padding token id, whose embedding row HF initialises to zero.
    #[serde(default)]
    pub pad_token_id: Option<usize>,
    /// Standard deviation of the normal initialisation.
    #[serde(default = "d_init")]
    pub initializer_range: f64,
    /// Every other field of `config.json`, kept verbatim.
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

impl BertConfig {
    /// Parses `config.json` text and checks it ([`BertConfig::validate`]).
    pub fn from_json(text: &str) -> Result<BertConfig, ModelError> {
        let c: BertConfig = serde_json::from_str(text)
            .map_err(|e| ModelError::Config(format!("config.json: {e}")))?;
        c.validate()?;
        Ok(c)
    }

    /// Checks what the runtime relies on; the error names the offending field.
    pub fn validate(&self) -> Result<(), ModelError> {
        let bad = |m: String| Err(ModelError::Config(m));
        for (name, v) in [
            ("vocab_size", self.vocab_size),
            ("hidden_size", self.hidden_size),
            ("num_hidden_layers", self.num_hidden_layers),
            ("num_attention_heads", self.num_attention_heads),
            ("intermediate_size", self.intermediate_size),
            ("max_position_embeddings", self.max_position_embeddings),
            ("type_vocab_size", self.type_vocab_size),
        ] {
            if v == 0 {
                return bad(format!("{name} must be positive"));
            }
        }
        if self.num_hidden_layers > 1000 {
            // The dropout stream numbering reserves 4096 sites per micro-batch.
            return bad(format!(
                "num_hidden_layers = {} is more than 1000",
                self.num_hidden_layers
            ));
        }
        if self.hidden_size % self.num_attention_heads != 0 {
            return bad(format!(
                "hidden_size {} is not a multiple of num_attention_heads {}",
                self.hidden_size, self.num_attention_heads
            ));
        }
        if self.hidden_act != "gelu" {
            return bad(format!(
                "hidden_act {:?} is not supported (only \"gelu\", the exact erf GELU)",
                self.hidden_act
            ));
        }
        if !(self.layer_norm_eps > 0.0 && self.layer_norm_eps.is_finite()) {
            return bad(format!(
                "layer_norm_eps {} must be positive",
                self.layer_norm_eps
            ));
        }
        for (name, p) in [
            ("hidden_dropout_prob", self.hidden_dropout_prob),
            (
                "attention_probs_dropout_prob",
                self.attention_probs_dropout_prob,
            ),
            ("classifier_dropout", self.classifier_dropout.unwrap_or(0.0)),
        ] {
            if !(0.0..1.0).contains(&p) {
                return bad(format!("{name} {p} is not in [0, 1)"));
            }
        }
        if !(self.initializer_range >= 0.0 && self.initializer_range.is_finite()) {
            return bad(format!(
                "initializer_range {} must be non-negative",
                self.initializer_range
            ));
        }
        if let Some(p) = self.pad_token_id {
            if p >= self.vocab_size {
                return bad(format!(
                    "pad_token_id {p} is not below vocab_size {}",
                    self.vocab_size
                ));
            }
        }
        if let Some(t) = self.extra.get("position_embedding_type") {
            if t != "absolute" {
                return bad(format!(
                    "position_embedding_type {t} is not supported (only \"absolute\")"
                ));
            }
        }
        if let Some(t) = self.extra.get("model_type") {
            if t != "bert" {
                return bad(format!("model_type {t} is not \"bert\""));
            }
        }
        Ok(())
    }

    /// Width of one attention head.
    pub fn head_dim(&self) -> usize {
        self.hidden_size / self.num_attention_heads
    }

    /// Dropout before the classifier head.
    pub fn head_dropout(&self) -> f64 {
        self.classifier_dropout.unwrap_or(self.hidden_dropout_prob)
    }
}
