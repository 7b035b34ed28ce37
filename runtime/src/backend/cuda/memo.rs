//! Which packed half-precision operands a GPU still holds ([`crate::backend::device::Device::gemm_half`]
//! with `RECIPE_HALF_GEMM=pack`): a GEMM whose operand was packed by an earlier GEMM, with
//! nothing written to the device's memory since but other GEMMs' outputs elsewhere, reads the
//! packed copy again instead of packing it anew. The backward reads each output gradient twice
//! in a row (the weight's gradient, then the input's), and the Q, K and V linears read the same
//! input three times, forward and backward: about a quarter of the packs on BERT.
//!
//! The rule that keeps it exact is coarse on purpose: every operation that may write device
//! memory (any kernel launch but the packs' own, a copy, a memset, an upload, an NCCL call, an
//! allocation) makes every entry stale ([`Memo::bump`]); a GEMM forgets the entries whose source
//! its output overlaps ([`Memo::written`]). An entry is reused only for the same address, dtype
//! and at most the span it packed.

use crate::precision::Dtype;

/// One packed slot: what it holds, and since when.
#[derive(Debug, Clone, Copy)]
struct Entry {
    /// The f32 source's device address; 0: nothing.
    src: u64,
    /// Elements packed from `src`.
    span: usize,
    half: Dtype,
    /// The write generation it was packed in.
    gen: u64,
    /// When it was last used (for eviction).
    used: u64,
}

const EMPTY: Entry = Entry {
    src: 0,
    span: 0,
    half: Dtype::F32,
    gen: 0,
    used: 0,
};

/// The slots' bookkeeping (the buffers themselves are the device's).
#[derive(Debug, Clone)]
pub struct Memo {
    entries: Vec<Entry>,
    gen: u64,
    clock: u64,
}

/// Where an operand's packed copy is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Found {
    pub slot: usize,
    /// Already packed there: nothing to do.
    pub hit: bool,
}

impl Memo {
    /// Bookkeeping of `slots` slots (at least two: a GEMM's two operands).
    pub fn new(slots: usize) -> Memo {
        assert!(slots >= 2, "a GEMM packs two operands");
        Memo {
            entries: vec![EMPTY; slots],
            gen: 1,
            clock: 0,
        }
    }

    /// Slots.
    pub fn slots(&self) -> usize {
        self.entries.len()
    }

    /// Something may have written device memory: no packed copy can be trusted any more.
    pub fn bump(&mut self) {
        self.gen += 1;
    }

    /// A GEMM wrote `bytes` bytes at `start`: the copies of sources it overlaps are stale.
    pub fn written(&mut self, start: u64, bytes: u64) {
        let end = start.saturating_add(bytes);
        for e in &mut self.entries {
            let e_end = e.src.saturating_add(4 * e.span as u64);
            if e.src != 0 && e.src < end && start < e_end {
                *e = EMPTY;
            }
        }
    }

    /// The slot of `span` f32 elements at `src` packed as `half`: one that holds them already
    /// (`hit`), else the least recently used slot not in `keep` (the GEMM's other operand),
    /// now recorded as holding them; the caller packs them there, or [`Memo::forget`]s the slot
    /// when it could not.
    pub fn find(&mut self, src: u64, span: usize, half: Dtype, keep: &[usize]) -> Found {
        self.clock += 1;
        let hit = self.entries.iter().position(|e| {
            e.src == src && e.src != 0 && e.half == half && e.gen == self.gen && span <= e.span
        });
        if let Some(slot) = hit {
            self.entries[slot].used = self.clock;
            return Found { slot, hit: true };
        }
        let slot = (0..self.entries.len())
            .filter(|s| !keep.contains(s))
            .min_by_key(|&s| self.entries[s].used)
            .expect("more slots than kept ones");
        self.entries[slot] = Entry {
            src,
            span,
            half,
            gen: self.gen,
            used: self.clock,
        };
        Found { slot, hit: false }
    }

    /// Slot `slot` holds nothing usable (its pack failed, or its buffer was replaced).
    pub fn forget(&mut self, slot: usize) {
        self.entries[slot] = EMPTY;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const BF: Dtype = Dtype::Bf16;

    #[test]
    fn a_source_packed_since_the_last_write_is_found_again() {
        let mut m = Memo::new(4);
        let a = m.find(1000, 64, BF, &[]);
        assert!(!a.hit);
        let w = m.find(5000, 32, BF, &[a.slot]);
        assert!(!w.hit);
        assert_ne!(a.slot, w.slot);
        // The same source again, or a shorter span of it: the same slot, nothing to pack.
        assert_eq!(
            m.find(1000, 64, BF, &[]),
            Found {
                slot: a.slot,
                hit: true
            }
        );
        assert_eq!(
            m.find(1000, 10, BF, &[]),
            Found {
                slot: a.slot,
                hit: true
            }
        );
        // A longer span, another dtype or another address is packed anew.
        assert!(!m.find(1000, 65, BF, &[]).hit);
        assert!(!m.find(5000, 32, Dtype::F16, &[]).hit);
        assert!(!m.find(1004, 8, BF, &[]).hit);
    }

    #[test]
    fn any_write_makes_every_copy_stale() {
        let mut m = Memo::new(3);
        let a = m.find(1000, 64, BF, &[]);
        m.bump();
        let again = m.find(1000, 64, BF, &[]);
        assert!(!again.hit);
        // Packed anew after the write: found from then on.
        assert!(m.find(1000, 64, BF, &[]).hit);
        let _ = a;
    }

    #[test]
    fn a_gemm_output_forgets_exactly_the_sources_it_overlaps() {
        let mut m = Memo::new(4);
        // Sources [1000, 1256), [2000, 2040), [3000, 3400).
        m.find(1000, 64, BF, &[]);
        m.find(2000, 10, BF, &[]);
        m.find(3000, 100, BF, &[]);
        // Output [1256, 2000): touches neither of the first two.
        m.written(1256, 744);
        assert!(m.find(1000, 64, BF, &[]).hit);
        assert!(m.find(2000, 10, BF, &[]).hit);
        // Output [2036, 2100): the second's last element.
        m.written(2036, 64);
        assert!(!m.find(2000, 10, BF, &[]).hit);
        assert!(m.find(3000, 100, BF, &[]).hit);
        // Output [2900, 3001): the third's first byte.
        m.written(2900, 101);
        assert!(!m.find(3000, 100, BF, &[]).hit);
    }

    #[test]
    fn the_least_recently_used_slot_goes_and_the_other_operand_stays() {
        let mut m = Memo::new(3);
        let x = m.find(100, 4, BF, &[]);
        let y = m.find(200, 4, BF, &[x.slot]);
        let z = m.find(300, 4, BF, &[y.slot]);
        // x is the oldest; used again, y becomes the oldest.
        assert!(m.find(100, 4, BF, &[]).hit);
        let w = m.find(400, 4, BF, &[]);
        assert_eq!(w.slot, y.slot);
        // With z kept, the oldest other (x) goes, not z.
        assert!(m.find(300, 4, BF, &[]).hit);
        let v = m.find(500, 4, BF, &[z.slot, w.slot]);
        assert_eq!(v.slot, x.slot);
        m.forget(v.slot);
        assert!(!m.find(500, 4, BF, &[]).hit);
    }
}
