"""The custom resource's ``status``: pure transitions, plus the durable-state adapter.

Two kinds of status content meet here:

- the scheduler's :class:`~streamtrain_operator.job.progress.Progress` — phase, current and last
  completed step, last checkpoint and export, last metrics, its conditions — shown in the
  printer-friendly fields of docs/design.md §1 and stored whole (pass history trimmed)
  under ``status.scheduler``, which is what an operator restart resumes from;
- the operator's own conditions (``SpecValid``, ``PodsReady``) and ``observedGeneration``.

Everything here is a pure function of its inputs (time is an argument), except
:class:`StatusStore`, the ``StateStore`` the driver saves progress through: it turns each
save into one status merge-patch through an injected callable (``kube.py`` in production, a
list in tests), so "about to do X" is durable in etcd before X happens.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any

from streamtrain_operator.job.progress import Phase, Progress

#: Pass records kept in ``status.scheduler`` (the full history lives in the exports'
#: manifests and in Prometheus; etcd objects should stay small).
STATUS_HISTORY = 24
#: Condition types the operator itself owns (the scheduler owns the others).
SPEC_VALID = "SpecValid"
PODS_READY = "PodsReady"
READY = "Ready"
#: Metrics shown in ``status.metrics`` (decimal strings, as docs/design.md §1 shows them).
#: One the last pass does not define (an empty pass has no auc/loss/copc, a pass of one
#: class no auc) is *removed* from the status (``null`` in the merge-patch), so the AUC
#: column of ``kubectl get stj`` is blank rather than a number of an older pass or a
#: placeholder.
SHOWN_METRICS = ("auc", "loss", "copc", "examples", "examplesPerSecond", "seconds")
COUNTS = frozenset({"examples"})

Patch = Callable[[dict[str, Any]], None]


def rfc3339(epoch_seconds: float) -> str:
    """Kubernetes time format (second precision, UTC, ``Z``)."""
    moment = dt.datetime.fromtimestamp(epoch_seconds, tz=dt.UTC).replace(microsecond=0)
    return moment.isoformat().replace("+00:00", "Z")


def condition(
    type_: str,
    status: bool,
    reason: str,
    message: str,
    now: float,
    *,
    generation: int | None = None,
) -> dict[str, Any]:
    out: dict[str, Any] = {
        "type": type_,
        "status": "True" if status else "False",
        "reason": reason,
        "message": message,
        "lastTransitionTime": rfc3339(now),
    }
    if generation is not None:
        out["observedGeneration"] = generation
    return out


def set_condition(
    conditions: Sequence[Mapping[str, Any]], new: Mapping[str, Any]
) -> list[dict[str, Any]]:
    """Replace the condition of ``new``'s type; keep ``lastTransitionTime`` when the status
    did not flip (the time says when it *became* so, not when it was last written)."""
    out: list[dict[str, Any]] = []
    placed = False
    for old in conditions:
        if old.get("type") != new["type"]:
            out.append(dict(old))
            continue
        merged = dict(new)
        if old.get("status") == new["status"] and "lastTransitionTime" in old:
            merged["lastTransitionTime"] = old["lastTransitionTime"]
        out.append(merged)
        placed = True
    if not placed:
        out.append(dict(new))
    return sorted(out, key=lambda c: str(c["type"]))


def _step(key: Mapping[str, Any] | None) -> dict[str, Any] | None:
    if not key:
        return None
    return {k: key[k] for k in ("day", "pass", "step", "kind", "uri") if k in key}


def _decimal(name: str, value: float) -> str:
    """Counts as integers (``1843200``, not ``1.8432e+06``); ratios to 6 significant digits."""
    if name in COUNTS and value == int(value):
        return str(int(value))
    return f"{value:.6g}"


def _ready(progress: Progress) -> tuple[bool, str, str]:
    phase = progress.phase
    if phase in (Phase.TRAINING, Phase.SAVING, Phase.SHRINKING, Phase.WAITING):
        return True, "Running", f"the scheduler is {phase}"
    if phase == Phase.SUCCEEDED:
        return False, "Succeeded", progress.message or "endDay reached"
    if phase == Phase.FAILED:  # the failure's own reason (e.g. MemoryLimitTooSmall) if set
        failed = progress.condition("Failed")
        reason = failed.reason if failed is not None and failed.status == "True" else ""
        return False, reason or "Failed", progress.message
    if phase == Phase.SUSPENDED:
        return False, "Suspended", "spec.suspend is true"
    return False, phase, progress.message or f"the scheduler is {phase}"


def status_from_progress(
    progress: Progress,
    now: float,
    *,
    observed_generation: int | None = None,
    existing: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The status merge-patch for ``progress`` (``None`` values delete stale fields).

    ``existing`` is the status as the API server has it: the operator's own conditions are
    kept, and condition times survive rewrites that do not flip them.
    """
    data = progress.to_dict()
    data["history"] = data["history"][-STATUS_HISTORY:]
    existing = existing or {}
    conditions: list[dict[str, Any]] = [
        dict(c) for c in existing.get("conditions", ()) if c.get("type") in (SPEC_VALID, PODS_READY)
    ]
    for c in progress.conditions:
        conditions = set_condition(
            conditions, condition(c.type, c.status == "True", c.reason, c.message, c.time)
        )
    ready, reason, message = _ready(progress)
    conditions = set_condition(
        [*conditions, *[c for c in existing.get("conditions", ()) if c.get("type") == READY]],
        condition(READY, ready, reason, message, now, generation=observed_generation),
    )
    current = _step(data["current"])
    if current is not None and progress.current_started:
        current["startedAt"] = rfc3339(progress.current_started)
    last = progress.last_pass
    # A merge-patch merges maps key by key: a metric the last pass left undefined must be
    # sent as null, or the previous pass's value would stay under the new pass's examples.
    metrics: dict[str, str | None] | None = (
        None
        if last is None
        else {k: _decimal(k, last.metrics[k]) if k in last.metrics else None for k in SHOWN_METRICS}
    )
    out: dict[str, Any] = {
        "phase": progress.phase,
        "generation": progress.generation,
        "current": current,
        "lastCompleted": _step(data["lastCompleted"]),
        "lastCheckpoint": _step(data["lastCheckpoint"]),
        "lastExport": _step(data["lastExport"]),
        "metrics": metrics,
        "message": progress.message,
        "conditions": conditions,
        "scheduler": data,
    }
    if observed_generation is not None:
        out["observedGeneration"] = observed_generation
    return out


