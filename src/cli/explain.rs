//! `recipe explain FILE [KEY] [--lr-csv PATH]`

use std::fmt::Write as _;
use std::path::Path;

use recipe::commands::explain::{report, Report};
use recipe::resolve::value::fmt_f64;
use recipe::upstream::memory::gib;

use super::{load, Format, RecipeFlags, FAILED, OK, USAGE};

/// The files `explain` writes besides its report, and how it lays the report out.
pub struct Files<'a> {
    /// `--lr-csv`.
    pub lr_csv: Option<&'a Path>,
    /// `--plot`.
    pub plot: Option<&'a Path>,
    /// The settings' layout.
    pub layout: Layout,
}

/// How the settings are laid out for people.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layout {
    /// `--wide`: one table row per setting, every column (as wide as it takes).
    Wide,
    /// Grouped by block, fitted to this many columns; `colour` for a terminal.
    Fit {
        /// Columns.
        width: usize,
        /// ANSI colour (stdout is a terminal, NO_COLOR unset).
        colour: bool,
    },
}

impl Layout {
    /// `--wide`, else the width of `COLUMNS`, of the terminal stdout is, or 100.
    pub fn detect(wide: bool) -> Layout {
        use std::io::IsTerminal;
        if wide {
            return Layout::Wide;
        }
        let tty = std::io::stdout().is_terminal();
        let width = std::env::var("COLUMNS")
            .ok()
            .and_then(|c| c.trim().parse::<usize>().ok())
            .filter(|&w| w > 0)
            .or_else(|| tty.then(terminal_width).flatten())
            .unwrap_or(100)
            .max(40);
        Layout::Fit {
            width,
            colour: tty && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty()),
        }
    }
}

/// The terminal's columns (TIOCGWINSZ on stdout).
fn terminal_width() -> Option<usize> {
    #[cfg(unix)]
    {
        // SAFETY: TIOCGWINSZ fills the winsize struct it is given; a zeroed one is valid input.
        let mut ws: libc::winsize = unsafe { std::mem::zeroed() };
        let ok = unsafe { libc::ioctl(libc::STDOUT_FILENO, libc::TIOCGWINSZ, &mut ws) } == 0;
        (ok && ws.ws_col > 0).then_some(ws.ws_col as usize)
    }
    #[cfg(not(unix))]
    {
        None
    }
}

