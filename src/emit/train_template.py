#!/usr/bin/env python3
"""Fine-tunes a sequence classifier with the HF Trainer and DeepSpeed, as a recipe says.

Written for @RECIPE@ by `recipe build`, beside launch.sh, which runs it (`bash launch.sh`);
rebuild rather than edit.

What the recipe says about the model and the data is in the constants below. Everything else
(batch sizes, optimizer, schedule, precision, clipping, evaluation, checkpoints and the DeepSpeed
config) arrives on the command line as TrainingArguments, read by transformers' own
HfArgumentParser: launch.sh passes every field of training_args.json as a flag, under the names
of the transformers release the recipe targets.

Needs torch and `pip install transformers accelerate deepspeed` at the recipe's target versions.
"""

import csv
import inspect
import io
import json
import os
import re
import sys

# ---- What @RECIPE@ says ----
# Paths are relative to the recipe's directory, where launch.sh runs this script.

@CONSTANTS@

# ---- Reading the data, as `recipe run` reads it ----

LABEL2ID = {name: i for i, name in enumerate(LABELS)}


def fail(path, line, message):
    sys.exit(f"error: {path}:{line}: {message}")


def label_id(raw, path, line):
    """The class id of a row's label: one of the recipe's label names, else an id from 0 to
    len(LABELS) - 1, written as a number or (CSV/TSV cells are text) in decimal digits."""
    if isinstance(raw, str):
        if LABELS_NAMED and raw in LABEL2ID:
            return LABEL2ID[raw]
        if re.fullmatch(r"[+-]?[0-9]+", raw):
            number = int(raw)
            if 0 <= number < len(LABELS):
                return number
    elif isinstance(raw, int) and not isinstance(raw, bool) and 0 <= raw < len(LABELS):
        return raw
    if LABELS_NAMED:
        allowed = ", ".join(f"{json.dumps(name, ensure_ascii=False)} or {i}"
                            for i, name in enumerate(LABELS))
    else:
        allowed = f"an id from 0 to {len(LABELS) - 1}"
    written = json.dumps(raw, ensure_ascii=False)
    fail(path, line, f"label {written} is not one of the declared labels ({allowed})")


def row_of(path, line, row):
    """(line, text, text pair, label id) of one parsed JSON row."""
    if not isinstance(row, dict):
        fail(path, line, "expected a JSON object per row")

    def text(field, role):
        if field not in row:
            fail(path, line, f'field "{field}" is missing (the recipe\'s data.{role})')
        if not isinstance(row[field], str):
            fail(path, line, f'field "{field}" (the recipe\'s data.{role}) must be a string')
        return row[field]

    if LABEL not in row:
        fail(path, line, f'field "{LABEL}" is missing (the recipe\'s data.label)')
    return (line, text(TEXT, "text"), text(TEXT_PAIR, "text_pair") if TEXT_PAIR else None,
            label_id(row[LABEL], path, line))


def read_jsonl(path, data):
    """(line, text, text pair, label id) of each JSON object per line; blank lines skipped."""
    rows = []
    for line, raw in enumerate(data.split(b"\n"), start=1):
        if not raw.strip(b" \t\r\n\x0c"):
            continue
        try:
            row = json.loads(raw.decode("utf-8"))
        except ValueError as e:  # UnicodeDecodeError is a ValueError too
            fail(path, line, f"not valid JSON (one object per line is expected): {e}")
        rows.append(row_of(path, line, row))
    return rows


def read_json_array(path, data):
    """The rows of a file that is one JSON array of objects (its first byte is `[`, the test of
    HF's json loader), each on the line where its element starts. As there, an array with no
    `{` before the first `"` in its first 100 bytes is a list of strings: each element is the
    row {"text": element} (datasets 5.2.0, packaged_modules/json/json.py)."""
    strings = b"{" not in data[:100].split(b'"', 1)[0]
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        fail(path, data[:e.start].count(b"\n") + 1, "the row is not valid UTF-8")
    space, decoder = re.compile(r"[ \t\n\r]*"), json.JSONDecoder()
    counted, line = 0, 1

    def line_at(at):
        nonlocal counted, line
        line, counted = line + text.count("\n", counted, at), at
        return line

    rows, at = [], space.match(text, 1).end()
    if text.startswith("]", at):
        at += 1
    else:
        while True:
            try:
                row, end = decoder.raw_decode(text, at)
            except ValueError as e:
                fail(path, e.lineno, f"not valid JSON: {e.msg}")
            rows.append(row_of(path, line_at(at), {"text": row} if strings else row))
            at = space.match(text, end).end()
            if text.startswith(",", at):
                at = space.match(text, at + 1).end()
            elif text.startswith("]", at):
                at += 1
                break
            else:
                fail(path, line_at(at), "`,` or `]` is expected after an element of the array")
    at = space.match(text, at).end()
    if at < len(text):
        fail(path, line_at(at), "something follows the array's `]`")
    return rows


