#!/usr/bin/env python3
"""Checks that transformers loads a checkpoint written by `Classifier::save_pretrained`.

Usage: python check_hf_load.py JOB.json   (written by runtime/tests/parity.rs)
JOB has the checkpoint dir, one batch, the Rust logits and the label names. Exits non-zero when a
key is missing, unexpected or mismatched, when the labels differ, or when the logits disagree.
"""
import json
import sys

import torch
from transformers import BertForSequenceClassification

job = json.load(open(sys.argv[1]))
model, info = BertForSequenceClassification.from_pretrained(job["dir"], output_loading_info=True,
                                                           attn_implementation="eager")
bad = {k: v for k, v in info.items() if v}
assert not bad, f"loading info not clean: {bad}"
assert model.config.num_labels == len(job["labels"]), model.config.num_labels
assert [model.config.id2label[i] for i in range(len(job["labels"]))] == job["labels"], model.config.id2label
model.eval()
shape = (job["batch"], job["seq"])
t = lambda k: torch.tensor(job[k], dtype=torch.long).reshape(shape)
with torch.no_grad():
    logits = model(input_ids=t("input_ids"), token_type_ids=t("token_type_ids"),
                   attention_mask=t("attention_mask")).logits
ours = torch.tensor(job["logits"]).reshape(logits.shape)
err = ((logits - ours).abs().max() / logits.abs().max()).item()
assert err <= 1e-5, f"logits differ: relative error {err}"
print(f"transformers loads the checkpoint cleanly; logits relative error {err:.2e}")
