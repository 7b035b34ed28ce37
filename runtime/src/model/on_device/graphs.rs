//! Captured passes: a micro-batch's forward and backward, or an evaluation batch's forward,
//! recorded once as a graph (a CUDA graph on a GPU, `Device::begin_capture`) and replayed for the
//! next batches of the same shape, so that the host queues one launch where it queued a few
//! hundred (docs/cuda.md, "CUDA graphs").
//!
//! A graph replays its kernels on the addresses and with the arguments they were captured
//! with, so a pass may be replayed only for what makes those the same: the batch's shape, the
//! loss weight, whether dropout applies, the parameters' and gradient buffers, and no device
//! allocation since the capture (`Kernels::allocations`: the workspace and the kernels' scratch
//! grown for a longer batch move). Everything else that differs per micro-batch lives in device
//! memory, written before the replay: the inputs (`Classifier::set_inputs_on`) and the dropout
//! key (`Kernels::dropout_key`). A shape is run directly the first time (sizing every buffer),
//! captured the second, replayed after that. A capture follows a direct run of its shape with no
//! allocation since (the epoch did not move), so it allocates nothing: memory allocated inside a
//! capture would be the graph's own (a GPU's device scratch refuses to grow during one, which
//! fails the capture instead).

use std::collections::HashMap;

use crate::backend::device::Device;
use crate::backend::kernels::Kernels;
use crate::model::ModelError;

/// Graphs kept at most: a run with many batch shapes (dynamic padding gives one per length)
/// runs the rest directly.
const MOST: usize = 64;

/// What a replay must match (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(super) struct Shape {
    pub batch: usize,
    pub seq: usize,
    pub loss_weight: u32,
    pub dropout: bool,
    /// The parameters' and the gradient buffers' addresses.
    pub buffers: [u64; 3],
}

#[derive(Debug, Clone, Copy)]
enum Slot<T> {
    /// Run directly once.
    Seen,
    /// Captured: the graph, and what the pass returned.
    Graph(u64, T),
    /// The capture failed: run directly from now on (until the next allocation).
    Direct,
}

/// How to run a micro-batch's pass.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) enum Plan<T> {
    /// Directly.
    Direct,
    /// Capture it, then replay the graph.
    Capture,
    /// Replay this graph; the pass returns this.
    Replay(u64, T),
}

/// A device's captured passes of one kind, each returning a `T` (see the module docs).
#[derive(Debug)]
pub(super) struct Graphs<T> {
    /// `Kernels::allocations` when the graphs were captured.
    epoch: u64,
    slots: HashMap<Shape, Slot<T>>,
    graphs: usize,
}

impl<T> Default for Graphs<T> {
    fn default() -> Self {
        Graphs {
            epoch: 0,
            slots: HashMap::new(),
            graphs: 0,
        }
    }
}

impl<T: Copy> Graphs<T> {
    /// How to run a pass of `shape` with the device's allocation count at `epoch`. An
    /// allocation since the last call releases every graph (`drop` each): their buffers may
    /// have moved.
    pub fn plan(&mut self, shape: Shape, epoch: u64, drop: impl FnMut(u64)) -> Plan<T> {
        if epoch != self.epoch {
            self.release(drop);
            self.epoch = epoch;
        }
        match self.slots.get(&shape) {
            None => {
                self.slots.insert(shape, Slot::Seen);
                Plan::Direct
            }
            Some(Slot::Seen) if self.graphs < MOST => Plan::Capture,
            Some(Slot::Seen | Slot::Direct) => Plan::Direct,
            Some(&Slot::Graph(id, loss)) => Plan::Replay(id, loss),
        }
    }

    /// The capture of `shape` gave graph `id` (`None`: it failed).
    pub fn captured(&mut self, shape: Shape, graph: Option<(u64, T)>) {
        let slot = match graph {
            Some((id, loss)) => {
                self.graphs += 1;
                Slot::Graph(id, loss)
            }
            None => Slot::Direct,
        };
        self.slots.insert(shape, slot);
    }

    /// A replay of `shape` failed (the device no longer has the graph): run it directly.
    pub fn lost(&mut self, shape: Shape) {
        if let Some(Slot::Graph(..)) = self.slots.insert(shape, Slot::Direct) {
            self.graphs -= 1;
        }
    }

    /// Releases every graph (`drop` each).
    pub fn release(&mut self, mut drop: impl FnMut(u64)) {
        for slot in self.slots.values() {
            if let Slot::Graph(id, _) = slot {
                drop(*id);
            }
        }
        self.slots.clear();
        self.graphs = 0;
    }
}

