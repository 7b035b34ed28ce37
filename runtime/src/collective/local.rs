//! [`LocalCollective`]: N ranks as N threads of one process, deterministic.
//!
//! Each op is a rendezvous on one `Mutex<State>` + `Condvar` shared by the group:
//! 1. *collect*: each rank deposits a description of its call (op, reduction, root, length) and
//!    a copy of its input (an `Arc`, so it can be read outside the lock); a description that
//!    differs from one already deposited fails the group with `Mismatch` at once;
//! 2. when the last rank has deposited, the op is *ready*: every rank takes the `Arc`s of all
//!    inputs, in rank order, and counts itself out; the last one out clears the slots and starts
//!    the next op's collect phase (a rank that races ahead into the next op waits for that);
//! 3. each rank computes its own result outside the lock from the same inputs in the same order
//!    (sums over ranks 0, 1, …, N−1), so every rank gets identical bits with no shared result
//!    buffer and no rank doing the others' work.
//!
//! Every wait is a `Condvar::wait_timeout` against one deadline per op; the rank whose deadline
//! passes fails the group with `Timeout`, which wakes everyone else.

use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use super::{Collective, CollectiveError, Op, ReduceOp};

/// One rank's handle of an in-process collective group; see [`LocalCollective::group`].
///
/// Dropping a handle *leaves* the group: ops that every rank had already completed stand, but
/// the group is then failed with [`CollectiveError::Aborted`] ("rank r aborted the collective
/// group: it left the group: …"), so a rank whose thread returned early or panicked never
/// leaves the others waiting for it. At the normal end of a run every rank drops its handle and
/// nobody calls again, so this is harmless.
#[derive(Debug)]
pub struct LocalCollective {
    rank: usize,
    shared: Arc<Shared>,
}

#[derive(Debug)]
struct Shared {
    world: usize,
    timeout: Duration,
    state: Mutex<State>,
    cv: Condvar,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Ranks are depositing their calls for op `seq`.
    Collect,
    /// Every rank has deposited for op `seq`; ranks are taking the inputs.
    Ready,
}

#[derive(Debug)]
struct State {
    /// Index of the current op in the group's sequence.
    seq: u64,
    phase: Phase,
    /// Per rank: its call of op `seq`, once deposited.
    slots: Vec<Option<Slot>>,
    arrived: usize,
    /// Ranks that have taken the inputs of a ready op.
    taken: usize,
    /// The first error; once set, the group is failed for good.
    failure: Option<CollectiveError>,
}

/// What a rank called: everything that must agree across ranks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Call {
    op: Op,
    reduce: Option<ReduceOp>,
    root: Option<usize>,
    len: usize,
}

impl std::fmt::Display for Call {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.op)?;
        if let Some(r) = self.reduce {
            write!(f, "({r})")?;
        }
        if let Some(root) = self.root {
            write!(f, "(root {root})")?;
        }
        write!(f, " of {} elements", self.len)
    }
}

#[derive(Debug, Clone)]
enum Payload {
    None,
    F32(Arc<[f32]>),
    F64(f64),
}

#[derive(Debug)]
struct Slot {
    call: Call,
    payload: Payload,
}

