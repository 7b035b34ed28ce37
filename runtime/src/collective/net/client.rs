//! [`NetCollective`]: one rank's end of a group whose ranks live in several processes (nodes),
//! talking to node 0's hub over TCP.

use std::io::{BufReader, BufWriter, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::thread;
use std::time::{Duration, Instant};

use super::wire::{self, tag, Hello};
use super::NetError;
use crate::collective::{Collective, CollectiveError, Op, ReduceOp};

/// One rank of a group spread over processes; every op goes to the hub, which runs it on an
/// in-process group ([`crate::collective::LocalCollective`]), so it has the same bits and the
/// same errors. See [`super::join`].
///
/// Dropping it leaves the group as dropping a `LocalCollective` does: the others' next op fails
/// with [`CollectiveError::Aborted`] ("it left the group: …").
#[derive(Debug)]
pub struct NetCollective {
    rank: usize,
    world: usize,
    addr: String,
    r: BufReader<TcpStream>,
    w: BufWriter<TcpStream>,
    /// Set when the connection failed: every later op returns it without touching the wire.
    lost: Option<CollectiveError>,
}

/// How often a rank retries a hub that is not listening yet.
const RETRY: Duration = Duration::from_millis(200);

impl NetCollective {
    /// Connects to the hub at `addr` (retrying until `join` has passed: the nodes may start in
    /// any order), says who it is and waits until every rank has joined. Returns the rank's
    /// handle and the blob the hub hands out. A reply slower than twice `op` after that means
    /// the hub is gone (its own waits end at `op`).
    pub fn join(
        addr: &str,
        hello: Hello,
        join: Duration,
        op: Duration,
    ) -> Result<(NetCollective, Vec<u8>), NetError> {
        let start = Instant::now();
        let stream = loop {
            let tried = addr
                .to_socket_addrs()
                .and_then(|mut a| {
                    a.next().ok_or_else(|| {
                        std::io::Error::new(std::io::ErrorKind::NotFound, "no address")
                    })
                })
                .and_then(|a| TcpStream::connect_timeout(&a, RETRY.max(join / 10)));
            match tried {
                Ok(s) => break s,
                Err(source) if start.elapsed() >= join => {
                    return Err(NetError::Connect {
                        addr: addr.to_string(),
                        waited: start.elapsed(),
                        source,
                    })
                }
                Err(_) => thread::sleep(RETRY),
            }
        };
        let io = |source| NetError::Io {
            what: format!("rank {} talking to the hub at {addr}", hello.rank),
            source,
        };
        stream.set_nodelay(true).map_err(io)?;
        let left = join.saturating_sub(start.elapsed()).max(RETRY);
        stream.set_read_timeout(Some(left)).map_err(io)?;
        let mut w = BufWriter::with_capacity(1 << 16, stream.try_clone().map_err(io)?);
        let mut r = BufReader::with_capacity(1 << 16, stream);
        wire::put_hello(&mut w, &hello)
            .and_then(|()| w.flush())
            .map_err(io)?;
        let answer = match wire::get_u8(&mut r) {
            Ok(a) => a,
            Err(e) if is_timeout(&e) => {
                return Err(NetError::Waiting {
                    rank: hello.rank,
                    addr: addr.to_string(),
                    waited: start.elapsed(),
                })
            }
            Err(e) => return Err(io(e)),
        };
        match answer {
            wire::WELCOME => {
                let blob = wire::get_blob(&mut r).map_err(io)?;
                r.get_ref()
                    .set_read_timeout(Some(op.saturating_mul(2)))
                    .map_err(io)?;
                let c = NetCollective {
                    rank: hello.rank,
                    world: hello.world,
                    addr: addr.to_string(),
                    r,
                    w,
                    lost: None,
                };
                Ok((c, blob))
            }
            wire::REFUSE => Err(NetError::Refused {
                rank: hello.rank,
                addr: addr.to_string(),
                reason: wire::get_str(&mut r).map_err(io)?,
            }),
            other => Err(io(wire::bad(format!("handshake answer {other}")))),
        }
    }

    /// Sends a request: `put` writes its tag and fields.
    fn send(
        &mut self,
        op: Op,
        put: impl FnOnce(&mut BufWriter<TcpStream>) -> std::io::Result<()>,
    ) -> Result<(), CollectiveError> {
        if let Some(e) = &self.lost {
            return Err(e.clone());
        }
        match put(&mut self.w).and_then(|()| self.w.flush()) {
            Ok(()) => Ok(()),
            Err(e) => Err(self.lose(op, &e)),
        }
    }

    /// Reads the reply's status and, on `OK`, its result (`get`).
    fn answer<T>(
        &mut self,
        op: Op,
        get: impl FnOnce(&mut BufReader<TcpStream>) -> std::io::Result<T>,
    ) -> Result<T, CollectiveError> {
        let got = match wire::get_u8(&mut self.r) {
            Ok(wire::OK) => get(&mut self.r).map(Ok),
            Ok(wire::ERR) => wire::get_err(&mut self.r).map(Err),
            Ok(s) => Err(wire::bad(format!("reply status {s}"))),
            Err(e) => Err(e),
        };
        match got {
            Ok(result) => result,
            Err(e) => Err(self.lose(op, &e)),
        }
    }

    /// The connection failed in `op`: the group is lost for this rank, for good.
    fn lose(&mut self, op: Op, e: &std::io::Error) -> CollectiveError {
        let detail = if is_timeout(e) {
            format!(
                "no answer from the hub at {} in {op} within twice the collective timeout; node 0 is gone or the network is down",
                self.addr
            )
        } else {
            format!(
                "the connection to the hub at {} failed in {op}: {e}; node 0's process ended or the network failed",
                self.addr
            )
        };
        let e = CollectiveError::Disconnected {
            rank: self.rank,
            detail,
        };
        self.lost = Some(e.clone());
        e
    }
}

fn is_timeout(e: &std::io::Error) -> bool {
    matches!(
        e.kind(),
        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
    )
}

/// Nothing more than the status.
fn nothing(_: &mut BufReader<TcpStream>) -> std::io::Result<()> {
    Ok(())
}

impl Collective for NetCollective {
    fn rank(&self) -> usize {
        self.rank
    }

    fn world(&self) -> usize {
        self.world
    }

    fn all_reduce(&mut self, buf: &mut [f32], op: ReduceOp) -> Result<(), CollectiveError> {
        self.send(Op::AllReduce, |w| {
            wire::put_u8(w, tag::ALL_REDUCE)?;
            wire::put_op(w, op)?;
            wire::put_f32s(w, buf)
        })?;
        self.answer(Op::AllReduce, |r| wire::get_f32s_into(r, buf))
    }

    fn reduce_scatter(
        &mut self,
        input: &[f32],
        output: &mut [f32],
        op: ReduceOp,
    ) -> Result<(), CollectiveError> {
        let out_len = output.len();
        self.send(Op::ReduceScatter, |w| {
            wire::put_u8(w, tag::REDUCE_SCATTER)?;
            wire::put_op(w, op)?;
            wire::put_f32s(w, input)?;
            wire::put_usize(w, out_len)
        })?;
        self.answer(Op::ReduceScatter, |r| wire::get_f32s_into(r, output))
    }

    fn reduce(
        &mut self,
        buf: &mut [f32],
        root: usize,
        op: ReduceOp,
    ) -> Result<(), CollectiveError> {
        let mine = root == self.rank;
        self.send(Op::Reduce, |w| {
            wire::put_u8(w, tag::REDUCE)?;
            wire::put_usize(w, root)?;
            wire::put_op(w, op)?;
            wire::put_f32s(w, buf)
        })?;
        self.answer(Op::Reduce, |r| {
            if mine {
                wire::get_f32s_into(r, buf)
            } else {
                Ok(())
            }
        })
    }

    fn all_gather(&mut self, shard: &[f32], output: &mut [f32]) -> Result<(), CollectiveError> {
        let out_len = output.len();
        self.send(Op::AllGather, |w| {
            wire::put_u8(w, tag::ALL_GATHER)?;
            wire::put_f32s(w, shard)?;
            wire::put_usize(w, out_len)
        })?;
        self.answer(Op::AllGather, |r| wire::get_f32s_into(r, output))
    }

    fn broadcast(&mut self, buf: &mut [f32], root: usize) -> Result<(), CollectiveError> {
        let mine = root == self.rank;
        self.send(Op::Broadcast, |w| {
            wire::put_u8(w, tag::BROADCAST)?;
            wire::put_usize(w, root)?;
            wire::put_usize(w, buf.len())?;
            wire::put_u8(w, u8::from(mine))?;
            if mine {
                wire::put_f32s(w, buf)?;
            }
            Ok(())
        })?;
        self.answer(Op::Broadcast, |r| {
            if mine {
                Ok(())
            } else {
                wire::get_f32s_into(r, buf)
            }
        })
    }

    fn all_reduce_max(&mut self, x: f32) -> Result<f32, CollectiveError> {
        self.send(Op::AllReduceMax, |w| {
            wire::put_u8(w, tag::MAX)?;
            wire::put_u64(w, u64::from(x.to_bits()))
        })?;
        self.answer(Op::AllReduceMax, |r| {
            Ok(f32::from_bits(wire::get_u64(r)? as u32))
        })
    }

    fn all_reduce_sum_f64(&mut self, x: f64) -> Result<f64, CollectiveError> {
        self.send(Op::AllReduceSumF64, |w| {
            wire::put_u8(w, tag::SUM_F64)?;
            wire::put_u64(w, x.to_bits())
        })?;
        self.answer(Op::AllReduceSumF64, |r| {
            Ok(f64::from_bits(wire::get_u64(r)?))
        })
    }

    fn barrier(&mut self) -> Result<(), CollectiveError> {
        self.send(Op::Barrier, |w| wire::put_u8(w, tag::BARRIER))?;
        self.answer(Op::Barrier, nothing)
    }

    fn abort(&mut self, reason: &str) {
        if self.lost.is_some() {
            return;
        }
        // No reply: the group records the first failure and this rank's next op reads it.
        let _ = wire::put_u8(&mut self.w, tag::ABORT)
            .and_then(|()| wire::put_str(&mut self.w, reason))
            .and_then(|()| self.w.flush());
    }
}

impl Drop for NetCollective {
    fn drop(&mut self) {
        if self.lost.is_some() {
            return;
        }
        // The same words as a `LocalCollective` that leaves, so the others read why.
        let reason = if thread::panicking() {
            "it left the group: its thread panicked"
        } else {
            "it left the group: its NetCollective was dropped (the rank returned)"
        };
        let _ = wire::put_u8(&mut self.w, tag::LEAVE)
            .and_then(|()| wire::put_str(&mut self.w, reason))
            .and_then(|()| self.w.flush());
        let _ = self.w.get_ref().shutdown(std::net::Shutdown::Both);
    }
}
