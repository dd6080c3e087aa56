"""Sparse table semantics (§4) and request validation through the ``Shard`` API."""

from __future__ import annotations

import numpy as np
import pytest

from streamtrain_ps.api import SparsePush
from streamtrain_ps.config import (
    DenseConfig,
    DenseOptimizerConfig,
    PSConfig,
    SparseOptimizerConfig,
    TableConfig,
)
from streamtrain_ps.engine.accessor import SLOT
from streamtrain_ps.errors import InvalidRequestError, RequestTooLargeError, UnknownTableError
from streamtrain_ps.shard import Shard
from streamtrain_ps.sharding import server_of_key

D = 4
T = "embedding"
#: The embed part's default step size: a first AdaGrad step moves embed_w by it times g.
EMBED_LR = SparseOptimizerConfig().embed_learning_rate


def _shard(**table: object) -> Shard:
    tc = TableConfig(embedxDim=D, **table)  # type: ignore[arg-type]
    return Shard(PSConfig(tables=(tc,), logicalShards=8, maxKeysPerRequest=1000))


def _push(
    shard: Shard,
    keys: list[int],
    shows: list[float],
    clicks: list[float] | None = None,
    grads: np.ndarray | None = None,
) -> int:
    k = np.array(keys, dtype=np.uint64)
    g = np.zeros((k.size, D + 1), np.float32) if grads is None else grads.astype(np.float32)
    c = np.zeros(k.size, np.float32) if clicks is None else np.array(clicks, np.float32)
    return shard.push_sparse(T, SparsePush(k, g, np.array(shows, np.float32), c))


def test_unknown_keys_pull_as_zeros_and_are_not_created() -> None:
    shard = _shard()
    out = shard.pull_sparse(T, np.array([0, 5, 2**64 - 1], dtype=np.uint64))
    assert out.shape == (3, 3 + D) and out.dtype == np.float32
    assert not out.any()
    assert shard.stats().tables[0].keys == 0


def test_repeated_keys_are_summed_before_the_update() -> None:
    shard = _shard(embedxThreshold=1e9)
    g = np.zeros((3, D + 1), np.float32)
    g[:, 0] = [1.0, 2.0, 3.0]
    assert _push(shard, [7, 7, 8], [1, 2, 4], [0, 1, 1], g) == 2
    # One update with the merged gradient (1+2)/(1+2) = 1 per impression, not two updates.
    lr = EMBED_LR  # first step: G = 0, so the AdaGrad ratio sqrt(G0 / (G0 + 0)) is 1
    out = shard.pull_sparse(T, np.array([7, 8], dtype=np.uint64))
    np.testing.assert_allclose(out[:, :2], [[3, 1], [4, 1]])
    np.testing.assert_allclose(out[0, 2], -lr * 1.0, rtol=1e-6)
    np.testing.assert_allclose(out[1, 2], -lr * 3.0 / 4.0, rtol=1e-6)


def test_show_zero_does_not_divide_by_zero() -> None:
    shard = _shard()
    g = np.full((1, D + 1), 2.0, np.float32)
    _push(shard, [1], [0], [0], g)
    out = shard.pull_sparse(T, np.array([1], dtype=np.uint64))
    assert np.isfinite(out).all()
    np.testing.assert_allclose(out[0, 2], -EMBED_LR * 2.0, rtol=1e-6)  # scale 1


def test_embedx_is_admitted_at_the_threshold_and_gradients_before_are_dropped() -> None:
    # score = (show - click) * 0.1 + click * 1.0; threshold 1.0
    shard = _shard(embedxThreshold=1.0)
    g = np.ones((1, D + 1), np.float32)
    _push(shard, [42], [5], [0], g)  # score 0.5
    out = shard.pull_sparse(T, np.array([42], dtype=np.uint64))
    assert not out[0, 3:].any(), "embedx pulls as zero before admission"
    assert out[0, 2] != 0, "embed_w trains from the first push"
    assert shard.stats().tables[0].expanded_keys == 0
    _push(shard, [42], [4], [1], g)  # score 0.5 + 0.3 + 1.0 = 1.8 >= 1
    out = shard.pull_sparse(T, np.array([42], dtype=np.uint64))
    x = out[0, 3:]
    assert x.any() and np.abs(x).max() <= 1e-4, (
        "admitted: U(+-initialRange), this push's gradient dropped"
    )
    stats = shard.stats().tables[0]
    assert (stats.expanded_keys, stats.admissions_total) == (1, 1)
    _push(shard, [42], [1], [0], g)
    assert not np.array_equal(shard.pull_sparse(T, np.array([42], dtype=np.uint64))[0, 3:], x), (
        "now it trains"
    )


def test_slots_are_stored_bit_exact_and_last_one_wins() -> None:
    shard = _shard()
    k = np.array([3, 3, 4], dtype=np.uint64)
    z = np.zeros(3, np.float32)
    slots = np.array([1, 2**32 - 1, 17], dtype=np.uint32)
    shard.push_sparse(T, SparsePush(k, np.zeros((3, D + 1), np.float32), z + 1, z, slots))
    t = shard.table(T)
    rows = t.saves.copy_rows(t.rows_of(np.array([3, 4], dtype=np.uint64)))[1]
    assert rows.view(np.uint32)[:, SLOT].tolist() == [2**32 - 1, 17]


def _args(n: int = 2) -> dict[str, np.ndarray]:
    return {
        "keys": np.arange(n, dtype=np.uint64),
        "grads": np.zeros((n, D + 1), np.float32),
        "shows": np.ones(n, np.float32),
        "clicks": np.zeros(n, np.float32),
    }


