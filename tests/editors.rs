//! The VS Code extension in editors/vscode builds from a clean copy, as docs/editors.md tells a
//! user to build it: `npm ci`, its own tests (the TextMate grammar against recipes/, the extension
//! loading its language client) and `npm run package`, which must give a .vsix holding the
//! manifest, the extension and the grammar.
//!
//! Needs npm (Node.js 20 or newer) and the npm registry, or a warm npm cache. Without npm the test
//! fails, so that a green run means the extension was built; `RECIPE_SKIP_NPM=1` skips it.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

const NPM: &str = if cfg!(windows) { "npm.cmd" } else { "npm" };

/// The entries the .vsix must hold (vsce puts the extension under `extension/`).
const VSIX_ENTRIES: &[&str] = &[
    "extension/package.json",
    "extension/extension.js",
    "extension/language-configuration.json",
    "extension/syntaxes/recipe.tmLanguage.json",
    "extension/node_modules/vscode-languageclient/package.json",
];

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// A scratch folder under the target directory, removed when dropped.
struct Scratch(PathBuf);

impl Scratch {
    fn new(name: &str) -> Scratch {
        let path =
            Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&path);
        std::fs::create_dir_all(&path).unwrap();
        Scratch(path)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Copies the folder `from` to `to`, leaving out what a build leaves (node_modules, .vsix).
fn copy_tree(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let name = entry.file_name();
        let name_str = name.to_string_lossy();
        if name_str == "node_modules" || name_str.ends_with(".vsix") {
            continue;
        }
        let kind = entry.file_type().unwrap();
        if kind.is_dir() {
            copy_tree(&entry.path(), &to.join(&name));
        } else if kind.is_file() {
            std::fs::copy(entry.path(), to.join(&name)).unwrap();
        }
    }
}

/// Runs `npm args...` in `dir`; panics with npm's output if it fails.
fn npm(dir: &Path, args: &[&str]) {
    let started = std::time::Instant::now();
    let out = Command::new(NPM)
        .args(args)
        .current_dir(dir)
        // The grammar tests read recipes/ and src/schema/blocks.rs from the repository.
        .env("RECIPE_ROOT", repo())
        .env("npm_config_update_notifier", "false")
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("npm {}: {e}", args.join(" ")));
    assert!(
        out.status.success(),
        "`npm {}` in {} failed ({}):\n--- stdout\n{}\n--- stderr\n{}",
        args.join(" "),
        dir.display(),
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    eprintln!("npm {}: {:.1?}", args.join(" "), started.elapsed());
}

fn npm_found() -> bool {
    Command::new(NPM)
        .arg("--version")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// The entry list of the zip file `path`, from `unzip -l` or else Python's zipfile module.
fn zip_listing(path: &Path) -> String {
    let listers: [(&str, &[&str]); 3] = [
        ("unzip", &["-l"]),
        ("python3", &["-m", "zipfile", "-l"]),
        ("python", &["-m", "zipfile", "-l"]),
    ];
    for (program, args) in listers {
        if let Ok(out) = Command::new(program).args(args).arg(path).output() {
            if out.status.success() {
                return String::from_utf8_lossy(&out.stdout).into_owned();
            }
        }
    }
    panic!(
        "cannot list {}: neither unzip nor python3 works",
        path.display()
    );
}

#[test]
fn the_vscode_extension_builds_from_a_clean_copy() {
    if !npm_found() {
        if std::env::var("RECIPE_SKIP_NPM").as_deref() == Ok("1") {
            eprintln!("skipped: npm not found");
            return;
        }
        panic!(
            "npm not found: this test builds the VS Code extension in editors/vscode and needs \
             Node.js 20 or newer with npm on PATH; set RECIPE_SKIP_NPM=1 to skip it"
        );
    }
    let scratch = Scratch::new("editors-vscode");
    let dir = scratch.0.join("vscode");
    copy_tree(&repo().join("editors/vscode"), &dir);
    assert!(
        dir.join("package-lock.json").is_file(),
        "editors/vscode/package-lock.json is missing: `npm ci` needs it"
    );

    // No install scripts: nothing the extension or its build needs runs one.
    npm(&dir, &["ci", "--ignore-scripts", "--no-audit", "--no-fund"]);
    npm(&dir, &["test"]);
    npm(&dir, &["run", "package"]);

    let vsix = dir.join("recipe.vsix");
    let bytes = std::fs::read(&vsix)
        .unwrap_or_else(|e| panic!("`npm run package` left no {}: {e}", vsix.display()));
    assert!(
        bytes.starts_with(b"PK\x03\x04"),
        "recipe.vsix is not a zip file"
    );
    let listing = zip_listing(&vsix);
    // unzip puts the name last on its line, Python's zipfile first: take the words that are
    // paths in the extension.
    let names: Vec<&str> = listing
        .split_whitespace()
        .filter(|word| word.starts_with("extension/"))
        .collect();
    for entry in VSIX_ENTRIES {
        assert!(
            names.contains(entry),
            "recipe.vsix has no {entry}; its entries:\n{listing}"
        );
    }
    // Only what the extension needs at run time: no tests, no build tools.
    for name in &names {
        assert!(
            !name.starts_with("extension/test/")
                && !name.starts_with("extension/node_modules/@vscode/vsce"),
            "recipe.vsix holds {name}, which the extension does not need"
        );
    }
    eprintln!(
        "recipe.vsix: {} bytes, {} entries",
        bytes.len(),
        names.len()
    );
}
