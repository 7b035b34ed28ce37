//! The real order of events for a (ds_config.json, TrainingArguments) pair, replayed on a working
//! copy of the config that remembers where every value came from:
//!
//! 1. `TrainingArguments.__post_init__`: its own validation, then HF's fill and match
//!    (`HfTrainerDeepSpeedConfig.trainer_config_process`, docs/upstream.md §2.2);
//! 2. accelerate's `DeepSpeedPlugin.__post_init__` (inserts `gradient_accumulation_steps: 1`,
//!    requires `zero_optimization`, fills its own keys, overwrites `steps_per_print`) and
//!    `set_mixed_precision` (precision blocks);
//! 3. the Trainer: its checks, `trainer_config_finalize` (hidden-size and step "auto"s, then the
//!    mismatch error), `deepspeed_optim_sched`, accelerate's last fill (`_prepare_deepspeed`);
//! 4. DeepSpeed: `DeepSpeedConfig` at the world size (deprecated keys, strict sections, batch
//!    inference and assertion, precision) and the engine's checks.
//!
//! Sources: transformers v5.24.0 `integrations/deepspeed.py`, `training_args.py`,
//! `trainer.py`; accelerate v1.15.0 `utils/dataclasses.py:DeepSpeedPlugin`,
//! `accelerator.py:_prepare_deepspeed`; DeepSpeed v0.19.8 `runtime/config.py`,
//! `runtime/engine.py` (read in conformance/.venv; the harness replays the same order:
//! conformance/harness.py `run_chain`). Every refusal is an error quoting the real message, every
//! silent change a warning. The steps live with their library: [`transformers`] (1, 4),
//! [`accelerate`] (2, 4's last fill), [`deepspeed`] (5).

mod accelerate;
mod deepspeed;
mod transformers;

use std::collections::BTreeMap;

use crate::diagnostics::{Label, Severity};
use crate::pair::args::Args;
use crate::pair::codes;
use crate::pair::json::{py_float, Node, Py};
use crate::syntax::ast::Span;
use crate::upstream::versions::{Facts, Targets};

/// Which file a span is in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Side {
    /// ds_config.json.
    DeepSpeed,
    /// The TrainingArguments (JSON file or flags).
    Args,
}

/// A label in one of the two files.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct At {
    /// The file.
    pub side: Side,
    /// The label.
    pub label: Label,
}

impl At {
    fn ds(span: Span, text: impl Into<String>) -> At {
        At {
            side: Side::DeepSpeed,
            label: Label::new(span, text),
        }
    }

    fn args(span: Span, text: impl Into<String>) -> At {
        At {
            side: Side::Args,
            label: Label::new(span, text),
        }
    }
}

/// One finding about a pair.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Finding {
    /// Stable code.
    pub code: &'static str,
    /// Error (the real stack refuses the pair), warning (it changes something silently), note.
    pub severity: Severity,
    /// One sentence.
    pub message: String,
    /// Where.
    pub primary: At,
    /// The other places involved (either file).
    pub secondary: Vec<At>,
    /// How to fix it.
    pub help: Option<String>,
}

impl Finding {
    fn new(code: &'static str, severity: Severity, message: impl Into<String>, at: At) -> Self {
        Finding {
            code,
            severity,
            message: message.into(),
            primary: at,
            secondary: Vec::new(),
            help: None,
        }
    }

    fn also(mut self, at: At) -> Self {
        self.secondary.push(at);
        self
    }

    fn help(mut self, help: impl Into<String>) -> Self {
        self.help = Some(help.into());
        self
    }
}

/// What the command line says that the files do not.
#[derive(Debug, Clone)]
pub struct Options {
    /// Processes of the launch (GPUs per node × nodes); 1 when not given.
    pub world: u64,
    /// Training examples, for the step "auto"s (`total_num_steps`, `warmup_num_steps`).
    pub samples: Option<u64>,
    /// The model's hidden size, for the ZeRO "auto" bucket sizes.
    pub hidden_size: Option<u64>,
    /// Whether the script passes an evaluation dataset (`None`: unknown, assumed yes).
    pub has_eval: Option<bool>,
    /// Target releases.
    pub targets: Targets,
}

