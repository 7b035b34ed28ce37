//! CUDA graphs on the emulated device ([`crate::EmuTyped`]): between
//! [`Device::begin_capture`](recipe_runtime::backend::device::Device::begin_capture) and
//! `end_capture` the thread's device work (launches, GEMMs, memsets, device copies) is recorded
//! with its arguments as they were, not run; `launch_graph` runs the record again, as a GPU
//! replays a captured graph: the same kernels on the same addresses with the same arguments.
//! A pass that passed anything per micro-batch by argument would replay the captured
//! micro-batch's value, and differ from the same pass run directly (tests/run.rs and
//! runtime/emu/tests/model.rs compare them bit for bit). Host work during a capture (a copy to
//! or from the host, an allocation, a synchronisation) fails it, as it would on a GPU
//! (`cudaErrorStreamCaptureUnsupported`), though it is still done here: the runtime then runs
//! the pass directly. Per thread, as a rank's device is driven by its rank's thread.

use std::cell::{Cell, RefCell};
use std::rc::Rc;

/// A recorded operation.
type Op = Box<dyn Fn()>;

/// The capture under way: what it recorded, and whether it may become a graph.
struct Capture {
    ops: Vec<Op>,
    ok: bool,
}

thread_local! {
    static CAPTURE: RefCell<Option<Capture>> = const { RefCell::new(None) };
    /// The graphs, by id (`None` once dropped).
    static GRAPHS: RefCell<Vec<Option<Rc<Vec<Op>>>>> = const { RefCell::new(Vec::new()) };
    static REPLAYS: Cell<u64> = const { Cell::new(0) };
}

/// Device work: recorded while capturing, else run now.
pub(crate) fn device_op(op: impl Fn() + 'static) {
    let op: Op = Box::new(op);
    let now = CAPTURE.with(|c| match c.borrow_mut().as_mut() {
        Some(cap) => {
            cap.ops.push(op);
            None
        }
        None => Some(op),
    });
    if let Some(op) = now {
        op();
    }
}

/// Host work (done by the caller): fails the capture under way, if any.
pub(crate) fn host_op() {
    CAPTURE.with(|c| {
        if let Some(cap) = c.borrow_mut().as_mut() {
            cap.ok = false;
        }
    });
}

pub(crate) fn begin() -> bool {
    CAPTURE.with(|c| {
        let mut c = c.borrow_mut();
        if c.is_some() {
            return false;
        }
        *c = Some(Capture {
            ops: Vec::new(),
            ok: true,
        });
        true
    })
}

pub(crate) fn end() -> Option<u64> {
    let cap = CAPTURE.with(|c| c.borrow_mut().take())?;
    if !cap.ok {
        return None;
    }
    GRAPHS.with(|g| {
        let mut g = g.borrow_mut();
        g.push(Some(Rc::new(cap.ops)));
        Some((g.len() - 1) as u64)
    })
}

pub(crate) fn launch(id: u64) -> bool {
    host_op();
    let ops = GRAPHS.with(|g| g.borrow().get(id as usize).cloned().flatten());
    let Some(ops) = ops else {
        return false;
    };
    for op in ops.iter() {
        op();
    }
    REPLAYS.with(|r| r.set(r.get() + 1));
    true
}

pub(crate) fn drop_graph(id: u64) {
    GRAPHS.with(|g| {
        if let Some(slot) = g.borrow_mut().get_mut(id as usize) {
            *slot = None;
        }
    });
}

/// How many captured graphs this thread has replayed on [`crate::EmuTyped`].
pub fn graphs_replayed() -> u64 {
    REPLAYS.with(Cell::get)
}
