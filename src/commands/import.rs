//! `recipe import`: an existing DeepSpeed config (and optionally the TrainingArguments that go with
//! it) turned into a recipe. Keys the language models become items; `"auto"` values are taken from
//! the TrainingArguments, as HF would fill them (docs/upstream.md §2.2); everything else goes to
//! the raw `deepspeed { }` / `hf { }` blocks, where the checker still validates it. The result is
//! checked like any recipe, so importing doubles as a linter for configs people already have.

use serde_json::{Map, Value};

use crate::commands::format;

/// What the configs do not say: the model and the data (script arguments).
#[derive(Debug, Clone, Default)]
pub struct Inputs {
    /// `model.from`; a placeholder when not given.
    pub model: Option<String>,
    /// `data.train`; a placeholder when not given.
    pub train: Option<String>,
    /// `data.eval`, if evaluation data goes with it.
    pub eval: Option<String>,
    /// `data.samples`, when the training file is not at hand.
    pub samples: Option<u64>,
    /// Number of labels of the classifier.
    pub labels: Option<u64>,
    /// `model.hidden_size`, for the config's `"auto"` ZeRO sizes.
    pub hidden_size: Option<u64>,
    /// Whether `model` is a local directory with a config.json (which gives the hidden size).
    pub model_is_local: bool,
    /// GPUs per node and nodes (the configs do not say either).
    pub gpus: Option<u64>,
    /// Nodes.
    pub nodes: Option<u64>,
    /// Target versions the configs were written for (`target` line), e.g. ("deepspeed", "0.3.16").
    pub targets: Vec<(String, String)>,
    /// Where the configs came from, for the header comment.
    pub origin: String,
}

/// Whether `name` is a word of the language (what keys and bare labels are made of).
fn is_word(name: &str) -> bool {
    name.chars()
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// `name` as a bare word when it is one, else quoted.
fn label_or_quoted(name: &str) -> String {
    if is_word(name) {
        name.to_string()
    } else {
        format::quote(name)
    }
}

/// `text` as one comment line. A comment runs to the end of its line (grammar/recipe.pest,
/// `COMMENT`), so a key or path from the configs that holds a line break or another control
/// character is written with it escaped (`\r`), not broken across lines into recipe text.
pub fn comment(text: &str) -> String {
    let mut line = String::from("# ");
    for c in text.chars() {
        if c.is_control() {
            line.extend(c.escape_default());
        } else {
            line.push(c);
        }
    }
    line.push('\n');
    line
}

/// A recipe value written from JSON.
fn lit(v: &Value) -> String {
    match v {
        Value::String(s) => format::quote(s),
        Value::Number(n) => n.to_string(),
        Value::Bool(b) => b.to_string(),
        Value::Null => "null".into(),
        Value::Array(items) => {
            format!("[{}]", items.iter().map(lit).collect::<Vec<_>>().join(", "))
        }
        Value::Object(_) => format::quote(&v.to_string()),
    }
}

fn is_auto(v: Option<&Value>) -> bool {
    v.and_then(Value::as_str) == Some("auto")
}

/// The JSON value at a dotted path.
fn at<'a>(v: &'a Value, path: &str) -> Option<&'a Value> {
    path.split('.').try_fold(v, |node, part| node.get(part))
}

struct Builder<'a> {
    ds: Map<String, Value>,
    args: Map<String, Value>,
    comments: Vec<String>,
    /// Keys no recipe can write (not words: no DeepSpeed key or TrainingArguments field is).
    dropped: Vec<String>,
    /// Top-level keys DeepSpeed does not read (it ignores them).
    ignored: Vec<String>,
    _inputs: &'a Inputs,
}

impl Builder<'_> {
    /// Takes a DeepSpeed key out of the config (so it is not copied raw), resolving `"auto"`
    /// from the TrainingArguments field that fills it.
    fn ds(&mut self, path: &str, hf: Option<&str>) -> Option<Value> {
        let v = take(&mut self.ds, path)?;
        if is_auto(Some(&v)) {
            return hf.and_then(|f| self.args.get(f).cloned());
        }
        Some(v)
    }

    /// The pairs whose (dotted) key the language can write; the others are noted as dropped.
    fn writable(&mut self, block: &str, pairs: Vec<(String, String)>) -> Vec<(String, String)> {
        let (keep, drop): (Vec<_>, Vec<_>) = pairs
            .into_iter()
            .partition(|(k, _)| k.split('.').all(is_word));
        self.dropped.extend(
            drop.into_iter()
                .map(|(k, _)| format!("{block}: {}", format::quote(&k))),
        );
        keep
    }

    /// Takes a TrainingArguments field.
    fn hf(&mut self, field: &str) -> Option<Value> {
        self.args.remove(field)
    }
}

/// Removes the value at a dotted path, pruning emptied parents.
fn take(map: &mut Map<String, Value>, path: &str) -> Option<Value> {
    match path.split_once('.') {
        None => map.remove(path),
        Some((head, rest)) => {
            let child = map.get_mut(head)?.as_object_mut()?;
            let v = take(child, rest);
            if child.is_empty() {
                map.remove(head);
            }
            v
        }
    }
}

fn num(v: &Value) -> Option<f64> {
    v.as_f64()
}

