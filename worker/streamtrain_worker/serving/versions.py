"""A delivered model version, the delivery state kept beside the rows, and the guard.

Pure (no torch, no storage): the tables store these records as JSON, the delivery and the
server read them. A version's id is the 1-based number of its donefile line, so a resumed
delivery rebuilds a half-written version under the same id and nothing is counted twice.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass(frozen=True)
class Version:
    """One model as delivered: the donefile line it came from and what the guard said."""

    id: int  # the donefile line number (1-based)
    key: str  # model key, e.g. "20261101/delta-3"
    chain: tuple[str, ...]  # base and deltas applied, oldest first
    published_at: float  # the donefile line's publishedAt
    delivered_at: float
    metrics: dict[str, float]
    keys: int  # rows in the table of this version
    accepted: bool
    refusal: str = ""  # why the guard refused it (accepted: empty)
    #: Keys whose rows are not finite in this version (a later delta may repair them).
    nonfinite: tuple[int, ...] = field(default=())

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str | bytes) -> Version:
        d = json.loads(text)
        d["chain"] = tuple(d["chain"])
        d["nonfinite"] = tuple(d["nonfinite"])
        return cls(**d)


@dataclass(frozen=True)
class DeliveryState:
    """Where the delivery is and what is served.

    ``head`` is the last version built (accepted or not: the next delta applies to it),
    ``live`` the newest accepted one, ``pinned`` an operator's choice (served instead of
    ``live`` while set), ``history`` the accepted versions still stored, oldest first.
    """

    cursor: int = 0  # donefile lines consumed
    head: Version | None = None
    live: int = 0
    pinned: int = 0
    history: tuple[Version, ...] = ()
    refused: int = 0

    @property
    def served(self) -> int:
        """The version requests are scored with (0: none yet)."""
        return self.pinned or self.live

    def version(self, vid: int) -> Version | None:
        for v in self.history:
            if v.id == vid:
                return v
        return self.head if self.head is not None and self.head.id == vid else None

    def previous(self) -> Version | None:
        """The accepted version before the served one (what ``rollback`` serves)."""
        older = [v for v in self.history if v.id < self.served]
        return older[-1] if older else None

    def kept(self) -> set[int]:
        """Versions whose rows must stay: head, served, live, and the one before served."""
        keep = {self.live, self.pinned}
        if self.head is not None:
            keep.add(self.head.id)
        prev = self.previous()
        if prev is not None:
            keep.add(prev.id)
        keep.discard(0)
        return keep


class GuardError(ValueError):
    """A guard setting is invalid (the message names it)."""


@dataclass(frozen=True)
class Guard:
    """When a built model may go live: finite rows and weights (always checked) and its own
    pass metrics against the user's thresholds; ``None`` turns a check off."""

    #: Refuse when the model's AUC is lower than the live model's by more than this.
    max_auc_drop: float | None = 0.05
    copc_min: float | None = None
    copc_max: float | None = None

    def __post_init__(self) -> None:
        for name in ("max_auc_drop", "copc_min", "copc_max"):
            value = getattr(self, name)
            if value is not None and (not math.isfinite(value) or value < 0):
                raise GuardError(f"{name}: must be a finite number >= 0, got {value!r}")
        if (
            self.copc_min is not None
            and self.copc_max is not None
            and self.copc_min > self.copc_max
        ):
            raise GuardError(f"copc_min {self.copc_min} > copc_max {self.copc_max}")

    def judge(
        self,
        metrics: Mapping[str, float],
        live: Version | None,
        nonfinite_rows: int,
        finite_weights: bool,
    ) -> str:
        """Why the model must not go live ("": it may). A metric a pass did not define
        (no example, one class) is not judged."""
        if not finite_weights:
            return "dense weights are not finite"
        if nonfinite_rows:
            return f"{nonfinite_rows} sparse rows are not finite"
        auc = metrics.get("auc")
        if self.max_auc_drop is not None and auc is not None and live is not None:
            live_auc = live.metrics.get("auc")
            if live_auc is not None and live_auc - auc > self.max_auc_drop:
                return (
                    f"auc {auc:.4f} is {live_auc - auc:.4f} below the live model's "
                    f"{live_auc:.4f} (max_auc_drop {self.max_auc_drop})"
                )
        copc = metrics.get("copc")
        if copc is not None:
            if self.copc_min is not None and copc < self.copc_min:
                return f"copc {copc:.4f} < copc_min {self.copc_min}"
            if self.copc_max is not None and copc > self.copc_max:
                return f"copc {copc:.4f} > copc_max {self.copc_max}"
        return ""


def state_fields(state: DeliveryState) -> dict[str, str]:
    """The state as string fields (a Redis hash, or a dict for the embedded table)."""
    return {
        "cursor": str(state.cursor),
        "head": state.head.to_json() if state.head is not None else "",
        "live": str(state.live),
        "pinned": str(state.pinned),
        "history": json.dumps([json.loads(v.to_json()) for v in state.history]),
        "refused": str(state.refused),
    }


def state_from_fields(fields: Mapping[str, Any]) -> DeliveryState:
    """Inverse of ``state_fields`` (missing fields: a fresh table)."""

    def text(name: str) -> str:
        value = fields.get(name, "")
        return value.decode() if isinstance(value, bytes) else str(value)

    history = text("history")
    return DeliveryState(
        cursor=int(text("cursor") or 0),
        head=Version.from_json(text("head")) if text("head") else None,
        live=int(text("live") or 0),
        pinned=int(text("pinned") or 0),
        history=tuple(Version.from_json(json.dumps(v)) for v in json.loads(history))
        if history
        else (),
        refused=int(text("refused") or 0),
    )
