//! `recipe lsp` driven over stdio with real JSON-RPC framing, as an editor drives it:
//! initialize, didOpen of a recipe with errors → publishDiagnostics with the right ranges
//! (multi-byte characters on the line), hover, completion inside a block, a quick fix applied →
//! diagnostics cleared after didChange, formatting edits, definition, shutdown and exit 0.

use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{channel, Receiver};
use std::time::Duration;

use serde_json::{json, Value};

struct Client {
    child: Child,
    stdin: ChildStdin,
    messages: Receiver<Value>,
    next_id: i64,
    /// Notifications read while waiting for something else.
    backlog: Vec<Value>,
}

impl Client {
    fn start(args: &[&str]) -> Client {
        let mut child = Command::new(env!("CARGO_BIN_EXE_recipe"))
            .arg("lsp")
            .args(args)
            .env("RECIPE_SCAN_CACHE", "0")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("recipe lsp starts");
        let stdin = child.stdin.take().unwrap();
        let stdout = child.stdout.take().unwrap();
        let (tx, rx) = channel();
        std::thread::spawn(move || {
            let mut reader = BufReader::new(stdout);
            loop {
                let mut length = None;
                loop {
                    let mut line = String::new();
                    if reader.read_line(&mut line).unwrap_or(0) == 0 {
                        return;
                    }
                    let line = line.trim_end();
                    if line.is_empty() {
                        break;
                    }
                    if let Some(v) = line.strip_prefix("Content-Length: ") {
                        length = Some(v.parse::<usize>().expect("a length"));
                    }
                }
                let mut body = vec![0; length.expect("Content-Length header")];
                reader.read_exact(&mut body).unwrap();
                let value: Value = serde_json::from_slice(&body).expect("JSON body");
                if tx.send(value).is_err() {
                    return;
                }
            }
        });
        Client {
            child,
            stdin,
            messages: rx,
            next_id: 1,
            backlog: Vec::new(),
        }
    }

    fn send(&mut self, message: Value) {
        let body = serde_json::to_string(&message).unwrap();
        write!(self.stdin, "Content-Length: {}\r\n\r\n{body}", body.len()).unwrap();
        self.stdin.flush().unwrap();
    }

    fn notify(&mut self, method: &str, params: Value) {
        self.send(json!({"jsonrpc": "2.0", "method": method, "params": params}));
    }

    fn request(&mut self, method: &str, params: Value) -> Value {
        let id = self.next_id;
        self.next_id += 1;
        self.send(json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}));
        loop {
            let m = self.recv();
            if m.get("id") == Some(&json!(id)) && m.get("method").is_none() {
                assert!(m.get("error").is_none(), "{method} failed: {m}");
                return m["result"].clone();
            }
            self.backlog.push(m);
        }
    }

    fn recv(&mut self) -> Value {
        self.messages
            .recv_timeout(Duration::from_secs(30))
            .expect("the server answers within 30 s")
    }

    /// The next diagnostics published for `uri` (at `version`, when given).
    fn diagnostics(&mut self, uri: &str, version: Option<i64>) -> Vec<Value> {
        let wanted = |m: &Value| {
            m["method"] == "textDocument/publishDiagnostics"
                && m["params"]["uri"] == uri
                && version.is_none_or(|v| m["params"]["version"] == v)
        };
        if let Some(i) = self.backlog.iter().position(wanted) {
            let m = self.backlog.remove(i);
            return m["params"]["diagnostics"].as_array().unwrap().clone();
        }
        loop {
            let m = self.recv();
            if wanted(&m) {
                return m["params"]["diagnostics"].as_array().unwrap().clone();
            }
            self.backlog.push(m);
        }
    }
}

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn file_uri(path: &Path) -> String {
    // The test paths are plain (no characters that need escaping) except the space we test.
    format!("file://{}", path.display()).replace(' ', "%20")
}

fn pos(line: u64, character: u64) -> Value {
    json!({"line": line, "character": character})
}

