//! Model rules: `from` against `config`, a local model's config.json against what the recipe says
//! (hidden size, architecture), the hidden size HF's DeepSpeed integration needs
//! (docs/upstream.md R-A05, issue #21342).
//!
//! A model is local when `from` (or `config`) names a path that exists here, read relative to the
//! recipe (`files::local_path`); anything else is a hub id or a path on the cluster, and is not
//! checked. `dropout` needs no rule: the compiler writes it into the model config
//! (`hidden_dropout_prob`, `attention_probs_dropout_prob`) itself.

use std::path::PathBuf;

use crate::diagnostics::{Diagnostic, Severity};
use crate::resolve::{files, Resolved, Source};
use crate::upstream::versions::HiddenSizeRead;

use super::anchor;

/// `from` and `config` are both given.
pub const FROM_AND_CONFIG: &str = "R0801";
/// A local model without a readable config.json.
pub const CONFIG_MISSING: &str = "R0802";
/// `hidden_size` differs from the local config.json's.
pub const HIDDEN_SIZE_MISMATCH: &str = "R0803";
/// `model bert`, but config.json describes another architecture.
pub const ARCH_MISMATCH: &str = "R0804";
/// The hidden size is unknown, so the ZeRO buckets fall back to DeepSpeed's fixed defaults.
pub const HIDDEN_SIZE_UNKNOWN: &str = "R0805";
/// transformers 4.18–4.26 read `model.config.hidden_size`, which this model does not have.
pub const HIDDEN_SIZE_ATTRIBUTE: &str = "R0806";
/// `data.max_len` is longer than the local model's `max_position_embeddings`.
pub const MAX_LEN_OVER_POSITIONS: &str = "R0807";
/// HF's BERT tokenizer lowercases otherwise than the model's tokenizer.json, which `recipe run`
/// follows.
pub const TOKENIZER_LOWERCASE: &str = "R0808";

/// This family's codes.
pub const CODES: &[(&str, &str, &str)] = &[
    (
        FROM_AND_CONFIG,
        "from-and-config",
        "`from` and `config` are both given",
    ),
    (
        CONFIG_MISSING,
        "config-missing",
        "a local model has no readable config.json",
    ),
    (
        HIDDEN_SIZE_MISMATCH,
        "hidden-size-mismatch",
        "`hidden_size` differs from the model's config.json",
    ),
    (
        ARCH_MISMATCH,
        "arch-mismatch",
        "`model bert` names another architecture than config.json",
    ),
    (
        HIDDEN_SIZE_UNKNOWN,
        "hidden-size-unknown",
        "ZeRO buckets fall back to DeepSpeed's defaults: the hidden size is unknown",
    ),
    (
        HIDDEN_SIZE_ATTRIBUTE,
        "hidden-size-attribute",
        "transformers < 4.27 reads `config.hidden_size`, which the model lacks",
    ),
    (
        MAX_LEN_OVER_POSITIONS,
        "max-len-over-positions",
        "`data.max_len` is longer than the model's `max_position_embeddings`",
    ),
    (
        TOKENIZER_LOWERCASE,
        "tokenizer-lowercase",
        "HF's BERT tokenizer lowercases otherwise than the model's tokenizer.json",
    ),
];

/// A local model's config.json, read.
struct LocalConfig {
    /// The recipe key that names the model (`model.from` or `model.config`).
    key: &'static str,
    /// The config.json read.
    path: PathBuf,
    /// Its contents (an object).
    json: serde_json::Value,
}

/// Checks the model rules.
pub fn check(r: &Resolved, out: &mut Vec<Diagnostic>) {
    if let (true, true) = (r.is_given("model.from"), r.is_given("model.config")) {
        out.push(from_and_config(r));
    }
    let mut config = None;
    for key in ["model.from", "model.config"] {
        if let Some(found) = local_config(r, key, out) {
            config.get_or_insert(found);
        }
    }
    if let Some(config) = &config {
        hidden_size_mismatch(r, config, out);
        arch_mismatch(r, config, out);
        hidden_size_attribute(r, config, out);
        max_len_over_positions(r, config, out);
        tokenizer_lowercase(r, config, out);
    }
    hidden_size_unknown(r, config.as_ref(), out);
}

fn from_and_config(r: &Resolved) -> Diagnostic {
    let shown = |k: &str| r.val(k).map(|v| v.to_string()).unwrap_or_default();
    let mut d = Diagnostic::error(
        FROM_AND_CONFIG,
        format!(
            "`from = {}` and `config = {}` are both given: it is ambiguous whether to fine-tune the pretrained weights or to train from a fresh initialisation",
            shown("model.from"),
            shown("model.config")
        ),
        anchor(r, "model.config"),
    )
    .with_label("a config to initialise from scratch");
    if let Some(span) = r.span("model.from") {
        d = d.with_secondary(span, "pretrained weights (and their config)");
    }
    d.with_help(
        "keep `from` to fine-tune (override dropout with `dropout`), or keep `config` to train from scratch",
    )
}

