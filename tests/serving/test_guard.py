"""The guard: a model with non-finite rows or weights, a metric drop or files that do not
verify is never made live; the refusal is counted and the live model stays."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from streamtrain_tools.bench.serving.models import Export, keys_of, rows_for
from streamtrain_worker.publishing.model_folder import ModelKind
from streamtrain_worker.serving.delivery import Delivery
from streamtrain_worker.serving.tables import EmbeddedTable
from streamtrain_worker.serving.versions import Guard, GuardError


def first(ex: Export) -> None:
    k = keys_of(range(20))
    ex.publish(ModelKind.DELTA, "20261101", 1, k, rows_for(k, 1), metrics={"auc": 0.75})


def test_nan_rows_are_refused_until_a_delta_repairs_them(tmp_path: Path) -> None:
    ex = Export(tmp_path / "export")
    first(ex)
    table = EmbeddedTable()
    delivery = Delivery(str(ex.root), table, grace_seconds=60)
    delivery.step()
    bad = keys_of([1, 2])
    rows = rows_for(bad, 2)
    rows[0, 4] = np.nan
    ex.publish(ModelKind.DELTA, "20261101", 2, bad, rows, metrics={"auc": 0.75})
    (applied,) = delivery.step()
    assert applied.refusal is not None and "1 sparse rows are not finite" in applied.refusal.reason
    state = table.state()
    assert state.live == 1 and state.served == 1 and state.refused == 1 and state.head.id == 2
    # The next delta builds on the refused one (its rows are in the chain) and is refused
    # too while the NaN row stays; one that replaces it goes live.
    other = keys_of([7])
    ex.publish(ModelKind.DELTA, "20261101", 3, other, rows_for(other, 3), metrics={"auc": 0.75})
    (applied,) = delivery.step()
    assert applied.refusal is not None and table.state().live == 1
    ex.publish(ModelKind.DELTA, "20261101", 4, bad, rows_for(bad, 4), metrics={"auc": 0.75})
    (applied,) = delivery.step()
    assert applied.refusal is None and table.state().live == 4
    assert np.isfinite(table.lookup(4, keys_of(range(20)))[0]).all()


def test_nan_weights_are_refused(tmp_path: Path) -> None:
    ex = Export(tmp_path / "export")
    first(ex)
    k = keys_of([3])
    ex.publish(ModelKind.DELTA, "20261101", 2, k, rows_for(k, 2), dense_scale=float("nan"))
    table = EmbeddedTable()
    applied = Delivery(str(ex.root), table).step()
    assert applied[1].refusal is not None and "dense weights" in applied[1].refusal.reason
    assert table.state().live == 1


def test_an_auc_drop_and_a_copc_out_of_range_are_refused(tmp_path: Path) -> None:
    ex = Export(tmp_path / "export")
    first(ex)
    k = keys_of([3])
    ex.publish(ModelKind.DELTA, "20261101", 2, k, rows_for(k, 2), metrics={"auc": 0.70})
    ex.publish(
        ModelKind.DELTA, "20261101", 3, k, rows_for(k, 3), metrics={"auc": 0.75, "copc": 1.6}
    )
    ex.publish(
        ModelKind.DELTA, "20261101", 4, k, rows_for(k, 4), metrics={"auc": 0.74, "copc": 1.1}
    )
    table = EmbeddedTable()
    guard = Guard(max_auc_drop=0.02, copc_min=0.8, copc_max=1.25)
    applied = Delivery(str(ex.root), table, guard).step()
    reasons = [a.refusal.reason if a.refusal else "" for a in applied]
    assert reasons[0] == ""
    assert reasons[1].startswith("auc 0.7000 is 0.0500 below the live model's 0.7500")
    assert reasons[2] == "copc 1.6000 > copc_max 1.25"
    assert reasons[3] == ""
    assert table.state().live == 4 and table.state().refused == 2


def test_files_that_do_not_verify_are_refused_and_the_next_base_recovers(tmp_path: Path) -> None:
    ex = Export(tmp_path / "export")
    first(ex)
    k = keys_of([3])
    ex.publish(ModelKind.DELTA, "20261101", 2, k, rows_for(k, 2))
    part = next((ex.root / "20261101/delta-2/sparse").rglob("part-*.bin"))
    part.write_bytes(part.read_bytes()[:-4] + b"XXXX")
    ex.publish(ModelKind.DELTA, "20261101", 3, k, rows_for(k, 3))
    kb = keys_of(range(10))
    ex.publish(ModelKind.BASE, "20261102", 0, kb, rows_for(kb, 4), metrics={"auc": 0.75})
    table = EmbeddedTable()
    applied = Delivery(str(ex.root), table).step()
    reasons = [a.refusal.reason if a.refusal else "" for a in applied]
    assert "20261101/delta-2/sparse" in reasons[1] and "checksum mismatch" in reasons[1]
    assert "checksum mismatch" in reasons[2]  # delta-3's chain holds delta-2
    assert reasons[3] == "" and table.state().live == 4


@pytest.mark.parametrize(
    ("kwargs", "named"),
    [({"max_auc_drop": -1}, "max_auc_drop"), ({"copc_min": 2, "copc_max": 1}, "copc_min")],
)
def test_bad_guard_settings_name_the_field(kwargs: dict[str, float], named: str) -> None:
    with pytest.raises(GuardError, match=named):
        Guard(**kwargs)  # type: ignore[arg-type]
