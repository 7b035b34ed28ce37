//! The docs' examples are tested: every ```` ```rcp ```` block of README.md and docs/**/*.md is
//! checked with the library, the `recipe` commands the docs show run with the built binary, and
//! the numbers the docs state about the code (the rule families' code ranges, the conformance
//! counts) are compared with it.
//!
//! An `rcp` block must check clean (no error, no warning; a note is allowed), unless its fence
//! line says otherwise, rustdoc-style, after `rcp`:
//!
//! - `expect=R0101,R0607`: the codes the block must produce, in any order (each code once, however
//!   often it is reported): exactly the codes of its errors and warnings, and a note's code only
//!   where it is listed (a block that shows a note lists it; notes it does not list are ignored).
//! - `fragment`: a partial recipe that shows one or a few blocks. It is checked after the blocks
//!   of [`MINIMAL`] it lacks (`recipe`, `model`, `data`, `batch`; a block is "there" when a line
//!   of the fragment starts with its keyword) are put in front of it. A block that has them all is
//!   not a fragment, and saying so fails the test.
//! - `native`: checked for the native runtime too (`--target native`: the R11xx refusals).
//!
//! Relative paths in the examples (data files, hostfiles, models) are read from the repository
//! root, where the docs' commands run (`data/spamassassin/train.jsonl`).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

use recipe::check::check_source_with;
use recipe::resolve::Options;
use recipe::schema::BLOCKS;
use recipe::Severity;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn read(path: &str) -> String {
    std::fs::read_to_string(root().join(path)).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// README.md and every markdown file under docs/, as paths from the repository root, sorted.
fn doc_files() -> Vec<String> {
    let mut out = vec!["README.md".to_string()];
    let mut stack = vec![root().join("docs")];
    let mut found = Vec::new();
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                stack.push(path);
            } else if path.extension().is_some_and(|e| e == "md") {
                let rel = path.strip_prefix(root()).unwrap();
                found.push(rel.to_string_lossy().replace('\\', "/"));
            }
        }
    }
    found.sort();
    out.extend(found);
    out
}

/// A fenced code block: the line of its opening fence (from 1), the fence's info string (`rcp
/// fragment expect=R0607`) and its text.
struct Block {
    line: usize,
    info: String,
    text: String,
}

/// The fenced code blocks of a markdown text.
fn blocks(text: &str) -> Vec<Block> {
    let mut out = Vec::new();
    let mut open: Option<Block> = None;
    for (n, line) in text.lines().enumerate() {
        let fence = line.trim_start().strip_prefix("```");
        match (&mut open, fence) {
            (None, Some(info)) => {
                open = Some(Block {
                    line: n + 1,
                    info: info.trim().to_string(),
                    text: String::new(),
                })
            }
            (Some(_), Some(_)) => out.extend(open.take()),
            (Some(block), None) => {
                block.text.push_str(line);
                block.text.push('\n');
            }
            (None, None) => {}
        }
    }
    assert!(open.is_none(), "a code block is never closed");
    out
}

/// What an `rcp` fence line says about its block.
#[derive(Debug, Default, PartialEq)]
struct Annotations {
    expect: BTreeSet<String>,
    fragment: bool,
    native: bool,
}

/// The annotations of an info string that starts with `rcp`; `None` for another language.
fn annotations(info: &str) -> Option<Result<Annotations, String>> {
    let mut words = info.split_whitespace();
    if words.next() != Some("rcp") {
        return None;
    }
    let mut a = Annotations::default();
    for word in words {
        match word {
            "fragment" => a.fragment = true,
            "native" => a.native = true,
            _ => match word.strip_prefix("expect=") {
                Some(codes) if !codes.is_empty() => {
                    a.expect.extend(codes.split(',').map(str::to_string))
                }
                _ => return Some(Err(format!("unknown annotation `{word}`"))),
            },
        }
    }
    Some(Ok(a))
}

