"""The three learners of ``make bench-quality``, each scored pass by pass the same way.

Every learner is progressive (test-then-train: an example is scored before it is learned
from) and every pass is scored by ``PassMetrics`` (the same AUC histograms, log loss and
COPC streamtrain reports), so the numbers compare like for like:

- **streamtrain**: ``streamtrain run``'s code path (``run_job``: PS shard and worker as
  processes, the pass scheduler, exports, checkpoints) on a manifest that names the data and
  ``model.type`` only, so every other setting is the CRD default; ``overrides`` (a JSON
  object deep-merged into ``spec``) measure alternatives. Also scored: each pass's folder
  by the model published after the pass before (``streamtrain predict``'s code): what a
  serving system that picks up every delta would see (``next_pass_scores``).
- **vw**: Vowpal Wabbit in-process through its Python API, one ``Workspace`` per setting,
  ``learn`` per example; the prediction read back is the one made before the update. Also
  scored: each pass by the model as it stood after the pass before (``predict`` only), the
  same next-pass COPC as streamtrain's published deltas.
- **torch**: the plain PyTorch reference of ``streamtrain_tools.bench.quality.reference`` (sparse
  AdaGrad embeddings, Adam MLP, batch 32) on the batches the worker's reader parses.
"""

from __future__ import annotations

import asyncio
import io
import itertools
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import vowpalwabbit
import yaml

from streamtrain_operator.job.progress import Phase
from streamtrain_operator.job.spec import load_job
from streamtrain_operator.local.runner import RunOptions, run_job
from streamtrain_tools.bench.quality.reference import BATCH, NUM_BUCKETS, TorchReference
from streamtrain_tools.bench.quality.streams import Stream, part_files
from streamtrain_worker.data.batch import Batch
from streamtrain_worker.data.config import DataConfig
from streamtrain_worker.data.reader import iter_batches
from streamtrain_worker.metrics import PassMetrics
from streamtrain_worker.publishing.model_folder import ModelKind, model_key
from streamtrain_worker.publishing.predict import load_model
from streamtrain_worker.publishing.predict import score as predict_score

#: Predictions are clipped here before the log loss (VW's logistic link can return 0 or 1).
_EPS = 1e-7


@dataclass(frozen=True)
class PassScore:
    """One pass's progressive metrics (``None`` where undefined)."""

    examples: int
    clicks: int
    auc: float | None
    loss: float | None
    copc: float | None

    def to_dict(self) -> dict[str, Any]:
        return {
            "examples": self.examples,
            "clicks": self.clicks,
            "auc": _round(self.auc),
            "loss": _round(self.loss),
            "copc": _round(self.copc),
        }


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 4)


def score(metrics: PassMetrics) -> PassScore:
    return PassScore(
        metrics.examples, round(metrics.label_sum), metrics.auc, metrics.loss, metrics.copc
    )


