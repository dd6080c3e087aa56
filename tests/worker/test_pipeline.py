"""Prefetch and push threads: order, back-pressure, merging, failures surface to the caller."""

from __future__ import annotations

import threading

import pytest

from streamtrain_worker.training.pipeline import AsyncPusher, Prefetcher


def test_prefetcher_preserves_order_and_stays_bounded() -> None:
    produced: list[int] = []
    release = threading.Event()

    def work(i: int) -> int:
        produced.append(i)
        return i * i

    def items():  # type: ignore[no-untyped-def]
        for i in range(10):
            if i == 3:
                assert release.wait(timeout=10)
            yield i

    with Prefetcher(items(), work, depth=2) as it:
        assert next(it) == 0
        release.set()
        assert list(it) == [i * i for i in range(1, 10)]
    assert produced == list(range(10))


def test_prefetcher_raises_the_producers_error_in_the_consumer() -> None:
    def work(i: int) -> int:
        if i == 2:
            raise KeyError("no such table")
        return i

    with Prefetcher(range(5), work, depth=1) as it:
        assert next(it) == 0 and next(it) == 1
        with pytest.raises(KeyError, match="no such table"):
            next(it)
        with pytest.raises(StopIteration):
            next(it)


def test_prefetcher_close_stops_a_blocked_producer() -> None:
    it = Prefetcher(iter(range(1_000_000)), lambda i: i, depth=1)
    assert next(it) == 0
    it.close()  # the producer is blocked on a full queue; close must not hang


def test_pusher_merges_what_queued_up_and_flush_waits_for_all() -> None:
    calls: list[list[int]] = []
    gate = threading.Event()
    started = threading.Event()

    def handle(items: list[int]) -> None:
        started.set()
        assert gate.wait(timeout=10)
        calls.append(items)

    pusher: AsyncPusher[int] = AsyncPusher(handle, depth=8, max_merge=3)
    pusher.submit(0)
    assert started.wait(timeout=10)  # item 0 is being handled; the next ones queue up
    for i in range(1, 6):
        pusher.submit(i)
    gate.set()
    pusher.flush()
    pusher.close()
    assert calls == [[0], [1, 2, 3], [4, 5]]


def test_pusher_failure_surfaces_at_the_next_call() -> None:
    def handle(items: list[int]) -> None:
        raise ConnectionError(f"PS gone while pushing {items}")

    pusher: AsyncPusher[int] = AsyncPusher(handle, depth=2)
    pusher.submit(1)
    with pytest.raises(ConnectionError, match="PS gone"):
        pusher.flush()
    pusher.flush()  # reported once; the pusher is usable again
    pusher.close()


def test_a_reader_can_wait_for_the_first_pushes_to_be_handled() -> None:
    """``submit`` numbers the items; ``wait_handled(n)`` returns once the first ``n`` were
    handled, while later ones may still wait (a dense pull then knows which of this
    worker's pushes the PS holds), and also when they were dropped after a failure."""
    gate = threading.Event()
    handled: list[int] = []

    def handle(items: list[int]) -> None:
        for item in items:
            if item == 3:
                assert gate.wait(timeout=10)
            handled.append(item)

    pusher: AsyncPusher[int] = AsyncPusher(handle, depth=8)
    assert [pusher.submit(i) for i in (1, 2, 3)] == [1, 2, 3]
    assert pusher.submitted == 3
    pusher.wait_handled(2)  # item 3 is held at the gate
    assert handled == [1, 2]
    gate.set()
    pusher.wait_handled(3)
    assert handled == [1, 2, 3]
    pusher.close()

    def fail(items: list[int]) -> None:
        raise ConnectionError("PS gone")

    failing: AsyncPusher[int] = AsyncPusher(fail, depth=8)
    for i in range(3):
        failing.submit(i)
    failing.wait_handled(3)  # dropped after the failure, counted as handled
    with pytest.raises(ConnectionError):
        failing.flush()
    failing.close()
