#!/usr/bin/env python3
"""PyTorch reference for `runtime/tests/mixed_parity.rs`: fp16 and bf16 mixed-precision training
of the tiny BERT with DeepSpeed's semantics, on CPU.

Run from the repository root with the conformance venv (torch 2.15, transformers 5.24; DeepSpeed
is not imported, its arithmetic is written out below):
    conformance/.venv/bin/python runtime/reference/make_mixed_fixtures.py
It rewrites runtime/tests/fixtures/mixed_parity/{fp16,bf16}.safetensors. It reads, and never
writes, runtime/tests/fixtures/parity/: the starting weights `full/` and the micro-batches of
`case_b.safetensors` (regenerate those first with make_parity_fixtures.py if they change).
Everything is deterministic (one thread, no dropout), so a rerun reproduces the files up to
PyTorch's own kernel numerics.

The training (both dtypes): 20 optimizer steps, 2 micro-batches of 4 x 9 tokens per step (the
first 40 micro-batches of case_b), eager attention, dropout 0, AdamW(lr 1e-3, betas 0.9/0.999,
eps 1e-8, weight decay 0.01 except biases and LayerNorm weights, foreach=False, fused=False),
HF's linear schedule with 4 warmup steps, gradient clipping at MAX_NORM. As DeepSpeed's ZeRO-0
`FP16_Optimizer` with the default grad_accum_dtype (= the module's dtype):
  - the module is converted to the half dtype (`model.half()` / `model.to(torch.bfloat16)`); the
    optimizer steps fp32 master copies of the converted (already rounded) parameters;
  - per micro-batch: `loss = model(..., labels=...).loss` (half logits, HF's CrossEntropyLoss on
    them, so the loss is a half value), then `(loss.float() * S / ACCUM).backward()`: autograd
    accumulates the scaled gradients in the half `.grad` of every parameter;
  - the key biases' gradients are zeroed (exactly 0 mathematically, rounding noise here; the
    runtime never accumulates them: see make_parity_fixtures.py and parity.rs `is_key_bias`);
  - overflow check (any inf/NaN; none happens in these runs, the script asserts it); the norm of
    the scaled half gradients, summed in float64; DeepSpeed's `unscale_and_clip_grads`:
    clip_ratio = (norm / S + 1e-6) / MAX_NORM, combined = clip_ratio * S if clip_ratio > 1 else S;
    fp32 gradients = grad.float() * float32(1 / combined);
  - AdamW steps the fp32 masters, the scheduler steps, and the masters are copied back into the
    half parameters (round to nearest even).
fp16 uses a static loss scale S = 1024; bf16 has no loss scale (S = 1).

Layout written (one file per dtype; float tensors are F32 unless marked):
  input_ids, token_type_ids, attention_mask  I32 [40, 4, 9]   the micro-batches, in order
  labels                                     I32 [40, 4]
  loss        [20]   the step's mean loss as training sees it: mean over its micro-batches of the
                     half loss value, as float
  loss_f32    [20]   the same logits' cross-entropy computed in float32 (F.cross_entropy on
                     logits.float(); a side computation that does not enter the training)
  grad_norm   [20]   the unscaled gradient norm before clipping (scaled norm / S)
  lr          F64 [20]  the learning rate of each step
  combined_scale F64 [20]  DeepSpeed's combined unscale-and-clip factor of each step
  step1_grad.<param>  (half dtype) the accumulated scaled half gradients of step 1, before the
                     key-bias zeroing (so the key biases show PyTorch's rounding noise)
  master.<param>      the fp32 master weights after the 20 steps (HF parameter names)
  final.<param>       (half dtype) the model's half weights after the 20 steps
Metadata: dtype, loss_scale, max_norm, steps, accum, warmup, clipped_steps.
"""
import os

import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file
from transformers import BertForSequenceClassification, get_linear_schedule_with_warmup

torch.manual_seed(0)
torch.set_num_threads(1)
HERE = os.path.dirname(os.path.abspath(__file__))
PARITY = os.path.join(HERE, "..", "tests", "fixtures", "parity")
OUT = os.path.join(HERE, "..", "tests", "fixtures", "mixed_parity")

STEPS, ACCUM, WARMUP = 20, 2, 4
MAX_NORM = 3.0
LR, WD = 1e-3, 0.01

case_b = load_file(os.path.join(PARITY, "case_b.safetensors"))
N_MICRO = STEPS * ACCUM
inputs = {k: case_b[k][:N_MICRO].clone().contiguous()
          for k in ("input_ids", "token_type_ids", "attention_mask", "labels")}
assert inputs["input_ids"].shape[0] == N_MICRO, "case_b has too few micro-batches"


