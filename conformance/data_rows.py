#!/usr/bin/env python3
"""Row counts of tricky data files: HF `datasets`' loaders against `recipe`.

The training script reads the data with `datasets.load_dataset("csv" | "json", data_files=…)`
(pandas for CSV/TSV, pyarrow for JSON Lines); `recipe explain` predicts the steps from its own
count of the same file, and `recipe run` trains on the rows its reader finds. This writes a set
of files that are easy to miscount (quoted newlines, a byte order mark, CRLF, blank lines, quoted
delimiters and header names, no final newline, a file that is one JSON array, one that datasets
takes for a list of strings) into `conformance/data-rows/`, counts each with the real loader (and
notes its columns) and with `recipe explain --format json`, and writes both counts to
`conformance/fixtures/data-rows.json`. tests/data_files.rs checks, without Python, that the
current scan (`recipe explain`'s count) and the runtime's reader still count what `datasets`
counted.

    conformance/.venv/bin/python conformance/data_rows.py --recipe target/release/recipe
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
FILES = HERE / "data-rows"
FIXTURE = HERE / "fixtures" / "data-rows.json"

TWO_LINES = "Lunch today?\nThe usual place, at noon."


def csv_field(text: str) -> str:
    return '"' + text.replace('"', '""') + '"'


# name → bytes. Every file has the columns `text` and `label` (labels `ham` / `spam`).
def files() -> dict[str, bytes]:
    rows = [(f'Row {i}: "{TWO_LINES}"' if i % 2 else f"Row {i}, plain", "spam" if i % 3 == 0 else "ham")
            for i in range(10)]
    out: dict[str, str] = {}
    out["quoted_newlines.csv"] = "text,label\n" + "".join(f"{csv_field(t)},{lab}\n" for t, lab in rows)
    out["bom_crlf.csv"] = "\ufefftext,label\r\n" + "".join(
        f"{csv_field(t.replace(chr(10), chr(13) + chr(10)))},{lab}\r\n" for t, lab in rows)
    out["blank_lines.csv"] = "text,label\n\n" + "".join(
        f"{csv_field(t)},{lab}\n\n" for t, lab in rows) + "\n\n"
    out["no_final_newline.csv"] = "text,label\n" + "\n".join(f"{csv_field(t)},{lab}" for t, lab in rows)
    out["quoted_header.csv"] = '"id, as written",text,label\n' + "".join(
        f'{i},{csv_field(t)},{lab}\n' for i, (t, lab) in enumerate(rows))
    out["only_quotes_span.csv"] = "text,label\n" + "".join(
        f'"{chr(10) * 3}",{lab}\n' for _, lab in rows)
    out["quoted_newlines.tsv"] = "text\tlabel\n" + "".join(
        f"{csv_field(t.replace(',', chr(9)))}\t{lab}\n" for t, lab in rows)
    out["blank_lines.jsonl"] = "\n" + "".join(
        json.dumps({"text": t, "label": lab}) + "\n\n" for t, lab in rows)
    out["bom_crlf.jsonl"] = "\ufeff" + "".join(
        json.dumps({"text": t, "label": lab}) + "\r\n" for t, lab in rows)
    out["no_final_newline.jsonl"] = "\n".join(json.dumps({"text": t, "label": lab}) for t, lab in rows)
    # Lines of spaces and tabs between rows: pandas and pyarrow skip them as blank lines.
    out["whitespace_lines.csv"] = "text,label\n" + "".join(
        f"{csv_field(t)},{lab}\n  \t \n" for t, lab in rows)
    out["whitespace_lines.jsonl"] = "".join(
        json.dumps({"text": t, "label": lab}) + "\n \t\n" for t, lab in rows)
    # A TSV line of spaces and a tab is a row of blank fields to pandas (the tab splits it), and
    # a CSV line of a bare delimiter is a row of empty fields; a CRLF whitespace line is blank.
    out["whitespace_lines.tsv"] = "text\tlabel\n" + "".join(
        f"{t.replace(chr(10), ' ')}\t{lab}\n  \t \n" for t, lab in rows)
    out["delimiter_only_lines.csv"] = "text,label\n" + "".join(
        f"{csv_field(t)},{lab}\n,\n" for t, lab in rows)
    out["whitespace_lines_crlf.csv"] = "text,label\r\n" + "".join(
        f"{csv_field(t.replace(chr(10), chr(13) + chr(10)))},{lab}\r\n \t\r\n" for t, lab in rows)
    # One JSON array of objects, which datasets' json loader reads whole when the file's first
    # byte (after a BOM) is `[`: pretty-printed, with a BOM and CRLF, and on one line in a .jsonl.
    objects = [{"text": t, "label": lab} for t, lab in rows]
    out["array.json"] = json.dumps(objects, indent=2) + "\n"
    out["array_bom_crlf.json"] = "\ufeff" + json.dumps(objects, indent=1).replace("\n", "\r\n")
    out["array_one_line.jsonl"] = json.dumps(objects)
    # What datasets takes for a list of strings (no `{` before the first `"` in the first 100
    # bytes): each element becomes the row {"text": element}, strings and objects alike.
    out["array_strings.json"] = json.dumps([t for t, _ in rows], indent=1) + "\n"
    out["array_padded.json"] = "[" + " " * 100 + json.dumps(objects) [1:] + "\n"
    return {name: text.encode("utf-8") for name, text in out.items()}


def hf_rows(path: Path) -> tuple[int, list[str]]:
    import datasets

    datasets.disable_progress_bars()
    ext = path.suffix
    with tempfile.TemporaryDirectory() as cache:
        if ext in (".jsonl", ".json"):
            ds = datasets.load_dataset("json", data_files=str(path), split="train", cache_dir=cache)
        else:
            kwargs = {"sep": "\t"} if ext == ".tsv" else {}
            ds = datasets.load_dataset("csv", data_files=str(path), split="train", cache_dir=cache,
                                       **kwargs)
    return ds.num_rows, ds.column_names


def recipe_rows(recipe: str, path: Path) -> int | None:
    with tempfile.TemporaryDirectory() as tmp:
        rcp = Path(tmp) / "rows.rcp"
        rcp.write_text('model bert { from = "bert-base-uncased", task = classify(labels: ["ham", "spam"]), '
                       'hidden_size = 768 }\n'
                       f'data {{ train = "{path}" }}\nbatch {{ micro = 2 }}\n')
        p = subprocess.run([recipe, "explain", "--format", "json", str(rcp)], capture_output=True,
                           text=True, env=dict(os.environ, RECIPE_SCAN_CACHE="0", NO_COLOR="1"))
        if p.returncode != 0:
            return None
        return json.loads(p.stdout)["steps"]["samples"]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--recipe", required=True, help="the recipe binary")
    a = ap.parse_args()
    FILES.mkdir(exist_ok=True)
    results = []
    for name, data in sorted(files().items()):
        path = FILES / name
        path.write_bytes(data)
        hf, columns = hf_rows(path)
        ours = recipe_rows(a.recipe, path.resolve())
        results.append({"file": f"data-rows/{name}", "datasets_rows": hf, "recipe_rows": ours,
                        "datasets_columns": columns,
                        "lines": data.count(b"\n") + (0 if data.endswith(b"\n") else 1)})
        print(f"data_rows: {name}: datasets {hf}, recipe {ours}")
    import datasets

    FIXTURE.write_text(json.dumps({"format": "recipe-conformance-data-rows/1",
                                   "datasets": datasets.__version__, "files": results},
                                  indent=1, sort_keys=True) + "\n")
    bad = [r["file"] for r in results if r["datasets_rows"] != r["recipe_rows"]]
    print(f"data_rows: {len(results)} files, disagreements: {bad}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
