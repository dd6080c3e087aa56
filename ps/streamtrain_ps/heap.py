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
