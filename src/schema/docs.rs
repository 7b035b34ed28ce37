//! The language reference's key tables, rendered from the schema. docs/language.md carries one
//! table per block; tests/docs_tables.rs checks that each is exactly what [`key_table`] renders
//! (and rewrites them with `RECIPE_BLESS_DOCS=1`), so a key's type, default, kinds, stages and
//! upstream names are written once, in [`super::blocks`].

use super::types::Ty;
use super::{BlockSpec, KeyDefault, KeySpec, Lit};

/// The header of every key table.
pub const HEADER: &str = "| key | type | default | applies to | DeepSpeed key | TrainingArguments field | meaning |\n|---|---|---|---|---|---|---|\n";

/// The key table of a block (header included, a row per key, each line ending in `\n`); empty
/// for a block without keys.
pub fn key_table(block: &BlockSpec) -> String {
    if block.keys.is_empty() {
        return String::new();
    }
    let mut out = String::from(HEADER);
    for key in block.keys {
        out.push_str(&row(key));
        out.push('\n');
    }
    out
}

fn row(key: &KeySpec) -> String {
    let cells = [
        format!("`{}`", key.name),
        ty(&key.ty),
        default(key),
        applies(key),
        deepspeed(key),
        hf(key.hf),
        key.doc.to_string(),
    ];
    let cells: Vec<String> = cells.iter().map(|c| c.replace('|', "\\|")).collect();
    format!("| {} |", cells.join(" | "))
}

fn words(ws: &[&str]) -> String {
    ws.iter()
        .map(|w| format!("`{w}`"))
        .collect::<Vec<_>>()
        .join(" | ")
}

fn num(x: f64) -> String {
    if x == f64::INFINITY {
        return "∞".into();
    }
    if x.fract() == 0.0 && x.abs() < 1e15 {
        return int(x as i64);
    }
    if !(1e-3..1e6).contains(&x.abs()) {
        return format!("{x:e}");
    }
    format!("{x}")
}

/// Whole numbers of a million or more with trailing zeros as `5e8`.
fn int(i: i64) -> String {
    if i.abs() >= 1_000_000 && i % 100_000 == 0 {
        format!("{:e}", i as f64)
    } else {
        i.to_string()
    }
}

/// A type in the words of the reference's type table (docs/language.md section 4).
pub fn ty(t: &Ty) -> String {
    match *t {
        Ty::Str => "string".into(),
        Ty::Path => "path".into(),
        Ty::Version => "version".into(),
        Ty::Int { min, max } if max == i64::MAX => format!("integer ≥ {}", int(min)),
        Ty::Int { min, max } => format!("integer {}–{}", int(min), int(max)),
        Ty::Number { min, max } if max == f64::INFINITY => format!("number ≥ {}", num(min)),
        Ty::Number { min, max } => format!("number {}–{}", num(min), num(max)),
        Ty::Size => "size".into(),
        Ty::Bool => "bool".into(),
        Ty::Word(ws) => words(ws),
        Ty::Fraction => "fraction".into(),
        Ty::Steps => "steps".into(),
        Ty::Pair { min, max } => format!("pair, each {}–{}", num(min), num(max)),
        Ty::Numbers { min, max } if max == f64::INFINITY => {
            format!("number ≥ {} (or one per parameter group)", num(min))
        }
        Ty::Numbers { min, max } => {
            format!(
                "number {}–{} (or one per parameter group)",
                num(min),
                num(max)
            )
        }
        Ty::StrList => "list of strings".into(),
        Ty::WordOrInt(ws, min, max) if max == i64::MAX => {
            format!("{} | integer ≥ {}", words(ws), int(min))
        }
        Ty::WordOrInt(ws, min, max) => format!("{} | integer {}–{}", words(ws), int(min), int(max)),
        Ty::Labels => "labels".into(),
        Ty::Call(calls) => {
            let names: Vec<&str> = calls.iter().map(|c| c.name).collect();
            format!("call: {}", words(&names))
        }
        Ty::Any => "any".into(),
    }
}

