"""SIGKILL ``streamtrain run`` while a checkpoint is written beside the next pass
(``checkpoint.besideTraining``, docs/scheduler.md §3).

The checkpoint of pass 2 is taken at the pass boundary (a PS snapshot) and its step
completed, but it becomes the restore point only once its files are published and the
driver has collected the write — after pass 3's RunPass. The pause hook ``before:train@3``
holds the run in that window (the write may be on disk already; the record does not name
it) and the run is killed there. What must hold: the record still names the genesis as the
restore point, and the rerun reloads it, replays passes 1-2 (not the checkpoint step),
trains passes 3-4 once: every pass recorded once, the final checkpoint bit-identical to a
run without the kill and without the overlap.
"""

from __future__ import annotations

from streamtrain_operator.job.plan import StepKey, StepKind
from streamtrain_operator.job.progress import Phase

from .harness import (
    DETERMINISTIC,
    START,
    Job,
    Reference,
    assert_same_model,
    checkpoint_of,
    read_checkpoint,
)


def test_a_kill_while_a_checkpoint_is_written_beside_a_pass_reloads_the_one_before(
    job: Job, reference: Reference
) -> None:
    checkpoints = {"path": "ckpt", "everyPasses": 2, "besideTraining": True}
    job.write(days=1, **{**DETERMINISTIC, "checkpoint": checkpoints})
    first = job.start(pause="before:train@3")
    assert job.wait_paused(first) == f"before train {START}/3"
    held = job.state()
    assert held is not None
    # Taken and completed, not (yet) the restore point.
    assert held.completed == StepKey(START, 2, StepKind.CHECKPOINT)
    assert held.checkpoint is not None and held.checkpoint.key.pass_index == 0
    first.kill_and_wait_children()

    code, output = job.run()
    assert code == 0, first.output + output
    after = job.state()
    assert after is not None and after.phase == Phase.SUCCEEDED
    assert [(r.day, r.pass_index) for r in after.history] == [(START, p) for p in (1, 2, 3, 4)]
    assert after.replayed_steps == 4  # passes 1-2 and their deltas, not the checkpoint
    assert after.checkpoint is not None and after.checkpoint.key.pass_index == 4
    # Every pass applied once: the final checkpoint equals the clean run's (which wrote
    # its checkpoints in the workers' path).
    assert_same_model(read_checkpoint(checkpoint_of(job.root, START, 4)), reference.model)