fn items(pairs: &[(String, String)]) -> String {
    if pairs.is_empty() {
        return String::new();
    }
    let width = pairs.iter().map(|(k, _)| k.len()).max().unwrap_or(0);
    let mut out = String::from(" {\n");
    for (k, v) in pairs {
        out.push_str(&format!("  {k:<width$} = {v}\n"));
    }
    out.push('}');
    out
}

fn raw_lines(map: &Map<String, Value>, prefix: &str, out: &mut Vec<(String, String)>) {
    for (k, v) in map {
        let key = if prefix.is_empty() {
            k.clone()
        } else {
            format!("{prefix}.{k}")
        };
        match v {
            Value::Object(m) if !m.is_empty() => raw_lines(m, &key, out),
            _ => out.push((key, lit(v))),
        }
    }
}

/// A TrainingArguments field's default in the newest transformers (the generated tables), as
/// JSON.
fn hf_default(field: &str) -> Option<Value> {
    let release = crate::schema::upstream::HfFields::for_target(
        crate::upstream::versions::Library::Transformers.newest(),
    );
    crate::pair::args::default_of(release, field)
        .filter(|v| *v != crate::pair::json::Py::None)
        .map(|v| v.to_json())
}

/// Deprecated `zero_optimization` keys mapped the way DeepSpeed maps them when it reads the
/// config (`DEEPSPEED_RENAMED` in schema/upstream.rs: `cpu_offload: true` is optimizer offload
/// to the CPU, `cpu_offload_param: true` parameter offload, the fp16 gather key is the 16-bit
/// one; `cpu_offload_use_pin_memory` is not applied at all), so that the recipe states what the
/// run does. Both the old key and its replacement: left as they are (the pair check refuses it).
fn deprecated_zero_keys(b: &mut Builder<'_>) {
    let Some(Value::Object(zero)) = b.ds.get_mut("zero_optimization") else {
        return;
    };
    let offloads = [
        ("cpu_offload", "offload_optimizer"),
        ("cpu_offload_param", "offload_param"),
    ];
    for (old, new) in offloads {
        if zero.contains_key(new) {
            continue;
        }
        if let Some(v) = zero.remove(old) {
            if v.as_bool() == Some(true) {
                zero.insert(new.into(), serde_json::json!({"device": "cpu"}));
            }
            b.comments.push(format!(
                "zero_optimization.{old} = {v} is deprecated; DeepSpeed reads it as {new} {}",
                if v.as_bool() == Some(true) {
                    "on the CPU"
                } else {
                    "off"
                }
            ));
        }
    }
    let (old, new) = (
        "stage3_gather_fp16_weights_on_model_save",
        "stage3_gather_16bit_weights_on_model_save",
    );
    if !zero.contains_key(new) {
        if let Some(v) = zero.remove(old) {
            zero.insert(new.into(), v);
        }
    }
    if zero.remove("cpu_offload_use_pin_memory").is_some() {
        b.comments.push(
            "zero_optimization.cpu_offload_use_pin_memory is dropped: DeepSpeed does not apply it \
             (write pin_memory in the offload call)"
                .into(),
        );
    }
}

