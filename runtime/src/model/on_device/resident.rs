//! [`Resident`] for [`OnDevice`]: the model states kept on the device, the optimizer stepped
//! there, and, with peers, what a rank owns of them ([`Keep::partition`]) and the sums,
//! broadcasts and gathers between the ranks' devices.

use std::cell::RefCell;
use std::ops::Range;

use super::graphs::{self, Graphs, Shape};
use super::{accumulator, grow_keeping, not_uploaded, put, same_len, OnDevice, Own, Split};
use crate::backend::device::{grouped, Device, Peers};
use crate::backend::kernels::{self, Kernels, SegmentNorms, NORM_BLOCKS};
use crate::backend::{Backend, Loss};
use crate::model::pieces::{self, Gather, Parts, Pieces, Queue, Rank, Scatter, SharedPeers};
use crate::model::{Batch, BufGrads, BufParams, Classifier, DropoutKey, ModelError, Workspace};
use crate::optim::device::{
    Accumulate, DeviceOptimizer, FirstPart, Keep, Landing, Partitioned, PinnedBuf, Resident,
};
use crate::optim::Optimizer;
use crate::precision::Dtype;
use crate::zero::{Storage, ZeroError};

/// One device's micro-batch `pass` (device work only, on the inputs `set_inputs_on` leaves):
/// captured as a graph at its shape's second micro-batch, replayed from the third (where the
/// device captures; graphs.rs), the inputs and the dropout key written to the device first,
/// outside any graph. `buffers`: the addresses of the parameters and gradient buffers it uses.
/// Not `alone` (a rank with peers or a ZeRO split): always directly. `inputs_set`: the caller
/// wrote the inputs already (`Resident::micro`, for the word embeddings' rows they name).
#[allow(clippy::too_many_arguments)]
fn graphed<D: Device>(
    k: &Kernels<D>,
    graphs: &mut Graphs<Loss>,
    ws: &mut Workspace<Kernels<D>>,
    (alone, inputs_set): (bool, bool),
    (model, batch, weight, dropout): (&Classifier, &Batch, f32, Option<DropoutKey>),
    buffers: [u64; 3],
    mut pass: impl FnMut(&mut Workspace<Kernels<D>>) -> Result<Loss, ModelError>,
) -> Result<Loss, ModelError> {
    if !inputs_set {
        model.set_inputs_on(k, ws, batch)?;
    }
    if let Some((seed, stream)) = model.dropout_key(dropout) {
        k.dropout_key(seed, stream);
    }
    if !alone {
        return pass(ws);
    }
    let shape = Shape {
        batch: batch.batch,
        seq: batch.seq,
        loss_weight: weight.to_bits(),
        dropout: dropout.is_some(),
        buffers,
    };
    // Only a loss left on the device may be replayed (a value would be the captured
    // micro-batch's).
    let queued = |loss: &Loss| matches!(loss, Loss::Queued { .. });
    graphs::run(k, graphs, shape, queued, || pass(ws))
}

/// The update event ([`Backend::wait_update`]) of the rest of the first segment's deferred step
/// (`rows_first`): one past the model's segments, whose own events are theirs.
fn rest_event(model: &Classifier) -> usize {
    model.segments().len()
}

/// The first segment's deferred step (`State::deferred`) for `batch`, whose inputs are on the
/// device: the word embeddings' rows its tokens name, and the segment's other tensors, on the
/// compute stream before the forward (which reads them), and the table's other rows, then the
/// segment's gradient zeroed, beside the forward (`rest_event`, which the backward waits for
/// before it writes that gradient). Every element is updated once, with the whole step's bits
/// (docs/cuda.md, "The step beside the forward").
fn rows_first<D: Device>(
    k: &Kernels<D>,
    st: &mut super::State<D>,
    model: &Classifier,
    batch: &Batch,
) -> Result<(), ModelError> {
    let Some(d) = st.deferred.take() else {
        return Ok(());
    };
    let (Some(o), Some(params), Some(ids)) =
        (st.opt.as_mut(), st.params.as_mut(), st.ws.input_ids())
    else {
        return Err(not_uploaded());
    };
    let (dev, part, ntok) = (k.device(), o.segment(0), batch.batch * batch.seq);
    let arg = |e: crate::optim::OptimError| ModelError::Argument(e.to_string());
    let rows = FirstPart::Rows(ids, ntok);
    o.step_first(k, dev.range_mut(params, part.clone()), &d, rows)
        .map_err(arg)?;
    let mut done = Ok(());
    k.update_aside(rest_event(model), || {
        let rest = FirstPart::Rest(ids, ntok);
        done = o.step_first(k, dev.range_mut(params, part), &d, rest);
    });
    done.map_err(arg)
}

fn no_peers() -> ModelError {
    ModelError::Argument(
        "this device sums with no other ranks' devices (OnDevice::with_peers)".into(),
    )
}

/// Checks [`Keep::partition`] against the group and the model (one range per rank inside the
/// parameters, or ZeRO-3's map of the model's segments over the group), with the optimizer
/// kept (the partition is what it steps) or the partition's gradient accumulated for the host
/// to step (offload), and makes this rank's [`Split`].
fn split<D: Device>(
    k: &Kernels<D>,
    peers: Option<&dyn Peers<D>>,
    p: Partitioned<'_>,
    model: &Classifier,
    keep: &Keep<'_>,
) -> Result<Split<D>, ModelError> {
    let peers = peers.ok_or_else(no_peers)?;
    let (me, world, n) = (peers.rank(), peers.world(), model.num_params());
    let bad = |what: String| Err(ModelError::Argument(what));
    if keep.optimizer.is_none() && matches!(keep.accumulate, Accumulate::Reduced(_)) {
        // Under offload the host steps the rank's range of what the device accumulated: the
        // partition's reduced gradient (ZeRO 2–3), or ZeRO-1's whole one averaged in place.
        return bad("a partition of the parameters with the optimizer offloaded takes its gradient reduced to the owners (ZeRO 2–3) or averaged in place (ZeRO-1)".into());
    }
    match p {
        Partitioned::Flat(ranges) => {
            if ranges.len() != world || ranges.iter().any(|r| r.start > r.end || r.end > n) {
                return bad(format!(
                    "a partition {ranges:?} for {world} ranks and {n} parameters"
                ));
            }
            Ok(Split::Flat(ranges.to_vec(), me))
        }
        Partitioned::Pieces(map) => {
            let Accumulate::ToOwners(storage) = keep.accumulate else {
                return bad("ZeRO-3's pieces reduce their gradients to the owners".into());
            };
            if map.segs != model.segments() || map.parts.iter().any(|p| p.world != world) {
                return bad(format!(
                    "a ZeRO-3 map of {} segments over {:?} ranks for a model of {} segments and a group of {world}",
                    map.segs.len(),
                    map.parts.first().map(|p| p.world),
                    model.segments().len()
                ));
            }
            if model.params().len() != n {
                return bad(
                    "ZeRO-3's pieces are taken from the whole parameters: gather them first".into(),
                );
            }
            Ok(Split::Pieces(Pieces::new(k, map.clone(), me, storage)))
        }
    }
}

