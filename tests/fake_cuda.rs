//! `recipe` on the CUDA backend end to end, without a GPU: the driver, NVRTC, cuBLAS and NCCL
//! it loads are runtime/fake-cuda's, which run on the CPU (kernels through runtime/emu) and
//! refuse at once what a GPU would get wrong silently (a kernel or copy outside live memory, an
//! allocation or a host wait inside a capture, an unjoined capture, NaN-filled fresh memory
//! read as data). So the CUDA backend's own host code (runtime/src/backend/cuda: cudarc's
//! calls, streams, events, graphs, cuBLAS's column-major mapping, NCCL's groups) runs here as
//! it will on a GPU, and scripts/gpu-check.sh's parts are rehearsed: the self-test, the tiny
//! BERT against the CPU (fp32, fp16, bf16), with CUDA graphs, with optimizer offload, on two
//! GPUs (ZeRO 0, 2, 3 over NCCL), a checkpoint moved between the devices, and an
//! out-of-memory GPU; several of them on asynchronous streams (`RECIPE_FAKE_CUDA_ASYNC`),
//! where an operation not ordered after what it reads reads early. What it cannot show (races between streams, a GPU's rounding and
//! speed): docs/cuda.md, "How the host code is proven".

use crate::common;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::{Mutex, OnceLock};

use common::{metrics, stderr, workspace, CONFIG, TINY};
use recipe_runtime::flops;
use serde_json::Value;

/// A folder of links named as the CUDA libraries cudarc loads, to the fake library that cargo
/// built for this test (the root crate's dev-dependency on `recipe-fake-cuda`).
fn fake_libs() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let exe = std::env::current_exe().unwrap();
        let deps = exe.parent().unwrap();
        let lib = [deps.to_path_buf(), deps.parent().unwrap().to_path_buf()]
            .iter()
            .flat_map(|d| std::fs::read_dir(d).into_iter().flatten().flatten())
            .map(|e| e.path())
            .filter(|p| {
                let n = p.file_name().unwrap().to_string_lossy();
                n.starts_with("librecipe_fake_cuda") && n.ends_with(".so")
            })
            .max_by_key(|p| std::fs::metadata(p).and_then(|m| m.modified()).ok())
            .unwrap_or_else(|| {
                panic!(
                    "no librecipe_fake_cuda*.so beside {} (cargo builds it as the root crate's \
                     dev-dependency: run the tests through cargo)",
                    deps.display()
                )
            });
        let dir = std::env::temp_dir().join(format!("recipe-fake-cuda-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        for name in [
            "libcuda.so",
            "libcuda.so.1",
            "libnvrtc.so",
            "libcublas.so",
            "libcublasLt.so",
            "libnccl.so",
            "libnccl.so.2",
        ] {
            std::os::unix::fs::symlink(&lib, dir.join(name)).unwrap();
        }
        dir
    })
}

/// `recipe ARGS` in `dir` with the fake libraries first on the loader's path and `gpus` GPUs.
fn on_fake(dir: &Path, gpus: usize, env: &[(&str, &str)], args: &[&str]) -> Output {
    let mut path = fake_libs().as_os_str().to_owned();
    if let Some(old) = std::env::var_os("LD_LIBRARY_PATH") {
        path.push(":");
        path.push(old);
    }
    let mut c = Command::new(env!("CARGO_BIN_EXE_recipe"));
    c.args(args)
        .current_dir(dir)
        .env("LD_LIBRARY_PATH", path)
        .env("NO_COLOR", "1")
        .env("RECIPE_CACHE", dir.join("cache"))
        .env("RECIPE_FAKE_CUDA_GPUS", gpus.to_string())
        .env("RECIPE_COLLECTIVE_TIMEOUT", "120")
        .env_remove("RECIPE_CUDA_GRAPHS")
        .env_remove("RECIPE_HALF_GEMM")
        .env_remove("RECIPE_GEMM_LIBRARY")
        .env_remove("RECIPE_NCCL")
        .env_remove("RECIPE_PEAK_TFLOPS")
        .env_remove("RECIPE_FAKE_CUDA_NAME");
    for (k, v) in env {
        c.env(k, v);
    }
    c.output().unwrap()
}

/// Fails on any refusal of the fake driver (`fake CUDA: …` on stderr).
fn no_refusals(what: &str, o: &Output) {
    let e = stderr(o);
    assert!(
        !e.contains("fake CUDA:"),
        "{what}: the fake driver refused an operation:\n{e}"
    );
}

/// One logged step: (step, lr, loss scale, skipped) and the loss.
type Step = ((Value, Value, Value, Value), f64);

fn steps(dir: &Path) -> (Vec<Step>, Value) {
    let rows = metrics(dir);
    let start = rows
        .iter()
        .find(|r| r["event"] == "start")
        .cloned()
        .unwrap_or(Value::Null);
    let steps = rows
        .iter()
        .filter(|r| r.get("loss").is_some())
        .map(|r| {
            (
                (
                    r["step"].clone(),
                    r["lr"].clone(),
                    r["loss_scale"].clone(),
                    r["skipped"].clone(),
                ),
                r["loss"].as_f64().unwrap(),
            )
        })
        .collect();
    (steps, start)
}

/// Each logged step's gradient norm and each evaluation's loss, in order.
fn norms_and_eval(dir: &Path) -> Vec<Value> {
    metrics(dir)
        .iter()
        .flat_map(|r| {
            [
                r.get("grad_norm"),
                r.get("eval").and_then(|e| e.get("loss")),
            ]
        })
        .flatten()
        .cloned()
        .collect()
}

/// Trains `recipe` (a file in `dir`) on the CPU and on the fake GPU(s) with `args`, and
/// checks the same steps, LRs, loss scales and skips, losses within `bound` relative, and the
/// GPU run's placement. Returns the largest relative loss difference and the GPU's steps.
fn against_the_cpu(
    dir: &Path,
    name: &str,
    recipe: &str,
    args: &[&str],
    gpus: usize,
    env: &[(&str, &str)],
    bound: f64,
) -> (f64, Vec<Step>) {
    // The CPU's run of a recipe and arguments, once per folder (tests compare several GPU runs
    // with one CPU run): what `env` sets is read by the GPU's code and the fake only (the
    // runtime's other variables, RECIPE_THREADS and the timeouts, change no number).
    type CpuRuns = HashMap<(PathBuf, String, Vec<String>), (Vec<Step>, Value)>;
    static CPU_RUNS: OnceLock<Mutex<CpuRuns>> = OnceLock::new();
    let key = (
        dir.to_path_buf(),
        recipe.to_string(),
        args.iter().map(|a| a.to_string()).collect::<Vec<_>>(),
    );
    let known = CPU_RUNS
        .get_or_init(Default::default)
        .lock()
        .unwrap()
        .get(&key)
        .cloned();
    let mut runs = Vec::new();
    for device in ["cpu", "cuda"] {
        if let (Some(cpu), "cpu") = (&known, device) {
            runs.push(cpu.clone());
            continue;
        }
        let out = format!("train.output_dir=\"{name}-{device}\"");
        let mut a = vec!["run", "--quiet", "--device", device, "--set", &out];
        a.extend_from_slice(args);
        a.push(recipe);
        let o = on_fake(dir, gpus, env, &a);
        assert_eq!(
            o.status.code(),
            Some(0),
            "{name} on {device}: {}",
            stderr(&o)
        );
        no_refusals(&format!("{name} on {device}"), &o);
        runs.push(steps(&dir.join(format!("{name}-{device}"))));
    }
    if known.is_none() {
        let mut memo = CPU_RUNS.get_or_init(Default::default).lock().unwrap();
        memo.insert(key, runs[0].clone());
    }
    let (cpu, cstart) = &runs[0];
    let (gpu, gstart) = &runs[1];
    assert!(!cpu.is_empty(), "{name}: no steps logged");
    assert_eq!(cstart["device"], "cpu", "{name}: {cstart}");
    assert_eq!(
        gstart["device"].as_str().map(|d| d.contains("fake")),
        Some(true),
        "{name}: {gstart}"
    );
    let keys = |s: &[Step]| s.iter().map(|(k, _)| k.clone()).collect::<Vec<_>>();
    assert_eq!(
        keys(cpu),
        keys(gpu),
        "{name}: steps, LRs, loss scales or skips differ"
    );
    let worst = cpu
        .iter()
        .zip(gpu)
        .map(|(a, b)| (a.1 - b.1).abs() / a.1.abs())
        .fold(0.0, f64::max);
    assert!(
        worst <= bound,
        "{name}: losses differ by {worst:e} relative (bound {bound:e})"
    );
    (worst, gpu.clone())
}

