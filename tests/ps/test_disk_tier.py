"""The disk tier: a shard under a small ``memoryLimit`` gives the same numbers as an
unlimited one (whose rules test_optim.py checks against the NumPy transcription), in
pulls, shrinks, every save mode, loads and N->M resharding; a full disk tier evicts and
counts instead of dying; a limit too small for one request is a clear error."""

from __future__ import annotations

from pathlib import Path

import fsspec
import numpy as np
import pytest

from streamtrain_ps.api import SaveMode, SparsePush
from streamtrain_ps.client.local import LocalPS
from streamtrain_ps.errors import CheckpointError
from streamtrain_ps.saves import checkpoint, load_plan
from streamtrain_ps.shard import Shard
from streamtrain_ps.tier.memory_limit import MemoryLimitError

from . import faultfs
from .conftest import TIER_DIM as D
from .conftest import TIER_KEYS as KEYS
from .conftest import TIER_TABLE as T
from .conftest import capped_shard
from .conftest import tier_config as config
from .conftest import tier_step as step


def pull_all(shard: Shard | LocalPS) -> np.ndarray:
    return shard.pull_sparse(T, np.arange(1, KEYS + 1, dtype=np.uint64))


def saved(uri: str, kind: str = "adagrad") -> tuple[np.ndarray, ...]:
    """A save's keys, values and tombstones by key; for a checkpoint full rows and the
    exact counters of hot keys too."""
    if checkpoint.read_manifest(uri).mode != SaveMode.CHECKPOINT:
        keys, values, tombs = checkpoint.read_sparse(uri, T)
        order = np.argsort(keys)
        return keys[order], values[order], np.sort(tombs)
    tp = load_plan.load_payload(uri, config(kind=kind), 0, 1).tables[T]
    exact = np.zeros((tp.keys.size, 3))
    exact[tp.hot_rows] = tp.hot_counts
    order = np.argsort(tp.keys)
    return tp.keys[order], tp.rows[order], exact[order], np.sort(tp.tombstones)


def save(shard: Shard, uri: str, mode: SaveMode) -> None:
    result = shard.save(uri, mode)
    checkpoint.publish(uri, [result], {}, config=shard.config)


@pytest.mark.parametrize(
    "kind", ["adagrad", "adam", "ftrl", "ftrl/adagrad", "adagrad/scale_free_adagrad"]
)
def test_a_capped_shard_is_bit_identical_to_an_unlimited_one(tmp_path: Path, kind: str) -> None:
    ref = Shard(config(kind=kind))
    capped = capped_shard(tmp_path, 90_000, kind=kind)
    rng = np.random.default_rng(7)
    for day in range(3):
        for _ in range(25):
            step([ref, capped], rng)
            probe = (rng.zipf(1.2, 300) % KEYS + 1).astype(np.uint64)
            np.testing.assert_array_equal(capped.pull_sparse(T, probe), ref.pull_sparse(T, probe))
        for mode in SaveMode:
            uris = [f"{tmp_path}/{who}-{day}-{int(mode)}" for who in ("ref", "capped")]
            save(ref, uris[0], mode)
            save(capped, uris[1], mode)
            for a, b in zip(saved(uris[0], kind), saved(uris[1], kind), strict=True):
                np.testing.assert_array_equal(a, b)
        assert ref.shrink().deleted == capped.shrink().deleted
    t = capped.table(T)
    st = capped.stats().tables[0]
    assert st.disk_keys > 0 and st.promotions_total > 0 and st.demotions_total > 0
    assert st.keys == len(ref.table(T)) == t.total_keys
    assert t.ram_bytes() <= 120_000
    np.testing.assert_array_equal(pull_all(capped), pull_all(ref))
    ref.close()
    capped.close()


def test_save_load_and_reshard_with_disk_resident_keys(tmp_path: Path) -> None:
    ref = Shard(config())
    capped = capped_shard(tmp_path, 100_000)
    rng = np.random.default_rng(3)
    for _ in range(40):
        step([ref, capped], rng)
    assert capped.table(T).disk_keys > 0
    uri = f"{tmp_path}/ckpt"
    save(capped, uri, SaveMode.CHECKPOINT)
    # 1 -> 2 shards, unlimited and capped, and back into a capped single shard.
    for target in (
        LocalPS(config(), num_shards=2),
        LocalPS(config(tmp_path / "disk2", limit=60_000), num_shards=2),
        LocalPS(config(tmp_path / "disk3", limit=80_000), num_shards=1),
    ):
        target.load(uri)
        np.testing.assert_array_equal(pull_all(target), pull_all(ref))
        for _ in range(5):  # and they keep training identically
            keys = (rng.zipf(1.2, 300) % KEYS + 1).astype(np.uint64)
            g = rng.normal(0, 1, (300, D + 1)).astype(np.float32)
            s = np.ones(300, np.float32)
            target.push_sparse(T, SparsePush(keys, g, s, s * 0))
            ref.push_sparse(T, SparsePush(keys, g, s, s * 0))
        np.testing.assert_array_equal(pull_all(target), pull_all(ref))
        target.close()
        ref.close()
        ref = Shard(config())
        ref.load(uri)
    capped.close()