/// The config.json of the model `key` names, when it is here; reports a local model whose
/// config.json is missing or not a JSON object.
fn local_config(r: &Resolved, key: &'static str, out: &mut Vec<Diagnostic>) -> Option<LocalConfig> {
    let written = r.str(key)?;
    let path = files::local_path(r, written);
    let item = key.trim_start_matches("model.");
    let config_path = if path.is_dir() {
        let config = path.join("config.json");
        if !config.is_file() {
            out.push(
                Diagnostic::error(
                    CONFIG_MISSING,
                    format!("the model directory \"{written}\" has no config.json"),
                    anchor(r, key),
                )
                .with_label(format!("no {}", config.display()))
                .with_help(format!(
                    "point `{item}` at an HF-layout directory (config.json, model.safetensors, tokenizer files), e.g. one written by save_pretrained, or at a hub id"
                )),
            );
            return None;
        }
        config
    } else if path.is_file() {
        if key == "model.from" {
            out.push(
                Diagnostic::error(
                    CONFIG_MISSING,
                    format!("`from = \"{written}\"` is a file, not a model directory"),
                    anchor(r, key),
                )
                .with_label("a file")
                .with_help(
                    "`from` takes an HF-layout directory (config.json, weights, tokenizer) or a hub id; a lone config.json goes in `config`",
                ),
            );
            return None;
        }
        path
    } else {
        return None; // a hub id, or a path on the cluster
    };
    let parsed = std::fs::read_to_string(&config_path)
        .map_err(|e| e.to_string())
        .and_then(|t| serde_json::from_str::<serde_json::Value>(&t).map_err(|e| e.to_string()));
    match parsed {
        Ok(json) if json.is_object() => Some(LocalConfig {
            key,
            path: config_path,
            json,
        }),
        other => {
            let why = match other {
                Err(e) => e,
                Ok(_) => "not a JSON object".into(),
            };
            out.push(
                Diagnostic::error(
                    CONFIG_MISSING,
                    format!(
                        "{} cannot be read as a model config: {why}",
                        config_path.display()
                    ),
                    anchor(r, key),
                )
                .with_label("this model's config.json")
                .with_help(
                    "fix config.json (it must be one JSON object, as save_pretrained writes it)",
                ),
            );
            None
        }
    }
}

/// The hidden size HF's DeepSpeed integration uses, in its lookup order (docs/upstream.md §2.2):
/// `hidden_size`, `max(hidden_sizes)`, then the same in `text_config`.
fn config_hidden_size(json: &serde_json::Value) -> Option<i64> {
    let pick = |v: &serde_json::Value| {
        v.get("hidden_size").and_then(|h| h.as_i64()).or_else(|| {
            v.get("hidden_sizes")
                .and_then(|a| a.as_array())
                .and_then(|a| a.iter().filter_map(|x| x.as_i64()).max())
        })
    };
    pick(json).or_else(|| json.get("text_config").and_then(pick))
}

fn hidden_size_mismatch(r: &Resolved, config: &LocalConfig, out: &mut Vec<Diagnostic>) {
    let (true, Some(written), Some(h)) = (
        r.is_given("model.hidden_size"),
        r.int("model.hidden_size"),
        config_hidden_size(&config.json),
    ) else {
        return;
    };
    if written == h {
        return;
    }
    let mut d = Diagnostic::error(
        HIDDEN_SIZE_MISMATCH,
        format!(
            "`hidden_size = {written}` differs from the hidden size {h} in {}",
            config.path.display()
        ),
        anchor(r, "model.hidden_size"),
    )
    .with_label(format!("config.json says {h}"));
    if let Some(span) = r.span(config.key) {
        d = d.with_secondary(span, "this model");
    }
    out.push(d.with_help(format!(
        "remove `hidden_size` (it is read from config.json: the ZeRO buckets then follow {h}), or point `{}` at the model you mean",
        config.key.trim_start_matches("model.")
    )));
}