/// Token ids, labels, masks and the dropout key go up from a ring of pinned slots
/// (runtime/src/backend/cuda/staging.rs), not from pageable memory, which a GPU's driver may
/// stage only after the stream's queued work ran: the host would wait for each micro-batch
/// before queueing the next. The fake counts such uploads: the setup's (buffers sized and
/// filled once) make all of them, so a run of one epoch makes as many as a run of two. With
/// the compute stream run only when something waits for it (`RECIPE_FAKE_CUDA_LAZY=first`),
/// a window of eight micro-batches queues more uploads than the ring has slots before the GPU
/// runs any: a slot written again before its copy ran would train on another micro-batch's
/// ids, and the losses would part from the CPU's.
#[test]
fn token_ids_go_up_from_pinned_memory_without_waiting_for_the_gpu() {
    let dir = workspace("fake-staging", TINY);
    let window = ["--set", "batch.micro=2", "--set", "batch.accumulate=8"];
    let behind = |epochs: &str| {
        let counts = dir.join(format!("stats-{epochs}.json"));
        let env = [
            ("RECIPE_FAKE_CUDA_ASYNC", "20"),
            ("RECIPE_FAKE_CUDA_LAZY", "first"),
            ("RECIPE_FAKE_CUDA_STATS", counts.to_str().unwrap()),
        ];
        let epochs = format!("train.epochs={epochs}");
        let mut args = window.to_vec();
        args.extend(["--set", &epochs]);
        let (_, steps) = against_the_cpu(&dir, "staged", "tiny.rcp", &args, 1, &env, 1e-5);
        let s = stats(&counts);
        (steps.len(), s["pageable_uploads_behind"].as_u64().unwrap())
    };
    let (one, two) = (behind("1"), behind("2"));
    assert!(one.0 >= 3 && two.0 > one.0, "steps: {one:?} {two:?}");
    assert_eq!(
        one.1, two.1,
        "pageable uploads behind the stream in one epoch and in two"
    );
}

/// `recipe kernels --selftest`: every operation on the (fake) GPU against the CPU backend, in
/// fp32, fp16 and bf16, through the CUDA backend's own memory, launch and cuBLAS code; as
/// scripts/gpu-check.sh runs it (with `RECIPE_CUDA_GRAPHS=1`, here on asynchronous streams
/// too, the side stream as late as its waits allow: `graph.update_wait` fails without the
/// graph's own wait for the update), with cuBLAS converting the half GEMMs' operands (`RECIPE_HALF_GEMM=convert`) on the
/// fastest of cuBLASLt's answers (`RECIPE_GEMM_ALGO=fastest`), and on two GPUs summing through
/// the fake NCCL.
#[test]
fn the_selftest_passes_on_the_fake_gpu() {
    let dir = workspace("fake-selftest", TINY);
    for (out, gpus, env) in [
        (
            "k",
            1,
            &[
                ("RECIPE_CUDA_GRAPHS", "1"),
                ("RECIPE_FAKE_CUDA_ASYNC", "20"),
                ("RECIPE_FAKE_CUDA_LAZY", "others"),
            ][..],
        ),
        (
            "k-convert",
            1,
            &[
                ("RECIPE_HALF_GEMM", "convert"),
                ("RECIPE_NCCL", "0"),
                ("RECIPE_GEMM_ALGO", "fastest"),
            ],
        ),
        // NCCL between two GPUs: sums, reductions, broadcasts, groups, queued calls.
        (
            "k-peers",
            2,
            &[("RECIPE_FAKE_CUDA_ASYNC", "20"), ("RECIPE_NCCL", "1")],
        ),
    ] {
        let o = on_fake(&dir, gpus, env, &["kernels", "--selftest", "--out", out]);
        let text = String::from_utf8_lossy(&o.stdout);
        assert_eq!(o.status.code(), Some(0), "{out}: {text}\n{}", stderr(&o));
        no_refusals(out, &o);
        assert!(text.contains("self-test on recipe fake GPU"), "{text}");
        if gpus == 2 {
            assert!(text.contains("sums between 2 GPUs through NCCL"), "{text}");
        }
        if out == "k-convert" {
            assert!(text.contains("shapes chosen)"), "{text}");
        }
        let report: Value = serde_json::from_str(
            &std::fs::read_to_string(dir.join(out).join("selftest.json")).unwrap(),
        )
        .unwrap();
        // One entry per check, each within its tolerance (the exit status says so too).
        let checks = report.as_array().unwrap();
        assert!(checks.len() > 100, "{out}: {} checks", checks.len());
        let waits = checks.iter().filter(|c| c["op"] == "graph.update_wait");
        assert_eq!(waits.count(), 3, "{out}: one a dtype");
        for c in checks {
            assert_eq!(c["ok"], true, "{out}: {c}");
        }
    }
}

/// The compile gate (`recipe kernels`, scripts/check-kernels.sh) reads each kernel's registers
/// and spills from the report NVRTC's assembler writes into its log: every kernel of the program
/// in each architecture's table, and exit 0; a kernel reported spilling (the fake NVRTC's
/// `RECIPE_FAKE_CUDA_SPILLS`) named and the gate failed, and only warned of on a GPU's run.
#[test]
fn the_compile_gate_reports_every_kernel_and_refuses_a_spill() {
    let dir = workspace("fake-gate", TINY);
    let args = ["kernels", "--arch", "sm_80", "--arch", "sm_90"];
    let tables = |o: &Output| {
        let text = String::from_utf8_lossy(&o.stdout).into_owned();
        for arch in ["sm_80", "sm_90"] {
            let table = text
                .split(&format!("kernels for {arch}"))
                .nth(1)
                .unwrap_or_else(|| panic!("no table for {arch}: {text}"));
            for k in recipe_runtime::backend::kernels::all_kernel_names() {
                assert!(
                    table
                        .lines()
                        .any(|l| l.split_whitespace().next() == Some(k)),
                    "{arch}: {k} not in the table:\n{text}"
                );
            }
        }
        text
    };
    let o = on_fake(&dir, 1, &[], &args);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let text = tables(&o);
    assert!(!text.contains("<- spills"), "{text}");
    no_refusals("gate", &o);

    let o = on_fake(&dir, 1, &[("RECIPE_FAKE_CUDA_SPILLS", "adamw_step")], &args);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    let text = tables(&o);
    let spilled: Vec<&str> = text.lines().filter(|l| l.ends_with("<- spills")).collect();
    assert_eq!(spilled.len(), 2, "one line an architecture: {text}");
    assert!(
        spilled
            .iter()
            .all(|l| l.trim_start().starts_with("adamw_step ")),
        "{text}"
    );
    assert!(
        stderr(&o).contains("error: sm_90: a kernel spills registers or is missing"),
        "{}",
        stderr(&o)
    );

    // On a GPU the command checks numbers and times with that machine's NVRTC: a spill there
    // is a warning, not a failure of the self-test or the GEMM timings.
    // (8 tokens, one repetition: `gemm_candidates_are_timed_on_the_fake_gpu`).
    let spills = [
        ("RECIPE_FAKE_CUDA_SPILLS", "adamw_step"),
        ("RECIPE_GEMM_BENCH", "8,1"),
    ];
    let timed = ["kernels", "--arch", "sm_90", "--gemm-candidates", "1"];
    let o = on_fake(&dir, 1, &spills, &timed);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("warning: sm_90: a kernel spills registers or is missing"),
        "{}",
        stderr(&o)
    );
}

