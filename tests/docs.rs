//! The docs cover the language: every key of the schema has its own row in its block's key table
//! in docs/language.md (and no row names a key the block does not have), every call argument a
//! row in its call's argument table, every block, call and label word is named; and every
//! diagnostic code has a section in docs/diagnostics.md. Comments, docs and messages cite
//! docs/upstream.md (not notes outside the repository), and every section and rule they cite is
//! there.

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
    for (code, name, _) in recipe::pair::codes::CODES {
        assert!(
            doc.contains(&format!("### {code} {name}")),
            "docs/rules/pairs.md has no `### {code} {name}`"
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

// ---- citations: docs/upstream.md, not notes outside the repository ----------------------------

/// What the docs under docs/ define: for each file (its path under docs/), the numbers of its
/// numbered headings (`## 6.`, `### 6.2`), and the rule ids docs/upstream.md defines (`#### R-Z03`).
struct Anchors {
    sections: std::collections::BTreeMap<String, std::collections::BTreeSet<String>>,
    rules: std::collections::BTreeSet<String>,
}

/// Every file under `dir` (relative to the repository), recursively, with its text; files that
/// are not UTF-8 are left out.
fn files_under(dir: &str) -> Vec<(String, String)> {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut out = Vec::new();
    let mut stack = vec![root.join(dir)];
    while let Some(path) = stack.pop() {
        if path.is_dir() {
            for entry in std::fs::read_dir(&path).unwrap() {
                stack.push(entry.unwrap().path());
            }
        } else if let Ok(text) = std::fs::read_to_string(&path) {
            let rel = path
                .strip_prefix(root)
                .unwrap()
                .to_string_lossy()
                .replace('\\', "/");
            out.push((rel, text));
        }
    }
    out.sort();
    out
}

fn anchors() -> Anchors {
    let mut sections = std::collections::BTreeMap::new();
    let mut rules = std::collections::BTreeSet::new();
    for (path, text) in files_under("docs") {
        let Some(name) = path.strip_prefix("docs/") else {
            continue;
        };
        let mut numbers = std::collections::BTreeSet::new();
        let mut fenced = false;
        for line in text.lines() {
            fenced ^= line.starts_with("```");
            // An ATX heading outside code blocks: `#`s, a space, the title.
            let Some(title) = line
                .strip_prefix('#')
                .map(|l| l.trim_start_matches('#'))
                .and_then(|l| l.strip_prefix(' '))
                .filter(|_| !fenced)
            else {
                continue;
            };
            let first = title.split_whitespace().next().unwrap_or("");
            let number = first.trim_end_matches('.');
            if number.starts_with(|c: char| c.is_ascii_digit()) {
                numbers.insert(number.to_string());
            }
            if name == "upstream.md" && rule_id(first).is_some() {
                rules.insert(first.to_string());
            }
        }
        sections.insert(name.to_string(), numbers);
    }
    Anchors { sections, rules }
}

/// `R-` and a capital letter and two digits at the start of `s` (a rule id of docs/upstream.md).
fn rule_id(s: &str) -> Option<&str> {
    let b = s.as_bytes();
    let ok = b.len() >= 5
        && b.starts_with(b"R-")
        && b[2].is_ascii_uppercase()
        && b[3].is_ascii_digit()
        && b[4].is_ascii_digit();
    ok.then(|| &s[..5])
}

/// The docs file a `§` cites: the file name before it, over line breaks, comment markers and the
/// other references of the same list (`docs/upstream.md §2.2, §2.3`,
/// `[upstream.md](../upstream.md) R-S06, §5.4 and §7`). `None` for a bare `§`.
fn cited_doc(before: &str) -> Option<String> {
    let lines: Vec<&str> = before.rsplit('\n').take(3).collect();
    let mut words: Vec<&str> = Vec::new();
    for line in &lines {
        let line = line.trim_start();
        let line = ["//!", "///", "//", "#"]
            .iter()
            .find_map(|m| line.strip_prefix(m))
            .unwrap_or(line);
        words.extend(line.split_whitespace().rev());
    }
    for word in words {
        let w = word.trim_matches(|c: char| "(),;`".contains(c));
        let listed = w.is_empty()
            || w == "and"
            || w == "or"
            || w.split(['/', '–']).filter(|p| !p.is_empty()).all(|part| {
                let part = part.trim_start_matches('§');
                rule_id(part).is_some_and(|id| id.len() == part.len())
                    || part.starts_with(|c: char| c.is_ascii_digit())
                        && part.chars().all(|c| c.is_ascii_digit() || c == '.')
            });
        if listed {
            continue;
        }
        // `docs/upstream.md`, `(docs/upstream.md`, `[upstream.md](../upstream.md)`.
        let file = word.trim_end_matches(')').rsplit(['(', '[', '`']).next()?;
        let file = file.trim_start_matches("../").trim_start_matches("docs/");
        return file.ends_with(".md").then(|| file.to_string());
    }
    None
}

/// The citations in `text` (the file `path`) that point outside the repository or at nothing:
/// the internal notes by name, a bare `§N`, a `§N` of a docs file that has no such heading, a
/// rule id docs/upstream.md does not define.
fn citation_problems(path: &str, text: &str, anchors: &Anchors) -> Vec<String> {
    let mut problems = Vec::new();
    let outside = [
        concat!("ds_hf", "_rules"),
        concat!("..", "/shared"),
        concat!("shared", "/reference"),
    ];
    for (n, line) in text.lines().enumerate() {
        for needle in outside {
            if line.contains(needle) {
                problems.push(format!("{path}:{}: cites `{needle}`", n + 1));
            }
        }
    }
    let line_of = |at: usize| text[..at].matches('\n').count() + 1;
    for (at, _) in text.match_indices('§') {
        let after = &text[at + '§'.len_utf8()..];
        let number: String = after
            .chars()
            .take_while(|c| c.is_ascii_digit() || *c == '.')
            .collect();
        let number = number.trim_end_matches('.');
        if number.is_empty() {
            continue;
        }
        let doc = cited_doc(&text[..at]).or_else(|| {
            // docs/upstream.md refers to its own sections without its name.
            (path == "docs/upstream.md").then(|| "upstream.md".to_string())
        });
        match doc {
            None => problems.push(format!(
                "{path}:{}: a bare §{number} (write docs/upstream.md §{number})",
                line_of(at)
            )),
            Some(doc) => match anchors.sections.get(&doc) {
                None => problems.push(format!(
                    "{path}:{}: §{number} of {doc}, which is not a file under docs/",
                    line_of(at)
                )),
                Some(numbers) if !numbers.contains(number) => problems.push(format!(
                    "{path}:{}: docs/{doc} has no section {number}",
                    line_of(at)
                )),
                Some(_) => {}
            },
        }
    }
    for (at, _) in text.match_indices("R-") {
        let preceded = text[..at]
            .chars()
            .next_back()
            .is_some_and(|c| c.is_alphanumeric());
        if let (false, Some(id)) = (preceded, rule_id(&text[at..])) {
            if !anchors.rules.contains(id) {
                problems.push(format!(
                    "{path}:{}: rule {id} is not defined in docs/upstream.md",
                    line_of(at)
                ));
            }
        }
    }
    problems
}

#[test]
fn citations_point_into_the_repository() {
    // Comments, docs and messages cite docs/upstream.md (`docs/upstream.md §6.2`, `R-Z03`), and
    // every section and rule they cite exists there.
    let anchors = anchors();
    assert!(anchors.sections["upstream.md"].contains("6.2"));
    assert!(anchors.rules.contains("R-S02"));
    let mut files = Vec::new();
    for dir in ["src", "runtime/src", "tests", "docs"] {
        files.extend(files_under(dir));
    }
    // conformance/*.py only: not its virtual environment.
    let conformance = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("conformance");
    for entry in std::fs::read_dir(conformance).unwrap() {
        let name = entry.unwrap().file_name().to_string_lossy().into_owned();
        if name.ends_with(".py") {
            let path = format!("conformance/{name}");
            files.push((path.clone(), read(&path)));
        }
    }
    files.push(("README.md".to_string(), read("README.md")));
    let problems: Vec<String> = files
        .iter()
        .flat_map(|(path, text)| citation_problems(path, text, &anchors))
        .collect();
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn the_citation_check_finds_what_points_nowhere() {
    let anchors = anchors();
    let check = |text: &str| citation_problems("x.rs", text, &anchors);
    for fine in [
        "// docs/upstream.md \u{a7}6.2",
        "/// (docs/upstream.md \u{a7}2.2, \u{a7}2.3; R-A01)",
        "//! the drift (docs/upstream.md\n//! \u{a7}5.5\u{2013}5.7, R-S02/R-S03)",
        "see [upstream.md](../upstream.md) R-S06, \u{a7}5.4 and \u{a7}6.4",
        "the syntax of language.md \u{a7}2.4",
    ] {
        assert_eq!(check(fine), Vec::<String>::new(), "{fine}");
    }
    assert_eq!(
        check("// the table of \u{a7}6.2"),
        ["x.rs:1: a bare \u{a7}6.2 (write docs/upstream.md \u{a7}6.2)"]
    );
    assert_eq!(
        check("// reference \u{a7}7, R-M02"),
        ["x.rs:1: a bare \u{a7}7 (write docs/upstream.md \u{a7}7)"]
    );
    assert_eq!(
        check("// docs/upstream.md \u{a7}6.9"),
        ["x.rs:1: docs/upstream.md has no section 6.9"]
    );
    assert_eq!(
        check("// notes.md \u{a7}1"),
        ["x.rs:1: \u{a7}1 of notes.md, which is not a file under docs/"]
    );
    assert_eq!(
        check(concat!("// (R-", "Q99)")),
        [concat!(
            "x.rs:1: rule R-",
            "Q99 is not defined in docs/upstream.md"
        )]
    );
    let internal = concat!("// ds_hf", "_rules.md R-S02");
    assert_eq!(
        check(internal),
        [concat!("x.rs:1: cites `ds_hf", "_rules`")]
    );
}
