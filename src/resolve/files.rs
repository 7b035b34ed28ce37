//! Values read from files next to the recipe: the training rows (for step accounting) and the
//! model's config.json (for the hidden-size dependent DeepSpeed buckets), and the one scan of
//! each data file that the row count and the data rules share. Relative paths are taken from
//! the recipe's directory.

use std::path::{Path, PathBuf};

use super::value::{Source, Val};
use super::{Options, Resolved};

fn local(path: &str, options: &Options) -> PathBuf {
    let p = Path::new(path);
    match &options.base_dir {
        Some(base) if p.is_relative() => base.join(p),
        _ => p.to_path_buf(),
    }
}

/// Training rows: `--samples`, else `data.samples`, else the rows of a local training file.
pub fn samples(r: &mut Resolved, options: &Options) {
    if let Some(n) = options.samples {
        r.set(
            "data.samples",
            Val::Int(n as i64),
            Source::Flag {
                flag: format!("--samples {n}"),
            },
        );
        return;
    }
    if r.is_given("data.samples") {
        return;
    }
    let Some(train) = r.str("data.train").map(str::to_string) else {
        return;
    };
    let path = local(&train, options);
    // The same scan the data rules use (memoised): one read of the file per process.
    let Ok(scan) = scan_data(&path, &ScanSpec::from_recipe(r)) else {
        return;
    };
    let rows = scan.rows;
    r.set(
        "data.samples",
        Val::Int(rows as i64),
        Source::File {
            // The path as the recipe writes it: the lock must not depend on where it was built.
            what: format!("{rows} rows of {train}"),
        },
    );
}

/// Non-blank lines, less a header line for CSV/TSV. (Quoted newlines inside CSV fields are
/// not handled here; the data loader reads the rows properly.)
pub fn count_rows(bytes: &[u8], header: bool) -> u64 {
    let rows = bytes
        .split(|&b| b == b'\n')
        .filter(|line| line.iter().any(|b| !b.is_ascii_whitespace()))
        .count() as u64;
    if header {
        rows.saturating_sub(1)
    } else {
        rows
    }
}

/// From a local model directory's config.json: `model.hidden_size`, unless written, and the
/// model's size (`model.params`, `model.largest_layer`).
pub fn model_config(r: &mut Resolved, options: &Options) {
    let dir = r
        .str("model.from")
        .or_else(|| r.str("model.config"))
        .map(str::to_string);
    let Some(dir) = dir else { return };
    let mut path = local(&dir, options);
    let mut shown = dir.clone();
    if path.is_dir() {
        path = path.join("config.json");
        shown = format!("{}/config.json", dir.trim_end_matches('/'));
    }
    let Ok(text) = std::fs::read_to_string(&path) else {
        return;
    };
    let Ok(json) = serde_json::from_str::<serde_json::Value>(&text) else {
        return;
    };
    model_size(r, &shown, &json);
    if r.is_given("model.hidden_size") {
        return;
    }
    // The lookup order HF uses (ds_hf_rules.md §2.2): hidden_size, max(hidden_sizes), then text_config.
    let pick = |v: &serde_json::Value| {
        v.get("hidden_size").and_then(|h| h.as_i64()).or_else(|| {
            v.get("hidden_sizes")
                .and_then(|a| a.as_array())
                .and_then(|a| a.iter().filter_map(|x| x.as_i64()).max())
        })
    };
    let hidden = pick(&json).or_else(|| json.get("text_config").and_then(pick));
    if let Some(h) = hidden {
        r.set(
            "model.hidden_size",
            Val::Int(h),
            Source::File {
                what: format!("hidden_size of {shown}"),
            },
        );
    }
}