/// The counts the fake driver wrote (`RECIPE_FAKE_CUDA_STATS`): kernels, captures, graph
/// launches, allocations.
fn stats(path: &Path) -> Value {
    serde_json::from_str(&std::fs::read_to_string(path).unwrap_or_else(|e| {
        panic!("{}: {e}", path.display());
    }))
    .unwrap()
}

/// The tiny BERT, 20 optimizer steps in fp32, on the fake GPU against the CPU (the issue's
/// curve goal, 1e-5), launching directly (`RECIPE_CUDA_GRAPHS=0`); again as a run does by
/// default, its passes replayed as CUDA graphs, which must give the same bits as the direct
/// passes and must have been replayed (the driver counts its launches).
#[test]
fn the_tiny_bert_trains_on_the_fake_gpu_as_on_the_cpu() {
    let dir = workspace("fake-tiny", TINY);
    let epochs = ["--set", "train.epochs=5"];
    let direct_stats = dir.join("direct-stats.json");
    let counted = [
        ("RECIPE_CUDA_GRAPHS", "0"),
        ("RECIPE_FAKE_CUDA_STATS", direct_stats.to_str().unwrap()),
    ];
    let (worst, direct) = against_the_cpu(&dir, "tiny", "tiny.rcp", &epochs, 1, &counted, 1e-5);
    assert!(direct.len() >= 20, "{} steps", direct.len());
    eprintln!(
        "fp32: {} steps, losses within {worst:e} of the CPU's",
        direct.len()
    );
    // A direct run captures nothing (the counts are written at captures, graph launches and
    // a stream's first cuBLASLt GEMM).
    let s = stats(&direct_stats);
    assert_eq!(
        (&s["captures"], &s["graph_launches"]),
        (&0.into(), &0.into()),
        "{s}"
    );
    // The first GPU run compiled the kernels and left them in the cache (RECIPE_CACHE, as
    // on_fake sets it); the later runs read them from there instead of compiling again, so the
    // entry is not written again.
    let cached = || {
        let entries: Vec<_> = std::fs::read_dir(dir.join("cache").join("kernels"))
            .expect("the kernel cache")
            .map(|e| e.unwrap().path())
            .collect();
        assert_eq!(entries.len(), 1, "one entry: {entries:?}");
        let modified = std::fs::metadata(&entries[0]).unwrap().modified().unwrap();
        (entries[0].clone(), modified)
    };
    let first = cached();
    let graph_stats = dir.join("graph-stats.json");
    let (_, graphs) = against_the_cpu(
        &dir,
        "graphs",
        "tiny.rcp",
        &epochs,
        1,
        &[("RECIPE_FAKE_CUDA_STATS", graph_stats.to_str().unwrap())],
        1e-5,
    );
    assert_eq!(
        graphs, direct,
        "graph replays differ from the direct passes"
    );
    // And with asynchronous streams (see the offload test), graphs and all.
    let late = [
        ("RECIPE_FAKE_CUDA_ASYNC", "20"),
        ("RECIPE_CUDA_GRAPHS", "1"),
    ];
    let (_, graphs_late) = against_the_cpu(&dir, "late", "tiny.rcp", &epochs, 1, &late, 1e-5);
    assert_eq!(graphs_late, direct, "asynchronous streams differ");
    assert_eq!(cached(), first, "a later run compiled the kernels again");
    let s = stats(&graph_stats);
    // The training shapes (a full micro-batch and an epoch's last, shorter one) and the
    // evaluation's are captured once each and replayed after.
    let launches = s["graph_launches"].as_u64().unwrap();
    assert!(launches >= 30, "{s}");
    assert!(s["captures"].as_u64().unwrap() >= 2, "{s}");
}

/// fp16 (loss scaling, skipped steps) and bf16 on the fake GPU against the CPU. The fake's
/// GEMMs add in the CPU backend's order, so the runs agree far closer than a GPU's would
/// (scripts/gpu-check.sh allows 2e-3 in fp16 there): a misrounded half operand shows, and so
/// does a 16-bit GEMM output rounded twice (the fake's cuBLASLt adds split-K halves in the
/// output's type unless the preference rules that out, as cuBLASLt may).
///
/// The GEMMs run through cuBLASLt (the fake counts the calls: every dense and strided GEMM,
/// none through cuBLAS's; only the pointer-list batches of attention's products stay there);
/// with `RECIPE_GEMM_LIBRARY=cublas`, with a cuBLASLt whose heuristic finds nothing, and with
/// one whose `cublasLtMatmul` refuses every call, they run through cuBLAS, with the same bits
/// here (the fake computes both alike).
#[test]
fn half_precision_trains_on_the_fake_gpu_as_on_the_cpu() {
    let dir = workspace("fake-half", TINY);
    for precision in ["fp16", "bf16"] {
        let set = format!("train.precision={precision}");
        let counts = dir.join(format!("{precision}-stats.json"));
        let env = [("RECIPE_FAKE_CUDA_STATS", counts.to_str().unwrap())];
        let (worst, steps) =
            against_the_cpu(&dir, precision, "tiny.rcp", &["--set", &set], 1, &env, 1e-5);
        eprintln!(
            "{precision}: {} steps, losses within {worst:e}",
            steps.len()
        );
        let s = stats(&counts);
        assert!(s["lt_matmuls"].as_u64().unwrap() > 0, "{s}");
        assert_eq!(s["blas_gemms"], 0, "{s}");
        if precision == "fp16" {
            continue;
        }
        for (name, env) in [
            ("on-cublas", ("RECIPE_GEMM_LIBRARY", "cublas")),
            ("no-algorithm", ("RECIPE_FAKE_CUBLASLT_NO_ALGORITHM", "1")),
            ("lt-refuses", ("RECIPE_FAKE_CUBLASLT_REFUSE", "1")),
        ] {
            let counts = dir.join(format!("{name}-stats.json"));
            let env = [env, ("RECIPE_FAKE_CUDA_STATS", counts.to_str().unwrap())];
            let (_, other) =
                against_the_cpu(&dir, name, "tiny.rcp", &["--set", &set], 1, &env, 1e-5);
            assert_eq!(other, steps, "{name}: not the cuBLASLt run's losses");
            // The training losses are bf16-coarse: the gradient norms and the evaluation's
            // losses show a GEMM's extra rounding where they do not.
            assert_eq!(
                norms_and_eval(&dir.join(format!("{name}-cuda"))),
                norms_and_eval(&dir.join(format!("{precision}-cuda"))),
                "{name}: not the cuBLASLt run's gradient norms or evaluation losses"
            );
            let s = stats(&counts);
            assert_eq!(s["lt_matmuls"], 0, "{name}: {s}");
            assert!(s["blas_gemms"].as_u64().unwrap() > 0, "{name}: {s}");
        }
    }
}

