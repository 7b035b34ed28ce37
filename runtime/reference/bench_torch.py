"""PyTorch CPU peer for the native runtime's training benchmark (`cargo bench -p recipe-runtime`).

HF's BertForSequenceClassification of a given shape on random token ids with AdamW, fp32, dropout 0.
It serves the Rust bench, which interleaves its own rounds with this process's so both sides see
the same machine load: each line read on stdin is `train K` (K training steps: forward, backward,
clipping, AdamW) or `eval K` (K forward passes under no_grad), and the answer is one JSON line
{"mode": ..., "seconds": [per-step times]}. `quit` or end of input stops it. The first line
printed says it is ready: {"ready": true, "torch": version, "threads": n}.
Run with the conformance venv's python (torch + transformers).
"""
import argparse, json, sys, time

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
ap.add_argument("--threads", type=int, default=1)
a = ap.parse_args()

torch.set_num_threads(a.threads)
torch.manual_seed(0)
cfg = BertConfig(vocab_size=a.vocab, hidden_size=a.hidden, num_hidden_layers=a.layers,
                 num_attention_heads=a.heads, intermediate_size=a.intermediate,
                 hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, num_labels=2)
model = BertForSequenceClassification(cfg)
opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.01)
ids = torch.randint(0, a.vocab, (a.batch, a.seq))
mask = torch.ones_like(ids)
labels = torch.randint(0, 2, (a.batch,))


def train_step():
    model.train()
    out = model(input_ids=ids, attention_mask=mask, labels=labels)
    out.loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    opt.zero_grad(set_to_none=True)


def eval_step():
    model.eval()
    with torch.no_grad():
        model(input_ids=ids, attention_mask=mask)


print(json.dumps({"ready": True, "torch": torch.__version__, "threads": a.threads}), flush=True)
for line in sys.stdin:
    words = line.split()
    if not words or words[0] == "quit":
        break
    mode, k = words[0], int(words[1])
    step = train_step if mode == "train" else eval_step
    seconds = []
    for _ in range(k):
        t = time.perf_counter()
        step()
        seconds.append(time.perf_counter() - t)
    print(json.dumps({"mode": mode, "seconds": seconds}), flush=True)
