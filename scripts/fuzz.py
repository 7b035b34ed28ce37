#!/usr/bin/env python3
"""Throws mutated inputs at the `recipe` binary and keeps the ones it mishandles.

Not part of CI (its inputs are random); run it after a change to the checker, the emitters, the
language server or the runtime's loaders. A finding is a crash (a panic, an abort, a signal), an
exit code outside 0/1/2, no answer within the time limit, a language server that dies or answers
with an error, or `fmt` that is not idempotent or changes what `check` reports. Each finding's
input is written to OUT/<mode>-<n>/ with what happened.

    scripts/fuzz.py [--mode recipes|pairs|lsp|fmt|data|files|backends|all] [--seconds 120] [--seed N] [--out DIR]

Modes (seeds from the repository):
  recipes  recipes/*.rcp and tests/diagnostics/*.rcp, mutated (tokens, numbers at extremes,
           lines shuffled), through check, explain, build and steps, now and then with
           --gpus, --nodes, --samples or --hidden-size at extremes;
  pairs    tests/pairs/*/ds_config.json (+ training_args.json) through check, import, explain;
  lsp      one `recipe lsp` session: each mutated text sent as a change, then hover, completion,
           definition, code actions, formatting, symbols and inlay hints at random places;
  fmt      fmt twice (the same text) and check before and after (the same codes);
  data     `recipe run --stop-after 2` of the tiny BERT (runtime/tests/fixtures) with broken data
           rows, config values and batch sizes;
  files    a trained tiny BERT's model directory read back (`from =`: run, check, explain) and
           its checkpoint resumed (`--resume`), one file broken (safetensors header length,
           offsets, dtypes, shapes and names; truncated; bytes flipped; JSON mutated) or removed;
  backends the tiny BERT in random shapes (heads of 5 to 64, 3 to 150 tokens), precisions,
           optimizers and ZeRO stages on the CPU and on the fake GPUs of runtime/fake-cuda under
           random CUDA switches (RECIPE_PDL, RECIPE_FUSED_ATTENTION, ...): the same steps and
           losses within 1e-5 (a few ulps in fp16/bf16), or a finding. Needs
           the fake driver (`cargo test --release --no-run`); not in `all` (seconds a case).
Found this way (2026-12-07): R0201's timeline walking every micro-batch (a recipe of 10^10
samples aborted), explain's LR table of every step, and a config asking for 372 GB aborting
`recipe run`; then R0315's greedy curve kept step by step (10^12 steps asked for 30 TB), its
plateau cuts made one by one (24 s) and R0303's half-way step walked (minutes, the editor
stalled). The files mode's first 7,600 inputs (2026-12-07) found nothing.
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
            with open(os.path.join(d, name), "wb" if isinstance(text, bytes) else "w") as f:
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


# The command line's numbers (--gpus 4294967296 --nodes 4294967296 once panicked in R0101).
FLAG_VALUES = ['0', '1', '3', '65536', '4294967296', '9223372036854775807', '18446744073709551615']


def random_flags():
    flags = []
    for flag in ("--gpus", "--nodes", "--samples", "--hidden-size"):
        if random.random() < 0.15:
            flags += [flag, random.choice(FLAG_VALUES)]
    return flags


def mode_recipes(tmp, findings, deadline):
    seeds, n = recipe_seeds(), 0
    path = os.path.join(tmp, "t.rcp")
    while time.time() < deadline:
        text, n = mutate_recipe(random.choice(seeds)), n + 1
        open(path, "w").write(text)
        flags = random_flags()
        no_hidden = [f for i, f in enumerate(flags)
                     if f != "--hidden-size" and (i == 0 or flags[i - 1] != "--hidden-size")]
        for args in (["check", path] + flags, ["explain", path] + flags,
                     ["build", path, "-o", os.path.join(tmp, "o")] + no_hidden, ["steps", path] + no_hidden):
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
                    p.kill()  # a server stuck in a check would spin on for hours
                    p.wait()
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


def mutate_safetensors(b):
    """A safetensors file (8-byte header length, JSON header, data) broken in one way: the
    length, the header's text (offsets, dtypes, shapes, names), the data's size, or bytes."""
    n = int.from_bytes(b[:8], "little") if len(b) >= 8 else 0
    header = b[8:8 + n].decode(errors="replace")
    k = random.random()
    if k < 0.15:
        return random.choice([0, 1, n - 1, n + 1, len(b), 1 << 40, (1 << 64) - 1]).to_bytes(8, "little") + b[8:]
    if k < 0.55:
        h = header
        for _ in range(random.randint(1, 3)):
            nums = list(re.finditer(r'\d+', h))
            r = random.random()
            if r < 0.4 and nums:
                m = random.choice(nums)
                h = h[:m.start()] + random.choice(['0', '1', '3', '4294967296', '18446744073709551615',
                                                   str(int(m.group()) + 1), str(max(int(m.group()) - 1, 0))]) + h[m.end():]
            elif r < 0.6:
                h = re.sub(r'"(F32|F16|BF16|I64)"', lambda _: random.choice(['"F32"', '"F16"', '"BF16"', '"F64"', '"I8"', '"U8"', '"BOOL"', '"X"']), h, count=1)
            elif r < 0.75:
                h = re.sub(r'"shape":\[[^\]]*\]', lambda _: random.choice(['"shape":[]', '"shape":[0]', '"shape":[1,1]', '"shape":[4294967296,4294967296]']), h, count=1)
            elif r < 0.9:
                names = re.findall(r'"([A-Za-z_.0-9]+)":\{', h)
                if names:
                    h = h.replace('"' + random.choice(names) + '":{', '"' + random.choice(names + ["x"]) + '":{', 1)
            else:
                h = mutate_json(h)
        hb = h.encode()
        return len(hb).to_bytes(8, "little") + hb + b[8 + n:]
    if k < 0.8:
        return b[:random.randrange(len(b) + 1)]
    b = bytearray(b)
    for _ in range(random.randint(1, 8)):
        i = random.randrange(len(b))
        b[i] = random.randrange(256)
    return bytes(b)


def mode_files(tmp, findings, deadline):
    """Broken model directories and checkpoints: a trained tiny BERT's `model/` read back by a
    recipe (`from = "model"`), and a checkpoint resumed (`--resume`), one of their files
    (model.safetensors, optimizer.safetensors, config.json, tokenizer.json, trainer_state.json)
    broken or removed."""
    fixtures = os.path.join(ROOT, "runtime/tests/fixtures")
    rows = open(os.path.join(fixtures, "data/spam48.jsonl")).read().splitlines()
    shutil.copy(os.path.join(fixtures, "tokenizer/tokenizer.json"), os.path.join(tmp, "tokenizer.json"))
    shutil.copy(os.path.join(fixtures, "tiny-bert/config.json"), os.path.join(tmp, "config.json"))
    open(os.path.join(tmp, "train.jsonl"), "w").write("\n".join(rows) + "\n")
    open(os.path.join(tmp, "eval.jsonl"), "w").write("\n".join(rows[:12]) + "\n")
    tiny = open(os.path.join(fixtures, "tiny-bert/tiny.rcp")).read()
    seeds = {}
    for precision in ("fp32", "bf16"):
        recipe = tiny.replace("precision = fp32", f"precision = {precision}").replace(
            'output_dir = "out"', f'output_dir = "seed-{precision}", save_every = 2')
        open(os.path.join(tmp, "tiny.rcp"), "w").write(recipe)
        r, what = run(["run", "tiny.rcp", "--quiet"], tmp, timeout=300)
        if what or r.returncode != 0:
            sys.exit(f"files: the seed run failed: {what or r.stderr.decode(errors='replace')}")
        seeds[precision] = os.path.join(tmp, f"seed-{precision}")
    n = 0
    while time.time() < deadline:
        n += 1
        precision = random.choice(list(seeds))
        resume = random.random() < 0.5
        src = os.path.join(seeds[precision], "checkpoint-2" if resume else "model")
        case = os.path.join(tmp, "case")
        shutil.rmtree(case, ignore_errors=True)
        shutil.copytree(src, case)
        name = random.choice(sorted(os.listdir(case)))
        path = os.path.join(case, name)
        data = open(path, "rb").read()
        if random.random() < 0.1:
            os.remove(path)
            broken = b""
        elif name.endswith(".safetensors"):
            broken = mutate_safetensors(data)
        else:
            broken = mutate_json(data.decode()).encode() if random.random() < 0.8 else data[:random.randrange(len(data) + 1)]
        if broken or os.path.exists(path):
            open(path, "wb").write(broken)
        out = os.path.join(tmp, "out")
        shutil.rmtree(out, ignore_errors=True)
        recipe = tiny.replace("precision = fp32", f"precision = {precision}")
        if resume:
            args = ["run", "tiny.rcp", "--quiet", "--resume", "case", "--stop-after", "4"]
        else:
            recipe = recipe.replace('config = "config.json"', 'from = "case"')
            args = random.choice([["run", "tiny.rcp", "--quiet", "--stop-after", "1"], ["check", "tiny.rcp"],
                                  ["explain", "tiny.rcp"]])
        open(os.path.join(tmp, "tiny.rcp"), "w").write(recipe)
        _, what = run(args, tmp, timeout=120)
        if what:
            findings.add("files", what, {"tiny.rcp": recipe, f"{'checkpoint' if resume else 'model'}-{name}": broken})
    return n


# Switches of the CUDA backend (docs/cuda.md) that must not change a run's results: each the
# GPU session's A/B of a default still to flip, or a fallback. With the fake driver's
# asynchronous streams a missing wait shows as a wrong result.
CUDA_SWITCHES = {
    "RECIPE_CUDA_GRAPHS": ["0", "1"],
    "RECIPE_FUSED_ATTENTION": ["0", "1"],
    "RECIPE_PDL": ["0", "1", "early"],
    "RECIPE_ROWS_FIRST": ["0", "1"],
    "RECIPE_STEP_ASIDE": ["0", "1"],
    "RECIPE_SIDE_STREAM": ["0", "1", "equal"],
    "RECIPE_GEMM_ALGO": ["fastest"],
    "RECIPE_GEMM_LIBRARY": ["cublas"],
    "RECIPE_HALF_GEMM": ["convert"],
    "RECIPE_FAKE_CUDA_ASYNC": ["20"],
    "RECIPE_FAKE_CUDA_LAZY": ["others"],
}


def fake_cuda_libs(tmp):
    """A folder of links named as the libraries cudarc loads, to the fake driver `cargo test
    --release` builds (runtime/fake-cuda; scripts/fake-gpu-check.sh does the same)."""
    found = [os.path.join(d, f) for d in (os.path.join(ROOT, "target/release/deps"),
                                          os.path.join(ROOT, "target/release"))
             if os.path.isdir(d) for f in os.listdir(d)
             if f.startswith("librecipe_fake_cuda") and f.endswith(".so")]
    if not found:
        sys.exit("no librecipe_fake_cuda*.so: cargo test --release --no-run -p recipe --test suite")
    libs = os.path.join(tmp, "libs")
    os.makedirs(libs, exist_ok=True)
    # A copy: a build during the session replaces the one in target/.
    lib = os.path.join(libs, "librecipe_fake_cuda.so")
    shutil.copy(max(found, key=os.path.getmtime), lib)
    for name in ("libcuda.so", "libcuda.so.1", "libnvrtc.so", "libcublas.so", "libcublasLt.so",
                 "libnccl.so", "libnccl.so.2"):
        os.symlink(lib, os.path.join(libs, name))
    return libs


def logged_steps(out):
    """Each logged step's (step, lr, loss scale, skipped) and its loss, and each step's gradient
    norm and evaluation's loss, from metrics.jsonl."""
    rows = [json.loads(x) for x in open(os.path.join(out, "metrics.jsonl")) if x.strip()]
    return [((r.get("step"), r.get("lr"), r.get("loss_scale"), r.get("skipped")), r["loss"])
            for r in rows if "loss" in r] + \
        [(("grad_norm", r.get("step")), r["grad_norm"]) for r in rows
         if isinstance(r.get("grad_norm"), float)] + \
        [(("eval", r.get("step")), r["eval"]["loss"]) for r in rows
         if isinstance(r.get("eval"), dict) and "loss" in r["eval"]]


