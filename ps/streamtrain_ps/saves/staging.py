"""The second phase of saves and loads: side effects and swaps kept pending until the caller
knows every server succeeded.

A multi-server save is complete only when the caller publishes the manifest. If a shard
applied its save side effects (delta/base: ``delta_score -= saved``, tombstones cleared;
batch: ``unseen_days += 1``) as soon as its own parts were written, a failure on another
shard would leave the retried delta without the keys this shard already "used up". So a
*staged* save records its effects here and applies them only on ``commit`` (after publish);
``abort`` drops them and the retry saves the unchanged state.

The same holds for loads: every server first *prepares* (reads and verifies its parts into
memory), and only when all prepared does any of them swap in.

Both slots hold at most one pending item per shard: a newer stage replaces (aborts) an older
uncommitted one, so the outcome never depends on message timing, and memory stays bounded.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Generic, TypeVar

import numpy as np
import numpy.typing as npt

from streamtrain_ps.errors import CheckpointError
from streamtrain_ps.tier.tiering import TieredTable

log = logging.getLogger(__name__)

T = TypeVar("T")


@dataclass(frozen=True)
class TableEffects:
    """What one table's part of a save changes once it counts as done.

    ``rows`` are stable while the key lives in RAM (rows never move; growth copies them in
    place; shrink frees deleted keys' rows, which ``forget`` removes first; a load discards
    the whole staged save). A key saved from the disk tier has row -1, and a demotion
    after the save (``moves``) sends every key through a lookup in both tiers.
    ``tombstone_mark`` is how many tombstone batches the save read
    (``TableSaves.tombstones_marked``), or -1 if the mode does not clear tombstones.
    """

    table: TieredTable
    keys: npt.NDArray[np.uint64]
    rows: npt.NDArray[np.int64]
    saved_delta: npt.NDArray[np.float32]
    unseen_inc: bool
    tombstone_mark: int
    #: ``table.moves`` when the rows were recorded (a demotion since makes them stale).
    moves: int = 0

    def apply_locked(self) -> None:
        """Apply; the caller holds ``table.lock.maintenance`` (no shrink or load meanwhile).

        Subtracting the *saved* delta_score (not zeroing) keeps pushes that arrived after the
        save counting towards the next delta; clearing only the marked tombstone batches
        keeps keys deleted by a later shrink pending.
        """
        if self.rows.size:
            t = self.table
            t.saves.apply_save(self.keys, self.rows, self.saved_delta, self.unseen_inc, self.moves)
        if self.tombstone_mark >= 0:
            self.table.saves.clear_tombstones(upto=self.tombstone_mark)

    def forget(self, deleted: npt.NDArray[np.uint64]) -> TableEffects:
        """Without the keys a shrink just deleted (their rows will hold other keys)."""
        if not deleted.size or not self.keys.size:
            return self
        keep = ~np.isin(self.keys, deleted)
        return replace(
            self, keys=self.keys[keep], rows=self.rows[keep], saved_delta=self.saved_delta[keep]
        )


@dataclass(frozen=True)
class SaveEffects:
    """A staged save: its id (the data directory it wrote), URI and per-table effects."""

    save_id: str
    uri: str
    tables: tuple[TableEffects, ...]

    def resets_deltas(self) -> bool:
        """Whether it is a delta or base (subtracts delta_score, clears tombstones)."""
        return any(e.tombstone_mark >= 0 for e in self.tables)


class Pending(Generic[T]):
    """One pending item per shard, by id, with the id of the last one committed.

    ``take(id)`` hands out the pending item if it is ``id`` (commit or abort), and tells a
    retried commit of the item already committed (``None`` + ``committed(id)``) apart from
    an id that was never staged or was superseded (an error).
    """

    def __init__(self, what: str) -> None:
        self._what = what
        self._lock = threading.Lock()
        self._id: str | None = None
        self._item: T | None = None
        self._committed: str | None = None
        #: Ids aborted before they were staged (the abort overtook a slow stage).
        self._aborted: deque[str] = deque(maxlen=16)

    def put(self, item_id: str, item: T) -> None:
        """Make ``item`` the pending one; an older pending item is dropped (aborted). An id
        whose abort already arrived is dropped at once."""
        with self._lock:
            if item_id in self._aborted:
                log.warning("%s %s was aborted before it was staged (dropped)", self._what, item_id)
                return
            if self._id is not None and self._id != item_id:
                log.warning("%s %s superseded by %s (dropped)", self._what, self._id, item_id)
            self._id, self._item = item_id, item

    def take(self, item_id: str, commit: bool) -> T | None:
        """The pending item ``item_id`` (removed), or None if a commit of it already
        happened or (``commit=False``) there is nothing to drop. Raises ``CheckpointError``
        when committing an id that is not pending and was not committed."""
        with self._lock:
            if self._id == item_id:
                item = self._item
                self._id = self._item = None
                if commit:
                    self._committed = item_id
                return item
            if not commit:
                self._aborted.append(item_id)
                return None
            if self._committed == item_id:
                return None
            now = f"; pending is {self._id}" if self._id else ""
            raise CheckpointError(
                f"{self._what} {item_id} is not pending (superseded, aborted or unknown){now}"
            )

    def update(self, fn: Callable[[T], T]) -> None:
        """Replace the pending item by ``fn(item)`` (e.g. forget keys a shrink deleted)."""
        with self._lock:
            if self._item is not None:
                self._item = fn(self._item)

    def restore(self, item_id: str, item: T) -> None:
        """Make ``item`` pending again after its commit failed before applying (a retried
        commit then applies it)."""
        with self._lock:
            if self._committed == item_id:
                self._committed = None
            self._id, self._item = item_id, item

    def drop_if(self, pred: Callable[[T], bool], reason: str) -> None:
        """Drop the pending item if ``pred(item)`` (a later save's effects cover it)."""
        with self._lock:
            if self._item is not None and pred(self._item):
                log.warning("%s %s dropped: %s", self._what, self._id, reason)
                self._id = self._item = None

    def clear(self, reason: str) -> None:
        """Drop the pending item (a load replaced the content it refers to)."""
        with self._lock:
            if self._id is not None:
                log.warning("%s %s dropped: %s", self._what, self._id, reason)
            self._id = self._item = None
