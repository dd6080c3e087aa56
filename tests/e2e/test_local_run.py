"""``streamtrain run`` end to end: real PS and worker processes on a small synthetic stream."""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from streamtrain_operator.job.plan import PassPlan
from streamtrain_operator.job.progress import Phase, Progress
from streamtrain_operator.job.spec import load_job
from streamtrain_operator.run.export import read_donefile, verify_model

from .conftest import start_run, streamtrain

STATE = Path("ckpt/_state/e2e.json")


def load_state(root: Path) -> Progress:
    return Progress.from_dict(json.loads((root / STATE).read_text()))


def test_two_days_auc_rises_exports_are_complete_and_shrink_runs_once_a_day(
    job_file: Callable[..., Path],
) -> None:
    job = job_file(days=2)
    root = job.parent
    run = streamtrain("run", str(job), cwd=root)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "Succeeded" in run.stdout
    assert "day 20261102 pass  4/4" in run.stdout

    progress = load_state(root)
    assert progress.phase == Phase.SUCCEEDED
    passes = [(r.day, r.pass_index) for r in progress.history]
    assert passes == [(d, p) for d in ("20261101", "20261102") for p in (1, 2, 3, 4)]
    aucs = [r.metrics["auc"] for r in progress.history]
    # Day means (600 examples each): one 150-example pass's AUC is too noisy to compare.
    first_day, last_day = sum(aucs[:4]) / 4, sum(aucs[-4:]) / 4
    assert last_day > max(first_day + 0.05, 0.6), aucs
    assert all(r.metrics["examples"] == 150 for r in progress.history)
    # Every pass but the first was read while the one before trained (all data is there
    # from the start), across the day end too; the first had nothing before it.
    read_ahead = [r.metrics["filesReadAhead"] for r in progress.history]
    assert read_ahead[0] == 0 and all(
        n == r.metrics["files"] > 0
        for n, r in zip(read_ahead[1:], progress.history[1:], strict=True)
    )
    assert progress.shrunk_days == ("20261101", "20261102")

    lines = read_donefile(str(root / "export"))
    keys = [d.key for d in lines]
    assert len(keys) == len(set(keys)) == 8 + 2 + 2
    assert [k for k in keys if k.endswith("base")] == ["20261102/base", "20261103/base"]
    for line in lines:
        manifest = verify_model(str(root / "export"), line.key)
        assert manifest.kind == line.kind
        assert any(f.path == "dense/dense.pt" for f in manifest.files)
    deltas_day2 = [d for d in lines if d.kind == "delta" and d.day == "20261102"]
    assert {d.base for d in deltas_day2} == {"20261102/base"}

    # A delta loads as its base plus the day's deltas up to it, and scores.
    parts = [str(p) for p in sorted((root / "data" / "20261102" / "1800").glob("part-*"))]
    predicted = streamtrain(
        "predict", "--export", "export", "--model", "20261102/delta-4", "--json", *parts, cwd=root
    )
    assert predicted.returncode == 0, predicted.stderr
    result = json.loads(predicted.stdout.strip().splitlines()[-1])
    assert result["chain"] == ["20261102/base"] + [f"20261102/delta-{p}" for p in (1, 2, 3, 4)]
    assert result["examples"] == 150 and 0.5 < result["auc"] <= 1.0

    status = streamtrain("status", str(job), cwd=root)
    assert status.returncode == 0
    assert "Succeeded" in status.stdout and "shrunk days: 2" in status.stdout


def _children(pid: int) -> list[int]:
    path = Path(f"/proc/{pid}/task/{pid}/children")
    return [int(c) for c in path.read_text().split()] if path.exists() else []


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def _wait_for(predicate: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)  # polling interval, not synchronisation


