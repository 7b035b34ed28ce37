//! `recipe kernels [--arch sm_XY]… [--out DIR]`: the CUDA kernels through the same NVRTC path a
//! run uses, on any machine (no GPU, no driver), with each kernel's registers and spills as the
//! assembler NVRTC runs reports them: the compile gate of CI (scripts/check-kernels.sh) and a
//! check of a CUDA install.

use std::path::Path;

use recipe_runtime::backend::cuda::{compile, ptxas};
use recipe_runtime::backend::kernels::all_kernel_names;

use super::{FAILED, OK, USAGE};

/// The architectures checked when none is named: A100 and H100/H200.
const DEFAULT_ARCHS: &[&str] = &["sm_80", "sm_90"];

/// `--arch` values: `sm_` and a number.
pub fn arch(s: &str) -> Result<String, String> {
    match s.strip_prefix("sm_") {
        Some(n) if !n.is_empty() && n.chars().all(|c| c.is_ascii_alphanumeric()) => Ok(s.into()),
        _ => Err(format!(
            "`{s}` is not an architecture; write sm_80, sm_90, …"
        )),
    }
}

/// `on_gpu`: `--selftest`, and `--gemm-candidates N`.
pub fn run(
    archs: &[String],
    out: Option<&Path>,
    (selftest, gemm_candidates): (bool, Option<usize>),
) -> i32 {
    let archs: Vec<String> = if archs.is_empty() {
        DEFAULT_ARCHS.iter().map(|s| s.to_string()).collect()
    } else {
        archs.to_vec()
    };
    let version = match compile::nvrtc_version() {
        Ok(v) => v,
        Err(e) => {
            eprintln!("error: {e}");
            return USAGE;
        }
    };
    if let Some(dir) = out {
        if let Err(e) = std::fs::create_dir_all(dir) {
            eprintln!("error: cannot create {}: {e}", dir.display());
            return USAGE;
        }
    }
    // The program a run with this RECIPE_PDL compiles (`early`: with the early signal on sm_90
    // and newer), so that the gate assembles that one and the self-test's device loads it.
    let pdl = match recipe_runtime::backend::cuda::pdl_from_env() {
        Ok(p) => p,
        Err(e) => {
            eprintln!("error: {e}");
            return USAGE;
        }
    };
    let kernels = all_kernel_names();
    // On a GPU (--selftest, --gemm-candidates) the command checks numbers and times, with
    // whatever NVRTC that machine has: a spill there is reported, and fails only the gate.
    let gate = !selftest && gemm_candidates.is_none();
    // Every architecture at once, each on a thread of its own (NVRTC compiles separate programs
    // side by side), then reported in order.
    let built: Vec<Built> = std::thread::scope(|s| {
        let threads: Vec<_> = archs
            .iter()
            .map(|arch| s.spawn(move || build(arch, pdl, out)))
            .collect();
        threads
            .into_iter()
            .map(|t| t.join().expect("a compile thread panicked"))
            .collect()
    });
    let mut failed = false;
    for (arch, b) in archs.iter().zip(built) {
        let compiled = match b.compiled {
            Ok(c) => c,
            Err(e) => {
                eprintln!("error: {e}");
                failed = true;
                continue;
            }
        };
        println!(
            "NVRTC {}.{}: {} kernels for {arch}: PTX {} bytes, CUBIN {} bytes",
            version.0,
            version.1,
            kernels.len(),
            compiled.ptx.len(),
            compiled.cubin.len()
        );
        let warnings = ptxas::without_report(&compiled.log);
        if !warnings.is_empty() {
            eprintln!("NVRTC log for {arch}:\n{warnings}");
        }
        if let Err(e) = b.written {
            eprintln!("error: {e}");
            return USAGE;
        }
        failed |= print_reports(arch, &ptxas::parse(&compiled.log), &kernels, gate);
    }
    if let Some(max) = gemm_candidates {
        if let Err(code) = time_gemm_candidates(max, out) {
            return code;
        }
    }
    if selftest {
        match self_test(out) {
            Ok(ok) => failed |= !ok,
            Err(code) => return code,
        }
    }
    if failed {
        FAILED
    } else {
        OK
    }
}

