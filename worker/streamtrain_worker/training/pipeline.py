"""Overlap of PS traffic with compute: a prefetch thread ahead, a push thread behind, a
dense refresh beside.

- ``Prefetcher`` runs a function (read + parse + dedup + pull) over an iterator in one
  background thread, at most ``depth`` results ahead of the consumer, so the next batch's
  pull happens while the current batch computes.
- ``AsyncPusher`` hands submitted items (a batch's sparse and dense gradients) in order to a
  handler in one background thread through a bounded queue: training blocks only when
  ``depth`` pushes are waiting; items that queued up while the handler was busy arrive
  together, so it can merge them. ``flush`` waits until every submitted item is handled, so
  a pass result reflects every push; ``between_items`` holds it between two items and
  says how many were handled, so a reader of the PS knows which of them it sees.
- ``SingleFlight`` runs one call (the dense pull) at a time in a background thread; the
  caller collects the result at a moment of its choosing (a batch boundary).

All three surface a background failure in the caller's thread (at the next ``next``/
``submit``/``flush``/``take``) instead of dying silently; their threads end when closed.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from typing import Generic, TypeVar

T = TypeVar("T")
R = TypeVar("R")

_END = object()


class _Failure:
    def __init__(self, error: BaseException) -> None:
        self.error = error


class Prefetcher(Generic[T, R], Iterator[R]):
    """Iterate ``fn(item)`` for ``item`` in ``items``, computed ``depth`` ahead in a thread."""

    def __init__(self, items: Iterable[T], fn: Callable[[T], R], depth: int) -> None:
        if depth < 1:
            raise ValueError(f"depth must be >= 1, got {depth}")
        self._queue: queue.Queue[object] = queue.Queue(maxsize=depth)
        self._stop = threading.Event()
        self._done = False
        self._thread = threading.Thread(
            target=self._run, args=(iter(items), fn), name="prefetch", daemon=True
        )
        self._thread.start()

    def _put(self, value: object) -> bool:
        while not self._stop.is_set():
            try:
                self._queue.put(value, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def _run(self, items: Iterator[T], fn: Callable[[T], R]) -> None:
        try:
            for item in items:
                if not self._put(fn(item)):
                    return
            self._put(_END)
        except BaseException as exc:  # re-raised in the consumer's thread
            self._put(_Failure(exc))

    def __next__(self) -> R:
        if self._done:
            raise StopIteration
        value = self._queue.get()
        if value is _END:
            self._done = True
            raise StopIteration
        if isinstance(value, _Failure):
            self._done = True
            raise value.error
        return value  # type: ignore[return-value]

    def close(self) -> None:
        """Stop the producer (it may be blocked on a full queue) and wait for it."""
        self._stop.set()
        self._done = True
        while True:  # unblock a producer waiting on put
            try:
                self._queue.get_nowait()
            except queue.Empty:
                break
        self._thread.join()

    def __enter__(self) -> Prefetcher[T, R]:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class AsyncPusher(Generic[T]):
    """Hand submitted items, in order, to ``handle`` in one background thread.

    At most ``depth`` items wait in the queue (``submit`` blocks beyond that: back-pressure
    instead of unbounded memory). When the consumer falls behind, it takes every waiting
    item — up to ``max_merge`` — in one ``handle`` call, so the handler can merge them
    (as Paddle's async communicator merges queued gradients of one variable).
    """

    def __init__(self, handle: Callable[[list[T]], None], depth: int, max_merge: int = 1) -> None:
        if depth < 1 or max_merge < 1:
            raise ValueError(f"depth and max_merge must be >= 1, got {depth}, {max_merge}")
        self._handle = handle
        self._max_merge = max_merge
        self._queue: queue.Queue[object] = queue.Queue(maxsize=depth)
        self._lock = threading.Lock()
        self._error: BaseException | None = None
        #: Items handled (also when dropped after a failure), in submission order; held
        #: while an item is handled (``between_items``).
        self._handled = 0
        self._handling = threading.Lock()
        self._submitted = 0
        self._thread = threading.Thread(target=self._run, name="push", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while True:
            items = [self._queue.get()]
            while len(items) < self._max_merge and items[-1] is not _END:
                try:
                    items.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            stop = items[-1] is _END
            work = [i for i in items if i is not _END]
            self._handling.acquire()
            try:
                with self._lock:
                    failed = self._error is not None
                if work and not failed:  # after a failure, drop the rest: the pass fails
                    self._handle(work)  # type: ignore[arg-type]
            except BaseException as exc:
                with self._lock:
                    self._error = exc
            finally:
                self._handled += len(work)
                self._handling.release()
                for _ in items:
                    self._queue.task_done()
            if stop:
                return

    def _raise_if_failed(self) -> None:
        with self._lock:
            error, self._error = self._error, None
        if error is not None:
            raise error

    def submit(self, item: T) -> int:
        """Queue ``item``; blocks while ``depth`` items wait; raises an earlier failure.
        Returns how many items were submitted with this one (its sequence number)."""
        self._raise_if_failed()
        self._queue.put(item)
        self._submitted += 1
        return self._submitted

    @property
    def submitted(self) -> int:
        """How many items were submitted so far."""
        return self._submitted

    @contextmanager
    def between_items(self) -> Iterator[int]:
        """Hold the push thread between two items (waiting for the one in hand) and yield
        how many were handled: the first that many, and no later one, have taken effect
        (or were dropped after a failure, which ``flush`` and ``submit`` raise)."""
        with self._handling:
            yield self._handled

    def flush(self) -> None:
        """Wait until every submitted item was handled; raise the first failure among them."""
        self._queue.join()
        self._raise_if_failed()

    def close(self) -> None:
        self._queue.put(_END)
        self._thread.join()


class SingleFlight(Generic[T]):
    """At most one call of ``fn`` in flight, in one background thread.

    ``start`` submits a call unless one is in flight; ``take`` returns the finished call's
    result (raising its error) or None while it runs, or waits for it with ``wait``.
    """

    def __init__(self, fn: Callable[[], T], name: str) -> None:
        self._fn = fn
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix=name)
        self._future: Future[T] | None = None

    def start(self) -> None:
        if self._future is None:
            self._future = self._pool.submit(self._fn)

    def take(self, wait: bool = False) -> T | None:
        future = self._future
        if future is None or (not wait and not future.done()):
            return None
        self._future = None
        return future.result()

    def discard(self) -> None:
        """Wait for a call in flight and drop its result or error (a failing pass's)."""
        future, self._future = self._future, None
        if future is not None:
            future.exception()

    def close(self) -> None:
        self.discard()
        self._pool.shutdown(wait=True)
