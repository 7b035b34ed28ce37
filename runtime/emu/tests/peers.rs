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
fn the_emulated_devices_sums_pass_for_two_and_three_ranks() {
    for world in [2, 3] {
        let checks = compare_peers(group(world));
        // Four checks (to every rank, to one root, from one root, a group from every rank) per
        // length per rank.
        assert_eq!(checks.len(), 4 * 4 * world);
        let bad: Vec<_> = checks.iter().filter(|c| !c.ok).collect();
        assert!(bad.is_empty(), "world {world}: {bad:?}");
    }
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
