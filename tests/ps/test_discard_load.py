"""The two load modes side by side: by default a load keeps the live tables until the new
ones are complete (a bad checkpoint changes nothing); with ``discard_live`` every part is
verified first (a bad checkpoint is refused before anything is dropped), then the live
tables are released and the save built in their place, and a failure after the release
leaves the shard empty, says so, and a retried load fills it. In process (``LocalPS``, two
shards) and over gRPC (two servers, the two-phase load)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from streamtrain_ps.api import SaveMode
from streamtrain_ps.client.local import LocalPS
from streamtrain_ps.errors import CheckpointError
from streamtrain_ps.saves import checkpoint
from streamtrain_ps.shard import Shard

from .conftest import TWO_PHASE_TABLE as T
from .conftest import Cluster
from .conftest import spread_keys as keys
from .conftest import two_phase_config as config
from .conftest import two_phase_push as push


def corrupt(uri: str, shard_index: int) -> tuple[Path, bytes]:
    """Flip the last bytes of one sparse part of ``shard_index`` (same size, wrong sha256);
    returns the path and its original bytes."""
    part = next(
        p
        for p in checkpoint.read_manifest(uri).files
        if p.startswith(f"data-s{shard_index:03d}-") and "sparse" in p
    )
    path = Path(uri) / part
    original = path.read_bytes()
    data = bytearray(original)
    data[-4:] = bytes(4 - i for i in range(4))
    path.write_bytes(bytes(data))
    return path, original


@pytest.fixture(params=["local", "grpc"])
def two_shards(request: pytest.FixtureRequest, ps_cluster: Callable[..., Cluster]) -> Any:
    if request.param == "local":
        ps = LocalPS(config(), num_shards=2)
        yield ps
        ps.close()
    else:
        yield ps_cluster(2, config=config()).client()


@pytest.mark.parametrize("discard_live", [False, True])
def test_a_bad_checkpoint_changes_nothing_in_either_mode(
    tmp_path: Path, two_shards: Any, discard_live: bool
) -> None:
    ps = two_shards
    k = keys(0, 600)
    push(ps, k, show=5, click=1)
    bad = str(tmp_path / "bad")
    ps.save(bad, SaveMode.CHECKPOINT)
    saved = ps.pull_sparse(T, k)
    push(ps, k, show=2, click=0, seed=5)  # the live model moves on
    live = ps.pull_sparse(T, k)
    assert not np.array_equal(live, saved)
    path, original = corrupt(bad, 1)
    with pytest.raises(CheckpointError, match=r"checksum"):
        ps.load(bad, discard_live=discard_live)
    # refused on every shard before any dropped its live tables (or swapped anything)
    np.testing.assert_array_equal(ps.pull_sparse(T, k), live)
    path.write_bytes(original)
    assert ps.load(bad, discard_live=discard_live) == k.size
    np.testing.assert_array_equal(ps.pull_sparse(T, k), saved)


def test_a_failure_after_the_discard_leaves_the_shard_empty_and_says_so(tmp_path: Path) -> None:
    shard = Shard(config())
    try:
        k = keys(0, 400)
        push(shard, k, show=5, click=1)
        uri = str(tmp_path / "ckpt")
        checkpoint.publish(uri, [shard.save(uri, SaveMode.CHECKPOINT)], None)
        saved = shard.pull_sparse(T, k)
        _, staged = shard.stage_save(str(tmp_path / "staged"), SaveMode.BASE)
        assert shard.verify_save(uri) == k.size  # what load(discard_live) checks first...
        path, original = corrupt(uri, 0)  # ...and the part changes in between
        with pytest.raises(CheckpointError, match=r"discarded its live tables .* holds no keys"):
            shard.replace(uri)
        assert len(shard.table(T)) == 0 and shard.stats().tables[0].keys == 0
        with pytest.raises(CheckpointError, match="not pending"):  # it saved the old content
            shard.finish_save(staged, commit=True)
        path.write_bytes(original)
        assert shard.load(uri, discard_live=True) == k.size  # the retried load fills it
        np.testing.assert_array_equal(shard.pull_sparse(T, k), saved)
    finally:
        shard.close()


def test_a_discarding_prepare_builds_nothing_and_its_commit_replaces(tmp_path: Path) -> None:
    shard = Shard(config())
    try:
        k = keys(0, 300)
        push(shard, k, show=5, click=1)
        uri = str(tmp_path / "ckpt")
        checkpoint.publish(uri, [shard.save(uri, SaveMode.CHECKPOINT)], None)
        saved = shard.pull_sparse(T, k)
        push(shard, keys(300, 500), show=1, click=0)  # keys the checkpoint does not have
        assert shard.prepare_load(uri, "l1", discard_live=True) == k.size
        assert len(shard.table(T)) == 500, "a prepare drops nothing"
        assert shard.finish_load(uri, commit=True, load_id="l1") == k.size
        assert len(shard.table(T)) == 300
        np.testing.assert_array_equal(shard.pull_sparse(T, k), saved)
        assert shard.prepare_load(uri, "l2", discard_live=True) == k.size
        assert shard.finish_load(uri, commit=False, load_id="l2") == 0  # an abort drops nothing
        assert len(shard.table(T)) == 300
    finally:
        shard.close()