/// Every rank's range of `buf` (`ranges[r]` for rank r) broadcast from its owner, in one group:
/// each rank's updated partition on every device.
fn broadcast_ranges<D: Device>(
    dev: &D,
    peers: &mut dyn Peers<D>,
    buf: &mut D::Buf,
    ranges: &[Range<usize>],
) -> Result<(), ModelError> {
    grouped(peers, |p| {
        for (owner, r) in ranges.iter().enumerate() {
            p.broadcast(dev, dev.range_mut(buf, r.clone()), owner)?;
        }
        Ok(())
    })
    .map_err(ModelError::Device)
}

/// Each `(range, owner)` of `buf` summed to its owner, in one group, in the order given (every
/// rank gives the same).
fn reduce_ranges<D: Device>(
    dev: &D,
    peers: &mut dyn Peers<D>,
    buf: &mut D::Buf,
    owners: impl Iterator<Item = (Range<usize>, usize)>,
) -> Result<(), ModelError> {
    grouped(peers, |p| {
        for (r, owner) in owners {
            p.reduce_sum(dev, dev.range_mut(buf, r), owner)?;
        }
        Ok(())
    })
    .map_err(ModelError::Device)
}

impl<D> Resident for OnDevice<D>
where
    D: Device + Send + Sync,
    D::Buf: Send,
    D::Ids: Send,
{
    fn upload(&self, model: &Classifier, module: Dtype, keep: Keep<'_>) -> Result<(), ModelError> {
        let k = &self.kernels;
        if k.store() != module {
            return Err(ModelError::Argument(format!(
                "the device stores {:?} values and the run trains in {module:?}",
                k.store()
            )));
        }
        let n = model.params().len();
        let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let st = &mut *st;
        st.settle(k);
        let split = match keep.partition {
            None => None,
            Some(p) => Some(split(k, st.peers.as_deref(), p, model, &keep)?),
        };
        if matches!(keep.accumulate, Accumulate::ToOwners(_)) && split.is_none() {
            return Err(ModelError::Argument(
                "a gradient reduced to its owners needs the ranks' partition".into(),
            ));
        }
        // The elements this rank's optimizer steps (ZeRO-3: its pieces, all the device holds).
        let mine = match &split {
            None => n,
            Some(Split::Flat(r, me)) => r[*me].len(),
            Some(Split::Pieces(pc)) => pc.local_len(),
        };
        if let Some((opt, master)) = keep.optimizer {
            let lens = [opt.len(), master.map_or(mine, <[f32]>::len)];
            if lens.iter().any(|&l| l != mine) {
                return Err(ModelError::Argument(format!(
                    "optimizer state of {lens:?} elements for {mine} parameters"
                )));
            }
        }
        // The parameters as [`Backend::alloc_stored`]: 16 bits on a device storing fp16/bf16, so
        // that the GEMMs read the weights as they are (docs/cuda.md, "16-bit buffers").
        match &split {
            Some(Split::Pieces(pc)) => {
                st.params = None;
                put(k, &mut st.params, &pc.take(&model.params().data), true);
            }
            _ => put(k, &mut st.params, &model.params().data, true),
        }
        // Under offload 16-bit parameters come up through pinned bits (`upload_params_part`):
        // the `mine` elements the host steps, pinned once, before the first step.
        let dev = k.device();
        let params = st
            .params
            .as_ref()
            .map_or(Dtype::F32, |p| dev.elem(k.view(p)));
        let short = st.param_bits.as_ref().is_none_or(|b| 2 * b.len() < mine);
        if keep.optimizer.is_none() && params.is_half() && short {
            st.param_bits = Some(dev.alloc_pinned(mine.div_ceil(2)));
        }
        st.params_stamp = model.params_stamp();
        // ZeRO 2–3 with peers accumulate their partition only; the others the whole gradient
        // (ZeRO-1's optimizer reading its range of it).
        let (acc, grads_at) = match (&split, keep.accumulate) {
            (_, Accumulate::ToOwners(_)) => (mine, 0..mine),
            (Some(Split::Flat(r, me)), _) => (n, r[*me].clone()),
            _ => (n, 0..n),
        };
        // ZeRO-1 offloaded with peers: the whole average stays on the device and only the
        // rank's range goes down, so the device sums the whole's squares, as its optimizer would.
        let whole_norm = keep.optimizer.is_none() && acc == n && grads_at.len() < n;
        (st.opt, st.acc) = match keep.optimizer {
            Some((opt, master)) => (
                Some(
                    DeviceOptimizer::new(k, opt, master, acc, grads_at)
                        .map_err(|e| ModelError::Argument(e.to_string()))?,
                ),
                None,
            ),
            None => (None, Some(k.alloc(acc))),
        };
        st.acc_norm = whole_norm.then(|| k.alloc(kernels::norm_scratch_len(n, NORM_BLOCKS)));
        st.own = match keep.accumulate {
            Accumulate::InPlace => None,
            // ZeRO-3's pieces take each segment's gradient as the backward finishes it.
            _ if matches!(split, Some(Split::Pieces(_))) => None,
            Accumulate::Reduced(storage) => Some(Own::Whole(k.alloc(n), storage)),
            // ZeRO-2 with peers: two segments' buffers (`split` checked it has its ranges).
            Accumulate::ToOwners(storage) => {
                let largest = model.segments().iter().map(Range::len).max().unwrap_or(0);
                Some(Own::Segments([k.alloc(largest), k.alloc(largest)], storage))
            }
        };
        // One device accumulating its whole gradient in place: the step by segments, each
        // beside the next forward's layers before it (`Kernels::update_aside`).
        let alone = split.is_none() && st.peers.is_none() && st.own.is_none();
        st.by_segments = match (&mut st.opt, keep.optimizer) {
            (Some(o), Some((opt, _))) if alone => o.by_segments(k, opt, model.segments()),
            _ => false,
        };
        if let (true, true, Some(o), Some((opt, _)), Some((rows, len))) = (
            st.by_segments,
            k.rows_first(),
            st.opt.as_mut(),
            keep.optimizer,
            model.token_table(),
        ) {
            o.rows_first(k, opt, rows, len);
        }
        st.deferred = None;
        st.norms = st
            .by_segments
            .then(|| SegmentNorms::new(k, model.segments()));
        st.zeroed = false;
        st.normed = false;
        st.split = split;
        k.device().sync().map_err(ModelError::Device)
    }

    fn zero_grads(&self) -> Result<(), ModelError> {
        let k = &self.kernels;
        let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let st = &mut *st;
        st.normed = false;
        if std::mem::take(&mut st.zeroed) {
            // The step zeroed each segment after its update (`Resident::step`).
            return Ok(());
        }
        st.settle(k);
        k.zero(k.view_mut(accumulator(&mut st.opt, &mut st.acc)?));
        Ok(())
    }

    fn micro(
        &self,
        model: &Classifier,
        batch: &Batch,
        weight: f32,
        dropout: Option<DropoutKey>,
    ) -> Result<Option<f32>, ModelError> {
        let (k, dev) = (&self.kernels, self.kernels.device());
        let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let st = &mut *st;
        let sum = std::mem::take(&mut st.sum_next);
        // The pass adds into the accumulator.
        st.zeroed = false;
        // The plain path's forward waits for each segment's update as it reads it (`updated`
        // below); any other joins the step's updates first.
        let waits = st.by_segments && st.landing.is_none() && !sum;
        if !waits {
            st.settle(k);
        }
        // This pass changes the accumulator: the norm's sums are its own or none.
        let norm = std::mem::take(&mut st.norm_next) && waits;
        st.normed = false;
        // The first segment's step put off by `step` (the word embeddings' rows first): on
        // the plain path, the rows this micro-batch's tokens name now, before its forward, and
        // the rest beside it; on any other, whole (`settle` did it where `waits` is false).
        let plain = waits && st.own.is_none() && st.split.is_none();
        let mut inputs_set = false;
        if plain && st.deferred.is_some() {
            model.set_inputs_on(k, &mut st.ws, batch)?;
            inputs_set = true;
            rows_first(k, st, model, batch)?;
        }
        st.step_deferred(k);
        // The backward waits for the rest of those rows' step before it writes the first
        // segment's gradient (which that step zeroes), in every plain pass where the step may
        // be put off: a graph captured without the wait may be replayed after such a step.
        let rest = (plain && st.opt.as_ref().is_some_and(DeviceOptimizer::has_rows_first))
            .then(|| rest_event(model));
        let (ws, params) = (&mut st.ws, st.params.as_ref().ok_or_else(not_uploaded)?);
        let acc = accumulator(&mut st.opt, &mut st.acc)?;
        // The whole parameters and a whole gradient buffer, segment by segment.
        let segs = model.segments();
        let landing = st.landing.take();
        // With peers the window lands through the reductions' sink (`Scatter::landing`).
        let alone_landing = landing.as_ref().filter(|_| st.peers.is_none());
        let loss = if let Some(dst) = alone_landing {
            // A window's last micro-batch under optimizer offload, one device (`land_next`):
            // each segment of the accumulator goes down as the backward finishes it.
            let mut src = BufParams::new(k, params, segs);
            let mut pass = |ws: &mut Workspace<Kernels<D>>, sink: &mut LandGrads<'_, D>| {
                model.forward_backward_on_with::<_, _, _, ModelError>(
                    k, ws, batch, weight, &mut src, sink, dropout,
                )
            };
            match &mut st.own {
                None => pass(
                    ws,
                    &mut LandGrads {
                        k,
                        grads: acc,
                        acc: None,
                        segs,
                        dst,
                    },
                )?,
                Some(Own::Whole(buf, storage)) => {
                    k.zero(k.view_mut(buf));
                    pass(
                        ws,
                        &mut LandGrads {
                            k,
                            grads: buf,
                            acc: Some((acc, *storage)),
                            segs,
                            dst,
                        },
                    )?
                }
                // With peers: the branches below.
                Some(Own::Segments(..)) => {
                    return Err(ModelError::Argument(
                        "a window landed on a device that reduces to its peers".into(),
                    ))
                }
            }
        } else if let Some(Split::Pieces(pc)) = &mut st.split {
            // ZeRO-3: each segment gathered as the pass reads it (the next one ahead), each
            // gradient reduced to the owners as the backward finishes it, both queued to
            // overlap the pass (model/pieces.rs).
            let peers = st.peers.as_deref_mut().ok_or_else(no_peers)?;
            let peers: SharedPeers<'_, D> = RefCell::new(peers);
            let Pieces {
                map,
                me,
                seg,
                grad,
                storage,
            } = pc;
            let queue = Queue::default();
            let rank = Rank {
                k,
                peers: &peers,
                parts: Parts::Pieces(map),
                me: *me,
                queue: &queue,
            };
            let mut src = Gather::new(rank, params, seg);
            let mut sink = Scatter::new(rank, grad, acc, *storage).landing(landing.as_ref());
            let loss = model.forward_backward_on_with::<_, _, _, ModelError>(
                k, ws, batch, weight, &mut src, &mut sink, dropout,
            );
            let finished = sink.finish();
            let loss = loss?;
            finished?;
            loss
        } else {
            // One device's whole model: captured and replayed where the device can (`graphed`).
            let alone = st.split.is_none() && st.peers.is_none();
            let graphs = &mut st.graphs;
            let p = dev.ptr(dev.view(params));
            let on = (model, batch, weight, dropout);
            // The pass on the inputs already set, its gradient into `grads` (and with `norms`,
            // each finished segment's `Σ g²` beside the rest: `Resident::norm_next`).
            let into = |ws: &mut Workspace<Kernels<D>>,
                        grads: &mut D::Buf,
                        norms: Option<&mut SegmentNorms<D>>| {
                let mut src = if waits {
                    BufParams::updated(k, params, segs)
                } else {
                    BufParams::new(k, params, segs)
                };
                match norms {
                    Some(norms) => {
                        let mut sink = Normed {
                            k,
                            grads,
                            segs,
                            norms,
                            rounding: 0,
                            rest,
                        };
                        model.pass_on_with::<_, _, _, ModelError>(
                            k, ws, batch, weight, &mut src, &mut sink, dropout,
                        )
                    }
                    None => {
                        let mut sink = BufGrads::new(k, grads, segs).after_update(0, rest);
                        model.pass_on_with::<_, _, _, ModelError>(
                            k, ws, batch, weight, &mut src, &mut sink, dropout,
                        )
                    }
                }
            };
            match (&mut st.own, &st.split) {
                (None, _) if sum => {
                    // ZeRO 0–1, a window's last micro-batch (`Resident::sum_next`): each
                    // finished segment of the accumulator summed over the devices on the copy
                    // stream while the backward goes on; `average_grads` joins them.
                    let peers = st.peers.as_deref_mut().ok_or_else(no_peers)?;
                    // ZeRO-1 under offload: the rank's range lands as the sums come in.
                    let averaging = std::mem::take(&mut st.averaging);
                    let mut land = match (landing.as_ref(), averaging, &st.split) {
                        (Some(dst), Some(storage), Some(Split::Flat(ranges, me))) => {
                            Some(Averaged {
                                dst,
                                mine: ranges[*me].clone(),
                                inv: 1.0 / peers.world() as f32,
                                storage,
                                pending: None,
                            })
                        }
                        (None, None, _) => None,
                        _ => {
                            return Err(ModelError::Argument(
                                "a window landed on a device that sums with its peers, \
                                 other than ZeRO-1's range"
                                    .into(),
                            ))
                        }
                    };
                    let averaged = land.is_some();
                    let loss = graphed(k, graphs, ws, (false, inputs_set), on, [0; 3], |ws| {
                        let mut src = BufParams::new(k, params, segs);
                        let mut sink = Summed {
                            k,
                            peers: &mut *peers,
                            grads: &mut *acc,
                            segs,
                            landing: land.take(),
                        };
                        let loss = model.pass_on_with::<_, _, _, ModelError>(
                            k, ws, batch, weight, &mut src, &mut sink, dropout,
                        )?;
                        sink.finish()?;
                        Ok(loss)
                    });
                    // Queued or not, the sums so far are pending: joined by `average_grads`.
                    st.summed = true;
                    let loss = loss?;
                    st.averaged = averaged;
                    loss
                }
                (None, _) => {
                    let mut norms = st.norms.as_mut().filter(|_| norm);
                    // A pass that sums the norm is a graph of its own.
                    let summed = norms.as_ref().map_or(0, |n| n.address(k));
                    let buffers = [p, dev.ptr(dev.view(acc)), summed];
                    graphed(k, graphs, ws, (alone, inputs_set), on, buffers, |ws| {
                        into(ws, acc, norms.as_deref_mut())
                    })?
                }
                // zero/sinks.rs `ReduceToOwners`: each segment's gradient, as the backward
                // finishes it, summed to the owners of its parts (on the copy stream, while
                // the backward computes the next segment into the other buffer), in the order
                // every rank calls them; then this rank's part made the average as
                // `reduce_to_owners` makes it, and added (model/pieces.rs `Scatter`).
                (Some(Own::Segments(grads, storage)), Some(Split::Flat(ranges, me))) => {
                    let peers = st.peers.as_deref_mut().ok_or_else(no_peers)?;
                    let peers: SharedPeers<'_, D> = RefCell::new(peers);
                    let queue = Queue::default();
                    let rank = Rank {
                        k,
                        peers: &peers,
                        parts: Parts::Flat { segs, ranges },
                        me: *me,
                        queue: &queue,
                    };
                    let mut sink =
                        Scatter::new(rank, grads, acc, *storage).landing(landing.as_ref());
                    let loss = graphed(k, graphs, ws, (false, inputs_set), on, [0; 3], |ws| {
                        let mut src = BufParams::new(k, params, segs);
                        model.pass_on_with::<_, _, _, ModelError>(
                            k, ws, batch, weight, &mut src, &mut sink, dropout,
                        )
                    });
                    // Joined even after an error: no direct sum may follow the queued ones.
                    let finished = sink.finish();
                    let loss = loss?;
                    finished?;
                    loss
                }
                (Some(Own::Segments(..)), _) => {
                    return Err(ModelError::Argument(
                        "a gradient reduced to its owners needs the ranks' partition".into(),
                    ))
                }
                // `Scattered`: the micro-batch's gradient on its own, `Storage::reduced`, then
                // `accumulate` (acc += g, stored as the module); in the graph on one device.
                (Some(Own::Whole(g, storage)), _) => {
                    let storage = *storage;
                    let buffers = [p, dev.ptr(dev.view(g)), dev.ptr(dev.view(acc))];
                    graphed(k, graphs, ws, (alone, inputs_set), on, buffers, |ws| {
                        k.zero(k.view_mut(g));
                        let loss = into(ws, g, None)?;
                        k.round_to(k.view_mut(g), storage.comm);
                        k.round_to(k.view_mut(g), storage.module);
                        k.add_assign(k.view_mut(acc), k.view(g));
                        Ok(loss)
                    })?
                }
            }
        };
        // The pass waited for every segment's update (a failed one leaves them to a join).
        st.updating = false;
        st.normed = norm;
        let Loss::Queued { rows } = loss else {
            return Ok(Some(k.loss(loss)));
        };
        // The rows' losses join the window's on the device; nothing waits for the device here.
        let at = st.pending.last().map_or(0, |&(at, n)| at + n);
        let window = grow_keeping(k, &mut st.losses, at, at + rows);
        k.keep_loss(dev.range_mut(window, at..at + rows));
        st.pending.push((at, rows));
        Ok(None)
    }

    fn window_losses(&self) -> Result<Vec<f32>, ModelError> {
        let (k, dev) = (&self.kernels, self.kernels.device());
        let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let st = &mut *st;
        let pending = std::mem::take(&mut st.pending);
        let Some(&(at, n)) = pending.last() else {
            return Ok(Vec::new());
        };
        let mut rows = vec![0.0f32; at + n];
        if let Some(window) = &st.losses {
            dev.download(dev.sub(dev.view(window), 0..at + n), &mut rows);
        }
        dev.sync().map_err(ModelError::Device)?;
        Ok(pending
            .iter()
            .map(|&(at, n)| k.mean_loss(&rows[at..at + n]))
            .collect())
    }

    fn grad_sq(&self) -> Result<f64, ModelError> {
        let k = &self.kernels;
        let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let st = &mut *st;
        st.settle(k);
        let summed = match st.norms.as_mut() {
            // The last backward summed each segment (its final join ordered them before this).
            Some(norms) if std::mem::take(&mut st.normed) => Some(norms.total(k)),
            _ => None,
        };
        let sq = match (summed, &mut st.acc_norm, &st.acc) {
            (Some(sq), ..) => sq,
            (None, Some(scratch), Some(acc)) => kernels::grad_norm_sq_in(k, k.view(acc), scratch),
            (None, ..) => st.optimizer()?.grad_sq(k),
        };
        k.device().sync().map_err(ModelError::Device)?;
        Ok(sq)
    }

    fn step(&self, opt: &Optimizer, lr: f64, factors: (f32, f32)) -> Result<(), ZeroError> {
        let k = &self.kernels;
        let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let st = &mut *st;
        let dev = k.device();
        // A step put off and never taken (no micro-batch since): queued whole first.
        st.step_deferred(k);
        let (Some(params), Some(o)) = (st.params.as_mut(), st.opt.as_mut()) else {
            return Err(not_uploaded().into());
        };
        if st.by_segments {
            // Each segment's update, then its gradient's zeroing for the next window, queued
            // beside the rest in forward order; the next micro-batch's forward waits for each
            // as it reads the segment. Nothing waits for the device here: a fault shows at the
            // next wait. With the word embeddings' rows first the first segment's is put off
            // to that micro-batch (`rows_first`), or whatever comes before it (`settle`).
            // One run of updates, nothing else queued between them (`updates_aside`).
            let mut done = Ok(());
            k.updates_aside(|| {
                for seg in 0..o.segment_count() {
                    if seg == 0 {
                        if let Some(d) = o.defer_first(opt, lr, factors) {
                            st.deferred = Some(d);
                            continue;
                        }
                    }
                    let part = o.segment(seg);
                    k.update_aside(seg, || {
                        let p = dev.range_mut(params, part);
                        done = o.step_segment_zeroing(k, p, opt, lr, factors, seg);
                    });
                    if done.is_err() {
                        break;
                    }
                }
            });
            done?;
            st.updating = true;
            st.zeroed = true;
            st.normed = false;
            return Ok(());
        }
        let Some(Split::Flat(ranges, me)) = &st.split else {
            // The whole parameters, or ZeRO-3's pieces (gathered when the next pass reads them).
            o.step(k, k.view_mut(params), opt, lr, factors)?;
            // The passes read these parameters as they are: no upload until the host changes
            // them.
            return Ok(dev.sync().map_err(ModelError::Device)?);
        };
        o.step(
            k,
            dev.range_mut(params, ranges[*me].clone()),
            opt,
            lr,
            factors,
        )?;
        // Every rank's updated partition from its owner: the whole parameters on every device.
        let peers = st.peers.as_deref_mut().ok_or_else(no_peers)?;
        broadcast_ranges(dev, peers, params, ranges)?;
        // The passes read these parameters as they are: no upload until the host changes them.
        Ok(k.device().sync().map_err(ModelError::Device)?)
    }

    fn download(
        &self,
        model: &mut Classifier,
        opt: Option<&mut Optimizer>,
        master: Option<&mut [f32]>,
    ) -> Result<(), ZeroError> {
        let k = &self.kernels;
        let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let st = &mut *st;
        st.settle(k);
        let params = st.params.as_ref().ok_or_else(not_uploaded)?;
        match &mut st.split {
            Some(Split::Pieces(pc)) => {
                // Every rank takes part (`Replica::gather_whole`).
                let n = model.num_params();
                same_len("parameter", model.params().len(), n)?;
                let peers = st.peers.as_deref_mut().ok_or_else(no_peers)?;
                pieces::download_whole(k, peers, pc, params, model.params_mut())?;
            }
            _ => k.download(k.view(params), model.params_mut()),
        }
        // The host now holds what the device holds: an evaluation uploads nothing.
        st.params_stamp = model.params_stamp();
        if let (Some(dev), Some(opt)) = (st.opt.as_ref(), opt) {
            dev.download(k, opt, master)?;
        }
        Ok(k.device().sync().map_err(ModelError::Device)?)
    }

    fn pinned(&self, n: usize) -> PinnedBuf {
        Box::new(self.kernels.device().alloc_pinned(n))
    }

    fn download_grads(&self, dst: &mut [f32]) -> Result<(), ModelError> {
        {
            let k = &self.kernels;
            let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
            let st = &mut *st;
            st.settle(k);
            if let (Some(Split::Flat(ranges, me)), None, Some(acc)) = (&st.split, &st.opt, &st.acc)
            {
                let (dev, mine) = (k.device(), ranges[*me].clone());
                if dev.len(dev.view(acc)) != mine.len() {
                    // ZeRO-1 offloaded with peers: the whole average is here, the rank's range
                    // goes down.
                    same_len("gradient partition", dst.len(), mine.len())?;
                    dev.download(dev.sub(dev.view(acc), mine), dst);
                    return dev.sync().map_err(ModelError::Device);
                }
            }
        }
        self.copy_accumulator(dst.len(), |k, acc| k.download(k.view(acc), dst))
    }

    fn upload_grads(&self, src: &[f32]) -> Result<(), ModelError> {
        self.copy_accumulator(src.len(), |k, acc| k.write(k.view_mut(acc), src))
    }

    fn peers(&self) -> Option<(usize, usize)> {
        let st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        st.peers.as_ref().map(|p| (p.rank(), p.world()))
    }

    fn average_grads(&self, storage: Storage) -> Result<(), ModelError> {
        let (k, dev) = (&self.kernels, self.kernels.device());
        let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let st = &mut *st;
        let peers = st.peers.as_mut().ok_or_else(no_peers)?;
        let acc = accumulator(&mut st.opt, &mut st.acc)?;
        if std::mem::take(&mut st.summed) {
            // Summed segment by segment during the last backward (`sum_next`).
            dev.join_copies().map_err(ModelError::Device)?;
            if std::mem::take(&mut st.averaged) {
                // And made the average there (`land_next`), with `storage` as here.
                return dev.sync().map_err(ModelError::Device);
            }
        } else {
            peers
                .all_reduce_sum(dev, dev.view_mut(acc))
                .map_err(ModelError::Device)?;
        }
        let inv = 1.0 / peers.world() as f32;
        k.scale_round(dev.view_mut(acc), inv, storage.comm, storage.module);
        dev.sync().map_err(ModelError::Device)
    }

    fn reduce_to_owners(
        &self,
        owners: &[(Range<usize>, usize)],
        storage: Storage,
        dst: &mut [f32],
    ) -> Result<(), ModelError> {
        let (k, dev) = (&self.kernels, self.kernels.device());
        let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let st = &mut *st;
        let peers = st.peers.as_mut().ok_or_else(no_peers)?;
        let (me, inv) = (peers.rank(), 1.0 / peers.world() as f32);
        let acc = accumulator(&mut st.opt, &mut st.acc)?;
        let n = dev.len(dev.view(acc));
        if let Some((r, _)) = owners.iter().find(|(r, _)| r.end > n || r.start > r.end) {
            return Err(ModelError::Argument(format!(
                "gradient range {r:?} of a device accumulator of {n}"
            )));
        }
        reduce_ranges(dev, &mut **peers, acc, owners.iter().cloned())?;
        let mine: Vec<Range<usize>> = owners
            .iter()
            .filter(|(_, o)| *o == me)
            .map(|(r, _)| r.clone())
            .collect();
        same_len(
            "gradient partition",
            dst.len(),
            mine.iter().map(Range::len).sum(),
        )?;
        for r in &mine {
            k.scale_round(
                dev.range_mut(acc, r.clone()),
                inv,
                storage.comm,
                storage.module,
            );
        }
        if let [r] = &mine[..] {
            // One range (ZeRO-2's flat partition): straight to the host.
            dev.download(dev.sub(dev.view(acc), r.clone()), dst);
        } else {
            // ZeRO-3's pieces, one per segment: packed on the device, then one copy.
            let part = st.part.get_or_insert_with(|| k.alloc(dst.len()));
            let mut at = 0;
            for r in &mine {
                let src = dev.sub(dev.view(acc), r.clone());
                dev.copy(dev.range_mut(part, at..at + r.len()), src);
                at += r.len();
            }
            dev.download(dev.sub(dev.view(part), 0..at), dst);
        }
        dev.sync().map_err(ModelError::Device)
    }

    fn upload_params(&self, src: &[f32]) -> Result<(), ModelError> {
        let (k, dev) = (&self.kernels, self.kernels.device());
        let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let st = &mut *st;
        st.settle(k);
        let params = st.params.as_mut().ok_or_else(not_uploaded)?;
        if let Some(Split::Flat(ranges, me)) = &st.split {
            // ZeRO-2 offloaded with peers: this rank's partition up, then every partition from
            // its owner (DeepSpeed's all-gather after the CPU step).
            let mine = ranges[*me].clone();
            same_len("parameter partition", src.len(), mine.len())?;
            k.write(dev.range_mut(params, mine), src);
            let peers = st.peers.as_deref_mut().ok_or_else(no_peers)?;
            broadcast_ranges(dev, peers, params, ranges)?;
            return dev.sync().map_err(ModelError::Device);
        }
        // The whole parameters, or ZeRO-3's pieces (which are all the device holds).
        same_len("parameter", src.len(), dev.len(k.view(params)))?;
        k.write(k.view_mut(params), src);
        // The source is pinned on a GPU: the copy is asynchronous, and the host writes it again
        // at the next step, so it must be finished before this returns.
        k.device().sync().map_err(ModelError::Device)
    }

    unsafe fn upload_params_part(&self, at: usize, src: &[f32]) -> bool {
        let k = &self.kernels;
        let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let st = &mut *st;
        let Some(params) = st.params.as_mut() else {
            return false;
        };
        let dev = k.device();
        // What `upload_params` takes, and where it lies in the device's parameters: one
        // device's whole parameters; with peers at ZeRO-2 this rank's partition (the owners'
        // broadcasts follow in `params_uploaded`); ZeRO-3's pieces, all the device holds.
        let (base, n) = match (&st.split, st.peers.is_some()) {
            (None, false) | (Some(Split::Pieces(_)), true) => (0, dev.len(dev.view(params))),
            (Some(Split::Flat(ranges, me)), true) => (ranges[*me].start, ranges[*me].len()),
            _ => return false,
        };
        if at + src.len() > n {
            return false;
        }
        let elem = dev.elem(dev.view(params));
        let dst = dev.range_mut(params, base + at..base + at + src.len());
        if !elem.is_half() {
            // SAFETY: the caller's contract keeps `src` (pinned) alive and unwritten until
            // `params_uploaded`; the device's passes do not read the parameters before then.
            unsafe { dev.upload_queued(dst, src.as_ptr()) };
            return true;
        }
        // 16-bit parameters: the range's bits into pinned memory of the state's (exact: the
        // host's values are rounded to the module's dtype), then up, half the bytes.
        // (Pinned by `upload`; without it the caller uploads the whole parameters after the
        // step.)
        let Some(pinned) = st.param_bits.as_mut().filter(|b| 2 * b.len() >= n) else {
            return false;
        };
        let part = &mut crate::backend::device::as_bits(pinned, n)[at..at + src.len()];
        for (b, &x) in part.iter_mut().zip(src) {
            *b = elem.bits(x);
        }
        // SAFETY: the state keeps `pinned` for the run, and this range of it is written again
        // only by the next step's call, after `params_uploaded`; the device's passes do not
        // read the parameters before then.
        unsafe { dev.upload_queued_bits(dst, part.as_ptr()) };
        true
    }

    fn params_uploaded(&self) -> Result<(), ModelError> {
        let dev = self.kernels.device();
        dev.wait_copies().map_err(ModelError::Device)?;
        let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let st = &mut *st;
        let (Some(Split::Flat(ranges, _)), Some(peers), Some(params)) =
            (&st.split, st.peers.as_deref_mut(), st.params.as_mut())
        else {
            return Ok(());
        };
        // ZeRO-2 offloaded with peers: every partition from its owner, as `upload_params` ends.
        broadcast_ranges(dev, peers, params, ranges)?;
        dev.sync().map_err(ModelError::Device)
    }

    fn sum_next(&self) -> bool {
        let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        // ZeRO 0–1 with peers: the whole accumulator, added into in place (ZeRO-3's pieces and
        // ZeRO-2's own gradient sum every micro-batch already).
        // ZeRO-1 under offload lands its range as the sums come in (`land_next`).
        let flat = matches!(st.split, None | Some(Split::Flat(..)));
        let landing = st.landing.is_none() || st.averaging.is_some();
        st.sum_next = st.peers.is_some() && st.own.is_none() && flat && landing;
        st.sum_next
    }

    fn norm_next(&self) -> bool {
        let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        st.norm_next = st.norms.is_some();
        st.norm_next
    }

    fn land_next(&self, dst: Landing, storage: Storage) -> bool {
        let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        // One device's whole accumulator; with peers at ZeRO 2–3 the rank's partition, each
        // segment's piece as it is reduced and added (`Scatter::landing`); ZeRO-1 with peers
        // the rank's range of the whole, each segment's part once summed and averaged (`Summed`).
        let dev = self.kernels.device();
        let acc = st.acc.as_ref().map(|a| dev.len(dev.view(a)));
        let partition = matches!(
            (&st.split, st.peers.is_some(), &st.own),
            (None, false, _)
                | (Some(Split::Flat(..)), true, Some(Own::Segments(..)))
                | (Some(Split::Pieces(_)), true, None)
        );
        // ZeRO-1's accumulator under offload is the whole gradient (`Resident::upload`).
        let range = match (&st.split, st.peers.is_some(), &st.own, acc) {
            (Some(Split::Flat(ranges, me)), true, None, Some(_)) => Some(ranges[*me].len()),
            _ => None,
        };
        if partition && acc == Some(dst.len()) {
            st.averaging = None;
        } else if range == Some(dst.len()) {
            st.averaging = Some(storage);
        } else {
            return false;
        }
        st.landing = Some(dst);
        true
    }

    fn landed(&self) -> Result<(), ModelError> {
        // For every copy queued.
        self.kernels
            .device()
            .wait_copies()
            .map_err(ModelError::Device)
    }
}

