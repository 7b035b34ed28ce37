//! Pictures of a run, drawn with `plotters` (SVG and PNG back-ends, no system libraries; the text
//! uses DejaVu Sans, shipped in `runtime/assets/` with its licence, through plotters' pure-Rust
//! `ab_glyph` renderer):
//!
//! - `loss.svg` / `loss.png`: training loss per logged step, evaluation loss per evaluation, the
//!   LR on the right-hand axis, skipped (overflow) steps marked; below it, evaluation accuracy;
//! - `throughput.svg`: samples per second per logged step, and the model FLOPs utilization on
//!   the right-hand axis where the run reported it;
//! - [`curves_chart`]: LR curves per optimizer step (`recipe explain --plot`) and optimizer steps
//!   per micro-batch (`recipe steps --plot`), with epoch ends and the points where the curves
//!   disagree marked.
//!
//! Each picture is written to a temporary file and renamed into place.

use std::path::{Path, PathBuf};
use std::sync::Once;

use plotters::coord::Shift;
use plotters::prelude::*;

/// The figures of one run, read back from its metrics.jsonl.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RunSeries {
    /// Logged steps: (step, loss, lr, samples/s).
    pub steps: Vec<(u64, f64, f64, f64)>,
    /// Steps skipped for an fp16 overflow.
    pub skipped: Vec<u64>,
    /// Evaluations: (step, loss, accuracy).
    pub evals: Vec<(u64, f64, f64)>,
    /// The logged steps' model FLOPs utilization (step, fraction), where the run reported one
    /// (runtime/src/flops.rs).
    pub mfu: Vec<(u64, f64)>,
}

impl RunSeries {
    /// Reads the records of a metrics.jsonl: the last run in it (the file is appended to: a
    /// `start` record begins a new run; after a `resume` the later records replace the steps
    /// they repeat); lines that are not records of a step or an evaluation are passed over.
    pub fn parse(text: &str) -> RunSeries {
        let mut s = RunSeries::default();
        for line in text.lines() {
            let Ok(v) = serde_json::from_str::<serde_json::Value>(line) else {
                continue;
            };
            if v.get("event").and_then(serde_json::Value::as_str) == Some("start") {
                s = RunSeries::default();
                continue;
            }
            let Some(step) = v.get("step").and_then(serde_json::Value::as_u64) else {
                continue;
            };
            let num = |x: &serde_json::Value, k: &str| x.get(k).and_then(serde_json::Value::as_f64);
            if let Some(e) = v.get("eval") {
                if let (Some(loss), Some(acc)) = (num(e, "loss"), num(e, "accuracy")) {
                    s.evals.retain(|&(st, ..)| st < step);
                    s.evals.push((step, loss, acc));
                }
            } else if let (Some(loss), Some(lr)) = (num(&v, "loss"), num(&v, "lr")) {
                s.steps.retain(|&(st, ..)| st < step);
                s.skipped.retain(|&st| st < step);
                s.mfu.retain(|&(st, _)| st < step);
                s.steps
                    .push((step, loss, lr, num(&v, "samples_per_s").unwrap_or(0.0)));
                if let Some(m) = num(&v, "mfu") {
                    s.mfu.push((step, m));
                }
                if v.get("skipped").and_then(serde_json::Value::as_bool) == Some(true) {
                    s.skipped.push(step);
                }
            }
        }
        s
    }
}

/// A picture could not be drawn or written.
#[derive(Debug, thiserror::Error)]
#[error("{path}: {message}")]
pub struct PlotError {
    /// The picture.
    pub path: PathBuf,
    /// What went wrong.
    pub message: String,
}

fn font() {
    static REGISTER: Once = Once::new();
    REGISTER.call_once(|| {
        let bytes: &'static [u8] = include_bytes!("../assets/DejaVuSans.ttf");
        // The font is the crate's own file: it always parses.
        let _ = plotters::style::register_font("sans-serif", FontStyle::Normal, bytes);
    });
}

/// The pixel size of every picture.
pub const SIZE: (u32, u32) = (960, 600);

const TRAIN: RGBColor = RGBColor(31, 119, 180);
const EVAL: RGBColor = RGBColor(255, 127, 14);
const LR: RGBColor = RGBColor(44, 160, 44);
const SKIP: RGBColor = RGBColor(214, 39, 40);
const GRID: RGBColor = RGBColor(220, 220, 220);

