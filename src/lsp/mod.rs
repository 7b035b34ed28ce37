//! `recipe lsp`: the language server. It speaks the Language Server Protocol on stdio through
//! `lsp-server` + `lsp-types` (rust-analyzer's own pair: a synchronous message loop, no async
//! runtime to carry for a server whose every answer takes milliseconds).
//!
//! Everything it says comes from the compiler's own stages: diagnostics are `recipe check`'s
//! (the same [`crate::check::analyze`] on the editor's text), hovers and inlay hints read the
//! resolved recipe and `recipe explain`'s report, completion reads the schema, formatting is
//! `recipe fmt`, quick fixes are the diagnostics' own [`crate::diagnostics::Fix`]es. Nothing is
//! worked out twice. See docs/editors.md for the editor set-up.
//!
//! Diagnostics are published once the client has been quiet for the debounce interval (typing
//! produces a change per keystroke; checking each one would only be thrown away), and always
//! for the newest text: a change that arrives while older text is pending replaces it.

mod actions;
mod complete;
mod context;
mod diagnostics;
pub mod document;
mod hover;
mod locate;
mod outline;
mod pair;

use std::collections::{BTreeSet, HashMap};
use std::path::PathBuf;
use std::rc::Rc;
use std::time::Duration;

use crossbeam_channel::RecvTimeoutError;
use lsp_server::{Connection, ErrorCode, Message, Notification, Request, RequestId, Response};
use lsp_types::notification::{self as notif, Notification as _};
use lsp_types::request::{self as req, Request as _};
use lsp_types::{
    InitializeParams, PositionEncodingKind, PublishDiagnosticsParams, ServerCapabilities, Uri,
};
use serde_json::Value as Json;

use crate::check::Analysis;
use crate::resolve::Options;

pub use document::{Document, Encoding};

/// How the server is started.
#[derive(Debug, Clone)]
pub struct Config {
    /// Resolution options every document is checked with (`--gpus`, `--target`, `--set`); each
    /// document's own directory is added as the base for relative data and model paths.
    pub options: Options,
    /// How long the client must be quiet before diagnostics are published.
    pub debounce: Duration,
    /// Where the code documentation lives (`codeDescription` links): a URL the docs/ folder's
    /// files are found under, e.g. `https://…/docs`. None: no links (the hover on a
    /// diagnostic still shows its documentation, which the binary carries).
    pub docs_url: Option<String>,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            options: Options::default(),
            debounce: Duration::from_millis(150),
            docs_url: std::env::var("RECIPE_DOCS_URL").ok(),
        }
    }
}

type Error = Box<dyn std::error::Error + Send + Sync>;

/// Serves one client on stdin/stdout until it says `exit`.
pub fn run_stdio(config: Config) -> Result<(), Error> {
    let (connection, io) = Connection::stdio();
    serve(&connection, config)?;
    drop(connection);
    io.join()?;
    Ok(())
}

/// Serves one client on `connection`: the initialize handshake, then the message loop until
/// shutdown and exit.
pub fn serve(connection: &Connection, mut config: Config) -> Result<(), Error> {
    let (id, params) = connection.initialize_start()?;
    let params: InitializeParams = serde_json::from_value(params)?;
    let encoding = negotiate(&params);
    if let Some(init) = &params.initialization_options {
        if let Some(ms) = init.get("debounceMs").and_then(Json::as_u64) {
            config.debounce = Duration::from_millis(ms);
        }
        if let Some(url) = init.get("docsUrl").and_then(Json::as_str) {
            config.docs_url = Some(url.to_string());
        }
    }
    let result = serde_json::json!({
        "capabilities": capabilities(encoding),
        "serverInfo": { "name": "recipe", "version": env!("CARGO_PKG_VERSION") },
    });
    connection.initialize_finish(id, result)?;
    Server::new(config, encoding).run(connection)
}

/// UTF-8 when the client offers it (no conversion at all), else UTF-16, the protocol's default.
fn negotiate(params: &InitializeParams) -> Encoding {
    let offered = params
        .capabilities
        .general
        .as_ref()
        .and_then(|g| g.position_encodings.as_ref());
    match offered {
        Some(kinds) if kinds.contains(&PositionEncodingKind::UTF8) => Encoding::Utf8,
        _ => Encoding::Utf16,
    }
}

