//! Resolution: from the checked AST to a [`Resolved`] recipe in which every value the artefacts
//! need is concrete and carries its provenance. Nothing after this reads the AST.
//!
//! Order: target versions → every block's label and keys in schema order (written, else a
//! `--set` flag, else a default) → world size → the batch triple (DeepSpeed's inference) →
//! samples (written, `--samples`, or counted) → step accounting.

pub mod batch;
pub mod defaults;
pub mod files;
pub mod overrides;
pub mod scan_cache;
pub mod value;

use std::collections::HashMap;
use std::path::PathBuf;

use crate::schema::{BodySpec, LabelSpec, BLOCKS};
use crate::syntax::ast::{Block, Entry, File, Span, ValueKind};
use crate::upstream::steps;
use crate::upstream::versions::{Facts, Library, Targets, Version};

pub use overrides::Override;
pub use value::{Setting, Source, Val};

/// What the command line adds to a recipe.
#[derive(Debug, Clone, Default)]
pub struct Options {
    /// `--gpus N`: GPUs per node.
    pub gpus: Option<u64>,
    /// `--nodes M`.
    pub nodes: Option<u64>,
    /// `--samples N`: training examples, instead of counting the dataset's rows.
    pub samples: Option<u64>,
    /// `--target lib=version`, in order.
    pub targets: Vec<(Library, Version)>,
    /// `--set block.key=value`, in order (later wins).
    pub sets: Vec<Override>,
    /// The recipe's directory: relative data and model paths are read from there.
    pub base_dir: Option<PathBuf>,
    /// Check for the native runtime too (`--target native`): its refusals (R11xx) join the
    /// upstream rules.
    pub native: bool,
}

/// The name under which a block's label is resolved (`zero 2` → `zero.stage`).
pub fn label_key(block: &str) -> &'static str {
    match block {
        "recipe" => "name",
        "model" => "arch",
        "zero" => "stage",
        _ => "kind",
    }
}

/// A recipe with every value resolved.
#[derive(Debug, Clone)]
pub struct Resolved {
    /// The versions the recipe targets.
    pub targets: Targets,
    /// Where each target version came from (transformers, accelerate, deepspeed).
    pub target_sources: [Source; 3],
    /// The version-dependent facts for those targets.
    pub facts: Facts,
    settings: Vec<Setting>,
    index: HashMap<String, usize>,
    /// Spans of blocks as written, for diagnostics about a whole block.
    pub block_spans: HashMap<String, Span>,
    /// Raw `deepspeed { }` keys (dotted path, value, span).
    pub raw_deepspeed: Vec<(String, Val, Span)>,
    /// Raw `hf { }` fields (dotted path, value, span).
    pub raw_hf: Vec<(String, Val, Span)>,
    /// The recipe's directory: relative data and model paths are read from here.
    pub base_dir: Option<PathBuf>,
    /// Where a key not written in a block would be added (for fixes: [`crate::rules::fix`]).
    pub block_inserts: HashMap<String, Insert>,
    /// The end of the recipe's last block (where a missing block would be added).
    pub text_end: usize,
    /// What to delete to remove each written key's item, separator included (for fixes).
    pub item_spans: HashMap<String, Span>,
    /// The same for raw keys: `deepspeed.<dotted path>`, `hf.<dotted path>`.
    pub raw_item_spans: HashMap<String, Span>,
}

/// Where a new `key = value` goes in a written block.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Insert {
    /// After the body's last entry: `, key = value`.
    AfterEntry(usize),
    /// Replacing an empty body `{ }`: `{ key = value }`.
    EmptyBody(Span),
    /// After a header without a body: ` { key = value }`.
    NoBody(usize),
}

impl Resolved {
    fn empty() -> Self {
        let newest = Targets::newest();
        let source = || Source::Default {
            reason: "newest known release".into(),
        };
        Resolved {
            targets: newest,
            target_sources: [source(), source(), source()],
            facts: Facts::for_targets(&newest),
            settings: Vec::new(),
            index: HashMap::new(),
            block_spans: HashMap::new(),
            raw_deepspeed: Vec::new(),
            raw_hf: Vec::new(),
            base_dir: None,
            block_inserts: HashMap::new(),
            text_end: 0,
            item_spans: HashMap::new(),
            raw_item_spans: HashMap::new(),
        }
    }