impl Options {
    /// The pair options of the recipe flags (`--gpus`, `--nodes`, `--samples`, `--target`): the
    /// world is GPUs × nodes, targets default to the newest releases.
    pub fn from_recipe(
        o: &crate::resolve::Options,
        hidden_size: Option<u64>,
        has_eval: Option<bool>,
    ) -> Options {
        let mut targets = crate::upstream::versions::Targets::newest();
        for (lib, v) in &o.targets {
            targets.set(*lib, *v);
        }
        Options {
            world: o.gpus.unwrap_or(1) * o.nodes.unwrap_or(1),
            samples: o.samples,
            hidden_size,
            has_eval,
            targets,
        }
    }
}

/// Where a value of the working config came from.
#[derive(Debug, Clone, PartialEq)]
pub enum Origin {
    /// Written in ds_config.json: the value's span.
    Written(Span),
    /// An "auto" filled by HF or accelerate from `from`.
    Filled {
        /// "HF" or "accelerate".
        by: &'static str,
        /// The TrainingArguments field (or the computed value) it came from.
        from: String,
        /// The key (or flag) of `from`, when it is a TrainingArguments field the user gave.
        given: Option<Span>,
    },
    /// Written, and replaced by HF or accelerate.
    Overwritten {
        /// "HF" or "accelerate".
        by: &'static str,
    },
    /// Not in the file: put there by HF or accelerate.
    Inserted {
        /// "HF" or "accelerate".
        by: &'static str,
    },
}

/// The result of replaying a pair.
#[derive(Debug, Clone)]
pub struct Outcome {
    /// Everything found, in the order of events.
    pub findings: Vec<Finding>,
    /// The DeepSpeed config as DeepSpeed receives it (every fill and insert applied).
    pub config: Py,
    /// Where each dotted key of `config` came from.
    pub origins: BTreeMap<String, Origin>,
    /// Optimizer steps the Trainer computes, when the sample count is known.
    pub total_steps: Option<u64>,
}

struct Work<'a> {
    ds: &'a Node,
    args: &'a Args,
    opts: &'a Options,
    facts: Facts,
    cfg: Py,
    origins: BTreeMap<String, Origin>,
    out: Vec<Finding>,
    /// HF's collected mismatches (reported at `trainer_config_finalize`).
    mismatches: Vec<Finding>,
}

/// Replays the pair.
pub fn replay(ds: &Node, args: &Args, opts: &Options) -> Outcome {
    let cfg = ds.to_py();
    // Every written key with its value's span (a repeated key: the last one, as Python reads it).
    let mut written = Vec::new();
    members(ds, "", &mut written);
    let origins = written
        .into_iter()
        .map(|(k, _, node)| (k, Origin::Written(node.span)))
        .collect();
    let mut w = Work {
        ds,
        args,
        opts,
        facts: Facts::for_targets(&opts.targets),
        cfg,
        origins,
        out: Vec::new(),
        mismatches: Vec::new(),
    };
    w.training_arguments();
    if let Some(Py::Bool(b)) = w.get("zero_optimization").cloned() {
        // The legacy boolean form: HF's `HfDeepSpeedConfig` (and accelerate) read the section
        // with `.get`, which a bool does not have.
        w.out.push(
            Finding::new(
                codes::DS_BAD_VALUE,
                Severity::Error,
                format!("`zero_optimization` is the legacy boolean form ({b}), not a section"),
                At::ds(w.ds_span("zero_optimization"), "not an object"),
            )
            .help(
                "HF refuses it while building TrainingArguments (\"'bool' object has no attribute \
                 'get'\"); write \"zero_optimization\": {\"stage\": 1} (true) or {\"stage\": 0} (false)",
            ),
        );
        w.deepspeed_keys();
        return Outcome {
            findings: w.out,
            config: w.cfg,
            origins: w.origins,
            total_steps: None,
        };
    }
    w.hf_process();
    // Releases where the Trainer calls deepspeed.initialize itself have no accelerate plugin
    // in the path (`Facts::hf_direct_deepspeed_init`).
    let through_accelerate = !w.facts.hf_direct_deepspeed_init;
    let plugin_ok = through_accelerate && w.accelerate_plugin();
    if through_accelerate {
        w.accelerate_mixed_precision();
    }
    w.trainer_checks();
    let total = w.hf_finalize();
    w.ignored_arguments();
    w.optim_sched();
    w.hf_scheduler();
    if plugin_ok {
        w.accelerate_last_fill();
    }
    w.deepspeed_keys();
    if !w.cfg.at("zero_optimization").is_some_and(Py::is_auto) {
        w.deepspeed_config();
    }
    Outcome {
        findings: w.out,
        config: w.cfg,
        origins: w.origins,
        total_steps: total,
    }
}