fn capabilities(encoding: Encoding) -> ServerCapabilities {
    use lsp_types::*;
    ServerCapabilities {
        position_encoding: Some(match encoding {
            Encoding::Utf8 => PositionEncodingKind::UTF8,
            Encoding::Utf16 => PositionEncodingKind::UTF16,
        }),
        text_document_sync: Some(TextDocumentSyncCapability::Options(
            TextDocumentSyncOptions {
                open_close: Some(true),
                change: Some(TextDocumentSyncKind::INCREMENTAL),
                save: Some(TextDocumentSyncSaveOptions::Supported(true)),
                ..Default::default()
            },
        )),
        hover_provider: Some(HoverProviderCapability::Simple(true)),
        completion_provider: Some(CompletionOptions {
            trigger_characters: Some(vec![
                " ".into(),
                "=".into(),
                "\"".into(),
                "{".into(),
                ".".into(),
            ]),
            ..Default::default()
        }),
        code_action_provider: Some(CodeActionProviderCapability::Options(CodeActionOptions {
            code_action_kinds: Some(vec![CodeActionKind::QUICKFIX]),
            ..Default::default()
        })),
        document_formatting_provider: Some(OneOf::Left(true)),
        document_symbol_provider: Some(OneOf::Left(true)),
        inlay_hint_provider: Some(OneOf::Left(true)),
        definition_provider: Some(OneOf::Left(true)),
        ..Default::default()
    }
}

/// What kind of file a document is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// A `.rcp` recipe.
    Recipe,
    /// A `ds_config*.json` or the `training_args.json` beside it (the pair linter).
    Pair,
    /// Anything else the client sends (the server answers nothing for it).
    Other,
}

/// An open document and its newest analysis.
struct Open {
    doc: Document,
    kind: Kind,
    /// The file's path, for a `file:` URI.
    path: Option<PathBuf>,
    /// The analysis of `doc`'s current version.
    analysis: Option<(i32, Rc<Analysis>)>,
    /// The newest analysis that resolved (kept while the text does not parse, for the targets'
    /// facts completion filters by).
    last_resolved: Option<Rc<Analysis>>,
}

/// The server's state between messages.
pub struct Server {
    config: Config,
    encoding: Encoding,
    docs: HashMap<Uri, Open>,
    /// Documents changed since their diagnostics were last published.
    dirty: BTreeSet<Uri>,
}

impl Server {
    /// A server with no open documents.
    pub fn new(config: Config, encoding: Encoding) -> Self {
        Server {
            config,
            encoding,
            docs: HashMap::new(),
            dirty: BTreeSet::new(),
        }
    }