/// `model.params` and `model.largest_layer`: the parameters of the sequence-classification model
/// HF builds from a BERT-shaped config.json (`memory::bert_size`, with the task's labels), for
/// the ZeRO memory estimate (ds_hf_rules.md §8, R-E01). Nothing when a shape field is missing.
fn model_size(r: &mut Resolved, shown: &str, json: &serde_json::Value) {
    let labels = match r.val("model.task").and_then(|t| t.arg("labels")) {
        Some(Val::List(items)) => items.len() as u64,
        Some(v) => v.as_i64().map_or(2, |n| n.max(0) as u64),
        None => 2,
    };
    let Some(size) = config_size(json, labels) else {
        return;
    };
    let what = format!("a {labels}-label BERT classifier from {shown}");
    for (key, n, of) in [
        ("model.params", size.params, "parameters"),
        (
            "model.largest_layer",
            size.largest_layer,
            "largest module's parameters",
        ),
    ] {
        r.set(
            key,
            Val::Int(i64::try_from(n).unwrap_or(i64::MAX)),
            Source::File {
                what: format!("{of} of {what}"),
            },
        );
    }
}

/// The size of the `labels`-way BERT classifier HF builds from a config.json, or `None` when a
/// shape field is missing.
pub fn config_size(json: &serde_json::Value, labels: u64) -> Option<crate::memory::ModelSize> {
    let get = |k: &str| json.get(k).and_then(serde_json::Value::as_u64);
    Some(crate::memory::bert_size(&crate::memory::BertShape {
        vocab_size: get("vocab_size")?,
        hidden_size: get("hidden_size")?,
        num_hidden_layers: get("num_hidden_layers")?,
        intermediate_size: get("intermediate_size")?,
        max_position_embeddings: get("max_position_embeddings")?,
        type_vocab_size: get("type_vocab_size").unwrap_or(2),
        num_labels: labels,
        pooler: true,
    }))
}

// ---- Data files: one streaming pass per file --------------------------------------------------
//
// The rules see only the [`Resolved`] recipe, so resolution records the recipe's directory
// (`Resolved::base_dir`) and [`local_path`] resolves paths the way [`samples`] does. A data file is read
// once per process: [`scan_data`] streams it in 64 KiB chunks (one big read costs far more than
// the scan in page faults), counts rows, checks each JSONL row's top-level structure and fields
// and collects the distinct labels; the summary is memoised on the file's path, size and mtime,
// so the row count here and the data rules (rules/data.rs) share one read. JSONL rows are walked
// in the same pass that finds their line ends (a string cannot hold a raw newline), so each
// byte is looked at about once (string contents through memchr's SIMD search): cls.rcp's two
// files (4.8 MB) scan in about 1.5 ms on one thread. Large files are scanned in parts on
// several threads where there are CPUs to spare ([`scan_file`]). The `recipe` binary also keeps
// clean scans across processes (`scan_cache`), keyed on the file's identity and change times.

/// Where a path written in the recipe is read from: a relative path from the recipe's directory
/// (when resolution was given one), anything else as written.
pub fn local_path(r: &Resolved, path: &str) -> PathBuf {
    let p = Path::new(path);
    match &r.base_dir {
        Some(base) if p.is_relative() => base.join(p),
        _ => p.to_path_buf(),
    }
}

/// A data file format, as `data.format` resolves it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub enum DataFormat {
    /// One JSON object per line (also `.json`, which HF's json loader reads as JSON Lines).
    Jsonl,
    /// Comma-separated values with a header line.
    Csv,
    /// Tab-separated values with a header line.
    Tsv,
}

impl DataFormat {
    /// The format a `data.format` word names (`auto` is resolved before the rules run).
    pub fn from_word(word: &str) -> Option<Self> {
        match word {
            "jsonl" => Some(DataFormat::Jsonl),
            "csv" => Some(DataFormat::Csv),
            "tsv" => Some(DataFormat::Tsv),
            _ => None,
        }
    }

    /// The format a file's extension says, when it says one.
    pub fn from_extension(path: &str) -> Option<Self> {
        let ext = Path::new(path).extension()?.to_str()?.to_ascii_lowercase();
        match ext.as_str() {
            "jsonl" | "json" => Some(DataFormat::Jsonl),
            "csv" => Some(DataFormat::Csv),
            "tsv" => Some(DataFormat::Tsv),
            _ => None,
        }
    }

    /// The word for it.
    pub fn name(self) -> &'static str {
        match self {
            DataFormat::Jsonl => "jsonl",
            DataFormat::Csv => "csv",
            DataFormat::Tsv => "tsv",
        }
    }

    fn has_header(self) -> bool {
        self != DataFormat::Jsonl
    }
}

