#!/usr/bin/env python3
"""PyTorch/transformers reference for `runtime/tests/parity.rs`.

Run from the repository root with the conformance venv (torch 2.15, transformers 5.24):
    conformance/.venv/bin/python runtime/reference/make_parity_fixtures.py
It rewrites runtime/tests/fixtures/parity/. Everything is seeded, so a rerun reproduces the files up
to PyTorch's own kernel numerics.

Layout written:
  full/config.json, full/model.safetensors   BertForSequenceClassification state dict ("bert." prefix,
                                             classifier head included), the weights every case starts from
  encoder/config.json, encoder/model.safetensors
                                             the same encoder as a bare BertModel file: no prefix, the
                                             I64 embeddings.position_ids buffer, no head (like MiniLM)
  case_a.safetensors   one padded batch: inputs, logits, loss, grad.<param> for every parameter
                       (raw PyTorch values: the key biases' are rounding noise around an exact 0)
  case_b.safetensors   AdamW + accumulation 3 + clipping + linear warmup schedule, 20 steps: the
                       60 micro-batches, per-step loss and pre-clip grad norm, lr, final.<param>
                       (key-bias gradient noise zeroed before clipping, see run())
  case_c.safetensors   Adam with L2 decay (torch.optim.Adam), 5 steps, no accumulation
"""
import json
import os
import shutil

import torch
from safetensors.torch import save_file
from transformers import BertConfig, BertForSequenceClassification, get_linear_schedule_with_warmup

torch.manual_seed(0)
torch.set_num_threads(1)
OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "fixtures", "parity")

NUM_LABELS = 3
cfg = BertConfig(
    vocab_size=99,
    hidden_size=32,
    num_hidden_layers=2,
    num_attention_heads=4,
    intermediate_size=37,
    max_position_embeddings=64,
    type_vocab_size=2,
    layer_norm_eps=1e-12,
    hidden_dropout_prob=0.0,
    attention_probs_dropout_prob=0.0,
    initializer_range=0.02,
    pad_token_id=0,
    num_labels=NUM_LABELS,
)
# Eager attention: the additive finfo(float32).min mask, the semantics the runtime implements.
cfg._attn_implementation = "eager"
model = BertForSequenceClassification(cfg)
# A larger init than HF's 0.02 so that gradients are not tiny and every op matters numerically.
with torch.no_grad():
    for n, p in model.named_parameters():
        if "LayerNorm" in n:
            p.add_(0.1 * torch.randn_like(p))
        else:
            p.copy_(0.2 * torch.randn_like(p))
model.eval()  # dropout is 0 anyway; eval keeps it explicit

names = [n for n, _ in model.named_parameters()]
init = {n: p.detach().clone().contiguous() for n, p in model.named_parameters()}


def write_dir(d, tensors, config_dict):
    os.makedirs(d, exist_ok=True)
    save_file(tensors, os.path.join(d, "model.safetensors"), metadata={"format": "pt"})
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(config_dict, f, indent=2, sort_keys=True)


if os.path.isdir(OUT):
    shutil.rmtree(OUT)
os.makedirs(OUT)
base_cfg = cfg.to_dict()
base_cfg.pop("_attn_implementation_autoset", None)
write_dir(os.path.join(OUT, "full"), init, base_cfg)
enc = {n[len("bert."):]: t for n, t in init.items() if n.startswith("bert.")}
enc["embeddings.position_ids"] = torch.arange(cfg.max_position_embeddings, dtype=torch.int64)[None, :]
enc_cfg = dict(base_cfg)
enc_cfg["architectures"] = ["BertModel"]
for k in ("id2label", "label2id", "num_labels"):
    enc_cfg.pop(k, None)
write_dir(os.path.join(OUT, "encoder"), enc, enc_cfg)

gen = torch.Generator().manual_seed(1234)


