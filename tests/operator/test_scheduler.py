"""The pass scheduler state machine over scripted events (no I/O, no clock)."""

from __future__ import annotations

import pytest
from fakes import PLAN, World, crash_at, fresh, policy, restart, steps

from streamtrain_operator.job.messages import (
    CheckData,
    Done,
    Failed,
    LoadCheckpoint,
    ResetWorkers,
    RunPass,
    Save,
    Shrink,
    Sleep,
    Terminal,
)
from streamtrain_operator.job.plan import PassPlan, StepKey, StepKind
from streamtrain_operator.job.progress import Condition, Phase
from streamtrain_operator.job.scheduler import ProtocolError, Scheduler


def test_two_days_in_order_with_exports_checkpoints_and_one_shrink_per_day() -> None:
    world = World()
    end = world.run(fresh())
    assert end.phase == Phase.SUCCEEDED
    assert steps(world.log) == [
        "reset",
        "checkpoint /ckpt/20261101/pass-0-g1",
        "train 20261101/1",
        "delta /exp/20261101/delta-1",
        "train 20261101/2",
        "delta /exp/20261101/delta-2",
        "checkpoint /ckpt/20261101/pass-2-g1",
        "train 20261101/3",
        "delta /exp/20261101/delta-3",
        "shrink 20261101",
        "base /exp/20261102/base",
        "batch /exp/20261101/batch",
        "checkpoint /ckpt/20261101/pass-3-g1",
        "train 20261102/1",
        "delta /exp/20261102/delta-1",
        "train 20261102/2",
        "delta /exp/20261102/delta-2",
        "checkpoint /ckpt/20261102/pass-2-g1",
        "train 20261102/3",
        "delta /exp/20261102/delta-3",
        "shrink 20261102",
        "base /exp/20261103/base",
        "batch /exp/20261102/batch",
        "checkpoint /ckpt/20261102/pass-3-g1",
    ]
    p = world.saved[-1]
    assert p.shrunk_days == ("20261101", "20261102")
    assert [(r.day, r.pass_index) for r in p.history] == [
        (d, i) for d in ("20261101", "20261102") for i in (1, 2, 3)
    ]
    assert p.checkpoint is not None and p.checkpoint.uri == "/ckpt/20261102/pass-3-g1"
    assert p.export is not None and p.export.key.kind == StepKind.BATCH
    # Every RunPass went to both workers, once.
    assert all(a.shares == (0, 1) and a.attempt == 1 for a in world.log if isinstance(a, RunPass))


def test_step_is_recorded_before_and_after_it_runs() -> None:
    world = World()
    machine = fresh()
    _open(machine, world)
    action = machine.next_action(0.0)
    assert isinstance(action, CheckData)
    assert machine.progress.current == StepKey("20261101", 1, StepKind.TRAIN)
    assert machine.progress.phase == Phase.TRAINING
    before_check = machine.progress
    machine.handle(world.answer(action), 1.0)
    action = machine.next_action(1.0)
    assert isinstance(action, RunPass)
    # The data was there: nothing changed, so the store skips the write before the RunPass.
    assert machine.progress == before_check
    assert machine.progress.completed == PLAN.genesis
    machine.handle(world.answer(action), 2.0)
    assert machine.progress.completed == StepKey("20261101", 1, StepKind.TRAIN)
    assert machine.progress.current is None
    assert machine.next_action(2.0) is machine.next_action(2.0)  # idempotent until answered


def test_late_donefile_waits_polls_and_records_the_wait() -> None:
    world = World(data_at={("20261101", 2): 25.0})
    machine = fresh()
    world.run(machine)
    sleeps = [a for a in world.log if isinstance(a, Sleep)]
    assert sleeps and all(s.seconds == 10.0 for s in sleeps)
    record = next(r for r in machine.progress.history if r.pass_index == 2)
    assert record.wait_seconds >= 20.0
    first = next(r for r in machine.progress.history if r.pass_index == 1)
    assert first.wait_seconds == 0.0
    # Shorter than the deadline: no condition was ever raised.
    assert all(p.condition("DataMissing") is None for p in world.saved)


