"""Hostile numbers: no finite push makes a stored row inf or NaN, whatever the rule.

A push with show 1e-25 and gradient 1 used to scale the gradient to 1e25: FTRL's ``n`` went
inf, the next push made it NaN and the key's weight stuck at 0; AdaGrad's G went inf and
froze the key. The show floor and the gradient clip (``optim``) bound what a step can
reach, a row that would still become non-finite is left as it was and counted
(``kernels.update_rows``), and a load refuses a save holding such a row. The property tests
push extreme finite values (denormals, tiny and huge shows, huge gradients) in process and
over gRPC and check every stored row stays finite.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry

from streamtrain_ps.api import SaveMode, SparsePush
from streamtrain_ps.client.remote import RemotePS, RetryPolicy
from streamtrain_ps.config import PSConfig, SparseOptimizerConfig, TableConfig
from streamtrain_ps.engine.accessor import P_EMBED_W
from streamtrain_ps.errors import CheckpointError, InvalidRequestError
from streamtrain_ps.saves import checkpoint
from streamtrain_ps.service.metrics import PSMetrics
from streamtrain_ps.service.server import PSServer
from streamtrain_ps.shard import Shard

T = "embedding"
D = 3
KINDS = ["adagrad", "std_adagrad", "adam", "ftrl", "scale_free_adagrad"]


def config(kind: str = "ftrl", **table: object) -> PSConfig:
    return PSConfig(
        tables=(
            TableConfig(
                name=T,
                embedxDim=D,
                embedxThreshold=0.0,
                optimizer=SparseOptimizerConfig(type=kind, initialRange=0.01),  # type: ignore[arg-type]
                **table,  # type: ignore[arg-type]
            ),
        ),
        logicalShards=4,
    )


def push(
    ps: Shard | RemotePS, keys: np.ndarray, grad: float, show: float, click: float = 0.0
) -> None:
    n = keys.size
    ps.push_sparse(
        T,
        SparsePush(
            keys,
            np.full((n, D + 1), grad, np.float32),
            np.full(n, show, np.float32),
            np.full(n, click, np.float32),
        ),
    )


def stored_rows(shard: Shard) -> tuple[np.ndarray, np.ndarray]:
    """Every key's full row in key order (slot column dropped: uint32 bits) and the exact
    hot counters."""
    t = shard.table(T)
    rows, _ = t.saves.rows_by_logical_shard(1)
    keys, full, hot = t.saves.copy_rows_exact(rows)
    return full[np.argsort(keys), 1:], hot.counts


def assert_all_finite(shard: Shard) -> None:
    full, hot = stored_rows(shard)
    assert np.isfinite(full).all(), full[~np.isfinite(full).all(axis=1)]
    assert np.isfinite(hot).all()


@pytest.mark.parametrize("kind", KINDS)
def test_a_push_with_a_tiny_show_leaves_the_row_finite_and_learning(kind: str) -> None:
    shard = Shard(config(kind))
    key = np.array([7], np.uint64)
    push(shard, key, grad=1.0, show=1e-25)
    push(shard, key, grad=1.0, show=1.0)
    assert_all_finite(shard)
    before = shard.pull_sparse(T, key).copy()
    push(shard, key, grad=-1.0, show=1.0)  # the key still learns: its weights move
    after = shard.pull_sparse(T, key)
    assert_all_finite(shard)
    assert np.isfinite(after).all()
    assert (after[0, 2:] != before[0, 2:]).all(), (before, after)
    assert shard.stats().tables[0].refused_total == 0
    shard.close()


def test_a_row_that_would_overflow_is_left_unchanged_and_counted() -> None:
    # clickCoeff 2: a push of show = click = 3e38 scores 6e38, past float32's range.
    shard = Shard(config("adagrad", clickCoeff=2.0))
    registry = CollectorRegistry()
    PSMetrics(registry, shard=0, stats=shard.stats)
    keys = np.array([1, 2], np.uint64)
    push(shard, keys, grad=0.5, show=1.0)
    before = stored_rows(shard)
    shard.push_sparse(
        T,
        SparsePush(
            keys,
            np.full((2, D + 1), 0.25, np.float32),
            np.array([3e38, 1.0], np.float32),
            np.array([3e38, 0.0], np.float32),
        ),
    )
    after = stored_rows(shard)
    assert_all_finite(shard)
    np.testing.assert_array_equal(after[0][0], before[0][0])  # key 1: refused, as it was
    assert after[0][1, 2] == before[0][1, 2] + 1.0  # key 2's show: applied
    assert shard.stats().tables[0].refused_total == 1
    labels = {"table": T, "shard": "0"}
    assert registry.get_sample_value("streamtrain_ps_refused_updates_total", labels) == 1
    shard.close()


def test_a_load_refuses_a_save_holding_a_non_finite_row(tmp_path: Path) -> None:
    shard = Shard(config("ftrl"))
    keys = np.arange(1, 50, dtype=np.uint64)
    push(shard, keys, grad=0.5, show=1.0)
    t = shard.table(T)
    row = int(t.rows_of(keys[10:11])[0])
    t._arrays.slab[row, P_EMBED_W] = np.nan  # what a save of the old kernels could hold
    uri = f"{tmp_path}/ckpt"
    checkpoint.publish(uri, [shard.save(uri, SaveMode.CHECKPOINT)], {}, config=shard.config)
    fresh = Shard(config("ftrl"))
    with pytest.raises(CheckpointError, match="not a finite number"):
        fresh.load(uri)
    assert len(fresh.table(T)) == 0  # nothing installed
    shard.close()
    fresh.close()


# -- properties -----------------------------------------------------------------------------

F32_MAX = float(np.finfo(np.float32).max)
#: Finite float32 values at the edges: denormals, tiny and huge normals, the largest.
EDGES = [0.0, 1e-45, 1e-40, 1e-38, 1e-25, 1e-7, 1.0, 3.0, 1e7, 1e20, 1e30, 1e38, F32_MAX]
shows = st.one_of(st.sampled_from(EDGES), st.floats(0, F32_MAX, width=32))
grads = st.one_of(
    st.sampled_from(EDGES + [-e for e in EDGES]),
    st.floats(-F32_MAX, F32_MAX, width=32, allow_nan=False, allow_infinity=False),
)
pushes = st.lists(st.tuples(st.integers(1, 6), grads, shows, shows), min_size=1, max_size=12)
DEEP = os.environ.get("STREAMTRAIN_DEEP") == "1"  # make test-deep
PROPERTY = settings(
    max_examples=500 if DEEP else 25,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)


def apply(ps: Shard | RemotePS, batch: list[tuple[int, float, float, float]]) -> None:
    """One push per element (key, grad, show, click); a sum that overflows float32 is
    refused as a whole (INVALID_ARGUMENT), which is fine: rows must stay finite either way."""
    for key, g, s, c in batch:
        with contextlib.suppress(InvalidRequestError):
            push(ps, np.array([key, key + 100], np.uint64), g, s, min(c, s) if c else 0.0)


@pytest.mark.parametrize("kind", KINDS)
@PROPERTY
@given(batch=pushes)
def test_extreme_finite_pushes_keep_every_row_finite(kind: str, batch: list) -> None:
    shard = Shard(config(kind))
    apply(shard, batch)
    assert_all_finite(shard)
    assert np.isfinite(shard.pull_sparse(T, np.arange(1, 200, dtype=np.uint64))).all()
    shard.close()


@given(value=st.sampled_from([1e39, 1e308, -1e308]))
@settings(max_examples=3, deadline=None)
def test_values_past_float32_are_refused_by_name(value: float) -> None:
    shard = Shard(config("ftrl"))
    with np.errstate(over="ignore"):
        g = np.full((1, D + 1), np.float32(value))  # inf once it is float32
    with pytest.raises(InvalidRequestError, match="grads"):
        shard.push_sparse(
            T,
            SparsePush(
                np.array([1], np.uint64), g, np.ones(1, np.float32), np.zeros(1, np.float32)
            ),
        )
    assert len(shard.table(T)) == 0
    shard.close()


@pytest.fixture(scope="module")
def served() -> Iterator[tuple[Shard, RemotePS]]:
    cfg = config("ftrl")
    shard = Shard(cfg)
    server = PSServer(shard, cfg, max_workers=2)
    server.start()
    client = RemotePS([server.address], cfg, retry=RetryPolicy(max_attempts=1))
    client.wait_ready(timeout=10)
    try:
        yield shard, client
    finally:
        client.close()
        server.close(grace=0)
        shard.close()


@settings(
    max_examples=200 if DEEP else 15, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
@given(batch=pushes)
def test_extreme_finite_pushes_over_grpc_keep_every_row_finite(
    served: tuple[Shard, RemotePS], batch: list
) -> None:
    shard, client = served
    apply(client, batch)
    assert_all_finite(shard)
    assert np.isfinite(client.pull_sparse(T, np.arange(1, 200, dtype=np.uint64))).all()
