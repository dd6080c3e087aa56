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

from streamtrain_ps.api import SaveMode
from streamtrain_ps.config import PSConfig, SparseOptimizerConfig, TableConfig
from streamtrain_ps.engine.table import SparseTable
from streamtrain_ps.errors import CheckpointError
from streamtrain_ps.saves import checkpoint
from streamtrain_ps.shard import Shard
from streamtrain_ps.tier import tiering
from streamtrain_ps.tier.tiering import DiskOptions, TieredTable

T = "embedding"
D = 4
L = 4


def table_config(**overrides: Any) -> TableConfig:
    base: dict[str, Any] = {
        "name": T,
        "embedxDim": D,
        "embedxThreshold": 0.0,
        "deltaThreshold": 0.1,
        "baseThreshold": 0.0,
        "optimizer": SparseOptimizerConfig(initialRange=0.01),
    }
    base.update(overrides)
    return TableConfig(**base)


def ps_config(tmp: Path | None = None, **overrides: Any) -> PSConfig:
    base: dict[str, Any] = {"tables": (table_config(),), "logicalShards": L}
    base.update(overrides)
    return PSConfig(diskPath=str(tmp) if tmp else "", **base)


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


# -- bug 2: a demotion failing half way -----------------------------------------------------


class StoreIOError(Exception):
    """What the RocksDB binding raises for an I/O error (a plain exception, not ENOSPC)."""


def fail_call(monkeypatch: pytest.MonkeyPatch, name: str, nth: int) -> list[int]:
    """Make the ``nth`` call of ``DiskStore.name`` raise ``StoreIOError``; returns the count."""
    real = getattr(tiering.DiskStore, name)
    calls = [0]

    def failing(self: Any, *args: Any, **kwargs: Any) -> Any:
        calls[0] += 1
        if calls[0] == nth:
            raise StoreIOError(f"IO error: {name} call {nth} (injected)")
        return real(self, *args, **kwargs)

    monkeypatch.setattr(tiering.DiskStore, name, failing)
    return calls


def delta_keys(shard: Shard, uri: str) -> set[int]:
    checkpoint.publish(uri, [shard.save(uri, SaveMode.DELTA)], None, config=shard.config)
    return set(checkpoint.read_sparse(uri, T)[0].tolist())


