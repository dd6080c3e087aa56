"""The process heap's share of a shard's memory (glibc ``malloc_trim``; a no-op elsewhere).

A bulk request allocates short-lived scratch in proportion to its keys (the message, its
decoded arrays, the merge of duplicates: a few hundred bytes per key). glibc serves large
allocations with their own mappings, returned at ``free``, and smaller ones from per-thread
arenas, which keep freed pages resident; its mmap threshold *adapts upwards* after large
frees (up to 32 MB). In a shard server whose 16 threads each handled a million-key request,
every thread's arena keeps that request's scratch resident: measured, 4M keys grown over
gRPC in 1M-key pushes held 81 B/key of RSS against 42 B/key of table, 52 B/key after one
``malloc_trim`` (docs/benchmarks.md, issue 12). Fixing the threshold low instead makes every
RPC ~3x slower (each request's arrays freshly mapped and faulted in), so the heap is trimmed
after bulk requests only, once the request's buffers are gone: the request's code notes its
scratch (``note_request_scratch``) and ``ScratchReleasingExecutor`` trims after the RPCs
have returned.

The other side of the same trade is ``reuse_large_buffers``: a process that moves the same
large messages every batch (a worker, a shard without a memory limit) keeps freed memory
for the next message instead of faulting it in afresh; these trims still release it.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import threading
import time
from collections.abc import Callable
from concurrent import futures
from typing import Any, ParamSpec, TypeVar

P = ParamSpec("P")
R = TypeVar("R")

_request = threading.local()

#: An in-process request at least this large (a bulk load) trims the heap when it ends.
BULK_REQUEST_KEYS = 500_000
#: Keys of request scratch after which a server's pool trims the heap (~300 B each).
RELEASE_AFTER_KEYS = 262_144
#: Longest a server waits between trims (seconds) once one is due.
MAX_RELEASE_DELAY = 1.0


@functools.cache
def _libc() -> ctypes.CDLL | None:
    """The C library, looked up once: ``find_library`` runs a subprocess (``ldconfig``),
    ~6 ms a call, which a capped shard trimming near its limit paid on every trim (measured
    in a profile of its pulls). None where there is none to load."""
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    except OSError:
        return None


def _malloc_trim() -> Callable[[int], int] | None:
    """glibc's ``malloc_trim``; None where there is no such call."""
    trim: Callable[[int], int] | None = getattr(_libc(), "malloc_trim", None)
    return trim


#: ``mallopt`` parameters (glibc's malloc.h).
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
#: Allocations below this come from the heap, whose freed memory is reused (glibc's own
#: adaptive threshold stops here too).
REUSED_ALLOCATION_BYTES = 32 << 20
#: Free memory at the top of a heap kept for reuse instead of given back at once.
KEPT_FREE_BYTES = 64 << 20


def reuse_large_buffers() -> bool:
    """Serve allocations up to ``REUSED_ALLOCATION_BYTES`` from the heap and keep up to
    ``KEPT_FREE_BYTES`` of freed memory for the next one (glibc ``mallopt``); False where
    that is not possible.

    For a process that moves the same large messages again and again — a worker sends a
    1.4-1.6 MB dense gradient every batch and receives the dense parameters every sync —
    glibc's defaults cost more than the copies themselves: such a buffer is mapped fresh
    and unmapped at ``free``, or served from a heap top that is trimmed as soon as a few of
    them are freed together, so each copy into it faults its ~400 pages in again. Measured
    (a worker against a shard process on 127.0.0.1): the client's CPU for one push with a
    1.38 MB dense gradient 4.4-4.7 -> 1.6-1.7 ms, for one dense pull 5.3-5.8 -> 1.6-1.9 ms.
    A shard without a memory limit calls it too (its part of each batch: receiving the
    gradient, sending the parameters); a capped shard does not, as its limit relies on
    freed request scratch leaving the process (module docstring).
    """
    libc = _libc()
    mallopt = getattr(libc, "mallopt", None)
    if mallopt is None:
        return False
    return bool(
        mallopt(_M_MMAP_THRESHOLD, REUSED_ALLOCATION_BYTES)
        and mallopt(_M_TRIM_THRESHOLD, KEPT_FREE_BYTES)
    )