/// Writes `loss.svg`, `loss.png` and `throughput.svg` into `dir`; returns their paths.
pub fn write_run_charts(
    dir: &Path,
    series: &RunSeries,
    title: &str,
) -> Result<Vec<PathBuf>, PlotError> {
    font();
    let mut written = Vec::new();
    let loss_svg = dir.join("loss.svg");
    atomic(&loss_svg, |tmp| {
        let root = SVGBackend::new(tmp, SIZE).into_drawing_area();
        loss_chart(&root, series, title)
    })?;
    written.push(loss_svg);
    let loss_png = dir.join("loss.png");
    atomic(&loss_png, |tmp| {
        let mut rgb = vec![0u8; SIZE.0 as usize * SIZE.1 as usize * 3];
        {
            let root = BitMapBackend::with_buffer(&mut rgb, SIZE).into_drawing_area();
            loss_chart(&root, series, title)?;
        }
        write_png(tmp, &rgb, SIZE)
    })?;
    written.push(loss_png);
    let throughput = dir.join("throughput.svg");
    atomic(&throughput, |tmp| {
        let root = SVGBackend::new(tmp, SIZE).into_drawing_area();
        throughput_chart(&root, series, title)
    })?;
    written.push(throughput);
    Ok(written)
}

/// Writes `rgb`, 8-bit RGB pixels row by row, as a PNG file. The `png` crate encodes it:
/// plotters' own encoder (`bitmap_encoder`) would bring the whole `image` crate, decoders of
/// six formats, for this one picture.
fn write_png(path: &Path, rgb: &[u8], (w, h): (u32, u32)) -> Result<(), String> {
    let file = std::fs::File::create(path).map_err(|e| e.to_string())?;
    let mut enc = png::Encoder::new(std::io::BufWriter::new(file), w, h);
    enc.set_color(png::ColorType::Rgb);
    enc.set_depth(png::BitDepth::Eight);
    let mut writer = enc.write_header().map_err(|e| e.to_string())?;
    writer.write_image_data(rgb).map_err(|e| e.to_string())?;
    writer.finish().map_err(|e| e.to_string())
}

/// Draws into a temporary file beside `path`, then renames it into place.
fn atomic(path: &Path, draw: impl FnOnce(&Path) -> Result<(), String>) -> Result<(), PlotError> {
    let err = |message: String| PlotError {
        path: path.to_path_buf(),
        message,
    };
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("plot");
    let ext = path.extension().and_then(|e| e.to_str()).unwrap_or("svg");
    let tmp = path.with_file_name(format!(".{name}.partial.{ext}"));
    let drawn = draw(&tmp);
    if let Err(e) = drawn {
        let _ = std::fs::remove_file(&tmp);
        return Err(err(e));
    }
    std::fs::rename(&tmp, path).map_err(|e| err(e.to_string()))
}

fn range(values: impl Iterator<Item = f64>) -> std::ops::Range<f64> {
    let (lo, hi) = values
        .filter(|v| v.is_finite())
        .fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), v| {
            (a.min(v), b.max(v))
        });
    if !lo.is_finite() {
        return 0.0..1.0;
    }
    let pad = ((hi - lo) * 0.05).max(hi.abs() * 1e-3).max(1e-12);
    (lo - pad).min(0.0f64.max(lo - pad))..hi + pad
}

fn steps_range(series: &RunSeries) -> std::ops::Range<u64> {
    let last = series
        .steps
        .iter()
        .map(|s| s.0)
        .chain(series.evals.iter().map(|e| e.0))
        .max()
        .unwrap_or(1);
    0..last.max(1) + 1
}