/// What a fragment is completed with: each block it lacks, put in front of it.
const MINIMAL: &[(&str, &str)] = &[
    ("recipe", "recipe \"doc\""),
    (
        "model",
        "model bert { from = \"prajjwal1/bert-tiny\", task = classify(labels: 2) }",
    ),
    ("data", "data { train = \"data/spamassassin/train.jsonl\" }"),
    ("batch", "batch { micro = 8 }"),
];

/// The block keywords a recipe text uses: the first word of each line that starts at column 1.
fn block_names(text: &str) -> BTreeSet<&str> {
    text.lines()
        .filter_map(|l| {
            l.split(|c: char| c.is_whitespace() || c == '{' || c == '"')
                .next()
        })
        .filter(|w| BLOCKS.iter().any(|b| b.name == *w))
        .collect()
}

/// A fragment with the blocks of [`MINIMAL`] it lacks in front; `None` when it lacks none.
fn complete(fragment: &str) -> Option<String> {
    let present = block_names(fragment);
    let missing: Vec<&str> = MINIMAL
        .iter()
        .filter(|(name, _)| !present.contains(name))
        .map(|(_, text)| *text)
        .collect();
    (!missing.is_empty()).then(|| format!("{}\n{fragment}", missing.join("\n")))
}

/// What is wrong with one `rcp` block, checked as its annotations say.
fn example_problem(a: &Annotations, text: &str) -> Option<String> {
    let source = if a.fragment {
        match complete(text) {
            Some(s) => s,
            None => return Some("`fragment`, but it has every block a recipe needs".into()),
        }
    } else {
        text.to_string()
    };
    let options = Options {
        base_dir: Some(root()),
        native: a.native,
        ..Options::default()
    };
    let checked = check_source_with(&source, &options);
    let got: BTreeSet<String> = checked
        .diagnostics
        .iter()
        .filter(|d| d.severity != Severity::Note || a.expect.contains(d.code))
        .map(|d| d.code.to_string())
        .collect();
    (got != a.expect).then(|| {
        let found: Vec<String> = checked
            .diagnostics
            .iter()
            .map(|d| format!("    {} {}: {}", d.code, d.severity, d.message))
            .collect();
        format!(
            "expected {:?}, got {:?}\n{}",
            a.expect,
            got,
            found.join("\n")
        )
    })
}

#[test]
fn every_rcp_example_in_the_docs_checks_as_annotated() {
    let mut problems = Vec::new();
    let mut count = 0;
    for path in doc_files() {
        let text = read(&path);
        for block in blocks(&text) {
            let at = format!("{path}:{} (```{})", block.line, block.info);
            match annotations(&block.info) {
                None => {}
                Some(Err(e)) => problems.push(format!("{at}: {e}")),
                Some(Ok(a)) => {
                    count += 1;
                    if let Some(p) = example_problem(&a, &block.text) {
                        problems.push(format!("{at}: {p}"));
                    }
                }
            }
        }
    }
    assert!(
        problems.is_empty(),
        "{} of {count} rcp examples:\n{}",
        problems.len(),
        problems.join("\n")
    );
    // The docs hold well over a hundred: finding few means the extraction broke.
    assert!(count >= 140, "only {count} rcp examples found");
}

