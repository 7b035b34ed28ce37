//! Tokenization with a HF `tokenizer.json`, once per run, and per-batch padding.
//!
//! Rows are tokenized (and truncated to the recipe's `max_len`) once when the [`Dataset`] is
//! loaded; a batch only copies the rows it needs and pads them to the longest among them, which
//! is what HF's `DataCollatorWithPadding` does and keeps short batches short.

use std::path::{Path, PathBuf};

use tokenizers::{
    EncodeInput, Tokenizer, TruncationDirection, TruncationParams, TruncationStrategy,
};

use super::{read_examples, DataError, DataSpec, Example, LabelSet};

/// Rows are tokenized in chunks of this many so that the tokenizer's intermediate
/// `Encoding`s (offsets, token strings, …) of a large file are never all alive at once.
const ENCODE_CHUNK: usize = 1024;

/// A HF `tokenizers` tokenizer configured for the recipe: no padding, truncation to `max_len`.
#[derive(Debug, Clone)]
pub struct TextTokenizer {
    inner: Tokenizer,
    path: PathBuf,
    max_len: usize,
    pad_id: u32,
    pad_type_id: u32,
}

/// One tokenized row (special tokens included, truncated, unpadded).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Encoded {
    /// Token ids.
    pub ids: Vec<u32>,
    /// Segment ids: 0 for the first text, 1 for the second of a pair (per the file's template).
    pub type_ids: Vec<u32>,
}

/// A text the tokenizer rejected; the tokenizers crate's message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct EncodeError(pub String);

impl TextTokenizer {
    /// Loads `tokenizer.json` and replaces the padding and truncation baked into it by the
    /// recipe's: many files (e.g. all-MiniLM-L6-v2's `padding: Fixed(128)`, `truncation: 128`)
    /// carry the settings of whoever exported them, which would silently make every row 128 long.
    /// Truncation is longest-first to `max_len` tokens including special tokens, as HF's
    /// `tokenizer(..., truncation=True, max_length=max_len)`.
    pub fn from_file(path: impl AsRef<Path>, max_len: usize) -> Result<TextTokenizer, DataError> {
        let path = path.as_ref().to_path_buf();
        let err = |message: String| DataError::Tokenizer {
            path: path.clone(),
            message,
        };
        let mut inner = Tokenizer::from_file(&path).map_err(|e| err(e.to_string()))?;
        // The pad token the file itself declares is authoritative (RoBERTa pads with `<pad>` = 1);
        // without one, BERT's `[PAD]`; else 0. Read before the file's padding is switched off.
        let (pad_id, pad_type_id) = match inner.get_padding() {
            Some(p) => (p.pad_id, p.pad_type_id),
            None => (inner.token_to_id("[PAD]").unwrap_or(0), 0),
        };
        // The special tokens of a pair (the larger count) must fit with room to spare; the
        // tokenizers crate subtracts them from `max_length` unchecked.
        let special = inner
            .get_post_processor()
            .map_or(0, |p| tokenizers::PostProcessor::added_tokens(p, true));
        if max_len <= special {
            return Err(err(format!(
                "max_len {max_len} leaves no room for text next to the {special} special tokens"
            )));
        }
        inner.with_padding(None);
        inner
            .with_truncation(Some(TruncationParams {
                direction: TruncationDirection::Right,
                max_length: max_len,
                strategy: TruncationStrategy::LongestFirst,
                stride: 0,
            }))
            .map_err(|e| err(e.to_string()))?;
        Ok(TextTokenizer {
            inner,
            path,
            max_len,
            pad_id,
            pad_type_id,
        })
    }

    /// The file this tokenizer was loaded from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The longest row, in tokens, that [`TextTokenizer::encode`] returns.
    pub fn max_len(&self) -> usize {
        self.max_len
    }

    /// The id padding positions get.
    pub fn pad_id(&self) -> u32 {
        self.pad_id
    }

    /// The segment id padding positions get.
    pub fn pad_type_id(&self) -> u32 {
        self.pad_type_id
    }

    /// The vocabulary size including added tokens: ids are below it.
    pub fn vocab_size(&self) -> usize {
        self.inner.get_vocab_size(true)
    }

    /// Tokenizes one text, or a pair, with special tokens, truncated to `max_len`.
    pub fn encode(&self, text: &str, pair: Option<&str>) -> Result<Encoded, EncodeError> {
        let enc = self
            .inner
            .encode(input(text, pair), true)
            .map_err(|e| EncodeError(e.to_string()))?;
        Ok(to_encoded(&enc))
    }

    /// Tokenizes examples read from `path` (in parallel where the crate can), naming the line of
    /// the first row that fails.
    pub fn encode_examples(
        &self,
        path: &Path,
        examples: &[Example],
    ) -> Result<Vec<Encoded>, DataError> {
        let mut out = Vec::with_capacity(examples.len());
        for chunk in examples.chunks(ENCODE_CHUNK) {
            let inputs: Vec<EncodeInput> = chunk
                .iter()
                .map(|e| input(&e.text, e.text_pair.as_deref()))
                .collect();
            match self.inner.encode_batch(inputs, true) {
                Ok(encs) => out.extend(encs.iter().map(to_encoded)),
                Err(_) => {
                    // The batch call does not say which row failed: find it one by one.
                    for e in chunk {
                        let enc = self
                            .encode(&e.text, e.text_pair.as_deref())
                            .map_err(|err| DataError::Encode {
                                path: path.to_path_buf(),
                                line: e.line,
                                message: err.0,
                            })?;
                        out.push(enc);
                    }
                }
            }
        }
        Ok(out)
    }
}