def deep_merge(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    """``base`` with ``extra`` merged in, nested objects merged key by key."""
    out = dict(base)
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = value
    return out


def manifest(
    stream: Stream, workdir: Path, overrides: dict[str, Any] | None = None
) -> dict[str, Any]:
    """The job: the stream's data and ``slot_dnn``; everything else the CRD default (the
    checkpoint and export paths are required; one PS shard and one worker, as bench-e2e)."""
    spec = {
        "data": {**stream.data, "pollSeconds": 0.1},
        "model": {"type": "slot_dnn"},
        "ps": {"replicas": 1},
        "workers": {"replicas": 1},
        "checkpoint": {"path": str(workdir / "checkpoints")},
        "export": {"path": str(workdir / "models")},
    }
    return {
        "apiVersion": "streamtrain.io/v1alpha1",
        "kind": "StreamingTrainingJob",
        "metadata": {"name": f"quality-{stream.name}"},
        "spec": deep_merge(spec, overrides or {}),
    }


@dataclass(frozen=True)
class LearnerRun:
    """A learner's progressive per-pass scores, and per pass the scores of its model as
    published after the pass before (``None``: the first pass, or no model published)."""

    scores: list[PassScore]
    next_pass: list[PassScore | None]


def run_streamtrain(
    stream: Stream, workdir: Path, overrides: dict[str, Any] | None = None
) -> LearnerRun:
    """The job through ``run_job`` (what ``streamtrain run`` calls); per-pass scores."""
    workdir.mkdir(parents=True, exist_ok=True)
    path = workdir / "job.yaml"
    path.write_text(yaml.safe_dump(manifest(stream, workdir, overrides)))
    job = load_job(path)
    log = io.StringIO()
    progress = asyncio.run(
        run_job(job, RunOptions(workdir / "state.json", workdir / "work", out=log))
    )
    if progress.phase != Phase.SUCCEEDED:
        raise RuntimeError(f"{stream.name}: job ended {progress.phase}: {progress.message}")
    if len(progress.history) != len(stream.passes):
        raise RuntimeError(
            f"{stream.name}: {len(progress.history)} passes trained, {len(stream.passes)} laid out"
        )
    scores = []
    for record in progress.history:
        m = record.metrics
        examples = int(m["examples"])
        clicks = round(m.get("actual_ctr", 0.0) * examples)
        scores.append(PassScore(examples, clicks, m.get("auc"), m.get("loss"), m.get("copc")))
    passes = [(r.day, r.pass_index) for r in progress.history]
    return LearnerRun(scores, next_pass_scores(stream, workdir / "models", passes))


def next_pass_scores(
    stream: Stream, export_root: Path, passes: list[tuple[str, int]]
) -> list[PassScore | None]:
    """Per pass ``i``: its folder scored by the delta published after pass ``i - 1``
    (``passes``: the trained passes' day and index, in the stream's order)."""
    published = set()
    donefile = export_root / "donefile.txt"
    if donefile.exists():
        published = {json.loads(line)["key"] for line in donefile.read_text().splitlines()}
    out: list[PassScore | None] = [None]
    for (day, index), (_, folder) in zip(passes, stream.passes[1:], strict=False):
        key = model_key(ModelKind.DELTA, day, index)
        if key not in published:
            out.append(None)
            continue
        model = load_model(str(export_root), key)
        out.append(score(predict_score(model, [str(p) for p in part_files(folder)])))
    return out


def run_vw(stream: Stream, settings: str) -> LearnerRun:
    """One VW setting over the stream, progressive; per-pass scores, and each pass after
    the first scored first by the model of the pass before (``predict``, no update)."""
    vw = vowpalwabbit.Workspace(f"{settings} --quiet")
    scores: list[PassScore] = []
    next_pass: list[PassScore | None] = []
    try:
        for _, folder in stream.passes:
            lines = [line for part in part_files(folder) for line in stream.vw_lines(part)]
            labels = [1.0 if line.startswith("1 ") else 0.0 for line in lines]
            if scores:
                next_pass.append(_vw_score([_vw_step(vw, line, False) for line in lines], labels))
            else:
                next_pass.append(None)
            scores.append(_vw_score([_vw_step(vw, line, True) for line in lines], labels))
    finally:
        vw.finish()
    return LearnerRun(scores, next_pass)


def _vw_step(vw: vowpalwabbit.Workspace, line: str, learn: bool) -> float:
    """One example's prediction, made before the update when ``learn``."""
    example = vw.parse(line)
    if learn:
        vw.learn(example)
    else:
        vw.predict(example)
    prediction = float(example.get_simplelabel_prediction())
    vw.finish_example(example)
    return prediction


def _vw_score(predictions: list[float], labels: list[float]) -> PassScore:
    p = np.clip(np.asarray(predictions, dtype=np.float64), _EPS, 1.0 - _EPS)
    y = np.asarray(labels)
    metrics = PassMetrics(num_buckets=NUM_BUCKETS)
    metrics.add(p, y, -(y * np.log(p) + (1.0 - y) * np.log(1.0 - p)))
    return score(metrics)


def previous_rate_scores(scores: list[PassScore]) -> list[PassScore | None]:
    """Per pass, its COPC had it been predicted at the pass before's actual click rate:
    how far the rate moves between passes, what a model that knows each pass's rate exactly
    but nothing of the next one would score (AUC undefined)."""
    out: list[PassScore | None] = [None]
    for before, now in itertools.pairwise(scores):
        rate = before.clicks / before.examples if before.examples else 0.0
        copc = (now.clicks / (rate * now.examples)) if rate > 0 and now.examples else None
        out.append(PassScore(now.examples, now.clicks, None, None, copc))
    return out


def torch_passes(stream: Stream, batch_size: int = BATCH) -> list[list[Batch]]:
    """Each pass's batches as the worker's reader cuts them."""
    config = DataConfig.from_dict(stream.data)
    return [
        list(iter_batches([str(p) for p in part_files(folder)], config, batch_size))
        for _, folder in stream.passes
    ]


def run_torch(stream: Stream, seed: int = 0) -> list[PassScore]:
    """The plain PyTorch reference over the stream; per-pass scores."""
    torch.set_num_threads(1)
    return [score(m) for m in TorchReference(torch_passes(stream), seed).run_metrics()]


def window_mean(scores: list[PassScore], indices: list[int], metric: str) -> float | None:
    """Mean of ``metric`` over the window's passes where it is defined."""
    values = [getattr(scores[i], metric) for i in indices]
    defined = [v for v in values if v is not None and math.isfinite(v)]
    return sum(defined) / len(defined) if defined else None
