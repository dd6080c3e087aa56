"""``LocalPS``: the PSLike protocol over N in-process shards, routed like the remote client."""

from __future__ import annotations

import numpy as np
import pytest

from streamtrain_ps import api
from streamtrain_ps.api import SparsePush
from streamtrain_ps.client.local import LocalPS
from streamtrain_ps.config import PSConfig, TableConfig
from streamtrain_ps.errors import InvalidRequestError, UnknownTableError
from streamtrain_ps.sharding import server_of_dense, server_of_key

D = 4
T = "embedding"
CFG = PSConfig(tables=(TableConfig(embedxDim=D, embedxThreshold=0.5),), logicalShards=16)


def _train(ps: LocalPS, rounds: int = 5) -> np.ndarray:
    rng = np.random.default_rng(9)
    keys = rng.integers(0, 2**64 - 1, 2000, dtype=np.uint64, endpoint=True)
    for _ in range(rounds):
        k = rng.choice(keys, 3000)
        ps.push_sparse(
            T,
            SparsePush(
                k,
                rng.normal(size=(k.size, D + 1)).astype(np.float32),
                np.ones(k.size, np.float32),
                (rng.random(k.size) < 0.1).astype(np.float32),
            ),
        )
    return keys


def test_local_ps_is_a_pslike() -> None:
    ps = LocalPS(CFG, 2)
    assert isinstance(ps, api.PSLike)
    ps.close()


def test_keys_live_on_the_shard_the_remote_client_would_pick() -> None:
    ps = LocalPS(CFG, 3)
    keys = _train(ps)
    owner = server_of_key(keys, CFG.logicalShards, 3)
    for i, shard in enumerate(ps.shards):
        present = shard.table(T).rows_of(keys) >= 0
        assert present.any()
        assert (owner[present] == i).all()
    ps.close()


def test_sharded_training_equals_single_shard_training() -> None:
    one, three = LocalPS(CFG, 1), LocalPS(CFG, 3)
    keys = _train(one)
    _train(three)
    np.testing.assert_array_equal(one.pull_sparse(T, keys), three.pull_sparse(T, keys))
    s1, s3 = one.stats(), three.stats()
    assert (s1.tables[0].keys, s1.tables[0].expanded_keys) == (
        s3.tables[0].keys,
        s3.tables[0].expanded_keys,
    )
    r1, r3 = one.shrink(), three.shrink()
    assert r1 == r3
    np.testing.assert_array_equal(one.pull_sparse(T, keys), three.pull_sparse(T, keys))
    for ps in (one, three):
        ps.close()


def test_dense_vectors_are_routed_by_name() -> None:
    ps = LocalPS(CFG, 3)
    for name in ("a", "b", "c", "tower/0"):
        ps.init_dense(name, np.ones(4, np.float32))
        assert ps.shards[server_of_dense(name, 3)].stats().dense_names.count(name) == 1
    ps.push_dense("a", np.ones(4, np.float32))
    assert (ps.pull_dense("a") < 1).all()
    assert ps.stats().dense_names == ("a", "b", "c", "tower/0")
    ps.close()


def test_bad_requests_raise_the_same_errors_as_a_shard() -> None:
    ps = LocalPS(CFG, 2)
    with pytest.raises(InvalidRequestError) as err:
        ps.push_sparse(
            T,
            SparsePush(
                np.arange(3, dtype=np.uint64),
                np.zeros((2, D + 1), np.float32),
                np.ones(3, np.float32),
                np.zeros(3, np.float32),
            ),
        )
    assert err.value.field == "grads"
    with pytest.raises(InvalidRequestError):
        ps.pull_sparse(T, np.arange(3, dtype=np.int32))  # type: ignore[arg-type]
    with pytest.raises(UnknownTableError):
        ps.pull_sparse("nope", np.arange(3, dtype=np.uint64))
    ps.close()
