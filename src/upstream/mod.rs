//! What the real stack does, as facts and formulas: the behaviour of each release
//! ([`versions`]), how HF and DeepSpeed count steps ([`steps`]), their learning-rate formulas
//! ([`lr`], [`schedules`]), DeepSpeed's memory estimators ([`memory`]), which steps its
//! loss scaler skips ([`skips`]) and which optimizer settings reach the optimizer the run
//! builds ([`hf_optimizers`]). Rules, emitters and `recipe explain` read these; they do not
//! restate them. Each formula cites its upstream source; docs/upstream.md collects them.

pub mod hf_optimizers;
pub mod lr;
pub mod memory;
pub mod schedules;
pub mod skips;
pub mod steps;
pub mod versions;
