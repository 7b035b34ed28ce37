#!/usr/bin/env python3
"""Regenerate src/schema/upstream_versions.rs from the released packages on PyPI.

The file holds, per sampled release, the dataclass fields of transformers' `TrainingArguments` (with
their literal defaults) and the ds_config keys DeepSpeed reads at the top level and inside
`zero_optimization`. Every line of it is written by this script; hand-curated knowledge about those
keys (renames, notes, master-only keys, the strict sections) lives in src/schema/upstream.rs.

    python3 conformance/extract_upstream.py            # fetch what is missing, rewrite the file
    python3 conformance/extract_upstream.py --check    # exit 1 when the committed file differs
    python3 conformance/extract_upstream.py --stdout   # print the file instead of writing it
    python3 conformance/extract_upstream.py --offline  # use the cache only (no network)

Python 3.11, standard library only. Downloads are kept in $RECIPE_UPSTREAM_CACHE (default
~/.cache/recipe/upstream): transformers wheels via `python3 -m pip download --no-deps --only-binary
:all:`; DeepSpeed sdists from the index's JSON API (PEP 691) with their sha256 checked, because
`pip download` builds an sdist's metadata and DeepSpeed's setup.py imports torch. Nothing is
installed or imported from the packages: their sources are parsed with `ast`.

tests/upstream_tables.rs checks, without Python or network, that the committed file is this script's
output for the constants it defines: it reads TEMPLATE below from this file and re-renders the tables
with the same rules (render_* below), digest included.
"""

from __future__ import annotations

import argparse
import ast
import glob
import hashlib
import json
import os
import subprocess
import sys
import tarfile
import urllib.parse
import urllib.request
import zipfile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUTPUT = os.path.join("src", "schema", "upstream_versions.rs")

# The sampled releases, oldest first. Adding one: append it here, rerun, review the diff of the
# generated file and of the facts in tests/upstream_tables.rs. DeepSpeed: the last release of each
# minor series from 0.3 on and, from 0.14 on, the first too (keys also change in patch releases:
# 0.19.5 -> 0.19.8); transformers: the last release of each minor series from 4.24 on, and the
# first of a few (4.30.0, 4.41.0, 4.46.0: fields also change in patch releases, 4.46.0 -> 4.46.3);
# so that a target falls between two sampled releases only inside a series; there, a key one
# neighbour reads and the other does not is uncertain (src/check/raw.rs). Both lists also hold the
# releases conformance/ runs (DeepSpeed 0.7.7, transformers 4.48.0).
TRANSFORMERS_VERSIONS = [
    "4.6.1", "4.24.0", "4.25.1", "4.26.1", "4.27.4", "4.28.1", "4.29.2", "4.30.0", "4.30.2",
    "4.31.0", "4.32.1", "4.33.3", "4.34.1", "4.35.2", "4.36.2", "4.37.2", "4.38.2", "4.39.3",
    "4.40.2", "4.41.0", "4.41.2", "4.42.4", "4.43.4", "4.44.2", "4.45.2", "4.46.0", "4.46.3",
    "4.47.1", "4.48.0", "4.48.3", "4.49.0", "4.50.3", "4.51.3", "4.52.1", "4.52.4", "4.53.3",
    "4.54.1", "4.55.4", "4.56.2", "4.57.6", "5.0.0", "5.1.0", "5.2.0", "5.3.0", "5.4.0", "5.5.4",
    "5.6.2", "5.7.0", "5.8.1", "5.9.0", "5.10.4", "5.11.0", "5.12.1", "5.13.1", "5.14.1", "5.15.1",
    "5.16.1", "5.17.0", "5.18.0", "5.19.0", "5.20.2", "5.21.1", "5.22.2", "5.23.0", "5.24.0",
    "5.25.0",
]
DEEPSPEED_VERSIONS = ["0.3.16", "0.4.5", "0.5.10", "0.6.7", "0.7.7", "0.8.3", "0.9.5", "0.10.3", "0.11.2", "0.12.6", "0.13.5", "0.14.0", "0.14.2", "0.14.5", "0.15.0", "0.15.4", "0.16.0", "0.16.9", "0.17.0", "0.17.6", "0.18.0", "0.18.9", "0.19.0", "0.19.5", "0.19.8"]

# Where the analysis of a DeepSpeed tree starts: (module, attribute path, the config argument: position
# or keyword). The class is instantiated (its __init__ runs), the function called, with the ds_config
# dict as that argument.
DEEPSPEED_ROOTS = [
    ("deepspeed.runtime.config", "DeepSpeedConfig", 0),  # DeepSpeedConfig(config, mpu, ...)
    ("deepspeed", "initialize", "config"),  # deepspeed.initialize(..., config=...)
    ("deepspeed", "initialize", "config_params"),  # the older keyword of the same argument
]

# Hand decisions the mechanical extraction cannot make: {(table, version): (added keys, removed keys,
# "reason; upstream file:function@version")}, table "top" or "zero". Empty: the extraction reproduces
# every table that was once hand-checked (the "Checked and not listed" cases in the generated file's
# docs fall out of the rules). An entry that changes nothing is an error.
DEEPSPEED_OVERRIDES: dict[tuple[str, str], tuple[list[str], list[str], str]] = {}


# ---------------------------------------------------------------------------------------------------
# Downloads


def cache_dir() -> str:
    path = os.environ.get("RECIPE_UPSTREAM_CACHE") or os.path.join("~", ".cache", "recipe", "upstream")
    path = os.path.expanduser(path)
    os.makedirs(path, exist_ok=True)
    return path


def transformers_wheel(cache: str, version: str, offline: bool) -> str:
    pattern = os.path.join(cache, f"transformers-{version}-py3-none-any.whl")
    if not glob.glob(pattern):
        if offline:
            sys.exit(f"--offline: {pattern} is not in the cache")
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "--quiet", "--disable-pip-version-check", "--no-deps",
             "--only-binary", ":all:", "--python-version", "3.11", "--dest", cache, f"transformers=={version}"],
            check=True)
    found = glob.glob(pattern)
    if len(found) != 1:
        sys.exit(f"pip download transformers=={version}: expected one file {pattern}, found {found}")
    return found[0]


