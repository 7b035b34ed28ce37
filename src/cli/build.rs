//! `recipe build FILE [-o DIR] [--auto]`: writes ds_config.json, training_args.json, train.py,
//! launch.sh and recipe.lock. Everything is written to a temporary directory inside DIR first and
//! renamed into place file by file; a recipe with errors writes nothing, and a failed write leaves
//! the previous outputs as they were.

use std::path::{Component, Path, PathBuf};

use recipe::emit::{self, deepspeed::Style, Layout};

use super::{load, RecipeFlags, FAILED, OK, USAGE};

/// `to` relative to `from` (both absolute and canonical).
fn relative(from: &Path, to: &Path) -> String {
    let f: Vec<Component> = from.components().collect();
    let t: Vec<Component> = to.components().collect();
    let common = f.iter().zip(&t).take_while(|(a, b)| a == b).count();
    let mut parts: Vec<String> = std::iter::repeat_n("..".to_string(), f.len() - common).collect();
    parts.extend(
        t[common..]
            .iter()
            .map(|c| c.as_os_str().to_string_lossy().into_owned()),
    );
    if parts.is_empty() {
        ".".into()
    } else {
        parts.join("/")
    }
}

/// The flags as given, for the lock's input hash.
fn flag_words(flags: &RecipeFlags) -> Vec<String> {
    let mut out = Vec::new();
    if let Some(g) = flags.gpus {
        out.push(format!("--gpus={g}"));
    }
    if let Some(n) = flags.nodes {
        out.push(format!("--nodes={n}"));
    }
    if let Some(s) = flags.samples {
        out.push(format!("--samples={s}"));
    }
    out.extend(
        flags
            .target
            .iter()
            .filter(|t| !super::BUILD_TARGETS.contains(&t.as_str()))
            .map(|t| format!("--target={t}")),
    );
    out.extend(flags.set.iter().map(|s| format!("--set={s}")));
    out
}

pub fn run(file: &Path, out: Option<&PathBuf>, auto: bool, flags: &RecipeFlags) -> i32 {
    let (source, resolved, options) = match load(file, flags) {
        Ok(loaded) => loaded,
        Err(code) => return code,
    };
    // `load` lets rule errors through for explain/steps; a build refuses them.
    let checked = recipe::check::check_source_with(&source.text, &options);
    if checked.has_errors() {
        eprintln!("{}: has errors; nothing written", source.name);
        return FAILED;
    }
    if resolved.uint("data.samples").is_none() && !flags.target.iter().any(|t| t == "native") {
        let d = recipe::rules::steps::build_needs_samples(&resolved);
        eprint!(
            "{}",
            recipe::diagnostics::render_human(&d, &source, super::style())
        );
        eprintln!("{}: has errors; nothing written", source.name);
        return FAILED;
    }
    let name = resolved.text("recipe.name").to_string();
    let out_dir = out
        .cloned()
        .unwrap_or_else(|| PathBuf::from("build").join(&name));
    if let Err(e) = std::fs::create_dir_all(&out_dir) {
        eprintln!("error: cannot create `{}`: {e}", out_dir.display());
        return USAGE;
    }
    let (Ok(out_abs), Ok(recipe_abs)) = (
        out_dir.canonicalize(),
        options
            .base_dir
            .clone()
            .unwrap_or_else(|| PathBuf::from("."))
            .canonicalize(),
    ) else {
        eprintln!("error: cannot resolve the paths of `{}`", out_dir.display());
        return USAGE;
    };
    let layout = Layout {
        recipe_dir_from_out: relative(&out_abs, &recipe_abs),
        out_dir_from_recipe: relative(&recipe_abs, &out_abs),
    };
    let files = if flags.target.iter().any(|t| t == "native") {
        if auto {
            eprintln!(
                "error: --auto is for the DeepSpeed target; a native plan has no \"auto\" values"
            );
            return USAGE;
        }
        match native_plan(&resolved, &source) {
            Ok(plan) => {
                let mut files = vec![("plan.json".to_string(), plan.to_json().into_bytes())];
                // Several nodes: the script that starts every node's `recipe run`.
                if let Some(s) = emit::launch_native::script(
                    &resolved,
                    &layout.recipe_dir_from_out,
                    &source.name,
                ) {
                    files.push(("launch-native.sh".to_string(), s.into_bytes()));
                }
                files
            }
            Err(code) => return code,
        }
    } else {
        let style = if auto { Style::Auto } else { Style::Explicit };
        // `--auto` changes the artefacts: it is an input of the lock like the other flags.
        let mut words = flag_words(flags);
        if auto {
            words.push("--auto".into());
        }
        emit::build(&resolved, &source, &words, &layout, style).files
    };
    match write_all(&out_abs, &files) {
        Ok(()) => {
            for (name, _) in &files {
                eprintln!("wrote {}", out_dir.join(name).display());
            }
            OK
        }
        Err(e) => {
            eprintln!("error: cannot write to `{}`: {e}", out_dir.display());
            USAGE
        }
    }
}

