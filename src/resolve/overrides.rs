//! `--set block.key=value`: any recipe item from the command line, checked like the recipe.

use crate::schema::{self, BodySpec, LabelSpec};
use crate::syntax::parser::parse_value;

use super::value::{Source, Val};

/// One `--set` override, parsed and type-checked.
#[derive(Debug, Clone, PartialEq)]
pub struct Override {
    /// The resolved key (`batch.micro`, `zero.offload optimizer`, `zero.stage`).
    pub key: String,
    /// The value.
    pub value: Val,
    /// The flag as given.
    pub flag: String,
}

impl Override {
    /// Its provenance.
    pub fn source(&self) -> Source {
        Source::Flag {
            flag: format!("--set {}", self.flag),
        }
    }
}

/// Parses `block.key=value`; the error says what is wrong, in one line.
pub fn parse(flag: &str) -> Result<Override, String> {
    let (path, raw) = flag
        .split_once('=')
        .ok_or_else(|| format!("`--set {flag}`: expected block.key=value"))?;
    let (block_name, key) = path
        .trim()
        .split_once('.')
        .ok_or_else(|| format!("`--set {flag}`: expected block.key=value, e.g. batch.micro=8"))?;
    let block = schema::block(block_name).ok_or_else(|| {
        let names = schema::BLOCKS.iter().map(|b| b.name);
        match crate::check::suggest::closest(block_name, names) {
            Some(best) => {
                format!("`--set {flag}`: unknown block `{block_name}` (did you mean `{best}`?)")
            }
            None => format!("`--set {flag}`: unknown block `{block_name}`"),
        }
    })?;
    if !matches!(block.body, BodySpec::Items) && !matches!(block.body, BodySpec::None) {
        return Err(format!(
            "`--set {flag}`: `{block_name}` cannot be set from the command line"
        ));
    }
    // A string is quoted as in a recipe; through a shell that means quoting twice.
    let quoted = format!(
        "--set '{}={}'",
        path.trim(),
        crate::commands::format::quote(raw.trim())
    );
    let value = parse_value(raw.trim()).map_err(|e| {
        let why = e.first().map_or("bad value", |d| d.message.as_str());
        if raw.trim().starts_with('"') {
            format!("`--set {flag}`: {why}")
        } else {
            format!("`--set {flag}`: {why}; a string value is quoted as in a recipe: {quoted}")
        }
    })?;
    // The label (`zero.stage`, `optimizer.kind`), else a key; `offload_optimizer` may stand for
    // `offload optimizer` since spaces are awkward in a shell.
    let label_key = super::label_key(block_name);
    let (key, ty) = if key == label_key {
        match block.label {
            LabelSpec::Required { ty, .. } | LabelSpec::Optional { ty, .. } => {
                (key.to_string(), ty)
            }
            LabelSpec::None => {
                return Err(format!("`--set {flag}`: `{block_name}` has no `{key}`"))
            }
        }
    } else {
        let spaced = key.replace('_', " ");
        let spec = block
            .key(key)
            .or_else(|| block.key(&spaced))
            .ok_or_else(|| {
                let names = block.keys.iter().map(|k| k.name);
                match crate::check::suggest::closest(key, names) {
                    Some(best) => format!("`--set {flag}`: `{block_name}` has no key `{key}` (did you mean `{best}`?)"),
                    None => format!("`--set {flag}`: `{block_name}` has no key `{key}`"),
                }
            })?;
        (spec.name.to_string(), spec.ty)
    };
    ty.check(&value).map_err(|m| {
        let why = match m {
            schema::types::Mismatch::Type {
                expected, found, ..
            } if expected.contains("string") && !raw.trim().starts_with('"') => {
                format!("expected {expected}, found {found}; quote it as in a recipe: {quoted}")
            }
            schema::types::Mismatch::Type {
                expected, found, ..
            } => format!("expected {expected}, found {found}"),
            schema::types::Mismatch::Word { word, allowed, .. } => {
                format!(
                    "`{word}` is not one of {}",
                    schema::types::words_list(&allowed)
                )
            }
            schema::types::Mismatch::Range { why, .. }
            | schema::types::Mismatch::Argument { why, .. } => why,
        };
        format!("`--set {flag}`: {why}")
    })?;
    Ok(Override {
        key: format!("{block_name}.{key}"),
        value: Val::from_ast(&value),
        flag: flag.to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_keys_labels_and_spaced_keys() {
        let o = parse("batch.micro=8").unwrap();
        assert_eq!(
            (o.key.as_str(), o.value.clone()),
            ("batch.micro", Val::Int(8))
        );
        assert_eq!(parse("zero.stage=3").unwrap().value, Val::Int(3));
        assert_eq!(
            parse("zero.offload_optimizer=cpu").unwrap().key,
            "zero.offload optimizer"
        );
        assert_eq!(
            parse("schedule.warmup=6%").unwrap().value,
            Val::Percent(6.0)
        );
    }

    #[test]
    fn unquoted_strings_get_the_quoted_spelling() {
        let e = parse("model.from=bert-base-uncased").unwrap_err();
        assert!(
            e.ends_with(
                r#"a string value is quoted as in a recipe: --set 'model.from="bert-base-uncased"'"#
            ),
            "{e}"
        );
        let e = parse("data.train=x").unwrap_err();
        assert!(
            e.ends_with(r#"quote it as in a recipe: --set 'data.train="x"'"#),
            "{e}"
        );
        assert!(parse(r#"model.from="bert-base-uncased""#).is_ok());
    }

    #[test]
    fn rejects_with_a_reason() {
        assert!(parse("batch.micro")
            .unwrap_err()
            .contains("block.key=value"));
        assert!(parse("bach.micro=1")
            .unwrap_err()
            .contains("did you mean `batch`"));
        assert!(parse("batch.mikro=1")
            .unwrap_err()
            .contains("did you mean `micro`"));
        assert!(parse("batch.micro=\"8\"")
            .unwrap_err()
            .contains("expected a whole number"));
        assert!(parse("zero.stage=7").unwrap_err().contains("out of range"));
        assert!(parse("train.precision=fp8")
            .unwrap_err()
            .contains("not one of"));
    }
}
