"""The durable progress record of a job: what the scheduler must remember across restarts.

A restarted scheduler needs exactly this: the last completed step, the step that was begun
but not completed (it is redone), the last published checkpoint (the PS is reloaded from
it and the steps after it are replayed), the generation (bumped on every start, fences
results of older processes), the last export, the last pass's metrics and the conditions.

The record is plain data with a JSON form (:meth:`Progress.to_dict`) that is also the
shape of the custom resource's ``status`` (docs/design.md §1), so the local state file
and the Kubernetes status store the same thing. No I/O here (see ``state.py``).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from streamtrain_operator.job.plan import StepKey

#: Pass records kept in the local history (the CR status keeps only the last metrics).
HISTORY_LIMIT = 1000


class Phase:
    """Phases shown by ``kubectl get stj`` and ``streamtrain status``."""

    PENDING = "Pending"
    RESTORING = "Restoring"
    WAITING = "WaitingForData"
    TRAINING = "Training"
    SAVING = "Saving"
    SHRINKING = "Shrinking"
    SUSPENDED = "Suspended"
    STOPPED = "Stopped"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"

    TERMINAL = frozenset({SUCCEEDED, FAILED})


@dataclass(frozen=True)
class Condition:
    """A Kubernetes-style condition; ``time`` is the (injected) clock at the transition."""

    type: str
    status: str  # "True" | "False"
    reason: str
    message: str
    time: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "type": self.type,
            "status": self.status,
            "reason": self.reason,
            "message": self.message,
            "time": self.time,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Condition:
        return cls(d["type"], d["status"], d["reason"], d["message"], float(d.get("time", 0)))


@dataclass(frozen=True)
class Published:
    """A published checkpoint or inference model."""

    key: StepKey
    uri: str

    def to_dict(self) -> dict[str, Any]:
        return {**self.key.to_dict(), "kind": self.key.kind.value, "uri": self.uri}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Published:
        return cls(StepKey.from_dict(d), str(d["uri"]))


@dataclass(frozen=True)
class PassRecord:
    """What one trained pass produced (global metrics from summed histograms)."""

    day: str
    pass_index: int
    generation: int
    metrics: dict[str, float]
    wait_seconds: float = 0.0
    attempts: int = 1

    def to_dict(self) -> dict[str, Any]:
        return {
            "day": self.day,
            "pass": self.pass_index,
            "generation": self.generation,
            "metrics": dict(self.metrics),
            "waitSeconds": self.wait_seconds,
            "attempts": self.attempts,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> PassRecord:
        return cls(
            str(d["day"]),
            int(d["pass"]),
            int(d["generation"]),
            {k: float(v) for k, v in d["metrics"].items()},
            float(d.get("waitSeconds", 0.0)),
            int(d.get("attempts", 1)),
        )


@dataclass(frozen=True)
class Progress:
    """Everything durable about a job's run (immutable: transitions build a new one)."""

    generation: int = 0
    phase: str = Phase.PENDING
    #: The step begun but not (yet) completed, and when it began.
    current: StepKey | None = None
    current_started: float = 0.0
    #: The last completed step; everything before it in plan order is done.
    completed: StepKey | None = None
    checkpoint: Published | None = None
    export: Published | None = None
    #: Shrinks completed, as day strings (the last few; proves "once per day").
    shrunk_days: tuple[str, ...] = ()
    #: Steps replayed after a restart (model state restored from a checkpoint).
    replayed_steps: int = 0
    history: tuple[PassRecord, ...] = ()
    conditions: tuple[Condition, ...] = ()
    message: str = ""

    # ------------------------------------------------------------------ updates

    def with_condition(self, cond: Condition) -> Progress:
        others = tuple(c for c in self.conditions if c.type != cond.type)
        old = next((c for c in self.conditions if c.type == cond.type), None)
        if old is not None and (old.status, old.reason, old.message) == (
            cond.status,
            cond.reason,
            cond.message,
        ):
            return self
        return replace(self, conditions=(*others, cond))

    def clear_condition(self, type_: str, now: float, reason: str = "Resolved") -> Progress:
        old = next((c for c in self.conditions if c.type == type_), None)
        if old is None or old.status == "False":
            return self
        return self.with_condition(Condition(type_, "False", reason, "", now))

    def condition(self, type_: str) -> Condition | None:
        return next((c for c in self.conditions if c.type == type_), None)

    def add_pass(self, record: PassRecord) -> Progress:
        return replace(self, history=(*self.history, record)[-HISTORY_LIMIT:])

    @property
    def last_pass(self) -> PassRecord | None:
        return self.history[-1] if self.history else None

    # ------------------------------------------------------------------ JSON / status

    def to_dict(self) -> dict[str, Any]:
        """The ``status`` shape of docs/design.md §1 plus what a restart needs."""
        last = self.last_pass
        return {
            "generation": self.generation,
            "phase": self.phase,
            "current": None
            if self.current is None
            else {**self.current.to_dict(), "startedAt": self.current_started},
            "lastCompleted": None if self.completed is None else self.completed.to_dict(),
            "lastCheckpoint": None if self.checkpoint is None else self.checkpoint.to_dict(),
            "lastExport": None if self.export is None else self.export.to_dict(),
            "metrics": {} if last is None else {k: f"{v:.6g}" for k, v in last.metrics.items()},
            "shrunkDays": list(self.shrunk_days),
            "replayedSteps": self.replayed_steps,
            "history": [r.to_dict() for r in self.history],
            "conditions": [c.to_dict() for c in self.conditions],
            "message": self.message,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Progress:
        cur = d.get("current")
        return cls(
            generation=int(d.get("generation", 0)),
            phase=str(d.get("phase", Phase.PENDING)),
            current=None if not cur else StepKey.from_dict(cur),
            current_started=float(cur.get("startedAt", 0.0)) if cur else 0.0,
            completed=None if not d.get("lastCompleted") else StepKey.from_dict(d["lastCompleted"]),
            checkpoint=None
            if not d.get("lastCheckpoint")
            else Published.from_dict(d["lastCheckpoint"]),
            export=None if not d.get("lastExport") else Published.from_dict(d["lastExport"]),
            shrunk_days=tuple(d.get("shrunkDays", ())),
            replayed_steps=int(d.get("replayedSteps", 0)),
            history=tuple(PassRecord.from_dict(r) for r in d.get("history", ())),
            conditions=tuple(Condition.from_dict(c) for c in d.get("conditions", ())),
            message=str(d.get("message", "")),
        )


__all__ = ["HISTORY_LIMIT", "Condition", "PassRecord", "Phase", "Progress", "Published"]
