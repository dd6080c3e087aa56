"""Fault case 7 at the PS-client level: network trouble between a worker and the PS.

A real TCP proxy (``netproxy.NetProxy``) sits between ``RemotePS`` and each of two real gRPC
servers. It cuts connections *after* the server applied a push (the client sees
``UNAVAILABLE`` and retries), refuses reconnects for a while, and delays traffic. Training
continues after recovery, and every gradient is applied exactly once: shows, weights and the
dense vector are bit-identical to a run without faults (the training rule is deterministic:
each step's gradients are a function of the values it pulled).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest

from streamtrain_ps.api import SparsePush
from streamtrain_ps.client.remote import RemotePS, RetryPolicy
from streamtrain_ps.errors import InvalidRequestError
from streamtrain_ps.service.idempotency import RecentRequests

from .conftest import Cluster, small_config
from .netproxy import NetProxy

T = "embedding"
DENSE = "mlp"
STEPS = 8
pytestmark = pytest.mark.faults


def step_keys(step: int) -> np.ndarray:
    rng = np.random.default_rng(step)
    return (rng.integers(1, 400, size=600) * 2654435761).astype(np.uint64)  # with repeats


def train_step(ps: RemotePS, step: int, before_push: Callable[[], None]) -> None:
    k = step_keys(step)
    rows = ps.pull_sparse(T, k)
    dense = ps.pull_dense(DENSE)
    grads = (0.5 * rows[:, 2:] - np.float32(0.01 * (step + 1))).astype(np.float32)
    clicks = (k % np.uint64(3) == 0).astype(np.float32)
    before_push()
    ps.push_sparse(T, SparsePush(k, grads, np.ones(k.size, np.float32), clicks))
    ps.push_dense(DENSE, (0.1 * dense + 0.01).astype(np.float32))


def final_state(ps: RemotePS) -> tuple[np.ndarray, np.ndarray]:
    every = np.unique(np.concatenate([step_keys(s) for s in range(STEPS)]))
    return ps.pull_sparse(T, every), ps.pull_dense(DENSE)


@pytest.fixture
def proxies() -> Iterator[list[NetProxy]]:
    made: list[NetProxy] = []
    yield made
    for p in made:
        p.close()


def test_training_through_a_broken_network_applies_every_gradient_once(
    ps_cluster: Callable[..., Cluster], proxies: list[NetProxy]
) -> None:
    cfg = small_config()
    init = np.linspace(-1, 1, 64, dtype=np.float32)

    clean = ps_cluster(2, config=cfg)
    reference = clean.client()
    reference.init_dense(DENSE, init)
    for step in range(STEPS):
        train_step(reference, step, lambda: None)
    expected = final_state(reference)

    faulty = ps_cluster(2, config=cfg)
    proxies += [NetProxy(ep) for ep in faulty.endpoints]
    ps = RemotePS(
        [p.address for p in proxies],
        cfg,
        retry=RetryPolicy(max_attempts=12, initial_backoff=0.02, total_seconds=30),
    )
    faulty.clients.append(ps)
    ps.wait_ready(timeout=10)
    ps.init_dense(DENSE, init)

    def drop_all() -> None:  # the next response of each server is lost after applying
        for p in proxies:
            p.drop_responses(1)

    def outage() -> None:  # connections die; the next reconnects are refused
        for p in proxies:
            p.refuse(2)
            p.cut()

    faults: dict[int, Callable[[], None]] = {1: drop_all, 3: outage, 5: drop_all}
    for step in range(STEPS):
        proxies[0].delay = 0.005 if step == 6 else 0.0
        train_step(ps, step, faults.get(step, lambda: None))

    assert sum(p.stats.dropped for p in proxies) >= 4  # two armed drops on each server
    assert sum(p.stats.refused for p in proxies) >= 2
    duplicates = sum(
        s.registry.get_sample_value(
            "streamtrain_ps_duplicate_pushes_total", {"method": m, "shard": str(i)}
        )
        or 0.0
        for i, s in enumerate(faulty.servers)
        for m in ("PushSparse", "PushDense")
    )
    assert duplicates >= 1  # retries of applied pushes happened and were recognised

    rows, dense = final_state(ps)
    shows_pushed = sum(step_keys(s).size for s in range(STEPS))
    assert rows[:, 0].sum() == shows_pushed == expected[0][:, 0].sum()  # each show once
    np.testing.assert_array_equal(rows, expected[0])  # weights bit-identical
    np.testing.assert_array_equal(dense, expected[1])


def test_recent_requests_apply_once_and_stay_bounded() -> None:
    recent = RecentRequests(per_client=4, clients=2)
    calls: list[int] = []

    def apply(n: int) -> Callable[[], int]:
        def run() -> int:
            calls.append(n)
            return n

        return run

    assert recent.run(b"a", 1, 1, apply(1)) == (1, False)
    assert recent.run(b"a", 1, 1, apply(99)) == (1, True)  # repeat: first answer, no apply
    assert calls == [1]

    def boom() -> int:
        raise InvalidRequestError("grads", "bad")

    with pytest.raises(InvalidRequestError):
        recent.run(b"a", 2, 1, boom)
    assert recent.run(b"a", 2, 1, apply(2)) == (2, False)  # a failed first copy: not applied

    for seq in range(3, 10):  # the client never acks: at most 4 entries are kept
        recent.run(b"a", seq, 1, apply(seq))
    assert len(recent) == 4
    recent.run(b"a", 10, 9, apply(10))  # acked_below 9 forgets everything older
    assert len(recent) == 2
    with pytest.raises(InvalidRequestError, match="below acked_below"):
        recent.run(b"a", 3, 9, apply(3))
    recent.run(b"b", 1, 1, apply(1))
    recent.run(b"c", 1, 1, apply(1))  # a third client evicts the least recently seen ("a")
    assert len(recent) == 2
    with pytest.raises(InvalidRequestError, match="client_id"):
        recent.run(b"", 1, 1, apply(1))

    # a total cap over all clients: inventing client ids cannot grow the server unboundedly
    capped = RecentRequests(per_client=4, clients=100, total=8)
    for client in range(10):
        for seq in range(1, 4):
            capped.run(bytes([client + 1]), seq, 1, apply(seq))
        assert len(capped) <= 8
    assert capped.run(bytes([10]), 3, 1, apply(0)) == (3, True)  # the newest is remembered


def test_a_retry_racing_its_first_copy_waits_and_is_not_applied() -> None:
    recent = RecentRequests()
    release = threading.Event()
    applied: list[int] = []
    answers: list[Any] = []

    def slow() -> int:
        assert release.wait(10)
        applied.append(1)
        return 7

    first = threading.Thread(target=lambda: answers.append(recent.run(b"c", 5, 1, slow)))
    first.start()
    second = threading.Thread(target=lambda: answers.append(recent.run(b"c", 5, 1, slow)))
    second.start()
    release.set()
    first.join(10)
    second.join(10)
    assert applied == [1]
    assert sorted(answers) == [(7, False), (7, True)]
