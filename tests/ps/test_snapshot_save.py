"""Snapshot saves: a model taken between two passes, written while the next one trains.

``snapshot`` copies every shard's parts into memory and applies the save's side effects at
that moment; ``save_snapshot`` writes those parts later. Pushes in between change neither
what is written nor the effects, so the model published is the one of the moment taken —
what lets the scheduler write a pass's delta beside the next pass (docs/scheduler.md §4).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from streamtrain_ps.api import SaveMode
from streamtrain_ps.client.local import LocalPS
from streamtrain_ps.errors import CheckpointError, InvalidRequestError, UnknownTableError
from streamtrain_ps.saves import checkpoint
from streamtrain_ps.shard import Shard

from .conftest import TWO_PHASE_TABLE as T
from .conftest import Cluster
from .conftest import spread_keys as keys
from .conftest import two_phase_config as config
from .conftest import two_phase_push as push


def saved(uri: Path) -> dict[int, bytes]:
    """Every saved key with its inference row (order-independent)."""
    k, values, _ = checkpoint.read_sparse(str(uri), T)
    return {int(key): row.tobytes() for key, row in zip(k, values, strict=True)}


@pytest.mark.parametrize("kind", ["remote", "local"])
def test_a_snapshot_writes_the_model_of_its_moment_and_applies_its_effects_then(
    kind: str, tmp_path: Path, ps_cluster: Callable[..., Cluster]
) -> None:
    cfg = config()
    ps: Any = ps_cluster(2, config=cfg).client() if kind == "remote" else LocalPS(cfg, 2)
    twin = LocalPS(cfg, 2)  # the same pushes, saved the ordinary way at the same moment
    try:
        for target in (ps, twin):
            push(target, keys(0, 600), show=5, click=1)
        twin.save(str(tmp_path / "expected"), SaveMode.DELTA)
        ps.snapshot(SaveMode.DELTA, "pass-1")
        ps.snapshot(SaveMode.DELTA, "pass-1")  # a retried call: nothing applied twice
        # The next pass trains before the snapshot is written: old and new keys.
        push(ps, keys(300, 900), show=5, click=1, seed=1)
        result = ps.save_snapshot(str(tmp_path / "delta-1"), SaveMode.DELTA, "pass-1")
        assert saved(tmp_path / "delta-1") == saved(tmp_path / "expected")
        assert result.keys_saved == 600
        # The effects happened at the snapshot: the next delta holds exactly the keys the
        # next pass pushed (delta_score of the others was reset when it was taken).
        ps.save(str(tmp_path / "delta-2"), SaveMode.DELTA)
        assert set(saved(tmp_path / "delta-2")) == {int(k) for k in keys(300, 900)}
        # Published and freed: writing it again names it as gone.
        with pytest.raises(CheckpointError, match="not held"):
            ps.save_snapshot(str(tmp_path / "again"), SaveMode.DELTA, "pass-1")
    finally:
        ps.close()
        twin.close()


@pytest.mark.parametrize("kind", ["remote", "local"])
def test_a_snapshot_holds_the_dense_vectors_of_its_moment(
    kind: str, tmp_path: Path, ps_cluster: Callable[..., Cluster]
) -> None:
    # A worker exports the model's dense part from the snapshot while the next pass
    # pushes to the live vectors (``PSLike.pull_dense(name, snapshot_id)``).
    cfg = config()
    ps: Any = ps_cluster(2, config=cfg).client() if kind == "remote" else LocalPS(cfg, 2)
    try:
        taken = np.linspace(-1, 1, 12, dtype=np.float32)
        ps.init_dense("net", taken)
        push(ps, keys(0, 100), show=5, click=1)
        ps.snapshot(SaveMode.DELTA, "pass-1")
        ps.push_dense("net", np.ones(12, dtype=np.float32))  # the next pass trains
        assert np.array_equal(ps.pull_dense("net", "pass-1"), taken)
        assert not np.allclose(ps.pull_dense("net"), taken)
        with pytest.raises(UnknownTableError, match="other"):
            ps.pull_dense("other", "pass-1")
        ps.save_snapshot(str(tmp_path / "delta-1"), SaveMode.DELTA, "pass-1")
        # Written and freed with the sparse parts: a late reader is told, not served.
        with pytest.raises(CheckpointError, match="not held"):
            ps.pull_dense("net", "pass-1")
    finally:
        ps.close()


def test_a_failed_write_can_be_retried_with_the_same_content(tmp_path: Path) -> None:
    shard = Shard(config())
    push(shard, keys(0, 200), show=5, click=1)
    shard.snapshot_save(SaveMode.BASE, "s")
    push(shard, keys(0, 400), show=5, click=1, seed=1)
    (tmp_path / "blocked").write_bytes(b"a file where the save's directory should be")
    with pytest.raises(CheckpointError, match="save to"):
        shard.write_snapshot(str(tmp_path / "blocked"), "s")
    first = shard.write_snapshot(str(tmp_path / "one"), "s")
    second = shard.write_snapshot(str(tmp_path / "two"), "s")
    assert first.files == second.files and first.keys_saved == 200
    assert [f.path for f in first.files] == [f.path for f in second.files]


def test_bad_snapshot_requests_are_named() -> None:
    shard = Shard(config())
    with pytest.raises(InvalidRequestError, match="table"):
        shard.snapshot_save(SaveMode.CHECKPOINT, "s", table=T)
    with pytest.raises(InvalidRequestError, match="save_id"):
        shard.snapshot_save(SaveMode.DELTA, "")
    shard.snapshot_save(SaveMode.DELTA, "old")
    shard.snapshot_save(SaveMode.DELTA, "new")  # replaces the one held
    with pytest.raises(CheckpointError, match="snapshot old is not held"):
        shard.write_snapshot("memory://x", "old")
    with pytest.raises(InvalidRequestError, match="uri"):
        shard.write_snapshot("", "new")
    # A cap far above what this test process holds: a shard refuses a limit below its RSS.
    capped = Shard(dataclasses.replace(config(), memoryLimit=16 << 30))
    with pytest.raises(InvalidRequestError, match="outside this shard's memoryLimit"):
        capped.snapshot_save(SaveMode.CHECKPOINT, "s")
    capped.close()


@pytest.mark.parametrize("kind", ["remote", "local"])
def test_a_checkpoint_snapshot_holds_the_model_of_its_moment(
    kind: str, tmp_path: Path, ps_cluster: Callable[..., Cluster]
) -> None:
    """A checkpoint taken between two passes and written while the next one pushes (the
    scheduler's ``checkpoint.besideTraining``) holds the rows and the dense vector with its
    optimizer state as they were when it was taken: the same part files, byte for byte, as
    an ordinary checkpoint at that moment, and it reloads to that dense vector."""
    cfg = config()
    ps: Any = ps_cluster(2, config=cfg).client() if kind == "remote" else LocalPS(cfg, 2)
    twin = LocalPS(cfg, 2)
    try:
        for target in (ps, twin):
            target.init_dense("mlp", np.zeros(16, np.float32))
            push(target, keys(0, 600), show=5, click=1)
            target.push_dense("mlp", np.full(16, 0.5, np.float32))
        twin.save(str(tmp_path / "expected"), SaveMode.CHECKPOINT)
        ps.snapshot(SaveMode.CHECKPOINT, "ckpt-6")
        push(ps, keys(300, 900), show=5, click=1, seed=1)  # the next pass
        ps.push_dense("mlp", np.full(16, -1.0, np.float32))
        result = ps.save_snapshot(str(tmp_path / "ckpt"), SaveMode.CHECKPOINT, "ckpt-6")
        assert result.keys_saved == 600
        assert part_digests(tmp_path / "ckpt") == part_digests(tmp_path / "expected")
        expected = twin.pull_dense("mlp")
        twin.push_dense("mlp", np.full(16, 0.25, np.float32))
        twin.load(str(tmp_path / "ckpt"))
        assert twin.pull_dense("mlp").tobytes() == expected.tobytes()
        with pytest.raises(CheckpointError, match="not held"):  # published and freed
            ps.save_snapshot(str(tmp_path / "again"), SaveMode.CHECKPOINT, "ckpt-6")
    finally:
        ps.close()
        twin.close()


def part_digests(uri: Path) -> list[str]:
    """The sha256 of every part a save's manifest lists (sparse and dense)."""
    return sorted(f["sha256"] for f in checkpoint.read_manifest(str(uri)).files.values())