#[test]
fn the_example_check_finds_what_is_wrong() {
    let ann = |info: &str| annotations(info).unwrap().unwrap();
    assert_eq!(annotations("sh"), None);
    assert_eq!(annotations("rcpx"), None);
    assert!(matches!(annotations("rcp expect"), Some(Err(_))));
    assert!(matches!(annotations("rcp fragmnet"), Some(Err(_))));
    let a = ann("rcp fragment expect=R0101,R0607 native");
    assert!(a.fragment && a.native);
    assert_eq!(a.expect, BTreeSet::from(["R0101".into(), "R0607".into()]));
    // A fragment gets the blocks it lacks, and only those.
    let batch = "batch {\n  micro = 16\n}\n";
    let done = complete(batch).unwrap();
    assert!(done.starts_with("recipe \"doc\"\nmodel bert"));
    assert_eq!(done.matches("batch {").count(), 1);
    assert_eq!(example_problem(&ann("rcp fragment"), batch), None);
    // Without `fragment` the missing blocks are errors.
    assert!(example_problem(&ann("rcp"), batch)
        .unwrap()
        .contains("R0016"));
    // A complete recipe is no fragment.
    let full = format!(
        "{}\n",
        MINIMAL.iter().map(|m| m.1).collect::<Vec<_>>().join("\n")
    );
    assert_eq!(example_problem(&ann("rcp"), &full), None);
    assert!(example_problem(&ann("rcp fragment"), &full).is_some());
    // The expected codes must be exactly the ones found.
    let mismatch = "batch { micro = 16, global = 20 }\n";
    assert_eq!(
        example_problem(&ann("rcp fragment expect=R0101"), mismatch),
        None
    );
    assert!(example_problem(&ann("rcp fragment"), mismatch).is_some());
    assert!(example_problem(&ann("rcp fragment expect=R0101,R0102"), mismatch).is_some());
    // A syntax error in an example is found like any other.
    assert!(example_problem(&ann("rcp"), "train { precision bf16 }\n").is_some());
}

// ---- the rule families' code ranges -----------------------------------------------------------

/// The first and last code of each rule family (`src/rules/NAME.rs`), the native one included.
fn family_ranges() -> Vec<(&'static str, &'static str, &'static str)> {
    type Codes = &'static [(&'static str, &'static str, &'static str)];
    let mut families: Vec<(&str, Codes)> = recipe::rules::FAMILIES
        .iter()
        .map(|f| (f.name, f.codes))
        .collect();
    families.push(("native", recipe::rules::native::CODES));
    families
        .into_iter()
        .map(|(name, codes)| {
            let first = codes.iter().map(|c| c.0).min().unwrap();
            let last = codes.iter().map(|c| c.0).max().unwrap();
            (name, first, last)
        })
        .collect()
}

