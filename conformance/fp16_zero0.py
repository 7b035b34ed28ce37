#!/usr/bin/env python3
"""R0510's evidence: does DeepSpeed scale an fp16 loss at ZeRO stage 0?

Run with the conformance venv on the CPU (DeepSpeed's shm communicator is JIT-built on first use,
a few minutes; ninja comes from the venv):
    PATH=conformance/.venv/bin:$PATH DS_ACCELERATOR=cpu conformance/.venv/bin/python conformance/fp16_zero0.py

One `Linear` in fp16, SGD with lr 1 (so the applied update is the gradient DeepSpeed steps with),
a dynamic loss scale starting at 2^8. It prints the engine's gradient against the true gradient
of the same half weights, and the applied update against it. DeepSpeed 0.19.8 printed 0.99996
and 0.0040 (= 1/256): the loss was not scaled, but the step divided by the scale.
"""
import os

import deepspeed
import torch

for k, v in {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29561", "RANK": "0", "WORLD_SIZE": "1",
             "LOCAL_RANK": "0"}.items():
    os.environ.setdefault(k, v)

torch.manual_seed(0)
model = torch.nn.Linear(4, 2)
config = {
    "train_micro_batch_size_per_gpu": 2,
    "gradient_accumulation_steps": 1,
    "optimizer": {"type": "SGD", "params": {"lr": 1.0}},
    "fp16": {"enabled": True, "loss_scale": 0, "initial_scale_power": 8},
    "zero_optimization": {"stage": 0},
}
engine, optimizer, _, _ = deepspeed.initialize(model=model, config=config, model_parameters=model.parameters())
print("deepspeed", deepspeed.__version__, "optimizer", type(optimizer).__name__)
x = torch.randn(2, 4).half()
y = torch.tensor([0, 1])
w0 = engine.module.weight.detach().float().clone()
loss = torch.nn.functional.cross_entropy(engine(x).float(), y)
engine.backward(loss)
grad = engine.module.weight.grad.detach().float().clone()
# The true gradient of the same (half) weights, in fp32.
ref = torch.nn.Linear(4, 2)
ref.weight.data = w0.clone()
ref.bias.data = engine.module.bias.detach().float().clone()
torch.nn.functional.cross_entropy(ref(x.float()), y).backward()
true = ref.weight.grad.norm()
print("engine gradient / true gradient:", (grad.norm() / true).item())
engine.step()
update = engine.module.weight.detach().float() - w0
print("applied update (SGD, lr 1) / true gradient:", (update.norm() / true).item())