    /// Sets (or replaces) a value.
    pub fn set(&mut self, key: &str, value: Val, source: Source) {
        let setting = Setting {
            key: key.to_string(),
            value,
            source,
        };
        match self.index.get(key) {
            Some(&i) => self.settings[i] = setting,
            None => {
                self.index.insert(key.to_string(), self.settings.len());
                self.settings.push(setting);
            }
        }
    }

    /// Every setting, in resolution order.
    pub fn settings(&self) -> &[Setting] {
        &self.settings
    }

    /// One setting.
    pub fn get(&self, key: &str) -> Option<&Setting> {
        self.index.get(key).map(|&i| &self.settings[i])
    }

    /// A value.
    pub fn val(&self, key: &str) -> Option<&Val> {
        self.get(key).map(|s| &s.value)
    }

    /// An integer value.
    pub fn int(&self, key: &str) -> Option<i64> {
        self.val(key).and_then(Val::as_i64)
    }

    /// A non-negative integer value.
    pub fn uint(&self, key: &str) -> Option<u64> {
        self.int(key).and_then(|i| u64::try_from(i).ok())
    }

    /// A numeric value (`6%` is 0.06).
    pub fn f64(&self, key: &str) -> Option<f64> {
        match self.val(key)? {
            // A per-group list (`min_lr = [1e-5, 0]`): parameter group 0's value, the group
            // whose LR the Trainer logs (`get_last_lr()[0]`); [`Resolved::per_group`] has all.
            Val::List(items) => items.first().and_then(Val::as_f64),
            v => v.as_f64(),
        }
    }

    /// The values of a per-parameter-group list (`min_lr = [1e-5, 0]`); None for one number.
    pub fn per_group(&self, key: &str) -> Option<Vec<f64>> {
        match self.val(key)? {
            Val::List(items) => items.iter().map(Val::as_f64).collect(),
            _ => None,
        }
    }

    /// A word value (or a call's name).
    pub fn word(&self, key: &str) -> Option<&str> {
        self.val(key).and_then(Val::as_word)
    }

    /// A string value.
    pub fn str(&self, key: &str) -> Option<&str> {
        self.val(key).and_then(Val::as_str)
    }

    /// A boolean value.
    pub fn bool(&self, key: &str) -> Option<bool> {
        self.val(key).and_then(Val::as_bool)
    }

    /// The schema's literal default of a setting (a key's own, the library's for an
    /// [`Upstream`](crate::schema::KeyDefault::Upstream) one, or a block label's when the block
    /// is absent).
    fn schema_default(key: &str) -> Option<Val> {
        crate::schema::literal_default(key).map(defaults::lit)
    }

    /// A number that always has a value: the resolved one, else the schema's literal default
    /// (for a key the recipe's kind does not resolve, or one the upstream library defaults).
    /// Only for keys whose schema default is a literal; others are NaN (a test checks every use).
    pub fn num(&self, key: &str) -> f64 {
        self.f64(key)
            .or_else(|| Self::schema_default(key).and_then(|v| v.as_f64()))
            .unwrap_or(f64::NAN)
    }

    /// A whole number that always has a value (see [`Resolved::num`]; 0 without a literal).
    pub fn integer(&self, key: &str) -> i64 {
        self.int(key)
            .or_else(|| Self::schema_default(key).and_then(|v| v.as_i64()))
            .unwrap_or(0)
    }

    /// A non-negative whole number that always has a value (see [`Resolved::num`]).
    pub fn count(&self, key: &str) -> u64 {
        u64::try_from(self.integer(key)).unwrap_or(0)
    }

    /// A boolean that always has a value (see [`Resolved::num`]; false without a literal).
    pub fn flag(&self, key: &str) -> bool {
        self.bool(key)
            .or_else(|| Self::schema_default(key).and_then(|v| v.as_bool()))
            .unwrap_or(false)
    }

    /// A word (or a call's name) that always has a value (see [`Resolved::num`]; "" without a
    /// literal).
    pub fn choice(&self, key: &str) -> &str {
        self.word(key)
            .or_else(|| crate::schema::literal_default(key).and_then(lit_word))
            .unwrap_or("")
    }

    /// A pair of numbers that always has a value (see [`Resolved::num`]; NaN without a literal).
    pub fn pair(&self, key: &str) -> (f64, f64) {
        let v = self.val(key).cloned().or_else(|| Self::schema_default(key));
        match v {
            Some(Val::List(xs)) if xs.len() == 2 => (
                xs[0].as_f64().unwrap_or(f64::NAN),
                xs[1].as_f64().unwrap_or(f64::NAN),
            ),
            _ => (f64::NAN, f64::NAN),
        }
    }

