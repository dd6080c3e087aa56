"""Benchmark: plain PyTorch vs the PS path in process vs the PS path over gRPC, side by side.

All three sides train the same network on the same batches: 39 slots x (1 + 8) dims
(embed_w + embedx, no CVM so the inputs are identical), the ``slot_dnn`` dense network with
hidden units 512-256-128, batch 512, one torch thread:

(a) ``torch``: ``nn.EmbeddingBag(mode="sum", sparse=True)`` over contiguous ids, sparse
    ``Adagrad`` for the embeddings and ``Adam`` for the dense network, one thread of
    control, no metrics — the textbook single-process setup.
(b) ``local``: ``Trainer.run_pass`` against ``LocalPS`` (one shard in this process): per
    batch key dedup, pull, pooled autograd bridge, progressive-validation metrics, sparse
    push with show/click, dense push and periodic dense pull, prefetch and push threads.
(c) ``grpc``: the same ``Trainer`` against ``RemotePS`` and one shard in its own process
    (``python -m streamtrain_ps`` on 127.0.0.1, started by ``streamtrain_ps.plumbing.launch``): what
    a worker pod does, on the same cores.

Two data sets: ``criteo`` (the Criteo sample repeated, a table that fits in a cache) and
``long_tail`` (``streamtrain_tools.bench.worker.long_tail``: the same shape, keys drawn 1/r from
millions of ids; every id is created in every table before timing, so lookups hit a table
of millions of rows). Each round runs the three sides back to back, in an order rotated per
round, so load from other processes hits them alike; a pair's ratio is the median over
rounds of the per-round ratio. Unique keys per batch, CPU-seconds per example of each side
(worker process and PS process separately over gRPC) and PS payload bytes per example are
measured too (``docs/sizing.md`` builds on them).

``python -m streamtrain_tools.bench.worker --json``: the last line is one JSON object with
``grpc_ratio_criteo`` and ``grpc_ratio_long_tail`` (PS over gRPC / plain PyTorch, median of
paired rounds), ``grpc_cpu_ratio_*`` (the same at equal CPU: plain PyTorch's CPU-seconds per
example over the worker's plus the PS process's — on a box whose cores other processes
share, a side with more threads and processes gets a larger share of them, which the wall
clock ratio rewards and this one does not), per data set the details, and
``parse_lines_per_s``. ``--cpus`` pins everything to the given cores. ``--quick`` is a
seconds-long run for tests (shape only; its speeds mean nothing).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import torch
from torch import nn

from streamtrain_ps.api import PSLike, SparsePush
from streamtrain_ps.client.dedup import unique_inverse
from streamtrain_ps.client.local import LocalPS
from streamtrain_ps.client.remote import RemotePS
from streamtrain_ps.plumbing.heap import reuse_large_buffers
from streamtrain_ps.service.process import shard_process
from streamtrain_tools.bench.ps.wire_count import CountingPS
from streamtrain_tools.bench.worker import long_tail
from streamtrain_tools.bench.worker import parse as bench_parse
from streamtrain_tools.samples import SAMPLES_DIR
from streamtrain_worker.config import WorkerConfig
from streamtrain_worker.data.batch import Batch
from streamtrain_worker.data.ordinal import ordinal_inputs
from streamtrain_worker.data.reader import iter_batches
from streamtrain_worker.models import ModelSpec, build_model
from streamtrain_worker.models.summary import (
    drain_pending,
    gather_stats,
    scatter_stats,
    summary_layers,
)
from streamtrain_worker.training.embedding import cvm_columns
from streamtrain_worker.training.train import Trainer

SAMPLE = "criteo_kaggle_sample_train.txt"
HIDDEN = (512, 256, 128)
DIM = 8
BATCH = 512
SLOTS = 39
SIDES = ("torch", "local", "grpc")
PAIRS = (("local", "torch"), ("grpc", "torch"), ("grpc", "local"))
GROW_CHUNK = 1 << 20


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
                # The torch side has no ordinal inputs, counts no base rate and keeps no
                # calibration window: every side trains the same network.
                "ordinalInputs": False,
                "baseRateOffset": False,
                "residualCalibration": False,
            },
            # embedx admitted at once, so the PS side does the full-width work from the start
            "ps": {"config": {"tables": [{"embedxDim": DIM, "embedxThreshold": 0}]}},
            "runtime": {"numThreads": threads},
        }
    )


@dataclass(frozen=True)
class DataSet:
    """One round's batches, and how plain PyTorch maps their keys to rows."""

    name: str
    batches: list[Batch]
    num_ids: int  # rows of plain PyTorch's table
    ids: Callable[[npt.NDArray[np.uint64]], npt.NDArray[np.int64]]
    grow: npt.NDArray[np.uint64] | None = None  # keys created in every PS table first
    slots: int = SLOTS


