"""Shrink (decay, eviction, tombstones) and the save-mode filters with their side effects."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from streamtrain_ps.api import SaveMode, SparsePush
from streamtrain_ps.config import PSConfig, TableConfig
from streamtrain_ps.engine.accessor import DELTA, UNSEEN
from streamtrain_ps.saves import checkpoint
from streamtrain_ps.shard import Shard

D = 2
T = "embedding"
A, B, C = 11, 22, 33


def _shard(**table: object) -> Shard:
    tc = TableConfig(
        embedxDim=D,
        embedxThreshold=1e9,
        nonclkCoeff=0.1,
        clickCoeff=1.0,
        deleteThreshold=0.8,
        baseThreshold=1.5,
        deltaThreshold=0.25,
        deltaKeepDays=1,
        **table,  # type: ignore[arg-type]
    )
    return Shard(PSConfig(tables=(tc,), logicalShards=4))


def _push(
    shard: Shard, keys: list[int], shows: list[float], clicks: list[float] | None = None
) -> None:
    n = len(keys)
    c = np.zeros(n, np.float32) if clicks is None else np.array(clicks, np.float32)
    shard.push_sparse(
        T,
        SparsePush(
            np.array(keys, np.uint64),
            np.zeros((n, D + 1), np.float32),
            np.array(shows, np.float32),
            c,
        ),
    )


def _col(shard: Shard, keys: list[int], col: int) -> list[float]:
    t = shard.table(T)
    return t.saves.copy_rows(t.rows_of(np.array(keys, np.uint64)))[1][:, col].tolist()


def _save(
    shard: Shard, root: Path, name: str, mode: SaveMode
) -> tuple[dict[int, np.ndarray], set[int]]:
    uri = str(root / name)
    result = shard.save(uri, mode)
    checkpoint.publish(uri, [result], config=shard.config)
    keys, values, tombs = checkpoint.read_sparse(uri, T)
    assert result.keys_saved == keys.size and result.tombstones == tombs.size
    return {int(k): v for k, v in zip(keys, values, strict=True)}, set(tombs.tolist())


def test_shrink_decays_then_deletes_by_score_and_unseen_days() -> None:
    shard = _shard(showClickDecayRate=0.5, deleteAfterUnseenDays=1)
    _push(shard, [A, B, C], [20, 10, 4], [0, 0, 2])  # scores 2.0, 1.0, 2.2
    r = shard.shrink()
    # decayed: A (10, 0) -> 1.0 kept; B (5, 0) -> 0.5 deleted; C (2, 1) -> 1.1 kept
    assert (r.keys_before, r.deleted, r.keys_after) == (3, 1, 2)
    out = shard.pull_sparse(T, np.array([A, B, C], np.uint64))
    np.testing.assert_allclose(out[:, :2], [[10, 0], [0, 0], [2, 1]])
    stats = shard.stats().tables[0]
    assert (stats.keys, stats.evictions_total) == (2, 1)
    assert shard.table(T).saves.tombstones().tolist() == [B]
    # Unseen days come from batch saves (mode 3); after 2 of them A and C are past 1 day.
    for _ in range(2):
        shard.save("memory://shrink-batch", SaveMode.BATCH)
    assert _col(shard, [A, C], UNSEEN) == [2.0, 2.0]
    _push(shard, [C], [100])  # seen again: unseen_days back to 0
    r = shard.shrink()
    assert (r.keys_before, r.deleted, r.keys_after) == (2, 1, 1)
    assert sorted(shard.table(T).saves.tombstones().tolist()) == [A, B]


def test_a_deleted_key_comes_back_on_push_into_a_reused_row() -> None:
    shard = _shard(showClickDecayRate=0.5)
    _push(shard, [A], [1])
    assert shard.shrink().deleted == 1
    _push(shard, [B], [3])
    out = shard.pull_sparse(T, np.array([A, B], np.uint64))
    np.testing.assert_allclose(out[:, 0], [0, 3])
    assert shard.table(T).rows_of(np.array([B], np.uint64)).tolist() == [0], "row 0 reused"


def test_save_mode_filters_side_effects_and_tombstones(tmp_path: Path) -> None:
    shard = _shard(deleteAfterUnseenDays=30)
    _push(shard, [A, B, C], [20, 5, 16])  # scores 2.0, 0.5, 1.6

    saved, tombs = _save(shard, tmp_path, "delta1", SaveMode.DELTA)
    assert set(saved) == {A, C} and not tombs
    np.testing.assert_allclose(saved[A][:2], [20, 0])
    assert saved[A].shape == (3 + D,)
    assert _col(shard, [A, B, C], DELTA) == [0.0, 0.5, 0.0], "delta_score reset for saved keys"

    _push(shard, [A, C], [1, 3])  # delta 0.1 (< 0.25) and 0.3
    assert shard.shrink().deleted == 1  # B: 0.5 * 0.98 < 0.8
    saved, tombs = _save(shard, tmp_path, "delta2", SaveMode.DELTA)
    assert set(saved) == {C} and tombs == {B}
    saved, tombs = _save(shard, tmp_path, "delta3", SaveMode.DELTA)
    assert not saved and not tombs, "tombstones go into the next delta only"

    saved, tombs = _save(shard, tmp_path, "base", SaveMode.BASE)
    assert set(saved) == {A, C} and not tombs
    assert _col(shard, [A, C], DELTA) == [0.0, 0.0]

    saved, _ = _save(shard, tmp_path, "batch1", SaveMode.BATCH)
    assert set(saved) == {A, C}
    assert _col(shard, [A, C], UNSEEN) == [1.0, 1.0]
    _save(shard, tmp_path, "batch2", SaveMode.BATCH)
    saved, _ = _save(shard, tmp_path, "base2", SaveMode.BASE)
    assert not saved, "unseen_days 2 > deltaKeepDays 1"


def test_checkpoint_carries_tombstones_without_clearing_them(tmp_path: Path) -> None:
    shard = _shard()
    _push(shard, [A, B], [20, 1])
    shard.shrink()
    result = shard.save(str(tmp_path / "ck"), SaveMode.CHECKPOINT)
    assert result.tombstones == 1 and result.keys_saved == 1
    _, tombs = _save(shard, tmp_path, "delta", SaveMode.DELTA)
    assert tombs == {B}


def test_a_recreated_key_in_the_delta_is_not_also_a_tombstone(tmp_path: Path) -> None:
    shard = _shard()
    _push(shard, [A, B], [20, 1])
    shard.shrink()  # B deleted
    _push(shard, [B], [30])  # and back, with a high score
    saved, tombs = _save(shard, tmp_path, "delta", SaveMode.DELTA)
    assert B in saved and not tombs


def test_delta_pushes_during_a_save_still_count(tmp_path: Path) -> None:
    """Side effects subtract what was saved, so increments that race a save are kept."""
    shard = _shard()
    _push(shard, [A], [20])
    t = shard.table(T)
    rows = t.rows_of(np.array([A], np.uint64))
    _, full = t.saves.copy_rows(rows)
    _push(shard, [A], [10])  # arrives between the copy and the side effect
    t.saves.after_save(rows, full[:, DELTA].copy(), unseen_inc=False)
    assert _col(shard, [A], DELTA) == [1.0]
