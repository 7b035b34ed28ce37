//! NCCL (`libnccl.so`) between the fake GPUs of one process: communicators, groups and the
//! collectives the CUDA backend calls (runtime/src/backend/cuda/nccl.rs), computed on the host.
//!
//! A communicator is one rank of a group (shared by its ranks) on one GPU. `ncclCommInitAll`
//! makes a whole group at once; `ncclCommInitRank` joins the group its unique id names, with
//! the calling thread's current GPU, and returns once every rank has joined, or, called inside
//! `ncclGroupStart` … `ncclGroupEnd`, lets `ncclGroupEnd` wait for that (so one thread can make
//! several ranks). Ranks of another process never join: the fake cannot reach them.
//!
//! A collective is queued on its stream (`crate::enqueue`: it runs now, in a stream's thread,
//! or at each launch of the graph it was captured in). When it runs it meets the other ranks'
//! collective of the same number on the communicator (the n-th issued meets the n-th), checks
//! that they agree (kind, count, datatype, root), copies its input, and once every rank has
//! arrived the last one computes the result; only then does any rank write its output, so
//! in-place calls are safe. Sums are in rank order 0, 1, …, N−1 (f16 and bf16 accumulated in
//! f32 and rounded once), deterministic; only `ncclSum` is supported. Inside a group the calls
//! are kept and queued at the outermost `ncclGroupEnd`, in order; when the group holds calls of
//! several communicators, each communicator's calls are queued from a thread of its own, as
//! a real group launches them together (run one after another here, two ranks of one group
//! would wait for each other).
//!
//! Every wait (a rank for the others, an init for its group) gives up after
//! `RECIPE_COLLECTIVE_TIMEOUT` seconds (120 by default). A failure — a timeout, ranks that
//! disagree, a buffer outside the rank's GPU's live memory, a refused call, a GPU that faulted
//! — fails the whole group at once, so that the other ranks report it instead of waiting:
//! the failing operation faults its GPU (`crate::enqueue`), and `ncclCommGetAsyncError` reports
//! it on every rank. `ncclCommAbort` (and `ncclCommDestroy`) release the communicator and make
//! the group's pending and later collectives fail.

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crate::{complain, current, enqueue, set_current, state, Op};

/// `ncclResult_t` (nccl.h).
mod rc {
    pub const SUCCESS: i32 = 0;
    pub const UNHANDLED_CUDA_ERROR: i32 = 1;
    pub const SYSTEM_ERROR: i32 = 2;
    pub const INTERNAL_ERROR: i32 = 3;
    pub const INVALID_ARGUMENT: i32 = 4;
    pub const INVALID_USAGE: i32 = 5;
    pub const REMOTE_ERROR: i32 = 6;
    pub const IN_PROGRESS: i32 = 7;
}

/// `ncclSum` (the only `ncclRedOp_t` supported).
const SUM: c_int = 0;

/// NCCL 2.28.3 as `NCCL_VERSION_CODE` encodes it (major·10000 + minor·100 + patch since 2.9).
const VERSION: c_int = 22803;

/// How long a rank waits for the others: `RECIPE_COLLECTIVE_TIMEOUT` seconds, 120 by default
/// (a few seconds in the unit tests, which wait for it on purpose).
fn timeout() -> Duration {
    if cfg!(test) {
        return Duration::from_secs(3);
    }
    std::env::var("RECIPE_COLLECTIVE_TIMEOUT")
        .ok()
        .and_then(|v| v.parse::<u64>().ok())
        .filter(|&s| s > 0)
        .map_or(Duration::from_secs(120), Duration::from_secs)
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// `ncclDataType_t`.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Dtype {
    I8,
    U8,
    I32,
    U32,
    I64,
    U64,
    F16,
    F32,
    F64,
    Bf16,
    F8e4m3,
    F8e5m2,
}

impl Dtype {
    fn from_raw(v: c_int) -> Option<Dtype> {
        use Dtype::*;
        [
            I8, U8, I32, U32, I64, U64, F16, F32, F64, Bf16, F8e4m3, F8e5m2,
        ]
        .get(usize::try_from(v).ok()?)
        .copied()
    }

    fn size(self) -> usize {
        use Dtype::*;
        match self {
            I8 | U8 | F8e4m3 | F8e5m2 => 1,
            F16 | Bf16 => 2,
            I32 | U32 | F32 => 4,
            I64 | U64 | F64 => 8,
        }
    }

    /// Whether [`sum`] can add it (the 8-bit floats have no host type here).
    fn summable(self) -> bool {
        !matches!(self, Dtype::F8e4m3 | Dtype::F8e5m2)
    }

    fn name(self) -> &'static str {
        use Dtype::*;
        match self {
            I8 => "ncclInt8",
            U8 => "ncclUint8",
            I32 => "ncclInt32",
            U32 => "ncclUint32",
            I64 => "ncclInt64",
            U64 => "ncclUint64",
            F16 => "ncclFloat16",
            F32 => "ncclFloat32",
            F64 => "ncclFloat64",
            Bf16 => "ncclBfloat16",
            F8e4m3 => "ncclFloat8e4m3",
            F8e5m2 => "ncclFloat8e5m2",
        }
    }
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Kind {
    AllReduce,
    Reduce,
    Broadcast,
    AllGather,
    ReduceScatter,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::AllReduce => "ncclAllReduce",
            Kind::Reduce => "ncclReduce",
            Kind::Broadcast => "ncclBroadcast",
            Kind::AllGather => "ncclAllGather",
            Kind::ReduceScatter => "ncclReduceScatter",
        }
    }
}

/// One collective as a rank called it: every rank's must be the same. `count` is NCCL's
/// (all-gather: elements sent; reduce-scatter: elements received); `root` is 0 where unused.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
struct Call {
    kind: Kind,
    count: usize,
    dtype: Dtype,
    root: usize,
}

impl std::fmt::Display for Call {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} of {} {}",
            self.kind.name(),
            self.count,
            self.dtype.name()
        )?;
        if matches!(self.kind, Kind::Reduce | Kind::Broadcast) {
            write!(f, " (root {})", self.root)?;
        }
        Ok(())
    }
}

impl Call {
    /// Elements rank `rank` of `n` reads from its send buffer.
    fn reads(&self, rank: usize, n: usize) -> usize {
        match self.kind {
            Kind::AllReduce | Kind::Reduce | Kind::AllGather => self.count,
            Kind::Broadcast if rank == self.root => self.count,
            Kind::Broadcast => 0,
            Kind::ReduceScatter => self.count * n,
        }
    }

    /// Elements rank `rank` of `n` writes to its receive buffer.
    fn writes(&self, rank: usize, n: usize) -> usize {
        match self.kind {
            Kind::AllReduce | Kind::Broadcast | Kind::ReduceScatter => self.count,
            Kind::Reduce if rank == self.root => self.count,
            Kind::Reduce => 0,
            Kind::AllGather => self.count * n,
        }
    }

    /// Where rank `rank`'s output starts in the group's result, in bytes.
    fn offset(&self, rank: usize) -> usize {
        match self.kind {
            Kind::ReduceScatter => rank * self.count * self.dtype.size(),
            _ => 0,
        }
    }

    /// The group's result from every rank's input (rank order).
    fn combine(&self, inputs: &[&[u8]]) -> Result<Vec<u8>, String> {
        match self.kind {
            Kind::AllReduce | Kind::Reduce | Kind::ReduceScatter => sum(self.dtype, inputs),
            Kind::Broadcast => Ok(inputs[self.root].to_vec()),
            Kind::AllGather => Ok(inputs.concat()),
        }
    }
}

