#!/usr/bin/env python3
"""Deterministically generates the old-stack corpus: recipes targeting the seed article's
stacks, which legacy.py runs through those releases' own config code (legacy_run.py).

    gen_legacy.py [--recipe BIN] [--count N] [--out DIR]

Writes ``OUT/<stack>/NNN-<slug>.rcp`` (default OUT: conformance/corpus-legacy) for each stack of
``STACKS``, and ``OUT/<stack>-rejected/``: recipes our checker rejects for that release, each
with an accepted base recipe and the patch of its artefacts (make_cases.py's format). The axes are gen_corpus.py's, narrowed to what those releases have: the schedules
both sides knew then (no ``cosine_with_min_lr`` / ``warmup_stable_decay`` / ``inverse_sqrt`` /
``WarmupCosineLR``), ZeRO 0–3 with CPU optimizer offload, fp32 / fp16 (and bf16 for
transformers 4.24), world sizes 1–64. With ``--recipe BIN`` every candidate is checked and one
our checker rejects is dropped and printed (e.g. HF's scheduler with DeepSpeed's optimizer on
transformers 4.6.1, R0413), so the corpus only holds recipes `recipe build` writes.

Only the standard library is used.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import sys
from pathlib import Path

from gen_corpus import (MODEL, batch_line, check_errors, fmt_num, kept, pick_samples,
                        schedule_block, steps_of)

HERE = Path(__file__).resolve().parent
SEED = 20261201

# stack name (as legacy.py) → (target line, precisions)
STACKS = {
    "transformers-4.6.1+deepspeed-0.3.16": ('target transformers "4.6.1", deepspeed "0.3.16"',
                                            ["fp32", "fp16"]),
    "transformers-4.24.0+deepspeed-0.7.7": ('target transformers "4.24.0", deepspeed "0.7.7"',
                                            ["fp32", "fp16", "bf16"]),
    "transformers-4.24.0+deepspeed-0.8.3": ('target transformers "4.24.0", deepspeed "0.8.3"',
                                            ["fp32", "fp16", "bf16"]),
}
HF_KINDS = ["linear", "cosine", "cosine_with_restarts", "polynomial", "constant",
            "constant_with_warmup"]
DS_KINDS = ["WarmupLR", "WarmupDecayLR", "OneCycle", "LRRangeTest"]
KINDS = HF_KINDS + DS_KINDS
ZEROS = [(0, "none"), (1, "none"), (2, "none"), (2, "cpu"), (3, "none"), (3, "cpu"),
         (1, "cpu")]
WORLDS = [(1, 1), (2, 1), (4, 1), (8, 1), (2, 2), (3, 1), (8, 4), (8, 8)]
BATCH_MODES = ["micro", "micro+acc", "micro+acc+global", "global+acc"]
LRS = [1e-5, 2e-5, 3e-5, 5e-5, 1e-4]


def gen_case(i: int, rng: random.Random, target: str, precisions: list[str]) -> tuple[str, str]:
    kind = KINDS[i % len(KINDS)]
    stage, off = ZEROS[(i // 2) % len(ZEROS)]
    precision = precisions[(i // 3) % len(precisions)]
    gpus, nodes = WORLDS[(i * 3 + i // 8) % len(WORLDS)]
    world = gpus * nodes
    mode = BATCH_MODES[(i // 5) % len(BATCH_MODES)]
    micro = rng.choice([1, 2, 4, 8, 16])
    acc = rng.choice([2, 3, 4]) if mode != "micro" else 1
    epochs = [1, 2, 3][(i // 4) % 3]
    short = i % 4 != 3
    samples = pick_samples(rng, micro, world, acc, epochs, short)
    _, _, total_guess = steps_of(samples, micro, world, acc, epochs)
    lr = rng.choice(LRS)
    # DeepSpeed's optimizer unless the schedule is HF's: transformers 4.6.1 cannot combine
    # DeepSpeed's optimizer with HF's scheduler (R0413); every fourth HF schedule keeps it anyway
    # (4.24 can), and the checker drops what a release cannot run.
    owner_hf = kind in HF_KINDS and i % 4 != 1

    lines = [f'recipe "l{i:03d}"', target, MODEL,
             f'data {{ train = "train.jsonl", samples = {samples} }}']
    lines.append(batch_line(mode, micro, acc, world))
    opt = [f"lr = {fmt_num(lr)}"]
    if rng.random() < 0.5:
        opt.append(f"weight_decay = {rng.choice(['0.0', '0.01', '0.1'])}")
    if rng.random() < 0.3:
        opt.append("betas = (0.9, 0.98)")
    if owner_hf:
        opt.append("owner = hf")
    lines.append(f"optimizer {'adam' if i % 7 == 3 else 'adamw'} {{ {', '.join(opt)} }}")
    lines.append(schedule_block(rng, kind, i, lr, total_guess))
    train = [f"epochs = {epochs}", f"precision = {precision}"]
    if rng.random() < 0.3:
        train.append(f"clip = {rng.choice(['0.5', '2.0'])}")
    if precision == "fp16" and rng.random() < 0.3:
        train.append(f"loss_scale = {rng.choice(['dynamic', '1024'])}")
    lines.append(f"train {{ {', '.join(train)} }}")
    z = []
    if off != "none":
        z.append(f"offload optimizer = {off}")
    if stage >= 1 and rng.random() < 0.3:
        z.append(f"overlap_comm = {rng.choice(['true', 'false'])}")
    lines.append(f"zero {stage} {{ {', '.join(z)} }}" if z else f"zero {stage}")
    if world > 1:
        lines.append(f"cluster {{ gpus = {gpus}, nodes = {nodes} }}")
    slug = f"{kind}-z{stage}{'c' if off != 'none' else ''}-{precision}-w{world}-" \
           f"{mode.replace('+', '_')}{'-hfopt' if owner_hf else ''}"
    return slug, "\n".join(lines) + "\n"


# Recipes our checker rejects for these releases (one per rule), as gen_corpus.py's REJECTED:
# the base recipe is built, the patch turns its artefacts into what the rejected recipe states,
# and legacy_run.py records what the old release does with them.
#   silent_lr: the release runs the base's learning rates, not the rejected recipe's.
#   raise:     the release stops (message containing `match`); the base is the control.
def rejected_cases(target: str) -> list[dict]:
    head = (f'{target}\n{MODEL}\ndata {{ train = "train.jsonl", samples = 1000 }}\n'
            "batch { micro = 8, accumulate = 2 }\ntrain { epochs = 2, precision = fp16 }\n"
            "cluster { gpus = 4 }\nzero 2\n")
    opt = "optimizer adamw { lr = 3e-5, owner = hf }\n"
    return [
        dict(slug="R0312-cosine-num-cycles", code="R0312", expect="silent_lr",
             why="no lr_scheduler_kwargs: HF's cosine runs with num_cycles 0.5, not 1.5",
             text=head + opt + "schedule cosine { warmup = 10, num_cycles = 1.5 }\n",
             base=head + opt + "schedule cosine { warmup = 10 }\n", patch=[]),
        dict(slug="R0312-polynomial-power", code="R0312", expect="silent_lr",
             why="no lr_scheduler_kwargs: HF's polynomial decay runs with power 1 and lr_end 1e-7",
             text=head + opt + "schedule polynomial { warmup = 10, power = 2.0, lr_end = 1e-6 }\n",
             base=head + opt + "schedule polynomial { warmup = 10 }\n", patch=[]),
        dict(slug="R0313-inverse-sqrt", code="R0313", expect="raise",
             engine_match="is not a valid SchedulerType",
             why="SchedulerType has no inverse_sqrt before transformers 4.27.0",
             text=head + opt + "schedule inverse_sqrt { warmup = 10 }\n",
             base=head + opt + "schedule linear { warmup = 10 }\n",
             patch=[{"file": "training_args.json", "set": "lr_scheduler_type",
                     "value": "inverse_sqrt"}]),
    ] + ([] if "0.3.16" not in target else [
        # DeepSpeed < 0.5.5 only: the cycle (2 × 10 steps) ends well before the 126 steps.
        dict(slug="R0314-one-cycle-zero-decay", code="R0314", expect="raise",
             engine_match="division by zero",
             why="OneCycle divides by decay_step_size = 0 after the cycle before DeepSpeed 0.5.5",
             text=head + "optimizer adamw { lr = 3e-5 }\n"
                  "schedule OneCycle { cycle_min_lr = 3e-6, cycle_first_step_size = 10, "
                  "cycle_momentum = false }\n",
             base=head + "optimizer adamw { lr = 3e-5 }\n"
                  "schedule OneCycle { cycle_min_lr = 3e-6, cycle_first_step_size = 10, "
                  "cycle_momentum = false, decay_step_size = 1, decay_lr_rate = 0 }\n",
             patch=[{"file": "ds_config.json", "set": "scheduler.params.decay_step_size",
                     "value": 0}]),
    ] + legacy_seed_rejected(target)) + ([] if "0.7.7" not in target else [
        # WarmupCosineLR came with DeepSpeed 0.12.3: 0.7.7 looks the name up in its own
        # schedulers and torch's and stops (the base's WarmupDecayLR, renamed by the patch).
        dict(slug="R0306-no-warmup-cosine", code="R0306", expect="raise",
             engine_match="DeepSpeed does not recognize LR scheduler WarmupCosineLR",
             why="DeepSpeed 0.7.7 has no WarmupCosineLR (added in 0.12.3)",
             text=head + "optimizer adamw { lr = 3e-5 }\nschedule WarmupCosineLR { warmup = 10 }\n",
             base=head + "optimizer adamw { lr = 3e-5 }\nschedule WarmupDecayLR { warmup = 10 }\n",
             patch=[{"file": "ds_config.json", "set": "scheduler.type",
                     "value": "WarmupCosineLR"}]),
    ]) + ([] if "0.8.3" not in target else [
        # DeepSpeed 0.8.3 added zero_force_ds_cpu_optimizer (default true): transformers 4.24
        # hands HF's optimizer to deepspeed.initialize, whose _configure_optimizer refuses it
        # under ZeRO-Offload. The base: DeepSpeed's AdamW (DeepSpeedCPUAdam under offload).
        dict(slug="R0408-client-optimizer-offload", code="R0408", expect="raise",
             engine_match="You are using ZeRO-Offload with a client provided optimizer",
             why="DeepSpeed 0.8.3 _configure_optimizer refuses a client optimizer with "
                 "ZeRO-Offload (zero_force_ds_cpu_optimizer)",
             text=head.replace("zero 2\n", "zero 2 { offload optimizer = cpu }\n")
                  + opt + "schedule linear { warmup = 10 }\n",
             base=head.replace("zero 2\n", "zero 2 { offload optimizer = cpu }\n")
                  + "optimizer adamw { lr = 3e-5 }\nschedule linear { warmup = 10 }\n",
             patch=[{"file": "ds_config.json", "del": "optimizer"},
                    {"file": "training_args.json", "set": "optim", "value": "adamw_torch"}]),
    ])


def legacy_seed_rejected(target: str) -> list[dict]:
    """Rules about transformers 4.6.1 / DeepSpeed 0.3.16 themselves (the seed article's stack)."""
    def head(zero: str, precision: str = "fp16") -> str:
        return (f'{target}\n{MODEL}\ndata {{ train = "train.jsonl", samples = 1000 }}\n'
                "batch { micro = 8, accumulate = 2 }\n"
                f"train {{ epochs = 2, precision = {precision} }}\ncluster {{ gpus = 4 }}\n{zero}\n")
    hf_opt = "optimizer adamw { lr = 3e-5, owner = hf }\nschedule linear { warmup = 10 }\n"
    ds_opt = "optimizer adamw { lr = 3e-5 }\n"
    ds_sched = "schedule WarmupDecayLR { warmup = 10, warmup_type = log }\n"
    return [
        dict(slug="R0412-offload-hf-optimizer", code="R0412", expect="raise",
             engine_match="ZeRO Offload can only work with DeepSpeed optimizers",
             why="transformers 4.6.1 deepspeed_init refuses HF's optimizer with ZeRO-3 offload",
             text=head("zero 3 { offload optimizer = cpu }") + hf_opt,
             base=head("zero 3") + hf_opt,
             patch=[{"file": "ds_config.json", "set": "zero_optimization.offload_optimizer",
                     "value": {"device": "cpu", "pin_memory": True}}]),
        dict(slug="R0413-ds-optimizer-hf-scheduler", code="R0413", expect="raise",
             engine_match="HF scheduler + DeepSpeed optimizer combination is not possible",
             why="transformers 4.6.1 deepspeed_init cannot pair DeepSpeed's optimizer with HF's "
                 "scheduler",
             text=head("zero 2") + ds_opt + "schedule linear { warmup = 10 }\n",
             base=head("zero 2") + ds_opt + ds_sched,
             patch=[{"file": "ds_config.json", "del": "scheduler"}]),
        dict(slug="R0508-zero1-fp32", code="R0508", expect="raise",
             engine_match="ZeRO is only supported if fp16 is enabled",
             why="DeepSpeed 0.3.16 asserts fp16 for ZeRO stage 1",
             text=head("zero 1", "fp32") + ds_opt + ds_sched,
             base=head("zero 1") + ds_opt + ds_sched,
             patch=[{"file": "ds_config.json", "set": "fp16.enabled", "value": False},
                    {"file": "training_args.json", "set": "fp16", "value": False}]),
        # DeepSpeed 0.3.16 has no warmup_type: the compiler cannot write it, and the release
        # warms up logarithmically, as the base recipe says (no patch: same artefacts).
        dict(slug="R0307-linear-warmup-ignored", code="R0307", expect="silent_lr",
             why="DeepSpeed 0.3.16 has no warmup_type: WarmupDecayLR warms up logarithmically",
             text=head("zero 2") + ds_opt + "schedule WarmupDecayLR { warmup = 10 }\n",
             base=head("zero 2") + ds_opt + ds_sched,
             patch=[]),
        # What a bf16 recipe builds on a newer stack (`bf16` section, fp16 off); transformers
        # 4.6.1 has no `bf16` argument, so only the DeepSpeed side says it. DeepSpeed 0.3.16
        # parses neither section as on: the run is fp32.
        dict(slug="R0506-bf16-unsupported", code="R0506", expect="silent_precision",
             why="DeepSpeed 0.3.16 has no bf16: it ignores the section and trains in fp32",
             text=head("zero 2", "bf16") + ds_opt + ds_sched,
             base=head("zero 2") + ds_opt + ds_sched,
             patch=[{"file": "ds_config.json", "set": "fp16.enabled", "value": False},
                    {"file": "ds_config.json", "set": "bf16", "value": {"enabled": True}},
                    {"file": "training_args.json", "set": "fp16", "value": False}]),
    ]


def write_rejected(out: Path, stack: str, recipe: str | None) -> int:
    target, _ = STACKS[stack]
    d = out / f"{stack}-rejected"
    if d.exists():
        shutil.rmtree(d)
    d.mkdir(parents=True)
    cases = rejected_cases(target)
    for n, case in enumerate(cases):
        name = f"{n:03d}-{case['slug']}"
        (d / f"{name}.rcp").write_text(f'recipe "{case["slug"]}"\n' + case["text"])
        (d / f"{name}.base.rcp").write_text(f'recipe "{case["slug"]}-base"\n' + case["base"])
        meta = {k: v for k, v in case.items() if k not in ("text", "base")}
        meta["recipe"] = f"{name}.rcp"
        meta["base"] = f"{name}.base.rcp"
        if recipe:
            meta["checker_errors"] = check_errors(recipe, d / meta["recipe"])
            meta["base_checker_errors"] = check_errors(recipe, d / meta["base"])
            if case["code"] not in meta["checker_errors"] or meta["base_checker_errors"]:
                sys.exit(f"gen_legacy: {stack}: {name}: checker said {meta['checker_errors']}, "
                         f"base {meta['base_checker_errors']}")
        (d / f"{name}.json").write_text(json.dumps(meta, indent=1, sort_keys=True) + "\n")
    return len(cases)


def write_stack(out: Path, stack: str, count: int, recipe: str | None) -> list[str]:
    target, precisions = STACKS[stack]
    d = out / stack
    if d.exists():
        shutil.rmtree(d)
    d.mkdir(parents=True)
    rng = random.Random(f"{SEED}-{stack}")
    written, dropped = [], []
    i = 0
    while len(written) < count:
        if i > count * 4:
            sys.exit(f"gen_legacy: {stack}: too many candidates rejected ({len(dropped)})")
        slug, text = gen_case(i, rng, target, precisions)
        i += 1
        name = f"{len(written):03d}-{slug}"
        path = d / f"{name}.rcp"
        path.write_text(text)
        if not kept(recipe, path, name, dropped):
            continue
        written.append(name)
    for name, errs in dropped:
        print(f"gen_legacy: {stack}: dropped candidate {name}: {', '.join(errs)}",
              file=sys.stderr)
    return written


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--recipe", help="recipe binary: drop candidates `recipe check` rejects")
    ap.add_argument("--count", type=int, default=30)
    ap.add_argument("--out", type=Path, default=HERE / "corpus-legacy")
    a = ap.parse_args()
    for stack in STACKS:
        names = write_stack(a.out, stack, a.count, a.recipe)
        n = write_rejected(a.out, stack, a.recipe)
        print(f"gen_legacy: {len(names)} recipes in {a.out / stack}, {n} rejected")


if __name__ == "__main__":
    main()
