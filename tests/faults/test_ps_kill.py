"""Case 1: SIGKILL the PS shard in the middle of a pass.

The pass is abandoned, every shard reloads the last checkpoint, the steps after it replay and
the pass is redone. With deterministic execution (one worker, ``workers.overlap: false``,
one torch thread, fixed seed) the final model — every sparse row with its optimizer state,
and every dense vector — is bit-identical to a run without the fault. With two workers and
``workers.overlap: true`` (not bitwise reproducible) every key's show and click — its
example count, decayed once by the day's shrink — equal a clean run's.
"""

from __future__ import annotations

import os
import signal
from typing import Any

import numpy as np
import pytest

from streamtrain_operator.job.progress import Phase

from .harness import START, Job, checkpoint_of, read_checkpoint

#: Pass 4 is made ~25x bigger than the others so that the kill lands inside it.
BIG = f"data/{START}/1800"
REPEAT = 25


#: Learning options whose state must live in the PS too: the scale-free rule's per-dimension
#: accumulators and the worker's row-shared gradient scale (a function of the batch alone).
OPTIONS: dict[str, Any] = {
    "sparse": {"optimizer": {"type": "scale_free_adagrad"}},
    "model": {"rowSharedSteps": "all"},
}


def _write(
    job: Job, workers: dict[str, Any] | None = None, options: dict[str, Any] | None = None
) -> None:
    job.write(
        days=1,
        workers=workers or {"replicas": 1, "numThreads": 1, "overlap": False},
        checkpoint={"path": "ckpt", "everyPasses": 2, "keep": 10},
        **(options or {}),
    )
    job.enlarge(BIG, REPEAT)


@pytest.mark.faults
@pytest.mark.timeout(150)
@pytest.mark.parametrize("options", [None, OPTIONS], ids=["defaults", "scale-free-row-shared"])
def test_ps_killed_mid_pass_reloads_replays_and_ends_bit_identical(
    job: Job, tmp_path_factory: pytest.TempPathFactory, options: dict[str, Any] | None
) -> None:
    _write(job, options=options)
    run = job.start()
    job.wait_training(run, 4)
    (ps,) = run.role_pids("streamtrain_ps")
    os.kill(ps, signal.SIGKILL)
    assert run.wait() == 0, run.output
    output = run.output
    assert "ps-0 exited with code -9; restarted on" in output
    # Every shard reloads the checkpoint of pass 2; pass 3 (train, delta) replays, 4 is redone.
    assert f"resuming from checkpoint {job.root}/ckpt/{START}/pass-2-g1" in output
    state = job.state()
    assert state is not None and state.phase == Phase.SUCCEEDED
    assert [r.pass_index for r in state.history] == [1, 2, 3, 4]
    assert state.replayed_steps == 2 and state.generation == 2
    assert state.history[3].generation == 2 and state.shrunk_days == (START,)
    restored = state.condition("Restored")
    assert restored is not None and restored.reason == "PSRestarted"

    clean = Job(tmp_path_factory.mktemp("clean"), job._runs)
    _write(clean, options=options)
    code, clean_output = clean.run()
    assert code == 0, clean_output
    got = read_checkpoint(checkpoint_of(job.root, START, 4))
    want = read_checkpoint(checkpoint_of(clean.root, START, 4))
    assert got.columns == want.columns
    assert np.array_equal(got.keys, want.keys)
    assert got.rows.tobytes() == want.rows.tobytes()  # bit-identical, NaN-safe
    assert got.dense.keys() == want.dense.keys()
    # values, m, v, step of each of six vectors (the parameters, the data-norm sums, the
    # calibration window, its evidence and persistence, the context rate's counts), plus
    # the five summary vectors' float64 sums
    assert len(want.dense) == 29
    for name, values in want.dense.items():
        assert got.dense[name].tobytes() == values.tobytes(), name
    # The pass metrics of the redone pass are the clean run's too.
    clean_state = clean.state()
    assert clean_state is not None
    assert state.history[3].metrics["loss"] == clean_state.history[3].metrics["loss"]


@pytest.mark.faults
@pytest.mark.timeout(200)
def test_ps_killed_mid_pass_with_two_overlapping_workers_counts_every_key_once(
    job: Job, tmp_path_factory: pytest.TempPathFactory
) -> None:
    parallel = {"replicas": 2, "overlap": True}
    _write(job, parallel)
    run = job.start()
    job.wait_training(run, 4)
    (ps,) = run.role_pids("streamtrain_ps")
    os.kill(ps, signal.SIGKILL)
    assert run.wait() == 0, run.output
    state = job.state()
    assert state is not None and state.phase == Phase.SUCCEEDED
    assert [r.pass_index for r in state.history] == [1, 2, 3, 4]
    assert state.history[3].metrics["examples"] == 120 * REPEAT
    restored = state.condition("Restored")
    assert restored is not None and restored.reason == "PSRestarted"

    clean = Job(tmp_path_factory.mktemp("clean"), job._runs)
    _write(clean, parallel)
    code, clean_output = clean.run()
    assert code == 0, clean_output
    got = read_checkpoint(checkpoint_of(job.root, START, 4))
    want = read_checkpoint(checkpoint_of(clean.root, START, 4))
    assert np.array_equal(got.keys, want.keys)
    assert got.column("show").tobytes() == want.column("show").tobytes()
    assert got.column("click").tobytes() == want.column("click").tobytes()