/// Heads of 32 (all-MiniLM-L6-v2's, recipes/cls.rcp's model) and of 64 (BERT-base's) train
/// through the fused attention kernels on a GPU (`attention_fused`, `attention_bwd_dq`,
/// `attention_bwd_dkv`: 16-bit buffers, at most 128 keys), with q's, k's and v's biases added
/// as they load them and dq, dk and dv written into the rows of the projections' one weight
/// matrix (docs/cuda.md). The tiny model widened to such heads trains on the fake GPU in bf16:
/// its losses within 1e-5 of the CPU's; with the side stream run late, the same bits as in
/// order; with the batched products (`RECIPE_FUSED_ATTENTION=0`), gradient norms and
/// evaluation losses within 1e-3. Not the same bits: the fused backward adds a row's Σ dp·p in
/// another order than the softmax backward (attention.cu), which at heads of 64 moves some
/// gradients by an ulp on some batches (here from the first step, with hidden dropout). A
/// profiled run shows the three kernels, its evaluations' forward included (no softmax kernel of
/// the batched products), and the unfused one none.
#[test]
fn heads_of_32_and_64_train_through_the_fused_attention_on_the_fake_gpu() {
    for (hidden, heads) in [(64, 2), (128, 2)] {
        // One epoch (4 steps, an evaluation): the larger model's updates are most of a run.
        let recipe = TINY.replace("epochs = 2", "epochs = 1");
        assert_ne!(recipe, TINY);
        let dir = workspace(&format!("fake-fused-{hidden}"), &recipe);
        let config = CONFIG
            .replace("\"hidden_size\": 32", &format!("\"hidden_size\": {hidden}"))
            .replace(
                "\"num_attention_heads\": 2",
                &format!("\"num_attention_heads\": {heads}"),
            );
        assert_ne!(config, CONFIG);
        std::fs::write(dir.join("config.json"), config).unwrap();
        let head = hidden / heads;
        let set = ["--set", "train.precision=bf16"];
        let (_, fused) = against_the_cpu(&dir, "fused", "tiny.rcp", &set, 1, &[], 1e-5);
        let fused_norms = norms_and_eval(&dir.join("fused-cuda"));
        let late = [
            ("RECIPE_FAKE_CUDA_LAZY", "others"),
            ("RECIPE_FAKE_CUDA_ASYNC", "20"),
        ];
        let (_, other) = against_the_cpu(&dir, "late", "tiny.rcp", &set, 1, &late, 1e-5);
        assert_eq!(
            (other, norms_and_eval(&dir.join("late-cuda"))),
            (fused.clone(), fused_norms.clone()),
            "heads of {head}, side stream late: not the fused run's losses, gradient norms or \
             evaluation"
        );
        let unfused = [("RECIPE_FUSED_ATTENTION", "0")];
        against_the_cpu(&dir, "unfused", "tiny.rcp", &set, 1, &unfused, 1e-5);
        let other = norms_and_eval(&dir.join("unfused-cuda"));
        assert_eq!(other.len(), fused_norms.len(), "heads of {head}");
        for (a, b) in other.iter().zip(&fused_norms) {
            let (a, b) = (a.as_f64().unwrap(), b.as_f64().unwrap());
            assert!(
                (a - b).abs() <= 1e-3 * b.abs(),
                "heads of {head}: unfused {a} vs fused {b} (gradient norm or evaluation loss)"
            );
        }
        for (name, fused_attention) in [("profiled", "1"), ("profiled-unfused", "0")] {
            let out = format!("train.output_dir=\"{name}\"");
            let o = on_fake(
                &dir,
                1,
                &[("RECIPE_FUSED_ATTENTION", fused_attention)],
                &[
                    &["run", "--quiet", "--device", "cuda", "--profile"],
                    &set[..],
                    &["--set", &out, "tiny.rcp"],
                ]
                .concat(),
            );
            assert_eq!(o.status.code(), Some(0), "{name}: {}", stderr(&o));
            no_refusals(name, &o);
            let p = profile(&dir.join(name));
            let names = operation_names(&p);
            for k in ["attention_fused", "attention_bwd_dq", "attention_bwd_dkv"] {
                assert_eq!(
                    names.iter().any(|n| n.starts_with(k)),
                    fused_attention == "1",
                    "heads of {head}, {name}: {k} in {names:?}"
                );
            }
            // The evaluations' forward takes the fused kernel too (bert.rs, `self_attention`):
            // no softmax of the batched products anywhere in the run.
            assert_eq!(
                names.iter().any(|n| n.starts_with("attention_softmax")),
                fused_attention == "0",
                "heads of {head}, {name}: attention_softmax in {names:?}"
            );
        }
    }
}

/// Optimizer offload (ZeRO-2, the optimizer on the host, copies overlapped with the backward)
/// in fp16: the GPU keeps the model, the host steps. Again with asynchronous streams
/// (`RECIPE_FAKE_CUDA_ASYNC`: each stream's operations run on a thread of their own, 20 µs
/// apart, while the host goes on), where a copy not ordered after the work it reads, or a host
/// reading a download before its wait, reads early: without `copy_stream`'s join of the work
/// stream, the fp16 run's loss scales differ there and its losses by 6e-3 (the synchronous
/// driver cannot see it).
#[test]
fn optimizer_offload_trains_on_the_fake_gpu_as_on_the_cpu() {
    let recipe = format!("{TINY}zero 2 {{ offload optimizer = cpu }}\n");
    let dir = workspace("fake-offload", &recipe);
    against_the_cpu(
        &dir,
        "offload",
        "tiny.rcp",
        &["--set", "train.precision=fp16"],
        1,
        &[],
        1e-5,
    );
    let late = [("RECIPE_FAKE_CUDA_ASYNC", "20")];
    against_the_cpu(
        &dir,
        "offload-async",
        "tiny.rcp",
        &["--set", "train.precision=fp16"],
        1,
        &late,
        1e-5,
    );
}

/// A checkpoint written on the GPU resumes on the CPU, and the CPU's on the GPU, each ending
/// where the CPU alone ends (the checkpoints are the same files).
#[test]
fn a_checkpoint_moves_from_the_fake_gpu_to_the_cpu() {
    let dir = workspace("fake-resume", TINY);
    let save = ["--set", "train.save_every=4"];
    let run = |device: &str, out: &str, resume: Option<&str>| {
        let out = format!("train.output_dir=\"{out}\"");
        let mut a = vec!["run", "--quiet", "--device", device, "--set", &out];
        a.extend_from_slice(&save);
        if let Some(r) = resume {
            a.extend_from_slice(&["--resume", r]);
        }
        a.push("tiny.rcp");
        let o = on_fake(&dir, 1, &[], &a);
        assert_eq!(o.status.code(), Some(0), "{device}: {}", stderr(&o));
        no_refusals(device, &o);
    };
    run("cpu", "alone", None);
    run("cuda", "gpu", None);
    run("cpu", "gpu", Some("gpu/checkpoint-4"));
    // And back: the CPU's checkpoint resumed on the GPU.
    run("cuda", "back", Some("alone/checkpoint-4"));
    let last = |d: &str| steps(&dir.join(d)).0.last().cloned().unwrap();
    let alone = last("alone");
    for moved in [last("gpu"), last("back")] {
        assert_eq!(alone.0, moved.0);
        assert!(
            (alone.1 - moved.1).abs() <= 1e-5 * alone.1.abs(),
            "{alone:?} {moved:?}"
        );
    }
}