fn loss_chart<DB: DrawingBackend>(
    root: &DrawingArea<DB, Shift>,
    s: &RunSeries,
    title: &str,
) -> Result<(), String> {
    let e = |x: DrawingAreaErrorKind<DB::ErrorType>| x.to_string();
    root.fill(&WHITE).map_err(e)?;
    let (upper, lower) = root.split_vertically(SIZE.1 * 2 / 3);
    let x = steps_range(s);
    let loss = range(
        s.steps
            .iter()
            .map(|p| p.1)
            .chain(s.evals.iter().map(|p| p.1)),
    );
    let lr = range(s.steps.iter().map(|p| p.2));
    let mut chart = ChartBuilder::on(&upper)
        .caption(
            format!("{title}: loss and learning rate"),
            ("sans-serif", 20),
        )
        .margin(10)
        .x_label_area_size(30)
        .y_label_area_size(60)
        .right_y_label_area_size(70)
        .build_cartesian_2d(x.clone(), loss)
        .map_err(e)?
        .set_secondary_coord(x.clone(), lr);
    chart
        .configure_mesh()
        .light_line_style(GRID)
        .y_desc("loss")
        .draw()
        .map_err(e)?;
    chart
        .configure_secondary_axes()
        .y_desc("learning rate")
        .y_label_formatter(&|v| format!("{v:.1e}"))
        .draw()
        .map_err(e)?;
    chart
        .draw_series(LineSeries::new(s.steps.iter().map(|p| (p.0, p.1)), TRAIN))
        .map_err(e)?
        .label("train loss")
        .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], TRAIN));
    if !s.evals.is_empty() {
        chart
            .draw_series(
                s.evals
                    .iter()
                    .map(|p| Circle::new((p.0, p.1), 4, EVAL.filled())),
            )
            .map_err(e)?
            .label("eval loss")
            .legend(|(x, y)| Circle::new((x + 10, y), 4, EVAL.filled()));
    }
    chart
        .draw_secondary_series(LineSeries::new(s.steps.iter().map(|p| (p.0, p.2)), LR))
        .map_err(e)?
        .label("learning rate (right)")
        .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], LR));
    if !s.skipped.is_empty() {
        let at: Vec<(u64, f64)> = s
            .skipped
            .iter()
            .filter_map(|&st| s.steps.iter().find(|p| p.0 == st).map(|p| (st, p.1)))
            .collect();
        chart
            .draw_series(
                at.into_iter()
                    .map(|p| Cross::new(p, 5, SKIP.stroke_width(2))),
            )
            .map_err(e)?
            .label("skipped (fp16 overflow)")
            .legend(|(x, y)| Cross::new((x + 10, y), 5, SKIP.stroke_width(2)));
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .position(SeriesLabelPosition::UpperRight)
        .draw()
        .map_err(e)?;
    // The same right-hand margin as above (the steps line up), with no labels in it.
    let mut acc = ChartBuilder::on(&lower)
        .margin(10)
        .x_label_area_size(35)
        .y_label_area_size(60)
        .right_y_label_area_size(70)
        .build_cartesian_2d(x.clone(), 0.0f64..1.0)
        .map_err(e)?
        .set_secondary_coord(x, 0.0f64..1.0);
    acc.configure_secondary_axes()
        .y_labels(0)
        .draw()
        .map_err(e)?;
    acc.configure_mesh()
        .light_line_style(GRID)
        .x_desc("optimizer step")
        .y_desc("eval accuracy")
        .draw()
        .map_err(e)?;
    if !s.evals.is_empty() {
        acc.draw_series(LineSeries::new(s.evals.iter().map(|p| (p.0, p.2)), EVAL))
            .map_err(e)?;
        acc.draw_series(
            s.evals
                .iter()
                .map(|p| Circle::new((p.0, p.2), 4, EVAL.filled())),
        )
        .map_err(e)?;
    }
    root.present().map_err(e)
}

fn throughput_chart<DB: DrawingBackend>(
    root: &DrawingArea<DB, Shift>,
    s: &RunSeries,
    title: &str,
) -> Result<(), String> {
    let e = |x: DrawingAreaErrorKind<DB::ErrorType>| x.to_string();
    root.fill(&WHITE).map_err(e)?;
    let y = range(s.steps.iter().map(|p| p.3).chain([0.0]));
    // MFU in percent on the right, from 0, where the run reported it.
    let mfu = range(s.mfu.iter().map(|p| 100.0 * p.1).chain([0.0]));
    let mut chart = ChartBuilder::on(root)
        .caption(format!("{title}: throughput"), ("sans-serif", 20))
        .margin(10)
        .x_label_area_size(35)
        .y_label_area_size(60)
        .right_y_label_area_size(if s.mfu.is_empty() { 0 } else { 70 })
        .build_cartesian_2d(steps_range(s), y)
        .map_err(e)?
        .set_secondary_coord(steps_range(s), mfu);
    chart
        .configure_mesh()
        .light_line_style(GRID)
        .x_desc("optimizer step")
        .y_desc("samples / s (since the start)")
        .draw()
        .map_err(e)?;
    chart
        .draw_series(LineSeries::new(s.steps.iter().map(|p| (p.0, p.3)), TRAIN))
        .map_err(e)?
        .label("samples / s")
        .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], TRAIN));
    if !s.mfu.is_empty() {
        chart
            .configure_secondary_axes()
            .y_desc("MFU, % (since the start)")
            .draw()
            .map_err(e)?;
        chart
            // Dashed: where every sample counts the same FLOPs (one padded length) it lies on
            // the samples/s line.
            .draw_secondary_series(DashedLineSeries::new(
                s.mfu.iter().map(|p| (p.0, 100.0 * p.1)),
                6,
                4,
                LR.stroke_width(2),
            ))
            .map_err(e)?
            .label("MFU (right)")
            .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], LR.stroke_width(2)));
        chart
            .configure_series_labels()
            .background_style(WHITE.mix(0.8))
            .border_style(BLACK)
            .position(SeriesLabelPosition::LowerRight)
            .draw()
            .map_err(e)?;
    }
    root.present().map_err(e)
}

