"""How a shard loads a published save: all or nothing over its live tables, or (for a
rollback) discarding them first, and the two phases of a multi-server load.

- **Keep live** (``load``; ``prepare_load`` + ``finish_load``): every owned part is read,
  verified and built into new tables beside the live ones, then swapped in. A corrupt or
  incomplete save leaves the shard as it was; the price is old + new table at once (~2x).
- **Discard live** (``discard_live=True``): every owned part is read and verified first,
  keeping nothing (``LoadPlan.verify``), so a bad save is refused before anything is
  dropped; then the live tables are released and the save is built in their place (~1x).
  A failure after the release (a part changed since, a storage error, a duplicate key)
  leaves the shard empty and says so in the ``CheckpointError``; a retried load fills it.
  The driver's rollback uses it: the live state it replaces is to be discarded anyway.

``ShardLoads`` is the shard's collaborator for them: it holds the shard's tables, dense
vectors and memory governor (what a load replaces or sizes) and its pending save and held
snapshot (what a load drops); ``streamtrain_ps.shard.Shard`` forwards its load calls here.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass, field
from typing import TypeVar

import numpy as np

from streamtrain_ps.config import PSConfig
from streamtrain_ps.engine.accessor import SLOT
from streamtrain_ps.engine.dense import DenseState, DenseStore
from streamtrain_ps.engine.packed import SLOT_CODES
from streamtrain_ps.engine.table import HotCounters
from streamtrain_ps.errors import CheckpointError, InvalidRequestError, PSError
from streamtrain_ps.plumbing.heap import release_scratch_memory
from streamtrain_ps.saves import load_plan
from streamtrain_ps.saves.held_save import SnapshotSlot
from streamtrain_ps.saves.staging import Pending, SaveEffects
from streamtrain_ps.tier.disk_filter import DiskKeyFilter
from streamtrain_ps.tier.disk_store import DiskFullError
from streamtrain_ps.tier.memory_limit import LOW_WATER, MemoryGovernor
from streamtrain_ps.tier.tiering import TieredContent, TieredTable

log = logging.getLogger(__name__)

R = TypeVar("R")
_NO_KEYS = np.empty(0, dtype=np.uint64)


@dataclass(frozen=True)
class PreparedLoad:
    """A verified, fully built load waiting to be swapped in (``Shard.read_save``); with
    ``discard_live`` only verified (``Shard.verify_save``): the commit discards the live
    tables, then builds (``Shard.replace``)."""

    tables: dict[str, TieredContent]
    dense: dict[str, DenseState] | None
    keys: int
    discard_live: bool = False


@dataclass
class ShardLoads:
    """Loads of one shard (see the module docstring)."""

    config: PSConfig
    shard_index: int
    num_shards: int
    tables: dict[str, TieredTable]
    memory: MemoryGovernor
    dense: DenseStore
    #: The shard's staged save and held snapshot: a load drops them (their content is gone).
    saves: Pending[SaveEffects]
    snapshot: SnapshotSlot
    #: Loads prepared by ``prepare_load``, waiting for ``finish_load``.
    prepared: Pending[PreparedLoad] = field(default_factory=lambda: Pending("prepared load"))
    #: How long the last load took (``Shard.stats``).
    last_seconds: float = 0.0

    def load(self, uri: str, discard_live: bool = False) -> int:
        """Replace this shard's content with its logical shards of a published save.

        Everything is read, checksum-verified and parsed before anything is swapped in, so a
        corrupt or incomplete save raises ``CheckpointError`` and leaves the shard as it was
        (the old and the new tables coexist until the swap: ~2x the table). With
        ``discard_live`` (a rollback, whose live state is to be dropped anyway) every part is
        verified first, then the live tables are released and the save built in their
        place (~1x); a failure after the release leaves the shard empty and says so.
        Returns the number of keys loaded.
        """
        start = time.perf_counter()
        if discard_live:
            self.verify_save(uri)
            keys = self.replace(uri)
        else:
            keys = self.install(self.read_save(uri))
        self.last_seconds = time.perf_counter() - start
        return keys

    def verify_save(self, uri: str) -> int:
        """Check every part of a save this shard would load (manifest against the config,
        checksums, headers, layout, dense vectors) one part at a time, keeping nothing.
        Raises ``CheckpointError``; returns the keys the parts hold."""
        return self._reading(uri, lambda plan: plan.verify())

    def replace(self, uri: str) -> int:
        """Discard the live tables (``discard``), then build and swap in the save's content
        (call after ``verify_save``). A failure from here on leaves the shard empty: it is
        logged and raised as ``CheckpointError`` saying so, and a retried load fills it."""
        self.discard()
        try:
            return self.install(self.read_save(uri))
        except PSError as exc:
            log.error(
                "shard %d: load of %s failed after the live tables were discarded: %s",
                self.shard_index,
                uri,
                exc,
            )
            raise CheckpointError(
                f"{exc} (shard {self.shard_index} discarded its live tables before this load "
                "failed, as asked: it holds no keys until a load succeeds)"
            ) from exc

    def discard(self) -> None:
        """Release every table's content (RAM and disk tier) and any staged save or held
        snapshot of it; dense vectors stay (a load replaces them). Returns once the memory
        is given back."""
        tables = list(self.tables.values())
        with ExitStack() as stack:
            for t in tables:
                stack.enter_context(t.lock.maintenance)
            self.saves.clear("a load discarded the shard's content")
            self.snapshot.drop()
            for t in tables:
                rows = np.empty((0, t.layout.width), np.float32)
                t.install_tiered(
                    TieredContent(t.build(_NO_KEYS, rows, _NO_KEYS), None, DiskKeyFilter())
                )
        release_scratch_memory()

    def read_save(self, uri: str) -> PreparedLoad:
        """First half of ``load``: read, verify and build this shard's part of a save
        (tables fully indexed, nothing swapped in yet)."""

        def build(plan: load_plan.LoadPlan) -> PreparedLoad:
            tables = {name: self._build(plan, name) for name in self.tables}
            keys_total = sum(plan.table_keys(name) for name in self.tables)
            return PreparedLoad(tables, plan.dense(), keys_total)

        return self._reading(uri, build)

    def _reading(self, uri: str, read: Callable[[load_plan.LoadPlan], R]) -> R:
        """``read`` the plan of the save at ``uri``; storage errors become ``CheckpointError``."""
        if not isinstance(uri, str) or not uri:
            raise InvalidRequestError("uri", "must be a non-empty fsspec URL")
        try:
            return read(load_plan.plan_load(uri, self.config, self.shard_index, self.num_shards))
        except PSError:
            raise
        except Exception as exc:  # storage errors of any fsspec backend
            raise CheckpointError(f"load from {uri} failed: {type(exc).__name__}: {exc}") from exc

    def _build(self, plan: load_plan.LoadPlan, name: str) -> TieredContent:
        """One table of a load, built beside the current one (which stays until
        ``install``). Without a memory limit it is built part by part, so the load holds
        one part of the save at a time; with one, the disk tier orders all keys by
        coldness first (``TieredTable.build_tiered``)."""
        uri = plan.manifest.uri
        t = self.tables[name]
        budget = int(self.memory.table_budget * LOW_WATER / max(1, len(self.tables)))
        try:
            if budget <= 0:
                ram = t.build_parts(plan.table_keys(name), plan.table_parts(name))
                return TieredContent(ram, None, DiskKeyFilter())
            tp = plan.table(name)
            slots = np.unique(np.ascontiguousarray(tp.rows[:, SLOT]).view(np.uint32))
            if np.count_nonzero(slots) >= SLOT_CODES:  # spilled keys are coded when promoted
                raise ValueError(f"more than the {SLOT_CODES} distinct slot ids a table holds")
            hot = HotCounters(tp.hot_rows, tp.hot_counts)
            return t.build_tiered(tp.keys, tp.rows, tp.tombstones, hot, budget)
        except ValueError as exc:
            raise CheckpointError(f"{uri}: table {name!r}: {exc}") from exc
        except DiskFullError as exc:
            raise CheckpointError(f"{uri}: table {name!r}: spilling to disk: {exc}") from exc

    def prepare_load(self, uri: str, load_id: str | None = None, discard_live: bool = False) -> int:
        """First phase of a multi-server load: ``read_save`` and keep the result pending as
        ``load_id`` (default: ``uri``; one per shard, a newer prepare replaces an older
        one). With ``discard_live`` only ``verify_save`` (nothing is built or dropped: the
        commit discards the live tables, then builds). Returns keys prepared."""
        if discard_live:
            prepared = PreparedLoad({}, None, self.verify_save(uri), discard_live=True)
        else:
            prepared = self.read_save(uri)
        self.prepared.put(load_id or uri, prepared)
        return prepared.keys

    def finish_load(self, uri: str, commit: bool, load_id: str | None = None) -> int:
        """Second phase: swap the prepared load in (``commit``) or drop it. Returns the keys
        installed (0 for an abort or a repeated commit)."""
        if not isinstance(uri, str) or not uri:
            raise InvalidRequestError("uri", "must be a non-empty fsspec URL")
        prepared = self.prepared.take(load_id or uri, commit)
        if prepared is None or not commit:
            return 0
        start = time.perf_counter()
        keys = self.replace(uri) if prepared.discard_live else self.install(prepared)
        self.last_seconds = time.perf_counter() - start
        return keys

    def install(self, prepared: PreparedLoad) -> int:
        """Second half of ``load``: swap a prepared load in; returns keys installed.
        A staged save is dropped: its rows and tombstones belong to the replaced content."""
        tables = list(self.tables.values())
        with ExitStack() as stack:
            for t in tables:
                stack.enter_context(t.lock.maintenance)
            self.saves.clear("a load replaced the shard's content")
            self.snapshot.drop()  # a copy of the replaced content
            for t in tables:
                t.install_tiered(prepared.tables[t.name])
            if prepared.dense is not None:
                self.dense.replace(prepared.dense)
        return prepared.keys
