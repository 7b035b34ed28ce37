//! Ranks in several processes: a run over several nodes (docs/runtime.md, "Several nodes").
//!
//! Node 0's process starts a [`Hub`] at the run's master address; every process joins it with
//! its ranks ([`join`]), the hub admits a rank only if its process runs the same plan the same
//! way (the digest and mode of [`Hello`]), and once all ranks are in it hands each the same
//! blob (an NCCL unique id when the GPUs sum directly). From then on each rank's
//! [`NetCollective`] sends its collectives to a proxy in the hub, which runs them on an
//! in-process [`LocalCollective`](super::LocalCollective) group: a star through node 0, with
//! the in-process group's bits and failure model (a rank that leaves, aborts or times out
//! fails every rank with the same error). The host's collectives carry what the CPU backend
//! exchanges and the small per-step values of GPU runs (loss, norm, overflow flag).
//!
//! Plain TCP, no authentication: the port is for the run's own nodes on a trusted network, as
//! with `torchrun`'s rendezvous and DeepSpeed's launcher (docs/runtime.md).

mod client;
mod hub;
mod wire;

use std::ops::Range;
use std::time::Duration;

pub use client::NetCollective;
pub use hub::{Expect, Hub};
pub use wire::Hello;

/// Why the ranks of a run could not gather (or talk) over the network.
#[derive(Debug, thiserror::Error)]
pub enum NetError {
    /// Node 0 cannot listen.
    #[error("node 0 cannot listen on {addr} for the other nodes: {source}")]
    Bind {
        /// The address it tried.
        addr: String,
        /// Why.
        source: std::io::Error,
    },
    /// No hub answered.
    #[error(
        "no node 0 at {addr} after {waited:.0?}: {source} (is node 0 started, with this address and port?)"
    )]
    Connect {
        /// The master address.
        addr: String,
        /// How long this rank kept trying.
        waited: Duration,
        /// The last attempt's error.
        source: std::io::Error,
    },
    /// The hub said no.
    #[error("node 0 at {addr} refused rank {rank}: {reason}")]
    Refused {
        /// This rank.
        rank: usize,
        /// The master address.
        addr: String,
        /// The hub's reason.
        reason: String,
    },
    /// This rank joined, but the others did not arrive in time.
    #[error("rank {rank} joined node 0 at {addr} and waited {waited:.0?} for the other ranks to join: start every node within the join timeout (RECIPE_JOIN_TIMEOUT)")]
    Waiting {
        /// This rank.
        rank: usize,
        /// The master address.
        addr: String,
        /// How long it waited.
        waited: Duration,
    },
    /// The hub's view of the same: who came, who was turned away.
    #[error("{}", gather_message(joined, *world, *waited, refused))]
    Gather {
        /// The ranks that joined.
        joined: Vec<usize>,
        /// Ranks in the run.
        world: usize,
        /// How long the hub waited.
        waited: Duration,
        /// Connections refused, with why.
        refused: Vec<String>,
    },
    /// A read or write failed.
    #[error("{what}: {source}")]
    Io {
        /// Who was talking.
        what: String,
        /// The error.
        source: std::io::Error,
    },
    /// Something that is not the protocol (or a bug).
    #[error("{0}")]
    Protocol(String),
}

fn gather_message(joined: &[usize], world: usize, waited: Duration, refused: &[String]) -> String {
    let missing: Vec<String> = (0..world)
        .filter(|r| !joined.contains(r))
        .map(|r| r.to_string())
        .collect();
    let mut s = format!(
        "after {waited:.0?} {} of {world} rank(s) had joined; missing: rank(s) {} (start every node within the join timeout, RECIPE_JOIN_TIMEOUT)",
        joined.len(),
        missing.join(", ")
    );
    if !refused.is_empty() {
        s.push_str("; refused: ");
        s.push_str(&refused.join("; "));
    }
    s
}

/// What a process needs to join a run.
#[derive(Debug, Clone)]
pub struct Join {
    /// Node 0's `host:port`.
    pub addr: String,
    /// This process's ranks.
    pub ranks: Range<usize>,
    /// Ranks in the run.
    pub world: usize,
    /// See [`Hello::digest`].
    pub digest: String,
    /// See [`Hello::mode`].
    pub mode: String,
    /// How long to wait for every rank to join.
    pub join: Duration,
    /// The group's timeout for one collective.
    pub op: Duration,
}

/// Joins the run with every rank of `j.ranks` at once (the hub welcomes none until all are
/// in); the handles in rank order and the blob the hub handed out.
pub fn join(j: &Join) -> Result<(Vec<NetCollective>, Vec<u8>), NetError> {
    let joined: Vec<Result<(NetCollective, Vec<u8>), NetError>> = std::thread::scope(|s| {
        let handles: Vec<_> = j
            .ranks
            .clone()
            .map(|rank| {
                s.spawn(move || {
                    let hello = Hello {
                        rank,
                        world: j.world,
                        digest: j.digest.clone(),
                        mode: j.mode.clone(),
                    };
                    NetCollective::join(&j.addr, hello, j.join, j.op)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join().unwrap_or_else(|_| {
                    Err(NetError::Protocol(
                        "a joining thread panicked (a bug; please report it)".into(),
                    ))
                })
            })
            .collect()
    });
    let mut colls = Vec::with_capacity(joined.len());
    let mut blob = Vec::new();
    for r in joined {
        let (c, b) = r?;
        colls.push(c);
        blob = b;
    }
    Ok((colls, blob))
}

/// A group of `world` ranks in this process that talk through a hub on the loopback
/// interface, as ranks on several nodes would: for tests, and for trying a multi-node setup
/// on one machine.
pub fn loopback_group(world: usize, op: Duration) -> Result<Vec<NetCollective>, NetError> {
    let hub = Hub::start(
        "127.0.0.1:0",
        Expect {
            world,
            digest: "loopback".into(),
            mode: "loopback".into(),
            blob: Vec::new(),
            join: Duration::from_secs(30),
            op,
        },
    )?;
    // The hub's thread lives on until every rank has left.
    let (colls, _) = join(&Join {
        addr: hub.addr().to_string(),
        ranks: 0..world,
        world,
        digest: "loopback".into(),
        mode: "loopback".into(),
        join: Duration::from_secs(30),
        op,
    })?;
    Ok(colls)
}
