"""The disk tier at its edges: a pull racing a promotion, a demotion failing half way, spill
folders a killed shard left behind, and a staged save committed after a later snapshot save.

Each test drives a real ``TieredTable`` (RocksDB store on ``tmp_path``) and puts the race
or the fault exactly where it hurts (a wrapper around the step, never a sleep and luck).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from streamtrain_ps import tiering
from streamtrain_ps.config import PSConfig, SparseOptimizerConfig, TableConfig
from streamtrain_ps.table import SparseTable
from streamtrain_ps.tiering import DiskOptions, TieredTable

T = "embedding"
D = 4
L = 4


def table_config(**overrides: Any) -> TableConfig:
    base: dict[str, Any] = {
        "name": T,
        "embedxDim": D,
        "embedxThreshold": 0.0,
        "deltaThreshold": 0.0,
        "optimizer": SparseOptimizerConfig(initialRange=0.01),
    }
    base.update(overrides)
    return TableConfig(**base)


def ps_config(tmp: Path | None = None, **overrides: Any) -> PSConfig:
    return PSConfig(
        tables=(table_config(),),
        logicalShards=L,
        diskPath=str(tmp) if tmp else "",
        **overrides,
    )


def tiered(tmp: Path, limit: int = 0) -> TieredTable:
    return TieredTable(table_config(), disk=DiskOptions(tmp / "disk", limit, L))


def push(t: SparseTable, keys: np.ndarray, seed: int = 0, show: float = 1.0) -> None:
    rng = np.random.default_rng(seed)
    n = keys.size
    grads = rng.normal(0, 1, (n, D + 1)).astype(np.float32)
    shows = np.full(n, show, np.float32)
    clicks = np.zeros(n, np.float32)
    parts = t.merge(keys, grads, shows, clicks, np.empty(0, np.uint32), (L, 1, 0))
    t.push_merged(parts, has_slots=False)


def wrap(
    monkeypatch: pytest.MonkeyPatch, owner: Any, name: str, before: Callable[[], None]
) -> None:
    """Run ``before()`` each time ``owner.name`` is called, then the real one."""
    real = getattr(owner, name)

    def wrapped(*args: Any, **kwargs: Any) -> Any:
        before()
        return real(*args, **kwargs)

    monkeypatch.setattr(owner, name, wrapped)


def reader_during(
    t: TieredTable, keys: np.ndarray, results: list[np.ndarray]
) -> Callable[[], None]:
    """A step that starts a pull of ``keys`` from another thread and gives it a moment: a
    pull that can finish while the writer is stopped here records what it saw; one that
    (rightly) waits for the writer records its answer once the writer is done."""
    threads: list[threading.Thread] = []

    def step() -> None:
        th = threading.Thread(target=lambda: results.append(t.pull(keys)))
        th.start()
        th.join(timeout=0.3)
        threads.append(th)

    step.threads = threads  # type: ignore[attr-defined]
    return step


# -- bug 5: a pull racing a promotion -------------------------------------------------------


def test_a_pull_racing_a_promotion_sees_the_whole_row(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    t = tiered(tmp_path)
    ref = SparseTable(table_config())
    keys = np.arange(1, 301, dtype=np.uint64)
    for seed in range(3):
        push(t, keys, seed)
        push(ref, keys, seed)
    expected = ref.pull(keys)
    assert (expected[:, 2:] != 0).all()
    t.demote(0)
    assert t.disk_keys == keys.size and len(t) == 0
    seen: list[np.ndarray] = []
    step = reader_during(t, keys, seen)
    # The writer stops after the rows are in the index's reach on the old code (insert,
    # then place) and before they are published on the new one (place, then publish).
    wrap(monkeypatch, tiering.tk, "place", step)
    np.testing.assert_array_equal(t.pull(keys), expected)  # the promotion
    for th in step.threads:  # type: ignore[attr-defined]
        th.join()
    assert len(seen) == 1
    np.testing.assert_array_equal(seen[0], expected)  # never a half-placed (zero) row
    t.close()
