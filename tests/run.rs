//! `recipe run` end to end on a tiny seeded BERT (generated here: a config.json, random init)
//! with the real MiniLM tokenizer and 48 committed SpamAssassin rows: the steps taken equal
//! the prediction, resume is bit-identical, a saved plan runs the same, and bad input is
//! reported plainly.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn recipe_in(dir: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_recipe"))
        .args(args)
        .current_dir(dir)
        .env("NO_COLOR", "1")
        .env("RECIPE_CACHE", dir.join("cache"))
        .output()
        .unwrap()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

const CONFIG: &str = r#"{"architectures": ["BertModel"], "model_type": "bert", "vocab_size": 30522,
 "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 37,
 "hidden_act": "gelu", "hidden_dropout_prob": 0.1, "attention_probs_dropout_prob": 0.1,
 "max_position_embeddings": 64, "type_vocab_size": 2, "initializer_range": 0.02,
 "layer_norm_eps": 1e-12, "pad_token_id": 0}"#;

/// A fresh directory with the tiny model, the tokenizer, the data and a recipe whose extra
/// lines are `extra` (appended, so they override nothing but add blocks).
fn workspace(name: &str, recipe: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("recipe-run-{name}-{}", std::process::id()));
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
    dir
}

const TINY: &str = r#"recipe "tiny"
model bert { config = "config.json", task = classify(labels: ["ham", "spam"]) }
data { train = "train.jsonl", eval = "eval.jsonl", max_len = 24 }
batch { micro = 5, accumulate = 3 }
optimizer adamw { lr = 1e-3, weight_decay = 0.01 }
schedule linear { warmup = 2 }
train { epochs = 2, precision = fp32, seed = 7, logging_steps = 1, output_dir = "out" }
"#;

