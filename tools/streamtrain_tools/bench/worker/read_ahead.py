"""A RunPass's fixed cost with and without the next pass read ahead, in one run.

One worker control server (gRPC on 127.0.0.1, the PS in process: ``LocalPS``, so that the
PS's own cost does not blur the worker's) trains ``--passes`` passes of 6,000 Criteo rows
(the bench-e2e throughput shape: batch 512, 512-256-128, CVM), each pass its own file.
Passes alternate in pairs between being read ahead (the RunPass before names their file in
``next_files``) and not, so load drift on a shared box hits both alike. A pass's *fixed
cost* is its RunPass wall time beyond the batch loop's compute (``seconds -
train_seconds``, as ``pass_fixed_seconds_per_pass`` in bench-e2e): the reader's start and
the wait for the first parsed file, the dense sync, the last push's flush, the answer.

The last line printed is one JSON object: ``fixed_ms_read_ahead`` and ``fixed_ms_plain``
(medians over the passes of each kind; the first two passes, which load the kernels, left
out), ``passes_read_ahead`` and ``passes_plain`` (how many of each were measured; a pass
counts as read ahead only if its ``files_read_ahead`` says so).
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from collections.abc import Sequence
from pathlib import Path

import grpc
import torch

from streamtrain_ps.client.local import LocalPS
from streamtrain_tools.samples import SAMPLES_DIR
from streamtrain_worker.config import WorkerConfig
from streamtrain_worker.control.service import WorkerServer, WorkerServicer
from streamtrain_worker.proto import worker_pb2_grpc
from streamtrain_worker.proto.share import PassShare

ROWS = 300  # rows of the sample per pass, repeated ``REPEAT`` times (bench-e2e's passes)
REPEAT = 20
CONFIG = {
    "data": {"format": "criteo"},
    "model": {"hiddenUnits": [512, 256, 128], "batchSize": 512, "embeddingDim": 8},
    "ps": {
        "config": {
            "logicalShards": 64,
            "tables": [{"name": "embedding", "embedxDim": 8, "embedxThreshold": 0}],
        }
    },
}


def write_passes(root: Path, passes: int, data_dir: Path) -> list[str]:
    lines = (data_dir / "criteo_kaggle_sample_train.txt").read_text().splitlines(keepends=True)
    files = []
    for p in range(passes):
        start = (p * ROWS) % len(lines)
        path = root / f"pass-{p:03d}"
        path.write_text("".join(lines[start : start + ROWS]) * REPEAT)
        files.append(str(path))
    return files


def measure(files: list[str]) -> tuple[list[float], list[float]]:
    """Fixed seconds of the passes read ahead and of the others (the first two left out)."""
    config = WorkerConfig.from_dict(CONFIG)
    servicer = WorkerServicer(config, LocalPS(config.ps.config))
    server = WorkerServer(servicer)
    server.start()
    channel = grpc.insecure_channel(server.address)
    stub = worker_pb2_grpc.WorkerStub(channel)
    ahead: list[float] = []
    plain: list[float] = []
    try:
        for p, path in enumerate(files):
            # Passes 2-3, 6-7, ... are read ahead: the RunPass before names their file.
            hint = [files[p + 1]] if p + 1 < len(files) and (p + 1) % 4 >= 2 else []
            share = PassShare.of("1", p + 1, [path], generation=1, next_files=hint)
            result = stub.RunPass(share.to_request(), timeout=600)
            if p >= 2:
                kind = ahead if result.files_read_ahead else plain
                kind.append(result.seconds - result.train_seconds)
    finally:
        channel.close()
        server.close(grace=0)
    return ahead, plain


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m streamtrain_tools.bench.worker.read_ahead", description=__doc__
    )
    p.add_argument("--json", action="store_true", help="(the JSON line is always printed last)")
    p.add_argument("--passes", type=int, default=42)
    p.add_argument("--data", type=Path, default=SAMPLES_DIR, help="folder of the samples")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory(prefix="streamtrain-bench-") as tmp:
        ahead, plain = measure(write_passes(Path(tmp), args.passes, args.data))
    result = {
        "fixed_ms_read_ahead": round(statistics.median(ahead) * 1e3, 1),
        "fixed_ms_plain": round(statistics.median(plain) * 1e3, 1),
        "passes_read_ahead": len(ahead),
        "passes_plain": len(plain),
    }
    print(
        f"RunPass fixed cost, median: {result['fixed_ms_read_ahead']} ms read ahead "
        f"({len(ahead)} passes), {result['fixed_ms_plain']} ms without ({len(plain)})"
    )
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
