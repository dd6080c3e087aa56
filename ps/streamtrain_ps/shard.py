"""One parameter-server shard: its sparse tables, its dense vectors, validation, save/load.

This is the object the gRPC servicer wraps (and ``LocalPS`` uses in-process). Every public
method validates its arguments and raises only the ``streamtrain_ps.errors`` tree, so the
servicer can map errors to status codes without knowing the engine. All methods are
thread-safe; see ``streamtrain_ps.engine.table`` for what concurrent pulls, pushes, saves and
shrinks see of each other.
"""

from __future__ import annotations

import functools
import os
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager, ExitStack
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import numpy.typing as npt

from streamtrain_ps import api, sharding
from streamtrain_ps.config import PSConfig
from streamtrain_ps.engine.accessor import RowLayout
from streamtrain_ps.engine.dense import DenseState, DenseStore
from streamtrain_ps.engine.push_errors import raise_push_errors
from streamtrain_ps.errors import (
    CheckpointError,
    InvalidRequestError,
    PSError,
    RequestTooLargeError,
    UnknownTableError,
)
from streamtrain_ps.plumbing.heap import note_request_scratch
from streamtrain_ps.saves import checkpoint, saving
from streamtrain_ps.saves.held_save import DenseValues, SnapshotSlot
from streamtrain_ps.saves.shard_loads import PreparedLoad, ShardLoads
from streamtrain_ps.saves.staging import Pending, SaveEffects
from streamtrain_ps.tier.disk_store import StoreMemory
from streamtrain_ps.tier.memory_limit import (
    MemoryBudget,
    MemoryGovernor,
    bound_allocator,
    capped_request_keys,
    peak_rss_bytes,
    request_bytes_per_key,
    request_scratch_bytes,
)
from streamtrain_ps.tier.request_gate import RequestGate
from streamtrain_ps.tier.tiering import DiskOptions, TieredTable
from streamtrain_ps.tier.warmup import warm_kernels
from streamtrain_ps.validation import contiguous_array, dense_name, require_finite, save_mode


@dataclass(frozen=True)
class TableShardStats:
    name: str
    keys: int
    expanded_keys: int
    memory_bytes: int
    admissions_total: int
    evictions_total: int
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


