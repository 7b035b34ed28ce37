//! The hub: node 0's process listens, waits until every rank of the run has joined, then runs
//! one proxy thread per rank. Each proxy holds that rank's end of a [`LocalCollective`] group
//! and replays the rank's requests on it, so the arithmetic, the ordering and the failure model
//! are those of the in-process group by construction (collective/local.rs), not a second
//! implementation of them.

use std::io::{BufReader, BufWriter, ErrorKind, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use super::wire::{self, tag, Hello};
use super::NetError;
use crate::collective::{Collective, LocalCollective};

/// What the hub admits.
#[derive(Debug, Clone)]
pub struct Expect {
    /// Ranks in the run.
    pub world: usize,
    /// What every rank's process must agree on; a rank with another digest is refused.
    pub digest: String,
    /// How the ranks exchange; every rank must match.
    pub mode: String,
    /// Handed to every rank on admission (an NCCL unique id; empty when none).
    pub blob: Vec<u8>,
    /// How long to wait for every rank to join.
    pub join: Duration,
    /// The group's timeout for one collective ([`LocalCollective::group`]).
    pub op: Duration,
}

/// A running hub; see the module docs.
#[derive(Debug)]
pub struct Hub {
    addr: SocketAddr,
    thread: JoinHandle<Result<(), NetError>>,
}

/// How long a connection may take to say who it is.
const HELLO: Duration = Duration::from_secs(10);
/// How often the accept loop looks at the clock.
const POLL: Duration = Duration::from_millis(10);

impl Hub {
    /// Listens on `bind` (`host:port`; port 0 picks a free one, see [`Hub::addr`]) and starts
    /// admitting ranks on a thread of its own.
    pub fn start(bind: &str, expect: Expect) -> Result<Hub, NetError> {
        let fail = |source| NetError::Bind {
            addr: bind.to_string(),
            source,
        };
        let addrs: Vec<SocketAddr> = bind.to_socket_addrs().map_err(fail)?.collect();
        let listener = TcpListener::bind(&addrs[..]).map_err(fail)?;
        let addr = listener.local_addr().map_err(fail)?;
        listener.set_nonblocking(true).map_err(fail)?;
        let thread = thread::Builder::new()
            .name("recipe-hub".into())
            .spawn(move || serve(listener, expect))
            .map_err(fail)?;
        Ok(Hub { addr, thread })
    }

    /// The address it listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Waits up to `within` for every rank of the other nodes to leave, so that node 0's
    /// process does not end (and close their connections) while their last collectives are in
    /// flight; a node that never says goodbye (a network gone silent) is not waited for past
    /// that. Whether they all left.
    pub fn finish_within(self, within: Duration) -> bool {
        let start = Instant::now();
        while !self.thread.is_finished() {
            if start.elapsed() >= within {
                return false;
            }
            thread::sleep(POLL);
        }
        let _ = self.thread.join();
        true
    }

    /// Waits until every rank has joined and left: the gathering's error if the run never
    /// gathered (the ranks see theirs too).
    pub fn finish(self) -> Result<(), NetError> {
        self.thread.join().unwrap_or_else(|_| {
            Err(NetError::Protocol(
                "the hub's thread panicked (a bug; please report it)".into(),
            ))
        })
    }
}

/// Admits ranks until all have joined or `expect.join` has passed, then proxies them.
fn serve(listener: TcpListener, expect: Expect) -> Result<(), NetError> {
    let start = Instant::now();
    let mut joined: Vec<Option<(TcpStream, SocketAddr)>> =
        (0..expect.world).map(|_| None).collect();
    let mut refused = Vec::new();
    while joined.iter().any(Option::is_none) {
        match listener.accept() {
            Ok((stream, peer)) => {
                if let Some(why) = admit(stream, peer, &expect, &mut joined) {
                    refused.push(format!("{peer}: {why}"));
                }
            }
            Err(e) if e.kind() == ErrorKind::WouldBlock => {
                if start.elapsed() >= expect.join {
                    let have: Vec<usize> =
                        (0..expect.world).filter(|&r| joined[r].is_some()).collect();
                    let err = NetError::Gather {
                        joined: have,
                        world: expect.world,
                        waited: expect.join,
                        refused,
                    };
                    for (mut s, _) in joined.into_iter().flatten() {
                        let _ = refuse(&mut s, &err.to_string());
                    }
                    return Err(err);
                }
                thread::sleep(POLL);
            }
            // A connection that failed before it was accepted: the rank retries.
            Err(_) => thread::sleep(POLL),
        }
    }
    let group = LocalCollective::group(expect.world, expect.op);
    let proxies: Vec<JoinHandle<()>> = joined
        .into_iter()
        .flatten()
        .zip(group)
        .map(|((stream, _), coll)| {
            let blob = expect.blob.clone();
            thread::spawn(move || proxy(stream, coll, &blob))
        })
        .collect();
    for p in proxies {
        let _ = p.join();
    }
    Ok(())
}

/// Reads a connection's hello and seats it, or refuses it with the reason (returned too).
fn admit(
    mut stream: TcpStream,
    peer: SocketAddr,
    expect: &Expect,
    joined: &mut [Option<(TcpStream, SocketAddr)>],
) -> Option<String> {
    let hello = stream
        .set_nonblocking(false)
        .and_then(|()| stream.set_read_timeout(Some(HELLO)))
        .and_then(|()| wire::get_hello(&mut BufReader::new(&stream)));
    let hello = match hello {
        Ok(h) => h,
        // Not a rank (a port scan, a health check, a stray client): nothing to tell it.
        Err(e) => return Some(format!("not admitted: {e}")),
    };
    let why = judge(&hello, expect, joined);
    match why {
        Some(why) => {
            let _ = refuse(&mut stream, &why);
            Some(format!("rank {}: {why}", hello.rank))
        }
        None => {
            joined[hello.rank] = Some((stream, peer));
            None
        }
    }
}

/// Why `hello` cannot join, if it cannot.
fn judge(
    hello: &Hello,
    expect: &Expect,
    joined: &[Option<(TcpStream, SocketAddr)>],
) -> Option<String> {
    if hello.world != expect.world {
        return Some(format!(
            "it runs {} rank(s) and this run has {}: every node must run the same plan with the same --gpus and --nodes",
            hello.world, expect.world
        ));
    }
    if hello.digest != expect.digest {
        return Some(format!(
            "it runs `{}` and node 0 runs `{}`: every node must run the same plan (the same recipe build, the same --set flags) from the same checkpoint",
            hello.digest, expect.digest
        ));
    }
    if hello.mode != expect.mode {
        return Some(format!(
            "it exchanges as `{}` and node 0 as `{}`: every node must train on the same kind of device",
            hello.mode, expect.mode
        ));
    }
    if hello.rank >= expect.world {
        return Some(format!(
            "rank {} is outside a run of {} rank(s)",
            hello.rank, expect.world
        ));
    }
    if let Some((_, at)) = &joined[hello.rank] {
        return Some(format!(
            "rank {} has already joined from {at}: two nodes with the same --node-rank?",
            hello.rank
        ));
    }
    None
}

fn refuse(stream: &mut TcpStream, why: &str) -> std::io::Result<()> {
    let mut w = BufWriter::new(stream);
    wire::put_u8(&mut w, wire::REFUSE)?;
    wire::put_str(&mut w, why)?;
    w.flush()
}

/// Welcomes a rank, then replays its requests on `coll` until it leaves.
fn proxy(stream: TcpStream, mut coll: LocalCollective, blob: &[u8]) {
    // Between collectives a rank may compute for as long as it likes (the group's timeout
    // judges the waits inside them), so reads here have no deadline.
    let setup = stream
        .set_read_timeout(None)
        .and_then(|()| stream.set_nodelay(true))
        .and_then(|()| stream.try_clone());
    let Ok(read_half) = setup else {
        coll.abort("it left the group: its connection failed at the start");
        return;
    };
    let mut r = BufReader::with_capacity(1 << 16, read_half);
    let mut w = BufWriter::with_capacity(1 << 16, stream);
    let welcome = wire::put_u8(&mut w, wire::WELCOME)
        .and_then(|()| wire::put_bytes(&mut w, blob))
        .and_then(|()| w.flush());
    if welcome.is_err() {
        coll.abort("it left the group: its connection closed before the start");
        return;
    }
    loop {
        match serve_one(&mut r, &mut w, &mut coll) {
            Ok(true) => {}
            Ok(false) => return,
            Err(e) => {
                coll.abort(&format!(
                    "it left the group: its connection to the hub failed ({e}); its process ended or the network failed"
                ));
                return;
            }
        }
    }
}

/// One request and its reply; `Ok(false)` when the rank has left.
fn serve_one(
    r: &mut BufReader<TcpStream>,
    w: &mut BufWriter<TcpStream>,
    coll: &mut LocalCollective,
) -> std::io::Result<bool> {
    let rank = coll.rank();
    // Lengths are the rank's own buffers (it passed the handshake); the group validates them
    // as it would in-process, with the same words.
    const ANY: usize = usize::MAX / 8;
    let t = wire::get_u8(r)?;
    match t {
        tag::ALL_REDUCE => {
            let op = wire::get_op(r)?;
            let mut buf = wire::get_f32s(r, ANY)?;
            match coll.all_reduce(&mut buf, op) {
                Ok(()) => ok_f32s(w, &buf)?,
                Err(e) => wire::put_err(w, &e)?,
            }
        }
        tag::REDUCE_SCATTER => {
            let op = wire::get_op(r)?;
            let input = wire::get_f32s(r, ANY)?;
            let mut out = vec![0.0; wire::get_usize(r)?];
            match coll.reduce_scatter(&input, &mut out, op) {
                Ok(()) => ok_f32s(w, &out)?,
                Err(e) => wire::put_err(w, &e)?,
            }
        }
        tag::REDUCE => {
            let root = wire::get_usize(r)?;
            let op = wire::get_op(r)?;
            let mut buf = wire::get_f32s(r, ANY)?;
            match coll.reduce(&mut buf, root, op) {
                Ok(()) if root == rank => ok_f32s(w, &buf)?,
                Ok(()) => wire::put_u8(w, wire::OK)?,
                Err(e) => wire::put_err(w, &e)?,
            }
        }
        tag::ALL_GATHER => {
            let shard = wire::get_f32s(r, ANY)?;
            let mut out = vec![0.0; wire::get_usize(r)?];
            match coll.all_gather(&shard, &mut out) {
                Ok(()) => ok_f32s(w, &out)?,
                Err(e) => wire::put_err(w, &e)?,
            }
        }
        tag::BROADCAST => {
            let root = wire::get_usize(r)?;
            let len = wire::get_usize(r)?;
            // Only the root's elements travel; the others send the length.
            let mut buf = if wire::get_u8(r)? == 1 {
                wire::get_f32s(r, ANY)?
            } else {
                vec![0.0; len]
            };
            match coll.broadcast(&mut buf, root) {
                Ok(()) if root == rank => wire::put_u8(w, wire::OK)?,
                Ok(()) => ok_f32s(w, &buf)?,
                Err(e) => wire::put_err(w, &e)?,
            }
        }
        tag::MAX => {
            let x = f32::from_bits(wire::get_u64(r)? as u32);
            match coll.all_reduce_max(x) {
                Ok(m) => {
                    wire::put_u8(w, wire::OK)?;
                    wire::put_u64(w, u64::from(m.to_bits()))?;
                }
                Err(e) => wire::put_err(w, &e)?,
            }
        }
        tag::SUM_F64 => {
            let x = f64::from_bits(wire::get_u64(r)?);
            match coll.all_reduce_sum_f64(x) {
                Ok(s) => {
                    wire::put_u8(w, wire::OK)?;
                    wire::put_u64(w, s.to_bits())?;
                }
                Err(e) => wire::put_err(w, &e)?,
            }
        }
        tag::BARRIER => match coll.barrier() {
            Ok(()) => wire::put_u8(w, wire::OK)?,
            Err(e) => wire::put_err(w, &e)?,
        },
        tag::ABORT => {
            let reason = wire::get_str(r)?;
            coll.abort(&reason);
            return Ok(true);
        }
        tag::LEAVE => {
            let reason = wire::get_str(r)?;
            coll.abort(&reason);
            return Ok(false);
        }
        other => return Err(wire::bad(format!("request tag {other}"))),
    }
    w.flush()?;
    Ok(true)
}

fn ok_f32s(w: &mut impl Write, v: &[f32]) -> std::io::Result<()> {
    wire::put_u8(w, wire::OK)?;
    wire::put_f32s(w, v)
}
