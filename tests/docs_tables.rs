//! The key tables of docs/language.md are the schema's: each block's table is exactly what
//! `recipe::schema::docs::key_table` renders from `schema/blocks.rs` (type, default and whose it
//! is, kinds and ZeRO stages, DeepSpeed key and aliases, TrainingArguments field, meaning).
//! After changing the schema, `RECIPE_BLESS_DOCS=1 cargo test --test suite docs_tables::` rewrites the
//! tables; the test then fails once more so that the change is looked at, and passes after.

use recipe::schema::{docs::key_table, BLOCKS};

const PATH: &str = "docs/language.md";

/// The byte range of `block`'s key table: the first `| key |` table after its `### 5.N` heading.
fn table_range(doc: &str, block: &str) -> Option<(usize, usize)> {
    let suffix = format!(" `{block}`");
    let mut offset = 0;
    let mut in_section = false;
    let mut start = None;
    for line in doc.split_inclusive('\n') {
        let trimmed = line.trim_end();
        if trimmed.starts_with("### ") || trimmed.starts_with("## ") {
            if in_section && start.is_none() {
                return None;
            }
            in_section = trimmed.starts_with("### 5.") && trimmed.ends_with(&suffix);
        }
        if in_section {
            match start {
                None if trimmed.starts_with("| key |") => start = Some(offset),
                Some(s) if !trimmed.starts_with('|') => return Some((s, offset)),
                _ => {}
            }
        }
        offset += line.len();
    }
    start.map(|s| (s, offset))
}

#[test]
fn key_tables_are_rendered_from_the_schema() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(PATH);
    let mut doc = std::fs::read_to_string(&path).unwrap();
    let bless = std::env::var_os("RECIPE_BLESS_DOCS").is_some();
    let mut stale = Vec::new();
    for block in BLOCKS.iter().filter(|b| !b.keys.is_empty()) {
        let want = key_table(block);
        let Some((a, b)) = table_range(&doc, block.name) else {
            stale.push(format!("{}: no key table in its section", block.name));
            continue;
        };
        if doc[a..b] != want {
            stale.push(block.name.to_string());
            if bless {
                doc.replace_range(a..b, &want);
            }
        }
    }
    if bless && !stale.is_empty() {
        let tmp = path.with_extension("md.tmp");
        std::fs::write(&tmp, &doc).unwrap();
        std::fs::rename(&tmp, &path).unwrap();
    }
    assert!(
        stale.is_empty(),
        "{PATH}: the key tables of {stale:?} differ from the schema; \
         RECIPE_BLESS_DOCS=1 cargo test --test suite docs_tables:: rewrites them"
    );
}

#[test]
fn a_changed_schema_row_is_caught() {
    // The renderer is not a constant: a key's table row follows its spec.
    let block = BLOCKS.iter().find(|b| b.name == "schedule").unwrap();
    let table = key_table(block);
    assert!(table.contains("| `min_lr_rate` | number 0–1 | — | `cosine_with_min_lr`, `cosine_warmup_with_min_lr` | — | `lr_scheduler_kwargs.min_lr_rate` |"));
    // A default that differs by kind says so.
    assert!(table.contains("| `factor` | number 0–1 | `0.1`: torch ReduceLROnPlateau; with `greedy`: `0.95`: HF GreedyLR |"));
    assert!(key_table(BLOCKS.iter().find(|b| b.name == "zero").unwrap())
        .contains("| `offload param` | call: `none` \\| `cpu` \\| `nvme` | `none`: DeepSpeed: no offload | stage 3 |"));
}
