"""Benchmark: plain single-process PyTorch vs training through a local PS shard.

Both sides train the same network on the same batches: 39 Criteo slots x (1 + 8) dims
(embed_w + embedx, no CVM so the inputs are identical), the ``slot_dnn`` dense network with
hidden units 512-256-128, batch 512, on the Criteo sample repeated to get stable timings.

(a) ``torch``: ``nn.EmbeddingBag(mode="sum", sparse=True)`` over contiguous ids (the
    key -> id vocabulary is built once, untimed — plain PyTorch needs one), sparse
    ``Adagrad`` for the embeddings and ``Adam`` for the dense network, all in one thread of
    control, no metrics.
(b) ``ps``: ``Trainer.run_pass`` against ``LocalPS`` (one in-process shard): per batch key
    dedup, pull, pooled autograd bridge, progressive-validation metrics, sparse push with
    show/click, dense push and periodic dense pull, with the prefetch and push threads.

Both run with the same torch thread count; the rounds alternate (a, b, a, b, ...) so load
from other processes on the machine hits both alike. ``ratio`` compares the best round of
each; ``ratio_paired_median`` is the median over rounds of b/a for back-to-back runs.
Parse throughput per format comes from ``bench_parse.measure_all``.

``python -m streamtrain_tools.bench.worker --json``: the last line is one JSON object with
``torch_ex_per_s``, ``ps_ex_per_s``, ``ratio`` and ``parse_lines_per_s``.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from streamtrain_ps.local import LocalPS
from streamtrain_tools.bench import parse as bench_parse
from streamtrain_tools.samples import SAMPLES_DIR
from streamtrain_worker.config import WorkerConfig
from streamtrain_worker.data.batch import Batch
from streamtrain_worker.data.reader import iter_batches
from streamtrain_worker.models import ModelSpec, build_model
from streamtrain_worker.train import Trainer

HIDDEN = (512, 256, 128)
DIM = 8
BATCH = 512


def bench_config(threads: int) -> WorkerConfig:
    return WorkerConfig.from_dict(
        {
            "data": {"format": "criteo"},
            "model": {
                "type": "slot_dnn",
                "embeddingDim": DIM,
                "hiddenUnits": list(HIDDEN),
                "batchSize": BATCH,
                "cvm": False,
                "denseSyncSteps": 10,
            },
            # embedx admitted at once, so the PS side does the full-width work from the start
            "ps": {"config": {"tables": [{"embedxDim": DIM, "embedxThreshold": 0}]}},
            "runtime": {"numThreads": threads},
        }
    )


def load_batches(path: Path, config: WorkerConfig) -> list[Batch]:
    return list(iter_batches([str(path)], config.data, BATCH))


class TorchBaseline:
    """Side (a): the same network trained the textbook way, in one process."""

    def __init__(self, batches: list[Batch], spec: ModelSpec, seed: int) -> None:
        vocab = np.unique(np.concatenate([b.keys for b in batches]))
        self.inputs = [
            (
                torch.from_numpy(np.searchsorted(vocab, b.keys).astype(np.int64)),
                torch.from_numpy(b.offsets[:-1].copy()),
                torch.from_numpy(b.labels),
                b.size,
            )
            for b in batches
        ]
        torch.manual_seed(seed)
        self.embedding = nn.EmbeddingBag(len(vocab), 1 + DIM, mode="sum", sparse=True)
        nn.init.uniform_(self.embedding.weight, -1e-4, 1e-4)
        self.dense = build_model("slot_dnn", spec, seed=seed)
        self.sparse_opt = torch.optim.Adagrad(self.embedding.parameters(), lr=0.05)
        self.dense_opt = torch.optim.Adam(self.dense.parameters(), lr=0.001)
        self.num_slots = spec.num_slots

    def run(self) -> int:
        examples = 0
        for ids, offsets, labels, size in self.inputs:
            pooled = self.embedding(ids, offsets).view(size, self.num_slots, 1 + DIM)
            logits = self.dense(pooled)
            loss = nn.functional.binary_cross_entropy_with_logits(logits, labels)
            self.sparse_opt.zero_grad(set_to_none=True)
            self.dense_opt.zero_grad(set_to_none=True)
            loss.backward()
            self.sparse_opt.step()
            self.dense_opt.step()
            examples += size
        return examples


def timed(fn: Any) -> float:
    """Examples per second of one call of ``fn`` (which returns its example count)."""
    started = time.perf_counter()
    examples = fn()
    return float(examples) / (time.perf_counter() - started)


def run(
    data_dir: Path, repeats: int, rounds: int, threads: int, parse_seconds: float
) -> dict[str, Any]:
    torch.set_num_threads(threads)
    # Plain PyTorch as people run it: no per-step sparse invariant checks in Adagrad.
    torch.sparse.check_sparse_tensor_invariants.disable()
    config = bench_config(threads)
    batches = load_batches(data_dir / "criteo_kaggle_sample_train.txt", config)
    stream = batches * repeats
    spec = ModelSpec.from_config(config.model, config.data.num_slots)

    baseline = TorchBaseline(stream, spec, config.seed)
    ps = LocalPS(config.ps.config)
    trainer = Trainer(config, ps, config.data.num_slots)
    try:
        baseline.run()  # warm-up: allocator, first-touch of the embedding table
        trainer.run_pass(batches)  # warm-up: numba kernels, key creation in the PS
        torch_rates, ps_rates = [], []
        for _ in range(rounds):
            torch_rates.append(timed(baseline.run))
            ps_rates.append(timed(lambda: trainer.run_pass(stream).examples))
    finally:
        trainer.close()
    parse = bench_parse.measure_all(data_dir, min_seconds=parse_seconds)
    torch_best, ps_best = max(torch_rates), max(ps_rates)
    return {
        "torch_ex_per_s": round(torch_best, 1),
        "ps_ex_per_s": round(ps_best, 1),
        "ratio": round(ps_best / torch_best, 3),
        # per round (a then b, back to back): robust to load that comes and goes
        "ratio_paired_median": round(
            float(np.median([p / t for p, t in zip(ps_rates, torch_rates, strict=True)])), 3
        ),
        "parse_lines_per_s": {k: round(v, 1) for k, v in parse.items()},
        "torch_rounds": [round(r, 1) for r in torch_rates],
        "ps_rounds": [round(r, 1) for r in ps_rates],
        "examples_per_round": sum(b.size for b in stream),
        "batch_size": BATCH,
        "slots": config.data.num_slots,
        "dims": 1 + DIM,
        "hidden_units": list(HIDDEN),
        "torch_threads": threads,
    }


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(
        prog="python -m streamtrain_tools.bench.worker", description=__doc__
    )
    p.add_argument("--data", type=Path, default=SAMPLES_DIR, help="folder of the samples")
    p.add_argument("--repeats", type=int, default=4, help="sample repetitions per round")
    p.add_argument("--rounds", type=int, default=3, help="alternating timed rounds per side")
    p.add_argument("--threads", type=int, default=1, help="torch intra-op threads (both sides)")
    p.add_argument("--parse-seconds", type=float, default=1.0, help="min time per parse format")
    p.add_argument("--json", action="store_true", help="only the JSON line")
    args = p.parse_args(argv)
    result = run(args.data, args.repeats, args.rounds, args.threads, args.parse_seconds)
    if not args.json:
        print(
            f"torch {result['torch_ex_per_s']:.0f} ex/s, PS {result['ps_ex_per_s']:.0f} ex/s, "
            f"ratio {result['ratio']:.3f}"
        )
        for fmt, rate in result["parse_lines_per_s"].items():
            print(f"parse {fmt}: {rate:.0f} lines/s")
    print(json.dumps(result, sort_keys=True), flush=True)


if __name__ == "__main__":
    main()