@pytest.mark.timeout(300)
def test_sigkilled_run_resumes_without_repeating_a_pass(job_file: Callable[..., Path]) -> None:
    job = job_file(days=2)
    root = job.parent
    proc = start_run(job)
    try:

        def third_pass_done() -> bool:
            if proc.poll() is not None:
                assert proc.stdout is not None
                raise AssertionError(f"run exited early ({proc.returncode}):\n{proc.stdout.read()}")
            return (root / STATE).exists() and len(load_state(root).history) >= 3

        _wait_for(third_pass_done, 180, "three passes")
        children = _children(proc.pid)
        assert len(children) == 3  # 1 PS + 2 workers
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        assert proc.stdout is not None
        first_output = proc.stdout.read()
        proc.stdout.close()
    # Its PS and workers die with it (PR_SET_PDEATHSIG): nothing is left running.
    _wait_for(lambda: not any(_alive(c) for c in children), 30, "orphaned children to exit")
    before = load_state(root)
    done_before = len(before.history)

    rerun = streamtrain("run", str(job), cwd=root)
    assert rerun.returncode == 0, first_output + rerun.stdout + rerun.stderr
    after = load_state(root)
    passes = [(r.day, r.pass_index) for r in after.history]
    assert passes == [(d, p) for d in ("20261101", "20261102") for p in (1, 2, 3, 4)]
    assert after.generation == 2
    # The PS restarts from the last checkpoint; only the steps completed after it are
    # replayed (model state only: no metrics, no second publication), then the run goes on.
    plan = PassPlan.from_spec(load_job(job).spec)
    assert before.checkpoint is not None
    expected = plan.steps_between(before.checkpoint.key, before.completed)
    assert after.replayed_steps == len(expected) <= 2
    assert f"resuming from checkpoint {before.checkpoint.uri}" in rerun.stdout
    trained_again = [line for line in rerun.stdout.splitlines() if line.startswith("day ")]
    assert len(trained_again) == 8 - done_before
    keys = [d.key for d in read_donefile(str(root / "export"))]
    assert len(keys) == len(set(keys)) == 12
    assert after.shrunk_days == ("20261101", "20261102")


@pytest.mark.timeout(300)
def test_killed_worker_and_ps_are_restarted_and_the_job_completes_exactly_once(
    job_file: Callable[..., Path],
) -> None:
    job = job_file(days=2, checkpoint={"path": "ckpt", "everyPasses": 2})
    root = job.parent
    proc = start_run(job)
    try:

        def passes_done(n: int) -> Callable[[], bool]:
            def check() -> bool:
                if proc.poll() is not None:
                    return True  # reported below with the output
                return (root / STATE).exists() and len(load_state(root).history) >= n

            return check

        _wait_for(passes_done(2), 180, "two passes")
        worker, ps = (
            _role_pids(proc.pid, "streamtrain_worker"),
            _role_pids(proc.pid, "streamtrain_ps"),
        )
        os.kill(worker[1], signal.SIGKILL)
        _wait_for(passes_done(5), 180, "five passes")
        os.kill(_role_pids(proc.pid, "streamtrain_ps")[0], signal.SIGKILL)
        output, _ = proc.communicate(timeout=240)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, output
    assert ps, output
    assert "worker-1 exited with code -9; restarted on" in output
    assert "ps-0 exited with code -9; restarted on" in output
    assert "resuming from checkpoint" in output
    progress = load_state(root)
    assert progress.phase == Phase.SUCCEEDED
    # Every pass is recorded once; the PS loss cost a reload and a replay, not a repetition.
    passes = [(r.day, r.pass_index) for r in progress.history]
    assert passes == [(d, p) for d in ("20261101", "20261102") for p in (1, 2, 3, 4)]
    assert progress.generation >= 2
    restored = progress.condition("Restored")
    assert restored is not None and "ps-0 exited" in restored.message
    keys = [d.key for d in read_donefile(str(root / "export"))]
    assert len(keys) == len(set(keys)) == 12
    assert progress.shrunk_days == ("20261101", "20261102")


def _role_pids(parent: int, module: str) -> list[int]:
    """Children of ``parent`` running ``python -m module``, in start order."""
    pids = []
    for child in _children(parent):
        try:
            cmdline = Path(f"/proc/{child}/cmdline").read_bytes().split(b"\0")
        except FileNotFoundError:
            continue
        if module.encode() in cmdline:
            pids.append(child)
    return pids
