"""Exact counters: show, click and delta_score keep counting past float32's 2^24.

Keys whose counters reach ``kernels.HOT_FROM`` move them to a float64 side table; the
float32 arithmetic of every other key is unchanged (test_optim.py is the oracle for it).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from streamtrain_ps.api import SaveMode, SparsePush
from streamtrain_ps.config import PSConfig, TableConfig
from streamtrain_ps.engine.kernels import HOT_BACK, HOT_FROM
from streamtrain_ps.saves import checkpoint
from streamtrain_ps.shard import Shard

D = 2
T = "embedding"
BIG = float(2**24)
KEY = np.array([77], np.uint64)


def _shard(**table: object) -> Shard:
    return Shard(PSConfig(tables=(TableConfig(embedxDim=D, **table),), logicalShards=2))  # type: ignore[arg-type]


def _push(shard: Shard, show: float, click: float = 0.0) -> None:
    shard.push_sparse(
        T,
        SparsePush(
            KEY,
            np.zeros((1, D + 1), np.float32),
            np.array([show], np.float32),
            np.array([click], np.float32),
        ),
    )


def _exact(shard: Shard) -> np.ndarray:
    t = shard.table(T)
    _, _, hot = t.saves.copy_rows_exact(t.rows_of(KEY))
    assert hot.positions.tolist() == [0]
    return hot.counts[0]


def test_counters_keep_counting_past_two_to_the_24() -> None:
    shard = _shard()
    _push(shard, BIG)
    for _ in range(5):
        _push(shard, 1.0, 1.0)
    assert np.float32(BIG) + np.float32(1.0) == np.float32(BIG), "float32 would stop here"
    show, click, delta = _exact(shard)
    assert show == BIG + 5 and click == 5
    first = float(np.float32(0.1 * BIG))  # the first push counted in float32 (below limit)
    assert delta == first + 5 * 1.0
    assert shard.table(T).hot_keys == 1
    pulled = shard.pull_sparse(T, KEY)
    assert pulled[0, 0] == np.float32(BIG + 5) and pulled[0, 1] == 5  # the API is float32


def test_ordinary_keys_stay_float32_and_hot_keys_decay_back() -> None:
    shard = _shard(showClickDecayRate=0.01, deleteThreshold=0.0)
    _push(shard, HOT_FROM / 2)
    assert shard.table(T).hot_keys == 0
    _push(shard, HOT_FROM / 2)  # reaches the limit: moves to the side table
    assert shard.table(T).hot_keys == 1
    _push(shard, 3.0)
    shard.shrink(T)  # x0.01 in float64, then below HOT_BACK: back to float32 counters
    assert (HOT_FROM + 3) * 0.01 < HOT_BACK
    assert shard.table(T).hot_keys == 0
    t = shard.table(T)
    full = t.saves.copy_rows(t.rows_of(KEY))[1]
    assert full[0, 3] == np.float32((HOT_FROM + 3) * 0.01)
    _push(shard, 1.0)
    assert shard.pull_sparse(T, KEY)[0, 0] == np.float32(np.float32((HOT_FROM + 3) * 0.01) + 1)


def test_checkpoints_and_deltas_carry_the_exact_counters(tmp_path: Path) -> None:
    shard = _shard()
    _push(shard, BIG, 3.0)
    _push(shard, 1.0)
    before = _exact(shard)
    uri = str(tmp_path / "ck")
    checkpoint.publish(uri, [shard.save(uri, SaveMode.CHECKPOINT)], config=shard.config)
    other = _shard()
    other.load(uri)
    np.testing.assert_array_equal(_exact(other), before)
    # A delta save commits by subtracting exactly what it saved: nothing is left over.
    d = str(tmp_path / "delta")
    checkpoint.publish(d, [other.save(d, SaveMode.DELTA)], config=other.config)
    assert _exact(other)[2] == 0.0
    assert checkpoint.read_sparse(d, T)[0].tolist() == [77]
