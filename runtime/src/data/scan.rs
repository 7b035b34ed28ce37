//! The checker's one pass over a data file: rows counted, each row's structure and the named
//! fields checked, the distinct labels collected, without building the examples. The compiler
//! counts `data.samples` with it and its data rules report what it finds; the runtime's
//! [`super::read`] reads the same rows (same blank lines, same CSV records, same line numbers:
//! [`super::format`]), so the count the plan is built for is the count training finds.
//!
//! JSONL rows are walked in the same pass that finds their line ends (a string cannot hold a
//! raw newline), so each byte is looked at about once, and the walk validates each row as the
//! reader's `serde_json::Value` reads it (strings, escapes, numbers, nesting; see
//! [`walk_object`]) without building anything: string contents go eight bytes at a time
//! ([`plain_run`]), the 4.8 MB of the repository's SpamAssassin split in about 2 ms on one
//! thread. Large JSONL files are scanned in parts on several threads where there are CPUs to
//! spare ([`scan_file`]). CSV/TSV files are read with the csv crate as the runtime reads them
//! (a quoted field may span lines, so a line is not a row); they cannot be cut into parts
//! without reading them, and are scanned on one thread.

use std::path::Path;

use super::format::{self, Format};

/// What a scan looks for.
#[derive(Debug, Clone, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub struct ScanSpec {
    /// How to read the rows (`Auto` reads as JSONL: resolve it against the file first).
    pub format: Format,
    /// The fields every row must have (text, text_pair, label).
    pub fields: Vec<String>,
    /// Which of `fields` holds the label (its distinct values are collected).
    pub label: Option<usize>,
}

/// A label value as the data holds it.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub enum LabelValue {
    /// A JSON integer, or a CSV/TSV cell that is one (as the runtime's `LabelSet` reads it).
    Int(i64),
    /// A JSON string, or any other non-empty CSV/TSV cell.
    Str(String),
    /// JSONL: anything else (a float, a boolean, an object …), as written (shortened).
    Other(String),
}

/// One distinct label value.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct LabelSeen {
    /// The value.
    pub value: LabelValue,
    /// The 1-based line where it first appears.
    pub first_line: u64,
    /// How many rows hold it.
    pub rows: u64,
}

/// A field some rows lack.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct MissingField {
    /// The field.
    pub field: String,
    /// The first line lacking it (for CSV/TSV: the header line).
    pub first_line: u64,
    /// Rows lacking it or holding `null` (CSV/TSV: an empty label cell); 0 when the CSV/TSV
    /// header lacks the column.
    pub rows: u64,
}

/// A text field some JSONL rows hold as something other than a string (the runtime's reader
/// stops at such a row; a null is missing, [`MissingField`]).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct NotText {
    /// The field.
    pub field: String,
    /// The first line where it is not a string.
    pub first_line: u64,
    /// What it is there, in the reader's words: `a number`, `a boolean`, `an array`, `an object`.
    pub found: String,
    /// Rows where it is not a string (nor null).
    pub rows: u64,
}

/// What a scan found.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct DataScan {
    /// Rows: JSONL non-blank lines; CSV/TSV records after the header (a quoted field may span
    /// lines). What the runtime's reader yields for a clean file.
    pub rows: u64,
    /// CSV/TSV: the header line and its column names.
    pub header: Option<(u64, Vec<String>)>,
    /// Rows the reader would stop at: JSONL lines that are not a JSON object, CSV/TSV records
    /// whose field count differs from the header's or that are not UTF-8.
    pub bad_rows: u64,
    /// The first such row's line and what is wrong (never cached: the compiler's cache keeps
    /// clean scans only).
    #[serde(skip)]
    pub first_bad: Option<(u64, String)>,
    /// JSONL: the top-level fields of the first object row, for suggestions.
    pub first_fields: Vec<String>,
    /// Wanted fields that some rows lack, in [`ScanSpec::fields`] order.
    pub missing: Vec<MissingField>,
    /// JSONL: text fields (the wanted fields but the label) that some rows hold as something
    /// other than a string, in [`ScanSpec::fields`] order.
    pub not_text: Vec<NotText>,
    /// Distinct label values in order of first appearance.
    pub labels: Vec<LabelSeen>,
    /// More than [`MAX_LABELS`] distinct labels: the rest were not collected.
    pub labels_truncated: bool,
    /// A JSON array file that HF `datasets` reads as a list of strings ([`array_of_strings`]):
    /// each element is the row `{"text": element}`.
    #[serde(default)]
    pub strings_array: bool,
}

/// Distinct label values collected at most (more than any classification task declares).
pub const MAX_LABELS: usize = 100_000;

/// Scans rows from any reader (no memo).
pub fn scan_reader(reader: impl std::io::Read, spec: &ScanSpec) -> std::io::Result<DataScan> {
    let mut state = ScanState::new(spec, true);
    if spec.format.has_header() {
        state.delimited(reader)?;
    } else {
        state.jsonl(reader)?;
    }
    Ok(state.finish())
}

/// The rows of a file's bytes, as [`DataScan::rows`] counts them.
pub fn count_rows(bytes: &[u8], format: Format) -> u64 {
    let spec = ScanSpec {
        format,
        fields: Vec::new(),
        label: None,
    };
    scan_reader(bytes, &spec).map_or(0, |s| s.rows)
}

/// Bytes of JSONL a thread scans at least: below this, starting a thread costs more than it saves.
const PART_BYTES: u64 = 256 * 1024;

/// Threads a scan uses at most.
const MAX_PARTS: u64 = 8;

/// Scans a file: a JSONL file large enough, on a machine with more than two CPUs, is cut at
/// line starts into parts scanned on separate threads and merged in order, with exactly the result of [`scan_reader`] (the same
/// counts, the same first lines, the labels in the same order); anything else is scanned on
/// this thread.
pub fn scan_file(path: &Path, len: u64, spec: &ScanSpec) -> std::io::Result<DataScan> {
    // One CPU is left to the rest of the machine: on a busy 2-CPU machine a second thread
    // waits for a CPU and the scan ends later than on one thread (measured: a median of
    // 2.5-3.3 ms against 1.6-2.5 ms for cls.rcp's two files at load 2.7).
    let mut parts = if !spec.format.has_header() {
        (len / PART_BYTES)
            .min(MAX_PARTS)
            .min(cpus().saturating_sub(1))
    } else {
        1
    };
    if parts > 1 {
        // An array file is one value: it is read whole.
        use std::io::Read;
        let mut head = Vec::with_capacity(4);
        std::fs::File::open(path)?.take(4).read_to_end(&mut head)?;
        if is_json_array(&head) {
            parts = 1;
        }
    }
    scan_in_parts(path, len, spec, parts)
}

/// [`scan_file`] with `parts` parts (1: this thread only).
fn scan_in_parts(path: &Path, len: u64, spec: &ScanSpec, parts: u64) -> std::io::Result<DataScan> {
    if parts < 2 {
        return scan_reader(std::fs::File::open(path)?, spec);
    }
    let cuts = line_cuts(path, len, parts)?;
    let scan_part = |k: usize| -> std::io::Result<ScanState<'_>> {
        use std::io::{Read, Seek};
        let (start, end) = (cuts[k], cuts[k + 1]);
        let mut file = std::fs::File::open(path)?;
        file.seek(std::io::SeekFrom::Start(start))?;
        let mut state = ScanState::new(spec, k == 0);
        state.jsonl(file.take(end - start))?;
        Ok(state)
    };
    let states: Vec<std::io::Result<ScanState<'_>>> = std::thread::scope(|s| {
        let others: Vec<_> = (1..cuts.len() - 1)
            .map(|k| s.spawn(move || scan_part(k)))
            .collect();
        let mut states = vec![scan_part(0)];
        for h in others {
            states.push(h.join().unwrap_or_else(|e| std::panic::resume_unwind(e)));
        }
        states
    });
    let mut states = states.into_iter();
    let mut all = states.next().expect("one part at least")?;
    for state in states {
        let state = state?;
        if state.scan.labels_truncated {
            // Which labels a part kept depends on the rows before it: read the file in order.
            return scan_reader(std::fs::File::open(path)?, spec);
        }
        all.append(state);
    }
    Ok(all.finish())
}

/// The CPUs this process may use (read once).
fn cpus() -> u64 {
    static CPUS: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    *CPUS.get_or_init(|| std::thread::available_parallelism().map_or(1, |n| n.get() as u64))
}