def release_scratch_memory() -> None:
    """Give freed heap pages back to the OS (glibc ``malloc_trim``; a no-op elsewhere).

    Requests leave freed scratch in glibc's heaps (module docstring), where it counts as
    resident memory until reused. Called after bulk requests (``note_request_scratch``,
    ``ScratchReleasingExecutor``), near a capped shard's limit and after loads.
    """
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


def note_request_scratch(keys: int) -> None:
    """Record that the current request allocated scratch for ``keys`` keys.

    On a ``ScratchReleasingExecutor`` thread (a gRPC server's request) the pool trims the
    heap later, once enough such scratch was freed and no request holds buffers; anywhere
    else (an in-process shard) a bulk request (``BULK_REQUEST_KEYS`` or more) trims now.
    """
    pool = getattr(_request, "pool", None)
    if pool is not None:
        pool.note_scratch(keys)
    elif keys >= BULK_REQUEST_KEYS:
        release_scratch_memory()


class ScratchReleasingExecutor(futures.ThreadPoolExecutor):
    """The gRPC server's pool (a task is one RPC), trimming the heap after requests.

    A client splits a bulk push into requests (``config.REQUEST_KEYS``) sent at once, so all the
    server's threads hold a request's scratch in their own arenas at the same time. The
    trim waits until those requests have returned (their messages and arrays freed): when
    the pool is idle with at least ``release_after_keys`` keys of scratch noted since the
    last trim, or at any moment once four times that is noted (a server never idle). A trim
    takes a few milliseconds (5 ms median at 4M keys, up to 25 ms), so trims are spaced to
    take at most ``max_share`` of the time, at most ``MAX_RELEASE_DELAY`` apart: a pod's
    memory settles within a second of a bulk load, and steady training pays ~1 % of one
    thread. The trims run on a thread of their own, never inside an RPC.
    """

    def __init__(
        self,
        *args: Any,
        release_after_keys: int = RELEASE_AFTER_KEYS,
        max_share: float = 0.01,
        release: Callable[[], None] = release_scratch_memory,
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        self._release = release
        self._release_after = release_after_keys
        self._max_share = max_share
        self._cond = threading.Condition()
        self._active = 0
        self._noted = 0
        self._closed = False
        self._not_before = 0.0
        self.releases = 0
        self._releaser = threading.Thread(
            target=self._release_loop, name="heap-release", daemon=True
        )
        self._releaser.start()

    def submit(self, fn: Callable[P, R], /, *args: P.args, **kwargs: P.kwargs) -> futures.Future[R]:
        return super().submit(self._run, functools.partial(fn, *args, **kwargs))

    def note_scratch(self, keys: int) -> None:
        with self._cond:
            self._noted += keys
            if self._due():
                self._cond.notify()

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify()
        super().shutdown(wait, cancel_futures=cancel_futures)

    def _run(self, call: Callable[[], R]) -> R:
        with self._cond:
            self._active += 1
        _request.pool = self
        try:
            return call()
        finally:
            _request.pool = None
            with self._cond:
                self._active -= 1
                if self._due():
                    self._cond.notify()

    def _due(self) -> bool:
        return self._noted >= self._release_after and (
            self._active == 0 or self._noted >= 4 * self._release_after
        )

    def _release_loop(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._closed or self._due())
                if self._closed:
                    return
                wait = self._not_before - time.monotonic()
                if wait <= 0:
                    self._noted = 0
            if wait > 0:
                time.sleep(wait)  # then look again: a request may have started meanwhile
                continue
            start = time.monotonic()
            self._release()
            took = time.monotonic() - start
            self.releases += 1
            self._not_before = time.monotonic() + min(took / self._max_share, MAX_RELEASE_DELAY)