/// What a scan looks for.
#[derive(Debug, Clone, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub struct ScanSpec {
    /// How to read the rows.
    pub format: DataFormat,
    /// The fields every row must have (text, text_pair, label).
    pub fields: Vec<String>,
    /// Which of `fields` holds the label (its distinct values are collected).
    pub label: Option<usize>,
}

impl ScanSpec {
    /// The fields and format the recipe's `data` block names.
    pub fn from_recipe(r: &Resolved) -> Self {
        let format = r
            .word("data.format")
            .and_then(DataFormat::from_word)
            .unwrap_or(DataFormat::Jsonl);
        let mut fields = Vec::new();
        for key in ["data.text", "data.text_pair"] {
            if let Some(f) = r.str(key) {
                if !fields.iter().any(|x| x == f) {
                    fields.push(f.to_string());
                }
            }
        }
        let label = r
            .str("data.label")
            .map(|f| match fields.iter().position(|x| x == f) {
                Some(i) => i,
                None => {
                    fields.push(f.to_string());
                    fields.len() - 1
                }
            });
        ScanSpec {
            format,
            fields,
            label,
        }
    }
}

/// A label value as the data holds it.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub enum LabelValue {
    /// A JSON integer.
    Int(i64),
    /// A JSON string.
    Str(String),
    /// Anything else (a float, a boolean, an object …), as written (shortened).
    Other(String),
}

impl std::fmt::Display for LabelValue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LabelValue::Int(i) => write!(f, "{i}"),
            LabelValue::Str(s) => f.write_str(&crate::format::quote(s)),
            LabelValue::Other(s) => f.write_str(s),
        }
    }
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
    /// Rows lacking it, or holding `null` (0 for CSV/TSV: the header lacks the column).
    pub rows: u64,
}

/// What a scan found.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct DataScan {
    /// Rows: non-blank lines, less the header line for CSV/TSV (as [`count_rows`]).
    pub rows: u64,
    /// CSV/TSV: the header line and its column names.
    pub header: Option<(u64, Vec<String>)>,
    /// JSONL: lines that are not a JSON object.
    pub bad_rows: u64,
    /// JSONL: the first such line and what it is (never cached: see `scan_cache`).
    #[serde(skip)]
    pub first_bad: Option<(u64, &'static str)>,
    /// JSONL: the top-level fields of the first object row, for suggestions.
    pub first_fields: Vec<String>,
    /// Wanted fields that some rows lack, in [`ScanSpec::fields`] order.
    pub missing: Vec<MissingField>,
    /// JSONL: distinct label values in order of first appearance.
    pub labels: Vec<LabelSeen>,
    /// More than [`MAX_LABELS`] distinct labels: the rest were not collected.
    pub labels_truncated: bool,
}

/// Distinct label values collected at most (more than any classification task declares).
pub const MAX_LABELS: usize = 100_000;

type MemoKey = (PathBuf, u64, Option<std::time::SystemTime>, ScanSpec);

static MEMO: std::sync::Mutex<Vec<(MemoKey, std::sync::Arc<DataScan>)>> =
    std::sync::Mutex::new(Vec::new());

/// Scans a local data file (memoised on path, size, mtime and spec; see the section comment).
pub fn scan_data(path: &Path, spec: &ScanSpec) -> std::io::Result<std::sync::Arc<DataScan>> {
    let meta = std::fs::metadata(path)?;
    if !meta.is_file() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "not a file",
        ));
    }
    let key: MemoKey = (
        path.to_path_buf(),
        meta.len(),
        meta.modified().ok(),
        spec.clone(),
    );
    let memo = |m: &Vec<(MemoKey, std::sync::Arc<DataScan>)>| {
        m.iter().find(|(k, _)| *k == key).map(|(_, s)| s.clone())
    };
    if let Some(hit) = MEMO.lock().ok().and_then(|m| memo(&m)) {
        return Ok(hit);
    }
    // A previous process's scan of the same unchanged file, else a fresh one.
    let scan = match super::scan_cache::get(path, &meta, spec) {
        Some(s) => s,
        None => {
            let s = scan_file(path, meta.len(), spec)?;
            super::scan_cache::put(path, &meta, spec, &s);
            s
        }
    };
    let scan = std::sync::Arc::new(scan);
    if let Ok(mut m) = MEMO.lock() {
        if m.len() >= 8 {
            m.remove(0);
        }
        m.push((key, scan.clone()));
    }
    Ok(scan)
}

