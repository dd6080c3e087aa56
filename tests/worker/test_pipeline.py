"""Prefetch and push threads: order, back-pressure, merging, failures surface to the caller."""

from __future__ import annotations

import threading
import time

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


def test_a_reader_sees_the_pushes_handled_and_no_push_half_way() -> None:
    """``submit`` numbers the items; ``between_items`` waits for the item in hand, then
    holds the handler and yields how many items were handled: while it is held no later
    item takes effect. An item dropped after a failure counts as handled."""
    gate, release, holding = threading.Event(), threading.Event(), threading.Event()
    handled: list[int] = []
    seen: list[int] = []

    def handle(items: list[int]) -> None:
        for item in items:
            if item == 2:
                holding.set()
                assert gate.wait(timeout=10)
            handled.append(item)

    def read() -> None:
        with pusher.between_items() as count:
            seen.append(count)
            assert release.wait(timeout=10)

    pusher: AsyncPusher[int] = AsyncPusher(handle, depth=8)
    assert [pusher.submit(i) for i in (1, 2)] == [1, 2]
    assert holding.wait(timeout=10)
    reader = threading.Thread(target=read)
    reader.start()  # waits for item 2, held at the gate
    time.sleep(0.05)
    assert seen == []
    gate.set()
    deadline = time.monotonic() + 10
    while not seen and time.monotonic() < deadline:
        time.sleep(0.01)
    assert seen == [2] and handled == [1, 2]
    assert pusher.submit(3) == 3 and pusher.submitted == 3
    time.sleep(0.1)
    assert handled == [1, 2]  # item 3 waits while the reader holds the handler
    release.set()
    reader.join()
    pusher.flush()
    assert handled == [1, 2, 3]
    pusher.close()

    def fail(items: list[int]) -> None:
        raise ConnectionError("PS gone")

    failing: AsyncPusher[int] = AsyncPusher(fail, depth=8)
    for i in range(3):
        failing.submit(i)
    with pytest.raises(ConnectionError):
        failing.flush()
    with failing.between_items() as count:
        assert count == 3  # one failed, two dropped after it
    failing.close()


def test_after_a_failed_push_the_queued_ones_are_dropped_not_sent() -> None:
    """A pass whose push failed fails: the pushes queued behind it are not sent (the pass
    is redone from its start), and the failure is raised once."""
    gate = threading.Event()
    sent: list[int] = []

    def handle(items: list[int]) -> None:
        if items[0] == 0:
            assert gate.wait(timeout=10)
            raise ConnectionError("PS gone")
        sent.extend(items)

    pusher: AsyncPusher[int] = AsyncPusher(handle, depth=8)
    for i in range(3):
        pusher.submit(i)  # 1 and 2 queue up behind the failing 0
    gate.set()
    with pytest.raises(ConnectionError, match="PS gone"):
        pusher.flush()
    assert sent == []
    pusher.submit(3)  # reported once: the pusher sends again
    pusher.flush()
    assert sent == [3]
    pusher.close()
