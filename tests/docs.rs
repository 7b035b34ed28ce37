//! The docs cover the language: every key of the schema has its own row in its block's key table
//! in docs/language.md (and no row names a key the block does not have), every call argument a
//! row in its call's argument table, every block, call and label word is named; and every
//! diagnostic code has a section in docs/diagnostics.md.

use recipe::schema::{BlockSpec, CallSpec, LabelSpec, Ty, BLOCKS};

fn read(path: &str) -> String {
    std::fs::read_to_string(std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(path)).unwrap()
}

/// The part of docs/language.md that documents `block`: from its `### 5.N `block`` heading to
/// the next heading of that level or above (its `####` subsections included).
fn block_section<'d>(doc: &'d str, block: &str) -> Option<&'d str> {
    let suffix = format!(" `{block}`");
    let mut start = None;
    let mut offset = 0;
    for line in doc.split_inclusive('\n') {
        let heading = line.trim_end();
        if let Some(s) = start {
            if heading.starts_with("## ") || heading.starts_with("### ") {
                return Some(&doc[s..offset]);
            }
        } else if heading.starts_with("### 5.") && heading.ends_with(&suffix) {
            start = Some(offset);
        }
        offset += line.len();
    }
    start.map(|s| &doc[s..])
}

/// A markdown table: its rows of trimmed cells, the header first, the `|---|` line left out.
type Table = Vec<Vec<String>>;

/// The tables in `text`, each with the indices of its first line and of the line after it.
fn tables(text: &str) -> Vec<(usize, usize, Table)> {
    let mut out: Vec<(usize, usize, Table)> = Vec::new();
    let mut current: Option<(usize, usize, Table)> = None;
    for (i, line) in text.lines().enumerate() {
        let line = line.trim();
        if !line.starts_with('|') {
            out.extend(current.take());
            continue;
        }
        // Cells split at `|`, but not at the `\|` of `a \| b` inside a cell.
        let inner = line.trim_start_matches('|').trim_end_matches('|');
        let mut cells = Vec::new();
        let mut cell = String::new();
        let mut chars = inner.chars().peekable();
        while let Some(c) = chars.next() {
            match c {
                '\\' if chars.peek() == Some(&'|') => cell.push(chars.next().unwrap_or('|')),
                '|' => cells.push(std::mem::take(&mut cell).trim().to_string()),
                c => cell.push(c),
            }
        }
        cells.push(cell.trim().to_string());
        if cells
            .iter()
            .all(|c| !c.is_empty() && c.chars().all(|ch| matches!(ch, '-' | ':')))
        {
            continue; // the header's separator
        }
        let table = current.get_or_insert_with(|| (i, i, Vec::new()));
        table.1 = i + 1;
        table.2.push(cells);
    }
    out.extend(current);
    out
}

fn calls(ty: &Ty) -> &'static [CallSpec] {
    match ty {
        Ty::Call(calls) => calls,
        _ => &[],
    }
}

/// What is wrong with `block`'s documentation in `section`.
fn block_problems(block: &BlockSpec, section: &str) -> Vec<String> {
    let mut problems = Vec::new();
    let name = block.name;
    let all = tables(section);
    // The key table: the one whose header starts with `key`.
    let key_tables: Vec<&Table> = all
        .iter()
        .map(|(_, _, t)| t)
        .filter(|t| t[0].first().is_some_and(|c| c == "key"))
        .collect();
    match (block.keys.is_empty(), key_tables.as_slice()) {
        (true, []) => {}
        (true, _) => problems.push(format!("{name}: a key table, but the block has no keys")),
        (false, [table]) => {
            let width = table[0].len();
            let rows: Vec<&str> = table[1..].iter().map(|r| r[0].as_str()).collect();
            for key in block.keys {
                let cell = format!("`{}`", key.name);
                match rows.iter().filter(|r| **r == cell).count() {
                    1 => {}
                    0 => problems.push(format!("{name}: no row for key `{}`", key.name)),
                    n => problems.push(format!("{name}: {n} rows for key `{}`", key.name)),
                }
            }
            for row in &table[1..] {
                let known = block.keys.iter().any(|k| row[0] == format!("`{}`", k.name));
                if !known {
                    problems.push(format!(
                        "{name}: a row for {}, not a key of the block",
                        row[0]
                    ));
                }
                if row.len() != width {
                    problems.push(format!(
                        "{name}: the row for {} has {} cells, the header {width}",
                        row[0],
                        row.len()
                    ));
                }
            }
        }
        (false, []) => problems.push(format!("{name}: no key table (header `| key | …`)")),
        (false, _) => problems.push(format!("{name}: more than one key table")),
    }
    // Each call is named; a call with arguments has an argument table: the first table, from
    // the key's `####` subsection on, whose introduction (the text since the table before it)
    // names the call.
    let lines: Vec<&str> = section.lines().collect();
    for key in block.keys {
        let heading = format!("#### `{}`", key.name);
        let from = lines
            .iter()
            .position(|l| l.trim_end() == heading)
            .unwrap_or(0);
        for call in calls(&key.ty) {
            let named = format!("`{}", call.name);
            if !section.contains(&named) {
                problems.push(format!(
                    "{name}.{}: the call `{}` is not named",
                    key.name, call.name
                ));
            }
            if call.args.is_empty() {
                continue;
            }
            let mut since = from;
            let table =
                all.iter()
                    .filter(|(start, _, _)| *start >= from)
                    .find(|(start, end, _)| {
                        let intro = lines[since..*start].iter().any(|l| l.contains(&named));
                        since = *end;
                        intro
                    });
            let Some((_, _, table)) = table else {
                problems.push(format!(
                    "{name}.{}: no argument table for `{}`",
                    key.name, call.name
                ));
                continue;
            };
            for arg in call.args {
                let cell = format!("`{}`", arg.name);
                if !table[1..].iter().any(|r| r[0] == cell) {
                    problems.push(format!(
                        "{name}.{}: `{}` has no row for its argument `{}`",
                        key.name, call.name, arg.name
                    ));
                }
            }
        }
    }
    // Label words (optimizer kinds, schedule kinds, stages) are named.
    if let LabelSpec::Required {
        ty: Ty::Word(words),
        ..
    }
    | LabelSpec::Optional {
        ty: Ty::Word(words),
        ..
    } = block.label
    {
        for w in words {
            if !section.contains(&format!("`{w}`")) {
                problems.push(format!("{name}: the label `{w}` is not named"));
            }
        }
    }
    problems
}