/// Applies LSP text edits (given in UTF-16 positions) to `text`.
fn apply_edits(text: &str, edits: &[Value]) -> String {
    let offset = |p: &Value| -> usize {
        let line = p["line"].as_u64().unwrap() as usize;
        let col = p["character"].as_u64().unwrap() as usize;
        let start: usize = text.split_inclusive('\n').take(line).map(str::len).sum();
        let mut units = 0;
        for (i, c) in text[start..].char_indices() {
            if units >= col || c == '\n' {
                return start + i;
            }
            units += c.len_utf16();
        }
        text.len()
    };
    let mut sorted: Vec<&Value> = edits.iter().collect();
    sorted.sort_by_key(|e| std::cmp::Reverse(offset(&e["range"]["start"])));
    let mut out = text.to_string();
    for e in sorted {
        let (a, b) = (offset(&e["range"]["start"]), offset(&e["range"]["end"]));
        out.replace_range(a..b, e["newText"].as_str().unwrap());
    }
    out
}

fn initialize(client: &mut Client, encodings: &[&str]) -> Value {
    let result = client.request(
        "initialize",
        json!({
            "processId": null,
            "rootUri": null,
            "capabilities": {"general": {"positionEncodings": encodings}},
            "initializationOptions": {"debounceMs": 0},
        }),
    );
    client.notify("initialized", json!({}));
    result
}

fn shutdown(mut client: Client) {
    assert_eq!(client.request("shutdown", Value::Null), Value::Null);
    client.notify("exit", Value::Null);
    let status = client.child.wait().unwrap();
    assert_eq!(status.code(), Some(0), "exit code after shutdown + exit");
}

/// A recipe in a temporary directory with the shipped data beside it.
fn workspace(name: &str, text: &str) -> (tempdir::Dir, PathBuf) {
    let dir = tempdir::Dir::new(name);
    let path = dir.path().join("my recipe.rcp");
    std::fs::write(&path, text).unwrap();
    (dir, path)
}

mod tempdir {
    use std::path::{Path, PathBuf};

    pub struct Dir(PathBuf);

    impl Dir {
        pub fn new(name: &str) -> Dir {
            let p = std::env::temp_dir().join(format!("recipe-lsp-{name}-{}", std::process::id()));
            let _ = std::fs::remove_dir_all(&p);
            std::fs::create_dir_all(&p).unwrap();
            Dir(p)
        }

        pub fn path(&self) -> &Path {
            &self.0
        }
    }

    impl Drop for Dir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}

fn recipe_text(data: &Path) -> String {
    format!(
        "# ünïcödé 𝔼 comment\nrecipe \"lsp\"\nmodel bert {{ from = \"prajjwal1/bert-tiny\", task = classify(labels: [\"ham\", \"spam\"]) }}\ndata {{ train = \"{}\", text = \"text\", label = \"label\" }}\nbatch {{ micro = 16, global = 64, accumulate = 3 }}\noptimizer adamw {{ lr = 3e-5 }}\ntrain {{ output_dir = \"out/é𝔼\", epochs = 1, precisoin = fp16 }}\n",
        data.display()
    )
}