/// Scans rows from any reader (no memo).
pub fn scan_reader(reader: impl std::io::Read, spec: &ScanSpec) -> std::io::Result<DataScan> {
    let mut state = ScanState::new(spec, true);
    if spec.format == DataFormat::Jsonl {
        state.jsonl(reader)?;
    } else {
        for_each_line(reader, |n, line| state.line(n, line))?;
    }
    Ok(state.finish())
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
    let parts = if spec.format == DataFormat::Jsonl {
        (len / PART_BYTES)
            .min(MAX_PARTS)
            .min(cpus().saturating_sub(1))
    } else {
        1
    };
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

/// Calls `f(line number, line)` for each line (without its `\n`), reading in chunks.
fn for_each_line(
    mut reader: impl std::io::Read,
    mut f: impl FnMut(u64, &[u8]),
) -> std::io::Result<()> {
    let mut buf = vec![0u8; CHUNK];
    let mut len = 0; // bytes held in buf: the start of a line not yet ended
    let mut line_no = 0u64;
    loop {
        let pos = len;
        if !refill(&mut reader, &mut buf, &mut len)? {
            if len > 0 {
                f(line_no + 1, &buf[..len]);
            }
            return Ok(());
        }
        let (mut start, mut pos) = (0, pos);
        while let Some(k) = find_byte(&buf[pos..len], b'\n') {
            line_no += 1;
            f(line_no, &buf[start..pos + k]);
            start = pos + k + 1;
            pos = start;
        }
        buf.copy_within(start..len, 0);
        len -= start;
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
    /// Non-blank lines.
    lines: u64,
    /// JSONL: all lines, blank ones too (the line numbers used).
    line_no: u64,
    have_first: bool,
    missing: Vec<(u64, u64)>, // per field: first line, rows
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
            label_index: std::collections::HashMap::new(),
            label_raw: Vec::new(),
        }
    }

    fn line(&mut self, n: u64, mut line: &[u8]) {
        if n == 1 {
            line = line.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(line); // a UTF-8 BOM
        }
        if line.iter().all(u8::is_ascii_whitespace) {
            return;
        }
        self.lines += 1;
        if self.lines == 1 {
            self.header(n, line);
        }
    }

    /// The header's column names. A simple split: a quoted column name containing the
    /// delimiter is not handled (the data loader reads it properly; we may then misreport).
    fn header(&mut self, n: u64, line: &[u8]) {
        let delimiter = if self.spec.format == DataFormat::Tsv {
            '\t'
        } else {
            ','
        };
        let text = String::from_utf8_lossy(line);
        let columns: Vec<String> = text
            .split(delimiter)
            .map(|c| {
                let c = c.trim();
                c.strip_prefix('"')
                    .and_then(|c| c.strip_suffix('"'))
                    .unwrap_or(c)
                    .to_string()
            })
            .collect();
        for (i, field) in self.spec.fields.iter().enumerate() {
            if !columns.contains(field) {
                self.missing[i] = (n, 0);
                self.scan.missing.push(MissingField {
                    field: field.clone(),
                    first_line: n,
                    rows: 0,
                });
            }
        }
        self.scan.header = Some((n, columns));
    }

    /// Reads JSONL rows: each row is walked from its first byte, and the walk finds where its
    /// line ends; only a row that fails is looked at again, as a whole line.
    fn jsonl(&mut self, mut reader: impl std::io::Read) -> std::io::Result<()> {
        let mut buf = vec![0u8; CHUNK];
        let (mut len, mut line_no, mut more) = (0, 0u64, true);
        while more {
            more = refill(&mut reader, &mut buf, &mut len)?;
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
        let bom = if n == 1 && self.file_start && rest.starts_with(b"\xEF\xBB\xBF") {
            3 // a UTF-8 byte order mark
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
            Ok(_) => return None,
            Err(_) => {}
        }
        // Blank, not an object, or cut off by the end of the buffer: find the line's end.
        let end = match find_byte(b, b'\n') {
            Some(end) => end,
            None if last => b.len(),
            None => return None,
        };
        let line = &b[..end];
        if !line.iter().all(u8::is_ascii_whitespace) {
            self.lines += 1;
            match self.walk_row(line) {
                Ok((_, row)) => self.record(n, row),
                Err(what) => {
                    self.scan.bad_rows += 1;
                    self.scan.first_bad.get_or_insert((n, what));
                }
            }
        }
        Some(bom + (end + 1).min(b.len()))
    }

    /// Walks one row; nothing is recorded yet (the caller may find the line incomplete).
    fn walk_row<'b>(&self, b: &'b [u8]) -> Result<(usize, Row<'b>), &'static str> {
        let mut row = Row {
            present: 0,
            label: None,
            keys: Vec::new(),
        };
        let first = !self.have_first;
        let end = walk_object(b, |key, value| {
            if first {
                row.keys.push(decode_key(key));
            }
            for (i, field) in self.spec.fields.iter().enumerate() {
                if key_is(key, field) {
                    if value == b"null" {
                        row.present &= !(1 << i);
                    } else {
                        row.present |= 1 << i;
                    }
                    if Some(i) == self.spec.label {
                        row.label = Some(value);
                    }
                }
            }
        })?;
        Ok((end, row))
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
        let Some(raw) = row.label.filter(|v| *v != b"null") else {
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
                value: label_value(raw),
                first_line: n,
                rows: 1,
            });
        } else {
            self.scan.labels_truncated = true;
        }
    }

    fn finish(mut self) -> DataScan {
        self.scan.rows = if self.spec.format.has_header() {
            self.lines.saturating_sub(1)
        } else {
            self.lines
        };
        if self.spec.format == DataFormat::Jsonl {
            for (i, (first_line, rows)) in self.missing.iter().enumerate() {
                if *rows > 0 {
                    self.scan.missing.push(MissingField {
                        field: self.spec.fields[i].clone(),
                        first_line: *first_line,
                        rows: *rows,
                    });
                }
            }
        }
        self.scan
    }
}

