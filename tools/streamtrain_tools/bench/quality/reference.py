"""Reference for ``make bench-e2e``'s quality protocol: plain single-process PyTorch vs the PS.

The protocol (issue 4): the Criteo sample's 7,200 chronological rows cut into 24 passes of
300 rows, each pass test-then-train (every batch is scored before it is trained on), 39
slots x (1 + 8) embeddings, MLP 512-256-128, batch 32; reported: the mean progressive AUC of
passes 13-24. The target (>= 0.727) is "what plain single-process PyTorch reaches", so this
module measures exactly that, side by side with the PS path on the same batches:

(a) ``torch``: ``nn.EmbeddingBag(mode="sum", sparse=True)`` over contiguous ids initialised
    U(+-1e-4) like the PS's embedx, the same ``slot_dnn`` network (``build_model`` with
    ``normalize_embeddings=False``, so without CVM the bare MLP, same init), sparse
    ``Adagrad`` (lr 0.05) on the embeddings and ``Adam`` (lr 0.001) on the network, mean
    loss per batch — the textbook setup.
(b) ``ps``: ``Trainer.run_pass`` against an in-process ``LocalPS`` with the settings the
    bench's manifest renders (CVM on and only CVM normalised, dense on the PS, async
    prefetch/push), the fast way to
    iterate on the PS path before confirming through ``streamtrain_tools.bench.worker.e2e``.

Both sides parse with ``streamtrain_worker.data`` (identical keys) and score with
``PassMetrics`` (identical AUC histograms). 300-row passes make one pass's AUC noisy
(+-0.03), so compare means over several seeds, run in the same process.

``python -m streamtrain_tools.bench.quality.reference --seeds 0 1 2 --json``: the last line is one
JSON object with each side's per-seed ``auc_mean_13_24``, their mean and spread.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.nn import functional as nnf

from streamtrain_ps.client.local import LocalPS
from streamtrain_tools.bench.worker.e2e import SUMMARY_DECAY
from streamtrain_tools.samples import SAMPLES_DIR
from streamtrain_worker.config import WorkerConfig
from streamtrain_worker.data.batch import Batch, slice_batch
from streamtrain_worker.data.config import DataConfig
from streamtrain_worker.data.reader import iter_batches
from streamtrain_worker.metrics import PassMetrics
from streamtrain_worker.models import ModelSpec, build_model
from streamtrain_worker.training.train import Trainer

SAMPLE = "criteo_kaggle_sample_train.txt"
ROWS_PER_PASS = 300
PASSES = 24
BATCH = 32
DIM = 8
HIDDEN = (512, 256, 128)
NUM_BUCKETS = 65536


def load_passes(data_dir: Path, batch_size: int = BATCH) -> list[list[Batch]]:
    """The sample as ``PASSES`` passes of ``ROWS_PER_PASS`` rows, each cut into batches.

    Mirrors ``streamtrain_tools.samples.lay_out`` + one worker reading a pass's folder:
    consecutive rows, batches restarting at every pass boundary.
    """
    config = DataConfig.from_dict({"format": "criteo"})
    path = data_dir / SAMPLE
    if not path.exists():
        raise FileNotFoundError(f"{path}: the Criteo sample is missing")
    passes: list[list[Batch]] = []
    for block in iter_batches([str(path)], config, ROWS_PER_PASS):
        if block.size < ROWS_PER_PASS or len(passes) == PASSES:
            break
        passes.append(
            [
                slice_batch(block, i, min(i + batch_size, block.size))
                for i in range(0, block.size, batch_size)
            ]
        )
    if len(passes) < PASSES:
        raise ValueError(f"{path}: only {len(passes)} passes of {ROWS_PER_PASS} rows")
    return passes


def pass_auc(metrics: PassMetrics) -> float:
    """The pass's AUC; a pass without both classes has none, and would bias the mean."""
    if metrics.auc is None:
        raise ValueError(f"a pass of {metrics.examples} examples has no AUC (one class only)")
    return metrics.auc


def auc_mean(aucs: list[float]) -> float:
    """Mean AUC of passes 13-24 (the second half of the day: the models have warmed up)."""
    tail = aucs[12:24]
    return sum(tail) / len(tail)


class TorchReference:
    """Side (a): the same network trained the textbook way, in one process."""

    def __init__(
        self,
        passes: list[list[Batch]],
        seed: int,
        *,
        sparse_lr: float = 0.05,
        dense_lr: float = 0.001,
        init_range: float | None = 1e-4,
    ) -> None:
        vocab = np.unique(np.concatenate([b.keys for p in passes for b in p]))
        self.passes = [
            [
                (
                    torch.from_numpy(np.searchsorted(vocab, b.keys).astype(np.int64)),
                    torch.from_numpy(b.offsets[:-1].copy()),
                    b,
                )
                for b in p
            ]
            for p in passes
        ]
        num_slots = passes[0][0].num_slots
        self.spec = ModelSpec(
            num_slots, DIM, cvm=False, hidden_units=HIDDEN, normalize_embeddings=False
        )
        torch.manual_seed(seed)
        # Opting out explicitly (torch's default) keeps torch from warning at every sparse step.
        torch.sparse.check_sparse_tensor_invariants.disable()
        self.embedding = nn.EmbeddingBag(len(vocab), 1 + DIM, mode="sum", sparse=True)
        if init_range is not None:  # None: torch's own N(0, 1)
            nn.init.uniform_(self.embedding.weight, -init_range, init_range)
        self.dense = build_model("slot_dnn", self.spec, seed=seed)
        self.sparse_opt = torch.optim.Adagrad(self.embedding.parameters(), lr=sparse_lr)
        self.dense_opt = torch.optim.Adam(self.dense.parameters(), lr=dense_lr)

    def run(self) -> list[float]:
        """Test-then-train over every pass; the progressive AUC of each pass."""
        return [pass_auc(m) for m in self.run_metrics()]

    def run_metrics(self) -> list[PassMetrics]:
        """Test-then-train over every pass; each pass's progressive metrics."""
        passes = []
        for batches in self.passes:
            metrics = PassMetrics(num_buckets=NUM_BUCKETS)
            for ids, offsets, batch in batches:
                pooled = self.embedding(ids, offsets).view(batch.size, self.spec.num_slots, -1)
                logits = self.dense(pooled)
                labels = torch.from_numpy(batch.labels)
                losses = nnf.binary_cross_entropy_with_logits(logits, labels, reduction="none")
                metrics.add(
                    torch.sigmoid(logits.detach()).numpy(), batch.labels, losses.detach().numpy()
                )
                self.sparse_opt.zero_grad(set_to_none=True)
                self.dense_opt.zero_grad(set_to_none=True)
                losses.mean().backward()
                self.sparse_opt.step()
                self.dense_opt.step()
            passes.append(metrics)
        return passes