/// The sink of ZeRO 0–1's last micro-batch of a window with peers ([`Resident::sum_next`]):
/// each segment of the accumulator summed over the devices as the backward finishes it, the sum
/// queued on the copy stream ([`Peers::all_reduce_sum_queued`]) while the backward computes the
/// next segments. The caller joins the sums ([`Device::join_copies`]) before it reads the
/// accumulator or calls a direct sum.
///
/// With `landing` (ZeRO-1 under optimizer offload, [`Resident::land_next`]) each summed segment
/// is made the average and its part in this rank's range queued for its copy down, one segment
/// late: when the backward has finished the next segment, the compute stream joins the sums
/// queued so far (that segment's sum has run beside the next segment's backward), averages the
/// segment and queues its copy on the copy stream, ahead of the next segment's sum.
/// [`Summed::finish`] does the last.
struct Summed<'a, D: Device> {
    k: &'a Kernels<D>,
    peers: &'a mut dyn Peers<D>,
    grads: &'a mut D::Buf,
    segs: &'a [Range<usize>],
    landing: Option<Averaged<'a>>,
}

/// Where [`Summed`] copies this rank's range of the averaged gradient, and how it averages.
struct Averaged<'a> {
    dst: &'a Landing,
    /// This rank's range of the accumulator, which `dst` holds.
    mine: Range<usize>,
    /// `1 / world`, as [`Resident::average_grads`] multiplies.
    inv: f32,
    storage: Storage,
    /// The segment summed last and not yet averaged.
    pending: Option<usize>,
}