_NONE = Condition("DataMissing", "None", "", "", 0.0)


def test_missing_past_deadline_raises_a_condition_naming_the_folder_and_keeps_waiting() -> None:
    world = World(data_at={("20261101", 1): 100.0})
    machine = fresh()
    world.run(machine)
    raised = [p.condition("DataMissing") for p in world.saved]
    true = [c for c in raised if c is not None and c.status == "True"]
    assert true, "the DataMissing condition was never raised"
    assert "/data/20261101/0100" in true[0].message
    assert "20261101/1" in true[0].message
    # A check that found the folder missing says so in the phase, written before the wait.
    late = [p for p in world.saved if (p.condition("DataMissing") or _NONE).status == "True"]
    assert late and all(p.phase == Phase.WAITING for p in late)
    final = machine.progress.condition("DataMissing")
    assert final is not None and final.status == "False" and final.reason == "DataArrived"
    assert machine.progress.phase == Phase.SUCCEEDED


def test_missing_past_deadline_fails_when_asked_to() -> None:
    world = World(data_at={("20261101", 2): 1e9})
    end = world.run(fresh(fail_on_missing=True))
    assert end.phase == Phase.FAILED
    assert "DataMissing" in end.message and "/data/20261101/0200" in end.message
    assert not any(isinstance(a, RunPass) and a.key.pass_index == 2 for a in world.log)


def test_a_refused_share_is_retried_alone_and_the_pass_counted_once() -> None:
    world = World(worker_errors={("20261101", 2, 1): ["refused: worker is busy"]})
    machine = fresh()
    assert world.run(machine).phase == Phase.SUCCEEDED
    runs = [a for a in world.log if isinstance(a, RunPass) and a.key.pass_index == 2]
    runs = [a for a in runs if a.key.day == "20261101"]
    assert [(a.shares, a.attempt) for a in runs] == [((0, 1), 1), ((1,), 2)]
    assert not any(isinstance(a, LoadCheckpoint) for a in world.log)
    records = [r for r in machine.progress.history if (r.day, r.pass_index) == ("20261101", 2)]
    assert len(records) == 1 and records[0].attempts == 2
    degraded = [p.condition("WorkerFailed") for p in world.saved]
    assert any(c is not None and "worker is busy" in c.message for c in degraded)


def test_a_share_that_may_have_pushed_restores_and_redoes_the_whole_pass() -> None:
    """A share that failed after it started may have pushed part of its gradients: it is
    never retried alone (that would apply them twice). The PS is restored from the last
    checkpoint (pass 1's is not due, checkpoint_every=2: the genesis), the completed pass 1
    replayed, and pass 2 redone by every worker."""
    world = World(worker_errors={("20261101", 2, 1): ["connection reset"]})
    machine = fresh()
    assert world.run(machine).phase == Phase.SUCCEEDED
    after = world.log[next(i for i, a in enumerate(world.log) if isinstance(a, RunPass)) :]
    assert steps(after)[:7] == [
        "train 20261101/1",
        "delta /exp/20261101/delta-1",
        "train 20261101/2",
        "load /ckpt/20261101/pass-0-g1",
        "reset",
        "replay train 20261101/1",
        "replay delta /exp/20261101/delta-1",
    ]
    assert steps(after)[7] == "train 20261101/2"
    runs = [a for a in world.log if isinstance(a, RunPass) and a.key.pass_index == 2]
    runs = [a for a in runs if a.key.day == "20261101"]
    assert [(a.shares, a.attempt, a.generation) for a in runs] == [((0, 1), 1, 1), ((0, 1), 1, 2)]
    records = [r for r in machine.progress.history if (r.day, r.pass_index) == ("20261101", 2)]
    assert len(records) == 1 and records[0].attempts == 2
    restored = machine.progress.condition("Restored")
    assert restored is not None and restored.reason == "ShareFailed"
    assert "worker 1 failed pass 20261101/2 after it may have pushed: connection reset" in (
        restored.message
    )


