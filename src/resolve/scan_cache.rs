//! A persistent cache of clean data-file scans, so that checking an unchanged recipe does not
//! read its (often large) data files again.
//!
//! Off unless the binary enables it ([`enable`]; `recipe` uses `<cache>/scans`, see
//! `src/cli/model_files.rs`, and `RECIPE_SCAN_CACHE=0` turns it off). An entry is reused only
//! when everything that could change the scan is identical: this binary's version and scan
//! format, the canonical path, the file's device, inode, size, and modification and
//! status-change times to the nanosecond (any write moves the status-change time, which no
//! user call can set back), and the fields the recipe asks for. Like git's index, a file
//! changed within the last [`RACY`] is never cached, because a second change within the
//! file system's timestamp granularity could leave every one of those the same. Only scans
//! without bad rows are cached (the diagnostics of a broken file always come from a fresh read).
//! Every failure (no directory, a corrupt or foreign entry) silently falls back to scanning;
//! entries are written to a temporary file and renamed.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::{Duration, SystemTime};

use serde::{Deserialize, Serialize};

use super::files::{DataScan, ScanSpec};

/// Bump when [`DataScan`]'s meaning changes without a version change (2: CSV/TSV rows are
/// records, not lines, and their labels are collected; 3: a JSONL row that is not UTF-8 or not
/// valid JSON, and a CSV/TSV header that is not UTF-8, are bad rows, as the runtime's reader
/// takes them; 4: JSONL rows are valid JSON as serde_json reads them into a value — no lone
/// surrogate, no number beyond an f64, at most 127 levels — and text fields that are not
/// strings are counted).
const SCAN_FORMAT: u32 = 4;

/// How recently changed a file must not be to be cached.
pub const RACY: Duration = Duration::from_secs(2);

static DIR: OnceLock<PathBuf> = OnceLock::new();

/// Turns the cache on, in `dir` (created on first write). Once per process; later calls are
/// ignored.
pub fn enable(dir: PathBuf) {
    let _ = DIR.set(dir);
}

#[derive(Debug, PartialEq, Serialize, Deserialize)]
struct Key {
    version: String,
    format: u32,
    path: PathBuf,
    dev: u64,
    ino: u64,
    len: u64,
    mtime_ns: i128,
    ctime_ns: i128,
    spec: ScanSpec,
}

#[derive(Serialize, Deserialize)]
struct Entry {
    key: Key,
    scan: DataScan,
}

#[cfg(unix)]
fn key(path: &Path, meta: &std::fs::Metadata, spec: &ScanSpec) -> Option<Key> {
    use std::os::unix::fs::MetadataExt;
    let ns = |s: i64, n: i64| i128::from(s) * 1_000_000_000 + i128::from(n);
    let mtime_ns = ns(meta.mtime(), meta.mtime_nsec());
    let ctime_ns = ns(meta.ctime(), meta.ctime_nsec());
    let now = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .ok()?
        .as_nanos() as i128;
    if now - mtime_ns.max(ctime_ns) < RACY.as_nanos() as i128 {
        return None;
    }
    Some(Key {
        version: env!("CARGO_PKG_VERSION").to_string(),
        format: SCAN_FORMAT,
        path: std::fs::canonicalize(path).ok()?,
        dev: meta.dev(),
        ino: meta.ino(),
        len: meta.len(),
        mtime_ns,
        ctime_ns,
        spec: spec.clone(),
    })
}

#[cfg(not(unix))]
fn key(_: &Path, _: &std::fs::Metadata, _: &ScanSpec) -> Option<Key> {
    None
}

/// The entry's file: one per (canonical path, spec), named by a hash of both.
fn entry_path(dir: &Path, key: &Key) -> PathBuf {
    let text = serde_json::to_string(&(&key.path, &key.spec)).unwrap_or_default();
    let hash = text.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    });
    dir.join(format!("{hash:016x}.json"))
}

/// The cached scan of `path`, when there is a valid one.
pub(crate) fn get(path: &Path, meta: &std::fs::Metadata, spec: &ScanSpec) -> Option<DataScan> {
    let dir = DIR.get()?;
    let key = key(path, meta, spec)?;
    let text = std::fs::read(entry_path(dir, &key)).ok()?;
    let entry: Entry = serde_json::from_slice(&text).ok()?;
    (entry.key == key).then_some(entry.scan)
}

/// Remembers a clean scan of `path` (best effort).
pub(crate) fn put(path: &Path, meta: &std::fs::Metadata, spec: &ScanSpec, scan: &DataScan) {
    let Some(dir) = DIR.get() else {
        return;
    };
    if scan.bad_rows > 0 || scan.first_bad.is_some() {
        return;
    }
    let Some(key) = key(path, meta, spec) else {
        return;
    };
    let target = entry_path(dir, &key);
    let entry = Entry {
        key,
        scan: scan.clone(),
    };
    let Ok(text) = serde_json::to_vec(&entry) else {
        return;
    };
    if std::fs::create_dir_all(dir).is_err() {
        return;
    }
    let tmp = target.with_extension(format!("tmp-{}", std::process::id()));
    if std::fs::write(&tmp, text).is_err() || std::fs::rename(&tmp, &target).is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
}