/// The element-wise sum of equally long inputs, in rank order.
fn sum(dtype: Dtype, inputs: &[&[u8]]) -> Result<Vec<u8>, String> {
    use half::{bf16, f16};
    Ok(match dtype {
        Dtype::F32 => fold(inputs, f32::from_le_bytes, |a, b| a + b, f32::to_le_bytes),
        Dtype::F64 => fold(inputs, f64::from_le_bytes, |a, b| a + b, f64::to_le_bytes),
        Dtype::F16 => fold(
            inputs,
            |b| f16::from_le_bytes(b).to_f32(),
            |a, b| a + b,
            |x| f16::from_f32(x).to_le_bytes(),
        ),
        Dtype::Bf16 => fold(
            inputs,
            |b| bf16::from_le_bytes(b).to_f32(),
            |a, b| a + b,
            |x| bf16::from_f32(x).to_le_bytes(),
        ),
        // Two's complement: a wrapping sum has the same bits signed or not.
        Dtype::I8 | Dtype::U8 => fold(inputs, u8::from_le_bytes, u8::wrapping_add, u8::to_le_bytes),
        Dtype::I32 | Dtype::U32 => fold(
            inputs,
            u32::from_le_bytes,
            u32::wrapping_add,
            u32::to_le_bytes,
        ),
        Dtype::I64 | Dtype::U64 => fold(
            inputs,
            u64::from_le_bytes,
            u64::wrapping_add,
            u64::to_le_bytes,
        ),
        Dtype::F8e4m3 | Dtype::F8e5m2 => {
            return Err(format!("a sum of {} (not supported)", dtype.name()))
        }
    })
}

/// Reads each input's `N`-byte elements as `T`, adds them in input order (the first one not
/// added to anything, so a one-rank sum is its input), and writes the totals back.
fn fold<const N: usize, T: Copy>(
    inputs: &[&[u8]],
    read: impl Fn([u8; N]) -> T,
    add: impl Fn(T, T) -> T,
    write: impl Fn(T) -> [u8; N],
) -> Vec<u8> {
    let element = |c: &[u8]| {
        let mut b = [0u8; N];
        b.copy_from_slice(c);
        read(b)
    };
    let Some((first, rest)) = inputs.split_first() else {
        return Vec::new();
    };
    let mut acc: Vec<T> = first.chunks_exact(N).map(element).collect();
    for x in rest {
        for (a, c) in acc.iter_mut().zip(x.chunks_exact(N)) {
            *a = add(*a, element(c));
        }
    }
    acc.into_iter().flat_map(write).collect()
}

/// Why a group failed, and the result code its ranks get.
#[derive(Clone, Debug)]
struct Failure {
    code: c_int,
    why: String,
}

/// One numbered collective on its way: the ranks' inputs until all have arrived, then the
/// result until all have taken it.
struct Round {
    call: Call,
    /// The rank whose call the others' are compared with.
    first: usize,
    inputs: Vec<Option<Vec<u8>>>,
    output: Option<Arc<Vec<u8>>>,
    taken: usize,
}

#[derive(Default)]
struct Shared {
    /// Each rank's GPU, once it has joined.
    devices: Vec<Option<i32>>,
    failure: Option<Failure>,
    /// The rank whose communicator was aborted or destroyed first.
    aborted: Option<usize>,
    rounds: BTreeMap<u64, Round>,
}

/// The ranks of one communicator, shared by their `Comm`s and queued operations.
struct Group {
    nranks: usize,
    /// For messages.
    serial: usize,
    shared: Mutex<Shared>,
    changed: Condvar,
}

impl Group {
    fn new(nranks: usize, devices: Vec<Option<i32>>) -> Arc<Group> {
        static SERIAL: AtomicUsize = AtomicUsize::new(0);
        Arc::new(Group {
            nranks,
            serial: SERIAL.fetch_add(1, Ordering::Relaxed) + 1,
            shared: Mutex::new(Shared {
                devices,
                ..Shared::default()
            }),
            changed: Condvar::new(),
        })
    }

    /// Records the group's failure (the first one stays) and wakes every waiting rank;
    /// returns the recorded one.
    fn fail(&self, sh: &mut Shared, code: c_int, why: String) -> Failure {
        let f = sh.failure.get_or_insert(Failure { code, why }).clone();
        self.changed.notify_all();
        f
    }

    /// Why rank waits are over without a result: a failure, or an aborted communicator.
    fn broken(&self, sh: &Shared) -> Option<Failure> {
        if let Some(f) = &sh.failure {
            return Some(f.clone());
        }
        sh.aborted.map(|r| Failure {
            code: rc::REMOTE_ERROR,
            why: format!(
                "NCCL group {}: rank {r}'s communicator was aborted or destroyed",
                self.serial
            ),
        })
    }

    fn missing(&self, have: impl Fn(usize) -> bool) -> Vec<usize> {
        (0..self.nranks).filter(|&r| !have(r)).collect()
    }

