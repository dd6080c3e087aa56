"""Case 3: SIGKILL ``streamtrain run`` mid-pass, mid-shrink and mid-export, then run again.

The pause hook holds the run right *after* the step ran and before its outcome is recorded —
the widest window: the PS already trained / shrank / the model is already published, but the
state file still says the step is in flight. The rerun must reload the last checkpoint,
replay, and redo that step so that every pass is recorded once, the day is shrunk once and
every model is published once and complete. Execution is deterministic (one worker,
``workers.overlap: false``), so "once" is also checked on the model itself: the final
checkpoint is bit-identical to a run without the kill (a pass trained twice or a second
shrink — which decays every show and click — would change it).

The same kills, and one inside an export's publication, with two workers and
``workers.overlap: true`` (prefetch and pushes in background threads: not bitwise
reproducible) are checked on what is order-independent:
every key's show and click — the example count of the key, decayed once by the day's
shrink — equal a clean run's of the same job.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from streamtrain_operator.job.progress import Phase
from streamtrain_operator.run.export import read_donefile, verify_model

from .harness import (
    DETERMINISTIC,
    ONE_DAY_MODELS,
    START,
    Job,
    ModelState,
    Reference,
    Run,
    assert_same_model,
    checkpoint_of,
    read_checkpoint,
    reap,
)

PASSES = [(START, p) for p in (1, 2, 3, 4)]
#: Two workers, overlap on (the default), a checkpoint every other pass.
PARALLEL: dict[str, Any] = {
    "workers": {"replicas": 2, "overlap": True},
    "checkpoint": {"path": "ckpt", "everyPasses": 2},
}
KILLS = [
    ("after:train@3", f"after train {START}/3"),
    ("after:shrink", f"after shrink {START}/4"),
    ("after:base", f"after base {START}/4"),
]
#: With two workers, also the kill inside an export's publication (its sparse parts
#: written, the rest not: ``test_export_kill`` checks that model itself with one worker).
PARALLEL_KILLS = [*KILLS, ("parts:delta@2", f"parts delta {START}/2")]


@pytest.fixture(scope="module")
def parallel_reference(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ModelState]:
    """The final checkpoint of the :data:`PARALLEL` job run without a fault."""
    runs: list[Run] = []
    try:
        job = Job(tmp_path_factory.mktemp("parallel-clean"), runs).write(days=1, **PARALLEL)
        code, output = job.run()
        assert code == 0, output
        yield read_checkpoint(checkpoint_of(job.root, START, 4))
    finally:
        reap(runs)


@pytest.mark.faults
@pytest.mark.timeout(150)
@pytest.mark.parametrize(("pause", "held_at"), KILLS)
def test_killed_scheduler_resumes_the_same_step_exactly_once(
    job: Job, reference: Reference, pause: str, held_at: str
) -> None:
    job.write(days=1, **DETERMINISTIC)
    first = job.start(pause=pause)
    assert job.wait_paused(first) == held_at
    before = job.state()
    assert before is not None and before.current is not None
    step = pause.split(":")[1].split("@", maxsplit=1)[0]
    assert before.current.kind.value == step  # "started" is durable, "done" is not
    # Its PS and worker die with it (PR_SET_PDEATHSIG): nothing of the first run is left.
    first.kill_and_wait_children()

    code, output = job.run()
    assert code == 0, first.output + output
    after = job.state()
    assert after is not None and after.phase == Phase.SUCCEEDED
    assert after.generation == 2 and before.checkpoint is not None
    assert f"resuming from checkpoint {before.checkpoint.uri}" in output
    # Every pass recorded once; the day shrunk once (on the reloaded state).
    assert [(r.day, r.pass_index) for r in after.history] == PASSES
    assert all(r.metrics["examples"] == 120 for r in after.history)
    assert after.shrunk_days == (START,)
    # Each model published exactly once, complete (manifest and checksums verify).
    lines = read_donefile(str(job.root / "export"))
    assert [d.key for d in lines] == ONE_DAY_MODELS
    for line in lines:
        assert verify_model(str(job.root / "export"), line.key).kind == line.kind
    # The model saw every pass and the shrink once: bit-identical to the clean run.
    assert_same_model(read_checkpoint(checkpoint_of(job.root, START, 4)), reference.model)


@pytest.mark.faults
@pytest.mark.timeout(150)
@pytest.mark.parametrize(("pause", "held_at"), PARALLEL_KILLS)
def test_two_overlapping_workers_killed_and_resumed_count_every_key_once(
    job: Job, parallel_reference: ModelState, pause: str, held_at: str
) -> None:
    job.write(days=1, **PARALLEL)
    first = job.start(pause=pause)
    assert job.wait_paused(first) == held_at
    first.kill_and_wait_children()
    code, output = job.run()
    assert code == 0, first.output + output
    after = job.state()
    assert after is not None and after.phase == Phase.SUCCEEDED and after.generation == 2
    assert [(r.day, r.pass_index) for r in after.history] == PASSES
    assert all(r.metrics["examples"] == 120 for r in after.history)
    assert [d.key for d in read_donefile(str(job.root / "export"))] == ONE_DAY_MODELS
    got = read_checkpoint(checkpoint_of(job.root, START, 4))
    want = parallel_reference
    assert got.keys.tobytes() == want.keys.tobytes()
    assert got.column("show").tobytes() == want.column("show").tobytes()
    assert got.column("click").tobytes() == want.column("click").tobytes()