/// A GPU too small for the run: the run stops with the reason and what to change, exit 1, no
/// panic (the fake driver's memory is `RECIPE_FAKE_CUDA_MEMORY` bytes).
#[test]
fn an_out_of_memory_gpu_stops_the_run_with_its_reason() {
    let dir = workspace("fake-oom", TINY);
    let o = on_fake(
        &dir,
        1,
        &[("RECIPE_FAKE_CUDA_MEMORY", "40000000")],
        &["run", "--quiet", "--device", "cuda", "tiny.rcp"],
    );
    let e = stderr(&o);
    assert_eq!(o.status.code(), Some(1), "{e}");
    assert!(
        e.contains("is out of memory") && e.contains("lower batch.micro"),
        "{e}"
    );
    assert!(!e.contains("panicked"), "{e}");
}

/// A micro-batch whose attention probabilities reach 2³¹ elements (1100 × 2 heads × 1024²) is
/// refused before anything is allocated on the GPU, naming the tensor and what to lower: the
/// kernels index with 32-bit ints, and the first launch would have stopped the run with a
/// panic. The CPU, which indexes with usize, is not refused; nor is the same model at 1000 rows.
#[test]
fn a_gpu_tensor_past_32_bit_indices_is_refused_before_the_run() {
    let dir = workspace("fake-int-indices", TINY);
    let config = CONFIG.replace(
        "\"max_position_embeddings\": 64",
        "\"max_position_embeddings\": 1024",
    );
    assert_ne!(config, CONFIG);
    std::fs::write(dir.join("config.json"), config).unwrap();
    let run = |micro: &str| {
        let micro = format!("batch.micro={micro}");
        on_fake(
            &dir,
            1,
            &[],
            &[
                "run",
                "--quiet",
                "--device",
                "cuda",
                "--stop-after",
                "1",
                "--set",
                "data.max_len=1024",
                "--set",
                "batch.accumulate=1",
                "--set",
                &micro,
                "tiny.rcp",
            ],
        )
    };
    let o = run("1100");
    let e = stderr(&o);
    assert_eq!(o.status.code(), Some(2), "{e}");
    assert!(
        e.contains(
            "the attention probabilities: micro 1100 × heads 2 × 1024 × 1024 tokens = 2306867200"
        ) && e.contains("lower batch.micro"),
        "{e}"
    );
    assert!(!e.contains("panicked"), "{e}");
    // 1000 × 2 × 1024² = 2097152000 < 2³¹: past the check (it then trains or stops for other
    // reasons, never for this one).
    let e = stderr(&run("1000"));
    assert!(!e.contains("2³¹"), "{e}");
}

/// Two GPUs, one rank each, exchanging through NCCL (the fake's, in host memory, summing in
/// rank order): ZeRO-0, ZeRO-2 in fp16 and ZeRO-3, on asynchronous streams, where the sums
/// queued on the copy stream overlap the pass; against the CPU's two simulated ranks. Without
/// `join_copies`' event (the compute stream waiting for the queued sums), ZeRO-3's losses
/// differ by 1.3e-3 here. And recipes/cls.rcp's shape, ZeRO-2 with the optimizer offloaded in
/// fp16 (and ZeRO-3 offloaded in bf16): each rank's partition lands in pinned memory during
/// the window's last backward, each segment's piece copied down once reduced and added, and
/// goes up range by range on the copy stream before the owners' broadcasts; ZeRO-1 offloaded in
/// bf16 averages the whole on the devices, sums its norm there and lands the rank's range during
/// the last backward (each segment's part once summed and averaged: without the compute
/// stream's join before the averaging, its losses differ by 1.4e-3 here).
#[test]
fn two_fake_gpus_train_through_nccl_as_the_cpu_ranks_do() {
    let dir = workspace("fake-nccl", TINY);
    std::fs::write(dir.join("zero2.rcp"), format!("{TINY}zero 2\n")).unwrap();
    std::fs::write(dir.join("zero3.rcp"), format!("{TINY}zero 3\n")).unwrap();
    let offload = |stage| format!("{TINY}zero {stage} {{ offload optimizer = cpu }}\n");
    std::fs::write(dir.join("zero2-offload.rcp"), offload(2)).unwrap();
    std::fs::write(dir.join("zero3-offload.rcp"), offload(3)).unwrap();
    std::fs::write(dir.join("zero1-offload.rcp"), offload(1)).unwrap();
    let late = [("RECIPE_FAKE_CUDA_ASYNC", "20")];
    let fp16 = ["--set", "train.precision=fp16"];
    let bf16 = ["--set", "train.precision=bf16"];
    for (name, recipe, sets) in [
        ("zero0", "tiny.rcp", &[][..]),
        ("zero2", "zero2.rcp", &fp16[..]),
        ("zero3", "zero3.rcp", &[][..]),
        ("zero2-offload", "zero2-offload.rcp", &fp16[..]),
        ("zero3-offload", "zero3-offload.rcp", &bf16[..]),
        ("zero1-offload", "zero1-offload.rcp", &bf16[..]),
    ] {
        let mut args = vec!["--gpus", "2"];
        args.extend_from_slice(sets);
        against_the_cpu(&dir, name, recipe, &args, 2, &late, 1e-5);
        let (_, start) = steps(&dir.join(format!("{name}-cuda")));
        assert_eq!(start["world"], 2, "{name}: {start}");
        assert_eq!(start["exchange_on_device"], true, "{name}: {start}");
    }
}

/// The profile.json a `--profile` run wrote into its output folder `out`.
fn profile(out: &Path) -> Value {
    serde_json::from_str(&std::fs::read_to_string(out.join("profile.json")).unwrap()).unwrap()
}

/// The names of a profile's rows (the timed operations).
fn operation_names(p: &Value) -> Vec<&str> {
    p["rows"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["name"].as_str().unwrap())
        .collect()
}

/// `--profile` times every GPU operation with CUDA events (on asynchronous streams, reached
/// when the stream gets there) into profile.json.
#[test]
fn a_profiled_run_writes_the_fake_gpus_operations() {
    let dir = workspace("fake-profile", TINY);
    let o = on_fake(
        &dir,
        1,
        &[("RECIPE_FAKE_CUDA_ASYNC", "20")],
        &[
            "run",
            "--quiet",
            "--device",
            "cuda",
            "--profile",
            "tiny.rcp",
        ],
    );
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    no_refusals("profile", &o);
    let p = profile(&dir.join("out"));
    assert!(p["device"].as_str().unwrap().contains("fake"), "{p}");
    let names = operation_names(&p);
    for k in ["layernorm_fwd", "cross_entropy", "adamw_step"] {
        assert!(
            names.iter().any(|n| n.starts_with(k)),
            "{k} not in {names:?}"
        );
    }
    assert!(p["busy_s"].as_f64().unwrap() > 0.0, "{p}");
    // The word embeddings' step in two parts only when asked (`RECIPE_ROWS_FIRST=1`); a value
    // it does not know stops the run before it trains.
    let parts = ["rows_mark", "adamw_rows", "rows_unmark"];
    assert!(!names.iter().any(|n| parts.contains(n)), "{names:?}");
    let args = [
        "run",
        "--quiet",
        "--device",
        "cuda",
        "--profile",
        "--set",
        "train.output_dir=\"rows\"",
        "tiny.rcp",
    ];
    let o = on_fake(&dir, 1, &[("RECIPE_ROWS_FIRST", "1")], &args);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    no_refusals("rows first", &o);
    let p = profile(&dir.join("rows"));
    let names = operation_names(&p);
    for k in parts {
        assert!(names.contains(&k), "{k} not in {names:?}");
    }
    let o = on_fake(&dir, 1, &[("RECIPE_ROWS_FIRST", "yes")], &args);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("RECIPE_ROWS_FIRST=yes"),
        "{}",
        stderr(&o)
    );
}

