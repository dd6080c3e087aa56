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

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, fields
from enum import IntEnum
from typing import Any, Protocol, runtime_checkable

import numpy as np
import numpy.typing as npt


class SaveMode(IntEnum):
    """What a save writes (docs/design.md §4)."""

    CHECKPOINT = 0  # all keys, all state (optimizer slots, dense tables)
    DELTA = 1  # score >= base, delta_score >= delta, unseen <= keep days; + tombstones
    BASE = 2  # score >= base, unseen <= keep days; resets delta_score
    BATCH = 3  # all keys, inference values; then unseen_days += 1


@dataclass(frozen=True)
class SparsePush:
    """One push of sparse rows: per key its gradient row, show, click and (optionally) slot.

    What travels together from a worker's batch through a client, the wire and the servicer
    to the shard. Every field is an array of one row per key, so routing a push to shards or
    servers takes the same rows of each (``take``); a new per-key field is one line here
    (plus its encoding on the wire). Arrays are not validated here: each receiver checks
    what it receives, naming the field (``errors.InvalidRequestError``).
    """

    keys: npt.NDArray[np.uint64]
    grads: npt.NDArray[np.float32]
    shows: npt.NDArray[np.float32]
    clicks: npt.NDArray[np.float32]
    slots: npt.NDArray[np.uint32] | None = None

    @property
    def size(self) -> int:
        return int(np.shape(self.keys)[0])

    def per_key(self) -> Iterator[tuple[str, npt.NDArray[np.generic] | None]]:
        """``(name, array)`` of every per-key field but the keys, in declaration order."""
        for f in fields(self)[1:]:
            yield f.name, getattr(self, f.name)

    @classmethod
    def concat(cls, parts: Sequence[SparsePush]) -> SparsePush:
        """One push carrying every part's rows (keys may repeat: a receiver sums them); an
        optional field absent from any part is absent from the whole."""

        def joined(name: str) -> Any:
            arrays = [getattr(p, name) for p in parts]
            return None if any(a is None for a in arrays) else np.concatenate(arrays)

        return cls(**{f.name: joined(f.name) for f in fields(cls)})

    def take(self, rows: npt.NDArray[np.intp] | slice) -> SparsePush:
        """The push of the keys at ``rows`` (an absent optional field stays absent)."""
        taken: dict[str, Any] = {
            f.name: None if (a := getattr(self, f.name)) is None else a[rows] for f in fields(self)
        }
        return SparsePush(**taken)


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

    def push_sparse(self, table: str, push: SparsePush) -> None: ...

    def push_batch(
        self,
        table: str,
        push: SparsePush,
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