fn input<'s>(text: &'s str, pair: Option<&'s str>) -> EncodeInput<'s> {
    match pair {
        Some(p) => (text, p).into(),
        None => text.into(),
    }
}

fn to_encoded(enc: &tokenizers::Encoding) -> Encoded {
    Encoded {
        ids: enc.get_ids().to_vec(),
        type_ids: enc.get_type_ids().to_vec(),
    }
}

/// A padded batch, row-major `[batch, seq]`; the training loop converts it into the model's
/// `Batch` (same fields).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenBatch {
    /// Token ids, padded with the tokenizer's pad id.
    pub input_ids: Vec<u32>,
    /// Segment ids, padded with the pad type id.
    pub token_type_ids: Vec<u32>,
    /// 1 on real tokens, 0 on padding.
    pub attention_mask: Vec<u32>,
    /// One class id per row.
    pub labels: Vec<u32>,
    /// Rows.
    pub batch: usize,
    /// Columns: the longest row of this batch.
    pub seq: usize,
}

/// A data file, read, label-checked and tokenized once, ready to be cut into batches.
#[derive(Debug, Clone)]
pub struct Dataset {
    path: PathBuf,
    rows: Vec<Encoded>,
    labels: Vec<u32>,
    lines: Vec<usize>,
    pad_id: u32,
    pad_type_id: u32,
}

impl Dataset {
    /// Reads `spec` (see [`read_examples`]) and tokenizes every row with `tokenizer`.
    pub fn load(
        spec: &DataSpec,
        labels: &LabelSet,
        tokenizer: &TextTokenizer,
    ) -> Result<Dataset, DataError> {
        let examples = read_examples(spec, labels)?;
        Dataset::from_examples(&spec.path, &examples, tokenizer)
    }

    /// Tokenizes examples already read from `path` (the path is kept for error messages).
    pub fn from_examples(
        path: &Path,
        examples: &[Example],
        tokenizer: &TextTokenizer,
    ) -> Result<Dataset, DataError> {
        let rows = tokenizer.encode_examples(path, examples)?;
        Ok(Dataset {
            path: path.to_path_buf(),
            rows,
            labels: examples.iter().map(|e| e.label).collect(),
            lines: examples.iter().map(|e| e.line).collect(),
            pad_id: tokenizer.pad_id(),
            pad_type_id: tokenizer.pad_type_id(),
        })
    }

    /// The data file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The number of examples.
    pub fn len(&self) -> usize {
        self.rows.len()
    }

    /// Whether there are no examples (never, for a `Dataset` built by [`Dataset::load`]).
    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }

    /// Every example's class id, in file order.
    pub fn labels(&self) -> &[u32] {
        &self.labels
    }

    /// Example `i`'s token ids (unpadded).
    pub fn ids(&self, i: usize) -> &[u32] {
        &self.rows[i].ids
    }

    /// The 1-based line example `i` starts on.
    pub fn line(&self, i: usize) -> usize {
        self.lines[i]
    }

    /// The longest example in tokens: the widest batch this dataset can produce.
    pub fn longest(&self) -> usize {
        self.rows.iter().map(|r| r.ids.len()).max().unwrap_or(0)
    }

    /// The examples at `indices` (in that order; repeats allowed, as wrap-around sharding makes
    /// them), padded on the right to the longest among them.
    ///
    /// # Panics
    /// If an index is `>= self.len()`: indices come from [`super::rank_batches`] over an order of
    /// `0..len`, so an out-of-range one is a bug in the caller, not bad input.
    pub fn batch(&self, indices: &[usize]) -> TokenBatch {
        let seq = indices
            .iter()
            .map(|&i| self.rows[i].ids.len())
            .max()
            .unwrap_or(0);
        let cells = indices.len() * seq;
        let mut b = TokenBatch {
            input_ids: Vec::with_capacity(cells),
            token_type_ids: Vec::with_capacity(cells),
            attention_mask: Vec::with_capacity(cells),
            labels: indices.iter().map(|&i| self.labels[i]).collect(),
            batch: indices.len(),
            seq,
        };
        for &i in indices {
            let row = &self.rows[i];
            let pad = seq - row.ids.len();
            b.input_ids.extend_from_slice(&row.ids);
            b.input_ids.extend(std::iter::repeat_n(self.pad_id, pad));
            b.token_type_ids.extend_from_slice(&row.type_ids);
            b.token_type_ids
                .extend(std::iter::repeat_n(self.pad_type_id, pad));
            b.attention_mask
                .extend(std::iter::repeat_n(1, row.ids.len()));
            b.attention_mask.extend(std::iter::repeat_n(0, pad));
        }
        b
    }
}
