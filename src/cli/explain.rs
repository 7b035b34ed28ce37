//! `recipe explain FILE [KEY] [--lr-csv PATH]`

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use recipe::commands::explain::{report, Report};
use recipe::resolve::value::fmt_f64;
use recipe::upstream::memory::gib;

use super::{load, Format, RecipeFlags, FAILED, OK, USAGE};

pub fn run(file: &Path, key: Option<&str>, lr_csv: Option<&PathBuf>, flags: &RecipeFlags) -> i32 {
    let (source, resolved, _) = match load(file, flags) {
        Ok(loaded) => loaded,
        Err(code) => return code,
    };
    let rep = report(&resolved, Some(&source));
    if let Some(path) = lr_csv {
        let mut csv = String::from("step,hf,deepspeed\n");
        for s in &rep.lr {
            let cell = |v: Option<f64>| v.map_or(String::new(), |x| format!("{x}"));
            let _ = writeln!(csv, "{},{},{}", s.step, cell(s.hf), cell(s.deepspeed));
        }
        if let Err(e) = recipe::commands::atomic::write(path, csv.as_bytes()) {
            eprintln!("error: cannot write `{}`: {e}", path.display());
            return USAGE;
        }
    }
    if let Some(key) = key {
        let Some(row) = rep.settings.iter().find(|r| r.key == key) else {
            let keys = rep.settings.iter().map(|r| r.key.as_str());
            match recipe::check::suggest::closest(key, keys) {
                Some(best) => eprintln!("error: no setting `{key}` (did you mean `{best}`?)"),
                None => {
                    eprintln!("error: no setting `{key}`; `recipe explain FILE` lists them all")
                }
            }
            return FAILED;
        };
        match flags.format {
            Format::Json => println!("{}", serde_json::to_string(row).expect("rows serialize")),
            Format::Human => {
                println!("{} = {}", row.key, row.value);
                println!("  from:              {}", row.from);
                if let Some(ds) = row.deepspeed {
                    println!("  DeepSpeed key:     {ds}");
                }
                if let Some(hf) = row.hf {
                    println!("  TrainingArguments: {hf}");
                }
                if let Some(note) = &row.upstream {
                    println!("  upstream:          {note}");
                }
            }
        }
        return OK;
    }
    match flags.format {
        Format::Json => println!(
            "{}",
            serde_json::to_string(&rep).expect("the report serializes")
        ),
        Format::Human => print!("{}", human(&rep)),
    }
    OK
}

