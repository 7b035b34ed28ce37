//! Timing figures for `recipe check` and `recipe fmt`: `cargo bench --bench check`.
//!
//! Prints figures next to the targets from the issue; asserts no timings (machines differ).
//! Measured:
//!
//! * (a) in-process parse+check of `recipes/cls.rcp` (median, p90);
//! * (b) in-process parse+check of two generated 10,000-line recipes, each next to serde_json
//!   parsing a JSON document of the same byte size, measured in the same run:
//!   - "raw": `recipes/cls.rcp` plus one `deepspeed { }` block of distinct nested keys (parses and
//!     checks with no diagnostics: the realistic way to reach 10,000 lines);
//!   - "repeated": `recipes/cls.rcp` written out again and again (every repeat is a duplicate
//!     block, so this one also measures building many diagnostics);
//!
//!   and `recipe::commands::format::format_source` of both;
//! * (c) whole-process `recipe check recipes/cls.rcp` (the release binary) next to spawning
//!   `/bin/true`, the process-spawn floor; then whole-process `recipe check` of the generated
//!   raw recipe (written to the temporary directory, so its data files are not local);
//! * (d) in-process scan of the two JSONL files cls.rcp names (`files::scan_file`, no memo: the
//!   part of (c) that reads data), next to reading the same bytes with `std::fs::read`;
//! * (e) when the conformance venv exists (`conformance/setup.sh` makes `conformance/.venv`): the
//!   real Python config path for the same recipe as a whole process — `TrainingArguments` built
//!   from `recipe build`'s training_args.json (its `__post_init__` runs HF's DeepSpeed fill),
//!   HF's `trainer_config_finalize`, then DeepSpeed's `DeepSpeedConfig` — next to (c).
//!
//! * (f) a DeepSpeed config + TrainingArguments pair (`recipe check ds_config.json --args …`,
//!   the pair linter) next to checking recipes/cls.rcp, in the same run: in process (the pair
//!   `conformance/pairs/001-docs-zero2-fp16-auto`, and all of conformance/pairs/ in a row), and
//!   as whole processes interleaved (release binary).
//!
//! (c) and (e) need the release binary: `cargo build --release` first (this bench builds it when
//! it is missing, and says so if that fails).

use std::ffi::OsStr;
use std::hint::black_box;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Issue target: whole-process `recipe check recipes/cls.rcp`.
const TARGET_PROCESS_MS: f64 = 5.0;
/// Issue target: checking a 10,000-line recipe.
const TARGET_10K_MS: f64 = 50.0;
/// Issue target: whole-process `recipe check recipes/cls.rcp` against the Python config path.
const TARGET_PYTHON_RATIO: f64 = 1000.0;
/// Lines in the generated recipes.
const LINES: usize = 10_000;