/// One curve of [`curves_chart`].
pub struct Curve<'a> {
    /// Its legend.
    pub name: &'a str,
    /// (optimizer step, LR).
    pub points: &'a [(u64, f64)],
}

/// The axes of a [`curves_chart`].
pub struct Axes {
    /// The x axis' description.
    pub x: &'static str,
    /// The y axis' description.
    pub y: &'static str,
    /// Label the values as 1.0e-5 (LRs) rather than plainly (counts).
    pub scientific: bool,
}

/// The LR per optimizer step (`recipe explain --plot`).
pub const LR_AXES: Axes = Axes {
    x: "optimizer step",
    y: "learning rate",
    scientific: true,
};

/// The optimizer steps each side has taken after every micro-batch (`recipe steps --plot`).
pub const STEPS_AXES: Axes = Axes {
    x: "micro-batch",
    y: "optimizer steps taken",
    scientific: false,
};

/// Curves as SVG: epoch ends as vertical lines, the x values where the first two curves differ
/// marked on the first.
pub fn curves_chart(
    path: &Path,
    title: &str,
    axes: &Axes,
    curves: &[Curve<'_>],
    epoch_ends: &[u64],
    differ: &[u64],
) -> Result<(), PlotError> {
    font();
    atomic(path, |tmp| {
        let root = SVGBackend::new(tmp, SIZE).into_drawing_area();
        let e = |x: DrawingAreaErrorKind<std::io::Error>| x.to_string();
        root.fill(&WHITE).map_err(e)?;
        let last = curves
            .iter()
            .flat_map(|c| c.points.iter().map(|p| p.0))
            .max()
            .unwrap_or(1);
        let y = range(
            curves
                .iter()
                .flat_map(|c| c.points.iter().map(|p| p.1))
                .chain([0.0]),
        );
        let mut chart = ChartBuilder::on(&root)
            .caption(title, ("sans-serif", 20))
            .margin(10)
            .x_label_area_size(35)
            .y_label_area_size(80)
            .build_cartesian_2d(0..last + 1, y.clone())
            .map_err(e)?;
        let scientific = axes.scientific;
        chart
            .configure_mesh()
            .light_line_style(GRID)
            .x_desc(axes.x)
            .y_desc(axes.y)
            .y_label_formatter(&|v| {
                if scientific {
                    format!("{v:.1e}")
                } else {
                    format!("{v:.0}")
                }
            })
            .draw()
            .map_err(e)?;
        let colours = [TRAIN, EVAL, LR];
        for (i, c) in curves.iter().enumerate() {
            let colour = colours[i % colours.len()];
            chart
                .draw_series(LineSeries::new(
                    c.points.iter().copied(),
                    colour.stroke_width(2),
                ))
                .map_err(e)?
                .label(c.name)
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], colour));
        }
        if !epoch_ends.is_empty() {
            chart
                .draw_series(
                    epoch_ends.iter().map(|&st| {
                        PathElement::new(vec![(st, y.start), (st, y.end)], BLACK.mix(0.4))
                    }),
                )
                .map_err(e)?
                .label("epoch end")
                .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], BLACK.mix(0.4)));
        }
        if let (false, Some(first)) = (differ.is_empty(), curves.first()) {
            let at: Vec<(u64, f64)> = differ
                .iter()
                .filter_map(|&st| first.points.iter().find(|p| p.0 == st).copied())
                .collect();
            chart
                .draw_series(
                    at.into_iter()
                        .map(|p| Cross::new(p, 5, SKIP.stroke_width(2))),
                )
                .map_err(e)?
                .label("the curves differ")
                .legend(|(x, y)| Cross::new((x + 10, y), 5, SKIP.stroke_width(2)));
        }
        chart
            .configure_series_labels()
            .background_style(WHITE.mix(0.8))
            .border_style(BLACK)
            .draw()
            .map_err(e)?;
        root.present().map_err(e)
    })
}