#[test]
fn an_editor_session_over_stdio() {
    let data = root().join("data/spamassassin/train.jsonl");
    let text = recipe_text(&data);
    let (_dir, path) = workspace("session", &text);
    let uri = file_uri(&path);
    let mut client = Client::start(&[]);
    let init = initialize(&mut client, &["utf-16"]);
    assert_eq!(init["capabilities"]["positionEncoding"], "utf-16");
    assert_eq!(init["capabilities"]["textDocumentSync"]["change"], 2);

    client.notify(
        "textDocument/didOpen",
        json!({"textDocument": {"uri": uri, "languageId": "recipe", "version": 1, "text": text}}),
    );
    let diags = client.diagnostics(&uri, Some(1));
    let codes: Vec<&str> = diags.iter().map(|d| d["code"].as_str().unwrap()).collect();
    // The schema error stops the rules, as in `recipe check`.
    assert_eq!(codes, ["R0011"], "{diags:#?}");
    let unknown = &diags[0];
    // UTF-16 columns: "é" is one unit, "𝔼" two (a surrogate pair), though 2 and 4 bytes.
    let line6 = text.lines().nth(6).unwrap();
    let before = &line6[..line6.find("precisoin").unwrap()];
    let col = before.encode_utf16().count() as u64;
    assert_eq!(
        col as usize,
        before.len() - 1 - 2,
        "the line has multi-byte characters"
    );
    assert_eq!(unknown["range"]["start"], pos(6, col));
    assert_eq!(unknown["range"]["end"], pos(6, col + 9));
    assert!(unknown["message"]
        .as_str()
        .unwrap()
        .contains("help: did you mean `precision`?"));

    // The quick fix, applied as an editor does, then sent back as an incremental change.
    let actions = client.request(
        "textDocument/codeAction",
        json!({
            "textDocument": {"uri": uri},
            "range": {"start": pos(6, col + 1), "end": pos(6, col + 1)},
            "context": {"diagnostics": [unknown]},
        }),
    );
    let action = &actions[0];
    assert_eq!(action["title"], "replace with `precision`");
    assert_eq!(action["kind"], "quickfix");
    let edits = action["edit"]["changes"][&uri].as_array().unwrap().clone();
    let fixed = apply_edits(&text, &edits);
    assert!(fixed.contains("precision = fp16"));
    client.notify(
        "textDocument/didChange",
        json!({
            "textDocument": {"uri": uri, "version": 2},
            "contentChanges": edits.iter().map(|e| json!({"range": e["range"], "text": e["newText"]})).collect::<Vec<_>>(),
        }),
    );
    // Now the rules run: the batch invariant (16 × 3 ≠ 64) is the one error.
    let diags = client.diagnostics(&uri, Some(2));
    let codes: Vec<&str> = diags.iter().map(|d| d["code"].as_str().unwrap()).collect();
    assert!(codes.contains(&"R0101"), "{diags:#?}");
    let batch = diags.iter().find(|d| d["code"] == "R0101").unwrap();
    let global = text.lines().nth(4).unwrap().find("64").unwrap() as u64;
    assert_eq!(batch["range"]["start"], pos(4, global), "the global value");
    assert!(batch["relatedInformation"].as_array().unwrap().len() >= 2);
    let actions = client.request(
        "textDocument/codeAction",
        json!({
            "textDocument": {"uri": uri},
            "range": batch["range"],
            "context": {"diagnostics": [batch]},
        }),
    );
    assert_eq!(actions[0]["title"], "write `accumulate = 4`");
    let edits = actions[0]["edit"]["changes"][&uri]
        .as_array()
        .unwrap()
        .clone();
    let fixed2 = apply_edits(&fixed, &edits);
    assert!(fixed2.contains("accumulate = 4 }"), "{fixed2}");
    client.notify(
        "textDocument/didChange",
        json!({
            "textDocument": {"uri": uri, "version": 3},
            "contentChanges": [{"text": fixed2}],
        }),
    );
    let diags = client.diagnostics(&uri, Some(3));
    assert!(
        diags.iter().all(|d| d["severity"] != 1),
        "no errors left: {diags:#?}"
    );

    // Hover on `micro`: the resolved value, its source, what it feeds, the step accounting.
    let hover = client.request(
        "textDocument/hover",
        json!({"textDocument": {"uri": uri}, "position": pos(4, 9)}),
    );
    let md = hover["contents"]["value"].as_str().unwrap();
    assert!(md.contains("**batch.micro** = `16`"), "{md}");
    assert!(md.contains("train_micro_batch_size_per_gpu"), "{md}");
    assert!(md.contains("per_device_train_batch_size"), "{md}");
    assert!(md.contains("optimizer steps per epoch"), "{md}");
    // Hover on the schedule-relevant lr: the LR summary.
    let hover = client.request(
        "textDocument/hover",
        json!({"textDocument": {"uri": uri}, "position": pos(5, 19)}),
    );
    let md = hover["contents"]["value"].as_str().unwrap();
    assert!(md.contains("**optimizer.lr** = `3e-5`"), "{md}");
    assert!(md.contains("LR over"), "{md}");

    // Hover on a block's label: the kind, its provenance and upstream names.
    let col = text.lines().nth(5).unwrap().find("adamw").unwrap() as u64 + 2;
    let hover = client.request(
        "textDocument/hover",
        json!({"textDocument": {"uri": uri}, "position": pos(5, col)}),
    );
    let md = hover["contents"]["value"].as_str().unwrap();
    assert!(md.starts_with("**optimizer.kind** = `adamw`"), "{md}");
    assert!(md.contains("DeepSpeed `optimizer.type`"), "{md}");

    // Completion inside `train { }`: its keys not yet written, with type and default.
    // (At the start of `precision`, after `epochs = 1, `.)
    let items = client.request(
        "textDocument/completion",
        json!({"textDocument": {"uri": uri}, "position": pos(6, col)}),
    );
    let items = items.as_array().unwrap();
    let labels: Vec<&str> = items.iter().map(|i| i["label"].as_str().unwrap()).collect();
    assert!(labels.contains(&"clip"), "{labels:?}");
    assert!(
        !labels.contains(&"epochs"),
        "written keys are not offered again"
    );
    let clip = items.iter().find(|i| i["label"] == "clip").unwrap();
    assert!(clip["detail"].as_str().unwrap().contains("default"));

    // Data columns read from the training file.
    let line3 = fixed2.lines().nth(3).unwrap();
    let col = (line3.find("text = \"").unwrap() + "text = \"".len()) as u64;
    let items = client.request(
        "textDocument/completion",
        json!({"textDocument": {"uri": uri}, "position": pos(3, col)}),
    );
    let labels: Vec<&str> = items
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["label"].as_str().unwrap())
        .collect();
    assert!(
        labels.contains(&"text") && labels.contains(&"label"),
        "{labels:?}"
    );

    // Go to definition on the data path.
    let col = (line3.find("train = \"").unwrap() + 10) as u64;
    let def = client.request(
        "textDocument/definition",
        json!({"textDocument": {"uri": uri}, "position": pos(3, col)}),
    );
    assert!(def["uri"]
        .as_str()
        .unwrap()
        .ends_with("data/spamassassin/train.jsonl"));

    // Formatting: the edits turn the text into `recipe fmt`'s.
    let edits = client.request(
        "textDocument/formatting",
        json!({"textDocument": {"uri": uri}, "options": {"tabSize": 2, "insertSpaces": true}}),
    );
    let formatted = apply_edits(&fixed2, edits.as_array().unwrap());
    assert_eq!(
        formatted,
        recipe::commands::format::format_source(&fixed2).unwrap()
    );

    // Symbols: one per block.
    let symbols = client.request(
        "textDocument/documentSymbol",
        json!({"textDocument": {"uri": uri}}),
    );
    let names: Vec<&str> = symbols
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        [
            "recipe \"lsp\"",
            "model bert",
            "data",
            "batch",
            "optimizer adamw",
            "train"
        ]
    );

    // Inlay hints: the derived and default values the recipe does not write.
    let hints = client.request(
        "textDocument/inlayHint",
        json!({"textDocument": {"uri": uri}, "range": {"start": pos(0, 0), "end": pos(20, 0)}}),
    );
    let labels: Vec<&str> = hints
        .as_array()
        .unwrap()
        .iter()
        .map(|h| h["label"].as_str().unwrap())
        .collect();
    assert!(
        labels.contains(&"cluster.world_size = 1 (derived)"),
        "{labels:?}"
    );
    assert!(labels.contains(&"steps.total = 74 (derived)"), "{labels:?}");
    assert!(
        labels
            .iter()
            .any(|l| l.starts_with("betas = ") && l.ends_with("(default)")),
        "{labels:?}"
    );

    shutdown(client);
}

