"""PyTorch eager peer of scripts/gpu-throughput.sh: BERT for sequence classification trained with
autocast bf16 and fused AdamW, the way a PyTorch user would run it, on fixed-length random token
ids; prints one JSON line with the samples per second of the timed steps.

HF's BertForSequenceClassification when transformers is installed (its default attention, SDPA
on recent releases), else the same architecture written here in plain torch (embeddings with
LayerNorm, post-LN encoder layers with `scaled_dot_product_attention`, erf GELU, the tanh pooler,
the classifier; dropout 0.1 where BERT has it), so the script runs on a machine with torch only.

    python3 torch_bert_bench.py [--device cuda] [--layers 12 --hidden 768 ...] [--steps 40]
"""
import argparse
import json
import statistics
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

ap = argparse.ArgumentParser()
ap.add_argument("--device", default="cuda")
ap.add_argument("--layers", type=int, default=12)
ap.add_argument("--hidden", type=int, default=768)
ap.add_argument("--heads", type=int, default=12)
ap.add_argument("--intermediate", type=int, default=3072)
ap.add_argument("--vocab", type=int, default=30522)
ap.add_argument("--batch", type=int, default=32)
ap.add_argument("--seq", type=int, default=128)
ap.add_argument("--steps", type=int, default=40)
ap.add_argument("--warmup", type=int, default=10, help="untimed steps first")
ap.add_argument("--plain", action="store_true", help="the plain-torch model even with transformers")
ap.add_argument("--profile", metavar="PATH",
                help="after the timed steps, profile 3 more with torch.profiler and write each CUDA "
                     "kernel's calls and microseconds per step to PATH (JSON)")
a = ap.parse_args()


class Layer(nn.Module):
    def __init__(self, h, heads, inter, p):
        super().__init__()
        self.heads, self.p = heads, p
        self.qkv = nn.Linear(h, 3 * h)
        self.out = nn.Linear(h, h)
        self.ln1 = nn.LayerNorm(h, eps=1e-12)
        self.up = nn.Linear(h, inter)
        self.down = nn.Linear(inter, h)
        self.ln2 = nn.LayerNorm(h, eps=1e-12)

    def forward(self, x, bias):
        b, t, h = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, self.heads, h // self.heads).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=bias,
                                           dropout_p=self.p if self.training else 0.0)
        y = y.transpose(1, 2).reshape(b, t, h)
        x = self.ln1(x + F.dropout(self.out(y), self.p, self.training))
        y = self.down(F.gelu(self.up(x)))
        return self.ln2(x + F.dropout(y, self.p, self.training))


class PlainBert(nn.Module):
    def __init__(self, a, labels=2, p=0.1):
        super().__init__()
        self.p = p
        self.word = nn.Embedding(a.vocab, a.hidden)
        self.pos = nn.Embedding(512, a.hidden)
        self.typ = nn.Embedding(2, a.hidden)
        self.ln = nn.LayerNorm(a.hidden, eps=1e-12)
        self.layers = nn.ModuleList(Layer(a.hidden, a.heads, a.intermediate, p)
                                    for _ in range(a.layers))
        self.pool = nn.Linear(a.hidden, a.hidden)
        self.cls = nn.Linear(a.hidden, labels)

    def forward(self, input_ids, attention_mask, labels):
        t = input_ids.shape[1]
        pos = torch.arange(t, device=input_ids.device)
        x = self.word(input_ids) + self.pos(pos)[None] + self.typ(torch.zeros_like(input_ids))
        x = F.dropout(self.ln(x), self.p, self.training)
        # HF's additive mask: 0 where attended, the dtype's lowest value where padded.
        bias = (1.0 - attention_mask[:, None, None, :].to(x.dtype)) * torch.finfo(x.dtype).min
        for layer in self.layers:
            x = layer(x, bias)
        pooled = torch.tanh(self.pool(x[:, 0]))
        logits = self.cls(F.dropout(pooled, self.p, self.training))
        return F.cross_entropy(logits.float(), labels)


impl = "plain torch"
# Which attention PyTorch runs (HF's choice on its release; the plain model's SDPA): ours
# materialises the probabilities, so this says what the comparison is against.
attention = "sdpa"
model = None
if not a.plain:
    try:
        import transformers
        from transformers import BertConfig, BertForSequenceClassification
        cfg = BertConfig(vocab_size=a.vocab, hidden_size=a.hidden, num_hidden_layers=a.layers,
                         num_attention_heads=a.heads, intermediate_size=a.intermediate,
                         num_labels=2)
        hf = BertForSequenceClassification(cfg)
        model = lambda **kw: hf(**kw).loss  # noqa: E731
        params = list(hf.parameters())
        module = hf
        impl = f"transformers {transformers.__version__} BertForSequenceClassification"
        attention = str(getattr(hf.config, "_attn_implementation", None))
    except ImportError:
        pass
if model is None:
    module = PlainBert(a)
    model = module
    params = list(module.parameters())

dev = torch.device(a.device)
module.to(dev).train()
torch.manual_seed(0)
fused = dev.type == "cuda"
opt = torch.optim.AdamW(params, lr=1e-4, weight_decay=0.01, fused=fused)
ids = torch.randint(1000, a.vocab, (a.batch, a.seq), device=dev)
mask = torch.ones_like(ids)
labels = torch.randint(0, 2, (a.batch,), device=dev)
amp = torch.bfloat16


def sync():
    if dev.type == "cuda":
        torch.cuda.synchronize()


def train_step():
    with torch.autocast(dev.type, dtype=amp):
        loss = model(input_ids=ids, attention_mask=mask, labels=labels)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(params, 1.0)
    opt.step()
    opt.zero_grad(set_to_none=True)


times = []
for step in range(a.warmup + a.steps):
    sync()
    t0 = time.perf_counter()
    train_step()
    sync()
    if step >= a.warmup:
        times.append(time.perf_counter() - t0)

if a.profile:
    # Where the peer's GPU time goes, for scripts/gpu-profile.sh: each kernel's calls and
    # microseconds per step (CUPTI's device times, not the host's).
    from torch.profiler import ProfilerActivity, profile
    n = 3
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(n):
            train_step()
        sync()
    # The Chrome trace's GPU events (its format is the stable interface: "cat" and "dur" in µs).
    prof.export_chrome_trace(a.profile + ".trace")
    rows = {}
    for e in json.load(open(a.profile + ".trace"))["traceEvents"]:
        if e.get("cat") not in ("kernel", "gpu_memcpy", "gpu_memset"):
            continue
        r = rows.setdefault(e["name"], [0, 0.0])
        r[0] += 1
        r[1] += e.get("dur", 0.0)
    with open(a.profile, "w") as f:
        json.dump(sorted(({"name": k, "calls_per_step": c / n, "us_per_step": t / n}
                          for k, (c, t) in rows.items()), key=lambda r: -r["us_per_step"]),
                  f, indent=1)

med = statistics.median(times)
print(json.dumps({
    "impl": impl, "torch": torch.__version__, "device": str(dev),
    "device_name": torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu",
    "parameters": sum(p.numel() for p in params), "batch": a.batch, "seq": a.seq,
    "steps_timed": len(times), "median_step_s": med, "samples_per_s": a.batch / med,
    "autocast": "bf16", "optimizer": "AdamW (fused)" if fused else "AdamW",
    "attention": attention,
}))