def test_a_demotion_failing_on_its_second_chunk_leaves_staged_saves_right(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    shard = Shard(ps_config(tmp_path / "disk"))
    t = shard.table(T)
    old = np.arange(1, 201, dtype=np.uint64)
    push(t, old, show=5.0)
    _, staged = shard.stage_save(str(tmp_path / "s1"), SaveMode.DELTA)
    monkeypatch.setattr(tiering, "MOVE_CHUNK", 50)
    fail_call(monkeypatch, "put", 2)
    with pytest.raises(StoreIOError):
        t.demote(0)  # the first chunk moved to disk, the second failed
    assert t.disk_keys == 50 and t.total_keys == old.size
    new = np.arange(1000, 1060, dtype=np.uint64)
    push(t, new, seed=1, show=5.0)  # new keys take the rows the first chunk freed
    assert shard.finish_save(staged, commit=True)
    assert delta_keys(shard, str(tmp_path / "s2")) == set(new.tolist())
    shard.close()


# -- bug 4: spill folders of a killed shard -------------------------------------------------


def test_a_starting_shard_removes_a_killed_shards_spill_folders(tmp_path: Path) -> None:
    volume = tmp_path / "disk"
    table_dir = volume / "shard-0" / T.encode().hex()
    for gen in ("gen-1", "gen-2"):  # what a kill -9 leaves: stores no one deletes
        (table_dir / gen).mkdir(parents=True)
        (table_dir / gen / "000012.sst").write_bytes(b"x" * 40_000)
    (volume / "shard-0" / "6f6c64").mkdir()  # a table of an older config
    (volume / "shard-0" / "6f6c64" / "LOG").write_bytes(b"y" * 1_000)
    shard = Shard(ps_config(volume, diskLimit=10**6))
    t = shard.table(T)
    assert not (volume / "shard-0").exists()  # created again when a table first spills
    push(t, np.arange(1, 101, dtype=np.uint64))
    t.demote(0)
    assert t.disk_keys == 100 and [p.name for p in table_dir.iterdir()] == ["gen-1"]
    shard.close()


def test_the_disk_cap_counts_every_byte_on_the_volume(tmp_path: Path) -> None:
    volume = tmp_path / "disk"
    (volume / "elsewhere").mkdir(parents=True)
    limit = 200_000
    shard = Shard(ps_config(volume, diskLimit=limit))
    t = shard.table(T)
    keys = np.arange(1, 1001, dtype=np.uint64)
    push(t, keys)
    (volume / "elsewhere" / "blob").write_bytes(b"z" * (limit - 20_000))  # not the tier's
    t.demote(0)
    store_bytes = t.disk_bytes()
    assert 0 < store_bytes <= 20_000, store_bytes  # only what the volume had left
    assert t.pressure_evictions_total == keys.size - t.disk_keys > 0
    shard.close()


# -- suspicion (a): a staged save committed after a later snapshot save ---------------------


def test_a_staged_commit_after_a_later_snapshot_save_loses_nothing(tmp_path: Path) -> None:
    """A snapshot save applies its effects at once. A staged delta committed after it must
    neither clear tombstones the snapshot never read nor subtract delta_score the snapshot
    already subtracted: its commit is refused (the snapshot's effects cover its own)."""
    shard = Shard(ps_config(tmp_path / "disk", tables=(table_config(deleteThreshold=0.8),)))
    t = shard.table(T)
    a, b, c = (np.arange(lo, lo + 40, dtype=np.uint64) for lo in (1, 100, 200))
    push(t, a, show=1.0)  # score 0.1: deleted by the first shrink
    push(t, b, show=20.0)  # score 2: survives every shrink
    shard.shrink()
    _, staged = shard.stage_save(str(tmp_path / "s1"), SaveMode.DELTA)  # b; a's tombstones
    shard.snapshot_save(SaveMode.DELTA, "snap")  # b again, a's tombstones: applied now
    shard.write_snapshot(str(tmp_path / "s2"), "snap")
    push(t, b, seed=2, show=20.0)  # b changes again after the snapshot
    push(t, c, show=1.0)
    shard.shrink()  # c deleted after the snapshot: its tombstones are not published yet
    refused = None
    try:
        shard.finish_save(staged, commit=True)  # the late commit
    except CheckpointError as exc:
        refused = exc
    uri = str(tmp_path / "s3")
    checkpoint.publish(uri, [shard.save(uri, SaveMode.DELTA)], None, config=shard.config)
    saved, _, tombs = checkpoint.read_sparse(uri, T)
    assert set(saved.tolist()) == set(b.tolist())  # pushed after the snapshot
    assert set(tombs.tolist()) == set(c.tolist())  # deleted after the snapshot
    assert refused is not None and "not pending" in str(refused)
    shard.close()


# -- found by the model test (test_table_model.py) ------------------------------------------


def test_a_commit_failing_on_a_disk_read_applies_nothing_and_stays_pending(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    shard = Shard(ps_config(tmp_path / "disk"))
    t = shard.table(T)
    keys = np.arange(1, 201, dtype=np.uint64)
    push(t, keys, show=5.0)
    t.demote(t.ram_bytes() // 2)
    assert 0 < t.disk_keys < keys.size
    _, staged = shard.stage_save(str(tmp_path / "s1"), SaveMode.DELTA)
    fail_call(monkeypatch, "get", 1)  # the commit's read of the disk rows
    with pytest.raises(StoreIOError):
        shard.finish_save(staged, commit=True)
    assert delta_keys(shard, str(tmp_path / "s2")) == set(keys.tolist())  # nothing applied
    shard.close()


def test_a_commit_retried_after_a_disk_error_applies_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    shard = Shard(ps_config(tmp_path / "disk"))
    t = shard.table(T)
    keys = np.arange(1, 201, dtype=np.uint64)
    push(t, keys, show=5.0)
    t.demote(t.ram_bytes() // 2)
    _, staged = shard.stage_save(str(tmp_path / "s1"), SaveMode.DELTA)
    fail_call(monkeypatch, "get", 1)
    with pytest.raises(StoreIOError):
        shard.finish_save(staged, commit=True)
    assert shard.finish_save(staged, commit=True)  # pending still: applied now
    assert delta_keys(shard, str(tmp_path / "s2")) == set()
    shard.close()


def test_a_shrink_whose_disk_write_fails_once_still_shrinks_both_tiers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ref = Shard(ps_config())
    shard = Shard(ps_config(tmp_path / "disk"))
    t = shard.table(T)
    keys = np.arange(1, 201, dtype=np.uint64)
    for s in (ref, shard):
        push(s.table(T), keys, show=5.0)
    t.demote(t.ram_bytes() // 2)
    fail_call(monkeypatch, "put", 1)  # the first shard's rewrite of its disk rows
    assert shard.shrink() == ref.shrink()
    np.testing.assert_array_equal(shard.pull_sparse(T, keys), ref.pull_sparse(T, keys))
    ref.close()
    shard.close()