/// `recipe kernels --gemm-candidates`: each of BERT-base's GEMMs with the fake heuristic's
/// three algorithms (tokens and repetitions made small, `RECIPE_GEMM_BENCH`), the first the
/// base of the speed-ups, every call of every candidate run through `cublasLtMatmul` without a
/// refusal; with the GEMMs on cuBLAS it says why it cannot measure.
#[test]
fn gemm_candidates_are_timed_on_the_fake_gpu() {
    let dir = workspace("fake-gemm-candidates", TINY);
    let args = ["kernels", "--arch", "sm_90", "--gemm-candidates", "3"];
    let o = on_fake(
        &dir,
        1,
        &[("RECIPE_GEMM_BENCH", "8,1")],
        &[&args[..], &["--out", "k"]].concat(),
    );
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    no_refusals("--gemm-candidates", &o);
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(text.contains("less a step"), "{text}");
    let rows: Value = serde_json::from_str(
        &std::fs::read_to_string(dir.join("k").join("gemm-candidates.json")).unwrap(),
    )
    .unwrap();
    let rows = rows.as_array().unwrap();
    assert_eq!(rows.len(), 11 * 3, "11 GEMMs, 3 candidates each: {rows:?}");
    for r in rows {
        assert!(r["us"].as_f64().unwrap() > 0.0, "{r}");
        if r["rank"] == 0 {
            assert_eq!(r["speedup"], 1.0, "{r}");
        }
    }
    let o = on_fake(&dir, 1, &[("RECIPE_GEMM_LIBRARY", "cublas")], &args);
    assert_ne!(o.status.code(), Some(0));
    assert!(
        stderr(&o).contains("unset RECIPE_GEMM_LIBRARY"),
        "{}",
        stderr(&o)
    );
}

/// The bf16 tiny BERT on the fake GPU against the CPU as `name`, with `env`: its losses,
/// gradient norms and evaluation, and the fake's counts.
fn bf16_run(dir: &Path, name: &str, env: &[(&str, &str)]) -> (Vec<Step>, Vec<Value>, Value) {
    let set = ["--set", "train.precision=bf16"];
    let counts = dir.join(format!("{name}-stats.json"));
    let mut env = env.to_vec();
    env.push(("RECIPE_FAKE_CUDA_STATS", counts.to_str().unwrap()));
    let (_, steps) = against_the_cpu(dir, name, "tiny.rcp", &set, 1, &env, 1e-5);
    let s = stats(&counts);
    (steps, norms_and_eval(&dir.join(format!("{name}-cuda"))), s)
}

/// [`bf16_run`] on one stream (`RECIPE_SIDE_STREAM=0`), which the side stream's runs must
/// match bit for bit: its losses, gradient norms and evaluation.
fn one_stream_run(dir: &Path) -> (Vec<Step>, Vec<Value>) {
    let (steps, norms, s) = bf16_run(dir, "one-stream", &[("RECIPE_SIDE_STREAM", "0")]);
    assert_eq!(s["lt_streams"], 1, "{s}");
    assert_eq!(s["external_waits"], 0, "{s}");
    // Programmatic dependent launches are off unless asked for.
    assert_eq!(s["dependent_launches"], 0, "{s}");
    (steps, norms)
}

/// The weight gradients' GEMMs and each segment's rounding run on a second stream
/// (`Backend::aside`: beside the input gradients and the next layer's first kernels), and so
/// do each step's segment updates (`Kernels::update_aside`: beside the next forward), with the
/// same bits as on one stream (`RECIPE_SIDE_STREAM=0`). The fake proves the ordering under two
/// adversarial schedules (`RECIPE_FAKE_CUDA_LAZY`, on asynchronous streams and without graphs,
/// whose replays run in order): the side stream's work as late as the waits allow (a missing
/// wait lets the compute stream overwrite an input first: without the wait before either
/// LayerNorm backward that writes the output gradient a weight gradient reads, or the
/// backward's final join, the gradient norms differ), and the compute stream as late as they
/// allow (a missing fork lets a GEMM read its inputs before they are written). With graphs,
/// the captures hold the forks and joins (the fake refuses a capture that ends with a stream
/// not joined back). The tests after this one run the step before the forward, dependent
/// launches, the streams' priorities, and the sinks that read a segment as it is handed on.
#[test]
fn weight_gradients_beside_the_rest_keep_the_bits() {
    let dir = workspace("fake-side", TINY);
    let (steps, norms) = one_stream_run(&dir);
    // Each step's updates go aside too, segment by segment, and the next forward waits for
    // each as it reads the segment (`Kernels::update_aside`): directly, and in the graphs as
    // their own nodes (external waits), which the graphs captured before the first step (the
    // window's second micro-batch) hold too. The side stream late, a missing wait lets the
    // forward read a segment's old parameters; early, a missing fork lets an update read a
    // gradient before the backward has written it.
    //
    // With the word embeddings' rows first (`RECIPE_ROWS_FIRST=1`), the first segment's step
    // waits for the next micro-batch: the rows its tokens name are updated before its forward
    // and the rest beside it, which the backward waits for before it writes their gradient
    // (the rest zeroes it). The side stream late, a missing wait lets the rest zero the
    // gradient the backward wrote; early, a missing fork lets the rest read the rows' marks
    // before they are set, or update the named rows again (that the parts run:
    // `a_profiled_run_writes_the_fake_gpus_operations`).
    for graphs in ["0", "1"] {
        for (lazy, rows) in [
            ("others", "0"),
            ("first", "0"),
            ("others", "1"),
            ("first", "1"),
        ] {
            if rows == "1" && (graphs == "1") == (lazy == "first") {
                continue; // two of the four: the side stream late with graphs, early without
            }
            let env = [
                ("RECIPE_CUDA_GRAPHS", graphs),
                ("RECIPE_FAKE_CUDA_ASYNC", "20"),
                ("RECIPE_FAKE_CUDA_LAZY", lazy),
                ("RECIPE_ROWS_FIRST", rows),
            ];
            let name = format!("lazy-{lazy}-graphs-{graphs}-rows-{rows}");
            let (other, other_norms, s) = bf16_run(&dir, &name, &env);
            assert_eq!(s["lt_streams"], 2, "{name}: {s}");
            if graphs == "1" {
                assert!(s["graph_launches"].as_u64().unwrap() > 0, "{name}: {s}");
                assert!(s["external_waits"].as_u64().unwrap() > 0, "{name}: {s}");
            }
            assert_eq!(
                (other, other_norms),
                (steps.clone(), norms.clone()),
                "{name}: not the one-stream run's losses, gradient norms or evaluation"
            );
        }
    }
}

