#!/usr/bin/env python3
"""Runs the hand-written (DeepSpeed config, TrainingArguments) pairs of `pairs/` through the REAL
transformers / accelerate / DeepSpeed chain of harness.py and writes one fixture per pair.

    pairs.py [--only SUBSTR] [--check]

Each `pairs/<name>/` holds `ds_config.json`, `case.json` and either `training_args.json` or
`args.txt` (TrainingArguments as command-line flags). The arguments are parsed the way HF's
example scripts do (`run_classification.py`: one `HfArgumentParser` over the script's own
arguments and TrainingArguments) — `parse_json_file` or `parse_args_into_dataclasses(args=...)`,
both refusing what no dataclass takes ("Some keys / specified arguments are not used by the
HfArgumentParser") — into harness.py's TrainingArguments class for the pair's world size, with `output_dir` added when absent and
`deepspeed` set to the pair's `ds_config.json`. An error there is recorded with stage "S0" when
the parser itself raises (unused keys, argparse's own errors) and "S1" when TrainingArguments'
construction inside the parser raises; the chain stops there. Otherwise the built arguments go
through `harness.run_chain`. Writes `fixtures/pairs/<name>.json` (format in README.md,
"Pairs"); `--check` compares with the committed fixtures instead (exit 1 on a difference).
"""

from __future__ import annotations

import argparse
import dataclasses
import enum
import json
import os
import shlex
import sys
import tempfile
import traceback
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import harness  # noqa: E402
from transformers import HfArgumentParser  # noqa: E402

FORMAT = "recipe-pair-fixture/1"
PAIRS = HERE / "pairs"
OUT = HERE / "fixtures" / "pairs"

ARG_FIELDS = ["per_device_train_batch_size", "gradient_accumulation_steps", "learning_rate",
              "adam_beta1", "adam_beta2", "adam_epsilon", "weight_decay", "max_grad_norm",
              "num_train_epochs", "max_steps", "warmup_steps", "warmup_ratio", "lr_scheduler_type",
              "lr_scheduler_kwargs", "fp16", "bf16", "eval_strategy", "save_strategy", "seed"]


def plain(v):
    """Enum members (SchedulerType, IntervalStrategy, …) as their values."""
    if isinstance(v, enum.Enum):
        return v.value
    if isinstance(v, dict):
        return {k: plain(x) for k, x in v.items()}
    return v


def parser_stage(e: BaseException) -> str:
    """S0 when the innermost frame is the parser's (hf_argparser.py, argparse.py), else S1
    (TrainingArguments.__init__ / __post_init__, called by the parser)."""
    tb = e.__traceback__
    last = None
    while tb is not None:
        last = tb.tb_frame.f_code.co_filename
        tb = tb.tb_next
    return "S0" if last and Path(last).name in ("hf_argparser.py", "argparse.py") else "S1"


@dataclasses.dataclass
class ScriptArguments:
    """The example script's own arguments (run_classification.py's ModelArguments and
    DataTrainingArguments, the ones launch scripts pass); values are not used here."""
    model_name_or_path: str | None = None
    config_name: str | None = None
    tokenizer_name: str | None = None
    cache_dir: str | None = None
    dataset_name: str | None = None
    dataset_config_name: str | None = None
    train_file: str | None = None
    validation_file: str | None = None
    test_file: str | None = None
    text_column_names: str | None = None
    label_column_name: str | None = None
    max_seq_length: int | None = None
    pad_to_max_length: bool = False
    max_train_samples: int | None = None
    max_eval_samples: int | None = None
    max_predict_samples: int | None = None
    preprocessing_num_workers: int | None = None
    model_revision: str | None = None
    trust_remote_code: bool = False