    /// Waits until every rank has joined (an `ncclCommInitRank`).
    fn wait_joined(self: &Arc<Group>) -> Result<(), Failure> {
        let deadline = Instant::now() + timeout();
        let mut sh = lock(&self.shared);
        loop {
            if let Some(f) = self.broken(&sh) {
                return Err(f);
            }
            if sh.devices.iter().all(Option::is_some) {
                return Ok(());
            }
            let now = Instant::now();
            if now >= deadline {
                let missing = self.missing(|r| sh.devices[r].is_some());
                let why = format!(
                    "NCCL group {}: ranks {missing:?} of {} did not join within {} s (a unique id \
                     from another process never completes here: the fake NCCL joins one \
                     process's ranks)",
                    self.serial,
                    self.nranks,
                    timeout().as_secs()
                );
                let f = self.fail(&mut sh, rc::SYSTEM_ERROR, why);
                drop(sh);
                forget_pending(self);
                return Err(f);
            }
            sh = self
                .changed
                .wait_timeout(sh, deadline - now)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }

    /// Rank `rank`'s part of collective number `seq`: deposits its input, waits for the other
    /// ranks', and returns the group's result (computed by the last to arrive).
    fn meet(
        &self,
        rank: usize,
        seq: u64,
        call: Call,
        input: Vec<u8>,
    ) -> Result<Arc<Vec<u8>>, Failure> {
        let deadline = Instant::now() + timeout();
        let n = self.nranks;
        let mut sh = lock(&self.shared);
        if let Some(f) = self.broken(&sh) {
            return Err(f);
        }
        let round = sh.rounds.entry(seq).or_insert_with(|| Round {
            call,
            first: rank,
            inputs: vec![None; n],
            output: None,
            taken: 0,
        });
        if round.call != call {
            let why = format!(
                "NCCL group {}, collective #{seq}: rank {rank} called {call}, rank {} {} (every \
                 rank must make the same calls in the same order)",
                self.serial, round.first, round.call
            );
            return Err(self.fail(&mut sh, rc::INVALID_USAGE, why));
        }
        if round.inputs[rank].is_some() {
            let why = format!(
                "NCCL group {}: rank {rank} reached collective #{seq} twice",
                self.serial
            );
            return Err(self.fail(&mut sh, rc::INTERNAL_ERROR, why));
        }
        round.inputs[rank] = Some(input);
        if round.inputs.iter().all(Option::is_some) {
            let inputs: Vec<&[u8]> = round.inputs.iter().flatten().map(Vec::as_slice).collect();
            match call.combine(&inputs) {
                Ok(out) => {
                    round.output = Some(Arc::new(out));
                    round.inputs = Vec::new();
                    self.changed.notify_all();
                }
                Err(why) => return Err(self.fail(&mut sh, rc::INVALID_ARGUMENT, why)),
            }
        }
        loop {
            // A finished round is taken even if the group failed or was aborted since.
            if let Some(round) = sh.rounds.get_mut(&seq) {
                if let Some(out) = round.output.clone() {
                    round.taken += 1;
                    if round.taken == n {
                        sh.rounds.remove(&seq);
                    }
                    return Ok(out);
                }
            }
            if let Some(f) = self.broken(&sh) {
                return Err(f);
            }
            let now = Instant::now();
            if now >= deadline {
                let missing = match sh.rounds.get(&seq) {
                    Some(round) => self.missing(|r| round.inputs[r].is_some()),
                    None => Vec::new(),
                };
                let why = format!(
                    "NCCL group {}, collective #{seq} ({call}): ranks {missing:?} did not come \
                     within {} s",
                    self.serial,
                    timeout().as_secs()
                );
                return Err(self.fail(&mut sh, rc::SYSTEM_ERROR, why));
            }
            sh = self
                .changed
                .wait_timeout(sh, deadline - now)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }
}

/// One rank's communicator.
struct Comm {
    group: Arc<Group>,
    rank: usize,
    device: i32,
    /// Collectives numbered so far (the n-th meets the other ranks' n-th).
    issued: AtomicU64,
    /// Its own failure's code (the first).
    error: Mutex<Option<c_int>>,
}

impl Comm {
    fn new(group: &Arc<Group>, rank: usize, device: i32) -> Arc<Comm> {
        Arc::new(Comm {
            group: Arc::clone(group),
            rank,
            device,
            issued: AtomicU64::new(0),
            error: Mutex::new(None),
        })
    }

    fn set_error(&self, code: c_int) {
        lock(&self.error).get_or_insert(code);
    }

    /// `ncclCommGetAsyncError`'s answer: its own failure, else its group's.
    fn async_error(&self) -> c_int {
        if let Some(code) = *lock(&self.error) {
            return code;
        }
        let sh = lock(&self.group.shared);
        sh.failure.as_ref().map_or(rc::SUCCESS, |f| f.code)
    }

    /// Fails the group for this rank's reason; the others get `REMOTE_ERROR`.
    fn fail_group(&self, own: c_int, why: &str) {
        self.set_error(own);
        let mut sh = lock(&self.group.shared);
        let why = format!(
            "NCCL group {}: rank {} (GPU {}) failed: {why}",
            self.group.serial, self.rank, self.device
        );
        self.group.fail(&mut sh, rc::REMOTE_ERROR, why);
    }
}

/// Live communicators by handle (a handle is never dereferenced, so a stale one is only
/// unknown).
static COMMS: Mutex<BTreeMap<usize, Arc<Comm>>> = Mutex::new(BTreeMap::new());

/// Groups of `ncclCommInitRank` that some ranks have not joined yet, by unique id.
static PENDING: Mutex<BTreeMap<[u8; 128], Arc<Group>>> = Mutex::new(BTreeMap::new());

fn register(comm: Arc<Comm>) -> *mut c_void {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    let h = 0x4e43_0000 + 64 * (NEXT.fetch_add(1, Ordering::Relaxed) + 1);
    lock(&COMMS).insert(h, comm);
    h as *mut c_void
}

fn lookup(h: *mut c_void) -> Option<Arc<Comm>> {
    lock(&COMMS).get(&(h as usize)).cloned()
}

/// Takes `group` out of [`PENDING`] (complete, failed or aborted: its id joins nothing more).
fn forget_pending(group: &Arc<Group>) {
    lock(&PENDING).retain(|_, g| !Arc::ptr_eq(g, group));
}

/// The text of the last failure, for `ncclGetLastError`.
static LAST: Mutex<String> = Mutex::new(String::new());

/// Says why `what` is refused (stderr and `ncclGetLastError`); returns `code`.
fn refuse(what: &str, code: c_int, why: &str) -> c_int {
    complain(what, why);
    remember(what, why);
    code
}

/// Keeps `why` for `ncclGetLastError`.
fn remember(what: &str, why: &str) {
    *lock(&LAST) = format!("{what}: {why}");
}

/// A collective accepted by its call, to queue now or at the group's end.
struct Queued {
    comm: Arc<Comm>,
    call: Call,
    send: u64,
    recv: u64,
    stream: usize,
}

/// The calling thread's open group (`ncclGroupStart` without its `ncclGroupEnd`).
#[derive(Default)]
struct Batch {
    depth: usize,
    calls: Vec<Queued>,
    /// Communicators whose `ncclCommInitRank` waits for the group's end.
    inits: Vec<Arc<Comm>>,
    /// A call refused inside the group: the group's end reports it and queues nothing.
    refused: Option<c_int>,
}

thread_local! {
    static BATCH: RefCell<Batch> = RefCell::default();
}

/// Remembers a refusal inside a group for its end; returns `code`.
fn refused_in_group(code: c_int) -> c_int {
    BATCH.with(|b| {
        let mut b = b.borrow_mut();
        if b.depth > 0 {
            b.refused.get_or_insert(code);
        }
    });
    code
}

/// Queues `q` on its stream; the `ncclResult_t`.
fn issue(q: Queued) -> c_int {
    let Queued {
        comm,
        call,
        send,
        recv,
        stream,
    } = q;
    // A captured collective runs at each launch of its graph: numbered when it runs. Any other
    // is numbered now, in the order the rank issued it, whichever stream it waits on.
    let captured = stream != 0 && state().capture_of(stream).is_some();
    let seq = (!captured).then(|| comm.issued.fetch_add(1, Ordering::SeqCst));
    let what = call.kind.name();
    let op: Op = {
        let comm = Arc::clone(&comm);
        Arc::new(move || perform(&comm, call, send, recv, seq))
    };
    // NCCL launches on its communicator's GPU: the legacy stream is that GPU's.
    let before = current();
    if stream == 0 {
        set_current(Some(comm.device));
    }
    let r = enqueue(stream, what, op);
    if stream == 0 {
        set_current(before);
    }
    if r == crate::code::SUCCESS {
        return rc::SUCCESS;
    }
    // It ran and failed (the group knows, and `enqueue` said why), or it could not be queued
    // (a GPU that faulted earlier, a refused stream): then the others must not wait for it.
    if lock(&comm.error).is_none() {
        let why = format!("not queued: CUDA error {r} on GPU {}", comm.device);
        complain(what, &why);
        comm.fail_group(rc::UNHANDLED_CUDA_ERROR, &why);
        remember(what, &why);
    }
    comm.async_error()
}

/// A queued collective when it runs: rank `comm.rank`'s part of collective `seq`.
fn perform(comm: &Comm, call: Call, send: u64, recv: u64, seq: Option<u64>) -> Result<(), String> {
    let seq = seq.unwrap_or_else(|| comm.issued.fetch_add(1, Ordering::SeqCst));
    let (rank, n, size) = (comm.rank, comm.group.nranks, call.dtype.size());
    let (read, written) = (call.reads(rank, n) * size, call.writes(rank, n) * size);
    let checked = {
        let st = state();
        let send_ok = if read > 0 {
            st.check_range(comm.device, send, read)
                .map_err(|e| format!("its send buffer: {e}"))
        } else {
            Ok(())
        };
        send_ok.and_then(|()| {
            if written > 0 {
                st.check_range(comm.device, recv, written)
                    .map_err(|e| format!("its receive buffer: {e}"))
            } else {
                Ok(())
            }
        })
    };
    if let Err(why) = checked {
        let why = format!("collective #{seq} ({call}): {why}");
        comm.fail_group(rc::UNHANDLED_CUDA_ERROR, &why);
        remember(call.kind.name(), &why);
        return Err(why);
    }
    let mut input = vec![0u8; read];
    // SAFETY: `[send, send + read)` lies in a live allocation of the rank's GPU (checked above),
    // which is host memory.
    unsafe { std::ptr::copy_nonoverlapping(send as *const u8, input.as_mut_ptr(), read) };
    match comm.group.meet(rank, seq, call, input) {
        Ok(out) => {
            let from = call.offset(rank);
            if let Some(part) = out.get(from..from + written) {
                // SAFETY: `[recv, recv + written)` lies in a live allocation of the rank's GPU
                // (checked above); every rank has read its input (the result exists).
                unsafe { std::ptr::copy_nonoverlapping(part.as_ptr(), recv as *mut u8, written) };
            }
            Ok(())
        }
        Err(f) => {
            comm.set_error(f.code);
            remember(call.kind.name(), &f.why);
            Err(f.why)
        }
    }
}

/// A collective's call: checks it, then queues it (or keeps it for the group's end).
#[allow(clippy::too_many_arguments)]
fn collective(
    kind: Kind,
    send: *const c_void,
    recv: *mut c_void,
    count: usize,
    datatype: c_int,
    op: Option<c_int>,
    root: Option<c_int>,
    comm: *mut c_void,
    stream: *mut c_void,
) -> c_int {
    let what = kind.name();
    let Some(c) = lookup(comm) else {
        let code = refuse(
            what,
            rc::INVALID_ARGUMENT,
            &format!("{comm:p} is no live communicator"),
        );
        return refused_in_group(code);
    };
    let (n, stream) = (c.group.nranks, stream as usize);
    let checked = (|| -> Result<Call, String> {
        let dtype = Dtype::from_raw(datatype)
            .ok_or_else(|| format!("datatype {datatype} is none of NCCL's"))?;
        if let Some(op) = op {
            if op != SUM {
                return Err(format!("reduction {op}: the fake NCCL sums only (ncclSum)"));
            }
            if !dtype.summable() {
                return Err(format!("a sum of {}: not supported", dtype.name()));
            }
        }
        let root = match root {
            None => 0,
            Some(r) => usize::try_from(r)
                .ok()
                .filter(|&r| r < n)
                .ok_or_else(|| format!("root {r} in a group of {n}"))?,
        };
        let call = Call {
            kind,
            count,
            dtype,
            root,
        };
        if call.reads(c.rank, n) > 0 && send.is_null() {
            return Err("a null send buffer".into());
        }
        if call.writes(c.rank, n) > 0 && recv.is_null() {
            return Err("a null receive buffer".into());
        }
        if stream != 0 {
            match crate::device_of(stream) {
                None => return Err(format!("an unknown stream {stream:#x}")),
                Some(d) if d != c.device => {
                    return Err(format!(
                        "a stream of GPU {d} for rank {}'s communicator on GPU {}",
                        c.rank, c.device
                    ))
                }
                Some(_) => {}
            }
        }
        Ok(call)
    })();
    let call = match checked {
        Ok(call) => call,
        Err(why) => {
            // NCCL would refuse it and the other ranks would wait for it until aborted: here
            // they fail at once.
            c.fail_group(rc::INVALID_ARGUMENT, &format!("{what} refused: {why}"));
            return refused_in_group(refuse(what, rc::INVALID_ARGUMENT, &why));
        }
    };
    if count == 0 {
        // NCCL returns at once, without a collective for the others to meet.
        return rc::SUCCESS;
    }
    let q = Queued {
        comm: c,
        call,
        send: send as u64,
        recv: recv as u64,
        stream,
    };
    let kept = BATCH.with(|b| {
        let mut b = b.borrow_mut();
        if b.depth == 0 {
            return Some(q);
        }
        b.calls.push(q);
        None
    });
    match kept {
        Some(q) => issue(q),
        None => rc::SUCCESS,
    }
}

/// A unique id: a mark, the process, the time and a count, then a mix of them.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct UniqueId {
    pub internal: [c_char; 128],
}

const ID_MARK: &[u8; 8] = b"fakeNCCL";

#[no_mangle]
pub unsafe extern "C" fn ncclGetVersion(version: *mut c_int) -> c_int {
    if version.is_null() {
        return refuse("ncclGetVersion", rc::INVALID_ARGUMENT, "a null pointer");
    }
    *version = VERSION;
    rc::SUCCESS
}

#[no_mangle]
pub unsafe extern "C" fn ncclGetUniqueId(id: *mut UniqueId) -> c_int {
    static COUNT: AtomicU64 = AtomicU64::new(0);
    if id.is_null() {
        return refuse("ncclGetUniqueId", rc::INVALID_ARGUMENT, "a null pointer");
    }
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    let count = COUNT.fetch_add(1, Ordering::Relaxed);
    let mut bytes = [0u8; 128];
    bytes[..8].copy_from_slice(ID_MARK);
    bytes[8..12].copy_from_slice(&std::process::id().to_le_bytes());
    bytes[12..20].copy_from_slice(&nanos.to_le_bytes());
    bytes[20..28].copy_from_slice(&count.to_le_bytes());
    // splitmix64 over the three, so that ids differ all along.
    let mut s = nanos ^ (u64::from(std::process::id()) << 32) ^ count.rotate_left(17);
    for chunk in bytes[32..].chunks_exact_mut(8) {
        s = s.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = s;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        chunk.copy_from_slice(&(z ^ (z >> 31)).to_le_bytes());
    }
    for (c, b) in (*id).internal.iter_mut().zip(bytes) {
        *c = b as c_char;
    }
    rc::SUCCESS
}

#[no_mangle]
pub unsafe extern "C" fn ncclCommInitAll(
    comms: *mut *mut c_void,
    ndev: c_int,
    devlist: *const c_int,
) -> c_int {
    let what = "ncclCommInitAll";
    let Ok(n) = usize::try_from(ndev) else {
        return refuse(what, rc::INVALID_ARGUMENT, &format!("{ndev} devices"));
    };
    if n == 0 || comms.is_null() {
        return refuse(
            what,
            rc::INVALID_ARGUMENT,
            "no devices, or a null array of communicators",
        );
    }
    let devices: Vec<i32> = if devlist.is_null() {
        (0..ndev).collect()
    } else {
        std::slice::from_raw_parts(devlist, n).to_vec()
    };
    if let Some(d) = devices
        .iter()
        .find(|&&d| !(0..crate::devices()).contains(&d))
    {
        return refuse(
            what,
            rc::INVALID_ARGUMENT,
            &format!("GPU {d}: the fake driver has {}", crate::devices()),
        );
    }
    let mut sorted = devices.clone();
    sorted.sort_unstable();
    sorted.dedup();
    if sorted.len() != n {
        return refuse(
            what,
            rc::INVALID_USAGE,
            &format!("GPUs {devices:?}: two ranks on one GPU"),
        );
    }
    let group = Group::new(n, devices.iter().map(|&d| Some(d)).collect());
    for (rank, &d) in devices.iter().enumerate() {
        *comms.add(rank) = register(Comm::new(&group, rank, d));
    }
    rc::SUCCESS
}

#[no_mangle]
pub unsafe extern "C" fn ncclCommInitRank(
    comm: *mut *mut c_void,
    nranks: c_int,
    id: UniqueId,
    rank: c_int,
) -> c_int {
    let what = "ncclCommInitRank";
    let (Ok(n), Ok(r)) = (usize::try_from(nranks), usize::try_from(rank)) else {
        return refused_in_group(refuse(
            what,
            rc::INVALID_ARGUMENT,
            &format!("rank {rank} of {nranks}"),
        ));
    };
    if comm.is_null() || r >= n {
        return refused_in_group(refuse(
            what,
            rc::INVALID_ARGUMENT,
            &format!("rank {rank} of {nranks}, or a null communicator pointer"),
        ));
    }
    let Some(device) = current() else {
        return refused_in_group(refuse(
            what,
            rc::INVALID_USAGE,
            "no current context (NCCL uses the calling thread's GPU)",
        ));
    };
    let key: [u8; 128] = id.internal.map(|c| c as u8);
    if key[..8] == ID_MARK[..] && key[8..12] != std::process::id().to_le_bytes() {
        return refused_in_group(refuse(
            what,
            rc::SYSTEM_ERROR,
            "a unique id drawn by another process: the fake NCCL joins the ranks of one \
             process only",
        ));
    }
    let group = {
        let mut pending = lock(&PENDING);
        let group = Arc::clone(
            pending
                .entry(key)
                .or_insert_with(|| Group::new(n, vec![None; n])),
        );
        if group.nranks != n {
            drop(pending);
            return refused_in_group(refuse(
                what,
                rc::INVALID_ARGUMENT,
                &format!(
                    "rank {r} says the group has {n} ranks, an earlier rank said {}",
                    group.nranks
                ),
            ));
        }
        let mut sh = lock(&group.shared);
        if sh.devices[r].is_some() {
            drop(sh);
            drop(pending);
            return refused_in_group(refuse(
                what,
                rc::INVALID_USAGE,
                &format!("rank {r} joined this unique id's group twice"),
            ));
        }
        if let Some(other) = sh.devices.iter().position(|&d| d == Some(device)) {
            let why = format!(
                "NCCL group {}: ranks {other} and {r} both on GPU {device}",
                group.serial
            );
            group.fail(&mut sh, rc::INVALID_USAGE, why.clone());
            drop(sh);
            pending.retain(|_, g| !Arc::ptr_eq(g, &group));
            return refused_in_group(refuse(what, rc::INVALID_USAGE, &why));
        }
        sh.devices[r] = Some(device);
        if sh.devices.iter().all(Option::is_some) {
            pending.remove(&key);
            group.changed.notify_all();
        }
        drop(sh);
        group
    };
    let c = Comm::new(&group, r, device);
    let handle = register(Arc::clone(&c));
    *comm = handle;
    let deferred = BATCH.with(|b| {
        let mut b = b.borrow_mut();
        if b.depth > 0 {
            b.inits.push(Arc::clone(&c));
        }
        b.depth > 0
    });
    if deferred {
        return rc::SUCCESS;
    }
    match group.wait_joined() {
        Ok(()) => rc::SUCCESS,
        Err(f) => {
            lock(&COMMS).remove(&(handle as usize));
            *comm = std::ptr::null_mut();
            refuse(what, f.code, &f.why)
        }
    }
}

#[no_mangle]
pub unsafe extern "C" fn ncclGroupStart() -> c_int {
    BATCH.with(|b| b.borrow_mut().depth += 1);
    rc::SUCCESS
}

#[no_mangle]
pub unsafe extern "C" fn ncclGroupEnd() -> c_int {
    let batch = BATCH.with(|b| {
        let mut b = b.borrow_mut();
        if b.depth == 0 {
            return None;
        }
        b.depth -= 1;
        Some((b.depth == 0).then(|| std::mem::take(&mut *b)))
    });
    let batch = match batch {
        None => {
            return refuse(
                "ncclGroupEnd",
                rc::INVALID_USAGE,
                "no group open on this thread",
            )
        }
        Some(None) => return rc::SUCCESS,
        Some(Some(b)) => b,
    };
    let mut result = rc::SUCCESS;
    for c in &batch.inits {
        if let Err(f) = c.group.wait_joined() {
            c.set_error(f.code);
            if result == rc::SUCCESS {
                result = refuse("ncclGroupEnd (ncclCommInitRank)", f.code, &f.why);
            }
        }
    }
    if let Some(code) = batch.refused {
        if !batch.calls.is_empty() {
            complain(
                "ncclGroupEnd",
                &format!(
                    "{} collectives not queued: a call of the group was refused",
                    batch.calls.len()
                ),
            );
        }
        return code;
    }
    let calls = batch.calls;
    // Each communicator's calls, in the order they were made.
    let mut per_comm: Vec<Vec<Queued>> = Vec::new();
    for q in calls {
        match per_comm
            .iter_mut()
            .find(|l| Arc::ptr_eq(&l[0].comm, &q.comm))
        {
            Some(l) => l.push(q),
            None => per_comm.push(vec![q]),
        }
    }
    // Every call is queued, even after a failure (whose group then fails the others at once).
    let issue_all = |list: Vec<Queued>| {
        list.into_iter().map(issue).fold(
            rc::SUCCESS,
            |first, r| if first == rc::SUCCESS { r } else { first },
        )
    };
    let codes: Vec<c_int> = if per_comm.len() <= 1 {
        per_comm.into_iter().map(issue_all).collect()
    } else {
        // Several ranks from one thread: each queued from a thread of its own, since a rank's
        // collective waits for the others' when it runs.
        std::thread::scope(|s| {
            let threads: Vec<_> = per_comm
                .into_iter()
                .map(|list| s.spawn(move || issue_all(list)))
                .collect();
            threads
                .into_iter()
                .map(|t| t.join().unwrap_or(rc::INTERNAL_ERROR))
                .collect()
        })
    };
    if result == rc::SUCCESS {
        result = codes
            .into_iter()
            .find(|&r| r != rc::SUCCESS)
            .unwrap_or(rc::SUCCESS);
    }
    result
}

#[no_mangle]
pub unsafe extern "C" fn ncclAllReduce(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    count: usize,
    datatype: c_int,
    op: c_int,
    comm: *mut c_void,
    stream: *mut c_void,
) -> c_int {
    collective(
        Kind::AllReduce,
        sendbuff,
        recvbuff,
        count,
        datatype,
        Some(op),
        None,
        comm,
        stream,
    )
}

#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn ncclReduce(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    count: usize,
    datatype: c_int,
    op: c_int,
    root: c_int,
    comm: *mut c_void,
    stream: *mut c_void,
) -> c_int {
    collective(
        Kind::Reduce,
        sendbuff,
        recvbuff,
        count,
        datatype,
        Some(op),
        Some(root),
        comm,
        stream,
    )
}

