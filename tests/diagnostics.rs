//! Every diagnostic has a failing recipe under tests/diagnostics/ whose rendered output is a
//! snapshot (tests/snapshots/). Files are named after the code they demonstrate.

use std::collections::BTreeSet;
use std::path::Path;

use recipe::diagnostics::{render_human, to_json, Style};
use recipe::{check_source, Checked, SourceFile};

/// The native family (R11xx) is checked for the native target only (`--target native`).
fn check_for(file_name: &str, text: &str) -> Checked {
    if file_name.starts_with("R11") {
        let options = recipe::resolve::Options {
            native: true,
            ..Default::default()
        };
        recipe::check::check_source_with(text, &options)
    } else {
        check_source(text)
    }
}

fn render(path: &Path) -> (String, Vec<&'static str>) {
    let text = std::fs::read_to_string(path).unwrap();
    let file_name = path.file_name().unwrap().to_string_lossy().to_string();
    let name = format!("tests/diagnostics/{file_name}");
    let file = SourceFile::new(name, text);
    let checked = check_for(&file_name, &file.text);
    let mut out = String::new();
    for d in &checked.diagnostics {
        out.push_str(&render_human(d, &file, Style::Plain));
        out.push('\n');
    }
    out.push_str("--- json\n");
    for d in &checked.diagnostics {
        out.push_str(&serde_json::to_string(&to_json(d, &file)).unwrap());
        out.push('\n');
    }
    (out, checked.diagnostics.iter().map(|d| d.code).collect())
}

#[test]
fn rendered_diagnostics_match_snapshots() {
    insta::glob!("diagnostics/*.rcp", |path| {
        let (rendered, codes) = render(path);
        let stem = path.file_stem().unwrap().to_string_lossy().to_string();
        // `R0011-unknown-key.rcp` must report R0011.
        if let Some(code) = stem.split('-').next().filter(|c| c.starts_with('R')) {
            assert!(
                codes.contains(&code),
                "{stem} does not report {code}: {codes:?}"
            );
        }
        assert!(!codes.is_empty(), "{stem} reports nothing");
        insta::assert_snapshot!(rendered);
    });
}

#[test]
fn every_code_has_a_failing_recipe() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/diagnostics");
    let covered: BTreeSet<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().to_string())
        .filter_map(|n| n.split('-').next().map(str::to_string))
        .collect();
    for (code, name, _) in recipe::diagnostics::codes::all() {
        assert!(
            covered.contains(code),
            "no failing recipe for {code} ({name}) in tests/diagnostics/"
        );
    }
}

#[test]
fn codes_are_unique_and_well_formed() {
    let mut seen = BTreeSet::new();
    for (code, _, _) in recipe::diagnostics::codes::all() {
        assert!(
            code.len() == 5
                && code.starts_with('R')
                && code[1..].chars().all(|c| c.is_ascii_digit())
        );
        assert!(seen.insert(code), "{code} listed twice");
    }
}

#[test]
fn several_problems_are_all_reported_in_source_order() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/diagnostics/many-problems.rcp");
    let text = std::fs::read_to_string(path).unwrap();
    let checked = check_source(&text);
    let starts: Vec<usize> = checked
        .diagnostics
        .iter()
        .map(|d| d.primary.span.start)
        .collect();
    assert!(starts.len() >= 6, "{starts:?}");
    assert!(
        starts.windows(2).all(|w| w[0] <= w[1]),
        "not in source order: {starts:?}"
    );
}

#[test]
fn passing_neighbours_are_clean() {
    // tests/diagnostics/ok/R0101-….rcp is the failing recipe with the problem fixed.
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/diagnostics/ok");
    let mut count = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        let text = std::fs::read_to_string(&path).unwrap();
        let checked = check_for(&path.file_name().unwrap().to_string_lossy(), &text);
        assert!(
            checked.diagnostics.is_empty(),
            "{} is not clean: {:#?}",
            path.display(),
            checked.diagnostics
        );
        let failing = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/diagnostics")
            .join(path.file_name().unwrap());
        assert!(failing.exists(), "{} has no failing twin", path.display());
        count += 1;
    }
    assert!(count >= 8);
}

#[test]
fn every_rule_code_has_a_passing_neighbour() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/diagnostics/ok");
    let covered: BTreeSet<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().to_string())
        .filter_map(|n| n.split('-').next().map(str::to_string))
        .collect();
    // Codes from R0100 on are upstream rules: each has a neighbour that passes.
    for (code, name, _) in recipe::diagnostics::codes::all()
        .into_iter()
        .filter(|(c, _, _)| *c >= "R0100")
    {
        assert!(
            covered.contains(code),
            "no passing neighbour for {code} ({name}) in tests/diagnostics/ok/"
        );
    }
}

/// Every quick fix a finding carries (the editor's code actions) does what its title says: the
/// fixed recipe still parses and no longer reports that finding.
#[test]
fn every_fix_removes_its_finding() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/diagnostics");
    let mut applied = 0;
    let mut bringing = Vec::new();
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_none_or(|e| e != "rcp") {
            continue;
        }
        let name = path.file_name().unwrap().to_string_lossy().to_string();
        let text = std::fs::read_to_string(&path).unwrap();
        let checked = check_for(&name, &text);
        for d in &checked.diagnostics {
            for fix in &d.fixes {
                let mut edits = fix.edits.clone();
                edits.sort_by_key(|e| std::cmp::Reverse(e.span.start));
                let mut fixed = text.clone();
                for e in &edits {
                    fixed.replace_range(e.span.start..e.span.end, &e.text);
                }
                let after = check_for(&name, &fixed);
                assert!(
                    after.file.is_some(),
                    "{name}: `{}` breaks the syntax:\n{fixed}",
                    fix.title
                );
                assert!(
                    !after
                        .diagnostics
                        .iter()
                        .any(|a| a.code == d.code && a.message == d.message),
                    "{name}: `{}` leaves `{}`:\n{fixed}",
                    fix.title,
                    d.message
                );
                // And a rule's fix brings no error of a kind the recipe did not have (a schema
                // fix may: the rules, held back by the schema error, then run).
                if d.code < "R0100" {
                    applied += 1;
                    continue;
                }
                let before: BTreeSet<&str> = checked.diagnostics.iter().map(|x| x.code).collect();
                let new: Vec<&str> = after
                    .diagnostics
                    .iter()
                    .filter(|a| a.is_error() && !before.contains(a.code))
                    .map(|a| a.code)
                    .collect();
                if !new.is_empty() {
                    bringing.push(format!("{name}: `{}` brings {new:?}", fix.title));
                }
                applied += 1;
            }
        }
    }
    eprintln!("{applied} fixes applied");
    bringing.sort();
    assert_eq!(bringing, Vec::<String>::new());
    assert!(applied >= 10, "only {applied} fixes exercised");
}
