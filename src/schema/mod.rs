//! The schema: every block and key of the language as data.
//!
//! One table ([`blocks::BLOCKS`]) says, for each block and key: the value type and allowed
//! values, the default (typed, with whose default it mirrors), a one-line doc, the upstream
//! meaning (the DeepSpeed key and the TrainingArguments field it becomes, other DeepSpeed names
//! that mean the same), the block kinds and ZeRO stages it applies to. The checker, resolution
//! (every default), the emitters, `recipe import`, the rules that ask which stage reads a key,
//! and the language reference's tables (tests/docs.rs renders them from here) all read this
//! table; nothing else lists keys.

pub mod blocks;
pub mod docs;
pub mod sampled;
pub mod types;
pub mod upstream;
pub mod upstream_versions;

pub use blocks::BLOCKS;
pub use types::{ArgSpec, CallSpec, Ty};

/// How a block's body is checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BodySpec {
    /// The block takes no `{ }` (`recipe "name"`).
    None,
    /// `key = value` items checked against the block's keys.
    Items,
    /// `target component "version"` pairs, checked against the block's keys.
    Pairs,
    /// Raw keys passed to an upstream library, checked against its key set.
    Raw(RawKind),
}

/// Which library a raw block feeds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RawKind {
    /// `deepspeed { }`: keys of the DeepSpeed config JSON.
    DeepSpeed,
    /// `hf { }`: fields of transformers' TrainingArguments.
    Hf,
}

/// What the word after a block keyword must be.
#[derive(Debug, Clone, Copy)]
pub enum LabelSpec {
    /// No label.
    None,
    /// A label is needed; `what` names it in messages (`a stage`).
    Required {
        /// Its type.
        ty: Ty,
        /// What it is, in words.
        what: &'static str,
        /// An example header, for the help line.
        example: &'static str,
    },
    /// A label may be given.
    Optional {
        /// Its type.
        ty: Ty,
        /// What it is, in words.
        what: &'static str,
    },
}

