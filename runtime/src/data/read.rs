//! Reading labelled text rows from JSON Lines, CSV or TSV into [`Example`]s.
//!
//! Files are streamed (a `BufReader` for JSONL, the `csv` crate's own buffer for CSV/TSV), and
//! every row remembers its 1-based line so that later stages (tokenization) can still point at it.
//! What a row is (blank lines, CSV records, their lines) comes from [`super::format`], which the
//! compiler's row count ([`super::scan`]) uses too.

use std::fs::File;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};

use serde_json::Value;

use super::format::{self, Format, LineTracker};
use super::{DataError, LabelSet};

/// Where the data is and which fields hold what: the recipe's `data` block.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DataSpec {
    /// The data file.
    pub path: PathBuf,
    /// Its layout.
    pub format: Format,
    /// The field (JSONL key or CSV/TSV column) holding the text.
    pub text: String,
    /// The field holding the second text of a pair task (NLI, QA), if any.
    pub text_pair: Option<String>,
    /// The field holding the label.
    pub label: String,
}

/// One labelled row of a data file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Example {
    /// The text.
    pub text: String,
    /// The second text, when the spec names a `text_pair` field.
    pub text_pair: Option<String>,
    /// The class id in the declared [`LabelSet`].
    pub label: u32,
    /// The 1-based line the row starts on.
    pub line: usize,
}

/// All rows of `spec.path`, in file order, with labels mapped onto `labels`.
///
/// Fails on the first bad row, naming the file and line. A file without rows is an error too:
/// training on nothing is never what a recipe means.
pub fn read_examples(spec: &DataSpec, labels: &LabelSet) -> Result<Vec<Example>, DataError> {
    let file = File::open(&spec.path).map_err(|source| DataError::Io {
        path: spec.path.clone(),
        source,
    })?;
    match spec.format.resolve(&spec.path)? {
        Format::Jsonl => {
            let mut reader = BufReader::new(file);
            let head = reader.fill_buf().map_err(|source| DataError::Io {
                path: spec.path.clone(),
                source,
            })?;
            if super::scan::is_json_array(head) {
                read_json_array(spec, labels, reader)
            } else {
                read_jsonl(spec, labels, reader)
            }
        }
        format => read_delimited(spec, labels, file, format),
    }
}