/// What a JSONL row holds of the wanted fields.
struct Row<'b> {
    /// Bit `i`: field `i` is there and not null.
    present: u64,
    /// The label's raw value.
    label: Option<&'b [u8]>,
    /// The row's top-level keys (first row only, for suggestions).
    keys: Vec<String>,
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

/// Skips spaces within the line (a newline ends the row).
fn skip_ws(b: &[u8], mut i: usize) -> usize {
    while i < b.len() && matches!(b[i], b' ' | b'\t' | b'\r') {
        i += 1;
    }
    i
}

/// `b[i]` is a `"`: the index after the closing quote (a string ends on its line).
fn string_end(b: &[u8], i: usize) -> Result<usize, &'static str> {
    let mut j = i + 1;
    loop {
        let k = j + find_string_stop(&b[j..]).ok_or("a string is not closed on its line")?;
        match b[k] {
            b'"' => return Ok(k + 1),
            b'\\' if k + 1 < b.len() && b[k + 1] != b'\n' => j = k + 2, // an escape
            _ => return Err("a string is not closed on its line"),
        }
    }
}

/// The index after the JSON value starting at `b[i]`. Nested objects and arrays are skipped by
/// bracket depth and strings; scalars are checked for their shape only.
fn value_end(b: &[u8], i: usize) -> Result<usize, &'static str> {
    match b.get(i) {
        Some(b'"') => string_end(b, i),
        Some(b'{' | b'[') => {
            let (mut depth, mut j) = (0usize, i);
            while j < b.len() {
                match b[j] {
                    b'"' => {
                        j = string_end(b, j)?;
                        continue;
                    }
                    b'{' | b'[' => depth += 1,
                    b'}' | b']' => {
                        depth -= 1;
                        if depth == 0 {
                            return Ok(j + 1);
                        }
                    }
                    b'\n' => break,
                    _ => {}
                }
                j += 1;
            }
            Err("malformed JSON: an object or array is not closed")
        }
        Some(_) => {
            let mut j = i;
            while j < b.len() && !matches!(b[j], b',' | b'}' | b']' | b' ' | b'\t' | b'\r' | b'\n')
            {
                j += 1;
            }
            let token = &b[i..j];
            let number = token
                .first()
                .is_some_and(|c| *c == b'-' || c.is_ascii_digit())
                && token
                    .iter()
                    .all(|c| c.is_ascii_digit() || matches!(c, b'-' | b'+' | b'.' | b'e' | b'E'));
            if number || matches!(token, b"true" | b"false" | b"null") {
                Ok(j)
            } else {
                Err("malformed JSON: a value is not valid")
            }
        }
        None => Err("malformed JSON: a value is missing"),
    }
}

