//! What the compiler's checker ([`super::scan`]) and the runtime's reader ([`super::read`]) must
//! agree on, written once: which format a file is in, which lines are blank, and how a CSV/TSV
//! file is cut into records (quoted fields may hold newlines, the file may start with a byte
//! order mark and end its lines with CRLF) and which line each record starts on.
//!
//! Both read CSV/TSV with the `csv` crate configured by [`csv_reader`], so a file has one row
//! count: the one `recipe explain` predicts steps from is the one `recipe run` trains on.

use std::collections::VecDeque;
use std::io::Read;
use std::path::Path;

use serde::{Deserialize, Serialize};

use super::DataError;

/// The layout of a data file: the recipe's `data.format` words.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Format {
    /// Decided by the extension: `.jsonl`/`.json` → JSONL, `.csv` → CSV, `.tsv` → TSV.
    Auto,
    /// One JSON object per line (HF `datasets` reads `.json` files the same way), or a file that
    /// is one JSON array of them (`[` first: [`super::scan::is_json_array`]).
    Jsonl,
    /// Comma-separated with a header row; RFC 4180 quoting.
    Csv,
    /// Tab-separated with a header row; quoting as for CSV (what pandas writes and reads).
    Tsv,
}

impl Format {
    /// The format a `data.format` word names.
    pub fn from_word(word: &str) -> Option<Format> {
        match word {
            "auto" => Some(Format::Auto),
            "jsonl" => Some(Format::Jsonl),
            "csv" => Some(Format::Csv),
            "tsv" => Some(Format::Tsv),
            _ => None,
        }
    }

    /// The format a file's extension names, when it names one (never `Auto`). The one
    /// extension table of the project.
    pub fn from_extension(path: impl AsRef<Path>) -> Option<Format> {
        let ext = path.as_ref().extension()?.to_str()?.to_ascii_lowercase();
        match ext.as_str() {
            "jsonl" | "json" => Some(Format::Jsonl),
            "csv" => Some(Format::Csv),
            "tsv" => Some(Format::Tsv),
            _ => None,
        }
    }

    /// The concrete format for `path`: itself, or for `Auto` the one its extension names.
    pub fn resolve(self, path: &Path) -> Result<Format, DataError> {
        match self {
            Format::Auto => Format::from_extension(path).ok_or_else(|| DataError::UnknownFormat {
                path: path.to_path_buf(),
            }),
            concrete => Ok(concrete),
        }
    }

    /// The word for it.
    pub fn name(self) -> &'static str {
        match self {
            Format::Auto => "auto",
            Format::Jsonl => "jsonl",
            Format::Csv => "csv",
            Format::Tsv => "tsv",
        }
    }

    /// Whether the first row names the columns.
    pub fn has_header(self) -> bool {
        matches!(self, Format::Csv | Format::Tsv)
    }

    /// The field separator of a delimited format.
    pub fn delimiter(self) -> u8 {
        if self == Format::Tsv {
            b'\t'
        } else {
            b','
        }
    }
}

/// The UTF-8 byte order mark some editors put at the start of a file.
pub const BOM: &[u8] = b"\xEF\xBB\xBF";

/// A JSONL line that holds no row: only ASCII whitespace (JSON's own whitespace, plus what
/// editors leave). Both the row count and the reader skip exactly these.
pub fn is_blank(line: &[u8]) -> bool {
    line.iter().all(u8::is_ascii_whitespace)
}

/// A CSV/TSV reader over `inner` as both sides read it: a header row, RFC 4180 quoting (a
/// quoted field may hold delimiters, `""` and newlines), `\n`, `\r\n` or `\r` line ends, empty
/// lines skipped, a leading byte order mark dropped (csv-core does both; lines of spaces and
/// tabs are left to [`is_blank_record`]). `flexible` lets a row
/// with another number of fields than the header through (the checker reports it and reads
/// on; the runtime stops at it).
pub fn csv_reader<R: Read>(
    format: Format,
    inner: R,
    flexible: bool,
) -> csv::Reader<LineTracker<R>> {
    csv::ReaderBuilder::new()
        .delimiter(format.delimiter())
        .has_headers(true)
        .flexible(flexible)
        .buffer_capacity(64 * 1024)
        .from_reader(LineTracker::new(inner))
}

/// A CSV/TSV line of spaces and tabs only, which the csv crate reads as a record of one field
/// and pandas (HF `datasets`' CSV loader) skips as a blank line: both sides skip it too.
pub fn is_blank_record(record: &csv::ByteRecord) -> bool {
    record.len() == 1 && record[0].iter().all(|b| matches!(b, b' ' | b'\t'))
}