/// `parts + 1` offsets cutting a file of `len` bytes into parts that each start at a line's
/// start (the first at 0, the last ending at `len`); a part may be empty.
fn line_cuts(path: &Path, len: u64, parts: u64) -> std::io::Result<Vec<u64>> {
    use std::io::{Read, Seek};
    let mut file = std::fs::File::open(path)?;
    let mut cuts = vec![0];
    let mut buf = vec![0u8; 4096];
    for k in 1..parts {
        // The first line start at or after the even cut: just after the first newline at or
        // after the byte before it.
        let mut at = (len * k / parts).max(*cuts.last().expect("a cut")).max(1) - 1;
        file.seek(std::io::SeekFrom::Start(at))?;
        let cut = loop {
            let n = match file.read(&mut buf) {
                Ok(n) => n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            };
            if n == 0 {
                break len; // no line starts after the cut: an empty part
            }
            if let Some(i) = find_byte(&buf[..n], b'\n') {
                break (at + i as u64 + 1).min(len);
            }
            at += n as u64;
        };
        cuts.push(cut.max(*cuts.last().expect("a cut")));
    }
    cuts.push(len);
    Ok(cuts)
}

/// Fills `buf[*len..]` from `reader`; false at the end of the input.
fn refill(
    reader: &mut impl std::io::Read,
    buf: &mut Vec<u8>,
    len: &mut usize,
) -> std::io::Result<bool> {
    if *len == buf.len() {
        buf.resize(buf.len() * 2, 0); // a line longer than the buffer
    }
    loop {
        match reader.read(&mut buf[*len..]) {
            Ok(n) => {
                *len += n;
                return Ok(n > 0);
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
}

/// The read size.
const CHUNK: usize = 64 * 1024;

/// The first `a` in `hay` (SIMD, through `memchr`).
#[inline]
fn find_byte(hay: &[u8], a: u8) -> Option<usize> {
    memchr::memchr(a, hay)
}

/// The first `"`, `\\` or newline in `hay` (the bytes that end a run of string content; SIMD,
/// through `memchr`).
#[inline]
fn find_string_stop(hay: &[u8]) -> Option<usize> {
    memchr::memchr3(b'"', b'\\', b'\n', hay)
}

struct ScanState<'a> {
    spec: &'a ScanSpec,
    /// Whether the input starts at the start of the file (a byte order mark may open it).
    file_start: bool,
    scan: DataScan,
    /// Rows: JSONL non-blank lines, CSV/TSV records after the header.
    lines: u64,
    /// JSONL: all lines, blank ones too (the line numbers used).
    line_no: u64,
    have_first: bool,
    missing: Vec<(u64, u64)>, // per field: first line, rows
    /// Per field: the first line where a text is not a string, what it is there, and rows.
    not_text: Vec<(u64, &'static str, u64)>,
    /// CSV/TSV: per field, whether the header lacks it.
    header_missing: Vec<bool>,
    label_index: std::collections::HashMap<Vec<u8>, usize>,
    label_raw: Vec<Vec<u8>>, // the raw values of `scan.labels`, for a quick look-up of a few
}

impl<'a> ScanState<'a> {
    fn new(spec: &'a ScanSpec, file_start: bool) -> Self {
        ScanState {
            spec,
            file_start,
            scan: DataScan::default(),
            lines: 0,
            line_no: 0,
            have_first: false,
            missing: vec![(0, 0); spec.fields.len()],
            not_text: vec![(0, "", 0); spec.fields.len()],
            header_missing: Vec::new(),
            label_index: std::collections::HashMap::new(),
            label_raw: Vec::new(),
        }
    }

    /// Reads CSV/TSV records as the runtime does ([`format::csv_reader`]), but lets a ragged
    /// row through to count and report it, as a JSONL line that is not an object is.
    fn delimited(&mut self, reader: impl std::io::Read) -> std::io::Result<()> {
        let mut rdr = format::csv_reader(self.spec.format, reader, true);
        let header = rdr.byte_headers()?.clone();
        if header.is_empty() {
            return Ok(()); // no header: an empty file, no rows and nothing to check
        }
        let header_line = header
            .position()
            .map_or(1, |p| rdr.get_mut().line_at(p.byte()) as u64);
        if !format::is_utf8_record(&header) {
            // The reader stops at such a header (data::read): its columns cannot be told.
            self.bad(header_line, format::NOT_UTF8.to_string());
            return Ok(());
        }
        let columns: Vec<String> = header
            .iter()
            .map(|c| String::from_utf8_lossy(c).into_owned())
            .collect();
        // Where each wanted field is: a column of the header (matched exactly, as the reader
        // matches it), or none (reported once, at the header line).
        let at: Vec<Option<usize>> = self
            .spec
            .fields
            .iter()
            .map(|f| columns.iter().position(|c| c == f))
            .collect();
        for (i, col) in at.iter().enumerate() {
            if col.is_none() {
                self.missing[i] = (header_line, 0);
            }
        }
        self.header_missing = at.iter().map(Option::is_none).collect();
        self.scan.header = Some((header_line, columns));
        let mut record = csv::ByteRecord::new();
        while rdr.read_byte_record(&mut record)? {
            if format::is_blank_record(&record) {
                continue;
            }
            self.lines += 1;
            let n = record
                .position()
                .map_or(0, |p| rdr.get_mut().line_at(p.byte()) as u64);
            let what = if record.len() != header.len() {
                Some(format::ragged_message(record.len(), header.len()))
            } else if !format::is_utf8_record(&record) {
                Some(format::NOT_UTF8.to_string())
            } else {
                None
            };
            if let Some(what) = what {
                self.bad(n, what);
                continue;
            }
            let mut row = Row::default();
            for (i, col) in at.iter().enumerate() {
                let Some(cell) = col.and_then(|c| record.get(c)) else {
                    continue;
                };
                // An empty label cell is what pandas reads as NaN: the JSONL `null`. An empty
                // text is a text (the runtime tokenizes it).
                if Some(i) == self.spec.label {
                    if !cell.is_empty() {
                        row.present |= 1 << i;
                        row.label = Some(cell);
                    }
                } else {
                    row.present |= 1 << i;
                }
            }
            for (i, missing) in self.header_missing.iter().enumerate() {
                if *missing {
                    row.present |= 1 << i; // reported at the header, not per row
                }
            }
            self.record(n, row);
        }
        Ok(())
    }

    /// Counts a row the reader would stop at.
    fn bad(&mut self, n: u64, what: String) {
        self.scan.bad_rows += 1;
        if self.scan.first_bad.is_none() {
            self.scan.first_bad = Some((n, what));
        }
    }

    /// Reads JSONL rows: each row is walked from its first byte, and the walk finds where its
    /// line ends; only a row that fails is looked at again, as a whole line.
    fn jsonl(&mut self, mut reader: impl std::io::Read) -> std::io::Result<()> {
        let mut buf = vec![0u8; CHUNK];
        let (mut len, mut line_no, mut more) = (0, 0u64, true);
        if self.file_start {
            // One JSON array rather than lines? The first byte after a BOM says.
            while more && len <= format::BOM.len() {
                more = refill(&mut reader, &mut buf, &mut len)?;
            }
            if is_json_array(&buf[..len]) {
                buf.truncate(len);
                reader.read_to_end(&mut buf)?;
                self.json_array(&buf);
                return Ok(());
            }
        }
        let mut refilled = false;
        while more || !refilled {
            if more {
                more = refill(&mut reader, &mut buf, &mut len)?;
            }
            refilled = true;
            let mut start = 0;
            while start < len {
                let Some(used) = self.json_line(line_no + 1, &buf[start..len], !more) else {
                    break; // the line goes on past what is read
                };
                line_no += 1;
                start += used;
            }
            buf.copy_within(start..len, 0);
            len -= start;
        }
        self.line_no = line_no;
        Ok(())
    }

    /// Reads a JSON array file's elements as rows ([`array_elements`]): each must be an object,
    /// as a JSONL line must; in a list of strings ([`array_of_strings`]) each element is the
    /// value of the row's one field, `text`.
    fn json_array(&mut self, bytes: &[u8]) {
        let strings = array_of_strings(bytes);
        self.scan.strings_array = strings;
        let fault = array_elements(bytes, |n, flat, at| {
            self.lines += 1;
            if strings {
                let row = self.string_row(flat);
                return self.record(n, row);
            }
            match self.walk_row(flat) {
                Ok((_, row)) => self.record(n, row),
                Err(fault) => self.bad(n, fault_message(&bytes[at], fault)),
            }
        });
        if let Err((n, what)) = fault {
            self.lines += 1;
            self.bad(n, what);
        }
    }

    /// Adds the scan of the input that follows this one's (its line numbers count from the
    /// end of this one's): as if one state had read both.
    fn append(&mut self, next: ScanState<'_>) {
        let offset = self.line_no;
        self.line_no += next.line_no;
        self.lines += next.lines;
        if !self.have_first && next.have_first {
            self.have_first = true;
            self.scan.first_fields = next.scan.first_fields;
        }
        self.scan.bad_rows += next.scan.bad_rows;
        if self.scan.first_bad.is_none() {
            self.scan.first_bad = next.scan.first_bad.map(|(n, what)| (n + offset, what));
        }
        for (m, (first_line, rows)) in self.missing.iter_mut().zip(next.missing) {
            if rows > 0 {
                if m.1 == 0 {
                    m.0 = first_line + offset;
                }
                m.1 += rows;
            }
        }
        for (t, (first_line, found, rows)) in self.not_text.iter_mut().zip(next.not_text) {
            if rows > 0 {
                if t.2 == 0 {
                    (t.0, t.1) = (first_line + offset, found);
                }
                t.2 += rows;
            }
        }
        for (raw, seen) in next.label_raw.into_iter().zip(next.scan.labels) {
            if let Some(&i) = self.label_index.get(&raw) {
                self.scan.labels[i].rows += seen.rows;
            } else if self.scan.labels.len() < MAX_LABELS {
                self.label_index.insert(raw.clone(), self.scan.labels.len());
                self.label_raw.push(raw);
                self.scan.labels.push(LabelSeen {
                    first_line: seen.first_line + offset,
                    ..seen
                });
            } else {
                self.scan.labels_truncated = true;
            }
        }
        self.scan.labels_truncated |= next.scan.labels_truncated;
    }

    /// Takes the line at the start of `rest`; returns the bytes used (with the newline), or
    /// `None` when the line may go on past `rest` (more input follows unless `last`).
    fn json_line(&mut self, n: u64, rest: &[u8], last: bool) -> Option<usize> {
        let bom = if n == 1 && self.file_start && rest.starts_with(format::BOM) {
            format::BOM.len()
        } else {
            0
        };
        let b = &rest[bom..];
        match self.walk_row(b) {
            Ok((end, row)) if end < b.len() || last => {
                self.lines += 1;
                self.record(n, row);
                return Some(bom + (end + 1).min(b.len()));
            }
            Ok((end, _)) if end >= b.len() && !last => return None,
            _ => {}
        }
        // Blank, not an object, or cut off by the end of the buffer: find the line's end.
        let end = match find_byte(b, b'\n') {
            Some(end) => end,
            None if last => b.len(),
            None => return None,
        };
        let line = &b[..end];
        if !format::is_blank(line) {
            self.lines += 1;
            match self.walk_row(line) {
                Ok((_, row)) => self.record(n, row),
                Err(fault) => self.bad(n, fault_message(line, fault)),
            }
        }
        Some(bom + (end + 1).min(b.len()))
    }

    /// Walks one row; nothing is recorded yet (the caller may find the line incomplete).
    fn walk_row<'b>(&self, b: &'b [u8]) -> Result<(usize, Row<'b>), Fault> {
        let mut row = Row::default();
        let end = walk_object(b, |key, value| self.member(&mut row, key, value))?;
        Ok((end, row))
    }

    /// The row of a list of strings' element ([`array_of_strings`]): `{"text": element}`, the
    /// element valid JSON ([`array_elements`]).
    fn string_row<'b>(&self, element: &'b [u8]) -> Row<'b> {
        let mut row = Row::default();
        self.member(&mut row, STRINGS_FIELD.as_bytes(), element);
        row
    }

    /// Adds a row's top-level member (its raw key and value) to what the scan looks for.
    fn member<'b>(&self, row: &mut Row<'b>, key: &'b [u8], value: &'b [u8]) {
        if !self.have_first {
            row.keys.push(decode_key(key));
        }
        for (i, field) in self.spec.fields.iter().enumerate() {
            if key_is(key, field) {
                if value == b"null" {
                    row.present &= !(1 << i);
                } else {
                    row.present |= 1 << i;
                }
                // The last of duplicate keys counts, as in the reader's map.
                row.not_text &= !(1 << i);
                if i < MAX_FIELDS
                    && Some(i) != self.spec.label
                    && value[0] != b'"'
                    && value != b"null"
                {
                    row.not_text |= 1 << i;
                    row.found[i] = json_type(value[0]);
                }
                if Some(i) == self.spec.label {
                    row.label = (value != b"null").then_some(value);
                }
            }
        }
    }

    fn record(&mut self, n: u64, row: Row<'_>) {
        if !self.have_first {
            self.have_first = true;
            self.scan.first_fields = row.keys;
        }
        for (i, m) in self.missing.iter_mut().enumerate() {
            if row.present & (1 << i) == 0 {
                if m.1 == 0 {
                    m.0 = n;
                }
                m.1 += 1;
            }
        }
        if row.not_text != 0 {
            for (i, t) in self.not_text.iter_mut().enumerate() {
                if row.not_text & (1 << i) != 0 {
                    if t.2 == 0 {
                        (t.0, t.1) = (n, row.found[i]);
                    }
                    t.2 += 1;
                }
            }
        }
        let Some(raw) = row.label else {
            return;
        };
        let known = if self.label_raw.len() <= 16 {
            self.label_raw.iter().position(|r| r.as_slice() == raw)
        } else {
            self.label_index.get(raw).copied()
        };
        if let Some(i) = known {
            self.scan.labels[i].rows += 1;
        } else if self.scan.labels.len() < MAX_LABELS {
            self.label_index
                .insert(raw.to_vec(), self.scan.labels.len());
            self.label_raw.push(raw.to_vec());
            self.scan.labels.push(LabelSeen {
                value: if self.spec.format.has_header() {
                    cell_label(raw)
                } else {
                    label_value(raw)
                },
                first_line: n,
                rows: 1,
            });
        } else {
            self.scan.labels_truncated = true;
        }
    }

    fn finish(mut self) -> DataScan {
        self.scan.rows = self.lines;
        for (i, &(first_line, rows)) in self.missing.iter().enumerate() {
            if rows > 0 || self.header_missing.get(i) == Some(&true) {
                self.scan.missing.push(MissingField {
                    field: self.spec.fields[i].clone(),
                    first_line,
                    rows,
                });
            }
        }
        for (i, &(first_line, found, rows)) in self.not_text.iter().enumerate() {
            if rows > 0 {
                self.scan.not_text.push(NotText {
                    field: self.spec.fields[i].clone(),
                    first_line,
                    found: found.to_string(),
                    rows,
                });
            }
        }
        self.scan
    }
}