/// Runs `pass` (device work only, on inputs already on the device) as `graphs` plans for
/// `shape` on `k`'s device: directly, captured and then replayed, or replayed. A captured pass
/// stands for its replays only if `replayable` accepts what it returned (a value computed on
/// the host would be the captured batch's) and it allocated nothing (its buffers must not
/// move); else the capture is dropped and the pass runs directly, as it does when the device
/// does not capture or no longer has the graph.
pub(super) fn run<D: Device, T: Copy>(
    k: &Kernels<D>,
    graphs: &mut Graphs<T>,
    shape: Shape,
    replayable: impl Fn(&T) -> bool,
    mut pass: impl FnMut() -> Result<T, ModelError>,
) -> Result<T, ModelError> {
    let dev = k.device();
    let id = match graphs.plan(shape, k.allocations(), |id| dev.drop_graph(id)) {
        Plan::Direct => return pass(),
        Plan::Replay(id, out) => Some((id, out)),
        Plan::Capture => {
            let before = k.allocations();
            if !dev.begin_capture() {
                graphs.captured(shape, None);
                return pass();
            }
            let out = pass();
            let id = dev.end_capture();
            match (out, id) {
                (Ok(out), Some(id)) if replayable(&out) && k.allocations() == before => {
                    graphs.captured(shape, Some((id, out)));
                    Some((id, out))
                }
                (out, id) => {
                    if let Some(id) = id {
                        dev.drop_graph(id);
                    }
                    graphs.captured(shape, None);
                    // Nothing captured ran: the pass again, directly (or its error).
                    out?;
                    None
                }
            }
        }
    };
    match id {
        Some((id, out)) if dev.launch_graph(id) => Ok(out),
        _ => {
            graphs.lost(shape);
            pass()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::Loss;

    fn shape(seq: usize) -> Shape {
        Shape {
            batch: 2,
            seq,
            loss_weight: 1.0f32.to_bits(),
            dropout: true,
            buffers: [64, 128, 0],
        }
    }

    /// A shape runs directly, is captured, then replays; an allocation releases the graphs and
    /// starts over; a failed capture or a lost graph runs directly until the next allocation.
    #[test]
    fn a_shape_is_run_then_captured_then_replayed_until_an_allocation() {
        let mut dropped = Vec::new();
        let mut g = Graphs::default();
        let loss = Loss::Queued { rows: 2 };
        let mut plan =
            |g: &mut Graphs<Loss>, seq, epoch| g.plan(shape(seq), epoch, |id| dropped.push(id));
        assert_eq!(plan(&mut g, 5, 0), Plan::Direct);
        assert_eq!(plan(&mut g, 5, 0), Plan::Capture);
        g.captured(shape(5), Some((7, loss)));
        assert_eq!(plan(&mut g, 5, 0), Plan::Replay(7, loss));
        // Another shape has its own.
        assert_eq!(plan(&mut g, 6, 0), Plan::Direct);
        assert_eq!(plan(&mut g, 6, 0), Plan::Capture);
        g.captured(shape(6), None);
        assert_eq!(plan(&mut g, 6, 0), Plan::Direct);
        assert_eq!(plan(&mut g, 5, 0), Plan::Replay(7, loss));
        // Buffers may have moved: graph 7 released.
        assert_eq!(plan(&mut g, 5, 1), Plan::Direct);
        assert_eq!(plan(&mut g, 6, 1), Plan::Direct);
        assert_eq!(plan(&mut g, 6, 1), Plan::Capture);
        g.captured(shape(6), Some((8, loss)));
        g.lost(shape(6));
        assert_eq!(plan(&mut g, 6, 1), Plan::Direct);
        assert_eq!(g.graphs, 0);
        assert_eq!(dropped, [7]);
    }

    /// Past the most graphs kept, new shapes run directly.
    #[test]
    fn graphs_are_bounded() {
        let mut g = Graphs::<Loss>::default();
        for seq in 0..MOST + 2 {
            assert_eq!(g.plan(shape(seq), 0, |_| {}), Plan::Direct);
            let p = g.plan(shape(seq), 0, |_| {});
            if seq < MOST {
                assert_eq!(p, Plan::Capture);
                g.captured(shape(seq), Some((seq as u64, Loss::Ready(0.0))));
            } else {
                assert_eq!(p, Plan::Direct, "{seq}");
            }
        }
    }
}