def progress_from_status(status: Mapping[str, Any] | None) -> Progress | None:
    """What an operator restart resumes from (``None``: the job never ran)."""
    if not status or not status.get("scheduler"):
        return None
    return Progress.from_dict(dict(status["scheduler"]))


def invalid_spec(
    message: str, field: str, now: float, generation: int | None, existing: Mapping[str, Any]
) -> dict[str, Any]:
    """Status patch for a spec the operator cannot run: the condition names the field.
    The phase is Failed until the user fixes the spec (an update re-parses it)."""
    cond = condition(
        SPEC_VALID, False, "InvalidSpec", f"{field}: {message}", now, generation=generation
    )
    conditions = set_condition(existing.get("conditions", ()), cond)
    return {
        "phase": Phase.FAILED,
        "message": f"invalid spec: {message}",
        "conditions": conditions,
        "observedGeneration": generation,
    }


def valid_spec(now: float, generation: int | None, existing: Mapping[str, Any]) -> dict[str, Any]:
    """Status patch after a spec parsed: SpecValid true; a job that never ran is Pending."""
    cond = condition(SPEC_VALID, True, "Parsed", "the spec is valid", now, generation=generation)
    out: dict[str, Any] = {
        "conditions": set_condition(existing.get("conditions", ()), cond),
        "observedGeneration": generation,
    }
    if not existing.get("phase") or (
        existing.get("phase") == Phase.FAILED and not existing.get("scheduler")
    ):
        out["phase"] = Phase.PENDING
        out["message"] = ""
    return out


def pods_ready(
    ready: bool, reason: str, message: str, now: float, existing: Mapping[str, Any]
) -> dict[str, Any]:
    cond = condition(PODS_READY, ready, reason, message, now)
    return {"conditions": set_condition(existing.get("conditions", ()), cond)}


def phase_patch(
    phase: str, message: str, now: float, existing: Mapping[str, Any]
) -> dict[str, Any]:
    """A phase set by the operator outside a scheduler run (Suspended, Succeeded)."""
    progress = progress_from_status(existing)
    if progress is not None:
        return status_from_progress(
            replace(progress, phase=phase, message=message), now, existing=existing
        )
    return {"phase": phase, "message": message}


class StatusStore:
    """``StateStore`` in the custom resource's status (one merge-patch per save).

    ``load`` returns what the status held when the daemon started; ``save`` patches the
    status and remembers the result, so conditions and times stay consistent between saves.
    """

    def __init__(
        self,
        patch: Patch,
        status: Mapping[str, Any] | None,
        clock: Callable[[], float],
        observed_generation: int | None = None,
    ) -> None:
        self._patch = patch
        self._status: dict[str, Any] = dict(status or {})
        self._clock = clock
        self._observed = observed_generation
        self._last: Progress | None = progress_from_status(self._status)
        self.saves = 0

    @property
    def status(self) -> Mapping[str, Any]:
        return self._status

    def load(self) -> Progress | None:
        return progress_from_status(self._status)

    def save(self, progress: Progress) -> None:
        if progress == self._last:
            return
        body = status_from_progress(
            progress, self._clock(), observed_generation=self._observed, existing=self._status
        )
        self._patch(body)
        self._status.update(body)
        self._last = progress
        self.saves += 1

    def patch(self, body: Mapping[str, Any]) -> None:
        """An operator-side status change (conditions, phase) through the same channel."""
        self._patch(dict(body))
        self._status.update(body)
