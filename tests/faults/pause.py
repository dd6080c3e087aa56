"""The fault tests' step hook: hold a run at one step, set from ``STREAMTRAIN_PAUSE``.

The product takes any :class:`~streamtrain_operator.run.hooks.StepHook`; the test entry
points (``faults.run_cli``, ``faults.operator_main``) build this one from the environment
their test gave the subprocess and inject it."""

from __future__ import annotations

import asyncio
import logging
import os
from dataclasses import dataclass

from streamtrain_operator.job.plan import StepKey, StepKind
from streamtrain_operator.run.hooks import MANIFEST_POINT, PARTS, POINTS

log = logging.getLogger(__name__)

MODEL_STEPS = (StepKind.DELTA.value, StepKind.BASE.value, StepKind.BATCH.value)


@dataclass
class PauseHook:
    """Hold the run at one step so a fault can be injected exactly there.

    ``STREAMTRAIN_PAUSE=<before|after|parts>:<step>[@<pass>]`` (``step``: train, delta,
    checkpoint, shrink, base, batch; ``pass``: its index in the day, any if omitted) with
    ``STREAMTRAIN_PAUSE_FILE=<path>``: at the first non-replay action of that step, ``before``
    it runs (its "started" record is already saved) or ``after`` it ran (its outcome not yet
    recorded: the widest crash window), the driver writes ``path`` with what it holds at and
    waits until the file is removed. ``parts`` (delta, base, batch only) holds *inside* the
    publication of that model (``export.publish_model``): its sparse parts are written, its
    dense part, ``MODEL.json`` and donefile line are not — a half-written model.
    ``manifest`` holds after its ``MODEL.json``, before its donefile line: in the end of the
    publication that runs beside the next pass. The
    fault-injection suite (``tests/faults``) uses it to SIGKILL ``streamtrain run`` mid-shrink
    or mid-export, which is otherwise a race against a step of milliseconds. Unset: a no-op.
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
            when not in POINTS
            or step not in {k.value for k in StepKind}
            or (when in (PARTS, MANIFEST_POINT) and step not in MODEL_STEPS)
            or (index and not index.isdigit())
        ):
            raise ValueError(
                f"STREAMTRAIN_PAUSE={where!r}: expected before|after:<step>[@<pass>] "
                f"or parts:<{'|'.join(MODEL_STEPS)}>[@<pass>] (or manifest:, the same)"
            )
        return cls(when, step, int(index) if index else None, path)

    async def hold(self, when: str, key: StepKey) -> None:
        """Hold here if ``when`` and ``key`` match the configured point (once per hook)."""
        if when != self.when or self.fired or key.kind.value != self.step:
            return
        if self.pass_index is not None and key.pass_index != self.pass_index:
            return
        self.fired = True
        with open(self.path, "w") as f:
            f.write(f"{when} {key.kind.value} {key.day}/{key.pass_index}\n")
        log.warning("paused %s %s (remove %s to go on)", when, key, self.path)
        while os.path.exists(self.path):
            await asyncio.sleep(0.05)  # held until the test removes the file