#[no_mangle]
pub unsafe extern "C" fn ncclBroadcast(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    count: usize,
    datatype: c_int,
    root: c_int,
    comm: *mut c_void,
    stream: *mut c_void,
) -> c_int {
    collective(
        Kind::Broadcast,
        sendbuff,
        recvbuff,
        count,
        datatype,
        None,
        Some(root),
        comm,
        stream,
    )
}

/// The in-place broadcast of NCCL 1's API.
#[no_mangle]
pub unsafe extern "C" fn ncclBcast(
    buff: *mut c_void,
    count: usize,
    datatype: c_int,
    root: c_int,
    comm: *mut c_void,
    stream: *mut c_void,
) -> c_int {
    ncclBroadcast(buff, buff, count, datatype, root, comm, stream)
}

#[no_mangle]
pub unsafe extern "C" fn ncclAllGather(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    sendcount: usize,
    datatype: c_int,
    comm: *mut c_void,
    stream: *mut c_void,
) -> c_int {
    collective(
        Kind::AllGather,
        sendbuff,
        recvbuff,
        sendcount,
        datatype,
        None,
        None,
        comm,
        stream,
    )
}

#[no_mangle]
pub unsafe extern "C" fn ncclReduceScatter(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    recvcount: usize,
    datatype: c_int,
    op: c_int,
    comm: *mut c_void,
    stream: *mut c_void,
) -> c_int {
    collective(
        Kind::ReduceScatter,
        sendbuff,
        recvbuff,
        recvcount,
        datatype,
        Some(op),
        None,
        comm,
        stream,
    )
}