fn arch_mismatch(r: &Resolved, config: &LocalConfig, out: &mut Vec<Diagnostic>) {
    if !r.is_given("model.arch") || r.word("model.arch") != Some("bert") {
        return;
    }
    let model_type = config.json.get("model_type").and_then(|t| t.as_str());
    let architectures: Vec<&str> = config
        .json
        .get("architectures")
        .and_then(|a| a.as_array())
        .map(|a| a.iter().filter_map(|x| x.as_str()).collect())
        .unwrap_or_default();
    let found = match model_type {
        Some("bert") => return,
        Some(t) => format!("model_type \"{t}\""),
        None if architectures.is_empty() || architectures.iter().any(|a| a.starts_with("Bert")) => {
            return
        }
        None => format!("architectures {}", architectures.join(", ")),
    };
    let mut d = Diagnostic::warning(
        ARCH_MISMATCH,
        format!(
            "`model bert`, but {} describes another architecture ({found})",
            config.path.display()
        ),
        anchor(r, "model.arch"),
    )
    .with_label("builds a BERT classifier");
    if let Some(span) = r.span(config.key) {
        d = d.with_secondary(span, found.clone());
    }
    out.push(d.with_help(
        "write `model auto` to build the architecture config.json names, or point at a BERT model",
    ));
}

/// transformers 4.18–4.26 (and ≤ 4.17 under ZeRO-3) read `model.config.hidden_size`
/// unconditionally in `trainer_config_finalize`; configs with only `hidden_sizes` raise
/// AttributeError (issue #21342, fixed by PR #21504 in v4.27.0; docs/upstream.md §2.2).
fn hidden_size_attribute(r: &Resolved, config: &LocalConfig, out: &mut Vec<Diagnostic>) {
    let stage = r.integer("zero.stage");
    match r.facts.hf_hidden_size_read {
        HiddenSizeRead::AutoKeysOnly => return,
        HiddenSizeRead::Zero3 if stage != 3 => return,
        HiddenSizeRead::Zero3 | HiddenSizeRead::Always => {}
    }
    let json = &config.json;
    if json.get("hidden_size").is_some() || json.get("hidden_sizes").is_none() {
        return;
    }
    let tf = r.targets.transformers;
    let class = json
        .get("model_type")
        .and_then(|t| t.as_str())
        .map_or_else(|| "PretrainedConfig".to_string(), |t| format!("{t} config"));
    let when = if r.facts.hf_hidden_size_read == HiddenSizeRead::Zero3 {
        " under ZeRO-3"
    } else {
        ""
    };
    let mut d = Diagnostic::error(
        HIDDEN_SIZE_ATTRIBUTE,
        format!(
            "transformers {tf} reads `model.config.hidden_size` when it sets up DeepSpeed{when}, and {} has only `hidden_sizes`",
            config.path.display()
        ),
        anchor(r, config.key),
    )
    .with_label(format!(
        "AttributeError at train(): the {class} has no attribute 'hidden_size'"
    ));
    if let Some(span) = r.target_sources[0].span() {
        d = d.with_secondary(span, "this transformers");
    }
    out.push(d.with_help(
        "target transformers ≥ 4.27.0 (it falls back to max(hidden_sizes), and reads it only for \"auto\" buckets; PR #21504), or add \"hidden_size\" to config.json",
    ));
}

/// A BERT-like model has one learned position embedding per position, `max_position_embeddings`
/// of them (transformers@v5.24.0 models/bert/modeling_bert.py:BertEmbeddings.__init__,
/// `nn.Embedding(config.max_position_embeddings, …)`; `forward` indexes it with the positions
/// 0…seq-1). The generated train.py truncates rows to `max_len` tokens, so a row longer than the
/// model's limit reaches the embedding and the first forward of that batch fails with an
/// index error (a CUDA device-side assert on a GPU); the native runtime refuses the same batch
/// (runtime/src/model/mod.rs `check_batch`: "seq … exceeds max_position_embeddings"), after the
/// run has started. Read from the config's top level, else its `text_config`.
fn max_len_over_positions(r: &Resolved, config: &LocalConfig, out: &mut Vec<Diagnostic>) {
    let pick = |v: &serde_json::Value| v.get("max_position_embeddings").and_then(|m| m.as_i64());
    let Some(limit) = pick(&config.json).or_else(|| config.json.get("text_config").and_then(pick))
    else {
        return;
    };
    let Some(max_len) = r.int("data.max_len") else {
        return;
    };
    if max_len <= limit {
        return;
    }
    let mut d = Diagnostic::error(
        MAX_LEN_OVER_POSITIONS,
        format!(
            "`max_len = {max_len}` is longer than the {limit} positions of the model ({} says max_position_embeddings = {limit}): the first batch with a row over {limit} tokens stops training with an index error in the position embeddings",
            config.path.display()
        ),
        anchor(r, "data.max_len"),
    )
    .with_label(format!("{max_len} tokens per row{}", super::origin(r, "data.max_len")));
    if let Some(span) = r.span(config.key) {
        d = d.with_secondary(span, format!("{limit} positions"));
    }
    out.push(d.with_help(format!(
        "set `max_len = {limit}` (the model's max_position_embeddings), or use a model with more positions"
    )));
}

