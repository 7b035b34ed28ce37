//! Random edit sequences sent to the language server as incremental changes (UTF-16 ranges,
//! insertions and deletions anywhere, multi-byte characters and line breaks included): the
//! server never panics, its copy of the text never falls behind the editor's, and the
//! diagnostics it publishes for the final text are `recipe check`'s, range for range.

use lsp_server::Notification;
use lsp_types::{PublishDiagnosticsParams, Uri};
use proptest::prelude::*;
use recipe::lsp::{Config, Encoding, Server};
use serde_json::json;

const START: &str = include_str!("../recipes/cls.rcp");

/// Pieces an editor inserts: recipe syntax, broken syntax, multi-byte text, line breaks.
const PIECES: &[&str] = &[
    "a",
    "=",
    " ",
    "\n",
    "{",
    "}",
    "(",
    ")",
    "\"",
    "#",
    ",",
    "é",
    "𝔼",
    "\r\n",
    "micro = 8",
    "batch { global = 48 }",
    "zero 3",
    "lr = ",
    "precision = bf16",
    "optimizer sgd { momentum = 0.9 }",
    "x.y = 1",
    "6%",
    "3e-5",
];

/// The UTF-16 position of a char boundary `offset` in `text` (an independent conversion).
fn position(text: &str, offset: usize) -> (u32, u32) {
    let before = &text[..offset];
    let line = before.matches('\n').count() as u32;
    let start = before.rfind('\n').map_or(0, |i| i + 1);
    (line, before[start..].encode_utf16().count() as u32)
}

fn boundary(text: &str, at: usize) -> usize {
    let mut at = at.min(text.len());
    while !text.is_char_boundary(at) {
        at -= 1;
    }
    at
}

fn uri() -> Uri {
    "file:///nonexistent/dir/edited.rcp".parse().unwrap()
}

fn notify(server: &mut Server, method: &str, params: serde_json::Value) {
    server.notification(Notification::new(method.into(), params));
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn the_server_follows_every_edit(
        edits in prop::collection::vec((0usize..4000, 0usize..40, prop::option::of(0usize..PIECES.len())), 1..40)
    ) {
        let mut server = Server::new(Config::default(), Encoding::Utf16);
        let uri = uri();
        notify(&mut server, "textDocument/didOpen", json!({"textDocument": {
            "uri": uri, "languageId": "recipe", "version": 0, "text": START}}));
        let mut text = START.to_string();
        for (version, (at, len, piece)) in edits.into_iter().enumerate() {
            let a = boundary(&text, at);
            let b = boundary(&text, a + len);
            // A \r\n is never split (an editor's positions never fall between the two).
            let a = if a > 0 && text[..a].ends_with('\r') && text[a..].starts_with('\n') { a - 1 } else { a };
            let b = if b > 0 && text[..b].ends_with('\r') && text[b..].starts_with('\n') { b + 1 } else { b };
            let insert = piece.map_or("", |i| PIECES[i]);
            let (sl, sc) = position(&text, a);
            let (el, ec) = position(&text, b);
            text.replace_range(a..b, insert);
            notify(&mut server, "textDocument/didChange", json!({
                "textDocument": {"uri": uri, "version": version + 1},
                "contentChanges": [{"range": {"start": {"line": sl, "character": sc}, "end": {"line": el, "character": ec}}, "text": insert}],
            }));
            prop_assert_eq!(server.text(&uri), Some(text.as_str()));
        }
        let published = server.publish_dirty();
        prop_assert_eq!(published.len(), 1);
        let params: PublishDiagnosticsParams = serde_json::from_value(published[0].params.clone()).unwrap();
        // `recipe check` on the final text, from the same directory.
        let options = recipe::resolve::Options {
            base_dir: Some("/nonexistent/dir".into()),
            ..Default::default()
        };
        let checked = recipe::check::check_source_with(&text, &options);
        prop_assert_eq!(params.diagnostics.len(), checked.diagnostics.len());
        let doc = recipe::lsp::Document::new(text.clone(), 0);
        for (got, want) in params.diagnostics.iter().zip(&checked.diagnostics) {
            prop_assert_eq!(got.code.clone(), Some(lsp_types::NumberOrString::String(want.code.into())));
            prop_assert_eq!(got.range, doc.range(want.primary.span, Encoding::Utf16));
            prop_assert!(got.message.starts_with(&want.message));
        }
    }
}
