//! `recipe import` round trips: import(build(r)) resolves to the same values as r, and
//! build(import(x)) gives back the same DeepSpeed config and TrainingArguments as x.

use std::path::PathBuf;

use recipe::check::check_source_with;
use recipe::emit::{self, deepspeed::Style, Layout};
use recipe::import::{import, Inputs};
use recipe::resolve::{resolve, Options, Resolved, Val};
use recipe::SourceFile;
use serde_json::Value;

fn examples() -> Vec<PathBuf> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("recipes");
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "rcp"))
        .collect();
    files.sort();
    files
}

fn resolve_text(text: &str, options: &Options) -> Resolved {
    let checked = check_source_with(text, options);
    assert!(!checked.has_errors(), "{text}\n{:#?}", checked.diagnostics);
    resolve(checked.file.as_ref().unwrap(), options)
}

fn layout() -> Layout {
    Layout {
        recipe_dir_from_out: ".".into(),
        out_dir_from_recipe: ".".into(),
    }
}

fn artefact(files: &[(String, Vec<u8>)], name: &str) -> Value {
    let (_, bytes) = files.iter().find(|(n, _)| n == name).unwrap();
    serde_json::from_slice(bytes).unwrap()
}

/// Artefacts: (file name, contents).
type Files = Vec<(String, Vec<u8>)>;

/// Builds a recipe, imports the artefacts back, and returns both resolutions and artefacts.
fn round_trip(path: &PathBuf) -> (Resolved, Resolved, Files, Files) {
    let text = std::fs::read_to_string(path).unwrap();
    let options = Options {
        base_dir: path.parent().map(|p| p.to_path_buf()),
        ..Options::default()
    };
    let r = resolve_text(&text, &options);
    let source = SourceFile::new("r.rcp", text);
    let built = emit::build(&r, &source, &[], &layout(), Style::Explicit).files;
    let labels = match r.val("model.task").and_then(|t| t.arg("labels")) {
        Some(Val::List(items)) => items.len() as u64,
        Some(v) => v.as_i64().unwrap() as u64,
        None => 2,
    };
    let inputs = Inputs {
        model: r.str("model.from").map(str::to_string),
        train: r.str("data.train").map(str::to_string),
        eval: r.str("data.eval").map(str::to_string),
        samples: r.uint("data.samples"),
        labels: Some(labels),
        gpus: r.uint("cluster.gpus"),
        nodes: r.uint("cluster.nodes"),
        targets: recipe::versions::Library::ALL
            .iter()
            .enumerate()
            .filter(|(i, _)| {
                !matches!(
                    r.target_sources[*i],
                    recipe::resolve::Source::Default { .. }
                )
            })
            .map(|(_, lib)| (lib.key().to_string(), r.targets.get(*lib).to_string()))
            .collect(),
        origin: "a test".into(),
    };
    let imported = import(
        &artefact(&built, "ds_config.json"),
        Some(&artefact(&built, "training_args.json")),
        &inputs,
    );
    // The imported recipe names no local files: steps come from `samples`.
    let back = resolve_text(&imported, &Options::default());
    let source = SourceFile::new("i.rcp", imported);
    let rebuilt = emit::build(&back, &source, &[], &layout(), Style::Explicit).files;
    (r, back, built, rebuilt)
}

#[test]
fn import_of_a_build_resolves_to_the_same_values() {
    let keys = [
        "batch.micro",
        "batch.accumulate",
        "batch.global",
        "cluster.world_size",
        "optimizer.kind",
        "optimizer.owner",
        "optimizer.lr",
        "optimizer.betas",
        "optimizer.eps",
        "optimizer.weight_decay",
        "schedule.kind",
        "steps.warmup",
        "steps.total",
        "steps.per_epoch",
        "train.precision",
        "train.clip",
        "train.epochs",
        "train.seed",
        "zero.stage",
        "zero.offload optimizer",
        "zero.offload param",
        "zero.reduce_bucket",
    ];
    for path in examples() {
        let (r, back, _, _) = round_trip(&path);
        for key in keys {
            let (a, b) = (r.val(key), back.val(key));
            let same = match (a.and_then(Val::as_f64), b.and_then(Val::as_f64)) {
                (Some(x), Some(y)) => x == y,
                // `cpu` and `cpu(pin_memory: true)` are the same place (the import states the
                // pin_memory the build made explicit).
                _ if a.and_then(Val::as_word).is_some() => {
                    a.and_then(Val::as_word) == b.and_then(Val::as_word)
                }
                _ => a.map(|v| v.to_string()) == b.map(|v| v.to_string()),
            };
            assert!(same, "{}: {key}: {a:?} became {b:?}", path.display());
        }
    }
}

#[test]
fn build_of_an_import_gives_back_the_same_artefacts() {
    for path in examples() {
        let (_, _, built, rebuilt) = round_trip(&path);
        for name in ["ds_config.json", "training_args.json"] {
            let (x, y) = (artefact(&built, name), artefact(&rebuilt, name));
            assert_eq!(
                x,
                y,
                "{}: {name} differs after import and rebuild",
                path.display()
            );
        }
    }
}