/// The step before the forward on the compute stream (`RECIPE_STEP_ASIDE=0`), and every kernel
/// as a programmatic dependent launch (the fake's compute capability is 9.0), directly and in
/// graphs, the side stream late, and with the program that signals early (`RECIPE_PDL=early`):
/// the one-stream run's bits (the fake starts a kernel after the one ahead of it either way; on
/// a GPU each kernel's GRID_WAIT keeps that order).
#[test]
fn the_step_before_the_forward_and_dependent_launches_keep_the_bits() {
    let dir = workspace("fake-side-pdl", TINY);
    let (steps, norms) = one_stream_run(&dir);
    let (other, other_norms, s) = bf16_run(&dir, "step-before", &[("RECIPE_STEP_ASIDE", "0")]);
    assert_eq!(s["external_waits"], 0, "{s}");
    assert_eq!((other, other_norms), (steps.clone(), norms.clone()));
    for (graphs, pdl) in [("0", "1"), ("1", "1"), ("1", "early")] {
        let name = format!("pdl-{pdl}-graphs-{graphs}");
        let env = [
            ("RECIPE_PDL", pdl),
            ("RECIPE_CUDA_GRAPHS", graphs),
            ("RECIPE_FAKE_CUDA_ASYNC", "20"),
            ("RECIPE_FAKE_CUDA_LAZY", "others"),
        ];
        let (other, other_norms, s) = bf16_run(&dir, &name, &env);
        assert!(s["dependent_launches"].as_u64().unwrap() > 0, "{name}: {s}");
        assert_eq!(
            (other, other_norms),
            (steps.clone(), norms.clone()),
            "{name}"
        );
    }
}

/// With graphs, the side stream behind the compute stream (the default: stream priorities,
/// kept per node) and of the same priority: the one-stream run's bits.
#[test]
fn the_side_streams_priority_keeps_the_bits_in_graphs() {
    let dir = workspace("fake-side-priority", TINY);
    let (steps, norms) = one_stream_run(&dir);
    for (name, side) in [("graphs", "1"), ("graphs-equal", "equal")] {
        let (other, other_norms, s) = bf16_run(&dir, name, &[("RECIPE_SIDE_STREAM", side)]);
        assert_eq!(s["lt_streams"], 2, "{name}: {s}");
        assert!(s["graph_launches"].as_u64().unwrap() > 0, "{name}: {s}");
        assert_eq!(
            (other, other_norms),
            (steps.clone(), norms.clone()),
            "{name}"
        );
    }
}

/// The sinks that read a segment's gradients as the backward hands it on (ZeRO-2's reductions
/// between two GPUs, the offload's copies to the host) join the side stream first, also when
/// it runs late: the same bits as on one stream.
#[test]
fn the_sinks_of_a_segment_join_the_side_stream_first() {
    let dir = workspace("fake-side-sinks", TINY);
    std::fs::write(dir.join("zero2.rcp"), format!("{TINY}zero 2\n")).unwrap();
    let offload = format!("{TINY}zero 2 {{ offload optimizer = cpu }}\n");
    std::fs::write(dir.join("offload.rcp"), offload).unwrap();
    let fp16 = ["--set", "train.precision=fp16"];
    for (name, recipe, gpus) in [("zero2", "zero2.rcp", 2), ("offload", "offload.rcp", 1)] {
        let mut args = vec!["--gpus", if gpus == 2 { "2" } else { "1" }];
        args.extend_from_slice(&fp16);
        let mut runs = Vec::new();
        for (tag, env) in [
            (
                "one-stream",
                [("RECIPE_SIDE_STREAM", "0"), ("RECIPE_CUDA_GRAPHS", "0")],
            ),
            (
                "lazy",
                [
                    ("RECIPE_FAKE_CUDA_LAZY", "others"),
                    ("RECIPE_CUDA_GRAPHS", "0"),
                ],
            ),
        ] {
            let run = format!("{name}-{tag}");
            let mut env = env.to_vec();
            env.push(("RECIPE_FAKE_CUDA_ASYNC", "20"));
            let (_, steps) = against_the_cpu(&dir, &run, recipe, &args, gpus, &env, 1e-5);
            runs.push((steps, norms_and_eval(&dir.join(format!("{run}-cuda")))));
        }
        assert_eq!(runs[0], runs[1], "{name}: lazy not the one-stream run's");
    }
}