/// What a row holds of the wanted fields.
#[derive(Default)]
struct Row<'b> {
    /// Bit `i`: field `i` is there and not null (CSV/TSV: the label cell is not empty).
    present: u64,
    /// Bit `i`: field `i`, a text, is there and neither a string nor null (JSONL).
    not_text: u64,
    /// What each field flagged in `not_text` is.
    found: [&'static str; MAX_FIELDS],
    /// The label's raw value (JSON text, or the CSV/TSV cell), unless null or empty.
    label: Option<&'b [u8]>,
    /// The row's top-level keys (first row only, for suggestions).
    keys: Vec<String>,
}

/// Fields whose text type a scan checks at most (a recipe names three: text, text_pair, label).
const MAX_FIELDS: usize = 4;

/// A JSON value's type by its first byte, in the reader's words (data::read, `json_type`).
fn json_type(first: u8) -> &'static str {
    match first {
        b'{' => "an object",
        b'[' => "an array",
        b't' | b'f' => "a boolean",
        b'n' => "null",
        b'"' => "a string",
        _ => "a number",
    }
}

fn decode_key(raw: &[u8]) -> String {
    if raw.contains(&b'\\') {
        let quoted = [b"\"", raw, b"\""].concat();
        if let Ok(s) = serde_json::from_slice::<String>(&quoted) {
            return s;
        }
    }
    String::from_utf8_lossy(raw).into_owned()
}

fn key_is(raw: &[u8], field: &str) -> bool {
    raw == field.as_bytes() || (raw.contains(&b'\\') && decode_key(raw) == field)
}

fn label_value(raw: &[u8]) -> LabelValue {
    if raw.first() == Some(&b'"') {
        if let Ok(s) = serde_json::from_slice::<String>(raw) {
            return LabelValue::Str(s);
        }
    } else if let Some(i) = std::str::from_utf8(raw)
        .ok()
        .and_then(|s| s.parse::<i64>().ok())
    {
        return LabelValue::Int(i);
    }
    let text = String::from_utf8_lossy(raw);
    let short: String = text.chars().take(40).collect();
    LabelValue::Other(if short.len() < text.len() {
        format!("{short}…")
    } else {
        short
    })
}

