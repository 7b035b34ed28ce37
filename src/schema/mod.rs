//! The schema: every block and key of the language as data.
//!
//! One table ([`blocks::BLOCKS`]) says, for each block and key: the value type, the allowed
//! values, the default, a one-line doc, and the upstream meaning (the DeepSpeed key and the
//! TrainingArguments field it becomes). The checker, the docs test and (later) `recipe explain`
//! all read this table; nothing else lists keys.

pub mod blocks;
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
    /// Its keys (empty for raw blocks).
    pub keys: &'static [KeySpec],
    /// Groups of keys of which at least one must be given.
    pub one_of: &'static [&'static [&'static str]],
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
    /// The default, in words, when it is not written (`None`: no default, or derived).
    pub default: Option<&'static str>,
    /// The DeepSpeed config key it becomes, if any.
    pub deepspeed: Option<&'static str>,
    /// The TrainingArguments field (or HF script argument) it becomes, if any.
    pub hf: Option<&'static str>,
    /// Whether the block needs it.
    pub required: bool,
    /// The block labels it applies to (`sgd` for `momentum`); empty = all.
    pub kinds: &'static [&'static str],
}

impl KeySpec {
    /// Whether this key applies to a block with this label.
    pub fn applies_to(&self, kind: Option<&str>) -> bool {
        self.kinds.is_empty() || kind.is_some_and(|k| self.kinds.contains(&k))
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
