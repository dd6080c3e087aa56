"""The pass scheduler as a pure state machine: actions out, events in, no I/O, no clock.

The driver (``driver.py``) runs the loop::

    machine = Scheduler(plan, policy, progress)    # progress from the state store
    while not isinstance(action := machine.next_action(now), Terminal):
        store.save(machine.progress)               # "about to do X" is durable
        event = await execute(action)
        machine.handle(event, now)
        store.save(machine.progress)               # "X done" is durable

Restart semantics (docs/design.md §3): every start bumps the generation, loads the last
published checkpoint into the PS (the PS state after a crash is either lost or partially
updated by an interrupted step, so only a checkpoint is a known state) and replays the
steps after it up to the last completed one — trains, shrinks and the state side effects
of exports (delta/base reset delta_score, batch ages unseen_days) — without recording
metrics or publishing anything again. The model state therefore sees each pass and each
shrink exactly once, published outputs exist exactly once, and the step that was begun but
not completed is then redone from scratch (exports are idempotent: same target, published
last). Time only enters through the ``now`` arguments, so tests script it.

A fresh job (nothing completed, no checkpoint) opens with ``ResetWorkers`` — every worker
builds its trainer, which offers its initial dense parameters to the PS (``init_dense``,
first one wins) — and then the genesis checkpoint (``PassPlan.genesis``), so the dense
vectors are in it and every later restore, even one during the first pass, reloads a
known state. A start that finds the genesis begun but not recorded does both again under
the new generation (a new directory; ``init_dense`` keeps what the PS already holds).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import TypeVar

from streamtrain_operator.job.messages import (
    Action,
    CheckData,
    CheckpointTaken,
    DataChecked,
    Done,
    Event,
    Failed,
    LoadCheckpoint,
    PassRan,
    ResetWorkers,
    RunPass,
    Save,
    Shrink,
    Sleep,
    Terminal,
)
from streamtrain_operator.job.plan import EXPORT_KINDS, PassPlan, StepKey, StepKind
from streamtrain_operator.job.progress import Condition, PassRecord, Phase, Progress, Published

SHRUNK_DAYS_KEPT = 64
_E = TypeVar("_E")

# --------------------------------------------------------------------------- policy


@dataclass(frozen=True)
class Policy:
    """The spec's scheduling knobs (built by ``driver.policy_from_spec``: this module is pure)."""

    num_workers: int
    poll_seconds: float = 60.0
    missing_deadline_seconds: float = 3600.0
    fail_on_missing: bool = False
    pass_retries: int = 2


class ProtocolError(RuntimeError):
    """The driver sent an event that does not answer the pending action (a bug)."""


# --------------------------------------------------------------------------- machine


@dataclass
class _PassState:
    """Transient state of the train step in progress (an interrupted pass is redone whole)."""

    key: StepKey
    pending: set[int]
    wait_started: float | None = None
    wait_seconds: float = 0.0
    data_ready: bool = False
    attempts: dict[int, int] = field(default_factory=dict)