    fn run(mut self, connection: &Connection) -> Result<(), Error> {
        loop {
            let message = if self.dirty.is_empty() {
                match connection.receiver.recv() {
                    Ok(m) => m,
                    Err(_) => return Ok(()),
                }
            } else {
                match connection.receiver.recv_timeout(self.config.debounce) {
                    Ok(m) => m,
                    Err(RecvTimeoutError::Timeout) => {
                        // A bug in a check must not take the editor's server down: the
                        // panic is reported on stderr (the client's log) and the loop goes on.
                        let published =
                            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                                self.publish_dirty()
                            }))
                            .unwrap_or_default();
                        for n in published {
                            connection.sender.send(Message::Notification(n))?;
                        }
                        continue;
                    }
                    Err(RecvTimeoutError::Disconnected) => return Ok(()),
                }
            };
            match message {
                Message::Request(request) => {
                    if connection.handle_shutdown(&request)? {
                        return Ok(());
                    }
                    let id = request.id.clone();
                    let response = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                        self.request(request)
                    }))
                    .unwrap_or_else(|_| {
                        Response::new_err(
                            id,
                            ErrorCode::InternalError as i32,
                            "internal error (see the server's log)".into(),
                        )
                    });
                    connection.sender.send(Message::Response(response))?;
                }
                Message::Notification(n) => {
                    if n.method == notif::Exit::METHOD {
                        return Ok(());
                    }
                    self.notification(n);
                }
                Message::Response(_) => {}
            }
        }
    }

    /// The server's copy of an open document's text.
    pub fn text(&self, uri: &Uri) -> Option<&str> {
        self.docs.get(uri).map(|o| o.doc.text())
    }

    /// Handles a notification from the client.
    pub fn notification(&mut self, n: Notification) {
        match n.method.as_str() {
            notif::DidOpenTextDocument::METHOD => {
                let Ok(p) =
                    serde_json::from_value::<lsp_types::DidOpenTextDocumentParams>(n.params)
                else {
                    return;
                };
                let item = p.text_document;
                let path = file_path(&item.uri);
                let kind = if item.language_id == "recipe"
                    || path
                        .as_ref()
                        .is_some_and(|p| p.extension().is_some_and(|e| e == "rcp"))
                {
                    Kind::Recipe
                } else if path
                    .as_ref()
                    .is_some_and(|p| pair::is_ds_config(p) || pair::is_training_args(p))
                {
                    Kind::Pair
                } else {
                    Kind::Other
                };
                self.dirty.insert(item.uri.clone());
                self.docs.insert(
                    item.uri,
                    Open {
                        doc: Document::new(item.text, item.version),
                        kind,
                        path,
                        analysis: None,
                        last_resolved: None,
                    },
                );
            }
            notif::DidChangeTextDocument::METHOD => {
                let Ok(p) =
                    serde_json::from_value::<lsp_types::DidChangeTextDocumentParams>(n.params)
                else {
                    return;
                };
                let uri = p.text_document.uri;
                if let Some(open) = self.docs.get_mut(&uri) {
                    for change in p.content_changes {
                        open.doc.apply(change, self.encoding);
                    }
                    open.doc.version = p.text_document.version;
                    self.dirty.insert(uri.clone());
                    if open.kind == Kind::Pair {
                        self.pair_changed(&uri);
                    }
                }
            }
            notif::DidCloseTextDocument::METHOD => {
                if let Ok(p) =
                    serde_json::from_value::<lsp_types::DidCloseTextDocumentParams>(n.params)
                {
                    self.docs.remove(&p.text_document.uri);
                    self.dirty.remove(&p.text_document.uri);
                }
            }
            notif::DidSaveTextDocument::METHOD => {
                // A data file may have changed too: check every recipe again.
                self.dirty.extend(self.docs.keys().cloned());
            }
            _ => {}
        }
    }

    /// The diagnostics of every changed document, as notifications (a closed document's list
    /// is not published again).
    // lsp_types::Uri holds a fluent_uri buffer clippy cannot see through; its Ord and Hash
    // read only the text, which never changes once parsed.
    #[allow(clippy::mutable_key_type)]
    pub fn publish_dirty(&mut self) -> Vec<Notification> {
        let dirty = std::mem::take(&mut self.dirty);
        let mut out = Vec::new();
        for uri in dirty {
            if !self.docs.contains_key(&uri) {
                continue;
            }
            let params = self.diagnostics(&uri);
            out.push(Notification::new(
                notif::PublishDiagnostics::METHOD.into(),
                params,
            ));
        }
        out
    }

    /// A pair file changed: the other open files of its directory are checked again too.
    fn pair_changed(&mut self, uri: &Uri) {
        let dir = self.docs[uri]
            .path
            .as_ref()
            .and_then(|p| p.parent().map(|d| d.to_path_buf()));
        let Some(dir) = dir else {
            return;
        };
        let same_dir: Vec<Uri> = self
            .docs
            .iter()
            .filter(|(_, o)| {
                o.kind == Kind::Pair && o.path.as_ref().and_then(|p| p.parent()) == Some(&dir)
            })
            .map(|(u, _)| u.clone())
            .collect();
        self.dirty.extend(same_dir);
    }

    /// The diagnostics of an open pair file.
    fn pair_diagnostics(&self, uri: &Uri) -> PublishDiagnosticsParams {
        let Some(open) = self.docs.get(uri) else {
            return PublishDiagnosticsParams::new(uri.clone(), Vec::new(), None);
        };
        let Some(path) = &open.path else {
            return PublishDiagnosticsParams::new(uri.clone(), Vec::new(), Some(open.doc.version));
        };
        let text_of = |p: &std::path::Path| {
            self.docs
                .values()
                .find(|o| o.path.as_deref() == Some(p))
                .map(|o| o.doc.text().to_string())
        };
        let read = |p: &std::path::Path| text_of(p).or_else(|| std::fs::read_to_string(p).ok());
        let is_open = |p: &std::path::Path| text_of(p).is_some();
        let list = pair::diagnostics(path, &read, &is_open, &self.config.options, self.encoding);
        PublishDiagnosticsParams::new(uri.clone(), list, Some(open.doc.version))
    }

    /// The current diagnostics of one open document.
    pub fn diagnostics(&mut self, uri: &Uri) -> PublishDiagnosticsParams {
        if self.docs.get(uri).is_some_and(|o| o.kind == Kind::Pair) {
            return self.pair_diagnostics(uri);
        }
        let encoding = self.encoding;
        let docs_url = self.config.docs_url.clone();
        let Some((open, analysis)) = self.analysis(uri) else {
            return PublishDiagnosticsParams::new(uri.clone(), Vec::new(), None);
        };
        let list = analysis
            .checked
            .diagnostics
            .iter()
            .map(|d| diagnostics::to_lsp(d, &open.doc, uri, encoding, docs_url.as_deref()))
            .collect();
        PublishDiagnosticsParams::new(uri.clone(), list, Some(open.doc.version))
    }

    /// The analysis of a recipe's current text (computed once per version).
    fn analysis(&mut self, uri: &Uri) -> Option<(&Open, Rc<Analysis>)> {
        let options = &self.config.options;
        let open = self.docs.get_mut(uri)?;
        if open.kind != Kind::Recipe {
            return None;
        }
        let current = open
            .analysis
            .as_ref()
            .filter(|(v, _)| *v == open.doc.version)
            .map(|(_, a)| a.clone());
        let analysis = match current {
            Some(a) => a,
            None => {
                let mut options = options.clone();
                options.base_dir = open
                    .path
                    .as_ref()
                    .and_then(|p| p.parent())
                    .map(|p| p.to_path_buf());
                let a = Rc::new(crate::check::analyze(open.doc.text(), &options));
                if a.resolved.is_some() {
                    open.last_resolved = Some(a.clone());
                }
                open.analysis = Some((open.doc.version, a.clone()));
                a
            }
        };
        Some((&*open, analysis))
    }

    /// Answers a request.
    pub fn request(&mut self, request: Request) -> Response {
        let id = request.id.clone();
        match self.answer(request) {
            Ok(value) => Response::new_ok(id, value),
            Err((code, message)) => Response::new_err(id, code as i32, message),
        }
    }

    fn answer(&mut self, request: Request) -> Result<Json, (ErrorCode, String)> {
        fn params<P: serde::de::DeserializeOwned>(r: Request) -> Result<P, (ErrorCode, String)> {
            serde_json::from_value(r.params).map_err(|e| (ErrorCode::InvalidParams, e.to_string()))
        }
        fn json(v: impl serde::Serialize) -> Result<Json, (ErrorCode, String)> {
            serde_json::to_value(v).map_err(|e| (ErrorCode::InternalError, e.to_string()))
        }
        let enc = self.encoding;
        match request.method.as_str() {
            req::HoverRequest::METHOD => {
                let p: lsp_types::HoverParams = params(request)?;
                let pos = p.text_document_position_params;
                let uri = pos.text_document.uri;
                let Some((open, analysis)) = self.analysis(&uri) else {
                    return Ok(Json::Null);
                };
                let offset = open.doc.offset(pos.position, enc);
                json(hover::hover(open, &analysis, offset, enc))
            }
            req::Completion::METHOD => {
                let p: lsp_types::CompletionParams = params(request)?;
                let pos = p.text_document_position;
                let uri = pos.text_document.uri;
                let Some((open, analysis)) = self.analysis(&uri) else {
                    return Ok(Json::Null);
                };
                let offset = open.doc.offset(pos.position, enc);
                let resolved = open.last_resolved.clone();
                let items = complete::complete(open, &analysis, resolved.as_deref(), offset, enc);
                json(lsp_types::CompletionResponse::Array(items))
            }
            req::CodeActionRequest::METHOD => {
                let p: lsp_types::CodeActionParams = params(request)?;
                let uri = p.text_document.uri.clone();
                let Some((open, analysis)) = self.analysis(&uri) else {
                    return Ok(Json::Null);
                };
                json(actions::code_actions(open, &analysis, &uri, &p, enc))
            }
            req::Formatting::METHOD => {
                let p: lsp_types::DocumentFormattingParams = params(request)?;
                let uri = p.text_document.uri;
                match self.docs.get(&uri).filter(|o| o.kind == Kind::Recipe) {
                    Some(open) => json(outline::format(&open.doc, enc)),
                    None => Ok(Json::Null),
                }
            }
            req::DocumentSymbolRequest::METHOD => {
                let p: lsp_types::DocumentSymbolParams = params(request)?;
                let Some((open, analysis)) = self.analysis(&p.text_document.uri) else {
                    return Ok(Json::Null);
                };
                json(outline::symbols(&open.doc, &analysis, enc))
            }
            req::InlayHintRequest::METHOD => {
                let p: lsp_types::InlayHintParams = params(request)?;
                let Some((open, analysis)) = self.analysis(&p.text_document.uri) else {
                    return Ok(Json::Null);
                };
                let range = open.doc.span(p.range, enc);
                json(outline::inlay_hints(&open.doc, &analysis, range, enc))
            }
            req::GotoDefinition::METHOD => {
                let p: lsp_types::GotoDefinitionParams = params(request)?;
                let pos = p.text_document_position_params;
                let Some((open, analysis)) = self.analysis(&pos.text_document.uri) else {
                    return Ok(Json::Null);
                };
                let offset = open.doc.offset(pos.position, enc);
                json(outline::definition(open, &analysis, offset))
            }
            _ => Err((
                ErrorCode::MethodNotFound,
                format!("unsupported request {}", request.method),
            )),
        }
    }
}