/// The code ranges `R0501–R0509` in `text` that follow a family's source file (`` (`src/rules/
/// precision.rs`, R0501–R0509) ``), or that start at a family's first code: such a range is taken
/// for the whole family (`R1101–R1106`, the native refusals), so a list of some of a family's
/// codes names them one by one. Each with its line, the family, its start and its end.
fn stated_ranges<'t>(
    text: &'t str,
    families: &[(&'static str, &'static str, &'static str)],
) -> Vec<(usize, &'static str, &'t str, &'t str)> {
    let mut out = Vec::new();
    for (n, line) in text.lines().enumerate() {
        for (at, _) in line.match_indices('–') {
            let (before, after) = (&line[..at], &line[at + '–'.len_utf8()..]);
            let start = before.get(before.len().saturating_sub(5)..).unwrap_or("");
            let end = after.get(..5).unwrap_or("");
            let is_code = |s: &str| {
                s.len() == 5 && s.starts_with('R') && s[1..].chars().all(|c| c.is_ascii_digit())
            };
            if !is_code(start) || !is_code(end) {
                continue;
            }
            for (name, first, _) in families {
                let file = format!("`src/rules/{name}.rs`, ");
                if start == *first || before.ends_with(&format!("{file}{start}")) {
                    out.push((n + 1, *name, start, end));
                }
            }
        }
    }
    out
}

#[test]
fn the_docs_state_each_rule_familys_code_range() {
    let families = family_ranges();
    let mut problems = Vec::new();
    let mut stated = BTreeSet::new();
    for path in doc_files() {
        let text = read(&path);
        for (line, name, start, end) in stated_ranges(&text, &families) {
            let (_, first, last) = families.iter().find(|f| f.0 == name).unwrap();
            if (start, end) != (*first, *last) {
                problems.push(format!(
                    "{path}:{line}: the {name} family is {first}–{last}, not {start}–{end}"
                ));
            }
            if text.contains(&format!("`src/rules/{name}.rs`, {start}")) {
                stated.insert(name);
            }
        }
    }
    // Each family with a page under docs/rules/ names its file and range there; batch and steps
    // are documented in docs/diagnostics.md itself.
    for (name, _, _) in &families {
        if !["batch", "steps"].contains(name) && !stated.contains(name) {
            problems.push(format!(
                "no page says (`src/rules/{name}.rs`, FIRST–LAST) for the {name} family"
            ));
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn the_range_check_finds_a_stale_range() {
    let families = family_ranges();
    let (_, first, last) = *families.iter().find(|f| f.0 == "zero").unwrap();
    let text = format!("ZeRO (`src/rules/zero.rs`, {first}–R0600) and\nalso {first}–{last}.");
    assert_eq!(
        stated_ranges(&text, &families),
        [(1, "zero", first, "R0600"), (2, "zero", first, last)]
    );
}

// ---- the commands the docs show -----------------------------------------------------------------

/// The `recipe` commands of the docs' shell blocks that run offline in a moment from the
/// repository root, with the exit code the docs give them (1: a check that finds errors, or
/// `recipe steps` where HF and DeepSpeed disagree).
const RUN: &[(&str, &str, i32)] = &[
    ("README.md", "recipe check recipes/cls.rcp", 0),
    ("docs/commands.md", "recipe check recipes/*.rcp", 0),
    (
        "docs/commands.md",
        "recipe check --gpus 8 --nodes 2 recipes/cls.rcp",
        0,
    ),
    // The step drift of accelerate 1.7 (R0201) is an error.
    (
        "docs/commands.md",
        "recipe check --target accelerate=1.7.0 recipes/cls.rcp",
        1,
    ),
    (
        "docs/commands.md",
        "recipe check --set batch.micro=8 recipes/cls.rcp",
        0,
    ),
    ("README.md", "recipe explain recipes/cls.rcp", 0),
    (
        "docs/commands.md",
        "recipe explain recipes/cls.rcp batch.global --gpus 4",
        0,
    ),
    (
        "docs/commands.md",
        "recipe steps recipes/cls.rcp --versions transformers=4.26.0",
        1,
    ),
    (
        "docs/commands.md",
        "recipe check --target native recipes/cls.rcp",
        0,
    ),
    ("docs/commands.md", "recipe fmt --check recipes/*.rcp", 0),
    ("docs/editors.md", "recipe lsp --help", 0),
    (
        "docs/own-model-and-data.md",
        "recipe check docs/examples/own-csv.rcp",
        0,
    ),
    (
        "docs/own-model-and-data.md",
        "recipe check --target native docs/examples/own-csv.rcp",
        0,
    ),
    (
        "docs/own-model-and-data.md",
        "recipe explain docs/examples/own-csv.rcp",
        0,
    ),
];

/// The others, and why they are not run here.
const NOT_RUN: &[(&str, &str)] = &[
    ("recipe check --format json broken.rcp", "the broken.rcp of docs/diagnostics-json.md: run by json_example_is_what_check_prints"),
    ("recipe explain --lr-csv lr.csv recipes/cls.rcp", "writes lr.csv into the tree"),
    ("recipe build recipes/cls.rcp -o build/cls", "writes into the tree"),
    ("recipe build --target native recipes/spam.rcp", "writes into the tree"),
    ("recipe build --target native -o build/spam recipes/spam.rcp", "writes into the tree"),
    ("recipe diff a/recipe.lock b/recipe.lock", "two builds' files, not in the tree"),
    ("recipe check ds_config.json --args training_args.json --gpus 4", "a config pair of the reader's"),
    ("recipe check ds_config.json --args training_args.json --gpus 4 --samples 20000", "a config pair of the reader's"),
    ("recipe check ds_config.json --args launch.sh", "a config pair of the reader's"),
    ("recipe check ds_config.json -- --per_device_train_batch_size 8 --learning_rate 2e-5 --fp16", "a config of the reader's"),
    ("recipe import ds_config.json --args training_args.json --model bert-base-uncased --train train.jsonl", "a config pair of the reader's"),
    ("recipe import ds_config.json --args training_args.json \\", "a config pair of the reader's"),
    ("recipe verify recipes/", "Python"),
    ("recipe run recipes/spam.rcp", "training"),
    ("recipe run recipes/cls.rcp --gpus 4", "training"),
    ("recipe run recipes/cls.rcp --gpus 2 --nodes 2 --node-rank K --master node0:29500", "one process per node: tests/nodes.rs runs two on one machine"),
    ("recipe run docs/examples/own-csv.rcp", "training (docs/own-model-and-data.md shows a real run)"),
    ("recipe run build/spam/plan.json", "training"),
    ("recipe run recipes/spam.rcp --stop-after 20", "training"),
    ("recipe run recipes/spam.rcp --resume recipes/out/spam/checkpoint-20", "training"),
    ("recipe fmt recipes/cls.rcp", "rewrites a file of the tree"),
    ("recipe lsp", "a server on stdin"),
    ("recipe run recipes/spam.rcp --device cuda", "a GPU"),
    (
        "recipe run recipes/spam.rcp --device cuda --profile",
        "a GPU",
    ),
    ("recipe run recipes/spam.rcp --device auto", "training"),
    ("recipe kernels", "NVRTC: scripts/check-kernels.sh runs it in .ci/run"),
    ("recipe check spam.rcp", "docs/language.md's complete example saved by the reader (checked as an rcp block)"),
    ("recipe check --format json spam.rcp", "docs/language.md's complete example saved by the reader (checked as an rcp block)"),
    ("recipe fmt spam.rcp", "docs/language.md's complete example saved by the reader"),
];

/// The `recipe …` command lines of the shell blocks of `text` (`cargo run --release -- …` read
/// as `recipe …`), without their trailing comments.
fn shell_commands(text: &str) -> Vec<String> {
    blocks(text)
        .into_iter()
        .filter(|b| b.info == "sh")
        .flat_map(|b| {
            b.text
                .lines()
                .map(|l| {
                    let l = l.trim();
                    match l.strip_prefix("cargo run --release -- ") {
                        Some(rest) => format!("recipe {rest}"),
                        None => l.to_string(),
                    }
                })
                .filter(|l| l.starts_with("recipe "))
                .map(|l| match l.find("  #") {
                    Some(i) => l[..i].trim_end().to_string(),
                    None => l.to_string(),
                })
                .collect::<Vec<_>>()
        })
        .collect()
}

/// `dir/*.ext` expanded to the files of `dir` that end with `.ext`, sorted; other words as they are.
fn expand(word: &str) -> Vec<String> {
    let Some((dir, pattern)) = word.rsplit_once('/') else {
        return vec![word.to_string()];
    };
    let Some(suffix) = pattern.strip_prefix('*') else {
        return vec![word.to_string()];
    };
    let mut files: Vec<String> = std::fs::read_dir(root().join(dir))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(suffix))
        .map(|n| format!("{dir}/{n}"))
        .collect();
    files.sort();
    assert!(!files.is_empty(), "{word} matches nothing");
    files
}

fn run_recipe(args: &[String], dir: &Path) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_recipe"))
        .args(args)
        .current_dir(dir)
        .env("RECIPE_SCAN_CACHE", "0")
        .output()
        .unwrap()
}

#[test]
fn the_docs_commands_run_as_the_docs_say() {
    let mut problems = Vec::new();
    // Every command shown is either run here or listed as not run.
    for path in doc_files() {
        for command in shell_commands(&read(&path)) {
            let run = RUN.iter().any(|(_, c, _)| *c == command);
            let not_run = NOT_RUN.iter().any(|(c, _)| *c == command);
            if !run && !not_run {
                problems.push(format!(
                    "{path}: `{command}` is neither run by this test nor listed as not run"
                ));
            }
        }
    }
    for (path, command, expected) in RUN {
        if !shell_commands(&read(path)).iter().any(|c| c == command) {
            problems.push(format!("{path} no longer shows `{command}`"));
            continue;
        }
        let args: Vec<String> = command
            .split_whitespace()
            .skip(1)
            .flat_map(expand)
            .collect();
        let out = run_recipe(&args, &root());
        if out.status.code() != Some(*expected) {
            problems.push(format!(
                "{path}: `{command}` exits with {:?}, not {expected}\n{}",
                out.status.code(),
                String::from_utf8_lossy(&out.stderr)
            ));
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn json_example_is_what_check_prints() {
    // docs/diagnostics-json.md: the broken.rcp it shows, the lines `recipe check --format json
    // broken.rcp` prints for it, and the first of them pretty-printed.
    let doc = read("docs/diagnostics-json.md");
    let all = blocks(&doc);
    let after = |marker: &str, info: &str| {
        let line = doc[..doc.find(marker).unwrap_or_else(|| panic!("no {marker:?}"))]
            .lines()
            .count();
        all.iter()
            .find(|b| b.line > line && b.info == info)
            .unwrap_or_else(|| panic!("no ```{info} block after {marker:?}"))
    };
    let recipe = &after("A small broken recipe, `broken.rcp`:", "text").text;
    let lines = &after("`recipe check --format json broken.rcp` prints", "json").text;
    let pretty = &after("The first line, pretty-printed:", "json").text;
    let dir = std::env::temp_dir().join(format!("recipe-doc-json-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("broken.rcp"), recipe).unwrap();
    let args: Vec<String> = ["check", "--format", "json", "broken.rcp"]
        .map(String::from)
        .to_vec();
    let out = run_recipe(&args, &dir);
    std::fs::remove_dir_all(&dir).ok();
    assert_eq!(out.status.code(), Some(1));
    let stdout = String::from_utf8(out.stdout).unwrap();
    assert_eq!(&stdout, lines, "docs/diagnostics-json.md's example output");
    assert!(doc.contains(&format!(
        "prints {} lines and exits with 1",
        ["no", "one", "two", "three", "four", "five"][stdout.lines().count().min(5)]
    )));
    let first: serde_json::Value = serde_json::from_str(stdout.lines().next().unwrap()).unwrap();
    let shown: serde_json::Value = serde_json::from_str(pretty).unwrap();
    assert_eq!(first, shown, "the pretty-printed first line");
}

// ---- conformance/README.md's counts -------------------------------------------------------------

#[test]
fn conformance_readme_counts_the_rejected_cases_of_the_summary() {
    let summary: serde_json::Value =
        serde_json::from_str(&read("conformance/fixtures/summary.json")).unwrap();
    let rejected = summary["rejected"].as_array().unwrap().len();
    let readme = read("conformance/README.md");
    for stated in [
        format!("`corpus-rejected/NNN-<slug>{{.rcp,.base.rcp,.json}}` ({rejected})"),
        format!("`corpus-rejected/` holds {rejected} recipes"),
    ] {
        assert!(
            readme.contains(&stated),
            "conformance/README.md should say {stated:?} (conformance/fixtures/summary.json has {rejected} rejected cases)"
        );
    }
    // The top-level README: how many, and for how many rules.
    let rules: BTreeSet<&str> = summary["rejected"]
        .as_array()
        .unwrap()
        .iter()
        .map(|case| case["code"].as_str().unwrap())
        .collect();
    let top = read("README.md")
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ");
    let stated = format!(
        "{rejected} recipes our checker rejects ({} rules)",
        rules.len()
    );
    assert!(top.contains(&stated), "README.md should say {stated:?}");
}

// ---- docs/diagnostics.md's account of severities ---------------------------------------------

/// The codes of `text` between `from` and `to` (the first `to` after `from`).
fn codes_between<'t>(text: &'t str, from: &str, to: &str) -> BTreeSet<&'t str> {
    let start = text.find(from).unwrap_or_else(|| panic!("no {from:?}")) + from.len();
    let end = start
        + text[start..]
            .find(to)
            .unwrap_or_else(|| panic!("no {to:?}"));
    text[start..end]
        .split(|c: char| !c.is_ascii_alphanumeric())
        .filter(|w| {
            w.len() == 5 && w.starts_with('R') && w[1..].chars().all(|c| c.is_ascii_digit())
        })
        .collect()
}

#[test]
fn the_severities_docs_diagnostics_states_are_the_ones_reported() {
    // docs/diagnostics.md lists the codes that are always warnings, always notes, or either in
    // some cases; every other code is always an error. Every failing recipe of tests/diagnostics/
    // (each code has one), its fixed neighbour and every rcp example of the docs must agree.
    let doc = read("docs/diagnostics.md");
    let doc = doc.split_whitespace().collect::<Vec<_>>().join(" ");
    let warnings = codes_between(&doc, "are always warnings:", "are always notes:");
    let notes = codes_between(&doc, "are always notes:", "are warnings in some cases");
    let mixed = codes_between(&doc, "are warnings in some cases", "Each code's section");
    let words = [
        "", "One", "Two", "Three", "Four", "Five", "Six", "Seven", "Eight", "Nine", "Ten",
    ];
    let word = |n: usize| {
        words.get(n).map(|w| w.to_string()).unwrap_or_else(|| {
            let tens = ["", "", "Twenty", "Thirty"][n / 10];
            let ones = [
                "", "-one", "-two", "-three", "-four", "-five", "-six", "-seven", "-eight", "-nine",
            ];
            format!("{tens}{}", ones[n % 10])
        })
    };
    assert!(doc.contains(&format!("{} are always warnings:", word(warnings.len()))));
    assert!(doc.contains(&format!("{} are always notes:", word(notes.len()))));

    let mut texts: Vec<(String, String, Options)> = Vec::new();
    for dir in ["tests/diagnostics", "tests/diagnostics/ok"] {
        for entry in std::fs::read_dir(root().join(dir)).unwrap() {
            let path = entry.unwrap().path();
            if path.extension().is_some_and(|e| e == "rcp") {
                let name = path.file_name().unwrap().to_string_lossy().into_owned();
                // As tests/diagnostics.rs checks them: paths from the repository root, the
                // native family for the R11xx recipes only.
                let options = Options {
                    base_dir: Some(root()),
                    native: name.starts_with("R11"),
                    ..Options::default()
                };
                let text = std::fs::read_to_string(&path).unwrap();
                texts.push((format!("{dir}/{name}"), text, options));
            }
        }
    }
    for path in doc_files() {
        for block in blocks(&read(&path)) {
            if let Some(Ok(a)) = annotations(&block.info) {
                let text = if a.fragment {
                    complete(&block.text).unwrap_or(block.text)
                } else {
                    block.text
                };
                let options = Options {
                    base_dir: Some(root()),
                    native: a.native,
                    ..Options::default()
                };
                texts.push((format!("{path}:{}", block.line), text, options));
            }
        }
    }
    let mut problems = BTreeSet::new();
    let mut seen = BTreeSet::new();
    for (at, text, options) in &texts {
        for d in check_source_with(text, options).diagnostics {
            let code = d.code;
            seen.insert((code, d.severity.to_string()));
            let listed = match d.severity {
                Severity::Warning => warnings.contains(code) || mixed.contains(code),
                Severity::Note => notes.contains(code) || mixed.contains(code),
                _ => !warnings.contains(code) && !notes.contains(code),
            };
            if !listed {
                problems.insert(format!(
                    "{code} is reported as a {} ({at}), which docs/diagnostics.md does not say",
                    d.severity
                ));
            }
        }
    }
    for code in &warnings {
        if !seen.contains(&(*code, "warning".to_string())) {
            problems.insert(format!(
                "{code} is listed as a warning and never reported as one"
            ));
        }
    }
    for code in &notes {
        if !seen.contains(&(*code, "note".to_string())) {
            problems.insert(format!(
                "{code} is listed as a note and never reported as one"
            ));
        }
    }
    let problems: Vec<String> = problems.into_iter().collect();
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}
