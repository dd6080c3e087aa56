"""Load a shard's numba kernels from their cache while the job's other processes start.

A numba kernel is loaded from its on-disk cache (or compiled) at its first call, in the
calling thread, and the process's first load also builds numba's typing registries: the
first save of a fresh shard took 0.5 s instead of 0.07 s (``make bench-e2e``'s genesis
checkpoint, 0.3 s of the start-up), the first pull and push likewise. A shard is ready
(``listening on``) after ~0.6 s while a worker's torch import takes ~2 s, so
``start_warm_up`` runs every kernel once on scratch tables (``memory_limit.warm_kernels``,
the same exercise a capped shard runs before measuring its budget) in a daemon thread
started once the shard announced itself: the loads happen in that idle time. A call that
comes before it finished waits on numba's compile lock for the same load, never loads
twice. Scratch tables only: nothing of the shard's state is touched.
"""

from __future__ import annotations

import logging
import threading

from streamtrain_ps.config import PSConfig
from streamtrain_ps.memory_limit import warm_kernels

log = logging.getLogger(__name__)


def start_warm_up(config: PSConfig) -> threading.Thread | None:
    """``warm_kernels`` in a daemon thread, or ``None`` for a capped shard (it warmed its
    kernels before measuring its memory budget). A failure is logged: the first call then
    loads its kernel itself and reports any real error."""
    if config.memoryLimit:
        return None

    def run() -> None:
        try:
            warm_kernels(config)
        except Exception:
            log.exception("loading the kernels ahead of the first call failed")

    thread = threading.Thread(target=run, name="kernel-warm-up", daemon=True)
    thread.start()
    return thread
