"""One parameter-server shard: its sparse tables, its dense vectors, validation, save/load.

This is the object the gRPC servicer wraps (and ``LocalPS`` uses in-process). Every public
method validates its arguments and raises only the ``streamtrain_ps.errors`` tree, so the
servicer can map errors to status codes without knowing the engine. All methods are
thread-safe; see ``streamtrain_ps.engine.table`` for what concurrent pulls, pushes, saves and
shrinks see of each other.

What ``memoryLimit`` makes of the shard is sized in one place (``tier.memory_plan``); saves
and loads are collaborators holding the shard's tables (``saves.shard_saves``,
``saves.shard_loads``), and the methods here that name them forward to them.
"""

from __future__ import annotations

import functools
import os
import shutil
import tempfile
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt

from streamtrain_ps import api, sharding
from streamtrain_ps.config import PSConfig
from streamtrain_ps.engine.dense import DenseState, DenseStore
from streamtrain_ps.engine.push_errors import raise_push_errors
from streamtrain_ps.errors import (
    InvalidRequestError,
    RequestTooLargeError,
    UnknownTableError,
)
from streamtrain_ps.plumbing.heap import note_request_scratch
from streamtrain_ps.saves.held_save import SnapshotSlot
from streamtrain_ps.saves.shard_loads import PreparedLoad, ShardLoads
from streamtrain_ps.saves.shard_saves import ShardSaves
from streamtrain_ps.tier.memory_limit import MemoryBudget, peak_rss_bytes
from streamtrain_ps.tier.memory_plan import MemoryPlan
from streamtrain_ps.tier.tiering import DiskOptions, TieredTable
from streamtrain_ps.validation import contiguous_array, dense_name, require_finite


@dataclass(frozen=True)
class TableShardStats:
    name: str
    keys: int
    expanded_keys: int
    memory_bytes: int
    admissions_total: int
    evictions_total: int
    #: Key updates refused because the row would have held inf or NaN (``kernels``).
    refused_total: int = 0
    #: Disk tier (``tiering``): keys and bytes there, moves between tiers, evictions
    #: because both tiers were full (included in ``evictions_total``).
    ram_bytes: int = 0
    disk_keys: int = 0
    disk_bytes: int = 0
    promotions_total: int = 0
    demotions_total: int = 0
    pressure_evictions_total: int = 0


@dataclass(frozen=True)
class ShardStats:
    shard_index: int
    num_shards: int
    tables: tuple[TableShardStats, ...]
    dense_names: tuple[str, ...]
    last_save_seconds: float
    last_load_seconds: float
    memory_limit_bytes: int = 0
    peak_rss_bytes: int = 0
    working_set_bytes: int = 0


_NO_SLOTS = np.empty(0, dtype=np.uint32)