/// The local path of a `file:` URI (percent-decoded).
fn file_path(uri: &Uri) -> Option<PathBuf> {
    let s = uri.as_str().strip_prefix("file://")?;
    // `file:///path` (empty authority) or `file://localhost/path`.
    let path = s.strip_prefix("localhost").unwrap_or(s);
    let decoded = percent_encoding::percent_decode_str(path)
        .decode_utf8()
        .ok()?;
    Some(PathBuf::from(decoded.as_ref()))
}

/// The `file:` URI of a local path.
fn file_uri(path: &std::path::Path) -> Option<Uri> {
    use percent_encoding::{utf8_percent_encode, AsciiSet, CONTROLS};
    // RFC 3986 path characters stay; everything else is escaped.
    const PATH: &AsciiSet = &CONTROLS
        .add(b' ')
        .add(b'"')
        .add(b'#')
        .add(b'%')
        .add(b'<')
        .add(b'>')
        .add(b'?')
        .add(b'[')
        .add(b'\\')
        .add(b']')
        .add(b'^')
        .add(b'`')
        .add(b'{')
        .add(b'|')
        .add(b'}');
    let absolute = std::path::absolute(path).ok()?;
    let text = absolute.to_str()?;
    format!("file://{}", utf8_percent_encode(text, PATH))
        .parse()
        .ok()
}

/// A request id for tests and benchmarks that drive a [`Server`] directly.
pub fn request(id: i32, method: &str, params: impl serde::Serialize) -> Request {
    Request::new(RequestId::from(id), method.into(), params)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn file_uris_round_trip_with_escapes() {
        let p = std::path::Path::new("/tmp/my recipes/ünï#1.rcp");
        let uri = file_uri(p).unwrap();
        assert_eq!(
            uri.as_str(),
            "file:///tmp/my%20recipes/%C3%BCn%C3%AF%231.rcp"
        );
        assert_eq!(file_path(&uri).unwrap(), p);
    }
}
