"""Fault case 5: the disk fills up or the object store fails during a save or an export.

Injected with ``failfs://`` (``tests/ps/faultfs.py``). For the PS checkpoint (``Shard.save``
+ ``checkpoint.publish``, in-process and over gRPC) and for the model export
(``streamtrain_operator.run.export.publish_model``) the outcome must be:

- the failing save raises a clear error naming the URI and the cause (ENOSPC);
- the previously published checkpoint / model stays intact: its manifest is unchanged and
  loading it gives exactly the state it was saved from;
- no manifest (or donefile line) of the failed save becomes visible;
- junk of the failed attempt is unreferenced and removed by the next successful save;
- where the code path retries (the export), it retries with exponential backoff and
  succeeds once storage recovers.
"""

from __future__ import annotations

import asyncio
import errno
import json
import os
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import fsspec
import numpy as np
import pytest

from streamtrain_operator.run import export
from streamtrain_ps.api import SaveMode, SaveResult, SparsePush
from streamtrain_ps.client.local import LocalPS
from streamtrain_ps.config import PSConfig, TableConfig
from streamtrain_ps.errors import CheckpointError
from streamtrain_ps.plumbing.retry import RetryPolicy
from streamtrain_ps.saves import checkpoint
from streamtrain_worker.publishing.model_folder import MODEL_MANIFEST, DoneLine, ModelKind

from . import faultfs
from .conftest import Cluster
from .faultfs import Faults

T = "embedding"
D = 4
CKPT = "failfs://models/ckpt"
pytestmark = pytest.mark.faults


@pytest.fixture
def failfs() -> Iterator[Faults]:
    """A blank ``failfs://`` disk with no faults armed (``faultfs.arm`` arms them)."""
    fsspec.register_implementation(faultfs.PROTOCOL, faultfs.FailingFileSystem, clobber=True)
    yield faultfs.reset()
    faultfs.reset()


def config() -> PSConfig:
    return PSConfig(
        tables=(TableConfig(name=T, embedxDim=D, embedxThreshold=0.0, baseThreshold=0.0),),
        logicalShards=8,
        storageSchemes=faultfs.SCHEMES,
    )


KEYS = np.arange(1, 401, dtype=np.uint64) * np.uint64(2654435761)


def train(ps: Any, seed: int) -> None:
    rng = np.random.default_rng(seed)
    ps.push_sparse(
        T,
        SparsePush(
            KEYS,
            rng.normal(size=(KEYS.size, D + 1)).astype(np.float32),
            np.ones(KEYS.size, np.float32),
            (rng.random(KEYS.size) < 0.3).astype(np.float32),
        ),
    )
    ps.init_dense("dense", np.zeros(16, np.float32))
    ps.push_dense("dense", rng.normal(size=16).astype(np.float32))


def state(ps: Any) -> tuple[np.ndarray, np.ndarray]:
    return ps.pull_sparse(T, KEYS), ps.pull_dense("dense")


def assert_loads_as(uri: str, expected: tuple[np.ndarray, np.ndarray]) -> None:
    fresh = LocalPS(config(), num_shards=2)
    try:
        assert fresh.load(uri) == KEYS.size
        rows, dense = state(fresh)
        np.testing.assert_array_equal(rows, expected[0])
        np.testing.assert_array_equal(dense, expected[1])
    finally:
        fresh.close()


def manifest_bytes(uri: str) -> bytes:
    fs, root = fsspec.core.url_to_fs(uri)
    data: bytes = fs.cat_file(f"{root}/{checkpoint.MANIFEST}")
    return data


def data_dirs(uri: str) -> set[str]:
    fs, root = fsspec.core.url_to_fs(uri)
    return {
        str(p).rstrip("/").rsplit("/", 1)[-1]
        for p in fs.ls(root, detail=False)
        if str(p).rstrip("/").rsplit("/", 1)[-1].startswith("data-")
    }


def referenced_dirs(uri: str) -> set[str]:
    return {p.split("/", 1)[0] for p in checkpoint.read_manifest(uri).files}


