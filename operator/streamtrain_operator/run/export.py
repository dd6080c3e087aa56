"""Publishing inference models: parts first, then a manifest, then one donefile line.

Layout under the export root (any fsspec URL)::

    <root>/donefile.txt                       one JSON line per published model, in order
    <root>/<day>/delta-<pass>/MODEL.json      the model's manifest (written after its parts)
    <root>/<day>/delta-<pass>/sparse/...      PS save, mode 1 (KV + tombstones) with its own
                                              MANIFEST.json (streamtrain_ps.checkpoint)
    <root>/<day>/delta-<pass>/dense/dense.pt  TorchScript dense network (+ dense.json)
    <root>/<day>/base/...                     mode 2, published at the end of day-1
    <root>/<day>/batch/...                    mode 3 (all keys), the day's batch model

A model exists for readers only once its donefile line exists; the line is written after
``MODEL.json``, which is written after every part and lists each with size and sha256
(plus the pass metrics and, for a delta, the key of the base it applies to). So a crash at
any point leaves either no visible model or a complete one, and redoing an interrupted
export rewrites the same target from scratch (its stale parts are removed first) before
publishing it once. Every storage step is retried with exponential backoff, each retry of a
part from an empty directory, so a published model holds exactly the files its manifest lists.

Readers: ``streamtrain_worker.predict`` parses the same files (the worker may not import
the operator), following ``docs/scheduler.md``.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import fsspec
from fsspec.implementations.local import LocalFileSystem

from streamtrain_operator.job.plan import StepKey, StepKind
from streamtrain_operator.run.hooks import NO_HOOK, PARTS, StepHook
from streamtrain_ps.api import SaveResult

DONEFILE = "donefile.txt"
MODEL_MANIFEST = "MODEL.json"
FORMAT = "streamtrain-model"
FORMAT_VERSION = 1

T = TypeVar("T")
Sleep = Callable[[float], Awaitable[None]]


class ExportError(RuntimeError):
    """An export could not be published after its retries; nothing new is visible."""


@dataclass(frozen=True)
class RetryPolicy:
    """Storage retries: ``retries`` more attempts, delays ``backoff * 2**i``."""

    retries: int = 5
    backoff_seconds: float = 1.0
    #: Exceptions worth retrying (storage and transient RPC errors).
    retry_on: tuple[type[BaseException], ...] = (OSError,)


async def with_retries(
    what: str, fn: Callable[[], Awaitable[T]], policy: RetryPolicy, sleep: Sleep
) -> T:
    """Run ``fn``; on a retryable error wait and try again, then raise ``ExportError``."""
    for attempt in range(policy.retries + 1):
        try:
            return await fn()
        except policy.retry_on as exc:
            if attempt == policy.retries:
                raise ExportError(f"{what}: {exc} (after {attempt + 1} attempts)") from exc
            await sleep(policy.backoff_seconds * 2**attempt)
    raise AssertionError("unreachable")  # pragma: no cover


@dataclass(frozen=True)
class DoneLine:
    """One published model, as listed in the export donefile."""

    key: str  # "20261101/delta-3", relative to the export root
    kind: str  # delta | base | batch
    day: str
    pass_index: int
    base: str | None  # key of the base a delta applies to (None: an empty model)
    published_at: float

    def to_json(self) -> str:
        return json.dumps(
            {
                "key": self.key,
                "kind": self.kind,
                "day": self.day,
                "pass": self.pass_index,
                "base": self.base,
                "manifest": f"{self.key}/{MODEL_MANIFEST}",
                "publishedAt": self.published_at,
            },
            sort_keys=True,
        )

    @classmethod
    def from_json(cls, line: str) -> DoneLine:
        d = json.loads(line)
        return cls(d["key"], d["kind"], d["day"], int(d["pass"]), d["base"], d["publishedAt"])


def _fs(uri: str) -> tuple[fsspec.AbstractFileSystem, str]:
    fs, path = fsspec.core.url_to_fs(uri)
    return fs, str(path).rstrip("/")


def _atomic_write(fs: fsspec.AbstractFileSystem, path: str, data: bytes) -> None:
    """Replace ``path`` so readers see old or new bytes, never a mix.

    Local disks: temporary file + fsync + rename. Object stores: one PUT is atomic.
    """
    if isinstance(fs, LocalFileSystem):
        directory = os.path.dirname(path)
        os.makedirs(directory, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=directory)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except BaseException:
            if os.path.exists(tmp):
                os.unlink(tmp)
            raise
    else:
        fs.pipe_file(path, data)


def read_donefile(root: str) -> list[DoneLine]:
    """Every published model, oldest first (an absent donefile: none yet)."""
    fs, base = _fs(root)
    path = f"{base}/{DONEFILE}"
    if not fs.exists(path):
        return []
    text = fs.cat_file(path).decode()
    return [DoneLine.from_json(line) for line in text.splitlines() if line.strip()]


def published(root: str, key: str) -> DoneLine | None:
    return next((d for d in read_donefile(root) if d.key == key), None)


def _sha256_of(fs: fsspec.AbstractFileSystem, path: str) -> tuple[int, str]:
    data = fs.cat_file(path)
    return len(data), hashlib.sha256(data).hexdigest()


@dataclass(frozen=True)
class ModelTarget:
    """What to publish and where."""

    root: str  # export root
    key: str  # "<day>/delta-<pass>" | "<day>/base" | "<day>/batch"
    kind: str
    day: str
    pass_index: int
    base: str | None

    @property
    def uri(self) -> str:
        return f"{self.root.rstrip('/')}/{self.key}"


async def publish_model(
    target: ModelTarget,
    *,
    save_sparse: Callable[[str], Awaitable[SaveResult]],
    export_dense: Callable[[str], Awaitable[Sequence[str]]],
    metrics: Mapping[str, float],
    policy: RetryPolicy,
    sleep: Sleep,
    clock: Callable[[], float] = time.time,
    extra: Mapping[str, Any] | None = None,
    hook: StepHook = NO_HOOK,
) -> DoneLine:
    """Write the parts, ``MODEL.json`` and the donefile line (idempotent per target).

    ``save_sparse(uri)`` is the PS save (it publishes its own ``MANIFEST.json`` below
    ``uri``); ``export_dense(uri)`` is a worker's ``ExportDense``. ``extra`` goes into
    ``MODEL.json`` as is (the data config, table and metric buckets the predictor needs).
    ``hook`` is offered the ``parts`` point between the sparse parts and the rest
    (``hooks.PARTS``: a half-written model); the default never holds.
    """
    existing = published(target.root, target.key)
    if existing is not None:
        return existing
    fs, model_dir = _fs(target.uri)

    async def clear() -> None:
        _remove(fs, model_dir)

    await with_retries(f"{target.uri}: remove stale parts", clear, policy, sleep)
    sparse_uri, dense_uri = f"{target.uri}/sparse", f"{target.uri}/dense"

    async def fresh_sparse() -> SaveResult:
        # A failed attempt leaves its partial parts (the PS saves into a new random
        # directory each time): remove them, or the model would hold files MODEL.json
        # does not list.
        _remove(fs, f"{model_dir}/sparse")
        return await save_sparse(sparse_uri)

    async def fresh_dense() -> Sequence[str]:
        _remove(fs, f"{model_dir}/dense")
        return await export_dense(dense_uri)

    sparse = await with_retries(f"{sparse_uri}: sparse save", fresh_sparse, policy, sleep)
    await hook.hold(PARTS, StepKey(target.day, target.pass_index, StepKind(target.kind)))
    await with_retries(f"{dense_uri}: dense export", fresh_dense, policy, sleep)

    async def write_manifest() -> None:
        files: list[dict[str, Any]] = [
            {"path": f"sparse/{f.path}", "size": f.size, "sha256": f.sha256, "rows": f.rows}
            for f in sparse.files
        ]
        unlisted = ["sparse/MANIFEST.json"] + [
            f"dense/{name}" for name in sorted(_names(fs, f"{model_dir}/dense"))
        ]
        for rel in unlisted:
            size, digest = _sha256_of(fs, f"{model_dir}/{rel}")
            files.append({"path": rel, "size": size, "sha256": digest})
        manifest: dict[str, Any] = {
            "format": FORMAT,
            "version": FORMAT_VERSION,
            "key": target.key,
            "kind": target.kind,
            "day": target.day,
            "pass": target.pass_index,
            "base": target.base,
            "saveMode": int(sparse.mode),
            "keys": sparse.keys_saved,
            "tombstones": sparse.tombstones,
            "metrics": dict(metrics),
            "files": files,
        }
        manifest.update(extra or {})
        _atomic_write(
            fs,
            f"{model_dir}/{MODEL_MANIFEST}",
            json.dumps(manifest, indent=1, sort_keys=True).encode(),
        )

    await with_retries(f"{target.uri}: {MODEL_MANIFEST}", write_manifest, policy, sleep)
    line = DoneLine(target.key, target.kind, target.day, target.pass_index, target.base, clock())

    async def append_line() -> None:
        rfs, root = _fs(target.root)
        path = f"{root}/{DONEFILE}"
        old = rfs.cat_file(path).decode() if rfs.exists(path) else ""
        if any(DoneLine.from_json(x).key == target.key for x in old.splitlines() if x.strip()):
            return
        _atomic_write(rfs, path, (old + line.to_json() + "\n").encode())

    await with_retries(f"{target.root}/{DONEFILE}", append_line, policy, sleep)
    return line


def _remove(fs: fsspec.AbstractFileSystem, path: str) -> None:
    if fs.exists(path):
        fs.rm(path, recursive=True)


def _names(fs: fsspec.AbstractFileSystem, directory: str) -> list[str]:
    if not fs.exists(directory):
        return []
    return [str(p).rstrip("/").rsplit("/", 1)[-1] for p in fs.ls(directory, detail=False)]


def verify_model(root: str, key: str) -> dict[str, Any]:
    """Read a published model's manifest and check every listed file (size and sha256)."""
    fs, base = _fs(root)
    model_dir = f"{base}/{key}"
    manifest: dict[str, Any] = json.loads(fs.cat_file(f"{model_dir}/{MODEL_MANIFEST}"))
    for f in manifest["files"]:
        size, digest = _sha256_of(fs, f"{model_dir}/{f['path']}")
        if (size, digest) != (f["size"], f["sha256"]):
            raise ExportError(f"{root}/{key}/{f['path']}: size or checksum mismatch")
    return manifest
