"""The process heap's share of a shard's memory (glibc ``malloc_trim``; a no-op elsewhere).

A push allocates short-lived scratch in proportion to its keys (the merge of duplicates:
~100 B per key of a request). glibc serves large allocations with their own mappings,
returned at ``free``, and smaller ones from per-thread arenas, which keep freed pages
resident; its mmap threshold *adapts upwards* after large frees (up to 32 MB). In a shard
server whose 16 threads handle 65,536-key requests, every thread's scratch therefore stays
resident in its arena: this is the shard process's RSS above its table (docs/benchmarks.md,
issue 12). Fixing the threshold at 256 KiB removes it (2M keys over gRPC: 83-89 -> 42-53
B/key) but makes RPCs ~3x slower (every request's arrays freshly mapped and faulted in), so
it is not done; reusing per-thread scratch across requests would be the fix.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
from collections.abc import Callable


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    """glibc's ``malloc_trim``, looked up once: ``find_library`` runs a subprocess
    (``ldconfig``), ~6 ms a call, which a capped shard trimming near its limit paid on
    every trim (measured in a profile of its pulls). None where there is no such call."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        trim: Callable[[int], int] = libc.malloc_trim
    except (OSError, AttributeError):
        return None
    return trim


def release_scratch_memory() -> None:
    """Give freed heap pages back to the OS (glibc ``malloc_trim``; a no-op elsewhere).

    A bulk push of a million keys allocates ~100 MB of short-lived scratch (the merge of
    duplicates); glibc keeps much of it mapped after ``free``, where it would count as
    resident memory of the table until reused. Called after such pushes only.
    """
    trim = _malloc_trim()
    if trim is not None:
        trim(0)
