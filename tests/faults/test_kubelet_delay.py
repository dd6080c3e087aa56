"""A worker pod killed mid-pass on the operator, restarted by a kubelet with back-off.

A real kubelet restarts a crashed container after a back-off (10 s, doubling), so when the
driver's ``RunPass`` fails, the pod's ``restartCount`` has not changed yet, and the
supervisor's watch notices the restart later. The share failed after it had pushed part of
its gradients; whether the restart is noticed in time must not matter: the scheduler
restores for the failed share (``ShareFailed``), the reload waits for the restarting worker,
and every key's show and click equal a clean run's.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from streams import write_stream
from streamtrain_operator.job.plan import StepKind
from streamtrain_operator.job.progress import Phase, Progress

from .gate import owners
from .harness import START, wait_for
from .on_kube import ROWS, SPLIT_MINUTES, KubeJob, read_counts, same_counts, succeeded

#: Pass 2 (folder 1200) is made 60x bigger so that the kill lands inside it.
REPEAT = 60
#: The test kubelet's back-off: longer than the supervisor's restart polls (0.5 s).
RESTART_DELAY = 3.0


def _write(root: Path) -> None:
    write_stream(root, rows_per_folder=ROWS, split_interval_minutes=SPLIT_MINUTES, seed=5)
    for part in (root / "data" / START / "1200").glob("part-*"):
        part.write_text(part.read_text() * REPEAT)


def _training_pass_2(status: dict[str, Any]) -> bool:
    if not status.get("scheduler"):
        return False
    p = Progress.from_dict(status["scheduler"])
    current = p.current
    return (
        current is not None
        and (current.kind, current.pass_index) == (StepKind.TRAIN, 2)
        and p.phase == Phase.TRAINING
    )


@pytest.mark.faults
@pytest.mark.timeout(720)
def test_a_worker_restarted_with_back_off_mid_pass_counts_every_example_once(
    tmp_path: Path,
) -> None:
    _write(tmp_path / "clean")
    with KubeJob(tmp_path / "clean") as clean:
        op = clean.start_operator()
        clean.create()
        status = clean.wait(op, succeeded, "the clean job to succeed", timeout=300)
        checkpoint = Progress.from_dict(status["scheduler"]).checkpoint
        assert checkpoint is not None
        want = read_counts(checkpoint.uri)
        op.stop()

    _write(tmp_path / "faulted")
    with KubeJob(tmp_path / "faulted", restart_delay=RESTART_DELAY) as kube:
        gate = kube.gate_ps()
        op = kube.start_operator()
        kube.create()
        kube.wait(op, _training_pass_2, "pass 2 to train", timeout=200)
        # Let the pass push for a moment, then hold the workers' PS traffic until worker 1
        # is provably inside its share (a request of it held), and kill it there.
        time.sleep(0.3)
        gate.hold()
        victim = {n: p for n, p in kube.kubelet.running().items() if n == "online-worker-1"}
        wait_for(lambda: owners(gate.held(), victim) == set(victim), 30, "worker 1 in pass 2")
        kube.kubelet.kill("online-worker-1")
        gate.release()
        wait_for(
            lambda: kube.kubelet.restarts("online-worker-1") == 1,
            RESTART_DELAY + 30,
            "the delayed restart",
        )
        status = kube.wait(op, succeeded, "the job to succeed", timeout=300)
        progress = Progress.from_dict(status["scheduler"])
        assert [(r.day, r.pass_index) for r in progress.history] == [(START, 1), (START, 2)]
        assert progress.history[1].metrics["examples"] == ROWS * REPEAT
        restored = progress.condition("Restored")
        assert restored is not None and restored.reason == "ShareFailed", progress.conditions
        assert f"worker 1 failed pass {START}/2 after it may have pushed" in restored.message
        assert progress.checkpoint is not None
        same_counts(read_counts(progress.checkpoint.uri), want)
        op.stop()