def test_a_replayed_pass_that_fails_restores_again_instead_of_retrying_its_share() -> None:
    world = World()
    world.run(fresh())
    crashed = crash_at(world, lambda a: isinstance(a, Shrink))  # after pass 3, not replayed
    replay = World(worker_errors={("20261101", 3, 0): ["socket closed"]})
    assert replay.run(restart(crashed)).phase == Phase.SUCCEEDED
    loads = [a for a in replay.log if isinstance(a, LoadCheckpoint)]
    assert len(loads) == 2  # the restart's reload, and the one after the failed replay
    assert all(not (isinstance(a, RunPass) and a.shares == (0,)) for a in replay.log)


def test_worker_error_beyond_retries_fails_with_a_clear_condition() -> None:
    world = World(worker_errors={("20261101", 1, 0): ["boom"] * 5})
    end = world.run(fresh(pass_retries=2))
    assert end.phase == Phase.FAILED
    assert "worker 0 failed pass 20261101/1 after 3 attempts: boom" in end.message
    loads = [a for a in world.log if isinstance(a, LoadCheckpoint)]
    assert len(loads) == 2  # passRetries restores, then the job fails
    failed = world.saved[-1].condition("Failed")
    assert failed is not None and failed.reason == "WorkerFailed"


def test_refusals_beyond_retries_fail_with_a_clear_condition() -> None:
    world = World(worker_errors={("20261101", 1, 0): ["refused: stale generation"] * 5})
    end = world.run(fresh(pass_retries=2))
    assert end.phase == Phase.FAILED
    assert "worker 0 failed pass 20261101/1 after 3 attempts: refused" in end.message


def _open(machine: Scheduler, world: World) -> None:
    """Answer the opening of a fresh job: the workers' reset, then the genesis checkpoint."""
    reset = machine.next_action(world.now)
    assert isinstance(reset, ResetWorkers)
    machine.handle(world.answer(reset), world.now)
    genesis = machine.next_action(world.now)
    assert isinstance(genesis, Save) and genesis.key == PLAN.genesis
    machine.handle(world.answer(genesis), world.now)


def test_restart_mid_export_reloads_replays_and_redoes_the_export_once() -> None:
    first = World()
    first.run(fresh())
    # Crash while day 1 pass 3's delta was being written (recorded as begun, not done).
    crashed = crash_at(
        first,
        lambda a: isinstance(a, Save) and a.key == StepKey("20261101", 3, StepKind.DELTA),
    )
    assert crashed.current == StepKey("20261101", 3, StepKind.DELTA)
    assert crashed.completed == StepKey("20261101", 3, StepKind.TRAIN)
    second = World()
    machine = restart(crashed)
    assert second.run(machine).phase == Phase.SUCCEEDED
    assert steps(second.log)[:5] == [
        "load /ckpt/20261101/pass-2-g1",
        "reset",
        "replay train 20261101/3",
        "delta /exp/20261101/delta-3",
        "shrink 20261101",
    ]
    # The redone export goes to the same target, the new checkpoints to fresh generation dirs.
    assert "checkpoint /ckpt/20261101/pass-3-g2" in steps(second.log)
    assert machine.progress.generation == 2
    # Model state saw pass 3 once: its metrics were recorded by the first run only.
    assert sum(1 for r in machine.progress.history if r.day == "20261101") == 3


def test_restart_mid_shrink_shrinks_the_day_once() -> None:
    first = World()
    first.run(fresh())
    crashed = crash_at(first, lambda a: isinstance(a, Shrink) and a.key.day == "20261101")
    assert crashed.current is not None and crashed.current.kind == StepKind.SHRINK
    assert crashed.shrunk_days == ()
    second = World()
    machine = restart(crashed)
    second.run(machine)
    assert [a.key.day for a in second.log if isinstance(a, Shrink)] == ["20261101", "20261102"]
    assert not any(isinstance(a, Shrink) and a.replay for a in second.log)
    assert machine.progress.shrunk_days == ("20261101", "20261102")