/// `--gemm-candidates`: a table of each GEMM's candidates (µs a call, speed-up over the
/// heuristic's first) and what the best of each would save a step; with `out`, the rows as
/// gemm-candidates.json.
fn time_gemm_candidates(max: usize, out: Option<&Path>) -> Result<(), i32> {
    use recipe_runtime::backend::cuda::{gemm_bench, gemm_choice, CudaDevice};
    let dev = CudaDevice::open(0).map_err(|e| {
        eprintln!("error: {e}");
        USAGE
    })?;
    let (name, arch) = dev.describe();
    println!("cuBLASLt's candidates for BERT-base's GEMMs on {name} ({arch}), bf16:");
    // RECIPE_GEMM_BENCH=TOKENS,REPS: a smaller run (tests/fake_cuda.rs, on the CPU).
    let (tokens, reps) = std::env::var("RECIPE_GEMM_BENCH")
        .ok()
        .and_then(|v| {
            let (t, r) = v.split_once(',')?;
            Some((t.trim().parse().ok()?, r.trim().parse().ok()?))
        })
        .unwrap_or((32 * 128, 20));
    let rows = dev.gemm_candidates(tokens, max.max(1), reps).map_err(|e| {
        eprintln!("error: {e}");
        FAILED
    })?;
    println!(
        "  {:<36} {:>4} {:>6} {:>9} {:>8}",
        "GEMM", "rank", "waves", "µs", "speed-up"
    );
    for r in &rows {
        println!(
            "  {:<36} {:>4} {:>6.2} {:>9.2} {:>8.3}",
            r.case, r.rank, r.waves, r.us, r.speedup
        );
    }
    println!(
        "the best candidate of each, in place of the first: {:.3} ms less a step (of the GEMMs' calls a step)",
        gemm_bench::step_saving_us(&rows) / 1e3
    );
    println!(
        "RECIPE_GEMM_ALGO=fastest's choice (another only where more than {} % faster): {:.3} ms less a step",
        gemm_choice::MARGIN * 100.0,
        gemm_bench::fastest_saving_us(&rows) / 1e3
    );
    if let Some(dir) = out {
        let json = serde_json::to_string_pretty(&rows).unwrap_or_default();
        if let Err(e) = write_atomic(&dir.join("gemm-candidates.json"), json.as_bytes()) {
            eprintln!("error: {e}");
            return Err(USAGE);
        }
    }
    Ok(())
}

/// Every operation on GPU 0 against the CPU backend, per storage dtype; true when all pass.
fn self_test(out: Option<&Path>) -> Result<bool, i32> {
    use recipe_runtime::backend::cuda::CudaDevice;
    use recipe_runtime::backend::kernels::Kernels;
    use recipe_runtime::backend::selftest::{
        compare, compare_graph_replay, compare_optim, compare_queued_upload, compare_update_wait,
        compare_wide_batched,
    };
    use recipe_runtime::precision::Dtype;
    let dev = CudaDevice::open(0).map_err(|e| {
        eprintln!("error: {e}");
        USAGE
    })?;
    let (name, arch) = dev.describe();
    println!(
        "self-test on {name} ({arch}; {}) against the CPU backend:",
        dev.libraries()
    );
    let mut kernels = Kernels::new(dev);
    let mut all = Vec::new();
    for store in [Dtype::F32, Dtype::F16, Dtype::Bf16] {
        kernels = kernels.with_store(store);
        let checks = compare(&kernels, store);
        if let Err(e) = recipe_runtime::backend::device::Device::sync(kernels.device()) {
            // What the stores before this one showed, then the error.
            print_checks(&all);
            write_checks(&all, out)?;
            eprintln!("error: the GPU reported ({}): {e}", store.torch_name());
            return Err(FAILED);
        }
        all.extend(checks);
    }
    // The device optimizer (no Backend operation): the gradient norm and Adam/AdamW against the
    // host optimizer, per store: the half stores add the mixed-precision step, whose working copy
    // is rounded by each half type's own PTX conversion.
    for store in [Dtype::F32, Dtype::F16, Dtype::Bf16] {
        kernels = kernels.with_store(store);
        let mut checks = compare_optim(&kernels, store);
        checks.push(compare_queued_upload(&kernels, store));
        checks.push(compare_wide_batched(&kernels, store));
        // Unless RECIPE_CUDA_GRAPHS=0.
        checks.extend(compare_graph_replay(&kernels, store));
        checks.extend(compare_update_wait(&kernels, store));
        if let Err(e) = recipe_runtime::backend::device::Device::sync(kernels.device()) {
            // What the stores before this one showed, then the error.
            print_checks(&all);
            write_checks(&all, out)?;
            eprintln!("error: the GPU reported ({}): {e}", store.torch_name());
            return Err(FAILED);
        }
        all.extend(checks);
    }
    // The one-GPU checks are printed and written first: the sums between GPUs and the
    // allocation failure below open devices and communicators of their own, and a failure or a
    // hang there keeps what is already known.
    print_checks(&all);
    write_checks(&all, out)?;
    // Which GEMM shapes, if any, cuBLASLt had no algorithm for (they ran on cuBLAS).
    println!("GEMMs after the checks: {}", kernels.device().libraries());
    let mut more = peers_test();
    more.push(out_of_memory_test());
    print_checks(&more);
    all.extend(more);
    write_checks(&all, out)?;
    let ok = all.iter().all(|c| c.ok);
    if !ok {
        eprintln!(
            "error: an operation on the GPU differs from the CPU backend beyond its tolerance"
        );
    }
    Ok(ok)
}