/// Walks one JSONL row at the start of `b`: it must be one JSON object; calls `field(raw key,
/// raw value)` for each top-level member, and returns where the row's line ends (the index of
/// its newline, or `b.len()`). A light scan: the structure is checked, not every escape or
/// number.
fn walk_object<'b>(
    b: &'b [u8],
    mut field: impl FnMut(&'b [u8], &'b [u8]),
) -> Result<usize, &'static str> {
    let mut i = skip_ws(b, 0);
    match b.get(i) {
        Some(b'{') => {}
        Some(b'[') => return Err("it is a JSON array"),
        Some(b'"') => return Err("it is a JSON string"),
        Some(c) if *c == b'-' || c.is_ascii_digit() => return Err("it is a number"),
        _ if value_end(b, i).is_ok_and(|e| matches!(b.get(skip_ws(b, e)), None | Some(b'\n'))) => {
            return Err("it is true, false or null")
        }
        _ => return Err("it is not JSON"),
    }
    i = skip_ws(b, i + 1);
    if b.get(i) == Some(&b'}') {
        i += 1;
    } else {
        loop {
            if b.get(i) != Some(&b'"') {
                return Err("malformed JSON: a key is expected");
            }
            let key_end = string_end(b, i)?;
            let key = &b[i + 1..key_end - 1];
            i = skip_ws(b, key_end);
            if b.get(i) != Some(&b':') {
                return Err("malformed JSON: `:` is expected after a key");
            }
            i = skip_ws(b, i + 1);
            let end = value_end(b, i)?;
            field(key, &b[i..end]);
            i = skip_ws(b, end);
            match b.get(i) {
                Some(b',') => i = skip_ws(b, i + 1),
                Some(b'}') => {
                    i += 1;
                    break;
                }
                _ => return Err("malformed JSON: `,` or `}` is expected"),
            }
        }
    }
    let end = skip_ws(b, i);
    match b.get(end) {
        None | Some(b'\n') => Ok(end),
        Some(_) => Err("more than one JSON value on the line"),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn counts_rows_without_blank_lines_and_headers() {
        assert_eq!(super::count_rows(b"{}\n{}\n\n{}", false), 3);
        assert_eq!(super::count_rows(b"text,label\na,1\nb,0\n", true), 2);
        assert_eq!(super::count_rows(b"", false), 0);
    }
}

#[cfg(test)]
mod scan_tests {
    use super::*;

    fn spec(format: DataFormat) -> ScanSpec {
        ScanSpec {
            format,
            fields: vec!["text".into(), "label".into()],
            label: Some(1),
        }
    }

    fn scan(text: &str, format: DataFormat) -> DataScan {
        scan_reader(text.as_bytes(), &spec(format)).unwrap()
    }