/// docs/upstream.md R-A05: HF fills the hidden-size buckets from the model's config; the compiler
/// resolves them itself, and without a hidden size it falls back to DeepSpeed's fixed defaults (a
/// note).
fn hidden_size_unknown(r: &Resolved, config: Option<&LocalConfig>, out: &mut Vec<Diagnostic>) {
    let stage = r.integer("zero.stage");
    if stage < 1 || r.int("model.hidden_size").is_some() {
        return;
    }
    let mut keys = vec![("zero.reduce_bucket", "reduce_bucket")];
    if stage == 3 {
        keys.push(("zero.prefetch_bucket", "prefetch_bucket"));
        keys.push((
            "zero.param_persistence_threshold",
            "param_persistence_threshold",
        ));
    }
    let defaulted: Vec<String> = keys
        .iter()
        .filter(|(k, _)| matches!(r.get(k).map(|s| &s.source), Some(Source::Default { .. })))
        .map(|(k, name)| format!("{name} {}", r.int(k).map_or_else(String::new, size)))
        .collect();
    if defaulted.is_empty() {
        return;
    }
    let (key, label) = match config {
        Some(c) => (
            c.key,
            format!("{} has no hidden_size or hidden_sizes", c.path.display()),
        ),
        None if r.is_given("model.from") => (
            "model.from",
            "not a local model: its config.json is not read".into(),
        ),
        None => ("model.config", "not a local file: it is not read".into()),
    };
    let mut d = Diagnostic {
        severity: Severity::Note,
        ..Diagnostic::warning(
            HIDDEN_SIZE_UNKNOWN,
            format!(
                "the model's hidden size is unknown, so ZeRO stage {stage} uses DeepSpeed's fixed sizes ({}) instead of the hidden-size values HF's \"auto\" would give",
                defaulted.join(", ")
            ),
            anchor(r, key),
        )
    }
    .with_label(label);
    if let Some(span) = r.span("zero.stage") {
        d = d.with_secondary(span, format!("stage {stage}"));
    }
    let names: Vec<&str> = keys.iter().map(|(_, n)| *n).collect();
    out.push(d.with_help(format!(
        "write the model's `hidden_size` in `model` (reduce_bucket becomes hidden_size², as HF computes it), or set {} in `zero`",
        names.join(", ")
    )));
}

