//! Helpers shared by the end-to-end tests (`run.rs`, `mixed.rs`, `data_files.rs`): a scratch
//! workspace with a tiny seeded BERT, the real MiniLM tokenizer and 48 committed SpamAssassin
//! rows; the CLI run in it; the metrics and weights a run leaves.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;

pub fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The `.rcp` files of a repository folder (`recipes`, `conformance/corpus`, …), sorted; only
/// recipes, whatever else a run left beside them.
pub fn rcp_files(dir: &str) -> Vec<PathBuf> {
    let dir = root().join(dir);
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "rcp"))
        .collect();
    files.sort();
    files
}

/// A parsed recipe's tree as JSON, to compare two texts' structure.
pub fn shape(text: &str) -> Value {
    serde_json::to_value(recipe::syntax::parse(text).unwrap()).unwrap()
}

/// Whether the tests run under CI (`CI` set, as CI services set it, and not `false` or `0`).
pub fn under_ci() -> bool {
    matches!(std::env::var("CI").as_deref(), Ok(v) if !v.is_empty() && v != "false" && v != "0")
}

/// The plain Python 3 a test runs a repository script with: `RECIPE_PYTHON`, else the
/// conformance venv's (`conformance/.venv/bin/python`, from conformance/setup.sh), else
/// `python3` on the PATH. When none runs: a failure under CI (a test must not pass there
/// without running), else `None` after saying on stderr that `what` was skipped.
pub fn python(what: &str) -> Option<PathBuf> {
    let py = match std::env::var_os("RECIPE_PYTHON") {
        Some(p) => PathBuf::from(p),
        None => {
            let venv = root().join("conformance/.venv/bin/python");
            if venv.is_file() {
                venv
            } else {
                PathBuf::from("python3")
            }
        }
    };
    let runs = Command::new(&py)
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if runs {
        return Some(py);
    }
    let why = format!(
        "{what} needs Python 3, and `{}` does not run (set RECIPE_PYTHON)",
        py.display()
    );
    assert!(
        !under_ci(),
        "{why}; CI is set, so this fails instead of skipping"
    );
    eprintln!("SKIPPED: {why}");
    None
}

pub fn recipe_in(dir: &Path, args: &[&str]) -> Output {
    recipe_in_env(dir, &[], args)
}

/// [`recipe_in`] with `env` set too.
pub fn recipe_in_env(dir: &Path, env: &[(&str, &str)], args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_recipe"))
        .args(args)
        .current_dir(dir)
        .env("NO_COLOR", "1")
        .env("RECIPE_CACHE", dir.join("cache"))
        // What the developer's environment may set that changes a run's records.
        .env_remove("RECIPE_PEAK_TFLOPS")
        .envs(env.iter().copied())
        .output()
        .unwrap()
}

pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// The tiny BERT of the run tests (also scripts/gpu-check.sh's): random init from this config.
pub const CONFIG: &str = include_str!("../../runtime/tests/fixtures/tiny-bert/config.json");

/// A test's scratch directory: removed when the test passes, kept (for a look) when it fails.
pub struct Scratch(pub PathBuf);

impl std::ops::Deref for Scratch {
    type Target = Path;
    fn deref(&self) -> &Path {
        &self.0
    }
}