class Shard:
    """Shard ``shard_index`` of ``num_shards``: owns the logical shards
    ``sharding.owned_logical_shards(shard_index, num_shards, config.logicalShards)``."""

    def __init__(
        self,
        config: PSConfig,
        shard_index: int = 0,
        num_shards: int = 1,
        memory_budget: MemoryBudget | None = None,
    ) -> None:
        """``memory_budget``: how ``config.memoryLimit`` is split; default measured here
        (``MemoryPlan.of``: the one place the limit sizes the shard's parts)."""
        if not 0 <= shard_index < num_shards:
            raise ValueError(f"shard_index {shard_index} not in [0, {num_shards})")
        plan = MemoryPlan.of(config, memory_budget)
        self.config = config
        self.shard_index = shard_index
        self.num_shards = num_shards
        self.owned = sharding.owned_logical_shards(shard_index, num_shards, config.logicalShards)
        cores = os.cpu_count() or 1
        self._helpers = (
            ThreadPoolExecutor(cores - 1, f"shard{shard_index}-kernel") if cores > 1 else None
        )
        self._disk_root = _disk_root(config, shard_index)
        self._tables = {
            t.name: TieredTable(
                t,
                seed=config.seed,
                capacity=plan.table_capacity(t),
                helpers=self._helpers,
                disk=DiskOptions(
                    self._disk_root / t.name.encode().hex(),
                    config.diskLimit,
                    config.logicalShards,
                    plan.store,
                    volume=Path(config.diskPath) if config.diskPath else None,
                ),
            )
            for t in config.tables
        }
        self._gate = plan.request_gate()
        self._memory = plan.governor(list(self._tables.values()), lambda: self._gate.used)
        self._max_keys = plan.max_request_keys
        self._dense = DenseStore(config.dense.optimizer)
        #: The snapshot save taken but maybe not yet written (``snapshot_save``).
        self._snapshot = SnapshotSlot(shard_index)
        self._saving = ShardSaves(
            config,
            shard_index,
            self.owned,
            self._tables,
            self._dense,
            self._selected,
            self._snapshot,
        )
        self._loading = ShardLoads(
            config,
            shard_index,
            num_shards,
            self._tables,
            self._memory,
            self._dense,
            self._saving.staged,
            self._snapshot,
        )

    # -- sparse -----------------------------------------------------------------------------

    def request_slot(self, keys: int) -> AbstractContextManager[None]:
        """Held while one sparse request of ``keys`` keys is decoded, served and encoded: a
        capped shard serves no more at once than its scratch reserve holds."""
        return self._gate.admit(keys)

    def release_memory(self) -> None:
        """Give freed heap pages back to the OS, then check a capped shard's RSS against its
        split (``MemoryGovernor.observe_after_trim``): the server's pool calls this when
        it trims after requests, with none in flight when it is idle."""
        self._memory.release_memory()

    def pull_sparse(self, table: str, keys: npt.NDArray[np.uint64]) -> npt.NDArray[np.float32]:
        """Rows ``[show, click, embed_w, embedx_w...]``; unknown keys are zeros (not created)."""
        t = self._table(table)
        k = self._keys(keys)
        # Promotions bring keys into RAM: the governor makes room for those the pull finds.
        out = t.pull(k, make_room=functools.partial(self._memory.make_room, t))
        self._memory.enforce()
        note_request_scratch(k.size)
        return out

    def push_sparse(self, table: str, push: api.SparsePush) -> int:
        """Apply one push (§4); returns the number of unique keys updated."""
        t = self._table(table)
        k = self._keys(push.keys)
        n = k.size
        g = contiguous_array(push.grads, "grads", np.float32, (n, t.layout.embedx_dim + 1))
        s = contiguous_array(push.shows, "shows", np.float32, (n,))
        c = contiguous_array(push.clicks, "clicks", np.float32, (n,))
        slots = push.slots
        sl = _NO_SLOTS if slots is None else contiguous_array(slots, "slots", np.uint32, (n,))
        route = (self.config.logicalShards, self.num_shards, self.shard_index)
        parts = t.merge(k, g, s, c, sl, route)
        raise_push_errors(parts, k, s, c, route)
        unique = sum(int(part.n) for part in parts)
        self._memory.check_request(t, unique)
        self._memory.make_room(t, unique)
        t.push_merged(parts, has_slots=slots is not None)
        self._memory.enforce()
        del parts  # the last reference to the scratch arrays
        note_request_scratch(n)
        return unique

    # -- dense ------------------------------------------------------------------------------

    def init_dense(
        self, name: str, values: npt.NDArray[np.float32], summary_decay: float | None = None
    ) -> tuple[npt.NDArray[np.float32], int]:
        """Create ``name`` from ``values`` unless it exists (first writer wins); with
        ``summary_decay`` it is a summary vector (``dense.py``)."""
        v = contiguous_array(values, "values", np.float32, None)
        require_finite(v, "values")
        if summary_decay is not None and not 0.0 < summary_decay <= 1.0:
            raise InvalidRequestError("summary.decay", f"must be in (0, 1], got {summary_decay}")
        return self._dense.init(dense_name(name), v, summary_decay)

    def pull_dense(self, name: str, snapshot_id: str = "") -> tuple[npt.NDArray[np.float32], int]:
        """Vector ``name`` now, or as the held snapshot save ``snapshot_id`` took it."""
        if snapshot_id:
            return self._snapshot.dense(snapshot_id, dense_name(name))
        return self._dense.get(dense_name(name)).pull()

    def push_dense(self, name: str, grads: npt.NDArray[np.float32]) -> int:
        g = contiguous_array(grads, "grads", np.float32, None)
        require_finite(g, "grads")
        return self._dense.push(dense_name(name), g)

    # -- maintenance ------------------------------------------------------------------------

    def shrink(self, table: str | None = None) -> api.ShrinkResult:
        """Decay show/click and delete stale keys of one table (or all)."""
        before = deleted = 0
        with self._saving.effects_lock:
            for t in self._selected(table):
                b, gone = t.shrink_keys()
                before += b
                deleted += int(gone.size)
                self._saving.forget(t, gone)
        return api.ShrinkResult(keys_before=before, deleted=deleted, keys_after=before - deleted)

    def save(self, uri: str, mode: api.SaveMode | int, table: str | None = None) -> api.SaveResult:
        """Write this shard's parts of a save and apply its side effects at once
        (``ShardSaves.save``; with several shards use ``stage_save`` + ``finish_save``)."""
        return self._saving.save(uri, mode, table)

    def stage_save(
        self,
        uri: str,
        mode: api.SaveMode | int,
        table: str | None = None,
        save_id: str | None = None,
    ) -> tuple[api.SaveResult, str]:
        """``save`` whose side effects stay pending until ``finish_save(id, commit=True)``."""
        return self._saving.stage_save(uri, mode, table, save_id)

    def finish_save(self, save_id: str, commit: bool) -> bool:
        """Apply (``commit``) or drop a staged save's side effects."""
        return self._saving.finish_save(save_id, commit)

    def snapshot_save(
        self, mode: api.SaveMode | int, snapshot_id: str, table: str | None = None
    ) -> api.SaveResult:
        """Take a save of the current content now and write it later (``write_snapshot``)."""
        return self._saving.snapshot_save(mode, snapshot_id, table)

    def write_snapshot(self, uri: str, snapshot_id: str) -> api.SaveResult:
        """Write the parts of snapshot ``snapshot_id`` below ``uri`` (no manifest)."""
        return self._saving.write_snapshot(uri, snapshot_id)

    def drop_snapshot(self, snapshot_id: str) -> None:
        """Free the memory of snapshot ``snapshot_id`` once it is published."""
        self._saving.drop_snapshot(snapshot_id)

    # -- loads ------------------------------------------------------------------------------

    def load(self, uri: str, discard_live: bool = False) -> int:
        """Replace this shard's content with its logical shards of a published save
        (``ShardLoads.load``); returns the keys loaded."""
        return self._loading.load(uri, discard_live)

    def verify_save(self, uri: str) -> int:
        """Check every part of a save this shard would load, keeping nothing."""
        return self._loading.verify_save(uri)

    def replace(self, uri: str) -> int:
        """Discard the live tables, then build and swap in the save (after ``verify_save``)."""
        return self._loading.replace(uri)

    def read_save(self, uri: str) -> PreparedLoad:
        """First half of ``load``: read, verify and build (nothing swapped in yet)."""
        return self._loading.read_save(uri)

    def install(self, prepared: PreparedLoad) -> int:
        """Second half of ``load``: swap a prepared load in; returns keys installed."""
        return self._loading.install(prepared)

    def prepare_load(self, uri: str, load_id: str | None = None, discard_live: bool = False) -> int:
        """First phase of a multi-server load; returns keys prepared."""
        return self._loading.prepare_load(uri, load_id, discard_live)

    def finish_load(self, uri: str, commit: bool, load_id: str | None = None) -> int:
        """Second phase: swap the prepared load in (``commit``) or drop it."""
        return self._loading.finish_load(uri, commit, load_id)

    # -- state ------------------------------------------------------------------------------

    def stats(self) -> ShardStats:
        tables = tuple(
            TableShardStats(
                name=t.name,
                keys=t.total_keys,
                expanded_keys=t.expanded_keys,
                memory_bytes=t.memory_bytes(),
                admissions_total=t.admissions_total,
                evictions_total=t.evictions_total,
                refused_total=t.refused_total,
                ram_bytes=t.ram_bytes(),
                disk_keys=t.disk_keys,
                disk_bytes=t.disk_bytes(),
                promotions_total=t.promotions_total,
                demotions_total=t.demotions_total,
                pressure_evictions_total=t.pressure_evictions_total,
            )
            for t in self._tables.values()
        )
        return ShardStats(
            shard_index=self.shard_index,
            num_shards=self.num_shards,
            tables=tables,
            dense_names=self._dense.names(),
            last_save_seconds=self._saving.last_seconds,
            last_load_seconds=self._loading.last_seconds,
            memory_limit_bytes=self.config.memoryLimit or 0,
            peak_rss_bytes=peak_rss_bytes(),
            working_set_bytes=self._memory.working_set_bytes,
        )

    @property
    def memory_budget(self) -> MemoryBudget:
        """How ``memoryLimit`` was split when the shard started."""
        return self._memory.budget

    def dense_snapshot(self) -> dict[str, DenseState]:
        """Copies of every dense vector with its optimizer state (tools and tests)."""
        return self._dense.snapshot()

    def close(self) -> None:
        """Stop the helper threads (idle ones cost nothing; this is for tidy shutdowns)."""
        if self._helpers is not None:
            self._helpers.shutdown(wait=True)
        for t in self._tables.values():
            t.close()

    def table(self, name: str) -> TieredTable:
        """The engine table behind ``name`` (tools and tests that need full rows)."""
        return self._table(name)

    # -- validation -------------------------------------------------------------------------

    def _table(self, name: str) -> TieredTable:
        if not isinstance(name, str) or not name:
            raise InvalidRequestError("table", "must name a sparse table")
        t = self._tables.get(name)
        if t is None:
            raise UnknownTableError("table", name)
        return t

    def _selected(self, table: str | None) -> list[TieredTable]:
        return list(self._tables.values()) if table is None else [self._table(table)]

    def _keys(self, keys: npt.NDArray[np.uint64]) -> npt.NDArray[np.uint64]:
        k = contiguous_array(keys, "keys", np.uint64, None)
        if k.ndim != 1:
            raise InvalidRequestError("keys", f"must be 1-D, got shape {k.shape}")
        if k.size > self.config.maxKeysPerRequest:
            raise RequestTooLargeError(
                f"keys: {k.size} keys exceed maxKeysPerRequest {self.config.maxKeysPerRequest}"
            )
        if self._max_keys and k.size > self._max_keys:
            raise RequestTooLargeError(
                f"keys: {k.size} keys exceed the {self._max_keys} a shard under memoryLimit "
                "admits in one request (its scratch reserve holds that many)"
            )
        return k


