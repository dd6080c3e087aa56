"""What the pass scheduler (``scheduler.py``) and its driver say to each other: the
actions the state machine asks for next, and the events that answer them.

Plain frozen dataclasses, no behaviour: the driver executes an action and hands back the
event, and the machine (``Scheduler.handle``) checks that the event answers the pending
action. Kept apart from the machine so a reader finds the protocol in one place.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from streamtrain_operator.job.plan import StepKey

# --------------------------------------------------------------------------- actions


@dataclass(frozen=True)
class LoadCheckpoint:
    uri: str


@dataclass(frozen=True)
class ResetWorkers:
    """Workers pull the (reloaded) dense parameters."""


@dataclass(frozen=True)
class CheckData:
    """Are all donefiles of this pass there? Answer with ``DataChecked``."""

    key: StepKey


@dataclass(frozen=True)
class Sleep:
    seconds: float


@dataclass(frozen=True)
class RunPass:
    """RunPass on the workers listed in ``shares`` (all of them unless retrying)."""

    key: StepKey
    shares: tuple[int, ...]
    attempt: int
    generation: int
    replay: bool = False


@dataclass(frozen=True)
class Save:
    """A PS save: ``kind`` delta/base/batch (inference export) or checkpoint.

    ``replay``: only the PS state side effect is wanted (the model is already published);
    the driver saves to a scratch location and deletes it.
    """

    key: StepKey
    uri: str
    generation: int
    replay: bool = False


@dataclass(frozen=True)
class Shrink:
    key: StepKey
    replay: bool = False


@dataclass(frozen=True)
class Terminal:
    """Stop the loop; ``phase`` is Succeeded, Failed, Suspended or Stopped."""

    phase: str
    message: str = ""


Action = LoadCheckpoint | ResetWorkers | CheckData | Sleep | RunPass | Save | Shrink | Terminal

# --------------------------------------------------------------------------- events


@dataclass(frozen=True)
class Done:
    """The action finished (load, reset, sleep, save, shrink); ``info`` is for the record."""

    info: Mapping[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class CheckpointTaken:
    """A checkpoint ``Save`` whose content was taken (a PS snapshot at the pass boundary)
    and whose files are still being written beside the next pass.

    The step is complete (the next pass may train), but the checkpoint is not recorded as
    the one to reload until the driver reports it published (``checkpoint_written``): a
    kill or a failed write in between leaves the previous checkpoint the restore point, and
    the replay from it skips this step like every checkpoint step.
    """


@dataclass(frozen=True)
class DataChecked:
    """``missing``: folders of the pass still without their donefile."""

    missing: tuple[str, ...]


@dataclass(frozen=True)
class PassRan:
    """Outcome of a ``RunPass``: failed shares with their error, or the global metrics.

    ``metrics`` (summed over every share of the pass, retries included) is given once no
    share is failing. ``refused``: the failed shares whose worker provably never started
    them (it refused the call: busy, or a stale generation) — nothing of theirs reached the
    PS, so only they can be retried alone; any other failure may have pushed part of the
    share (a worker error after some batches, a lost connection, a timeout).
    """

    failed: Mapping[int, str]
    metrics: Mapping[str, float] | None = None
    refused: frozenset[int] = frozenset()

    @property
    def may_have_pushed(self) -> bool:
        return any(w not in self.refused for w in self.failed)


@dataclass(frozen=True)
class Failed:
    """The action failed for good (the driver already retried storage errors)."""

    reason: str
    message: str


Event = Done | CheckpointTaken | DataChecked | PassRan | Failed
