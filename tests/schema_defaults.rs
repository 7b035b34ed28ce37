//! Defaults live in the schema only. Later stages read a setting through the accessors that fall
//! back to the schema's literal (`Resolved::num`, `integer`, `count`, `flag`, `choice`, `text`),
//! never through a literal of their own; this test reads every such use in `src/` and checks
//! that the key has a default the accessor can fall back to (a literal, or a derived one that
//! resolution always fills). It also ties the few schema literals that mirror another table.

use recipe::schema::{self, KeyDefault};

fn rust_files(dir: &std::path::Path, out: &mut Vec<std::path::PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The dotted keys passed to `accessor("…")` in `text`.
fn uses<'t>(text: &'t str, accessor: &str) -> Vec<&'t str> {
    let pat = format!("{accessor}(\"");
    text.match_indices(&pat)
        .filter_map(|(i, _)| {
            let rest = &text[i + pat.len()..];
            let key = &rest[..rest.find('"')?];
            key.contains('.').then_some(key)
        })
        .collect()
}

fn has_fallback(key: &str) -> bool {
    schema::literal_default(key).is_some()
        || schema::key_spec(key).is_some_and(|k| matches!(k.default, KeyDefault::Derived(..)))
}

#[test]
fn every_defaulting_accessor_names_a_key_with_a_schema_default() {
    let mut files = Vec::new();
    rust_files(
        &std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src"),
        &mut files,
    );
    let mut checked = 0;
    let mut missing = Vec::new();
    for path in files {
        let text = std::fs::read_to_string(&path).unwrap();
        let mut keys = Vec::new();
        for accessor in [".num", ".integer", ".count", ".flag", ".choice", ".text"] {
            keys.extend(uses(&text, accessor));
        }
        // `let f = |k: &str| r.num(k);` and then `f("schedule.power")`.
        if text.contains("|k: &str| r.num(k)") || text.contains("|k: &str| num(r.num(k))") {
            keys.extend(uses(&text, " f").into_iter().chain(uses(&text, "(f")));
        }
        for key in keys {
            checked += 1;
            if !has_fallback(key) {
                missing.push(format!("{}: {key}", path.display()));
            }
        }
    }
    assert!(
        checked > 50,
        "only {checked} uses found: the scan is broken"
    );
    assert!(
        missing.is_empty(),
        "keys read with a defaulting accessor but without a schema default: {missing:?}"
    );
}

#[test]
fn a_key_without_a_default_is_caught() {
    assert!(!has_fallback("data.train"));
    assert!(!has_fallback("batch.micro"));
    assert!(has_fallback("optimizer.lr"));
    assert!(has_fallback("zero.stage")); // the absent block's label
    assert!(has_fallback("optimizer.max_coeff")); // DeepSpeed's own, not written
}

#[test]
fn target_defaults_are_the_newest_known_releases() {
    use recipe::upstream::versions::Library;
    for lib in Library::ALL {
        let lit = schema::literal_default(&format!("target.{}", lib.key()));
        assert_eq!(
            lit,
            Some(schema::Lit::Str(Box::leak(
                lib.newest().to_string().into_boxed_str()
            ))),
            "target.{}",
            lib.key()
        );
    }
}

#[test]
fn lamb_trust_ratio_bounds_are_the_runtimes() {
    assert_eq!(
        schema::literal_default("optimizer.max_coeff"),
        Some(schema::Lit::Float(recipe_runtime::optim::DEFAULT_MAX_COEFF))
    );
    assert_eq!(
        schema::literal_default("optimizer.min_coeff"),
        Some(schema::Lit::Float(recipe_runtime::optim::DEFAULT_MIN_COEFF))
    );
}
