"""A shard's snapshot save between being taken and being written (``Shard.snapshot_save``).

The scheduler takes a model between two passes and writes it while the next pass pushes:
the parts are copied (and encoded) into a ``checkpoint.PartBuffer`` at that moment, held
here, and written later — as often as asked, so a failed write is retried with the same
content. The shard's dense vectors are copied at the same moment, so the model's dense
part (a worker's TorchScript export) is read from the snapshot beside the next pass too.
One per shard: a newer snapshot replaces it, a load clears it (it is a copy of the
replaced content), a published one is dropped to free its memory.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace

import numpy as np
import numpy.typing as npt

from streamtrain_ps import api
from streamtrain_ps.errors import CheckpointError, UnknownTableError
from streamtrain_ps.saves import checkpoint

#: A dense vector as pulled: its values and how many pushes they hold.
DenseValues = tuple[npt.NDArray[np.float32], int]


@dataclass(frozen=True)
class HeldSnapshot:
    """A snapshot save: its parts in memory and what writing them will report."""

    snapshot_id: str
    buffer: checkpoint.PartBuffer
    result: api.SaveResult
    #: The shard's dense vectors at the same moment, by name.
    dense: Mapping[str, DenseValues]


class SnapshotSlot:
    """The one snapshot save a shard holds."""

    def __init__(self, shard_index: int) -> None:
        self.shard_index = shard_index
        self._lock = threading.Lock()
        self._held: HeldSnapshot | None = None

    def take(
        self,
        snapshot_id: str,
        make: Callable[[], tuple[checkpoint.PartBuffer, api.SaveResult, Mapping[str, DenseValues]]],
    ) -> api.SaveResult:
        """Hold what ``make`` takes now (parts, result, dense vectors); the held one if it
        is already ``snapshot_id`` (a retried call takes nothing twice)."""
        with self._lock:
            if self._held is not None and self._held.snapshot_id == snapshot_id:
                return self._held.result
            buffer, result, dense = make()
            self._held = HeldSnapshot(snapshot_id, buffer, result, dense)
            return result

    def _get(self, snapshot_id: str) -> HeldSnapshot:
        held = self._held
        if held is None or held.snapshot_id != snapshot_id:
            raise CheckpointError(
                f"snapshot {snapshot_id} is not held by shard {self.shard_index} "
                "(replaced by a newer one, written, or lost in a restart)"
            )
        return held

    def write(self, uri: str, snapshot_id: str) -> api.SaveResult:
        """Write the held parts of ``snapshot_id`` below ``uri``; ``CheckpointError`` if
        another one (or none) is held. Storage errors are raised as they come."""
        held = self._get(snapshot_id)
        held.buffer.write_to(uri, self.shard_index)
        return replace(held.result, uri=uri)

    def dense(self, snapshot_id: str, name: str) -> DenseValues:
        """Dense vector ``name`` as snapshot ``snapshot_id`` took it (a copy of its values);
        ``CheckpointError`` if that snapshot is not held, ``UnknownTableError`` if the
        vector did not exist on this shard then."""
        held = self._get(snapshot_id)
        if name not in held.dense:
            raise UnknownTableError("dense vector", f"{name} (in snapshot {snapshot_id})")
        values, version = held.dense[name]
        return values.copy(), version

    def drop(self, snapshot_id: str | None = None) -> None:
        """Free the held snapshot (only if it is ``snapshot_id``, when given)."""
        with self._lock:
            if self._held is not None and snapshot_id in (None, self._held.snapshot_id):
                self._held = None