impl<D: Device> Summed<'_, D> {
    /// The pending segment's sum joined, made the average, and its part in this rank's range
    /// queued for its copy down.
    fn average_pending(&mut self) -> Result<(), ModelError> {
        let Some(l) = self.landing.as_mut() else {
            return Ok(());
        };
        let Some(seg) = l.pending.take() else {
            return Ok(());
        };
        let (k, dev) = (self.k, self.k.device());
        dev.join_copies().map_err(ModelError::Device)?;
        let r = self.segs[seg].clone();
        let s = l.storage;
        k.scale_round(
            dev.range_mut(self.grads, r.clone()),
            l.inv,
            s.comm,
            s.module,
        );
        let part = r.start.max(l.mine.start)..r.end.min(l.mine.end);
        if !part.is_empty() {
            // SAFETY: `dst` is pinned memory of this rank's range (`land_next` checked), which
            // the replica leaves alone until `landed`; this segment of the accumulator is not
            // written again before the next window's `zero_grads`, after `landed`.
            unsafe {
                dev.download_queued(
                    dev.sub(k.view(self.grads), part.clone()),
                    l.dst.at(part.start - l.mine.start),
                )
            };
        }
        Ok(())
    }

    /// After the pass: the last segment averaged and queued.
    fn finish(mut self) -> Result<(), ModelError> {
        self.average_pending()
    }
}

