//! The data pipeline: read a labelled text file ([`read`]), map its labels onto the recipe's
//! declared set ([`labels`]), tokenize once per run and pad per batch ([`tokenize`]), and deal
//! each epoch's batches to the data-parallel ranks exactly as accelerate does ([`shard`]).
//!
//! The compiler reads the same files before a run: [`scan`] counts the rows it plans steps
//! for and checks their fields and labels in one pass. Both sides take the format, the blank
//! lines and the CSV/TSV records from [`format`], so they agree on what a row is.
//!
//! [`Dataset`] ties the first three together; the training loop asks [`shard::epoch_order`] and
//! [`shard::rank_batches`] which indices to put in each step's batch and [`Dataset::batch`] for
//! the padded tensors.
//!
//! Every error caused by the input files is a [`DataError`] whose message starts with
//! `path:line:` so that a user can jump to the offending row.

pub mod format;
pub mod labels;
pub mod read;
pub mod scan;
pub mod shard;
pub mod tokenize;

use std::path::PathBuf;

pub use format::Format;
pub use labels::LabelSet;
pub use read::{read_examples, DataSpec, Example};
pub use shard::{epoch_order, rank_batches, trainer_batches};
pub use tokenize::{Dataset, EncodeError, Encoded, TextTokenizer, TokenBatch};

/// Why the data could not be loaded. The `Display` text is the message shown to the user and names
/// the file and, where the problem is in a row, its 1-based line.
#[derive(Debug, thiserror::Error)]
pub enum DataError {
    /// The file could not be opened or read.
    #[error("{path}: cannot read the file: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// What the operating system said.
        source: std::io::Error,
    },
    /// A read failed part-way through (e.g. a line that is not UTF-8).
    #[error("{path}:{line}: cannot read the line: {source}")]
    IoAt {
        /// The file.
        path: PathBuf,
        /// 1-based line.
        line: usize,
        /// What the operating system or decoder said.
        source: std::io::Error,
    },
    /// `Format::Auto` and the extension is none of `.jsonl`, `.json`, `.csv`, `.tsv`.
    #[error(
        "{path}: cannot tell the format from the extension; use .jsonl, .json, .csv or .tsv, \
         or declare the format in the recipe"
    )]
    UnknownFormat {
        /// The file.
        path: PathBuf,
    },
    /// The file holds no rows at all (or, for CSV/TSV, only the header).
    #[error("{path}:{line}: the file has no examples")]
    Empty {
        /// The file.
        path: PathBuf,
        /// The last line read (1 for an empty file).
        line: usize,
    },
    /// A JSONL line is not valid JSON, or not a JSON object.
    #[error("{path}:{line}: {message}")]
    Json {
        /// The file.
        path: PathBuf,
        /// 1-based line.
        line: usize,
        /// What is wrong, e.g. serde_json's description.
        message: String,
    },
    /// A CSV/TSV row could not be parsed (e.g. a different number of fields than the header).
    #[error("{path}:{line}: {message}")]
    Csv {
        /// The file.
        path: PathBuf,
        /// 1-based line.
        line: usize,
        /// The csv crate's description.
        message: String,
    },
    /// A field (JSONL key or CSV/TSV column) named by the recipe is absent.
    #[error("{path}:{line}: field \"{field}\" is missing (the recipe's data.{role}){found}")]
    MissingField {
        /// The file.
        path: PathBuf,
        /// 1-based line (the header line for CSV/TSV).
        line: usize,
        /// The field's name in the file.
        field: String,
        /// Which recipe key named it: `text`, `text_pair` or `label`.
        role: &'static str,
        /// For CSV/TSV, `"; the header has: a, b"`; empty for JSONL.
        found: String,
    },
    /// A text field holds something other than a string.
    #[error(
        "{path}:{line}: field \"{field}\" (the recipe's data.{role}) must be a string, not {found}"
    )]
    NotText {
        /// The file.
        path: PathBuf,
        /// 1-based line.
        line: usize,
        /// The field's name in the file.
        field: String,
        /// Which recipe key named it: `text` or `text_pair`.
        role: &'static str,
        /// The JSON type found, e.g. `a number`.
        found: &'static str,
    },
    /// A row's label is not one of the declared labels.
    #[error("{path}:{line}: label {value} is not one of the declared labels ({allowed})")]
    BadLabel {
        /// The file.
        path: PathBuf,
        /// 1-based line.
        line: usize,
        /// The label as written in the file (JSON text).
        value: String,
        /// The accepted values, e.g. `"ham" or 0, "spam" or 1`.
        allowed: String,
    },
    /// The recipe's label declaration itself is unusable (no labels, a duplicate name).
    #[error("labels: {0}")]
    LabelDecl(String),
    /// The tokenizer file could not be loaded or configured.
    #[error("{path}: cannot load the tokenizer: {message}")]
    Tokenizer {
        /// The tokenizer.json file.
        path: PathBuf,
        /// The tokenizers crate's description.
        message: String,
    },
    /// A row could not be tokenized.
    #[error("{path}:{line}: cannot tokenize the row: {message}")]
    Encode {
        /// The data file.
        path: PathBuf,
        /// 1-based line.
        line: usize,
        /// The tokenizers crate's description.
        message: String,
    },
    /// Sharding parameters that cannot describe a run (zero batch size or world, rank ≥ world).
    #[error("sharding: {0}")]
    Shard(String),
}