#: A shard's spill root without ``diskPath``: in the temporary directory, by process id.
_TEMP_ROOT = "streamtrain-ps-{pid}-shard-{index}"


def _disk_root(config: PSConfig, shard_index: int) -> Path:
    """Where this shard's disk tier lives: ``diskPath/shard-<i>``, or a fresh temporary
    directory (created only when a table first spills).

    A starting shard owns nothing there yet: whatever it finds is a killed predecessor's
    spill (``gen-*`` stores no one deletes, outside any cap: the road to a full volume),
    so it is removed: the whole ``diskPath/shard-<i>``, and in the temporary directory the
    roots of processes that no longer run."""
    if config.diskPath:
        root = Path(config.diskPath) / f"shard-{shard_index}"
        shutil.rmtree(root, ignore_errors=True)
        return root
    tmp = Path(tempfile.gettempdir())
    for old in tmp.glob(_TEMP_ROOT.format(pid="*", index="*")):
        pid = old.name.split("-")[2]
        if pid.isdigit() and not _running(int(pid)):
            shutil.rmtree(old, ignore_errors=True)
    return tmp / _TEMP_ROOT.format(pid=os.getpid(), index=shard_index)


def _running(pid: int) -> bool:
    """Whether process ``pid`` exists (signal 0 checks without sending anything)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process
        return True
    return True