/// The self-test's table of `checks`.
fn print_checks(checks: &[recipe_runtime::backend::selftest::OpCheck]) {
    println!(
        "  {:<28} {:>5} {:>10} {:>10}",
        "operation", "store", "error", "tolerance"
    );
    for c in checks {
        println!(
            "  {:<28} {:>5} {:>10.2e} {:>10.1e}{}",
            c.op,
            c.store.torch_name().trim_start_matches("torch."),
            c.error,
            c.tolerance,
            if c.ok { "" } else { "  <- FAILS" }
        );
    }
}

/// `checks` as `selftest.json` in `out`, when given (replaced whole).
fn write_checks(
    checks: &[recipe_runtime::backend::selftest::OpCheck],
    out: Option<&Path>,
) -> Result<(), i32> {
    let Some(dir) = out else {
        return Ok(());
    };
    let json = serde_json::to_string_pretty(checks).expect("plain data");
    write_atomic(&dir.join("selftest.json"), json.as_bytes()).map_err(|e| {
        eprintln!("error: {e}");
        USAGE
    })
}

/// A check that could not run, failed, named by what stopped it.
fn failing(op: String) -> recipe_runtime::backend::selftest::OpCheck {
    recipe_runtime::backend::selftest::OpCheck {
        op,
        store: recipe_runtime::precision::Dtype::F32,
        error: 1.0,
        tolerance: 0.0,
        ok: false,
    }
}

/// An allocation larger than GPU 0's memory on a device of its own: the run's error (what
/// failed, what was free, what to change) at the next sync, and again at the one after (the
/// missing buffer stays missing), never a panic.
fn out_of_memory_test() -> recipe_runtime::backend::selftest::OpCheck {
    use recipe_runtime::backend::cuda::CudaDevice;
    use recipe_runtime::backend::device::Device;
    use recipe_runtime::precision::Dtype;
    let dev = match CudaDevice::open(0) {
        Ok(d) => d,
        Err(e) => return failing(format!("alloc beyond memory: GPU 0: {e}")),
    };
    let total = dev.mem_info().map_or(1 << 40, |(_, total)| total);
    let buf = dev.alloc(total / 4 + (1 << 28));
    let first = dev.sync();
    let mut small = dev.alloc(16);
    dev.zero(dev.view_mut(&mut small));
    let second = dev.sync();
    drop(buf);
    let ok = matches!((&first, &second), (Err(a), Err(b)) if a.contains("out of memory") && a == b);
    let what = match &first {
        Err(e) => e.split(';').next().unwrap_or(e).to_string(),
        Ok(()) => "no error".into(),
    };
    recipe_runtime::backend::selftest::OpCheck {
        op: format!("alloc beyond memory: {what}"),
        store: Dtype::F32,
        error: if ok { 0.0 } else { 1.0 },
        tolerance: 0.0,
        ok,
    }
}

