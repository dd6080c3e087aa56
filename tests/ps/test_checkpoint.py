"""Save -> publish -> load: bit-identical round trips, N -> M re-sharding, and failures."""

from __future__ import annotations

import hashlib
import json
import uuid
from pathlib import Path

import fsspec
import numpy as np
import pytest

from streamtrain_ps.api import SaveMode, SparsePush
from streamtrain_ps.client.local import LocalPS
from streamtrain_ps.config import PSConfig, SparseOptimizerConfig, TableConfig
from streamtrain_ps.engine.accessor import DELTA
from streamtrain_ps.engine.packed import SLOT_CODES
from streamtrain_ps.errors import CheckpointError
from streamtrain_ps.saves import checkpoint, partfile
from streamtrain_ps.shard import Shard

D = 3


def _config(**kw: object) -> PSConfig:
    tables = (
        TableConfig(name="embedding", embedxDim=D, embedxThreshold=1.0),
        TableConfig(
            name="user ids/è",  # not a safe path component: hex-escaped in file names
            embedxDim=2,
            embedxThreshold=0.0,
            optimizer=SparseOptimizerConfig(type="adam"),
        ),
    )
    return PSConfig(tables=tables, logicalShards=8, **kw)  # type: ignore[arg-type]


def _train(ps: LocalPS | Shard, seed: int = 0, rounds: int = 4) -> np.ndarray:
    rng = np.random.default_rng(seed)
    keys = rng.integers(0, 2**64 - 1, 500, dtype=np.uint64, endpoint=True)
    for _ in range(rounds):
        k = rng.choice(keys, 800)
        for table, dim in (("embedding", D), ("user ids/è", 2)):
            ps.push_sparse(
                table,
                SparsePush(
                    k,
                    rng.normal(size=(k.size, dim + 1)).astype(np.float32),
                    rng.integers(0, 3, k.size).astype(np.float32),
                    (rng.random(k.size) < 0.2).astype(np.float32),
                    rng.integers(0, 40, k.size).astype(np.uint32),
                ),
            )
    ps.init_dense("dnn", np.arange(6, dtype=np.float32))
    ps.push_dense("dnn", rng.normal(size=6).astype(np.float32))
    ps.init_dense("bias", np.zeros(2, dtype=np.float32))
    return keys


def _counts(ps: LocalPS | Shard) -> list[tuple[str, int, int]]:
    return [(t.name, t.keys, t.expanded_keys) for t in ps.stats().tables]


def _full_state(shard: Shard, table: str, keys: np.ndarray) -> np.ndarray:
    t = shard.table(table)
    rows = t.rows_of(keys)
    assert (rows >= 0).all()
    return t.saves.copy_rows(rows)[1]


def test_checkpoint_round_trip_is_bit_identical(tmp_path: Path) -> None:
    cfg = _config()
    src = Shard(cfg)
    keys = np.unique(_train(src))
    src.shrink()
    live = keys[src.table("embedding").rows_of(keys) >= 0]
    result = src.save(str(tmp_path / "ck"), SaveMode.CHECKPOINT)
    checkpoint.publish(str(tmp_path / "ck"), [result], {"pass": 3}, config=cfg)
    manifest = json.loads((tmp_path / "ck" / "MANIFEST.json").read_text())
    assert manifest["meta"] == {"pass": 3} and manifest["logicalShards"] == 8
    assert manifest["tables"]["embedding"]["embedxDim"] == D

    dst = Shard(cfg)
    dst.push_sparse(
        "embedding",
        SparsePush(
            np.array([123], np.uint64),
            np.zeros((1, D + 1), np.float32),
            np.ones(1, np.float32),
            np.zeros(1, np.float32),
        ),
    )
    loaded = dst.load(str(tmp_path / "ck"))
    assert loaded == sum(t.keys for t in src.stats().tables)
    for table in ("embedding", "user ids/è"):
        k = keys[src.table(table).rows_of(keys) >= 0]
        np.testing.assert_array_equal(
            _full_state(src, table, k).view(np.uint32), _full_state(dst, table, k).view(np.uint32)
        )
    assert dst.table("embedding").rows_of(np.array([123], np.uint64))[0] == -1, "load replaces"
    for name in ("dnn", "bias"):
        a, b = src.dense_snapshot()[name], dst.dense_snapshot()[name]
        for field in ("values", "m", "v"):
            np.testing.assert_array_equal(getattr(a, field), getattr(b, field))
        assert (a.step, a.version) == (b.step, b.version)
    np.testing.assert_array_equal(
        src.table("embedding").saves.tombstones(), dst.table("embedding").saves.tombstones()
    )
    assert _counts(src) == _counts(dst)
    assert live.size == src.stats().tables[0].keys