def no_decay(n):
    # HF Trainer's grouping: no weight decay on biases and LayerNorm weights.
    return "bias" in n or "LayerNorm.weight" in n


def is_key_bias(n):
    return n.endswith("attention.self.key.bias")


def train(dtype, scale):
    model = BertForSequenceClassification.from_pretrained(
        os.path.join(PARITY, "full"), attn_implementation="eager")
    assert model.config.hidden_dropout_prob == 0.0 and model.config.attention_probs_dropout_prob == 0.0
    model.eval()  # dropout is 0 anyway; eval keeps it explicit
    model.to(dtype)
    names = [n for n, _ in model.named_parameters()]
    params = dict(model.named_parameters())
    master = {n: torch.nn.Parameter(p.detach().float().clone()) for n, p in params.items()}
    groups = [
        {"params": [master[n] for n in names if not no_decay(n)], "weight_decay": WD},
        {"params": [master[n] for n in names if no_decay(n)], "weight_decay": 0.0},
    ]
    opt = torch.optim.AdamW(groups, lr=LR, betas=(0.9, 0.999), eps=1e-8, foreach=False, fused=False)
    sched = get_linear_schedule_with_warmup(opt, WARMUP, STEPS)
    losses, losses32, norms, lrs, combined_scales = [], [], [], [], []
    rec = {}
    for s in range(STEPS):
        model.zero_grad(set_to_none=True)
        total, total32 = 0.0, 0.0
        for a in range(ACCUM):
            i = s * ACCUM + a
            labels = inputs["labels"][i].long()
            out = model(input_ids=inputs["input_ids"][i].long(),
                        token_type_ids=inputs["token_type_ids"][i].long(),
                        attention_mask=inputs["attention_mask"][i].long(),
                        labels=labels)
            assert out.loss.dtype == dtype and out.logits.dtype == dtype
            (out.loss.float() * scale / ACCUM).backward()
            total += out.loss.float().item() / ACCUM
            with torch.no_grad():
                total32 += F.cross_entropy(out.logits.float(), labels).item() / ACCUM
        if s == 0:
            for n in names:
                rec["step1_grad." + n] = params[n].grad.detach().clone().contiguous()
        for n in names:
            if is_key_bias(n):
                params[n].grad.zero_()
        grads = [params[n].grad for n in names]
        assert all(g.dtype == dtype for g in grads)
        overflow = any(not torch.isfinite(g).all() for g in grads)
        assert not overflow, f"step {s}: the gradients overflowed at scale {scale}"
        scaled_norm = sum(g.double().pow(2).sum() for g in grads).sqrt().item()
        combined = scale
        clip_ratio = (scaled_norm / scale + 1e-6) / MAX_NORM
        if clip_ratio > 1:
            combined = clip_ratio * scale
        unscale = torch.tensor(1.0 / combined, dtype=torch.float32)
        for n in names:
            master[n].grad = params[n].grad.float() * unscale
        lrs.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
        with torch.no_grad():
            for n in names:
                params[n].copy_(master[n])
        losses.append(total)
        losses32.append(total32)
        norms.append(scaled_norm / scale)
        combined_scales.append(combined)
    for k, v in inputs.items():
        rec[k] = v.to(torch.int32).contiguous()
    rec["loss"] = torch.tensor(losses, dtype=torch.float32)
    rec["loss_f32"] = torch.tensor(losses32, dtype=torch.float32)
    rec["grad_norm"] = torch.tensor(norms, dtype=torch.float32)
    rec["lr"] = torch.tensor(lrs, dtype=torch.float64)
    rec["combined_scale"] = torch.tensor(combined_scales, dtype=torch.float64)
    for n in names:
        rec["master." + n] = master[n].detach().clone().contiguous()
        rec["final." + n] = params[n].detach().clone().contiguous()
        assert torch.equal(rec["final." + n], rec["master." + n].to(dtype))
    return rec, norms


os.makedirs(OUT, exist_ok=True)
for tag, dtype, scale in (("fp16", torch.float16, 1024.0), ("bf16", torch.bfloat16, 1.0)):
    rec, norms = train(dtype, scale)
    clipped = sum(1 for x in norms if x > MAX_NORM)
    assert 0 < clipped < len(norms), f"{tag}: clipping must bite on some steps only: {norms}"
    save_file(rec, os.path.join(OUT, f"{tag}.safetensors"), metadata={
        "dtype": tag, "loss_scale": str(scale), "max_norm": str(MAX_NORM), "steps": str(STEPS),
        "accum": str(ACCUM), "warmup": str(WARMUP), "clipped_steps": str(clipped),
    })
    print(f"{tag}: clipped steps {clipped} of {len(norms)}; norms",
          ["%.3f" % x for x in norms], "; losses", ["%.4f" % x for x in rec["loss"].tolist()])
