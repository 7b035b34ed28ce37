#!/usr/bin/env python3
"""Throws mutated inputs at the `recipe` binary and keeps the ones it mishandles.

Not part of CI (its inputs are random); run it after a change to the checker, the emitters, the
language server or the runtime's loaders. A finding is a crash (a panic, an abort, a signal), an
exit code outside 0/1/2, no answer within the time limit, a language server that dies or answers
with an error, or `fmt` that is not idempotent or changes what `check` reports. Each finding's
input is written to OUT/<mode>-<n>/ with what happened.

    scripts/fuzz.py [--mode recipes|pairs|lsp|fmt|data|all] [--seconds 120] [--seed N] [--out DIR]

Modes (seeds from the repository):
  recipes  recipes/*.rcp and tests/diagnostics/*.rcp, mutated (tokens, numbers at extremes,
           lines shuffled), through check, explain, build and steps;
  pairs    tests/pairs/*/ds_config.json (+ training_args.json) through check, import, explain;
  lsp      one `recipe lsp` session: each mutated text sent as a change, then hover, completion,
           definition, code actions, formatting, symbols and inlay hints at random places;
  fmt      fmt twice (the same text) and check before and after (the same codes);
  data     `recipe run --stop-after 2` of the tiny BERT (runtime/tests/fixtures) with broken data
           rows, config values and batch sizes.
Found this way (2026-12-07): R0201's timeline walking every micro-batch (a recipe of 10^10
samples aborted), explain's LR table of every step, and a config asking for 372 GB aborting
`recipe run`.
"""
import argparse
import json
import os
import queue
import random
import re
import shutil
import subprocess
import sys
import threading
import time

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
BIN = os.environ.get("RECIPE_BIN", os.path.join(ROOT, "target/release/recipe"))
TOKENS = ['{', '}', '=', ',', '(', ')', '[', ']', '"', '0', '-1', '1e309', '99999999999999999999',
          '0.0', '-0', 'nan', 'inf', 'true', 'false', 'null', 'cpu', 'nvme', 'bf16', 'fp16', 'zero',
          '3', '\n', '#', '//', 'micro', 'accumulate', 'global', 'lr', 'warmup', 'epochs',
          'max_steps', 'optimizer', 'schedule', '\u00e9', '\t', '\\', '1e-400', 'offload', 'gpus',
          'nodes', '4294967296', '18446744073709551616', '0x10', '1_000', '.5', '5.', '-', '+']
NUMBERS = ['0', '-1', '1e309', '99999999999999999999', '3', '1e-400', '65536', '0.0',
           '1000000005', '10000000000000']
JSON_VALUES = NUMBERS + ['"auto"', 'null', 'true', '[]', '{}', '"x"', '-9223372036854775809']
BAD_ROWS = ['{', '{"text": 1, "label": 0}', '{"text": "a"}', '{"label": 1}',
            '{"text": "x", "label": 7}', '{"text": "x", "label": -1}', '{"text": "x", "label": "eggs"}',
            '{"text": "", "label": 0}', '[]', 'null', '{"text": "\\ud800", "label": 0}',
            '{"text": "' + 'a ' * 5000 + '", "label": 1}', '\x00\x01', '{"text": "x", "label": 1.5}',
            '{"text": "x", "label": 0, "text": "y"}', '   ', '\ufeff{"text": "x", "label": 0}']


def mutate_recipe(s):
    for _ in range(random.randint(1, 4)):
        s = s or "x"
        k, i = random.random(), random.randrange(len(s))
        j = min(len(s), i + random.randint(0, 20))
        if k < 0.25:
            s = s[:i] + s[j:]
        elif k < 0.5:
            s = s[:i] + random.choice(TOKENS) + s[i:]
        elif k < 0.65:
            s = s[:i] + s[i:j] + s[i:j] + s[j:]
        elif k < 0.85:
            nums = list(re.finditer(r'\d+(\.\d+)?(e-?\d+)?', s))
            if nums:
                m = random.choice(nums)
                s = s[:m.start()] + random.choice(NUMBERS) + s[m.end():]
        else:
            lines = s.split('\n')
            random.shuffle(lines)
            s = '\n'.join(lines)
    return s