def ps_config(seed: int, overrides: dict[str, Any] | None = None) -> WorkerConfig:
    """The worker config ``bench_e2e``'s manifest renders (1 shard), plus ``overrides``.

    ``overrides`` is merged one level deep per section, e.g.
    ``{"model": {"cvm": False}, "runtime": {"overlap": False}}``; ``sparse`` and ``dense``
    (the PS table's and dense vector's optimizer fields) are forwarded into the PS config.
    """
    overrides = overrides or {}
    sparse = {"learningRate": 0.05, **overrides.get("sparse", {})}
    dense = {"type": "adam", "learningRate": 0.0005, **overrides.get("dense", {})}
    table = {
        "embedxDim": DIM,
        "embedxThreshold": 0,
        "optimizer": sparse,
        **overrides.get("table", {}),
    }
    return WorkerConfig.from_dict(
        {
            "data": {"format": "criteo"},
            "model": {
                "type": "slot_dnn",
                "embeddingDim": DIM,
                "hiddenUnits": list(HIDDEN),
                "batchSize": BATCH,
                "normalizeEmbeddings": False,  # as bench_e2e's manifest
                "summaryDecayRate": SUMMARY_DECAY,  # bench_e2e's manifest's
                **overrides.get("model", {}),
            },
            "ps": {
                "config": {"tables": [table], "dense": {"optimizer": dense}, "seed": seed},
            },
            "runtime": {"numThreads": 1, **overrides.get("runtime", {})},
            "seed": seed,
        }
    )


def run_ps(passes: list[list[Batch]], config: WorkerConfig) -> list[float]:
    """Side (b): test-then-train through ``Trainer`` + ``LocalPS``; per-pass AUC."""
    ps = LocalPS(config.ps.config)
    trainer = Trainer(config, ps, passes[0][0].num_slots)
    try:
        return [pass_auc(trainer.run_pass(batches)) for batches in passes]
    finally:
        trainer.close()


def _summary(values: list[float]) -> dict[str, Any]:
    return {
        "runs": [round(v, 4) for v in values],
        "mean": round(statistics.fmean(values), 4),
        "min": round(min(values), 4),
        "max": round(max(values), 4),
        "stdev": round(statistics.stdev(values), 4) if len(values) > 1 else 0.0,
    }


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(
        prog="python -m streamtrain_tools.bench.quality.reference", description=__doc__
    )
    p.add_argument("--data", type=Path, default=SAMPLES_DIR, help="folder of the samples")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--sides", nargs="+", choices=["torch", "ps"], default=["torch", "ps"])
    p.add_argument(
        "--ps-overrides", type=json.loads, default={}, help="JSON merged into the PS side"
    )
    p.add_argument("--torch-init-range", type=float, default=1e-4, help="<= 0: torch's N(0,1)")
    p.add_argument("--torch-sparse-lr", type=float, default=0.05)
    p.add_argument("--torch-dense-lr", type=float, default=0.001)
    p.add_argument("--json", action="store_true", help="(the JSON line is always printed last)")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    passes = load_passes(args.data)
    result: dict[str, Any] = {"seeds": args.seeds, "ps_overrides": args.ps_overrides}
    runs: dict[str, list[float]] = {side: [] for side in args.sides}
    for seed in args.seeds:  # sides interleaved per seed: machine load hits both alike
        for side in args.sides:
            if side == "torch":
                init = args.torch_init_range if args.torch_init_range > 0 else None
                aucs = TorchReference(
                    passes,
                    seed,
                    sparse_lr=args.torch_sparse_lr,
                    dense_lr=args.torch_dense_lr,
                    init_range=init,
                ).run()
            else:
                aucs = run_ps(passes, ps_config(seed, args.ps_overrides))
            runs[side].append(auc_mean(aucs))
            if not args.json:
                print(f"{side} seed {seed}: auc_mean_13_24 {runs[side][-1]:.4f}", flush=True)
    for side, values in runs.items():
        result[side] = _summary(values)
    if "torch" in runs and "ps" in runs:
        result["ps_minus_torch"] = round(result["ps"]["mean"] - result["torch"]["mean"], 4)
    print(json.dumps(result, sort_keys=True), flush=True)


if __name__ == "__main__":
    main()
