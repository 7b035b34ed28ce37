//! `recipe import ds_config.json [--args training_args.json]`: the recipe on stdout, its check on
//! stderr (exit 1 when the imported setup has errors: the linter use).

use std::path::{Path, PathBuf};

use recipe::commands::import::{comment, import, Inputs};
use recipe::diagnostics::render_human;
use recipe::SourceFile;

use super::{style, RecipeFlags, FAILED, OK, USAGE};

/// A JSON file's settings, from the text already read.
fn settings(file: &SourceFile) -> Result<serde_json::Value, String> {
    let v: serde_json::Value = serde_json::from_str(&file.text)
        .map_err(|e| format!("`{}` is not JSON: {e}", file.name))?;
    if !v.is_object() {
        return Err(format!(
            "`{}` is JSON but not an object of settings (`{{ … }}`)",
            file.name
        ));
    }
    Ok(v)
}

/// What the user says that the configs do not: the model and the data.
pub struct Given {
    pub model: Option<String>,
    pub train: Option<String>,
    pub eval: Option<String>,
    pub labels: Option<u64>,
    pub hidden_size: Option<u64>,
}

pub fn run(
    file: &Path,
    args: Option<&PathBuf>,
    given: Given,
    force: bool,
    flags: &RecipeFlags,
) -> i32 {
    let Some(ds_file) = super::read(file) else {
        return USAGE;
    };
    let args_file = match args.map(|p| super::read(p)) {
        Some(None) => return USAGE,
        Some(f) => f,
        None => None,
    };
    let parsed = settings(&ds_file).and_then(|ds| {
        let hf = args_file.as_ref().map(settings).transpose()?;
        Ok((ds, hf))
    });
    let (ds, hf) = match parsed {
        Ok(v) => v,
        Err(e) => {
            eprintln!("error: {e}");
            return USAGE;
        }
    };
    // The pair as the real stack takes it, first: a pair it refuses gets no recipe (unless
    // --force), since a recipe is consistent by construction and would hide the conflict.
    let pair_opts = match super::pair::options(flags, file, given.hidden_size, false) {
        Ok(o) => o,
        Err(e) => {
            eprintln!("error: {e}");
            return USAGE;
        }
    };
    let report = recipe::pair::check(
        ds_file,
        args_file.map(recipe::pair::ArgsInput::Json),
        &pair_opts,
    );
    if super::pair::print(&report, flags.format, true).is_err() {
        return USAGE;
    }
    let conflicts: Vec<String> = report
        .findings
        .iter()
        .filter(|f| f.severity == recipe::Severity::Error)
        .map(|f| format!("{} {}", f.code, f.message))
        .collect();
    if !conflicts.is_empty() && !force {
        eprintln!(
            "error: the real stack refuses this pair ({} error{} above), so no recipe is written; \
             fix the pair, or give --force to write one marked where the pair conflicts",
            conflicts.len(),
            if conflicts.len() == 1 { "" } else { "s" }
        );
        return FAILED;
    }
    let mut origin = file.display().to_string();
    if let Some(a) = args {
        origin.push_str(&format!(" and {}", a.display()));
    }
    let options = match flags.options(Path::new("-")) {
        Ok(o) => o,
        Err(e) => {
            eprintln!("error: {e}");
            return USAGE;
        }
    };
    let inputs = Inputs {
        targets: options
            .targets
            .iter()
            .map(|(lib, v)| (lib.key().to_string(), v.to_string()))
            .collect(),
        // A local model directory's config.json gives the hidden size (the check reads it).
        model_is_local: given
            .model
            .as_ref()
            .is_some_and(|m| Path::new(m).join("config.json").is_file()),
        model: given.model,
        train: given.train,
        eval: given.eval,
        samples: flags.samples,
        labels: given.labels,
        hidden_size: given.hidden_size,
        gpus: flags.gpus,
        nodes: flags.nodes,
        origin,
    };
    let mut text = import(&ds, hf.as_ref(), &inputs);
    // Silent changes the stack makes to the pair (accelerate's inserts, arguments the run does
    // not use): the recipe states one consistent run, so say where it differs from the pair's.
    let surprises: String = report
        .findings
        .iter()
        .filter(|f| {
            f.severity == recipe::Severity::Warning
                && [
                    recipe::pair::codes::ACCELERATE_CHANGES,
                    recipe::pair::codes::ARGS_IGNORED,
                ]
                .contains(&f.code)
        })
        .map(|f| {
            comment(&format!(
                "the pair as the stack runs it: {} {}",
                f.code,
                f.message.replace('\n', " ")
            ))
        })
        .collect();
    text = format!("{surprises}{text}");
    if !conflicts.is_empty() {
        // --force: the recipe says where the pair it came from conflicts.
        let marks: String = conflicts
            .iter()
            .map(|c| {
                comment(&format!(
                    "conflict in the imported pair (--force): {}",
                    c.replace('\n', " ")
                ))
            })
            .collect();
        text = format!("{marks}{text}");
    }
    print!("{text}");
    // The args file as it is, against the target transformers (the linter use): a key that
    // release does not have is reported even where the import maps it.
    if let (Some(hf), Some(path)) = (&hf, args) {
        let mut t = recipe::upstream::versions::Targets::newest();
        for (lib, v) in &options.targets {
            t.set(*lib, *v);
        }
        let tf = t.get(recipe::upstream::versions::Library::Transformers);
        let given = options
            .targets
            .iter()
            .any(|(lib, _)| *lib == recipe::upstream::versions::Library::Transformers);
        for m in recipe::commands::import::unknown_args(hf, tf) {
            if flags.format == super::Format::Json {
                let line = serde_json::json!({
                    "severity": "warning", "file": path.display().to_string(), "message": m
                });
                eprintln!("{line}");
                continue;
            }
            eprintln!("warning: {}: {m}", path.display());
            if !given {
                eprintln!(
                    "  help: for files written for another release, give it: --target transformers=X"
                );
            }
        }
    }
    // Check what was imported, against the generated text (its `target` line already holds
    // the --target versions).
    let source = SourceFile::new("<imported>", text);
    let checked = recipe::check::check_source_with(&source.text, &options);
    for d in &checked.diagnostics {
        match flags.format {
            // stdout holds the recipe: the JSON lines go to stderr.
            super::Format::Json => eprintln!(
                "{}",
                serde_json::to_string(&recipe::diagnostics::to_json(d, &source))
                    .expect("a diagnostic serializes")
            ),
            super::Format::Human => eprint!("{}", render_human(d, &source, style())),
        }
    }
    if checked.has_errors() {
        FAILED
    } else {
        OK
    }
}
