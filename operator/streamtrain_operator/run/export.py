"""Publishing inference models: parts first, then a manifest, then one donefile line.

The folder's format (names, keys, donefile line, ``MODEL.json``) is
``streamtrain_worker.publishing.model_folder``, shared with the predictor that reads it; this module
writes it. A model exists for readers only once its donefile line exists; the line is written after
``MODEL.json``, which is written after every part and lists each with size and sha256
(plus the pass metrics and, for a delta, the key of the base it applies to). So a crash at
any point leaves either no visible model or a complete one, and redoing an interrupted
export rewrites the same target from scratch (its stale parts are removed first) before
publishing it once. Every storage step is retried with exponential backoff, each retry of a
part from an empty directory, so a published model holds exactly the files its manifest lists.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import fsspec

from streamtrain_operator.job.plan import StepKey, StepKind
from streamtrain_operator.run.hooks import MANIFEST_POINT, NO_HOOK, PARTS, StepHook
from streamtrain_ps.api import SaveResult
from streamtrain_ps.plumbing import storage
from streamtrain_ps.plumbing.retry import RetryPolicy
from streamtrain_ps.saves.checkpoint import MANIFEST
from streamtrain_worker.publishing import model_folder
from streamtrain_worker.publishing.model_folder import (
    DONEFILE,
    MODEL_MANIFEST,
    DoneLine,
    ModelFile,
    ModelKind,
    ModelManifest,
    Serving,
)

T = TypeVar("T")
Sleep = Callable[[float], Awaitable[None]]
#: The timed parts of a publication (``publish_model``'s ``on_phase``), retries included.
PHASES = ("snapshot", "sparse", "dense", "manifest", "donefile")


class ExportError(RuntimeError):
    """An export could not be published after its retries; nothing new is visible."""


async def with_retries(
    what: str, fn: Callable[[], Awaitable[T]], policy: RetryPolicy, sleep: Sleep
) -> T:
    """Run ``fn``; on an error of ``policy.retry_on`` wait and try again, at most
    ``policy.max_attempts`` times in all, then raise ``ExportError``."""
    for attempt in range(policy.max_attempts):
        try:
            return await fn()
        except policy.retry_on as exc:
            if attempt == policy.max_attempts - 1:
                raise ExportError(f"{what}: {exc} (after {attempt + 1} attempts)") from exc
            await sleep(policy.delay(attempt))
    raise AssertionError("unreachable")  # pragma: no cover


def read_donefile(root: str) -> list[DoneLine]:
    """Every published model below the export ``root`` URL, oldest first (none yet: [])."""
    return model_folder.read_donefile(*storage.filesystem(root))


def published(root: str, key: str) -> DoneLine | None:
    return next((d for d in read_donefile(root) if d.key == key), None)


@dataclass(frozen=True)
class ModelTarget:
    """What to publish and where."""

    root: str  # export root
    key: str  # model_folder.model_key: "<day>/delta-<pass>" | "<day>/base" | "<day>/batch"
    kind: ModelKind
    day: str
    pass_index: int
    base: str | None

    @property
    def uri(self) -> str:
        return f"{self.root.rstrip('/')}/{self.key}"


@dataclass(frozen=True)
class ModelParts:
    """Where a model's parts come from, and what ``MODEL.json`` says of them.

    ``save_sparse(uri)`` is the PS save (it publishes its own ``MANIFEST.json`` below
    ``uri``); ``export_dense(uri)`` is a worker's ``ExportDense``. With ``snapshot`` (the
    PS's ``snapshot``: every shard copies the model's sparse rows and its dense vectors into
    memory now) both write what that snapshot took, so the parts can be written beside the
    next pass. ``metrics`` and ``serving`` (the data config, table and metric buckets the
    predictor needs) go into ``MODEL.json``.
    """

    save_sparse: Callable[[str], Awaitable[SaveResult]]
    export_dense: Callable[[str], Awaitable[Sequence[str]]]
    metrics: Mapping[str, float]
    serving: Serving | None = None
    snapshot: Callable[[], Awaitable[None]] | None = None


@dataclass(frozen=True)
class StorageSteps:
    """How every storage step of a publication runs: retried under ``policy`` (waiting with
    ``sleep``), the donefile line stamped by ``clock``, offered to ``hook`` at the ``parts``
    point (``hooks.PARTS``: a half-written model) and the ``manifest`` point (between
    ``MODEL.json`` and the donefile line; the default never holds), and ``on_phase`` told how
    long each of ``PHASES`` took (benchmarks break a pass transition down with it)."""

    policy: RetryPolicy
    sleep: Sleep
    clock: Callable[[], float] = time.time
    hook: StepHook = NO_HOOK
    on_phase: Callable[[str, float], None] | None = None

    async def retried(self, what: str, fn: Callable[[], Awaitable[T]]) -> T:
        return await with_retries(what, fn, self.policy, self.sleep)


async def publish_model(target: ModelTarget, parts: ModelParts, steps: StorageSteps) -> DoneLine:
    """Write the parts, ``MODEL.json`` and the donefile line (idempotent per target).

    The same as ``write_parts`` followed at once by the publication it returns.
    """
    publish = await write_parts(target, parts, steps)
    return await publish()


async def write_parts(
    target: ModelTarget, parts: ModelParts, steps: StorageSteps
) -> Callable[[], Coroutine[Any, Any, DoneLine]]:
    """The part of ``publish_model`` that reads the model state; returns the rest.

    With ``parts.snapshot`` this part only takes the snapshot, and the rest —
    ``export_dense`` (which must read the snapshot's dense vectors), ``save_sparse`` writing
    the snapshot's parts, ``MODEL.json``, the donefile line — only writes what was taken
    here, so the driver runs it while the next pass trains. Without it, both parts are
    written from what the PS holds, here. Until the rest has run, the model is not visible.
    """
    existing = published(target.root, target.key)
    if existing is not None:

        async def already() -> DoneLine:
            return existing

        return already
    publication = _Publication(target, parts, steps)
    await publication.take()
    return publication.publish


class _Publication:
    """One model being written: its folder, the PS save's result once written, the timer."""

    def __init__(self, target: ModelTarget, parts: ModelParts, steps: StorageSteps) -> None:
        self.target, self.parts, self.steps = target, parts, steps
        self.fs, self.model_dir = storage.filesystem(target.uri)
        self.sparse_uri, self.dense_uri = f"{target.uri}/sparse", f"{target.uri}/dense"
        self.key = StepKey(target.day, target.pass_index, StepKind(target.kind))
        self.saved: SaveResult | None = None
        self.timed = _Timer(steps.on_phase)

    async def take(self) -> None:
        """Clear stale parts, then write both parts — or, from a snapshot, only take it."""
        await self.steps.retried(f"{self.target.uri}: remove stale parts", self._clear)
        if self.parts.snapshot is None:
            await self._write_sparse()
            await self._write_dense()
        else:
            # The snapshot copies the sparse rows and the dense vectors on every shard at
            # once; ``export_dense`` then reads the dense ones from it (the caller's to
            # arrange), so the whole model is the one of this moment, written beside the
            # next pass.
            await self.steps.retried(f"{self.sparse_uri}: snapshot", self.parts.snapshot)
            self.timed("snapshot")
        self.timed.restart()

    async def publish(self) -> DoneLine:
        """The rest: the parts not yet written, ``MODEL.json``, then the donefile line."""
        steps, target = self.steps, self.target
        self.timed.restart()
        if self.saved is None:
            # From a snapshot: the dense part first, as writing the sparse parts frees it.
            await self._write_dense()
            self.timed.restart()
            await self._write_sparse()
        await steps.retried(f"{target.uri}: {MODEL_MANIFEST}", self._write_manifest)
        self.timed("manifest")
        await steps.hook.hold(MANIFEST_POINT, self.key)
        self.timed.restart()
        line = await steps.retried(f"{target.root}/{DONEFILE}", self._append_line)
        self.timed("donefile")
        return line

    async def _clear(self) -> None:
        _remove(self.fs, self.model_dir)

    async def _fresh_sparse(self) -> SaveResult:
        # A failed attempt leaves its partial parts (the PS saves into a new random
        # directory each time): remove them, or the model would hold files MODEL.json
        # does not list.
        _remove(self.fs, f"{self.model_dir}/sparse")
        return await self.parts.save_sparse(self.sparse_uri)

    async def _fresh_dense(self) -> Sequence[str]:
        _remove(self.fs, f"{self.model_dir}/dense")
        return await self.parts.export_dense(self.dense_uri)

    async def _write_sparse(self) -> None:
        what = f"{self.sparse_uri}: sparse save"
        self.saved = await self.steps.retried(what, self._fresh_sparse)
        self.timed("sparse")
        await self.steps.hook.hold(PARTS, self.key)
        self.timed.restart()

    async def _write_dense(self) -> None:
        started = time.perf_counter()
        await self.steps.retried(f"{self.dense_uri}: dense export", self._fresh_dense)
        if self.steps.on_phase is not None:
            self.steps.on_phase("dense", time.perf_counter() - started)

    async def _write_manifest(self) -> None:
        saved, target, fs, model_dir = self.saved, self.target, self.fs, self.model_dir
        assert saved is not None  # the sparse parts are written first
        files = [ModelFile(f"sparse/{f.path}", f.size, f.sha256, f.rows) for f in saved.files]
        unlisted = [f"sparse/{MANIFEST}"] + [
            f"dense/{name}" for name in sorted(_names(fs, f"{model_dir}/dense"))
        ]
        files += [ModelFile.of(rel, fs.cat_file(f"{model_dir}/{rel}")) for rel in unlisted]
        manifest = ModelManifest(
            key=target.key,
            kind=target.kind,
            day=target.day,
            pass_index=target.pass_index,
            base=target.base,
            save_mode=int(saved.mode),
            keys=saved.keys_saved,
            tombstones=saved.tombstones,
            metrics=dict(self.parts.metrics),
            files=tuple(files),
            serving=self.parts.serving,
        )
        storage.write_durable(fs, f"{model_dir}/{MODEL_MANIFEST}", manifest.render())

    async def _append_line(self) -> DoneLine:
        t = self.target
        line = DoneLine(t.key, t.kind, t.day, t.pass_index, t.base, self.steps.clock())
        rfs, root = storage.filesystem(t.root)
        path = f"{root}/{DONEFILE}"
        old = rfs.cat_file(path).decode() if rfs.exists(path) else ""
        new = model_folder.with_line(old, line, path)
        if new is not None:
            storage.write_durable(rfs, path, new.encode())
        return line


class _Timer:
    """Reports the seconds since the last report (or ``restart``) under a phase name."""

    def __init__(self, report: Callable[[str, float], None] | None) -> None:
        self.report = report
        self.started = time.perf_counter()

    def restart(self) -> None:
        self.started = time.perf_counter()

    def __call__(self, phase: str) -> None:
        now = time.perf_counter()
        if self.report is not None:
            self.report(phase, now - self.started)
        self.started = now


def _remove(fs: fsspec.AbstractFileSystem, path: str) -> None:
    if fs.exists(path):
        fs.rm(path, recursive=True)


def _names(fs: fsspec.AbstractFileSystem, directory: str) -> list[str]:
    if not fs.exists(directory):
        return []
    return [str(p).rstrip("/").rsplit("/", 1)[-1] for p in fs.ls(directory, detail=False)]


def verify_model(root: str, key: str) -> ModelManifest:
    """Read a published model's manifest and check every listed file (size and sha256);
    ``model_folder.ModelFormatError`` names what does not match."""
    fs, base = storage.filesystem(root)
    manifest = model_folder.read_manifest(fs, base, key)
    model_folder.verify_files(fs, base, manifest)
    return manifest