def sdist(cache: str, project: str, version: str, offline: bool) -> str:
    name = f"{project}-{version}.tar.gz"
    path = os.path.join(cache, name)
    if os.path.exists(path):
        return path
    if offline:
        sys.exit(f"--offline: {path} is not in the cache")
    index = os.environ.get("PIP_INDEX_URL", "https://pypi.org/simple").rstrip("/") + f"/{project}/"
    request = urllib.request.Request(index, headers={"Accept": "application/vnd.pypi.simple.v1+json"})
    with urllib.request.urlopen(request, timeout=120) as response:
        files = [f for f in json.load(response)["files"] if f["filename"] == name]
    if len(files) != 1:
        sys.exit(f"{index}: no single file {name}")
    with urllib.request.urlopen(urllib.parse.urljoin(index, files[0]["url"]), timeout=600) as response:
        data = response.read()
    if hashlib.sha256(data).hexdigest() != files[0]["hashes"]["sha256"]:
        sys.exit(f"{name}: sha256 differs from the index's")
    with open(path + ".part", "wb") as f:
        f.write(data)
    os.replace(path + ".part", path)
    return path


def sha256_of(path: str) -> str:
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


# ---------------------------------------------------------------------------------------------------
# transformers: TrainingArguments dataclass fields


def training_arguments(source: str) -> list[tuple[str, str | None, str | None]]:
    """(field, literal default as Python repr or None, why there is no literal default), sorted."""
    tree = ast.parse(source)
    classes = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "TrainingArguments"]
    if len(classes) != 1:
        raise ValueError("expected one top-level class TrainingArguments")
    cls = classes[0]
    if cls.bases or [ast.unparse(d) for d in cls.decorator_list] != ["dataclass"]:
        raise ValueError("TrainingArguments is no longer a plain @dataclass without bases: extend the script")
    for st in cls.body:
        if not isinstance(st, (ast.AnnAssign, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            if any(isinstance(n, ast.AnnAssign) for n in ast.walk(st)):
                raise ValueError(f"annotated assignment nested in a class-level statement: {ast.unparse(st)[:80]}")
    rows = []
    for st in cls.body:
        if not (isinstance(st, ast.AnnAssign) and isinstance(st.target, ast.Name)):
            continue
        if "ClassVar" in ast.unparse(st.annotation):
            continue
        name, expr, note = st.target.id, st.value, None
        if isinstance(expr, ast.Call) and isinstance(expr.func, ast.Name) and expr.func.id == "field":
            kw = {k.arg: k.value for k in expr.keywords}
            if "init" in kw and isinstance(kw["init"], ast.Constant) and kw["init"].value is False:
                continue  # not an __init__ argument
            if "default" in kw:
                expr = kw["default"]
            elif "default_factory" in kw:
                expr, note = None, "default_factory=" + ast.unparse(kw["default_factory"])
            else:
                expr = None
        if expr is None:
            rows.append((name, None, note or "no default: required argument"))
            continue
        try:
            rows.append((name, repr(ast.literal_eval(expr)), None))
        except ValueError:
            rows.append((name, None, non_literal_note(cls, expr)))
    rows.sort()
    names = [r[0] for r in rows]
    if len(set(names)) != len(names):
        raise ValueError("duplicate field")
    return rows


def non_literal_note(cls: ast.ClassDef, expr: ast.expr) -> str:
    """`non-literal default `EXPR``; for a class attribute, the literal values assigned to it in the
    class body, each with the `if` conditions it sits under."""
    note = f"non-literal default `{ast.unparse(expr)}`"
    if not isinstance(expr, ast.Name):
        return note
    values = []

    def walk(stmts, conds):
        for st in stmts:
            if isinstance(st, ast.Assign) and any(isinstance(t, ast.Name) and t.id == expr.id for t in st.targets):
                try:
                    value = repr(ast.literal_eval(st.value))
                except ValueError:
                    value = f"`{ast.unparse(st.value)}`"
                values.append(value + (" if " + " and ".join(conds) if conds else ""))
            elif isinstance(st, ast.If):
                walk(st.body, conds + [ast.unparse(st.test)])
                walk(st.orelse, conds + [f"not ({ast.unparse(st.test)})"])

    walk(cls.body, [])
    return note + (": " + "; ".join(values) if values else "")


def read_wheel(path: str, version: str) -> str:
    with zipfile.ZipFile(path) as z:
        metadata = z.read(f"transformers-{version}.dist-info/METADATA").decode()
        if f"\nVersion: {version}\n" not in metadata:
            raise ValueError(f"{path}: METADATA is not for version {version}")
        return z.read("transformers/training_args.py").decode()


# ---------------------------------------------------------------------------------------------------
# DeepSpeed: the keys of the ds_config dict a release reads


class Key:
    """The ds_config dict (path ()), or the sub-dict at `path` inside it."""

    __slots__ = ("path",)

    def __init__(self, path):
        self.path = path

    def __eq__(self, other):
        return isinstance(other, Key) and other.path == self.path

    def __hash__(self):
        return hash(("key", self.path))


class Lit:
    """A literal str or int."""

    __slots__ = ("value",)

    def __init__(self, value):
        self.value = value

    def __eq__(self, other):
        return isinstance(other, Lit) and type(other.value) is type(self.value) and other.value == self.value

    def __hash__(self):
        return hash(("lit", type(self.value).__name__, self.value))


class Ref:
    """Anything else followed, by `kind`, an AST node (compared by identity) and `extra`: func, class,
    inst (instance of class `node`), bound (method `node` bound to the instance of the class with id
    `extra`), super (methods after class `node` in its MRO, bound like `bound`), mod (`extra`: module
    name), seq / dict / items (literal containers; `extra`: the element value sets), keymeth (method
    `extra[1]` of the config dict at path `extra[0]`), dictmeth (method of a literal dict)."""

    __slots__ = ("kind", "node", "extra")

    def __init__(self, kind, node, extra=None):
        self.kind, self.node, self.extra = kind, node, extra

    def __eq__(self, other):
        return (isinstance(other, Ref) and other.kind == self.kind and other.node is self.node
                and other.extra == self.extra)

    def __hash__(self):
        return hash((self.kind, id(self.node), self.extra))


EMPTY: frozenset = frozenset()


class Frame:
    def __init__(self, module, env, func=None, self_cls=None):
        self.module, self.env, self.func, self.self_cls = module, env, func, self_cls
        self.returns = set()

    def merge(self, *envs):
        """The state after branches that ended in `envs`."""
        out = {}
        for env in envs:
            for k, v in env.items():
                out[k] = out.get(k, EMPTY) | v
        self.env = out


class KeyReads:
    """Which keys of the ds_config dict a DeepSpeed source tree reads, by abstract interpretation.

    Values are sets of Key / Lit / Ref; a name with no known value has the empty set (an undefined
    constant reads nothing). Assignments replace a variable's value, branches and loops merge them;
    a function is analysed once per distinct set of argument values, and the whole analysis repeats
    until instance attributes and reads stop growing. A value read is `d[k]`, `d.get(k, ...)`,
    `d.pop(k, ...)` or `d.setdefault(k, ...)` with a constant key on a config dict (or a copy of one:
    copy.copy, copy.deepcopy, dict(), `{k: v for k, v in d.items() ...}`); `k in d` is not a read.
    `Model(**d)` with a pydantic model (a class whose MRO reaches `BaseModel`) reads every field name and
    alias of the model, inherited ones included. Calls are followed into the package only; names
    resolve through module globals and `from ... import` (star imports included)."""

    def __init__(self, files: dict[str, str], package: str = "deepspeed"):
        self.files, self.package = files, package
        self.modules = {}
        self.ns_cache, self.ns_busy = {}, set()
        self.classes, self.method_class, self.owner = {}, {}, {}
        self.reads, self.models, self.attrs = set(), set(), {}
        self.memo, self.busy = {}, set()
        self.changed = False

    # modules ---------------------------------------------------------------------------------------
    def module(self, name):
        if name not in self.modules:
            self.modules[name] = None
            if name.split(".")[0] == self.package:
                base = name.replace(".", "/")
                for path, is_pkg in ((base + ".py", False), (base + "/__init__.py", True)):
                    if path in self.files:
                        tree = ast.parse(self.files[path], filename=path)
                        self.index(tree, name)
                        self.modules[name] = (tree, is_pkg)
                        break
        return self.modules[name]

    def index(self, tree, modname):
        for node in ast.walk(tree):
            if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                self.owner[id(node)] = modname
            if isinstance(node, ast.ClassDef):
                self.classes[id(node)] = node
                for st in node.body:
                    if isinstance(st, (ast.FunctionDef, ast.AsyncFunctionDef)):
                        self.method_class[id(st)] = node

    def absolute(self, modname, level, current):
        if level == 0:
            return modname
        parts = current.split(".")
        mod = self.module(current)
        if not (mod and mod[1]):
            parts = parts[:-1]
        parts = parts[: len(parts) - (level - 1)]
        return ".".join(parts + ([modname] if modname else []))

    def namespace(self, name):
        """Module-level bindings in source order (a later one wins): name -> binding."""
        if name in self.ns_cache:
            return self.ns_cache[name]
        if name in self.ns_busy or self.module(name) is None:
            return {}
        self.ns_busy.add(name)
        ns = {}

        def visit(stmts):
            for st in stmts:
                if isinstance(st, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                    ns[st.name] = ("node", st)
                elif isinstance(st, ast.Assign):
                    for t in st.targets:
                        if isinstance(t, ast.Name):
                            ns[t.id] = ("expr", st.value, name)
                elif isinstance(st, ast.AnnAssign) and isinstance(st.target, ast.Name) and st.value:
                    ns[st.target.id] = ("expr", st.value, name)
                elif isinstance(st, ast.ImportFrom):
                    src = self.absolute(st.module, st.level, name)
                    for alias in st.names:
                        if alias.name == "*":
                            ns.update((k, v) for k, v in self.namespace(src).items() if not k.startswith("_"))
                        else:
                            ns[alias.asname or alias.name] = ("from", src, alias.name)
                elif isinstance(st, ast.Import):
                    for alias in st.names:
                        local = alias.asname or alias.name.split(".")[0]
                        ns[local] = ("mod", alias.name if alias.asname else local)
                elif isinstance(st, ast.If):
                    visit(st.body)
                    visit(st.orelse)
                elif isinstance(st, ast.Try):
                    visit(st.body)
                    for h in st.handlers:
                        visit(h.body)
                    visit(st.orelse)
                    visit(st.finalbody)

        visit(self.modules[name][0].body)
        self.ns_busy.discard(name)
        self.ns_cache[name] = ns
        return ns

    def global_value(self, modname, name):
        b = self.namespace(modname).get(name)
        return self.module_ref(f"{modname}.{name}") if b is None else self.binding_value(b)

    def module_ref(self, name):
        return frozenset([Ref("mod", None, name)]) if self.module(name) is not None else EMPTY

    def binding_value(self, b):
        if b[0] == "node":
            return frozenset([Ref("class" if isinstance(b[1], ast.ClassDef) else "func", b[1])])
        if b[0] == "mod":
            return self.module_ref(b[1])
        key = (b[0], id(b[1])) if b[0] == "expr" else b
        if key in self.ns_busy:
            return EMPTY
        self.ns_busy.add(key)
        try:
            if b[0] == "expr":
                return self.eval(b[1], Frame(b[2], {}))
            return self.module_ref(f"{b[1]}.{b[2]}") or self.global_value(b[1], b[2])
        finally:
            self.ns_busy.discard(key)

    # classes ---------------------------------------------------------------------------------------
    def mro(self, cls):
        """The class, then its bases breadth-first; a base outside the package as its source text."""
        out, todo, seen = [], [cls], set()
        while todo:
            c = todo.pop(0)
            if isinstance(c, str):
                out.append(c)
                continue
            if id(c) in seen:
                continue
            seen.add(id(c))
            out.append(c)
            for b in c.bases:
                found = [v.node for v in self.eval(b, Frame(self.owner[id(c)], {}))
                         if isinstance(v, Ref) and v.kind == "class"]
                todo.extend(found or [ast.unparse(b)])
        return out

    def is_model(self, cls):
        return any(isinstance(c, str) and c.split(".")[-1] == "BaseModel" for c in self.mro(cls))

    @staticmethod
    def method(mro, name):
        for c in mro:
            if isinstance(c, ast.ClassDef):
                for st in c.body:
                    if isinstance(st, (ast.FunctionDef, ast.AsyncFunctionDef)) and st.name == name:
                        return st
        return None

    def model_fields(self, cls):
        keys = set()
        for c in self.mro(cls):
            if not isinstance(c, ast.ClassDef):
                continue
            for st in c.body:
                if not (isinstance(st, ast.AnnAssign) and isinstance(st.target, ast.Name)):
                    continue
                if st.target.id.startswith("_") or "ClassVar" in ast.unparse(st.annotation):
                    continue
                keys.add(st.target.id)
                if isinstance(st.value, ast.Call):
                    for kw in st.value.keywords:
                        if kw.arg == "alias" and isinstance(kw.value, ast.Constant):
                            keys.add(kw.value.value)
        return keys

    # expressions -----------------------------------------------------------------------------------
    def read_keys(self, bases, keys):
        out = set()
        for b in bases:
            if isinstance(b, Key):
                for k in keys:
                    if isinstance(k, Lit) and isinstance(k.value, str):
                        path = b.path + (k.value,)
                        if path not in self.reads:
                            self.reads.add(path)
                            self.changed = True
                        out.add(Key(path))
        return out

    def eval(self, node, fr):
        handler = getattr(self, "e_" + type(node).__name__, None)
        if handler is not None:
            return handler(node, fr)
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.expr):
                self.eval(child, fr)
        return EMPTY

    def e_Constant(self, node, fr):
        ok = isinstance(node.value, (str, int)) and not isinstance(node.value, bool)
        return frozenset([Lit(node.value)]) if ok else EMPTY

    def e_Name(self, node, fr):
        if node.id in fr.env:
            return fr.env[node.id]
        return self.global_value(fr.module, node.id)

    def e_JoinedStr(self, node, fr):
        parts = []
        for v in node.values:
            if isinstance(v, ast.Constant):
                parts.append(str(v.value))
                continue
            vals = self.eval(v.value, fr)
            if len(vals) != 1 or not isinstance(next(iter(vals)), Lit) or v.format_spec or v.conversion != -1:
                return EMPTY
            parts.append(str(next(iter(vals)).value))
        return frozenset([Lit("".join(parts))])

    def e_BinOp(self, node, fr):
        left, right = self.eval(node.left, fr), self.eval(node.right, fr)
        if not isinstance(node.op, ast.Add):
            return EMPTY
        return frozenset(Lit(a.value + b.value) for a in left for b in right
                         if isinstance(a, Lit) and isinstance(b, Lit)
                         and isinstance(a.value, str) and isinstance(b.value, str))

    def e_BoolOp(self, node, fr):
        return frozenset().union(*(self.eval(v, fr) for v in node.values))

    def e_IfExp(self, node, fr):
        self.eval(node.test, fr)
        return self.eval(node.body, fr) | self.eval(node.orelse, fr)

    def e_Tuple(self, node, fr):
        return frozenset([Ref("seq", node, tuple(self.eval(e, fr) for e in node.elts))])

    e_List = e_Set = e_Tuple

    def e_Dict(self, node, fr):
        pairs = []
        for k, v in zip(node.keys, node.values):
            vals = self.eval(v, fr)
            if k is not None:
                pairs.append((self.eval(k, fr), vals))
        return frozenset([Ref("dict", node, tuple(pairs))])

    def e_Subscript(self, node, fr):
        base, idx = self.eval(node.value, fr), self.eval(node.slice, fr)
        out = self.read_keys(base, idx)
        for b in base:
            if isinstance(b, Ref) and b.kind == "dict":
                for kv, vv in b.extra:
                    if kv & idx:
                        out |= vv
            elif isinstance(b, Ref) and b.kind == "seq":
                for i in idx:
                    if isinstance(i, Lit) and isinstance(i.value, int) and -len(b.extra) <= i.value < len(b.extra):
                        out |= b.extra[i.value]
        return frozenset(out)

    def e_Attribute(self, node, fr):
        out = set()
        for b in self.eval(node.value, fr):
            if isinstance(b, Key):
                out.add(Ref("keymeth", None, (b.path, node.attr)))
            elif not isinstance(b, Ref):
                continue
            elif b.kind == "inst":
                out |= self.attrs.get((id(b.node), node.attr), EMPTY)
                m = self.method(self.mro(b.node), node.attr)
                if m is not None:
                    out.add(Ref("bound", m, id(b.node)))
            elif b.kind == "super":
                m = self.method(self.mro(b.node)[1:], node.attr)
                if m is not None:
                    out.add(Ref("bound", m, b.extra))
            elif b.kind == "class":
                m = self.method(self.mro(b.node), node.attr)
                if m is not None:
                    out.add(Ref("func", m))
            elif b.kind == "mod":
                out |= self.global_value(b.extra, node.attr)
            elif b.kind == "dict":
                out.add(Ref("dictmeth", b.node, (b.extra, node.attr)))
        return frozenset(out)

    def e_Compare(self, node, fr):
        self.eval(node.left, fr)
        for c in node.comparators:
            self.eval(c, fr)
        return EMPTY

    def e_Lambda(self, node, fr):
        return EMPTY

    def e_Starred(self, node, fr):
        return self.eval(node.value, fr)

    def comprehension(self, node, fr, element):
        sub = Frame(fr.module, dict(fr.env), fr.func, fr.self_cls)
        results = []

        def loop(i):
            if i == len(node.generators):
                results.append(element(sub))
                return
            g = node.generators[i]
            for item in self.iterate(self.eval(g.iter, sub)):
                self.bind(g.target, item, sub)
                for cond in g.ifs:
                    self.eval(cond, sub)
                loop(i + 1)

        loop(0)
        return results

    def e_ListComp(self, node, fr):
        self.comprehension(node, fr, lambda s: self.eval(node.elt, s))
        return EMPTY

    e_SetComp = e_GeneratorExp = e_ListComp

    def e_DictComp(self, node, fr):
        pairs = self.comprehension(node, fr, lambda s: (self.eval(node.key, s), self.eval(node.value, s)))
        out = {Ref("dict", node, tuple(pairs))}
        g = node.generators[0]
        if isinstance(g.iter, ast.Call) and isinstance(g.iter.func, ast.Attribute) and g.iter.func.attr == "items":
            out |= {b for b in self.eval(g.iter.func.value, fr) if isinstance(b, Key)}
        return frozenset(out)

    @staticmethod
    def iterate(vals):
        """The values a loop variable takes over `vals`: literal containers element by element, then
        the empty set (anything else)."""
        for v in vals:
            if isinstance(v, Ref) and v.kind == "seq":
                yield from v.extra
            elif isinstance(v, Ref) and v.kind == "dict":
                yield from (k for k, _ in v.extra)
            elif isinstance(v, Ref) and v.kind == "items":
                yield from (frozenset([Ref("seq", v.node, pair)]) for pair in v.extra)
        yield EMPTY

    def bind(self, target, vals, fr):
        if isinstance(target, ast.Name):
            fr.env[target.id] = vals
        elif isinstance(target, (ast.Tuple, ast.List)):
            seqs = [v.extra for v in vals
                    if isinstance(v, Ref) and v.kind == "seq" and len(v.extra) == len(target.elts)]
            for i, t in enumerate(target.elts):
                self.bind(t, frozenset().union(*(s[i] for s in seqs)), fr)
        elif isinstance(target, ast.Attribute):
            for b in self.eval(target.value, fr):
                if isinstance(b, Ref) and b.kind == "inst":
                    key = (id(b.node), target.attr)
                    old = self.attrs.get(key, EMPTY)
                    if not vals <= old:
                        self.attrs[key] = old | vals
                        self.changed = True
        elif isinstance(target, ast.Subscript):
            self.eval(target.value, fr)
            self.eval(target.slice, fr)
        elif isinstance(target, ast.Starred):
            self.bind(target.value, EMPTY, fr)

    def e_Call(self, node, fr):
        if isinstance(node.func, ast.Name) and node.func.id == "super" and "super" not in fr.env:
            cls = self.method_class.get(id(fr.func))
            if cls is None or fr.self_cls is None:
                return EMPTY
            return frozenset([Ref("super", cls, id(fr.self_cls))])
        funcs = self.eval(node.func, fr)
        args = [self.eval(a, fr) for a in node.args]
        kwargs, spread = {}, []
        for kw in node.keywords:
            vals = self.eval(kw.value, fr)
            if kw.arg is None:
                spread.append(vals)
            else:
                kwargs[kw.arg] = vals
        out = set()
        for f in funcs:
            if not isinstance(f, Ref):
                continue
            if f.kind == "keymeth":
                path, meth = f.extra
                if meth in ("get", "pop", "setdefault") and args:
                    out |= self.read_keys([Key(path)], args[0])
                    for a in args[1:2] + [kwargs.get("default", EMPTY)]:
                        out |= a
                elif meth == "copy":
                    out.add(Key(path))
            elif f.kind == "dictmeth":
                pairs, meth = f.extra
                if meth == "items":
                    out.add(Ref("items", f.node, pairs))
                elif meth == "keys":
                    out.add(Ref("seq", f.node, tuple(k for k, _ in pairs)))
                elif meth == "values":
                    out.add(Ref("seq", f.node, tuple(v for _, v in pairs)))
                elif meth == "get" and args:
                    for kv, vv in pairs:
                        if kv & args[0]:
                            out |= vv
            elif f.kind == "func":
                out |= self.call(f.node, None, args, kwargs)
            elif f.kind == "bound":
                out |= self.call(f.node, self.classes[f.extra], args, kwargs)
            elif f.kind == "class":
                out |= self.instantiate(f.node, args, kwargs, spread)
        if ast.unparse(node.func) in ("copy.copy", "copy.deepcopy", "deepcopy", "dict") and args:
            out |= {v for v in args[0] if isinstance(v, Key)}
        return frozenset(out)

    def instantiate(self, cls, args, kwargs, spread):
        if self.is_model(cls):
            fields = self.model_fields(cls)
            for vals in spread:
                for v in vals:
                    if isinstance(v, Key):
                        self.models.add((v.path, cls.name))
                        self.read_keys([v], [Lit(k) for k in fields])
        else:
            init = self.method(self.mro(cls), "__init__")
            if init is not None:
                self.call(init, cls, args, kwargs)
        return frozenset([Ref("inst", cls)])

    def call(self, fn, self_cls, args, kwargs):
        def followed(vals):
            return any(isinstance(v, Key) or (isinstance(v, Ref) and v.kind in ("inst", "seq", "dict", "items"))
                       for v in vals)

        if self_cls is None and not any(followed(a) for a in list(args) + list(kwargs.values())):
            return EMPTY
        positional = fn.args.posonlyargs + fn.args.args
        params = [a.arg for a in positional]
        static = any(isinstance(d, ast.Name) and d.id == "staticmethod" for d in fn.decorator_list)
        env = {}
        if self_cls is not None and params and not static:
            env[params.pop(0)] = frozenset([Ref("inst", self_cls)])
        for p, a in zip(params, args):
            env[p] = a
        names = set(params) | {a.arg for a in fn.args.kwonlyargs}
        env.update((k, v) for k, v in kwargs.items() if k in names)
        defaults = list(zip(positional[len(positional) - len(fn.args.defaults):], fn.args.defaults))
        defaults += [(a, d) for a, d in zip(fn.args.kwonlyargs, fn.args.kw_defaults) if d is not None]
        for a, d in defaults:
            if a.arg not in env:
                env[a.arg] = self.eval(d, Frame(self.owner[id(fn)], {}))
        for p in names | {a.arg for a in (fn.args.vararg, fn.args.kwarg) if a is not None}:
            env.setdefault(p, EMPTY)
        sig = (id(fn), id(self_cls), tuple(sorted(env.items(), key=lambda kv: kv[0])))
        if sig in self.memo:
            return self.memo[sig]
        if sig in self.busy:
            return EMPTY
        self.busy.add(sig)
        fr = Frame(self.owner[id(fn)], env, fn, self_cls)
        self.block(fn.body, fr)
        self.busy.discard(sig)
        self.memo[sig] = frozenset(fr.returns)
        return self.memo[sig]

    # statements ------------------------------------------------------------------------------------
    def block(self, stmts, fr):
        for st in stmts:
            self.stmt(st, fr)

    def stmt(self, st, fr):
        if isinstance(st, ast.Assign):
            vals = self.eval(st.value, fr)
            for t in st.targets:
                self.bind(t, vals, fr)
        elif isinstance(st, ast.AnnAssign):
            if st.value is not None:
                self.bind(st.target, self.eval(st.value, fr), fr)
        elif isinstance(st, ast.AugAssign):
            self.eval(st.value, fr)
        elif isinstance(st, ast.Expr):
            self.eval(st.value, fr)
        elif isinstance(st, ast.Return):
            if st.value is not None:
                fr.returns |= self.eval(st.value, fr)
        elif isinstance(st, ast.If):
            self.eval(st.test, fr)
            start = dict(fr.env)
            self.block(st.body, fr)
            after_body, fr.env = fr.env, dict(start)
            self.block(st.orelse, fr)
            fr.merge(after_body, fr.env)
        elif isinstance(st, (ast.For, ast.AsyncFor, ast.While)):
            start = dict(fr.env)
            if isinstance(st, ast.While):
                self.eval(st.test, fr)
                items = [None]
            else:
                items = list(self.iterate(self.eval(st.iter, fr)))
            ends = [start]
            for item in items:
                for _ in range(2):  # the second pass sees what the first one assigned
                    fr.merge(start, *ends[1:])
                    if item is not None:
                        self.bind(st.target, item, fr)
                    self.block(st.body, fr)
                    ends.append(fr.env)
            fr.merge(*ends)
            self.block(st.orelse, fr)
        elif isinstance(st, (ast.With, ast.AsyncWith)):
            for item in st.items:
                self.eval(item.context_expr, fr)
                if item.optional_vars is not None:
                    self.bind(item.optional_vars, EMPTY, fr)
            self.block(st.body, fr)
        elif isinstance(st, ast.Try):
            start = dict(fr.env)
            self.block(st.body, fr)
            self.block(st.orelse, fr)
            ends = [start, fr.env]
            for h in st.handlers:
                fr.merge(*ends[:2])
                self.block(h.body, fr)
                ends.append(fr.env)
            fr.merge(*ends)
            self.block(st.finalbody, fr)
        elif isinstance(st, ast.Assert):
            self.eval(st.test, fr)
        elif isinstance(st, ast.Raise) and st.exc is not None:
            self.eval(st.exc, fr)
        elif isinstance(st, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            fr.env[st.name] = frozenset([Ref("class" if isinstance(st, ast.ClassDef) else "func", st)])
        elif isinstance(st, ast.ImportFrom):
            src = self.absolute(st.module, st.level, fr.module)
            for alias in st.names:
                if alias.name != "*":
                    fr.env[alias.asname or alias.name] = self.binding_value(("from", src, alias.name))
        elif isinstance(st, ast.Import):
            for alias in st.names:
                local = alias.asname or alias.name.split(".")[0]
                fr.env[local] = self.module_ref(alias.name if alias.asname else local)

    # entry point -----------------------------------------------------------------------------------
    def run(self, roots):
        """Analyse from `roots` (see DEEPSPEED_ROOTS) to a fixpoint; returns the read key paths."""
        sys.setrecursionlimit(max(sys.getrecursionlimit(), 20000))
        while True:
            self.changed, self.memo = False, {}
            for modname, qualname, arg in roots:
                vals = self.global_value(modname, qualname)
                targets = [v for v in vals if isinstance(v, Ref) and v.kind in ("class", "func")]
                if not targets:
                    raise ValueError(f"entry point {modname}.{qualname} not found")
                cfg = frozenset([Key(())])
                args, kwargs = ([EMPTY] * arg + [cfg], {}) if isinstance(arg, int) else ([], {arg: cfg})
                for v in targets:
                    if v.kind == "class":
                        self.instantiate(v.node, args, kwargs, [])
                    else:
                        self.call(v.node, None, args, kwargs)
            if not self.changed:
                return self.reads


def read_sdist(path: str, version: str) -> dict[str, str]:
    """The Python files under deepspeed/ of an sdist, by path relative to its top directory."""
    files = {}
    top = f"deepspeed-{version}/"
    with tarfile.open(path) as tar:
        for member in tar.getmembers():
            if not member.isfile() or not member.name.startswith(top):
                continue
            rel = member.name[len(top):]
            if rel in ("PKG-INFO", "version.txt") or (rel.startswith("deepspeed/") and rel.endswith(".py")):
                files[rel] = tar.extractfile(member).read().decode("utf-8")
    if f"\nVersion: {version}\n" not in files.get("PKG-INFO", ""):
        raise ValueError(f"{path}: PKG-INFO is not for version {version}")
    if files.get("version.txt", "").strip() != version:
        raise ValueError(f"{path}: version.txt is not {version}")
    return files


def deepspeed_keys(files: dict[str, str], version: str) -> tuple[list[str], list[str]]:
    """(top-level keys, zero_optimization keys) the release reads, sorted."""
    reads = KeyReads(files).run(DEEPSPEED_ROOTS)
    tables = {
        "top": {p[0] for p in reads},
        "zero": {p[1] for p in reads if len(p) > 1 and p[0] == "zero_optimization"},
    }
    for (table, v), (added, removed, _why) in DEEPSPEED_OVERRIDES.items():
        if v != version:
            continue
        if set(added) & tables[table] or set(removed) - tables[table]:
            raise ValueError(f"stale override {(table, v)}: the extraction already does it")
        tables[table] = (tables[table] | set(added)) - set(removed)
    return sorted(tables["top"]), sorted(tables["zero"])


# ---------------------------------------------------------------------------------------------------
# Rendering. tests/upstream_tables.rs mirrors render_* and fill() line by line: change both together.

# The generated file around the tables; `@@NAME@@` lines stand for the rendered entries of the table
# NAME, `@@DIGEST@@` for the sha256 of the whole file with that field set to 64 zeros.
TEMPLATE = r"""// @generated by conformance/extract_upstream.py; do not edit.
// Regenerate: `python3 conformance/extract_upstream.py` (conformance/README.md, "Upstream key
// tables"). tests/upstream_tables.rs checks that this file is the script's rendering of its
// constants, and this digest (sha256 of the file with the 64 hex digits below set to 0):
// @@DIGEST@@

//! Per-release key sets of transformers' `TrainingArguments` and of the DeepSpeed config, extracted
//! from the released packages on PyPI by `conformance/extract_upstream.py` (names re-typed by the
//! script; no upstream code is copied). Hand-curated knowledge about these keys (renames, per-key
//! notes, keys only on DeepSpeed master, the strict DeepSpeed sections) is in [`super::upstream`],
//! which takes its newest lists (`DEEPSPEED_TOP_LEVEL`, the strict `zero_optimization` keys,
//! `TRAINING_ARGUMENTS_FIELDS`) from the last entries here.
//!
//! # transformers
//!
//! Source: the PyPI wheel `transformers==X` (fetched with `pip download`), file
//! `transformers/training_args.py` (`src/transformers/training_args.py` in the repository), parsed
//! with Python's `ast`: every annotated assignment in the body of `class TrainingArguments` (a
//! `@dataclass` with no base class, so these are all its dataclass fields; the script stops if that
//! changes). Versions: 4.6.1, 4.24.0, 4.30.0, 4.41.0, 4.46.0 (a yanked
//! release on PyPI, yanked only for Python 3.8), 4.48.0, 4.52.1, 4.57.6, 5.0.0, 5.24.0, 5.25.0.
//!
//! * Excluded: `field(init=False)` fields (`_n_gpu`, 4.6.1 … 4.57.6: not an `__init__` argument, so
//!   passing it raises `TypeError`) and `ClassVar`s (none so far). Plain class attributes without
//!   an annotation (`framework`, `default_optim`, `_VALID_DICT_FIELDS`) are not fields.
//! * Default: `Some(repr)` when the dataclass default (`= X` or `field(default=X)`) is a Python
//!   literal (`ast.literal_eval` succeeds), written as Python's `repr` (so `Some("None")` is a
//!   literal `None` default and `Some("'no'")` the string `no`). `None` when there is no literal
//!   default: a `default_factory`, a non-literal expression, or no default at all (`output_dir` is
//!   required up to 4.46.0); `default_notes` then says which. These are the dataclass defaults,
//!   before `__post_init__` (which rewrites some of them, e.g. `report_to` and `logging_dir` in
//!   4.x).
//! * Type annotations differ between versions; notably `warmup_steps` is `int` up to 4.57.6 and
//!   `float` in 5.0.0, 5.24.0 and 5.25.0 (a value in [0, 1) is then a ratio).
//!
//! # DeepSpeed
//!
//! Source: the PyPI sdists `deepspeed==X` (0.3.16, 0.4.5, 0.5.10, 0.6.7, 0.7.7, 0.8.3, 0.9.5, 0.10.3,
//! 0.11.2, 0.12.6, 0.13.5, 0.14.0, 0.14.2, 0.14.5, 0.15.0, 0.15.4, 0.16.0, 0.16.9, 0.17.0, 0.17.6,
//! 0.18.0, 0.18.9, 0.19.0, 0.19.5, 0.19.8: the last of each minor series, the first too from 0.14; fetched
//! from the index with their sha256 checked; `version.txt` and `PKG-INFO` checked). The script follows the
//! ds_config dict with Python's `ast` from `deepspeed/runtime/config.py:DeepSpeedConfig.__init__`
//! (`_initialize_params`, `_do_warning_check` and every `get_*` reader and section config they
//! reach: zero, elasticity, activation checkpointing, flops profiler, aio, autotuning, monitor,
//! comm, compression, data_pipeline, nebula, compile, precision, timers, tensor_parallel, …) and
//! from `deepspeed/__init__.py:initialize` (which reads `data_parallel_size` and
//! `sequence_parallel_size` from 0.15.0 on), through
//! calls, instance attributes and constants resolved through the modules' imports. A key is listed
//! when its value is read (`d[k]`, `d.get(k)`, `d.pop(k)`); a membership test alone (`k in d`) does
//! not count. `Model(**d)` with a pydantic model lists every field name and alias of the model.
//!
//! * Top level: DeepSpeed reads it with `dict.get` in every version listed, so an unknown top-level
//!   key is silently ignored; a key missing from a version's list is one that version does not
//!   read. 0.19.8 no longer reads the sections of the features it removed (`amp`, `sparse_attention`,
//!   …, and `zero_optimization`'s `mics_*` and `zeropp_loco_param`): it refuses them ("… has been
//!   removed", `runtime/config.py:_reject_removed_config_keys`), which R0909 reports
//!   (`rules::compat::REMOVED_KEYS`), so the key checks pass over them.
//! * `zero_optimization`: up to 0.5.10 it is a plain dict read with `dict.get` (unknown keys
//!   ignored); from 0.7.7 on (first sampled: 0.7.7; [`super::upstream`] dates it to
//!   v0.7.0) it is the pydantic model `DeepSpeedZeroConfig` (`extra = "forbid"`, field names and
//!   aliases both accepted, deprecated fields accepted with a warning): an unknown key is an error.
//!   Listed: the keys the version reads (≤ 0.5.10) or accepts (≥ 0.7.7: every field name and alias,
//!   deprecated ones included).

pub use super::upstream::HfFields;

/// `TrainingArguments` dataclass fields of sampled transformers releases, sorted by version
/// (numeric); fields sorted (byte order), no duplicates. Source: PyPI wheel `transformers==X`,
/// `src/transformers/training_args.py` (see the module doc).
#[rustfmt::skip]
pub const TRAINING_ARGUMENTS_BY_VERSION: &[HfFields] = &[
@@TRAINING_ARGUMENTS_BY_VERSION@@
];

/// Top-level ds_config keys each DeepSpeed release reads: (version, keys), sorted by version
/// (numeric); keys sorted (byte order), no duplicates. Source: PyPI sdist `deepspeed==X`,
/// `deepspeed/runtime/config.py`, `deepspeed/runtime/constants.py` and the section readers it calls
/// (see the module doc). The last entry is [`super::upstream`]'s `DEEPSPEED_TOP_LEVEL`.
///
/// Not listed, by the rules above: `eigenvalue` (0.5.10 … 0.19.5 read it only nested inside
/// `quantize_training`); `quantize_training` from 0.7.7 to 0.19.0 (`get_eigenvalue_config` refers to
/// an undefined `QUANTIZE_TRAINING` constant there, so the section is never read: with compression
/// weight quantization on, DeepSpeed raises `NameError`); `reduce_scatter` at top level (0.3.16 has
/// an unused `get_zero_reduce_scatter` reader, never called).
#[rustfmt::skip]
pub const DEEPSPEED_TOP_LEVEL_BY_VERSION: &[(&str, &[&str])] = &[
@@DEEPSPEED_TOP_LEVEL_BY_VERSION@@
];

/// Keys inside `zero_optimization` per DeepSpeed release: (version, keys), sorted by version
/// (numeric); keys sorted (byte order), no duplicates. 0.3.16 and 0.5.10: the keys
/// `DeepSpeedZeroConfig._initialize` and `offload_config.py` read from the plain dict (others are
/// silently ignored). From 0.7.7 on: every field name and alias of the strict pydantic
/// model `DeepSpeedZeroConfig` (anything else is rejected, except a key whose value is the string
/// `"auto"`, which is dropped before validation); the last entry is [`super::upstream`]'s strict
/// `zero_optimization` section. Source: PyPI sdist `deepspeed==X`,
/// `deepspeed/runtime/zero/{config,constants,offload_config}.py`.
///
/// Not listed, by the rules above: `cpu_offload_use_pin_memory` in 0.3.16 and 0.5.10 (named only in
/// a deprecation check, `old_key in zero_config_dict`; its value is never read).
#[rustfmt::skip]
pub const DEEPSPEED_ZERO_KEYS_BY_VERSION: &[(&str, &[&str])] = &[
@@DEEPSPEED_ZERO_KEYS_BY_VERSION@@
];
"""


def rust_str(s: str) -> str:
    if not s.isprintable():
        raise ValueError(f"unprintable string {s!r}")
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"') + '"'


def render_training_arguments(releases: list[tuple[str, list[tuple[str, str | None, str | None]]]]) -> list[str]:
    out = []
    for version, rows in releases:
        out.append(f"    // transformers=={version} (PyPI wheel), transformers/training_args.py: "
                   f"{len(rows)} fields")
        out.append("    HfFields {")
        out.append(f"        version: {rust_str(version)},")
        out.append("        fields: &[")
        for name, default, _ in rows:
            value = "None" if default is None else f"Some({rust_str(default)})"
            out.append(f"            ({rust_str(name)}, {value}),")
        out.append("        ],")
        notes = [(name, note) for name, _, note in rows if note is not None]
        if notes:
            out.append("        default_notes: &[")
            out.extend(f"            ({rust_str(name)}, {rust_str(note)})," for name, note in notes)
            out.append("        ],")
        else:
            out.append("        default_notes: &[],")
        out.append("    },")
    return out


def render_keys(releases: list[tuple[str, list[str]]]) -> list[str]:
    out = []
    for version, keys in releases:
        out.append(f"    // deepspeed=={version} (PyPI sdist): {len(keys)} keys")
        out.append("    (")
        out.append(f"        {rust_str(version)},")
        out.append("        &[")
        out.extend(f"            {rust_str(k)}," for k in keys)
        out.append("        ],")
        out.append("    ),")
    return out


def fill(tables: dict[str, list[str]]) -> str:
    lines = []
    for line in TEMPLATE.split("\n"):
        name = line[2:-2] if len(line) > 4 and line.startswith("@@") and line.endswith("@@") else None
        lines.extend(tables.pop(name) if name else [line])
    if tables:
        raise ValueError(f"tables without a place in TEMPLATE: {sorted(tables)}")
    text = "\n".join(lines).replace("@@DIGEST@@", "0" * 64)
    return text.replace("0" * 64, hashlib.sha256(text.encode()).hexdigest(), 1)


# ---------------------------------------------------------------------------------------------------


def check_sorted(name: str, items: list[str]) -> None:
    if any(not k.isascii() for k in items) or items != sorted(set(items)):
        raise ValueError(f"{name}: not sorted, unique ASCII")


def generate(offline: bool) -> str:
    cache = cache_dir()
    hf = []
    for version in TRANSFORMERS_VERSIONS:
        path = transformers_wheel(cache, version, offline)
        rows = training_arguments(read_wheel(path, version))
        check_sorted(f"transformers {version}", [r[0] for r in rows])
        print(f"transformers {version}: {len(rows)} fields ({os.path.basename(path)} sha256 {sha256_of(path)})",
              file=sys.stderr)
        hf.append((version, rows))
    top, zero = [], []
    for version in DEEPSPEED_VERSIONS:
        path = sdist(cache, "deepspeed", version, offline)
        t, z = deepspeed_keys(read_sdist(path, version), version)
        check_sorted(f"deepspeed {version} top", t)
        check_sorted(f"deepspeed {version} zero", z)
        print(f"deepspeed {version}: {len(t)} top-level keys, {len(z)} zero_optimization keys "
              f"({os.path.basename(path)} sha256 {sha256_of(path)})", file=sys.stderr)
        top.append((version, t))
        zero.append((version, z))
    return fill({
        "TRAINING_ARGUMENTS_BY_VERSION": render_training_arguments(hf),
        "DEEPSPEED_TOP_LEVEL_BY_VERSION": render_keys(top),
        "DEEPSPEED_ZERO_KEYS_BY_VERSION": render_keys(zero),
    })


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--check", action="store_true", help=f"exit 1 when {OUTPUT} differs from the output")
    mode.add_argument("--stdout", action="store_true", help="print the generated file")
    parser.add_argument("--offline", action="store_true", help="use the download cache only")
    args = parser.parse_args()
    text = generate(args.offline)
    path = os.path.join(REPO, OUTPUT)
    if args.stdout:
        sys.stdout.write(text)
        return 0
    with open(path, encoding="utf-8") as f:
        current = f.read()
    if args.check:
        if current != text:
            print(f"{OUTPUT} is not the script's output: run python3 conformance/extract_upstream.py",
                  file=sys.stderr)
            return 1
        print(f"{OUTPUT} is up to date", file=sys.stderr)
        return 0
    if current != text:
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
        print(f"wrote {OUTPUT}", file=sys.stderr)
    else:
        print(f"{OUTPUT} unchanged", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
