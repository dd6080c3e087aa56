"""``make bench-e2e``: the Criteo sample as 24 hourly passes, through the whole system.

Two runs of ``streamtrain run`` (local mode: PS shard and workers as processes, the pass
scheduler, delta exports every pass, checkpoints, day-end shrink/base/batch):

1. **Quality**: the 7,200 chronological Criteo rows cut into 24 hourly folders of 300 rows;
   each pass is test-then-train (progressive validation), 39 slots x (1 + 8) embeddings,
   MLP 512-256-128. Reported: the mean progressive AUC over passes 13-24.
2. **Throughput**: the same folders with each pass's rows repeated 20x (6,000 rows a pass,
   144,000 in all), batch 512. Reported: examples per second from launch to finish (process
   start-up, waiting, training, exports and checkpoints included) and training-only examples
   per second (examples over the summed wall time of the RunPass steps).

The last line printed is one JSON object: ``auc_mean_13_24``, ``e2e_ex_per_s``,
``train_ex_per_s`` (plus the settings used).
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from streamtrain_operator.job.progress import Phase, Progress
from streamtrain_operator.job.spec import load_job
from streamtrain_operator.local.runner import RunOptions, run_job
from streamtrain_tools.samples import SAMPLES_DIR, lay_out

DAY = "20261101"


def manifest(batch_size: int, workers: int, lr: float, dense_lr: float = 0.0005) -> dict[str, Any]:
    return {
        "apiVersion": "streamtrain.io/v1alpha1",
        "kind": "StreamingTrainingJob",
        "metadata": {"name": "bench-e2e"},
        "spec": {
            "data": {
                "path": "data",
                "format": "criteo",
                "startDay": DAY,
                "endDay": DAY,
                "splitIntervalMinutes": 60,
                "pollSeconds": 0.1,
            },
            "model": {
                "type": "slot_dnn",
                "embeddingDim": 8,
                "hiddenUnits": [512, 256, 128],
                "batchSize": batch_size,
                # The target is what plain PyTorch reaches (EmbeddingBag + MLP, the
                # embeddings fed raw; streamtrain_tools.bench.reference): normalise only the
                # CVM columns like it. Normalising the whole input cost ~0.01 AUC here
                # (measured with batch norm; docs/decisions.md).
                "normalizeEmbeddings": False,
                # A 7,200-row stream: every key's show count grows pass after pass, so the
                # CVM inputs drift faster than a cumulative average follows; ~20 pushes of
                # memory (2 passes) instead of the near-infinite default (docs/decisions.md).
                "summaryDecayRate": 0.95,
            },
            # Every key gets its 1 + 8 weights from its first show, as in plain PyTorch.
            "sparse": {"embedxThreshold": 0, "optimizer": {"learningRate": lr}},
            "dense": {"optimizer": {"type": "adam", "learningRate": dense_lr}},
            "ps": {"replicas": 1},
            "workers": {"replicas": workers},
            "checkpoint": {"path": "checkpoints", "everyPasses": 6},
            "export": {"path": "models", "deltaEveryPasses": 1},
        },
    }


def run(
    root: Path, *, repeat: int, batch_size: int, workers: int, lr: float, log: io.TextIOBase
) -> tuple[Progress, float]:
    """Lay out the data, run the job; the final progress and launch-to-finish seconds."""
    lay_out("criteo", root / "data", data_dir=SAMPLES_DIR, start_day=DAY, repeat=repeat)
    path = root / "job.yaml"
    path.write_text(yaml.safe_dump(manifest(batch_size, workers, lr)))
    job = load_job(path)
    started = time.perf_counter()
    progress = asyncio.run(
        run_job(job, RunOptions(root / "state.json", root / "work", out=log))  # type: ignore[arg-type]
    )
    wall = time.perf_counter() - started
    if progress.phase != Phase.SUCCEEDED:
        raise RuntimeError(f"bench job ended {progress.phase}: {progress.message}")
    return progress, wall


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m streamtrain_tools.bench.e2e", description=__doc__)
    p.add_argument("--json", action="store_true", help="(the JSON line is always printed last)")
    p.add_argument("--auc-batch-size", type=int, default=32)
    p.add_argument("--batch-size", type=int, default=512)
    p.add_argument("--repeat", type=int, default=20)
    p.add_argument("--workers", type=int, default=1)
    p.add_argument("--lr", type=float, default=0.05, help="sparse AdaGrad learning rate")
    p.add_argument("--verbose", action="store_true", help="show the jobs' progress lines")
    args = p.parse_args(argv)
    log: Any = sys.stdout if args.verbose else io.StringIO()
    with tempfile.TemporaryDirectory(prefix="streamtrain-bench-") as tmp:
        quality, _ = run(
            Path(tmp) / "auc",
            repeat=1,
            batch_size=args.auc_batch_size,
            workers=args.workers,
            lr=args.lr,
            log=log,
        )
        # A pass of one class has no AUC; the bench's passes always hold both, and a mean
        # over a silently shorter list would not be the protocol's number.
        missing = [r.pass_index for r in quality.history if "auc" not in r.metrics]
        if missing:
            raise SystemExit(f"passes {missing} of the quality run have no AUC (one class)")
        aucs = [r.metrics["auc"] for r in quality.history]
        auc_mean = sum(aucs[12:24]) / len(aucs[12:24])
        print(f"quality run: 24 passes x 300 rows, batch {args.auc_batch_size}")
        print("  progressive AUC per pass: " + " ".join(f"{a:.3f}" for a in aucs))
        print(f"  mean AUC of passes 13-24: {auc_mean:.4f} (target >= 0.727)")
        speed, wall = run(
            Path(tmp) / "speed",
            repeat=args.repeat,
            batch_size=args.batch_size,
            workers=args.workers,
            lr=args.lr,
            log=log,
        )
        examples = sum(r.metrics["examples"] for r in speed.history)
        train_seconds = sum(r.metrics["seconds"] for r in speed.history)
        e2e = examples / wall
        train = examples / train_seconds
        print(
            f"throughput run: 24 passes x {300 * args.repeat} rows, batch {args.batch_size}: "
            f"{examples:,.0f} examples in {wall:.1f}s launch to finish ({e2e:,.0f} ex/s), "
            f"{train_seconds:.1f}s in RunPass ({train:,.0f} ex/s)"
        )
    result = {
        "auc_mean_13_24": round(auc_mean, 4),
        "e2e_ex_per_s": round(e2e, 1),
        "train_ex_per_s": round(train, 1),
        "workers": args.workers,
        "ps_shards": 1,
        "auc_batch_size": args.auc_batch_size,
        "batch_size": args.batch_size,
    }
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