/// A literal as the recipe would write it.
pub fn lit(v: Lit) -> String {
    match v {
        Lit::Int(i) => int(i),
        Lit::Float(f) => num(f),
        Lit::Bool(b) => b.to_string(),
        Lit::Word(w) => w.to_string(),
        Lit::Str(s) => format!("\"{s}\""),
        Lit::Floats(xs) => format!(
            "({})",
            xs.iter().map(|x| num(*x)).collect::<Vec<_>>().join(", ")
        ),
        Lit::Strs(xs) => format!(
            "[{}]",
            xs.iter()
                .map(|x| format!("\"{x}\""))
                .collect::<Vec<_>>()
                .join(", ")
        ),
    }
}

pub fn default(key: &KeySpec) -> String {
    if key.required {
        return "required".into();
    }
    let mut text = match key.default {
        KeyDefault::None => "—".into(),
        KeyDefault::Value(v, why) => format!("`{}`: {why}", lit(v)),
        KeyDefault::Upstream(v, who) => format!("`{}` from {who} (not written)", lit(v)),
        KeyDefault::Derived(_, text) | KeyDefault::Later(text) => text.to_string(),
    };
    for (kinds, v, why) in key.kind_defaults {
        let kinds = kinds
            .iter()
            .map(|k| format!("`{k}`"))
            .collect::<Vec<_>>()
            .join(", ");
        text.push_str(&format!("; with {kinds}: `{}`: {why}", lit(*v)));
    }
    text
}

fn applies(key: &KeySpec) -> String {
    let mut parts = Vec::new();
    if !key.kinds.is_empty() {
        parts.push(
            key.kinds
                .iter()
                .map(|k| format!("`{k}`"))
                .collect::<Vec<_>>()
                .join(", "),
        );
    }
    match key.stages {
        [] => {}
        [one] => parts.push(format!("stage {one}")),
        [init @ .., last] => parts.push(format!(
            "stages {} and {last}",
            init.iter()
                .map(i64::to_string)
                .collect::<Vec<_>>()
                .join(", ")
        )),
    }
    if parts.is_empty() {
        "all".into()
    } else {
        parts.join("; ")
    }
}

fn deepspeed(key: &KeySpec) -> String {
    let Some(ds) = key.deepspeed else {
        return "—".into();
    };
    let mut s = ds
        .split(", ")
        .map(|d| format!("`{d}`"))
        .collect::<Vec<_>>()
        .join(", ");
    if !key.ds_aliases.is_empty() {
        s.push_str(&format!(
            " (also {})",
            key.ds_aliases
                .iter()
                .map(|a| format!("`{a}`"))
                .collect::<Vec<_>>()
                .join(", ")
        ));
    }
    s
}

/// `name, name (note)` with the names in code.
fn hf(field: Option<&str>) -> String {
    let Some(field) = field else {
        return "—".into();
    };
    let (names, note) = match field.find(" (") {
        Some(i) => (&field[..i], &field[i..]),
        None => (field, ""),
    };
    let names = names
        .split(", ")
        .map(|n| format!("`{n}`"))
        .collect::<Vec<_>>()
        .join(", ");
    format!("{names}{note}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_types_and_defaults_as_the_reference_writes_them() {
        assert_eq!(
            ty(&Ty::Int {
                min: 1,
                max: i64::MAX
            }),
            "integer ≥ 1"
        );
        assert_eq!(ty(&Ty::Number { min: 0.0, max: 1.0 }), "number 0–1");
        assert_eq!(ty(&Ty::Word(&["a", "b"])), "`a` | `b`");
        assert_eq!(lit(Lit::Float(5e-5)), "5e-5");
        assert_eq!(lit(Lit::Int(500_000_000)), "5e8");
        assert_eq!(lit(Lit::Int(29500)), "29500");
        assert_eq!(lit(Lit::Floats(&[0.9, 0.999])), "(0.9, 0.999)");
        assert_eq!(
            hf(Some("adam_beta1, adam_beta2")),
            "`adam_beta1`, `adam_beta2`"
        );
        assert_eq!(hf(Some("train_file (script)")), "`train_file` (script)");
    }
}
