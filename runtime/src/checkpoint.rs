//! Safetensors and `config.json` IO for HF-compatible checkpoints.
//!
//! Reading converts F32 / F16 / BF16 tensors to `f32` and sets integer tensors (buffers such as
//! `embeddings.position_ids`) aside; writing produces F32 tensors with `{"format": "pt"}` metadata,
//! which is what `transformers` expects, and replaces a checkpoint directory atomically.

use std::collections::HashMap;
use std::fs;
use std::path::{Path, PathBuf};

use safetensors::tensor::{Dtype, SafeTensors, TensorView};

use crate::model::ModelError;

/// A floating-point tensor read from a safetensors file, converted to `f32`.
#[derive(Debug, Clone, PartialEq)]
pub struct Tensor {
    /// Name as stored in the file.
    pub name: String,
    /// Shape as stored in the file.
    pub shape: Vec<usize>,
    /// Values, row-major.
    pub data: Vec<f32>,
}

/// The contents of a safetensors file: its float tensors (sorted by name) and the names of its
/// integer tensors, which a model loader skips.
#[derive(Debug, Clone, Default)]
pub struct TensorFile {
    /// F32 / F16 / BF16 tensors, converted to `f32`.
    pub tensors: Vec<Tensor>,
    /// Names of integer (and boolean) tensors.
    pub skipped: Vec<String>,
}

fn io_err(path: &Path, e: std::io::Error) -> ModelError {
    ModelError::Io {
        path: path.to_path_buf(),
        message: e.to_string(),
    }
}

/// IEEE binary16 → f32 (exact: every f16 is an f32).
fn f16_to_f32(h: u16) -> f32 {
    let sign = u32::from(h >> 15) << 31;
    let exp = u32::from((h >> 10) & 0x1f);
    let man = u32::from(h & 0x3ff);
    let bits = match (exp, man) {
        (0, 0) => sign,
        (0, m) => {
            // Subnormal: value m · 2^-24. Shift the top set bit to position 10 (the implicit
            // bit), lowering the exponent by the same amount.
            let lz = m.leading_zeros() - 21;
            let m = (m << lz) & 0x3ff;
            sign | ((127 - 14 - lz) << 23) | (m << 13)
        }
        (0x1f, m) => sign | 0x7f80_0000 | (m << 13),
        (e, m) => sign | ((e + 127 - 15) << 23) | (m << 13),
    };
    f32::from_bits(bits)
}

/// Reads every tensor of the safetensors file at `path`.
pub fn read_safetensors(path: &Path) -> Result<TensorFile, ModelError> {
    let bytes = fs::read(path).map_err(|e| io_err(path, e))?;
    let st = SafeTensors::deserialize(&bytes).map_err(|e| ModelError::Safetensors {
        path: path.to_path_buf(),
        message: e.to_string(),
    })?;
    let mut out = TensorFile::default();
    for (name, view) in st.iter() {
        let raw = view.data();
        let data: Vec<f32> = match view.dtype() {
            Dtype::F32 => raw
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .collect(),
            Dtype::F16 => raw
                .chunks_exact(2)
                .map(|b| f16_to_f32(u16::from_le_bytes([b[0], b[1]])))
                .collect(),
            // bf16 is the top half of an f32.
            Dtype::BF16 => raw
                .chunks_exact(2)
                .map(|b| f32::from_bits(u32::from(u16::from_le_bytes([b[0], b[1]])) << 16))
                .collect(),
            Dtype::BOOL
            | Dtype::U8
            | Dtype::I8
            | Dtype::I16
            | Dtype::U16
            | Dtype::I32
            | Dtype::U32
            | Dtype::I64
            | Dtype::U64 => {
                out.skipped.push(name.to_string());
                continue;
            }
            other => {
                return Err(ModelError::Dtype {
                    name: name.to_string(),
                    dtype: format!("{other:?}"),
                })
            }
        };
        out.tensors.push(Tensor {
            name: name.to_string(),
            shape: view.shape().to_vec(),
            data,
        });
    }
    // The parser's order is unspecified; sort so that errors name the same tensor every time.
    out.tensors.sort_by(|a, b| a.name.cmp(&b.name));
    out.skipped.sort();
    Ok(out)
}

/// Serialises `(name, shape, values)` tensors as F32 safetensors bytes with `metadata`.
pub fn safetensors_bytes(
    tensors: &[(String, Vec<usize>, &[f32])],
    metadata: HashMap<String, String>,
) -> Result<Vec<u8>, ModelError> {
    let raw: Vec<Vec<u8>> = tensors
        .iter()
        .map(|(_, _, d)| d.iter().flat_map(|x| x.to_le_bytes()).collect())
        .collect();
    let mut views = Vec::with_capacity(tensors.len());
    for ((name, shape, _), bytes) in tensors.iter().zip(&raw) {
        let v = TensorView::new(Dtype::F32, shape.clone(), bytes).map_err(|e| {
            ModelError::Safetensors {
                path: PathBuf::from(name),
                message: e.to_string(),
            }
        })?;
        views.push((name.clone(), v));
    }
    let bytes = safetensors::tensor::serialize(views, Some(metadata)).map_err(|e| {
        ModelError::Safetensors {
            path: PathBuf::new(),
            message: e.to_string(),
        }
    })?;
    Ok(sorted_metadata(bytes))
}