impl AsRef<Path> for Scratch {
    fn as_ref(&self) -> &Path {
        &self.0
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}

/// A fresh directory with the tiny model, the tokenizer, the data and a recipe whose extra
/// lines are `extra` (appended, so they override nothing but add blocks). Its name has a
/// per-process counter: two files' tests may take the same `name` side by side (tests/suite.rs).
pub fn workspace(name: &str, recipe: &str) -> Scratch {
    static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let dir = std::env::temp_dir().join(format!("recipe-run-{name}-{}-{n}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("config.json"), CONFIG).unwrap();
    let fixtures = root().join("runtime/tests/fixtures");
    std::fs::copy(
        fixtures.join("tokenizer/tokenizer.json"),
        dir.join("tokenizer.json"),
    )
    .unwrap();
    let rows = std::fs::read_to_string(fixtures.join("data/spam48.jsonl")).unwrap();
    std::fs::write(dir.join("train.jsonl"), &rows).unwrap();
    let eval: String = rows.lines().take(12).map(|l| format!("{l}\n")).collect();
    std::fs::write(dir.join("eval.jsonl"), eval).unwrap();
    std::fs::write(dir.join("tiny.rcp"), recipe).unwrap();
    Scratch(dir)
}

pub const TINY: &str = include_str!("../../runtime/tests/fixtures/tiny-bert/tiny.rcp");

/// [`TINY`] with another `data` block (TINY's names `train.jsonl` and `eval.jsonl`).
pub fn tiny_with_data(data: &str) -> String {
    let old = "data { train = \"train.jsonl\", eval = \"eval.jsonl\", max_len = 24 }";
    assert!(TINY.contains(old));
    TINY.replace(old, data)
}

/// The committed SpamAssassin rows: (text, label id).
pub fn spam_rows() -> Vec<(String, u64)> {
    let path = root().join("runtime/tests/fixtures/data/spam48.jsonl");
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .map(|l| {
            let v: Value = serde_json::from_str(l).unwrap();
            (
                v["text"].as_str().unwrap().to_string(),
                v["label"].as_u64().unwrap(),
            )
        })
        .collect()
}

/// The JSON object a command printed on stdout.
pub fn stdout_json(o: &Output) -> Value {
    assert_eq!(o.status.code(), Some(0), "{}", stderr(o));
    serde_json::from_slice(&o.stdout).unwrap_or_else(|e| {
        panic!("{e}: {}", String::from_utf8_lossy(&o.stdout));
    })
}

pub fn metrics(dir: &Path) -> Vec<Value> {
    std::fs::read_to_string(dir.join("metrics.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// Final weights of a run, by tensor name.
pub fn weights(path: &Path) -> Vec<(String, Vec<f32>)> {
    recipe_runtime::checkpoint::read_safetensors(path)
        .unwrap()
        .tensors
        .into_iter()
        .map(|t| (t.name, t.data))
        .collect()
}

/// The tiny recipe with one global batch of 12 (micro 12 on one rank, 12/N on N) and no
/// dropout, so every world size trains the same function.
pub fn dp_recipe() -> String {
    TINY.replace(
        "batch { micro = 5, accumulate = 3 }",
        "batch { micro = 12, accumulate = 2 }",
    )
    .replace(
        "task = classify(labels: [\"ham\", \"spam\"]) }",
        "task = classify(labels: [\"ham\", \"spam\"]), dropout = 0 }",
    )
}

/// `--set` arguments for a ZeRO stage, with or without optimizer offload.
pub fn zero_sets(stage: u32, offload: bool) -> Vec<String> {
    let mut v = vec!["--set".to_string(), format!("zero.stage={stage}")];
    if offload {
        v.push("--set".into());
        v.push("zero.offload optimizer=cpu".into());
    }
    v
}

/// Runs `dir`'s tiny.rcp on `world` ranks (micro 12/world) into `out`, with `extra` arguments.
pub fn dp_run(dir: &Path, world: u64, out: &str, extra: &[String]) {
    let mut args: Vec<String> = ["run", "--quiet", "tiny.rcp", "--gpus"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    args.push(world.to_string());
    args.extend(["--set".into(), format!("batch.micro={}", 12 / world)]);
    args.extend(["--set".into(), format!("train.output_dir=\"{out}\"")]);
    args.extend(extra.iter().cloned());
    let refs: Vec<&str> = args.iter().map(String::as_str).collect();
    let o = recipe_in(dir, &refs);
    assert_eq!(o.status.code(), Some(0), "{args:?}: {}", stderr(&o));
}

pub fn start_record(dir: &Path) -> Value {
    metrics(dir)
        .into_iter()
        .find(|r| r["event"] == "start")
        .unwrap()
}