/// The recipe for a DeepSpeed config and optional TrainingArguments.
pub fn import(ds: &Value, args: Option<&Value>, inputs: &Inputs) -> String {
    let mut b = Builder {
        ds: ds.as_object().cloned().unwrap_or_default(),
        args: args.and_then(Value::as_object).cloned().unwrap_or_default(),
        comments: Vec::new(),
        dropped: Vec::new(),
        ignored: Vec::new(),
        _inputs: inputs,
    };
    deprecated_zero_keys(&mut b);
    // HF owns these; they say nothing about the run.
    b.hf("deepspeed");
    b.hf("do_train");
    b.hf("do_eval");
    let mut out = String::new();
    out.push_str(&comment(&format!(
        "Imported by `recipe import` from {}.",
        inputs.origin
    )));
    out.push_str("recipe \"imported\"\n");
    if !inputs.targets.is_empty() {
        let pairs: Vec<String> = inputs
            .targets
            .iter()
            .map(|(lib, v)| format!("{lib} {}", format::quote(v)))
            .collect();
        out.push_str(&format!("target {}\n", pairs.join(", ")));
    }
    out.push('\n');

    // model / data: the configs do not say; placeholders are marked.
    let model = inputs.model.clone().unwrap_or_else(|| {
        b.comments
            .push("model.from is a placeholder: give --model".into());
        "MODEL".into()
    });
    let labels = inputs.labels.unwrap_or_else(|| {
        b.comments
            .push("model.task assumes 2 classes (the configs do not say): give --labels N".into());
        2
    });
    let mut model_items = vec![
        ("from".to_string(), format::quote(&model)),
        ("task".to_string(), format!("classify(labels: {labels})")),
    ];
    if let Some(h) = inputs.hidden_size {
        model_items.push(("hidden_size".into(), h.to_string()));
    }
    // Renamed `activation_checkpointing` in transformers 5.23.
    let ckpt = b.hf("activation_checkpointing");
    let ckpt = b.hf("gradient_checkpointing").or(ckpt);
    if let Some(v) = ckpt.filter(|v| v.as_bool() == Some(true)) {
        model_items.push(("gradient_checkpointing".into(), lit(&v)));
    }
    out.push_str(&format!("model bert{}\n\n", items(&model_items)));
    let train = inputs.train.clone().unwrap_or_else(|| {
        b.comments
            .push("data.train is a placeholder: give --train".into());
        "train.jsonl".into()
    });
    let mut data = vec![("train".to_string(), format::quote(&train))];
    // The arguments ask for evaluation: the script had evaluation data (HF refuses a strategy
    // without it), so a placeholder stands in rather than a false R0706.
    let strategy = b
        .args
        .get("eval_strategy")
        .or_else(|| b.args.get("evaluation_strategy"))
        .and_then(Value::as_str);
    let evaluates = matches!(strategy, Some("steps" | "epoch"));
    let eval = inputs.eval.clone().or_else(|| {
        evaluates.then(|| {
            b.comments
                .push("data.eval is a placeholder: give --eval".into());
            "eval.jsonl".to_string()
        })
    });
    if let Some(e) = &eval {
        data.push(("eval".into(), format::quote(e)));
    }
    if let Some(n) = inputs.samples {
        data.push(("samples".into(), n.to_string()));
    }
    if let Some(v) = b.hf("dataloader_drop_last") {
        data.push(("drop_last".into(), lit(&v)));
    }
    if let Some(v) = b.hf("dataloader_num_workers") {
        data.push(("workers".into(), lit(&v)));
    }
    // transformers ≥ 5.2.0: "sequential" is `shuffle = false`, "random" the default; the other
    // strategies (group_by_length, batch_rebalance) have no recipe key and stay raw.
    match b
        .args
        .get("train_sampling_strategy")
        .and_then(|v| v.as_str())
    {
        Some("sequential") => {
            b.hf("train_sampling_strategy");
            data.push(("shuffle".into(), "false".into()));
        }
        Some("random") => {
            b.hf("train_sampling_strategy");
        }
        _ => {}
    }
    out.push_str(&format!("data{}\n\n", items(&data)));

    let mut inferred_gpus: Option<u64> = None;
    // batch: DeepSpeed's keys, "auto" filled from the arguments; train_batch_size kept only
    // when it was written as a number (so the checker verifies it).
    let mut batch = Vec::new();
    let global_written = at(ds, "train_batch_size").is_some_and(|v| !is_auto(Some(v)));
    let micro = b
        .ds(
            "train_micro_batch_size_per_gpu",
            Some("per_device_train_batch_size"),
        )
        .or_else(|| b.args.get("per_device_train_batch_size").cloned());
    b.hf("per_device_train_batch_size");
    let gas = b
        .ds(
            "gradient_accumulation_steps",
            Some("gradient_accumulation_steps"),
        )
        .or_else(|| b.args.get("gradient_accumulation_steps").cloned());
    b.hf("gradient_accumulation_steps");
    let global = b.ds("train_batch_size", None);
    if let Some(m) = &micro {
        batch.push(("micro".to_string(), lit(m)));
    }
    if let Some(g) = &gas {
        batch.push(("accumulate".to_string(), lit(g)));
    }
    if let (true, Some(t)) = (global_written, &global) {
        batch.push(("global".to_string(), lit(t)));
    }
    // No --gpus/--nodes: a written train_batch_size that is a multiple of micro × accumulation
    // says the world size DeepSpeed expects; take it as one node's GPUs, and say so.
    let int = |v: &Option<Value>| v.as_ref().and_then(Value::as_u64);
    if let (true, None, None, Some(t), Some(m), Some(g)) = (
        global_written,
        inputs.gpus,
        inputs.nodes,
        int(&global),
        int(&micro),
        int(&gas),
    ) {
        if m * g > 0 && t % (m * g) == 0 && t / (m * g) > 1 {
            let world = t / (m * g);
            inferred_gpus = Some(world);
            b.comments.push(format!(
                "cluster.gpus = {world} inferred: train_batch_size {t} = micro {m} × accumulation \
                 {g} × world {world}; give --gpus and --nodes for the real layout"
            ));
        }
    }
    if let Some(e) = b.hf("per_device_eval_batch_size") {
        batch.push(("eval_micro".to_string(), lit(&e)));
    }
    out.push_str(&format!("batch{}\n\n", items(&batch)));

    // optimizer
    let ds_opt_type = b.ds("optimizer.type", None);
    let mut opt = Vec::new();
    let kind: String = match ds_opt_type.as_ref().and_then(Value::as_str) {
        Some(t) => {
            let lower = t.to_ascii_lowercase();
            let known = match lower.as_str() {
                "adam" => {
                    // DeepSpeed's Adam is AdamW unless adam_w_mode is false
                    // (docs/upstream.md R-P01).
                    let w = b.ds("optimizer.params.adam_w_mode", None);
                    Some(if w.and_then(|v| v.as_bool()) == Some(false) {
                        "adam"
                    } else {
                        "adamw"
                    })
                }
                "adamw" => {
                    b.ds("optimizer.params.adam_w_mode", None);
                    Some("adamw")
                }
                "lamb" | "lion" | "adagrad" | "onebitadam" | "zerooneadam" | "onebitlamb"
                | "sgd" => Some(lower.as_str()),
                _ => None,
            };
            // Not one the language models (a typo, or a torch.optim class such as RMSprop
            // that DeepSpeed would look up by name): kept as written, so the check names it.
            known.map_or_else(|| label_or_quoted(&lower), str::to_string)
        }
        None => {
            opt.push(("owner".to_string(), "hf".to_string()));
            // The `optim` values the compiler writes (and 4.x's default `adamw_hf`); any
            // other (8-bit, fused, paged, GaLore, …) is another optimizer or kernel, kept as
            // written so the check names it rather than silently becoming adamw_torch.
            let adafactor = b.hf("adafactor").and_then(|v| v.as_bool()) == Some(true);
            match b.args.get("optim").and_then(Value::as_str) {
                None if adafactor => "adafactor".to_string(),
                None | Some("adamw_torch" | "adamw_hf") => "adamw".to_string(),
                Some("sgd") => "sgd".to_string(),
                Some("adagrad") => "adagrad".to_string(),
                Some("adafactor") => "adafactor".to_string(),
                Some("lion_32bit") => "lion".to_string(),
                Some(other) => label_or_quoted(other),
            }
        }
    };
    b.hf("optim");
    let lr = b.ds("optimizer.params.lr", Some("learning_rate"));
    let lr = lr.or_else(|| b.args.get("learning_rate").cloned());
    b.hf("learning_rate");
    if let Some(v) = lr {
        opt.insert(0, ("lr".into(), lit(&v)));
    }
    let betas = b.ds("optimizer.params.betas", None);
    let (b1, b2) = (b.hf("adam_beta1"), b.hf("adam_beta2"));
    // One beta given: the other is TrainingArguments' default (HF fills "auto" betas with both).
    let betas = match betas {
        Some(Value::Array(v)) if v.len() == 2 => Some((v[0].clone(), v[1].clone())),
        _ if b1.is_some() || b2.is_some() => b1
            .or_else(|| hf_default("adam_beta1"))
            .zip(b2.or_else(|| hf_default("adam_beta2"))),
        _ => None,
    };
    if let Some((x, y)) = betas {
        opt.push(("betas".into(), format!("({}, {})", lit(&x), lit(&y))));
    }
    let eps = b.ds("optimizer.params.eps", Some("adam_epsilon"));
    let eps = eps.or_else(|| b.args.get("adam_epsilon").cloned());
    b.hf("adam_epsilon");
    if let Some(v) = eps {
        opt.push(("eps".into(), lit(&v)));
    }
    let wd = b.ds("optimizer.params.weight_decay", Some("weight_decay"));
    let wd = wd.or_else(|| b.args.get("weight_decay").cloned());
    b.hf("weight_decay");
    if let Some(v) = wd {
        opt.push(("weight_decay".into(), lit(&v)));
    }
    // The other params, by the schema's DeepSpeed column (those with a TrainingArguments
    // counterpart were read above, against it).
    for (param, key) in ds_params("optimizer", "optimizer", |k| k.hf.is_none()) {
        if let Some(v) = b.ds(&format!("optimizer.params.{param}"), None) {
            opt.push((key.into(), lit(&v)));
        }
    }
    // The `optim_args` of an HF-built optimizer, as the compiler writes it
    // (src/upstream/hf_optimizers.rs): each entry back to the key it states. An entry with no key
    // keeps the whole string raw, where the check names it (R0411).
    if ds_opt_type.is_none() {
        if let Some(Value::String(text)) = b.args.get("optim_args").cloned() {
            let newest = crate::upstream::versions::Facts::for_targets(
                &crate::upstream::versions::Targets::newest(),
            );
            let pairs: Option<Vec<(&str, String)>> = text
                .replace(' ', "")
                .split(',')
                .filter(|p| !p.is_empty())
                .map(|pair| {
                    let (name, value) = pair.split_once('=')?;
                    let key =
                        crate::upstream::hf_optimizers::key_for_optim_arg(&kind, name, &newest)?;
                    let value = match value.parse::<f64>() {
                        Ok(x) => lit(&Value::from(x)),
                        // `_get_sgd`: `value.lower() in ("true", "1", "yes")`.
                        Err(_) => {
                            matches!(value.to_ascii_lowercase().as_str(), "true" | "1" | "yes")
                                .to_string()
                        }
                    };
                    Some((key, value))
                })
                .collect();
            if let Some(pairs) = pairs {
                b.hf("optim_args");
                for (key, value) in pairs {
                    opt.retain(|(k, _)| k != key);
                    opt.push((key.to_string(), value));
                }
            }
        }
    }
    // Parameters the language does not model go into the block, where the check names them
    // (DeepSpeed would pass them to the optimizer's constructor). `max_grad_norm` stays raw:
    // R0031 says where it went.
    if let Some(Value::Object(params)) = at(&Value::Object(b.ds.clone()), "optimizer.params") {
        for (k, v) in params {
            if k != "max_grad_norm" && !is_auto(Some(v)) {
                b.ds(&format!("optimizer.params.{k}"), None);
                opt.push((k.clone(), lit(v)));
            }
        }
    }
    let opt = b.writable("optimizer", opt);
    out.push_str(&format!("optimizer {kind}{}\n\n", items(&opt)));

    // schedule: DeepSpeed's section if present, else HF's lr_scheduler_type.
    let total_auto = b.ds("scheduler.params.total_num_steps", None);
    let _ = total_auto; // derived from the step accounting
    let sched_type = b.ds("scheduler.type", None);
    let warmup_steps_arg = b.hf("warmup_steps");
    let warmup_ratio_arg = b.hf("warmup_ratio");
    // HF's warmup (`get_warmup_steps`): steps when positive (a float below 1 is a fraction in
    // 5.x), else `warmup_ratio` (4.x).
    let hf_warmup = {
        let ratio = warmup_ratio_arg.as_ref().and_then(num).filter(|r| *r > 0.0);
        let steps = warmup_steps_arg.as_ref().and_then(num).filter(|s| *s > 0.0);
        // A fraction is written as the number itself (a number below 1 is a fraction in the
        // language): `0.06`, not `6.000000000000001%`; a ratio of 1 is `100%`.
        let fraction = |f: f64| {
            if f < 1.0 {
                format!("{f}")
            } else {
                "100%".to_string()
            }
        };
        match (steps, ratio) {
            (Some(s), _) if s >= 1.0 => Some(format!("{}", s as i64)),
            (Some(s), _) => Some(fraction(s)),
            (None, Some(r)) => Some(fraction(r)),
            _ => None,
        }
    };
    let mut sched = Vec::new();
    let kind = match sched_type.as_ref().and_then(Value::as_str) {
        Some(t) => {
            // Taken raw: `"auto"` is HF's max(1, warmup from the arguments).
            let w = take(&mut b.ds, "scheduler.params.warmup_num_steps");
            // Recipe text: HF's warmup as the language writes it, else the config's value as a
            // literal (a string other than "auto" quoted, for the check to name, never raw).
            let w = match w {
                Some(Value::String(s)) if s == "auto" => hf_warmup.clone(),
                // HF matches warmup_num_steps against max(1, warmup_steps) (DeepSpeed ≥ 0.19.6
                // wants it positive), so 1 with `warmup_steps = 0` is a run without warmup.
                Some(v)
                    if num(&v) == Some(1.0)
                        && warmup_steps_arg.as_ref().and_then(num) == Some(0.0) =>
                {
                    warmup_steps_arg.as_ref().map(lit)
                }
                other => other.as_ref().map(lit),
            };
            if let Some(item) = w {
                sched.push(("warmup".to_string(), item));
            }
            // Every param the schema maps but the warmup length, read above.
            for (param, key) in ds_params("schedule", "scheduler", |k| k.name != "warmup") {
                let v = b.ds(&format!("scheduler.params.{param}"), None);
                match v {
                    // `"auto"` min/max lr are HF's 0 and learning_rate: the recipe's defaults.
                    Some(Value::String(s)) if s == "auto" => {}
                    Some(Value::String(s)) if key == "warmup_type" => {
                        sched.push((key.into(), label_or_quoted(&s)));
                    }
                    Some(v) => sched.push((key.into(), lit(&v))),
                    None => {}
                }
            }
            // -1 is DeepSpeed's default (a fresh run); any other value stays raw and is named.
            if at(
                &Value::Object(b.ds.clone()),
                "scheduler.params.last_batch_iteration",
            )
            .and_then(num)
                == Some(-1.0)
            {
                b.ds("scheduler.params.last_batch_iteration", None);
            }
            // DeepSpeed's own default warmup is log; say so rather than inherit the recipe's.
            if !sched.iter().any(|(k, _)| k == "warmup_type")
                && matches!(t, "WarmupLR" | "WarmupDecayLR" | "WarmupCosineLR")
            {
                sched.push(("warmup_type".into(), "log".into()));
            }
            b.hf("lr_scheduler_type");
            t.to_string()
        }
        None => {
            let name = b
                .hf("lr_scheduler_type")
                .and_then(|v| v.as_str().map(str::to_string))
                .unwrap_or_else(|| "linear".into());
            // A kind without warmup (`constant`, the metric-driven ones: `get_scheduler` passes
            // them no `num_warmup_steps`) ignores the field: it stays raw, as given.
            let takes_warmup = crate::schema::key_spec("schedule.warmup")
                .is_some_and(|k| k.applies_to(Some(name.as_str())));
            if let Some(w) = hf_warmup.clone() {
                if takes_warmup {
                    sched.push(("warmup".into(), w));
                } else {
                    for (field, v) in [
                        ("warmup_steps", &warmup_steps_arg),
                        ("warmup_ratio", &warmup_ratio_arg),
                    ] {
                        if let Some(v) = v.clone().filter(|v| num(v).is_some_and(|x| x > 0.0)) {
                            b.args.insert(field.to_string(), v);
                        }
                    }
                }
            }
            if let Some(Value::Object(kw)) = b.hf("lr_scheduler_kwargs") {
                for (k, v) in kw {
                    // The schedule key whose kwarg this is (the schema's `hf` column); one the
                    // language does not model stays raw (`hf { lr_scheduler_kwargs.<k> }`, which
                    // the emitter merges into the kwargs).
                    let field = format!("lr_scheduler_kwargs.{k}");
                    match crate::schema::block("schedule")
                        .and_then(|b| b.keys.iter().find(|key| key.hf == Some(field.as_str())))
                    {
                        // HF's shape names as the language's words ("1-sqrt").
                        Some(key) if key.name.ends_with("_shape") => {
                            let word = v
                                .as_str()
                                .and_then(crate::upstream::schedules::wsd_shape_word);
                            match word {
                                Some(w) => sched.push((key.name.to_string(), w.to_string())),
                                None => sched.push((key.name.to_string(), lit(&v))),
                            }
                        }
                        // A word the key takes is written bare (`mode = max`).
                        Some(key) => {
                            let word = match (key.ty, v.as_str()) {
                                (crate::schema::Ty::Word(words), Some(w)) if words.contains(&w) => {
                                    Some(w.to_string())
                                }
                                _ => None,
                            };
                            sched.push((key.name.to_string(), word.unwrap_or_else(|| lit(&v))));
                        }
                        None => {
                            b.args.insert(field, v);
                        }
                    }
                }
            }
            name
        }
    };
    let sched = b.writable("schedule", sched);
    let kind = label_or_quoted(&kind);
    out.push_str(&format!("schedule {kind}{}\n\n", items(&sched)));

    // train
    let mut train = Vec::new();
    if let Some(v) = b.hf("num_train_epochs") {
        train.push(("epochs".to_string(), lit(&v)));
    }
    if let Some(v) = b
        .hf("max_steps")
        .filter(|v| num(v).is_some_and(|s| s > 0.0))
    {
        train.push(("max_steps".into(), lit(&v)));
    }
    let clip = b.ds("gradient_clipping", Some("max_grad_norm"));
    let clip = clip.or_else(|| b.args.get("max_grad_norm").cloned());
    b.hf("max_grad_norm");
    if let Some(v) = clip {
        train.push(("clip".into(), lit(&v)));
    }
    let fp16_args = b.hf("fp16").and_then(|v| v.as_bool()).unwrap_or(false);
    // accelerate inserts `fp16: {enabled: true, auto_cast: true}` when the arguments train in
    // fp16 and the config has no fp16 section (`DeepSpeedPlugin.set_mixed_precision`,
    // docs/rules/pairs.md); the compiler writes `auto_cast: false`, so the recipe keeps the
    // inserted value raw.
    let fp16_section_absent = !b.ds.contains_key("fp16");
    let bf16_args = b.hf("bf16").and_then(|v| v.as_bool()).unwrap_or(false);
    let enabled = |b: &mut Builder, key: &str, arg: bool| match b.ds(key, None) {
        Some(Value::Bool(x)) => x,
        _ => arg, // absent or "auto": HF's argument decides
    };
    let fp16 = enabled(&mut b, "fp16.enabled", fp16_args);
    // The legacy `bfloat16` section is never read under HF: accelerate inserts a `bf16` section
    // when there is none, and DeepSpeed reads `bfloat16` only without `bf16` (dropped below).
    let bf16 = enabled(&mut b, "bf16.enabled", bf16_args);
    let precision = if fp16 {
        "fp16"
    } else if bf16 {
        "bf16"
    } else {
        "fp32"
    };
    train.push(("precision".into(), precision.into()));
    // Both halves on: keep the second one raw so the check reports the conflict that DeepSpeed
    // ("bfloat16 and fp16 modes cannot be simultaneously enabled") and HF refuse.
    if fp16 && bf16 {
        if bf16_args {
            b.args.insert("bf16".into(), Value::Bool(true));
        } else {
            b.ds.insert("bf16".into(), serde_json::json!({ "enabled": true }));
        }
    }
    // apex AMP: HF's backend field (4.x) or DeepSpeed's `amp` section.
    let backend = b.hf("half_precision_backend");
    let backend = b.hf("fp16_backend").or(backend);
    let amp = match b.ds("amp.enabled", None) {
        Some(Value::Bool(x)) => x,
        _ => false,
    };
    if amp || backend.as_ref().and_then(Value::as_str) == Some("apex") {
        train.push(("fp16_backend".into(), "apex".into()));
    }
    for (param, key) in [
        ("initial_scale_power", "initial_scale_power"),
        ("loss_scale_window", "loss_scale_window"),
        ("hysteresis", "hysteresis"),
        ("min_loss_scale", "min_loss_scale"),
    ] {
        if let Some(v) = b.ds(&format!("fp16.{param}"), None) {
            if fp16 {
                train.push((key.into(), lit(&v)));
            }
        }
    }
    if let Some(v) = b.ds("fp16.loss_scale", None) {
        if fp16 {
            let fixed = num(&v).filter(|x| *x > 0.0);
            train.push((
                "loss_scale".into(),
                fixed.map_or("dynamic".into(), |x| format!("{}", x as i64)),
            ));
        }
    }
    // auto_cast: the compiler writes false; a true (written, or accelerate's insert) stays raw.
    let auto_cast = b.ds("fp16.auto_cast", None);
    if fp16 && (auto_cast == Some(Value::Bool(true)) || (fp16_args && fp16_section_absent)) {
        if auto_cast.is_none() {
            b.comments.push(
                "fp16.auto_cast = true: the config has no fp16 section, so accelerate inserts one \
                 with auto_cast on"
                    .into(),
            );
        }
        b.ds.insert("fp16".into(), serde_json::json!({ "auto_cast": true }));
    }
    let logging = b.args.get("logging_steps").cloned();
    for f in [
        "seed",
        "logging_steps",
        "output_dir",
        "auto_find_batch_size",
    ] {
        if let Some(v) = b.hf(f) {
            train.push((f.into(), lit(&v)));
        }
    }
    // The compiler writes steps_per_print from logging_steps; another value stays raw.
    if let Some(v) = b.ds("steps_per_print", None) {
        if Some(&v) != logging.as_ref() {
            b.ds.insert("steps_per_print".into(), v);
        }
    }
    for (strategy, steps, key) in [
        ("eval_strategy", "eval_steps", "eval_every"),
        ("save_strategy", "save_steps", "save_every"),
    ] {
        // `evaluation_strategy` before transformers 4.41.
        let old = (strategy == "eval_strategy").then_some("evaluation_strategy");
        // Not given: HF's defaults (save every 500 steps, no evaluation), which the recipe's
        // own defaults are not.
        let s = b
            .hf(strategy)
            .or_else(|| old.and_then(|o| b.hf(o)))
            .or_else(|| hf_default(strategy));
        let n = b.hf(steps).or_else(|| hf_default(steps));
        match s.as_ref().and_then(Value::as_str) {
            Some("steps") => {
                if let Some(n) = n {
                    train.push((key.into(), lit(&n)));
                }
            }
            Some("no") => train.push((key.into(), "never".into())),
            Some("epoch") => train.push((key.into(), "epoch".into())),
            _ => {}
        }
    }
    for f in ["fp16_full_eval", "bf16_full_eval"] {
        if b.hf(f).and_then(|v| v.as_bool()) == Some(true) {
            train.push(("eval_precision".into(), f[..4].to_string()));
        }
    }
    out.push_str(&format!("train{}\n\n", items(&train)));

    // zero
    let stage = b.ds("zero_optimization.stage", None);
    let stage = stage.and_then(|v| v.as_i64()).unwrap_or(0);
    let mut zero = Vec::new();
    let zero_keys = crate::schema::block("zero").map_or(&[][..], |z| z.keys);
    // The schema's DeepSpeed name of each `zero` key (the offload calls first, then the rest).
    let leaf = |k: &crate::schema::KeySpec| {
        k.deepspeed
            .and_then(|d| d.strip_prefix("zero_optimization."))
    };
    for spec in zero_keys {
        let (crate::schema::Ty::Call(calls), Some(which)) = (spec.ty, leaf(spec)) else {
            continue;
        };
        let key = spec.name;
        let device = b.ds(&format!("zero_optimization.{which}.device"), None);
        let Some(device) = device.and_then(|v| v.as_str().map(str::to_string)) else {
            continue;
        };
        let mut args = Vec::new();
        // Every argument any of the calls takes, by its DeepSpeed name, once.
        let mut known: Vec<(&str, &str)> = Vec::new();
        // The device's own call first, so its arguments keep the order the docs give them.
        let own = calls.iter().filter(|c| c.name == device);
        for a in own
            .chain(calls.iter().filter(|c| c.name != device))
            .flat_map(|c| c.args)
        {
            if let Some(up) = a.upstream {
                if !known.iter().any(|(p, _)| *p == up) {
                    known.push((up, a.name));
                }
            }
        }
        for (param, arg) in known {
            if let Some(v) = b.ds(&format!("zero_optimization.{which}.{param}"), None) {
                if !v.is_null() {
                    args.push(format!("{arg}: {}", lit(&v)));
                }
            }
        }
        if device != "none" || !args.is_empty() {
            // A device that is not a word (`""`) is written quoted: the check names it.
            let call = if args.is_empty() || !is_word(&device) {
                label_or_quoted(&device)
            } else {
                format!("{device}({})", args.join(", "))
            };
            zero.push((key.to_string(), call));
        }
    }
    // HF fills these `"auto"` values from the model's hidden size (docs/upstream.md §2.2); the
    // recipe derives the same from `model.hidden_size`, so they need the hidden size and nothing
    // else.
    let hidden_autos = [
        "reduce_bucket_size",
        "stage3_prefetch_bucket_size",
        "stage3_param_persistence_threshold",
    ]
    .iter()
    .any(|k| {
        is_auto(at(
            &Value::Object(b.ds.clone()),
            &format!("zero_optimization.{k}"),
        ))
    });
    if hidden_autos && inputs.hidden_size.is_none() && !inputs.model_is_local {
        b.comments.push(
            "model.hidden_size is unknown: the config's \"auto\" ZeRO sizes are HF's hidden-size \
             values; give --hidden-size N (or --model DIR with its config.json)"
                .into(),
        );
    }
    for (spec, param) in zero_keys
        .iter()
        .filter(|k| !matches!(k.ty, crate::schema::Ty::Call(_)))
        .filter_map(|k| Some((k, leaf(k)?)))
    {
        let key = spec.name;
        // An `"auto"` comes back as None: derived from model.hidden_size.
        if let Some(v) = b.ds(&format!("zero_optimization.{param}"), None) {
            // Stage 3 ignores the stage-1/2 allgather knobs; at DeepSpeed's defaults (what
            // `recipe build` states there) they are not the user's choice, and R0601 would flag
            // them. Other values are kept, and flagged.
            let stage12_default = stage == 3
                && match param {
                    "allgather_partitions" => v.as_bool() == Some(true),
                    "allgather_bucket_size" => v.as_f64() == Some(5e8),
                    _ => false,
                };
            if !stage12_default {
                zero.push((key.into(), lit(&v)));
            }
        }
    }
    out.push_str(&format!("zero {stage}{}\n", items(&zero)));

    if inputs.gpus.is_some() || inputs.nodes.is_some() || inferred_gpus.is_some() {
        let mut cluster = Vec::new();
        if let Some(g) = inputs.gpus.or(inferred_gpus) {
            cluster.push(("gpus".to_string(), g.to_string()));
        }
        if let Some(n) = inputs.nodes {
            cluster.push(("nodes".to_string(), n.to_string()));
        }
        out.push_str(&format!("\ncluster{}\n", items(&cluster)));
    }
    // What the language does not model stays raw, still checked.
    if b.ds.get("wall_clock_breakdown") == Some(&Value::Bool(false)) {
        b.ds.remove("wall_clock_breakdown"); // DeepSpeed's default; the compiler writes it
    }
    // Top-level keys DeepSpeed does not read: it ignores them, so they say nothing about the run.
    let ignored: Vec<String> =
        b.ds.keys()
            .filter(|k| {
                crate::schema::upstream::DEEPSPEED_TOP_LEVEL
                    .binary_search(&k.as_str())
                    .is_err()
            })
            .cloned()
            .collect();
    for k in ignored {
        b.ds.remove(&k);
        b.ignored.push(k);
    }
    // Old names DeepSpeed no longer reads (`DEEPSPEED_RENAMED`, not honoured): they say nothing
    // about the run either.
    for (old, new, _, honoured) in crate::schema::upstream::DEEPSPEED_RENAMED {
        if !honoured && take(&mut b.ds, old).is_some() {
            let instead = if new.is_empty() {
                String::new()
            } else {
                format!(" (the current key is `{new}`)")
            };
            b.comments.push(format!(
                "{old} is not imported: DeepSpeed does not read it under HF{instead}"
            ));
        }
    }
    // `null` is DeepSpeed's "not set" (its readers' default applies); a recipe has no null.
    let mut nulls = Vec::new();
    raw_lines(&b.ds, "", &mut nulls);
    for (path, value) in nulls {
        if value == "null" {
            take(&mut b.ds, &path);
            b.comments.push(format!(
                "{path} = null is not imported: DeepSpeed's default applies, as for null"
            ));
        }
    }
    let mut raw = Vec::new();
    raw_lines(&b.ds, "", &mut raw);
    let raw = b.writable("deepspeed", raw);
    if !raw.is_empty() {
        out.push_str(&format!("\ndeepspeed{}\n", items(&raw)));
    }
    let mut raw = Vec::new();
    for (k, v) in &b.args {
        raw.push((k.clone(), lit(v)));
    }
    let raw = b.writable("hf", raw);
    if !raw.is_empty() {
        out.push_str(&format!("\nhf{}\n", items(&raw)));
    }
    if !b.comments.is_empty() || !b.dropped.is_empty() || !b.ignored.is_empty() {
        let mut head = String::new();
        for c in &b.comments {
            // Deprecated keys are mapped, not missing: a note, not a fill-in.
            let what = if c.contains(" is not imported: ") {
                "not imported"
            } else if c.starts_with("zero_optimization.") || c.starts_with("fp16.") {
                "mapped"
            } else {
                "fill in"
            };
            head.push_str(&comment(&format!("{what}: {c}")));
        }
        for k in &b.ignored {
            let top = crate::schema::upstream::DEEPSPEED_TOP_LEVEL.iter().copied();
            let hint = crate::check::suggest::closest(k, top)
                .map(|best| format!(" (did you mean `{best}`?)"))
                .unwrap_or_default();
            head.push_str(&comment(&format!(
                "not imported: `{k}` is not a DeepSpeed key; DeepSpeed ignores it{hint}"
            )));
        }
        for d in &b.dropped {
            head.push_str(&comment(&format!(
                "not imported: {d} is not a name a DeepSpeed key or TrainingArguments field has"
            )));
        }
        out = head + &out;
    }
    // One canonical layout.
    format::format_source(&out).unwrap_or(out)
}

