"""PyTorch CPU peer for the native runtime's training benchmark (`cargo bench -p recipe-runtime`).

Trains HF's BertForSequenceClassification of a given shape on random token ids with AdamW, fp32,
dropout 0, and prints one JSON line: {"samples_per_s": ..., "ms_per_step": ..., "threads": ...}.
Run with the conformance venv's python (torch + transformers); the Rust bench calls it with the
same shape and thread count it measures itself.
"""
import argparse, json, time

import torch
from transformers import BertConfig, BertForSequenceClassification

ap = argparse.ArgumentParser()
ap.add_argument("--layers", type=int, default=6)
ap.add_argument("--hidden", type=int, default=384)
ap.add_argument("--heads", type=int, default=12)
ap.add_argument("--intermediate", type=int, default=1536)
ap.add_argument("--vocab", type=int, default=30522)
ap.add_argument("--batch", type=int, default=16)
ap.add_argument("--seq", type=int, default=128)
ap.add_argument("--steps", type=int, default=5)
ap.add_argument("--warmup", type=int, default=1)
ap.add_argument("--threads", type=int, default=1)
a = ap.parse_args()

torch.set_num_threads(a.threads)
torch.manual_seed(0)
cfg = BertConfig(vocab_size=a.vocab, hidden_size=a.hidden, num_hidden_layers=a.layers,
                 num_attention_heads=a.heads, intermediate_size=a.intermediate,
                 hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, num_labels=2)
model = BertForSequenceClassification(cfg)
model.train()
opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.01)
ids = torch.randint(0, a.vocab, (a.batch, a.seq))
mask = torch.ones_like(ids)
labels = torch.randint(0, 2, (a.batch,))

def step():
    out = model(input_ids=ids, attention_mask=mask, labels=labels)
    out.loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    opt.zero_grad(set_to_none=True)

for _ in range(a.warmup):
    step()
times = []
for _ in range(a.steps):
    t = time.perf_counter()
    step()
    times.append(time.perf_counter() - t)
best = min(times)
print(json.dumps({"samples_per_s": a.batch / best, "ms_per_step": best * 1e3,
                  "threads": a.threads, "torch": torch.__version__}))
