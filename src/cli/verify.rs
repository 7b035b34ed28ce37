//! `recipe verify DIR`: runs the conformance harness (conformance/, embedded in the binary)
//! against the transformers / accelerate / DeepSpeed installed for the user's Python, for every
//! recipe in DIR: the real TrainingArguments, HF's fill/match, DeepSpeed's config validation and
//! the real schedulers, compared with what `recipe` emits and predicts. Says plainly when Python
//! or the libraries are missing.

use std::path::{Path, PathBuf};
use std::process::Command;

use super::{FAILED, OK, USAGE};

const MAKE_CASES: &str = include_str!("../../conformance/make_cases.py");
const HARNESS: &str = include_str!("../../conformance/harness.py");
const SUMMARY: &str = include_str!("../../conformance/summary.py");

/// The interpreter: `$RECIPE_PYTHON`, else `python3`.
fn python() -> String {
    std::env::var("RECIPE_PYTHON").unwrap_or_else(|_| "python3".into())
}

pub fn run(dir: &Path) -> i32 {
    if !dir.is_dir() {
        eprintln!("error: `{}` is not a directory of recipes", dir.display());
        return USAGE;
    }
    let recipes = std::fs::read_dir(dir)
        .map(|d| {
            d.filter_map(Result::ok)
                .filter(|e| e.path().extension().is_some_and(|x| x == "rcp"))
                .count()
        })
        .unwrap_or(0);
    if recipes == 0 {
        eprintln!(
            "error: `{}` has no .rcp file: nothing to verify",
            dir.display()
        );
        return USAGE;
    }
    let py = python();
    // The installed releases, read without importing them a second time (DeepSpeed logs to
    // stdout on import, hence the marker).
    let probe = Command::new(&py)
        .args([
            "-c",
            "import torch, transformers, accelerate, deepspeed\n\
             from importlib.metadata import version as v\n\
             print('RECIPE-STACK transformers=' + v('transformers') + ',accelerate=' + \
             v('accelerate') + ',deepspeed=' + v('deepspeed'))",
        ])
        .output();
    match probe {
        Err(e) => {
            eprintln!(
                "error: recipe verify needs Python 3 (`{py}` could not be run: {e}); set RECIPE_PYTHON to an interpreter with torch, transformers, accelerate and deepspeed (conformance/setup.sh makes one)"
            );
            return USAGE;
        }
        Ok(o) if !o.status.success() => {
            let why = String::from_utf8_lossy(&o.stderr);
            let last = why.lines().last().unwrap_or("").trim();
            eprintln!(
                "error: recipe verify needs torch, transformers, accelerate and deepspeed importable by `{py}` ({last}); set RECIPE_PYTHON to an interpreter that has them (conformance/setup.sh makes one)"
            );
            return USAGE;
        }
        Ok(_) => {}
    }
    let stack = probe
        .ok()
        .and_then(|o| {
            String::from_utf8_lossy(&o.stdout)
                .lines()
                .find_map(|l| l.strip_prefix("RECIPE-STACK ").map(str::to_string))
        })
        .unwrap_or_default();
    if !stack.is_empty() {
        eprintln!(
            "verify: building for the installed {} (a library a recipe does not pin gets the installed release)",
            stack.replace(',', ", ").replace('=', " ")
        );
    }
    let work = std::env::temp_dir().join(format!("recipe-verify-{}", std::process::id()));
    let scripts = work.join("conformance");
    let setup = (|| -> std::io::Result<PathBuf> {
        std::fs::create_dir_all(&scripts)?;
        std::fs::create_dir_all(work.join("none"))?;
        std::fs::write(scripts.join("make_cases.py"), MAKE_CASES)?;
        std::fs::write(scripts.join("harness.py"), HARNESS)?;
        std::fs::write(scripts.join("summary.py"), SUMMARY)?;
        std::env::current_exe()
    })();
    let exe = match setup {
        Ok(exe) => exe,
        Err(e) => {
            eprintln!("error: cannot prepare `{}`: {e}", work.display());
            return USAGE;
        }
    };
    let step = |args: &[&str]| -> bool {
        Command::new(&py)
            .args(args)
            .status()
            .map(|s| s.success())
            .unwrap_or(false)
    };
    let s = |p: &Path| p.to_string_lossy().into_owned();
    let build = work.join("build");
    let fixtures = work.join("fixtures");
    // Every recipe that builds is run, even when another one does not: make_cases reports
    // those, and the exit status says so.
    let built = step(&[
        &s(&scripts.join("make_cases.py")),
        "--recipe",
        &s(&exe),
        "--corpus",
        &s(dir),
        "--rejected",
        &s(&work.join("none")),
        "--out",
        &s(&build),
        "--stack",
        &stack,
    ]);
    let ran = step(&[
        &s(&scripts.join("harness.py")),
        &s(&build.join("cases")),
        &s(&fixtures.join("corpus")),
        "--json-summary",
    ]);
    let agreed = ran && step(&[&s(&scripts.join("summary.py")), &s(&fixtures), "--strict"]);
    let skipped: Vec<serde_json::Value> = std::fs::read_to_string(build.join("skipped.json"))
        .ok()
        .and_then(|t| serde_json::from_str(&t).ok())
        .unwrap_or_default();
    for x in &skipped {
        eprintln!(
            "verify: skipped {}: {}",
            x["recipe"].as_str().unwrap_or("?"),
            x["why"].as_str().unwrap_or("?")
        );
    }
    let ok = built && agreed;
    if !built {
        eprintln!("verify: some recipes could not be built (listed above by make_cases)");
    }
    if ran && !agreed {
        eprintln!("verify: the real stack disagrees with recipe on some recipes (listed above)");
    }
    eprintln!("verify: cases and fixtures kept in {}", work.display());
    if ok {
        OK
    } else {
        FAILED
    }
}
