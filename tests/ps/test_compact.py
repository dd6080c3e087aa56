"""Compact rows: embedx (and its optimizer state) exists only for admitted keys.

The update rules themselves are checked against the NumPy transcription in test_optim.py;
these tests pin what the second slab changes: memory, freeing and reuse of embedx rows at
shrink, and that a table rebuilt from its own checkpoint behaves bit-identically.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from streamtrain_ps.api import SaveMode, SparsePush
from streamtrain_ps.config import PSConfig, SparseOptimizerConfig, TableConfig
from streamtrain_ps.engine.accessor import RowLayout, save_filter
from streamtrain_ps.engine.packed import SLOT_CODES, UNSEEN_MAX
from streamtrain_ps.errors import CheckpointError, InvalidRequestError
from streamtrain_ps.saves import checkpoint
from streamtrain_ps.shard import Shard

D = 8
T = "embedding"


def _shard(kind: str = "adagrad", **table: object) -> Shard:
    """``kind``: a rule, or ``embed_rule/embedx_rule`` for the two parts apart."""
    embed, _, embedx = kind.rpartition("/")
    opt = SparseOptimizerConfig(type=embedx, embedType=embed or None)  # type: ignore[arg-type]
    tc = TableConfig(embedxDim=D, optimizer=opt, **table)  # type: ignore[arg-type]
    return Shard(PSConfig(tables=(tc,), logicalShards=4, maxKeysPerRequest=100_000))


def _push(shard: Shard, keys: np.ndarray, shows: np.ndarray, seed: int = 0) -> None:
    rng = np.random.default_rng(seed)
    grads = rng.normal(0, 1, (keys.size, D + 1)).astype(np.float32)
    clicks = ((rng.random(keys.size) < 0.2) * np.minimum(shows, 1)).astype(np.float32)
    shard.push_sparse(
        T, SparsePush(keys.astype(np.uint64), grads, shows.astype(np.float32), clicks)
    )


def test_unadmitted_keys_cost_no_embedx_memory() -> None:
    shard = _shard(embedxThreshold=1e9)
    t = shard.table(T)
    n = 20_000
    _push(shard, np.arange(1, n + 1), np.ones(n))
    lay = t.layout
    assert lay.primary_width == 6, "delta, show, click, embed_w, G, packed slot/unseen/pointer"
    assert t.expanded_keys == 0
    assert t.memory_bytes() == t.slot_capacity * 4 + n * (8 + 4 * lay.primary_width)
    pulled = shard.pull_sparse(T, np.arange(1, n + 1, dtype=np.uint64))
    assert not pulled[:, 3:].any() and pulled[:, 2].any()


def test_shrink_frees_embedx_rows_and_admission_reuses_them() -> None:
    cfg = {"embedxThreshold": 1.0, "deleteThreshold": 0.5, "showClickDecayRate": 0.01}
    shard = _shard(**cfg)
    t = shard.table(T)
    hot = np.arange(1, 101)
    _push(shard, hot, np.full(100, 20.0))  # score >= 2: admitted
    keep = hot[50:]
    _push(shard, keep, np.full(50, 5000.0))
    assert t.expanded_keys == 100
    high = t.memory_bytes()
    # Decay x0.01: the first 50 fall to score < 0.5 and are deleted, embedx rows and all.
    result = shard.shrink(T)
    assert result.deleted == 50 and len(t) == 50 and t.expanded_keys == 50
    fresh = np.arange(5000, 5050)
    _push(shard, fresh, np.full(50, 20.0))  # admitted into the freed rows
    assert t.expanded_keys == 100
    assert t.memory_bytes() == high, "rows and embedx rows were reused, nothing grew"
    # A reused embedx row holds exactly what a fresh one would (init is a hash of the key).
    ref = _shard(**cfg)
    _push(ref, fresh, np.full(50, 20.0))
    np.testing.assert_array_equal(
        shard.pull_sparse(T, fresh.astype(np.uint64)), ref.pull_sparse(T, fresh.astype(np.uint64))
    )


@pytest.mark.parametrize(
    "kind", ["adagrad", "std_adagrad", "adam", "ftrl", "ftrl/adagrad", "adagrad/scale_free_adagrad"]
)
def test_a_checkpoint_round_trip_is_bit_identical_and_keeps_training_identically(
    tmp_path: Path, kind: str
) -> None:
    rng = np.random.default_rng(5)
    space = np.unique(rng.integers(1, 2**63, 3000, dtype=np.uint64))
    src = _shard(kind, embedxThreshold=3.0)
    for step in range(4):  # a long tail: few keys reach the threshold
        keys = space[np.minimum(rng.zipf(1.3, 4000) - 1, space.size - 1)]
        _push(src, keys, rng.integers(0, 4, keys.size).astype(np.float64), seed=step)
    t = src.table(T)
    assert 0 < t.expanded_keys < len(t)
    uri = str(tmp_path / "ck")
    checkpoint.publish(uri, [src.save(uri, SaveMode.CHECKPOINT)], config=src.config)
    dst = _shard(kind, embedxThreshold=3.0)
    dst.load(uri)
    live = space[t.rows_of(space) >= 0]
    full_src = t.saves.copy_rows(t.rows_of(live))[1]
    full_dst = dst.table(T).saves.copy_rows(dst.table(T).rows_of(live))[1]
    np.testing.assert_array_equal(full_src.view(np.uint32), full_dst.view(np.uint32))
    lay = RowLayout.of(src.config.tables[0])
    assert full_src.shape[1] == lay.width
    assert dst.table(T).expanded_keys == t.expanded_keys
    for step in range(3):
        keys = space[rng.integers(0, space.size, 2000)]
        shows = rng.integers(0, 4, keys.size).astype(np.float64)
        _push(src, keys, shows, seed=10 + step)
        _push(dst, keys, shows, seed=10 + step)
    a = src.pull_sparse(T, space)
    b = dst.pull_sparse(T, space)
    np.testing.assert_array_equal(a.view(np.uint32), b.view(np.uint32))


@pytest.mark.parametrize("mode", [SaveMode.DELTA, SaveMode.BASE, SaveMode.BATCH])
def test_a_save_selects_exactly_the_rows_the_save_filter_keeps(mode: SaveMode) -> None:
    rng = np.random.default_rng(8)
    shard = _shard(embedxThreshold=3.0, deltaKeepDays=1)
    t = shard.table(T)
    space = np.arange(1, 5001, dtype=np.uint64)
    for step in range(3):
        keys = space[rng.integers(0, space.size, 6000)]
        _push(shard, keys, rng.integers(0, 3, keys.size).astype(np.float64), seed=step)
        t.saves.after_save(t.rows_of(keys[:500]), np.zeros(500, np.float32), unseen_inc=True)
    rows = t.rows_of(space)
    rows = rows[rows >= 0]
    kept, keys, full, _ = t.saves.snapshot(rows, mode)
    _, everything = t.saves.copy_rows(rows)
    want = save_filter(everything, mode, t.config)
    assert 0 < want.sum() <= rows.size
    np.testing.assert_array_equal(kept, rows[want])
    np.testing.assert_array_equal(full, everything[want])


def test_slot_ids_and_unseen_days_round_trip_through_the_packed_word(tmp_path: Path) -> None:
    """Slot ids are coded per table, unseen_days is a saturating uint16 (``packed``): both
    come back bit-identical in full rows and checkpoints, admitted or not."""
    shard = _shard(embedxThreshold=3.0)
    t = shard.table(T)
    keys = np.arange(1, 201, dtype=np.uint64)
    slots = np.array([0, 1, 2**31, 2**32 - 1] * 50, dtype=np.uint32)
    shows = np.where(keys % 2 == 0, 50.0, 1.0).astype(np.float32)  # every other key admitted
    z = np.zeros(keys.size, np.float32)
    shard.push_sparse(
        T, SparsePush(keys, np.zeros((keys.size, D + 1), np.float32), shows, z, slots)
    )
    assert t.expanded_keys == 100
    days = (keys % 5).astype(np.int64)
    for d in range(1, 5):  # key k ages (k % 5) days
        at = keys[days >= d]
        t.saves.after_save(t.rows_of(at), np.zeros(at.size, np.float32), unseen_inc=True)
    _, full = t.saves.copy_rows(t.rows_of(keys))
    np.testing.assert_array_equal(full[:, 0].view(np.uint32), slots)
    np.testing.assert_array_equal(full[:, 1], days.astype(np.float32))
    uri = str(tmp_path / "ck")
    checkpoint.publish(uri, [shard.save(uri, SaveMode.CHECKPOINT)], config=shard.config)
    dst = _shard(embedxThreshold=3.0)
    dst.load(uri)
    _, back = dst.table(T).saves.copy_rows(dst.table(T).rows_of(keys))
    np.testing.assert_array_equal(back.view(np.uint32), full.view(np.uint32))


def test_unseen_days_saturate_at_the_packed_maximum() -> None:
    shard = _shard()
    t = shard.table(T)
    keys = np.arange(1, 4, dtype=np.uint64)
    _push(shard, keys, np.ones(3))
    full = t.saves.copy_rows(t.rows_of(keys))[1]
    full[:, 1] = [UNSEEN_MAX - 1, UNSEEN_MAX, 1e9]
    t.install(t.build(keys, full, np.empty(0, np.uint64)))
    t.saves.after_save(t.rows_of(keys), np.zeros(3, np.float32), unseen_inc=True)
    np.testing.assert_array_equal(t.saves.copy_rows(t.rows_of(keys))[1][:, 1], [UNSEEN_MAX] * 3)
    full[0, 1] = 2.5
    with pytest.raises(ValueError, match=r"row 0: unseen_days 2.5 is not a whole number"):
        t.build(keys, full, np.empty(0, np.uint64))


def test_a_push_past_the_slot_dictionary_changes_nothing() -> None:
    shard = _shard()
    t = shard.table(T)
    n = SLOT_CODES  # slot id 0 has code 0: ids 1..SLOT_CODES - 1 fit, one more does not
    keys = np.arange(1, n + 1, dtype=np.uint64)
    slots = np.arange(1, n + 1, dtype=np.uint32)
    g = np.zeros((n, D + 1), np.float32)
    ones = np.ones(n, np.float32)
    shard.push_sparse(T, SparsePush(keys[:-1], g[:-1], ones[:-1], ones[:-1] * 0, slots[:-1]))
    before = t.saves.copy_rows(t.rows_of(keys[:-1]))[1]
    with pytest.raises(InvalidRequestError, match=f"slots: slot id {n}: table 'embedding'"):
        shard.push_sparse(T, SparsePush(keys, g, ones, ones * 0, slots))
    assert len(t) == n - 1
    np.testing.assert_array_equal(t.saves.copy_rows(t.rows_of(keys[:-1]))[1], before)
    shard.push_sparse(
        T, SparsePush(keys[:2], g[:2], ones[:2], ones[:2] * 0, slots[:2])
    )  # known ids: fine


def test_a_checkpoint_loads_only_into_the_same_rule_of_each_part(tmp_path: Path) -> None:
    src = _shard("ftrl/adagrad", embedxThreshold=0.0)
    keys = np.arange(1, 50, dtype=np.uint64)
    _push(src, keys, np.ones(keys.size))
    uri = str(tmp_path / "ck")
    checkpoint.publish(uri, [src.save(uri, SaveMode.CHECKPOINT)], config=src.config)
    with pytest.raises(CheckpointError, match=r"embed:ftrl,embedx:adagrad.*says adagrad"):
        _shard("adagrad", embedxThreshold=0.0).load(uri)
    same = _shard("ftrl/adagrad", embedxThreshold=0.0)
    same.load(uri)
    np.testing.assert_array_equal(same.pull_sparse(T, keys), src.pull_sparse(T, keys))