/// `bytes` (a safetensors file) with its header's `__metadata__` in key order. The crate
/// writes the metadata from its `HashMap` in that map's order, which differs from process to
/// process, so the same checkpoint would not be the same bytes run after run. The header is
/// JSON padded with spaces to a multiple of 8 bytes (the format's alignment of the data); the
/// tensors' entries keep their explicit offsets, so only the header changes.
fn sorted_metadata(bytes: Vec<u8>) -> Vec<u8> {
    let header = bytes
        .get(..8)
        .and_then(|b| b.try_into().ok())
        .map(u64::from_le_bytes)
        .and_then(|n| usize::try_from(n).ok())
        .filter(|&n| bytes.len() >= 8 + n);
    let Some(n) = header else {
        return bytes;
    };
    let Ok(serde_json::Value::Object(mut fields)) =
        serde_json::from_slice::<serde_json::Value>(&bytes[8..8 + n])
    else {
        return bytes;
    };
    if let Some(serde_json::Value::Object(meta)) = fields.remove("__metadata__") {
        let sorted: std::collections::BTreeMap<_, _> = meta.into_iter().collect();
        let mut first = serde_json::Map::new();
        first.insert("__metadata__".into(), serde_json::json!(sorted));
        first.extend(fields);
        fields = first;
    }
    let Ok(mut text) = serde_json::to_string(&fields) else {
        return bytes;
    };
    while text.len() % 8 != 0 {
        text.push(' ');
    }
    let mut out = Vec::with_capacity(8 + text.len() + bytes.len() - 8 - n);
    out.extend_from_slice(&(text.len() as u64).to_le_bytes());
    out.extend_from_slice(text.as_bytes());
    out.extend_from_slice(&bytes[8 + n..]);
    out
}

/// Writes `files` (name, contents) as directory `dir`, all or nothing: they go into a fresh
/// sibling directory first, which then takes `dir`'s place, so a crash never leaves a half-written
/// checkpoint under `dir`.
pub fn write_dir_atomically(dir: &Path, files: &[(&str, Vec<u8>)]) -> Result<(), ModelError> {
    let parent = match dir.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let base = dir
        .file_name()
        .ok_or_else(|| ModelError::Io {
            path: dir.to_path_buf(),
            message: "not a directory name".into(),
        })?
        .to_string_lossy()
        .into_owned();
    fs::create_dir_all(&parent).map_err(|e| io_err(&parent, e))?;
    let tmp = parent.join(format!(".{base}.tmp-{}", std::process::id()));
    if tmp.exists() {
        fs::remove_dir_all(&tmp).map_err(|e| io_err(&tmp, e))?;
    }
    fs::create_dir(&tmp).map_err(|e| io_err(&tmp, e))?;
    for (name, bytes) in files {
        let p = tmp.join(name);
        let mut f = fs::File::create(&p).map_err(|e| io_err(&p, e))?;
        std::io::Write::write_all(&mut f, bytes).map_err(|e| io_err(&p, e))?;
        f.sync_all().map_err(|e| io_err(&p, e))?;
    }
    if dir.exists() {
        // Move the old checkpoint aside, put the new one in place, then delete the old one.
        let old = parent.join(format!(".{base}.old-{}", std::process::id()));
        fs::rename(dir, &old).map_err(|e| io_err(dir, e))?;
        fs::rename(&tmp, dir).map_err(|e| io_err(dir, e))?;
        fs::remove_dir_all(&old).map_err(|e| io_err(&old, e))?;
    } else {
        fs::rename(&tmp, dir).map_err(|e| io_err(dir, e))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn f16_conversion_is_exact() {
        assert_eq!(f16_to_f32(0x3c00), 1.0);
        assert_eq!(f16_to_f32(0xc000), -2.0);
        assert_eq!(f16_to_f32(0x7bff), 65504.0);
        assert_eq!(f16_to_f32(0x0001), 2f32.powi(-24));
        assert_eq!(f16_to_f32(0x0200), 2f32.powi(-15));
        assert_eq!(f16_to_f32(0x3555), 0.333_251_95);
        assert!(f16_to_f32(0x7c00).is_infinite());
        assert!(f16_to_f32(0x7e00).is_nan());
    }

    /// The same tensors and metadata give the same bytes whatever order the metadata's map
    /// hands its keys in (each `HashMap` has its own), with the metadata in key order, and
    /// read back whole.
    #[test]
    fn a_checkpoint_is_the_same_bytes_whatever_the_metadata_order() {
        let w = [1.0f32, -2.5, 3.25];
        let tensors = [
            ("b.bias".to_string(), vec![3], &w[..]),
            ("a.weight".to_string(), vec![1, 3], &w[..]),
        ];
        let keys = ["step", "optimizer", "elements", "zeta", "alpha", "mid"];
        let files: Vec<Vec<u8>> = (0..16)
            .map(|i| {
                let meta: HashMap<String, String> = keys
                    .iter()
                    .cycle()
                    .skip(i)
                    .take(keys.len())
                    .map(|k| (k.to_string(), format!("{k}-value")))
                    .collect();
                safetensors_bytes(&tensors, meta).unwrap()
            })
            .collect();
        assert!(files.iter().all(|f| f == &files[0]));
        let n = u64::from_le_bytes(files[0][..8].try_into().unwrap()) as usize;
        assert_eq!(n % 8, 0);
        let header = std::str::from_utf8(&files[0][8..8 + n]).unwrap();
        let at = |k: &str| header.find(&format!("\"{k}\":\"{k}-value\"")).unwrap();
        let mut sorted = keys;
        sorted.sort_unstable();
        assert!(sorted.windows(2).all(|p| at(p[0]) < at(p[1])), "{header}");
        let dir = std::env::temp_dir().join(format!("recipe-st-order-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("x.safetensors");
        std::fs::write(&path, &files[0]).unwrap();
        let back = read_safetensors(&path).unwrap();
        let _ = std::fs::remove_dir_all(&dir);
        assert_eq!(back.tensors.len(), 2);
        assert!(back.tensors.iter().all(|t| t.data == w));
    }
}
