//! The flat parameter store: every parameter of a model in one `f32` buffer.
//!
//! One buffer rather than one allocation per tensor, because the optimizer, gradient clipping and
//! (next) ZeRO partitioning all work on contiguous ranges of it; gradients use the same layout, so
//! `grads[entry.range()]` is the gradient of `data[entry.range()]`.

use std::ops::Range;

/// One named tensor inside a [`Params`] buffer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// HF `named_parameters()` name, e.g. `bert.embeddings.word_embeddings.weight`.
    pub name: String,
    /// Shape, row-major (Linear weights are `[out, in]` like PyTorch).
    pub shape: Vec<usize>,
    /// Offset of the first element in the flat buffer.
    pub offset: usize,
}

impl Entry {
    /// Number of elements.
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }

    /// The elements' range in the flat buffer.
    pub fn range(&self) -> Range<usize> {
        self.offset..self.offset + self.numel()
    }
}

/// All parameters of a model in one flat `f32` buffer, entries in HF `named_parameters()` order.
#[derive(Debug, Clone, PartialEq)]
pub struct Params {
    /// The values, entry after entry, no padding.
    pub data: Vec<f32>,
    /// The tensors, in order; `entries[i + 1].offset == entries[i].range().end`.
    pub entries: Vec<Entry>,
}

impl Params {
    /// A zero-filled store with the given `(name, shape)` tensors laid out in order.
    pub fn zeros(specs: Vec<(String, Vec<usize>)>) -> Params {
        let (entries, n) = lay_out(specs);
        Params {
            data: vec![0.0; n],
            entries,
        }
    }

    /// [`Params::zeros`] for a model whose size comes from a file: an error naming the size,
    /// rather than an abort, where the elements overflow `usize` or their memory cannot be had.
    pub fn try_zeros(specs: Vec<(String, Vec<usize>)>) -> Result<Params, String> {
        let n = element_count(&specs).ok_or("the model's parameter count overflows")?;
        let mut data = Vec::new();
        data.try_reserve_exact(n).map_err(|e| {
            format!(
                "the model's {n} parameters need {:.1} GiB as f32, which cannot be allocated ({e})",
                n as f64 * 4.0 / (1u64 << 30) as f64
            )
        })?;
        data.resize(n, 0.0);
        Ok(Params {
            data,
            entries: lay_out(specs).0,
        })
    }

    /// Total number of elements.
    pub fn len(&self) -> usize {
        self.data.len()
    }

    /// True when there are no elements.
    pub fn is_empty(&self) -> bool {
        self.data.is_empty()
    }

    /// The entry called `name`.
    pub fn entry(&self, name: &str) -> Option<&Entry> {
        self.entries.iter().find(|e| e.name == name)
    }

    /// The values of tensor `name`.
    pub fn get(&self, name: &str) -> Option<&[f32]> {
        let r = self.entry(name)?.range();
        Some(&self.data[r])
    }

    /// The values of tensor `name`, mutable.
    pub fn get_mut(&mut self, name: &str) -> Option<&mut [f32]> {
        let r = self.entry(name)?.range();
        Some(&mut self.data[r])
    }

    /// A zeroed gradient buffer with this store's layout.
    pub fn zeros_like(&self) -> Vec<f32> {
        vec![0.0; self.data.len()]
    }
}

/// The tensors one after another from offset 0, and the elements they take.
fn lay_out(specs: Vec<(String, Vec<usize>)>) -> (Vec<Entry>, usize) {
    let mut offset = 0;
    let entries = specs
        .into_iter()
        .map(|(name, shape)| {
            let e = Entry {
                name,
                shape,
                offset,
            };
            offset += e.numel();
            e
        })
        .collect();
    (entries, offset)
}

/// The elements of tensors of these shapes together, or `None` past `usize::MAX`.
pub fn element_count(specs: &[(String, Vec<usize>)]) -> Option<usize> {
    specs.iter().try_fold(0usize, |sum, (_, shape)| {
        let n = shape.iter().try_fold(1usize, |p, &d| p.checked_mul(d))?;
        sum.checked_add(n)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_are_contiguous_and_addressable() {
        let mut p = Params::zeros(vec![
            ("a".into(), vec![2, 3]),
            ("b".into(), vec![4]),
            ("c".into(), vec![]),
        ]);
        assert_eq!(p.len(), 11);
        assert_eq!(p.entry("b").unwrap().range(), 6..10);
        assert_eq!(p.entry("c").unwrap().range(), 10..11);
        p.get_mut("b").unwrap()[1] = 5.0;
        assert_eq!(p.data[7], 5.0);
        assert!(p.get("nope").is_none());
    }

    #[test]
    fn a_model_too_large_to_hold_is_an_error_not_an_abort() {
        let specs = |d: usize| vec![("w".to_string(), vec![d, d]), ("b".to_string(), vec![d])];
        let p = Params::try_zeros(specs(3)).unwrap();
        assert_eq!(p, Params::zeros(specs(3)));
        assert_eq!(element_count(&specs(3)), Some(12));
        // 2^62 elements: 2^64 bytes, past what an allocation may ask for (isize::MAX), refused
        // without asking the OS (which may overcommit a merely huge request).
        let e = Params::try_zeros(specs(1 << 31)).unwrap_err();
        assert!(
            e.contains("4611686020574871552 parameters need") && e.contains("cannot be allocated"),
            "{e}"
        );
        // Shapes whose product passes usize::MAX.
        assert_eq!(element_count(&specs(1 << 40)), None);
        assert!(Params::try_zeros(specs(1 << 40))
            .unwrap_err()
            .contains("overflows"));
    }
}
