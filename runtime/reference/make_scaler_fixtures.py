#!/usr/bin/env python3
"""DeepSpeed's own fp16 loss scalers, driven by overflow sequences, for `runtime/tests/scaler.rs`.

Run with the conformance venv (DeepSpeed 0.19.8, torch 2.15; `conformance/setup.sh`):
    conformance/.venv/bin/python runtime/reference/make_scaler_fixtures.py
It rewrites runtime/tests/fixtures/scaler/scalers.json. No GPU is needed: the scalers are plain
Python state machines.

Two implementations, as DeepSpeed 0.19 wires them:
  zero             deepspeed.runtime.fp16.loss_scaler.DynamicLossScaler (the ZeRO-1/2/3 optimizers
                   build it through CreateLossScaler), with hysteresis and an exception at the
                   minimum scale; and LossScaler for a static scale.
  fp16_optimizer   FP16_Optimizer._update_scale and FP16_UnfusedOptimizer._update_scale (ZeRO-0),
                   both recorded, over a LossScaleConfig built as the engine builds it
                   (engine._configure_fp16_optimizer: dynamic_loss_args from the fp16 section).

The only shim: `DynamicLossScaler.update_scale` logs through `deepspeed.comm.get_rank()`, which needs
an initialised process group; a stand-in returning rank 0 replaces the module's `dist` here.
"""
import itertools
import json
import os
import random

import torch
import deepspeed
from deepspeed.runtime.fp16 import loss_scaler as ls
from deepspeed.runtime.fp16.fused_optimizer import FP16_Optimizer
from deepspeed.runtime.fp16.unfused_optimizer import FP16_UnfusedOptimizer


class _Rank0:
    @staticmethod
    def get_rank():
        return 0


ls.dist = _Rank0()
OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "fixtures", "scaler")


def sequences():
    """Overflow patterns: streaks, alternation, a long good run, and seeded random ones."""
    seqs = [
        [True] * 6 + [False] * 10,
        [True, False] * 8,
        [False] * 9 + [True, True, True] + [False] * 9,
        [True, True, False, True, False, False, True, True, True, False, False, False, False],
    ]
    rng = random.Random(1234)
    for p in (0.1, 0.3, 0.6):
        seqs.append([rng.random() < p for _ in range(40)])
    return seqs


def run_zero(cfg, seq):
    if cfg["static"] is not None:
        s = ls.CreateLossScaler(torch.half, cfg["static"], False, None)
    else:
        s = ls.CreateLossScaler(
            torch.half,
            0,
            True,
            {
                ls.INITIAL_LOSS_SCALE: 2 ** cfg["power"],
                ls.SCALE_WINDOW: cfg["window"],
                ls.DELAYED_SHIFT: cfg["hysteresis"],
                ls.CONSECUTIVE_HYSTERESIS: cfg["consecutive"],
                ls.MIN_LOSS_SCALE: cfg["min"],
            },
        )
    scales, hyst, error_at = [], [], None
    for i, overflow in enumerate(seq):
        try:
            s.update_scale(overflow)
        except Exception as e:  # the scaler's own "already at minimum" exception
            assert "minimum" in str(e), e
            error_at = i
            break
        scales.append(float(s.cur_scale))
        hyst.append(getattr(s, "cur_hysteresis", None))
    return scales, hyst, error_at


def run_fp16_optimizer(cls, cfg, seq):
    dynamic = cfg["static"] is None
    conf = ls.LossScaleConfig(
        low_precision_dtype=torch.float16,
        dynamic_loss_scale=dynamic,
        static_loss_scale=cfg["static"] if not dynamic else 1.0,
        dynamic_loss_args={
            ls.INITIAL_LOSS_SCALE: 2 ** cfg["power"],
            ls.SCALE_WINDOW: cfg["window"],
            ls.DELAYED_SHIFT: cfg["hysteresis"],
            ls.CONSECUTIVE_HYSTERESIS: cfg["consecutive"],
            ls.MIN_LOSS_SCALE: cfg["min"],
        },
        profile=ls.LossScaleProfile.FUSED if cls is FP16_Optimizer else ls.LossScaleProfile.UNFUSED,
        initial_dynamic_scale=2 ** cfg["power"],
    )
    opt = object.__new__(cls)  # only the scale update runs: no parameters or device needed
    opt.loss_scale_config = conf
    opt.verbose = False
    scales = []
    for overflow in seq:
        opt._update_scale(overflow)
        scales.append(float(conf.cur_scale))
    return scales


def main():
    cases = []
    grid = itertools.product((4, 16), (1, 3, 1000), (1, 2, 3), (False, True), (1, 4))
    configs = [
        dict(static=None, power=p, window=w, hysteresis=h, consecutive=c, min=m) for p, w, h, c, m in grid
    ]
    configs += [dict(static=s, power=16, window=1000, hysteresis=2, consecutive=False, min=1) for s in (1, 128)]
    for cfg in configs:
        for seq in sequences():
            scales, hyst, error_at = run_zero(cfg, seq)
            cases.append(dict(imp="zero", config=cfg, overflows=seq, scales=scales, hysteresis=hyst,
                              error_at=error_at))
            fused = run_fp16_optimizer(FP16_Optimizer, cfg, seq)
            unfused = run_fp16_optimizer(FP16_UnfusedOptimizer, cfg, seq)
            assert fused == unfused, (cfg, seq)
            cases.append(dict(imp="fp16_optimizer", config=cfg, overflows=seq, scales=fused, hysteresis=None,
                              error_at=None))
    os.makedirs(OUT, exist_ok=True)
    doc = dict(deepspeed=deepspeed.__version__, torch=torch.__version__, cases=cases)
    path = os.path.join(OUT, "scalers.json")
    with open(path + ".tmp", "w") as f:
        json.dump(doc, f, separators=(",", ":"))
        f.write("\n")
    os.replace(path + ".tmp", path)
    print(f"{len(cases)} cases -> {os.path.relpath(path)}")


if __name__ == "__main__":
    main()
