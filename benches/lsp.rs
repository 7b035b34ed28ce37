//! The language server's latency: `cargo bench --bench lsp`.
//!
//! Diagnostics for `recipes/cls.rcp` after one keystroke, in process, the way the server
//! handles it: the incremental change applied, the recipe checked (its data files' scans
//! remembered from the first check), the diagnostics converted to the protocol's form. Next to
//! it, in the same run, the peer: `recipe check`'s own in-process check of the same text
//! (`check_source_with` with the recipe's directory). Prints figures and ratios (against the
//! issue's 10 ms budget and against the peer); asserts no timings.

use std::hint::black_box;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use lsp_server::Notification;
use recipe::lsp::{Config, Encoding, Server};
use serde_json::json;

const BUDGET_MS: f64 = 10.0;

fn main() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let path = root.join("recipes/cls.rcp");
    let text = std::fs::read_to_string(&path).expect("read recipes/cls.rcp");
    let uri: lsp_types::Uri = format!("file://{}", path.display())
        .parse()
        .expect("a file URI");
    let mut server = Server::new(
        Config {
            debounce: Duration::ZERO,
            ..Config::default()
        },
        Encoding::Utf16,
    );
    server.notification(Notification::new(
        "textDocument/didOpen".into(),
        json!({"textDocument": {"uri": uri, "languageId": "recipe", "version": 0, "text": text}}),
    ));
    // The first check reads the data files (4,708 + 1,177 rows); later ones remember them.
    let first = Instant::now();
    let published = server.publish_dirty();
    let first = first.elapsed();
    let count = published[0].params["diagnostics"]
        .as_array()
        .map_or(0, Vec::len);

    // One keystroke: type a space at the end of the `micro` line, or take it away again.
    let line = text
        .lines()
        .position(|l| l.contains("micro"))
        .expect("cls.rcp sets micro") as u32;
    let end = text
        .lines()
        .nth(line as usize)
        .unwrap()
        .encode_utf16()
        .count() as u32;
    let mut version = 0;
    let mut keystroke = |server: &mut Server| {
        version += 1;
        let (range, new) = if version % 2 == 1 {
            ((end, end), " ")
        } else {
            ((end, end + 1), "")
        };
        server.notification(Notification::new(
            "textDocument/didChange".into(),
            json!({
                "textDocument": {"uri": uri, "version": version},
                "contentChanges": [{"range": {
                    "start": {"line": line, "character": range.0},
                    "end": {"line": line, "character": range.1}}, "text": new}],
            }),
        ));
        black_box(server.publish_dirty());
    };
    let options = recipe::resolve::Options {
        base_dir: Some(root.join("recipes")),
        ..Default::default()
    };
    // Interleaved rounds: a keystroke, then the peer, so both see the same machine state.
    let (mut lsp, mut peer) = (Vec::new(), Vec::new());
    for round in 0..2_200 {
        let t = Instant::now();
        keystroke(&mut server);
        let a = t.elapsed();
        let t = Instant::now();
        black_box(recipe::check::check_source_with(black_box(&text), &options));
        let b = t.elapsed();
        if round >= 200 {
            lsp.push(a);
            peer.push(b);
        }
    }
    lsp.sort();
    peer.sort();
    let pct = |v: &[Duration], p: usize| v[(v.len() - 1) * p / 100].as_secs_f64() * 1e3;
    println!("recipe lsp bench (figures, not assertions)");
    println!(
        "first check of recipes/cls.rcp (reads its data files): {:.2} ms, {count} diagnostics",
        first.as_secs_f64() * 1e3
    );
    println!(
        "one keystroke → diagnostics, {} rounds: median {:.3} ms, p90 {:.3} ms, p99 {:.3} ms",
        lsp.len(),
        pct(&lsp, 50),
        pct(&lsp, 90),
        pct(&lsp, 99)
    );
    println!(
        "peer: recipe check's in-process check of the same text: median {:.3} ms, p99 {:.3} ms",
        pct(&peer, 50),
        pct(&peer, 99)
    );
    println!(
        "ratios: keystroke p99 / {BUDGET_MS} ms budget = {:.3}; keystroke median / peer median = {:.2}",
        pct(&lsp, 99) / BUDGET_MS,
        pct(&lsp, 50) / pct(&peer, 50)
    );
}
