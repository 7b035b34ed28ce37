//! The docs cover the language: every block, key and call argument of the schema is in
//! docs/language.md, and every diagnostic code has a section in docs/diagnostics.md.

use recipe::schema::{LabelSpec, Ty, BLOCKS};

fn read(path: &str) -> String {
    std::fs::read_to_string(std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(path)).unwrap()
}

fn call_args(ty: &Ty, out: &mut Vec<String>) {
    if let Ty::Call(calls) = ty {
        for call in *calls {
            out.push(call.name.to_string());
            for arg in call.args {
                out.push(arg.name.to_string());
                call_args(&arg.ty, out);
            }
        }
    }
}

#[test]
fn language_reference_mentions_every_block_key_and_argument() {
    let doc = read("docs/language.md");
    let mut missing = Vec::new();
    for block in BLOCKS {
        let mut names = vec![block.name.to_string()];
        for key in block.keys {
            names.push(key.name.to_string());
            call_args(&key.ty, &mut names);
        }
        if let LabelSpec::Required {
            ty: Ty::Word(words),
            ..
        }
        | LabelSpec::Optional {
            ty: Ty::Word(words),
            ..
        } = block.label
        {
            names.extend(words.iter().map(|w| w.to_string()));
        }
        for name in names {
            if !doc.contains(&format!("`{name}`")) {
                missing.push(format!("{}: `{name}`", block.name));
            }
        }
    }
    assert!(
        missing.is_empty(),
        "docs/language.md does not mention:\n{}",
        missing.join("\n")
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
    for (code, name, _) in recipe::codes::all() {
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