    /// A list of strings that always has a value (see [`Resolved::num`]; empty without a literal).
    pub fn strings(&self, key: &str) -> Vec<String> {
        let v = self.val(key).cloned().or_else(|| Self::schema_default(key));
        match v {
            Some(Val::List(xs)) => xs
                .iter()
                .filter_map(|x| x.as_str().map(str::to_string))
                .collect(),
            _ => Vec::new(),
        }
    }

    /// A string that always has a value (see [`Resolved::num`]; "" without a literal).
    pub fn text(&self, key: &str) -> &str {
        self.str(key)
            .or_else(|| crate::schema::literal_default(key).and_then(lit_str))
            .unwrap_or("")
    }

    /// The span where the recipe wrote this value.
    pub fn span(&self, key: &str) -> Option<Span> {
        self.get(key).and_then(|s| s.source.span())
    }

    /// Whether the value was given (in the recipe or a flag) rather than defaulted or derived.
    pub fn is_given(&self, key: &str) -> bool {
        matches!(
            self.get(key).map(|s| &s.source),
            Some(Source::Written { .. } | Source::Flag { .. })
        )
    }
}

fn lit_word(v: crate::schema::Lit) -> Option<&'static str> {
    match v {
        crate::schema::Lit::Word(w) => Some(w),
        _ => None,
    }
}

fn lit_str(v: crate::schema::Lit) -> Option<&'static str> {
    match v {
        crate::schema::Lit::Str(s) => Some(s),
        _ => None,
    }
}

/// Resolves a parsed, schema-checked recipe.
pub fn resolve(file: &File, options: &Options) -> Resolved {
    let mut r = Resolved::empty();
    r.base_dir = options.base_dir.clone();
    let blocks: HashMap<&str, &Block> = file
        .blocks
        .iter()
        .rev() // the first of duplicate blocks wins (duplicates are already an error)
        .map(|b| (b.name.name.as_str(), b))
        .collect();
    for (name, block) in &blocks {
        r.block_spans.insert(name.to_string(), block.header_span());
        let insert = match &block.body {
            Some(body) => match body.entries.last() {
                Some(last) => Insert::AfterEntry(last.span().end),
                None => Insert::EmptyBody(body.span),
            },
            None => Insert::NoBody(block.header_span().end),
        };
        r.block_inserts.insert(name.to_string(), insert);
    }
    r.text_end = file.blocks.last().map_or(0, |b| b.span.end);

    resolve_targets(&mut r, blocks.get("target").copied(), options);

    for spec in BLOCKS {
        let block = blocks.get(spec.name).copied();
        match spec.body {
            BodySpec::Pairs => continue, // targets, done above
            BodySpec::Raw(kind) => {
                if let Some(body) = block.and_then(|b| b.body.as_ref()) {
                    let mut raw = Vec::new();
                    flatten_raw(&body.entries, &mut String::new(), &mut raw);
                    raw_removals(body, spec.name, &file.comments, &mut r.raw_item_spans);
                    match kind {
                        crate::schema::RawKind::DeepSpeed => r.raw_deepspeed = raw,
                        crate::schema::RawKind::Hf => r.raw_hf = raw,
                    }
                }
                continue;
            }
            BodySpec::None | BodySpec::Items => {}
        }
        // The label.
        let label_name = format!("{}.{}", spec.name, label_key(spec.name));
        if !matches!(spec.label, LabelSpec::None) {
            let written = block.and_then(|b| b.label.as_ref());
            if let Some(o) = options.sets.iter().rev().find(|o| o.key == label_name) {
                r.set(&label_name, o.value.clone(), o.source());
            } else if let Some(label) = written {
                r.set(
                    &label_name,
                    Val::from_ast(label),
                    Source::Written { span: label.span },
                );
            } else if let Some((v, s)) = defaults::default(spec.absent, &r) {
                r.set(&label_name, v, s);
            }
        }
        let kind = r.word(&label_name).map(str::to_string);
        // The keys.
        for key in spec.keys {
            if !key.applies_to(kind.as_deref()) {
                continue;
            }
            let name = format!("{}.{}", spec.name, key.name);
            let body = block.and_then(|b| b.body.as_ref());
            let written = body.and_then(|body| {
                body.entries.iter().enumerate().find_map(|(i, e)| match e {
                    Entry::Item(item) if item.key.text == key.name => Some((i, item)),
                    _ => None,
                })
            });
            if let Some(o) = options.sets.iter().rev().find(|o| o.key == name) {
                r.set(&name, o.value.clone(), o.source());
            } else if let (Some((index, item)), Some(body)) = (written, body) {
                r.item_spans.insert(
                    name.clone(),
                    crate::syntax::edit::removal_span(body, index, &file.comments),
                );
                r.set(
                    &name,
                    Val::from_ast(&item.value),
                    Source::Written {
                        span: item.value.span,
                    },
                );
            } else if let Some((v, s)) = defaults::default(key.default_for(kind.as_deref()), &r) {
                r.set(&name, v, s);
            }
        }
        if spec.name == "model" {
            files::model_config(&mut r, options);
        }
    }

    resolve_world(&mut r, options);
    batch::infer(&mut r);
    files::samples(&mut r, options);
    resolve_steps(&mut r);
    r
}

