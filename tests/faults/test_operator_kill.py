"""Issue 6 on Kubernetes: the real operator (``kopf run``, a subprocess) against KMock, the
rendered pods run as local processes by ``kubelet.py``; the operator SIGKILLed mid-pass,
mid-export and mid-shrink and started again.

Unlike ``streamtrain run`` (``test_scheduler_kill.py``), killing the operator leaves the PS
and worker pods running with whatever state the interrupted step left in them. The new
operator must take its progress from the custom resource's status alone, reload the last
checkpoint into the surviving PS, replay, and redo the interrupted step — so that every
pass is trained and recorded once, the day is shrunk once, and every model is published
once and complete.

"Once in the model" is checked on the sparse table's ``show`` and ``click`` columns of the
final checkpoint: they count the example occurrences of every key (decayed once by the
day's shrink), which does not depend on the order in which two workers' pushes arrive, so
they equal a clean run's exactly — a pass trained twice, or a second shrink, would not.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from streamtrain_operator.export import read_donefile, verify_model
from streamtrain_operator.progress import Phase, Progress
from streamtrain_worker.predict import load_model

from .harness import START, ModelState, data_totals, read_checkpoint, wait_for
from .on_kube import KubeJob, write_stream

ROWS = 150
PASSES = [(START, 1), (START, 2)]
MODELS = [f"{START}/delta-1", f"{START}/delta-2", "20261102/base", f"{START}/batch"]


def succeeded(status: dict[str, Any]) -> bool:
    return status.get("phase") == Phase.SUCCEEDED


@pytest.fixture
def kube(tmp_path: Path) -> Iterator[KubeJob]:
    """A job on the operator against KMock; operators, pods and the API are stopped at
    teardown, also when the test fails."""
    write_stream(tmp_path, ROWS)
    with KubeJob(tmp_path) as job:
        yield job


def check_outcome(kube: KubeJob, status: dict[str, Any]) -> ModelState:
    """Everything a finished job must show; returns its final checkpoint."""
    progress = Progress.from_dict(status["scheduler"])
    assert progress.phase == Phase.SUCCEEDED, status
    # Every pass recorded once, each with every example of its folder.
    assert [(r.day, r.pass_index) for r in progress.history] == PASSES
    for record in progress.history:
        folder = kube.root / "data" / START / f"{(record.pass_index - 1) * 12:02d}00"
        assert record.metrics["examples"] == data_totals(folder)[0] == ROWS
    assert progress.shrunk_days == (START,)
    # Each model published exactly once (one donefile line each, in order) and complete.
    export = str(kube.root / "export")
    lines = read_donefile(export)
    assert [d.key for d in lines] == MODELS
    for line in lines:
        assert verify_model(export, line.key)["kind"] == line.kind
    model = load_model(export)  # base + deltas, every checksum verified on the way
    assert model is not None
    # The day-end checkpoint is the last one, published and readable.
    assert progress.checkpoint is not None
    assert progress.checkpoint.uri.startswith(str(kube.root / "ckpt" / START))
    # Succeeded: the pods' StatefulSets are deleted (right after the phase), so are the pods.
    wait_for(
        lambda: kube.statefulsets() == [] and kube.kubelet.running() == {},
        30,
        "the StatefulSets and their pods to be removed",
    )
    return read_checkpoint(progress.checkpoint.uri)


@pytest.mark.faults
@pytest.mark.timeout(100)
def test_a_job_runs_to_end_day_on_the_operator(kube: KubeJob) -> None:
    op = kube.start_operator()
    kube.create()
    status = kube.wait(op, succeeded, "the job to succeed", timeout=80)
    state = check_outcome(kube, status)
    assert status["generation"] == 1
    assert len(state.keys) > 0 and np.all(state.column("show") > 0)
    reasons = {reason for reason, _ in kube.events()}
    assert {"PassStarted", "PassCompleted", "Exported", "Shrunk", "Succeeded"} <= reasons
    op.stop()
    assert op.process.returncode == 0, op.output[-4000:]