@pytest.mark.parametrize(
    ("field", "bad"),
    [
        ("keys", np.arange(2, dtype=np.int64)),
        ("keys", [0, 1]),
        ("grads", np.zeros((2, D), np.float32)),
        ("grads", np.zeros((2, D + 1), np.float64)),
        ("grads", np.array([[np.nan] * (D + 1)] * 2, np.float32)),
        ("shows", np.ones(3, np.float32)),
        ("shows", np.array([1, -1], np.float32)),
        ("clicks", np.array([np.inf, 0], np.float32)),
        ("slots", np.ones(2, np.int32)),
    ],
)
def test_bad_push_is_rejected_naming_the_field_and_changes_nothing(field: str, bad: object) -> None:
    shard = _shard()
    args: dict[str, object] = dict(_args())
    args[field] = bad
    with pytest.raises(InvalidRequestError) as err:
        shard.push_sparse(T, SparsePush(**args))  # type: ignore[arg-type]
    assert err.value.field == field
    assert shard.stats().tables[0].keys == 0


def test_duplicates_that_overflow_when_summed_are_rejected() -> None:
    shard = _shard()
    g = np.full((2, D + 1), 3e38, np.float32)
    with pytest.raises(InvalidRequestError, match="sum to a non-finite") as err:
        _push(shard, [5, 5], [1, 1], [0, 0], g)
    assert err.value.field == "grads"
    assert shard.stats().tables[0].keys == 0


def test_unknown_table_too_many_keys_and_bad_pull() -> None:
    shard = _shard()
    with pytest.raises(UnknownTableError):
        shard.pull_sparse("nope", np.arange(2, dtype=np.uint64))
    with pytest.raises(UnknownTableError):
        shard.push_sparse("nope", SparsePush(**_args()))
    with pytest.raises(RequestTooLargeError):
        shard.pull_sparse(T, np.arange(1001, dtype=np.uint64))
    with pytest.raises(InvalidRequestError) as err:
        shard.pull_sparse(T, np.zeros((2, 2), dtype=np.uint64))
    assert err.value.field == "keys"


def test_a_shard_refuses_keys_it_does_not_own() -> None:
    cfg = PSConfig(tables=(TableConfig(embedxDim=D),), logicalShards=8)
    shard = Shard(cfg, shard_index=1, num_shards=2)
    keys = np.arange(64, dtype=np.uint64)
    owned = server_of_key(keys, 8, 2) == 1
    a = _args(int(owned.sum()))
    a["keys"] = keys[owned]
    assert shard.push_sparse(T, SparsePush(**a)) == owned.sum()
    b = _args(1)
    b["keys"] = keys[~owned][:1]
    with pytest.raises(InvalidRequestError, match="belongs to server 0"):
        shard.push_sparse(T, SparsePush(**b))


def test_dense_adam_and_sgd_match_the_formulas() -> None:
    rng = np.random.default_rng(5)
    init = rng.normal(size=10).astype(np.float32)
    grads = [rng.normal(size=10).astype(np.float32) for _ in range(5)]
    for kind in ("adam", "sgd"):
        opt = DenseOptimizerConfig(type=kind, learningRate=0.01)  # type: ignore[arg-type]
        shard = Shard(PSConfig(dense=DenseConfig(optimizer=opt)))
        values, version = shard.init_dense("w", init)
        np.testing.assert_array_equal(values, init)
        assert version == 0
        again, _ = shard.init_dense("w", init + 1)  # first writer wins
        np.testing.assert_array_equal(again, init)
        w = init.astype(np.float64)
        m = np.zeros(10)
        v = np.zeros(10)
        for t, g in enumerate(grads, start=1):
            assert shard.push_dense("w", g) == t
            if kind == "sgd":
                w = w - 0.01 * g
            else:
                m = 0.9 * m + 0.1 * g
                v = 0.999 * v + 0.001 * g.astype(np.float64) ** 2
                w = w - 0.01 * np.sqrt(1 - 0.999**t) / (1 - 0.9**t) * m / (np.sqrt(v) + 1e-8)
        values, version = shard.pull_dense("w")
        assert version == 5
        np.testing.assert_allclose(values, w, rtol=1e-5, atol=1e-6)
        assert shard.stats().dense_names == ("w",)


def test_dense_bad_input() -> None:
    shard = Shard(PSConfig())
    with pytest.raises(UnknownTableError):
        shard.pull_dense("missing")
    shard.init_dense("w", np.zeros(3, np.float32))
    with pytest.raises(InvalidRequestError) as err:
        shard.push_dense("w", np.zeros(4, np.float32))
    assert err.value.field == "grads"
    with pytest.raises(InvalidRequestError):
        shard.push_dense("w", np.array([np.nan, 0, 0], np.float32))
    with pytest.raises(InvalidRequestError):
        shard.init_dense("", np.zeros(3, np.float32))
    with pytest.raises(InvalidRequestError):
        shard.init_dense("w2", np.zeros(3, np.float64))  # type: ignore[arg-type]


def test_pushing_existing_keys_never_grows_the_index() -> None:
    # 700 keys fill a 1,024-slot index to 0.68; counting 400 pushed keys as new would need
    # 1,100 keys' room and double it (a rehash under the writer lock).
    shard = Shard(PSConfig(tables=(TableConfig(embedxDim=D),), maxKeysPerRequest=1000))
    t = shard.table(T)
    keys = list(range(1, 701))
    _push(shard, keys, [1] * 700)
    assert t.slot_capacity == 1024
    _push(shard, keys[:400], [1] * 400)
    assert t.slot_capacity == 1024 and len(t) == 700
    _push(shard, keys[:400] + list(range(701, 801)), [1] * 500)  # 100 new: 800 > 768
    assert t.slot_capacity == 2048 and len(t) == 800