def build_args(pair: Path, world: int, errors: list, res: dict):
    """TrainingArguments as the example scripts' parser builds them, or None (error recorded)."""
    cls = harness.training_arguments_class(world)
    parser = HfArgumentParser((ScriptArguments, cls), prog="train.py")  # argparse's messages name the program
    ds = str(pair / "ds_config.json")
    if (pair / "training_args.json").exists():
        res["args_from"] = "training_args.json"
        data = json.loads((pair / "training_args.json").read_text())
        data.setdefault("output_dir", "output")
        data["deepspeed"] = ds
        tmp = Path("training_args.json")  # in the scratch directory (cwd)
        tmp.write_text(json.dumps(data))

        def call():
            return parser.parse_json_file(tmp)[1]
    else:
        res["args_from"] = "args.txt"
        toks = shlex.split((pair / "args.txt").read_text(), comments=True)
        if not any(t == "--output_dir" or t.startswith("--output_dir=") for t in toks):
            toks += ["--output_dir", "output"]
        toks += ["--deepspeed", ds]

        def call():
            out = parser.parse_args_into_dataclasses(args=toks, look_for_args_file=False)
            return out[1]
    q = harness.Quiet()
    try:
        with q, harness.gpu_bf16_for_training_arguments():
            return call()
    except SystemExit as e:  # argparse: "usage: …" and "train.py: error: <message>" on stderr
        lines = [ln for ln in q._e.getvalue().splitlines() if ln.strip()]
        msg = lines[-1].split(": error: ", 1)[-1] if lines else str(e.code)
        errors.append({"stage": "S0", "error": f"SystemExit: {msg}"})
    except Exception as e:  # noqa: BLE001
        errors.append({"stage": parser_stage(e), "error": harness.err_text(e)})
    return None


def run_pair(pair: Path) -> dict:
    case = json.loads((pair / "case.json").read_text())
    world = int(case["world_size"])
    res: dict = {"format": FORMAT, "case": pair.name, "versions": harness.VERSIONS,
                 "world_size": world, "samples": case["samples"],
                 "hidden_size": case["hidden_size"], "has_eval": case["has_eval"],
                 "args_from": None}
    errors: list = []
    extra: dict = {}
    args = build_args(pair, world, errors, extra)
    res["args_from"] = extra["args_from"]
    chain = None
    if args is not None:
        emitted = json.loads((pair / "ds_config.json").read_text())
        # want_lr: the scheduler is also built (DeepSpeed's from its section, else HF's
        # get_scheduler with the TrainingArguments), as the engine / Trainer would at train().
        n = len(errors)
        chain = harness.run_chain(emitted, {}, pair / "ds_config.json", case, {}, errors, True,
                                  args=args)
        # As run_chain does for DeepSpeed's validation: when the chain stopped with "auto" left
        # in the config, a DeepSpeed scheduler built from it fails on "auto" — never reached.
        if chain and chain["final"] is not None and "auto" in harness.flatten(chain["final"]).values():
            errors[n:] = [e for e in errors[n:] if e["stage"] != "deepspeed-scheduler"]
    res["verdict"] = "error" if errors else "ok"
    res["errors"] = errors
    res["final_config"] = chain["final"] if chain else None
    res["args"] = ({f: plain(getattr(args, f)) for f in ARG_FIELDS if hasattr(args, f)}
                   if args is not None else None)
    res["steps"] = chain["steps"] if chain else None
    return res


def render(res: dict) -> str:
    text = json.dumps(harness.jsonable(res), indent=1, sort_keys=False, ensure_ascii=True)
    return harness.portable(text) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", help="only pairs whose name contains this")
    ap.add_argument("--check", action="store_true",
                    help="compare with fixtures/pairs/ instead of writing (exit 1 on a difference)")
    a = ap.parse_args()
    pairs = sorted(p for p in PAIRS.iterdir() if (p / "case.json").exists())
    if a.only:
        pairs = [p for p in pairs if a.only in p.name]
    OUT.mkdir(parents=True, exist_ok=True)
    old = os.getcwd()
    os.chdir(tempfile.mkdtemp(prefix="recipe-pairs-"))  # output_dir and the parsed JSON go here
    counts: dict = {}
    differ = []
    try:
        for p in pairs:
            try:
                res = run_pair(p)
            except Exception:  # noqa: BLE001 — a bug of this script, not a verdict
                print(f"{p.name}: CRASH\n{traceback.format_exc()}", file=sys.stderr)
                return 2
            text = render(res)
            dest = OUT / f"{p.name}.json"
            if a.check:
                if not dest.exists() or dest.read_text() != text:
                    differ.append(p.name)
            else:
                dest.write_text(text)
            counts[res["verdict"]] = counts.get(res["verdict"], 0) + 1
            first = res["errors"][0] if res["errors"] else None
            print(f"{p.name}: {res['verdict']}"
                  + (f" [{first['stage']}] {harness.portable(first['error'])[:120]}" if first else ""))
    finally:
        os.chdir(old)
    if a.check and not a.only:
        known = {p.name for p in pairs}
        differ += [f.stem + " (no pair)" for f in sorted(OUT.glob("*.json")) if f.stem not in known]
    print(f"pairs: {sum(counts.values())} ({', '.join(f'{k} {v}' for k, v in sorted(counts.items()))})")
    if differ:
        print("differ from fixtures/pairs/: " + ", ".join(differ))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
