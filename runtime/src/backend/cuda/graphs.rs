//! CUDA graphs ([`Device::begin_capture`]): a pass captured once on the compute stream (and the
//! side stream forked into it), then replayed; a capture that fails is dropped and the pass runs
//! directly (docs/cuda.md, "CUDA graphs").

use super::*;

/// How the device captures: thread-local, so that other ranks' threads, driving other GPUs,
/// may allocate and synchronise meanwhile.
const CAPTURE_MODE: drv_sys::CUstreamCaptureMode =
    drv_sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL;

/// A captured graph. cudarc's `CudaGraph` holds raw driver handles, which CUDA lets any thread
/// use as long as the calls on one graph are serialised (driver API, "Graph object thread
/// safety"): it is only used under [`Captures`]' lock.
pub(super) struct Graph(cudarc::driver::CudaGraph);

// SAFETY: see above; every use is under the `captures` mutex.
unsafe impl Send for Graph {}

/// The device's CUDA graphs ([`Device::begin_capture`]).
#[derive(Default)]
pub(super) struct Captures {
    /// A capture under way, and the first error in it (which fails it instead of the run).
    pub(super) capturing: Option<Option<String>>,
    pub(super) graphs: HashMap<u64, Graph>,
    pub(super) next: u64,
}

impl CudaDevice {
    /// Runs `f` (an allocation, or the release of memory) for real even during a capture: the
    /// capture is ended and its graph discarded (failing the capture, as `what`), `f` runs on
    /// the stream, and a new capture begins, which records the rest of the pass for nothing;
    /// [`Device::end_capture`] then reports the failure and the pass runs directly
    /// (`model/graphs.rs`), with the new memory. Inside the capture the driver would make the
    /// allocation a node of the graph, an address with no memory behind it outside the graph's
    /// replays, and a release of memory the graph did not allocate is an error. A pass captured
    /// after its shape's direct run allocates nothing; this keeps an exception from writing
    /// through such an address.
    pub(super) fn outside_capture<R>(&self, what: &str, f: impl FnOnce() -> R) -> R {
        let failing = {
            let mut c = self.captures.lock().unwrap_or_else(|p| p.into_inner());
            match c.capturing.as_mut() {
                Some(first) => {
                    first.get_or_insert_with(|| format!("{what} during a capture"));
                    true
                }
                None => false,
            }
        };
        if !failing {
            return f();
        }
        self.bind();
        if !self.discard_capture() {
            return f(); // already outside (a nested call)
        }
        let r = f();
        // SAFETY: this device's stream, no longer capturing.
        if let Err(e) = unsafe { drv::stream::begin_capture(self.stream.cu_stream(), CAPTURE_MODE) }
        {
            // The rest of the pass would run directly, and then again: stop queueing instead.
            self.stop(format!(
                "GPU {}: resuming a CUDA graph's capture after {what}: {e:?} (RECIPE_CUDA_GRAPHS=0 runs without graphs)",
                self.ctx.ordinal()
            ));
        }
        r
    }

    /// Ends the stream's capture, if it is capturing (or cannot say), and destroys what it
    /// recorded; whether it was capturing. Raw driver calls: cudarc's would return early on an
    /// error left in the context and leave the stream capturing. The context must be bound.
    pub(super) fn discard_capture(&self) -> bool {
        self.join_aside();
        let stream = self.stream.cu_stream();
        // SAFETY: this device's stream, on its bound context.
        let status = unsafe { drv::stream::is_capturing(stream) };
        if status.is_ok_and(|s| s == drv_sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE)
        {
            return false;
        }
        // SAFETY: as above; the graph it returns is destroyed here, once.
        if let Ok(g) = unsafe { drv::stream::end_capture(stream) } {
            if !g.is_null() {
                let _ = unsafe { drv::graph::destroy(g) };
            }
        }
        true
    }

    /// Whether a capture is under way ([`Device::begin_capture`]).
    pub(super) fn capturing(&self) -> bool {
        self.captures
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .capturing
            .is_some()
    }

