//! Emitters: pure functions from a [`Resolved`] recipe to the artefacts `recipe build` writes.
//! No I/O here; the CLI writes the files atomically.

pub mod deepspeed;
pub mod launch;
pub mod launch_native;
pub mod lock;
pub mod plan;
pub mod train_py;
pub mod training_args;

use crate::diagnostics::source::SourceFile;
use crate::resolve::Resolved;

/// What `recipe build` writes, in order (the lock last).
#[derive(Debug, Clone)]
pub struct Artefacts {
    /// (file name, contents).
    pub files: Vec<(String, Vec<u8>)>,
}

/// Where things are, for the paths written into the artefacts.
#[derive(Debug, Clone)]
pub struct Layout {
    /// The recipe's directory, relative to the output directory (for launch.sh's `cd`).
    pub recipe_dir_from_out: String,
    /// The output directory, relative to the recipe's directory (for `--deepspeed`).
    pub out_dir_from_recipe: String,
}

impl Layout {
    /// A file of the output directory, as a path from the recipe's directory.
    pub fn from_recipe(&self, name: &str) -> String {
        let out = self.out_dir_from_recipe.trim_end_matches('/');
        if out.is_empty() || out == "." {
            name.to_string()
        } else {
            format!("{out}/{name}")
        }
    }
}

fn pretty(v: &serde_json::Value) -> Vec<u8> {
    let mut s = serde_json::to_string_pretty(v).expect("JSON values serialize");
    s.push('\n');
    s.into_bytes()
}

/// Builds every artefact of the DeepSpeed + HF target.
pub fn build(
    r: &Resolved,
    source: &SourceFile,
    flags: &[String],
    layout: &Layout,
    style: deepspeed::Style,
) -> Artefacts {
    let ds = deepspeed::config(r, style);
    let args = training_args::arguments(r, &layout.from_recipe("ds_config.json"));
    let mut files = vec![
        ("ds_config.json".to_string(), pretty(&ds)),
        ("training_args.json".to_string(), pretty(&args)),
    ];
    // train.py before launch.sh, which runs it: the files are renamed into place in this order.
    let train_py = layout.from_recipe(train_py::FILE);
    let script = if train_py::written(r) {
        files.push((
            train_py::FILE.to_string(),
            train_py::script(r, &source.name).into_bytes(),
        ));
        launch::Script::Written(&train_py)
    } else {
        launch::Script::Own(r.text("train.script"))
    };
    let launch = launch::script(r, &args, &layout.recipe_dir_from_out, &source.name, script);
    files.push(("launch.sh".to_string(), launch.into_bytes()));
    let lock = lock::lock(r, source, flags, &files);
    files.push((
        "recipe.lock".to_string(),
        pretty(&serde_json::to_value(&lock).expect("the lock serializes")),
    ));
    Artefacts { files }
}