fn main() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let cls_path = root.join("recipes/cls.rcp");
    let cls = std::fs::read_to_string(&cls_path).expect("read recipes/cls.rcp");

    println!("recipe bench (std::time::Instant; figures, not assertions)");
    if let Ok(load) = std::fs::read_to_string("/proc/loadavg") {
        let cpus = std::thread::available_parallelism().map_or(0, |n| n.get());
        println!(
            "machine: {cpus} CPUs, load average {} (other work skews these figures)",
            load.split_whitespace()
                .take(3)
                .collect::<Vec<_>>()
                .join(" ")
        );
    }
    println!();

    // (a) cls.rcp in process.
    let checked = recipe::check_source(&cls);
    assert!(checked.file.is_some(), "recipes/cls.rcp does not parse");
    let samples = time_n(5_000, 200, || {
        black_box(recipe::check_source(black_box(&cls)));
    });
    println!(
        "(a) in-process check of recipes/cls.rcp ({} bytes, {} lines, {}), {} iterations",
        cls.len(),
        cls.lines().count(),
        codes(&checked),
        samples.len()
    );
    println!(
        "    median {:>9.1} us   p90 {:>9.1} us   min {:>9.1} us",
        us(percentile(&samples, 50)),
        us(percentile(&samples, 90)),
        us(percentile(&samples, 0))
    );
    let (parse, schema) = split(&cls, 5_000, 200);
    println!(
        "    of which: parse median {:>9.1} us   schema check median {:>9.1} us",
        us(parse),
        us(schema)
    );
    println!();

    // (b) 10,000-line recipes, each with a same-size JSON peer.
    println!("(b) in-process check of a generated {LINES}-line recipe, median of 15 runs (target: < {TARGET_10K_MS} ms)");
    let raw = raw_recipe(&cls, LINES);
    for (name, text) in [
        ("raw", raw.clone()),
        ("repeated", repeated_recipe(&cls, LINES)),
    ] {
        bench_big(name, &text);
    }
    println!();

    // (c) whole process.
    println!("(c) whole-process `recipe check recipes/cls.rcp`, median of 50 runs (target: < {TARGET_PROCESS_MS} ms)");
    let bin = release_binary(&root);
    let process = match &bin {
        Ok(bin) => {
            let medians = bench_process(bin, &root, &cls_path);
            bench_raw_process(bin, &root, &raw);
            Some(medians)
        }
        Err(why) => {
            println!("    skipped: {why}");
            None
        }
    };
    println!();

    // (d) the data scan alone.
    bench_scan(&root);
    println!();

    // (e) the Python config path.
    match (&bin, process) {
        (Ok(bin), Some(medians)) => bench_python(bin, &root, &cls_path, medians),
        _ => println!("(e) Python config path: skipped (no release binary)"),
    }
    println!();

    // (f) pairs.
    bench_pairs(&root, &cls, bin.as_ref().ok());
}

/// The pair of a conformance/pairs/ directory, as `recipe check` reads it.
fn pair_input(dir: &Path) -> (recipe::SourceFile, Option<recipe::pair::ArgsInput>) {
    let read = |p: PathBuf| recipe::SourceFile::read(&p).expect("read a pair file");
    let args = if dir.join("training_args.json").is_file() {
        Some(recipe::pair::ArgsInput::Json(read(
            dir.join("training_args.json"),
        )))
    } else if dir.join("args.txt").is_file() {
        Some(recipe::pair::ArgsInput::Flags(read(dir.join("args.txt"))))
    } else {
        None
    };
    (read(dir.join("ds_config.json")), args)
}

/// Times (f): checking pairs against checking cls.rcp, in the same run.
fn bench_pairs(root: &Path, cls: &str, bin: Option<&PathBuf>) {
    let opts = recipe::pair::Options {
        world: 4,
        samples: Some(20_000),
        hidden_size: Some(768),
        has_eval: None,
        targets: recipe::upstream::versions::Targets::newest(),
    };
    let one = root.join("conformance/pairs/001-docs-zero2-fp16-auto");
    let (ds, args) = pair_input(&one);
    let pair = time_n(5_000, 200, || {
        black_box(recipe::pair::check(ds.clone(), args.clone(), &opts));
    });
    let rcp = time_n(5_000, 200, || {
        black_box(recipe::check_source(black_box(cls)));
    });
    let (p, r) = (us(percentile(&pair, 50)), us(percentile(&rcp, 50)));
    println!("(f) the pair linter against checking a recipe, same run");
    println!("    in process, pair 001-docs-zero2-fp16-auto   median {p:>8.1} us");
    println!("    in process, recipes/cls.rcp                median {r:>8.1} us   ratio pair/recipe {:.2}x", p / r);
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(root.join("conformance/pairs"))
        .map(|d| {
            d.filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| p.is_dir())
                .collect()
        })
        .unwrap_or_default();
    dirs.sort();
    let inputs: Vec<_> = dirs.iter().map(|d| pair_input(d)).collect();
    let all = time_n(50, 5, || {
        for (ds, args) in &inputs {
            black_box(recipe::pair::check(ds.clone(), args.clone(), &opts));
        }
    });
    println!(
        "    in process, all {} conformance pairs         median {:>8.1} us ({:.1} us a pair)",
        inputs.len(),
        us(percentile(&all, 50)),
        us(percentile(&all, 50)) / inputs.len().max(1) as f64
    );
    let Some(bin) = bin else {
        println!("    whole process: skipped (no release binary)");
        return;
    };
    let run = |args: &[&OsStr]| {
        let t = Instant::now();
        let status = run_quiet(bin, args, root, &[]);
        assert!(status.code().is_some(), "recipe was killed");
        t.elapsed()
    };
    let ds = one.join("ds_config.json");
    let ta = one.join("training_args.json");
    let pair_args = [
        OsStr::new("check"),
        ds.as_os_str(),
        OsStr::new("--args"),
        ta.as_os_str(),
    ];
    let rcp_path = root.join("recipes/cls.rcp");
    let rcp_args = [OsStr::new("check"), rcp_path.as_os_str()];
    let (mut ps, mut rs) = (Vec::new(), Vec::new());
    for i in 0..55 {
        let p = run(&pair_args);
        let r = run(&rcp_args);
        if i >= 5 {
            ps.push(p);
            rs.push(r);
        }
    }
    ps.sort();
    rs.sort();
    let (p, r) = (ms(percentile(&ps, 50)), ms(percentile(&rs, 50)));
    println!("    whole process, recipe check ds_config.json --args training_args.json  median {p:>7.3} ms");
    println!("    whole process, recipe check recipes/cls.rcp (scan cache warm)        median {r:>7.3} ms   ratio pair/recipe {:.2}x", p / r);
}