def criteo(data_dir: Path, config: WorkerConfig, repeats: int, limit: int = 0) -> DataSet:
    """The sample's batches ``repeats`` times (only its first ``limit`` batches if > 0)."""
    path = data_dir / SAMPLE
    if not path.exists():
        raise FileNotFoundError(f"{path}: the Criteo sample is missing (--data)")
    batches = list(iter_batches([str(path)], config.data, BATCH))[: limit or None]
    vocab = np.unique(np.concatenate([b.keys for b in batches]))
    return DataSet(
        "criteo",
        batches * repeats,
        int(vocab.size),
        lambda keys: np.searchsorted(vocab, keys).astype(np.int64),
    )


def long_tail_set(count: int, keys_per_slot: int, seed: int, slots: int = SLOTS) -> DataSet:
    batches = long_tail.batches(
        count=count,
        batch_size=BATCH,
        slots=slots,
        keys_per_slot=keys_per_slot,
        ctr=0.25,
        seed=seed,
    )
    return DataSet(
        "long_tail",
        batches,
        long_tail.num_keys(slots, keys_per_slot),
        lambda keys: keys.astype(np.int64),
        grow=long_tail.all_keys(slots, keys_per_slot),
        slots=slots,
    )


class TorchBaseline:
    """Side (a): the same network trained the textbook way, in one process.

    ``spec`` may be any ``slot_dnn`` shape the system trains; plain PyTorch then computes
    the same inputs itself, so both sides run the same network (``bench.worker.e2e`` compares its
    job with plain PyTorch at the job's own shape):

    - CVM columns: per-id show and click counts in a ``(num_ids, 2)`` tensor, pooled per
      slot like the embeddings (``embedding.cvm_columns``: log counts) and incremented after
      each batch — the statistics the PS keeps, kept the plain-PyTorch way;
    - ordinal inputs: computed from each batch's keys up front, like its ids;
    - summary layers (data norm, base rate): after each step the batch's counts are folded
      into the layers' statistics by the PS's summary rule (``decay * stats + batch``).
    """

    def __init__(
        self, data: DataSet, spec: ModelSpec, seed: int, summary_decay: float = 1.0
    ) -> None:
        self.inputs = [_TorchInput.of(b, data.ids(b.keys), spec) for b in data.batches]
        torch.manual_seed(seed)
        self.embedding = nn.EmbeddingBag(data.num_ids, 1 + DIM, mode="sum", sparse=True)
        nn.init.uniform_(self.embedding.weight, -1e-4, 1e-4)
        self.dense = build_model("slot_dnn", spec, seed=seed)
        self.sparse_opt = torch.optim.Adagrad(self.embedding.parameters(), lr=0.05)
        self.dense_opt = torch.optim.Adam(self.dense.parameters(), lr=0.001)
        self.num_slots = spec.num_slots
        self.counts = torch.zeros(data.num_ids, 2) if spec.cvm else None
        self.summaries = summary_layers(self.dense)
        self.summary_decay = summary_decay

    def run(self) -> int:
        examples = 0
        for x in self.inputs:
            pooled = self.embedding(x.ids, x.offsets[:-1]).view(x.size, self.num_slots, -1)
            if self.counts is not None:
                shows_clicks = cvm_columns(x.ids, self.counts.numpy(), x.offsets)
                pooled = torch.cat([shows_clicks.view(x.size, self.num_slots, 2), pooled], 2)
            self.dense.follow_keys(pooled, x.first_keys)
            logits = self.dense(pooled, None, None, x.ordinal)
            loss = nn.functional.binary_cross_entropy_with_logits(logits, x.labels)
            self.sparse_opt.zero_grad(set_to_none=True)
            self.dense_opt.zero_grad(set_to_none=True)
            loss.backward()
            self.sparse_opt.step()
            self.dense_opt.step()
            if self.counts is not None and x.key_counts is not None:
                self.counts.index_add_(0, x.ids, x.key_counts)
            if self.summaries:
                self.dense.observe_labels(x.labels, logits)
                batch_stats = drain_pending(self.summaries)
                stats = gather_stats(self.summaries) * self.summary_decay + batch_stats
                scatter_stats(self.summaries, stats)
            examples += x.size
        return examples


