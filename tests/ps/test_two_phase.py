"""Two-phase saves and loads: all or nothing across shards and servers.

- A save's side effects (delta_score, tombstones, unseen_days) are staged and committed only
  after the manifest is published; a failure on one server leaves every server unchanged,
  so the retried delta holds every changed key (before: 520 of 1,000).
- Staged effects stay right when pushes and shrinks happen between stage and commit, and a
  newer staged save supersedes an older one deterministically.
- A load prepares (reads + verifies) on every server before any swaps in: one corrupt part
  on server 1 leaves both servers serving their previous state.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import fsspec
import numpy as np
import pytest

from streamtrain_ps.api import SaveMode
from streamtrain_ps.client.local import LocalPS
from streamtrain_ps.errors import CheckpointError
from streamtrain_ps.saves import checkpoint
from streamtrain_ps.shard import Shard

from . import faultfs
from .conftest import TWO_PHASE_TABLE as T
from .conftest import Cluster
from .conftest import spread_keys as keys
from .conftest import two_phase_config as config
from .conftest import two_phase_push as push
from .faultfs import Faults

pytestmark = pytest.mark.faults


@pytest.fixture
def failfs() -> Iterator[Faults]:
    fsspec.register_implementation(faultfs.PROTOCOL, faultfs.FailingFileSystem, clobber=True)
    yield faultfs.reset()
    faultfs.reset()


def data_dirs(prefix: str, server: int) -> set[str]:
    """The ``data-s<server>-*`` directories on the failfs disk (one per save attempt)."""
    marker = f"data-s{server:03d}-"
    return {p.split(marker, 1)[1].split("/", 1)[0] for p in faultfs.files(prefix) if marker in p}


def manifest(uri: str) -> bytes:
    fs, root = fsspec.core.url_to_fs(uri)
    data: bytes = fs.cat_file(f"{root}/{checkpoint.MANIFEST}")
    return data


@pytest.mark.parametrize("kind", ["remote", "local"])
def test_retried_delta_after_a_partial_failure_holds_every_changed_key(
    kind: str, failfs: Faults, ps_cluster: Callable[..., Cluster]
) -> None:
    cfg = config()
    ps: Any = ps_cluster(2, config=cfg).client() if kind == "remote" else LocalPS(cfg, 2)
    try:
        uri = "failfs://models/delta"
        push(ps, keys(0, 500), show=5, click=1)
        ps.save(uri, SaveMode.DELTA)  # the previously published delta
        before = manifest(uri)
        changed = keys(0, 1000)
        push(ps, changed, show=5, click=1, seed=1)

        faultfs.arm(fail_paths=("data-s001-",))  # every part of server 1 fails
        written = data_dirs("models/delta", 0)
        with pytest.raises(CheckpointError, match="No space"):
            ps.save(uri, SaveMode.DELTA)
        assert manifest(uri) == before  # the previous delta is intact
        assert faultfs.FailingFileSystem.faults.failures >= 1
        # server 0 did write its parts in the failed attempt (its effects were staged)
        assert len(data_dirs("models/delta", 0) - written) == 1

        faultfs.arm()
        result = ps.save(uri, SaveMode.DELTA)
        saved, _, _ = checkpoint.read_sparse(uri, T)
        assert np.array_equal(np.sort(saved), np.sort(changed))  # all 1,000, not 520
        assert result.keys_saved == changed.size
        # and this time the effects were committed: nothing changed since, nothing to save
        assert ps.save(uri, SaveMode.DELTA).keys_saved == 0
    finally:
        ps.close()


def test_batch_save_ages_unseen_days_only_when_every_server_succeeded(
    failfs: Faults, ps_cluster: Callable[..., Cluster]
) -> None:
    cluster = ps_cluster(2, config=config())
    ps = cluster.client()
    k = keys(0, 200)
    push(ps, k, show=5, click=1)
    faultfs.arm(fail_paths=("data-s000-",))
    with pytest.raises(CheckpointError):
        ps.save("failfs://models/batch", SaveMode.BATCH)
    assert len(data_dirs("models/batch", 1)) == 1  # server 1 wrote its parts
    faultfs.arm()
    ps.save("failfs://models/batch", SaveMode.BATCH)
    unseen = []
    for shard in cluster.shards:
        t = shard.table(T)
        rows = t.rows_of(k)
        owned = rows >= 0
        unseen.append(t.saves.copy_rows(rows[owned])[1][:, t.layout.columns().index("unseen_days")])
    assert np.concatenate(unseen).tolist() == [1.0] * k.size  # aged once, not twice


def test_staged_effects_survive_pushes_and_shrinks_before_the_commit(tmp_path: Path) -> None:
    # deleteThreshold 0.8: score 0.1 (1 show, 0 clicks) and 0.3 (3 shows) decay below it
    shard = Shard(config(deleteThreshold=0.8))
    try:
        a, b, d = keys(0, 50), keys(100, 200), keys(300, 340)
        push(shard, a, show=1, click=0)  # score 0.1: deleted by the first shrink
        push(shard, b, show=5, click=1)  # score 1.4: in every delta, survives shrinks
        assert shard.shrink().deleted == a.size
        push(shard, d, show=3, click=0)  # score 0.3: in the delta, deleted by the next shrink
        first, save_id = shard.stage_save(str(tmp_path / "s1"), SaveMode.DELTA)
        assert first.keys_saved == b.size + d.size and first.tombstones == a.size

        # between stage and commit: re-push part of b, delete d, re-create d, delete c
        c = keys(500, 520)
        push(shard, b[:10], show=5, click=1, seed=2)
        push(shard, c, show=1, click=0, seed=3)
        assert shard.shrink().deleted == d.size + c.size
        push(shard, d, show=3, click=0, seed=4)  # re-created, possibly in reused rows
        assert shard.finish_save(save_id, commit=True) is True

        uri = str(tmp_path / "s2")
        checkpoint.publish(uri, [shard.save(uri, SaveMode.DELTA)], None, config=shard.config)
        saved, _, tombs = checkpoint.read_sparse(uri, T)
        # b[:10] got a new push; d is new again (its old saved delta was not subtracted)
        assert set(saved.tolist()) == set(b[:10].tolist()) | set(d.tolist())
        # a's tombstones went out with the first delta; c's (and d's, now an upsert) did not
        assert set(tombs.tolist()) == set(c.tolist())
    finally:
        shard.close()


def test_a_newer_staged_save_supersedes_an_older_one(tmp_path: Path) -> None:
    shard = Shard(config())
    try:
        k = keys(0, 100)
        push(shard, k, show=5, click=1)
        _, old = shard.stage_save(str(tmp_path / "a"), SaveMode.DELTA)
        _, new = shard.stage_save(str(tmp_path / "b"), SaveMode.DELTA)
        with pytest.raises(CheckpointError, match=f"staged save {old} is not pending"):
            shard.finish_save(old, commit=True)
        assert shard.finish_save(new, commit=True) is True
        assert shard.finish_save(new, commit=True) is True  # a retried commit is a no-op
        assert shard.save(str(tmp_path / "c"), SaveMode.DELTA).keys_saved == 0

        # an abort that overtakes its stage: the late stage is dropped, not left pending
        push(shard, k, show=5, click=1)
        assert shard.finish_save("late", commit=False) is False
        shard.stage_save(str(tmp_path / "d"), SaveMode.DELTA, save_id="late")
        with pytest.raises(CheckpointError, match="not pending"):
            shard.finish_save("late", commit=True)
        assert shard.save(str(tmp_path / "e"), SaveMode.DELTA).keys_saved == k.size

        # a load replaces the content a staged save refers to: the save is dropped
        uri = str(tmp_path / "ckpt")
        checkpoint.publish(uri, [shard.save(uri, SaveMode.CHECKPOINT)], None)
        _, staged = shard.stage_save(str(tmp_path / "f"), SaveMode.BASE)
        shard.load(uri)
        with pytest.raises(CheckpointError, match="not pending"):
            shard.finish_save(staged, commit=True)
    finally:
        shard.close()


def test_a_corrupt_part_on_one_server_loads_nothing_anywhere(
    tmp_path: Path, ps_cluster: Callable[..., Cluster]
) -> None:
    cluster = ps_cluster(2, config=config())
    ps = cluster.client()
    k = keys(0, 600)
    push(ps, k, show=5, click=1)
    good = str(tmp_path / "good")
    ps.save(good, SaveMode.CHECKPOINT)
    saved_state = ps.pull_sparse(T, k)
    bad = str(tmp_path / "bad")
    ps.save(bad, SaveMode.CHECKPOINT)
    push(ps, k, show=2, click=0, seed=5)  # the servers move on
    current = ps.pull_sparse(T, k)
    assert not np.array_equal(current, saved_state)

    part = next(
        p
        for p in checkpoint.read_manifest(bad).files
        if p.startswith("data-s001-") and "sparse" in p
    )
    path = Path(bad) / part
    original = path.read_bytes()
    data = bytearray(original)
    data[-4:] = bytes(4 - i for i in range(4))  # same size, wrong sha256
    path.write_bytes(bytes(data))

    with pytest.raises(CheckpointError, match=r"sha256|checksum"):
        ps.load(bad)
    np.testing.assert_array_equal(ps.pull_sparse(T, k), current)  # both servers unchanged
    for shard in cluster.shards:  # nothing left prepared: a commit now has nothing to swap
        with pytest.raises(CheckpointError, match="not pending"):
            shard.finish_load(bad, commit=True)

    assert ps.load(good) == k.size
    np.testing.assert_array_equal(ps.pull_sparse(T, k), saved_state)
    path.write_bytes(original)  # repaired: the same uri loads now (nothing stale remembered)
    assert ps.load(bad) == k.size
    np.testing.assert_array_equal(ps.pull_sparse(T, k), saved_state)