/// Whether every field of a record is UTF-8, as the reader's `StringRecord` requires: field by
/// field, since the bytes of two fields may be UTF-8 only together (a character split by a
/// delimiter).
pub fn is_utf8_record(record: &csv::ByteRecord) -> bool {
    record.is_empty()
        || record.as_slice().is_ascii()
        || record.iter().all(|f| std::str::from_utf8(f).is_ok())
}

/// A CSV/TSV record that is not UTF-8: the message both sides show.
pub const NOT_UTF8: &str = "the row is not valid UTF-8";

/// The fields of a record against the header's: the message both sides show.
pub fn ragged_message(fields: usize, header: usize) -> String {
    format!("the row has {fields} fields but the header has {header}")
}

/// Passes a file's bytes through to the csv reader and notes where its line breaks are, so that
/// a record's byte offset can be turned into the line it starts on. The csv crate's own
/// `Position::line` is taken at the byte after the previous record's terminator, which in a
/// CRLF file is the `\n` still on the previous line (one line early), and before any empty
/// lines it skips. Queries must come in file order (records do); breaks already passed are
/// forgotten, so memory stays bounded by the reader's look-ahead.
pub struct LineTracker<R> {
    inner: R,
    /// Bytes read so far.
    offset: u64,
    /// Line breaks read but not yet passed by a query: (offset, `\n` or `\r`).
    pending: VecDeque<(u64, u8)>,
    /// 1 + the `\n`s before the last query's position.
    line: usize,
}

impl<R> LineTracker<R> {
    fn new(inner: R) -> Self {
        LineTracker {
            inner,
            offset: 0,
            pending: VecDeque::new(),
            line: 1,
        }
    }

    /// The 1-based line of the first byte at or after `byte` that is not a line break.
    pub fn line_at(&mut self, byte: u64) -> usize {
        let mut at = byte;
        while let Some(&(offset, b)) = self.pending.front() {
            if offset > at {
                break;
            }
            if offset == at {
                at += 1; // a break at the position: the record starts after it
            }
            if b == b'\n' {
                self.line += 1;
            }
            self.pending.pop_front();
        }
        self.line
    }
}

impl<R: Read> Read for LineTracker<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        for i in memchr::memchr2_iter(b'\n', b'\r', &buf[..n]) {
            self.pending.push_back((self.offset + i as u64, buf[i]));
        }
        self.offset += n as u64;
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn words_and_extensions() {
        assert_eq!(Format::from_extension("a/b.JSONL"), Some(Format::Jsonl));
        assert_eq!(Format::from_extension("b.json"), Some(Format::Jsonl));
        assert_eq!(Format::from_extension("b.tsv"), Some(Format::Tsv));
        assert_eq!(Format::from_extension("b.txt"), None);
        assert_eq!(Format::from_extension("noext"), None);
        for f in [Format::Auto, Format::Jsonl, Format::Csv, Format::Tsv] {
            assert_eq!(Format::from_word(f.name()), Some(f));
        }
        assert_eq!(Format::from_word("parquet"), None);
    }

    /// Record start lines through a tracker, as the reader and the scan take them.
    fn record_lines(text: &str) -> Vec<(usize, Vec<String>)> {
        let mut rdr = csv_reader(Format::Csv, text.as_bytes(), true);
        let mut out = Vec::new();
        let mut rec = csv::StringRecord::new();
        let h = rdr.headers().unwrap().clone();
        let hl = rdr.get_mut().line_at(h.position().unwrap().byte());
        out.push((hl, h.iter().map(String::from).collect()));
        while rdr.read_record(&mut rec).unwrap() {
            let line = rdr.get_mut().line_at(rec.position().unwrap().byte());
            out.push((line, rec.iter().map(String::from).collect()));
        }
        out
    }

    #[test]
    fn records_start_where_their_first_byte_is() {
        let text = "\u{feff}text,label\r\n\r\n\"a\r\nb\",1\r\n\n\nc,0\r\"d\"\"\",1";
        let got = record_lines(text);
        let lines: Vec<usize> = got.iter().map(|r| r.0).collect();
        // `\r` alone ends a record too, but only `\n` starts a line.
        assert_eq!(lines, [1, 3, 7, 7]);
        assert_eq!(got[0].1, ["text", "label"]);
        assert_eq!(got[1].1, ["a\r\nb", "1"]);
        assert_eq!(got[3].1, ["d\"", "1"]);
    }
}