/// The `training_args.json` keys that are not `TrainingArguments` fields of `transformers` (the
/// import's target release; the sampled field list of the newest release not newer): that
/// release's `TrainingArguments(**args)` refuses the file ("unexpected keyword argument"), even
/// where the import maps the key (e.g. `warmup_ratio` into `warmup`, `evaluation_strategy` into
/// `eval_every`). One message per key, with the rename where there was one.
pub fn unknown_args(args: &Value, transformers: crate::upstream::versions::Version) -> Vec<String> {
    let fields = crate::schema::upstream_versions::HfFields::for_target(transformers);
    let Some(obj) = args.as_object() else {
        return Vec::new();
    };
    obj.keys()
        .filter(|k| !fields.has(k))
        .map(|k| {
            let renamed = crate::schema::upstream::TRAINING_ARGUMENTS_RENAMED
                .iter()
                .find(|(old, _, _)| old == k)
                .map(|(_, new, note)| {
                    if new.is_empty() {
                        format!(" ({note})")
                    } else {
                        format!(" (now `{new}`: {note})")
                    }
                })
                .unwrap_or_default();
            format!(
                "`{k}` is not a TrainingArguments field of transformers {transformers}{renamed}: that release refuses the file (\"unexpected keyword argument\")"
            )
        })
        .collect()
}

/// The keys of `block` the schema maps to `<section>.params.<param>`, as (param, key), in schema
/// order, those `keep` accepts.
fn ds_params(
    block: &str,
    section: &str,
    keep: impl Fn(&crate::schema::KeySpec) -> bool,
) -> Vec<(&'static str, &'static str)> {
    let prefix = format!("{section}.params.");
    crate::schema::block(block)
        .map_or(&[][..], |b| b.keys)
        .iter()
        .filter(|k| keep(k))
        .filter_map(|k| Some((k.deepspeed?.strip_prefix(prefix.as_str())?, k.name)))
        .collect()
}
