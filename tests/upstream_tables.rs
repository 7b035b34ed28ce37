//! The generated upstream key tables (`src/schema/upstream_versions.rs`).
//!
//! That file is the output of `conformance/extract_upstream.py`, which reads the released packages
//! (transformers wheels, DeepSpeed sdists) from PyPI. Without Python and without network, this test
//! checks that the committed file is exactly what the script writes for the constants it defines:
//! the script's `TEMPLATE` (read from the script itself) filled with the tables re-rendered from the
//! compiled constants by the same rules as the script's `render_*` and `fill` (line layout, Rust
//! string escaping, counts, digest). A hand edit of the file — a line, a key, a comment, the order —
//! fails here; so does a change of the script's template or version lists without regenerating.
//! The remaining tests are facts about the extracted tables, checked by hand against the upstream
//! sources they cite.

use recipe::schema::upstream_versions::{
    HfFields, DEEPSPEED_TOP_LEVEL_BY_VERSION, DEEPSPEED_ZERO_KEYS_BY_VERSION,
    TRAINING_ARGUMENTS_BY_VERSION,
};
use sha2::{Digest, Sha256};

const GENERATED: &str = "src/schema/upstream_versions.rs";
const SCRIPT: &str = "conformance/extract_upstream.py";

fn read(rel: &str) -> String {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(rel);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The text between `start` (exclusive) and the next `end` in `script`.
fn between<'a>(script: &'a str, start: &str, end: &str) -> &'a str {
    let from = script
        .find(start)
        .unwrap_or_else(|| panic!("{SCRIPT}: no {start:?}"))
        + start.len();
    let len = script[from..]
        .find(end)
        .unwrap_or_else(|| panic!("{SCRIPT}: no {end:?} after {start:?}"));
    &script[from..from + len]
}

/// The script's `rust_str`: a Rust string literal, `\` and `"` escaped.
fn rust_str(s: &str) -> String {
    assert!(
        s.chars().all(|c| !c.is_control()),
        "unprintable string {s:?}"
    );
    format!("\"{}\"", s.replace('\\', "\\\\").replace('"', "\\\""))
}

/// The script's `render_training_arguments`.
fn render_training_arguments(releases: &[HfFields]) -> Vec<String> {
    let mut out = Vec::new();
    for h in releases {
        out.push(format!(
            "    // transformers=={} (PyPI wheel), transformers/training_args.py: {} fields",
            h.version,
            h.fields.len()
        ));
        out.push("    HfFields {".into());
        out.push(format!("        version: {},", rust_str(h.version)));
        out.push("        fields: &[".into());
        for (name, default) in h.fields {
            let value = match default {
                None => "None".to_string(),
                Some(d) => format!("Some({})", rust_str(d)),
            };
            out.push(format!("            ({}, {value}),", rust_str(name)));
        }
        out.push("        ],".into());
        if h.default_notes.is_empty() {
            out.push("        default_notes: &[],".into());
        } else {
            out.push("        default_notes: &[".into());
            for (name, note) in h.default_notes {
                out.push(format!(
                    "            ({}, {}),",
                    rust_str(name),
                    rust_str(note)
                ));
            }
            out.push("        ],".into());
        }
        out.push("    },".into());
    }
    out
}

/// The script's `render_keys`.
fn render_keys(releases: &[(&str, &[&str])]) -> Vec<String> {
    let mut out = Vec::new();
    for (version, keys) in releases {
        out.push(format!(
            "    // deepspeed=={version} (PyPI sdist): {} keys",
            keys.len()
        ));
        out.push("    (".into());
        out.push(format!("        {},", rust_str(version)));
        out.push("        &[".into());
        out.extend(keys.iter().map(|k| format!("            {},", rust_str(k))));
        out.push("        ],".into());
        out.push("    ),".into());
    }
    out
}

/// The script's `fill`: the template's `@@NAME@@` lines replaced by the tables, then the digest.
fn fill(template: &str, mut tables: Vec<(&str, Vec<String>)>) -> String {
    let mut lines: Vec<String> = Vec::new();
    for line in template.split('\n') {
        let marker = line
            .strip_prefix("@@")
            .and_then(|l| l.strip_suffix("@@"))
            .filter(|_| line.len() > 4);
        match marker {
            Some(name) => {
                let i = tables
                    .iter()
                    .position(|(n, _)| *n == name)
                    .unwrap_or_else(|| panic!("template names an unknown table {name}"));
                lines.extend(tables.remove(i).1);
            }
            None => lines.push(line.to_string()),
        }
    }
    assert!(
        tables.is_empty(),
        "tables without a place in the template: {:?}",
        tables.iter().map(|(n, _)| *n).collect::<Vec<_>>()
    );
    let zeros = "0".repeat(64);
    let text = lines.join("\n").replace("@@DIGEST@@", &zeros);
    let digest = format!("{:x}", Sha256::digest(text.as_bytes()));
    text.replacen(&zeros, &digest, 1)
}

