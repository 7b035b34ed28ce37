//! `recipe run --device cuda|auto`: one GPU per rank of this process, each with the kernels
//! compiled for it and storing the plan's module dtype, and NCCL between them when it loads
//! (docs/cuda.md, "Several GPUs"; docs/runtime.md, "Several nodes").

use std::sync::{Arc, Mutex};

use recipe_runtime::backend::cuda::{self, CudaDevice};
use recipe_runtime::backend::kernels::Kernels;
use recipe_runtime::model::{Executor, OnDevice};
use recipe_runtime::plan::Plan;
use recipe_runtime::train::{self, NodeOptions};

use super::{Device, FAILED, USAGE};

/// The executors of this process's ranks (GPU r for its r-th rank). A plan of more ranks than
/// the machine has GPUs shares them round-robin (rank r on GPU r mod N), with a note: the same
/// numbers as one GPU per rank, for checking a multi-GPU recipe on a smaller machine, not for
/// speed. Under `auto` a GPU that cannot be opened falls back to the CPU with a note.
///
/// One node of several (`node`) opens its own ranks' GPUs and says how they exchange in
/// `node.mode`: `gpu+nccl` when NCCL loads and each rank has a GPU of its own (node 0 then
/// draws the unique id, `node.blob`, and the executors are made once the run has gathered,
/// `node.connect`, so this returns none), else `gpu`, through host memory and node 0's hub.
pub fn open(
    plan: &Plan,
    device: Device,
    node: Option<&mut NodeOptions>,
) -> Result<Vec<Arc<dyn Executor>>, i32> {
    let fail = |e: String| {
        if device == Device::Auto {
            eprintln!("note: {e}; training on the CPU");
            Ok(Vec::new())
        } else {
            eprintln!("error: {e}");
            Err(USAGE)
        }
    };
    let world = plan.batch.world.max(1) as usize;
    let local = match train::local_ranks(plan, node.as_deref()) {
        Ok(r) => r,
        Err(e) => return fail(e.to_string()),
    };
    let ranks = local.len();
    let found = cuda::probe().devices.max(1);
    if ranks > found {
        eprintln!(
            "note: {ranks} ranks on {found} GPU(s): rank r runs on GPU r mod {found}, so the GPUs are shared (the same numbers as one GPU per rank, not the speed)"
        );
    }
    let mut devices = Vec::with_capacity(ranks);
    for r in 0..ranks {
        let ordinal = r % found;
        match CudaDevice::open(ordinal) {
            Ok(dev) => devices.push(dev),
            Err(e) => return fail(format!("GPU {ordinal}: {e}")),
        }
    }
    let (name, arch) = match devices.first() {
        Some(d) => (d.describe().0.to_string(), d.describe().1.to_string()),
        None => return fail("no GPU opened".into()),
    };
    let what = if world == 1 {
        format!("{name} ({arch})")
    } else {
        format!("{world} ranks on {}× {name} ({arch})", ranks.min(found))
    };
    let store = plan.train.precision.module_dtype();
    let nccl_off = cuda::nccl::switched_off();
    if let Some(node) = node {
        // Every node decides alike (NCCL loads, a GPU per rank); node 0's hub refuses a node
        // that decided otherwise, naming both.
        if nccl_off || !cuda::nccl::present() || ranks > found {
            node.mode = "gpu".into();
            eprintln!(
                "note: {}: the ranks exchange gradients through host memory and node 0's hub",
                if nccl_off {
                    "RECIPE_NCCL=0"
                } else if ranks > found {
                    "fewer GPUs than ranks on this node"
                } else {
                    "no libnccl.so"
                }
            );
            return Ok(executors(devices, Vec::new(), &what, store));
        }
        node.mode = "gpu+nccl".into();
        if node.rank == 0 {
            match cuda::nccl::unique_id() {
                Ok(id) => node.blob = id,
                Err(e) => {
                    eprintln!("error: {e} (RECIPE_NCCL=0 on every node exchanges through host memory instead)");
                    return Err(USAGE);
                }
            }
        }
        let first = local.start;
        let kept = Mutex::new(Some(devices));
        node.connect = Some(Arc::new(move |blob: &[u8]| {
            let devices = kept
                .lock()
                .map_err(|_| "a previous attempt panicked".to_string())?
                .take()
                .ok_or("the devices are already connected")?;
            let peers = nccl_init(|| {
                cuda::nccl::group_across(&devices.iter().collect::<Vec<_>>(), first, world, blob)
            })
            .map_err(|e| e.to_string())?;
            let v = cuda::nccl::version().unwrap_or_else(|| "?".into());
            eprintln!(
                "note: the ranks of every node sum their gradients GPU to GPU through NCCL {v}"
            );
            Ok(executors(devices, peers, &what, store))
        }));
        return Ok(Vec::new());
    }
    // One GPU per rank: the ranks sum their gradients GPU to GPU through NCCL when it loads
    // (RECIPE_NCCL=0 turns it off); otherwise through host memory, the same numbers.
    let mut peers = Vec::new();
    if world > 1 && world <= found {
        if nccl_off {
            eprintln!("note: RECIPE_NCCL=0: the ranks exchange gradients through host memory");
        } else {
            match nccl_init(|| cuda::nccl::group(&devices.iter().collect::<Vec<_>>())) {
                Ok(p) => {
                    let v = cuda::nccl::version().unwrap_or_else(|| "?".into());
                    eprintln!("note: the ranks sum their gradients GPU to GPU through NCCL {v}");
                    peers = p;
                }
                Err(e) => {
                    eprintln!("note: {e}; the ranks exchange gradients through host memory instead")
                }
            }
        }
    }
    Ok(executors(devices, peers, &what, store))
}