/// `RECIPE_GEMM_ALGO=fastest`: each GEMM shape's first call times the cuBLASLt heuristic's
/// answers and the shape keeps the fastest, in the cache for later runs. The fake's answers
/// after the first add a product's terms in another order (`RECIPE_FAKE_CUBLASLT_DISTINCT`),
/// so the losses show which ran, and `RECIPE_FAKE_CUBLASLT_SLOW` makes some answers slow: with
/// the first slow, another is chosen (other bits than the heuristic's first); a second run with
/// the same cache keeps those choices although the others are now the slow ones (a run that
/// timed them again would take the first, as one with a fresh cache does). fp32: the tiny
/// model's 16-bit products add up exactly in either order.
#[test]
fn the_fastest_gemm_algorithms_are_chosen_once_and_kept() {
    let dir = workspace("fake-gemm-choice", TINY);
    let run = |name: &str, cache: &str, env: &[(&str, &str)]| {
        let out = format!("train.output_dir=\"{name}\"");
        let cache = dir.join(cache);
        let mut env = env.to_vec();
        env.push(("RECIPE_FAKE_CUBLASLT_DISTINCT", "1"));
        env.push(("RECIPE_CACHE", cache.to_str().unwrap()));
        // One epoch: the choices are made at the first GEMMs and kept; the second epoch would
        // repeat them (and cost this test half its time).
        let args = [
            "run",
            "--quiet",
            "--device",
            "cuda",
            "--set",
            &out,
            "--set",
            "train.epochs=1",
            "tiny.rcp",
        ];
        let o = on_fake(&dir, 1, &env, &args);
        assert_eq!(o.status.code(), Some(0), "{name}: {}", stderr(&o));
        no_refusals(name, &o);
        let (steps, _) = steps(&dir.join(name));
        (steps, norms_and_eval(&dir.join(name)))
    };
    let fastest = |name: &str, cache: &str, slow| {
        run(
            name,
            cache,
            &[
                ("RECIPE_GEMM_ALGO", "fastest"),
                ("RECIPE_FAKE_CUBLASLT_SLOW", slow),
            ],
        )
    };
    let first = run("first", "cache-first", &[]);
    let chosen = fastest("chosen", "cache", "0");
    assert_ne!(
        chosen, first,
        "the first answer slow: another chosen, other losses"
    );
    let books: Vec<_> = std::fs::read_dir(dir.join("cache").join("gemms"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert_eq!(books.len(), 1, "one book for the one GPU: {books:?}");
    let book: Value = serde_json::from_str(&std::fs::read_to_string(&books[0]).unwrap()).unwrap();
    let choices = book["choices"].as_object().unwrap();
    assert!(!choices.is_empty(), "{book}");
    for (shape, c) in choices {
        assert_eq!(c["of"], 3, "{shape}: {c}");
        assert_ne!(c["rank"], 0, "{shape}: {c}");
    }
    assert!(
        dir.join("cache-first").join("gemms").read_dir().is_err(),
        "the heuristic's first keeps no book"
    );
    let kept = fastest("kept", "cache", "1,2");
    assert_eq!(kept, chosen, "the kept choices, not timed again");
    let fresh = fastest("fresh", "cache-fresh", "1,2");
    assert_eq!(
        fresh, first,
        "timed with the others slow: the first everywhere"
    );
    // It chooses among cuBLASLt's answers: with cuBLAS alone, refused.
    let env = [
        ("RECIPE_GEMM_ALGO", "fastest"),
        ("RECIPE_GEMM_LIBRARY", "cublas"),
    ];
    let o = on_fake(
        &dir,
        1,
        &env,
        &["run", "--quiet", "--device", "cuda", "tiny.rcp"],
    );
    assert_ne!(o.status.code(), Some(0));
    assert!(
        stderr(&o).contains("RECIPE_GEMM_ALGO=fastest chooses among cuBLASLt's algorithms"),
        "{}",
        stderr(&o)
    );
}

/// Where a run trains and what it says of it. Without `--device`, on a machine whose GPUs could
/// train (here two fake ones), it trains on the CPU and says so once; `--device cpu` and
/// `--quiet` say nothing, nor does a machine whose driver reports no GPU. `--device auto` there
/// trains on the CPU and says why (a run meant for a GPU would otherwise go on unnoticed); with
/// a GPU it trains on it.
#[test]
fn a_run_says_where_it_trains_when_a_gpu_could_change_it() {
    let recipe = TINY.replace("epochs = 2", "max_steps = 1");
    assert_ne!(recipe, TINY);
    let dir = workspace("fake-device-choice", &recipe);
    let here = "note: this machine has 2 CUDA GPU(s) that could train; without --device the \
                run's 1 rank(s) train on the CPU";
    let why = "note: --device auto trains on the CPU: the CUDA driver reports no GPU";
    // (fake GPUs, arguments, the note said if any, whether the run trains on the GPU)
    let cases: [(usize, &[&str], Option<&str>, bool); 6] = [
        (2, &["run", "tiny.rcp"], Some(here), false),
        (2, &["run", "--device", "cpu", "tiny.rcp"], None, false),
        (2, &["run", "--quiet", "tiny.rcp"], None, false),
        (0, &["run", "tiny.rcp"], None, false),
        (
            0,
            &["run", "--device", "auto", "tiny.rcp"],
            Some(why),
            false,
        ),
        (1, &["run", "--device", "auto", "tiny.rcp"], None, true),
    ];
    for (i, (gpus, args, said, on_gpu)) in cases.into_iter().enumerate() {
        let what = format!("{gpus} GPU(s), {args:?}");
        let out = format!("train.output_dir=\"case{i}\"");
        let o = on_fake(&dir, gpus, &[], &[args, &["--set", &out]].concat());
        let err = stderr(&o);
        assert_eq!(o.status.code(), Some(0), "{what}: {err}");
        for note in [here, why] {
            let want = usize::from(said == Some(note));
            assert_eq!(err.matches(note).count(), want, "{what}: {err}");
        }
        // Nor the note for another count of GPUs.
        assert_eq!(
            err.contains("could train"),
            said == Some(here),
            "{what}: {err}"
        );
        let (_, start) = steps(&dir.join(format!("case{i}")));
        assert_eq!(
            start["device"].as_str().unwrap().contains("fake"),
            on_gpu,
            "{what}: {start}"
        );
    }
}

/// A run on a GPU `recipe` knows reports its model FLOPs utilization against that GPU's dense
/// peak for the run's precision (runtime/src/flops.rs); on another only with
/// `RECIPE_PEAK_TFLOPS`, which also wins over the table and works on the CPU; a bad value stops
/// the run before it starts. Every row of the tiny data is longer than `max_len` (24 tokens),
/// so every sample counts llm.c's FLOPs of a 24-token row, and a step's `mfu` over its
/// `samples_per_s` is exactly that count over the peak (both figures over the same time).
#[test]
fn a_gpu_recipe_knows_reports_the_runs_mfu() {
    let dir = workspace("fake-mfu", TINY);
    let config: Value = serde_json::from_str(CONFIG).unwrap();
    let (layers, hidden) = (
        config["num_hidden_layers"].as_u64().unwrap() as usize,
        config["hidden_size"].as_u64().unwrap() as usize,
    );
    let h200 = ("RECIPE_FAKE_CUDA_NAME", "NVIDIA H200");
    let given = ("RECIPE_PEAK_TFLOPS", "2.5");
    // (output, precision, device, environment, the peak and where it came from)
    type Case<'a> = (
        &'a str,
        &'a str,
        &'a str,
        &'a [(&'a str, &'a str)],
        Option<(f64, &'a str)>,
    );
    let cases: [Case; 6] = [
        (
            "h200-bf16",
            "bf16",
            "cuda",
            &[h200],
            Some((989.0, "NVIDIA H200 (sm_")),
        ),
        (
            "h200-fp32",
            "fp32",
            "cuda",
            &[h200],
            Some((67.0, "NVIDIA H200 (sm_")),
        ),
        ("unknown", "bf16", "cuda", &[], None),
        (
            "given",
            "bf16",
            "cuda",
            &[given],
            Some((2.5, "RECIPE_PEAK_TFLOPS")),
        ),
        (
            "given-h200",
            "bf16",
            "cuda",
            &[h200, given],
            Some((2.5, "RECIPE_PEAK_TFLOPS")),
        ),
        (
            "given-cpu",
            "fp32",
            "cpu",
            &[given],
            Some((2.5, "RECIPE_PEAK_TFLOPS")),
        ),
    ];
    for (name, precision, device, env, peak) in cases {
        let out = format!("train.output_dir=\"{name}\"");
        let prec = format!("train.precision={precision}");
        let args = ["run", "--device", device, "--set", &out, "--set", &prec];
        let o = on_fake(&dir, 1, env, &[&args[..], &["tiny.rcp"]].concat());
        let err = stderr(&o);
        assert_eq!(o.status.code(), Some(0), "{name}: {err}");
        no_refusals(name, &o);
        let records = metrics(&dir.join(name));
        let start = &records[0];
        assert_eq!(start["event"], "start", "{name}");
        let summary = err.lines().find(|l| l.starts_with("trained ")).unwrap();
        // A GPU without a known peak says why the run reports no MFU.
        let why = "note: no MFU: recipe does not know the dense peak of recipe fake GPU";
        assert_eq!(err.contains(why), name == "unknown", "{name}: {err}");
        let Some((tflops, from)) = peak else {
            assert!(start.get("peak_tflops").is_none(), "{name}: {start}");
            assert!(records.iter().all(|r| r.get("mfu").is_none()), "{name}");
            assert!(!summary.contains("MFU"), "{name}: {summary}");
            continue;
        };
        assert_eq!(
            start["peak_tflops"].as_f64(),
            Some(tflops),
            "{name}: {start}"
        );
        let named = start["peak_from"].as_str().unwrap();
        assert!(named.starts_with(from), "{name}: {named}");
        assert!(summary.contains("samples/s (MFU "), "{name}: {summary}");
        let per_row =
            flops::train_flops(start["parameters"].as_u64().unwrap(), layers, hidden, 1, 24);
        let steps: Vec<_> = records.iter().filter(|r| r["loss"].is_number()).collect();
        assert!(!steps.is_empty(), "{name}");
        for r in steps {
            let (mfu, rate) = (
                r["mfu"].as_f64().unwrap(),
                r["samples_per_s"].as_f64().unwrap(),
            );
            let counted = mfu * tflops * 1e12 / rate;
            assert!(
                (counted - per_row).abs() <= 1e-9 * per_row,
                "{name}: {counted} FLOPs a row, not {per_row}: {r}"
            );
        }
    }
    // A peak that is not a positive number: exit 2, nothing trained.
    for bad in ["0", "fast", "-1"] {
        let o = on_fake(
            &dir,
            1,
            &[("RECIPE_PEAK_TFLOPS", bad)],
            &["run", "--set", "train.output_dir=\"bad\"", "tiny.rcp"],
        );
        let err = stderr(&o);
        assert_eq!(o.status.code(), Some(2), "{bad}: {err}");
        assert!(
            err.contains("RECIPE_PEAK_TFLOPS") && err.contains("positive"),
            "{err}"
        );
        assert!(!dir.join("bad").exists(), "{bad}");
    }
}
