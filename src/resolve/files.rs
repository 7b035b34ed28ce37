//! Values read from files next to the recipe: the training rows (for step accounting) and the
//! model's config.json (for the hidden-size dependent DeepSpeed buckets). Relative paths are
//! taken from the recipe's directory.

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
    let Ok(bytes) = std::fs::read(&path) else {
        return;
    };
    let header = matches!(r.word("data.format"), Some("csv" | "tsv"));
    let rows = count_rows(&bytes, header);
    r.set(
        "data.samples",
        Val::Int(rows as i64),
        Source::File {
            what: format!("{rows} rows of {}", path.display()),
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

/// `model.hidden_size` from a local model directory's config.json, unless written.
pub fn model_config(r: &mut Resolved, options: &Options) {
    if r.is_given("model.hidden_size") {
        return;
    }
    let dir = r
        .str("model.from")
        .or_else(|| r.str("model.config"))
        .map(str::to_string);
    let Some(dir) = dir else { return };
    let mut path = local(&dir, options);
    if path.is_dir() {
        path = path.join("config.json");
    }
    let Ok(text) = std::fs::read_to_string(&path) else {
        return;
    };
    let Ok(json) = serde_json::from_str::<serde_json::Value>(&text) else {
        return;
    };
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
                what: format!("hidden_size of {}", path.display()),
            },
        );
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