@pytest.mark.parametrize("uri", ["memory://ckpt/a", "file://{tmp}/b"])
def test_two_shards_load_into_three_and_back(tmp_path: Path, uri: str) -> None:
    uri = uri.format(tmp=tmp_path)
    cfg = _config()
    two = LocalPS(cfg, 2)
    keys = _train(two)
    pulled = {t: two.pull_sparse(t, keys) for t in ("embedding", "user ids/è")}
    two.save(uri, SaveMode.CHECKPOINT)
    three = LocalPS(cfg, 3)
    assert three.load(uri) == sum(t.keys for t in two.stats().tables)
    for t, values in pulled.items():
        np.testing.assert_array_equal(three.pull_sparse(t, keys), values)
    np.testing.assert_array_equal(three.pull_dense("dnn"), two.pull_dense("dnn"))
    uri2 = uri + "-back"
    three.save(uri2, SaveMode.CHECKPOINT)
    back = LocalPS(cfg, 2)
    back.load(uri2)
    for t, values in pulled.items():
        np.testing.assert_array_equal(back.pull_sparse(t, keys), values)
    assert _counts(back) == _counts(two)
    for ps in (two, three, back):
        ps.close()


def _part_files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("part-*.bin"))


def test_corrupt_part_or_missing_manifest_loads_nothing(tmp_path: Path) -> None:
    cfg = _config()
    src = LocalPS(cfg, 2)
    keys = _train(src)
    src.save(str(tmp_path / "ck"), SaveMode.CHECKPOINT)
    dst = LocalPS(cfg, 2)
    _train(dst, seed=1, rounds=1)
    before = dst.pull_sparse("embedding", keys)
    before_stats = dst.stats()

    part = _part_files(tmp_path / "ck")[5]
    data = bytearray(part.read_bytes())
    data[len(data) // 2] ^= 0x01
    part.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="checksum"):
        dst.load(str(tmp_path / "ck"))
    np.testing.assert_array_equal(dst.pull_sparse("embedding", keys), before)
    assert dst.stats() == before_stats

    (tmp_path / "ck" / "MANIFEST.json").unlink()
    with pytest.raises(CheckpointError, match="MANIFEST"):
        dst.load(str(tmp_path / "ck"))
    with pytest.raises(CheckpointError):
        dst.load(str(tmp_path / "never-saved"))
    np.testing.assert_array_equal(dst.pull_sparse("embedding", keys), before)


def test_missing_part_is_refused_at_load_and_at_publish(tmp_path: Path) -> None:
    cfg = _config()
    ps = LocalPS(cfg, 2)
    _train(ps, rounds=1)
    ps.save(str(tmp_path / "ck"), SaveMode.CHECKPOINT)
    _part_files(tmp_path / "ck")[0].unlink()
    with pytest.raises(CheckpointError, match="missing"):
        Shard(cfg).load(str(tmp_path / "ck"))
    only_one = ps.shards[0].save(str(tmp_path / "half"), SaveMode.CHECKPOINT)
    with pytest.raises(CheckpointError, match="incomplete"):
        checkpoint.publish(str(tmp_path / "half"), [only_one], config=cfg)
    assert not (tmp_path / "half" / "MANIFEST.json").exists()