class Scheduler:
    """The job's state machine; ``progress`` is what the store must persist."""

    def __init__(self, plan: PassPlan, policy: Policy, progress: Progress) -> None:
        self.plan = plan
        self.policy = policy
        self.progress = progress
        self._queue: list[Action] = []  # start-up work: load, reset, replay
        self._pending: Action | None = None
        self._started = False
        self._stop: tuple[str, str] | None = None
        #: A checkpoint taken (``CheckpointTaken``) whose files are not yet published.
        self._unwritten: Published | None = None
        self._sleep: float | None = None
        self._pass: _PassState | None = None
        #: Restores caused by a failed share, by pass (bounded by ``pass_retries``).
        self._share_restores: dict[StepKey, int] = {}

    # ------------------------------------------------------------------ public

    def request_stop(self, phase: str = Phase.STOPPED, message: str = "") -> None:
        """Stop before the next step (Ctrl-C, SIGTERM, ``suspend``); progress stays valid."""
        self._stop = (phase, message)

    def restore(self, reason: str, now: float, cause: str = "PSRestarted") -> None:
        """The PS state is lost or unknown: start over from the last checkpoint.

        ``cause`` (the condition's reason): ``PSRestarted`` (a shard came back empty) or
        ``ShareFailed`` (a share failed after it may have pushed part of its gradients:
        the machine calls this itself, see ``_on_share_failed``).

        Whatever action is pending is abandoned (its outcome is unknown or was computed
        against a PS that lost state); the next action bumps the generation, reloads the
        checkpoint and replays the completed steps after it, exactly as after a scheduler
        restart. The step in progress is then redone from scratch.
        """
        if self.progress.phase in Phase.TERMINAL:
            return
        self._pending = None
        self._pass = None
        self._sleep = None
        self._queue = []
        self._started = False
        self._unwritten = None
        self.progress = self.progress.with_condition(
            Condition("Restored", "True", cause, reason, now)
        )

    def checkpoint_written(self, uri: str) -> None:
        """The files of the checkpoint taken for ``uri`` are published: from now on it is
        the one a restore reloads (saved with the next progress write)."""
        if self._unwritten is None or self._unwritten.uri != uri:
            raise ProtocolError(f"checkpoint {uri} was not taken")
        self.progress = replace(self.progress, checkpoint=self._unwritten)
        self._unwritten = None

    @property
    def generation(self) -> int:
        return self.progress.generation

    def next_action(self, now: float) -> Action:
        """The next thing to do; repeated calls without an event return the same action."""
        if self._pending is None:
            self._pending = self._decide(now)
        return self._pending

    def handle(self, event: Event, now: float) -> None:
        """Apply the outcome of the pending action."""
        action = self._pending
        if action is None or isinstance(action, Terminal):
            raise ProtocolError(f"event {event!r} with no pending action")
        self._pending = None
        if isinstance(event, Failed):
            self._fail(event.reason, event.message, now)
            return
        if self._queue and action is self._queue[0]:
            self._queue.pop(0)
            if isinstance(action, RunPass) and _expect(event, PassRan).failed:
                self._on_share_failed(action, _expect(event, PassRan), now)
                if not self._started:  # restored: the start-up work is queued anew
                    return
            if not self._queue:
                self.progress = replace(self.progress, phase=Phase.PENDING)
            return
        if isinstance(action, CheckData):
            self._on_data(action, _expect(event, DataChecked), now)
        elif isinstance(action, Sleep):
            _expect(event, Done)
            self._sleep = None
        elif isinstance(action, RunPass):
            self._on_pass(action, _expect(event, PassRan), now)
        elif isinstance(action, Save):
            if isinstance(event, CheckpointTaken) and action.key.kind == StepKind.CHECKPOINT:
                self._unwritten = Published(action.key, action.uri)
                self._complete(action.key)
            else:
                _expect(event, Done)
                self._on_saved(action)
        elif isinstance(action, Shrink):
            _expect(event, Done)
            days = (*self.progress.shrunk_days, action.key.day)[-SHRUNK_DAYS_KEPT:]
            self.progress = replace(self.progress, shrunk_days=days)
            self._complete(action.key)
        else:  # pragma: no cover - every action type is handled above
            raise ProtocolError(f"unexpected pending action {action!r}")

    # ------------------------------------------------------------------ deciding

    def _decide(self, now: float) -> Action:
        if not self._started:
            p = self.progress
            if p.phase == Phase.SUCCEEDED and self.plan.next_step(p.completed) is None:
                return Terminal(p.phase, p.message)
            # A new run: a failed job is retried from its last checkpoint, a succeeded one
            # continues when endDay was moved later.
            self._start(now)
        if self.progress.phase in Phase.TERMINAL:
            return Terminal(self.progress.phase, self.progress.message)
        if self._queue:
            return self._queue[0]
        if self._stop is not None:
            phase, message = self._stop
            self.progress = replace(self.progress, phase=phase, message=message)
            return Terminal(phase, message)
        if self._sleep is not None:
            return Sleep(self._sleep)
        return self._next_step_action(now)

    def _start(self, now: float) -> None:
        """Bump the generation; queue the checkpoint load and the replay of later steps."""
        self._started = True
        p = self.progress
        gen = p.generation + 1
        ckpt = p.checkpoint
        # Checkpoints are no replay work (only the genesis of a record written before it
        # existed can lie between no checkpoint and the last completed step).
        replay = [
            key
            for key in self.plan.steps_between(None if ckpt is None else ckpt.key, p.completed)
            if key.kind != StepKind.CHECKPOINT
        ]
        queue: list[Action] = []
        if ckpt is not None:
            queue += [LoadCheckpoint(ckpt.uri), ResetWorkers()]
        elif p.completed is None:
            # The genesis checkpoint is next: the dense vectors must be on the PS first.
            queue.append(ResetWorkers())
        for key in replay:
            if key.kind == StepKind.TRAIN:
                queue.append(RunPass(key, self._all_shares(), 1, gen, replay=True))
            elif key.kind in EXPORT_KINDS:
                queue.append(Save(key, self.plan.export_uri(key), gen, replay=True))
            elif key.kind == StepKind.SHRINK:
                queue.append(Shrink(key, replay=True))
            # A checkpoint step after the last published checkpoint was taken but never
            # written (``CheckpointTaken``): nothing to redo, the next one comes in time.
        self._queue = queue
        self.progress = replace(
            p,
            generation=gen,
            phase=Phase.RESTORING if ckpt is not None or replay else Phase.PENDING,
            message="",
            replayed_steps=p.replayed_steps + len(replay),
        ).clear_condition("Failed", now, "Resumed")

    def _next_step_action(self, now: float) -> Action:
        key = self.plan.next_step(self.progress.completed)
        if key is None:
            self.progress = replace(
                self.progress, phase=Phase.SUCCEEDED, current=None, message="endDay reached"
            )
            return Terminal(Phase.SUCCEEDED, "endDay reached")
        gen = self.progress.generation
        if key.kind == StepKind.TRAIN:
            st = self._pass
            if st is None or st.key != key:
                st = self._pass = _PassState(key, pending=set(self._all_shares()))
                # Training, not WaitingForData, until a data check finds a folder missing:
                # the check takes milliseconds when the data is there (almost always), and
                # so the record before the RunPass equals the one before the check, and the
                # store skips that write (one fsynced write less per pass; docs/decisions.md).
                self._begin(key, Phase.TRAINING, now)
            if not st.data_ready:
                return CheckData(key)
            shares = tuple(sorted(st.pending))
            attempt = 1 + max((st.attempts.get(w, 0) for w in shares), default=0)
            return RunPass(key, shares, attempt, gen)
        if key.kind == StepKind.SHRINK:
            self._begin(key, Phase.SHRINKING, now)
            return Shrink(key)
        self._begin(key, Phase.SAVING, now)
        if key.kind == StepKind.CHECKPOINT:
            return Save(key, self.plan.checkpoint_uri(key, gen), gen)
        return Save(key, self.plan.export_uri(key), gen)

    def _begin(self, key: StepKey, phase: str, now: float) -> None:
        if self.progress.current == key:
            self.progress = replace(self.progress, phase=phase)
        else:
            self.progress = replace(self.progress, current=key, current_started=now, phase=phase)

    def _complete(self, key: StepKey) -> None:
        self.progress = replace(self.progress, completed=key, current=None)

    # ------------------------------------------------------------------ outcomes

    def _on_data(self, action: CheckData, event: DataChecked, now: float) -> None:
        st = self._pass
        assert st is not None and st.key == action.key
        if st.wait_started is None:
            st.wait_started = now
        st.wait_seconds = now - st.wait_started
        if not event.missing:
            st.data_ready = True
            self.progress = replace(self.progress, phase=Phase.TRAINING).clear_condition(
                "DataMissing", now, "DataArrived"
            )
            return
        self.progress = replace(self.progress, phase=Phase.WAITING)
        if st.wait_seconds >= self.policy.missing_deadline_seconds:
            message = (
                f"pass {action.key.day}/{action.key.pass_index}: no donefile after "
                f"{st.wait_seconds:.0f}s in {', '.join(event.missing)}"
            )
            if self.policy.fail_on_missing:
                self._fail("DataMissing", message, now)
                return
            self.progress = self.progress.with_condition(
                Condition("DataMissing", "True", "DonefileLate", message, now)
            )
        self._sleep = self.policy.poll_seconds

    def _on_pass(self, action: RunPass, event: PassRan, now: float) -> None:
        st = self._pass
        assert st is not None and st.key == action.key
        for w in action.shares:
            st.attempts[w] = action.attempt
        st.pending = set(event.failed)
        if event.failed:
            self._on_share_failed(action, event, now)
            return
        if event.metrics is None:
            raise ProtocolError("PassRan without failures must carry the pass metrics")
        record = PassRecord(
            day=action.key.day,
            pass_index=action.key.pass_index,
            generation=action.generation,
            metrics=dict(event.metrics),
            wait_seconds=st.wait_seconds,
            attempts=self._share_restores.get(action.key, 0) + max(st.attempts.values(), default=1),
        )
        self.progress = self.progress.add_pass(record).clear_condition(
            "WorkerFailed", now, "PassCompleted"
        )
        self._complete(action.key)
        self._pass = None

    def _on_share_failed(self, action: RunPass, event: PassRan, now: float) -> None:
        """A share failed. Exactly-once: a share is applied once or not at all.

        A share that may have pushed part of its gradients (anything but a refusal) cannot
        be retried alone — the retry would apply those gradients again. The PS is restored
        instead (reload the last checkpoint, replay, redo the pass whole), at most
        ``pass_retries`` times per pass; then the job fails naming the worker and the error.
        Only shares refused before they ran are retried alone. A record without any
        checkpoint (written before the genesis existed) cannot be restored: it fails.
        """
        if not event.may_have_pushed:
            self._retry_or_fail(action, event, now)
            return
        worker, error = min((w, e) for w, e in event.failed.items() if w not in event.refused)
        where = f"pass {action.key.day}/{action.key.pass_index}"
        restores = self._share_restores.get(action.key, 0)
        if restores >= self.policy.pass_retries or self.progress.checkpoint is None:
            why = (
                "with no checkpoint to restore"
                if self.progress.checkpoint is None
                else f"after {restores + 1} attempts"
            )
            self._fail("WorkerFailed", f"worker {worker} failed {where} {why}: {error}", now)
            return
        self._share_restores[action.key] = restores + 1
        self.progress = self.progress.with_condition(
            Condition(
                "WorkerFailed",
                "True",
                "RestoringPass",
                f"worker {worker} failed {where} (attempt {restores + 1}): {error}",
                now,
            )
        )
        self.restore(
            f"worker {worker} failed {where} after it may have pushed: {error}; the pushes "
            "of the pass are discarded (reload the last checkpoint, replay, redo the pass)",
            now,
            cause="ShareFailed",
        )

    def _retry_or_fail(self, action: RunPass, event: PassRan, now: float) -> None:
        """Every failed share was refused before it ran: retry those shares alone."""
        worker, error = sorted(event.failed.items())[0]
        where = f"pass {action.key.day}/{action.key.pass_index}"
        if action.attempt > self.policy.pass_retries:
            self._fail(
                "WorkerFailed",
                f"worker {worker} failed {where} after {action.attempt} attempts: {error}",
                now,
            )
            return
        self.progress = self.progress.with_condition(
            Condition(
                "WorkerFailed",
                "True",
                "RetryingShare",
                f"worker {worker} failed {where} (attempt {action.attempt}): {error}",
                now,
            )
        )
        if action.replay:
            retry = replace(action, shares=tuple(sorted(event.failed)), attempt=action.attempt + 1)
            self._queue.insert(0, retry)

    def _on_saved(self, action: Save) -> None:
        published = Published(action.key, action.uri)
        if action.key.kind == StepKind.CHECKPOINT:
            self.progress = replace(self.progress, checkpoint=published)
        else:
            self.progress = replace(self.progress, export=published)
        self._complete(action.key)

    def _fail(self, reason: str, message: str, now: float) -> None:
        self._queue = []
        self.progress = replace(
            self.progress, phase=Phase.FAILED, message=f"{reason}: {message}"
        ).with_condition(Condition("Failed", "True", reason, message, now))

    def _all_shares(self) -> tuple[int, ...]:
        return tuple(range(self.policy.num_workers))


def _expect(event: object, cls: type[_E]) -> _E:
    if not isinstance(event, cls):
        raise ProtocolError(f"expected {cls.__name__}, got {event!r}")
    return event