FAULTS: dict[str, dict[str, Any]] = {
    # The third part file of the save fails outright.
    "nth-write": {"fail_writes": {3}},
    # The disk fills up mid-save: a truncated part is left behind, then ENOSPC.
    "disk-full": {"byte_budget": 2500},
    # Every part is written; the final manifest PUT (the publish) fails.
    "manifest": {"fail_paths": (checkpoint.MANIFEST,)},
}


@pytest.mark.parametrize("fault", sorted(FAULTS))
def test_failed_checkpoint_keeps_the_published_one(failfs: Faults, fault: str) -> None:
    ps = LocalPS(config(), num_shards=2)
    train(ps, 1)
    ps.save(CKPT, SaveMode.CHECKPOINT)
    published = state(ps)
    before = manifest_bytes(CKPT)
    train(ps, 2)
    assert not np.array_equal(state(ps)[0], published[0])

    plan = faultfs.arm(**FAULTS[fault])
    with pytest.raises(CheckpointError) as err:
        ps.save(CKPT, SaveMode.CHECKPOINT)
    assert plan.failures >= 1
    message = str(err.value)
    assert "No space left on device" in message and "models/ckpt" in message, message
    assert manifest_bytes(CKPT) == before, "the failed save replaced the manifest"
    assert referenced_dirs(CKPT) < data_dirs(CKPT) or fault == "nth-write"
    assert_loads_as(CKPT, published)

    faultfs.arm()  # storage recovers: the next save publishes and collects the junk
    ps.save(CKPT, SaveMode.CHECKPOINT)
    assert data_dirs(CKPT) == referenced_dirs(CKPT)
    assert_loads_as(CKPT, state(ps))
    ps.close()


def test_a_first_save_that_fails_publishes_nothing(failfs: Faults) -> None:
    ps = LocalPS(config(), num_shards=2)
    train(ps, 1)
    faultfs.arm(fail_paths=(checkpoint.MANIFEST,))
    uri = "failfs://models/fresh"
    with pytest.raises(CheckpointError, match="No space left"):
        ps.save(uri, SaveMode.CHECKPOINT)
    assert not any(p.endswith(checkpoint.MANIFEST) for p in faultfs.files("models/fresh"))
    with pytest.raises(CheckpointError, match="missing"):
        LocalPS(config()).load(uri)
    ps.close()


def test_failed_save_over_grpc_is_a_clear_error_and_servers_stay_up(
    failfs: Faults, ps_cluster: Callable[..., Cluster]
) -> None:
    cluster = ps_cluster(2, config=config())
    ps = cluster.client()
    train(ps, 1)
    ps.save(CKPT, SaveMode.CHECKPOINT)
    published = state(ps)
    before = manifest_bytes(CKPT)
    train(ps, 2)

    faultfs.arm(byte_budget=1000)
    with pytest.raises(CheckpointError, match=r"save to failfs://models/ckpt failed.*No space"):
        ps.save(CKPT, SaveMode.CHECKPOINT)
    assert manifest_bytes(CKPT) == before
    assert ps.stats().tables[0].keys == KEYS.size  # both servers still answer
    assert_loads_as(CKPT, published)
    ps.load(CKPT)  # and the servers themselves reload the intact checkpoint
    np.testing.assert_array_equal(state(ps)[0], published[0])