def mutate_json(s):
    for _ in range(random.randint(1, 3)):
        values = list(re.finditer(r'(?<=: )(-?\d+(\.\d+)?(e-?\d+)?|"[^"]*"|true|false|null)', s))
        i = random.randrange(len(s) + 1)
        if random.random() < 0.6 and values:
            m = random.choice(values)
            s = s[:m.start()] + random.choice(JSON_VALUES) + s[m.end():]
        elif random.random() < 0.5:
            s = s[:i] + random.choice('{},":[]\\\n') + s[i:]
        else:
            s = s[:i] + s[i + random.randint(0, 10):]
    return s


class Findings:
    def __init__(self, out):
        self.out, self.n = out, 0

    def add(self, mode, what, files):
        self.n += 1
        d = os.path.join(self.out, f"{mode}-{self.n}")
        os.makedirs(d, exist_ok=True)
        for name, text in files.items():
            with open(os.path.join(d, name), "w") as f:
                f.write(text)
        with open(os.path.join(d, "what.txt"), "w") as f:
            f.write(what)
        print(f"finding {d}: {what.splitlines()[0] if what else ''}", flush=True)


def run(args, cwd, timeout=30):
    try:
        r = subprocess.run([BIN] + args, capture_output=True, timeout=timeout, cwd=cwd)
    except subprocess.TimeoutExpired:
        return None, f"no answer in {timeout} s: recipe {' '.join(args)}"
    bad = r.returncode not in (0, 1, 2) or b"panicked" in r.stderr
    what = f"exit {r.returncode}: recipe {' '.join(args)}\n" + r.stderr.decode(errors="replace")[-2000:]
    return r, (what if bad else None)


def recipe_seeds():
    paths = [os.path.join(ROOT, "recipes", f) for f in sorted(os.listdir(os.path.join(ROOT, "recipes")))
             if f.endswith(".rcp")]
    diag = os.path.join(ROOT, "tests/diagnostics")
    paths += [os.path.join(diag, f) for f in sorted(os.listdir(diag)) if f.endswith(".rcp")]
    return [open(p).read() for p in paths]


def mode_recipes(tmp, findings, deadline):
    seeds, n = recipe_seeds(), 0
    path = os.path.join(tmp, "t.rcp")
    while time.time() < deadline:
        text, n = mutate_recipe(random.choice(seeds)), n + 1
        open(path, "w").write(text)
        for args in (["check", path], ["explain", path], ["build", path, "-o", os.path.join(tmp, "o")],
                     ["steps", path]):
            _, what = run(args, os.path.join(ROOT, "recipes"))
            if what:
                findings.add("recipes", what, {"t.rcp": text})
    return n


def mode_pairs(tmp, findings, deadline):
    base = os.path.join(ROOT, "tests/pairs")
    dirs = [os.path.join(base, d) for d in sorted(os.listdir(base))
            if os.path.exists(os.path.join(base, d, "ds_config.json"))]
    n = 0
    while time.time() < deadline:
        d, n = random.choice(dirs), n + 1
        files = {"ds_config.json": mutate_json(open(os.path.join(d, "ds_config.json")).read())}
        ta = os.path.join(d, "training_args.json")
        if os.path.exists(ta):
            text = open(ta).read()
            files["training_args.json"] = mutate_json(text) if random.random() < 0.5 else text
        for name, text in files.items():
            open(os.path.join(tmp, name), "w").write(text)
        extra = ["--args", os.path.join(tmp, "training_args.json")] if len(files) > 1 else []
        ds = os.path.join(tmp, "ds_config.json")
        for args in (["check", ds] + extra, ["import", ds] + extra, ["explain", ds] + extra):
            _, what = run(args, ROOT)
            if what:
                findings.add("pairs", what, files)
    return n


