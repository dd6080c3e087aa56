"""Before every reload: wait until no worker still runs a pass of an earlier generation.

A worker finishes what it started: cancelling the ``RunPass`` call (a ``passTimeoutSeconds``
timeout, a driver cancelled after a PS restart, an operator pod that was lost) does not stop
it, and it keeps pulling and pushing until its share is done. Those pushes, landing after
the checkpoint was loaded, would count that part of the pass twice once it is redone.
``Reset`` with the driver's (newer) generation makes the worker cancel such a pass at its
next batch boundary, flush its pushes, and only then answer, so once every worker has
answered, nothing old can push any more. A worker busy with something else (an export)
answers "busy" and is asked again, bounded by ``passTimeoutSeconds`` (unbounded without it,
like the pass itself); a worker that does not answer at all (its pod is being restarted,
with the kubelet's back-off) is asked again for up to ``RESTART_WAIT_SECONDS``.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Protocol

from streamtrain_operator.run import worker_errors

log = logging.getLogger(__name__)

#: Seconds between two ``Reset`` calls to a worker still busy with an earlier pass.
IDLE_POLL_SECONDS = 0.5
#: How long a reload waits for a worker that does not answer (a pod being restarted: the
#: kubelet's back-off reaches 5 minutes).
RESTART_WAIT_SECONDS = 600.0


class Resettable(Protocol):
    name: str

    async def reset(self, generation: int) -> None: ...


async def wait_for_idle(
    workers: Sequence[Resettable],
    generation: int,
    limit: float | None,
    sleep: Callable[[float], Awaitable[None]],
) -> None:
    """Reset every worker with ``generation``; ``limit``: ``passTimeoutSeconds``."""
    log.warning(
        "generation %d reloads the checkpoint: resetting the workers first (a pass of an "
        "earlier generation still running is cancelled and its pushes flushed)",
        generation,
    )

    async def idle(worker: Resettable) -> None:
        waited = 0.0
        while True:
            try:
                await worker.reset(generation)
                return
            except Exception as exc:
                busy, down = worker_errors.busy(exc), worker_errors.unavailable(exc)
                if not (busy or down):
                    raise
                if busy and limit is not None and waited >= limit:
                    raise
                if down and waited >= RESTART_WAIT_SECONDS:
                    raise
            if waited == 0.0:
                log.warning(
                    "%s is %s: generation %d waits for it before reloading the checkpoint",
                    worker.name,
                    "busy" if busy else "not answering",
                    generation,
                )
            await sleep(IDLE_POLL_SECONDS)
            waited += IDLE_POLL_SECONDS

    await asyncio.gather(*(idle(w) for w in workers))
