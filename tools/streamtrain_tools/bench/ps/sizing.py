"""Sizing model of a job (``docs/sizing.md``): measured costs per example -> predicted speed.

Inputs, all measured on this code (``make bench-worker`` over gRPC, and a dense-only probe
run here against a real shard process):

- ``worker_cpu``: CPU-seconds per example of a worker process (training thread, prefetch
  and push threads, gRPC client);
- ``ps_cpu``: CPU-seconds per example of the PS processes, split into ``dense_cpu`` — the
  dense vectors' pushes and pulls, which all land on the ONE shard that owns each vector
  (``sharding.server_of_dense``) — and the sparse remainder, which spreads evenly over
  the shards;
- bytes on the wire per example, sparse (spread) and dense (to the dense shard).

With ``W`` workers of ``worker_cores`` cores and ``S`` shards of ``ps_cores`` cores, the
examples/s a job can reach is the smallest of

- workers: ``W * worker_cores / worker_cpu``;
- the dense shard: ``ps_cores / (sparse_cpu / S + dense_cpu)`` (the other shards carry
  only ``sparse_cpu / S`` and bind later);
- the dense shard's network: ``nic_bytes_per_s / (dense_bytes + sparse_bytes / S)``.

``python -m streamtrain_tools.bench.ps.sizing --worker-json FILE``: reads a ``bench.worker``
JSON line, probes the dense cost, prints the inputs and the table as markdown, and one JSON
object last.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from streamtrain_ps.client.remote import RemotePS
from streamtrain_ps.config import PSConfig
from streamtrain_ps.service.process import shard_process
from streamtrain_tools.bench.worker.run import process_cpu_seconds

WORKERS = (1, 2, 4, 8, 16, 32, 64)
SHARDS = (1, 2, 4, 8, 16, 32)


@dataclass(frozen=True)
class Costs:
    """Per-example costs of one shape (seconds of CPU, bytes)."""

    worker_cpu: float
    sparse_cpu: float
    dense_cpu: float
    sparse_bytes: float
    dense_bytes: float


@dataclass(frozen=True)
class Resources:
    worker_cores: float = 1.0
    ps_cores: float = 1.0
    nic_bytes_per_s: float = 10e9 / 8  # 10 Gbit/s


def predict(costs: Costs, res: Resources, workers: int, shards: int) -> tuple[float, str]:
    """Examples/s of ``workers`` x ``shards`` and the limit that binds first."""
    limits = {
        "workers": workers * res.worker_cores / costs.worker_cpu,
        "dense shard CPU": res.ps_cores / (costs.sparse_cpu / shards + costs.dense_cpu),
        "dense shard network": res.nic_bytes_per_s
        / (costs.dense_bytes + costs.sparse_bytes / shards),
    }
    binding = min(limits, key=lambda k: limits[k])
    return limits[binding], binding


def probe_dense(parameters: int, pushes: int, sync_steps: int) -> float:
    """PS CPU-seconds per trained batch spent on the dense vector over gRPC: one push per
    batch and one pull every ``sync_steps`` batches, against a real shard process."""
    config = PSConfig()
    grads = np.full(parameters, 1e-3, dtype=np.float32)
    with contextlib.ExitStack() as stack:
        tmp = stack.enter_context(tempfile.TemporaryDirectory(prefix="sizing-"))
        shard = stack.enter_context(shard_process(config, Path(tmp)))
        ps = RemotePS([shard.address], config)
        stack.callback(ps.close)
        ps.wait_ready()
        ps.init_dense("dnn", np.zeros(parameters, dtype=np.float32))
        for _ in range(5):  # warm-up: kernels, buffers
            ps.push_dense("dnn", grads)
        before = process_cpu_seconds(shard.process.pid)
        for i in range(pushes):
            ps.push_dense("dnn", grads)
            if i % sync_steps == 0:
                ps.pull_dense("dnn")
        return (process_cpu_seconds(shard.process.pid) - before) / pushes


def costs_from(section: dict[str, Any], dense_per_batch: float, batch: int) -> Costs:
    """Per-example costs from one data set of a ``bench.worker`` JSON line."""
    cpu = section["cpu_us_per_example"]
    wire = section["wire_bytes_per_example"]
    dense_cpu = dense_per_batch / batch
    return Costs(
        worker_cpu=cpu["grpc"] * 1e-6,
        sparse_cpu=max(cpu["grpc_ps"] * 1e-6 - dense_cpu, 0.0),
        dense_cpu=dense_cpu,
        sparse_bytes=wire["sparse_pull"] + wire["sparse_push"],
        dense_bytes=wire["dense"],
    )


def table(costs: Costs, res: Resources) -> str:
    head = "| workers \\ shards | " + " | ".join(str(s) for s in SHARDS) + " |"
    rows = [head, "|---" * (len(SHARDS) + 1) + "|"]
    short = {"workers": "W", "dense shard CPU": "D", "dense shard network": "N"}
    for w in WORKERS:
        cells = []
        for s in SHARDS:
            rate, binding = predict(costs, res, w, s)
            cells.append(f"{rate / 1000:,.1f}k {short[binding]}")
        rows.append(f"| {w} | " + " | ".join(cells) + " |")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(
        prog="python -m streamtrain_tools.bench.ps.sizing", description=__doc__
    )
    p.add_argument("--worker-json", type=Path, required=True, help="a bench.worker JSON line")
    p.add_argument("--set", default="criteo", help="data set of the JSON to size")
    p.add_argument("--parameters", type=int, required=True, help="dense parameters")
    p.add_argument("--batch", type=int, default=512)
    p.add_argument("--sync-steps", type=int, default=10)
    p.add_argument("--pushes", type=int, default=100)
    p.add_argument("--worker-cores", type=float, default=1.0)
    p.add_argument("--ps-cores", type=float, default=1.0)
    args = p.parse_args(argv)
    bench = json.loads(args.worker_json.read_text().strip().splitlines()[-1])
    dense_per_batch = probe_dense(args.parameters, args.pushes, args.sync_steps)
    costs = costs_from(bench[args.set], dense_per_batch, args.batch)
    res = Resources(worker_cores=args.worker_cores, ps_cores=args.ps_cores)
    print(f"inputs ({args.set}, {args.parameters:,} dense parameters): {asdict(costs)}")
    print(table(costs, res))
    print(json.dumps({"costs": asdict(costs), "dense_ps_cpu_per_batch": dense_per_batch}))


if __name__ == "__main__":
    main()