fn table(rows: &[Vec<String>]) -> String {
    let cols = rows.iter().map(Vec::len).max().unwrap_or(0);
    let widths: Vec<usize> = (0..cols)
        .map(|c| {
            rows.iter()
                .filter_map(|r| r.get(c))
                .map(|s| s.chars().count())
                .max()
                .unwrap_or(0)
        })
        .collect();
    let mut out = String::new();
    for row in rows {
        let mut line = String::new();
        for (c, cell) in row.iter().enumerate() {
            if c + 1 == row.len() {
                line.push_str(cell);
            } else {
                let _ = write!(line, "{cell:<w$}  ", w = widths[c]);
            }
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

fn lr_cell(v: Option<f64>, peak: f64) -> String {
    match v {
        Some(x) if x.is_nan() => "error".into(),
        Some(x) => format!(
            "{} ({:.3})",
            fmt_sig(x),
            if peak > 0.0 { x / peak } else { 0.0 }
        ),
        None => "—".into(),
    }
}

fn fmt_sig(x: f64) -> String {
    if x == 0.0 {
        "0".into()
    } else {
        let s = format!("{x:.3e}");
        // 3.000e-5 → 3e-5
        match s.split_once('e') {
            Some((m, e)) => format!("{}e{e}", m.trim_end_matches('0').trim_end_matches('.')),
            None => s,
        }
    }
}

/// The report for people.
pub fn human(rep: &Report) -> String {
    let mut out = String::new();
    let targets: Vec<String> = rep
        .targets
        .iter()
        .map(|t| format!("{} {} ({})", t.library, t.version, t.from))
        .collect();
    let _ = writeln!(
        out,
        "recipe \"{}\"\ntargets: {}\n",
        rep.name,
        targets.join(", ")
    );
    let mut rows = vec![vec![
        "KEY".to_string(),
        "VALUE".into(),
        "FROM".into(),
        "DEEPSPEED".into(),
        "TRAININGARGUMENTS".into(),
    ]];
    for r in &rep.settings {
        rows.push(vec![
            r.key.clone(),
            r.value.clone(),
            r.from.clone(),
            r.deepspeed.unwrap_or("—").into(),
            r.hf.unwrap_or("—").into(),
        ]);
    }
    out.push_str(&table(&rows));
    if let Some(s) = &rep.steps {
        let _ = writeln!(out, "\nstep accounting");
        out.push_str(&table(&[
            vec!["  training samples".into(), s.samples.to_string()],
            vec![
                "  micro-batches per rank per epoch (L)".into(),
                s.batches_per_epoch.to_string(),
            ],
            vec![
                "  optimizer steps per epoch (U)".into(),
                s.per_epoch.to_string(),
            ],
            vec![
                "  micro-batches in an epoch's last window".into(),
                s.last_window.to_string(),
            ],
            vec!["  optimizer steps in all".into(), s.total.to_string()],
            vec!["  warmup steps".into(), s.warmup.to_string()],
        ]));
    }
    if !rep.lr.is_empty() {
        let peak = rep
            .settings
            .iter()
            .find(|r| r.key == "optimizer.lr")
            .and_then(|r| r.json.as_f64())
            .unwrap_or(0.0);
        let owner = match rep.schedule_owner {
            Some(recipe::upstream::schedules::Owner::DeepSpeed) => "DeepSpeed builds it",
            _ => "HF builds it",
        };
        let _ = writeln!(
            out,
            "\nlearning rate per optimizer step (peak {}; {owner}; fraction of peak in brackets)",
            fmt_f64(peak)
        );
        let mut rows = vec![vec![
            "  STEP".to_string(),
            format!("HF {}", rep.hf_schedule.unwrap_or("(no equivalent)")),
            format!(
                "DEEPSPEED {}",
                rep.deepspeed_schedule.unwrap_or("(no equivalent)")
            ),
        ]];
        let n = rep.lr.len();
        for (i, s) in rep.lr.iter().enumerate() {
            if n > 10 && i == 5 {
                rows.push(vec!["  …".into(), String::new(), String::new()]);
            }
            if n <= 10 || i < 5 || i >= n - 5 {
                rows.push(vec![
                    format!("  {}", s.step),
                    lr_cell(s.hf, peak),
                    lr_cell(s.deepspeed, peak),
                ]);
            }
        }
        out.push_str(&table(&rows));
        if n > 10 {
            let _ = writeln!(out, "  (--lr-csv FILE writes all {n} steps)");
        }
    }
    if let Some(m) = &rep.memory {
        let _ = writeln!(
            out,
            "\nZeRO memory, model states only ({}: {:.1}M parameters, largest layer {:.1}M; {} GPU(s) × {} node(s))",
            m.from,
            m.params as f64 / 1e6,
            m.largest_layer as f64 / 1e6,
            m.gpus_per_node,
            m.nodes
        );
        let mut rows = vec![vec![
            "  STAGE".to_string(),
            "OFFLOAD OPTIMIZER".into(),
            "OFFLOAD PARAM".into(),
            "PER GPU".into(),
            "PER NODE CPU".into(),
        ]];
        for e in &m.estimates {
            rows.push(vec![
                format!(
                    "  {}{}",
                    e.stage,
                    if e.chosen { " (this recipe)" } else { "" }
                ),
                e.offload_optimizer.into(),
                e.offload_param.into(),
                format!("{:.2} GiB", gib(e.per_gpu)),
                format!("{:.2} GiB", gib(e.per_node_cpu)),
            ]);
        }
        out.push_str(&table(&rows));
    }
    for note in &rep.notes {
        let _ = writeln!(out, "\nnote: {note}");
    }
    out
}