def test_restart_after_shrink_replays_it_on_the_restored_state_without_recording_it() -> None:
    first = World()
    first.run(fresh())
    # Crash while the day-end base export runs: shrink is done but not checkpointed yet.
    crashed = crash_at(first, lambda a: isinstance(a, Save) and a.key.kind == StepKind.BASE)
    second = World()
    machine = restart(crashed)
    second.run(machine)
    assert steps(second.log)[:7] == [
        "load /ckpt/20261101/pass-2-g1",
        "reset",
        "replay train 20261101/3",
        "replay delta /exp/20261101/delta-3",
        "replay shrink 20261101",
        "base /exp/20261102/base",
        "batch /exp/20261101/batch",
    ]
    assert machine.progress.shrunk_days == ("20261101", "20261102")


def test_a_kill_after_the_day_end_exports_replays_the_base_and_the_batch() -> None:
    """Killed while the day-end checkpoint was written: the day's base and batch are
    published, and their PS side effects (``delta_score`` reset, ``unseen_days`` aged) are
    part of the state that checkpoint must hold. The replay redoes them (to scratch), not
    only the deltas; a replay without them writes a checkpoint of another state."""
    first = World()
    first.run(fresh())
    crashed = crash_at(
        first,
        lambda a: isinstance(a, Save) and a.key == StepKey("20261101", 3, StepKind.CHECKPOINT),
    )
    assert crashed.completed == StepKey("20261101", 3, StepKind.BATCH)
    second = World()
    machine = restart(crashed)
    assert second.run(machine).phase == Phase.SUCCEEDED
    assert steps(second.log)[:8] == [
        "load /ckpt/20261101/pass-2-g1",
        "reset",
        "replay train 20261101/3",
        "replay delta /exp/20261101/delta-3",
        "replay shrink 20261101",
        "replay base /exp/20261102/base",
        "replay batch /exp/20261101/batch",
        "checkpoint /ckpt/20261101/pass-3-g2",
    ]
    assert machine.progress.replayed_steps == 5


def test_resume_after_a_checkpoint_skips_completed_passes() -> None:
    first = World()
    first.run(fresh())
    # Stopped right after day 1's day-end checkpoint.
    crashed = crash_at(
        first,
        lambda a: isinstance(a, CheckData) and a.key == StepKey("20261102", 1, StepKind.TRAIN),
    )
    assert crashed.completed == StepKey("20261101", 3, StepKind.CHECKPOINT)
    second = World()
    second.run(restart(crashed))
    assert steps(second.log)[:3] == [
        "load /ckpt/20261101/pass-3-g1",
        "reset",
        "train 20261102/1",
    ]
    trained = [a.key for a in second.log if isinstance(a, RunPass)]
    assert all(k.day == "20261102" for k in trained)


def test_stop_request_ends_cleanly_and_a_restart_continues() -> None:
    world = World()
    machine = fresh()
    for _ in range(6):
        action = machine.next_action(world.now)
        machine.handle(world.answer(action), world.now)
    machine.request_stop()
    end = machine.next_action(world.now)
    assert isinstance(end, Terminal) and end.phase == Phase.STOPPED
    with pytest.raises(ProtocolError):
        machine.handle(Done(), world.now)
    rest = World()
    assert rest.run(restart(machine.progress)).phase == Phase.SUCCEEDED
    assert restart(machine.progress).progress.generation == 1


def test_storage_failure_fails_the_job_with_the_reason() -> None:
    machine = fresh()
    world = World()
    while not isinstance(action := machine.next_action(world.now), Save) or (
        action.key.kind == StepKind.CHECKPOINT
    ):
        machine.handle(world.answer(action), world.now)
    machine.handle(Failed("ExportFailed", "s3://b/x: access denied after 5 retries"), 9.0)
    end = machine.next_action(9.0)
    assert isinstance(end, Terminal) and end.phase == Phase.FAILED
    assert "access denied" in end.message