fn expected_file() -> String {
    let script = read(SCRIPT);
    let template = between(&script, "\nTEMPLATE = r\"\"\"", "\"\"\"");
    fill(
        template,
        vec![
            (
                "TRAINING_ARGUMENTS_BY_VERSION",
                render_training_arguments(TRAINING_ARGUMENTS_BY_VERSION),
            ),
            (
                "DEEPSPEED_TOP_LEVEL_BY_VERSION",
                render_keys(DEEPSPEED_TOP_LEVEL_BY_VERSION),
            ),
            (
                "DEEPSPEED_ZERO_KEYS_BY_VERSION",
                render_keys(DEEPSPEED_ZERO_KEYS_BY_VERSION),
            ),
        ],
    )
}

#[test]
fn generated_file_is_the_scripts_output() {
    let committed = read(GENERATED);
    let expected = expected_file();
    if committed != expected {
        let (n, (c, e)) = committed
            .split('\n')
            .chain(std::iter::repeat("<end of file>"))
            .zip(
                expected
                    .split('\n')
                    .chain(std::iter::repeat("<end of file>")),
            )
            .enumerate()
            .find(|(_, (c, e))| c != e)
            .expect("texts differ");
        panic!(
            "{GENERATED} is not what {SCRIPT} writes for its constants (do not edit it by hand; \
             rerun `python3 {SCRIPT}`). First difference, line {}:\n  committed: {c}\n  expected:  {e}",
            n + 1
        );
    }
}

/// The version lists at the top of the script are the tables' versions.
#[test]
fn script_versions_are_the_tables_versions() {
    let script = read(SCRIPT);
    let list = |name: &str| -> Vec<String> {
        between(&script, &format!("\n{name} = ["), "]")
            .split(',')
            .map(|v| v.trim().trim_matches('"').to_string())
            .filter(|v| !v.is_empty())
            .collect()
    };
    let hf: Vec<&str> = TRAINING_ARGUMENTS_BY_VERSION
        .iter()
        .map(|h| h.version)
        .collect();
    assert_eq!(list("TRANSFORMERS_VERSIONS"), hf);
    for table in [
        DEEPSPEED_TOP_LEVEL_BY_VERSION,
        DEEPSPEED_ZERO_KEYS_BY_VERSION,
    ] {
        let ds: Vec<&str> = table.iter().map(|(v, _)| *v).collect();
        assert_eq!(list("DEEPSPEED_VERSIONS"), ds);
    }
}

/// `default_notes` covers exactly the fields without a literal default, in field order.
#[test]
fn hf_default_notes_are_the_none_defaults() {
    for h in TRAINING_ARGUMENTS_BY_VERSION {
        let none: Vec<&str> = h
            .fields
            .iter()
            .filter(|(_, d)| d.is_none())
            .map(|(n, _)| *n)
            .collect();
        let noted: Vec<&str> = h.default_notes.iter().map(|(n, _)| *n).collect();
        assert_eq!(noted, none, "transformers {}", h.version);
        for (name, note) in h.default_notes {
            assert!(
                *note == "no default: required argument"
                    || note.starts_with("default_factory=")
                    || note.starts_with("non-literal default `"),
                "transformers {} {name}: {note}",
                h.version
            );
        }
    }
}

// ---- facts about the extracted tables ------------------------------------------------------------

fn vkey(v: &str) -> Vec<u32> {
    v.split('.')
        .map(|p| p.parse().expect("numeric version part"))
        .collect()
}

fn hf(version: &str) -> &'static HfFields {
    TRAINING_ARGUMENTS_BY_VERSION
        .iter()
        .find(|h| h.version == version)
        .unwrap_or_else(|| panic!("no transformers {version}"))
}

/// `Some(default)` if `field` exists in `version` (default itself may be `None`), else `None`.
fn field(version: &str, name: &str) -> Option<Option<&'static str>> {
    hf(version)
        .fields
        .iter()
        .find(|(n, _)| *n == name)
        .map(|(_, d)| *d)
}

