"""Step hooks: the points where a run can be held, for whoever injects a hook.

The driver calls its hook ``before`` and ``after`` every step it performs for the first time
(a replayed step is not offered), and ``publish_model`` calls it at ``parts``: inside the
publication of a model, after its sparse parts are written and before its dense part,
``MODEL.json`` and donefile line are — a half-written model — and at ``manifest``, after
``MODEL.json`` and before the donefile line (the end of a publication, which the driver
runs beside the next pass). A hook that waits there lets a caller act at an exact step (the
fault-injection tests SIGKILL the process mid-export or mid-shrink, which is otherwise a
race against a step of milliseconds). The product never builds a hook of its own: the
default does nothing; a test passes one in through ``Driver(step_hook=...)``,
``export.StorageSteps(hook=...)``, local mode's ``RunOptions`` or the operator's ``Runtime``.
"""

from __future__ import annotations

from typing import Protocol

from streamtrain_operator.job.plan import StepKey

#: Before a step runs (its "started" record is already saved).
BEFORE = "before"
#: After a step ran, before its outcome is recorded (the widest crash window).
AFTER = "after"
#: Inside ``export.publish_model``: sparse parts written, the rest not.
PARTS = "parts"
#: Inside ``export.publish_model``: every part and ``MODEL.json`` written, the donefile line
#: not — in the publication the driver runs while the next pass trains.
MANIFEST_POINT = "manifest"
POINTS = (BEFORE, AFTER, PARTS, MANIFEST_POINT)


class StepHook(Protocol):
    """Called at each hold point; returning lets the run go on."""

    async def hold(self, point: str, key: StepKey) -> None: ...


class NoHook:
    """The default: never holds."""

    async def hold(self, point: str, key: StepKey) -> None:
        return None


NO_HOOK: StepHook = NoHook()