fn resolve_targets(r: &mut Resolved, block: Option<&Block>, options: &Options) {
    for (i, lib) in Library::ALL.into_iter().enumerate() {
        let written = block.and_then(|b| b.body.as_ref()).and_then(|body| {
            body.entries.iter().find_map(|e| match e {
                Entry::Item(item) if item.key.text == lib.key() => match &item.value.kind {
                    ValueKind::Str(s) => s.parse::<Version>().ok().map(|v| (v, item.value.span)),
                    _ => None,
                },
                _ => None,
            })
        });
        if let Some((_, v)) = options.targets.iter().rev().find(|(l, _)| *l == lib) {
            r.targets.set(lib, *v);
            r.target_sources[i] = Source::Flag {
                flag: format!("--target {}={v}", lib.key()),
            };
        } else if let Some((v, span)) = written {
            r.targets.set(lib, v);
            r.target_sources[i] = Source::Written { span };
        }
    }
    r.facts = Facts::for_targets(&r.targets);
}

/// What to delete to remove each raw entry (sections too), keyed `<prefix>.<path>`.
fn raw_removals(
    body: &crate::syntax::ast::Body,
    prefix: &str,
    comments: &[crate::syntax::ast::Comment],
    out: &mut HashMap<String, Span>,
) {
    for (i, entry) in body.entries.iter().enumerate() {
        let path = format!("{prefix}.{}", entry.key().text);
        out.insert(
            path.clone(),
            crate::syntax::edit::removal_span(body, i, comments),
        );
        if let Entry::Section(section) = entry {
            raw_removals(&section.body, &path, comments, out);
        }
    }
}

/// Flattens raw entries below `prefix` (a dotted path, empty at the top; restored on return).
fn flatten_raw(entries: &[Entry], prefix: &mut String, out: &mut Vec<(String, Val, Span)>) {
    for entry in entries {
        let len = prefix.len();
        if len > 0 {
            prefix.push('.');
        }
        prefix.push_str(&entry.key().text);
        match entry {
            Entry::Item(item) => {
                out.push((prefix.clone(), Val::from_ast(&item.value), item.value.span))
            }
            Entry::Section(section) => flatten_raw(&section.body.entries, prefix, out),
        }
        prefix.truncate(len);
    }
}

fn flag_or<T: Copy + ToString>(flag: Option<T>, name: &str) -> Option<(Val, Source)>
where
    i64: TryFrom<T>,
{
    flag.and_then(|v| {
        i64::try_from(v).ok().map(|i| {
            (
                Val::Int(i),
                Source::Flag {
                    flag: format!("--{name} {}", v.to_string()),
                },
            )
        })
    })
}