def test_failed_rename_on_a_local_disk_leaves_no_temp_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Local disks publish by temp file + rename; a failing rename must not leave the temp
    file next to the manifest (only ``data-*`` directories are garbage-collected)."""
    ps = LocalPS(config())
    train(ps, 1)
    uri = str(tmp_path / "ckpt")
    ps.save(uri, SaveMode.CHECKPOINT)
    published = state(ps)
    train(ps, 2)
    real_replace = os.replace

    def failing_replace(src: str, dst: str) -> None:
        if str(dst).endswith(checkpoint.MANIFEST):
            raise OSError(errno.EIO, "Input/output error (injected)", str(dst))
        real_replace(src, dst)

    monkeypatch.setattr(checkpoint.os, "replace", failing_replace)
    with pytest.raises(CheckpointError, match="Input/output error"):
        ps.save(uri, SaveMode.CHECKPOINT)
    monkeypatch.undo()
    leftovers = [p.name for p in (tmp_path / "ckpt").iterdir() if not p.name.startswith("data-")]
    assert leftovers == [checkpoint.MANIFEST]
    assert_loads_as(uri, published)
    ps.close()


# -- the model export (operator) ----------------------------------------------------------


EXPORT = "failfs://models/export"


def run_export(ps: LocalPS, pass_index: int, policy: RetryPolicy, sleeps: list[float]) -> DoneLine:
    async def save_sparse(uri: str) -> SaveResult:
        return await asyncio.to_thread(ps.save, uri, SaveMode.DELTA)

    async def export_dense(uri: str) -> Sequence[str]:
        """What a worker's ExportDense does to storage: write the dense files under uri."""
        fs, root = fsspec.core.url_to_fs(uri)
        fs.pipe_file(f"{root}/dense.json", json.dumps({"pass": pass_index}).encode())
        return [f"{uri}/dense.json"]

    async def sleep(seconds: float) -> None:
        sleeps.append(seconds)

    target = export.ModelTarget(
        root=EXPORT,
        key=f"20261101/delta-{pass_index}",
        kind=ModelKind.DELTA,
        day="20261101",
        pass_index=pass_index,
        base=None,
    )
    return asyncio.run(
        export.publish_model(
            target,
            export.ModelParts(save_sparse, export_dense, metrics={"auc": 0.7}),
            export.StorageSteps(policy, sleep),
        )
    )


def test_export_retries_with_backoff_then_fails_cleanly(failfs: Faults) -> None:
    # One shard: a shard applies a delta save's effects only after all its parts were
    # written, so a retried delta save of one shard is exact (docs/operations.md).
    ps = LocalPS(config(), num_shards=1)
    # What the driver passes: storage errors surface from a PS save as CheckpointError.
    policy = RetryPolicy.storage(
        retries=3, backoff_seconds=0.5, retry_on=(OSError, CheckpointError)
    )
    sleeps: list[float] = []
    train(ps, 1)
    run_export(ps, 1, policy, sleeps)
    assert sleeps == []
    first = checkpoint.read_sparse(f"{EXPORT}/20261101/delta-1/sparse", T)

    train(ps, 2)
    # A transient outage: the first write of two attempts fails, then it recovers. An
    # attempt writes every part (8 logical shards, in parallel) before it reports the error.
    parts = config().logicalShards
    faultfs.arm(fail_writes={1, parts + 1})
    run_export(ps, 2, policy, sleeps)
    assert sleeps == [0.5, 1.0]
    keys = [d.key for d in export.read_donefile(EXPORT)]
    assert keys == ["20261101/delta-1", "20261101/delta-2"]
    export.verify_model(EXPORT, "20261101/delta-2")

    train(ps, 3)
    done_before = faultfs.FailingFileSystem.store["/models/export/donefile.txt"].getvalue()
    sleeps.clear()
    faultfs.arm(byte_budget=0)  # the disk is full for good
    with pytest.raises(export.ExportError, match=r"No space left.*after 4 attempts"):
        run_export(ps, 3, policy, sleeps)
    assert sleeps == [0.5, 1.0, 2.0]
    faultfs.arm()
    after = faultfs.FailingFileSystem.store["/models/export/donefile.txt"].getvalue()
    assert after == done_before, "a failed export changed the donefile"
    assert not any(
        p.endswith(MODEL_MANIFEST) for p in faultfs.files("models/export/20261101/delta-3")
    )
    for key in keys:
        export.verify_model(EXPORT, key)
    again = checkpoint.read_sparse(f"{EXPORT}/20261101/delta-1/sparse", T)
    for a, b in zip(first, again, strict=True):
        np.testing.assert_array_equal(a, b)
    ps.close()
