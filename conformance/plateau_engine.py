#!/usr/bin/env python3
"""R0315's evidence: what DeepSpeed's engine does with HF's `reduce_lr_on_plateau` and `greedy`.

With a DeepSpeed-built optimizer, HF hands its scheduler to `deepspeed.initialize` as a callable
(transformers integrations/deepspeed.py:deepspeed_optim_sched) and the engine steps it after every
optimizer step. This builds each scheduler the way HF does (`transformers.get_scheduler`), runs a
real engine on the CPU for a few optimizer steps, and records the learning rate after each one
into conformance/fixtures/plateau-engine.json and greedy-engine.json; tests/conformance.rs checks
R0315's arithmetic against them. Run with the conformance venv (DeepSpeed's shm communicator is
JIT-built on first use, a few minutes; ninja comes from the venv):

    PATH=$PWD/conformance/.venv/bin:$PATH DS_ACCELERATOR=cpu conformance/.venv/bin/python conformance/plateau_engine.py
"""
import json
import os
from pathlib import Path

import deepspeed
import torch
import transformers

for k, v in {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29562", "RANK": "0", "WORLD_SIZE": "1",
             "LOCAL_RANK": "0"}.items():
    os.environ.setdefault(k, v)

LR, FACTOR, PATIENCE, MICRO, STEPS = 1e-4, 0.5, 2, 4, 12
# GreedyLR from a higher LR, so that its default floor min_lr = 1e-3 is reached, with a cooldown
# and two reductions tried at the floor before it starts over (reset_start).
GREEDY_LR, GREEDY_STEPS = 1e-2, 24
GREEDY_KWARGS = {"factor": 0.5, "patience": 1, "cooldown": 1, "reset_start": 2}

config = {
    "train_micro_batch_size_per_gpu": MICRO,
    "gradient_accumulation_steps": 1,
    "optimizer": {"type": "SGD", "params": {"lr": LR}},
    "zero_optimization": {"stage": 0},
}


def run(lr, steps, hf_scheduler):
    """A fresh engine over a small model with the scheduler HF would build; the LR after each
    optimizer step, the engine's batch size and the scheduler."""
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    cfg = dict(config, optimizer={"type": "SGD", "params": {"lr": lr}})
    engine, optimizer, _, scheduler = deepspeed.initialize(model=model, config=cfg,
                                                           model_parameters=model.parameters(),
                                                           lr_scheduler=hf_scheduler)
    lrs = []
    for _ in range(steps):
        x, y = torch.randn(MICRO, 4), torch.randint(0, 2, (MICRO,))
        loss = torch.nn.functional.cross_entropy(engine(x), y)
        engine.backward(loss)
        engine.step()
        lrs.append(optimizer.param_groups[0]["lr"])
    return lrs, engine.train_batch_size(), scheduler


def versions():
    return {"deepspeed": deepspeed.__version__, "transformers": transformers.__version__,
            "torch": torch.__version__.split("+")[0]}


def write(name, out):
    path = Path(__file__).resolve().parent / "fixtures" / name
    path.write_text(json.dumps(out, indent=1, sort_keys=True) + "\n")
    print(json.dumps(out))


# What HF's Trainer.create_scheduler builds for lr_scheduler_type = reduce_lr_on_plateau.
lrs, batch, scheduler = run(LR, STEPS, lambda optimizer: transformers.get_scheduler(
    "reduce_lr_on_plateau", optimizer,
    scheduler_specific_kwargs={"factor": FACTOR, "patience": PATIENCE}))
write("plateau-engine.json", {
    "format": "recipe-conformance-plateau-engine/1",
    **versions(),
    "scheduler": type(scheduler).__name__,
    "lr": LR, "factor": FACTOR, "patience": PATIENCE, "train_batch_size": batch,
    "lr_after_step": lrs,
    "best_metric": scheduler.best,
})

# And for lr_scheduler_type = greedy (transformers >= 5.4.0: get_greedy_schedule → GreedyLR).
lrs, batch, scheduler = run(GREEDY_LR, GREEDY_STEPS, lambda optimizer: transformers.get_scheduler(
    "greedy", optimizer, scheduler_specific_kwargs=GREEDY_KWARGS))
write("greedy-engine.json", {
    "format": "recipe-conformance-greedy-engine/1",
    **versions(),
    "scheduler": type(scheduler).__name__,
    "lr": GREEDY_LR, "kwargs": GREEDY_KWARGS, "train_batch_size": batch,
    "lr_after_step": lrs,
    "best_metric": scheduler.best,
})
