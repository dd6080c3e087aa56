"""What the operator renders, the PS and the worker parse — field by field."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pytest

from streamtrain_operator.job import render
from streamtrain_operator.job.spec import JobSpec, parse_spec
from streamtrain_ps.config import PSConfig
from streamtrain_worker.config import ModelConfig, WorkerConfig
from streamtrain_worker.data.config import DataConfig

BASE: dict[str, Any] = {
    "data": {"path": "/logs", "startDay": "20261101", "format": "criteo"},
    "checkpoint": {"path": "/ckpt"},
    "export": {"path": "/exp"},
}

NON_DEFAULT: dict[str, Any] = {
    "data": {
        "path": "s3://logs/ctr",
        "startDay": "20261101",
        "endDay": "20261103",
        "format": "csv",
        "columns": {"click": "label", "site": "site", "tags": {"slot": "tags", "kind": "multi"}},
        "delimiter": ";",
        "header": True,
        "splitIntervalMinutes": 30,
        "splitsPerPass": 4,
        "donefile": "_DONE",
        "pollSeconds": 5,
        "missingDeadlineSeconds": 120,
        "onMissing": "fail",
        "maxBadLineFraction": 0.01,
        "sequenceSlot": 1,
    },
    "model": {
        "type": "din",
        "embeddingDim": 4,
        "hiddenUnits": [32, 16],
        "batchSize": 128,
        "cvm": False,
        "denseSyncSteps": 3,
        "normalizeEmbeddings": False,
        "summaryDecayRate": 0.999,
        "dataNormPrior": 50.0,
        "crossLayers": 1,
        "crossRank": 16,
        "fmInteractions": True,
        "priorClickRate": 0.05,
        "ordinalInputs": False,
        "baseRateOffset": False,
        "residualCalibration": True,
        "calibrationWindow": 250,
        "calibrationInLoss": False,
        "calibrationSparesContextKeys": True,
        "calibrationPassSplit": False,
        "calibrationEvidence": False,
        "calibrationPseudoClicks": 3,
        "rateScaledSteps": False,
        "contextRate": False,
        "targetSlot": 0,
        "attentionUnits": [8],
    },
    "sparse": {
        "embedxThreshold": 2,
        "nonclkCoeff": 0.2,
        "clickCoeff": 2,
        "showClickDecayRate": 0.9,
        "deleteThreshold": 0.5,
        "deleteAfterUnseenDays": 7,
        "baseThreshold": 0.5,
        "deltaThreshold": 0.1,
        "deltaKeepDays": 3,
        "optimizer": {
            "type": "adam",
            "learningRate": 0.01,
            "initialG2sum": 1.0,
            "initialRange": 0.001,
            "weightBounds": [-5, 5],
            "beta1": 0.8,
            "beta2": 0.99,
            "epsilon": 1e-6,
            "embedType": "ftrl",
            "ftrlAlpha": 0.1,
            "ftrlBeta": 0.5,
            "ftrlL1": 0.2,
            "ftrlL2": 0.3,
        },
    },
    "dense": {
        "optimizer": {
            "type": "sgd",
            "learningRate": 0.1,
            "beta1": 0.5,
            "beta2": 0.9,
            "epsilon": 1e-7,
        }
    },
    "ps": {"replicas": 3, "logicalShards": 12},
    "workers": {
        "replicas": 2,
        "numThreads": 3,
        "prefetchBatches": 3,
        "pushQueueDepth": 2,
        "inOrderExamples": 0,
        "maxMergedPushes": 4,
    },
    "checkpoint": {"path": "s3://models/ckpt", "everyPasses": 2},
    "export": {"path": "s3://models/serving", "deltaEveryPasses": 2},
    "seed": 7,
}

ENDPOINTS = ("127.0.0.1:7001", "127.0.0.1:7002", "127.0.0.1:7003")


def _plain(value: Any) -> Any:
    return list(value) if isinstance(value, tuple) else value


def _same_named_fields(ours: Any, theirs: Any, skip: set[str] = frozenset()) -> int:
    """Every field ``ours`` and ``theirs`` share by name holds the same value."""
    names = {f.name for f in dataclasses.fields(ours)} & {
        f.name for f in dataclasses.fields(theirs)
    }
    names -= skip
    for name in sorted(names):
        a, b = getattr(ours, name), getattr(theirs, name)
        if dataclasses.is_dataclass(a) and dataclasses.is_dataclass(b):
            _same_named_fields(a, b)
        else:
            assert _plain(a) == _plain(b), f"{type(ours).__name__}.{name}: {a!r} != {b!r}"
    return len(names)


@pytest.mark.parametrize("raw", [BASE, NON_DEFAULT], ids=["defaults", "non-defaults"])
def test_ps_parses_what_the_operator_renders(raw: dict[str, Any]) -> None:
    spec = parse_spec(raw)
    text = render.render_ps(spec)
    parsed = PSConfig.from_json(text)
    assert parsed == render.ps_config(spec)
    (table,) = parsed.tables
    assert table.embedxDim == spec.model.embeddingDim
    assert _same_named_fields(spec.sparse, table, skip={"optimizer"}) == 9
    assert _same_named_fields(spec.sparse.optimizer, table.optimizer) == 16
    assert _same_named_fields(spec.dense.optimizer, parsed.dense.optimizer) == 5
    assert (parsed.logicalShards, parsed.seed) == (spec.ps.logicalShards, spec.seed)
    # Every field is explicit in the JSON: nothing is left to the PS's defaults.
    assert set(json.loads(text)) == {f.name for f in dataclasses.fields(PSConfig)}


@pytest.mark.parametrize("raw", [BASE, NON_DEFAULT], ids=["defaults", "non-defaults"])
def test_worker_parses_what_the_operator_renders(raw: dict[str, Any]) -> None:
    spec = parse_spec(raw)
    text = render.render_worker(spec, ENDPOINTS)
    parsed = WorkerConfig.from_json(text)
    assert parsed == render.worker_config(spec, ENDPOINTS)
    assert _same_named_fields(spec.model, parsed.model) == 28
    data = parsed.data
    assert _same_named_fields(spec.data, data) == len(dataclasses.fields(spec.data))
    assert parsed.ps.endpoints == ENDPOINTS
    assert parsed.ps.config == render.ps_config(spec)
    # Every runtime setting the manifest names reaches the worker (the rest: metrics only).
    assert _same_named_fields(spec.workers, parsed.runtime) == 6
    assert parsed.seed == spec.seed
    rendered = json.loads(text)
    assert set(rendered) == {f.name for f in dataclasses.fields(WorkerConfig)}
    assert set(rendered["model"]) == {f.name for f in dataclasses.fields(ModelConfig)}
    assert set(rendered["data"]) == {f.name for f in dataclasses.fields(DataConfig)}


def test_spec_model_defaults_are_the_worker_defaults() -> None:
    """One set of defaults: an empty spec.model renders exactly the worker's ModelConfig()."""
    spec: JobSpec = parse_spec(BASE)
    assert render.worker_config(spec, ENDPOINTS).model == ModelConfig()