def mode_fmt(tmp, findings, deadline):
    seeds, n = recipe_seeds(), 0
    path = os.path.join(tmp, "t.rcp")

    def codes(text):
        open(path, "w").write(text)
        r, _ = run(["check", "--format", "json", path], tmp)
        return sorted(json.loads(x)["code"] for x in r.stdout.decode().splitlines() if x.startswith("{"))

    while time.time() < deadline:
        text, n = mutate_recipe(random.choice(seeds)), n + 1
        open(path, "w").write(text)
        r, what = run(["fmt", path], tmp)
        if what:
            findings.add("fmt", what, {"t.rcp": text})
            continue
        if r is None or r.returncode != 0:
            continue
        once = open(path).read()
        run(["fmt", path], tmp)
        if open(path).read() != once:
            findings.add("fmt", "fmt is not idempotent", {"t.rcp": text, "once.rcp": once})
        elif codes(text) != codes(once):
            findings.add("fmt", "fmt changed what check reports", {"t.rcp": text, "once.rcp": once})
    return n


def mode_lsp(tmp, findings, deadline):
    seeds = recipe_seeds()
    err_path = os.path.join(tmp, "lsp.err")
    p = subprocess.Popen([BIN, "lsp"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         stderr=open(err_path, "w"), cwd=os.path.join(ROOT, "recipes"),
                         env=dict(os.environ, RECIPE_SCAN_CACHE="0"))
    inbox = queue.Queue()

    def reader():
        while True:
            length = None
            while True:
                line = p.stdout.readline()
                if not line:
                    inbox.put(None)
                    return
                if not line.strip():
                    break
                if line.startswith(b"Content-Length:"):
                    length = int(line.split(b":")[1])
            inbox.put(json.loads(p.stdout.read(length)))

    threading.Thread(target=reader, daemon=True).start()
    ids = iter(range(1, 1 << 62))

    def send(message):
        body = json.dumps(message).encode()
        p.stdin.write(b"Content-Length: %d\r\n\r\n" % len(body) + body)
        p.stdin.flush()

    def request(method, params, timeout=20):
        i = next(ids)
        send({"jsonrpc": "2.0", "id": i, "method": method, "params": params})
        end = time.time() + timeout
        while time.time() < end:
            try:
                m = inbox.get(timeout=max(0.01, end - time.time()))
            except queue.Empty:
                break
            if m is None:
                return {"error": "the server exited"}
            if m.get("id") == i:
                return m
        return {"error": f"no answer in {timeout} s"}

    def notify(method, params):
        send({"jsonrpc": "2.0", "method": method, "params": params})

    request("initialize", {"processId": None, "rootUri": None, "capabilities": {}})
    notify("initialized", {})
    uri = "file://" + os.path.join(ROOT, "recipes", "fuzz.rcp")
    text, version, n = seeds[0], 1, 0
    notify("textDocument/didOpen", {"textDocument": {"uri": uri, "languageId": "recipe",
                                                     "version": version, "text": text}})
    while time.time() < deadline:
        text = mutate_recipe(random.choice(seeds) if random.random() < 0.5 else text)
        version, n = version + 1, n + 1
        notify("textDocument/didChange", {"textDocument": {"uri": uri, "version": version},
                                          "contentChanges": [{"text": text}]})
        for _ in range(3):
            pos = {"line": random.randrange(text.count("\n") + 3), "character": random.randrange(80)}
            doc = {"uri": uri}
            start = {"line": 0, "character": 0}
            method, params = random.choice([
                ("hover", {"textDocument": doc, "position": pos}),
                ("completion", {"textDocument": doc, "position": pos}),
                ("definition", {"textDocument": doc, "position": pos}),
                ("codeAction", {"textDocument": doc, "range": {"start": start, "end": pos},
                                "context": {"diagnostics": []}}),
                ("formatting", {"textDocument": doc, "options": {"tabSize": 2, "insertSpaces": True}}),
                ("documentSymbol", {"textDocument": doc}),
                ("inlayHint", {"textDocument": doc, "range": {"start": start, "end": pos}}),
            ])
            answer = request("textDocument/" + method, params)
            if "error" in answer:
                findings.add("lsp", f"{method} at {pos}: {answer['error']}", {"t.rcp": text})
                if answer["error"] in ("the server exited",) or "no answer" in str(answer["error"]):
                    return n
    request("shutdown", None)
    notify("exit", None)
    p.wait(timeout=10)
    stderr = open(err_path).read()
    if "panicked" in stderr:
        findings.add("lsp", "the server caught a panic\n" + stderr[-3000:], {"t.rcp": text})
    return n


def mode_data(tmp, findings, deadline):
    fixtures = os.path.join(ROOT, "runtime/tests/fixtures")
    rows = open(os.path.join(fixtures, "data/spam48.jsonl")).read().splitlines()
    config0 = json.load(open(os.path.join(fixtures, "tiny-bert/config.json")))
    recipe0 = open(os.path.join(fixtures, "tiny-bert/tiny.rcp")).read()
    shutil.copy(os.path.join(fixtures, "tokenizer/tokenizer.json"), os.path.join(tmp, "tokenizer.json"))

    def broken(lines):
        lines = list(lines)
        for _ in range(random.randint(1, 3)):
            lines = lines or [random.choice(BAD_ROWS)]
            i, k = random.randrange(len(lines)), random.random()
            if k < 0.5:
                lines[i] = random.choice(BAD_ROWS)
            elif k < 0.7:
                del lines[i]
            elif k < 0.85:
                lines.insert(i, random.choice(BAD_ROWS))
            else:
                lines = lines[:random.randint(0, 3)]
        return lines

    n = 0
    while time.time() < deadline:
        n += 1
        files = {
            "train.jsonl": "\n".join(broken(rows) if random.random() < 0.6 else rows) + "\n",
            "eval.jsonl": "\n".join(broken(rows[:12]) if random.random() < 0.3 else rows[:12]) + "\n",
        }
        config = dict(config0)
        if random.random() < 0.3:
            config[random.choice(list(config))] = json.loads(random.choice(
                ['0', '-1', '1', '3', '100000', '1e9', 'null', '"x"', '0.5', '[]']))
        files["config.json"] = json.dumps(config)
        recipe = recipe0
        if random.random() < 0.3:
            recipe = re.sub(r"max_len = \d+", "max_len = " + random.choice(["1", "2", "0", "513", "100000"]), recipe)
        if random.random() < 0.2:
            recipe = re.sub(r"micro = \d+", "micro = " + random.choice(["1", "49", "1000", "0"]), recipe)
        files["tiny.rcp"] = recipe
        for name, text in files.items():
            open(os.path.join(tmp, name), "w").write(text)
        shutil.rmtree(os.path.join(tmp, "out"), ignore_errors=True)
        _, what = run(["run", "tiny.rcp", "--quiet", "--stop-after", "2"], tmp, timeout=120)
        if what:
            findings.add("data", what, files)
    return n


MODES = {"recipes": mode_recipes, "pairs": mode_pairs, "lsp": mode_lsp, "fmt": mode_fmt, "data": mode_data}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mode", default="all", choices=list(MODES) + ["all"])
    ap.add_argument("--seconds", type=float, default=120, help="per mode")
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--out", default=os.path.join(ROOT, "target/fuzz"))
    a = ap.parse_args()
    if not os.path.exists(BIN):
        sys.exit(f"{BIN} not found: cargo build --release first (or set RECIPE_BIN)")
    seed = a.seed if a.seed is not None else random.randrange(1 << 32)
    random.seed(seed)
    findings = Findings(os.path.abspath(a.out))
    for name in (MODES if a.mode == "all" else [a.mode]):
        tmp = os.path.join(os.path.abspath(a.out), "work", name)
        shutil.rmtree(tmp, ignore_errors=True)
        os.makedirs(tmp)
        before = findings.n
        cases = MODES[name](tmp, findings, time.time() + a.seconds)
        print(f"{name}: {cases} inputs, {findings.n - before} findings (seed {seed})", flush=True)
    sys.exit(1 if findings.n else 0)


if __name__ == "__main__":
    main()