#[test]
fn utf8_positions_when_the_client_offers_them() {
    let multi = "# é𝔼\nrecipe \"x\"\nbatch { c = \"𝔼\", mikro = 16 }\n";
    let (_dir, path) = workspace("utf8", multi);
    let uri = file_uri(&path);
    let mut client = Client::start(&[]);
    let init = initialize(&mut client, &["utf-8", "utf-16"]);
    assert_eq!(init["capabilities"]["positionEncoding"], "utf-8");
    // The error on a line with multi-byte characters before it: bytes count.
    client.notify(
        "textDocument/didOpen",
        json!({"textDocument": {"uri": uri, "languageId": "recipe", "version": 1, "text": multi}}),
    );
    let diags = client.diagnostics(&uri, Some(1));
    let mikro = diags
        .iter()
        .find(|d| d["message"].as_str().unwrap().contains("mikro"))
        .unwrap();
    let byte_col = "batch { c = \"𝔼\", ".len() as u64;
    assert_eq!(mikro["range"]["start"], pos(2, byte_col));
    shutdown(client);
}

#[test]
fn a_deepspeed_config_and_its_training_arguments() {
    // An explicit lr that differs from the TrainingArguments' learning_rate: HF's
    // trainer_config_finalize refuses the pair at launch (R1203-like mismatch).
    let dir = tempdir::Dir::new("pair");
    let ds = dir.path().join("ds_config.json");
    let args = dir.path().join("training_args.json");
    let ds_text = "{\n  \"train_micro_batch_size_per_gpu\": \"auto\",\n  \"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 0.001}},\n  \"zero_optimization\": {\"stage\": 2}\n}\n";
    let args_text =
        "{\"output_dir\": \"out\", \"learning_rate\": 5e-05, \"per_device_train_batch_size\": 8}\n";
    std::fs::write(&ds, ds_text).unwrap();
    std::fs::write(&args, args_text).unwrap();
    let (ds_uri, args_uri) = (file_uri(&ds), file_uri(&args));
    let mut client = Client::start(&[]);
    initialize(&mut client, &["utf-16"]);
    client.notify(
        "textDocument/didOpen",
        json!({"textDocument": {"uri": ds_uri, "languageId": "json", "version": 1, "text": ds_text}}),
    );
    let diags = client.diagnostics(&ds_uri, Some(1));
    let mismatch = diags
        .iter()
        .find(|d| d["message"].as_str().unwrap().contains("learning_rate"))
        .unwrap_or_else(|| panic!("{diags:#?}"));
    assert_eq!(mismatch["severity"], 1);
    let lr = ds_text.lines().nth(2).unwrap().find("0.001").unwrap() as u64;
    assert_eq!(mismatch["range"]["start"], pos(2, lr));
    let related = mismatch["relatedInformation"].as_array().unwrap();
    assert!(
        related.iter().any(|r| r["location"]["uri"] == args_uri),
        "{related:#?}"
    );

    // Opening the TrainingArguments and making them agree clears the config's error.
    client.notify(
        "textDocument/didOpen",
        json!({"textDocument": {"uri": args_uri, "languageId": "json", "version": 1, "text": args_text}}),
    );
    client.diagnostics(&args_uri, Some(1));
    let col = args_text.find("5e-05").unwrap() as u64;
    client.notify(
        "textDocument/didChange",
        json!({
            "textDocument": {"uri": args_uri, "version": 2},
            "contentChanges": [{"range": {"start": pos(0, col), "end": pos(0, col + 5)}, "text": "0.001"}],
        }),
    );
    let diags = client.diagnostics(&ds_uri, None);
    assert!(
        diags
            .iter()
            .all(|d| !d["message"].as_str().unwrap().contains("learning_rate")),
        "{diags:#?}"
    );
    shutdown(client);
}
