//! The compiled kernel program, remembered across runs. NVRTC takes seconds to compile it (about
//! 4 s for one architecture on the H200 machine's CPU: docs/cuda.md, "Performance") at every
//! run's start; with the cache only the first run of a program, NVRTC and architecture pays.
//!
//! Off unless enabled: `recipe` enables it in `$RECIPE_CACHE/kernels` (default
//! `~/.cache/recipe/kernels`; `RECIPE_KERNEL_CACHE=0` turns it off), the library and its tests
//! never write one. An entry is one file per key: the architecture, NVRTC's version, the
//! compile options and the whole program text, named by their SHA-256. The file holds the key in
//! full, and an entry is used only when the key read back is the one asked for, so a changed
//! kernel, option or NVRTC is a miss, never a stale program; an unreadable or truncated file is a
//! miss too. A new entry is written to a temporary file and renamed into place (best effort: a
//! cache that cannot be written costs the compile only). Two NVRTC libraries of one version are
//! taken to compile the same program; runtime/fake-cuda's NVRTC is not a real one, so the runs
//! on it keep their own cache (tests/fake_cuda.rs) or none (scripts/fake-gpu-check.sh). The
//! compile gate (`recipe kernels`) never reads or writes it: it is there to compile.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use sha2::{Digest, Sha256};

use super::compile::Compiled;

static DIR: OnceLock<PathBuf> = OnceLock::new();

/// The entry file's first bytes (the format's version).
const MAGIC: &[u8] = b"recipe-kernels 1\n";

/// Turns the cache on, in `dir` (created on first write). Once per process; later calls are
/// ignored.
pub fn enable(dir: PathBuf) {
    let _ = DIR.set(dir);
}

/// What a compiled program depends on, as one text.
pub(crate) fn key(arch: &str, nvrtc: (i32, i32), options: &[String], program: &str) -> String {
    format!(
        "arch {arch}\nnvrtc {}.{}\noptions {}\n{program}",
        nvrtc.0,
        nvrtc.1,
        options.join(" ")
    )
}

fn entry_path(dir: &Path, arch: &str, key: &str) -> PathBuf {
    let hash = Sha256::digest(key.as_bytes());
    let hex: String = hash[..16].iter().map(|b| format!("{b:02x}")).collect();
    dir.join(format!("{arch}-{hex}.bin"))
}

/// The cached program for `key`, when the cache is on and holds it.
pub(crate) fn get(arch: &str, key: &str) -> Option<Compiled> {
    get_in(DIR.get()?, arch, key)
}

/// Remembers `c`, compiled for `key`, when the cache is on.
pub(crate) fn put(c: &Compiled, key: &str) {
    if let Some(dir) = DIR.get() {
        put_in(dir, c, key);
    }
}

fn get_in(dir: &Path, arch: &str, key: &str) -> Option<Compiled> {
    let bytes = std::fs::read(entry_path(dir, arch, key)).ok()?;
    let mut rest = bytes.strip_prefix(MAGIC)?;
    let mut field = || -> Option<&[u8]> {
        let (len, tail) = rest.split_first_chunk::<8>()?;
        let len = usize::try_from(u64::from_le_bytes(*len)).ok()?;
        if tail.len() < len {
            return None;
        }
        let (f, tail) = tail.split_at(len);
        rest = tail;
        Some(f)
    };
    let (k, ptx, cubin, log) = (field()?, field()?, field()?, field()?);
    if k != key.as_bytes() || cubin.is_empty() {
        return None;
    }
    Some(Compiled {
        arch: arch.to_string(),
        ptx: String::from_utf8(ptx.to_vec()).ok()?,
        cubin: cubin.to_vec(),
        log: String::from_utf8(log.to_vec()).ok()?,
    })
}

fn put_in(dir: &Path, c: &Compiled, key: &str) {
    let mut bytes = MAGIC.to_vec();
    for f in [key.as_bytes(), c.ptx.as_bytes(), &c.cubin, c.log.as_bytes()] {
        bytes.extend_from_slice(&(f.len() as u64).to_le_bytes());
        bytes.extend_from_slice(f);
    }
    put_file(dir, &entry_path(dir, &c.arch, key), &bytes);
}

/// Writes `bytes` to `target` in `dir` (created if missing) through a temporary file renamed
/// into place, best effort: a cache file that cannot be written costs the next run the work
/// it would have saved. The GEMM choices' book is written so too (`super::gemm_choice`).
pub(super) fn put_file(dir: &Path, target: &Path, bytes: &[u8]) {
    if std::fs::create_dir_all(dir).is_err() {
        return;
    }
    let tmp = target.with_extension(format!("tmp-{}", std::process::id()));
    if std::fs::write(&tmp, bytes).is_err() || std::fs::rename(&tmp, target).is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn program(arch: &str) -> Compiled {
        Compiled {
            arch: arch.into(),
            ptx: ".version 9.0\n// kernels".into(),
            cubin: vec![0x7f, b'E', b'L', b'F', 0, 1, 2, 3],
            log: String::new(),
        }
    }

    #[test]
    fn an_entry_comes_back_for_its_key_only() {
        let dir = tempfile::tempdir().unwrap();
        let opts = vec!["--gpu-architecture=sm_90".to_string()];
        let k = key(
            "sm_90",
            (13, 0),
            &opts,
            "extern \"C\" __global__ void f() {}",
        );
        assert!(get_in(dir.path(), "sm_90", &k).is_none(), "empty cache");
        put_in(dir.path(), &program("sm_90"), &k);
        let got = get_in(dir.path(), "sm_90", &k).expect("the entry just written");
        assert_eq!(got.cubin, program("sm_90").cubin);
        assert_eq!(got.ptx, program("sm_90").ptx);
        // Anything the program depends on changed: a miss.
        for other in [
            key(
                "sm_90",
                (13, 0),
                &opts,
                "extern \"C\" __global__ void g() {}",
            ),
            key(
                "sm_90",
                (13, 1),
                &opts,
                "extern \"C\" __global__ void f() {}",
            ),
            key("sm_90", (13, 0), &[], "extern \"C\" __global__ void f() {}"),
        ] {
            assert!(get_in(dir.path(), "sm_90", &other).is_none());
        }
        assert!(
            get_in(dir.path(), "sm_80", &k).is_none(),
            "another architecture"
        );
        // No temporary file is left behind.
        let names: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        assert_eq!(names.len(), 1, "{names:?}");
        assert!(names[0].starts_with("sm_90-") && names[0].ends_with(".bin"));
    }

    #[test]
    fn a_damaged_entry_is_a_miss() {
        let dir = tempfile::tempdir().unwrap();
        let k = key("sm_80", (13, 0), &[], "program");
        put_in(dir.path(), &program("sm_80"), &k);
        let path = entry_path(dir.path(), "sm_80", &k);
        let whole = std::fs::read(&path).unwrap();
        for cut in [0, MAGIC.len(), MAGIC.len() + 5, whole.len() - 1] {
            std::fs::write(&path, &whole[..cut]).unwrap();
            assert!(get_in(dir.path(), "sm_80", &k).is_none(), "cut at {cut}");
        }
        // A file of another key under this key's name (a hash collision): a miss.
        let other = key("sm_80", (13, 0), &[], "another program");
        put_in(dir.path(), &program("sm_80"), &other);
        std::fs::rename(entry_path(dir.path(), "sm_80", &other), &path).unwrap();
        assert!(get_in(dir.path(), "sm_80", &k).is_none());
    }
}