class Shard(ShardLoads):
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
        (``MemoryBudget.measure`` after warming the kernels: a process budget)."""
        if not 0 <= shard_index < num_shards:
            raise ValueError(f"shard_index {shard_index} not in [0, {num_shards})")
        limit = config.memoryLimit or 0
        if memory_budget is None:
            memory_budget = MemoryBudget.unlimited()
            if limit:
                bound_allocator()
                warm_kernels(config)
                memory_budget = MemoryBudget.measure(
                    limit, num_tables=len(config.tables), request=request_scratch_bytes(config)
                )
        store_memory = StoreMemory(memory_budget.store) if limit else None
        # Slabs sized for the table budget up front (untouched pages are not resident), so
        # reaching the budget never copies a slab (a copy would hold old and new at once).
        per_table = memory_budget.tables // max(1, len(config.tables)) if limit else 0
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
                capacity=per_table // (8 + 4 * RowLayout.of(t).primary_width),
                helpers=self._helpers,
                disk=DiskOptions(
                    self._disk_root / t.name.encode().hex(),
                    config.diskLimit,
                    config.logicalShards,
                    store_memory,
                ),
            )
            for t in config.tables
        }
        #: Sparse requests served at once: as many as the scratch reserve holds, by bytes
        #: (a capped shard; the servicer holds it around a request's decode, work, encode).
        self._gate = RequestGate(
            memory_budget.requests_in_flight * memory_budget.request_bytes,
            request_bytes_per_key(config),
        )
        self._memory = MemoryGovernor(
            memory_budget,
            list(self._tables.values()),
            disk_limit=config.diskLimit,
            store=store_memory,
            in_flight=lambda: self._gate.used,
        )
        #: Most keys of one request (0: ``maxKeysPerRequest``): a process budget's reserve
        #: holds ``capped_request_keys`` (a table-only budget reserves nothing).
        self._max_keys = capped_request_keys(config) if memory_budget.request_bytes else 0
        self._dense = DenseStore(config.dense.optimizer)
        self._last_save = 0.0
        self._last_load = 0.0
        #: Staged saves and prepared loads (two-phase, see ``streamtrain_ps.saves.staging``).
        self._saves: Pending[SaveEffects] = Pending("staged save")
        #: The snapshot save taken but maybe not yet written (``snapshot_save``).
        self._snapshot = SnapshotSlot(shard_index)
        self._loads: Pending[PreparedLoad] = Pending("prepared load")
        #: Orders a commit's apply against a shrink's ``forget`` (taken before table locks).
        self._effects_lock = threading.Lock()

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

    def push_sparse(
        self,
        table: str,
        keys: npt.NDArray[np.uint64],
        grads: npt.NDArray[np.float32],
        shows: npt.NDArray[np.float32],
        clicks: npt.NDArray[np.float32],
        slots: npt.NDArray[np.uint32] | None = None,
    ) -> int:
        """Apply one push (§4); returns the number of unique keys updated."""
        t = self._table(table)
        k = self._keys(keys)
        n = k.size
        g = contiguous_array(grads, "grads", np.float32, (n, t.layout.embedx_dim + 1))
        s = contiguous_array(shows, "shows", np.float32, (n,))
        c = contiguous_array(clicks, "clicks", np.float32, (n,))
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
        with self._effects_lock:
            for t in self._selected(table):
                b, gone = t.shrink_keys()
                before += b
                deleted += int(gone.size)
                self._saves.update(functools.partial(_forget, table=t, gone=gone))
        return api.ShrinkResult(keys_before=before, deleted=deleted, keys_after=before - deleted)

    def save(self, uri: str, mode: api.SaveMode | int, table: str | None = None) -> api.SaveResult:
        """Write this shard's parts of a save (no manifest: the caller publishes it) and apply
        its side effects at once.

        Modes 1 and 2 reset the saved keys' delta_score, mode 3 ages unseen_days, and 1/2
        clear tombstones — only after every part was written, so a failed save changes
        nothing. Dense vectors are written by mode 0 saves of all tables. With several
        shards use ``stage_save`` + ``finish_save`` instead: a failure on *another* shard
        must not leave this one's effects applied.
        """
        return self._save(uri, mode, table, stage=False)[0]

    def stage_save(
        self,
        uri: str,
        mode: api.SaveMode | int,
        table: str | None = None,
        save_id: str | None = None,
    ) -> tuple[api.SaveResult, str]:
        """``save`` whose side effects stay pending until ``finish_save(id, commit=True)``
        (after the manifest is published). Returns the result and the save id (``save_id``
        if given — the caller's, so it can abort everywhere — else the data directory). A
        newer staged save replaces an older pending one (whose effects are dropped)."""
        return self._save(uri, mode, table, stage=True, save_id=save_id)

    def finish_save(self, save_id: str, commit: bool) -> bool:
        """Apply (``commit``) or drop a staged save's side effects. Returns whether the
        effects are applied (now or by an earlier call: a retried commit is a no-op).
        Committing an id that is not pending and was not committed is ``CheckpointError``."""
        if not isinstance(save_id, str) or not save_id:
            raise InvalidRequestError("save_id", "must name a staged save")
        tables = list(self._tables.values())
        with self._effects_lock, ExitStack() as stack:
            for t in tables:
                stack.enter_context(t.lock.maintenance)
            effects = self._saves.take(save_id, commit)
            if effects is None or not commit:
                return commit
            for e in effects.tables:
                e.apply_locked()
        return True

    def snapshot_save(
        self, mode: api.SaveMode | int, snapshot_id: str, table: str | None = None
    ) -> api.SaveResult:
        """Take a save of the current content now and write it later (``write_snapshot``).

        The parts are copied and encoded into memory and the save's side effects are applied
        at once, as one consistent moment of the model: the scheduler takes it between two
        passes and lets the next pass train while the parts are written, so they stay the
        model of the pass before. (A write that fails for good fails the job, whose next
        run reloads a checkpoint: an applied effect never outlives its save.) One snapshot
        per shard, replaced by the next; taking the same ``snapshot_id`` again returns it
        without applying anything twice (a retried call). A checkpoint (mode 0, every table:
        with the dense vectors) holds an encoded copy of every row until it is written —
        the shard's memory doubles meanwhile, so the scheduler asks for one only when the
        job opts in (``checkpoint.besideTraining``).
        """
        mode = save_mode(mode)
        if mode == api.SaveMode.CHECKPOINT and table is not None:
            raise InvalidRequestError("table", "a checkpoint snapshot takes every table")
        if not isinstance(snapshot_id, str) or not snapshot_id:
            raise InvalidRequestError("save_id", "must name the snapshot")
        if mode == api.SaveMode.CHECKPOINT and self.config.memoryLimit:
            raise InvalidRequestError(
                "mode",
                "a checkpoint snapshot holds a copy of every row (the disk tier's too) in "
                "memory, outside this shard's memoryLimit: write the checkpoint directly",
            )

        def take() -> tuple[checkpoint.PartBuffer, api.SaveResult, dict[str, DenseValues]]:
            tables = self._selected(table)
            start = time.perf_counter()
            buffer = checkpoint.PartBuffer(self.shard_index)
            with ExitStack() as stack:
                for t in tables:
                    stack.enter_context(t.lock.maintenance)
                files, effects, saved, tombs = saving.write_tables(
                    buffer, tables, mode, self.config.logicalShards, self.owned
                )
                if mode == api.SaveMode.CHECKPOINT:
                    files += saving.write_dense(buffer, self._dense.snapshot())
                for e in effects:
                    e.apply_locked()
                dense = self._dense.pull_all()  # the model's dense part, same moment
            seconds = time.perf_counter() - start
            result = api.SaveResult("", mode, tuple(files), saved, tombs, seconds)
            return buffer, result, dense

        return self._snapshot.take(snapshot_id, take)

    def write_snapshot(self, uri: str, snapshot_id: str) -> api.SaveResult:
        """Write the parts of snapshot ``snapshot_id`` below ``uri`` (no manifest: the caller
        publishes it); can be repeated after a failure. ``CheckpointError`` if this shard
        does not hold it (replaced by a newer one, or lost in a restart)."""
        if not isinstance(uri, str) or not uri:
            raise InvalidRequestError("uri", "must be a non-empty fsspec URL")
        start = time.perf_counter()
        try:
            result = self._snapshot.write(uri, snapshot_id)
        except PSError:
            raise
        except Exception as exc:  # storage errors of any fsspec backend
            raise CheckpointError(f"save to {uri} failed: {type(exc).__name__}: {exc}") from exc
        seconds = time.perf_counter() - start
        self._last_save = seconds
        return replace(result, seconds=result.seconds + seconds)

    def drop_snapshot(self, snapshot_id: str) -> None:
        """Free the memory of snapshot ``snapshot_id`` once it is published (no-op otherwise)."""
        self._snapshot.drop(snapshot_id)

    def _save(
        self,
        uri: str,
        mode: api.SaveMode | int,
        table: str | None,
        stage: bool,
        save_id: str | None = None,
    ) -> tuple[api.SaveResult, str]:
        mode = save_mode(mode)
        if not isinstance(uri, str) or not uri:
            raise InvalidRequestError("uri", "must be a non-empty fsspec URL")
        tables = self._selected(table)
        start = time.perf_counter()
        try:
            with ExitStack() as stack:
                for t in tables:
                    stack.enter_context(t.lock.maintenance)
                # Leaving the writer's block waits until every part is on storage: the
                # effects below are staged or applied only after that.
                with checkpoint.PartWriter(uri, self.shard_index) as writer:
                    files, effects, saved, tombs = saving.write_tables(
                        writer, tables, mode, self.config.logicalShards, self.owned
                    )
                    if mode == api.SaveMode.CHECKPOINT and table is None:
                        files += saving.write_dense(writer, self._dense.snapshot())
                staged = SaveEffects(save_id or writer.data_dir, uri, tuple(effects))
                if stage:
                    self._saves.put(staged.save_id, staged)
                else:
                    for e in staged.tables:
                        e.apply_locked()
        except PSError:
            raise
        except Exception as exc:  # storage errors of any fsspec backend
            raise CheckpointError(f"save to {uri} failed: {type(exc).__name__}: {exc}") from exc
        seconds = time.perf_counter() - start
        self._last_save = seconds
        return api.SaveResult(uri, mode, tuple(files), saved, tombs, seconds), staged.save_id

    def stats(self) -> ShardStats:
        tables = tuple(
            TableShardStats(
                name=t.name,
                keys=t.total_keys,
                expanded_keys=t.expanded_keys,
                memory_bytes=t.memory_bytes(),
                admissions_total=t.admissions_total,
                evictions_total=t.evictions_total,
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
            last_save_seconds=self._last_save,
            last_load_seconds=self._last_load,
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


def _forget(
    effects: SaveEffects, *, table: TieredTable, gone: npt.NDArray[np.uint64]
) -> SaveEffects:
    """``effects`` without the keys a shrink of ``t`` deleted (their rows get reused)."""
    tables = tuple(e.forget(gone) if e.table is table else e for e in effects.tables)
    return SaveEffects(effects.save_id, effects.uri, tables)


def _disk_root(config: PSConfig, shard_index: int) -> Path:
    """Where this shard's disk tier lives: ``diskPath/shard-<i>``, or a fresh temporary
    directory (created only when a table first spills)."""
    if config.diskPath:
        return Path(config.diskPath) / f"shard-{shard_index}"
    return Path(tempfile.gettempdir()) / f"streamtrain-ps-{os.getpid()}-shard-{shard_index}"