def test_a_full_disk_tier_evicts_by_the_shrink_rule_and_counts(tmp_path: Path) -> None:
    shard = capped_shard(tmp_path, 100_000, disk=60_000)
    rng = np.random.default_rng(5)
    for _ in range(60):
        step([shard], rng)
    t = shard.table(T)
    st = shard.stats().tables[0]
    assert st.pressure_evictions_total > 0
    assert st.evictions_total >= st.pressure_evictions_total
    assert t.disk_bytes() <= 60_000 and t.ram_bytes() <= 100_000
    assert st.keys == t.total_keys
    # evicted keys are deleted from the model (a key may be evicted, re-created, evicted)
    assert 0 < shard.table(T).saves.tombstones().size <= st.pressure_evictions_total
    shard.close()


def test_a_limit_too_small_for_one_request_names_the_field(tmp_path: Path) -> None:
    shard = capped_shard(tmp_path, 20_000)
    rng = np.random.default_rng(1)
    with pytest.raises(MemoryLimitError, match=r"spec\.ps\.memoryLimit .* needs \d+ bytes"):
        step([shard], rng, n=2_000)
    assert len(shard.table(T)) == 0, "the refused request changed nothing"
    shard.close()


@pytest.fixture
def failfs() -> faultfs.Faults:
    fsspec.register_implementation(faultfs.PROTOCOL, faultfs.FailingFileSystem, clobber=True)
    return faultfs.reset()


def test_a_disk_full_save_keeps_the_previous_one_and_the_disk_tier(
    tmp_path: Path, failfs: faultfs.Faults
) -> None:
    shard = capped_shard(tmp_path, 100_000)
    rng = np.random.default_rng(9)
    for _ in range(30):
        step([shard], rng)
    uri = "failfs://models/tiered"
    save(shard, uri, SaveMode.CHECKPOINT)
    published = saved(uri)
    for _ in range(10):
        step([shard], rng)
    before = pull_all(shard)
    assert shard.table(T).disk_keys > 0
    faultfs.arm(byte_budget=20_000)
    with pytest.raises(CheckpointError, match="No space left on device"):
        save(shard, uri, SaveMode.CHECKPOINT)
    faultfs.arm()
    for a, b in zip(saved(uri), published, strict=True):
        np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(pull_all(shard), before)
    assert shard.table(T).disk_keys > 0
    faultfs.reset()
    shard.close()


def test_a_demotion_spares_keys_pulled_since_the_hand_last_passed(tmp_path: Path) -> None:
    """Second chance (CLOCK): keys a pull promoted (the lowest score in RAM) stay in RAM
    while the demotions' hand passes them once, and untouched keys of the same score go;
    the hand cleared their marks, so when it comes round again they may go too."""
    shard = capped_shard(tmp_path, 400_000)
    t = shard.table(T)
    one = np.ones(1_000, np.float32)
    grads = np.zeros((1_000, D + 1), np.float32)

    def push(keys: np.ndarray) -> None:  # one score for all keys: ties everywhere
        for lo in range(0, keys.size, 1_000):
            k = keys[lo : lo + 1_000]
            shard.push_sparse(T, SparsePush(k, grads[: k.size], one[: k.size], 0 * one[: k.size]))

    keys = np.arange(1, 40_001, dtype=np.uint64)
    push(keys)
    on_disk = keys[t.rows_of(keys) < 0]
    assert on_disk.size > 20_000 and t.disk_keys == on_disk.size
    pulled = on_disk[:500]
    shard.pull_sparse(T, pulled)
    assert (t.rows_of(pulled) >= 0).all(), "promoted"
    before = t.demotions_total
    new = 10**9
    while t.demotions_total == before:  # new keys until one demotion ran
        push(np.arange(new, new + 200, dtype=np.uint64))
        new += 200
    assert t.demotions_total - before >= 200, "untouched keys of that score went"
    assert (t.rows_of(pulled) >= 0).all(), "the pulled keys had a second chance"
    push(np.arange(2 * 10**9, 2 * 10**9 + 40_000, dtype=np.uint64))  # laps: marks cleared
    assert (t.rows_of(pulled) < 0).any(), "unmarked by the hand, they may go again"
    shard.close()
