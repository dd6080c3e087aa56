"""Test-only pause points of the driver (``STREAMTRAIN_PAUSE``): see :class:`PauseHook`."""

from __future__ import annotations

import asyncio
import logging
import os
from dataclasses import dataclass

from streamtrain_operator.plan import StepKind
from streamtrain_operator.scheduler import Action, RunPass, Save, Shrink

log = logging.getLogger(__name__)


@dataclass
class PauseHook:
    """Test-only: hold the driver at one step so a fault can be injected exactly there.

    ``STREAMTRAIN_PAUSE=<before|after>:<step>[@<pass>]`` (``step``: train, delta, checkpoint,
    shrink, base, batch; ``pass``: its index in the day, any if omitted) with
    ``STREAMTRAIN_PAUSE_FILE=<path>``: at the first non-replay action of that step, ``before``
    it runs (its "started" record is already saved) or ``after`` it ran (its outcome not yet
    recorded: the widest crash window), the driver writes ``path`` with what it holds at and
    waits until the file is removed. The fault-injection suite (``tests/faults``) uses it to
    SIGKILL ``streamtrain run`` mid-shrink or mid-export, which is otherwise a race against a
    step of milliseconds. Unset (always, outside tests): a no-op.
    """

    when: str = ""
    step: str = ""
    pass_index: int | None = None
    path: str = ""
    #: Holds once per process: a released run goes on normally.
    fired: bool = False

    @classmethod
    def from_env(cls) -> PauseHook:
        where = os.environ.get("STREAMTRAIN_PAUSE", "")
        path = os.environ.get("STREAMTRAIN_PAUSE_FILE", "")
        if not where or not path:
            return cls()
        when, _, rest = where.partition(":")
        step, _, index = rest.partition("@")
        if (
            when not in ("before", "after")
            or step not in {k.value for k in StepKind}
            or (index and not index.isdigit())
        ):
            raise ValueError(f"STREAMTRAIN_PAUSE={where!r}: expected before|after:<step>[@<pass>]")
        return cls(when, step, int(index) if index else None, path)

    async def at(self, when: str, action: Action) -> None:
        if when != self.when or self.fired or not isinstance(action, RunPass | Save | Shrink):
            return
        key = action.key
        if action.replay or key.kind.value != self.step:
            return
        if self.pass_index is not None and key.pass_index != self.pass_index:
            return
        self.fired = True
        with open(self.path, "w") as f:
            f.write(f"{when} {key.kind.value} {key.day}/{key.pass_index}\n")
        log.warning("paused %s %s (remove %s to go on)", when, key, self.path)
        while os.path.exists(self.path):
            await asyncio.sleep(0.05)  # test-only hold, released by the test