def test_a_failed_save_leaves_the_previous_one_and_the_table_intact(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg = _config()
    ps = LocalPS(cfg, 1)
    keys = _train(ps)
    uri = str(tmp_path / "model")
    ps.save(uri, SaveMode.CHECKPOINT)
    first = ps.pull_sparse("embedding", keys)
    _train(ps, seed=2, rounds=1)
    deltas = (
        ps.shards[0]
        .table("embedding")
        .saves.copy_rows(ps.shards[0].table("embedding").rows_of(np.unique(keys)))[1][:, DELTA]
    )

    real_write = checkpoint._write
    calls = {"n": 0}

    def flaky(fs: fsspec.AbstractFileSystem, path: str, data: bytes) -> None:
        calls["n"] += 1
        if calls["n"] == 4:
            raise OSError("disk full")
        real_write(fs, path, data)

    monkeypatch.setattr(checkpoint, "_write", flaky)
    with pytest.raises(CheckpointError, match="disk full"):
        ps.save(uri, SaveMode.DELTA)
    monkeypatch.setattr(checkpoint, "_write", real_write)
    t = ps.shards[0].table("embedding")
    np.testing.assert_array_equal(
        t.saves.copy_rows(t.rows_of(np.unique(keys)))[1][:, DELTA], deltas
    )
    other = LocalPS(cfg, 1)
    other.load(uri)
    np.testing.assert_array_equal(other.pull_sparse("embedding", keys), first)
    # A later successful save to the same URI replaces it and removes the old data dirs.
    ps.save(uri, SaveMode.CHECKPOINT)
    assert len([p for p in Path(uri).iterdir() if p.name.startswith("data-")]) == 1
    other.load(uri)
    np.testing.assert_array_equal(
        other.pull_sparse("embedding", keys), ps.pull_sparse("embedding", keys)
    )


def test_incompatible_checkpoints_are_refused(tmp_path: Path) -> None:
    cfg = _config()
    ps = LocalPS(cfg, 1)
    _train(ps, rounds=1)
    ps.save(str(tmp_path / "ck"), SaveMode.CHECKPOINT)
    other_l = PSConfig(tables=cfg.tables, logicalShards=16)
    with pytest.raises(CheckpointError, match="logicalShards"):
        Shard(other_l).load(str(tmp_path / "ck"))
    other_dim = PSConfig(tables=(TableConfig(name="embedding", embedxDim=5),), logicalShards=8)
    with pytest.raises(CheckpointError, match="embedxDim"):
        Shard(other_dim).load(str(tmp_path / "ck"))
    ps.save(str(tmp_path / "delta"), SaveMode.DELTA)
    with pytest.raises(CheckpointError, match="delta"):
        Shard(cfg).load(str(tmp_path / "delta"))


def test_base_model_warm_start_and_reading_helpers(tmp_path: Path) -> None:
    cfg = _config()
    ps = LocalPS(cfg, 2)
    keys = _train(ps)
    uri = str(tmp_path / "batch")
    ps.save(uri, SaveMode.BATCH)
    m = checkpoint.read_manifest(uri)
    assert m.mode == SaveMode.BATCH and set(m.tables) == {"embedding", "user ids/è"}
    k, values, tombs = checkpoint.read_sparse(uri, "embedding")
    assert values.shape == (k.size, 3 + D) and tombs.size == 0
    np.testing.assert_array_equal(values, ps.pull_sparse("embedding", k))
    warm = LocalPS(cfg, 3)
    warm.load(uri)
    np.testing.assert_array_equal(
        warm.pull_sparse("embedding", keys), ps.pull_sparse("embedding", keys)
    )
    with pytest.raises(CheckpointError):
        checkpoint.read_sparse(uri, "nope")

    ck = str(tmp_path / "ck")
    ps.save(ck, SaveMode.CHECKPOINT)
    dense = checkpoint.read_dense(ck)
    np.testing.assert_array_equal(dense["dnn"], ps.pull_dense("dnn"))
    with pytest.raises(CheckpointError, match="training state"):
        checkpoint.read_sparse(ck, "embedding")


def test_part_codec_rejects_garbage() -> None:
    with pytest.raises(CheckpointError):
        partfile.decode_part(b"nonsense", "x")
    good = partfile.encode_part({"mode": 0}, {"keys": np.arange(3, dtype=np.uint64)})
    with pytest.raises(CheckpointError):
        partfile.decode_part(good[:-4], "x")
    header, arrays = partfile.decode_part(good, "x")
    assert header["mode"] == 0 and arrays["keys"].tolist() == [0, 1, 2]


def test_object_store_save_and_load_through_s3(monkeypatch: pytest.MonkeyPatch) -> None:
    """``s3://`` via a local moto server: parts are plain PUTs, the manifest goes last, and
    a second save to the same URI replaces the first one's data directories."""
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        host, port = server.get_host_and_port()
        for var in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
            monkeypatch.setenv(var, "testing")
        monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
        monkeypatch.setitem(fsspec.config.conf, "s3", {"endpoint_url": f"http://{host}:{port}"})
        fs = fsspec.filesystem("s3", skip_instance_cache=True)
        # moto keeps its buckets process-wide: another test may already own "models".
        bucket = f"models-{uuid.uuid4().hex[:12]}"
        fs.mkdir(bucket)
        cfg = _config()
        ps = LocalPS(cfg, 2)
        keys = _train(ps, rounds=1)
        ps.save(f"s3://{bucket}/ck", SaveMode.CHECKPOINT)
        ps.save(f"s3://{bucket}/ck", SaveMode.CHECKPOINT)
        fs.invalidate_cache()
        entries = sorted(p.rsplit("/", 1)[-1] for p in fs.ls(f"{bucket}/ck"))
        assert entries[0] == "MANIFEST.json" and len(entries) == 3  # manifest + 2 shards' dirs
        three = LocalPS(cfg, 3)
        three.load(f"s3://{bucket}/ck")
        np.testing.assert_array_equal(
            three.pull_sparse("embedding", keys), ps.pull_sparse("embedding", keys)
        )
        ps.close()
        three.close()
    finally:
        server.stop()


def test_a_part_listing_a_key_twice_is_refused_before_anything_changes(tmp_path: Path) -> None:
    cfg = _config()
    ps = LocalPS(cfg, 1)
    keys = _train(ps, rounds=1)
    uri = tmp_path / "ck"
    ps.save(str(uri), SaveMode.CHECKPOINT)
    manifest = json.loads((uri / "MANIFEST.json").read_text())
    entry = next(f for f in manifest["files"] if f["kind"] == "sparse" and f["rows"] > 0)
    header, arrays = partfile.decode_part((uri / entry["path"]).read_bytes(), "part")
    header.pop("arrays")
    arrays["keys"] = np.concatenate([arrays["keys"], arrays["keys"][:1]])
    arrays["values"] = np.concatenate([arrays["values"], arrays["values"][:1]])
    data = partfile.encode_part(header, arrays)
    (uri / entry["path"]).write_bytes(data)
    entry.update(size=len(data), sha256=hashlib.sha256(data).hexdigest())
    (uri / "MANIFEST.json").write_text(json.dumps(manifest))
    before = ps.pull_sparse("embedding", keys)
    with pytest.raises(CheckpointError, match="listed twice"):
        ps.load(str(uri))
    np.testing.assert_array_equal(ps.pull_sparse("embedding", keys), before)


@pytest.mark.parametrize("limit", [0, 10**9])
def test_a_save_with_more_slot_ids_than_a_table_holds_is_refused(
    tmp_path: Path, limit: int
) -> None:
    """Slot ids are coded per table (``packed.SLOT_CODES``); a save that could not be coded
    is refused naming the table, whether the load builds in RAM or spills to disk."""
    cfg = _config(memoryLimit=limit, diskPath=str(tmp_path / "disk"))
    ps = LocalPS(cfg, 1)
    keys = np.arange(1, SLOT_CODES + 1, dtype=np.uint64)
    g = np.zeros((keys.size, D + 1), np.float32)
    ones = np.ones(keys.size, np.float32)
    ps.push_sparse("embedding", SparsePush(keys, g, ones, ones * 0, keys.astype(np.uint32) % 7))
    uri = tmp_path / "ck"
    ps.save(str(uri), SaveMode.CHECKPOINT)
    manifest = json.loads((uri / "MANIFEST.json").read_text())
    for entry in manifest["files"]:  # give every key its own slot id: one too many
        if entry["kind"] != "sparse" or not entry["rows"]:
            continue
        header, arrays = partfile.decode_part((uri / entry["path"]).read_bytes(), "part")
        header.pop("arrays")
        values = arrays["values"].reshape(entry["rows"], -1)
        values[:, 0] = arrays["keys"].astype(np.uint32).view(np.float32)
        arrays["values"] = values
        data = partfile.encode_part(header, arrays)
        (uri / entry["path"]).write_bytes(data)
        entry.update(size=len(data), sha256=hashlib.sha256(data).hexdigest())
    (uri / "MANIFEST.json").write_text(json.dumps(manifest))
    with pytest.raises(CheckpointError, match=r"table 'embedding'.*distinct slot ids"):
        LocalPS(cfg, 1).load(str(uri))


@pytest.mark.parametrize(
    "inline_bytes", [0, checkpoint.INLINE_PART_BYTES], ids=["threads", "inline"]
)
def test_part_writer_waits_for_every_part_and_raises_a_failed_write(
    tmp_path: Path, inline_bytes: int
) -> None:
    # Large parts are written on several threads, small ones by the caller; either way
    # leaving the block means every part is on disk (fsynced), or the first write error is
    # raised (the caller then stages nothing).
    with checkpoint.PartWriter(str(tmp_path), 0, threads=4, inline_bytes=inline_bytes) as writer:
        saved = [
            writer.write(f"{writer.data_dir}/p{i}", bytes([i]) * 1000, rows=i) for i in range(20)
        ]
    for i, f in enumerate(saved):
        data = (tmp_path / f.path).read_bytes()
        assert data == bytes([i]) * 1000
        assert (f.size, f.sha256, f.rows) == (1000, hashlib.sha256(data).hexdigest(), i)

    (tmp_path / "blocked").write_bytes(b"a file where a directory is needed")
    with (
        pytest.raises(OSError),
        checkpoint.PartWriter(str(tmp_path), 0, threads=4, inline_bytes=inline_bytes) as writer,
    ):
        for i in range(10):
            writer.write(f"{writer.data_dir}/p{i}", b"x", rows=1)
        writer.write("blocked/part", b"x", rows=1)
    # every write was waited for, and what a failed save wrote is removed at once
    assert not any((tmp_path / writer.data_dir / f"p{i}").exists() for i in range(10))
