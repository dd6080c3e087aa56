"""Case 2: SIGKILL a worker in the middle of its share of a pass.

Its share is redone and the pass's metrics count every example once (example count and label
sum equal the data's). The model state also sees every example once: a worker lost mid-pass
makes the driver reload the last checkpoint and replay, as for a PS loss, so the gradients
the dead worker pushed before it died are discarded — the show counts of the checkpoint after
the pass equal an uninterrupted run's.
"""

from __future__ import annotations

import os
import signal

import numpy as np
import pytest

from streamtrain_operator.job.progress import Phase

from .harness import START, Job, checkpoint_of, data_totals, read_checkpoint

#: Pass 2 is made ~25x bigger than the others so that the kill lands inside it.
BIG = f"data/{START}/0600"
REPEAT = 25


def _write(job: Job) -> None:
    job.write(
        days=1,
        workers={"replicas": 2, "passRetries": 2},
        checkpoint={"path": "ckpt", "everyPasses": 1, "keep": 10},
    )
    job.enlarge(BIG, REPEAT)


@pytest.mark.faults
@pytest.mark.timeout(150)
def test_worker_killed_mid_pass_counts_every_example_once(
    job: Job, tmp_path_factory: pytest.TempPathFactory
) -> None:
    _write(job)
    run = job.start()
    job.wait_training(run, 2)
    victim = run.role_pids("streamtrain_worker")[1]
    os.kill(victim, signal.SIGKILL)
    assert run.wait() == 0, run.output
    output = run.output
    assert "worker-1 exited with code -9; restarted on" in output
    # The lost worker had pushed part of its share: reload the checkpoint of pass 1, redo 2.
    assert f"resuming from checkpoint {job.root}/ckpt/{START}/pass-1-g1" in output

    state = job.state()
    assert state is not None and state.phase == Phase.SUCCEEDED
    assert [r.pass_index for r in state.history] == [1, 2, 3, 4]
    record = state.history[1]
    examples, positives = data_totals(job.root / BIG)
    assert examples == 120 * REPEAT
    restored = state.condition("Restored")
    assert restored is not None and restored.reason == "ShareFailed"
    assert f"worker 1 failed pass {START}/2 after it may have pushed" in restored.message
    assert state.generation == 2 and record.generation == 2
    assert record.metrics["examples"] == examples
    assert round(record.metrics["actual_ctr"] * examples) == positives

    # Model state: the same show counts as a run without the fault.
    clean = Job(tmp_path_factory.mktemp("clean"), job._runs)
    _write(clean)
    code, clean_output = clean.run()
    assert code == 0, clean_output
    got = read_checkpoint(checkpoint_of(job.root, START, 3))
    want = read_checkpoint(checkpoint_of(clean.root, START, 3))
    assert np.array_equal(got.keys, want.keys)
    assert np.array_equal(got.column("show"), want.column("show"))
    assert np.array_equal(got.column("click"), want.column("click"))
