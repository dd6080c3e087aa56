"""The genesis checkpoint in the pass scheduler state machine (scripted events, no I/O).

Every job opens with ``ResetWorkers`` and the checkpoint of the untrained model, so a
restore during the first passes reloads a known state instead of replaying on whatever
state survived. The driver-level proof with a real two-shard PS is in ``test_driver.py``.
"""

from __future__ import annotations

from fakes import PLAN, World, crash_at, fresh, restart, steps

from streamtrain_operator.job.messages import CheckData, Done, ResetWorkers, RunPass, Save
from streamtrain_operator.job.plan import StepKey, StepKind
from streamtrain_operator.job.progress import Phase, Progress


def test_a_fresh_job_opens_with_the_workers_reset_and_the_genesis_checkpoint() -> None:
    """The dense vectors reach the PS (reset builds every trainer), then pass 0 is saved."""
    machine = fresh()
    reset = machine.next_action(0.0)
    assert isinstance(reset, ResetWorkers)
    assert machine.progress.phase == Phase.PENDING and machine.progress.checkpoint is None
    machine.handle(Done(), 1.0)
    genesis = machine.next_action(1.0)
    assert isinstance(genesis, Save) and not genesis.replay
    assert genesis.key == StepKey("20261101", 0, StepKind.CHECKPOINT)
    assert genesis.uri == "/ckpt/20261101/pass-0-g1"
    # Recorded as begun before it runs, as the last checkpoint once done.
    assert machine.progress.current == genesis.key and machine.progress.phase == Phase.SAVING
    machine.handle(Done(), 2.0)
    assert machine.progress.completed == genesis.key
    assert machine.progress.checkpoint is not None
    assert machine.progress.checkpoint.uri == "/ckpt/20261101/pass-0-g1"
    assert restart(machine.progress).progress.checkpoint == machine.progress.checkpoint
    assert isinstance(machine.next_action(2.0), CheckData)


def test_a_ps_loss_before_the_first_regular_checkpoint_reloads_the_genesis() -> None:
    """Pass 1 is redone on the reloaded pass-0 state, never on what survived of the PS."""
    world = World()
    machine = fresh()
    while True:
        action = machine.next_action(world.now)
        if isinstance(action, RunPass) and action.key.pass_index == 2:
            break
        machine.handle(world.answer(action), world.now)
    machine.restore("ps-1 exited with code -9", world.now)
    assert world.run(machine).phase == Phase.SUCCEEDED
    assert steps(world.log)[:5] == [
        "load /ckpt/20261101/pass-0-g1",
        "reset",
        "replay train 20261101/1",
        "replay delta /exp/20261101/delta-1",
        "train 20261101/2",
    ]
    assert machine.progress.generation == 2 and machine.progress.replayed_steps == 2
    assert [(r.pass_index, r.generation) for r in machine.progress.history][:2] == [(1, 1), (2, 2)]


def test_a_restart_mid_genesis_redoes_it_under_the_new_generation() -> None:
    first = World()
    first.run(fresh())
    crashed = crash_at(first, lambda a: isinstance(a, Save) and a.key == PLAN.genesis)
    assert crashed.current == PLAN.genesis
    assert crashed.completed is None and crashed.checkpoint is None
    second = World()
    machine = restart(crashed)
    assert second.run(machine).phase == Phase.SUCCEEDED
    assert steps(second.log)[:3] == [
        "reset",
        "checkpoint /ckpt/20261101/pass-0-g2",
        "train 20261101/1",
    ]
    assert machine.progress.replayed_steps == 0


def test_a_record_from_before_the_genesis_replays_without_counting_it() -> None:
    """A job recorded by an older operator (no genesis, no checkpoint yet) still resumes."""
    old = Progress(generation=1, completed=StepKey("20261101", 1, StepKind.DELTA))
    world = World()
    machine = restart(old)
    assert world.run(machine).phase == Phase.SUCCEEDED
    assert steps(world.log)[:3] == [
        "replay train 20261101/1",
        "replay delta /exp/20261101/delta-1",
        "train 20261101/2",
    ]
    assert machine.progress.replayed_steps == 2