/// The native plan of a checked recipe; the reasons on stderr when it cannot run natively. The
/// check with `--target native` has already reported the native family's refusals (R11xx), so
/// they show here only for a caller that skipped it.
pub fn native_plan(
    resolved: &recipe::resolve::Resolved,
    source: &recipe::SourceFile,
) -> Result<recipe_runtime::plan::Plan, i32> {
    use recipe::emit::plan::Unsupported;
    let model = super::model_files::find(resolved).map_err(|e| {
        eprintln!("error: {e}");
        USAGE
    })?;
    emit::plan::plan(resolved, model).map_err(|why| {
        match why {
            Unsupported::Refused(diagnostics) => {
                for d in &diagnostics {
                    eprint!(
                        "{}",
                        recipe::diagnostics::render_human(d, source, super::style())
                    );
                }
                eprintln!(
                    "{}: the native runtime cannot train this recipe yet",
                    source.name
                );
            }
            Unsupported::Bug(what) => {
                eprintln!("error: the native plan cannot state {what} (a bug; please report it)");
            }
        }
        FAILED
    })
}

/// Writes `files` into `dir` as one change: each is written and synced in a temporary directory
/// beside them, every destination is checked to be replaceable, and only then are they renamed
/// into place (`recipe.lock`, listed last, last). If a rename fails, the ones already done are
/// undone from backups (hard links to the previous files), so a failed build leaves the previous
/// outputs as they were. A process killed between two renames (a window of microseconds) can
/// still leave a mix; the lock's artefact hashes show it.
fn write_all(dir: &Path, files: &[(String, Vec<u8>)]) -> std::io::Result<()> {
    let tmp = dir.join(format!(".recipe-build-{}", std::process::id()));
    std::fs::create_dir_all(&tmp)?;
    let result = (|| {
        for (name, bytes) in files {
            let path = tmp.join(name);
            std::fs::write(&path, bytes)?;
            if name.ends_with(".sh") {
                use std::os::unix::fs::PermissionsExt;
                std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755))?;
            }
            std::fs::File::open(&path)?.sync_all()?;
        }
        // A destination that is a directory cannot be replaced: say so before touching any.
        for (name, _) in files {
            let dest = dir.join(name);
            if dest.is_dir() {
                return Err(std::io::Error::other(format!(
                    "`{}` is a directory",
                    dest.display()
                )));
            }
        }
        // The previous files, kept until every rename has succeeded.
        let mut backups: Vec<Option<PathBuf>> = Vec::new();
        for (name, _) in files {
            let dest = dir.join(name);
            if dest.exists() {
                let keep = tmp.join(format!(".previous-{name}"));
                if std::fs::hard_link(&dest, &keep).is_err() {
                    std::fs::copy(&dest, &keep)?;
                }
                backups.push(Some(keep));
            } else {
                backups.push(None);
            }
        }
        for (i, (name, _)) in files.iter().enumerate() {
            if let Err(e) = std::fs::rename(tmp.join(name), dir.join(name)) {
                for ((done, _), keep) in files[..i].iter().zip(&backups) {
                    let dest = dir.join(done);
                    let _ = match keep {
                        Some(keep) => std::fs::rename(keep, &dest),
                        None => std::fs::remove_file(&dest),
                    };
                }
                return Err(e);
            }
        }
        Ok(())
    })();
    let _ = std::fs::remove_dir_all(&tmp);
    result
}

#[cfg(test)]
mod tests {
    use super::relative;
    use std::path::Path;

    #[test]
    fn relative_paths_between_directories() {
        assert_eq!(
            relative(Path::new("/a/b/build/cls"), Path::new("/a/b/recipes")),
            "../../recipes"
        );
        assert_eq!(
            relative(Path::new("/a/b/recipes"), Path::new("/a/b/build/cls")),
            "../build/cls"
        );
        assert_eq!(relative(Path::new("/a"), Path::new("/a")), ".");
    }
}