    /// Unless `RECIPE_CUDA_GRAPHS=0`, and not while profiling (the events around each operation
    /// would be captured too). Thread-local mode: other ranks' threads, driving other GPUs,
    /// may allocate and synchronise meanwhile.
    /// [`Device::begin_capture`] on this GPU.
    pub(super) fn run_begin_capture(&self) -> bool {
        if !self.graphs_on
            || self.failed()
            || self.profiling.load(std::sync::atomic::Ordering::Relaxed)
        {
            return false;
        }
        // Every operand a captured GEMM reads is packed inside the graph: a pack made before
        // the capture and found current in it would be missing from the graph's replays.
        self.wrote();
        // An error left in the context is the run's (cudarc's begin checks for one first and
        // would return it without capturing, and it would be lost): taken here, recorded.
        self.bind();
        // Side work queued before (a step's updates, `update_aside`) is joined outside the
        // capture: the capture's own join at its end may not wait on work outside it. Only the
        // capturing pass waits for all of it; the graph waits for each segment's update
        // (`wait_update`).
        self.join_aside();
        let mut c = self.captures.lock().unwrap_or_else(|p| p.into_inner());
        if c.capturing.is_some() {
            return false;
        }
        if self.stream.begin_capture(CAPTURE_MODE).is_err() {
            return false;
        }
        c.capturing = Some(None);
        true
    }

    /// [`Device::end_capture`] on this GPU.
    pub(super) fn run_end_capture(&self) -> Option<u64> {
        // The packs recorded in the capture never ran: a pass run directly after a failed
        // capture must not find them current.
        self.wrote();
        // A stream forked into the capture must be joined back before it ends.
        self.join_aside();
        if !self.capturing() {
            return None;
        }
        // An error an earlier asynchronous call left in the context (cudarc checks for one
        // before ending a capture, and would return it without ending): taken here, as this
        // capture's failure.
        self.bind();
        let failed = self
            .captures
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .capturing
            .take()?;
        // Each kernel node with its stream's priority (the side stream's behind the rest).
        let flags = if self.ahead {
            cudarc::driver::sys::CUgraphInstantiate_flags::CUDA_GRAPH_INSTANTIATE_FLAG_USE_NODE_PRIORITY
        } else {
            cudarc::driver::sys::CUgraphInstantiate_flags(0)
        };
        // An invalidated capture ends in an error, which fails it rather than the run.
        let graph = self.stream.end_capture(flags).ok().flatten();
        // Still capturing only if cudarc returned before ending it (an error left meanwhile).
        if self.discard_capture() {
            return None;
        }
        let (None, Some(graph)) = (failed, graph) else {
            return None;
        };
        let mut c = self.captures.lock().unwrap_or_else(|p| p.into_inner());
        let id = c.next;
        c.next += 1;
        c.graphs.insert(id, Graph(graph));
        Some(id)
    }

    /// [`Device::launch_graph`] on this GPU.
    pub(super) fn run_launch_graph(&self, id: u64) -> bool {
        if self.failed() {
            return true; // nothing is queued after a failed allocation; `sync` reports it
        }
        // A replay rewrites what the graph's kernels write; a pass run directly instead of a
        // missing graph must not find earlier packs current either.
        self.wrote();
        // An error left in the context is the run's (cudarc's launch checks for one first and
        // would return it without launching): taken here, outside the lock it records under.
        self.bind();
        let c = self.captures.lock().unwrap_or_else(|p| p.into_inner());
        let Some(g) = c.graphs.get(&id) else {
            return false;
        };
        if let Err(e) = self.timed("cuda graph", || g.0.launch()) {
            drop(c);
            self.record("launching a CUDA graph", e);
        }
        true
    }

    /// [`Device::drop_graph`] on this GPU.
    pub(super) fn run_drop_graph(&self, id: u64) {
        let g = self
            .captures
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .graphs
            .remove(&id);
        if g.is_some() {
            self.bind();
        }
        drop(g);
    }
}