fn json_type(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

fn read_jsonl(
    spec: &DataSpec,
    labels: &LabelSet,
    reader: impl BufRead,
) -> Result<Vec<Example>, DataError> {
    let path = &spec.path;
    let mut out = Vec::new();
    let mut last = 1;
    for (i, line) in reader.split(b'\n').enumerate() {
        let line_no = i + 1;
        last = line_no;
        let mut line = line.map_err(|source| DataError::IoAt {
            path: path.clone(),
            line: line_no,
            source,
        })?;
        if line.last() == Some(&b'\r') {
            line.pop();
        }
        // Not UTF-8: a bad row, as the checker's scan says (scan.rs `json_line`) and as a CSV/TSV
        // record is (`format::NOT_UTF8`), rather than an error reading the file.
        let line = String::from_utf8(line).map_err(|_| DataError::Json {
            path: path.clone(),
            line: line_no,
            message: format::NOT_UTF8.to_string(),
        })?;
        // Editors on Windows may start the file with a byte-order mark, which JSON forbids.
        let line = if line_no == 1 {
            line.strip_prefix('\u{feff}').unwrap_or(&line)
        } else {
            &line
        };
        if format::is_blank(line.as_bytes()) {
            continue;
        }
        let value: Value = serde_json::from_str(line).map_err(|e| DataError::Json {
            path: path.clone(),
            line: line_no,
            message: format!("not valid JSON (one object per line is expected): {e}"),
        })?;
        out.push(example(spec, labels, line_no, value)?);
    }
    if out.is_empty() {
        return Err(DataError::Empty {
            path: path.clone(),
            line: last,
        });
    }
    Ok(out)
}

/// The rows of a JSON array file (one array of objects, [`super::scan::is_json_array`]), as
/// HF's json loader takes them: each element a row, on the line where it starts; in what it
/// takes for a list of strings ([`super::scan::array_of_strings`]), each element the value of
/// the row's one field, `text`. The file is read whole, as there; its elements are cut by the
/// scan's own walk ([`super::scan::array_elements`]), so that `recipe check` and `recipe run`
/// find the same rows and stop at the same one.
fn read_json_array(
    spec: &DataSpec,
    labels: &LabelSet,
    mut reader: impl std::io::Read,
) -> Result<Vec<Example>, DataError> {
    let path = &spec.path;
    let mut bytes = Vec::new();
    reader
        .read_to_end(&mut bytes)
        .map_err(|source| DataError::Io {
            path: path.clone(),
            source,
        })?;
    let strings = super::scan::array_of_strings(&bytes);
    let mut elements = Vec::new();
    let fault = super::scan::array_elements(&bytes, |line, _, range| {
        elements.push((line as usize, range));
    });
    let mut out = Vec::with_capacity(elements.len());
    for (line, range) in elements {
        let mut value: Value =
            serde_json::from_slice(&bytes[range]).map_err(|e| DataError::Json {
                path: path.clone(),
                line,
                message: format!("not valid JSON: {e}"),
            })?;
        if strings {
            let field = super::scan::STRINGS_FIELD.to_string();
            value = Value::Object([(field, value)].into_iter().collect());
        }
        out.push(example(spec, labels, line, value)?);
    }
    if let Err((line, message)) = fault {
        return Err(DataError::Json {
            path: path.clone(),
            line: line as usize,
            message,
        });
    }
    if out.is_empty() {
        let line = 1 + bytes.iter().filter(|&&c| c == b'\n').count();
        return Err(DataError::Empty {
            path: path.clone(),
            line,
        });
    }
    Ok(out)
}

/// One row's example from its parsed JSON: an object with the text(s) and a declared label.
fn example(
    spec: &DataSpec,
    labels: &LabelSet,
    line_no: usize,
    value: Value,
) -> Result<Example, DataError> {
    let path = &spec.path;
    let Value::Object(obj) = value else {
        return Err(DataError::Json {
            path: path.clone(),
            line: line_no,
            message: format!(
                "expected a JSON object per row, found {}",
                json_type(&value)
            ),
        });
    };
    let text_of = |field: &str, role: &'static str| -> Result<String, DataError> {
        match obj.get(field) {
            Some(Value::String(s)) => Ok(s.clone()),
            Some(other) => Err(DataError::NotText {
                path: path.clone(),
                line: line_no,
                field: field.to_string(),
                role,
                found: json_type(other),
            }),
            None => Err(missing(path, line_no, field, role, String::new())),
        }
    };
    let text = text_of(&spec.text, "text")?;
    let text_pair = match &spec.text_pair {
        Some(f) => Some(text_of(f, "text_pair")?),
        None => None,
    };
    let raw = obj
        .get(&spec.label)
        .ok_or_else(|| missing(path, line_no, &spec.label, "label", String::new()))?;
    let id = match raw {
        Value::Number(n) => n.as_i64().and_then(|v| labels.id_of_int(v)),
        Value::String(s) => labels.id_of_str(s),
        _ => None,
    };
    let label = id.ok_or_else(|| DataError::BadLabel {
        path: path.clone(),
        line: line_no,
        value: raw.to_string(),
        allowed: labels.allowed(),
    })?;
    Ok(Example {
        text,
        text_pair,
        label,
        line: line_no,
    })
}

fn missing(path: &Path, line: usize, field: &str, role: &'static str, found: String) -> DataError {
    DataError::MissingField {
        path: path.to_path_buf(),
        line,
        field: field.to_string(),
        role,
        found,
    }
}

