"""The ``PSLike`` protocol: what workers and the scheduler need from a parameter server.

Two implementations (``streamtrain_ps.client``): ``LocalPS`` (in-process shard, for tests
and single-process training) and ``RemotePS`` (N gRPC servers; routes keys by logical shard,
fans out in parallel, deduplicates pulls, merges pushes, retries UNAVAILABLE).

Array conventions: keys ``uint64 (n,)``; pulled rows ``float32 (n, 3 + embedx_dim)`` laid out
``[show, click, embed_w, embedx_w...]``; pushed gradients ``float32 (n, 1 + embedx_dim)``
laid out ``[embed_g, embedx_g...]`` — the gradient of the *sum* of per-example losses; the
table divides by the pushed show to get a per-impression step. Shows and clicks
``float32 (n,)``, slots ``uint32 (n,)``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Protocol, runtime_checkable

import numpy as np
import numpy.typing as npt


class SaveMode(IntEnum):
    """What a save writes (docs/design.md §4)."""

    CHECKPOINT = 0  # all keys, all state (optimizer slots, dense tables)
    DELTA = 1  # score >= base, delta_score >= delta, unseen <= keep days; + tombstones
    BASE = 2  # score >= base, unseen <= keep days; resets delta_score
    BATCH = 3  # all keys, inference values; then unseen_days += 1


@dataclass(frozen=True)
class SavedFile:
    path: str  # relative to the save URI
    size: int
    sha256: str
    rows: int


@dataclass(frozen=True)
class SaveResult:
    uri: str
    mode: SaveMode
    files: tuple[SavedFile, ...]
    keys_saved: int
    tombstones: int
    seconds: float

    @classmethod
    def combined(
        cls, uri: str, mode: SaveMode | int, results: Sequence[SaveResult], seconds: float
    ) -> SaveResult:
        """One save's result over every shard's part of it."""
        return cls(
            uri=uri,
            mode=SaveMode(mode),
            files=tuple(f for r in results for f in r.files),
            keys_saved=sum(r.keys_saved for r in results),
            tombstones=sum(r.tombstones for r in results),
            seconds=seconds,
        )


@dataclass(frozen=True)
class ShrinkResult:
    keys_before: int
    deleted: int
    keys_after: int


@dataclass(frozen=True)
class TableStats:
    name: str
    keys: int
    expanded_keys: int
    memory_bytes: int


@dataclass(frozen=True)
class PSStats:
    tables: tuple[TableStats, ...]
    dense_names: tuple[str, ...] = field(default_factory=tuple)


@runtime_checkable
class PSLike(Protocol):
    """A parameter server, local or remote. All methods are thread-safe."""

    def pull_sparse(self, table: str, keys: npt.NDArray[np.uint64]) -> npt.NDArray[np.float32]: ...

    def push_sparse(
        self,
        table: str,
        keys: npt.NDArray[np.uint64],
        grads: npt.NDArray[np.float32],
        shows: npt.NDArray[np.float32],
        clicks: npt.NDArray[np.float32],
        slots: npt.NDArray[np.uint32] | None = None,
    ) -> None: ...

    def push_batch(
        self,
        table: str,
        keys: npt.NDArray[np.uint64],
        grads: npt.NDArray[np.float32],
        shows: npt.NDArray[np.float32],
        clicks: npt.NDArray[np.float32],
        slots: npt.NDArray[np.uint32] | None = None,
        dense: Sequence[tuple[str, npt.NDArray[np.float32]]] = (),
    ) -> None:
        """One trained batch: ``push_dense(name, grads)`` for every pair of ``dense``, then
        ``push_sparse`` — over gRPC in one request per server involved, not one per call."""
        ...

    def init_dense(
        self, name: str, values: npt.NDArray[np.float32], summary_decay: float | None = None
    ) -> npt.NDArray[np.float32]:
        """Create the vector unless it exists; return its current values. With
        ``summary_decay`` pushes are summed statistics, not gradients (``dense.py``)."""
        ...

    def pull_dense(self, name: str, snapshot_id: str = "") -> npt.NDArray[np.float32]:
        """The vector's values now, or (``snapshot_id``) as that held snapshot save took
        them (``snapshot``; ``CheckpointError`` once it is no longer held)."""
        ...

    def push_dense(self, name: str, grads: npt.NDArray[np.float32]) -> None: ...

    def save(self, uri: str, mode: SaveMode) -> SaveResult:
        """Write every shard's parts, then publish the manifest (all or nothing)."""
        ...

    def snapshot(self, mode: SaveMode, snapshot_id: str) -> None:
        """Take a save of every shard now, named ``snapshot_id`` (the caller's, so a retry
        names the same one and applies nothing twice), to be written by ``save_snapshot``:
        parts copied into memory, side effects applied. A checkpoint (mode 0) copies every
        row and the dense vectors: the shards' memory doubles until it is written."""
        ...

    def save_snapshot(self, uri: str, mode: SaveMode, snapshot_id: str) -> SaveResult:
        """Write snapshot ``snapshot_id`` below ``uri`` and publish its manifest (may be
        retried); then free it."""
        ...

    def load(self, uri: str, discard_live: bool = False) -> int:
        """Load a published save into every shard; returns keys loaded. The live tables
        stay until the new ones are complete (a bad save changes nothing), or with
        ``discard_live`` are released first, once every part was verified (a rollback:
        half the peak memory; a failure after the release leaves the shards empty)."""
        ...

    def shrink(self) -> ShrinkResult: ...

    def stats(self) -> PSStats: ...

    def close(self) -> None: ...