/// NCCL's initialisation, which blocks until every rank has connected and cannot be
/// interrupted, watched: past the collectives' timeout (`RECIPE_COLLECTIVE_TIMEOUT`) the
/// process says so and ends, rather than wait forever for a rank NCCL cannot reach.
fn nccl_init<T>(f: impl FnOnce() -> T) -> T {
    recipe_runtime::watchdog::watched(
        recipe_runtime::collective::timeout(),
        |waited| {
            eprintln!(
                "error: NCCL's initialisation did not finish in {waited:.0?} (RECIPE_COLLECTIVE_TIMEOUT): \
                 some rank cannot reach the others. Across nodes, NCCL must pick an interface every \
                 node reaches (NCCL_SOCKET_IFNAME=eth0, say; NCCL_DEBUG=INFO shows its choice); \
                 RECIPE_NCCL=0 on every node exchanges through host memory instead"
            );
            std::process::exit(FAILED);
        },
        f,
    )
}

/// One executor per device, with its rank's communicator when there are peers.
fn executors(
    devices: Vec<CudaDevice>,
    peers: Vec<cuda::nccl::NcclPeers>,
    what: &str,
    store: recipe_runtime::precision::Dtype,
) -> Vec<Arc<dyn Executor>> {
    let mut peers = peers.into_iter();
    // `RECIPE_FUSED_ATTENTION=0`: attention's forward and backward as the batched products and
    // the softmax kernels even where the fused kernels fit (docs/cuda.md, "Kernels"), to compare
    // the two.
    let fused = std::env::var_os("RECIPE_FUSED_ATTENTION").is_none_or(|v| v != "0");
    devices
        .into_iter()
        .map(|dev| -> Arc<dyn Executor> {
            // `RECIPE_ROWS_FIRST=1` (read as the GPU opened): the word embeddings' step in two
            // parts around the next forward (docs/cuda.md, "The step beside the forward").
            let rows_first = dev.rows_first();
            let kernels = Kernels::new(dev)
                .with_store(store)
                .with_fused_attention(fused)
                .with_rows_first(rows_first);
            match peers.next() {
                Some(p) => OnDevice::with_peers(kernels, what.to_string(), Box::new(p)),
                None => OnDevice::new(kernels, what.to_string()),
            }
        })
        .collect()
}