pub fn run(file: &Path, key: Option<&str>, files: Files<'_>, flags: &RecipeFlags) -> i32 {
    let (source, resolved, _) = match load(file, flags) {
        Ok(loaded) => loaded,
        Err(code) => return code,
    };
    let rep = report(&resolved, Some(&source));
    if let Some(path) = files.plot {
        if let Err(e) = plot(&rep, path) {
            eprintln!("error: {e}");
            return USAGE;
        }
    }
    if let Some(path) = files.lr_csv {
        if let Err(e) = lr_csv(&resolved, path) {
            eprintln!("error: {e}");
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
        Format::Human => print!("{}", human(&rep, files.layout)),
    }
    OK
}

/// The most rows `--lr-csv` writes: about 4 GB of text.
const CSV_STEPS_MAX: u64 = 100_000_000;

/// `--lr-csv`: every optimizer step's LR on each side, computed as it is written (the report
/// lists a sample of a long run's), through a temporary file renamed at the end.
fn lr_csv(r: &recipe::resolve::Resolved, path: &Path) -> Result<(), String> {
    use std::io::Write as _;
    let Some(curves) = recipe::upstream::schedules::curves(r) else {
        return Err("--lr-csv: no LR to write (the number of training samples is unknown: give `data.samples` or --samples)".into());
    };
    let n = curves.total();
    if n > CSV_STEPS_MAX {
        return Err(format!(
            "--lr-csv: the run has {n} optimizer steps; the CSV is written for runs of at most {CSV_STEPS_MAX} (about 4 GB)"
        ));
    }
    recipe::commands::atomic::write_with(path, |out| {
        let mut w = std::io::BufWriter::new(out);
        w.write_all(b"step,hf,deepspeed\n")?;
        let cell = |v: Option<f64>| v.map_or(String::new(), |x| format!("{x}"));
        for k in 1..=n {
            let s = curves.at(k);
            writeln!(w, "{},{},{}", s.step, cell(s.hf), cell(s.deepspeed))?;
        }
        w.flush()
    })
    .map_err(|e| format!("cannot write `{}`: {e}", path.display()))
}

/// `--plot`: HF's and DeepSpeed's LR per optimizer step, epoch ends, the steps they differ at
/// (of the report's steps: a long run's sample).
fn plot(rep: &Report, path: &Path) -> Result<(), String> {
    use recipe_runtime::plot::{curves_chart, Curve, LR_AXES};
    if rep.lr.is_empty() {
        return Err(
            "--plot: no LR to draw (the number of training samples is unknown: give `data.samples` or --samples)"
                .into(),
        );
    }
    let side = |f: fn(&recipe::upstream::schedules::LrStep) -> Option<f64>| -> Vec<(u64, f64)> {
        rep.lr
            .iter()
            .filter_map(|s| f(s).map(|v| (s.step, v)))
            .collect()
    };
    let hf = side(|s| s.hf);
    let ds = side(|s| s.deepspeed);
    let hf_name = format!("HF {}", rep.hf_schedule.unwrap_or("(no equivalent)"));
    let ds_name = format!(
        "DeepSpeed {}",
        rep.deepspeed_schedule.unwrap_or("(no equivalent)")
    );
    let mut curves = Vec::new();
    if !hf.is_empty() {
        curves.push(Curve {
            name: &hf_name,
            points: &hf,
        });
    }
    if !ds.is_empty() {
        curves.push(Curve {
            name: &ds_name,
            points: &ds,
        });
    }
    let (per_epoch, total) = rep
        .steps
        .as_ref()
        .map_or((0, 0), |s| (s.per_epoch, s.total));
    let epoch_ends: Vec<u64> = (1..)
        .map(|e| e * per_epoch)
        .take_while(|&s| per_epoch > 0 && s <= total)
        .collect();
    let differ: Vec<u64> = rep
        .lr
        .iter()
        .filter(|s| matches!((s.hf, s.deepspeed), (Some(a), Some(b)) if (a - b).abs() > 1e-12 * a.abs().max(b.abs())))
        .map(|s| s.step)
        .collect();
    let owner = match rep.schedule_owner {
        Some(recipe::upstream::schedules::Owner::DeepSpeed) => "DeepSpeed builds it",
        _ => "HF builds it",
    };
    let title = format!("{}: learning rate per optimizer step ({owner})", rep.name);
    curves_chart(path, &title, &LR_AXES, &curves, &epoch_ends, &differ).map_err(|e| e.to_string())
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

/// Words of `text` in lines of at most `width` characters, each after `indent` (the first after
/// `first`, which the caller has already written); a word longer than a line stands alone.
fn wrap(text: &str, first: usize, indent: usize, width: usize) -> String {
    let mut out = String::new();
    let mut col = first;
    let mut line_empty = true;
    for word in text.split_whitespace() {
        let len = word.chars().count();
        if !line_empty && col + 1 + len > width {
            // A word too long for the indent (a long DeepSpeed key) starts further left.
            let at = indent.min(width.saturating_sub(len));
            out.push('\n');
            out.push_str(&" ".repeat(at));
            col = at;
            line_empty = true;
        }
        if !line_empty {
            out.push(' ');
            col += 1;
        }
        out.push_str(word);
        col += len;
        line_empty = false;
    }
    out
}

/// The settings grouped by block, fitted to `width`: `key  value  provenance` on one line when
/// it fits, else the provenance on the next line under the value; then what it feeds upstream
/// and what upstream does with it.
fn settings_fitted(rep: &Report, width: usize, colour: bool) -> String {
    let paint = |code: &str, text: &str| {
        if colour {
            format!("\x1b[{code}m{text}\x1b[0m")
        } else {
            text.to_string()
        }
    };
    let mut out = String::new();
    let name_of = |key: &str| key.split_once('.').map_or(key, |(_, k)| k).to_string();
    let key_w = rep
        .settings
        .iter()
        .map(|r| name_of(&r.key).chars().count())
        .max()
        .unwrap_or(0)
        .min(18);
    let mut block = "";
    for r in &rep.settings {
        let b = r.key.split_once('.').map_or("", |(b, _)| b);
        if b != block {
            block = b;
            let _ = writeln!(out, "{}", paint("1", b));
        }
        let name = name_of(&r.key);
        let value_col = 2 + key_w.max(name.chars().count()) + 2;
        let head = format!("  {name:<key_w$}  ");
        let value = wrap(&r.value, value_col, value_col, width);
        out.push_str(&head);
        out.push_str(&value);
        let end = value.rsplit('\n').next().map_or(0, |l| {
            if value.contains('\n') {
                l.chars().count()
            } else {
                value_col + l.chars().count()
            }
        });
        // The provenance beside the value when it fits, else below it.
        let from_len = r.from.chars().count();
        if !value.contains('\n') && end + 2 + from_len <= width {
            out.push_str("  ");
            out.push_str(&paint("2", &r.from));
        } else {
            out.push('\n');
            out.push_str(&" ".repeat(value_col));
            out.push_str(&paint("2", &wrap(&r.from, value_col, value_col, width)));
        }
        out.push('\n');
        let mut feeds = Vec::new();
        if let Some(ds) = r.deepspeed {
            feeds.push(format!("DeepSpeed {ds}"));
        }
        if let Some(hf) = r.hf {
            feeds.push(format!("TrainingArguments {hf}"));
        }
        if !feeds.is_empty() {
            let text = format!("→ {}", feeds.join(" · "));
            out.push_str(&" ".repeat(value_col));
            out.push_str(&wrap(&text, value_col, value_col + 2, width));
            out.push('\n');
        }
        if let Some(note) = &r.upstream {
            let text = format!("upstream: {note}");
            out.push_str(&" ".repeat(value_col));
            out.push_str(&wrap(&text, value_col, value_col + 2, width));
            out.push('\n');
        }
    }
    out
}

/// The report for people.
pub fn human(rep: &Report, layout: Layout) -> String {
    let mut out = String::new();
    let targets: Vec<String> = rep
        .targets
        .iter()
        .map(|t| format!("{} {} ({})", t.library, t.version, t.from))
        .collect();
    let width = match layout {
        Layout::Wide => usize::MAX,
        Layout::Fit { width, .. } => width,
    };
    let _ = writeln!(
        out,
        "recipe \"{}\"\ntargets: {}\n",
        rep.name,
        wrap(&targets.join(", "), 9, 9, width)
    );
    if let Layout::Fit { width, colour } = layout {
        out.push_str(&settings_fitted(rep, width, colour));
    } else {
        out.push_str(&settings_wide(rep));
    }
    rest(rep, &mut out, width);
    out
}

/// One row per setting, every column.
fn settings_wide(rep: &Report) -> String {
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
    table(&rows)
}

/// Step accounting, the LR table, memory and notes (narrow already, but for the notes).
fn rest(rep: &Report, out: &mut String, width: usize) {
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
        let heading = format!(
            "learning rate per optimizer step (peak {}; {owner}; fraction of peak in brackets)",
            fmt_f64(peak)
        );
        let _ = writeln!(out, "\n{}", wrap(&heading, 0, 2, width));
        let mut rows = vec![vec![
            "  STEP".to_string(),
            format!("HF {}", rep.hf_schedule.unwrap_or("(no equivalent)")),
            format!(
                "DEEPSPEED {}",
                rep.deepspeed_schedule.unwrap_or("(no equivalent)")
            ),
        ]];
        let n = rep.lr.len();
        let total = rep.lr_steps;
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
        if total > CSV_STEPS_MAX {
            let _ = writeln!(out, "  ({total} steps in all)");
        } else if total > 10 {
            let _ = writeln!(out, "  (--lr-csv FILE writes all {total} steps)");
        }
    }
    if let Some(m) = &rep.memory {
        let heading = format!(
            "ZeRO memory, model states only ({}: {:.1}M parameters, largest layer {:.1}M; {} GPU(s) × {} node(s))",
            m.from,
            m.params as f64 / 1e6,
            m.largest_layer as f64 / 1e6,
            m.gpus_per_node,
            m.nodes
        );
        let _ = writeln!(out, "\n{}", wrap(&heading, 0, 2, width));
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
        let _ = writeln!(out, "\nnote: {}", wrap(note, 6, 6, width));
    }
}