def mode_backends(tmp, findings, deadline):
    """The tiny BERT in random shapes and settings on the CPU and on the fake GPUs (the
    emulated kernels, cuBLASLt and NCCL of runtime/fake-cuda), under random CUDA switches: a
    crash, a refusal of the fake driver, other steps, LRs, loss scales or skips, losses or
    evaluation losses more than 1e-5 apart relative (the fake's GEMMs add in the CPU's order:
    tests/fake_cuda.rs holds its fixed shapes to 1e-5; in fp16/bf16 a few ulps of the 16-bit
    type) or gradient norms more than 1e-3 apart (2e-2 in fp16/bf16) is a finding."""
    fixtures = os.path.join(ROOT, "runtime/tests/fixtures")
    rows = open(os.path.join(fixtures, "data/spam48.jsonl")).read().splitlines()
    config0 = json.load(open(os.path.join(fixtures, "tiny-bert/config.json")))
    shutil.copy(os.path.join(fixtures, "tokenizer/tokenizer.json"), os.path.join(tmp, "tokenizer.json"))
    open(os.path.join(tmp, "train.jsonl"), "w").write("\n".join(rows) + "\n")
    open(os.path.join(tmp, "eval.jsonl"), "w").write("\n".join(rows[:12]) + "\n")
    env = dict(os.environ, LD_LIBRARY_PATH=fake_cuda_libs(tmp) + ":" + os.environ.get("LD_LIBRARY_PATH", ""),
               NO_COLOR="1", RECIPE_CACHE=os.path.join(tmp, "cache"), RECIPE_COLLECTIVE_TIMEOUT="120")
    for k in list(env):
        if k.startswith("RECIPE_") and k not in ("RECIPE_CACHE", "RECIPE_COLLECTIVE_TIMEOUT"):
            del env[k]
    n = 0
    while time.time() < deadline:
        n += 1
        head = random.choice([8, 12, 16, 32, 32, 64, 64, 5])
        heads = random.choice([1, 2, 3])
        config = dict(config0, hidden_size=head * heads, num_attention_heads=heads,
                      intermediate_size=random.randint(1, 4 * head * heads),
                      num_hidden_layers=random.choice([1, 2]), max_position_embeddings=256)
        dropout = random.choice([0.0, 0.1])
        config.update(hidden_dropout_prob=dropout, attention_probs_dropout_prob=random.choice([0.0, dropout]))
        precision = random.choice(["fp32", "fp16", "bf16", "bf16"])
        gpus = random.choice([1, 1, 2])
        stage = random.choice([0, 1, 2, 3])
        zero = f"zero {stage}" + (" { offload optimizer = cpu }" if stage and random.random() < 0.3 else "")
        optimizer = random.choice(["adamw { lr = 1e-3, weight_decay = 0.01 }", "adamw { lr = 1e-3 }",
                                   "sgd { lr = 1e-2, momentum = 0.9 }", "adagrad { lr = 1e-2 }",
                                   "lamb { lr = 1e-3 }"])
        recipe = "\n".join([
            'recipe "fuzz"',
            'model bert { config = "config.json", task = classify(labels: ["ham", "spam"]) }',
            'data { train = "train.jsonl", eval = "eval.jsonl", max_len = %d }'
            % random.choice([3, 8, 24, 31, 64, 128, 129, 150]),
            "batch { micro = %d, accumulate = %d }" % (random.randint(1, 6), random.randint(1, 3)),
            "optimizer " + optimizer,
            "schedule linear { warmup = 1 }",
            "train { epochs = 1, precision = %s, seed = %d, logging_steps = 1%s }"
            % (precision, random.randrange(1000), random.choice(["", ", clip = 1.0"])),
            zero, ""])
        switches = {k: random.choice(v) for k, v in CUDA_SWITCHES.items() if random.random() < 0.3}
        if "RECIPE_GEMM_LIBRARY" in switches:  # refused together (cuBLAS has no candidates)
            switches.pop("RECIPE_GEMM_ALGO", None)
        files = {"config.json": json.dumps(config), "fuzz.rcp": recipe,
                 "env.txt": " ".join(f"{k}={v}" for k, v in sorted(switches.items()))}
        for name in ("config.json", "fuzz.rcp"):
            open(os.path.join(tmp, name), "w").write(files[name])
        runs, what = [], None
        for device in ("cpu", "cuda"):
            out = os.path.join(tmp, "out-" + device)
            shutil.rmtree(out, ignore_errors=True)
            args = [BIN, "run", "fuzz.rcp", "--quiet", "--device", device, "--gpus", str(gpus),
                    "--stop-after", "3", "--set", f'train.output_dir="{out}"']
            e = dict(env, RECIPE_FAKE_CUDA_GPUS=str(gpus), **(switches if device == "cuda" else {}))
            try:
                r = subprocess.run(args, capture_output=True, timeout=600, cwd=tmp, env=e)
            except subprocess.TimeoutExpired:
                what = f"no answer in 600 s on {device}"
                break
            err = r.stderr.decode(errors="replace")
            if device == "cpu" and r.returncode in (1, 2) and "panicked" not in err:
                what = "refused"  # a recipe the checker refuses (LAMB with offload, ...)
                break
            if r.returncode != 0 or "panicked" in err or "fake CUDA:" in err:
                what = f"exit {r.returncode} on {device}\n{err[-3000:]}"
                break
            runs.append(logged_steps(out))
        if what is None:
            (cpu, gpu) = runs
            if [k for k, _ in cpu] != [k for k, _ in gpu]:
                what = f"steps, LRs, loss scales or skips differ:\ncpu {cpu}\ncuda {gpu}"
            elif not any(isinstance(k[0], int) for k, _ in cpu):
                what = "no step logged"
            else:
                # In fp32 every path gives the CPU's losses on the fake GPU. In fp16/bf16 the
                # attention's kernels (the fused ones, and the softmax around the batched
                # products) add some sums in another order than the CPU (docs/cuda.md): a
                # probability or gradient an ulp of its 16-bit type apart now and then, and a
                # loss some ulps apart a step later. Near-uniform attention over long padded
                # rows (Σ dp·p close to each dp) turns the order into q's and k's gradients
                # some 1e-3 apart: gradient norms 1e-5 to 1e-4 apart in fp32.
                half = precision != "fp32"
                loss_bound = {"fp32": 1e-5, "fp16": 4e-3, "bf16": 2e-2}[precision]
                norm_bound = 2e-2 if half else 1e-3
                for (key, a), (_, b) in zip(cpu, gpu):
                    if a is None or b is None:
                        continue
                    rel = abs(a - b) / max(abs(a), 1e-30)
                    if rel > (norm_bound if key[0] == "grad_norm" else loss_bound):
                        what = f"{key} differs by {rel:.3e} relative:\ncpu {cpu}\ncuda {gpu}"
                        break
        if what and what != "refused":
            findings.add("backends", what, files)
    return n


MODES = {"recipes": mode_recipes, "pairs": mode_pairs, "lsp": mode_lsp, "fmt": mode_fmt, "data": mode_data,
         "files": mode_files, "backends": mode_backends}


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
    for name in ([m for m in MODES if m != "backends"] if a.mode == "all" else [a.mode]):
        tmp = os.path.join(os.path.abspath(a.out), "work", name)
        shutil.rmtree(tmp, ignore_errors=True)
        os.makedirs(tmp)
        before = findings.n
        cases = MODES[name](tmp, findings, time.time() + a.seconds)
        print(f"{name}: {cases} inputs, {findings.n - before} findings (seed {seed})", flush=True)
    sys.exit(1 if findings.n else 0)


if __name__ == "__main__":
    main()