impl<D: Device> crate::model::GradSink<Kernels<D>> for Summed<'_, D> {
    type Error = ModelError;

    fn fetch<'s>(&'s mut self, seg: usize) -> Result<D::ViewMut<'s>, ModelError>
    where
        Kernels<D>: 's,
    {
        Ok(self.k.range_mut(self.grads, self.segs[seg].clone()))
    }

    fn done(&mut self, seg: usize) -> Result<(), ModelError> {
        // The segment's aside work (its weight gradients' GEMMs and rounding) first.
        self.k.join_aside();
        // The segment before, averaged and landing, ahead of this one's sum.
        self.average_pending()?;
        let dev = self.k.device();
        let s = dev.range_mut(self.grads, self.segs[seg].clone());
        // SAFETY: the accumulator is the state's, alive for the run; the backward writes only
        // the segments it has not finished, and the caller joins the sums before it reads or
        // writes this one again or calls a direct sum.
        unsafe { self.peers.all_reduce_sum_queued(dev, s) }.map_err(ModelError::Device)?;
        if let Some(l) = self.landing.as_mut() {
            l.pending = Some(seg);
        }
        Ok(())
    }
}

/// The sink of one device's window's last micro-batch ([`Resident::norm_next`]): the backward
/// accumulates into `grads`, and each finished segment's `Σ g²` partial sums are queued beside
/// the rest (`Backend::aside`, after the segment's own aside work: its weight gradients and
/// their rounding), so that they run while the backward computes the segments below; the
/// backward's final join orders them before anything after the pass.
///
/// A segment whose weight gradients the backward leaves unrounded
/// ([`crate::model::GradSink::rounds`]) is rounded in that same pass
/// (`SegmentNorms::partials_rounding`: one read of the segment less than the backward's
/// `round_stored` and then the sum; the same values and sums).
struct Normed<'a, D: Device> {
    k: &'a Kernels<D>,
    grads: &'a mut D::Buf,
    segs: &'a [Range<usize>],
    norms: &'a mut SegmentNorms<D>,
    /// The segments this sink rounds ([`crate::model::GradSink::rounds`]), a bit each.
    rounding: u128,
    /// The event the first segment's gradient waits for first (`rest_event`), if any.
    rest: Option<usize>,
}