def read_delimited(path, data):
    """(line, text, text pair, label id) of each CSV/TSV record after the header row; RFC 4180
    quoting, empty lines and lines of spaces and tabs skipped."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        fail(path, data[:e.start].count(b"\n") + 1, "the row is not valid UTF-8")
    csv.field_size_limit(2**31 - 1)
    records = csv.reader(io.StringIO(text, newline=""), delimiter="\t" if FORMAT == "tsv" else ",")
    header, rows, line = None, [], 1
    for record in records:
        blank = not record or (len(record) == 1 and not record[0].strip(" \t"))
        if not blank and header is None:
            header = record
            columns = {}
            for key, field in (("text", TEXT), ("text_pair", TEXT_PAIR), ("label", LABEL)):
                if field is not None and field not in header:
                    fail(path, line, f'field "{field}" is missing (the recipe\'s data.{key}); '
                                     f"the header has: {', '.join(header)}")
                columns[key] = header.index(field) if field is not None else None
        elif not blank:
            if len(record) != len(header):
                fail(path, line,
                     f"the row has {len(record)} fields but the header has {len(header)}")
            pair = record[columns["text_pair"]] if TEXT_PAIR else None
            rows.append((line, record[columns["text"]], pair,
                         label_id(record[columns["label"]], path, line)))
        line = records.line_num + 1  # where the next record starts
    return rows


def read_rows(path):
    """Every row of a data file, in file order. Stops at the first bad row, naming its file and
    line, as `recipe run` does."""
    with open(path, "rb") as f:
        data = f.read()
    if data.startswith(b"\xef\xbb\xbf"):  # a byte order mark
        data = data[3:]
    if FORMAT != "jsonl":
        rows = read_delimited(path, data)
    elif data.startswith(b"["):
        rows = read_json_array(path, data)
    else:
        rows = read_jsonl(path, data)
    if not rows:
        fail(path, data.count(b"\n") + 1, "the file has no examples")
    return rows


def encode(tokenizer, rows):
    """The rows tokenized with the model's tokenizer, special tokens included, truncated to
    MAX_LEN tokens (longest first for a pair) and not padded: the collator pads each batch."""
    texts = [text for _, text, _, _ in rows]
    pairs = [pair for _, _, pair, _ in rows] if TEXT_PAIR else None
    encoded = tokenizer(texts, text_pair=pairs, truncation=True, max_length=MAX_LEN)
    return [dict({key: values[i] for key, values in encoded.items()}, labels=row[3])
            for i, row in enumerate(rows)]


def compute_metrics(prediction):
    """Accuracy and F1 as `recipe run` reports them: for two classes the F1 of class 1, for more
    the mean of the classes' F1."""
    logits = prediction.predictions
    logits = logits[0] if isinstance(logits, tuple) else logits
    predicted, gold = logits.argmax(-1), prediction.label_ids

    def f1(c):
        tp = int(((predicted == c) & (gold == c)).sum())
        fp = int(((predicted == c) & (gold != c)).sum())
        fn = int(((predicted != c) & (gold == c)).sum())
        return 2 * tp / (2 * tp + fp + fn) if tp else 0.0

    n = len(LABELS)
    return {"accuracy": float((predicted == gold).mean()),
            "f1": f1(1) if n == 2 else sum(f1(c) for c in range(n)) / n}


def evaluates(args):
    """Whether the TrainingArguments evaluate during training (`eval_strategy`, called
    `evaluation_strategy` before transformers 4.41)."""
    strategy = getattr(args, "eval_strategy", None) or getattr(args, "evaluation_strategy", "no")
    return getattr(strategy, "value", strategy) != "no"


# ---- Training ----