/// A literal default value.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Lit {
    /// A whole number.
    Int(i64),
    /// A number.
    Float(f64),
    /// `true` / `false`.
    Bool(bool),
    /// A bare word (`adamw`, `none`).
    Word(&'static str),
    /// A string.
    Str(&'static str),
    /// A tuple of numbers (`(0.9, 0.999)`).
    Floats(&'static [f64]),
    /// A list of strings.
    Strs(&'static [&'static str]),
}

/// What a key (or a block's label) is when the recipe does not write it.
#[derive(Debug, Clone, Copy)]
pub enum KeyDefault {
    /// No default: the key stays unset unless written.
    None,
    /// This value; the text names whose default it mirrors (`recipe explain` and the docs show it).
    Value(Lit, &'static str),
    /// Computed from other settings when the recipe is resolved (`resolve::defaults` implements
    /// each rule); the text describes it for the docs.
    Derived(Derive, &'static str),
    /// Not written into the artefacts: the upstream library applies its own default, this value
    /// (the native runtime and the rules use it too); the text names it.
    Upstream(Lit, &'static str),
    /// Not set by the key's own step: the text says who supplies it (a later resolution step,
    /// such as the batch inference or the row count, or the upstream library at run time).
    Later(&'static str),
}

/// A default computed from other settings (see [`KeyDefault::Derived`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Derive {
    /// The data format, from the training file's extension.
    FormatFromExtension,
    /// The training micro batch.
    TrainingMicro,
    /// The optimizer's learning rate.
    OptimizerLr,
    /// Cosine cycles: 1 for `cosine_with_restarts`, else 0.5.
    CosineCycles,
    /// The training precision.
    TrainingPrecision,
    /// `out/<recipe name>`.
    OutputDir,
    /// Evaluate each epoch when there is evaluation data, else never.
    EvalEvery,
    /// The parameters without weight decay: HF's grouping when HF builds the optimizer; none
    /// when DeepSpeed does (it gets one parameter group).
    NoDecay,
    /// True at ZeRO stage 3, else false.
    Stage3,
    /// hidden_size² (else DeepSpeed's 5e8).
    HiddenSquared,
    /// int(0.9 × hidden_size²) (else DeepSpeed's 5e7).
    PrefetchBucket,
    /// 10 × hidden_size (else DeepSpeed's 1e5).
    PersistenceThreshold,
}

impl KeyDefault {
    /// The literal value, if the default is one.
    pub fn literal(&self) -> Option<Lit> {
        match self {
            KeyDefault::Value(v, _) | KeyDefault::Upstream(v, _) => Some(*v),
            _ => None,
        }
    }
}

/// One block of the language.
#[derive(Debug, Clone, Copy)]
pub struct BlockSpec {
    /// The keyword.
    pub name: &'static str,
    /// One line for docs and hovers.
    pub doc: &'static str,
    /// The word after the keyword.
    pub label: LabelSpec,
    /// The body.
    pub body: BodySpec,
    /// Whether every recipe needs it.
    pub required: bool,
    /// The label's value when the block is absent (`zero.stage` 0, `optimizer.kind` adamw).
    pub absent: KeyDefault,
    /// Its keys (empty for raw blocks).
    pub keys: &'static [KeySpec],
    /// Groups of keys of which at least one must be given.
    pub one_of: &'static [&'static [&'static str]],
    /// Groups of keys of which at most one may be given.
    pub exclusive: &'static [&'static [&'static str]],
}

/// One key of a block.
#[derive(Debug, Clone, Copy)]
pub struct KeySpec {
    /// The key as written (`offload optimizer`).
    pub name: &'static str,
    /// Its type.
    pub ty: Ty,
    /// One line for docs and hovers.
    pub doc: &'static str,
    /// Its value when it is not written.
    pub default: KeyDefault,
    /// The DeepSpeed config key it becomes, if any.
    pub deepspeed: Option<&'static str>,
    /// Other names DeepSpeed accepts for the same setting (pydantic aliases, deprecated
    /// switches), last path component only; `recipe import` and the raw-key rules read them.
    pub ds_aliases: &'static [&'static str],
    /// The ZeRO stages at which DeepSpeed reads it (empty: not stage-dependent).
    pub stages: &'static [i64],
    /// The TrainingArguments field (or HF script argument) it becomes, if any.
    pub hf: Option<&'static str>,
    /// Whether the block needs it.
    pub required: bool,
    /// The block labels it applies to (`sgd` for `momentum`); empty = all.
    pub kinds: &'static [&'static str],
    /// Defaults that differ by block label, instead of `default` (HF's `greedy` takes
    /// `factor`, `threshold`, … with other defaults than torch's `ReduceLROnPlateau`): the
    /// labels, the value, whose default it mirrors.
    pub kind_defaults: &'static [KindDefault],
}

/// A key's default for some block labels (see [`KeySpec::kind_defaults`]).
pub type KindDefault = (&'static [&'static str], Lit, &'static str);

impl KeySpec {
    /// Whether this key applies to a block with this label.
    pub fn applies_to(&self, kind: Option<&str>) -> bool {
        self.kinds.is_empty() || kind.is_some_and(|k| self.kinds.contains(&k))
    }

    /// The key's default in a block with this label: the label's own default, if the key has
    /// one, else `default`.
    pub fn default_for(&self, kind: Option<&str>) -> KeyDefault {
        kind.and_then(|k| {
            self.kind_defaults
                .iter()
                .find(|(kinds, _, _)| kinds.contains(&k))
        })
        .map_or(self.default, |(_, v, why)| KeyDefault::Value(*v, why))
    }
}

/// The block with this keyword.
pub fn block(name: &str) -> Option<&'static BlockSpec> {
    BLOCKS.iter().find(|b| b.name == name)
}

impl BlockSpec {
    /// The key with this name (for any kind).
    pub fn key(&self, name: &str) -> Option<&'static KeySpec> {
        self.keys.iter().find(|k| k.name == name)
    }
}

/// The key spec of a dotted setting name (`optimizer.lr`); `None` for labels and derived settings.
pub fn key_spec(dotted: &str) -> Option<&'static KeySpec> {
    let (b, k) = dotted.split_once('.')?;
    block(b)?.key(k)
}

/// The literal default of a dotted setting (a key's, or a block label's when the block is absent).
pub fn literal_default(dotted: &str) -> Option<Lit> {
    if let Some(k) = key_spec(dotted) {
        return k.default.literal();
    }
    let (b, _) = dotted.split_once('.')?;
    block(b)?.absent.literal()
}