/// A one-line picture of `values` (▁▂▃▄▅▆▇█), at most `width` characters (evenly sampled).
pub fn sparkline(values: &[f64], width: usize) -> String {
    const BARS: [char; 8] = ['▁', '▂', '▃', '▄', '▅', '▆', '▇', '█'];
    let finite: Vec<f64> = values.iter().copied().filter(|v| v.is_finite()).collect();
    if finite.is_empty() || width == 0 {
        return String::new();
    }
    let n = finite.len().min(width);
    let sampled: Vec<f64> = (0..n)
        .map(|i| finite[i * (finite.len() - 1) / (n - 1).max(1)])
        .collect();
    let (lo, hi) = sampled
        .iter()
        .fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), &v| {
            (a.min(v), b.max(v))
        });
    sampled
        .iter()
        .map(|&v| {
            let t = if hi > lo { (v - lo) / (hi - lo) } else { 0.5 };
            BARS[((t * 7.0).round() as usize).min(7)]
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn series() -> RunSeries {
        let text = (1..=40)
            .map(|s| {
                format!(
                    "{{\"step\":{s},\"epoch\":1,\"loss\":{},\"lr\":{},\"grad_norm\":1.0,\"samples_per_s\":{},\"skipped\":{}}}",
                    1.0 / s as f64,
                    1e-4 * (1.0 - s as f64 / 40.0),
                    10.0 + s as f64,
                    s == 3
                )
            })
            .chain([
                "{\"step\":20,\"eval\":{\"rows\":10,\"loss\":0.3,\"accuracy\":0.7,\"f1\":0.6}}".to_string(),
                "{\"step\":40,\"eval\":{\"rows\":10,\"loss\":0.2,\"accuracy\":0.9,\"f1\":0.8}}".to_string(),
                "{\"event\":\"end\"}".to_string(),
            ])
            .collect::<Vec<_>>()
            .join("\n");
        RunSeries::parse(&text)
    }

    #[test]
    fn parses_steps_evaluations_and_skips() {
        let s = series();
        assert_eq!(s.steps.len(), 40);
        assert_eq!(s.evals, vec![(20, 0.3, 0.7), (40, 0.2, 0.9)]);
        assert_eq!(s.skipped, vec![3]);
        // A resumed run repeats steps: the later records replace them.
        let again = RunSeries::parse("{\"step\":2,\"loss\":1,\"lr\":1}\n{\"step\":3,\"loss\":1,\"lr\":1}\n{\"step\":2,\"loss\":5,\"lr\":1}");
        assert_eq!(again.steps, vec![(2, 5.0, 1.0, 0.0)]);
        // A run started again from scratch appends: only the last run is drawn.
        let twice = RunSeries::parse("{\"event\":\"start\"}\n{\"step\":7,\"loss\":1,\"lr\":1}\n{\"event\":\"start\"}\n{\"step\":1,\"loss\":2,\"lr\":1}");
        assert_eq!(twice.steps, vec![(1, 2.0, 1.0, 0.0)]);
    }

    #[test]
    fn writes_svg_and_png_of_the_expected_size_and_series() {
        let dir = tempfile::tempdir().unwrap();
        let written = write_run_charts(dir.path(), &series(), "test").unwrap();
        assert_eq!(written.len(), 3);
        let svg = std::fs::read_to_string(dir.path().join("loss.svg")).unwrap();
        assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"));
        assert!(svg.contains(&format!("width=\"{}\" height=\"{}\"", SIZE.0, SIZE.1)));
        for label in [
            "train loss",
            "eval loss",
            "learning rate (right)",
            "skipped (fp16 overflow)",
        ] {
            assert!(svg.contains(label), "no legend `{label}`");
        }
        // Lines by colour (grid lines are grey): train loss and LR, each with its legend
        // sample; eval accuracy (below, no legend).
        let lines = |colour: &str| {
            svg.split("<polyline")
                .skip(1)
                .filter(|p| p.split("/>").next().is_some_and(|p| p.contains(colour)))
                .count()
        };
        assert_eq!(lines("#1F77B4"), 2, "train loss");
        assert_eq!(lines("#2CA02C"), 2, "learning rate");
        assert_eq!(lines("#FF7F0E"), 1, "eval accuracy");
        let png = std::fs::read(dir.path().join("loss.png")).unwrap();
        assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n");
        let be = |b: &[u8]| u32::from_be_bytes([b[0], b[1], b[2], b[3]]);
        assert_eq!((be(&png[16..20]), be(&png[20..24])), SIZE);
        let t = std::fs::read_to_string(dir.path().join("throughput.svg")).unwrap();
        assert_eq!(t.matches("stroke=\"#1F77B4\"").count(), 1);
        assert!(!t.contains("MFU"), "no MFU without one reported");
        // Nothing half-written is left behind.
        let names: Vec<String> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().to_string())
            .collect();
        assert!(names.iter().all(|n| !n.contains("partial")), "{names:?}");
    }

    /// A run that reported its MFU gets it on the throughput picture's right-hand axis.
    #[test]
    fn the_throughput_picture_shows_the_mfu_the_run_reported() {
        let text = (1..=10)
            .map(|s| {
                format!(
                    "{{\"step\":{s},\"loss\":1.0,\"lr\":1e-4,\"samples_per_s\":{},\"mfu\":{}}}",
                    100.0 + s as f64,
                    s as f64 / 40.0
                )
            })
            .collect::<Vec<_>>()
            .join("\n");
        let s = RunSeries::parse(&text);
        assert_eq!(s.mfu.len(), 10);
        assert_eq!(s.mfu[9], (10, 0.25));
        // A resumed run's repeated step replaces its MFU too.
        let again = RunSeries::parse(&format!(
            "{text}\n{{\"step\":10,\"loss\":1,\"lr\":1,\"samples_per_s\":50,\"mfu\":0.1}}"
        ));
        assert_eq!((again.mfu.len(), again.mfu[9]), (10, (10, 0.1)));
        let dir = tempfile::tempdir().unwrap();
        write_run_charts(dir.path(), &s, "test").unwrap();
        let t = std::fs::read_to_string(dir.path().join("throughput.svg")).unwrap();
        for label in ["samples / s", "MFU (right)", "MFU, % (since the start)"] {
            assert!(t.contains(label), "no `{label}`");
        }
        // Each line and its legend sample.
        assert_eq!(t.matches("stroke=\"#1F77B4\"").count(), 2, "samples/s");
        // The MFU's line dashed: a path a dash, and its legend sample.
        assert!(t.matches("stroke=\"#2CA02C\"").count() > 10, "MFU");
        // The right-hand axis is in percent: its labels reach the largest MFU, 25 %.
        assert!(t.lines().any(|l| l.trim() == "25.0"), "no 25 % label: {t}");
    }

    #[test]
    fn lr_chart_marks_epochs_and_disagreements() {
        let dir = tempfile::tempdir().unwrap();
        let hf: Vec<(u64, f64)> = (1..=10).map(|s| (s, s as f64 * 1e-5)).collect();
        let ds: Vec<(u64, f64)> = (1..=10).map(|s| (s, (s as f64 - 0.5) * 1e-5)).collect();
        let path = dir.path().join("lr.svg");
        curves_chart(
            &path,
            "lr",
            &LR_AXES,
            &[
                Curve {
                    name: "HF linear",
                    points: &hf,
                },
                Curve {
                    name: "DeepSpeed WarmupDecayLR",
                    points: &ds,
                },
            ],
            &[5, 10],
            &[3],
        )
        .unwrap();
        let svg = std::fs::read_to_string(&path).unwrap();
        for label in [
            "HF linear",
            "DeepSpeed WarmupDecayLR",
            "epoch end",
            "the curves differ",
        ] {
            assert!(svg.contains(label), "no legend `{label}`");
        }
    }

    #[test]
    fn sparklines() {
        assert_eq!(sparkline(&[3.0, 2.0, 1.0, 0.0], 10), "█▆▃▁");
        assert_eq!(sparkline(&[1.0; 100], 5).chars().count(), 5);
        assert_eq!(sparkline(&[], 5), "");
    }
}
