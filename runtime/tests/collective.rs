//! The `Collective` contract, tested on `LocalCollective` (ranks as threads) and on
//! `NetCollective` (ranks that talk through a hub over TCP, here on the loopback interface):
//! every test runs on both (`local_*`, `net_*`). An NCCL implementation is meant to pass the
//! same properties: every op equals a sequential reference computed here in rank order
//! (bit-exact), consecutive ops never interfere, and every misuse ends with an error on every
//! rank instead of a hang.
//!
//! No test can hang: ranks run on threads and report over a channel that the test reads with a
//! deadline, so a deadlock fails the test instead of blocking it.

use std::sync::mpsc;
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use recipe_runtime::collective::net::loopback_group;
use recipe_runtime::collective::{
    Collective, CollectiveError, LocalCollective, NetCollective, Op, Partition, ReduceOp,
};

/// An implementation under test: how to make a group, and what a rank that leaves says.
trait Group: Collective + Sized + 'static {
    fn group(world: usize, timeout: Duration) -> Vec<Self>;
    const LEFT: &'static str;
}

impl Group for LocalCollective {
    fn group(world: usize, timeout: Duration) -> Vec<Self> {
        LocalCollective::group(world, timeout)
    }
    const LEFT: &'static str = "its LocalCollective was dropped (the rank returned)";
}

impl Group for NetCollective {
    fn group(world: usize, timeout: Duration) -> Vec<Self> {
        loopback_group(world, timeout).expect("a loopback group")
    }
    const LEFT: &'static str = "its NetCollective was dropped (the rank returned)";
}

/// How long a whole multi-rank test may take before it counts as hung.
const HUNG: Duration = Duration::from_secs(60);

/// Runs `f` on every rank of a fresh group, one thread each, and returns what each rank
/// returned (`None` for a rank whose thread panicked). Fails the test if the ranks have not all
/// finished within [`HUNG`].
fn run_ranks<G: Group, T, F>(world: usize, timeout: Duration, f: F) -> Vec<Option<T>>
where
    T: Send + 'static,
    F: Fn(G) -> T + Send + Sync + 'static,
{
    let f = Arc::new(f);
    let (tx, rx) = mpsc::channel();
    for c in G::group(world, timeout) {
        let (f, tx) = (Arc::clone(&f), tx.clone());
        thread::spawn(move || {
            let rank = c.rank();
            let out = f(c);
            let _ = tx.send((rank, out));
        });
    }
    drop(tx);
    let deadline = Instant::now() + HUNG;
    let mut out: Vec<Option<T>> = (0..world).map(|_| None).collect();
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok((rank, v)) => out[rank] = Some(v),
            // Every sender is gone: every rank returned or panicked.
            Err(mpsc::RecvTimeoutError::Disconnected) => return out,
            Err(mpsc::RecvTimeoutError::Timeout) => panic!("ranks still running after {HUNG:?}"),
        }
    }
}

/// [`run_ranks`] where no rank may panic.
fn run_all<G: Group, T, F>(world: usize, timeout: Duration, f: F) -> Vec<T>
where
    T: Send + 'static,
    F: Fn(G) -> T + Send + Sync + 'static,
{
    run_ranks::<G, T, F>(world, timeout, f)
        .into_iter()
        .enumerate()
        .map(|(r, v)| v.unwrap_or_else(|| panic!("rank {r} panicked")))
        .collect()
}