fn has(version: &str, name: &str) -> bool {
    field(version, name).is_some()
}

fn ds<'a>(table: &'a [(&str, &[&str])], version: &str) -> &'a [&'a str] {
    table
        .iter()
        .find(|(v, _)| *v == version)
        .map(|(_, k)| *k)
        .unwrap_or_else(|| panic!("no DeepSpeed {version}"))
}

fn sorted_unique(keys: &[&str]) -> bool {
    keys.windows(2).all(|w| w[0] < w[1])
}

/// The sampled transformers releases, oldest first (the script's list:
/// `script_versions_are_the_tables_versions`).
fn hf_versions() -> Vec<&'static str> {
    TRAINING_ARGUMENTS_BY_VERSION
        .iter()
        .map(|h| h.version)
        .collect()
}
const DS_VERSIONS: &[&str] = &[
    "0.3.16", "0.4.5", "0.5.10", "0.6.7", "0.7.7", "0.8.3", "0.9.5", "0.10.3", "0.11.2", "0.12.6",
    "0.13.5", "0.14.0", "0.14.2", "0.14.5", "0.15.0", "0.15.4", "0.16.0", "0.16.9", "0.17.0",
    "0.17.6", "0.18.0", "0.18.9", "0.19.0", "0.19.5", "0.19.8",
];

#[test]
fn hf_versions_sorted() {
    assert!(TRAINING_ARGUMENTS_BY_VERSION
        .windows(2)
        .all(|w| vkey(w[0].version) < vkey(w[1].version)));
}

#[test]
fn hf_fields_sorted_unique_and_counted() {
    let counts = [
        67, 101, 102, 105, 106, 107, 108, 108, 108, 109, 111, 111, 112, 114, 118, 118, 120, 121,
        122, 125, 125, 126, 128, 128, 129, 130, 131, 131, 131, 131, 131, 132, 129, 128, 128, 130,
        130, 130, 131, 132, 109, 109, 109, 109, 109, 109, 112, 112, 112, 112, 112, 112, 112, 112,
        112, 112, 112, 112, 112, 112, 112, 112, 112, 114, 114, 114,
    ];
    assert_eq!(counts.len(), TRAINING_ARGUMENTS_BY_VERSION.len());
    for (h, n) in TRAINING_ARGUMENTS_BY_VERSION.iter().zip(counts) {
        let names: Vec<&str> = h.fields.iter().map(|(n, _)| *n).collect();
        assert!(
            sorted_unique(&names),
            "transformers {} not sorted/unique",
            h.version
        );
        assert_eq!(names.len(), n, "transformers {} field count", h.version);
        for (name, default) in h.fields {
            assert!(!name.is_empty() && !name.starts_with('_'), "{name}");
            if let Some(d) = default {
                assert!(!d.is_empty(), "{} {name}", h.version);
            }
        }
    }
}