/// A CSV/TSV label cell as the runtime's `LabelSet::id_of_str` takes it: an integer id, else a
/// name.
fn cell_label(raw: &[u8]) -> LabelValue {
    let text = String::from_utf8_lossy(raw);
    match text.parse::<i64>() {
        Ok(i) => LabelValue::Int(i),
        Err(_) => LabelValue::Str(text.into_owned()),
    }
}

/// Skips spaces within the line (a newline ends the row): JSON's whitespace but the newline.
fn skip_ws(b: &[u8], mut i: usize) -> usize {
    while i < b.len() && matches!(b[i], b' ' | b'\t' | b'\r') {
        i += 1;
    }
    i
}

/// Why the walk refused a line.
#[derive(Debug, Clone, Copy)]
enum Fault {
    /// JSON the reader parses, but not one object (an array, a string …): these words are the
    /// report.
    Shape(&'static str),
    /// Not JSON as the reader's `serde_json::Value` reads it: serde's own message is the report
    /// ([`fault_message`]), these words where serde has none.
    Syntax(&'static str),
}

use Fault::{Shape, Syntax};

const UNCLOSED: Fault = Syntax("a string is not closed on its line");

/// What is reported for a line the walk refused, in the reader's terms (data::read): bytes
/// that are not UTF-8 first, then serde_json's message for JSON it cannot read.
fn fault_message(line: &[u8], fault: Fault) -> String {
    let Ok(text) = std::str::from_utf8(line) else {
        return format::NOT_UTF8.to_string();
    };
    match fault {
        Shape(what) => what.to_string(),
        Syntax(what) => match serde_json::from_str::<serde_json::Value>(text) {
            Err(e) => format!("malformed JSON: {e}"),
            Ok(_) => format!("malformed JSON: {what}"),
        },
    }
}

/// `b[i]` is a `"`: the index after the closing quote (a string ends on its line). The content
/// is checked as serde_json reads it into a `String`: UTF-8, no control character, and valid
/// escapes ([`escape_end`]).
fn string_end(b: &[u8], i: usize) -> Result<usize, Fault> {
    let mut j = i + 1;
    loop {
        j += plain_run(&b[j..]);
        match b.get(j) {
            Some(b'"') => return Ok(j + 1),
            Some(b'\\') => j = escape_end(b, j)?,
            Some(&c) if c >= 0x80 => {
                // Text beyond ASCII: the rest of the run up to the next stop, as UTF-8.
                let k = j + find_string_stop(&b[j..]).ok_or(UNCLOSED)?;
                string_run(&b[j..k])?;
                j = k;
            }
            Some(b'\n') | None => return Err(UNCLOSED),
            Some(_) => return Err(CONTROL),
        }
    }
}

const CONTROL: Fault = Syntax("a control character in a string");

/// The length of the run of printable ASCII but `"` and `\\` at the start of `s`: the common
/// content of a string, looked at eight bytes at a time (one `u64`, bit tricks on its bytes).
#[inline]
fn plain_run(s: &[u8]) -> usize {
    const ONES: u64 = 0x0101_0101_0101_0101;
    const HIGH: u64 = 0x8080_8080_8080_8080;
    // The high bit of each byte that is zero (exact for the lowest such byte: a borrow only
    // flags bytes above a true one).
    let zero = |v: u64| v.wrapping_sub(ONES) & !v & HIGH;
    let mut i = 0;
    while let Some(word) = s.get(i..i + 8) {
        let x = u64::from_le_bytes(word.try_into().expect("eight bytes"));
        // Bytes below 0x20 borrow in the subtraction, bytes from 0x80 have their high bit.
        let stops = zero(x ^ (ONES * u64::from(b'"')))
            | zero(x ^ (ONES * u64::from(b'\\')))
            | ((x.wrapping_sub(ONES * 0x20) | x) & HIGH);
        if stops != 0 {
            return i + (stops.trailing_zeros() / 8) as usize;
        }
        i += 8;
    }
    let stop = |c: u8| c == b'"' || c == b'\\' || !(0x20..0x80).contains(&c);
    i + s[i..].iter().position(|&c| stop(c)).unwrap_or(s.len() - i)
}

/// Checks a run of string content between two stops (`"`, `\` and the newline are ASCII, so a
/// UTF-8 character is never cut by one): UTF-8 without the control characters U+0000–U+001F,
/// which JSON requires escaped.
fn string_run(run: &[u8]) -> Result<(), Fault> {
    // A fold rather than `any`: without the early exit the compiler vectorises it.
    if run.iter().fold(false, |seen, &c| seen | (c < 0x20)) {
        return Err(CONTROL);
    }
    std::str::from_utf8(run)
        .map(|_| ())
        .map_err(|_| Syntax(format::NOT_UTF8))
}

/// `b[k]` is a `\`: the index after its escape, as serde_json reads one into a `String`: one of
/// `\" \\ \/ \b \f \n \r \t`, or `\u` and four hex digits, where a UTF-16 surrogate must be a
/// leading one followed by a trailing one (serde_json's read.rs, `parse_unicode_escape`, which
/// refuses a lone surrogate when it builds a string).
fn escape_end(b: &[u8], k: usize) -> Result<usize, Fault> {
    const LONE: Fault = Syntax("a lone UTF-16 surrogate in a \\u escape");
    match b.get(k + 1) {
        Some(b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't') => Ok(k + 2),
        Some(b'u') => match hex4(b, k + 2)? {
            0xDC00..=0xDFFF => Err(LONE),
            0xD800..=0xDBFF => {
                if b.get(k + 6..k + 8) == Some(b"\\u") && matches!(hex4(b, k + 8)?, 0xDC00..=0xDFFF)
                {
                    Ok(k + 12)
                } else {
                    Err(LONE)
                }
            }
            _ => Ok(k + 6),
        },
        _ => Err(Syntax("an escape is not valid")),
    }
}

/// The four hex digits at `b[at..]`.
fn hex4(b: &[u8], at: usize) -> Result<u16, Fault> {
    const BAD: Fault = Syntax("a \\u escape is not four hex digits");
    let digits = b.get(at..at + 4).ok_or(BAD)?;
    digits.iter().try_fold(0u16, |n, &c| {
        let d = (c as char).to_digit(16).ok_or(BAD)?;
        Ok(n << 4 | d as u16)
    })
}

/// `b[i]` is `-` or a digit: the index after the number, by JSON's grammar (one leading zero,
/// digits after `.` and after `e`). A number that may not fit an f64 (with an exponent, or of
/// hundreds of digits: 10³⁰⁰ fits) is read by serde_json itself, which refuses one that does
/// not (de.rs, `NumberOutOfRange`); the rest always fit.
fn number_end(b: &[u8], i: usize) -> Result<usize, Fault> {
    const BAD: Fault = Syntax("a number is not valid");
    let digits = |mut j: usize| {
        while j < b.len() && b[j].is_ascii_digit() {
            j += 1;
        }
        j
    };
    let mut j = i + usize::from(b[i] == b'-');
    match b.get(j) {
        Some(b'0') => j += 1,
        Some(b'1'..=b'9') => j = digits(j + 1),
        _ => return Err(BAD),
    }
    if b.get(j) == Some(&b'.') {
        let k = digits(j + 1);
        if k == j + 1 {
            return Err(BAD);
        }
        j = k;
    }
    let mut exponent = false;
    if matches!(b.get(j), Some(b'e' | b'E')) {
        j += 1;
        if matches!(b.get(j), Some(b'+' | b'-')) {
            j += 1;
        }
        let k = digits(j);
        if k == j {
            return Err(BAD);
        }
        (j, exponent) = (k, true);
    }
    if (exponent || j - i > 300) && serde_json::from_slice::<serde_json::Value>(&b[i..j]).is_err() {
        return Err(Syntax("a number is out of range"));
    }
    Ok(j)
}

/// The most objects and arrays open at once that serde_json reads: its recursion limit
/// (de.rs, `remaining_depth`: 128, less one on entering each, refused at 0).
const MAX_DEPTH: usize = 127;

/// The index after the JSON value starting at `b[i]`, checked as the reader's serde_json
/// reads it into a `Value`; `depth` objects or arrays enclose it.
fn value_end(b: &[u8], i: usize, depth: usize) -> Result<usize, Fault> {
    match b.get(i) {
        Some(b'"') => string_end(b, i),
        Some(b'{' | b'[') => nested_end(b, i, depth),
        Some(b'-' | b'0'..=b'9') => number_end(b, i),
        Some(b't' | b'f' | b'n') => [&b"true"[..], b"false", b"null"]
            .into_iter()
            .find(|w| b[i..].starts_with(w))
            .map(|w| i + w.len())
            .ok_or(Syntax("a value is not valid")),
        _ => Err(Syntax("a value is expected")),
    }
}

/// `b[i]` is `"`, a member's key: the index after the key's closing quote, and the index of
/// its value (after the `:` and spaces).
fn member_value(b: &[u8], i: usize) -> Result<(usize, usize), Fault> {
    if b.get(i) != Some(&b'"') {
        return Err(Syntax("a key is expected"));
    }
    let key_end = string_end(b, i)?;
    let i = skip_ws(b, key_end);
    if b.get(i) != Some(&b':') {
        return Err(Syntax("`:` is expected after a key"));
    }
    Ok((key_end, skip_ws(b, i + 1)))
}

/// `b[i]` opens an object or array inside `depth` others: the index after the bracket that
/// closes it. A loop over a stack of the open brackets (at most [`MAX_DEPTH`]), not recursion.
fn nested_end(b: &[u8], i: usize, depth: usize) -> Result<usize, Fault> {
    let mut open = [0u8; MAX_DEPTH];
    let mut top = 0;
    let mut j = i;
    loop {
        // `b[j]` starts a value.
        match b.get(j) {
            Some(&c @ (b'{' | b'[')) => {
                if depth + top >= MAX_DEPTH {
                    return Err(Syntax("objects and arrays are nested too deeply"));
                }
                open[top] = c;
                top += 1;
                j = skip_ws(b, j + 1);
                let close = if c == b'{' { b'}' } else { b']' };
                if b.get(j) != Some(&close) {
                    if c == b'{' {
                        j = member_value(b, j)?.1;
                    }
                    continue;
                }
                top -= 1;
                j += 1;
            }
            _ => j = value_end(b, j, depth + top)?,
        }
        // After a value: close what it ends, or go on to the next member or element.
        loop {
            if top == 0 {
                return Ok(j);
            }
            j = skip_ws(b, j);
            let object = open[top - 1] == b'{';
            match b.get(j) {
                Some(b',') => {
                    j = skip_ws(b, j + 1);
                    if object {
                        j = member_value(b, j)?.1;
                    }
                    break;
                }
                Some(b'}') if object => {}
                Some(b']') if !object => {}
                _ => return Err(Syntax("`,` or a closing bracket is expected")),
            }
            top -= 1;
            j += 1;
        }
    }
}

/// Whether a JSON Lines file's first bytes make it one JSON array of rows: `[` first, after a
/// byte order mark. That is the test of HF `datasets`' json loader, which then reads the whole
/// file and takes each element as a row (datasets 5.2.0 packaged_modules/json/json.py,
/// `_generate_tables`: `batch.startswith(b"[")` after dropping a BOM, `ujson_loads` of the whole
/// file, each element written back as a JSON line). Whitespace before the `[` makes it JSON
/// Lines again, there as here.
pub fn is_json_array(head: &[u8]) -> bool {
    head.strip_prefix(format::BOM).unwrap_or(head).first() == Some(&b'[')
}

/// Whether HF `datasets` takes a JSON array file ([`is_json_array`]) as a list of strings: when
/// no `{` comes before the first `"` in its first 100 bytes (after a byte order mark). It then
/// writes each element `x` back as the JSON line `{"text": x}`, whatever `x` is, so the rows
/// have one field, `text` (datasets 5.2.0 packaged_modules/json/json.py, `_generate_tables`:
/// `b"{" in batch[:100].split(b'"', 1)[0]` decides "list of objects"). Checked there: `["a",
/// "b"]` gives two rows of a `text` string; `[1, 2]` a `text` of integers; an array of
/// objects after 100 bytes of spaces, rows whose `text` is each object.
pub fn array_of_strings(bytes: &[u8]) -> bool {
    let b = bytes.strip_prefix(format::BOM).unwrap_or(bytes);
    let head = &b[..b.len().min(100)];
    let before_quote = head.split(|&c| c == b'"').next().unwrap_or(head);
    !before_quote.contains(&b'{')
}

/// The field a list of strings' rows hold ([`array_of_strings`]).
pub const STRINGS_FIELD: &str = "text";

/// A fault of a JSON array file: the line it is on and what is wrong.
pub type ArrayFault = (u64, String);

/// The elements of a JSON array file ([`is_json_array`]), in order: `each(line, element,
/// range)` for each, with the line its first byte is on, its bytes with every newline made a
/// tab, and its range in `bytes`. Every element passed is valid JSON as the reader's
/// serde_json reads it alone (of any type: the caller checks it is an object). Stops at the
/// first fault, the array's own syntax or an element that is not valid JSON, and returns it.
pub fn array_elements(
    bytes: &[u8],
    mut each: impl FnMut(u64, &[u8], std::ops::Range<usize>),
) -> Result<(), ArrayFault> {
    // The walk reads one line, and an element may span several. A newline is whitespace outside
    // a string and a control character inside one, and so is a tab: with each newline made a
    // tab, the whole array is one line to the walk, and it validates what serde_json would.
    let flat: Vec<u8> = bytes
        .iter()
        .map(|&c| if c == b'\n' { b'\t' } else { c })
        .collect();
    let mut lines = LineCount::default();
    let start = if bytes.starts_with(format::BOM) {
        format::BOM.len()
    } else {
        0
    };
    let mut i = skip_ws(&flat, start + 1);
    if flat.get(i) == Some(&b']') {
        i += 1;
    } else {
        loop {
            let line = lines.at(bytes, i);
            let end = value_end(&flat, i, 0).map_err(|f| element_fault(bytes, i, line, f))?;
            each(line, &flat[i..end], i..end);
            i = skip_ws(&flat, end);
            match flat.get(i) {
                Some(b',') => i = skip_ws(&flat, i + 1),
                Some(b']') => {
                    i += 1;
                    break;
                }
                _ => {
                    let what =
                        "malformed JSON: `,` or `]` is expected after an element of the array";
                    return Err((lines.at(bytes, i), what.to_string()));
                }
            }
        }
    }
    let end = skip_ws(&flat, i);
    if end < flat.len() {
        let what = "more than one JSON value in the file: something follows the array's `]`";
        return Err((lines.at(bytes, end), what.to_string()));
    }
    Ok(())
}

/// Line numbers of increasing offsets in a file.
#[derive(Default)]
struct LineCount {
    /// The offset counted up to, and the line it is on (0 before the first call).
    counted: usize,
    line: u64,
}

impl LineCount {
    fn at(&mut self, bytes: &[u8], offset: usize) -> u64 {
        let newlines = memchr::memchr_iter(b'\n', &bytes[self.counted..offset]).count();
        self.line += newlines as u64 + u64::from(self.line == 0);
        self.counted = offset;
        self.line
    }
}

/// An element of an array file (starting at `bytes[at]`, on `line`) the walk refused: serde's
/// message and line for it, as the reader reports it, else `fault`'s words.
fn element_fault(bytes: &[u8], at: usize, line: u64, fault: Fault) -> ArrayFault {
    let rest = &bytes[at..];
    let valid = match std::str::from_utf8(rest) {
        Ok(text) => text,
        Err(e) => std::str::from_utf8(&rest[..e.valid_up_to()]).expect("valid up to there"),
    };
    let newlines = |b: &[u8]| memchr::memchr_iter(b'\n', b).count() as u64;
    let mut values = serde_json::Deserializer::from_str(valid).into_iter::<serde_json::Value>();
    match values.next() {
        // A fault inside the element (or the file's end inside it): not the bytes after it.
        Some(Err(e)) if !e.is_eof() || valid.len() == rest.len() => {
            let message = e.to_string();
            let position = format!(" at line {} column {}", e.line(), e.column());
            let message = message.strip_suffix(&position).unwrap_or(&message);
            (
                line + e.line() as u64 - 1,
                format!("malformed JSON: {message}"),
            )
        }
        _ if valid.len() < rest.len() => (
            line + newlines(valid.as_bytes()),
            format::NOT_UTF8.to_string(),
        ),
        _ => {
            let (Shape(what) | Syntax(what)) = fault;
            (line, format!("malformed JSON: {what}"))
        }
    }
}

/// Walks one JSONL row at the start of `b`: it must be one JSON object, as the reader's
/// serde_json reads it (every string, escape, number and nested value checked); calls
/// `field(raw key, raw value)` for each top-level member, and returns where the row's line
/// ends (the index of its newline, or `b.len()`).
fn walk_object<'b>(b: &'b [u8], mut field: impl FnMut(&'b [u8], &'b [u8])) -> Result<usize, Fault> {
    let mut i = skip_ws(b, 0);
    let other = match b.get(i) {
        Some(b'{') => None,
        Some(b'[') => Some("it is a JSON array"),
        Some(b'"') => Some("it is a JSON string"),
        Some(b'-' | b'0'..=b'9') => Some("it is a number"),
        Some(b't' | b'f' | b'n') => Some("it is true, false or null"),
        _ => return Err(Syntax("it is not JSON")),
    };
    if let Some(what) = other {
        // Said so only of a value the reader would parse, alone on its line.
        let whole =
            value_end(b, i, 0).is_ok_and(|e| matches!(b.get(skip_ws(b, e)), None | Some(b'\n')));
        return Err(if whole { Shape(what) } else { Syntax(what) });
    }
    i = skip_ws(b, i + 1);
    if b.get(i) == Some(&b'}') {
        i += 1;
    } else {
        loop {
            let (key_end, at) = member_value(b, i)?;
            let end = value_end(b, at, 1)?;
            field(&b[i + 1..key_end - 1], &b[at..end]);
            i = skip_ws(b, end);
            match b.get(i) {
                Some(b',') => i = skip_ws(b, i + 1),
                Some(b'}') => {
                    i += 1;
                    break;
                }
                _ => return Err(Syntax("`,` or `}` is expected")),
            }
        }
    }
    let end = skip_ws(b, i);
    match b.get(end) {
        None | Some(b'\n') => Ok(end),
        Some(_) => Err(Shape("more than one JSON value on the line")),
    }
}

#[cfg(test)]
mod scan_tests {
    use super::*;
    use std::path::PathBuf;