/// The csv crate's error as `path:line: message`; `fallback` is the line when it knows none.
fn csv_error<R>(
    path: &Path,
    e: csv::Error,
    index: &mut LineTracker<R>,
    fallback: usize,
) -> DataError {
    let line = e.position().map_or(fallback, |p| index.line_at(p.byte()));
    let message = match e.kind() {
        csv::ErrorKind::UnequalLengths {
            expected_len, len, ..
        } => format::ragged_message(*len as usize, *expected_len as usize),
        csv::ErrorKind::Utf8 { .. } => format::NOT_UTF8.to_string(),
        csv::ErrorKind::Io(err) => format!("cannot read the line: {err}"),
        _ => e.to_string(),
    };
    DataError::Csv {
        path: path.to_path_buf(),
        line,
        message,
    }
}

fn read_delimited(
    spec: &DataSpec,
    labels: &LabelSet,
    file: File,
    format: Format,
) -> Result<Vec<Example>, DataError> {
    let path = &spec.path;
    // The csv reader buffers internally, so no BufReader is needed around the file. Flexible:
    // a blank line of spaces is one field, to skip before the field count is checked here.
    let mut rdr = format::csv_reader(format, file, true);
    let header = match rdr.headers() {
        Ok(h) => h.clone(),
        Err(e) => return Err(csv_error(path, e, rdr.get_mut(), 1)),
    };
    let header_line = header
        .position()
        .map_or(1, |p| rdr.get_mut().line_at(p.byte()));
    // A header of empty names (`,`) is a header without the recipe's columns, as the checker's
    // scan takes it (R0703), not an empty file.
    if header.is_empty() {
        return Err(DataError::Empty {
            path: path.clone(),
            line: header_line,
        });
    }
    let column = |field: &str, role: &'static str| -> Result<usize, DataError> {
        header.iter().position(|h| h == field).ok_or_else(|| {
            let names: Vec<&str> = header.iter().collect();
            missing(
                path,
                header_line,
                field,
                role,
                format!("; the header has: {}", names.join(", ")),
            )
        })
    };
    let text_col = column(&spec.text, "text")?;
    let pair_col = match &spec.text_pair {
        Some(f) => Some(column(f, "text_pair")?),
        None => None,
    };
    let label_col = column(&spec.label, "label")?;

    let mut out = Vec::new();
    let mut last = header_line;
    let mut bytes = csv::ByteRecord::new();
    loop {
        match rdr.read_byte_record(&mut bytes) {
            Ok(true) => {}
            Ok(false) => break,
            Err(e) => return Err(csv_error(path, e, rdr.get_mut(), last + 1)),
        }
        if format::is_blank_record(&bytes) {
            continue;
        }
        let line = bytes
            .position()
            .map_or(last + 1, |p| rdr.get_mut().line_at(p.byte()));
        last = line;
        let row_error = |message: String| DataError::Csv {
            path: path.clone(),
            line,
            message,
        };
        if bytes.len() != header.len() {
            return Err(row_error(format::ragged_message(bytes.len(), header.len())));
        }
        let record = csv::StringRecord::from_byte_record(std::mem::take(&mut bytes))
            .map_err(|_| row_error(format::NOT_UTF8.to_string()))?;
        // Checked against the header's field count above: the header's columns are in the row.
        let cell = |c: usize| record.get(c).unwrap_or_default();
        let raw = cell(label_col);
        let label = labels.id_of_str(raw).ok_or_else(|| DataError::BadLabel {
            path: path.clone(),
            line,
            value: Value::String(raw.to_string()).to_string(),
            allowed: labels.allowed(),
        })?;
        out.push(Example {
            text: cell(text_col).to_string(),
            text_pair: pair_col.map(|c| cell(c).to_string()),
            label,
            line,
        });
        bytes = record.into_byte_record(); // its buffers, for the next row
    }
    if out.is_empty() {
        return Err(DataError::Empty {
            path: path.clone(),
            line: last,
        });
    }
    Ok(out)
}