/// A size as the language writes it: `5e8` for 500000000.
fn size(v: i64) -> String {
    let (mut m, mut e) = (v, 0);
    while m != 0 && m % 10 == 0 {
        m /= 10;
        e += 1;
    }
    if e >= 4 {
        format!("{m}e{e}")
    } else {
        v.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::{config_hidden_size, size};

    #[test]
    fn sizes_read_like_the_language() {
        assert_eq!(size(500_000_000), "5e8");
        assert_eq!(size(100_000), "1e5");
        assert_eq!(size(147_456), "147456");
        assert_eq!(size(1000), "1000");
    }

    use serde_json::json;

    #[test]
    fn hidden_size_lookup_follows_hf() {
        assert_eq!(config_hidden_size(&json!({"hidden_size": 384})), Some(384));
        assert_eq!(
            config_hidden_size(&json!({"hidden_sizes": [64, 512, 256]})),
            Some(512)
        );
        assert_eq!(
            config_hidden_size(&json!({"text_config": {"hidden_size": 1024}})),
            Some(1024)
        );
        assert_eq!(config_hidden_size(&json!({"n_embd": 768})), None);
    }
}

/// Whether a tokenizer.json normalizer lowercases: a `BertNormalizer`'s `lowercase`, or a
/// `Sequence` holding `Lowercase` or such a `BertNormalizer`; None for anything else.
fn normalizer_lowercases(n: &serde_json::Value) -> Option<bool> {
    match n.get("type")?.as_str()? {
        "BertNormalizer" => n.get("lowercase")?.as_bool(),
        "Lowercase" => Some(true),
        "Sequence" => {
            let parts: Vec<Option<bool>> = n
                .get("normalizers")?
                .as_array()?
                .iter()
                .map(normalizer_lowercases)
                .collect();
            Some(parts.contains(&Some(true)))
        }
        _ => None,
    }
}

/// BERT's tokenizer in transformers takes `do_lower_case` from tokenizer_config.json, else the
/// release's default, and rebuilds tokenizer.json's normalizer with `lowercase = do_lower_case`
/// whatever the file says (transformers@v4.57.6 models/bert/tokenization_bert_fast.py
/// `BertTokenizerFast.__init__`, default true; v5.0.0–v5.2.0 tokenization_bert.py
/// `BertTokenizer.__init__`, default **false**; v5.3.0 on, true: `Facts::hf_bert_do_lower_case_default`).
/// `recipe run` tokenizes with tokenizer.json as it is. Where the two differ, the DeepSpeed build
/// trains on other tokens than the native run: an uncased vocabulary not lowercased turns every
/// capitalised word into `[UNK]` (seen in a real 5.0.0 run: conformance/README.md, "Found on
/// transformers 5.0.0").
fn tokenizer_lowercase(r: &Resolved, config: &LocalConfig, out: &mut Vec<Diagnostic>) {
    if config.key != "model.from" || r.word("model.arch") != Some("bert") {
        return;
    }
    let Some(dir) = config.path.parent() else {
        return;
    };
    let read = |name: &str| -> Option<serde_json::Value> {
        serde_json::from_str(&std::fs::read_to_string(dir.join(name)).ok()?).ok()
    };
    let Some(file) = read("tokenizer.json").and_then(|t| normalizer_lowercases(&t["normalizer"]))
    else {
        return;
    };
    let tc_path = dir.join("tokenizer_config.json");
    let tc = if tc_path.is_file() {
        match read("tokenizer_config.json") {
            Some(tc) => Some(tc),
            None => return, // unreadable: not this rule's business
        }
    } else {
        None
    };
    let class = tc.as_ref().and_then(|t| t["tokenizer_class"].as_str());
    if class.is_some_and(|c| !c.starts_with("BertTokenizer")) {
        return;
    }
    let tf = r.targets.transformers;
    let default = r.facts.hf_bert_do_lower_case_default;
    let (hf, why) = match tc.as_ref().and_then(|t| t["do_lower_case"].as_bool()) {
        Some(v) => (v, format!("{}'s `do_lower_case`", tc_path.display())),
        None if tc.is_some() => (
            default,
            format!(
                "no `do_lower_case` in {} (transformers {tf}'s default: {default})",
                tc_path.display()
            ),
        ),
        None => (
            default,
            format!(
                "no tokenizer_config.json (transformers {tf}'s default `do_lower_case`: {default})"
            ),
        ),
    };
    if hf == file {
        return;
    }
    let (does, lost) = if file {
        (
            "does not lowercase",
            "every capitalised word of an uncased vocabulary becomes [UNK]",
        )
    } else {
        ("lowercases", "a cased vocabulary loses its capitals")
    };
    let mut d = Diagnostic::warning(
        TOKENIZER_LOWERCASE,
        format!(
            "HF's BERT tokenizer {does} here, unlike the model's tokenizer.json that `recipe run` follows: {why}, and transformers rebuilds the file's normalizer (`lowercase: {file}`) from it — the DeepSpeed build trains on other tokens ({lost})"
        ),
        anchor(r, "model.from"),
    )
    .with_label(format!("tokenizer.json: lowercase = {file}; HF: {hf}"));
    if let Some(span) = r.target_sources[0].span() {
        d = d.with_secondary(span, "this transformers");
    }
    let newer = if file && !default {
        ", or target transformers ≥ 5.3.0 (its default is true)"
    } else {
        ""
    };
    out.push(d.with_help(format!(
        "write \"do_lower_case\": {file} in tokenizer_config.json beside tokenizer.json (save_pretrained writes it){newer}"
    )));
}

#[cfg(test)]
mod normalizer_tests {
    use super::normalizer_lowercases;
    use serde_json::json;

    #[test]
    fn tokenizer_json_normalizers_that_lowercase() {
        let bert = |l: bool| json!({"type": "BertNormalizer", "lowercase": l});
        assert_eq!(normalizer_lowercases(&bert(true)), Some(true));
        assert_eq!(normalizer_lowercases(&bert(false)), Some(false));
        let seq =
            json!({"type": "Sequence", "normalizers": [{"type": "NFD"}, {"type": "Lowercase"}]});
        assert_eq!(normalizer_lowercases(&seq), Some(true));
        let cased = json!({"type": "Sequence", "normalizers": [{"type": "NFD"}, bert(false)]});
        assert_eq!(normalizer_lowercases(&cased), Some(false));
        assert_eq!(normalizer_lowercases(&json!({"type": "NFC"})), None);
        assert_eq!(normalizer_lowercases(&serde_json::Value::Null), None);
    }
}
