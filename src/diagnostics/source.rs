//! A source file: its name as given and its text.

use std::path::Path;

/// Why a recipe could not be read.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    /// The file could not be opened or read.
    #[error("cannot read `{name}`: {source}")]
    Io {
        /// The path as given.
        name: String,
        /// The underlying error.
        source: std::io::Error,
    },
    /// The bytes are not UTF-8.
    #[error("`{name}` is not UTF-8 text (invalid byte at offset {offset})")]
    NotUtf8 {
        /// The path as given.
        name: String,
        /// Byte offset of the first invalid byte.
        offset: usize,
    },
}

/// A recipe's text and the name to show for it.
#[derive(Debug, Clone)]
pub struct SourceFile {
    /// The path as the user gave it (or `<stdin>`).
    pub name: String,
    /// The whole text.
    pub text: String,
    line_starts: Vec<usize>,
}

impl SourceFile {
    /// Wraps a text.
    pub fn new(name: impl Into<String>, text: impl Into<String>) -> Self {
        let text = text.into();
        let line_starts = std::iter::once(0)
            .chain(text.match_indices('\n').map(|(i, _)| i + 1))
            .collect();
        SourceFile {
            name: name.into(),
            text,
            line_starts,
        }
    }

    /// Reads a file; `-` reads standard input (named `<stdin>`).
    pub fn read(path: &Path) -> Result<SourceFile, ReadError> {
        let (name, bytes) = if path.as_os_str() == "-" {
            let mut buf = Vec::new();
            let name = "<stdin>".to_string();
            match std::io::Read::read_to_end(&mut std::io::stdin(), &mut buf) {
                Ok(_) => (name, buf),
                Err(source) => return Err(ReadError::Io { name, source }),
            }
        } else {
            let name = path.display().to_string();
            match std::fs::read(path) {
                Ok(bytes) => (name, bytes),
                Err(source) => return Err(ReadError::Io { name, source }),
            }
        };
        match String::from_utf8(bytes) {
            Ok(text) => Ok(SourceFile::new(name, text)),
            Err(e) => Err(ReadError::NotUtf8 {
                name,
                offset: e.utf8_error().valid_up_to(),
            }),
        }
    }

    /// 1-based line and column (in characters) of a byte offset; offsets past the end clamp.
    pub fn line_col(&self, offset: usize) -> (usize, usize) {
        let offset = offset.min(self.text.len());
        let line = self.line_starts.partition_point(|&s| s <= offset) - 1;
        let start = self.line_starts[line];
        let column = self
            .text
            .get(start..offset)
            .map_or(offset - start, |s| s.chars().count());
        (line + 1, column + 1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn line_col_counts_characters_from_one() {
        let f = SourceFile::new("x", "ab\nçd\n");
        assert_eq!(f.line_col(0), (1, 1));
        assert_eq!(f.line_col(2), (1, 3));
        assert_eq!(f.line_col(3), (2, 1));
        assert_eq!(f.line_col(5), (2, 2)); // after the two-byte ç
        assert_eq!(f.line_col(7), (3, 1));
        assert_eq!(f.line_col(99), (3, 1));
    }
}
