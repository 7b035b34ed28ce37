"""Writes runtime/tests/fixtures/data/shard_cases.json: the batches each rank gets from the REAL
accelerate `BatchSamplerShard` (even_batches=True, split_batches=False: the HF Trainer default),
for the Rust port in runtime/src/data/shard.rs to reproduce exactly.

Run from the repository root with the conformance venv (accelerate 1.15.0, torch):
    conformance/.venv/bin/python runtime/reference/make_shard_fixtures.py
"""

import json
import pathlib
import random

import accelerate
from accelerate.data_loader import BatchSamplerShard
from torch.utils.data import BatchSampler, SequentialSampler

OUT = pathlib.Path(__file__).resolve().parent.parent / "tests/fixtures/data/shard_cases.json"


def shard(order, micro, world, drop_last):
    """Per-rank batches of sample indices, as accelerate hands them to each process."""
    ranks = []
    for rank in range(world):
        inner = BatchSampler(order, micro, drop_last)
        s = BatchSamplerShard(inner, num_processes=world, process_index=rank,
                              split_batches=False, even_batches=True)
        batches = [list(b) for b in s]
        # accelerate's own length must agree with what it yields, or the fixture is meaningless.
        assert len(batches) == len(s), (order, micro, world, drop_last, rank)
        ranks.append(batches)
    return ranks


def main():
    cases = []
    sizes = list(range(0, 24)) + [37, 64, 100]
    for n in sizes:
        for micro in (1, 2, 3, 5, 8):
            for world in (1, 2, 3, 4):
                for drop_last in (False, True):
                    order = SequentialSampler(range(n))
                    cases.append({"n": n, "micro": micro, "world": world, "drop_last": drop_last,
                                  "order": None, "ranks": shard(order, micro, world, drop_last)})
    # A shuffled epoch order: the wrap-around must come from the start of *this* order, not 0..n.
    rng = random.Random(20240607)
    for n in (5, 7, 13, 22):
        order = list(range(n))
        rng.shuffle(order)
        for micro, world in ((2, 3), (3, 2), (5, 4), (8, 3)):
            for drop_last in (False, True):
                cases.append({"n": n, "micro": micro, "world": world, "drop_last": drop_last,
                              "order": order, "ranks": shard(order, micro, world, drop_last)})
    OUT.parent.mkdir(parents=True, exist_ok=True)
    with OUT.open("w") as f:
        f.write('{"accelerate": %s, "cases": [\n' % json.dumps(accelerate.__version__))
        f.write(",\n".join(json.dumps(c, separators=(",", ":")) for c in cases))
        f.write("\n]}\n")
    print(f"{len(cases)} cases -> {OUT}")


if __name__ == "__main__":
    main()
