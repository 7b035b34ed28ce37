//! Every diagnostic code, with a one-line summary. [`all`] is the registry: a test checks that
//! each code has a failing recipe under tests/diagnostics/ and a section in the docs. The
//! syntax and schema codes are here; each rule family lists its own (`rules::*::CODES`).

/// A syntax error the grammar reports.
pub const SYNTAX: &str = "R0001";
/// A string without its closing quote.
pub const UNTERMINATED_STRING: &str = "R0002";
/// A `{`, `(` or `[` that is never closed.
pub const UNCLOSED_DELIMITER: &str = "R0003";
/// A closing delimiter that does not match, or closes nothing.
pub const UNEXPECTED_CLOSER: &str = "R0004";
/// A malformed number literal.
pub const BAD_NUMBER: &str = "R0005";
/// An unknown escape in a string.
pub const BAD_ESCAPE: &str = "R0006";
/// Brackets nested too deep.
pub const NESTING_TOO_DEEP: &str = "R0007";

/// A block keyword the language does not have.
pub const UNKNOWN_BLOCK: &str = "R0010";
/// A key the block does not have.
pub const UNKNOWN_KEY: &str = "R0011";
/// A key that exists, but not for this kind of block (`momentum` in `optimizer adamw`).
pub const KEY_NOT_FOR_KIND: &str = "R0012";
/// A value of the wrong type.
pub const WRONG_TYPE: &str = "R0013";
/// The same key twice in a block.
pub const DUPLICATE_KEY: &str = "R0014";
/// The same block twice.
pub const DUPLICATE_BLOCK: &str = "R0015";
/// A block every recipe needs is missing.
pub const MISSING_BLOCK: &str = "R0016";
/// An item the block needs is missing.
pub const MISSING_ITEM: &str = "R0017";
/// A word that is not one of the allowed values.
pub const UNKNOWN_VALUE: &str = "R0018";
/// A number outside the allowed range.
pub const OUT_OF_RANGE: &str = "R0019";
/// A block without the label it needs (`zero` without a stage).
pub const MISSING_LABEL: &str = "R0020";
/// A block written in a shape it does not take (a label or body where none belongs).
pub const BLOCK_SHAPE: &str = "R0021";
/// A nested `key { }` section outside the raw blocks.
pub const SECTION_NOT_ALLOWED: &str = "R0022";
/// A call argument that does not exist, is repeated or is missing.
pub const BAD_ARGUMENT: &str = "R0023";
/// Two keys that exclude each other are both given (`min_lr` and `min_lr_rate`).
pub const EXCLUSIVE_KEYS: &str = "R0024";

/// A `deepspeed { }` key DeepSpeed does not know (it would silently ignore it).
pub const UNKNOWN_DEEPSPEED_KEY: &str = "R0030";
/// A deprecated or renamed DeepSpeed key.
pub const RENAMED_DEEPSPEED_KEY: &str = "R0031";
/// An `hf { }` key that is not a TrainingArguments field.
pub const UNKNOWN_HF_FIELD: &str = "R0032";
/// A TrainingArguments field that was renamed or removed.
pub const RENAMED_HF_FIELD: &str = "R0033";

/// Code, short name, summary of the syntax and schema codes (R00xx).
pub const ALL: &[(&str, &str, &str)] = &[
    (SYNTAX, "syntax", "the text does not follow the grammar"),
    (
        UNTERMINATED_STRING,
        "unterminated-string",
        "a string has no closing quote on its line",
    ),
    (
        UNCLOSED_DELIMITER,
        "unclosed-delimiter",
        "a `{`, `(` or `[` is never closed",
    ),
    (
        UNEXPECTED_CLOSER,
        "unexpected-closer",
        "a closing delimiter does not match what is open",
    ),
    (BAD_NUMBER, "bad-number", "a number literal is malformed"),
    (
        BAD_ESCAPE,
        "bad-escape",
        "a string contains an unknown escape",
    ),
    (
        NESTING_TOO_DEEP,
        "nesting-too-deep",
        "brackets are nested more than 64 levels",
    ),
    (
        UNKNOWN_BLOCK,
        "unknown-block",
        "a block keyword the language does not have",
    ),
    (UNKNOWN_KEY, "unknown-key", "a key the block does not have"),
    (
        KEY_NOT_FOR_KIND,
        "key-not-for-kind",
        "a key that belongs to another kind of the block",
    ),
    (WRONG_TYPE, "wrong-type", "a value of the wrong type"),
    (
        DUPLICATE_KEY,
        "duplicate-key",
        "a key given twice in one block",
    ),
    (DUPLICATE_BLOCK, "duplicate-block", "a block given twice"),
    (
        MISSING_BLOCK,
        "missing-block",
        "a block every recipe needs is missing",
    ),
    (
        MISSING_ITEM,
        "missing-item",
        "an item the block needs is missing",
    ),
    (
        UNKNOWN_VALUE,
        "unknown-value",
        "a word that is not one of the allowed values",
    ),
    (
        OUT_OF_RANGE,
        "out-of-range",
        "a number outside the allowed range",
    ),
    (
        MISSING_LABEL,
        "missing-label",
        "a block lacks the label it needs",
    ),
    (
        BLOCK_SHAPE,
        "block-shape",
        "a label or body where the block takes none",
    ),
    (
        SECTION_NOT_ALLOWED,
        "section-not-allowed",
        "a nested section outside deepspeed/hf",
    ),
    (
        BAD_ARGUMENT,
        "bad-argument",
        "a call argument is unknown, repeated or missing",
    ),
    (
        EXCLUSIVE_KEYS,
        "exclusive-keys",
        "two keys that exclude each other are both given",
    ),
    (
        UNKNOWN_DEEPSPEED_KEY,
        "unknown-deepspeed-key",
        "a raw DeepSpeed key DeepSpeed does not know",
    ),
    (
        RENAMED_DEEPSPEED_KEY,
        "renamed-deepspeed-key",
        "a raw DeepSpeed key that is deprecated or renamed",
    ),
    (
        UNKNOWN_HF_FIELD,
        "unknown-hf-field",
        "a raw key that is not a TrainingArguments field",
    ),
    (
        RENAMED_HF_FIELD,
        "renamed-hf-field",
        "a TrainingArguments field renamed or removed for the target",
    ),
];

/// Every code: syntax and schema, then each rule family's.
pub fn all() -> Vec<(&'static str, &'static str, &'static str)> {
    let mut codes = ALL.to_vec();
    for family in crate::rules::FAMILIES {
        codes.extend_from_slice(family.codes);
    }
    // Not run by `recipe check` alone: the native target's refusals (`--target native`).
    codes.extend_from_slice(crate::rules::native::CODES);
    codes
}