    #[test]
    fn rows_are_counted_as_count_rows_does() {
        for (text, header) in [
            ("{}\n{}\n\n{}", false),
            ("text,label\na,1\nb,0\n", true),
            ("", false),
            ("\n \n{}\r\n", false),
        ] {
            let format = if header {
                DataFormat::Csv
            } else {
                DataFormat::Jsonl
            };
            assert_eq!(
                scan(text, format).rows,
                count_rows(text.as_bytes(), header),
                "{text:?}"
            );
        }
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
        let s = scan(&text, DataFormat::Jsonl);
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
        let cases = [
            ("[1, 2]", "it is a JSON array"),
            ("\"text\"", "it is a JSON string"),
            ("42", "it is a number"),
            ("null", "it is true, false or null"),
            ("text,label", "it is not JSON"),
            (
                "{\"text\": \"a\", \"label\": 1",
                "malformed JSON: `,` or `}` is expected",
            ),
            ("{\"text\": \"a}", "a string is not closed on its line"),
            (
                "{\"text\" \"a\"}",
                "malformed JSON: `:` is expected after a key",
            ),
            (
                "{\"text\": \"a\"} {}",
                "more than one JSON value on the line",
            ),
            ("{\"text\": nope}", "malformed JSON: a value is not valid"),
            (
                "{\"text\": [1, {\"a\": 2}",
                "malformed JSON: an object or array is not closed",
            ),
        ];
        for (row, what) in cases {
            let s = scan(
                &format!("{{\"text\": \"ok\", \"label\": 0}}\n{row}\n"),
                DataFormat::Jsonl,
            );
            assert_eq!(s.first_bad, Some((2, what)), "{row}");
            assert_eq!(s.bad_rows, 1);
        }
        // Nested values, escapes and odd spacing are fine.
        let ok = "\u{feff}{ \"meta\" : {\"a\": [1, \"}\"]}, \"te\\u0078t\": \"a\\\\\", \"label\" : -0.5e3 }";
        let s = scan(ok, DataFormat::Jsonl);
        assert_eq!(s.bad_rows, 0, "{:?}", s.first_bad);
        assert!(s.missing.is_empty(), "{:?}", s.missing);
        assert_eq!(s.labels[0].value, LabelValue::Other("-0.5e3".into()));
    }

    #[test]
    fn missing_and_null_fields_and_string_labels() {
        let s = scan(
            "{\"text\": \"a\", \"label\": \"spam\"}\n{\"text\": \"b\"}\n{\"text\": null, \"label\": \"ham\"}\n{\"text\": \"c\", \"label\": null}\n",
            DataFormat::Jsonl,
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
        let labels: Vec<_> = s
            .labels
            .iter()
            .map(|l| (l.value.to_string(), l.first_line))
            .collect();
        assert_eq!(
            labels,
            [("\"spam\"".to_string(), 1), ("\"ham\"".to_string(), 3)]
        );
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
        let whole = scan(text, DataFormat::Jsonl);
        let trickled = scan_reader(Trickle(text.as_bytes(), 0), &spec(DataFormat::Jsonl)).unwrap();
        assert_eq!(whole, trickled);
        assert_eq!(whole.rows, 5);
        assert_eq!(whole.bad_rows, 2);
        assert_eq!(whole.first_bad, Some((4, "it is a JSON array")));
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
        let s = scan(&text, DataFormat::Jsonl);
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
                std::env::temp_dir().join(format!("recipe-files-{}-{name}", std::process::id()));
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
                0 => text.push_str("  \n"),
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
        let spec = spec(DataFormat::Jsonl);
        let whole = scan_reader(text.as_bytes(), &spec).unwrap();
        assert!(whole.bad_rows > 0 && whole.labels.len() > 5 && !whole.missing.is_empty());
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
        let spec = spec(DataFormat::Jsonl);
        let whole = scan_reader(text.as_bytes(), &spec).unwrap();
        assert!(whole.labels_truncated);
        let file = TempFile::new("labels.jsonl", text.as_bytes());
        let scan = scan_in_parts(&file.0, text.len() as u64, &spec, 3).unwrap();
        assert_eq!(scan, whole);
    }

    #[test]
    fn csv_and_tsv_headers() {
        let s = scan("\"text\", target\nhello,1\n", DataFormat::Csv);
        assert_eq!(s.rows, 1);
        assert_eq!(
            s.header,
            Some((1, vec!["text".to_string(), "target".to_string()]))
        );
        assert_eq!(
            s.missing,
            [MissingField {
                field: "label".into(),
                first_line: 1,
                rows: 0
            }]
        );
        let s = scan("\ntext\tlabel\nhi\t0\n", DataFormat::Tsv);
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
    fn formats_from_words_and_extensions() {
        assert_eq!(
            DataFormat::from_extension("a/b.JSONL"),
            Some(DataFormat::Jsonl)
        );
        assert_eq!(
            DataFormat::from_extension("b.json"),
            Some(DataFormat::Jsonl)
        );
        assert_eq!(DataFormat::from_extension("b.tsv"), Some(DataFormat::Tsv));
        assert_eq!(DataFormat::from_extension("b.txt"), None);
        assert_eq!(DataFormat::from_word("csv"), Some(DataFormat::Csv));
    }
}