#[test]
fn hf_facts() {
    // warmup: both in 4.6.1 (warmup_steps: int = 0, warmup_ratio: float = 0.0).
    assert_eq!(field("4.6.1", "warmup_steps"), Some(Some("0")));
    assert_eq!(field("4.6.1", "warmup_ratio"), Some(Some("0.0")));
    assert_eq!(field("5.0.0", "warmup_ratio"), Some(Some("None")));
    for v in ["5.24.0", "5.25.0"] {
        assert!(!has(v, "warmup_ratio"), "{v}");
        assert_eq!(field(v, "warmup_steps"), Some(Some("0")), "{v}");
    }

    // evaluation_strategy -> eval_strategy (renamed in 4.41, old name gone by 4.52.1).
    assert_eq!(field("4.24.0", "evaluation_strategy"), Some(Some("'no'")));
    assert_eq!(field("4.41.0", "evaluation_strategy"), Some(Some("None")));
    assert_eq!(field("4.46.0", "evaluation_strategy"), Some(Some("None")));
    for v in ["4.52.1", "4.57.6", "5.0.0", "5.24.0", "5.25.0"] {
        assert!(!has(v, "evaluation_strategy"), "{v}");
    }
    for v in ["4.6.1", "4.24.0", "4.30.0"] {
        assert!(!has(v, "eval_strategy"), "{v}");
    }
    for v in [
        "4.41.0", "4.46.0", "4.52.1", "4.57.6", "5.0.0", "5.24.0", "5.25.0",
    ] {
        assert_eq!(field(v, "eval_strategy"), Some(Some("'no'")), "{v}");
    }

    // optim: new in 4.16.0 (absent in 4.15.0); a literal default up to 4.26.1, not from 4.27.4.
    assert!(!has("4.6.1", "optim"));
    for v in ["4.24.0", "4.25.1", "4.26.1"] {
        assert_eq!(field(v, "optim"), Some(Some("'adamw_hf'")), "{v}");
    }
    let versions = hf_versions();
    let from = versions.iter().position(|v| *v == "4.27.4").unwrap();
    for v in &versions[from..] {
        assert_eq!(field(v, "optim"), Some(None), "{v}");
    }
    // Fields change inside a minor series too: 4.46.3 has average_tokens_across_devices,
    // 4.46.0 does not; and between the series: logging_dir and warmup_ratio leave in 5.15.
    assert!(!has("4.46.0", "average_tokens_across_devices"));
    assert!(has("4.46.3", "average_tokens_across_devices"));
    for f in ["logging_dir", "warmup_ratio"] {
        assert!(has("5.14.1", f) && !has("5.15.1", f), "{f}");
    }

    // lr_scheduler_kwargs: new in 4.36.0; default_factory=dict up to 4.52.1, literal None later.
    for v in ["4.6.1", "4.24.0", "4.30.0"] {
        assert!(!has(v, "lr_scheduler_kwargs"), "{v}");
    }
    assert_eq!(field("4.41.0", "lr_scheduler_kwargs"), Some(None));
    assert_eq!(field("4.52.1", "lr_scheduler_kwargs"), Some(None));
    assert_eq!(field("4.57.6", "lr_scheduler_kwargs"), Some(Some("None")));
    assert_eq!(field("5.24.0", "lr_scheduler_kwargs"), Some(Some("None")));
    assert_eq!(field("5.25.0", "lr_scheduler_kwargs"), Some(Some("None")));

    // fp16_backend (4.6.1 … 4.57.6) vs half_precision_backend (4.24.0 … 4.57.6); neither in 5.x.
    assert_eq!(field("4.6.1", "fp16_backend"), Some(Some("'auto'")));
    assert!(!has("4.6.1", "half_precision_backend"));
    for v in ["4.24.0", "4.30.0", "4.41.0", "4.46.0", "4.52.1", "4.57.6"] {
        assert_eq!(field(v, "fp16_backend"), Some(Some("'auto'")), "{v}");
        assert_eq!(
            field(v, "half_precision_backend"),
            Some(Some("'auto'")),
            "{v}"
        );
    }
    for v in ["5.0.0", "5.24.0", "5.25.0"] {
        assert!(
            !has(v, "fp16_backend") && !has(v, "half_precision_backend"),
            "{v}"
        );
    }

    // gradient_checkpointing in 4.24 (not 4.6.1); activation_checkpointing only in 5.24.0.
    assert!(!has("4.6.1", "gradient_checkpointing"));
    assert_eq!(
        field("4.24.0", "gradient_checkpointing"),
        Some(Some("False"))
    );
    assert_eq!(
        field("5.24.0", "gradient_checkpointing"),
        Some(Some("None"))
    );
    assert_eq!(
        field("5.24.0", "activation_checkpointing"),
        Some(Some("None"))
    );
    assert!(!has("5.0.0", "activation_checkpointing"));

    // 5.25.0's training_args.py is 5.24.0's, byte for byte: the same fields and defaults.
    assert_eq!(hf("5.25.0").fields, hf("5.24.0").fields);

    // bf16 absent in 4.6.1; save_safetensors 4.30.0 (False) … 4.57.6 (True); adafactor gone in 5.x.
    assert!(!has("4.6.1", "bf16") && has("4.24.0", "bf16") && has("5.24.0", "bf16"));
    assert_eq!(field("4.30.0", "save_safetensors"), Some(Some("False")));
    assert_eq!(field("4.41.0", "save_safetensors"), Some(Some("True")));
    assert!(!has("4.24.0", "save_safetensors") && !has("5.0.0", "save_safetensors"));
    assert!(has("4.57.6", "adafactor") && !has("5.0.0", "adafactor"));
    assert_eq!(field("5.0.0", "report_to"), Some(Some("'none'")));
    assert_eq!(field("4.57.6", "report_to"), Some(Some("None")));

    // deepspeed everywhere; output_dir required up to 4.46.0; _n_gpu (init=False) never listed.
    for v in hf_versions() {
        assert_eq!(field(v, "deepspeed"), Some(Some("None")), "{v}");
        assert!(!has(v, "_n_gpu"), "{v}");
    }
    assert_eq!(field("4.46.0", "output_dir"), Some(None));
    assert_eq!(field("4.52.1", "output_dir"), Some(Some("None")));
}

