"""Model publication: parts, then MODEL.json, then one donefile line; retries; idempotence."""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path

import pytest

from streamtrain_operator.run.export import (
    ExportError,
    ModelParts,
    ModelTarget,
    RetryPolicy,
    StorageSteps,
    publish_model,
    read_donefile,
    verify_model,
    write_parts,
)
from streamtrain_ps.api import SavedFile, SaveMode, SaveResult
from streamtrain_worker.publishing.model_folder import ModelFormatError, ModelKind, Serving


class FakeParts:
    """Writes a sparse part + PS manifest and a dense file; fails the first ``fail`` calls."""

    def __init__(self, fail_sparse: int = 0, fail_dense: int = 0) -> None:
        self.fail_sparse = fail_sparse
        self.fail_dense = fail_dense
        self.sparse_calls = 0
        self.dense_calls = 0

    async def save_sparse(self, uri: str) -> SaveResult:
        self.sparse_calls += 1
        if self.sparse_calls <= self.fail_sparse:
            raise OSError("connection reset by peer")
        d = Path(uri)
        (d / "data-s000").mkdir(parents=True)
        data = b"kv" * 10
        (d / "data-s000" / "part-00000.bin").write_bytes(data)
        (d / "MANIFEST.json").write_text("{}")
        files = (SavedFile("data-s000/part-00000.bin", 20, hashlib.sha256(data).hexdigest(), 5),)
        return SaveResult(uri, SaveMode.DELTA, files, 5, 1, 0.0)

    async def export_dense(self, uri: str) -> Sequence[str]:
        self.dense_calls += 1
        if self.dense_calls <= self.fail_dense:
            raise OSError("disk full")
        Path(uri).mkdir(parents=True)
        (Path(uri) / "dense.pt").write_bytes(b"torchscript")
        return [f"{uri}/dense.pt"]


def target(root: Path, pass_index: int = 3) -> ModelTarget:
    return ModelTarget(
        str(root), f"20261101/delta-{pass_index}", ModelKind.DELTA, "20261101", pass_index, None
    )


def publish(parts: FakeParts, tgt: ModelTarget, sleeps: list[float], retries: int = 3) -> None:
    async def sleep(seconds: float) -> None:
        sleeps.append(seconds)

    asyncio.run(
        publish_model(
            tgt,
            ModelParts(
                save_sparse=parts.save_sparse,
                export_dense=parts.export_dense,
                metrics={"auc": 0.75},
                serving=Serving(
                    data={"format": "criteo"}, table="embedding", num_buckets=64, model="dnn"
                ),
            ),
            StorageSteps(
                policy=RetryPolicy.storage(retries=retries, backoff_seconds=0.5),
                sleep=sleep,
                clock=lambda: 1000.0,
            ),
        )
    )


def test_storage_errors_are_retried_with_exponential_backoff(tmp_path: Path) -> None:
    parts = FakeParts(fail_sparse=2, fail_dense=1)
    sleeps: list[float] = []
    publish(parts, target(tmp_path), sleeps)
    assert sleeps == [0.5, 1.0, 0.5]
    (line,) = read_donefile(str(tmp_path))
    assert (line.key, line.kind, line.pass_index, line.published_at) == (
        "20261101/delta-3",
        "delta",
        3,
        1000.0,
    )
    manifest = json.loads((tmp_path / "20261101/delta-3/MODEL.json").read_text())
    assert manifest["metrics"] == {"auc": 0.75} and manifest["table"] == "embedding"
    # Sparse parts keep the PS's checksums; everything else is hashed on publication.
    paths = {f["path"] for f in manifest["files"]}
    assert paths == {"sparse/data-s000/part-00000.bin", "sparse/MANIFEST.json", "dense/dense.pt"}


def test_a_model_whose_upload_keeps_failing_is_never_visible(tmp_path: Path) -> None:
    sleeps: list[float] = []
    with pytest.raises(ExportError, match=r"dense export: disk full \(after 3 attempts\)"):
        publish(FakeParts(fail_dense=10), target(tmp_path), sleeps, retries=2)
    assert read_donefile(str(tmp_path)) == []
    assert not (tmp_path / "20261101/delta-3/MODEL.json").exists()