/// What (e) runs in the venv's Python: argv[1] is `recipe build`'s output directory, argv[2] the
/// total optimizer steps (for `trainer_config_finalize`). The same calls as a real launch makes
/// before training (conformance/harness.py runs them with its patches, this runs them plain, at
/// world size 1 like cls.rcp). Prints the milliseconds of the imports and of the config calls.
const PYTHON_PEER: &str = r#"
import contextlib, io, json, logging, os, sys, time, types, warnings
t0 = time.perf_counter()
os.environ.setdefault("DS_ACCELERATOR", "cpu")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
warnings.filterwarnings("ignore")
logging.disable(logging.WARNING)
with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
    from transformers import TrainingArguments
    from deepspeed.runtime.config import DeepSpeedConfig
t1 = time.perf_counter()
out, total = sys.argv[1], int(sys.argv[2])
with open(os.path.join(out, "training_args.json")) as f:
    kw = json.load(f)
kw["deepspeed"] = os.path.join(out, "ds_config.json")
kw["output_dir"] = os.path.join(out, "out")
with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
    args = TrainingArguments(**kw)  # __post_init__: HfTrainerDeepSpeedConfig + trainer_config_process
    hf = args.hf_deepspeed_config
    # all-MiniLM-L6-v2's width (HF reads it only for "auto" ZeRO bucket sizes)
    model = types.SimpleNamespace(config=types.SimpleNamespace(hidden_size=384))
    hf.trainer_config_finalize(args, model, total)
    DeepSpeedConfig(hf.config)
t2 = time.perf_counter()
print(f"{(t1 - t0) * 1e3:.1f} {(t2 - t1) * 1e3:.1f}")
"#;

