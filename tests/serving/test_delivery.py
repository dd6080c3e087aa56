"""Delivery follows the donefile into the embedded and the Redis table: tombstones, order,
versions, exactly once across kills at every step."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from streamtrain_tools.bench.serving.models import Export, keys_of, rows_for
from streamtrain_worker.publishing.model_folder import ModelKind
from streamtrain_worker.publishing.predict import load_model
from streamtrain_worker.serving.delivery import Delivery
from streamtrain_worker.serving.tables import EmbeddedTable, RedisTable, VersionedTable
from streamtrain_worker.serving.versions import Guard

from .conftest import PROBE, RedisProcess, three_models


def tables(redis_server: RedisProcess | None) -> VersionedTable:
    if redis_server is None:
        return EmbeddedTable()
    return RedisTable(redis_server.client, "t:")


def assert_version_equals_predict(table: VersionedTable, vid: int, root: Path, key: str) -> None:
    model = load_model(str(root), key)
    rows, hit = table.lookup(vid, PROBE)
    expected = model.sparse.pull_sparse(model.table, PROBE)
    known = np.isin(PROBE, model.sparse.keys)
    np.testing.assert_array_equal(hit, known)
    np.testing.assert_array_equal(rows[hit], expected[hit])


@pytest.mark.parametrize("backend", ["embedded", "redis"])
def test_every_version_equals_the_predictor_chain(
    backend: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    server = request.getfixturevalue("redis_server") if backend == "redis" else None
    ex = Export(tmp_path / "export")
    keys = three_models(ex)
    table = tables(server)
    delivery = Delivery(str(ex.root), table, grace_seconds=0)
    applied = delivery.step()
    assert [a.line.key for a in applied] == keys
    state = table.state()
    assert state.cursor == 5 and state.live == 5 and state.refused == 0
    # Batch model skipped; the base restarts the chain; tombstoned id 5 is gone from delta-2.
    assert [a.version.id if a.version else None for a in applied] == [1, 2, None, 4, 5]
    assert applied[4].version is not None and applied[4].version.chain == (
        "20261102/base",
        "20261102/delta-1",
    )
    assert_version_equals_predict(table, 5, ex.root, "20261102/delta-1")
    # Kept: live (5) and the accepted one before it (4); 1 and 2 are dropped.
    assert table.stored() == {4, 5}
    assert_version_equals_predict(table, 4, ex.root, "20261102/base")
    assert delivery.step() == []  # nothing new: nothing applied twice


@pytest.mark.parametrize("backend", ["embedded", "redis"])
def test_tombstones_and_replacements_per_version(
    backend: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    server = request.getfixturevalue("redis_server") if backend == "redis" else None
    ex = Export(tmp_path / "export")
    k1 = keys_of(range(40))
    ex.publish(ModelKind.DELTA, "20261101", 1, k1, rows_for(k1, 1))
    table = tables(server)
    delivery = Delivery(str(ex.root), table, grace_seconds=60)
    delivery.step()
    k2 = keys_of([i for i in range(10) if i != 5])
    ex.publish(ModelKind.DELTA, "20261101", 2, k2, rows_for(k2, 2), keys_of([5]))
    delivery.step()
    assert_version_equals_predict(table, 1, ex.root, "20261101/delta-1")
    assert_version_equals_predict(table, 2, ex.root, "20261101/delta-2")
    rows, hit = table.lookup(2, keys_of([5]))
    assert not hit.any() and not rows.any()


class CrashError(Exception):
    pass


class CrashingTable:
    """Wraps a table; raises at the ``n``-th call of ``point`` (write, commit)."""

    def __init__(self, inner: VersionedTable, point: str, n: int) -> None:
        self.inner, self.point, self.n, self.calls = inner, point, n, 0

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.inner, name)
        if name != self.point:
            return attr

        def wrapped(*args: Any, **kwargs: Any) -> Any:
            self.calls += 1
            if self.calls == self.n:
                if name == "write":  # half the rows written, then the kill
                    version, parent, parts = args
                    attr(
                        version,
                        parent,
                        [(p[0][: len(p[0]) // 2], p[1][: len(p[0]) // 2], p[2]) for p in parts],
                    )
                raise CrashError(f"killed in {name} #{self.n}")
            return attr(*args, **kwargs)

        return wrapped


@pytest.mark.parametrize("point", ["write", "commit"])
@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_a_delivery_killed_at_each_step_resumes_and_applies_every_line_once(
    redis_server: RedisProcess, tmp_path: Path, point: str, n: int
) -> None:
    ex = Export(tmp_path / "export")
    three_models(ex)
    clean = RedisTable(redis_server.client, "clean:")
    Delivery(str(ex.root), clean, grace_seconds=0).step()

    crashing = CrashingTable(RedisTable(redis_server.client, "k:"), point, n)
    with pytest.raises(CrashError):
        Delivery(str(ex.root), crashing, grace_seconds=0).step()  # type: ignore[arg-type]
    before = RedisTable(redis_server.client, "k:").state()
    # A fresh process: a new table object over the same Redis.
    resumed = RedisTable(redis_server.client, "k:")
    applied = Delivery(str(ex.root), resumed, grace_seconds=0).step()
    assert [a.line.key for a in applied] == ex.published[before.cursor :]
    state = resumed.state()
    assert state.cursor == 5 and state.live == 5 and state.refused == 0
    assert [v.id for v in state.history] == [v.id for v in clean.state().history]
    for vid in (4, 5):
        a, hit_a = resumed.lookup(vid, PROBE)
        b, hit_b = clean.lookup(vid, PROBE)
        np.testing.assert_array_equal(hit_a, hit_b)
        np.testing.assert_array_equal(a, b)
    # No half-written bucket of the killed attempt survives beside the kept versions.
    leftovers = {int(k.split(b":")[2]) for k in redis_server.client.scan_iter(match="k:r:*")}
    assert leftovers <= resumed.stored() == {4, 5}


def test_grace_keeps_a_dropped_version_readable_for_a_moment(tmp_path: Path) -> None:
    ex = Export(tmp_path / "export")
    three_models(ex)
    table = EmbeddedTable()
    delivery = Delivery(str(ex.root), table, Guard(), grace_seconds=30)
    delivery.step()
    assert {1, 2} <= table.stored()  # unkept, but within the grace period