    fn spec(format: Format) -> ScanSpec {
        ScanSpec {
            format,
            fields: vec!["text".into(), "label".into()],
            label: Some(1),
        }
    }

    fn scan(text: &str, format: Format) -> DataScan {
        scan_reader(text.as_bytes(), &spec(format)).unwrap()
    }

    #[test]
    fn counts_rows_without_blank_lines_and_headers() {
        assert_eq!(count_rows(b"{}\n{}\n\n{}", Format::Jsonl), 3);
        assert_eq!(count_rows(b"\n \n{}\r\n", Format::Jsonl), 1);
        assert_eq!(count_rows(b"text,label\na,1\nb,0\n", Format::Csv), 2);
        assert_eq!(count_rows(b"", Format::Jsonl), 0);
        assert_eq!(count_rows(b"", Format::Csv), 0);
        assert_eq!(count_rows(b"text,label\n", Format::Csv), 0);
    }

    #[test]
    fn csv_rows_are_records_not_lines() {
        // Quoted newlines (LF and CRLF), a quoted delimiter, doubled quotes, a BOM, blank lines
        // between records and no final newline: three rows on nine lines.
        let text = "\u{feff}text,label\r\n\"one\r\ntwo, three\",spam\r\n\r\n\"say \"\"hi\"\"\n\nbye\",0\n\"x\",ham";
        let s = scan(text, Format::Csv);
        assert_eq!(s.rows, 3);
        assert_eq!(s.bad_rows, 0, "{:?}", s.first_bad);
        assert_eq!(s.header, Some((1, vec!["text".into(), "label".into()])));
        let labels: Vec<_> = s.labels.iter().map(|l| (&l.value, l.first_line)).collect();
        assert_eq!(
            labels,
            [
                (&LabelValue::Str("spam".into()), 2),
                (&LabelValue::Int(0), 5),
                (&LabelValue::Str("ham".into()), 8)
            ]
        );
        assert_eq!(count_rows(text.as_bytes(), Format::Csv), 3);
    }

