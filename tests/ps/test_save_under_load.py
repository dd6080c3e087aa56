"""Fault case 4: a checkpoint saved while clients keep pulling and pushing.

Two real PS servers (gRPC on 127.0.0.1:0); three clients, each with its own ``RemotePS``,
pull and push the same "hot" keys in a loop while ``RemotePS.save(uri, CHECKPOINT)`` runs
several times. Every client push carries every hot key with show 1 (and click 1 for a fixed
half of them), so at any instant all hot keys have show ``1 + m`` where ``m`` is the number
of pushes applied so far. That makes the engine's consistency promise checkable
(``docs/ps-engine.md``, "Saving under load"):

- no client sees an error while saves run;
- every key that existed when the save started is in it;
- each saved row is whole (click <= show, and a clicky key's click is exactly show - 1);
- within one logical shard all rows are from one instant: the hot keys of a logical shard
  all carry the same ``m`` (one push request is applied atomically per server, and a
  logical shard is copied under the table's writer lock);
- every ``m`` lies between the pushes completed before the save started and those started
  before it ended (a prefix of the push sequence, never a mix of two futures);
- keys nobody pushes during the save ("cold") are saved exactly;
- the checkpoint loads (into a different server count, too) and yields exactly the saved rows.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from streamtrain_ps import sharding
from streamtrain_ps.api import SaveMode, SparsePush
from streamtrain_ps.client.local import LocalPS
from streamtrain_ps.client.remote import RemotePS, RetryPolicy
from streamtrain_ps.config import PSConfig, SparseOptimizerConfig, TableConfig
from streamtrain_ps.saves import checkpoint

from .conftest import Cluster

T = "embedding"
D = 4
L = 16
CLIENTS = 3
SAVES = 4


def config() -> PSConfig:
    return PSConfig(
        tables=(
            TableConfig(
                name=T,
                embedxDim=D,
                embedxThreshold=0.0,
                showClickDecayRate=1.0,
                optimizer=SparseOptimizerConfig(initialRange=0.01),
            ),
        ),
        logicalShards=L,
    )


def _push(ps: RemotePS, keys: np.ndarray, clicks: np.ndarray) -> None:
    ps.push_sparse(
        T,
        SparsePush(
            keys,
            np.full((keys.size, D + 1), 0.01, np.float32),
            np.ones(keys.size, np.float32),
            clicks,
        ),
    )


@pytest.mark.faults
def test_checkpoint_saved_under_load_is_a_per_logical_shard_snapshot(
    ps_cluster: Callable[..., Cluster], tmp_path: Path
) -> None:
    cfg = config()
    cluster = ps_cluster(2, config=cfg)
    admin = cluster.client()
    rng = np.random.default_rng(3)
    hot = np.unique(rng.integers(1, 2**63, 6000, dtype=np.uint64))
    cold = np.unique(rng.integers(1, 2**63, 3000, dtype=np.uint64))
    cold = np.setdiff1d(cold, hot)
    clicky = np.zeros(hot.size, np.float32)
    clicky[::2] = 1.0
    _push(admin, hot, np.zeros(hot.size, np.float32))  # show 1, click 0: m = 0
    for _ in range(3):
        _push(admin, cold, np.ones(cold.size, np.float32))
    cold_rows = admin.pull_sparse(T, cold)

    stop = threading.Event()
    lock = threading.Lock()
    started = [0]  # pushes begun (upper bound of what a save can contain)
    completed = [0]  # pushes returned (lower bound)
    errors: list[BaseException] = []
    clients = [
        cluster.client(retry=RetryPolicy(max_attempts=1, total_seconds=5)) for _ in range(CLIENTS)
    ]

    def client(ps: RemotePS) -> None:
        try:
            while not stop.is_set():
                pulled = ps.pull_sparse(T, hot)
                assert (pulled[:, 1] <= pulled[:, 0]).all()
                with lock:
                    started[0] += 1
                _push(ps, hot, clicky)
                with lock:
                    completed[0] += 1
        except BaseException as exc:  # re-raised by the test thread below
            errors.append(exc)

    threads = [threading.Thread(target=client, args=(c,)) for c in clients]
    for t in threads:
        t.start()
    windows: list[tuple[int, int, str]] = []
    try:
        for i in range(SAVES):
            deadline = completed[0] + 5
            while completed[0] < deadline and not errors:  # bounded: clients push ~100/s
                stop.wait(0.01)
            with lock:
                low = completed[0]
            uri = str(tmp_path / f"ckpt-{i}")
            result = admin.save(uri, SaveMode.CHECKPOINT)
            with lock:
                high = started[0]
            assert result.keys_saved >= hot.size + cold.size
            windows.append((low, high, uri))
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=30)
    assert not any(t.is_alive() for t in threads), "a client hung"
    assert not errors, f"a client saw an error during the saves: {errors[0]!r}"
    assert any(high > low for low, high, _ in windows), "no push overlapped any save"

    hot_ls = sharding.logical_shard(hot, L)
    for low, high, uri in windows:
        m = checkpoint.read_manifest(uri)
        assert m.mode == SaveMode.CHECKPOINT and m.logical_shards == L
        fresh = LocalPS(cfg, num_shards=3)  # N=2 servers -> M=3 shards
        assert fresh.load(uri) == hot.size + cold.size
        rows = fresh.pull_sparse(T, hot)
        shows, clicks = rows[:, 0], rows[:, 1]
        pushes = shows - 1
        assert (clicks <= shows).all()
        np.testing.assert_array_equal(clicks[clicky == 1], pushes[clicky == 1])
        np.testing.assert_array_equal(clicks[clicky == 0], 0)
        for logical in range(L):
            in_part = np.unique(pushes[hot_ls == logical])
            assert in_part.size == 1, f"{uri}: logical shard {logical} mixes pushes {in_part}"
        assert low <= pushes.min() and pushes.max() <= high, (low, high, pushes.min())
        np.testing.assert_array_equal(fresh.pull_sparse(T, cold), cold_rows)
        fresh.close()
