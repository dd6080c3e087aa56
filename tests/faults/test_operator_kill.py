"""Issue 6 on Kubernetes: the real operator (``kopf run``, a subprocess) against KMock, the
rendered pods run as local processes by ``kubelet.py``; the operator SIGKILLed mid-pass
(after the pass trained, and while the workers still train), mid-export and mid-shrink, and
started again.

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
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from streams import write_stream
from streamtrain_operator.job.progress import Phase, Progress
from streamtrain_operator.run.export import read_donefile, verify_model
from streamtrain_worker.publishing.predict import load_model

from .harness import START, data_totals, wait_for
from .on_kube import ROWS, SPLIT_MINUTES, Counts, KubeJob, read_counts, same_counts, succeeded

PASSES = [(START, 1), (START, 2)]
MODELS = [f"{START}/delta-1", f"{START}/delta-2", "20261102/base", f"{START}/batch"]


#: What a driver logs before its workers' Reset ahead of every reload, which cancels a pass
#: of an earlier generation still running (here: held in the gate, so the Reset waits for it).
def taking_over(generation: int) -> str:
    return f"generation {generation} reloads the checkpoint: resetting the workers first"


@dataclass(frozen=True)
class CleanRun:
    """The job run without a fault: its final status, checkpoint and events."""

    status: dict[str, Any]
    model: Counts
    events: set[str]
    exit_code: int | None
    output: str


@pytest.fixture(scope="module")
def clean(tmp_path_factory: pytest.TempPathFactory) -> CleanRun:
    """Run the job once without a fault (its outcome is checked by the first test and is
    the reference of the others)."""
    root = tmp_path_factory.mktemp("clean")
    write_stream(root, rows_per_folder=ROWS, split_interval_minutes=SPLIT_MINUTES, seed=5)
    with KubeJob(root) as job:
        op = job.start_operator()
        job.create()
        status = job.wait(op, succeeded, "the job to succeed", timeout=80)
        model = check_outcome(job, status)
        events = {reason for reason, _ in job.events()}
        op.stop()
        return CleanRun(status, model, events, op.process.returncode, op.output)


@pytest.fixture
def kube(tmp_path: Path) -> Iterator[KubeJob]:
    """A job on the operator against KMock; operators, pods and the API are stopped at
    teardown, also when the test fails."""
    write_stream(tmp_path, rows_per_folder=ROWS, split_interval_minutes=SPLIT_MINUTES, seed=5)
    with KubeJob(tmp_path) as job:
        yield job


def check_outcome(kube: KubeJob, status: dict[str, Any]) -> Counts:
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
        assert verify_model(export, line.key).kind == line.kind
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
    return read_counts(progress.checkpoint.uri)


@pytest.mark.faults
@pytest.mark.timeout(110)
def test_a_job_runs_to_end_day_on_the_operator(clean: CleanRun) -> None:
    """Phase Succeeded, both passes in the status, every model published once and
    complete, checkpoints written (``check_outcome``), lifecycle events posted."""
    assert clean.status["generation"] == 1
    assert len(clean.model.keys) > 0 and np.all(clean.model.show > 0)
    assert {"PassStarted", "PassCompleted", "Exported", "Shrunk", "Succeeded"} <= clean.events
    assert clean.exit_code == 0, clean.output[-4000:]


@pytest.mark.faults
@pytest.mark.timeout(300)  # four operator kills, each a kopf start: 150 s was tight when loaded
def test_a_killed_operator_resumes_each_step_exactly_once(kube: KubeJob, clean: CleanRun) -> None:
    """SIGKILL the operator four times and start a new one each time; the worker pods
    keep running throughout:

    1. after pass 1 trained, before that was recorded;
    2. while both workers are inside pass 2 — their PS traffic held by a gate, so their
       ``RunPass`` outlives the operator. The next operator must not reload the checkpoint
       under the running pass (its remaining pushes would count part of pass 2 twice once
       the pass is redone) but wait until the workers are idle. While it waits, the PS
       pod's process is SIGKILLed: the kubelet restarts it empty, the supervisor notices,
       cancels the driver and starts another, which reloads every shard;
    3. after the delta of pass 2 was published (donefile line written), before recorded;
    4. after the day's shrink, before recorded.
    """
    gate = kube.gate_ps()
    kube.create()
    export = str(kube.root / "export")

    # 1. Mid-pass, the widest window: pass 1 trained on the PS, "done" not recorded.
    op = kube.start_operator(pause="after:train@1")
    assert kube.wait_paused(op) == f"after train {START}/1"
    pods = kube.kubelet.running()
    before = kube.progress()
    assert before is not None and before.current is not None
    assert (before.current.kind.value, before.current.pass_index) == ("train", 1)
    assert before.history == ()
    kube.kill_paused(op)

    # 2. Mid-pass, the workers still training: the second operator redid pass 1 and is
    #    held before pass 2; the gate closes, pass 2 starts, the operator dies.
    op = kube.start_operator(pause="before:train@2")
    assert kube.wait_paused(op) == f"before train {START}/2"
    gate.hold()
    kube.pause_file.unlink()  # let the driver send RunPass to both workers
    kube.wait_inside_pass(gate)
    op.kill()

    # 3. The third operator cancels the old pass and waits for it to stop (phase
    #    Restoring): held in the gate, it cannot reach its next batch ...
    op = kube.start_operator(pause="after:delta@2")
    op.wait_output(taking_over(3))
    status = kube.status()
    assert (status["phase"], status["generation"]) == (Phase.RESTORING, 3)
    #    ... the PS pod dies meanwhile: a new driver (generation 4) resets the workers too.
    kube.kubelet.kill("online-ps-0")
    op.wait_output(taking_over(4))
    status = kube.status()
    assert (status["phase"], status["generation"]) == (Phase.RESTORING, 4)
    assert kube.kubelet.restarts("online-ps-0") == 1
    #    The gate opens: the old pass stops at its next batch (its queued pushes land on the
    #    restarted PS), then every shard reloads the pass-1 checkpoint, pass 2 is redone and
    #    its delta published; the operator dies before recording the delta.
    gate.release()
    assert kube.wait_paused(op) == f"after delta {START}/2"
    during = kube.progress()
    assert during is not None
    assert [(r.pass_index, r.generation) for r in during.history] == [(1, 2), (2, 4)]
    #    The end of a publication (dense part, MODEL.json, donefile line) runs beside the
    #    next steps, so the hold after the delta step can come before its line is written:
    #    wait for the line, so the kill lands after it and before the record.
    wait_for(lambda: [d.key for d in read_donefile(export)] == MODELS[:2], 60, "the delta's line")
    kube.kill_paused(op)

    # 4. Mid-shrink: the day shrunk on the PS, "done" not recorded.
    op = kube.start_operator(pause="after:shrink")
    assert kube.wait_paused(op) == f"after shrink {START}/2"
    during = kube.progress()
    assert during is not None and during.current is not None
    assert during.current.kind.value == "shrink" and during.shrunk_days == ()
    kube.kill_paused(op)

    # A last operator finishes the job.
    op = kube.start_operator()
    status = kube.wait(op, succeeded, "the job to succeed after four kills", timeout=60)
    # The same worker pods served all five operators; the PS container restarted once.
    assert set(pods) == {"online-ps-0", "online-worker-0", "online-worker-1"}
    assert [kube.kubelet.restarts(p) for p in sorted(pods)] == [1, 0, 0]
    assert "Recovering" in {reason for reason, _ in kube.events()}
    model = check_outcome(kube, status)
    progress = Progress.from_dict(status["scheduler"])
    assert progress.generation == 6 and progress.replayed_steps > 0
    # Pass 1 recorded by the second operator, pass 2 by the third's second driver (replays
    # are not recorded).
    assert [(r.pass_index, r.generation) for r in progress.history] == [(1, 2), (2, 4)]
    # ... and in the model each example counted once and the day decayed once.
    same_counts(model, clean.model)
    op.stop()