    #[test]
    fn csv_rows_the_reader_would_stop_at() {
        let s = scan(
            "text,label\na,1\nb,1,extra\n\"c\"\nd,\n\"e\",\"\"\n",
            Format::Csv,
        );
        assert_eq!(s.rows, 5);
        assert_eq!(s.bad_rows, 2);
        assert_eq!(
            s.first_bad,
            Some((3, "the row has 3 fields but the header has 2".into()))
        );
        // Empty label cells are missing labels (pandas reads NaN), not a label "".
        assert_eq!(
            s.missing,
            [MissingField {
                field: "label".into(),
                first_line: 5,
                rows: 2
            }]
        );
        assert_eq!(s.labels.len(), 1);
        let s = scan_reader(&b"text,label\n\xff,1\n"[..], &spec(Format::Csv)).unwrap();
        assert_eq!(s.first_bad, Some((2, format::NOT_UTF8.into())));
        // Lines of spaces and tabs are blank, as pandas reads them; not in quotes.
        let s = scan("text,label\n \t\na,1\n   \n\" \",0\n", Format::Csv);
        assert_eq!((s.rows, s.bad_rows), (2, 0));
    }

    #[test]
    fn long_lines_and_chunk_boundaries() {
        // Lines longer than the 64 KiB buffer, and many lines across chunk boundaries.
        let long = "x".repeat(200_000);
        let mut text = format!("{{\"text\": \"{long}\", \"label\": 1}}\n");
        for i in 0..10_000 {
            text.push_str(&format!(
                "{{\"text\": \"row {i} \\\"quoted\\\"\", \"label\": 0}}\n"
            ));
        }
        text.push_str("{\"text\": \"last, no newline\", \"label\": 1}");
        let s = scan(&text, Format::Jsonl);
        assert_eq!(s.rows, 10_002);
        assert_eq!(s.bad_rows, 0, "{:?}", s.first_bad);
        assert!(s.missing.is_empty());
        let labels: Vec<_> = s.labels.iter().map(|l| (&l.value, l.rows)).collect();
        assert_eq!(
            labels,
            [(&LabelValue::Int(1), 2), (&LabelValue::Int(0), 10_000)]
        );
        assert_eq!(s.first_fields, ["text", "label"]);
    }

    #[test]
    fn rows_that_are_not_objects() {
        // JSON that is not one object: the walk's words.
        let shapes = [
            ("[1, 2]", "it is a JSON array"),
            ("\"text\"", "it is a JSON string"),
            ("42", "it is a number"),
            ("null", "it is true, false or null"),
            (
                "{\"text\": \"a\"} {}",
                "more than one JSON value on the line",
            ),
        ];
        // Not JSON as the reader's serde_json reads it into a `Value`: serde's message.
        let malformed = [
            "text,label",
            "{\"text\": \"a\", \"label\": 1",
            "{\"text\": \"a}",
            "{\"text\" \"a\"}",
            "{\"text\": nope}",
            "{\"text\": [1, {\"a\": 2}",
            "{\"text\": [1, 2,]}",
            "{\"text\": \"a\",}",
            "{\"text\": {\"a\" 1}}",
            "{\"text\": \"a\\x\"}",
            "{\"text\": \"a\\u12\"}",
            "{\"text\": \"a\u{1}b\"}",
            "{\"text\": \"é\u{1f}b\"}",
            // A lone surrogate: serde_json skips it when ignoring a value, refuses it in a string.
            "{\"text\": \"\\ud83d\"}",
            "{\"text\": \"\\ud83d\\u0041\"}",
            "{\"text\": \"\\ude00\"}",
            "{\"x\": [\"\\ud83dx\"]}",
            "{\"text\": 01}",
            "{\"text\": 1.}",
            "{\"text\": -}",
            "{\"text\": 1e}",
            "{\"text\": tru}",
            // Out of an f64's range, which a `Value` refuses and an ignored value does not.
            "{\"text\": 1e309}",
            "{\"x\": {\"y\": -2.5E+400}}",
            // Not objects, and not JSON either.
            "[1, 2",
            "\"open",
            "-x",
            "nope",
            "[1] [2]",
        ];
        let cases = shapes
            .iter()
            .map(|&(row, what)| (row.to_string(), what.to_string()))
            .chain(malformed.iter().map(|&row| {
                let e = serde_json::from_str::<serde_json::Value>(row).expect_err(row);
                (row.to_string(), format!("malformed JSON: {e}"))
            }))
            // Nested deeper than serde_json reads (the row's object counts: 128 levels).
            .chain([127, 200].map(|n| {
                let row = format!("{{\"x\": {}{}}}", "[".repeat(n), "]".repeat(n));
                let e = serde_json::from_str::<serde_json::Value>(&row).expect_err("deep");
                (row, format!("malformed JSON: {e}"))
            }));
        for (row, what) in cases {
            let s = scan(
                &format!("{{\"text\": \"ok\", \"label\": 0}}\n{row}\n"),
                Format::Jsonl,
            );
            assert_eq!(s.first_bad, Some((2, what)), "{row}");
            assert_eq!(s.bad_rows, 1);
        }
        // Nested values, escapes, odd spacing, numbers at an f64's ends and 127 levels are fine.
        let ok = format!(
            "\u{feff}{{ \"meta\" : {{\"a\": [1, \"}}\", {{}}, []]}}, \"te\\u0078t\": \"a\\\\é\\ud83d\\ude00\\/\", \"deep\": {}{}, \"big\": [1e308, -0.0e-999, 0, {}], \"label\" : -0.5e3 }}",
            "[".repeat(126),
            "]".repeat(126),
            "9".repeat(300),
        );
        serde_json::from_str::<serde_json::Value>(ok.trim_start_matches('\u{feff}'))
            .expect("serde_json reads it");
        let s = scan(&ok, Format::Jsonl);
        assert_eq!(s.bad_rows, 0, "{:?}", s.first_bad);
        assert!(s.missing.is_empty(), "{:?}", s.missing);
        assert_eq!(s.labels[0].value, LabelValue::Other("-0.5e3".into()));
    }

