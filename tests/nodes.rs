//! `recipe run --node-rank K --master HOST:PORT`: one recipe spread over several processes
//! (nodes), here on the loopback interface. Two nodes of two ranks train the same bits as the
//! four ranks in one process, at ZeRO-0 and at ZeRO-3 with the optimizer offloaded; a run they
//! stop resumes in one process; a node started with another plan is refused, and both sides
//! say why.

use crate::common;

use std::path::Path;
use std::process::{Command, Output, Stdio};

use common::*;
use serde_json::Value;

/// A port nothing listens on now: bound, noted, released.
fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().port()
}

fn args(out: &str, extra: &[&str]) -> Vec<String> {
    let mut a: Vec<String> = [
        "run",
        "--quiet",
        "tiny.rcp",
        "--gpus",
        "2",
        "--nodes",
        "2",
        "--set",
        "batch.micro=3",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    a.extend(["--set".into(), format!("train.output_dir=\"{out}\"")]);
    a.extend(extra.iter().map(|s| s.to_string()));
    a
}

/// Starts every node of `per_node` (node k gets `per_node[k]` plus `--node-rank k`), all
/// meeting at one port, and waits for all of them.
fn nodes(dir: &Path, per_node: &[Vec<String>], env: &[(&str, &str)]) -> Vec<Output> {
    let master = format!("127.0.0.1:{}", free_port());
    let children: Vec<_> = per_node
        .iter()
        .enumerate()
        .map(|(k, a)| {
            Command::new(env!("CARGO_BIN_EXE_recipe"))
                .args(a)
                .args(["--node-rank", &k.to_string(), "--master", &master])
                .current_dir(dir)
                .env("NO_COLOR", "1")
                .env("RECIPE_CACHE", dir.join("cache"))
                .envs(env.iter().copied())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    children
        .into_iter()
        .map(|c| c.wait_with_output().unwrap())
        .collect()
}

fn all_ok(outs: &[Output]) {
    for (k, o) in outs.iter().enumerate() {
        assert_eq!(o.status.code(), Some(0), "node {k}: {}", stderr(o));
    }
}

/// Each logged step's loss, LR and gradient norm, exactly as written.
fn curve(dir: &Path) -> Vec<(Value, Value, Value, Value)> {
    metrics(dir)
        .into_iter()
        .filter(|r| r["loss"].is_number())
        .map(|r| {
            (
                r["step"].clone(),
                r["loss"].clone(),
                r["lr"].clone(),
                r["grad_norm"].clone(),
            )
        })
        .collect()
}

fn same_model(dir: &Path, a: &str, b: &str) {
    let read = |d: &str| std::fs::read(dir.join(d).join("model/model.safetensors")).unwrap();
    assert!(read(a) == read(b), "{a} and {b} saved different weights");
}

fn two_nodes_match_one_process(name: &str, zero: &[&str]) {
    let dir = workspace(name, &dp_recipe());
    let one = recipe_in(&dir, &refs(&args("one", zero)));
    assert_eq!(one.status.code(), Some(0), "{}", stderr(&one));

    let two = nodes(&dir, &[args("two", zero), args("two", zero)], &[]);
    all_ok(&two);
    // No launcher reads a hostfile here: R1001, which `recipe check` gives this recipe on two
    // nodes, is not printed.
    let check = recipe_in(&dir, &["check", "tiny.rcp", "--gpus", "2", "--nodes", "2"]);
    assert!(stderr(&check).contains("R1001"), "{}", stderr(&check));
    for o in two.iter().chain([&one]) {
        assert!(!stderr(o).contains("R1001"), "{}", stderr(o));
    }
    let c = curve(&dir.join("two"));
    assert_eq!(
        c.len(),
        4,
        "48 rows / 12 = 4 batches, windows of 2, 2 epochs"
    );
    assert_eq!(c, curve(&dir.join("one")));
    same_model(&dir, "one", "two");
    // Node 0 (rank 0) logged the run for all four ranks and drew its pictures, alone.
    let start = start_record(&dir.join("two"));
    assert_eq!(start["world"], 4);
    assert!(dir.join("two/loss.svg").is_file());
    let stray: Vec<_> = std::fs::read_dir(dir.join("two"))
        .unwrap()
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.contains("tmp"))
        .collect();
    assert!(stray.is_empty(), "{stray:?}");

    // Stopped on two nodes, resumed in one process: the uninterrupted run's end.
    let mut stop = zero.to_vec();
    stop.extend(["--stop-after", "2"]);
    all_ok(&nodes(&dir, &[args("r", &stop), args("r", &stop)], &[]));
    let mut rest = zero.to_vec();
    rest.extend(["--resume", "r/checkpoint-2"]);
    let o = recipe_in(&dir, &refs(&args("r", &rest)));
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    same_model(&dir, "one", "r");
}

/// `recipe build --target native -o built` of `dir`'s tiny.rcp with four ranks' micro-batch.
fn build_four_ranks(dir: &Path) -> Output {
    let o = recipe_in(
        dir,
        &[
            "build",
            "--target",
            "native",
            "-o",
            "built",
            "--set",
            "batch.micro=3",
            "tiny.rcp",
        ],
    );
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    o
}

fn refs(v: &[String]) -> Vec<&str> {
    v.iter().map(String::as_str).collect()
}

#[test]
fn two_nodes_train_the_bits_of_one_process_at_zero_0() {
    two_nodes_match_one_process("nodes0", &["--set", "zero.stage=0"]);
}

#[test]
fn two_nodes_train_the_bits_of_one_process_at_zero_3_offloaded() {
    two_nodes_match_one_process(
        "nodes3",
        &[
            "--set",
            "zero.stage=3",
            "--set",
            "zero.offload optimizer=cpu",
        ],
    );
}

#[test]
fn a_node_with_another_plan_is_refused_and_both_nodes_say_why() {
    let dir = workspace("nodes-refused", &dp_recipe());
    let outs = nodes(
        &dir,
        &[args("x", &[]), args("x", &["--set", "optimizer.lr=2e-3"])],
        &[("RECIPE_JOIN_TIMEOUT", "3")],
    );
    let (n0, n1) = (stderr(&outs[0]), stderr(&outs[1]));
    assert_eq!(outs[1].status.code(), Some(1), "{n1}");
    assert!(n1.contains("node 0 at 127.0.0.1:"), "{n1}");
    assert!(n1.contains("refused rank 2"), "{n1}");
    assert!(n1.contains("every node must run the same plan"), "{n1}");
    // Node 0 waited for the join timeout, then named who never came and who was turned away.
    assert_eq!(outs[0].status.code(), Some(1), "{n0}");
    assert!(
        n0.contains("2 of 4 rank(s) had joined; missing: rank(s) 2, 3"),
        "{n0}"
    );
    assert!(n0.contains("refused: 127.0.0.1:"), "{n0}");
    assert!(!dir.join("x/model").exists());
}

#[test]
fn node_flags_that_cannot_work_are_usage_errors() {
    let dir = workspace("nodes-usage", &dp_recipe());
    let run = |extra: &[&str]| {
        let mut a = vec!["run", "--quiet", "tiny.rcp"];
        a.extend(extra);
        recipe_in(&dir, &a)
    };
    let o = run(&[
        "--nodes",
        "2",
        "--node-rank",
        "2",
        "--master",
        "127.0.0.1:9",
    ]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("--node-rank 2 for a plan of 2 nodes (0..2)"),
        "{}",
        stderr(&o)
    );
    let o = run(&["--node-rank", "0", "--master", "127.0.0.1:9"]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("--node-rank for a plan of one node"),
        "{}",
        stderr(&o)
    );
    let o = run(&["--nodes", "2", "--node-rank", "0"]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("--master"), "{}", stderr(&o));
    let o = run(&["--nodes", "2", "--node-rank", "0", "--master", "node0"]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("HOST:PORT"), "{}", stderr(&o));
    // Without --node-rank every rank runs here, and the run says how to spread them.
    let o = recipe_in(
        &dir,
        &[
            "run",
            "tiny.rcp",
            "--nodes",
            "2",
            "--set",
            "train.max_steps=1",
        ],
    );
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("all run in this process; start it on each node with --node-rank"),
        "{}",
        stderr(&o)
    );
}

/// GPUs that sum across nodes (NCCL's place), emulated: node 0's process draws the blob (an
/// NCCL unique id), the hub hands it to every rank, and each node makes its devices' peers from
/// it once the run has gathered (`NodeOptions::connect`). Two nodes of two emulated GPUs at
/// ZeRO-2 in fp16, each GPU stepping its partition, train the bits of the four GPUs in one
/// process.
#[test]
fn two_nodes_of_gpus_sum_across_the_nodes_from_the_id_node_0_drew() {
    use recipe_kernel_emu::{Emu, EmuPeers};
    use recipe_runtime::backend::kernels::Kernels;
    use recipe_runtime::model::{Executor, OnDevice};
    use recipe_runtime::plan::Plan;
    use recipe_runtime::train::{self, NodeOptions, RunOptions};
    use std::sync::{Arc, Mutex};

    let recipe = dp_recipe()
        .replace(
            "batch { micro = 12, accumulate = 2 }",
            "batch { micro = 2, accumulate = 2 }",
        )
        .replace("max_len = 24", "max_len = 16")
        .replace("precision = fp32,", "precision = fp16,");
    let dir = workspace("nodes-gpus", &format!("{recipe}zero 2\n"));
    let o = recipe_in(
        &dir,
        &[
            "build", "--target", "native", "-o", "built", "--gpus", "2", "--nodes", "2", "tiny.rcp",
        ],
    );
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let mut plan = Plan::read(&dir.join("built/plan.json")).unwrap();
    assert_eq!((plan.batch.world, plan.batch.nodes), (4, 2));
    let dtype = plan.train.precision.module_dtype();
    let gpus = move |peers: Vec<EmuPeers>| -> Vec<Arc<dyn Executor>> {
        peers
            .into_iter()
            .map(|p| -> Arc<dyn Executor> {
                OnDevice::with_peers(
                    Kernels::new(Emu).with_store(dtype),
                    "emulated GPU",
                    Box::new(p),
                )
            })
            .collect()
    };
    let quiet = RunOptions {
        quiet: true,
        ..RunOptions::default()
    };

    plan.train.output_dir = dir.join("one");
    let one = RunOptions {
        executors: gpus(EmuPeers::group(4)),
        ..quiet.clone()
    };
    train::run(&plan, &one).unwrap();

    plan.train.output_dir = dir.join("two");
    // One group of four devices' ends, ranks 0–1 for node 0 and 2–3 for node 1.
    let mut ends = EmuPeers::group(4);
    let node1 = Mutex::new(Some(ends.split_off(2)));
    let node0 = Mutex::new(Some(ends));
    let parts = Arc::new([node0, node1]);
    let master = format!("127.0.0.1:{}", free_port());
    let seen = Arc::new(Mutex::new(Vec::new()));
    let summaries: Vec<_> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..2)
            .map(|k| {
                let (parts, seen, plan, quiet) = (parts.clone(), seen.clone(), &plan, &quiet);
                let master = master.clone();
                s.spawn(move || {
                    let connect: train::Connect = Arc::new(move |blob: &[u8]| {
                        seen.lock().unwrap().push((k, blob.to_vec()));
                        let ends = parts[k].lock().unwrap().take().ok_or("twice")?;
                        Ok(gpus(ends))
                    });
                    let options = RunOptions {
                        node: Some(NodeOptions {
                            rank: k,
                            master,
                            mode: "emulated+peers".into(),
                            blob: if k == 0 {
                                b"drawn by node 0".to_vec()
                            } else {
                                Vec::new()
                            },
                            connect: Some(connect),
                        }),
                        ..quiet.clone()
                    };
                    train::run(plan, &options)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for (k, s) in summaries.iter().enumerate() {
        let s = s.as_ref().unwrap_or_else(|e| panic!("node {k}: {e}"));
        assert_eq!(s.node.as_ref().unwrap().node, k);
    }
    // Each node made its devices once, from the id node 0 drew.
    let mut seen = seen.lock().unwrap().clone();
    seen.sort();
    assert_eq!(
        seen,
        [
            (0, b"drawn by node 0".to_vec()),
            (1, b"drawn by node 0".to_vec())
        ]
    );
    let start = start_record(&dir.join("two"));
    assert_eq!(start["exchange_on_device"], true, "{start}");
    assert_eq!(start["optimizer_on_device"], true, "{start}");
    assert_eq!(curve(&dir.join("two")), curve(&dir.join("one")));
    same_model(&dir, "one", "two");
}

/// `recipe build --target native` writes `launch-native.sh` for a plan of several nodes; run
/// with an `ssh` that runs its command here (the test's two "hosts" are this machine), it
/// starts both nodes, which train the bits of one process.
#[test]
fn launch_native_sh_starts_every_node_of_the_hostfile() {
    use std::os::unix::fs::PermissionsExt;
    let recipe = format!(
        "{}cluster {{ gpus = 2, nodes = 2, hostfile = \"hosts\" }}\n",
        dp_recipe()
    );
    let dir = workspace("nodes-launch", &recipe);
    std::fs::write(
        dir.join("hosts"),
        "# two hosts, one machine\nlocalhost slots=2\n\n127.0.0.1 slots=2\n",
    )
    .unwrap();
    let bin = dir.join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    // `ssh [-o OPTION]… HOST COMMAND`, run on this machine.
    std::fs::write(
        bin.join("ssh"),
        "#!/usr/bin/env bash\nwhile [[ $1 == -* ]]; do shift 2; done\nshift\nexec bash -c \"$*\"\n",
    )
    .unwrap();
    std::fs::set_permissions(bin.join("ssh"), std::fs::Permissions::from_mode(0o755)).unwrap();
    let o = build_four_ranks(&dir);
    assert!(stderr(&o).contains("launch-native.sh"), "{}", stderr(&o));

    let path = format!(
        "{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let o = Command::new(dir.join("built/launch-native.sh"))
        .arg("--quiet")
        .current_dir(&dir.0)
        .env("PATH", path)
        .env("RECIPE", env!("CARGO_BIN_EXE_recipe"))
        .env("MASTER_PORT", free_port().to_string())
        .env("RECIPE_CACHE", dir.join("cache"))
        .env("NO_COLOR", "1")
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));

    let one = recipe_in(
        &dir,
        &[
            "run",
            "--quiet",
            "tiny.rcp",
            "--set",
            "batch.micro=3",
            "--set",
            "train.output_dir=\"one\"",
        ],
    );
    assert_eq!(one.status.code(), Some(0), "{}", stderr(&one));
    assert_eq!(curve(&dir.join("out")), curve(&dir.join("one")));
    assert_eq!(curve(&dir.join("one")).len(), 4);
    same_model(&dir, "one", "out");

    // A hostfile of fewer hosts than nodes is refused before anything starts.
    std::fs::write(dir.join("hosts"), "localhost slots=2\n").unwrap();
    let o = Command::new(dir.join("built/launch-native.sh"))
        .current_dir(&dir.0)
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("lists 1 host(s), and the plan runs on 2 nodes"),
        "{}",
        stderr(&o)
    );
}

/// A recipe that names node 0 (`cluster.master_addr`, `master_port`) puts it in the plan, and
/// `recipe run plan.json --node-rank K` needs no `--master`.
#[test]
fn the_plan_carries_the_recipes_master_address() {
    let port = free_port();
    let recipe = format!(
        "{}cluster {{ gpus = 2, nodes = 2, master_addr = \"127.0.0.1\", master_port = {port} }}\n",
        dp_recipe()
    );
    let dir = workspace("nodes-master", &recipe);
    build_four_ranks(&dir);
    let plan: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("built/plan.json")).unwrap())
            .unwrap();
    assert_eq!(plan["batch"]["master"], format!("127.0.0.1:{port}"));
    let children: Vec<_> = (0..2)
        .map(|k| {
            Command::new(env!("CARGO_BIN_EXE_recipe"))
                .args([
                    "run",
                    "--quiet",
                    "built/plan.json",
                    "--node-rank",
                    &k.to_string(),
                ])
                .current_dir(&dir.0)
                .env("RECIPE_CACHE", dir.join("cache"))
                .stderr(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    let outs: Vec<Output> = children
        .into_iter()
        .map(|c| c.wait_with_output().unwrap())
        .collect();
    all_ok(&outs);
    assert_eq!(curve(&dir.join("out")).len(), 4);
}