/// The dict holding `path`'s last part, if every parent exists (HF's `find_config_node`).
fn node_mut<'a>(cfg: &'a mut Py, path: &str) -> Option<(&'a mut Vec<(String, Py)>, String)> {
    let mut parts: Vec<&str> = path.split('.').collect();
    let last = parts.pop()?.to_string();
    let mut node = cfg;
    for p in parts {
        node = match node {
            Py::Dict(items) => &mut items.iter_mut().find(|(k, _)| k == p)?.1,
            _ => return None,
        };
    }
    match node {
        Py::Dict(items) => Some((items, last)),
        _ => None,
    }
}

fn set_in(items: &mut Vec<(String, Py)>, key: &str, v: Py) {
    match items.iter_mut().find(|(k, _)| k == key) {
        Some(slot) => slot.1 = v,
        None => items.push((key.to_string(), v)),
    }
}

impl Work<'_> {
    // ---- spans ---------------------------------------------------------------------------

    /// The span of the value at `path` in ds_config.json, else of its nearest written parent's
    /// key, else the opening brace.
    fn ds_span(&self, path: &str) -> Span {
        if let Some(n) = self.ds.get(path) {
            return n.span;
        }
        self.ds_key_span(path)
    }

    /// The span of the key at `path`, else of its nearest written parent, else the opening brace.
    fn ds_key_span(&self, path: &str) -> Span {
        let mut p = path;
        loop {
            if let Some(m) = self.ds.get_member(p) {
                return m.key_span;
            }
            match p.rsplit_once('.') {
                Some((parent, _)) => p = parent,
                None => return Span::new(self.ds.span.start, self.ds.span.start + 1),
            }
        }
    }

    /// A label on a TrainingArguments field: its value where written, else nothing.
    fn field_at(&self, field: &str, text: impl Into<String>) -> Option<At> {
        self.args
            .given(field)
            .map(|(_, value)| At::args(value, text))
    }

    fn get(&self, path: &str) -> Option<&Py> {
        self.cfg.at(path)
    }

    fn is_auto(&self, path: &str) -> bool {
        self.get(path).is_some_and(Py::is_auto)
    }

    /// Sets a key whose parents exist; a section set whole gives its keys the same origin.
    fn set(&mut self, path: &str, v: Py, origin: Origin) {
        let Some((items, last)) = node_mut(&mut self.cfg, path) else {
            return;
        };
        for (k, _) in v.entries() {
            self.origins.insert(format!("{path}.{k}"), origin.clone());
        }
        set_in(items, &last, v);
        self.origins.insert(path.to_string(), origin);
    }

    /// Sets a key whose parents may be missing (creating them), as `config[a] = config.get(a,
    /// {})` code does.
    fn insert(&mut self, path: &str, v: Py, by: &'static str) {
        let mut prefix = String::new();
        for part in path.split('.').collect::<Vec<_>>().split_last().unwrap().1 {
            if !prefix.is_empty() {
                prefix.push('.');
            }
            prefix.push_str(part);
            if self.get(&prefix).is_none() {
                let p = prefix.clone();
                self.set(&p, Py::Dict(Vec::new()), Origin::Inserted { by });
            }
        }
        self.set(path, v, Origin::Inserted { by });
    }

    /// The ZeRO keys HF and accelerate fill from the model's hidden size `h`, with those values
    /// (`h²`, `int(0.9·h²)`, `10·h`), when `--hidden-size` gives it.
    fn hidden_size_fills(&self) -> [(&'static str, Option<i128>); 3] {
        let h = self.opts.hidden_size.map(|h| h as i128);
        [
            (
                "zero_optimization.reduce_bucket_size",
                h.map(|h| h.saturating_mul(h)),
            ),
            (
                "zero_optimization.stage3_prefetch_bucket_size",
                h.map(|h| h.saturating_mul(h).saturating_mul(9) / 10),
            ),
            (
                "zero_optimization.stage3_param_persistence_threshold",
                h.map(|h| h.saturating_mul(10)),
            ),
        ]
    }

    /// HF's `fill_match`: an "auto" becomes `hf`; otherwise, with `must_match`, a written value
    /// that differs from `hf` (Python `!=`) is a mismatch.
    fn fill_match(&mut self, path: &str, hf: Py, hf_key: &str, fields: &[&str], must_match: bool) {
        // Absent (or a parent missing): HF does nothing.
        let Some(current) = self.get(path).cloned() else {
            return;
        };
        if current.is_auto() {
            let given = fields.iter().find_map(|f| self.args.given(f)).map(|g| g.0);
            self.set(
                path,
                hf,
                Origin::Filled {
                    by: "HF",
                    from: hf_key.to_string(),
                    given,
                },
            );
            return;
        }
        // Before transformers 4.24 HF only filled "auto"s and compared nothing
        // (`Facts::hf_mismatch_checks`).
        if !must_match
            || !self.facts.hf_mismatch_checks
            || current == Py::None
            || current.py_eq(&hf)
        {
            return;
        }
        let given: Vec<&str> = fields
            .iter()
            .copied()
            .filter(|f| self.args.given(f).is_some())
            .collect();
        let hf_text = hf.show();
        let whose = if given.is_empty() {
            if fields.len() == 1 {
                format!("`{}` (its default)", fields[0])
            } else {
                format!("`{hf_key}`")
            }
        } else {
            format!("`{hf_key}`")
        };
        let mut f = Finding::new(
            codes::DS_HF_MISMATCH,
            Severity::Error,
            format!(
                "`{path}` = {} in the DeepSpeed config, but TrainingArguments {whose} = {hf_text}",
                current.show()
            ),
            At::ds(self.ds_span(path), format!("HF expects {hf_text} here")),
        )
        .help(format!(
            "HF refuses the pair at launch (\"Please correct the following DeepSpeed config values \
             that mismatch TrainingArguments values: - ds {path}={} vs hf {hf_key}={hf_text}\"): write \
             \"auto\" here, or make the two agree",
            current.show()
        ));
        for field in given {
            let v = self.args.get(field).map(Py::show).unwrap_or_default();
            if let Some(at) = self.field_at(field, format!("{field} = {v}")) {
                f = f.also(at);
            }
        }
        self.mismatches.push(f);
    }
}

/// Every written key (dotted), its key span and value, in file order.
fn members<'a>(node: &'a Node, prefix: &str, out: &mut Vec<(String, Span, &'a Node)>) {
    for m in node.members() {
        let key = if prefix.is_empty() {
            m.key.clone()
        } else {
            format!("{prefix}.{}", m.key)
        };
        out.push((key.clone(), m.key_span, &m.value));
        members(&m.value, &key, out);
    }
}

fn py_num(f: f64) -> String {
    if f.fract() == 0.0 && f.abs() < 1e15 {
        format!("{}", f as i64)
    } else {
        py_float(f)
    }
}