    #[test]
    fn missing_and_null_fields_and_string_labels() {
        let s = scan(
            "{\"text\": \"a\", \"label\": \"spam\"}\n{\"text\": \"b\"}\n{\"text\": null, \"label\": \"ham\"}\n{\"text\": \"c\", \"label\": null}\n",
            Format::Jsonl,
        );
        assert_eq!(
            s.missing,
            [
                MissingField {
                    field: "text".into(),
                    first_line: 3,
                    rows: 1
                },
                MissingField {
                    field: "label".into(),
                    first_line: 2,
                    rows: 2
                },
            ]
        );
        let labels: Vec<_> = s.labels.iter().map(|l| (&l.value, l.first_line)).collect();
        assert_eq!(
            labels,
            [
                (&LabelValue::Str("spam".into()), 1),
                (&LabelValue::Str("ham".into()), 3)
            ]
        );
    }

    #[test]
    fn texts_that_are_not_strings() {
        let spec = ScanSpec {
            format: Format::Jsonl,
            fields: vec!["text".into(), "pair".into(), "label".into()],
            label: Some(2),
        };
        let rows = [
            r#"{"text": "a", "pair": "b", "label": 1}"#,
            r#"{"text": 12, "pair": "b", "label": 1}"#,
            r#"{"text": "a", "pair": {"x": 1}, "label": 1}"#,
            r#"{"text": [1], "pair": null, "label": 1}"#,
            r#"{"text": true, "text": "a", "pair": "b", "label": 1}"#, // the last of two counts
            r#"{"text": "a", "text": -1.5e3, "pair": "b", "label": [1]}"#, // a label is not a text
        ];
        let s = scan_reader(
            rows.join(
                "
",
            )
            .as_bytes(),
            &spec,
        )
        .unwrap();
        let seen: Vec<_> = s
            .not_text
            .iter()
            .map(|t| (t.field.as_str(), t.first_line, t.found.as_str(), t.rows))
            .collect();
        assert_eq!(
            seen,
            [("text", 2, "a number", 3), ("pair", 3, "an object", 1)]
        );
        assert_eq!(s.missing.len(), 1, "the null pair: {:?}", s.missing);
        // CSV/TSV cells are text.
        let s = scan(
            "text,label
12,1
",
            Format::Csv,
        );
        assert!(s.not_text.is_empty());
    }

    /// HF's list of strings: no `{` before the first `"` in the first 100 bytes, whatever
    /// the elements are; each element is the row's `text`.
    #[test]
    fn a_json_array_of_strings_is_read_as_rows_of_text() {
        let spec = spec(Format::Jsonl);
        let scan = |text: &str| scan_reader(text.as_bytes(), &spec).unwrap();
        let s = scan("[\"a\",\n \"b\", null,\n 7]");
        assert!(s.strings_array);
        assert_eq!((s.rows, s.bad_rows), (4, 0), "{:?}", s.first_bad);
        assert_eq!(s.first_fields, ["text"]);
        let missing = |field: &str, first_line, rows| MissingField {
            field: field.into(),
            first_line,
            rows,
        };
        assert_eq!(s.missing, [missing("text", 2, 1), missing("label", 1, 4)]);
        assert_eq!(
            s.not_text,
            [NotText {
                field: "text".into(),
                first_line: 3,
                found: "a number".into(),
                rows: 1
            }]
        );
        // Objects are strings' rows too when their first `{` comes after the first 100 bytes
        // (or after a `"`); a BOM is not counted.
        let object = "{\"text\": \"a\", \"label\": 0}";
        for (pad, strings) in [(98, false), (99, true), (0, false)] {
            let text = format!("\u{feff}[{}{object}]", " ".repeat(pad));
            assert_eq!(array_of_strings(text.as_bytes()), strings, "{pad} spaces");
            let s = scan(&text);
            assert_eq!((s.strings_array, s.rows, s.bad_rows), (strings, 1, 0));
            assert_eq!(s.not_text.len(), usize::from(strings), "{pad} spaces");
        }
        assert!(array_of_strings(b"[\"a\", {\"text\": \"b\"}]"));
        assert!(!array_of_strings(b"[{\"text\": \"b\"}, \"a\"]"));
        // Faults of the array itself stop the walk as in any array file.
        let s = scan("[\"a\",\n\"b\" \"c\"]");
        assert_eq!(s.first_bad.map(|b| b.0), Some(2));
    }

    #[test]
    fn a_json_array_file_is_read_as_rows() {
        let spec = spec(Format::Jsonl);
        let scan = |text: &str| scan_reader(text.as_bytes(), &spec).unwrap();
        // Pretty-printed, a BOM, CRLF: each element a row on the line where it starts.
        let text = "\u{feff}[\r\n {\r\n  \"text\": \"a\",\r\n  \"label\": 1\r\n },\r\n {\"text\": \"b\"},\r\n {\"label\": \"x\", \"text\": \"c\"}\r\n]\r\n";
        let s = scan(text);
        assert_eq!((s.rows, s.bad_rows), (3, 0), "{:?}", s.first_bad);
        assert_eq!(
            s.missing,
            [MissingField {
                field: "label".into(),
                first_line: 6,
                rows: 1
            }]
        );
        let lines: Vec<u64> = s.labels.iter().map(|l| l.first_line).collect();
        assert_eq!(lines, [2, 7]);
        assert_eq!(s.first_fields, ["text", "label"]);
        // One line, and empty.
        assert_eq!(scan("[{\"text\": \"a\", \"label\": 0}]").rows, 1);
        assert_eq!(scan("[ ]\n").rows, 0);
        // Whitespace before the `[`: JSON Lines again, as HF's loader reads it.
        assert_eq!(scan(" [{\"text\": \"a\", \"label\": 0}]").bad_rows, 1);
        // An element that is not an object is a bad row; the rows after it still count.
        let s = scan(
            "[\n{\"text\": \"a\", \"label\": 0},\n[1, 2],\n{\"text\": \"b\", \"label\": 0}\n]",
        );
        assert_eq!((s.rows, s.bad_rows), (3, 1));
        assert_eq!(s.first_bad, Some((3, "it is a JSON array".into())));
        // Faults stop the walk, at the line serde_json names (inside a multi-line element).
        let faults = [
            ("[\n{\"text\": \"a\",\n \"label\": 01}\n]", 3),
            ("[\n{\"text\": \"a\",\n \"label\": 1}\n{}]", 4),
            ("[{\"text\": \"a\", \"label\": 1}]\n\n[]", 3),
            // serde_json puts a raw newline inside a string on the line it ends.
            ("[{\"text\": \"a\nb\", \"label\": 1}]", 2),
            ("[{\"text\": \"a\", \"label\": 1},\n", 2),
            ("[{\"text\": \"a\", \"label\": 1},]", 1),
            ("[\n{\"text\": \"\\ud800\", \"label\": 1}]", 2),
        ];
        for (text, line) in faults {
            let s = scan(text);
            assert_eq!(s.bad_rows, 1, "{text:?}");
            assert_eq!(
                s.first_bad.as_ref().map(|b| b.0),
                Some(line),
                "{text:?}: {s:?}"
            );
        }
        // Bytes that are not UTF-8, at their line.
        let mut bytes = b"[{\"text\": \"a\", \"label\": 1},\n{\"text\": \"".to_vec();
        bytes.extend(b"\xff\"}]");
        let s = scan_reader(&bytes[..], &spec).unwrap();
        assert_eq!(s.first_bad, Some((2, format::NOT_UTF8.into())));
        // Never cut into parts.
        let mut text = String::from("[");
        for i in 0..2000 {
            text.push_str(&format!(
                "\n{{\"text\": \"{}\", \"label\": {}}},",
                "x".repeat(200),
                i % 2
            ));
        }
        text.push_str("\n{\"text\": \"last\", \"label\": 0}\n]\n");
        let file = TempFile::new("array.json", text.as_bytes());
        let len = text.len() as u64;
        let whole = scan(&text);
        assert_eq!((whole.rows, whole.bad_rows), (2001, 0));
        assert_eq!(scan_file(&file.0, len, &spec).unwrap(), whole);
    }