/// Releases `comm` and marks its group aborted: the other ranks' pending and later
/// collectives fail (they could never complete).
fn release(what: &str, comm: *mut c_void) -> c_int {
    if comm.is_null() {
        return rc::SUCCESS;
    }
    let Some(c) = lock(&COMMS).remove(&(comm as usize)) else {
        return refuse(
            what,
            rc::INVALID_ARGUMENT,
            &format!("{comm:p} is no live communicator (released already?)"),
        );
    };
    forget_pending(&c.group);
    let mut sh = lock(&c.group.shared);
    sh.aborted.get_or_insert(c.rank);
    c.group.changed.notify_all();
    rc::SUCCESS
}

#[no_mangle]
pub unsafe extern "C" fn ncclCommAbort(comm: *mut c_void) -> c_int {
    release("ncclCommAbort", comm)
}

#[no_mangle]
pub unsafe extern "C" fn ncclCommDestroy(comm: *mut c_void) -> c_int {
    release("ncclCommDestroy", comm)
}

/// Nothing to flush: a collective is done once its rank's part has run.
#[no_mangle]
pub unsafe extern "C" fn ncclCommFinalize(comm: *mut c_void) -> c_int {
    match lookup(comm) {
        Some(_) => rc::SUCCESS,
        None => refuse(
            "ncclCommFinalize",
            rc::INVALID_ARGUMENT,
            &format!("{comm:p} is no live communicator"),
        ),
    }
}

/// A communicator's query: `f` of it into `out`.
unsafe fn query(
    what: &str,
    comm: *mut c_void,
    out: *mut c_int,
    f: impl Fn(&Comm) -> c_int,
) -> c_int {
    if out.is_null() {
        return refuse(what, rc::INVALID_ARGUMENT, "a null pointer");
    }
    match lookup(comm) {
        Some(c) => {
            *out = f(&c);
            rc::SUCCESS
        }
        None => refuse(
            what,
            rc::INVALID_ARGUMENT,
            &format!("{comm:p} is no live communicator"),
        ),
    }
}

#[no_mangle]
pub unsafe extern "C" fn ncclCommGetAsyncError(comm: *mut c_void, error: *mut c_int) -> c_int {
    query("ncclCommGetAsyncError", comm, error, Comm::async_error)
}