fn metrics(dir: &Path) -> Vec<Value> {
    std::fs::read_to_string(dir.join("metrics.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

#[test]
fn run_takes_the_predicted_steps_and_saves_an_hf_model() {
    let dir = workspace("steps", TINY);
    let o = recipe_in(&dir, &["steps", "--format", "json", "tiny.rcp"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let steps: Value = serde_json::from_slice(&o.stdout).unwrap();
    let predicted = steps["native"]["total"].as_u64().unwrap();
    // 48 rows / micro 5 = 10 micro-batches per epoch, windows of 3: 4 steps (the last over 1).
    assert_eq!(predicted, 8);

    let o = recipe_in(&dir, &["run", "--quiet", "tiny.rcp"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let m = metrics(&dir.join("out"));
    let end = m.iter().find(|r| r["event"] == "end").unwrap();
    assert_eq!(end["steps"]["taken"], predicted);
    assert_eq!(end["steps"]["predicted"], predicted);
    let logged: Vec<u64> = m
        .iter()
        .filter_map(|r| r["loss"].as_f64().map(|_| r["step"].as_u64().unwrap()))
        .collect();
    assert_eq!(logged, (1..=predicted).collect::<Vec<_>>());
    // The LR of each step is the schedule `explain` prints: linear, warmup 2 of 8, peak 1e-3.
    let lr: Vec<f64> = m.iter().filter_map(|r| r["lr"].as_f64()).collect();
    let want = [
        0.0,
        5e-4,
        1e-3,
        5e-4 * 5.0 / 3.0,
        5e-4 * 4.0 / 3.0,
        5e-4,
        5e-4 * 2.0 / 3.0,
        5e-4 / 3.0,
    ];
    for (k, (g, w)) in lr.iter().zip(want).enumerate() {
        assert!((g - w).abs() < 1e-12, "step {}: lr {g}, want {w}", k + 1);
    }
    assert!(
        m.iter().any(|r| r["eval"]["rows"] == 12),
        "no eval record: {m:?}"
    );
    // HF layout: config.json with the label names, model.safetensors, tokenizer.json.
    let model = dir.join("out/model");
    let config: Value =
        serde_json::from_str(&std::fs::read_to_string(model.join("config.json")).unwrap()).unwrap();
    assert_eq!(config["id2label"]["1"], "spam");
    assert!(model.join("model.safetensors").is_file());
    assert!(model.join("tokenizer.json").is_file());
    // A checkpoint at the end of epoch 1 (save_every = epoch), none half-written.
    assert!(dir.join("out/checkpoint-4/optimizer.safetensors").is_file());
    let leftovers: Vec<_> = std::fs::read_dir(dir.join("out"))
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().contains(".tmp"))
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
}

#[test]
fn a_resumed_run_ends_bit_identical_to_an_uninterrupted_one() {
    let dir = workspace("resume", TINY);
    let full = recipe_in(
        &dir,
        &[
            "run",
            "--quiet",
            "tiny.rcp",
            "--set",
            "train.output_dir=\"a\"",
        ],
    );
    assert_eq!(full.status.code(), Some(0), "{}", stderr(&full));
    // Stop inside the second epoch (step 6 of 8), then resume from there.
    let first = recipe_in(
        &dir,
        &[
            "run",
            "--quiet",
            "tiny.rcp",
            "--set",
            "train.output_dir=\"b\"",
            "--stop-after",
            "6",
        ],
    );
    assert_eq!(first.status.code(), Some(0), "{}", stderr(&first));
    assert!(
        !dir.join("b/model").exists(),
        "a stopped run wrote a final model"
    );
    let rest = recipe_in(
        &dir,
        &[
            "run",
            "--quiet",
            "tiny.rcp",
            "--set",
            "train.output_dir=\"b\"",
            "--resume",
            "b/checkpoint-6",
        ],
    );
    assert_eq!(rest.status.code(), Some(0), "{}", stderr(&rest));
    let a = std::fs::read(dir.join("a/model/model.safetensors")).unwrap();
    let b = std::fs::read(dir.join("b/model/model.safetensors")).unwrap();
    assert!(a == b, "resumed weights differ from the uninterrupted run");
    // The logged curve after the resume point is the same too.
    let curve = |d: &str| -> Vec<(u64, f64)> {
        metrics(&dir.join(d))
            .iter()
            .filter_map(|r| Some((r["step"].as_u64()?, r["loss"].as_f64()?)))
            .collect()
    };
    assert_eq!(curve("a"), curve("b"));
}

#[test]
fn a_saved_plan_runs_like_the_recipe() {
    let dir = workspace("plan", TINY);
    let o = recipe_in(
        &dir,
        &["build", "--target", "native", "-o", "built", "tiny.rcp"],
    );
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let plan: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("built/plan.json")).unwrap())
            .unwrap();
    assert_eq!(plan["format"], 1);
    assert_eq!(plan["steps"]["total"], 8);
    assert_eq!(plan["optimizer"]["no_decay"][0], "bias");
    let o = recipe_in(&dir, &["run", "--quiet", "built/plan.json"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    std::fs::rename(dir.join("out"), dir.join("from-plan")).unwrap();
    let o = recipe_in(&dir, &["run", "--quiet", "tiny.rcp"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let a = std::fs::read(dir.join("from-plan/model/model.safetensors")).unwrap();
    let b = std::fs::read(dir.join("out/model/model.safetensors")).unwrap();
    assert!(a == b, "the plan and the recipe trained different weights");
}

#[test]
fn a_bad_row_is_reported_with_file_and_line_and_nothing_is_trained() {
    let dir = workspace("badrow", TINY);
    let mut rows: Vec<String> = std::fs::read_to_string(dir.join("train.jsonl"))
        .unwrap()
        .lines()
        .map(str::to_string)
        .collect();
    rows[4] = r#"{"text": "half a row", "label": "#.into();
    std::fs::write(dir.join("train.jsonl"), rows.join("\n") + "\n").unwrap();
    let o = recipe_in(&dir, &["run", "--quiet", "tiny.rcp"]);
    assert_ne!(o.status.code(), Some(0));
    assert!(stderr(&o).contains("train.jsonl:5"), "{}", stderr(&o));
    assert!(!dir.join("out/model").exists());
}

#[test]
fn a_label_outside_the_declared_set_is_an_error() {
    let dir = workspace("badlabel", TINY);
    let text = std::fs::read_to_string(dir.join("train.jsonl")).unwrap();
    std::fs::write(
        dir.join("train.jsonl"),
        text.replacen("\"label\": 1", "\"label\": 7", 1),
    )
    .unwrap();
    let o = recipe_in(&dir, &["run", "--quiet", "tiny.rcp"]);
    assert_ne!(o.status.code(), Some(0));
    let e = stderr(&o);
    assert!(e.contains("train.jsonl:") && e.contains('7'), "{e}");
}

#[test]
fn what_is_not_built_yet_is_said_plainly() {
    let fp16 = TINY.replace("precision = fp32", "precision = fp16");
    let dir = workspace("fp16", &fp16);
    let o = recipe_in(&dir, &["run", "tiny.rcp"]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("not built yet"), "{}", stderr(&o));

    // ZeRO-2/3 partitioning over several ranks (stages 0 and 1 run; see below).
    let dir = workspace("gpus", &format!("{TINY}zero 2\n"));
    let o = recipe_in(&dir, &["run", "--gpus", "2", "tiny.rcp"]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("not built yet"), "{}", stderr(&o));
    assert!(stderr(&o).contains("ZeRO stage 2"), "{}", stderr(&o));

    let o = recipe_in(&dir, &["run", "--device", "cuda", "tiny.rcp"]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("not built yet"), "{}", stderr(&o));
}

#[test]
fn a_hub_model_that_is_not_cached_says_how_to_fetch_it() {
    let recipe = TINY.replace(
        "config = \"config.json\"",
        "from = \"sentence-transformers/all-MiniLM-L6-v2\"",
    );
    let dir = workspace("hub", &recipe);
    let o = recipe_in(&dir, &["run", "tiny.rcp"]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("scripts/fetch-minilm.sh"),
        "{}",
        stderr(&o)
    );
}

/// Final weights of a run, by tensor name.
fn weights(path: &Path) -> Vec<(String, Vec<f32>)> {
    recipe_runtime::checkpoint::read_safetensors(path)
        .unwrap()
        .tensors
        .into_iter()
        .map(|t| (t.name, t.data))
        .collect()
}

/// Data parallelism, ZeRO stages 0 and 1: N rank threads with micro-batch 12/N average their
/// gradients and train the same curve and weights as one process with micro-batch 12 (the global
/// batch held fixed; only the order of float sums differs). Stage 1 partitions the optimizer
/// state (each rank updates its partition, then the partitions are all-gathered).
#[test]
fn data_parallel_ranks_match_the_single_process_run() {
    for stage in [0, 1] {
        data_parallel_case(stage);
    }
}

fn data_parallel_case(stage: u32) {
    let recipe =
        TINY.replace(
            "batch { micro = 5, accumulate = 3 }",
            "batch { micro = 12, accumulate = 2 }",
        )
        .replace(
            "task = classify(labels: [\"ham\", \"spam\"]) }",
            "task = classify(labels: [\"ham\", \"spam\"]), dropout = 0 }",
        ) + &format!("zero {stage}\n");
    let dir = workspace(&format!("dp{stage}"), &recipe);
    let run = |world: u64, out: &str| {
        let micro = format!("batch.micro={}", 12 / world);
        let out_set = format!("train.output_dir=\"{out}\"");
        let gpus = world.to_string();
        let o = recipe_in(
            &dir,
            &[
                "run", "--quiet", "tiny.rcp", "--gpus", &gpus, "--set", &micro, "--set", &out_set,
            ],
        );
        assert_eq!(
            o.status.code(),
            Some(0),
            "stage {stage} world {world}: {}",
            stderr(&o)
        );
        let curve: Vec<f64> = metrics(&dir.join(out))
            .iter()
            .filter_map(|r| r["loss"].as_f64())
            .collect();
        (
            curve,
            weights(&dir.join(out).join("model/model.safetensors")),
        )
    };
    let (curve1, w1) = run(1, "w1");
    assert_eq!(
        curve1.len(),
        4,
        "48 rows / 12 = 4 batches, windows of 2, 2 epochs"
    );
    for world in [2u64, 3, 4] {
        let (curve, w) = run(world, &format!("w{world}"));
        assert_eq!(curve.len(), curve1.len(), "world {world}");
        for (k, (a, b)) in curve.iter().zip(&curve1).enumerate() {
            assert!(
                (a - b).abs() <= 1e-6 * b.abs(),
                "world {world} step {}: loss {a} vs {b}",
                k + 1
            );
        }
        // The whole model within 1e-6 relative (L2), and every tensor within 1e-5: the bias
        // gradients are sums of terms of both signs, whose rounding depends on how rows are
        // grouped, and Adam turns that into ~1e-6 relative changes of a bias (measured 1.4e-6
        // for value.bias at world 3).
        let norm = |v: &mut dyn Iterator<Item = f64>| v.map(|x| x * x).sum::<f64>().sqrt();
        let (mut all_diff, mut all_scale) = (0.0f64, 0.0f64);
        for ((name, a), (_, b)) in w.iter().zip(&w1) {
            let diff = norm(&mut a.iter().zip(b).map(|(x, y)| f64::from(x - y)));
            let scale = norm(&mut b.iter().map(|&x| f64::from(x))).max(1e-30);
            assert!(
                diff <= 1e-5 * scale,
                "world {world}: {name}: ‖Δ‖ {diff:e} vs ‖w‖ {scale:e}"
            );
            all_diff += diff * diff;
            all_scale += scale * scale;
        }
        let rel = (all_diff / all_scale).sqrt();
        assert!(
            rel <= 1e-6,
            "world {world}: the weights differ by {rel:e} (relative L2)"
        );
    }
}

/// ZeRO-1 checkpoints hold the gathered optimizer state: stage 1 trains the same bits as stage 0
/// at the same world size, and a run stopped on 2 ranks resumes on 3 (re-partitioned) and ends
/// where the uninterrupted run ends.
#[test]
fn zero1_state_is_gathered_and_resumes_on_another_world_size() {
    let recipe = TINY
        .replace(
            "batch { micro = 5, accumulate = 3 }",
            "batch { micro = 12, accumulate = 2 }",
        )
        .replace(
            "task = classify(labels: [\"ham\", \"spam\"]) }",
            "task = classify(labels: [\"ham\", \"spam\"]), dropout = 0 }",
        );
    let dir = workspace("zero1", &recipe);
    let run = |args: &[&str]| {
        let mut all = vec!["run", "--quiet", "tiny.rcp"];
        all.extend_from_slice(args);
        let o = recipe_in(&dir, &all);
        assert_eq!(o.status.code(), Some(0), "{args:?}: {}", stderr(&o));
    };
    let z0 = ["--set", "zero.stage=0"];
    let z1 = ["--set", "zero.stage=1"];
    run(&[
        &z0[..],
        &[
            "--gpus",
            "2",
            "--set",
            "batch.micro=6",
            "--set",
            "train.output_dir=\"s0\"",
        ],
    ]
    .concat());
    run(&[
        &z1[..],
        &[
            "--gpus",
            "2",
            "--set",
            "batch.micro=6",
            "--set",
            "train.output_dir=\"s1\"",
        ],
    ]
    .concat());
    let s0 = std::fs::read(dir.join("s0/model/model.safetensors")).unwrap();
    let s1 = std::fs::read(dir.join("s1/model/model.safetensors")).unwrap();
    assert!(
        s0 == s1,
        "ZeRO-1 and ZeRO-0 trained different weights on 2 ranks"
    );
    // What rank 0 held: the optimizer state halves under ZeRO-1, params and grads do not.
    let mem = |d: &str| {
        metrics(&dir.join(d))
            .into_iter()
            .find(|r| r["event"] == "start")
            .unwrap()["memory_rank0"]
            .clone()
    };
    let (m0, m1) = (mem("s0"), mem("s1"));
    assert_eq!(m1["params"], m0["params"]);
    assert_eq!(m1["grads"], m0["grads"]);
    let n = m0["optimizer"].as_u64().unwrap() / 8; // two fp32 moments per parameter
    assert_eq!(m1["optimizer"].as_u64().unwrap(), 8 * n.div_ceil(2));
    // Stop on 2 ranks after step 3 (inside epoch 2), resume on 3 ranks with the same global batch.
    run(&[
        &z1[..],
        &[
            "--gpus",
            "2",
            "--set",
            "batch.micro=6",
            "--set",
            "train.output_dir=\"r\"",
            "--stop-after",
            "3",
        ],
    ]
    .concat());
    run(&[
        &z1[..],
        &[
            "--gpus",
            "3",
            "--set",
            "batch.micro=4",
            "--set",
            "train.output_dir=\"r\"",
            "--resume",
            "r/checkpoint-3",
        ],
    ]
    .concat());
    let resumed = metrics(&dir.join("r"))
        .into_iter()
        .find(|r| r["event"] == "resume")
        .unwrap();
    assert_eq!(resumed["repartitioned"], true, "{resumed}");
    let a = weights(&dir.join("s1/model/model.safetensors"));
    let b = weights(&dir.join("r/model/model.safetensors"));
    let (mut diff, mut scale) = (0.0f64, 0.0f64);
    for ((_, x), (_, y)) in a.iter().zip(&b) {
        for (p, q) in x.iter().zip(y) {
            diff += f64::from(p - q).powi(2);
            scale += f64::from(*p).powi(2);
        }
    }
    let rel = (diff / scale).sqrt();
    assert!(rel <= 1e-6, "resumed on 3 ranks: weights differ by {rel:e}");
}

/// `reduce_lr_on_plateau`: the LR stays at its peak until evaluation losses stop improving, then
/// drops by `factor` — replayed here from the logged evaluation losses with torch's rule (mode
/// min, relative threshold 1e-4, `num_bad > patience`), on one rank and on two.
#[test]
fn reduce_lr_on_plateau_follows_the_evaluation_loss() {
    let recipe = TINY
        .replace(
            "schedule linear { warmup = 2 }",
            "schedule reduce_lr_on_plateau { factor = 0.5, patience = 0 }",
        )
        .replace("logging_steps = 1,", "logging_steps = 1, eval_every = 1,")
        .replace("optimizer adamw { lr = 1e-3", "optimizer adamw { lr = 3e-2");
    let dir = workspace("plateau", &recipe);
    for (gpus, micro, out) in [("1", "5", "p1"), ("2", "5", "p2")] {
        let out_set = format!("train.output_dir=\"{out}\"");
        let micro_set = format!("batch.micro={micro}");
        let o = recipe_in(
            &dir,
            &[
                "run", "--quiet", "tiny.rcp", "--gpus", gpus, "--set", &out_set, "--set",
                &micro_set,
            ],
        );
        assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
        let m = metrics(&dir.join(out));
        let lrs: Vec<f64> = m.iter().filter_map(|r| r["lr"].as_f64()).collect();
        let evals: Vec<f64> = m
            .iter()
            .filter_map(|r| r["eval"]["loss"].as_f64())
            .collect();
        assert_eq!(evals.len(), lrs.len(), "one evaluation per step");
        // Replay: step k+1 runs at the LR after the evaluation of step k.
        let (mut lr, mut best, mut bad) = (3e-2f64, f64::INFINITY, 0u32);
        let mut reduced = false;
        for (k, (&got, &loss)) in lrs.iter().zip(&evals).enumerate() {
            assert_eq!(got, lr, "gpus {gpus} step {}", k + 1);
            if loss < best * (1.0 - 1e-4) {
                best = loss;
                bad = 0;
            } else {
                bad += 1;
            }
            if bad > 0 {
                lr *= 0.5;
                bad = 0;
                reduced = true;
            }
        }
        assert!(
            reduced,
            "gpus {gpus}: the LR never dropped; the test shows nothing: {evals:?}"
        );
    }
}