#[test]
fn ds_tables_sorted_unique() {
    for table in [
        DEEPSPEED_TOP_LEVEL_BY_VERSION,
        DEEPSPEED_ZERO_KEYS_BY_VERSION,
    ] {
        let got: Vec<&str> = table.iter().map(|(v, _)| *v).collect();
        assert_eq!(got, DS_VERSIONS);
        assert!(table.windows(2).all(|w| vkey(w[0].0) < vkey(w[1].0)));
        for (v, keys) in table {
            assert!(sorted_unique(keys), "DeepSpeed {v} not sorted/unique");
        }
    }
    let top: Vec<usize> = DEEPSPEED_TOP_LEVEL_BY_VERSION
        .iter()
        .map(|(_, k)| k.len())
        .collect();
    assert_eq!(
        top,
        [
            30, 31, 35, 38, 41, 43, 44, 45, 46, 48, 49, 49, 49, 50, 52, 52, 52, 54, 54, 55, 55, 56,
            56, 60, 52
        ]
    );
    let zero: Vec<usize> = DEEPSPEED_ZERO_KEYS_BY_VERSION
        .iter()
        .map(|(_, k)| k.len())
        .collect();
    assert_eq!(
        zero,
        [
            20, 22, 22, 23, 31, 31, 34, 40, 40, 41, 41, 41, 41, 43, 43, 43, 45, 47, 47, 49, 50, 53,
            53, 53, 52
        ]
    );
}