/// The sums between GPUs (NCCL, one rank per GPU, every GPU of the machine) against the host's
/// collective, when NCCL loads; says why not otherwise. With one GPU the group has one rank:
/// its sums are identities, but NCCL's calls, the copy stream's queued ones and their joins
/// run on the GPU. A GPU that does not open, or NCCL refusing the group, is a failing check;
/// NCCL's initialisation, which cannot be interrupted, runs watched (`RECIPE_COLLECTIVE_TIMEOUT`:
/// past it the process says so and exits, the one-GPU checks already printed and written).
fn peers_test() -> Vec<recipe_runtime::backend::selftest::OpCheck> {
    use recipe_runtime::backend::cuda::{self, nccl, CudaDevice};
    use recipe_runtime::backend::device::Peers;
    use recipe_runtime::backend::selftest::compare_peers;
    let gpus = cuda::probe().devices;
    let off = nccl::switched_off();
    if gpus < 1 || off || !nccl::present() {
        let why = if gpus < 1 {
            format!("{gpus} GPU")
        } else if off {
            "RECIPE_NCCL=0".to_string()
        } else {
            "libnccl.so not found (docs/cuda.md)".to_string()
        };
        println!("  sums between GPUs (NCCL): not checked ({why})");
        return Vec::new();
    }
    let devices = match (0..gpus)
        .map(|i| CudaDevice::open(i).map_err(|e| format!("GPU {i}: {e}")))
        .collect::<Result<Vec<_>, String>>()
    {
        Ok(d) => d,
        Err(e) => return vec![failing(format!("nccl: {e}"))],
    };
    let group = recipe_runtime::watchdog::watched(
        recipe_runtime::collective::timeout(),
        |waited| {
            eprintln!(
                "error: NCCL's initialisation did not finish in {waited:.0?} (RECIPE_COLLECTIVE_TIMEOUT)"
            );
            // Without exit handlers or library destructors, which could block on NCCL's
            // unfinished setup in the main thread; the one-GPU checks are printed and written.
            // SAFETY: ends the process at once; nothing after it runs.
            unsafe { libc::_exit(FAILED) };
        },
        || nccl::group(&devices.iter().collect::<Vec<_>>()),
    );
    let peers = match group {
        Ok(p) => p,
        Err(e) => return vec![failing(format!("nccl: {e}"))],
    };
    let v = nccl::version().unwrap_or_default();
    if gpus == 1 {
        println!("  NCCL {v} on one GPU: a one-rank group (its sums are the rank's own values)");
    } else {
        println!("  sums between {gpus} GPUs through NCCL {v}");
    }
    let ranks = devices
        .into_iter()
        .zip(peers)
        .map(|(d, p)| (d, Box::new(p) as Box<dyn Peers<CudaDevice>>))
        .collect();
    compare_peers(ranks)
}

/// One architecture's program ([`build`]): compiled (with ptxas's report in its log), written.
struct Built {
    compiled: Result<std::sync::Arc<compile::Compiled>, String>,
    written: Result<(), String>,
}

/// Compiles the program for `arch` now (the gate proves NVRTC compiles it; the disk cache is not
/// read) and keeps it for the process (the self-test's device, of the same architecture, loads
/// it); writes its PTX and CUBIN into `out` when given.
fn build(arch: &str, pdl: recipe_runtime::backend::cuda::Pdl, out: Option<&Path>) -> Built {
    let compiled = compile::compile_fresh(arch, compile::early_for(arch, pdl));
    let Ok(c) = &compiled else {
        return Built {
            compiled: compiled.map_err(|e| e.to_string()),
            written: Ok(()),
        };
    };
    let written = match out {
        Some(dir) => write_atomic(&dir.join(format!("kernels.{arch}.ptx")), c.ptx.as_bytes())
            .and_then(|()| write_atomic(&dir.join(format!("kernels.{arch}.cubin")), &c.cubin)),
        None => Ok(()),
    };
    Built {
        compiled: compiled.map_err(|e| e.to_string()),
        written: written.map_err(|e| e.to_string()),
    }
}

/// Prints one architecture's table; true when a kernel spills or is missing from the report and
/// `gate` (else it says so as a warning).
fn print_reports(
    arch: &str,
    reports: &[ptxas::KernelReport],
    kernels: &[&str],
    gate: bool,
) -> bool {
    println!(
        "  {:<28} {:>5} {:>6} {:>6} {:>7}",
        "kernel", "regs", "smem", "stack", "spills"
    );
    let mut bad = false;
    for r in reports {
        let spills = r.spill_stores + r.spill_loads;
        println!(
            "  {:<28} {:>5} {:>6} {:>6} {:>7}{}",
            r.name,
            r.registers,
            r.smem,
            r.stack,
            spills,
            if spills > 0 { "  <- spills" } else { "" }
        );
        bad |= spills > 0;
    }
    let level = if gate { "error" } else { "warning" };
    for k in kernels {
        if !reports.iter().any(|r| r.name == *k) {
            eprintln!("{level}: ptxas reported nothing for kernel {k} ({arch})");
            bad = true;
        }
    }
    if bad {
        eprintln!("{level}: {arch}: a kernel spills registers or is missing");
    }
    bad && gate
}

/// Writes through a temporary file and a rename: never a half-written artefact.
fn write_atomic(path: &Path, bytes: &[u8]) -> Result<(), String> {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, bytes)
        .and_then(|()| std::fs::rename(&tmp, path))
        .map_err(|e| format!("cannot write {}: {e}", path.display()))
}