fn lock(m: &Mutex<State>) -> MutexGuard<'_, State> {
    // No code panics while holding the lock; recovering from poison keeps "no panic on misuse"
    // even if that ever changes, and the failure flag still ends the run cleanly.
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl LocalCollective {
    /// A group of `world` ranks, handle `r` for rank `r`; move each into its rank's thread.
    /// An op that has not completed `timeout` after this rank called it fails the group with
    /// [`CollectiveError::Timeout`], so `timeout` must exceed the longest time a rank may
    /// legitimately spend between collectives while others wait (e.g. an evaluation done on
    /// rank 0 only). `world == 0` gives an empty group.
    pub fn group(world: usize, timeout: Duration) -> Vec<LocalCollective> {
        let shared = Arc::new(Shared {
            world,
            timeout,
            state: Mutex::new(State {
                seq: 0,
                phase: Phase::Collect,
                slots: (0..world).map(|_| None).collect(),
                arrived: 0,
                taken: 0,
                failure: None,
            }),
            cv: Condvar::new(),
        });
        (0..world)
            .map(|rank| LocalCollective {
                rank,
                shared: Arc::clone(&shared),
            })
            .collect()
    }

    /// The group's timeout for one op.
    pub fn timeout(&self) -> Duration {
        self.shared.timeout
    }

    /// Records `err` as the group's failure unless one is already recorded; returns the
    /// recorded one (what every rank reports) and wakes all waiters.
    fn fail(&self, st: &mut State, err: CollectiveError) -> CollectiveError {
        let recorded = st.failure.get_or_insert(err).clone();
        self.shared.cv.notify_all();
        recorded
    }

    /// Fails the group for a bad local argument (the others would otherwise wait for this rank
    /// until they time out).
    fn invalid(&self, op: Op, detail: String) -> CollectiveError {
        let mut st = lock(&self.shared.state);
        let err = CollectiveError::InvalidArgument {
            rank: self.rank,
            op,
            detail,
        };
        self.fail(&mut st, err)
    }

    /// One rendezvous: deposits `call` and `payload`, waits for all ranks, and returns every
    /// rank's payload in rank order.
    fn exchange(&self, call: Call, payload: Payload) -> Result<Vec<Payload>, CollectiveError> {
        let sh = &*self.shared;
        let start = Instant::now();
        let mut st = lock(&sh.state);

        // The previous op may still be handing out its inputs to slower ranks.
        loop {
            if let Some(e) = &st.failure {
                return Err(e.clone());
            }
            if st.phase == Phase::Collect {
                break;
            }
            // Op `st.seq` is still being handed out; this rank's call is the next one.
            let next = st.seq + 1;
            st = self.wait(st, start, call.op, next)?;
        }

        if st.slots.iter().flatten().any(|s| s.call != call) {
            // Every call deposited so far plus this one, in rank order.
            let detail: Vec<String> = st
                .slots
                .iter()
                .enumerate()
                .filter_map(|(r, s)| match s {
                    Some(s) => Some(format!("rank {r}: {}", s.call)),
                    None if r == self.rank => Some(format!("rank {r}: {call}")),
                    None => None,
                })
                .collect();
            let err = CollectiveError::Mismatch {
                seq: st.seq,
                detail: detail.join(", "),
            };
            return Err(self.fail(&mut st, err));
        }
        st.slots[self.rank] = Some(Slot { call, payload });
        st.arrived += 1;
        let seq = st.seq;
        if st.arrived == sh.world {
            st.phase = Phase::Ready;
            sh.cv.notify_all();
        }

        // Check completion before failure: an op every rank has deposited for is complete, even
        // if a rank that already took its result has since left the group.
        loop {
            if st.seq == seq && st.phase == Phase::Ready {
                break;
            }
            if let Some(e) = &st.failure {
                return Err(e.clone());
            }
            st = self.wait(st, start, call.op, seq)?;
        }
        let inputs: Vec<Payload> = st
            .slots
            .iter()
            .map(|s| s.as_ref().map_or(Payload::None, |s| s.payload.clone()))
            .collect();
        st.taken += 1;
        if st.taken == sh.world {
            st.slots.iter_mut().for_each(|s| *s = None);
            st.arrived = 0;
            st.taken = 0;
            st.seq += 1;
            st.phase = Phase::Collect;
            sh.cv.notify_all();
        }
        Ok(inputs)
    }

    /// Waits on the condvar until the deadline of this rank's op `seq`; at the deadline, fails
    /// the group.
    fn wait<'a>(
        &self,
        mut st: MutexGuard<'a, State>,
        start: Instant,
        op: Op,
        seq: u64,
    ) -> Result<MutexGuard<'a, State>, CollectiveError> {
        let waited = start.elapsed();
        if waited >= self.shared.timeout {
            let err = CollectiveError::Timeout {
                rank: self.rank,
                op,
                seq,
                waited,
            };
            return Err(self.fail(&mut st, err));
        }
        let (st, _) = self
            .shared
            .cv
            .wait_timeout(st, self.shared.timeout - waited)
            .unwrap_or_else(PoisonError::into_inner);
        Ok(st)
    }

    /// The f32 inputs of a completed exchange, in rank order.
    fn f32_inputs(&self, inputs: &[Payload], op: Op) -> Result<Vec<Arc<[f32]>>, CollectiveError> {
        inputs
            .iter()
            .map(|p| match p {
                Payload::F32(a) => Ok(Arc::clone(a)),
                // Unreachable while calls are validated equal; an error rather than a panic.
                _ => Err(self.invalid(op, "internal: missing f32 input".into())),
            })
            .collect()
    }
}

