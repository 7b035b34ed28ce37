//! The check of the sums between devices (`selftest::compare_peers`, which `recipe kernels
//! --selftest` runs over NCCL on a machine with several GPUs) on emulated devices: it passes for
//! the emulator's sums, and fails for a group that does not sum, sums into the wrong rank or
//! broadcasts from the wrong one.

use recipe_kernel_emu::{Emu, EmuPeers};
use recipe_runtime::backend::device::Peers;
use recipe_runtime::backend::selftest::compare_peers;

fn group(world: usize) -> Vec<(Emu, Box<dyn Peers<Emu>>)> {
    EmuPeers::group(world)
        .into_iter()
        .map(|p| (Emu, Box::new(p) as Box<dyn Peers<Emu>>))
        .collect()
}

#[test]
fn the_emulated_devices_sums_pass_for_one_two_and_three_ranks() {
    for world in [1, 2, 3] {
        let checks = compare_peers(group(world));
        // Five checks (to every rank, to one root, from one root, a group from every rank,
        // queued sums) per length per rank.
        assert_eq!(checks.len(), 5 * 4 * world);
        let bad: Vec<_> = checks.iter().filter(|c| !c.ok).collect();
        assert!(bad.is_empty(), "world {world}: {bad:?}");
    }
}

/// The same checks on `EmuTyped`, whose queued sums run at the join (the latest their contract
/// allows, where `Emu` sums at once): the check's device work between them and the join does not
/// touch what they sum, and its read after the join sees the sums.
#[test]
fn the_typed_emulators_queued_sums_pass_and_run_at_the_join() {
    use recipe_kernel_emu::{EmuTyped, EmuTypedPeers};
    use recipe_runtime::backend::device::Device;
    let ranks: Vec<(EmuTyped, Box<dyn Peers<EmuTyped>>)> = EmuTypedPeers::group(2)
        .into_iter()
        .map(|p| (EmuTyped, Box::new(p) as Box<dyn Peers<EmuTyped>>))
        .collect();
    let bad: Vec<_> = compare_peers(ranks).into_iter().filter(|c| !c.ok).collect();
    assert!(bad.is_empty(), "{bad:?}");

    // Late: a queued sum has not run before the join, and a direct one meanwhile is refused
    // (on a GPU it would run unordered with the queued ones).
    let mut group = EmuTypedPeers::group(2);
    std::thread::scope(|s| {
        for (rank, mut p) in group.drain(..).enumerate() {
            s.spawn(move || {
                let dev = EmuTyped;
                let mut buf = dev.upload(&[1.0 + rank as f32, 10.0]);
                let mut other = dev.upload(&[0.0]);
                // SAFETY: `buf` outlives the join and is not touched before it.
                unsafe { p.all_reduce_sum_queued(&dev, dev.view_mut(&mut buf)) }.unwrap();
                let mut v = vec![0.0; 2];
                dev.download(dev.view(&buf), &mut v);
                assert_eq!(v, [1.0 + rank as f32, 10.0], "summed before the join");
                let e = p
                    .all_reduce_sum(&dev, dev.view_mut(&mut other))
                    .unwrap_err();
                assert!(e.contains("queued sums are pending"), "{e}");
                dev.join_copies().unwrap();
                dev.download(dev.view(&buf), &mut v);
                assert_eq!(v, [3.0, 20.0]);
            });
        }
    });
}

/// A group whose sums go wrong in one way each.
struct Broken {
    inner: EmuPeers,
    /// 0: all-reduce does nothing; 1: reduce leaves its result on every rank; 2: all-reduce
    /// adds the rank's own input twice; 3: broadcast from rank 0 whatever the root.
    how: u8,
}

impl Peers<Emu> for Broken {
    fn rank(&self) -> usize {
        self.inner.rank()
    }
    fn world(&self) -> usize {
        self.inner.world()
    }
    fn all_reduce_sum(&mut self, dev: &Emu, buf: &mut [f32]) -> Result<(), String> {
        match self.how {
            0 => Ok(()),
            2 => {
                let own = buf.to_vec();
                self.inner.all_reduce_sum(dev, buf)?;
                buf.iter_mut().zip(own).for_each(|(b, x)| *b += x);
                Ok(())
            }
            _ => self.inner.all_reduce_sum(dev, buf),
        }
    }
    fn reduce_sum(&mut self, dev: &Emu, buf: &mut [f32], root: usize) -> Result<(), String> {
        if self.how == 1 {
            return self.inner.all_reduce_sum(dev, buf);
        }
        self.inner.reduce_sum(dev, buf, root)
    }
    fn broadcast(&mut self, dev: &Emu, buf: &mut [f32], root: usize) -> Result<(), String> {
        let root = if self.how == 3 { 0 } else { root };
        self.inner.broadcast(dev, buf, root)
    }
}

#[test]
fn a_group_that_sums_wrong_fails_the_check() {
    for how in 0..4u8 {
        let ranks = EmuPeers::group(2)
            .into_iter()
            .map(|inner| (Emu, Box::new(Broken { inner, how }) as Box<dyn Peers<Emu>>))
            .collect();
        let checks = compare_peers(ranks);
        assert!(checks.iter().any(|c| !c.ok), "broken way {how} passed");
    }
}