#[test]
fn ds_facts() {
    let z = |v| ds(DEEPSPEED_ZERO_KEYS_BY_VERSION, v);
    let t = |v| ds(DEEPSPEED_TOP_LEVEL_BY_VERSION, v);
    // 0.3.16: both the old bool `cpu_offload` and the new `offload_optimizer` (new in 0.3.15).
    for k in [
        "cpu_offload",
        "offload_optimizer",
        "offload_param",
        "cpu_offload_params",
    ] {
        assert!(z("0.3.16").contains(&k), "{k}");
    }
    // `cpu_offload_params` (plain dict, ≤ 0.5.10) became the pydantic field `cpu_offload_param`.
    assert!(z("0.5.10").contains(&"cpu_offload_params"));
    for v in ["0.8.3", "0.14.2", "0.19.5", "0.19.8"] {
        assert!(z(v).contains(&"cpu_offload_param") && !z(v).contains(&"cpu_offload_params"));
        assert!(z(v).contains(&"gather_16bit_weights_on_model_save"));
    }
    assert!(!z("0.3.16").contains(&"cpu_offload_use_pin_memory"));
    assert!(z("0.8.3").contains(&"cpu_offload_use_pin_memory"));
    // find_unused_parameters (0.3.16) -> ignore_unused_parameters (0.5.10 on).
    assert!(z("0.3.16").contains(&"find_unused_parameters"));
    assert!(!z("0.5.10").contains(&"find_unused_parameters"));
    assert!(z("0.5.10").contains(&"ignore_unused_parameters"));
    // stage3_* keys in every version (names, then aliases of the pydantic fields).
    for v in DS_VERSIONS {
        for k in [
            "stage",
            "stage3_prefetch_bucket_size",
            "stage3_param_persistence_threshold",
        ] {
            assert!(z(v).contains(&k), "{v} {k}");
        }
        for k in [
            "zero_optimization",
            "fp16",
            "optimizer",
            "scheduler",
            "gradient_clipping",
        ] {
            assert!(t(v).contains(&k), "{v} {k}");
        }
        assert!(!t(v).contains(&"eigenvalue"), "{v}");
    }
    assert!(z("0.8.3").contains(&"stage3_gather_16bit_weights_on_model_save"));
    // bf16 section names: none in 0.3.16 and 0.4.5, only `bfloat16` in 0.5.10, both from 0.6.7
    // (versions.rs: `bf16` from 0.6.0).
    for v in ["0.3.16", "0.4.5"] {
        assert!(
            !t(v).contains(&"bf16") && !t(v).contains(&"bfloat16"),
            "{v}"
        );
    }
    assert!(t("0.5.10").contains(&"bfloat16") && !t("0.5.10").contains(&"bf16"));
    for v in ["0.6.7", "0.8.3", "0.14.2", "0.19.5", "0.19.8"] {
        assert!(t(v).contains(&"bf16") && t(v).contains(&"bfloat16"), "{v}");
    }
    // fp32_allreduce only in 0.3.16; dataloader_drop_last from 0.5.10.
    assert!(t("0.3.16").contains(&"fp32_allreduce") && !t("0.5.10").contains(&"fp32_allreduce"));
    assert!(
        !t("0.3.16").contains(&"dataloader_drop_last")
            && t("0.5.10").contains(&"dataloader_drop_last")
    );
    // quantize_training: read in 0.5.10 and 0.19.5, not in 0.8.3 / 0.14.2 (undefined constant).
    assert!(
        t("0.5.10").contains(&"quantize_training") && t("0.19.5").contains(&"quantize_training")
    );
    assert!(
        !t("0.8.3").contains(&"quantize_training") && !t("0.14.2").contains(&"quantize_training")
    );
    // sequence-parallel comm dtype key renamed between 0.14.2 and 0.19.5.
    assert!(t("0.14.2").contains(&"seq_parallel_comm_data_type"));
    assert!(t("0.19.5").contains(&"seq_parallel_communication_data_type"));
    assert!(!t("0.19.5").contains(&"seq_parallel_comm_data_type"));
    // data_parallel_size: read only by deepspeed.initialize, from 0.15.0 on; the 0.3.16 reader
    // of a top-level reduce_scatter is never called.
    assert!(
        t("0.15.0").contains(&"data_parallel_size") && !t("0.14.5").contains(&"data_parallel_size")
    );
    // Read in the sources of the dense samples (src/check/raw.rs decides between them):
    // `compile` read by 0.13.5, not by 0.14.5 (`get_compile_config` gone from
    // runtime/config.py) nor 0.16.0, again by 0.16.9; `torch_autocast` from 0.17.6, not 0.17.0.
    assert!(t("0.13.5").contains(&"compile") && !t("0.14.5").contains(&"compile"));
    assert!(!t("0.16.0").contains(&"compile") && t("0.16.9").contains(&"compile"));
    assert!(!t("0.17.0").contains(&"torch_autocast") && t("0.17.6").contains(&"torch_autocast"));
    // quantize_training unread from 0.8.3 through 0.19.0 (its constant undefined).
    for v in ["0.9.5", "0.14.5", "0.17.6", "0.19.0"] {
        assert!(!t(v).contains(&"quantize_training"), "{v}");
    }
    // 0.7.7 (which conformance runs): the pydantic zero fields 0.8.3 has, and `bf16`, but not
    // 0.8.3's `data_efficiency` and `zero_force_ds_cpu_optimizer`.
    assert_eq!(z("0.7.7"), z("0.8.3"));
    assert!(t("0.7.7").contains(&"bf16") && !t("0.7.7").contains(&"data_efficiency"));
    assert!(!t("0.7.7").contains(&"zero_force_ds_cpu_optimizer"));
    // zero fields of the dense samples: `leaf_module` from 0.18.0, `zenflow` from 0.17.6.
    assert!(!z("0.17.6").contains(&"leaf_module") && z("0.18.0").contains(&"leaf_module"));
    assert!(!z("0.17.0").contains(&"zenflow") && z("0.17.6").contains(&"zenflow"));
    assert!(!t("0.3.16").contains(&"reduce_scatter") && z("0.3.16").contains(&"reduce_scatter"));
    // 0.19.8 (docs/upstream.md §0.4): new top-level and zero keys; the removed features' sections
    // are no longer read (R0909's keys).
    for k in ["gradient_allreduce_op", "disable_python_gc"] {
        assert!(t("0.19.8").contains(&k) && !t("0.19.5").contains(&k), "{k}");
    }
    for k in ["compute_grad_norm", "parameter_alignment"] {
        assert!(z("0.19.8").contains(&k) && !z("0.19.5").contains(&k), "{k}");
    }
    for k in [
        "amp",
        "sparse_attention",
        "elasticity",
        "quantize_training",
        "nebula",
    ] {
        assert!(t("0.19.5").contains(&k) && !t("0.19.8").contains(&k), "{k}");
    }
    for k in [
        "mics_shard_size",
        "mics_hierarchical_params_gather",
        "zeropp_loco_param",
    ] {
        assert!(z("0.19.5").contains(&k) && !z("0.19.8").contains(&k), "{k}");
    }
}