/// `out[i] = ((in_0[off+i] + in_1[off+i]) + …) + in_{N-1}[off+i]`, then `× (1/N)` for `Avg`.
fn reduce_into(out: &mut [f32], inputs: &[Arc<[f32]>], offset: usize, op: ReduceOp) {
    let end = offset + out.len();
    out.copy_from_slice(&inputs[0][offset..end]);
    for input in &inputs[1..] {
        for (o, x) in out.iter_mut().zip(&input[offset..end]) {
            *o += *x;
        }
    }
    if op == ReduceOp::Avg {
        let scale = 1.0_f32 / inputs.len() as f32;
        out.iter_mut().for_each(|o| *o *= scale);
    }
}

impl Collective for LocalCollective {
    fn rank(&self) -> usize {
        self.rank
    }

    fn world(&self) -> usize {
        self.shared.world
    }

    fn all_reduce(&mut self, buf: &mut [f32], op: ReduceOp) -> Result<(), CollectiveError> {
        let call = Call {
            op: Op::AllReduce,
            reduce: Some(op),
            root: None,
            len: buf.len(),
        };
        let inputs = self.exchange(call, Payload::F32(Arc::from(&*buf)))?;
        let inputs = self.f32_inputs(&inputs, Op::AllReduce)?;
        reduce_into(buf, &inputs, 0, op);
        Ok(())
    }

    fn reduce_scatter(
        &mut self,
        input: &[f32],
        output: &mut [f32],
        op: ReduceOp,
    ) -> Result<(), CollectiveError> {
        let world = self.shared.world;
        if input.len() != world * output.len() {
            return Err(self.invalid(
                Op::ReduceScatter,
                format!(
                    "input has {} elements, expected world {world} × output {} = {}",
                    input.len(),
                    output.len(),
                    world * output.len()
                ),
            ));
        }
        let call = Call {
            op: Op::ReduceScatter,
            reduce: Some(op),
            root: None,
            len: input.len(),
        };
        let inputs = self.exchange(call, Payload::F32(Arc::from(input)))?;
        let inputs = self.f32_inputs(&inputs, Op::ReduceScatter)?;
        reduce_into(output, &inputs, self.rank * output.len(), op);
        Ok(())
    }

    fn reduce(
        &mut self,
        buf: &mut [f32],
        root: usize,
        op: ReduceOp,
    ) -> Result<(), CollectiveError> {
        let world = self.shared.world;
        if root >= world {
            return Err(self.invalid(
                Op::Reduce,
                format!("root {root} is outside the group of {world} ranks"),
            ));
        }
        let call = Call {
            op: Op::Reduce,
            reduce: Some(op),
            root: Some(root),
            len: buf.len(),
        };
        let inputs = self.exchange(call, Payload::F32(Arc::from(&*buf)))?;
        if self.rank == root {
            let inputs = self.f32_inputs(&inputs, Op::Reduce)?;
            reduce_into(buf, &inputs, 0, op);
        }
        Ok(())
    }