#[no_mangle]
pub unsafe extern "C" fn ncclCommCount(comm: *mut c_void, count: *mut c_int) -> c_int {
    query("ncclCommCount", comm, count, |c| c.group.nranks as c_int)
}

#[no_mangle]
pub unsafe extern "C" fn ncclCommUserRank(comm: *mut c_void, rank: *mut c_int) -> c_int {
    query("ncclCommUserRank", comm, rank, |c| c.rank as c_int)
}

#[no_mangle]
pub unsafe extern "C" fn ncclCommCuDevice(comm: *mut c_void, device: *mut c_int) -> c_int {
    query("ncclCommCuDevice", comm, device, |c| c.device)
}

#[no_mangle]
pub unsafe extern "C" fn ncclGetErrorString(result: c_int) -> *const c_char {
    let text: &'static CStr = match result {
        rc::SUCCESS => c"no error",
        rc::UNHANDLED_CUDA_ERROR => c"unhandled cuda error (fake NCCL: see its message on stderr)",
        rc::SYSTEM_ERROR => {
            c"unhandled system error (fake NCCL: a rank timed out; see its message on stderr)"
        }
        rc::INTERNAL_ERROR => c"internal error (fake NCCL: see its message on stderr)",
        rc::INVALID_ARGUMENT => c"invalid argument (fake NCCL: see its message on stderr)",
        rc::INVALID_USAGE => c"invalid usage (fake NCCL: see its message on stderr)",
        rc::REMOTE_ERROR => {
            c"remote process exited or there was a network error (fake NCCL: another rank failed or aborted)"
        }
        rc::IN_PROGRESS => c"NCCL operation in progress",
        _ => c"unknown result code",
    };
    text.as_ptr()
}

/// The last failure's text, in a buffer of the calling thread (valid until its next call).
#[no_mangle]
pub unsafe extern "C" fn ncclGetLastError(_comm: *mut c_void) -> *const c_char {
    thread_local! {
        static TEXT: RefCell<CString> = RefCell::default();
    }
    let last = lock(&LAST).replace('\0', " ");
    TEXT.with(|t| {
        let mut t = t.borrow_mut();
        *t = CString::new(last).unwrap_or_default();
        t.as_ptr()
    })
}

#[cfg(test)]
mod tests {
    //! Ranks on threads, each with its GPU bound and host buffers registered as that GPU's
    //! live memory, on the legacy stream. Each test uses GPUs of its own, numbered past the
    //! other modules' tests' (a fault leaves its GPU failing for the whole process).
    use super::*;
    use std::ptr::null_mut;

    /// Host memory registered as a live allocation of `device`, released on drop.
    struct Buf {
        ptr: u64,
        device: i32,
        bytes: usize,
        layout: std::alloc::Layout,
    }

