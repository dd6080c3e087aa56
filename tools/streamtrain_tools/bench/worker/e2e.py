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

3. **Plain PyTorch** at the throughput run's shape, in the same invocation (before and after
   the throughput run, averaged, so load drift hits both): ``bench.worker``'s
   ``nn.EmbeddingBag`` + the job's own ``slot_dnn`` network (``job_spec``) over the same
   144,000 rows, batch 512, one torch thread, sparse Adagrad and dense Adam; the CVM
   columns from per-id show/click counts and the ordinal inputs computed by plain PyTorch
   too (``TorchBaseline``): 39 x (2 + 1 + 8) + 13 x 2 inputs to the first layer. Also the
   textbook 39 x (1 + 8) network without them (the reference of earlier rounds: ~20 %
   less compute per example), reported beside it.

Every step the driver runs in the throughput run is timed (``RunOptions.on_action``): start-up
is launch to the first step; a pass transition is everything between two passes' training
(delta save + TorchScript export + manifests, checkpoints, data checks, day end), reported
per pass and per kind of step.

The last line printed is one JSON object: ``auc_mean_13_24``,
``throughput_auc_mean_13_24`` (the throughput run's progressive AUC, passes 13-24),
``e2e_ex_per_s``,
``train_ex_per_s``, ``torch_ex_per_s``, ``train_vs_torch`` (training-only over plain
PyTorch at the job's shape), ``torch_textbook_ex_per_s`` and ``train_vs_torch_textbook``
(the same over the textbook network), ``e2e_vs_train`` (launch-to-finish over training-only),
``job_cpu_us_per_example`` (CPU-seconds of the throughput run's processes and of the driver,
launch to finish, per example) beside ``torch_cpu_us_per_example`` (plain PyTorch's),
``train_vs_torch_no_cvm`` (with ``--no-cvm-side``: a second throughput run with
``model.cvm: false``, over plain PyTorch at that shape measured around it),
``transition_seconds_per_pass``, ``pass_fixed_seconds_per_pass`` (a RunPass's wall time
beyond the workers' batch loops), ``passes_read_ahead`` (passes whose files the workers read
while the pass before trained), ``startup_seconds``, ``step_seconds`` (per kind: total and
count), ``phase_seconds`` (the parts of the steps and of the start-up, total and count:
``launch`` and ``connect`` of the processes; a publication's ``sparse`` PS save, ``dense``
TorchScript export, ``manifest`` and ``donefile``; ``checkpoint_save`` and its ``prune``,
``checkpoint_snapshot`` (a checkpoint taken at the pass boundary and written beside the next
pass, ``checkpoint.besideTraining``, which this job sets);
``assign``, a pass's file listing and recording; ``state``, the durable progress writes),
plus the settings used.
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import resource
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
import yaml

from streamtrain_operator.job.messages import Action, RunPass, Save
from streamtrain_operator.job.progress import Phase, Progress
from streamtrain_operator.job.render import worker_config
from streamtrain_operator.job.spec import load_job, parse_job
from streamtrain_operator.local.runner import RunOptions, run_job
from streamtrain_ps.plumbing.heap import reuse_large_buffers
from streamtrain_tools.bench.worker import run as bench_worker
from streamtrain_tools.samples import SAMPLES_DIR, lay_out
from streamtrain_worker.models import ModelSpec

DAY = "20261101"
SUMMARY_DECAY = 0.95


def manifest(
    batch_size: int,
    workers: int,
    lr: float,
    dense_lr: float = 0.0005,
    shards: int = 1,
    cvm: bool = True,
) -> dict[str, Any]:
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
                # Off only for --no-cvm-side: then the input is plain PyTorch's, 39 x (1 + 8).
                "cvm": cvm,
                # The target is what plain PyTorch reaches (EmbeddingBag + MLP, the
                # embeddings fed raw; streamtrain_tools.bench.quality.reference): normalise only the
                # CVM columns like it. Normalising the whole input cost ~0.01 AUC here
                # (measured with batch norm; docs/decisions.md).
                "normalizeEmbeddings": False,
                # A 7,200-row stream: every key's show count grows pass after pass, so the
                # CVM inputs drift faster than a cumulative average follows; ~20 pushes of
                # memory (2 passes) instead of the near-infinite default (docs/decisions.md).
                "summaryDecayRate": SUMMARY_DECAY,
            },
            # Every key gets its 1 + 8 weights from its first show, as in plain PyTorch.
            "sparse": {"embedxThreshold": 0, "optimizer": {"learningRate": lr}},
            "dense": {"optimizer": {"type": "adam", "learningRate": dense_lr}},
            "ps": {"replicas": shards},
            "workers": {"replicas": workers},
            # Each checkpoint's files are written while the next pass trains (a copy of
            # the PS's rows, 7 MB here, held meanwhile: docs/decisions.md).
            "checkpoint": {"path": "checkpoints", "everyPasses": 6, "besideTraining": True},
            "export": {"path": "models", "deltaEveryPasses": 1},
        },
    }


class StepTimer:
    """Start times of the driver's steps, by kind (``train``, ``save_delta``, ...)."""

    def __init__(self) -> None:
        self.started = time.perf_counter()
        self.steps: list[tuple[float, str]] = []
        self.finished = self.started
        #: Parts of steps and of the start-up (``RunOptions.on_phase``): total seconds, count.
        self.phases: dict[str, list[float]] = {}
        #: CPU-seconds of the whole run: the driver (this process) and the job's processes.
        self.cpu_seconds = 0.0

    def phase(self, name: str, seconds: float) -> None:
        total = self.phases.setdefault(name, [0.0, 0])
        total[0] += seconds
        total[1] += 1

    def __call__(self, action: Action, progress: Progress) -> None:
        if isinstance(action, RunPass):
            kind = "train"
        elif isinstance(action, Save):
            kind = f"save_{action.key.kind.value}"
        else:
            kind = type(action).__name__.lower()
        self.steps.append((time.perf_counter(), kind))

    def report(self, passes: int) -> dict[str, Any]:
        """Start-up, per-kind totals, and the transition time between passes."""
        ends = [t for t, _ in self.steps[1:]] + [self.finished]
        kinds: dict[str, list[float]] = {}
        for (start, kind), end in zip(self.steps, ends, strict=True):
            kinds.setdefault(kind, []).append(end - start)
        first = self.steps[0][0] if self.steps else self.finished
        train = sum(kinds.get("train", []))
        return {
            "startup_seconds": round(first - self.started, 2),
            "transition_seconds_per_pass": round((self.finished - first - train) / passes, 3),
            "step_seconds": {
                k: {"total": round(sum(v), 2), "count": len(v)} for k, v in sorted(kinds.items())
            },
            "phase_seconds": {
                k: {"total": round(v[0], 3), "count": int(v[1])}
                for k, v in sorted(self.phases.items())
            },
        }


def run(
    root: Path,
    *,
    repeat: int,
    batch_size: int,
    workers: int,
    lr: float,
    log: io.TextIOBase,
    data_dir: Path = SAMPLES_DIR,
    shards: int = 1,
    cvm: bool = True,
) -> tuple[Progress, float, StepTimer]:
    """Lay out the data, run the job; the final progress, launch-to-finish seconds and the
    steps' timings."""
    lay_out("criteo", root / "data", data_dir=data_dir, start_day=DAY, repeat=repeat)
    path = root / "job.yaml"
    path.write_text(yaml.safe_dump(manifest(batch_size, workers, lr, shards=shards, cvm=cvm)))
    job = load_job(path)
    timer = StepTimer()
    options = RunOptions(
        root / "state.json",
        root / "work",
        out=log,  # type: ignore[arg-type]
        on_action=timer,
        on_phase=timer.phase,
    )
    own, children = time.process_time(), _children_cpu()
    progress = asyncio.run(run_job(job, options))
    timer.finished = time.perf_counter()
    timer.cpu_seconds = time.process_time() - own + _children_cpu() - children
    wall = timer.finished - timer.started
    if progress.phase != Phase.SUCCEEDED:
        raise RuntimeError(f"bench job ended {progress.phase}: {progress.message}")
    return progress, wall, timer


def _children_cpu() -> float:
    """User + system CPU-seconds of this process's children that have ended (and been
    waited for): the job's shard and worker processes once ``run_job`` returned."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def job_spec(cvm: bool = True) -> ModelSpec:
    """The network the throughput job trains: its worker config as the operator renders it
    (``job.render.worker_config``), so a setting added to the manifest reaches both."""
    job = parse_job(manifest(512, 1, 0.05, cvm=cvm))
    config = worker_config(job.spec, [])
    return ModelSpec.from_config(config.model, bench_worker.SLOTS, None, config.data.ordinal_slots)


def torch_reference(
    repeat: int, data_dir: Path = SAMPLES_DIR, cvm: bool = True, textbook: bool = False
) -> tuple[float, float]:
    """Plain PyTorch over the throughput run's rows (``bench.worker``'s side a): its
    examples/s and its CPU-seconds per example.

    By default at the job's own shape (``job_spec``: the CVM columns and ordinal inputs
    widen the first layer by a third, the base rate and data norm count per batch) — the
    issue's "same shape"; ``textbook`` is the 39 x (1 + 8) network without them, the
    reference of earlier rounds (``train_vs_torch_textbook``).
    """
    torch.set_num_threads(1)
    torch.sparse.check_sparse_tensor_invariants.disable()
    reuse_large_buffers()  # the heap the job's workers run with (streamtrain_ps.plumbing.heap)
    config = bench_worker.bench_config(1)
    data = bench_worker.criteo(data_dir, config, repeat)
    # The textbook network has no summary layers: the decay only reaches the job's.
    spec = ModelSpec.from_config(config.model, bench_worker.SLOTS) if textbook else job_spec(cvm)
    baseline = bench_worker.TorchBaseline(data, spec, config.seed, summary_decay=SUMMARY_DECAY)
    baseline.inputs, rest = baseline.inputs[:4], baseline.inputs  # warm-up: 4 batches
    baseline.run()
    baseline.inputs = rest
    started, cpu = time.perf_counter(), time.process_time()
    examples = baseline.run()
    cpu_per_example = (time.process_time() - cpu) / examples
    return examples / (time.perf_counter() - started), cpu_per_example


def quality_run(root: Path, args: argparse.Namespace, log: io.TextIOBase) -> float:
    """The quality protocol; the mean progressive AUC of passes 13-24."""
    quality, _, _ = run(
        root,
        repeat=1,
        batch_size=args.auc_batch_size,
        workers=args.workers,
        lr=args.lr,
        log=log,
        data_dir=args.data,
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
    return auc_mean


def no_cvm_side(root: Path, args: argparse.Namespace, log: io.TextIOBase) -> dict[str, Any]:
    """The throughput run again with ``model.cvm: false``, against plain PyTorch at that
    shape measured before and after it: what the 2 CVM columns cost."""
    before = torch_reference(args.repeat, args.data, cvm=False)[0]
    speed, _, _ = run(
        root,
        repeat=args.repeat,
        batch_size=args.batch_size,
        workers=args.workers,
        lr=args.lr,
        log=log,
        data_dir=args.data,
        shards=args.shards,
        cvm=False,
    )
    torch_rate = (before + torch_reference(args.repeat, args.data, cvm=False)[0]) / 2
    train = sum(r.metrics["examples"] for r in speed.history) / sum(
        r.metrics["seconds"] for r in speed.history
    )
    print(f"throughput run without CVM: {train:,.0f} ex/s in RunPass, torch {torch_rate:,.0f}")
    return {
        "train_ex_per_s_no_cvm": round(train, 1),
        "torch_ex_per_s_no_cvm": round(torch_rate, 1),
        "train_vs_torch_no_cvm": round(train / torch_rate, 3),
    }


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m streamtrain_tools.bench.worker.e2e", description=__doc__
    )
    p.add_argument("--json", action="store_true", help="(the JSON line is always printed last)")
    p.add_argument("--auc-batch-size", type=int, default=32)
    p.add_argument("--batch-size", type=int, default=512)
    p.add_argument("--repeat", type=int, default=20)
    p.add_argument("--workers", type=int, default=1)
    p.add_argument("--lr", type=float, default=0.05, help="sparse AdaGrad learning rate")
    p.add_argument("--shards", type=int, default=1, help="PS shards of the throughput run")
    p.add_argument("--skip-quality", action="store_true", help="only the throughput run")
    p.add_argument("--data", type=Path, default=SAMPLES_DIR, help="folder of the samples")
    p.add_argument("--verbose", action="store_true", help="show the jobs' progress lines")
    p.add_argument(
        "--no-cvm-side",
        action="store_true",
        help="also a throughput run with model.cvm false, "
        "reported as train_vs_torch_no_cvm against plain PyTorch at that shape around it",
    )
    args = p.parse_args(argv)
    log: Any = sys.stdout if args.verbose else io.StringIO()
    with tempfile.TemporaryDirectory(prefix="streamtrain-bench-") as tmp:
        auc_mean = None if args.skip_quality else quality_run(Path(tmp) / "auc", args, log)
        textbook = [torch_reference(args.repeat, args.data, textbook=True)]
        references = [torch_reference(args.repeat, args.data)]
        speed, wall, timer = run(
            Path(tmp) / "speed",
            repeat=args.repeat,
            batch_size=args.batch_size,
            workers=args.workers,
            lr=args.lr,
            log=log,
            data_dir=args.data,
            shards=args.shards,
        )
        references.append(torch_reference(args.repeat, args.data))
        textbook.append(torch_reference(args.repeat, args.data, textbook=True))
        torch_rates = [rate for rate, _ in references]
        no_cvm = no_cvm_side(Path(tmp) / "no-cvm", args, log) if args.no_cvm_side else {}
        examples = sum(r.metrics["examples"] for r in speed.history)
        train_seconds = sum(r.metrics["seconds"] for r in speed.history)
        # The workers' batch loops (forward, backward, metrics; the slowest worker's per
        # pass): the rest of a RunPass is its fixed cost (the call, the reader's and the
        # prefetcher's start, the dense sync, the final flush, the metrics' answer).
        compute_seconds = sum(r.metrics["trainSeconds"] for r in speed.history)
        # The throughput run's own progressive AUC (each batch scored before its update;
        # its passes repeat their rows, so it reads higher than the quality run's):
        # ``bench-peer`` sets it beside the peer's on the same passes.
        speed_aucs = [r.metrics["auc"] for r in speed.history[12:24] if "auc" in r.metrics]
        speed_auc = sum(speed_aucs) / 12 if len(speed_aucs) == 12 else None
        e2e = examples / wall
        train = examples / train_seconds
        print(
            f"throughput run: 24 passes x {300 * args.repeat} rows, batch {args.batch_size}: "
            f"{examples:,.0f} examples in {wall:.1f}s launch to finish ({e2e:,.0f} ex/s), "
            f"{train_seconds:.1f}s in RunPass ({train:,.0f} ex/s)"
        )
    torch_rate = sum(torch_rates) / len(torch_rates)
    textbook_rate = sum(rate for rate, _ in textbook) / len(textbook)
    torch_cpu = sum(cpu for _, cpu in references) / len(references)
    job_cpu = timer.cpu_seconds / examples
    steps = timer.report(len(speed.history))
    print(
        f"plain PyTorch at the job's shape: {torch_rate:,.0f} ex/s "
        f"({' / '.join(f'{r:,.0f}' for r in torch_rates)}), at the textbook shape "
        f"{textbook_rate:,.0f} ex/s; start-up "
        f"{steps['startup_seconds']:.1f}s, {steps['transition_seconds_per_pass']:.3f}s of "
        f"steps between passes per pass; steps: {steps['step_seconds']}; "
        f"their parts: {steps['phase_seconds']}"
    )
    result = {
        "auc_mean_13_24": None if auc_mean is None else round(auc_mean, 4),
        "throughput_auc_mean_13_24": None if speed_auc is None else round(speed_auc, 4),
        "e2e_ex_per_s": round(e2e, 1),
        "train_ex_per_s": round(train, 1),
        "torch_ex_per_s": round(torch_rate, 1),
        "torch_rounds": [round(r, 1) for r in torch_rates],
        "train_vs_torch": round(train / torch_rate, 3),
        "torch_textbook_ex_per_s": round(textbook_rate, 1),
        "train_vs_torch_textbook": round(train / textbook_rate, 3),
        # CPU, whatever the load: the job's processes and the driver, launch to finish
        # (start-up, transitions and saves included), and plain PyTorch's training loop.
        "job_cpu_us_per_example": round(job_cpu * 1e6, 1),
        "torch_cpu_us_per_example": round(torch_cpu * 1e6, 1),
        "e2e_vs_train": round(e2e / train, 3),
        "pass_fixed_seconds_per_pass": round(
            (train_seconds - compute_seconds) / len(speed.history), 3
        ),
        # Passes whose files were read while the pass before trained (the first pass's
        # never are: nothing runs before it).
        "passes_read_ahead": sum(
            1 for r in speed.history if r.metrics.get("filesReadAhead", 0) > 0
        ),
        **no_cvm,
        **steps,
        "workers": args.workers,
        "ps_shards": args.shards,
        "auc_batch_size": args.auc_batch_size,
        "batch_size": args.batch_size,
    }
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
