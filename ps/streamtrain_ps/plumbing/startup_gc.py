"""A server process's imports with the cyclic garbage collector paused, then frozen.

Importing torch, numba and gRPC creates some 300,000 objects that live as long as the
process. The collector, counting allocations, runs over and over while they are created
and finds nothing to free: the worker's imports took 1.42-1.50 s with it and 1.15-1.24 s
without (``python -X importtime`` shows it as seconds spent in small modules that happen to
trigger a collection). Its imports are the longest part of a job's start-up, which a
streaming job pays at every launch and after every worker restart.

``gc.freeze`` then moves those objects to a generation the collector never visits: a full
collection afterwards took 0 ms instead of 90-150 ms, a pause a training step would
otherwise meet now and then. Only objects of the start-up are frozen; everything created
later is collected as usual.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def collector_paused() -> Iterator[None]:
    """Run the block (the process's imports) without cyclic collections; freeze what it
    created and turn the collector back on when it ends, also after an error."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()
        if was_enabled:
            gc.enable()