    impl Buf {
        fn new(device: i32, data: &[u8]) -> Buf {
            let layout = std::alloc::Layout::from_size_align(data.len().max(1), 64).unwrap();
            // SAFETY: a non-zero size.
            let p = unsafe { std::alloc::alloc(layout) };
            assert!(!p.is_null());
            // SAFETY: `p` has room for `data`.
            unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), p, data.len()) };
            let ptr = p as u64;
            crate::state().allocs.insert(
                ptr,
                crate::Alloc {
                    size: data.len(),
                    device,
                    layout,
                },
            );
            Buf {
                ptr,
                device,
                bytes: data.len(),
                layout,
            }
        }

        fn f32s(device: i32, xs: &[f32]) -> Buf {
            let bytes: Vec<u8> = xs.iter().flat_map(|x| x.to_le_bytes()).collect();
            Buf::new(device, &bytes)
        }

        /// Its contents once the GPU's queued work is done (`RECIPE_FAKE_CUDA_ASYNC`).
        fn bytes(&self) -> Vec<u8> {
            crate::streams::drain(self.device, None);
            let mut out = vec![0u8; self.bytes];
            // SAFETY: the buffer holds `bytes` bytes.
            unsafe {
                std::ptr::copy_nonoverlapping(self.ptr as *const u8, out.as_mut_ptr(), self.bytes)
            };
            out
        }

        fn read(&self) -> Vec<f32> {
            self.bytes()
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect()
        }

        fn p(&self) -> *mut c_void {
            self.ptr as *mut c_void
        }
    }

    impl Drop for Buf {
        fn drop(&mut self) {
            crate::state().allocs.remove(&self.ptr);
            // SAFETY: allocated in `new` with this layout.
            unsafe { std::alloc::dealloc(self.ptr as *mut u8, self.layout) };
        }
    }

    const F32: c_int = 7;
    const F16: c_int = 6;
    const BF16: c_int = 9;
    const LEGACY: *mut c_void = null_mut();

    /// A communicator handle that crosses threads.
    #[derive(Clone, Copy)]
    struct H(usize);

    impl H {
        fn p(self) -> *mut c_void {
            self.0 as *mut c_void
        }
    }

    fn unique_id() -> UniqueId {
        let mut id = UniqueId { internal: [0; 128] };
        // SAFETY: an out-pointer.
        assert_eq!(unsafe { ncclGetUniqueId(&mut id) }, rc::SUCCESS);
        id
    }

    /// One communicator per GPU of `devices`, made as the backend makes them across nodes:
    /// one thread, each GPU bound in turn, `ncclCommInitRank` inside one group.
    fn make_comms(devices: &[i32]) -> Vec<H> {
        let id = unique_id();
        let n = devices.len() as c_int;
        let mut out = vec![null_mut(); devices.len()];
        // SAFETY: out-pointers; ranks in range.
        unsafe {
            assert_eq!(ncclGroupStart(), rc::SUCCESS);
            for (rank, (&d, c)) in devices.iter().zip(out.iter_mut()).enumerate() {
                set_current(Some(d));
                assert_eq!(ncclCommInitRank(c, n, id, rank as c_int), rc::SUCCESS);
            }
            assert_eq!(ncclGroupEnd(), rc::SUCCESS);
        }
        out.into_iter().map(|c| H(c as usize)).collect()
    }

    /// `f(rank, comm, device)` on a thread per rank, its GPU bound; the results in rank order.
    fn on_ranks<R: Send>(
        comms: &[H],
        devices: &[i32],
        f: impl Fn(usize, *mut c_void, i32) -> R + Sync,
    ) -> Vec<R> {
        std::thread::scope(|s| {
            let f = &f;
            let threads: Vec<_> = comms
                .iter()
                .zip(devices)
                .enumerate()
                .map(|(rank, (&c, &d))| {
                    s.spawn(move || {
                        set_current(Some(d));
                        let r = f(rank, c.p(), d);
                        crate::streams::drain(d, None);
                        r
                    })
                })
                .collect();
            threads.into_iter().map(|t| t.join().unwrap()).collect()
        })
    }

    /// A call's result, or with asynchronous streams the GPU's once its work is done.
    fn settled(device: i32, r: c_int) -> c_int {
        if r != rc::SUCCESS {
            return r;
        }
        crate::streams::drain(device, None);
        crate::state().sticky.get(&device).copied().unwrap_or(0)
    }

    fn release_all(comms: &[H]) {
        for c in comms {
            // SAFETY: a communicator of `comms`, released once.
            assert_eq!(unsafe { ncclCommAbort(c.p()) }, rc::SUCCESS);
        }
    }

    fn async_error(c: *mut c_void) -> c_int {
        let mut e = -1;
        // SAFETY: an out-pointer.
        assert_eq!(unsafe { ncclCommGetAsyncError(c, &mut e) }, rc::SUCCESS);
        e
    }

    #[test]
    fn version_and_error_strings() {
        let mut v = 0;
        // SAFETY: out-pointers; static strings.
        unsafe {
            assert_eq!(ncclGetVersion(&mut v), rc::SUCCESS);
            assert_eq!((v / 10000, v / 100 % 100, v % 100), (2, 28, 3));
            let s = CStr::from_ptr(ncclGetErrorString(rc::SUCCESS));
            assert_eq!(s.to_str().unwrap(), "no error");
        }
        let (a, b) = (unique_id(), unique_id());
        assert_ne!(a.internal, b.internal, "two ids differ");
    }

    #[test]
    fn all_reduce_sums_in_rank_order_in_place_or_not() {
        let devices = [50, 51, 52];
        let comms = make_comms(&devices);
        let out = on_ranks(&comms, &devices, |rank, comm, d| {
            let r = rank as f32;
            let send = Buf::f32s(d, &[1.0 + r, 10.0 * r, 0.1, -r]);
            let recv = Buf::f32s(d, &[f32::NAN; 4]);
            // SAFETY: live buffers of four floats on the rank's GPU.
            unsafe {
                assert_eq!(
                    ncclAllReduce(send.p(), recv.p(), 4, F32, SUM, comm, LEGACY),
                    rc::SUCCESS
                );
                assert_eq!(
                    ncclAllReduce(send.p(), send.p(), 4, F32, SUM, comm, LEGACY),
                    rc::SUCCESS
                );
            }
            (recv.read(), send.read())
        });
        let tenth = 0.1f32 + 0.1 + 0.1;
        for (recv, in_place) in out {
            assert_eq!(recv, [6.0, 30.0, tenth, -3.0]);
            assert_eq!(in_place, recv);
        }
        for &c in &comms {
            assert_eq!(async_error(c.p()), rc::SUCCESS);
        }
        release_all(&comms);
    }

    #[test]
    fn reduce_to_root_1_and_broadcast_from_root_1() {
        let devices = [53, 54, 55];
        let comms = make_comms(&devices);
        let out = on_ranks(&comms, &devices, |rank, comm, d| {
            let buf = Buf::f32s(d, &[rank as f32 + 1.0, 2.0]);
            let other = Buf::f32s(d, &[7.0, 7.0]);
            // SAFETY: live buffers of two floats on the rank's GPU.
            unsafe {
                assert_eq!(
                    ncclReduce(buf.p(), buf.p(), 2, F32, SUM, 1, comm, LEGACY),
                    rc::SUCCESS
                );
                let reduced = buf.read();
                assert_eq!(
                    ncclBroadcast(other.p(), other.p(), 2, F32, 1, comm, LEGACY),
                    rc::SUCCESS
                );
                // Rank 1 sends its sum to the others.
                assert_eq!(ncclBcast(buf.p(), 2, F32, 1, comm, LEGACY), rc::SUCCESS);
                (reduced, other.read(), buf.read())
            }
        });
        for (rank, (reduced, other, bcast)) in out.into_iter().enumerate() {
            if rank == 1 {
                assert_eq!(reduced, [6.0, 6.0]);
            } else {
                assert_eq!(reduced, [rank as f32 + 1.0, 2.0], "left as it was");
            }
            assert_eq!(other, [7.0, 7.0]);
            assert_eq!(bcast, [6.0, 6.0]);
        }
        release_all(&comms);
    }

    #[test]
    fn a_group_of_two_ops_per_rank() {
        let devices = [56, 57];
        let comms = make_comms(&devices);
        let out = on_ranks(&comms, &devices, |rank, comm, d| {
            let a = Buf::f32s(d, &[rank as f32 + 1.0; 3]);
            let b = Buf::f32s(d, &[if rank == 0 { 5.0 } else { -1.0 }; 2]);
            // SAFETY: live buffers on the rank's GPU.
            unsafe {
                assert_eq!(ncclGroupStart(), rc::SUCCESS);
                assert_eq!(
                    ncclAllReduce(a.p(), a.p(), 3, F32, SUM, comm, LEGACY),
                    rc::SUCCESS
                );
                assert_eq!(ncclBcast(b.p(), 2, F32, 0, comm, LEGACY), rc::SUCCESS);
                // Nothing ran yet: the calls wait for the group's end.
                assert_eq!(a.read(), [rank as f32 + 1.0; 3]);
                assert_eq!(ncclGroupEnd(), rc::SUCCESS);
            }
            (a.read(), b.read())
        });
        for (a, b) in out {
            assert_eq!(a, [3.0; 3]);
            assert_eq!(b, [5.0; 2]);
        }
        release_all(&comms);
    }

    #[test]
    fn one_thread_in_a_group_drives_every_rank() {
        let devices = [77, 78];
        let comms = make_comms(&devices);
        let bufs: Vec<Buf> = devices
            .iter()
            .enumerate()
            .map(|(r, &d)| Buf::f32s(d, &[r as f32 + 0.5; 2]))
            .collect();
        // SAFETY: live buffers, each on its rank's GPU.
        unsafe {
            assert_eq!(ncclGroupStart(), rc::SUCCESS);
            for (c, b) in comms.iter().zip(&bufs) {
                assert_eq!(
                    ncclAllReduce(b.p(), b.p(), 2, F32, SUM, c.p(), LEGACY),
                    rc::SUCCESS
                );
            }
            assert_eq!(ncclGroupEnd(), rc::SUCCESS);
        }
        for &d in &devices {
            crate::streams::drain(d, None);
        }
        for b in &bufs {
            assert_eq!(b.read(), [2.0; 2]);
        }
        release_all(&comms);
    }

    #[test]
    fn init_rank_meets_across_threads_and_in_one_threads_group() {
        // One thread per rank: each returns once all have joined.
        let devices = [58, 59, 60];
        let id = unique_id();
        let made = std::thread::scope(|s| {
            let threads: Vec<_> = devices
                .iter()
                .enumerate()
                .map(|(rank, &d)| {
                    s.spawn(move || {
                        set_current(Some(d));
                        let mut c = null_mut();
                        // SAFETY: an out-pointer; a rank in range.
                        let r = unsafe { ncclCommInitRank(&mut c, 3, id, rank as c_int) };
                        (r, H(c as usize))
                    })
                })
                .collect();
            threads
                .into_iter()
                .map(|t| t.join().unwrap())
                .collect::<Vec<_>>()
        });
        for (rank, &(r, c)) in made.iter().enumerate() {
            assert_eq!(r, rc::SUCCESS);
            let (mut n, mut me, mut d) = (0, 0, 0);
            // SAFETY: out-pointers.
            unsafe {
                assert_eq!(ncclCommCount(c.p(), &mut n), rc::SUCCESS);
                assert_eq!(ncclCommUserRank(c.p(), &mut me), rc::SUCCESS);
                assert_eq!(ncclCommCuDevice(c.p(), &mut d), rc::SUCCESS);
            }
            assert_eq!((n, me, d), (3, rank as c_int, devices[rank]));
        }
        let comms: Vec<H> = made.into_iter().map(|(_, c)| c).collect();
        let sums = on_ranks(&comms, &devices, |rank, comm, d| {
            let b = Buf::f32s(d, &[rank as f32]);
            // SAFETY: a live buffer of one float on the rank's GPU.
            let r = unsafe { ncclAllReduce(b.p(), b.p(), 1, F32, SUM, comm, LEGACY) };
            (r, b.read())
        });
        assert!(sums.iter().all(|s| *s == (rc::SUCCESS, vec![3.0])));
        release_all(&comms);

        // One thread, every rank inside a group (the backend's `group_across`).
        let devices = [61, 62];
        let comms = make_comms(&devices);
        for (rank, c) in comms.iter().enumerate() {
            let mut me = -1;
            // SAFETY: an out-pointer.
            assert_eq!(unsafe { ncclCommUserRank(c.p(), &mut me) }, rc::SUCCESS);
            assert_eq!(me, rank as c_int);
        }
        release_all(&comms);
        // SAFETY: released above: a second abort is refused, not a crash.
        assert_eq!(unsafe { ncclCommAbort(comms[0].p()) }, rc::INVALID_ARGUMENT);
    }

    #[test]
    fn init_all_numbers_the_listed_gpus() {
        let mut c = [null_mut(); 2];
        // SAFETY: room for two communicators; a list of two GPUs.
        unsafe {
            assert_eq!(
                ncclCommInitAll(c.as_mut_ptr(), 2, std::ptr::null()),
                rc::SUCCESS
            );
            let mut d = -1;
            assert_eq!(ncclCommCuDevice(c[1], &mut d), rc::SUCCESS);
            assert_eq!(d, 1);
            for h in c {
                assert_eq!(ncclCommDestroy(h), rc::SUCCESS);
            }
            let list = [2, 1];
            assert_eq!(
                ncclCommInitAll(c.as_mut_ptr(), 2, list.as_ptr()),
                rc::SUCCESS
            );
            assert_eq!(ncclCommCuDevice(c[0], &mut d), rc::SUCCESS);
            assert_eq!(d, 2);
            for h in c {
                assert_eq!(ncclCommAbort(h), rc::SUCCESS);
            }
            let twice = [1, 1];
            assert_eq!(
                ncclCommInitAll(c.as_mut_ptr(), 2, twice.as_ptr()),
                rc::INVALID_USAGE
            );
        }
    }

    #[test]
    fn half_sums_all_gather_and_reduce_scatter() {
        use half::{bf16, f16};
        let devices = [72, 73];
        let comms = make_comms(&devices);
        let out = on_ranks(&comms, &devices, |rank, comm, d| {
            let r = rank as f32;
            let h: Vec<u8> = [1.0 + r, 0.25]
                .iter()
                .flat_map(|&x| f16::from_f32(x).to_le_bytes())
                .collect();
            let b: Vec<u8> = [3.0 * r, -1.0]
                .iter()
                .flat_map(|&x| bf16::from_f32(x).to_le_bytes())
                .collect();
            let (h, b) = (Buf::new(d, &h), Buf::new(d, &b));
            let send = Buf::f32s(d, &[r, r + 0.5]);
            let gathered = Buf::f32s(d, &[f32::NAN; 4]);
            let scatter = Buf::f32s(d, &[1.0, 2.0, 3.0, 4.0]);
            let mine = Buf::f32s(d, &[f32::NAN; 2]);
            // SAFETY: live buffers on the rank's GPU, of the sizes given.
            unsafe {
                assert_eq!(ncclAllReduce(h.p(), h.p(), 2, F16, SUM, comm, LEGACY), 0);
                assert_eq!(ncclAllReduce(b.p(), b.p(), 2, BF16, SUM, comm, LEGACY), 0);
                assert_eq!(
                    ncclAllGather(send.p(), gathered.p(), 2, F32, comm, LEGACY),
                    0
                );
                assert_eq!(
                    ncclReduceScatter(scatter.p(), mine.p(), 2, F32, SUM, comm, LEGACY),
                    0
                );
            }
            let h: Vec<f32> = h
                .bytes()
                .chunks_exact(2)
                .map(|c| f16::from_le_bytes([c[0], c[1]]).to_f32())
                .collect();
            let b: Vec<f32> = b
                .bytes()
                .chunks_exact(2)
                .map(|c| bf16::from_le_bytes([c[0], c[1]]).to_f32())
                .collect();
            (h, b, gathered.read(), mine.read())
        });
        for (rank, (h, b, gathered, mine)) in out.into_iter().enumerate() {
            assert_eq!(h, [3.0, 0.5]);
            assert_eq!(b, [3.0, -2.0]);
            assert_eq!(gathered, [0.0, 0.5, 1.0, 1.5]);
            assert_eq!(mine, [[2.0, 4.0], [6.0, 8.0]][rank]);
        }
        release_all(&comms);
    }

    #[test]
    fn ranks_that_disagree_fail_together_without_waiting() {
        let devices = [63, 64];
        let comms = make_comms(&devices);
        let start = Instant::now();
        let codes = on_ranks(&comms, &devices, |rank, comm, d| {
            let b = Buf::f32s(d, &[1.0; 5]);
            let n = 4 + (rank == 0) as usize;
            // SAFETY: a live buffer of five floats; rank 1 sums only four.
            settled(d, unsafe {
                ncclAllReduce(b.p(), b.p(), n, F32, SUM, comm, LEGACY)
            })
        });
        assert!(start.elapsed() < timeout(), "failed before the timeout");
        assert!(codes.iter().all(|&c| c != rc::SUCCESS), "{codes:?}");
        for c in &comms {
            assert_eq!(async_error(c.p()), rc::INVALID_USAGE);
        }
        release_all(&comms);
    }

    #[test]
    fn a_buffer_of_another_gpu_fails_every_rank() {
        let devices = [65, 66];
        let comms = make_comms(&devices);
        let start = Instant::now();
        let codes = on_ranks(&comms, &devices, |rank, comm, d| {
            // Rank 1's buffer lies on GPU 67.
            let b = Buf::f32s(if rank == 1 { 67 } else { d }, &[1.0; 2]);
            // SAFETY: a live buffer of two floats.
            settled(d, unsafe {
                ncclAllReduce(b.p(), b.p(), 2, F32, SUM, comm, LEGACY)
            })
        });
        assert!(start.elapsed() < timeout(), "failed before the timeout");
        assert!(codes.iter().all(|&c| c != rc::SUCCESS), "{codes:?}");
        assert_eq!(async_error(comms[1].p()), rc::UNHANDLED_CUDA_ERROR);
        assert_eq!(async_error(comms[0].p()), rc::REMOTE_ERROR);
        // SAFETY: the thread's last error, a NUL-terminated string.
        let last = unsafe { CStr::from_ptr(ncclGetLastError(comms[0].p())) };
        assert!(!last.to_bytes().is_empty());
        release_all(&comms);
    }

    #[test]
    fn an_abort_wakes_the_waiting_rank() {
        let devices = [68, 69];
        let comms = make_comms(&devices);
        let start = Instant::now();
        let codes = on_ranks(&comms, &devices, |rank, comm, d| {
            if rank == 1 {
                std::thread::sleep(Duration::from_millis(50));
                // SAFETY: rank 1's communicator, released once.
                return unsafe { ncclCommAbort(comm) };
            }
            let b = Buf::f32s(d, &[1.0]);
            // SAFETY: a live buffer of one float.
            settled(d, unsafe {
                ncclAllReduce(b.p(), b.p(), 1, F32, SUM, comm, LEGACY)
            })
        });
        assert!(start.elapsed() < timeout(), "woken before the timeout");
        assert_eq!(codes[1], rc::SUCCESS);
        assert_ne!(codes[0], rc::SUCCESS);
        assert_eq!(async_error(comms[0].p()), rc::REMOTE_ERROR);
        // SAFETY: rank 0's communicator, released once.
        assert_eq!(unsafe { ncclCommAbort(comms[0].p()) }, rc::SUCCESS);
    }

    #[test]
    fn an_init_whose_ranks_never_come_times_out() {
        set_current(Some(70));
        let id = unique_id();
        let mut c = null_mut();
        let start = Instant::now();
        // SAFETY: an out-pointer; rank 0 of 2, and rank 1 never comes.
        let r = unsafe { ncclCommInitRank(&mut c, 2, id, 0) };
        assert_eq!(r, rc::SYSTEM_ERROR);
        assert!(c.is_null());
        assert!(start.elapsed() >= timeout());

        // An id from another process fails at once.
        let mut foreign = unique_id();
        foreign.internal[8] = foreign.internal[8].wrapping_add(1);
        set_current(Some(71));
        // SAFETY: as above.
        let r = unsafe { ncclCommInitRank(&mut c, 2, foreign, 0) };
        assert_eq!(r, rc::SYSTEM_ERROR);
    }

    #[test]
    fn misuse_is_refused() {
        let devices = [74, 75];
        let comms = make_comms(&devices);
        let b = Buf::f32s(74, &[1.0]);
        // SAFETY: a live buffer; a group closed without being opened.
        unsafe {
            assert_eq!(ncclGroupEnd(), rc::INVALID_USAGE);
            set_current(Some(74));
            assert_eq!(
                ncclAllReduce(b.p(), b.p(), 1, F32, 2, comms[0].p(), LEGACY),
                rc::INVALID_ARGUMENT,
                "max is not supported"
            );
            assert_eq!(
                ncclAllReduce(b.p(), b.p(), 1, 10, SUM, comms[0].p(), LEGACY),
                rc::INVALID_ARGUMENT,
                "a sum of fp8"
            );
        }
        // The other rank is not left waiting: its group failed.
        assert_eq!(async_error(comms[1].p()), rc::REMOTE_ERROR);
        release_all(&comms);
    }
}
