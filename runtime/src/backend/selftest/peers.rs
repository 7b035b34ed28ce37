//! The devices' sums between ranks ([`Peers`]: NCCL on GPUs) against the host's
//! [`LocalCollective`] on the same buffers: what `recipe kernels --selftest` runs on a machine
//! with NCCL (one rank per GPU; with one GPU a one-rank group, whose sums are identities but
//! whose calls run), and what the emulation tests run on emulated devices.
//!
//! Each rank is a thread with its own device and inputs. Every length is summed to every rank
//! (`all_reduce_sum`) and to one root (`reduce_sum`, whose other ranks must keep their input bit
//! for bit), broadcast, and summed and broadcast by queued calls joined back
//! (`all_reduce_sum_queued`, `reduce_sum_queued`, `broadcast_queued`, `Device::join_copies`: on
//! GPUs, NCCL on the copy stream). Two ranks must give the host's bits (one addition, commutative); more may add in
//! another order (NCCL's ring), within 1e-6 of the largest sum.

use super::{rand, OpCheck};
use crate::backend::device::{grouped, Device, Peers};
use crate::collective::{Collective, LocalCollective, ReduceOp};
use crate::precision::Dtype;

/// Lengths: one element, odd, past a block and past NCCL's smallest chunk.
const LENGTHS: [usize; 4] = [1, 255, 4097, 300_007];

/// Rank `rank`'s input of case `case`, the same on every thread.
fn input(case: usize, rank: usize, n: usize) -> Vec<f32> {
    rand(n, 1.0, 0x9e0 + 64 * case as u64 + rank as u64, Dtype::F32)
}

/// The host's sums of every rank's input, in rank order.
fn host_sum(case: usize, world: usize, n: usize) -> Vec<f32> {
    let mut group = LocalCollective::group(world, std::time::Duration::from_secs(60));
    std::thread::scope(|s| {
        let handles: Vec<_> = group
            .iter_mut()
            .enumerate()
            .map(|(rank, c)| {
                s.spawn(move || {
                    let mut x = input(case, rank, n);
                    c.all_reduce(&mut x, ReduceOp::Sum).map(|()| x)
                })
            })
            .collect();
        let sums: Vec<_> = handles.into_iter().map(|h| h.join()).collect();
        match sums.into_iter().next() {
            Some(Ok(Ok(x))) => x,
            _ => vec![f32::NAN; n],
        }
    })
}

fn check(op: String, got: &[f32], want: &[f32], tolerance: f64) -> OpCheck {
    let scale = want.iter().fold(0.0f64, |m, &x| m.max(f64::from(x.abs())));
    let worst = got
        .iter()
        .zip(want)
        .fold(0.0f64, |m, (&g, &w)| m.max(f64::from((g - w).abs())));
    let bits = got.len() == want.len()
        && got
            .iter()
            .zip(want)
            .all(|(g, w)| g.to_bits() == w.to_bits());
    let error = if got.len() != want.len() || got.iter().any(|g| !g.is_finite()) {
        f64::INFINITY
    } else if scale > 0.0 {
        worst / scale
    } else {
        worst
    };
    OpCheck {
        op,
        store: Dtype::F32,
        error,
        tolerance,
        ok: if tolerance == 0.0 {
            bits
        } else {
            error <= tolerance
        },
    }
}

