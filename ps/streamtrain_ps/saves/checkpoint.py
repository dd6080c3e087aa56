"""Save files, the manifest, and reading them back — the PS's only storage I/O.

Layout of a save at ``uri`` (any fsspec URL)::

    uri/MANIFEST.json                                  written LAST, lists every file below
    uri/data-s000-<token>/sparse/<table>/part-00003.bin  one per logical shard per table
    uri/data-s000-<token>/dense/<name>.bin              mode 0 only

Each shard writes into its own fresh ``data-*`` directory, so a new save to the same URI
never touches the files the current manifest lists: until ``publish`` replaces
``MANIFEST.json`` (one atomic rename on local disks, one PUT on object stores) readers see
the previous save, complete. After publishing, ``data-*`` directories the new manifest does
not reference are removed.

The part files' names and codec are in ``partfile``.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import threading
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import fsspec
import numpy as np
import numpy.typing as npt

from streamtrain_ps.api import SavedFile, SaveMode, SaveResult
from streamtrain_ps.config import PSConfig
from streamtrain_ps.errors import CheckpointError
from streamtrain_ps.plumbing import storage
from streamtrain_ps.saves.partfile import (
    decode_part,
    new_data_dir,
    parse_path,
)

MANIFEST = "MANIFEST.json"
FORMAT = "streamtrain-ps-save"
FORMAT_VERSION = 1
#: Threads that fsync a save's part files at once, and that write its large parts
#: (``PartWriter``).
SYNC_THREADS = 8
#: Local parts smaller than this are written by the saving thread itself (``PartWriter``).
INLINE_PART_BYTES = 1 << 20


# -- writing --------------------------------------------------------------------------------


def _fs(uri: str) -> tuple[fsspec.AbstractFileSystem, str]:
    try:
        return storage.filesystem(uri)
    except (ValueError, ImportError) as exc:
        raise CheckpointError(f"{uri}: unsupported URL: {exc}") from exc


def _write(fs: fsspec.AbstractFileSystem, path: str, data: bytes) -> None:
    """Store one part file: in place on local disks (its data directory is fresh and no
    manifest lists it yet, so a torn write is never read; ``PartWriter.finish`` makes it
    durable), one PUT elsewhere."""
    fs.makedirs(path.rsplit("/", 1)[0], exist_ok=True)
    if storage.is_local(fs):
        with open(path, "wb") as f:
            f.write(data)
    else:
        fs.pipe_file(path, data)


class PartWriter:
    """Writes the files of one shard's save into a fresh data directory under ``uri``.

    A save writes one part per logical shard (64 by default); on a local disk an fsync
    per part, one after another, made the file count, not the bytes, the cost of a small
    delta save paid every pass. So local parts are fsynced together, on ``threads``
    threads, when the block is left. Where a part goes before that depends on its size:

    - a small local part (under ``inline_bytes``) is written at once by the caller: a
      write to the page cache costs less than handing it to a thread (64 parts of 3 KB,
      a pass's delta in ``make bench-e2e``: 21-29 ms and 30 ms of CPU through the
      threads, 10 ms and 11 ms inline, fsyncs included);
    - a large part, or any part for an object store (one PUT each, a round trip), is
      written on ``threads`` threads, with at most ``2 * threads`` encoded parts waiting,
      so a large save's memory stays bounded while the caller encodes the next part.

    Use it as a context manager: leaving the block waits for every write and every fsync
    and raises the first error, so nothing is reported saved before it is on storage;
    after an error the local files already written are removed at once (a full disk gets
    its space back).
    """

    def __init__(
        self,
        uri: str,
        shard_index: int,
        threads: int = SYNC_THREADS,
        inline_bytes: int = INLINE_PART_BYTES,
    ) -> None:
        self.uri = uri
        self.fs, self.root = _fs(uri)
        self.data_dir = new_data_dir(shard_index)
        self._local = storage.is_local(self.fs)
        self._threads = threads
        self._inline_bytes = inline_bytes if self._local else 0
        self._pool: ThreadPoolExecutor | None = None  # started by the first large part
        self._room = threading.BoundedSemaphore(2 * threads)
        self._pending: list[Future[None]] = []
        self._written: list[str] = []  # local files, fsynced when the block is left
        self._error: BaseException | None = None  # the first failed inline write

    def write(self, relpath: str, data: bytes, rows: int) -> SavedFile:
        """Queue one file (on storage by the time the block is left); its size and sha256."""
        path = f"{self.root}/{relpath}"
        if self._local:
            self._written.append(path)
        if len(data) < self._inline_bytes:
            if self._error is None:  # after a failure the save is lost: write nothing more
                try:
                    _write(self.fs, path, data)
                except OSError as exc:
                    self._error = exc
        else:
            self._queue(path, data)
        return SavedFile(
            path=relpath, size=len(data), sha256=hashlib.sha256(data).hexdigest(), rows=rows
        )

    def _queue(self, path: str, data: bytes) -> None:
        if self._pool is None:
            self._pool = ThreadPoolExecutor(self._threads, thread_name_prefix="ps-save")
        self._room.acquire()
        try:
            future = self._pool.submit(_write, self.fs, path, data)
        except BaseException:
            self._room.release()
            raise
        future.add_done_callback(lambda _: self._room.release())
        self._pending.append(future)

    def __enter__(self) -> PartWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        """Wait for every queued write (also after an error), then make them durable; on
        any error remove what was written and raise the first error."""
        if self._pool is not None:
            self._pool.shutdown(wait=True)
        error: BaseException | None = self._error or next(
            (e for e in (f.exception() for f in self._pending) if e is not None), None
        )
        if error is None and exc[0] is None and self._written:
            threads = min(self._threads, len(self._written))
            try:
                with ThreadPoolExecutor(threads, thread_name_prefix="save-fsync") as pool:
                    list(pool.map(storage.fsync_path, self._written))
            except OSError as sync_error:
                error = sync_error
        if error is not None or exc[0] is not None:
            for path in self._written:
                with contextlib.suppress(OSError):
                    os.unlink(path)
        if error is not None and exc[0] is None:
            raise error


class PartBuffer:
    """A shard's save taken now and written later: the parts in memory, encoded.

    Same ``data_dir``/``write`` as ``PartWriter``, so a save's part code serves both;
    ``write_to(uri)`` then writes the held parts (on ``PartWriter``'s threads) — as often
    as asked, so a failed write can be retried with the very same content.
    """

    def __init__(self, shard_index: int) -> None:
        self.data_dir = new_data_dir(shard_index)
        self._parts: list[tuple[str, bytes, int]] = []

    def write(self, relpath: str, data: bytes, rows: int) -> SavedFile:
        self._parts.append((relpath, data, rows))
        return SavedFile(
            path=relpath, size=len(data), sha256=hashlib.sha256(data).hexdigest(), rows=rows
        )

    @property
    def nbytes(self) -> int:
        return sum(len(data) for _, data, _ in self._parts)

    def write_to(self, uri: str, shard_index: int) -> None:
        """Write every held part below ``uri``; raises the first write error."""
        with PartWriter(uri, shard_index) as writer:
            for relpath, data, rows in self._parts:
                writer.write(relpath, data, rows)


#: Where a save's parts go: to storage now, or into memory for a snapshot.
PartSink = PartWriter | PartBuffer


# -- publishing -----------------------------------------------------------------------------


def _read(fs: fsspec.AbstractFileSystem, path: str, what: str) -> bytes:
    try:
        data: bytes = fs.cat_file(path)
    except FileNotFoundError as exc:
        raise CheckpointError(f"{what}: missing ({path})") from exc
    except OSError as exc:
        raise CheckpointError(f"{what}: cannot read {path}: {exc}") from exc
    return data


def publish(
    uri: str,
    results: Sequence[SaveResult],
    meta: Mapping[str, Any] | None = None,
    *,
    config: PSConfig | None = None,
    gc: bool = True,
) -> dict[str, Any]:
    """Write ``MANIFEST.json`` for the shards' ``results`` (call after every shard saved).

    Refuses (``CheckpointError``, nothing written) unless the results agree on the mode and
    cover every logical shard of every table exactly once. Table dimensions come from
    ``config`` or, without it, from each table's first part header. Returns the manifest.
    """
    if not results:
        raise CheckpointError(f"{uri}: nothing to publish")
    modes = {SaveMode(r.mode) for r in results}
    if len(modes) != 1:
        raise CheckpointError(f"{uri}: shards saved different modes {sorted(modes)}")
    mode = modes.pop()
    fs, root = _fs(uri)
    files: list[dict[str, Any]] = []
    for r in results:
        for saved in r.files:
            files.append(
                {
                    **parse_path(saved.path),
                    "path": saved.path,
                    "size": saved.size,
                    "sha256": saved.sha256,
                    "rows": saved.rows,
                }
            )
    tables: dict[str, dict[str, Any]] = {}
    dense: dict[str, dict[str, Any]] = {}
    for f in files:
        if f["kind"] == "dense":
            if f["name"] in dense:
                raise CheckpointError(f"{uri}: dense vector {f['name']!r} saved twice")
            dense[f["name"]] = {"path": f["path"], "size": f["rows"]}
            continue
        t = tables.setdefault(f["table"], {"parts": {}, "rows": 0})
        if f["logicalShard"] in t["parts"]:
            raise CheckpointError(
                f"{uri}: table {f['table']!r} part {f['logicalShard']} saved twice"
            )
        t["parts"][f["logicalShard"]] = f["path"]
        t["rows"] += f["rows"]
    logical = config.logicalShards if config is not None else None
    for name, t in tables.items():
        first = min(t["parts"])
        if config is not None:
            try:
                tc = config.table(name)
            except KeyError:
                raise CheckpointError(
                    f"{uri}: parts of table {name!r}, not in the config"
                ) from None
            info = {"embedxDim": tc.embedxDim, "optimizer": tc.optimizer.signature}
        else:
            header, _ = decode_part(_read(fs, f"{root}/{t['parts'][first]}", name), name)
            info = {"embedxDim": header["embedxDim"], "optimizer": header["optimizer"]}
            logical = int(header["logicalShards"])
        assert logical is not None
        missing = sorted(set(range(logical)) - set(t["parts"]))
        if missing or len(t["parts"]) != logical:
            raise CheckpointError(
                f"{uri}: table {name!r} is incomplete: missing logical shards {missing[:10]}"
            )
        tables[name] = {**info, "rows": t["rows"], "parts": logical}
    manifest = {
        "format": FORMAT,
        "version": FORMAT_VERSION,
        "mode": int(mode),
        "modeName": mode.name.lower(),
        "logicalShards": logical if logical is not None else 0,
        "tables": tables,
        "dense": dense,
        "files": files,
        "keysSaved": sum(r.keys_saved for r in results),
        "tombstones": sum(r.tombstones for r in results),
        "createdAt": time.time(),
        "meta": dict(meta or {}),
    }
    try:
        text = json.dumps(manifest, indent=1, sort_keys=True).encode()
        storage.write_durable(fs, f"{root}/{MANIFEST}", text)
    except OSError as exc:
        raise CheckpointError(f"{uri}: cannot write {MANIFEST}: {exc}") from exc
    if gc:
        _collect_garbage(fs, root, {f["path"].split("/", 1)[0] for f in files})
    return manifest


def _collect_garbage(fs: fsspec.AbstractFileSystem, root: str, keep: set[str]) -> None:
    """Remove ``data-*`` directories of earlier or failed saves (best effort)."""
    try:
        entries = fs.ls(root, detail=False)
    except OSError:
        return
    for entry in entries:
        base = str(entry).rstrip("/").rsplit("/", 1)[-1]
        if base.startswith("data-") and base not in keep:
            try:
                fs.rm(f"{root}/{base}", recursive=True)
            except OSError:
                continue


# -- reading --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Manifest:
    """A parsed ``MANIFEST.json``."""

    uri: str
    mode: SaveMode
    logical_shards: int
    tables: dict[str, dict[str, Any]]
    dense: dict[str, dict[str, Any]]
    files: dict[str, dict[str, Any]]  # by path
    meta: dict[str, Any]

    def sparse_part(self, table: str, logical: int) -> dict[str, Any]:
        for f in self.files.values():
            if f["kind"] == "sparse" and f["table"] == table and f["logicalShard"] == logical:
                return f
        raise CheckpointError(f"{self.uri}: manifest lists no part {logical} of table {table!r}")


def read_manifest(uri: str) -> Manifest:
    """Parse and sanity-check ``uri/MANIFEST.json`` (a save without one does not exist)."""
    fs, root = _fs(uri)
    raw = _read(fs, f"{root}/{MANIFEST}", f"{uri}: {MANIFEST}")
    try:
        m = json.loads(raw)
        if m.get("format") != FORMAT or m.get("version") != FORMAT_VERSION:
            raise ValueError(f"unknown format {m.get('format')!r} version {m.get('version')!r}")
        files = {f["path"]: f for f in m["files"]}
        return Manifest(
            uri=uri,
            mode=SaveMode(int(m["mode"])),
            logical_shards=int(m["logicalShards"]),
            tables=dict(m["tables"]),
            dense=dict(m["dense"]),
            files=files,
            meta=dict(m.get("meta", {})),
        )
    except (ValueError, KeyError, TypeError) as exc:
        raise CheckpointError(f"{uri}: malformed {MANIFEST}: {exc}") from exc


def read_verified(
    manifest: Manifest, entry: Mapping[str, Any]
) -> tuple[dict[str, Any], dict[str, npt.NDArray[Any]]]:
    """Read one listed file, check size and sha256 against the manifest, and decode it."""
    fs, root = _fs(manifest.uri)
    path = entry["path"]
    data = _read(fs, f"{root}/{path}", f"{manifest.uri}: {path}")
    if len(data) != entry["size"] or hashlib.sha256(data).hexdigest() != entry["sha256"]:
        raise CheckpointError(f"{manifest.uri}: {path}: checksum mismatch (corrupt or replaced)")
    header, arrays = decode_part(data, f"{manifest.uri}: {path}")
    if header.get("mode") != int(manifest.mode):
        raise CheckpointError(f"{manifest.uri}: {path}: mode {header.get('mode')} != manifest")
    return header, arrays


def read_sparse(
    uri: str, table: str
) -> tuple[npt.NDArray[np.uint64], npt.NDArray[np.float32], npt.NDArray[np.uint64]]:
    """All of ``table`` in an inference save (modes 1-3): keys, values, tombstones.

    ``values`` rows are ``[show, click, embed_w, embedx_w...]``; tombstones (delta saves
    only) are keys to delete from the previous model. Checksums are verified.
    """
    m = read_manifest(uri)
    if m.mode == SaveMode.CHECKPOINT:
        raise CheckpointError(f"{uri}: a mode 0 checkpoint holds training state, not a model")
    if table not in m.tables:
        raise CheckpointError(f"{uri}: no table {table!r} (has {sorted(m.tables)})")
    dim = int(m.tables[table]["embedxDim"]) + 3
    keys, values, tombs = [], [], []
    for logical in range(m.logical_shards):
        _, arrays = read_verified(m, m.sparse_part(table, logical))
        keys.append(arrays["keys"])
        values.append(arrays["values"].reshape(-1, dim))
        tombs.append(arrays["tombstones"])
    return np.concatenate(keys), np.concatenate(values), np.concatenate(tombs)


def read_dense(uri: str) -> dict[str, npt.NDArray[np.float32]]:
    """The dense vectors of a mode 0 checkpoint, by name."""
    m = read_manifest(uri)
    out = {}
    for name, info in m.dense.items():
        _, arrays = read_verified(m, m.files[info["path"]])
        out[name] = arrays["values"].astype(np.float32)
    return out