def test_redo_after_a_crash_rewrites_the_target_and_publishes_once(tmp_path: Path) -> None:
    stale = tmp_path / "20261101/delta-3/sparse/data-old"
    stale.mkdir(parents=True)
    (stale / "part-00000.bin").write_bytes(b"half written")
    publish(FakeParts(), target(tmp_path), [])
    assert not stale.exists()
    parts = FakeParts()
    publish(parts, target(tmp_path), [])  # already published: nothing is written again
    assert parts.sparse_calls == 0
    publish(FakeParts(), target(tmp_path, pass_index=4), [])
    assert [d.key for d in read_donefile(str(tmp_path))] == ["20261101/delta-3", "20261101/delta-4"]
    verify_model(str(tmp_path), "20261101/delta-4")


def test_verify_model_detects_a_changed_file(tmp_path: Path) -> None:
    publish(FakeParts(), target(tmp_path), [])
    (tmp_path / "20261101/delta-3/dense/dense.pt").write_bytes(b"tampered!!!")
    with pytest.raises(ModelFormatError, match=r"delta-3/dense/dense\.pt: size or checksum"):
        verify_model(str(tmp_path), "20261101/delta-3")


class LeakyParts(FakeParts):
    """Each failed attempt leaves a partial part in its own directory (as a PS save into
    a fresh random directory, or a dense writer, does when it dies mid-way)."""

    async def save_sparse(self, uri: str) -> SaveResult:
        if self.sparse_calls < self.fail_sparse:
            self.sparse_calls += 1
            attempt = Path(uri) / f"data-s000-attempt{self.sparse_calls}"
            attempt.mkdir(parents=True)
            (attempt / "part-00000.bin").write_bytes(b"half")
            raise OSError("connection reset by peer")
        return await super().save_sparse(uri)

    async def export_dense(self, uri: str) -> Sequence[str]:
        if self.dense_calls < self.fail_dense:
            self.dense_calls += 1
            Path(uri).mkdir(parents=True, exist_ok=True)
            (Path(uri) / "dense.pt.partial").write_bytes(b"half")
            raise OSError("disk full")
        return await super().export_dense(uri)


def test_parts_of_a_failed_attempt_do_not_survive_into_the_published_model(
    tmp_path: Path,
) -> None:
    """Every file of a published model is listed in MODEL.json: a retried part starts from
    an empty directory, so nothing of a failed attempt is left unaccounted for."""
    publish(LeakyParts(fail_sparse=2, fail_dense=1), target(tmp_path), [])
    model = tmp_path / "20261101/delta-3"
    on_disk = {str(p.relative_to(model)) for p in model.rglob("*") if p.is_file()}
    listed = {f.path for f in verify_model(str(tmp_path), "20261101/delta-3").files}
    assert on_disk == listed | {"MODEL.json"}


def test_the_dense_part_is_exported_from_the_snapshot_beside_the_next_pass(
    tmp_path: Path,
) -> None:
    """The step (between two passes) only takes the PS snapshot, which holds the dense
    vectors too; the rest, run beside the next pass, exports the dense part from it before
    the sparse parts are written (writing them frees the snapshot). A failed snapshot
    exports and publishes nothing."""
    parts = FakeParts()
    calls: list[str] = []

    async def export_dense(uri: str) -> Sequence[str]:
        calls.append("dense")
        return await parts.export_dense(uri)

    async def save_sparse(uri: str) -> SaveResult:
        calls.append("sparse")
        return await parts.save_sparse(uri)

    def take(fail: bool) -> Callable[[], Awaitable[None]]:
        async def snapshot() -> None:
            if fail:
                raise ExportError("snapshot refused")
            calls.append("snapshot")

        return snapshot

    async def sleep(seconds: float) -> None:
        pass

    async def write(fail: bool, tgt: ModelTarget) -> None:
        rest = await write_parts(
            tgt,
            ModelParts(save_sparse, export_dense, metrics={}, snapshot=take(fail)),
            StorageSteps(policy=RetryPolicy.storage(retries=0, backoff_seconds=0.5), sleep=sleep),
        )
        assert calls == ["snapshot"]  # the step: nothing but the snapshot
        await rest()

    asyncio.run(write(False, target(tmp_path / "ok")))
    assert calls == ["snapshot", "dense", "sparse"]
    assert [line.key for line in read_donefile(str(tmp_path / "ok"))] == ["20261101/delta-3"]
    calls.clear()
    with pytest.raises(ExportError, match="snapshot refused"):
        asyncio.run(write(True, target(tmp_path / "failed")))
    assert calls == []
    assert read_donefile(str(tmp_path / "failed")) == []
