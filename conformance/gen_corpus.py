#!/usr/bin/env python3
"""Deterministically generates the conformance corpus.

    gen_corpus.py [--recipe BIN] [--count N] [--out DIR] [--rejected-out DIR]

* ``corpus/NNN-<slug>.rcp``: recipes that ``recipe check`` must accept (warnings allowed). The
  generator is seeded and walks fixed axes (schedule kind, ZeRO stage/offload, precision, batch
  shape, world size, warmup form, epochs), so the same generator writes the same files. Choices
  known to produce checker errors are never made; with ``--recipe BIN`` every candidate is also
  checked and a candidate that still has errors is dropped (and printed), so the corpus only
  holds accepted recipes.
* ``corpus-rejected/NNN-<slug>.rcp`` + ``.json``: recipes our checker rejects (one per rule). As
  ``recipe build`` writes nothing for a recipe with errors, each ``.json`` names an accepted
  *base* recipe (``base``, its text) and the edits (``patch``) that turn the base's artefacts into
  what the rejected recipe states; ``run.sh`` builds the base, applies the patch and hands the
  result to the harness, which records what the real libraries do with it.

Only the standard library is used.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import shutil
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
SEED = 20261130

MODEL = 'model bert { from = "bert-base-uncased", task = classify(labels: 2), hidden_size = 768 }'

HF_KINDS = [
    "linear", "cosine", "cosine_with_restarts", "polynomial", "constant",
    "constant_with_warmup", "inverse_sqrt", "cosine_with_min_lr", "warmup_stable_decay",
]
DS_KINDS = ["WarmupLR", "WarmupDecayLR", "WarmupCosineLR", "OneCycle", "LRRangeTest"]
KINDS = HF_KINDS + DS_KINDS
NO_WARMUP = {"constant", "OneCycle", "LRRangeTest"}

# (stage, offload optimizer, offload param)
ZEROS = [
    (0, "none", "none"), (1, "none", "none"), (1, "cpu", "none"), (2, "none", "none"),
    (2, "cpu", "none"), (3, "none", "none"), (3, "cpu", "none"), (3, "cpu", "cpu"),
    (3, "none", "cpu"),
]
PRECISIONS = ["fp32", "fp16", "bf16"]
# (gpus, nodes)
WORLDS = [(1, 1), (2, 1), (3, 1), (4, 1), (8, 1), (2, 2), (4, 2), (8, 2), (3, 4), (8, 4),
          (6, 1), (4, 4), (8, 8), (1, 5), (7, 1), (5, 3)]
BATCH_MODES = ["micro", "micro+acc", "micro+acc+global", "micro+global", "global+acc", "global"]
LRS = [1e-5, 2e-5, 3e-5, 5e-5, 1e-4, 3e-4, 2.5e-5]


def fmt_num(x: float) -> str:
    """A number as the recipe language writes it (repr is valid: 3e-05, 0.1, 2.0)."""
    if isinstance(x, int):
        return str(x)
    r = repr(float(x))
    return r


def steps_of(samples: int, micro: int, world: int, acc: int, epochs: float) -> tuple[int, int, int]:
    """(L, U, total) per docs/upstream.md §5.1/§5.2 (drop_last false, even batches)."""
    b = math.ceil(samples / micro)
    l = b // world + (1 if b % world else 0)
    u = max(math.ceil(l / acc), 1)
    return l, u, math.ceil(epochs * u)


def pick_samples(rng: random.Random, micro: int, world: int, acc: int, epochs: float,
                 short: bool) -> int:
    """A sample count giving about 4..240 optimizer steps; `short` makes the last accumulation
    window, the last per-rank batch and the last micro-batch short."""
    target = rng.randint(4, 240)
    u = max(1, math.ceil(target / epochs))
    if short and acc > 1:
        l = acc * (u - 1) + rng.randint(1, acc - 1)
    else:
        l = acc * u
    if short and world > 1:
        b = world * (l - 1) + rng.randint(1, world - 1) if l > 1 else rng.randint(1, world)
    else:
        b = world * l
    if short and micro > 1:
        n = micro * (b - 1) + rng.randint(1, micro - 1)
    else:
        n = micro * b
    return max(n, 1)


def warmup_choice(rng: random.Random, i: int, total_guess: int) -> str:
    forms = ["0", "1", "2", "steps", "steps", "6%", "10%", "0.1", "25%", "3.5%", "0.05"]
    f = forms[i % len(forms)]
    if f == "steps":
        return str(rng.randint(3, max(3, total_guess // 3)))
    return f


def schedule_block(rng: random.Random, kind: str, i: int, lr: float, total_guess: int) -> str:
    items: list[str] = []
    if kind not in NO_WARMUP:
        items.append(f"warmup = {warmup_choice(rng, i // len(KINDS), total_guess)}")
    if kind == "cosine" and rng.random() < 0.5:
        items.append(f"num_cycles = {rng.choice(['0.5', '1.0', '0.25', '1.5'])}")
    elif kind == "cosine_with_restarts":
        items.append(f"num_cycles = {rng.choice(['1', '2', '3'])}")
    elif kind == "polynomial":
        if rng.random() < 0.7:
            items.append(f"power = {rng.choice(['1.0', '2.0', '0.5', '3.0'])}")
        if rng.random() < 0.6:
            items.append(f"lr_end = {fmt_num(lr * rng.choice([0.0, 0.01, 0.1]))}")
    elif kind == "inverse_sqrt" and rng.random() < 0.5:
        items.append(f"timescale = {rng.choice([5, 10, 50, 100])}")
    elif kind == "cosine_with_min_lr":
        items.append(f"min_lr = {fmt_num(lr * rng.choice([0.0, 0.1, 0.05]))}")
        if rng.random() < 0.3:
            items.append("num_cycles = 0.5")
    elif kind == "warmup_stable_decay":
        items.append(f"decay = {rng.choice(['10%', '20%', '0.3', '5', '12'])}")
        if rng.random() < 0.5:
            items.append(f"min_lr_ratio = {rng.choice(['0.0', '0.1', '0.01'])}")
    elif kind in ("WarmupLR", "WarmupDecayLR"):
        items.append(f"warmup_type = {rng.choice(['linear', 'linear', 'log'])}")
        if rng.random() < 0.3:
            items.append(f"min_lr = {fmt_num(lr * 0.01)}")
        if rng.random() < 0.3:
            items.append(f"max_lr = {fmt_num(lr)}")  # equal to lr: R0311 otherwise
    elif kind == "WarmupCosineLR":
        items.append(f"warmup_type = {rng.choice(['linear', 'linear', 'log'])}")
        if rng.random() < 0.5:
            items.append(f"cos_min_ratio = {rng.choice(['0.0', '0.0001', '0.1'])}")
        if rng.random() < 0.4:
            items.append(f"warmup_min_ratio = {rng.choice(['0.0', '0.1', '0.5'])}")
    elif kind == "OneCycle":
        first = rng.randint(2, max(2, total_guess // 2))
        items.append(f"cycle_min_lr = {fmt_num(lr / 10)}")
        if rng.random() < 0.5:
            items.append(f"cycle_max_lr = {fmt_num(lr)}")
        items.append(f"cycle_first_step_size = {first}")
        if rng.random() < 0.4:
            items.append(f"cycle_second_step_size = {rng.randint(1, max(1, total_guess // 2))}")
        if rng.random() < 0.4:
            items.append(f"cycle_first_stair_count = {rng.randint(0, 4)}")
        if rng.random() < 0.2:
            items.append(f"cycle_second_stair_count = {rng.randint(1, 3)}")
        if rng.random() < 0.5:
            items.append(f"decay_lr_rate = {rng.choice(['0.1', '0.5', '0.001'])}")
            items.append(f"decay_step_size = {rng.randint(1, 10)}")
        items.append(f"cycle_momentum = {rng.choice(['true', 'false'])}")
        if rng.random() < 0.3:
            items.append("cycle_min_mom = 0.85")
            items.append("cycle_max_mom = 0.95")
        if rng.random() < 0.2:
            items.append("decay_mom_rate = 0.01")
    elif kind == "LRRangeTest":
        items.append(f"start_lr = {fmt_num(lr / 10)}")
        items.append(f"step_size = {rng.randint(1, max(1, total_guess // 4))}")
        items.append(f"step_rate = {rng.choice(['1.0', '0.5', '2.0', '0.1'])}")
        items.append(f"staircase = {rng.choice(['true', 'false'])}")
    body = ", ".join(items)
    return f"schedule {kind} {{ {body} }}" if body else f"schedule {kind}"


def batch_line(mode: str, micro: int, acc: int, world: int) -> str:
    """The `batch` block for a batch mode (`BATCH_MODES`), global = micro × acc × world."""
    g = micro * acc * world
    items = {"micro": [f"micro = {micro}"],
             "micro+acc": [f"micro = {micro}", f"accumulate = {acc}"],
             "micro+acc+global": [f"micro = {micro}", f"accumulate = {acc}", f"global = {g}"],
             "micro+global": [f"micro = {micro}", f"global = {g}"],
             "global+acc": [f"global = {g}", f"accumulate = {acc}"],
             "global": [f"global = {g}"]}[mode]
    return f"batch {{ {', '.join(items)} }}"


def gen_case(i: int, rng: random.Random) -> tuple[str, str]:
    kind = KINDS[i % len(KINDS)]
    stage, off_opt, off_par = ZEROS[(i // 2) % len(ZEROS)]
    precision = PRECISIONS[(i // 5) % len(PRECISIONS)]
    gpus, nodes = WORLDS[(i * 7 + i // 16) % len(WORLDS)]
    world = gpus * nodes
    mode = BATCH_MODES[(i // 3) % len(BATCH_MODES)]
    micro = rng.choice([1, 2, 3, 4, 5, 7, 8, 16, 32])
    acc = rng.choice([1, 2, 3, 4, 5, 8]) if mode != "micro" else 1
    if mode == "global":
        acc = 1
    epochs = [1, 2, 3, 2.5][(i // 7) % 4] if i % 11 else 1.5
    short = (i % 4) != 3
    samples = pick_samples(rng, micro, world, acc, epochs, short)
    _, _, total_guess = steps_of(samples, micro, world, acc, epochs)
    lr = rng.choice(LRS)
    owner_hf = (i % 6 == 5)
    opt_kind = "adam" if i % 9 == 4 else "adamw"

    ev = ', eval = "dev.jsonl"' if i % 3 == 1 else ""
    lines = [f'recipe "c{i:03d}"', MODEL, f'data {{ train = "train.jsonl"{ev}, samples = {samples} }}']
    lines.append(batch_line(mode, micro, acc, world))

    opt = [f"lr = {fmt_num(lr)}"]
    if rng.random() < 0.5:
        opt.append(f"weight_decay = {rng.choice(['0.0', '0.01', '0.1'])}")
    if rng.random() < 0.3:
        opt.append("betas = (0.9, 0.98)")
    if rng.random() < 0.3:
        opt.append("eps = 1e-6")
    if owner_hf:
        opt.append("owner = hf")
    lines.append(f"optimizer {opt_kind} {{ {', '.join(opt)} }}")
    lines.append(schedule_block(rng, kind, i, lr, total_guess))

    train = [f"epochs = {fmt_num(epochs) if isinstance(epochs, float) else epochs}",
             f"precision = {precision}"]
    if rng.random() < 0.3:
        train.append(f"clip = {rng.choice(['0.5', '0.0', '2.0'])}")
    if i % 10 == 7 and total_guess > 3:
        train.append(f"max_steps = {rng.randint(2, total_guess - 1)}")
    if precision == "fp16" and rng.random() < 0.3:
        train.append(f"loss_scale = {rng.choice(['dynamic', '1024', '128'])}")
        train.append(f"initial_scale_power = {rng.choice([12, 16, 20])}")
    if rng.random() < 0.2:
        train.append(f"logging_steps = {rng.choice([1, 50])}")
    lines.append(f"train {{ {', '.join(train)} }}")

    zitems = []
    if off_opt != "none":
        zitems.append(f"offload optimizer = {off_opt}")
    if off_par != "none":
        zitems.append(f"offload param = {off_par}")
    if stage >= 1 and rng.random() < 0.3:
        zitems.append(f"overlap_comm = {rng.choice(['true', 'false'])}")
    if stage >= 1 and rng.random() < 0.2:
        zitems.append("reduce_bucket = 5e8")
    if stage == 3 and rng.random() < 0.3:
        zitems.append("prefetch_bucket = 5e7")
    lines.append(f"zero {stage} {{ {', '.join(zitems)} }}" if zitems else f"zero {stage}")
    if world > 1 or i % 2:
        lines.append(f"cluster {{ gpus = {gpus}, nodes = {nodes} }}")

    offl = {"none": "", "cpu": "c"}[off_opt] + {"none": "", "cpu": "p"}[off_par]
    slug = f"{kind}-z{stage}{offl}-{precision}-w{world}-{mode.replace('+', '_')}"
    if owner_hf:
        slug += "-hfopt"
    return slug, "\n".join(lines) + "\n"


# --------------------------------------------------------------------------------------------
# Fixed feature cases, appended after the generated ones: optimizers other than Adam(W), raw
# DeepSpeed / HF keys, offload variants, data options, metric-driven schedules, edge step counts.
# (slug, data line or None for the default, other blocks)
# --------------------------------------------------------------------------------------------

DATA = 'data { train = "train.jsonl", samples = 1003 }'
FEATURES = [
    ("opt-sgd-z2", None, ["batch { micro = 8, accumulate = 2 }",
                          "optimizer sgd { lr = 0.1, momentum = 0.9, nesterov = true }", "zero 2"]),
    ("opt-sgd-z0", None, ["batch { micro = 8 }", "optimizer sgd { lr = 0.05, momentum = 0.9 }", "zero 0"]),
    ("opt-lamb-z2-fp16", None, ["batch { micro = 8 }", "optimizer lamb { lr = 1e-3 }",
                                "train { precision = fp16 }", "zero 2"]),
    ("opt-lamb-z0", None, ["batch { micro = 8 }", "optimizer lamb { lr = 1e-3, max_coeff = 5.0 }", "zero 0"]),
    ("opt-lion-z2", None, ["batch { micro = 8 }", "optimizer lion { lr = 1e-4, betas = (0.9, 0.99) }",
                           "zero 2"]),
    ("opt-lion-z2-offload", None, ["batch { micro = 8 }", "optimizer lion { lr = 1e-4 }",
                                   "zero 2 { offload optimizer = cpu }"]),
    ("opt-adagrad-z1", None, ["batch { micro = 8 }", "optimizer adagrad { lr = 1e-2 }", "zero 1"]),
    ("opt-adagrad-z2-offload", None, ["batch { micro = 8 }", "optimizer adagrad { lr = 1e-2, eps = 1e-10 }",
                                      "zero 2 { offload optimizer = cpu }"]),
    ("opt-onebitadam-z0-fp16", None, ["batch { micro = 8 }",
                                      "optimizer onebitadam { lr = 1e-4, freeze_step = 100 }",
                                      "train { precision = fp16 }", "zero 0"]),
    ("opt-zerooneadam-z0-fp16", None, ["batch { micro = 8 }", "optimizer zerooneadam { lr = 1e-4 }",
                                       "train { precision = fp16 }", "zero 0"]),
    ("opt-onebitlamb-z0-fp16", None, ["batch { micro = 8 }", "optimizer onebitlamb { lr = 1e-3 }",
                                      "train { precision = fp16 }", "zero 0"]),
    ("opt-sgd-hf-z2", None, ["batch { micro = 8 }", "optimizer sgd { lr = 0.1, momentum = 0.9, owner = hf }",
                             "zero 2"]),
    ("opt-adam-amsgrad-z1", None, ["batch { micro = 8 }",
                                   "optimizer adam { lr = 2e-5, amsgrad = true, weight_decay = 0.01 }", "zero 1"]),
    ("opt-adamw-amsgrad-z2-offload", None, ["batch { micro = 8 }",
                                            "optimizer adamw { lr = 2e-5, amsgrad = true }",
                                            "zero 2 { offload optimizer = cpu }"]),
    ("opt-adam-amsgrad-torch-z1", None, ["batch { micro = 8 }",
                                         "optimizer adam { lr = 2e-5, amsgrad = true, torch_adam = true }",
                                         "zero 1"]),
    ("opt-adamw-torch-adam-z2", None, ["batch { micro = 8 }",
                                       "optimizer adamw { lr = 2e-5, torch_adam = true }", "zero 2"]),
    ("raw-sparse-attention", None, ["batch { micro = 8 }", 'deepspeed { sparse_attention { mode = "fixed" } }']),
    ("raw-elasticity-off", None, ["batch { micro = 8 }", "deepspeed { elasticity { enabled = false } }"]),
    ("raw-progressive-layer-drop", None, ["batch { micro = 8 }",
                                          "deepspeed { progressive_layer_drop { enabled = false } }"]),
    ("raw-compression-training", None, ["batch { micro = 8 }",
                                        "deepspeed { compression_training { weight_quantization { shared_parameters { enabled = false } } } }"]),
    ("raw-nebula", None, ["batch { micro = 8 }", "deepspeed { nebula { enabled = false } }"]),
    ("raw-sparse-gradients", None, ["batch { micro = 8 }", "deepspeed { sparse_gradients = false }"]),
    ("raw-graph-harvesting", None, ["batch { micro = 8 }", "deepspeed { graph_harvesting = false }"]),
    ("raw-curriculum-learning", None, ["batch { micro = 8 }",
                                       "deepspeed { curriculum_learning { enabled = false } }"]),
    ("raw-mics-shard-size-z3", None, ["batch { micro = 8 }", "zero 3",
                                      "deepspeed { zero_optimization.mics_shard_size = -1 }"]),
    ("raw-zeropp-loco-z3", None, ["batch { micro = 8 }", "zero 3",
                                  "deepspeed { zero_optimization.zeropp_loco_param { err_beta = 0.8 } }"]),
    ("raw-flops-profiler", None, ["batch { micro = 8 }",
                                  "deepspeed { flops_profiler { enabled = true, profile_step = 2 } }"]),
    ("raw-comm-dtype-bf16", None, ["batch { micro = 8 }", "train { precision = bf16 }", "zero 2",
                                   'deepspeed { communication_data_type = "fp32", wall_clock_breakdown = true }']),
    ("raw-hf-report-to", None, ["batch { micro = 8 }",
                                'hf { report_to = ["none"], dataloader_pin_memory = false }']),
    ("zero3-nvme", None, ["batch { micro = 8 }",
                          'zero 3 { offload optimizer = nvme(path: "/local_nvme", buffer_count: 8), '
                          'offload param = nvme(path: "/local_nvme") }']),
    ("zero3-partial-offload", None, ["batch { micro = 8 }",
                                     "zero 3 { offload optimizer = cpu(ratio: 0.5, pin_memory: false) }"]),
    ("zero3-persistence", None, ["batch { micro = 8 }",
                                 "zero 3 { model_persistence_threshold = 1M, max_live_parameters = 5e8, "
                                 "gather_16bit_weights_on_model_save = false }"]),
    ("zero2-all-knobs", None, ["batch { micro = 8 }",
                               "zero 2 { overlap_comm = true, contiguous_gradients = false, reduce_scatter = false, "
                               "allgather_bucket = 2e8, round_robin_gradients = true, elastic_checkpoint = false }"]),
    ("data-drop-last", 'data { train = "train.jsonl", samples = 1003, drop_last = true }',
     ["batch { micro = 8, accumulate = 3 }", "cluster { gpus = 4 }", "schedule WarmupDecayLR { warmup = 5 }"]),
    ("data-eval-steps", 'data { train = "train.jsonl", eval = "dev.jsonl", samples = 1003 }',
     ["batch { micro = 8, eval_micro = 32 }", "train { eval_every = 20, save_every = 40, logging_steps = 5 }"]),
    ("data-eval-never", 'data { train = "train.jsonl", eval = "dev.jsonl", samples = 1003 }',
     ["batch { micro = 8 }", "train { eval_every = never, save_every = never }"]),
    ("model-gradient-checkpointing",
     None, ["batch { micro = 8 }",
            'model bert { from = "bert-base-uncased", task = classify(labels: 2), hidden_size = 768, '
            'gradient_checkpointing = true, dropout = 0.0 }']),
    ("eval-fp32-train-fp16", None, ["batch { micro = 8 }",
                                    "train { precision = fp16, eval_precision = fp32 }", "zero 2"]),
    ("eval-fp32-train-bf16", None, ["batch { micro = 8 }",
                                    "train { precision = bf16, eval_precision = fp32 }", "zero 3"]),
    ("fp16-loss-knobs", None, ["batch { micro = 8 }",
                               "train { precision = fp16, loss_scale_window = 500, hysteresis = 4, "
                               "min_loss_scale = 0.5, initial_scale_power = 10 }", "zero 1"]),
    ("reduce-lr-on-plateau", None, ["batch { micro = 8 }",
                                    "schedule reduce_lr_on_plateau { factor = 0.5, patience = 2 }"]),
    # HF steps the plateau schedule at each evaluation only when HF builds the optimizer (R0315).
    ("reduce-lr-on-plateau-with-eval", 'data { train = "train.jsonl", eval = "dev.jsonl", samples = 1003 }',
     ["batch { micro = 8 }", "optimizer adamw { owner = hf }",
      "schedule reduce_lr_on_plateau { factor = 0.5, patience = 2 }"]),
    ("max-steps-ds-decay", None, ["batch { micro = 8, accumulate = 2 }", "train { max_steps = 17 }",
                                  "schedule WarmupDecayLR { warmup = 10% }"]),
    ("max-steps-beyond-epochs", None, ["batch { micro = 8, accumulate = 2 }", "train { max_steps = 200, epochs = 1 }",
                                       "schedule cosine { warmup = 10 }"]),
    ("tiny-L-below-G", 'data { train = "train.jsonl", samples = 10 }',
     ["batch { micro = 4, accumulate = 4 }", "cluster { gpus = 8 }", "train { epochs = 3 }",
      "schedule WarmupLR { warmup = 1 }"]),
    ("tiny-fewer-batches-than-ranks", 'data { train = "train.jsonl", samples = 5 }',
     ["batch { micro = 2 }", "cluster { gpus = 8, nodes = 2 }", "train { epochs = 2 }"]),
    ("warmup-ratio-one", None, ["batch { micro = 8 }", "schedule linear { warmup = 100% }"]),
    ("warmup-longer-than-run", None, ["batch { micro = 64 }", "train { epochs = 1 }",
                                      "schedule WarmupCosineLR { warmup = 500 }"]),
    ("clip-zero-ds-sched", None, ["batch { micro = 8 }", "train { clip = 0.0 }",
                                  "schedule WarmupLR { warmup = 3, warmup_type = log }"]),
    ("global-64-gpus", 'data { train = "train.jsonl", samples = 50000 }',
     ["batch { global = 1024, micro = 4 }", "cluster { gpus = 8, nodes = 8 }",
      "schedule WarmupCosineLR { warmup = 3%, cos_min_ratio = 0.01 }"]),
    ("target-explicit", None, ['target transformers "5.25.0", accelerate "1.16.0", deepspeed "0.19.8"',
                               "batch { micro = 8 }"]),
    # HF's cosine_with_min_lr ends at min_lr_rate × lr when given the rate instead of min_lr.
    ("sched-cosine-min-lr-rate", None, ["batch { micro = 8, accumulate = 2 }",
                                        "schedule cosine_with_min_lr { warmup = 10%, min_lr_rate = 0.1 }"]),
    # HF's warmup_stable_decay with every argument: stable steps, the phase shapes, cycles.
    ("sched-wsd-shapes", None, ["batch { micro = 8, accumulate = 2 }",
                                "schedule warmup_stable_decay { warmup = 5, stable = 30%, decay = 20, "
                                "warmup_shape = cosine, decay_shape = one_minus_sqrt }"]),
    ("sched-wsd-cycles", None, ["batch { micro = 8 }",
                                "schedule warmup_stable_decay { warmup = 10%, decay = 30%, num_cycles = 1.0, "
                                "min_lr_ratio = 0.1, decay_shape = cosine }"]),
    # Every argument of torch's ReduceLROnPlateau the Trainer passes on (HF steps it, owner = hf).
    ("sched-plateau-kwargs", 'data { train = "train.jsonl", eval = "dev.jsonl", samples = 1003 }',
     ["batch { micro = 8 }", "optimizer adamw { owner = hf }",
      "schedule reduce_lr_on_plateau { factor = 0.5, patience = 1, cooldown = 1, mode = max, "
      "threshold = 0.01, threshold_mode = abs, min_lr = 1e-6, eps = 1e-9 }"]),
    # HF's cosine_warmup_with_min_lr (transformers >= 4.54.0): one step ahead of
    # cosine_with_min_lr, so without warmup step 1 is already past the peak.
    ("sched-cosine-warmup-min-lr", None, ["batch { micro = 8, accumulate = 2 }",
                                          "schedule cosine_warmup_with_min_lr { min_lr = 2e-6 }"]),
    # ... with its warmup_lr_rate, a min_lr_rate and more than half a cosine wave.
    ("sched-cosine-warmup-min-lr-rates", None, ["batch { micro = 8 }",
                                                "schedule cosine_warmup_with_min_lr { warmup = 10%, min_lr_rate = 0.05, "
                                                "warmup_lr_rate = 0.02, num_cycles = 0.75 }"]),
    # HF's greedy (transformers >= 5.4.0, GreedyLR) with every argument it takes; HF steps it at
    # each evaluation (owner = hf), so without a metric the LR holds.
    ("sched-greedy-kwargs", 'data { train = "train.jsonl", eval = "dev.jsonl", samples = 1003 }',
     ["batch { micro = 8 }", "optimizer adamw { owner = hf }", "train { eval_every = 25 }",
      "schedule greedy { factor = 0.8, patience = 3, cooldown = 1, increase_cooldown = 2, mode = min, "
      "threshold = 1e-3, threshold_mode = rel, min_lr = 1e-7, max_lr = 1e-3, eps = 1e-9, smooth = true, "
      "window_size = 5, reset_start = 100, verbose = false }"]),
    # ... and with GreedyLR's own defaults (no lr_scheduler_kwargs at all).
    ("sched-greedy-defaults", 'data { train = "train.jsonl", eval = "dev.jsonl", samples = 1003 }',
     ["batch { micro = 8 }", "optimizer adamw { owner = hf }", "schedule greedy"]),
]


def feature_case(slug: str, data: str | None, blocks: list[str], n: int) -> str:
    lines = [f'recipe "f{n:03d}"']
    if not any(b.startswith("model ") for b in blocks):
        lines.append(MODEL)
    lines.append(data or DATA)
    lines.extend(blocks)
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------------------------
# Rejected corpus: recipes our checker rejects, and how to build what they state.
# Patch ops (applied by run.sh to the base's artefacts, in order):
#   {"file": "ds_config.json"|"training_args.json", "set": "dotted.key", "value": V}
#   {"file": ..., "del": "dotted.key"}
# "expect" names what the real stack should do (for the summary): "raise" at a stage, or
# "silent" misbehaviour the harness can see in the filled config; "not_reproducible" where the
# pinned stack (accelerate 1.15, transformers 5.24) cannot show it.
# --------------------------------------------------------------------------------------------

BASE_HEAD = MODEL + '\ndata { train = "train.jsonl", eval = "dev.jsonl", samples = 1000 }\n'

REJECTED = [
    dict(slug="R0101-batch-mismatch", code="R0101",
         text=BASE_HEAD + "batch { micro = 3, global = 10 }\n",
         base=BASE_HEAD + "batch { micro = 3, accumulate = 3 }\n",
         patch=[{"file": "ds_config.json", "set": "train_batch_size", "value": 10}],
         expect="raise", match="ds train_batch_size=10 vs hf train_batch_size", why="DeepSpeed _batch_assertion: 10 != 3 * 3 * 1; HF: train_batch_size mismatch"),
    dict(slug="R0101-batch-mismatch-multi-gpu", code="R0101",
         text=BASE_HEAD + "batch { micro = 4, accumulate = 2, global = 64 }\ncluster { gpus = 4 }\n",
         base=BASE_HEAD + "batch { micro = 4, accumulate = 2 }\ncluster { gpus = 4 }\n",
         patch=[{"file": "ds_config.json", "set": "train_batch_size", "value": 64}],
         expect="raise", match="ds train_batch_size=64 vs hf train_batch_size", why="4*2*4 = 32 != 64"),
    dict(slug="R0102-batch-zero", code="R0102",
         text=BASE_HEAD + "batch { micro = 16, global = 8 }\n",
         base=BASE_HEAD + "batch { micro = 16 }\n",
         patch=[{"file": "ds_config.json", "set": "train_batch_size", "value": 8},
                {"file": "ds_config.json", "del": "gradient_accumulation_steps"}],
         expect="raise", match="ds train_batch_size=8 vs hf train_batch_size", why="GAS = 8 // 16 // 1 = 0"),
    dict(slug="R0311-peak-mismatch", code="R0311",
         text=BASE_HEAD + "batch { micro = 8 }\noptimizer adamw { lr = 5e-5 }\n"
              "schedule WarmupLR { warmup = 10, max_lr = 1e-4 }\n",
         base=BASE_HEAD + "batch { micro = 8 }\noptimizer adamw { lr = 5e-5 }\n"
              "schedule WarmupLR { warmup = 10 }\n",
         patch=[{"file": "ds_config.json", "set": "scheduler.params.warmup_max_lr", "value": 1e-4}],
         expect="raise", match="ds scheduler.params.warmup_max_lr=0.0001 vs hf learning_rate", why="HF mismatch: ds scheduler.params.warmup_max_lr vs hf learning_rate"),
    dict(slug="R0503-apex-with-zero", code="R0503",
         text='target transformers "4.57.0"\n' + BASE_HEAD + "batch { micro = 16 }\n"
              "train { precision = fp16, fp16_backend = apex }\nzero 2\n",
         base=BASE_HEAD + "batch { micro = 16 }\ntrain { precision = fp16 }\nzero 2\n",
         patch=[{"file": "ds_config.json", "set": "amp", "value": {"enabled": True}}],
         expect="raise", match="NVIDIA Apex AMP integration has been removed",
         why="DeepSpeed: Amp and ZeRO are not currently compatible (transformers 4.57 would write "
             "amp.enabled; 5.24 has no apex, so the amp section is injected by hand)"),
    dict(slug="R0504-apex-with-fp16", code="R0504",
         text='target transformers "4.57.0"\n' + BASE_HEAD + "batch { micro = 16 }\n"
              "train { precision = fp16, fp16_backend = apex }\n",
         base=BASE_HEAD + "batch { micro = 16 }\ntrain { precision = fp16 }\n",
         patch=[{"file": "ds_config.json", "set": "amp", "value": {"enabled": True}}],
         expect="raise", match="NVIDIA Apex AMP integration has been removed", why="DeepSpeed: Cannot enable both amp with (legacy) fp16 or bfloat16 mode"),
    # 1-bit Adam exists up to DeepSpeed 0.19.7 (PR #8490 deleted it in 0.19.8, R0410): the
    # recipe pins 0.19.7 so the checker says R0404; the installed 0.19.8 refuses it either way.
    dict(slug="R0404-onebit-with-zero", code="R0404",
         text='target deepspeed "0.19.7"\n' + BASE_HEAD + "batch { micro = 8 }\noptimizer onebitadam { lr = 1e-4, freeze_step = 400 }\n"
              "train { precision = fp16 }\nzero 1\n",
         base=BASE_HEAD + "batch { micro = 8 }\noptimizer adamw { lr = 1e-4 }\n"
              "train { precision = fp16 }\nzero 1\n",
         patch=[{"file": "ds_config.json", "set": "optimizer",
                 "value": {"type": "OneBitAdam", "params": {"lr": 1e-4, "betas": [0.9, 0.999],
                                                            "eps": 1e-8, "weight_decay": 0,
                                                            "freeze_step": 400}}}],
         expect="raise", match="OneBitAdam is not a supported DeepSpeed Optimizer", why="DeepSpeed engine: 1bit-Adam is not compatible with ZeRO (≤ 0.19.7; 0.19.8 has no 1-bit Adam)"),
    # DeepSpeed 0.19.8 deleted the 1-bit optimizers (PR #8490): R0410 for the target release.
    dict(slug="R0410-onebitadam-removed", code="R0410",
         text=BASE_HEAD + "batch { micro = 8 }\noptimizer onebitadam { lr = 1e-4, freeze_step = 100 }\n"
              "train { precision = fp16 }\n",
         base=BASE_HEAD + "batch { micro = 8 }\noptimizer adamw { lr = 1e-4 }\ntrain { precision = fp16 }\n",
         patch=[{"file": "ds_config.json", "set": "optimizer",
                 "value": {"type": "OneBitAdam", "params": {"lr": 1e-4, "freeze_step": 100}}}],
         expect="raise", match="OneBitAdam is not a supported DeepSpeed Optimizer", why="DeepSpeed 0.19.8: OneBitAdam is not a supported DeepSpeed Optimizer"),
    dict(slug="R0410-zerooneadam-removed", code="R0410",
         text=BASE_HEAD + "batch { micro = 8 }\noptimizer zerooneadam { lr = 1e-4 }\n"
              "train { precision = fp16 }\n",
         base=BASE_HEAD + "batch { micro = 8 }\noptimizer adamw { lr = 1e-4 }\ntrain { precision = fp16 }\n",
         patch=[{"file": "ds_config.json", "set": "optimizer",
                 "value": {"type": "ZeroOneAdam", "params": {"lr": 1e-4}}}],
         expect="raise", match="ZeroOneAdam is not a supported DeepSpeed Optimizer", why="DeepSpeed 0.19.8: ZeroOneAdam is not a supported DeepSpeed Optimizer"),
    dict(slug="R0410-onebitlamb-removed", code="R0410",
         text=BASE_HEAD + "batch { micro = 8 }\noptimizer onebitlamb { lr = 1e-3 }\n"
              "train { precision = fp16 }\n",
         base=BASE_HEAD + "batch { micro = 8 }\noptimizer lamb { lr = 1e-3 }\ntrain { precision = fp16 }\n",
         patch=[{"file": "ds_config.json", "set": "optimizer.type", "value": "OneBitLamb"}],
         expect="raise", match="OneBitLamb is not a supported DeepSpeed Optimizer", why="DeepSpeed 0.19.8: OneBitLamb is not a supported DeepSpeed Optimizer"),
    dict(slug="R0414-amsgrad-fusedadam", code="R0414",
         text=BASE_HEAD + "batch { micro = 8 }\noptimizer adam { lr = 2e-5, amsgrad = true, weight_decay = 0.01 }\n"
              "zero 1\n",
         base=BASE_HEAD + "batch { micro = 8 }\noptimizer adam { lr = 2e-5, weight_decay = 0.01 }\nzero 1\n",
         patch=[{"file": "ds_config.json", "set": "optimizer.params.amsgrad", "value": True}],
         expect="raise", match="FusedAdam does not support the AMSGrad variant", why="FusedAdam does not support the AMSGrad variant"),
    dict(slug="R0414-amsgrad-cpuadam", code="R0414",
         text=BASE_HEAD + "batch { micro = 8 }\noptimizer adamw { lr = 2e-5, amsgrad = true }\n"
              "zero 2 { offload optimizer = cpu }\n",
         base=BASE_HEAD + "batch { micro = 8 }\noptimizer adamw { lr = 2e-5 }\nzero 2 { offload optimizer = cpu }\n",
         patch=[{"file": "ds_config.json", "set": "optimizer.params.amsgrad", "value": True}],
         expect="raise", match="DeepSpeedCPUAdam does not support the AMSGrad variant", why="DeepSpeedCPUAdam does not support the AMSGrad variant"),
    dict(slug="R0909-sparse-attention", code="R0909",
         text=BASE_HEAD + "batch { micro = 8 }\ndeepspeed { sparse_attention { mode = \"fixed\" } }\n",
         base=BASE_HEAD + "batch { micro = 8 }\n",
         patch=[{"file": "ds_config.json", "set": "sparse_attention", "value": {"mode": "fixed"}}],
         expect="raise", match="Sparse Attention has been removed", why="DeepSpeed 0.19.8: Sparse Attention has been removed"),
    dict(slug="R0909-elasticity", code="R0909",
         text=BASE_HEAD + "batch { micro = 8 }\ndeepspeed { elasticity { enabled = false } }\n",
         base=BASE_HEAD + "batch { micro = 8 }\n",
         patch=[{"file": "ds_config.json", "set": "elasticity", "value": {"enabled": False}}],
         expect="raise", match="Elastic training has been removed", why="DeepSpeed 0.19.8: Elastic training has been removed (even disabled)"),
    dict(slug="R0909-mics-shard-size", code="R0909",
         text=BASE_HEAD + "batch { micro = 8 }\nzero 3\ndeepspeed { zero_optimization.mics_shard_size = -1 }\n",
         base=BASE_HEAD + "batch { micro = 8 }\nzero 3\n",
         patch=[{"file": "ds_config.json", "set": "zero_optimization.mics_shard_size", "value": -1}],
         expect="raise", match="MiCS ZeRO-3 sharding has been removed", why="DeepSpeed 0.19.8: MiCS ZeRO-3 sharding has been removed"),
    dict(slug="R0406-lamb-offload", code="R0406",
         text=BASE_HEAD + "batch { micro = 8 }\noptimizer lamb { lr = 1e-3 }\n"
              "zero 2 { offload optimizer = cpu }\n",
         base=BASE_HEAD + "batch { micro = 8 }\noptimizer lamb { lr = 1e-3 }\nzero 2\n",
         patch=[{"file": "ds_config.json", "set": "zero_optimization.offload_optimizer",
                 "value": {"device": "cpu", "pin_memory": True}}],
         # raise_engine: the harness builds the real engine (train_run.py --engine). DeepSpeed
         # 0.19.8 has no config-level check for it: runtime/engine.py:_configure_basic_optimizer
         # builds FusedLamb (ops/lamb/fused_lamb.py:FusedLamb.__init__ loads FusedLambBuilder)
         # whatever the offload; on a GPU the CUDA kernel then meets the offloaded CPU states at
         # the first step. On the CPU accelerator FusedLambBuilder maps to
         # ops/op_builder/cpu/no_impl.py:NotImplementedBuilder.load ("This op had not been
         # implemented on CPU backend."), for the base recipe (no offload) too, so the control
         # fails the same way and the case stays not reproduced (recorded as such).
         expect="raise_engine",
         why="FusedLamb is a CUDA kernel: fails at the first step on a GPU; no config-level check "
             "exists, and on the CPU accelerator FusedLamb cannot be built at all (base too)"),
    dict(slug="R0405-lamb-fixed-loss-scale", code="R0405",
         text=BASE_HEAD + "batch { micro = 8 }\noptimizer lamb { lr = 1e-3 }\n"
              "train { precision = fp16, loss_scale = 1024 }\n",
         base=BASE_HEAD + "batch { micro = 8 }\noptimizer lamb { lr = 1e-3 }\n"
              "train { precision = fp16 }\n",
         patch=[{"file": "ds_config.json", "set": "fp16.loss_scale", "value": 1024}],
         expect="raise", match="lamb optimizer requires dynamic loss scaling", why="DeepSpeed _do_sanity_check: lamb optimizer requires dynamic loss scaling"),
    dict(slug="R0605-auto-batch-zero3", code="R0605",
         text=BASE_HEAD + "batch { micro = 16 }\ntrain { auto_find_batch_size = true }\nzero 3\n",
         base=BASE_HEAD + "batch { micro = 16 }\nzero 3\n",
         patch=[{"file": "training_args.json", "set": "auto_find_batch_size", "value": True}],
         expect="raise_trainer", match="`auto_find_batch_size` isn't supported yet with DeepSpeed Zero-3",
         why="Trainer.create_accelerator_and_postprocess raises for auto_find_batch_size + ZeRO-3; "
             "the harness does not build a Trainer, so it replays that one check"),
    dict(slug="R0609-prescale-zero2", code="R0609",
         text=BASE_HEAD + "batch { micro = 8 }\nzero 2\ndeepspeed { prescale_gradients = true }\n",
         base=BASE_HEAD + "batch { micro = 8 }\nzero 2\n",
         patch=[{"file": "ds_config.json", "set": "prescale_gradients", "value": True}],
         # raise_engine: the harness builds the real engine (train_run.py --engine): HF Trainer
         # -> accelerate -> deepspeed.initialize -> runtime/engine.py:_configure_zero_optimizer
         # -> runtime/zero/stage_1_and_2.py:DeepSpeedZeroOptimizer.__init__, which asserts
         # `postscale_gradients` when reduce_scatter and partition_gradients (ZeRO-2) and
         # gradient_average; DeepSpeedConfig validation accepts the key.
         expect="raise_engine",
         engine_match="pre-scale gradients is not yet supported with ZeRO-2 with reduce scatter "
                      "enabled",
         why="assertion in DeepSpeedZeroOptimizer.__init__ (the real engine refuses); config "
             "validation accepts it"),
    dict(slug="R0901-auto-unfilled", code="R0901",
         text=BASE_HEAD + "batch { micro = 8 }\ndeepspeed { wall_clock_breakdown = \"auto\" }\n",
         base=BASE_HEAD + "batch { micro = 8 }\n",
         patch=[{"file": "ds_config.json", "set": "wall_clock_breakdown", "value": "auto"}],
         expect="raise", match="`wall_clock_breakdown` not found in kwargs", why="accelerate deepspeed_config_process: `wall_clock_breakdown` not found in kwargs"),
    dict(slug="R0901-auto-warmup-type", code="R0901",
         text=BASE_HEAD + "batch { micro = 8 }\nschedule WarmupLR { warmup = 10 }\n"
              "deepspeed { scheduler.params.warmup_type = \"auto\" }\n",
         base=BASE_HEAD + "batch { micro = 8 }\nschedule WarmupLR { warmup = 10 }\n",
         patch=[{"file": "ds_config.json", "set": "scheduler.params.warmup_type", "value": "auto"}],
         expect="raise", match="`scheduler.params.warmup_type` not found in kwargs", why="R-A01: scheduler.params.warmup_type is not fillable"),
    dict(slug="R0902-raw-duplicate-train-batch-size", code="R0902",
         text=BASE_HEAD + "batch { micro = 8, accumulate = 2 }\ndeepspeed { train_batch_size = 32 }\n",
         base=BASE_HEAD + "batch { micro = 8, accumulate = 2 }\n",
         patch=[{"file": "ds_config.json", "set": "train_batch_size", "value": 32}],
         expect="raise", match="ds train_batch_size=32 vs hf train_batch_size", why="raw value overrides the typed one: 32 != 8 * 2 * 1"),
    dict(slug="R0902-raw-duplicate-gas", code="R0902",
         text=BASE_HEAD + "batch { micro = 8, accumulate = 2 }\n"
              "deepspeed { gradient_accumulation_steps = 4 }\n",
         base=BASE_HEAD + "batch { micro = 8, accumulate = 2 }\n",
         patch=[{"file": "ds_config.json", "set": "gradient_accumulation_steps", "value": 4}],
         expect="raise", match="ds gradient_accumulation_steps=4 vs hf gradient_accumulation_steps", why="HF mismatch gradient_accumulation_steps and DS batch assertion"),
    dict(slug="R0501-eval-fp16-train-fp32", code="R0501",
         text=BASE_HEAD + "batch { micro = 16 }\ntrain { precision = fp32, eval_precision = fp16 }\n",
         base=BASE_HEAD + "batch { micro = 16 }\ntrain { precision = fp32 }\n",
         patch=[{"file": "training_args.json", "set": "fp16_full_eval", "value": True},
                {"file": "ds_config.json", "set": "fp16.enabled", "value": "auto"}],
         expect="silent", silent_key="fp16.enabled", silent_value=True,
         why="HF fills fp16.enabled = fp16 or fp16_full_eval = true: DeepSpeed trains in fp16"),
    dict(slug="R0502-fp16-and-bf16", code="R0502",
         text=BASE_HEAD + "batch { micro = 16 }\ntrain { precision = bf16, eval_precision = fp16 }\n",
         base=BASE_HEAD + "batch { micro = 16 }\ntrain { precision = bf16 }\n",
         patch=[{"file": "training_args.json", "set": "fp16_full_eval", "value": True},
                {"file": "ds_config.json", "set": "fp16.enabled", "value": "auto"}],
         expect="raise", match="cannot be set to `bf16` when `fp16` is set in the DeepSpeed config", why="fp16.enabled and bf16.enabled both true: DeepSpeed rejects"),
    dict(slug="R0403-untested-optimizer-flag-false", code="R0403",
         text=BASE_HEAD + "batch { micro = 8 }\noptimizer sgd { lr = 0.1, momentum = 0.9 }\nzero 2\n"
              "deepspeed { zero_allow_untested_optimizer = false }\n",
         base=BASE_HEAD + "batch { micro = 8 }\noptimizer sgd { lr = 0.1, momentum = 0.9 }\nzero 2\n",
         patch=[{"file": "ds_config.json", "set": "zero_allow_untested_optimizer", "value": False}],
         expect="runtime", match="You are using an untested ZeRO Optimizer",
         why="DeepSpeed engine _configure_zero_optimizer: untested ZeRO optimizer (needs an engine)"),
    # R0201 / R0202 need older releases than the pinned stack: `stack` names an overlay of
    # overlays.txt (setup.sh overlays) under which the harness trains the case for real
    # (train_run.py), and, as the control, under the pinned stack. The base recipes target the
    # nearest releases our checker accepts (accelerate 1.8.0; transformers 4.52.0).
    dict(slug="R0201-step-drift-accelerate-1.7", code="R0201",
         text='target transformers "5.25.0", accelerate "1.7.0"\n' + MODEL +
              '\ndata { train = "train.jsonl", eval = "dev.jsonl", samples = 100 }\nbatch { micro = 8, accumulate = 4 }\n',
         base='target transformers "5.25.0", accelerate "1.8.0"\n' + MODEL +
              '\ndata { train = "train.jsonl", eval = "dev.jsonl", samples = 100 }\nbatch { micro = 8, accumulate = 4 }\n',
         patch=[],
         expect="silent_run", stack="accelerate-1.7.0", stack_check="step_drift",
         why="R-S02: accelerate < 1.8 calls engine.step() on every micro-batch, so DeepSpeed "
             "updates the weights on its own micro-batch count while HF also steps at each epoch "
             "end: fewer weight updates than HF optimizer steps"),
    dict(slug="R0202-early-stop-transformers-4.48", code="R0202",
         text='target transformers "4.48.0", accelerate "1.8.0"\n' + MODEL +
              '\ndata { train = "train.jsonl", eval = "dev.jsonl", samples = 100 }\nbatch { micro = 8, accumulate = 4 }\n'
              "train { epochs = 3 }\n",
         base='target transformers "4.52.0", accelerate "1.8.0"\n' + MODEL +
              '\ndata { train = "train.jsonl", eval = "dev.jsonl", samples = 100 }\nbatch { micro = 8, accumulate = 4 }\n'
              "train { epochs = 3 }\n",
         patch=[],
         expect="silent_run", stack="transformers-4.48.0", stack_check="early_stop",
         why="R-S04: transformers 4.47-4.51 compute max_steps from floor(L/G) but step at every "
             "epoch end: the run stops before the last epoch ends"),
    # Refusals the pinned stack makes at TrainingArguments or DeepSpeed's config (`match`: the
    # refusal must say it).
    dict(slug="R0402-lamb-owner-hf", code="R0402",
         text=BASE_HEAD + "batch { micro = 8 }\noptimizer lamb { lr = 1e-3, owner = hf }\n",
         base=BASE_HEAD + "batch { micro = 8 }\noptimizer adamw { lr = 1e-3, owner = hf }\n",
         patch=[{"file": "training_args.json", "set": "optim", "value": "lamb"}],
         expect="raise", match="lamb is not a valid OptimizerNames",
         why="HF's optim has no LAMB: TrainingArguments refuses the name"),
    dict(slug="R0505-apex-transformers-5", code="R0505",
         text=BASE_HEAD + "batch { micro = 8 }\ntrain { precision = fp16, fp16_backend = apex }\n",
         base=BASE_HEAD + "batch { micro = 8 }\ntrain { precision = fp16 }\n",
         patch=[{"file": "training_args.json", "set": "half_precision_backend", "value": "apex"}],
         expect="raise", match="unexpected keyword argument 'half_precision_backend'",
         why="transformers 5 removed apex and half_precision_backend"),
    dict(slug="R0603-partial-offload-zero2", code="R0603",
         text=BASE_HEAD + "batch { micro = 8 }\nzero 2 { offload optimizer = cpu(ratio: 0.3) }\n",
         base=BASE_HEAD + "batch { micro = 8 }\nzero 2 { offload optimizer = cpu }\n",
         patch=[{"file": "ds_config.json", "set": "zero_optimization.offload_optimizer.ratio",
                 "value": 0.3}],
         expect="raise", match="Partial offloading only supported for ZeRO Stage 3",
         why="DeepSpeedZeroConfig.offload_ratio_check"),
    # Refusals of the real Trainer or engine (train_run.py --engine builds both, world size 1).
    dict(slug="R0905-fsdp-with-deepspeed", code="R0905",
         text=BASE_HEAD + "batch { micro = 8 }\nhf { fsdp = \"full_shard\" }\n",
         base=BASE_HEAD + "batch { micro = 8 }\n",
         patch=[{"file": "training_args.json", "set": "fsdp", "value": "full_shard"}],
         expect="raise_engine", engine_match="together with --deepspeed is not possible",
         why="Trainer.__init__ refuses FSDP with DeepSpeed"),
    dict(slug="R0906-save-only-model-best", code="R0906",
         text=BASE_HEAD + "batch { micro = 8 }\n"
              "hf { save_only_model = true, load_best_model_at_end = true }\n",
         base=BASE_HEAD + "batch { micro = 8 }\nhf { load_best_model_at_end = true }\n",
         patch=[{"file": "training_args.json", "set": "save_only_model", "value": True}],
         expect="raise_engine", engine_match="can't be used with `save_only_model`",
         why="Trainer.create_accelerator_and_postprocess refuses it under DeepSpeed"),
    dict(slug="R0907-unmanaged-accumulation", code="R0907",
         text=BASE_HEAD + "batch { micro = 8, accumulate = 2 }\n"
              "deepspeed { managed_gradient_accumulation = false }\n",
         base=BASE_HEAD + "batch { micro = 8, accumulate = 2 }\n",
         patch=[{"file": "ds_config.json", "set": "managed_gradient_accumulation",
                 "value": False}],
         expect="raise_engine", engine_match="managed_gradient_accumulation=False",
         why="accelerate >= 1.8 sets the accumulation boundary; DeepSpeed asserts at the step"),
    # The run trains, with another optimizer than the recipe names (`silent_engine`: DeepSpeed's
    # basic optimizer, module.Class, for the case and for the base recipe).
    dict(slug="R0407-sgd-becomes-cpu-adam", code="R0407",
         text=BASE_HEAD + "batch { micro = 8 }\noptimizer sgd { lr = 0.1, momentum = 0.9, owner = hf }\n"
              "zero 2 { offload optimizer = cpu }\n",
         base=BASE_HEAD + "batch { micro = 8 }\noptimizer sgd { lr = 0.1, momentum = 0.9, owner = hf }\n"
              "zero 2\n",
         patch=[{"file": "ds_config.json", "set": "zero_optimization.offload_optimizer",
                 "value": {"device": "cpu", "pin_memory": True}}],
         expect="silent_engine",
         engine_optimizer="deepspeed.ops.adam.cpu_adam.DeepSpeedCPUAdam",
         control_optimizer="torch.optim.sgd.SGD",
         why="accelerate rebuilds HF's SGD as DeepSpeedCPUAdam from its parameter groups"),
    dict(slug="R0409-adafactor-owner-deepspeed", code="R0409",
         text=BASE_HEAD + "batch { micro = 8 }\noptimizer adafactor { lr = 1e-3 }\n",
         base=BASE_HEAD + "batch { micro = 8 }\noptimizer adafactor { lr = 1e-3, owner = hf }\n",
         patch=[{"file": "ds_config.json", "set": "optimizer",
                 "value": {"type": "Adafactor", "params": {"lr": 1e-3}}}],
         expect="silent_engine",
         engine_optimizer="torch.optim.Adafactor",
         control_optimizer="transformers.optimization.Adafactor",
         why="DeepSpeed looks Adafactor up in torch.optim (torch >= 2.5): torch's, not HF's"),
    # Two sources of truth: the raw key, were it written, changes what the run does.
    dict(slug="R0411-hf-learning-rate", code="R0411",
         text=BASE_HEAD + "batch { micro = 8 }\noptimizer adamw { lr = 3e-5 }\nhf { learning_rate = 5e-5 }\n",
         base=BASE_HEAD + "batch { micro = 8 }\noptimizer adamw { lr = 3e-5 }\n",
         patch=[{"file": "training_args.json", "set": "learning_rate", "value": 5e-5}],
         expect="raise", match="ds optimizer.params.lr=3e-05 vs hf learning_rate=5e-05",
         why="HF's mismatch check: the optimizer's lr against learning_rate"),
    dict(slug="R0903-hf-micro-batch", code="R0903",
         text=BASE_HEAD + "batch { micro = 8 }\nhf { per_device_train_batch_size = 16 }\n",
         base=BASE_HEAD + "batch { micro = 8 }\n",
         patch=[{"file": "training_args.json", "set": "per_device_train_batch_size", "value": 16}],
         expect="raise", match="ds train_micro_batch_size_per_gpu=8 vs hf per_device_train_batch_size=16",
         why="HF's mismatch check: the micro batch against per_device_train_batch_size"),
    dict(slug="R0509-raw-bf16-with-fp16", code="R0509",
         text=BASE_HEAD + "batch { micro = 8 }\ntrain { precision = fp16 }\ndeepspeed { bf16 { enabled = true } }\n",
         base=BASE_HEAD + "batch { micro = 8 }\ntrain { precision = fp16 }\n",
         patch=[{"file": "ds_config.json", "set": "bf16.enabled", "value": True}],
         expect="raise", match="ds bf16.enabled=True vs hf bf16",
         why="HF mismatch: DeepSpeed bf16 on, TrainingArguments in fp16 (accelerate refuses the pair too)"),
    dict(slug="R0607-raw-reduce-bucket", code="R0607",
         text=BASE_HEAD + "batch { micro = 8 }\nzero 2\ndeepspeed { zero_optimization { reduce_bucket_size = 500000000 } }\n",
         base=BASE_HEAD + "batch { micro = 8 }\nzero 2\n",
         patch=[{"file": "ds_config.json", "set": "zero_optimization.reduce_bucket_size",
                 "value": 500000000}],
         expect="silent", silent_key="zero_optimization.reduce_bucket_size", silent_value=500000000,
         why="DeepSpeed runs with the raw bucket size, not the recipe's (hidden_size^2 = 589824)"),
    dict(slug="R0309-raw-ds-scheduler", code="R0309",
         text=BASE_HEAD + "batch { micro = 8 }\nschedule linear { warmup = 20 }\n"
              "deepspeed { scheduler { type = \"WarmupLR\" } }\n",
         base=BASE_HEAD + "batch { micro = 8 }\nschedule linear { warmup = 20 }\n",
         patch=[{"file": "ds_config.json", "set": "scheduler", "value": {"type": "WarmupLR"}}],
         expect="silent", silent_key="scheduler.type", silent_value="WarmupLR",
         why="DeepSpeed builds WarmupLR (its defaults) and HF silently drops its linear schedule"),
    # transformers 5.25 (as 5.0 … 5.24) needs accelerate >= 1.1.0 (`TrainingArguments._setup_devices`); the base
    # targets 1.1.0, and the case runs under an accelerate 1.0.1 overlay.
    dict(slug="R0908-accelerate-1.0.1", code="R0908",
         text='target transformers "5.25.0", accelerate "1.0.1"\n' + BASE_HEAD + "batch { micro = 8 }\n",
         base='target transformers "5.25.0", accelerate "1.1.0"\n' + BASE_HEAD + "batch { micro = 8 }\n",
         patch=[],
         expect="silent_run", stack="accelerate-1.0.1", stack_check="refused",
         match="requires `accelerate>=1.1.0`",
         why="TrainingArguments: Using the `Trainer` with `PyTorch` requires `accelerate>=1.1.0`"),
    # No evaluation data, evaluation asked for: the real Trainer refuses (the control trains
    # with the base recipe's evaluation set: base/case.json).
    dict(slug="R0706-eval-without-data", code="R0706",
         text=MODEL + '\ndata { train = "train.jsonl", samples = 1000 }\nbatch { micro = 8 }\n'
              "train { eval_every = epoch }\n",
         base=BASE_HEAD + "batch { micro = 8 }\ntrain { eval_every = epoch }\n",
         patch=[],
         expect="raise_engine", engine_match="you didn't pass an `eval_dataset` to `Trainer`",
         why="Trainer._validate_args: an evaluation strategy without an eval_dataset"),
    # Ten samples, micro-batches of 16 and drop_last: no batch at all. transformers 5.24's
    # Trainer.train() takes a dataloader of length 0 for one without a length and stops (after
    # the model has loaded, in a real launch); the control, drop_last off, trains.
    dict(slug="R0205-no-steps", code="R0205",
         text=MODEL + '\ndata { train = "train.jsonl", eval = "dev.jsonl", samples = 10, '
              'drop_last = true }\nbatch { micro = 16 }\n',
         base=MODEL + '\ndata { train = "train.jsonl", eval = "dev.jsonl", samples = 10 }\n'
              "batch { micro = 16 }\n",
         patch=[{"file": "training_args.json", "set": "dataloader_drop_last", "value": True}],
         expect="raise_engine",
         engine_match="args.max_steps must be set to a positive value if dataloader does not "
                      "have a length",
         why="Trainer.set_initial_training_values: len(dataloader) == 0 is taken for no length"),
    # Two nodes, a hostfile of one: DeepSpeed's launcher keeps the hosts there are and starts
    # 8 processes, not 16; DeepSpeed's batch assertion at that world size (`launch`: the
    # harness runs the launcher's own resource code on launch.sh, then DeepSpeedConfig at the
    # world size it gives). The artefacts differ from the base's in launch.sh's --hostfile only.
    dict(slug="R1003-hostfile-too-few-nodes", code="R1003",
         text=BASE_HEAD + "batch { micro = 8 }\n"
              'cluster { gpus = 8, nodes = 2, hostfile = "R1003-one-host.hostfile" }\n',
         base=BASE_HEAD + "batch { micro = 8 }\n"
              'cluster { gpus = 8, nodes = 2, hostfile = "R1003-two-hosts.hostfile" }\n',
         files={"R1003-one-host.hostfile": "worker-1 slots=8\n",
                "R1003-two-hosts.hostfile": "worker-1 slots=8\nworker-2 slots=8\n"},
         patch=[{"file": "launch.sh", "replace": ["--hostfile R1003-two-hosts.hostfile",
                                                  "--hostfile R1003-one-host.hostfile"]}],
         expect="launch",
         match="train_batch_size is not equal to micro_batch_per_gpu * gradient_acc_step * "
               "world_size 128 != 8 * 1 * 8",
         why="deepspeed.launcher.runner: apply_num_nodes_and_gpus keeps the one host listed; "
             "DeepSpeedConfig._batch_assertion at world size 8"),
    # A hostfile line the launcher cannot read ("host:slots" instead of "host slots=N"): it
    # stops before starting anything (runner._parse_hostfile).
    dict(slug="R1002-hostfile-invalid", code="R1002",
         text=BASE_HEAD + "batch { micro = 8 }\n"
              'cluster { gpus = 8, nodes = 2, hostfile = "R1002-bad-line.hostfile" }\n',
         base=BASE_HEAD + "batch { micro = 8 }\n"
              'cluster { gpus = 8, nodes = 2, hostfile = "R1003-two-hosts.hostfile" }\n',
         files={"R1002-bad-line.hostfile": "worker-1 slots=8\nworker-2:8\n",
                "R1003-two-hosts.hostfile": "worker-1 slots=8\nworker-2 slots=8\n"},
         patch=[{"file": "launch.sh", "replace": ["--hostfile R1003-two-hosts.hostfile",
                                                  "--hostfile R1002-bad-line.hostfile"]}],
         expect="launch",
         match="Hostfile contains a bad entry: worker-2:8",
         why="deepspeed.launcher.runner._parse_hostfile refuses the line"),
]


def kept(recipe: str | None, path: Path, name: str, dropped: list) -> bool:
    """Whether the candidate at `path` stays: `recipe check` finds no error in it (or no binary
    was given). A rejected candidate is deleted and recorded in `dropped` as (name, codes)."""
    if not recipe:
        return True
    errs = check_errors(recipe, path)
    if errs:
        dropped.append((name, errs))
        path.unlink()
    return not errs


def write_corpus(out: Path, count: int, recipe: str | None) -> list[str]:
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    rng = random.Random(SEED)
    written, dropped = [], []
    i = 0
    n = 0
    while n < count:
        slug, text = gen_case(i, rng)
        i += 1
        name = f"{n:03d}-{slug}"
        path = out / f"{name}.rcp"
        path.write_text(text)
        if not kept(recipe, path, name, dropped):
            continue
        written.append(name)
        n += 1
        if i > count * 3:
            sys.exit(f"gen_corpus: too many candidates rejected ({len(dropped)})")
    for slug, data, blocks in FEATURES:
        name = f"{n:03d}-{slug}"
        path = out / f"{name}.rcp"
        path.write_text(feature_case(slug, data, blocks, n))
        if not kept(recipe, path, name, dropped):
            continue
        written.append(name)
        n += 1
    for name, errs in dropped:
        print(f"gen_corpus: dropped candidate {name}: {', '.join(errs)}", file=sys.stderr)
    return written


def check_errors(recipe: str, path: Path) -> list[str]:
    """The error codes `recipe check --format json` reports for a file."""
    p = subprocess.run([recipe, "check", "--format", "json", str(path)],
                       capture_output=True, text=True)
    codes = []
    for line in p.stdout.splitlines():
        line = line.strip()
        if not line:
            continue
        try:
            d = json.loads(line)
        except json.JSONDecodeError:
            continue
        if d.get("severity") == "error":
            codes.append(d.get("code", "?"))
    if p.returncode != 0 and not codes:
        codes.append(f"exit {p.returncode}: {p.stderr.strip()[:200]}")
    return codes


def write_rejected(out: Path, recipe: str | None) -> None:
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    for n, case in enumerate(REJECTED):
        name = f"{n:03d}-{case['slug']}"
        for fname, content in case.get("files", {}).items():  # e.g. hostfiles the recipes name
            (out / fname).write_text(content)
        rcp = out / f"{name}.rcp"
        rcp.write_text(f'recipe "{case["slug"]}"\n' + case["text"])
        base = out / f"{name}.base.rcp"
        base.write_text(f'recipe "{case["slug"]}-base"\n' + case["base"])
        meta = {k: v for k, v in case.items() if k not in ("text", "base")}
        meta["recipe"] = rcp.name
        meta["base"] = base.name
        if recipe:
            meta["checker_errors"] = check_errors(recipe, rcp)
            meta["base_checker_errors"] = check_errors(recipe, base)
            if case["code"] not in meta["checker_errors"]:
                print(f"gen_corpus: {name}: expected {case['code']}, checker said "
                      f"{meta['checker_errors']}", file=sys.stderr)
            if meta["base_checker_errors"]:
                print(f"gen_corpus: {name}: base has errors {meta['base_checker_errors']}",
                      file=sys.stderr)
        (out / f"{name}.json").write_text(json.dumps(meta, indent=1, sort_keys=True) + "\n")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--recipe", help="recipe binary: drop candidates `recipe check` rejects")
    ap.add_argument("--count", type=int, default=220)
    ap.add_argument("--out", type=Path, default=HERE / "corpus")
    ap.add_argument("--rejected-out", type=Path, default=HERE / "corpus-rejected")
    a = ap.parse_args()
    names = write_corpus(a.out, a.count, a.recipe)
    write_rejected(a.rejected_out, a.recipe)
    print(f"gen_corpus: {len(names)} recipes in {a.out}, {len(REJECTED)} in {a.rejected_out}")


if __name__ == "__main__":
    main()