impl<D: Device> crate::model::GradSink<Kernels<D>> for Normed<'_, D> {
    type Error = ModelError;

    fn fetch<'s>(&'s mut self, seg: usize) -> Result<D::ViewMut<'s>, ModelError>
    where
        Kernels<D>: 's,
    {
        if seg == 0 {
            if let Some(e) = self.rest.take() {
                self.k.wait_update(e);
            }
        }
        Ok(self.k.range_mut(self.grads, self.segs[seg].clone()))
    }

    fn done(&mut self, seg: usize) -> Result<(), ModelError> {
        let k = self.k;
        let norms = &mut *self.norms;
        if seg < 128 && self.rounding >> seg & 1 == 1 {
            let g = &mut *self.grads;
            let _ = k.aside(|| norms.partials_rounding(k, k.view_mut(g), seg));
        } else {
            let g = &*self.grads;
            let _ = k.aside(|| norms.partials(k, k.view(g), seg));
        }
        Ok(())
    }

    fn rounds(&mut self, seg: usize) -> bool {
        // Past 128 segments the backward rounds (no bit for them).
        if seg >= 128 {
            return false;
        }
        self.rounding |= 1 << seg;
        true
    }
}

/// The sink of a window's last micro-batch under optimizer offload ([`Resident::land_next`]):
/// the backward accumulates into `grads` (the accumulator, or with `acc` the micro-batch's own
/// gradient, which is then rounded and added as the whole-buffer path does after the pass:
/// `Storage::reduced`, `acc += g`), and each finished segment of the accumulator is queued
/// for its copy to `dst`.
struct LandGrads<'a, D: Device> {
    k: &'a Kernels<D>,
    grads: &'a mut D::Buf,
    acc: Option<(&'a mut D::Buf, Storage)>,
    segs: &'a [Range<usize>],
    dst: &'a Landing,
}

