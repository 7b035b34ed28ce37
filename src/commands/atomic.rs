//! Writing files so that a reader never sees half of one: write a temporary file next to the
//! target, flush it to disk, then rename it over the target.

use std::fs;
use std::io::{self, Write};
use std::path::Path;

/// Replaces `path` with `contents` atomically (same directory, then rename).
pub fn write(path: &Path, contents: &[u8]) -> io::Result<()> {
    write_with(path, |f| f.write_all(contents))
}

/// Replaces `path` atomically with what `fill` writes (a file too large to hold in memory):
/// into a temporary file in the same directory, removed if `fill` fails, renamed at the end.
pub fn write_with(
    path: &Path,
    fill: impl FnOnce(&mut fs::File) -> io::Result<()>,
) -> io::Result<()> {
    let dir = path
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let name = path
        .file_name()
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "not a file path"))?;
    let tmp = dir.join(format!(
        ".{}.tmp-{}",
        name.to_string_lossy(),
        std::process::id()
    ));
    let result = (|| {
        let mut f = fs::File::create(&tmp)?;
        fill(&mut f)?;
        f.sync_all()?;
        if let Ok(meta) = fs::metadata(path) {
            fs::set_permissions(&tmp, meta.permissions())?;
        }
        fs::rename(&tmp, path)
    })();
    if result.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    result
}

#[cfg(test)]
mod tests {
    #[test]
    fn replaces_contents_and_leaves_no_temporary() {
        let dir = std::env::temp_dir().join(format!("recipe-atomic-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("a.rcp");
        std::fs::write(&path, "old").unwrap();
        super::write(&path, b"new").unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "new");
        let names: Vec<_> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names.len(), 1);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
