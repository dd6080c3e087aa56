"""Following an export's donefile into a versioned table, exactly once, guarded.

Each donefile line after the table's cursor, in order:

1. a batch model is skipped (not servable); the cursor moves past it;
2. the chain is ``predict.model_chain`` (the one place that knows it); every file of the
   model's ``MODEL.json`` is verified (size, sha256) before anything is read;
3. the rows: the new delta onto the head version when the chain extends the head's chain,
   otherwise the whole chain from its base (a base, a day change, a repaired gap);
4. the guard (``versions.Guard``): finite rows and dense weights, the pass metrics;
5. the rows are written as a new version (invisible), then ``commit`` moves cursor, head
   and, if accepted, the live version in one write.

A kill anywhere before 5 leaves the cursor where it was, and the rerun rebuilds the same
version id (the line number) from scratch; a kill after it finds the line consumed. So
every line is applied once. A model whose files do not verify is refused without a
version: the head stays, and the next model rebuilds from its chain.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import fsspec
import numpy as np
import torch

from streamtrain_ps.errors import CheckpointError
from streamtrain_ps.saves.checkpoint import read_sparse
from streamtrain_worker.publishing.export import load_dense
from streamtrain_worker.publishing.model_folder import (
    DoneLine,
    ModelFormatError,
    ModelKind,
    read_donefile,
    read_manifest,
    verify_files,
)
from streamtrain_worker.publishing.predict import ModelNotFoundError, model_chain
from streamtrain_worker.serving.tables import Part, VersionedTable
from streamtrain_worker.serving.versions import DeliveryState, Guard, Version

log = logging.getLogger(__name__)

#: What a model that cannot be built raises (its refusal names the file).
_BROKEN = (ModelFormatError, CheckpointError, ModelNotFoundError, OSError, ValueError, RuntimeError)
#: Hook points of one version: verified and read; rows written (invisible); committed.
BUILT, WRITTEN, COMMITTED = "built", "written", "committed"
POINTS = (BUILT, WRITTEN, COMMITTED)
#: Keys listed per version whose rows are not finite (beyond: the count still refuses).
MAX_LISTED_NONFINITE = 10_000


@dataclass(frozen=True)
class Refusal:
    """A model the guard (or verification) kept from going live."""

    key: str
    reason: str
    at: float


@dataclass(frozen=True)
class Applied:
    """One donefile line handled."""

    line: DoneLine
    version: Version | None  # None: skipped (batch model) or not buildable
    seconds: float
    refusal: Refusal | None = None


class Delivery:
    """Follows ``root``'s donefile into ``table`` (module docstring)."""

    def __init__(
        self,
        root: str,
        table: VersionedTable,
        guard: Guard | None = None,
        *,
        grace_seconds: float = 2.0,
        on_applied: Callable[[Applied], None] = lambda a: None,
        hook: Callable[[str, int], None] = lambda point, vid: None,
    ) -> None:
        self.root = root.rstrip("/")
        self.table = table
        self.guard = guard or Guard()
        self.grace_seconds = grace_seconds
        self._on_applied = on_applied
        #: Called at ``POINTS`` with the version id; the tests' kill hook SIGKILLs there.
        self._hook = hook
        self._fs, path = fsspec.core.url_to_fs(self.root)
        self._path = str(path).rstrip("/")
        self._unkept_since: dict[int, float] = {}
        self.refusals: list[Refusal] = []

    def pending(self) -> list[tuple[int, DoneLine]]:
        """Donefile lines not yet consumed, with their 1-based numbers."""
        lines = read_donefile(self._fs, self._path)
        cursor = self.table.state().cursor
        return [(i + 1, line) for i, line in enumerate(lines) if i >= cursor]

    def step(self, stop: threading.Event | None = None) -> list[Applied]:
        """Apply every pending line (until ``stop`` is set); then drop versions no longer
        needed."""
        done = []
        for number, line in self.pending():
            if stop is not None and stop.is_set():
                break
            applied = self.apply(number, line)
            done.append(applied)
            self._on_applied(applied)
        self.collect()
        return done

    def apply(self, number: int, line: DoneLine) -> Applied:
        started = time.monotonic()
        state = self.table.state()
        if number != state.cursor + 1:
            raise RuntimeError(f"line {number} is not next (cursor {state.cursor})")
        if line.kind is ModelKind.BATCH:
            self.table.commit(None, number)
            return Applied(line, None, time.monotonic() - started)
        try:
            version, parent, parts = self._build(number, line, state)
        except _BROKEN as exc:
            refusal = self._refuse(line.key, f"files: {' '.join(str(exc).split())}")
            self.table.commit(None, number, refused=True)
            return Applied(line, None, time.monotonic() - started, refusal)
        self._hook(BUILT, number)
        rows = self.table.write(version, parent, parts)
        version = replace(version, keys=rows)
        self._hook(WRITTEN, number)
        refused = self._refuse(line.key, version.refusal) if version.refusal else None
        self.table.commit(version, number, refused=refused is not None)
        self._hook(COMMITTED, number)
        return Applied(line, version, time.monotonic() - started, refused)

    def _build(
        self, number: int, line: DoneLine, state: DeliveryState
    ) -> tuple[Version, Version | None, list[Part]]:
        chain = model_chain(self.root, line.key)
        manifest = read_manifest(self._fs, self._path, line.key)
        serving = manifest.serving_info(f"{self._path}/{line.key}/MODEL.json")
        verify_files(self._fs, self._path, manifest)
        dense, _ = load_dense(f"{self.root}/{line.key}/dense")
        finite_weights = all(bool(torch.isfinite(t).all()) for t in _tensors(dense))
        keys = tuple(d.key for d in chain)
        head = state.head
        if head is not None and head.chain == keys[:-1]:
            parent: Version | None = head
            todo = keys[-1:]
            nonfinite = set(head.nonfinite)
        else:
            parent, todo, nonfinite = None, keys, set()
        parts: list[Part] = []
        for key in todo:
            if key != line.key:  # the chain's earlier models are verified too
                verify_files(self._fs, self._path, read_manifest(self._fs, self._path, key))
            part = read_sparse(f"{self.root}/{key}/sparse", serving.table)
            parts.append(part)
            nonfinite = _nonfinite_after(nonfinite, part)
        live = state.version(state.live) if state.live else None
        refusal = self.guard.judge(manifest.metrics, live, len(nonfinite), finite_weights)
        version = Version(
            id=number,
            key=line.key,
            chain=keys,
            published_at=line.published_at,
            delivered_at=time.time(),
            metrics=dict(manifest.metrics),
            keys=0,
            accepted=not refusal,
            refusal=refusal,
            nonfinite=tuple(sorted(nonfinite))[:MAX_LISTED_NONFINITE],
        )
        return version, parent, parts

    def _refuse(self, key: str, reason: str) -> Refusal:
        refusal = Refusal(key, reason, time.time())
        self.refusals.append(refusal)
        del self.refusals[:-100]
        log.warning("model %s refused: %s", key, reason)
        return refusal

    def collect(self) -> set[int]:
        """Drop versions that have not been needed for ``grace_seconds`` (a request that
        started on one finishes well within); returns the dropped ids."""
        kept = self.table.state().kept()
        now = time.monotonic()
        stale = set()
        for vid in self.table.stored() - kept:
            since = self._unkept_since.setdefault(vid, now)
            if now - since >= self.grace_seconds:
                stale.add(vid)
        for vid in kept:
            self._unkept_since.pop(vid, None)
        if stale:
            self.table.drop(stale)
            for vid in stale:
                self._unkept_since.pop(vid, None)
        return stale

    def follow(self, stop: threading.Event, poll_seconds: float = 0.2) -> None:
        """``step`` until ``stop`` is set; a failing step is logged and retried."""
        while not stop.is_set():
            try:
                self.step(stop)
            except Exception:  # storage hiccups: retried next poll
                log.exception("delivery step failed; retrying")
            stop.wait(poll_seconds)


def _nonfinite_after(nonfinite: set[int], part: Part) -> set[int]:
    """Keys with non-finite rows after ``part``: a tombstone or a finite row repairs one
    (only the few listed keys are looked up: no set of the whole delta)."""
    keys, values, tombstones = part
    bad = ~np.isfinite(values).all(axis=1)
    if nonfinite:
        listed = np.fromiter(nonfinite, dtype=np.uint64, count=len(nonfinite))
        repaired = np.isin(listed, tombstones) | np.isin(listed, keys[~bad])
        nonfinite = set(listed[~repaired].tolist())
    return nonfinite | set(keys[bad].tolist())


def _tensors(module: torch.jit.ScriptModule) -> Sequence[torch.Tensor]:
    return [*module.parameters(), *(b for b in module.buffers() if b.is_floating_point())]