impl<D: Device> crate::model::GradSink<Kernels<D>> for LandGrads<'_, D> {
    type Error = ModelError;

    fn fetch<'s>(&'s mut self, seg: usize) -> Result<D::ViewMut<'s>, ModelError>
    where
        Kernels<D>: 's,
    {
        Ok(self.k.range_mut(self.grads, self.segs[seg].clone()))
    }

    fn done(&mut self, seg: usize) -> Result<(), ModelError> {
        let (k, r) = (self.k, self.segs[seg].clone());
        // The segment's aside work (its weight gradients' GEMMs and rounding) first.
        k.join_aside();
        let dev = k.device();
        let done: &D::Buf = match &mut self.acc {
            None => self.grads,
            Some((acc, storage)) => {
                let g = &mut *self.grads;
                k.round_to(k.range_mut(g, r.clone()), storage.comm);
                k.round_to(k.range_mut(g, r.clone()), storage.module);
                k.add_assign(k.range_mut(acc, r.clone()), dev.sub(k.view(g), r.clone()));
                acc
            }
        };
        // SAFETY: `dst` is pinned memory of the accumulator's length (`land_next` checked),
        // which the replica leaves alone until `landed`; the accumulator is next written by
        // the next window's `zero_grads`, after `landed`.
        unsafe { dev.download_queued(dev.sub(k.view(done), r.clone()), self.dst.at(r.start)) };
        Ok(())
    }
}