/// Times (e): the Python config path of cls.rcp as a whole process, against (c)'s medians
/// (scan cache off, warm).
fn bench_python(bin: &Path, root: &Path, cls: &Path, (off, warm): (f64, f64)) {
    let python = root.join("conformance/.venv/bin/python");
    if !python.is_file() {
        println!("(e) Python config path: skipped (no conformance/.venv; `conformance/setup.sh` makes it)");
        return;
    }
    let dir = std::env::temp_dir().join(format!("recipe-bench-python-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let built = Command::new(bin)
        .args([OsStr::new("build"), cls.as_os_str(), OsStr::new("-o")])
        .arg(&dir)
        .current_dir(root)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    let total = std::fs::read_to_string(dir.join("ds_config.json"))
        .ok()
        .and_then(|t| serde_json::from_str::<serde_json::Value>(&t).ok())
        .and_then(|v| v["scheduler"]["params"]["total_num_steps"].as_u64())
        .unwrap_or(1);
    let script = dir.join("peer.py");
    if !built || std::fs::write(&script, PYTHON_PEER).is_err() {
        println!("(e) Python config path: skipped (`recipe build` of cls.rcp failed)");
        let _ = std::fs::remove_dir_all(&dir);
        return;
    }
    const RUNS: usize = 3;
    println!(
        "(e) the Python config path of recipes/cls.rcp, whole process, median of {RUNS} runs after one warm-up (target: recipe check >= {TARGET_PYTHON_RATIO}x faster)"
    );
    let mut whole = Vec::new();
    let mut parts = Vec::new();
    for i in 0..=RUNS {
        let t = Instant::now();
        let output = Command::new(&python)
            .arg(&script)
            .arg(&dir)
            .arg(total.to_string())
            .current_dir(&dir)
            .stdin(Stdio::null())
            .output()
            .expect("spawn python");
        let elapsed = t.elapsed();
        if !output.status.success() {
            let err = String::from_utf8_lossy(&output.stderr);
            let tail: Vec<&str> = err.lines().rev().take(5).collect();
            println!("    skipped: the Python peer failed ({}):", output.status);
            for line in tail.iter().rev() {
                println!("      {line}");
            }
            let _ = std::fs::remove_dir_all(&dir);
            return;
        }
        let text = String::from_utf8_lossy(&output.stdout);
        let phases: Vec<f64> = text
            .split_whitespace()
            .filter_map(|w| w.parse().ok())
            .collect();
        if i > 0 {
            whole.push(elapsed);
            parts.push((
                phases.first().copied().unwrap_or(0.0),
                phases.get(1).copied().unwrap_or(0.0),
            ));
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
    whole.sort();
    let median = |mut v: Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let p = ms(percentile(&whole, 50));
    let imports = median(parts.iter().map(|x| x.0).collect());
    let config = median(parts.iter().map(|x| x.1).collect());
    println!(
        "    python        median {p:>9.1} ms   (of which imports {imports:.1} ms, TrainingArguments + HF fill + DeepSpeedConfig {config:.1} ms)"
    );
    for (label, r) in [("scan cache warm", warm), ("scan cache off", off)] {
        let ratio = p / r;
        println!(
            "    ratio python/recipe check ({label}, {r:.3} ms): {ratio:.0}x   (target >= {TARGET_PYTHON_RATIO}x: {})",
            if ratio >= TARGET_PYTHON_RATIO { "met" } else { "NOT met" }
        );
    }
}

/// Times (c) for the generated raw recipe.
fn bench_raw_process(bin: &Path, root: &Path, raw: &str) {
    let path = std::env::temp_dir().join(format!("recipe-bench-raw-{}.rcp", std::process::id()));
    std::fs::write(&path, raw).expect("write the raw recipe");
    let samples = time_n(15, 2, || {
        // Exits 1: the raw recipe has errors (R0902, R0909) by design.
        run_quiet(bin, &[OsStr::new("check"), path.as_os_str()], root, &[]);
    });
    let _ = std::fs::remove_file(&path);
    let r = ms(percentile(&samples, 50));
    println!(
        "    raw {LINES}-line recipe, whole process: median {r:>7.3} ms   (target < {TARGET_10K_MS} ms: {})",
        verdict(r, TARGET_10K_MS)
    );
}

/// Times (d): `files::scan_file` of the data files cls.rcp names, next to `std::fs::read`.
fn bench_scan(root: &Path) {
    use recipe::resolve::files::{scan_file, Format, ScanSpec};
    let spec = ScanSpec {
        format: Format::Jsonl,
        fields: vec!["text".into(), "label".into()],
        label: Some(1),
    };
    let files: Vec<PathBuf> = ["train", "test"]
        .iter()
        .map(|f| root.join(format!("data/spamassassin/{f}.jsonl")))
        .filter(|p| p.is_file())
        .collect();
    if files.is_empty() {
        println!("(d) data scan: skipped (no data/spamassassin)");
        return;
    }
    let bytes: u64 = files
        .iter()
        .map(|p| std::fs::metadata(p).map_or(0, |m| m.len()))
        .sum();
    let scan = time_n(50, 5, || {
        for p in &files {
            let len = std::fs::metadata(p).expect("stat").len();
            black_box(scan_file(p, len, &spec).expect("scan"));
        }
    });
    let read = time_n(50, 5, || {
        for p in &files {
            black_box(std::fs::read(p).expect("read"));
        }
    });
    let (s, r) = (ms(percentile(&scan, 50)), ms(percentile(&read, 50)));
    println!(
        "(d) in-process scan of cls.rcp's data files ({} files, {bytes} bytes, {} CPUs), median of 50",
        files.len(),
        std::thread::available_parallelism().map_or(1, |n| n.get())
    );
    println!("    scan_file     median {s:>7.3} ms");
    println!(
        "    std::fs::read median {r:>7.3} ms   (same bytes, same run)   ratio scan/read {:.1}x",
        s / r
    );
}

/// Times (b) for one generated recipe.
fn bench_big(name: &str, text: &str) {
    let checked = recipe::check_source(text);
    assert!(
        checked.file.is_some(),
        "the generated {name} recipe does not parse: {:?}",
        checked.diagnostics.first()
    );
    let json = json_document(text.len());
    serde_json::from_str::<serde_json::Value>(&json).expect("generated JSON parses");

    let check = time_n(15, 2, || {
        black_box(recipe::check_source(black_box(text)));
    });
    let peer = time_n(15, 2, || {
        black_box(serde_json::from_str::<serde_json::Value>(black_box(&json)).unwrap());
    });
    let format = time_n(15, 2, || {
        black_box(recipe::commands::format::format_source(black_box(text)).unwrap());
    });
    let (c, p, f) = (
        ms(percentile(&check, 50)),
        ms(percentile(&peer, 50)),
        ms(percentile(&format, 50)),
    );
    println!(
        "    {name:<9} {} lines, {} bytes, {}",
        text.lines().count(),
        text.len(),
        codes(&checked)
    );
    println!(
        "      check         median {c:>9.3} ms   (target < {TARGET_10K_MS} ms: {})",
        verdict(c, TARGET_10K_MS)
    );
    println!(
        "      serde_json    median {p:>9.3} ms   ({} bytes of JSON, same run)   ratio recipe/serde_json {:.1}x",
        json.len(),
        c / p
    );
    let (parse, schema) = split(text, 15, 2);
    println!(
        "      of which: parse median {:>9.3} ms   schema check median {:>9.3} ms",
        ms(parse),
        ms(schema)
    );
    println!("      format_source median {f:>9.3} ms");
}

/// Medians of the two halves of `check_source`: `syntax::parse`, then `check::schema::check` of
/// the parsed file (without sorting the diagnostics).
fn split(text: &str, n: usize, warmup: usize) -> (Duration, Duration) {
    let parse = time_n(n, warmup, || {
        black_box(recipe::syntax::parse(black_box(text)).unwrap());
    });
    let file = recipe::syntax::parse(text).unwrap();
    let schema = time_n(n, warmup, || {
        black_box(recipe::check::schema::check(black_box(&file)));
    });
    (percentile(&parse, 50), percentile(&schema, 50))
}

/// Times (c): spawning the release binary next to spawning `/bin/true`.
/// Whole-process `recipe check` against `/bin/true`, twice: with the data scan cache off (every
/// run reads the data files) and on (warm: an earlier run remembered the unchanged files).
/// Returns the two medians in ms (cache off, warm).
fn bench_process(bin: &Path, root: &Path, cls: &Path) -> (f64, f64) {
    let cache = std::env::temp_dir().join(format!("recipe-bench-cache-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&cache);
    let off = [("RECIPE_SCAN_CACHE", std::ffi::OsString::from("0"))];
    let warm = [("RECIPE_CACHE", cache.clone().into_os_string())];
    let mut medians = Vec::new();
    for (label, envs) in [
        ("scan cache off (every run reads the data)", &off[..]),
        (
            "scan cache warm (the first run remembers the data)",
            &warm[..],
        ),
    ] {
        println!("  {label}:");
        medians.push(bench_process_with(bin, root, cls, envs));
    }
    let _ = std::fs::remove_dir_all(&cache);
    (medians[0], medians[1])
}

/// Returns the median of `recipe check` in ms.
fn bench_process_with(
    bin: &Path,
    root: &Path,
    cls: &Path,
    envs: &[(&str, std::ffi::OsString)],
) -> f64 {
    let run = |program: &Path, args: &[&OsStr]| {
        let status = run_quiet(program, args, root, envs);
        assert!(
            status.success(),
            "{} exited with {status}",
            program.display()
        );
    };
    let true_bin = Path::new("/bin/true");
    // Interleave the two so that both see the same machine state.
    let mut recipe_samples = Vec::new();
    let mut true_samples = Vec::new();
    for i in 0..55 {
        let t = Instant::now();
        run(bin, &[OsStr::new("check"), cls.as_os_str()]);
        let r = t.elapsed();
        let t = Instant::now();
        run(true_bin, &[]);
        let f = t.elapsed();
        if i >= 5 {
            recipe_samples.push(r);
            true_samples.push(f);
        }
    }
    recipe_samples.sort();
    true_samples.sort();
    let r = ms(percentile(&recipe_samples, 50));
    let f = ms(percentile(&true_samples, 50));
    println!(
        "    recipe check  median {r:>7.3} ms   p90 {:>7.3} ms   (target < {TARGET_PROCESS_MS} ms: {})",
        ms(percentile(&recipe_samples, 90)),
        verdict(r, TARGET_PROCESS_MS)
    );
    println!(
        "    /bin/true     median {f:>7.3} ms   p90 {:>7.3} ms   (process-spawn floor)",
        ms(percentile(&true_samples, 90))
    );
    println!(
        "    ratio recipe/true {:.1}x, difference {:.3} ms   [{}]",
        r / f,
        r - f,
        bin.display()
    );
    r
}

/// Runs `program args` in `root` with no input or output (`envs` added), as every whole-process
/// figure does; panics when it cannot start.
fn run_quiet(
    program: &Path,
    args: &[&OsStr],
    root: &Path,
    envs: &[(&str, std::ffi::OsString)],
) -> std::process::ExitStatus {
    Command::new(program)
        .args(args)
        .envs(envs.iter().map(|(k, v)| (*k, v)))
        .current_dir(root)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .expect("spawn")
}

/// `target/release/recipe`, built here when missing.
fn release_binary(root: &Path) -> Result<PathBuf, String> {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| root.join("target"));
    let bin = target.join("release").join("recipe");
    if bin.is_file() {
        return Ok(bin);
    }
    println!(
        "    {} is missing; running `cargo build --release --bin recipe`",
        bin.display()
    );
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let status = Command::new(cargo)
        .args(["build", "--release", "--bin", "recipe"])
        .current_dir(root)
        .status()
        .map_err(|e| format!("could not run cargo: {e}; run `cargo build --release` first"))?;
    if status.success() && bin.is_file() {
        Ok(bin)
    } else {
        Err(format!(
            "no release binary at {}; run `cargo build --release` first",
            bin.display()
        ))
    }
}

/// `cls.rcp`, then one `deepspeed { }` block of distinct nested keys, `lines` lines in all.
/// `amp` passes its keys through to Apex unchecked, so every key is accepted.
fn raw_recipe(cls: &str, lines: usize) -> String {
    let mut out = String::with_capacity(lines * 40);
    let push = |out: &mut String, line: String| {
        out.push_str(&line);
        out.push('\n');
    };
    out.push_str(cls);
    let mut count = cls.lines().count();
    for line in [
        "",
        "# Generated: a large raw DeepSpeed block.",
        "deepspeed {",
        "  gradient_clipping = 1.0",
        "  steps_per_print = 100",
        "  amp {",
    ] {
        push(&mut out, line.to_string());
        count += 1;
    }
    let closing = 2; // `amp`'s and `deepspeed`'s closing braces
    let mut group = 0;
    while count + 12 + closing <= lines {
        push(
            &mut out,
            format!("    group_{group:04} {{  # group {group}"),
        );
        for k in 0..10 {
            push(
                &mut out,
                match k % 5 {
                    0 => format!("      lr_scale_{k} = {}e-5", group % 97 + 1),
                    1 => format!("      name_{k} = \"layer.{group}.attention.{k}\""),
                    2 => format!("      enabled_{k} = {}", group % 2 == 0),
                    3 => format!("      betas_{k} = (0.9, 0.{})", 990 + group % 9),
                    _ => format!("      buckets_{k} = [{}M, {k}k, {group}]", group % 64),
                },
            );
        }
        push(&mut out, "    }".to_string());
        count += 12;
        group += 1;
    }
    while count + closing < lines {
        push(&mut out, format!("    pad_{group:04} = {group}"));
        count += 1;
        group += 1;
    }
    push(&mut out, "  }".to_string());
    push(&mut out, "}".to_string());
    out
}

/// `cls.rcp` written out again and again (each copy after the first repeats every block).
fn repeated_recipe(cls: &str, lines: usize) -> String {
    let mut out = String::with_capacity(lines * 40);
    let mut copy = 0;
    while out.lines().count() < lines {
        if copy > 0 {
            out.push('\n');
        }
        out.push_str(cls);
        copy += 1;
    }
    // Trim to exactly `lines` lines, at a block boundary: drop whole trailing lines until the
    // last line is blank, a comment or closes a block.
    let mut kept: Vec<&str> = out.lines().take(lines).collect();
    while let Some(last) = kept.last() {
        let t = last.trim();
        let open = kept.iter().filter(|l| l.contains('{')).count();
        let close = kept.iter().filter(|l| l.contains('}')).count();
        if open == close && (t.is_empty() || t.starts_with('#') || t.ends_with('}')) {
            break;
        }
        kept.pop();
    }
    let mut text = kept.join("\n");
    text.push('\n');
    text
}

/// A JSON document of about `bytes` bytes (a few bytes over at most): an object of objects,
/// shaped like a DeepSpeed config, with the same kinds of values as the raw recipe.
fn json_document(bytes: usize) -> String {
    let mut out = String::with_capacity(bytes + 256);
    out.push_str("{\n  \"amp\": {\n");
    let mut group = 0;
    loop {
        let entry = format!(
            "    \"group_{group:04}\": {{\"lr_scale_0\": {}e-5, \"name_1\": \"layer.{group}.attention.1\", \"enabled_2\": {}, \"betas_3\": [0.9, 0.{}], \"buckets_4\": [{}, {}, {}]}},\n",
            group % 97 + 1,
            group % 2 == 0,
            990 + group % 9,
            group % 64,
            group,
            group * 7
        );
        if out.len() + entry.len() + 64 > bytes {
            break;
        }
        out.push_str(&entry);
        group += 1;
    }
    // Pad with one string to the requested size.
    let closing = "    \"pad\": \"\"\n  }\n}\n";
    let pad = bytes.saturating_sub(out.len() + closing.len());
    out.push_str(&format!("    \"pad\": \"{}\"\n  }}\n}}\n", "x".repeat(pad)));
    out
}

/// "N diagnostics: R0001 x3, ..." (codes in order of first appearance).
fn codes(checked: &recipe::Checked) -> String {
    let mut counts: Vec<(&str, usize)> = Vec::new();
    for d in &checked.diagnostics {
        match counts.iter_mut().find(|(c, _)| *c == d.code) {
            Some((_, n)) => *n += 1,
            None => counts.push((d.code, 1)),
        }
    }
    let list: Vec<String> = counts
        .iter()
        .map(|(c, n)| {
            if *n == 1 {
                c.to_string()
            } else {
                format!("{c} x{n}")
            }
        })
        .collect();
    match checked.diagnostics.len() {
        0 => "0 diagnostics".to_string(),
        n => format!("{n} diagnostics: {}", list.join(", ")),
    }
}

/// Runs `f` `warmup` times untimed, then `n` times timed; sorted samples.
fn time_n(n: usize, warmup: usize, mut f: impl FnMut()) -> Vec<Duration> {
    for _ in 0..warmup {
        f();
    }
    let mut samples: Vec<Duration> = (0..n)
        .map(|_| {
            let t = Instant::now();
            f();
            t.elapsed()
        })
        .collect();
    samples.sort();
    samples
}

/// The `p`th percentile (nearest rank) of sorted samples; 0 is the minimum.
fn percentile(sorted: &[Duration], p: usize) -> Duration {
    let i = (sorted.len() * p / 100).min(sorted.len() - 1);
    sorted[i]
}

fn us(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn verdict(value: f64, target: f64) -> &'static str {
    if value < target {
        "met"
    } else {
        "NOT met"
    }
}