    /// A reader that hands out a few bytes at a time.
    struct Trickle<'a>(&'a [u8], usize);

    impl std::io::Read for Trickle<'_> {
        fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
            self.1 = self.1 % 13 + 1;
            let n = self.1.min(buf.len()).min(self.0.len());
            buf[..n].copy_from_slice(&self.0[..n]);
            self.0 = &self.0[n..];
            Ok(n)
        }
    }

    #[test]
    fn rows_cut_by_reads_are_walked_whole() {
        let text = "{\"text\": \"a \\\"b\\\" c\", \"label\": 1}\r\n\n  \n[1]\n{\"text\": \"x\"}\n{\"text\": \"bad\n{\"text\": \"y\", \"label\": \"z\"}";
        let whole = scan(text, Format::Jsonl);
        let trickled = scan_reader(Trickle(text.as_bytes(), 0), &spec(Format::Jsonl)).unwrap();
        assert_eq!(whole, trickled);
        assert_eq!(whole.rows, 5);
        assert_eq!(whole.bad_rows, 2);
        assert_eq!(whole.first_bad, Some((4, "it is a JSON array".into())));
        assert_eq!(
            whole.missing,
            [MissingField {
                field: "label".into(),
                first_line: 5,
                rows: 1
            }]
        );
        assert_eq!(whole.labels.len(), 2);
        assert_eq!(whole.labels[1].first_line, 7);
    }

    #[test]
    fn many_distinct_labels() {
        let mut text = String::new();
        for round in 0..2 {
            for i in 0..40 {
                text.push_str(&format!("{{\"text\": \"r{round}\", \"label\": {i}}}\n"));
            }
        }
        let s = scan(&text, Format::Jsonl);
        assert_eq!(s.labels.len(), 40);
        assert!(s.labels.iter().all(|l| l.rows == 2));
        assert_eq!(s.labels[39].value, LabelValue::Int(39));
        assert_eq!(s.labels[39].first_line, 40);
    }

    /// A temporary file, removed when dropped.
    struct TempFile(PathBuf);

    impl TempFile {
        fn new(name: &str, bytes: &[u8]) -> Self {
            let path =
                std::env::temp_dir().join(format!("recipe-scan-{}-{name}", std::process::id()));
            std::fs::write(&path, bytes).unwrap();
            TempFile(path)
        }
    }

    impl Drop for TempFile {
        fn drop(&mut self) {
            let _ = std::fs::remove_file(&self.0);
        }
    }

    #[test]
    fn a_file_scanned_in_parts_reads_as_one() {
        // Blank lines, bad rows, a BOM, missing and null fields, labels first seen in later
        // parts, a long line and no final newline: every cut lands somewhere different.
        let mut text = String::from("\u{FEFF}{\"text\": \"a\", \"label\": 1}\n\n");
        for i in 0..60 {
            match i % 7 {
                0 if i % 2 == 0 => text.push_str("  \n"),
                0 => text.push_str(&format!("{{\"text\": [{i}], \"label\": 0}}\n")),
                1 => text.push_str(&format!("[{i}]\n")),
                2 => text.push_str(&format!("{{\"text\": \"t{i}\"}}\n")),
                3 => text.push_str(&format!("{{\"text\": null, \"label\": \"l{}\"}}\n", i % 5)),
                4 => text.push_str(&format!(
                    "{{\"text\": \"{}\", \"label\": 2}}\n",
                    "x".repeat(300)
                )),
                5 => text.push_str(&format!("{{\"label\": {i}, \"text\": \"open\n")),
                _ => text.push_str(&format!("{{\"text\": \"u\\\"v\", \"label\": {}}}\n", i % 3)),
            }
        }
        text.push_str("{\"text\": \"last\", \"label\": 9}");
        let spec = spec(Format::Jsonl);
        let whole = scan_reader(text.as_bytes(), &spec).unwrap();
        assert!(whole.bad_rows > 0 && whole.labels.len() > 5 && !whole.missing.is_empty());
        assert_eq!(whole.not_text.len(), 1);
        let file = TempFile::new("parts.jsonl", text.as_bytes());
        let len = text.len() as u64;
        for parts in 1..=40 {
            let scan = scan_in_parts(&file.0, len, &spec, parts).unwrap();
            assert_eq!(scan, whole, "{parts} parts");
        }
        assert_eq!(scan_file(&file.0, len, &spec).unwrap(), whole);
        // Cuts fall at line starts, in order.
        let cuts = line_cuts(&file.0, len, 9).unwrap();
        assert_eq!((cuts[0], cuts[9]), (0, len));
        for w in cuts.windows(2) {
            assert!(w[0] <= w[1]);
            assert!(w[1] == len || text.as_bytes()[w[1] as usize - 1] == b'\n');
        }
    }

    #[test]
    fn parts_that_run_out_of_labels_are_read_again_in_order() {
        let mut text = String::new();
        for i in 0..MAX_LABELS + 10 {
            text.push_str(&format!("{{\"text\": \"r\", \"label\": {i}}}\n"));
        }
        let spec = spec(Format::Jsonl);
        let whole = scan_reader(text.as_bytes(), &spec).unwrap();
        assert!(whole.labels_truncated);
        let file = TempFile::new("labels.jsonl", text.as_bytes());
        let scan = scan_in_parts(&file.0, text.len() as u64, &spec, 3).unwrap();
        assert_eq!(scan, whole);
    }

    #[test]
    fn csv_and_tsv_headers() {
        // Column names are matched as written: pandas and the runtime see " target".
        let s = scan("\"text\", target\nhello,1\n", Format::Csv);
        assert_eq!(s.rows, 1);
        assert_eq!(
            s.header,
            Some((1, vec!["text".to_string(), " target".to_string()]))
        );
        assert_eq!(
            s.missing,
            [MissingField {
                field: "label".into(),
                first_line: 1,
                rows: 0
            }]
        );
        let s = scan("\ntext\tlabel\nhi\t0\n", Format::Tsv);
        assert_eq!(s.rows, 1);
        assert!(s.missing.is_empty());
    }

    #[test]
    fn byte_search() {
        let hay = b"abcdefghijklmnopqrstuvwxyz\"\\";
        for i in 0..hay.len() {
            assert_eq!(find_byte(&hay[i..], b'z'), (i <= 25).then(|| 25 - i));
            assert_eq!(find_string_stop(&hay[i..]), Some(26usize.saturating_sub(i)));
        }
        assert_eq!(find_string_stop(b"\x80\x22"), Some(1));
        assert_eq!(find_string_stop(b"abcdefghij\n"), Some(10));
        assert_eq!(find_byte(b"", b'a'), None);
    }

    #[test]
    fn plain_runs_stop_at_every_byte_that_is_not_plain() {
        // Every byte value at every offset of a word and past it, after plain bytes and before
        // stops of every kind (the bit tricks must flag the first stop, not one after it).
        let plain = |c: u8| (0x20..0x80).contains(&c) && c != b'"' && c != b'\\';
        for c in 0..=255u8 {
            for at in 0..19 {
                for after in [b'"', 0x00, 0x1f, 0xff, b'a'] {
                    let mut s = vec![b'x'; at];
                    s.push(c);
                    s.extend([after; 9]);
                    let want = if plain(c) {
                        if plain(after) {
                            s.len()
                        } else {
                            at + 1
                        }
                    } else {
                        at
                    };
                    assert_eq!(plain_run(&s), want, "{c:#x} at {at}, then {after:#x}");
                }
            }
        }
        assert_eq!(plain_run(b""), 0);
    }
}
