"""Load the worker's numba kernels from their cache before the first pass needs them.

A numba function is compiled — or, with ``cache=True``, loaded from its on-disk cache — at
its first call, in the calling thread: 0.3-0.8 s for the parse kernel and the key dedup
on this code, and the first call is the first batch of the first pass, where it delays
training (``make bench-e2e``: the first pass's first batch took 0.75 s, the others 10-20
ms). ``start_warm_up`` does those first calls on a blank line and three keys in a daemon
thread, started once the worker has built its trainer (the scheduler's first call; at a
job's start the genesis checkpoint follows, which keeps the PS, not the worker, busy):
started earlier it slowed the server start and the trainer build, which hold the GIL as
the cache load does. A pass that begins before it finished waits on numba's own compile
lock for the same load, never loads twice.

Nothing here touches the model, the PS or any data file, so it cannot change what is
learned.
"""

from __future__ import annotations

import logging
import threading

import numpy as np

from streamtrain_ps.client.dedup import unique_inverse
from streamtrain_worker.data.config import DataConfig
from streamtrain_worker.data.formats import make_format

log = logging.getLogger(__name__)


def warm_kernels(config: DataConfig) -> None:
    """Call the format's parse kernel and the key dedup once on tiny inputs.

    Formats whose parser depends on a file's header (csv with ``header: true``) cannot
    build one without a file; their kernel is loaded by the first file as before.
    """
    unique_inverse(np.array([3, 1, 3], dtype=np.uint64))
    fmt = make_format(config)
    if not fmt.has_header:
        fmt.for_file("", None).parse(np.frombuffer(b"\n", dtype=np.uint8), 1)


def start_warm_up(config: DataConfig) -> threading.Thread:
    """``warm_kernels`` in a daemon thread; a failure is logged (the first pass then loads
    the kernels itself and reports any real error with its file)."""

    def run() -> None:
        try:
            warm_kernels(config)
        except Exception:
            log.warning("warming the parse and dedup kernels failed", exc_info=True)

    thread = threading.Thread(target=run, name="warm-up", daemon=True)
    thread.start()
    return thread
