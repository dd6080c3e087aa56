"""Publishing inference models: parts first, then a manifest, then one donefile line.

The folder's format (names, keys, donefile line, ``MODEL.json``) is
``streamtrain_worker.model_folder``, shared with the predictor that reads it; this module
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
from streamtrain_worker import model_folder
from streamtrain_worker.model_folder import (
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


async def publish_model(
    target: ModelTarget,
    *,
    save_sparse: Callable[[str], Awaitable[SaveResult]],
    export_dense: Callable[[str], Awaitable[Sequence[str]]],
    metrics: Mapping[str, float],
    policy: RetryPolicy,
    sleep: Sleep,
    clock: Callable[[], float] = time.time,
    serving: Serving | None = None,
    hook: StepHook = NO_HOOK,
    on_phase: Callable[[str, float], None] | None = None,
) -> DoneLine:
    """Write the parts, ``MODEL.json`` and the donefile line (idempotent per target).

    ``save_sparse(uri)`` is the PS save (it publishes its own ``MANIFEST.json`` below
    ``uri``); ``export_dense(uri)`` is a worker's ``ExportDense``. ``serving`` goes into
    ``MODEL.json`` (the data config, table and metric buckets the predictor needs).
    ``hook`` is offered the ``parts`` point between the sparse parts and the rest
    (``hooks.PARTS``: a half-written model) and the ``manifest`` point between
    ``MODEL.json`` and the donefile line; the default never holds. ``on_phase`` is told
    how long each of ``PHASES`` took (benchmarks break a pass transition down with it).

    The same as ``write_parts`` followed at once by the publication it returns.
    """
    publish = await write_parts(
        target,
        save_sparse=save_sparse,
        export_dense=export_dense,
        metrics=metrics,
        policy=policy,
        sleep=sleep,
        clock=clock,
        serving=serving,
        hook=hook,
        on_phase=on_phase,
    )
    return await publish()


async def write_parts(
    target: ModelTarget,
    *,
    save_sparse: Callable[[str], Awaitable[SaveResult]],
    export_dense: Callable[[str], Awaitable[Sequence[str]]],
    metrics: Mapping[str, float],
    policy: RetryPolicy,
    sleep: Sleep,
    clock: Callable[[], float] = time.time,
    serving: Serving | None = None,
    hook: StepHook = NO_HOOK,
    on_phase: Callable[[str, float], None] | None = None,
    snapshot: Callable[[], Awaitable[None]] | None = None,
) -> Callable[[], Coroutine[Any, Any, DoneLine]]:
    """The part of ``publish_model`` that reads the model state; returns the rest.

    With ``snapshot`` (the PS's ``snapshot``: every shard copies the model's sparse rows
    and its dense vectors into memory now) this part only takes the snapshot, and the rest
    — ``export_dense`` (which must read the snapshot's dense vectors), ``save_sparse``
    writing the snapshot's parts, ``MODEL.json``, the donefile line — only writes what was
    taken here, so the driver runs it while the next pass trains. Without it, both parts
    are written from what the PS holds, here. Until the rest has run, the model is not
    visible. Other arguments as for ``publish_model``.
    """
    timed = _Timer(on_phase)
    existing = published(target.root, target.key)
    if existing is not None:

        async def already() -> DoneLine:
            return existing

        return already
    fs, model_dir = storage.filesystem(target.uri)

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

    key = StepKey(target.day, target.pass_index, StepKind(target.kind))
    sparse: list[SaveResult] = []

    async def write_sparse() -> None:
        sparse.append(await with_retries(f"{sparse_uri}: sparse save", fresh_sparse, policy, sleep))
        timed("sparse")
        await hook.hold(PARTS, key)
        timed.restart()

    async def write_dense() -> None:
        started = time.perf_counter()
        await with_retries(f"{dense_uri}: dense export", fresh_dense, policy, sleep)
        if on_phase is not None:
            on_phase("dense", time.perf_counter() - started)

    if snapshot is None:
        await write_sparse()
        await write_dense()
    else:
        # The snapshot copies the sparse rows and the dense vectors on every shard at once;
        # ``export_dense`` then reads the dense ones from it (the caller's to arrange), so
        # the whole model is the one of this moment, written beside the next pass.
        await with_retries(f"{sparse_uri}: snapshot", snapshot, policy, sleep)
        timed("snapshot")
    timed.restart()

    async def write_manifest() -> None:
        saved = sparse[0]
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
            metrics=dict(metrics),
            files=tuple(files),
            serving=serving,
        )
        storage.write_durable(fs, f"{model_dir}/{MODEL_MANIFEST}", manifest.render())

    async def append_line() -> DoneLine:
        line = DoneLine(
            target.key, target.kind, target.day, target.pass_index, target.base, clock()
        )
        rfs, root = storage.filesystem(target.root)
        path = f"{root}/{DONEFILE}"
        old = rfs.cat_file(path).decode() if rfs.exists(path) else ""
        new = model_folder.with_line(old, line, path)
        if new is not None:
            storage.write_durable(rfs, path, new.encode())
        return line

    async def publish() -> DoneLine:
        timed.restart()
        if not sparse:
            # From a snapshot: the dense part first, as writing the sparse parts frees it.
            await write_dense()
            timed.restart()
            await write_sparse()
        await with_retries(f"{target.uri}: {MODEL_MANIFEST}", write_manifest, policy, sleep)
        timed("manifest")
        await hook.hold(MANIFEST_POINT, key)
        timed.restart()
        line = await with_retries(f"{target.root}/{DONEFILE}", append_line, policy, sleep)
        timed("donefile")
        return line

    return publish


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