/// One rank's checks on `dev` with `peers`.
fn rank_checks<D: Device>(dev: &D, peers: &mut dyn Peers<D>) -> Vec<OpCheck> {
    let (rank, world) = (peers.rank(), peers.world());
    // One or two ranks: exactly the host's bits; more: NCCL may add in another order.
    let tolerance = if world <= 2 { 0.0 } else { 1e-6 };
    let mut out = Vec::new();
    for (case, &n) in LENGTHS.iter().enumerate() {
        let sum = host_sum(case, world, n);
        let want = sum.clone();
        let x = input(case, rank, n);
        let mut got = vec![0.0; n];
        let mut buf = dev.upload(&x);
        let done = peers.all_reduce_sum(dev, dev.view_mut(&mut buf));
        dev.download(dev.view(&buf), &mut got);
        let op = format!("peers.all_reduce[{n}]@{rank}");
        out.push(match done.and_then(|()| dev.sync()) {
            Ok(()) => check(op, &got, &want, tolerance),
            Err(e) => check(format!("{op}: {e}"), &[], &want, tolerance),
        });

        let root = case % world;
        let mut buf = dev.upload(&x);
        let done = peers.reduce_sum(dev, dev.view_mut(&mut buf), root);
        dev.download(dev.view(&buf), &mut got);
        let (op, want, tolerance) = if rank == root {
            (format!("peers.reduce[{n}]@{rank}"), want, tolerance)
        } else {
            (
                format!("peers.reduce[{n}]@{rank} (not the root)"),
                x.clone(),
                0.0,
            )
        };
        out.push(match done.and_then(|()| dev.sync()) {
            Ok(()) => check(op, &got, &want, tolerance),
            Err(e) => check(format!("{op}: {e}"), &[], &want, tolerance),
        });

        // A broadcast copies the root's bits to every rank (ZeRO's parameter gathers).
        let root = (case + 1) % world;
        let mut buf = dev.upload(&x);
        let done = peers.broadcast(dev, dev.view_mut(&mut buf), root);
        dev.download(dev.view(&buf), &mut got);
        let want = input(case, root, n);
        let op = format!("peers.broadcast[{n}]@{rank} from {root}");
        out.push(match done.and_then(|()| dev.sync()) {
            Ok(()) => check(op, &got, &want, 0.0),
            Err(e) => check(format!("{op}: {e}"), &[], &want, 0.0),
        });

        // One group (ZeRO's per-owner calls): each rank's share of the buffer broadcast from
        // that rank, issued together.
        let share = |r: usize| n * r / world..n * (r + 1) / world;
        let mut buf = dev.upload(&x);
        let done = grouped(peers, |p| {
            for owner in 0..world {
                p.broadcast(dev, dev.range_mut(&mut buf, share(owner)), owner)?;
            }
            Ok(())
        });
        dev.download(dev.view(&buf), &mut got);
        let mut want = vec![0.0; n];
        for owner in 0..world {
            want[share(owner)].copy_from_slice(&input(case, owner, n)[share(owner)]);
        }
        let op = format!("peers.grouped broadcasts[{n}]@{rank}");
        out.push(match done.and_then(|()| dev.sync()) {
            Ok(()) => check(op, &got, &want, 0.0),
            Err(e) => check(format!("{op}: {e}"), &[], &want, 0.0),
        });

        // Queued calls (the pass's overlapped ones: on a GPU, NCCL on the copy stream): the
        // first third summed to every rank, the second to one root, the last broadcast from
        // another, while the device works on another buffer; joined, then read by the device's
        // own work (a copy on the compute stream).
        let (a, b) = (n / 3, 2 * n / 3);
        let root = (case + 1) % world;
        let from = (case + 2) % world;
        let mut buf = dev.upload(&x);
        let mut busy = dev.upload(&x);
        let mut copy = dev.upload(&x);
        // SAFETY: `buf` is alive and untouched until the join below, and no direct sum is
        // called before it.
        let done = grouped(peers, |p| unsafe {
            p.all_reduce_sum_queued(dev, dev.range_mut(&mut buf, 0..a))?;
            p.reduce_sum_queued(dev, dev.range_mut(&mut buf, a..b), root)?;
            p.broadcast_queued(dev, dev.range_mut(&mut buf, b..n), from)
        });
        dev.zero(dev.view_mut(&mut busy));
        let done = done.and_then(|()| dev.join_copies());
        dev.copy(dev.view_mut(&mut copy), dev.view(&buf));
        dev.download(dev.view(&copy), &mut got);
        let mut want = sum;
        if rank != root {
            want[a..b].copy_from_slice(&x[a..b]);
        }
        want[b..].copy_from_slice(&input(case, from, n)[b..]);
        let op = format!("peers.queued calls[{n}]@{rank} (reduced to {root}, from {from})");
        out.push(match done.and_then(|()| dev.sync()) {
            Ok(()) => check(op, &got, &want, tolerance),
            Err(e) => check(format!("{op}: {e}"), &[], &want, tolerance),
        });
    }
    out
}

/// Every rank's checks, each rank a thread with its device and its end of the group (ranks in
/// order); the result lists rank 0's checks first.
pub fn compare_peers<D>(ranks: Vec<(D, Box<dyn Peers<D>>)>) -> Vec<OpCheck>
where
    D: Device + Send,
{
    std::thread::scope(|s| {
        let handles: Vec<_> = ranks
            .into_iter()
            .map(|(dev, mut peers)| s.spawn(move || rank_checks(&dev, peers.as_mut())))
            .collect();
        handles
            .into_iter()
            .flat_map(|h| {
                h.join().unwrap_or_else(|_| {
                    vec![check("peers: a rank panicked".into(), &[], &[0.0], 0.0)]
                })
            })
            .collect()
    })
}