@dataclass(frozen=True)
class _TorchInput:
    """One batch as plain PyTorch takes it (everything derived from the data up front)."""

    ids: torch.Tensor
    offsets: torch.Tensor  # with the last offset
    labels: torch.Tensor
    size: int
    ordinal: torch.Tensor | None
    #: Each key occurrence's (show, click) increment, for a CVM shape.
    key_counts: torch.Tensor | None
    #: The first example's key of each slot (``Batch.first_example_keys``).
    first_keys: torch.Tensor

    @classmethod
    def of(cls, batch: Batch, ids: npt.NDArray[np.int64], spec: ModelSpec) -> _TorchInput:
        key_counts = None
        if spec.cvm:
            clicks = batch.labels[batch.bag_of_key() // batch.num_slots]
            key_counts = torch.from_numpy(
                np.stack([np.ones_like(clicks), clicks], axis=1).astype(np.float32)
            )
        ordinal = None
        if spec.ordinal_slots:
            ordinal = torch.from_numpy(ordinal_inputs(batch, spec.ordinal_slots))
        return cls(
            torch.from_numpy(ids),
            torch.from_numpy(np.ascontiguousarray(batch.offsets, dtype=np.int64)),
            torch.from_numpy(batch.labels),
            batch.size,
            ordinal,
            key_counts,
            torch.from_numpy(batch.first_example_keys()),
        )


def grow(ps: PSLike, table: str, keys: npt.NDArray[np.uint64]) -> None:
    """Create every key's row (one show, zero gradient), untimed."""
    for i in range(0, keys.size, GROW_CHUNK):
        chunk = keys[i : i + GROW_CHUNK]
        n = chunk.size
        zeros = np.zeros(n, dtype=np.float32)
        grads = np.zeros((n, 1 + DIM), dtype=np.float32)
        ps.push_sparse(
            table, SparsePush(chunk, grads, zeros + 1, zeros, np.zeros(n, dtype=np.uint32))
        )


def process_cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of another process so far (``/proc/<pid>/stat``)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@dataclass
class Side:
    name: str
    run: Callable[[], int]
    ps_pid: int | None = None  # the PS process, when it is not this one
    rates: list[float] | None = None
    cpu: list[float] | None = None  # this process's CPU-seconds per example
    ps_cpu: list[float] | None = None

    def timed(self) -> None:
        """One round: examples/s, and CPU-seconds per example here and in the PS process."""
        ps0 = process_cpu_seconds(self.ps_pid) if self.ps_pid else 0.0
        cpu0, t0 = time.process_time(), time.perf_counter()
        examples = self.run()
        wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
        self.rates = [*(self.rates or []), examples / wall]
        self.cpu = [*(self.cpu or []), cpu / examples]
        if self.ps_pid:
            ps_cpu = process_cpu_seconds(self.ps_pid) - ps0
            self.ps_cpu = [*(self.ps_cpu or []), ps_cpu / examples]


@contextlib.contextmanager
def make_sides(
    data: DataSet, config: WorkerConfig, spec: ModelSpec, names: tuple[str, ...] = SIDES
) -> Iterator[list[Side]]:
    """The sides ``names`` for ``data``, each with a fresh table (grown to the key space)."""
    with contextlib.ExitStack() as stack:
        out = []
        for name in names:
            if name == "torch":
                out.append(Side(name, TorchBaseline(data, spec, config.seed).run))
                continue
            pid = None
            ps: PSLike
            if name == "local":
                ps = LocalPS(config.ps.config)
            else:
                tmp = stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-worker-"))
                shard = stack.enter_context(shard_process(config.ps.config, Path(tmp)))
                ps = remote = RemotePS([shard.address], config.ps.config)
                remote.wait_ready()
                pid = shard.process.pid
            stack.callback(ps.close)
            if data.grow is not None:
                grow(ps, config.table, data.grow)
            trainer = Trainer(config, ps, data.slots)
            stack.callback(trainer.close)
            out.append(Side(name, partial(_train, trainer, data.batches), ps_pid=pid))
        yield out


def _train(trainer: Trainer, batches: list[Batch]) -> int:
    return trainer.run_pass(batches).examples


def wire_bytes(data: DataSet, config: WorkerConfig) -> dict[str, float]:
    """PS payload bytes per example of one pass over gRPC (``CountingPS``), untimed."""
    with contextlib.ExitStack() as stack:
        tmp = stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-worker-"))
        shard = stack.enter_context(shard_process(config.ps.config, Path(tmp)))
        remote = RemotePS([shard.address], config.ps.config)
        stack.callback(remote.close)
        remote.wait_ready()
        counting = CountingPS(remote)
        trainer = Trainer(config, counting, data.slots)
        stack.callback(trainer.close)
        counting.reset()
        examples = trainer.run_pass(data.batches).examples
    return {k: round(v / examples, 1) for k, v in counting.bytes.items()}


def measure(
    data: DataSet, config: WorkerConfig, rounds: int, names: tuple[str, ...] = SIDES
) -> dict[str, Any]:
    spec = ModelSpec.from_config(config.model, data.slots)
    with make_sides(data, config, spec, names) as all_sides:
        for side in all_sides:  # warm-up: allocator, numba kernels, first touch
            side.run()
        for r in range(rounds):
            for i in range(len(all_sides)):
                all_sides[(r + i) % len(all_sides)].timed()
    by_name = {s.name: s for s in all_sides}
    rates = {n: s.rates or [] for n, s in by_name.items()}
    uniques = [unique_inverse(b.keys)[0].size for b in data.batches]
    ps_cpu = by_name["grpc"].ps_cpu if "grpc" in by_name else None
    return {
        "ex_per_s_best": {n: round(max(r), 1) for n, r in rates.items()},
        "rounds": {n: [round(x, 1) for x in r] for n, r in rates.items()},
        "paired_median": {
            f"{a}_vs_{b}": round(
                statistics.median(x / y for x, y in zip(rates[a], rates[b], strict=True)), 3
            )
            for a, b in PAIRS
            if a in rates and b in rates
        },
        # Throughput at equal CPU (load-independent): plain PyTorch's CPU-seconds per example
        # over the gRPC path's, worker and PS process together.
        "cpu_ratio_grpc_vs_torch": _cpu_ratio(by_name, ps_cpu),
        "cpu_us_per_example": {
            **{n: round(1e6 * statistics.median(s.cpu or [0.0]), 2) for n, s in by_name.items()},
            "grpc_ps": round(1e6 * statistics.median(ps_cpu or [0.0]), 2),
        },
        "wire_bytes_per_example": wire_bytes(data, config) if "grpc" in names else {},
        "unique_keys_per_batch": round(float(np.mean(uniques)), 1),
        "keys_per_batch": round(float(np.mean([b.keys.size for b in data.batches])), 1),
        "table_keys": int(data.grow.size) if data.grow is not None else data.num_ids,
        "examples_per_round": sum(b.size for b in data.batches),
    }


def _cpu_ratio(by_name: dict[str, Side], ps_cpu: list[float] | None) -> float | None:
    if "torch" not in by_name or "grpc" not in by_name or not ps_cpu:
        return None
    torch_cpu = statistics.median(by_name["torch"].cpu or [0.0])
    grpc_cpu = statistics.median(by_name["grpc"].cpu or [0.0]) + statistics.median(ps_cpu)
    return round(torch_cpu / grpc_cpu, 3)


def run(args: argparse.Namespace) -> dict[str, Any]:
    torch.set_num_threads(args.threads)
    # Plain PyTorch as people run it: no per-step sparse invariant checks in Adagrad.
    torch.sparse.check_sparse_tensor_invariants.disable()
    # This process trains every side, so it keeps large buffers for reuse as a worker
    # process does (``streamtrain_ps.plumbing.heap``): plain PyTorch gets the same heap.
    reuse_large_buffers()
    config = bench_config(args.threads)
    result: dict[str, Any] = {}
    for name in args.sets:
        if name == "criteo":
            data = criteo(args.data, config, args.repeats, args.criteo_batches)
        else:
            data = long_tail_set(
                args.long_tail_batches, args.keys_per_slot, config.seed, args.long_tail_slots
            )
        result[name] = measure(data, config, args.rounds, tuple(args.sides))
        pm = result[name]["paired_median"]
        result[f"grpc_cpu_ratio_{name}"] = result[name]["cpu_ratio_grpc_vs_torch"]
        for side in ("grpc", "local"):
            if f"{side}_vs_torch" in pm:
                result[f"{side}_ratio_{name}"] = pm[f"{side}_vs_torch"]
        if not args.json:
            print_set(name, result[name])
    if args.parse_seconds > 0:
        parse = bench_parse.measure_all(args.data, min_seconds=args.parse_seconds)
        result["parse_lines_per_s"] = {k: round(v, 1) for k, v in parse.items()}
    result.update(
        batch_size=BATCH, slots=SLOTS, long_tail_slots=args.long_tail_slots, dims=1 + DIM,
        hidden_units=list(HIDDEN), torch_threads=args.threads, rounds=args.rounds,
    )  # fmt: skip
    return result


def print_set(name: str, r: dict[str, Any]) -> None:
    best, cpu = r["ex_per_s_best"], r["cpu_us_per_example"]
    print(
        f"{name}: {r['examples_per_round']} examples/round, {r['keys_per_batch']:.0f} keys and "
        f"{r['unique_keys_per_batch']:.0f} unique keys per batch, table {r['table_keys']:,} keys"
    )
    for side in best:
        print(f"  {side:6s} best {best[side]:9.0f} ex/s  cpu {cpu[side]:7.1f} us/ex")
    print(f"  PS process over gRPC: cpu {cpu['grpc_ps']:.1f} us/ex")
    print(f"  at equal CPU, gRPC path / plain PyTorch: {r['cpu_ratio_grpc_vs_torch']}")
    print("  paired medians: " + ", ".join(f"{k} {v:.3f}" for k, v in r["paired_median"].items()))
    print(f"  payload bytes/ex: {r['wire_bytes_per_example']}")


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(
        prog="python -m streamtrain_tools.bench.worker", description=__doc__
    )
    p.add_argument("--data", type=Path, default=SAMPLES_DIR, help="folder of the samples")
    p.add_argument("--repeats", type=int, default=3, help="Criteo sample repetitions per round")
    p.add_argument("--criteo-batches", type=int, default=0, help="> 0: only the first N batches")
    p.add_argument("--long-tail-batches", type=int, default=40, help="long-tail batches per round")
    p.add_argument(
        "--keys-per-slot", type=int, default=1 << 17, help="long-tail ids per slot (power of 2)"
    )
    p.add_argument("--long-tail-slots", type=int, default=SLOTS, help="slots of the long tail")
    p.add_argument("--rounds", type=int, default=5, help="rounds of the three sides")
    p.add_argument("--threads", type=int, default=1, help="torch intra-op threads (every side)")
    p.add_argument("--parse-seconds", type=float, default=1.0, help="min time per parse format")
    p.add_argument("--sides", nargs="+", choices=SIDES, default=list(SIDES), help="(profiling)")
    p.add_argument(
        "--sets", nargs="+", choices=("criteo", "long_tail"), default=["criteo", "long_tail"]
    )
    p.add_argument(
        "--cpus", type=int, nargs="+", help="pin the bench and its PS process to these cores"
    )
    p.add_argument("--quick", action="store_true", help="tiny sizes, one round (for tests)")
    p.add_argument("--json", action="store_true", help="only the JSON line")
    args = p.parse_args(argv)
    if args.quick:
        args.repeats, args.criteo_batches = 1, 3
        args.long_tail_batches, args.keys_per_slot = 3, 1 << 10
        args.rounds, args.parse_seconds = 1, 0.01
    if args.cpus:  # the PS process started later inherits the same cores
        os.sched_setaffinity(0, args.cpus)
    result = run(args)
    if not args.json and "grpc_ratio_long_tail" in result and "grpc_ratio_criteo" in result:
        print(
            f"PS over gRPC / plain PyTorch (median of paired rounds): criteo "
            f"{result['grpc_ratio_criteo']:.3f}, long tail {result['grpc_ratio_long_tail']:.3f}"
        )
    print(json.dumps(result, sort_keys=True), flush=True)


if __name__ == "__main__":
    main()
