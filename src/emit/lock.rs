//! `recipe.lock`: every resolved value with its provenance, the target versions, and a hash of
//! the inputs, so that two builds can be compared (`recipe diff A.lock B.lock`).

use serde::{Deserialize, Serialize};
use serde_json::Value;
use sha2::{Digest, Sha256};

use crate::diagnostics::source::SourceFile;
use crate::resolve::Resolved;
use crate::upstream::versions::Library;

/// One locked setting.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Locked {
    /// The value as JSON.
    pub value: Value,
    /// Where it came from, in words.
    pub from: String,
}

/// The lock file.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Lock {
    /// The recipe's name.
    pub recipe: String,
    /// `recipe <version>` that wrote it.
    pub generator: String,
    /// sha256 of the inputs: the recipe text, the flags, and what was read from files.
    pub inputs_sha256: String,
    /// The build's flags (`--gpus=4`, `--auto`, …), as hashed; absent in older locks.
    #[serde(default)]
    pub flags: Vec<String>,
    /// Target versions with their provenance.
    pub targets: std::collections::BTreeMap<String, Locked>,
    /// Every resolved setting, in resolution order.
    pub settings: Vec<(String, Locked)>,
    /// sha256 of each artefact written next to the lock.
    pub artefacts: std::collections::BTreeMap<String, String>,
}

/// Hex sha256.
pub fn sha256(bytes: &[u8]) -> String {
    let digest = Sha256::digest(bytes);
    digest.iter().map(|b| format!("{b:02x}")).collect()
}

/// Builds the lock for a resolved recipe and its artefacts.
pub fn lock(
    r: &Resolved,
    source: &SourceFile,
    flags: &[String],
    artefacts: &[(String, Vec<u8>)],
) -> Lock {
    let settings: Vec<(String, Locked)> = r
        .settings()
        .iter()
        .map(|s| {
            (
                s.key.clone(),
                Locked {
                    value: super::deepspeed::to_json(&s.value),
                    from: s.source.describe(Some(source)),
                },
            )
        })
        .collect();
    let mut hasher = Sha256::new();
    hasher.update(source.text.as_bytes());
    for f in flags {
        hasher.update(b"\0flag\0");
        hasher.update(f.as_bytes());
    }
    // Values read from files (row counts, config.json) are inputs too.
    for s in r.settings() {
        if let crate::resolve::Source::File { what } = &s.source {
            hasher.update(b"\0file\0");
            hasher.update(what.as_bytes());
            hasher.update(s.value.to_string().as_bytes());
        }
    }
    let inputs_sha256 = hasher
        .finalize()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    let targets = Library::ALL
        .iter()
        .enumerate()
        .map(|(i, lib)| {
            (
                lib.key().to_string(),
                Locked {
                    value: Value::String(r.targets.get(*lib).to_string()),
                    from: r.target_sources[i].describe(Some(source)),
                },
            )
        })
        .collect();
    Lock {
        recipe: r.text("recipe.name").to_string(),
        generator: format!("recipe {}", env!("CARGO_PKG_VERSION")),
        inputs_sha256,
        flags: flags.to_vec(),
        targets,
        settings,
        artefacts: artefacts
            .iter()
            .map(|(name, bytes)| (name.clone(), sha256(bytes)))
            .collect(),
    }
}

/// One difference between two locks.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Change {
    /// The key (`batch.micro`, `target.transformers`, `artefact.ds_config.json`).
    pub key: String,
    /// The value in the first lock (None: absent).
    pub before: Option<Locked>,
    /// The value in the second lock (None: absent).
    pub after: Option<Locked>,
}

/// What changed from `a` to `b`, in `a`'s order (then keys only in `b`).
pub fn diff(a: &Lock, b: &Lock) -> Vec<Change> {
    let mut out = Vec::new();
    let mut compare = |key: String, x: Option<&Locked>, y: Option<&Locked>| {
        if x.map(|l| &l.value) != y.map(|l| &l.value) {
            out.push(Change {
                key,
                before: x.cloned(),
                after: y.cloned(),
            });
        }
    };
    // The flags first: `--auto` changes the artefacts without changing a value.
    let flags = |l: &Lock| Locked {
        value: Value::String(l.flags.join(" ")),
        from: "command line".into(),
    };
    compare("build.flags".into(), Some(&flags(a)), Some(&flags(b)));
    for (lib, x) in &a.targets {
        compare(format!("target.{lib}"), Some(x), b.targets.get(lib));
    }
    for (lib, y) in &b.targets {
        if !a.targets.contains_key(lib) {
            compare(format!("target.{lib}"), None, Some(y));
        }
    }
    let find = |l: &Lock, k: &str| {
        l.settings
            .iter()
            .find(|(key, _)| key == k)
            .map(|(_, v)| v.clone())
    };
    for (key, x) in &a.settings {
        compare(key.clone(), Some(x), find(b, key).as_ref());
    }
    for (key, y) in &b.settings {
        if find(a, key).is_none() {
            compare(key.clone(), None, Some(y));
        }
    }
    let art = |h: Option<&String>| {
        h.map(|h| Locked {
            value: Value::String(h.clone()),
            from: "sha256".into(),
        })
    };
    let names: std::collections::BTreeSet<&String> =
        a.artefacts.keys().chain(b.artefacts.keys()).collect();
    for name in names {
        compare(
            format!("artefact.{name}"),
            art(a.artefacts.get(name)).as_ref(),
            art(b.artefacts.get(name)).as_ref(),
        );
    }
    out
}
