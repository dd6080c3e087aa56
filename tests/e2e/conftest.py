"""Fixtures of the end-to-end tests: a small synthetic stream and a job manifest over it."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from streams import START, write_stream


def manifest(root: Path, days: int, **overrides: Any) -> dict[str, Any]:
    """A tiny job (1 PS, 2 workers, small MLP) over ``root/data``; ``overrides`` per section."""
    last = f"{int(START) + days - 1}"
    spec: dict[str, Any] = {
        "data": {
            "path": "data",
            "format": "slot",
            "slots": ["user", "item", "category", "device", "position", "hour", "hist"],
            "labelSlot": "click",
            "startDay": START,
            "endDay": last,
            "splitIntervalMinutes": 360,
            "pollSeconds": 0.2,
        },
        # No wide part and normalised embeddings: on this world of 300 users and 200 items,
        # each seen dozens of times a pass, the normalised embeddings learn the ids faster
        # than the wide part does (docs/decisions.md, "Learning quality on long-tail
        # streams"); the tests' AUC checks need the fastest learner on 150-row passes.
        "model": {
            "hiddenUnits": [16, 8],
            "batchSize": 64,
            "denseSyncSteps": 2,
            "wide": False,
            "normalizeEmbeddings": True,
        },
        "sparse": {"embedxThreshold": 1, "baseThreshold": 0, "deltaThreshold": 0},
        "ps": {"replicas": 1, "logicalShards": 8},
        "workers": {"replicas": 2},
        "checkpoint": {"path": "ckpt", "everyPasses": 1},
        "export": {"path": "export"},
    }
    for section, values in overrides.items():
        if isinstance(values, dict):
            spec.setdefault(section, {}).update(values)
        else:
            spec[section] = values
    return {
        "apiVersion": "streamtrain.io/v1alpha1",
        "kind": "StreamingTrainingJob",
        "metadata": {"name": "e2e"},
        "spec": spec,
    }


@pytest.fixture
def job_file(tmp_path: Path) -> Callable[..., Path]:
    """``job_file(days, **overrides)``: write the stream and the manifest; the manifest path."""

    def make(days: int = 2, rows_per_folder: int = 150, **overrides: Any) -> Path:
        write_stream(
            tmp_path, days=days, rows_per_folder=rows_per_folder, num_users=300, num_items=200
        )
        path = tmp_path / "job.yaml"
        path.write_text(yaml.safe_dump(manifest(tmp_path, days, **overrides)))
        return path

    return make


def streamtrain(*args: str, cwd: Path, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    """Run the ``streamtrain`` CLI in a fresh interpreter, as a user would."""
    return subprocess.run(
        [sys.executable, "-m", "streamtrain_operator.cli", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def start_run(job: Path) -> subprocess.Popen[str]:
    """``streamtrain run job`` in the background (cwd: the job's folder), output merged on a
    pipe, for the tests that kill or interrupt it mid-run."""
    return subprocess.Popen(
        [sys.executable, "-m", "streamtrain_operator.cli", "run", str(job)],
        cwd=job.parent,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
