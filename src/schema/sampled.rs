//! Where a target release falls among the releases recipe sampled: the per-release tables of
//! [`super::upstream_versions`], oldest first, written by conformance/extract_upstream.py.
//!
//! One rule for every reader — the DeepSpeed emitter (which `zero_optimization` keys a release
//! reads), HF's `TrainingArguments` fields, and the raw-key checks (R0030, R0032): a target takes
//! the keys of the newest sampled release not newer than it, or of the oldest sampled one when it
//! is older than all of them; and where the target is not itself sampled, the next sampled
//! release says whether a key may have come or gone in between (docs/language.md, "Raw keys").

use super::upstream::HfFields;
use crate::upstream::versions::Version;

/// An entry of a per-release table.
pub trait Release: 'static {
    /// The release, as sampled (`"0.19.8"`).
    fn version(&self) -> &'static str;
    /// Whether the release reads (has) `key`.
    fn has(&self, key: &str) -> bool;
}

/// A DeepSpeed table's entry: (version, the keys it reads).
impl Release for (&'static str, &'static [&'static str]) {
    fn version(&self) -> &'static str {
        self.0
    }
    fn has(&self, key: &str) -> bool {
        self.1.contains(&key)
    }
}

impl Release for HfFields {
    fn version(&self) -> &'static str {
        self.version
    }
    fn has(&self, key: &str) -> bool {
        HfFields::has(self, key)
    }
}

/// The parsed version of a sampled release (the script writes only `X.Y.Z`;
/// tests/upstream_tables.rs parses every one).
fn parsed<T: Release>(e: &T) -> Version {
    e.version().parse().expect("sampled versions parse")
}

/// The sampled releases on either side of a target.
#[derive(Debug)]
pub struct Around<T: 'static> {
    /// The newest sampled release not newer than the target; `None` when it is older than all.
    pub at: Option<&'static T>,
    /// The oldest sampled release newer than the target, unless the target is itself sampled.
    pub next: Option<&'static T>,
}

impl<T> Clone for Around<T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T> Copy for Around<T> {}

/// Where `v` falls among `table`'s sampled releases.
pub fn around<T: Release>(table: &'static [T], v: Version) -> Around<T> {
    let i = table.partition_point(|e| parsed(e) <= v);
    let at = i.checked_sub(1).map(|i| &table[i]);
    let sampled = at.is_some_and(|e| parsed(e) == v);
    Around {
        at,
        next: table.get(i).filter(|_| !sampled),
    }
}

/// The release whose keys the target `v` takes: the newest sampled one not newer than it, or the
/// oldest sampled one for a target older than every sample.
pub fn nearest<T: Release>(table: &'static [T], v: Version) -> &'static T {
    around(table, v).at.unwrap_or(&table[0])
}

/// The first sampled release newer than `v` that has `key`, and the sampled release just before
/// it (`None` when that one is the oldest sampled): "`a` reads it (`b` does not)".
pub fn first_later_with<T: Release>(
    table: &'static [T],
    v: Version,
    key: &str,
) -> Option<(&'static T, Option<&'static T>)> {
    let i = table.iter().position(|e| e.has(key) && parsed(e) > v)?;
    Some((&table[i], i.checked_sub(1).map(|p| &table[p])))
}

/// Whether a sampled release older than `v` has `key` (a key the target's release dropped).
pub fn earlier_has<T: Release>(table: &'static [T], v: Version, key: &str) -> bool {
    table.iter().any(|e| e.has(key) && parsed(e) < v)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schema::upstream_versions::{
        DEEPSPEED_TOP_LEVEL_BY_VERSION as DS, TRAINING_ARGUMENTS_BY_VERSION as HF,
    };

    fn v(s: &str) -> Version {
        s.parse().unwrap()
    }

    fn versions<T: Release>(a: Around<T>) -> (Option<&'static str>, Option<&'static str>) {
        (a.at.map(T::version), a.next.map(T::version))
    }

    #[test]
    fn a_sampled_target_has_no_next() {
        assert_eq!(versions(around(DS, v("0.19.8"))), (Some("0.19.8"), None));
        assert_eq!(versions(around(DS, v("0.14.0"))), (Some("0.14.0"), None));
        assert_eq!(versions(around(HF, v("4.48.0"))), (Some("4.48.0"), None));
    }

    #[test]
    fn a_target_between_samples_has_both_neighbours() {
        assert_eq!(
            versions(around(DS, v("0.17.2"))),
            (Some("0.17.0"), Some("0.17.6"))
        );
        assert_eq!(
            versions(around(HF, v("4.46.1"))),
            (Some("4.46.0"), Some("4.46.3"))
        );
    }

    #[test]
    fn outside_the_samples() {
        // Older than all: no `at`, and the oldest sample's keys.
        assert_eq!(versions(around(DS, v("0.2.0"))), (None, Some("0.3.16")));
        assert_eq!(nearest(DS, v("0.2.0")).0, "0.3.16");
        assert_eq!(nearest(HF, v("4.0.0")).version, "4.6.1");
        // Newer than all: the newest, nothing after it.
        assert_eq!(versions(around(DS, v("9.0.0"))), (Some("0.19.8"), None));
        assert_eq!(nearest(HF, v("9.0.0")).version, "5.25.0");
    }

    #[test]
    fn the_first_later_release_with_a_key() {
        // DeepSpeed 0.17.6 is the first sampled release that reads `torch_autocast`.
        let (first, before) = first_later_with(DS, v("0.14.2"), "torch_autocast").unwrap();
        assert_eq!((first.0, before.map(|b| b.0)), ("0.17.6", Some("0.17.0")));
        assert!(first_later_with(DS, v("0.19.8"), "torch_autocast").is_none());
        // A key of the oldest sample has no release before it.
        let (first, before) = first_later_with(DS, v("0.2.0"), "fp16").unwrap();
        assert_eq!((first.0, before), ("0.3.16", None));
        assert!(earlier_has(DS, v("0.19.8"), "torch_autocast"));
        assert!(!earlier_has(DS, v("0.17.6"), "torch_autocast"));
    }
}