fn resolve_world(r: &mut Resolved, options: &Options) {
    if let Some((v, s)) = flag_or(options.gpus, "gpus") {
        r.set("cluster.gpus", v, s);
    }
    if let Some((v, s)) = flag_or(options.nodes, "nodes") {
        r.set("cluster.nodes", v, s);
    }
    let gpus = r.integer("cluster.gpus");
    let nodes = r.integer("cluster.nodes");
    if nodes > 1 && r.get("cluster.hostfile").is_none() {
        // Stated in launch.sh rather than left to the launcher (R1001 says so).
        r.set(
            "cluster.hostfile",
            Val::Str(crate::rules::launch::DEFAULT_HOSTFILE.into()),
            Source::Default {
                reason: "the DeepSpeed launcher's hostfile when none is given (DLTS_HOSTFILE, launcher/runner.py)".into(),
            },
        );
    }
    r.set(
        "cluster.world_size",
        // Saturating: a product past i64 is R0103's to report, not to wrap into a small one.
        Val::Int(gpus.saturating_mul(nodes)),
        Source::Derived {
            rule: "gpus × nodes".into(),
            inputs: vec![
                format!("cluster.gpus = {gpus}"),
                format!("cluster.nodes = {nodes}"),
            ],
        },
    );
}

/// Warmup as the recipe states it.
pub fn warmup(r: &Resolved) -> Option<steps::Warmup> {
    warmup_like(r, "schedule.warmup")
}

/// A length in steps or as a fraction of the run (`warmup`, `decay`), as the recipe states it.
pub fn warmup_like(r: &Resolved, key: &str) -> Option<steps::Warmup> {
    match r.val(key)? {
        Val::Percent(p) => Some(steps::Warmup::Fraction(p / 100.0)),
        Val::Float(f) if *f < 1.0 => Some(steps::Warmup::Fraction(*f)),
        v => v.as_i64().map(|s| steps::Warmup::Steps(s.max(0) as u64)),
    }
}

/// Re-derives the step accounting, e.g. after changing the targets (`recipe steps --versions`).
pub fn recompute_steps(r: &mut Resolved) {
    resolve_steps(r);
}

fn resolve_steps(r: &mut Resolved) {
    let (Some(samples), Some(micro), Some(acc), Some(world)) = (
        r.uint("data.samples"),
        r.uint("batch.micro"),
        r.uint("batch.accumulate"),
        r.uint("cluster.world_size"),
    ) else {
        return;
    };
    if micro == 0 || acc == 0 || world == 0 {
        return;
    }
    let drop_last = r.flag("data.drop_last");
    let facts = r.facts.clone();
    let l = steps::batches_per_rank(samples, micro, world, drop_last, facts.sharding);
    let sharding = match facts.sharding {
        crate::upstream::versions::Sharding::BatchSamplerShard => "accelerate BatchSamplerShard",
        crate::upstream::versions::Sharding::DistributedSampler => "torch DistributedSampler",
    };
    r.set(
        "steps.batches_per_epoch",
        Val::Int(l as i64),
        Source::Derived {
            rule: format!(
                "micro-batches per rank per epoch, L ({sharding}{})",
                if drop_last { ", drop_last" } else { "" }
            ),
            inputs: vec![
                format!("data.samples = {samples}"),
                format!("batch.micro = {micro}"),
                format!("cluster.world_size = {world}"),
            ],
        },
    );
    let u = steps::updates_per_epoch(l, acc, facts.updates_per_epoch);
    let rounding = match facts.updates_per_epoch {
        crate::upstream::versions::Rounding::Floor => "max(L // G, 1)",
        crate::upstream::versions::Rounding::Ceil => "max(ceil(L / G), 1)",
    };
    r.set(
        "steps.per_epoch",
        Val::Int(u as i64),
        Source::Derived {
            rule: format!("optimizer steps per epoch, U = {rounding}"),
            inputs: vec![format!("L = {l}"), format!("G = batch.accumulate = {acc}")],
        },
    );
    let epochs = r.num("train.epochs");
    let max_steps = r.uint("train.max_steps");
    let total = steps::total_steps(epochs, u, max_steps);
    r.set(
        "steps.total",
        Val::Int(total as i64),
        Source::Derived {
            rule: if max_steps.is_some() {
                "train.max_steps".into()
            } else {
                "ceil(epochs × U)".into()
            },
            inputs: vec![
                format!("train.epochs = {}", value::fmt_f64(epochs)),
                format!("U = {u}"),
            ],
        },
    );
    if let Some(w) = warmup(r) {
        let steps = steps::warmup_steps(w, total, facts.warmup_args);
        r.set(
            "steps.warmup",
            Val::Int(steps as i64),
            Source::Derived {
                rule: match w {
                    steps::Warmup::Steps(_) => "schedule.warmup, in steps".into(),
                    steps::Warmup::Fraction(_) => "ceil(total × warmup fraction)".into(),
                },
                inputs: vec![format!("steps.total = {total}")],
            },
        );
    }
}
