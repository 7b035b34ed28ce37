//! `recipe-runtime`: the native training runtime of `recipe`.
//!
//! It knows nothing of the recipe language: it executes a [`plan::Plan`] (serde JSON) that the
//! compiler writes. The learning-rate formulas ([`lr`]) and the step accounting ([`accounting`])
//! live here once and are shared with the compiler's `explain`, `steps` and rules.
//!
//! The numerical core: [`params`] (one flat parameter buffer), [`backend`] (the kernel trait and
//! its deterministic CPU implementation), [`model`] (HF `BertForSequenceClassification`),
//! [`optim`] (torch-exact clipping; Adam, AdamW, SGD, Adagrad and LAMB as the upstream classes
//! compute them) and [`checkpoint`] (safetensors IO). Parity with
//! PyTorch is tested in `tests/parity.rs` against fixtures from `reference/`.
//!
//! Data parallelism: [`collective`] (the `Collective` trait over flat buffers, deterministic
//! in-process ranks, the padded shard map used by ZeRO) and [`zero`] (what each rank holds
//! under ZeRO stages 0–3 and optimizer offload).

pub mod accounting;
pub mod backend;
pub mod checkpoint;
pub mod collective;
pub mod data;
pub mod flops;
pub mod greedy;
pub mod host_memory;
pub mod json_f64;
pub mod lr;
pub mod metrics;
pub mod model;
pub mod optim;
pub mod par;
pub mod params;
pub mod plan;
pub mod plateau;
pub mod plot;
pub mod precision;
pub mod progress;
pub mod resume;
pub mod rng;
pub mod train;
pub mod watchdog;
pub mod windows;
pub mod zero;