def test_wrong_event_is_a_protocol_error() -> None:
    machine = fresh()
    _open(machine, World())
    assert isinstance(machine.next_action(0.0), CheckData)
    with pytest.raises(ProtocolError):
        machine.handle(Done(), 0.0)


def test_forever_job_keeps_planning_days() -> None:
    plan = PassPlan("20261230", None, 2, 0, 1, False, False, "/e", "/c")
    key: StepKey | None = plan.first_step()
    keys = []
    for _ in range(12):
        assert key is not None
        keys.append(str(key))
        key = plan.next_step(key)
    assert "20270101/1/train" in keys
    assert "20261231/2/shrink" in keys
    assert not any("delta" in k or "base" in k for k in keys)


def test_a_step_of_an_older_spec_still_has_its_place() -> None:
    """deltaEveryPasses changed between two runs: resume right after the recorded step."""
    no_deltas = PassPlan("20261101", "20261102", 3, 0, 2, True, True, "/exp", "/ckpt")
    done = StepKey("20261101", 2, StepKind.DELTA)  # recorded under PLAN (a delta every pass)
    assert no_deltas.next_step(done) == StepKey("20261101", 2, StepKind.CHECKPOINT)
    assert no_deltas.next_step(StepKey("20261101", 3, StepKind.DELTA)) == StepKey(
        "20261101", 3, StepKind.SHRINK
    )
    assert no_deltas.steps_between(None, done) == [
        StepKey("20261101", 0, StepKind.CHECKPOINT),
        StepKey("20261101", 1, StepKind.TRAIN),
        StepKey("20261101", 2, StepKind.TRAIN),
    ]


def test_ps_loss_mid_pass_reloads_the_checkpoint_and_replays_then_redoes_the_pass() -> None:
    world = World()
    machine = fresh()
    while True:  # run until pass 3 of day 1 is being trained
        action = machine.next_action(world.now)
        if isinstance(action, RunPass) and action.key == StepKey("20261101", 3, StepKind.TRAIN):
            break
        machine.handle(world.answer(action), world.now)
    machine.restore("ps-0 exited with code -9", world.now)
    cond = machine.progress.condition("Restored")
    assert cond is not None and cond.message == "ps-0 exited with code -9"
    assert world.run(machine).phase == Phase.SUCCEEDED
    assert steps(world.log)[:4] == [
        "load /ckpt/20261101/pass-2-g1",
        "reset",
        "train 20261101/3",
        "delta /exp/20261101/delta-3",
    ]
    first_run = [a for a in world.log if isinstance(a, RunPass)]
    assert first_run[0].generation == 2
    assert [(r.day, r.pass_index) for r in machine.progress.history][:3] == [
        ("20261101", 1),
        ("20261101", 2),
        ("20261101", 3),
    ]


def test_a_failed_job_run_again_resumes_from_its_checkpoint() -> None:
    world = World(worker_errors={("20261101", 3, 0): ["boom"] * 3})
    machine = fresh()
    assert world.run(machine).phase == Phase.FAILED
    again = World()
    machine = restart(machine.progress)
    assert again.run(machine).phase == Phase.SUCCEEDED
    assert steps(again.log)[:3] == ["load /ckpt/20261101/pass-2-g1", "reset", "train 20261101/3"]
    failed = machine.progress.condition("Failed")
    assert failed is not None and (failed.status, failed.reason) == ("False", "Resumed")


def test_a_succeeded_job_stays_done_unless_end_day_moves() -> None:
    world = World()
    machine = fresh()
    world.run(machine)
    done = machine.progress
    end = restart(done).next_action(0.0)
    assert isinstance(end, Terminal) and end.phase == Phase.SUCCEEDED
    longer = PassPlan(**{**PLAN.__dict__, "end_day": "20261103"})
    machine = Scheduler(longer, policy(), done)
    later = World()
    assert later.run(machine).phase == Phase.SUCCEEDED
    trained = [a.key.day for a in later.log if isinstance(a, RunPass)]
    assert trained == ["20261103"] * 3