fn splitmix(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Values of both signs over ~12 decades, so the order of summation changes the bits.
fn data(seed: u64, rank: usize, len: usize) -> Vec<f32> {
    let mut s = seed ^ (rank as u64).wrapping_mul(0xA24B_AED4_963E_E407) ^ (len as u64) << 40;
    (0..len)
        .map(|_| {
            let r = splitmix(&mut s);
            let mantissa = (r & 0xFFFF) as f32 / 65536.0 + 0.5;
            let exp = ((r >> 16) % 40) as i32 - 20;
            let sign = if r >> 63 == 1 { -1.0 } else { 1.0 };
            sign * mantissa * 2f32.powi(exp)
        })
        .collect()
}

/// The sequential reference: `((x_0 + x_1) + …) + x_{N-1}`, then `× (1/N)` for `Avg`.
fn reference(inputs: &[Vec<f32>], op: ReduceOp) -> Vec<f32> {
    let mut acc = inputs[0].clone();
    for x in &inputs[1..] {
        for (a, v) in acc.iter_mut().zip(x) {
            *a += *v;
        }
    }
    if op == ReduceOp::Avg {
        let s = 1.0_f32 / inputs.len() as f32;
        acc.iter_mut().for_each(|a| *a *= s);
    }
    acc
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

const LENS: [usize; 11] = [0, 1, 2, 3, 4, 5, 7, 8, 13, 64, 257];

#[derive(Debug)]
struct Outputs {
    sum: Vec<f32>,
    avg: Vec<f32>,
    rs_sum: Vec<f32>,
    rs_avg: Vec<f32>,
    gathered: Vec<f32>,
    broadcasts: Vec<Vec<f32>>,
    /// `reduces[root]`: this rank's buffer after `reduce(Sum)` to `root`, then after `reduce(Avg)`.
    reduces: Vec<(Vec<f32>, Vec<f32>)>,
    max: f32,
    sum_f64: f64,
}

fn every_op_equals_the_sequential_reference_bit_for_bit<G: Group>() {
    for world in 1..=4 {
        for len in LENS {
            let seed = 7;
            let outs = run_all::<G, _, _>(world, Duration::from_secs(10), move |mut c| {
                let r = c.rank();
                let mine = data(seed, r, len);
                let part = Partition::new(len, world).unwrap();
                let padded = part.pad(&mine).unwrap();
                let mut sum = mine.clone();
                c.all_reduce(&mut sum, ReduceOp::Sum).unwrap();
                let mut avg = mine.clone();
                c.all_reduce(&mut avg, ReduceOp::Avg).unwrap();
                let mut rs_sum = vec![f32::NAN; part.shard];
                c.reduce_scatter(&padded, &mut rs_sum, ReduceOp::Sum)
                    .unwrap();
                let mut rs_avg = vec![f32::NAN; part.shard];
                c.reduce_scatter(&padded, &mut rs_avg, ReduceOp::Avg)
                    .unwrap();
                let mut gathered = vec![f32::NAN; part.padded];
                c.all_gather(&padded[part.padded_range(r)], &mut gathered)
                    .unwrap();
                let mut broadcasts = Vec::new();
                for root in 0..world {
                    let mut b = mine.clone();
                    c.broadcast(&mut b, root).unwrap();
                    broadcasts.push(b);
                }
                let mut reduces = Vec::new();
                for root in 0..world {
                    let mut s = mine.clone();
                    c.reduce(&mut s, root, ReduceOp::Sum).unwrap();
                    let mut a = mine.clone();
                    c.reduce(&mut a, root, ReduceOp::Avg).unwrap();
                    reduces.push((s, a));
                }
                let max = c
                    .all_reduce_max(mine.first().copied().unwrap_or(r as f32))
                    .unwrap();
                let sum_f64 = c.all_reduce_sum_f64(0.1 * (r as f64 + 1.0)).unwrap();
                c.barrier().unwrap();
                Outputs {
                    sum,
                    avg,
                    rs_sum,
                    rs_avg,
                    gathered,
                    broadcasts,
                    reduces,
                    max,
                    sum_f64,
                }
            });

            let inputs: Vec<Vec<f32>> = (0..world).map(|r| data(seed, r, len)).collect();
            let part = Partition::new(len, world).unwrap();
            let padded: Vec<Vec<f32>> = inputs.iter().map(|x| part.pad(x).unwrap()).collect();
            let sum = reference(&inputs, ReduceOp::Sum);
            let avg = reference(&inputs, ReduceOp::Avg);
            let psum = reference(&padded, ReduceOp::Sum);
            let pavg = reference(&padded, ReduceOp::Avg);
            let flags: Vec<f32> = (0..world)
                .map(|r| inputs[r].first().copied().unwrap_or(r as f32))
                .collect();
            let max = flags.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let mut sum_f64 = 0.1;
            for r in 1..world {
                sum_f64 += 0.1 * (r as f64 + 1.0);
            }
            for (r, o) in outs.iter().enumerate() {
                let ctx = format!("world {world} len {len} rank {r}");
                assert_eq!(bits(&o.sum), bits(&sum), "{ctx}: all_reduce sum");
                assert_eq!(bits(&o.avg), bits(&avg), "{ctx}: all_reduce avg");
                let pr = part.padded_range(r);
                assert_eq!(bits(&o.rs_sum), bits(&psum[pr.clone()]), "{ctx}: rs sum");
                assert_eq!(bits(&o.rs_avg), bits(&pavg[pr]), "{ctx}: rs avg");
                let concat: Vec<f32> = (0..world)
                    .flat_map(|q| padded[q][part.padded_range(q)].to_vec())
                    .collect();
                assert_eq!(bits(&o.gathered), bits(&concat), "{ctx}: all_gather");
                for (root, b) in o.broadcasts.iter().enumerate() {
                    assert_eq!(bits(b), bits(&inputs[root]), "{ctx}: broadcast {root}");
                }
                for (root, (s, a)) in o.reduces.iter().enumerate() {
                    // The root gets the all-reduce's bits; every other rank keeps its input.
                    let (es, ea) = if root == r {
                        (&sum, &avg)
                    } else {
                        (&inputs[r], &inputs[r])
                    };
                    assert_eq!(bits(s), bits(es), "{ctx}: reduce sum to {root}");
                    assert_eq!(bits(a), bits(ea), "{ctx}: reduce avg to {root}");
                }
                assert_eq!(o.max.to_bits(), max.to_bits(), "{ctx}: max");
                assert_eq!(o.sum_f64.to_bits(), sum_f64.to_bits(), "{ctx}: sum_f64");
            }
            // The padded all-reduce restricted to the real elements is the unpadded one.
            assert_eq!(bits(&psum[..len]), bits(&sum));
            if world == 1 {
                // World 1 is the identity, Avg included (× 1.0 is exact).
                assert_eq!(bits(&avg), bits(&inputs[0]));
            }
        }
    }
}

fn max_propagates_nan_and_handles_infinities<G: Group>() {
    let outs = run_all::<G, _, _>(3, Duration::from_secs(10), |mut c| {
        let r = c.rank();
        let a = c.all_reduce_max([0.0, f32::INFINITY, 1.0][r]).unwrap();
        let b = c.all_reduce_max([0.0, f32::NAN, 1.0][r]).unwrap();
        let d = c.all_reduce_max(-(r as f32)).unwrap();
        (a, b, d)
    });
    for (a, b, d) in outs {
        assert_eq!(a, f32::INFINITY);
        assert!(b.is_nan());
        assert_eq!(d, 0.0);
    }
}

/// One random op of a shared sequence; every rank draws the same one.
#[derive(Debug, Clone, Copy)]
enum Step {
    AllReduce(ReduceOp, usize),
    ReduceScatter(ReduceOp, usize),
    AllGather(usize),
    Broadcast(usize, usize),
    Max,
    SumF64,
    Barrier,
}

fn draw(s: &mut u64, world: usize) -> Step {
    let r = splitmix(s);
    let len = (r >> 8) as usize % 40;
    let op = if r >> 7 & 1 == 0 {
        ReduceOp::Sum
    } else {
        ReduceOp::Avg
    };
    match r % 7 {
        0 => Step::AllReduce(op, len),
        1 => Step::ReduceScatter(op, len),
        2 => Step::AllGather(len),
        3 => Step::Broadcast(len, (r >> 32) as usize % world),
        4 => Step::Max,
        5 => Step::SumF64,
        _ => Step::Barrier,
    }
}

/// Runs `iters` random ops on every rank; each rank checks every result against the reference
/// (it can regenerate every rank's input) and returns a digest of the replicated results.
fn mixed<G: Group>(world: usize, iters: usize, seed: u64) -> Vec<u64> {
    run_all::<G, _, _>(world, Duration::from_secs(10), move |mut c| {
        let r = c.rank();
        let mut s = seed;
        let mut digest = 0xcbf2_9ce4_8422_2325_u64;
        let mut mix = |v: u64| digest = (digest ^ v).wrapping_mul(0x100_0000_01b3);
        for it in 0..iters {
            let step = draw(&mut s, world);
            let k = seed ^ (it as u64) << 20;
            match step {
                Step::AllReduce(op, len) => {
                    let mut buf = data(k, r, len);
                    c.all_reduce(&mut buf, op).unwrap();
                    let all: Vec<_> = (0..world).map(|q| data(k, q, len)).collect();
                    assert_eq!(bits(&buf), bits(&reference(&all, op)), "it {it} {step:?}");
                    buf.iter().for_each(|x| mix(x.to_bits() as u64));
                }
                Step::ReduceScatter(op, len) => {
                    let input = data(k, r, len * world);
                    let mut out = vec![0.0; len];
                    c.reduce_scatter(&input, &mut out, op).unwrap();
                    let all: Vec<_> = (0..world).map(|q| data(k, q, len * world)).collect();
                    let full = reference(&all, op);
                    assert_eq!(bits(&out), bits(&full[r * len..(r + 1) * len]), "it {it}");
                }
                Step::AllGather(len) => {
                    let mut out = vec![0.0; len * world];
                    c.all_gather(&data(k, r, len), &mut out).unwrap();
                    let all: Vec<f32> = (0..world).flat_map(|q| data(k, q, len)).collect();
                    assert_eq!(bits(&out), bits(&all), "it {it}");
                    out.iter().for_each(|x| mix(x.to_bits() as u64));
                }
                Step::Broadcast(len, root) => {
                    let mut buf = data(k, r, len);
                    c.broadcast(&mut buf, root).unwrap();
                    assert_eq!(bits(&buf), bits(&data(k, root, len)), "it {it}");
                    buf.iter().for_each(|x| mix(x.to_bits() as u64));
                }
                Step::Max => {
                    let m = c.all_reduce_max(data(k, r, 1)[0]).unwrap();
                    let want = (0..world)
                        .map(|q| data(k, q, 1)[0])
                        .fold(f32::MIN, f32::max);
                    assert_eq!(m.to_bits(), want.to_bits(), "it {it}");
                    mix(m.to_bits() as u64);
                }
                Step::SumF64 => {
                    let x = |q: usize| data(k, q, 1)[0] as f64 / 3.0;
                    let got = c.all_reduce_sum_f64(x(r)).unwrap();
                    let mut want = x(0);
                    for q in 1..world {
                        want += x(q);
                    }
                    assert_eq!(got.to_bits(), want.to_bits(), "it {it}");
                    mix(got.to_bits());
                }
                Step::Barrier => c.barrier().unwrap(),
            }
        }
        digest
    })
}

fn a_thousand_random_consecutive_ops_agree_on_every_rank<G: Group>() {
    for world in 1..=4 {
        let digests = mixed::<G>(world, 1000, 42 + world as u64);
        assert!(
            digests.iter().all(|d| *d == digests[0]),
            "world {world}: {digests:?}"
        );
    }
}

fn repeated_runs_are_bit_identical<G: Group>() {
    let first = mixed::<G>(3, 200, 99);
    for _ in 0..3 {
        assert_eq!(mixed::<G>(3, 200, 99), first);
    }
}

/// Runs `f` with a long timeout and checks it fails fast: the error must not come from a
/// timeout.
fn fails_fast<G: Group, T, F>(world: usize, f: F) -> Vec<T>
where
    T: Send + 'static,
    F: Fn(G) -> T + Send + Sync + 'static,
{
    let start = Instant::now();
    let out = run_all::<G, T, F>(world, Duration::from_secs(30), f);
    let took = start.elapsed();
    assert!(took < Duration::from_secs(1), "took {took:?}");
    out
}

fn mismatched_calls_fail_every_rank_with_mismatch<G: Group>() {
    type Case<G> = fn(&mut G, usize) -> Result<(), CollectiveError>;
    let cases: [(&str, Case<G>); 6] = [
        ("length", |c, w| {
            let mut b = vec![1.0; if c.rank() == w - 1 { 9 } else { 8 }];
            c.all_reduce(&mut b, ReduceOp::Sum)
        }),
        ("op kind", |c, _| {
            let mut b = vec![1.0; 4];
            if c.rank() == 0 {
                c.broadcast(&mut b, 0)
            } else {
                c.all_reduce(&mut b, ReduceOp::Sum)
            }
        }),
        ("reduction", |c, _| {
            let mut b = vec![1.0; 4];
            let op = if c.rank() == 1 {
                ReduceOp::Avg
            } else {
                ReduceOp::Sum
            };
            c.all_reduce(&mut b, op)
        }),
        ("root", |c, _| {
            let mut b = vec![1.0; 4];
            c.broadcast(&mut b, usize::from(c.rank() == 0))
        }),
        ("reduce root", |c, _| {
            let mut b = vec![1.0; 4];
            c.reduce(&mut b, usize::from(c.rank() == 0), ReduceOp::Sum)
        }),
        ("shard", |c, w| {
            let shard = if c.rank() == 1 { 3 } else { 2 };
            let mut out = vec![0.0; w * shard];
            c.all_gather(&vec![1.0; shard], &mut out)
        }),
    ];
    for world in 2..=4 {
        for (name, case) in cases {
            let errs = fails_fast::<G, _, _>(world, move |mut c| {
                let first = case(&mut c, world);
                // The group stays failed: the next op reports the same error.
                let next = c.barrier();
                (first, next)
            });
            for (r, (first, next)) in errs.into_iter().enumerate() {
                let ctx = format!("{name}, world {world}, rank {r}");
                assert!(
                    matches!(first, Err(CollectiveError::Mismatch { seq: 0, .. })),
                    "{ctx}: {first:?}"
                );
                assert_eq!(next, first, "{ctx}");
            }
        }
    }
}

fn errors_say_what_each_rank_did<G: Group>() {
    let errs = fails_fast::<G, _, _>(3, |mut c| {
        let mut b = vec![1.0; if c.rank() == 1 { 9 } else { 8 }];
        c.all_reduce(&mut b, ReduceOp::Avg)
    });
    let msg = errs[0].clone().unwrap_err().to_string();
    eprintln!("{msg}");
    // Whichever rank saw the mismatch first, the message names the ranks in order.
    assert!(msg.starts_with("collective #0: ranks disagree: "), "{msg}");
    assert!(
        msg.contains("rank 1: all_reduce(avg) of 9 elements"),
        "{msg}"
    );
    assert!(msg.contains("all_reduce(avg) of 8 elements"), "{msg}");

    let timeout = Duration::from_millis(100);
    let errs = run_all::<G, _, _>(2, timeout, move |mut c| {
        if c.rank() == 1 {
            thread::sleep(timeout * 3);
        }
        c.barrier()
    });
    let msg = errs[1].clone().unwrap_err().to_string();
    eprintln!("{msg}");
    assert!(msg.starts_with("rank 0 waited "), "{msg}");
    assert!(msg.contains("in barrier (collective #0)"), "{msg}");

    let errs = fails_fast::<G, _, _>(2, |mut c| {
        if c.rank() == 0 {
            return Ok(());
        }
        c.barrier()
    });
    let msg = errs[1].clone().unwrap_err().to_string();
    eprintln!("{msg}");
    assert_eq!(
        msg,
        format!(
            "rank 0 aborted the collective group: it left the group: {}",
            G::LEFT
        )
    );
}

fn a_bad_argument_on_one_rank_fails_every_rank<G: Group>() {
    let errs = fails_fast::<G, _, _>(3, |mut c| {
        let input = vec![1.0; 6];
        let mut out = vec![0.0; if c.rank() == 1 { 3 } else { 2 }];
        c.reduce_scatter(&input, &mut out, ReduceOp::Sum)
    });
    for e in errs {
        match e {
            Err(CollectiveError::InvalidArgument {
                rank: 1,
                op: Op::ReduceScatter,
                ..
            }) => {}
            other => panic!("{other:?}"),
        }
    }
    let errs = fails_fast::<G, _, _>(2, |mut c| {
        let mut b = vec![1.0; 2];
        c.broadcast(&mut b, if c.rank() == 0 { 0 } else { 5 })
    });
    for e in errs {
        assert!(
            matches!(e, Err(CollectiveError::InvalidArgument { rank: 1, .. })),
            "{e:?}"
        );
    }
}

fn a_rank_that_returns_early_fails_the_others_promptly<G: Group>() {
    let start = Instant::now();
    let outs = run_all::<G, _, _>(3, Duration::from_millis(200), |mut c| {
        let mut b = vec![c.rank() as f32; 5];
        let first = c.all_reduce(&mut b, ReduceOp::Sum);
        if c.rank() == 2 {
            return (first, Ok(()));
        }
        // Rank 2 has dropped its handle by now or will soon; this can never complete.
        let second = c.all_reduce(&mut b, ReduceOp::Sum);
        (first, second)
    });
    assert!(start.elapsed() < Duration::from_secs(5));
    for (r, (first, second)) in outs.into_iter().enumerate() {
        assert_eq!(first, Ok(()), "rank {r}: the completed op stands");
        if r != 2 {
            match second {
                Err(CollectiveError::Aborted { rank: 2, reason }) => {
                    assert!(reason.contains("left the group"), "{reason}")
                }
                other => panic!("rank {r}: {other:?}"),
            }
        }
    }
}

fn a_rank_that_panics_fails_the_others<G: Group>() {
    let outs = run_ranks::<G, _, _>(3, Duration::from_secs(30), |mut c| {
        c.barrier().unwrap();
        if c.rank() == 1 {
            panic!("rank 1 fails on purpose (this panic is expected by the test)");
        }
        let start = Instant::now();
        let e = c.barrier();
        (e, start.elapsed())
    });
    assert!(outs[1].is_none());
    for r in [0, 2] {
        let (e, took) = outs[r].clone().unwrap();
        assert!(took < Duration::from_secs(1), "rank {r} took {took:?}");
        match e {
            Err(CollectiveError::Aborted { rank: 1, reason }) => {
                assert!(reason.contains("panicked"), "{reason}")
            }
            other => panic!("rank {r}: {other:?}"),
        }
    }
}

fn abort_reaches_every_rank<G: Group>() {
    let errs = fails_fast::<G, _, _>(3, |mut c| {
        let mut b = vec![1.0; 3];
        if c.rank() == 1 {
            thread::sleep(Duration::from_millis(20));
            c.abort("found NaN in the gradients");
            return c.all_reduce(&mut b, ReduceOp::Sum);
        }
        c.all_reduce(&mut b, ReduceOp::Sum)
    });
    let want = Err(CollectiveError::Aborted {
        rank: 1,
        reason: "found NaN in the gradients".into(),
    });
    for (r, e) in errs.into_iter().enumerate() {
        assert_eq!(e, want, "rank {r}");
    }
}

fn a_rank_that_never_calls_times_the_others_out<G: Group>() {
    let timeout = Duration::from_millis(200);
    let start = Instant::now();
    let errs = run_all::<G, _, _>(3, timeout, move |mut c| {
        if c.rank() == 2 {
            thread::sleep(timeout * 3);
        }
        c.all_reduce(&mut [1.0, 2.0], ReduceOp::Avg)
    });
    assert!(start.elapsed() < Duration::from_secs(5));
    // Every rank, the late one included, reports the first timeout.
    let first = errs[0].clone();
    match &first {
        Err(CollectiveError::Timeout {
            rank,
            op: Op::AllReduce,
            seq: 0,
            waited,
        }) => {
            assert!(*rank < 2, "a waiting rank timed out, not the late one");
            assert!(*waited >= timeout, "{waited:?}");
        }
        other => panic!("{other:?}"),
    }
    for e in &errs {
        assert_eq!(e, &first);
    }
}

fn ranks_that_finish_together_see_no_error<G: Group>() {
    // The fastest rank drops its handle while slower ones are still taking the last op's
    // result; a completed op must stand.
    for _ in 0..20 {
        let outs = run_all::<G, _, _>(4, Duration::from_secs(10), |mut c| {
            let mut last = 0.0;
            for i in 0..50 {
                last = c.all_reduce_max((i * 4 + c.rank()) as f32)?;
            }
            Ok::<f32, CollectiveError>(last)
        });
        assert!(outs.iter().all(|o| *o == Ok(199.0)), "{outs:?}");
    }
}

fn empty_group_and_trait_objects<G: Group>() {
    assert!(G::group(0, Duration::from_secs(1)).is_empty());
    let mut boxed: Vec<Box<dyn Collective>> = G::group(1, Duration::from_secs(1))
        .into_iter()
        .map(|c| Box::new(c) as Box<dyn Collective>)
        .collect();
    let c = &mut boxed[0];
    assert_eq!((c.rank(), c.world()), (0, 1));
    let mut b = [3.0, -1.5];
    c.all_reduce(&mut b, ReduceOp::Avg).unwrap();
    assert_eq!(b, [3.0, -1.5]);
    assert_eq!(
        c.all_reduce_sum_f64(-0.0).unwrap().to_bits(),
        (-0.0f64).to_bits()
    );
}

fn a_timeout_names_the_collective_it_happened_in<G: Group>() {
    let timeout = Duration::from_millis(100);
    let errs = run_all::<G, _, _>(2, timeout, move |mut c| {
        for _ in 0..3 {
            c.barrier()?;
        }
        if c.rank() == 1 {
            thread::sleep(timeout * 3);
        }
        let max = c.all_reduce_max(1.0)?;
        Ok::<f32, CollectiveError>(max)
    });
    for e in errs {
        assert!(
            matches!(
                e,
                Err(CollectiveError::Timeout {
                    rank: 0,
                    op: Op::AllReduceMax,
                    seq: 3,
                    ..
                })
            ),
            "{e:?}"
        );
    }
}

/// Every test above, on both implementations.
macro_rules! both {
    ($($name:ident),* $(,)?) => {
        mod local {
            $(#[test] fn $name() { super::$name::<super::LocalCollective>() })*
        }
        mod net {
            $(#[test] fn $name() { super::$name::<super::NetCollective>() })*
        }
    };
}

both!(
    every_op_equals_the_sequential_reference_bit_for_bit,
    max_propagates_nan_and_handles_infinities,
    a_thousand_random_consecutive_ops_agree_on_every_rank,
    repeated_runs_are_bit_identical,
    mismatched_calls_fail_every_rank_with_mismatch,
    errors_say_what_each_rank_did,
    a_bad_argument_on_one_rank_fails_every_rank,
    a_rank_that_returns_early_fails_the_others_promptly,
    a_rank_that_panics_fails_the_others,
    abort_reaches_every_rank,
    a_rank_that_never_calls_times_the_others_out,
    ranks_that_finish_together_see_no_error,
    empty_group_and_trait_objects,
    a_timeout_names_the_collective_it_happened_in,
);

/// Gathering a run over the network: who is admitted, and what the others are told.
mod gathering {
    use std::time::Duration;

    use recipe_runtime::collective::net::{join, Expect, Hub, Join, NetError};
    use recipe_runtime::collective::{Collective, ReduceOp};

    fn expect(world: usize, join: Duration) -> Expect {
        Expect {
            world,
            digest: "plan a".into(),
            mode: "cpu".into(),
            blob: b"an nccl id".to_vec(),
            join,
            op: Duration::from_secs(10),
        }
    }

    fn joining(addr: &str, ranks: std::ops::Range<usize>, world: usize, digest: &str) -> Join {
        Join {
            addr: addr.into(),
            ranks,
            world,
            digest: digest.into(),
            mode: "cpu".into(),
            join: Duration::from_secs(10),
            op: Duration::from_secs(10),
        }
    }

    #[test]
    fn two_processes_worth_of_ranks_gather_and_get_the_blob() {
        let hub = Hub::start("127.0.0.1:0", expect(4, Duration::from_secs(10))).unwrap();
        let addr = hub.addr().to_string();
        // Two "nodes" of two ranks each, joining in the wrong order.
        let second = {
            let addr = addr.clone();
            std::thread::spawn(move || join(&joining(&addr, 2..4, 4, "plan a")))
        };
        std::thread::sleep(Duration::from_millis(50));
        let (mut first, blob) = join(&joining(&addr, 0..2, 4, "plan a")).unwrap();
        let (mut second, blob2) = second.join().unwrap().unwrap();
        assert_eq!(blob, b"an nccl id");
        assert_eq!(blob2, blob);
        let ranks: Vec<usize> = first.iter().chain(&second).map(|c| c.rank()).collect();
        assert_eq!(ranks, [0, 1, 2, 3]);
        let sums: Vec<f32> = std::thread::scope(|s| {
            let hs: Vec<_> = first
                .iter_mut()
                .chain(second.iter_mut())
                .map(|c| {
                    s.spawn(move || {
                        let mut b = [c.rank() as f32 + 0.5];
                        c.all_reduce(&mut b, ReduceOp::Sum).unwrap();
                        b[0]
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        assert_eq!(sums, [8.0; 4]);
        drop((first, second));
        hub.finish().unwrap();
    }

    #[test]
    fn a_process_with_another_plan_is_refused_and_told_why() {
        let hub = Hub::start("127.0.0.1:0", expect(2, Duration::from_millis(800))).unwrap();
        let addr = hub.addr().to_string();
        let e = join(&joining(&addr, 1..2, 2, "plan b")).unwrap_err();
        let msg = e.to_string();
        assert!(matches!(e, NetError::Refused { rank: 1, .. }), "{msg}");
        assert!(
            msg.contains("`plan b`") && msg.contains("`plan a`"),
            "{msg}"
        );
        assert!(msg.contains("the same plan"), "{msg}");
        // Another world size, then a rank outside it.
        let e = join(&joining(&addr, 0..1, 3, "plan a")).unwrap_err();
        assert!(
            e.to_string()
                .contains("it runs 3 rank(s) and this run has 2"),
            "{e}"
        );
        // The hub gives up at its join timeout and says who came and who was turned away.
        let e = hub.finish().unwrap_err();
        let msg = e.to_string();
        assert!(msg.contains("0 of 2 rank(s) had joined"), "{msg}");
        assert!(msg.contains("missing: rank(s) 0, 1"), "{msg}");
        assert!(msg.contains("rank 1: it runs `plan b`"), "{msg}");
    }

    #[test]
    fn the_same_rank_twice_is_refused_and_the_first_hears_the_run_did_not_gather() {
        let hub = Hub::start("127.0.0.1:0", expect(2, Duration::from_millis(800))).unwrap();
        let addr = hub.addr().to_string();
        let first = {
            let addr = addr.clone();
            std::thread::spawn(move || join(&joining(&addr, 0..1, 2, "plan a")))
        };
        std::thread::sleep(Duration::from_millis(100));
        let e = join(&joining(&addr, 0..1, 2, "plan a")).unwrap_err();
        assert!(
            e.to_string().contains("rank 0 has already joined from"),
            "{e}"
        );
        let e = first.join().unwrap().unwrap_err();
        let msg = e.to_string();
        assert!(matches!(e, NetError::Refused { rank: 0, .. }), "{msg}");
        assert!(
            msg.contains("1 of 2 rank(s) had joined; missing: rank(s) 1"),
            "{msg}"
        );
        assert!(hub.finish().is_err());
    }

    #[test]
    fn node_0_waits_for_the_others_to_leave_but_not_forever() {
        let start = |world| {
            let hub = Hub::start("127.0.0.1:0", expect(world, Duration::from_secs(10))).unwrap();
            let addr = hub.addr().to_string();
            let (colls, _) = join(&joining(&addr, 0..world, world, "plan a")).unwrap();
            (hub, colls)
        };
        // A rank still connected: node 0 stops waiting at the bound, and says so.
        let (hub, colls) = start(1);
        let t = std::time::Instant::now();
        assert!(!hub.finish_within(Duration::from_millis(300)));
        assert!(t.elapsed() >= Duration::from_millis(300));
        drop(colls);
        // Every rank gone: it returns as soon as they have left.
        let (hub, colls) = start(2);
        drop(colls);
        let t = std::time::Instant::now();
        assert!(hub.finish_within(Duration::from_secs(30)));
        assert!(t.elapsed() < Duration::from_secs(5));
    }

    #[test]
    fn a_rank_with_no_node_0_gives_up_at_its_join_timeout() {
        // A port nothing listens on: bind one, note it, close it.
        let addr = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap().to_string()
        };
        let mut j = joining(&addr, 1..2, 2, "plan a");
        j.join = Duration::from_millis(600);
        let e = join(&j).unwrap_err();
        let msg = e.to_string();
        assert!(matches!(e, NetError::Connect { .. }), "{msg}");
        assert!(msg.contains("is node 0 started"), "{msg}");
    }

    #[test]
    fn a_stranger_on_the_port_does_not_disturb_the_run() {
        use std::io::Write;
        let hub = Hub::start("127.0.0.1:0", expect(1, Duration::from_secs(10))).unwrap();
        let addr = hub.addr().to_string();
        let mut s = std::net::TcpStream::connect(&addr).unwrap();
        s.write_all(b"GET / HTTP/1.1\r\n\r\n").unwrap();
        drop(s);
        let (mut c, _) = join(&joining(&addr, 0..1, 1, "plan a")).unwrap();
        c[0].barrier().unwrap();
        drop(c);
        hub.finish().unwrap();
    }

    #[test]
    fn a_rank_whose_hub_dies_gets_an_error_not_a_hang() {
        // A fake hub that welcomes one rank and then hangs up.
        use std::io::{Read, Write};
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap().to_string();
        let fake = std::thread::spawn(move || {
            let (mut s, _) = l.accept().unwrap();
            let mut hello = [0u8; 64];
            let _ = s.read(&mut hello).unwrap();
            s.write_all(&[1]).unwrap(); // WELCOME
            s.write_all(&0u64.to_le_bytes()).unwrap(); // an empty blob
        });
        let (mut c, blob) = join(&joining(&addr, 0..1, 1, "plan a")).unwrap();
        let c = &mut c[0];
        assert!(blob.is_empty());
        fake.join().unwrap();
        let e = c.barrier().unwrap_err();
        let msg = e.to_string();
        assert!(msg.starts_with("rank 0 lost the collective group"), "{msg}");
        assert!(msg.contains("in barrier"), "{msg}");
        // The loss is for good, without another trip to the wire.
        assert_eq!(c.all_reduce_max(1.0).unwrap_err(), e);
    }
}
