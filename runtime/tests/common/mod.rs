//! Helpers shared by the PyTorch parity tests (`parity.rs`, `mixed_parity.rs`): the safetensors
//! fixtures that `runtime/reference/*.py` write, read as f64.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use recipe_runtime::model::Batch;
use safetensors::tensor::{Dtype, SafeTensors};

/// `runtime/tests/fixtures/<dir>`.
pub fn fixtures(dir: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(dir)
}

/// A fixture file's tensors as f64 (from F32, F64, F16, BF16 or I32, each exact in f64), with
/// their shapes and stored dtypes, and the file's metadata.
pub struct Fixture {
    t: HashMap<String, (Vec<usize>, Dtype, Vec<f64>)>,
    meta: HashMap<String, String>,
}

impl Fixture {
    /// Reads `path`.
    pub fn load(path: &Path) -> Fixture {
        let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let (_, meta) = SafeTensors::read_metadata(&bytes).unwrap();
        let meta = meta.metadata().clone().unwrap_or_default();
        let st = SafeTensors::deserialize(&bytes).unwrap();
        let mut t = HashMap::new();
        for (n, v) in st.iter() {
            let d = v.data();
            let vals: Vec<f64> = match v.dtype() {
                Dtype::F32 => d
                    .chunks_exact(4)
                    .map(|b| f64::from(f32::from_le_bytes(b.try_into().unwrap())))
                    .collect(),
                Dtype::F64 => d
                    .chunks_exact(8)
                    .map(|b| f64::from_le_bytes(b.try_into().unwrap()))
                    .collect(),
                Dtype::F16 => d
                    .chunks_exact(2)
                    .map(|b| half::f16::from_le_bytes(b.try_into().unwrap()).to_f64())
                    .collect(),
                Dtype::BF16 => d
                    .chunks_exact(2)
                    .map(|b| half::bf16::from_le_bytes(b.try_into().unwrap()).to_f64())
                    .collect(),
                Dtype::I32 => d
                    .chunks_exact(4)
                    .map(|b| f64::from(i32::from_le_bytes(b.try_into().unwrap())))
                    .collect(),
                other => panic!("{n}: unexpected fixture dtype {other:?}"),
            };
            t.insert(n.to_string(), (v.shape().to_vec(), v.dtype(), vals));
        }
        Fixture { t, meta }
    }

    /// Tensor `name`'s values.
    pub fn f(&self, name: &str) -> &[f64] {
        &self
            .t
            .get(name)
            .unwrap_or_else(|| panic!("fixture lacks {name}"))
            .2
    }

    /// The tensors' names.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.t.keys().map(String::as_str)
    }

    /// Tensor `name`'s shape.
    pub fn shape(&self, name: &str) -> &[usize] {
        &self.t[name].0
    }

    /// The dtype tensor `name` was stored in.
    pub fn dtype(&self, name: &str) -> Dtype {
        self.t[name].1
    }

    /// Metadata entry `key`, parsed.
    pub fn meta<T: std::str::FromStr>(&self, key: &str) -> T
    where
        T::Err: std::fmt::Debug,
    {
        self.meta[key].parse().unwrap()
    }

    /// Metadata entry `key` as text, if present.
    pub fn meta_str(&self, key: &str) -> Option<&str> {
        self.meta.get(key).map(String::as_str)
    }

    /// Elements `range` of tensor `name` as token ids.
    pub fn u32s(&self, name: &str, range: std::ops::Range<usize>) -> Vec<u32> {
        self.f(name)[range].iter().map(|&x| x as u32).collect()
    }

    /// Micro-batch `i` of stacked `[n, batch, seq]` inputs (or the only one of `[batch, seq]`).
    pub fn batch(&self, i: usize) -> Batch {
        let s = self.shape("input_ids");
        let (b, t) = (s[s.len() - 2], s[s.len() - 1]);
        let tok = i * b * t..(i + 1) * b * t;
        Batch {
            input_ids: self.u32s("input_ids", tok.clone()),
            token_type_ids: self.u32s("token_type_ids", tok.clone()),
            attention_mask: self.u32s("attention_mask", tok),
            labels: self.u32s("labels", i * b..(i + 1) * b),
            batch: b,
            seq: t,
        }
    }
}