    fn all_gather(&mut self, shard: &[f32], output: &mut [f32]) -> Result<(), CollectiveError> {
        let world = self.shared.world;
        if output.len() != world * shard.len() {
            return Err(self.invalid(
                Op::AllGather,
                format!(
                    "output has {} elements, expected world {world} × shard {} = {}",
                    output.len(),
                    shard.len(),
                    world * shard.len()
                ),
            ));
        }
        let call = Call {
            op: Op::AllGather,
            reduce: None,
            root: None,
            len: shard.len(),
        };
        let inputs = self.exchange(call, Payload::F32(Arc::from(shard)))?;
        let inputs = self.f32_inputs(&inputs, Op::AllGather)?;
        if !shard.is_empty() {
            for (dst, src) in output.chunks_exact_mut(shard.len()).zip(&inputs) {
                dst.copy_from_slice(src);
            }
        }
        Ok(())
    }

    fn broadcast(&mut self, buf: &mut [f32], root: usize) -> Result<(), CollectiveError> {
        let world = self.shared.world;
        if root >= world {
            return Err(self.invalid(
                Op::Broadcast,
                format!("root {root} is outside the group of {world} ranks"),
            ));
        }
        let call = Call {
            op: Op::Broadcast,
            reduce: None,
            root: Some(root),
            len: buf.len(),
        };
        // Only the root's data travels.
        let payload = if self.rank == root {
            Payload::F32(Arc::from(&*buf))
        } else {
            Payload::None
        };
        let inputs = self.exchange(call, payload)?;
        if self.rank != root {
            match &inputs[root] {
                Payload::F32(src) => buf.copy_from_slice(src),
                _ => return Err(self.invalid(Op::Broadcast, "internal: missing root input".into())),
            }
        }
        Ok(())
    }

    fn all_reduce_max(&mut self, x: f32) -> Result<f32, CollectiveError> {
        let call = Call {
            op: Op::AllReduceMax,
            reduce: None,
            root: None,
            len: 1,
        };
        let inputs = self.exchange(call, Payload::F32(Arc::from([x].as_slice())))?;
        let inputs = self.f32_inputs(&inputs, Op::AllReduceMax)?;
        let max = inputs
            .iter()
            .map(|v| v[0])
            .fold(f32::NEG_INFINITY, |acc, v| {
                // NaN-propagating on purpose (see the trait): f32::max would ignore a NaN flag.
                if acc.is_nan() || v.is_nan() {
                    f32::NAN
                } else {
                    acc.max(v)
                }
            });
        Ok(max)
    }

    fn all_reduce_sum_f64(&mut self, x: f64) -> Result<f64, CollectiveError> {
        let call = Call {
            op: Op::AllReduceSumF64,
            reduce: None,
            root: None,
            len: 1,
        };
        let inputs = self.exchange(call, Payload::F64(x))?;
        let mut sum: Option<f64> = None;
        for p in &inputs {
            match p {
                // Starting from rank 0's value (not 0.0) keeps −0.0 and the exact rank-order sum.
                Payload::F64(v) => sum = Some(sum.map_or(*v, |s| s + *v)),
                _ => {
                    return Err(
                        self.invalid(Op::AllReduceSumF64, "internal: missing f64 input".into())
                    )
                }
            }
        }
        Ok(sum.unwrap_or(0.0))
    }

    fn barrier(&mut self) -> Result<(), CollectiveError> {
        let call = Call {
            op: Op::Barrier,
            reduce: None,
            root: None,
            len: 0,
        };
        self.exchange(call, Payload::None).map(|_| ())
    }

    fn abort(&mut self, reason: &str) {
        let mut st = lock(&self.shared.state);
        let err = CollectiveError::Aborted {
            rank: self.rank,
            reason: reason.to_string(),
        };
        self.fail(&mut st, err);
    }
}

impl Drop for LocalCollective {
    fn drop(&mut self) {
        // A rank that leaves can never take part again: fail the group now so the others get an
        // error at their next (or pending) op instead of waiting out the timeout.
        let reason = if std::thread::panicking() {
            "it left the group: its thread panicked"
        } else {
            "it left the group: its LocalCollective was dropped (the rank returned)"
        };
        self.abort(reason);
    }
}