def main():
    try:
        from transformers import (AutoConfig, AutoModelForSequenceClassification, AutoTokenizer,
                                  DataCollatorWithPadding, HfArgumentParser, Trainer,
                                  TrainingArguments, set_seed)
    except ImportError as e:
        sys.exit(f"error: {e}: train.py needs torch, transformers, accelerate and deepspeed "
                 "(pip install transformers accelerate deepspeed)")

    # The TrainingArguments first: with ZeRO-3 in the DeepSpeed config they make the model below
    # load its weights partitioned.
    (args,) = HfArgumentParser(TrainingArguments).parse_args_into_dataclasses()
    set_seed(args.seed)  # the classifier head's initial weights

    tokenizer = AutoTokenizer.from_pretrained(MODEL_FROM or os.path.dirname(MODEL_CONFIG) or ".")
    train = encode(tokenizer, read_rows(TRAIN_FILE))
    evaluation = encode(tokenizer, read_rows(EVAL_FILE)) if EVAL_FILE else None
    test = encode(tokenizer, read_rows(TEST_FILE)) if TEST_FILE else None

    labels = {"num_labels": len(LABELS), "id2label": dict(enumerate(LABELS)),
              "label2id": dict(LABEL2ID)}
    if DROPOUT is not None:  # BERT's names for them, as `recipe run` sets them
        labels.update(hidden_dropout_prob=DROPOUT, attention_probs_dropout_prob=DROPOUT)
    if MODEL_CONFIG:
        config = AutoConfig.from_pretrained(MODEL_CONFIG, **labels)
        model = AutoModelForSequenceClassification.from_config(config)
    else:
        model = AutoModelForSequenceClassification.from_pretrained(MODEL_FROM, **labels)

    # The loss of a step is the mean over its window of the micro-batches' mean losses, as the
    # recipe means it. The Trainer divides each micro-batch's loss by the accumulation steps
    # only when the model does not take "loss kwargs" (transformers v5.24.0 trainer.py,
    # `Trainer.training_step`: `loss_is_scaled_for_ga`, else `loss / current_gradient_
    # accumulation_steps`; under DeepSpeed it also passes `scale_wrt_gas=False`, so DeepSpeed
    # does not divide either). `Trainer.__init__` ("Model introspection") takes
    # `model_accepts_loss_kwargs` from the model's `accepts_loss_kwargs` attribute when it has
    # one, else from whether `forward` takes `**kwargs` -- which BertForSequenceClassification's
    # does from 5.0.0 on (models/bert/modeling_bert.py), while its loss is a plain
    # `CrossEntropyLoss()` mean that ignores `num_items_in_batch`: with G accumulation steps the
    # gradients would be G times the mean (clipping at max_grad_norm / G, the logged loss G
    # times). The attribute is read from 4.48 on (checked in 4.48.0, 4.52.1, 4.57.6, 5.0.0 and
    # 5.24.0); older releases ignore it, and BERT's `forward` took no `**kwargs` before 5.0.0.
    model.accepts_loss_kwargs = False

    trainer_args = {"model": model, "args": args, "train_dataset": train,
                    "eval_dataset": evaluation, "data_collator": DataCollatorWithPadding(tokenizer),
                    "compute_metrics": compute_metrics}
    # The tokenizer is saved with the checkpoints: `processing_class` from 4.46, `tokenizer` before.
    if "processing_class" in inspect.signature(Trainer.__init__).parameters:
        trainer_args["processing_class"] = tokenizer
    else:
        trainer_args["tokenizer"] = tokenizer
    trainer_class = Trainer
    if not SHUFFLE and not hasattr(args, "train_sampling_strategy"):
        # data.shuffle = false on a release without TrainingArguments.train_sampling_strategy
        # (before 5.2.0; launch.sh passes --train_sampling_strategy sequential where it exists):
        # the Trainer's own sampler is a RandomSampler (trainer.py, `Trainer._get_train_sampler`),
        # so the rows are taken in file order here, as `recipe run` takes them.
        from torch.utils.data import SequentialSampler

        class SequentialTrainer(Trainer):
            # A `train_dataset` argument from 4.51/4.52 on (4.52.1; 4.50.0 has none).
            def _get_train_sampler(self, *positional, **named):
                dataset = positional[0] if positional else named.get("train_dataset")
                return SequentialSampler(self.train_dataset if dataset is None else dataset)

        trainer_class = SequentialTrainer
    trainer = trainer_class(**trainer_args)
    trainer.train(resume_from_checkpoint=args.resume_from_checkpoint)

    # Evaluated after the last step too (unless the recipe says eval_every = never: the Trainer
    # may have done it already), and on the test data once.
    step = trainer.state.global_step
    last = [{key: value for key, value in log.items() if key != "step"}
            for log in trainer.state.log_history if "eval_loss" in log and log.get("step") == step]
    results = []
    if evaluation is not None and evaluates(args):
        results.append(("eval", last[-1] if last else trainer.evaluate()))
    if test is not None:
        results.append(("test", trainer.evaluate(test, metric_key_prefix="test")))
    for split, metrics in results:
        trainer.log_metrics(split, metrics)
        trainer.save_metrics(split, metrics)
    # The final model, where `recipe run` puts it.
    trainer.save_model(os.path.join(args.output_dir, "model"))


if __name__ == "__main__":
    main()