def make_batch(b, t):
    """Random ids with varying real lengths (>= 2), [CLS]-like first token, pads = 0 after the end;
    token_type 1 on the second half of the real tokens of some rows."""
    ids = torch.randint(1, cfg.vocab_size, (b, t), generator=gen)
    lens = torch.randint(2, t + 1, (b,), generator=gen)
    lens[0] = t  # one full-length row
    mask = (torch.arange(t)[None, :] < lens[:, None]).long()
    ids = ids * mask
    tt = torch.zeros(b, t, dtype=torch.long)
    for i in range(b):
        if i % 2 == 1:
            tt[i, lens[i] // 2: lens[i]] = 1
    labels = torch.randint(0, NUM_LABELS, (b,), generator=gen)
    return ids, tt, mask, labels


def i32(x):
    return x.to(torch.int32).contiguous()


# ---- case a: one padded batch, forward + backward ------------------------------------------
ids, tt, mask, labels = make_batch(5, 11)
model.zero_grad()
out = model(input_ids=ids, token_type_ids=tt, attention_mask=mask, labels=labels)
out.loss.backward()
case_a = {
    "input_ids": i32(ids), "token_type_ids": i32(tt), "attention_mask": i32(mask), "labels": i32(labels),
    "logits": out.logits.detach().contiguous(), "loss": out.loss.detach().reshape(1),
}
for n, p in model.named_parameters():
    case_a["grad." + n] = p.grad.detach().clone().contiguous()
save_file(case_a, os.path.join(OUT, "case_a.safetensors"))


# ---- case b: AdamW, accumulation 3, clipping, linear warmup schedule --------------------------
def no_decay(n):
    # HF Trainer's grouping: no weight decay on biases and LayerNorm weights.
    return "bias" in n or "LayerNorm.weight" in n


def run(steps, accum, opt_factory, clip, schedule, b, t):
    with torch.no_grad():
        for n, p in model.named_parameters():
            p.copy_(init[n])
    params = dict(model.named_parameters())
    groups = [
        {"params": [params[n] for n in names if not no_decay(n)], "weight_decay": 0.01},
        {"params": [params[n] for n in names if no_decay(n)], "weight_decay": 0.0},
    ]
    opt = opt_factory(groups)
    sched = get_linear_schedule_with_warmup(opt, 4, steps) if schedule else None
    batches = [make_batch(b, t) for _ in range(steps * accum)]
    losses, norms, lrs = [], [], []
    for s in range(steps):
        opt.zero_grad()
        total = 0.0
        for a in range(accum):
            ids, tt, mask, labels = batches[s * accum + a]
            loss = model(input_ids=ids, token_type_ids=tt, attention_mask=mask, labels=labels).loss / accum
            loss.backward()
            total += loss.item()
        # The key bias's gradient is exactly zero in exact arithmetic (a constant added to every
        # score of a query row does not change its softmax); PyTorch's value is rounding noise
        # (~1e-9), which Adam's eps-limited normalisation turns into a random walk of ~0.1·lr per
        # step. The runtime does not accumulate that noise, so the reference drops it too.
        for n, p in model.named_parameters():
            if n.endswith("attention.self.key.bias"):
                p.grad.zero_()
        if clip is not None:
            norm = torch.nn.utils.clip_grad_norm_(model.parameters(), clip, foreach=False).item()
        else:
            norm = torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in model.parameters()])).item()
        lrs.append(opt.param_groups[0]["lr"])
        opt.step()
        if sched is not None:
            sched.step()
        losses.append(total)
        norms.append(norm)
    rec = {
        "input_ids": i32(torch.stack([x[0] for x in batches])),
        "token_type_ids": i32(torch.stack([x[1] for x in batches])),
        "attention_mask": i32(torch.stack([x[2] for x in batches])),
        "labels": i32(torch.stack([x[3] for x in batches])),
        "loss": torch.tensor(losses, dtype=torch.float32),
        "grad_norm": torch.tensor(norms, dtype=torch.float32),
        "lr": torch.tensor(lrs, dtype=torch.float64),
    }
    for n, p in model.named_parameters():
        rec["final." + n] = p.detach().clone().contiguous()
    return rec, norms


CLIP = 2.5
case_b, norms = run(
    20, 3,
    lambda g: torch.optim.AdamW(g, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, foreach=False, fused=False),
    CLIP, True, 4, 9,
)
clipped = sum(1 for x in norms if x > CLIP)
assert 0 < clipped < len(norms), f"clipping must bite on some steps only: {norms}"
save_file(case_b, os.path.join(OUT, "case_b.safetensors"),
          metadata={"max_norm": str(CLIP), "steps": "20", "accum": "3", "warmup": "4", "clipped_steps": str(clipped)})

# ---- case c: Adam with L2 decay (DeepSpeed adam_w_mode=false), constant LR ----------------------
case_c, _ = run(
    5, 1,
    lambda g: torch.optim.Adam(g, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, foreach=False, fused=False),
    None, False, 4, 9,
)
save_file(case_c, os.path.join(OUT, "case_c.safetensors"), metadata={"steps": "5", "accum": "1"})
print("clipped steps:", clipped, "of", len(norms), "norms:", ["%.3f" % x for x in norms])
