#!/usr/bin/env python3
"""DeepSpeed's launcher on a set of hostfiles: what `recipe check` says about a hostfile (R1002,
R1003, R1004; src/rules/launch.rs) must be what the launcher does with it.

    launcher.py OUT.json            (run with conformance/.venv/bin/python; run.sh does)

Each hostfile text of ``HOSTFILES`` (the usual layouts and the edge cases of the launcher's
parser: comments, indentation, tabs, CRLF and lone-CR line ends, text after the slot count,
spaces around ``=``, duplicates, empty files) is written to a file as bytes and read by the
installed DeepSpeed's own ``deepspeed.launcher.runner.fetch_hostfile`` (which opens it in text
mode: universal newlines, as a launch does). Recorded per text: ``hosts`` (``[name, slots]`` in
order) or ``error`` (the exception's type and message). tests/conformance.rs (`our_hostfile_parser_agrees_with_deepspeeds_launcher`) parses the same texts
with `recipe`'s parser and compares.
"""

from __future__ import annotations

import json
import logging
import sys
import tempfile
from pathlib import Path

FORMAT = "recipe-conformance-hostfiles/1"

HOSTFILES = [
    "worker-1 slots=8\nworker-2 slots=8\n",
    "worker-1 slots=8",
    "# the cluster\n\nworker-1 slots=8\n\n# spare\nworker-2 slots=4\n",
    "   worker-1    slots=8   \n\tworker-2\tslots=16\n",
    "worker-1 slots=8 # a comment after the count\n",
    "worker-1 slots=8x\n",
    "worker-1 slots=08\n",
    "worker-1 slots=0\n",
    "10.0.0.1 slots=8\n10.0.0.2 slots=8\n",
    "worker-1 slots=8\r\nworker-2 slots=8\r\n",
    "worker-1 slots=8\rworker-2 slots=8\r",
    "worker-1 slots = 8\n",
    "worker-1 slots=\n",
    "worker-1\n",
    "worker-1:8\n",
    "slots=8\n",
    "worker-1 gpus=8\n",
    "worker-1 slots=8\nworker-1 slots=4\n",
    "worker-1 slots=8\n  worker-2 slots=8\nworker-2 slots=8\n",
    "",
    "\n\n",
    "# only comments\n# here\n",
    "worker-1 slots=8\nbad line here\n",
    "worker-1 extra slots=8\n",
    "  # indented comment\nworker-1 slots=2\n",
    "worker-1 slots=99999999999999999999999\n",
    "worker-1\u00a0slots=8\n",
]


def main() -> int:
    from deepspeed.launcher import runner

    logging.getLogger("DeepSpeed").setLevel(logging.CRITICAL)
    runner.logger.setLevel(logging.CRITICAL)
    out = []
    with tempfile.TemporaryDirectory(prefix="hostfiles-") as t:
        for i, text in enumerate(HOSTFILES):
            path = Path(t) / f"hostfile-{i}"
            path.write_bytes(text.encode("utf-8"))
            entry: dict = {"text": text}
            try:
                pool = runner.fetch_hostfile(str(path))
                entry["hosts"] = [[h, n] for h, n in pool.items()]
            except Exception as e:  # noqa: BLE001 — the launcher's refusal is the record
                entry["error"] = {"type": type(e).__name__, "message": str(e)}
            out.append(entry)
    import deepspeed
    doc = {"format": FORMAT, "deepspeed": deepspeed.__version__, "hostfiles": out}
    Path(sys.argv[1]).write_text(json.dumps(doc, indent=1, ensure_ascii=False) + "\n")
    print(f"launcher: {len(out)} hostfiles, "
          f"{sum('error' in e for e in out)} refused by DeepSpeed {deepspeed.__version__}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