#[test]
fn language_reference_has_a_row_for_every_key_and_argument() {
    let doc = read("docs/language.md");
    let mut problems = Vec::new();
    for block in BLOCKS {
        match block_section(&doc, block.name) {
            Some(section) => problems.extend(block_problems(block, section)),
            None => problems.push(format!(
                "{}: no `### 5.N `{}`` section",
                block.name, block.name
            )),
        }
    }
    assert!(
        problems.is_empty(),
        "docs/language.md:\n{}",
        problems.join("\n")
    );
}

#[test]
fn the_docs_check_finds_what_is_missing() {
    // The check itself: a key without a row, a stale row, a short row and a missing argument
    // row are each reported.
    let model = BLOCKS.iter().find(|b| b.name == "model").unwrap();
    let doc = read("docs/language.md");
    let section = block_section(&doc, "model").unwrap();
    assert!(block_problems(model, section).is_empty());
    let no_row: String = section
        .lines()
        .filter(|l| !l.starts_with("| `dropout` |"))
        .map(|l| format!("{l}\n"))
        .collect();
    assert_eq!(
        block_problems(model, &no_row),
        ["model: no row for key `dropout`"]
    );
    let stale = section.replacen("| `dropout` |", "| `drop_out` |", 1);
    let found = block_problems(model, &stale);
    assert!(found.contains(&"model: a row for `drop_out`, not a key of the block".to_string()));
    let short = section.replacen("| `dropout` | number 0–1 |", "| `dropout` |", 1);
    assert!(block_problems(model, &short)[0].contains("has 6 cells, the header 7"));
    let no_arg = section.replacen("| `labels` |", "| `label` |", 1);
    assert_eq!(
        block_problems(model, &no_arg),
        ["model.task: `classify` has no row for its argument `labels`"]
    );
    // A backticked mention elsewhere is not a row.
    let mention = format!("{no_row}\nSee `dropout`.\n");
    assert_eq!(
        block_problems(model, &mention),
        ["model: no row for key `dropout`"]
    );
}

#[test]
fn diagnostics_reference_has_a_section_per_code() {
    // docs/diagnostics.md, plus one page per rule family under docs/rules/.
    let mut doc = read("docs/diagnostics.md");
    let rules = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/rules");
    if let Ok(entries) = std::fs::read_dir(rules) {
        for entry in entries {
            doc.push_str(&std::fs::read_to_string(entry.unwrap().path()).unwrap());
        }
    }
    for (code, name, _) in recipe::diagnostics::codes::all() {
        assert!(
            doc.contains(&format!("### {code}")),
            "docs/diagnostics.md has no `### {code}` ({name})"
        );
    }
}

#[test]
fn json_contract_is_documented() {
    let doc = read("docs/diagnostics-json.md");
    for field in [
        "code", "severity", "message", "file", "span", "labels", "help", "line", "column",
        "offset", "primary",
    ] {
        assert!(
            doc.contains(&format!("`{field}`")),
            "docs/diagnostics-json.md does not describe `{field}`"
        );
    }
}
