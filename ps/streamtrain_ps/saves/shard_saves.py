"""How a shard saves: its parts of a save written now, staged until the caller publishes, or
taken now and written later (a snapshot), and the side effects each save implies.

``ShardSaves`` is the shard's collaborator for them: it holds the shard's tables and dense
vectors (what a save reads), the staged save and the held snapshot (what a later commit or
write finishes); ``streamtrain_ps.shard.Shard`` forwards its save calls here, and a shrink
tells it which keys are gone (``forget``).
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass, field, replace

import numpy as np
import numpy.typing as npt

from streamtrain_ps import api
from streamtrain_ps.config import PSConfig
from streamtrain_ps.engine.dense import DenseStore
from streamtrain_ps.errors import CheckpointError, InvalidRequestError, PSError
from streamtrain_ps.saves import checkpoint, saving
from streamtrain_ps.saves.held_save import DenseValues, SnapshotSlot
from streamtrain_ps.saves.staging import Pending, SaveEffects
from streamtrain_ps.tier.tiering import TieredTable
from streamtrain_ps.validation import save_mode


@dataclass
class ShardSaves:
    """Saves of one shard (see the module docstring)."""

    config: PSConfig
    shard_index: int
    #: The logical shards this shard owns (its parts of every save).
    owned: list[int]
    tables: dict[str, TieredTable]
    dense: DenseStore
    #: The shard's tables a call names (``None``: all), checked as the shard checks a name.
    select: Callable[[str | None], list[TieredTable]]
    #: The held snapshot (``snapshot_save``); a load drops it too.
    snapshot: SnapshotSlot
    #: Staged saves (two-phase, see ``streamtrain_ps.saves.staging``); a load drops them.
    staged: Pending[SaveEffects] = field(default_factory=lambda: Pending("staged save"))
    #: Orders a commit's apply against a shrink's ``forget`` (taken before table locks).
    effects_lock: threading.Lock = field(default_factory=threading.Lock)
    #: How long the last save took (``Shard.stats``).
    last_seconds: float = 0.0

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
        tables = list(self.tables.values())
        with self.effects_lock, ExitStack() as stack:
            for t in tables:
                stack.enter_context(t.lock.maintenance)
            effects = self.staged.take(save_id, commit)
            if effects is None or not commit:
                return commit
            for i, e in enumerate(effects.tables):
                try:
                    e.apply_locked()
                except BaseException:  # a disk-tier error: this table's part unapplied
                    self.staged.restore(save_id, replace(effects, tables=effects.tables[i:]))
                    raise
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
            tables = self.select(table)
            start = time.perf_counter()
            buffer = checkpoint.PartBuffer(self.shard_index)
            with ExitStack() as stack:
                for t in tables:
                    stack.enter_context(t.lock.maintenance)
                files, effects, saved, tombs = saving.write_tables(
                    buffer, tables, mode, self.config.logicalShards, self.owned
                )
                if mode == api.SaveMode.CHECKPOINT:
                    files += saving.write_dense(buffer, self.dense.snapshot())
                for e in effects:
                    e.apply_locked()
                self._supersede_staged(mode)
                dense = self.dense.pull_all()  # the model's dense part, same moment
            seconds = time.perf_counter() - start
            result = api.SaveResult("", mode, tuple(files), saved, tombs, seconds)
            return buffer, result, dense

        return self.snapshot.take(snapshot_id, take)

    def write_snapshot(self, uri: str, snapshot_id: str) -> api.SaveResult:
        """Write the parts of snapshot ``snapshot_id`` below ``uri`` (no manifest: the caller
        publishes it); can be repeated after a failure. ``CheckpointError`` if this shard
        does not hold it (replaced by a newer one, or lost in a restart)."""
        if not isinstance(uri, str) or not uri:
            raise InvalidRequestError("uri", "must be a non-empty fsspec URL")
        start = time.perf_counter()
        try:
            result = self.snapshot.write(uri, snapshot_id)
        except PSError:
            raise
        except Exception as exc:  # storage errors of any fsspec backend
            raise CheckpointError(f"save to {uri} failed: {type(exc).__name__}: {exc}") from exc
        seconds = time.perf_counter() - start
        self.last_seconds = seconds
        return replace(result, seconds=result.seconds + seconds)

    def drop_snapshot(self, snapshot_id: str) -> None:
        """Free the memory of snapshot ``snapshot_id`` once it is published (no-op otherwise)."""
        self.snapshot.drop(snapshot_id)

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
        tables = self.select(table)
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
                        files += saving.write_dense(writer, self.dense.snapshot())
                staged = SaveEffects(save_id or writer.data_dir, uri, tuple(effects))
                if stage:
                    self.staged.put(staged.save_id, staged)
                else:
                    for e in staged.tables:
                        e.apply_locked()
                    self._supersede_staged(mode)
        except PSError:
            raise
        except Exception as exc:  # storage errors of any fsspec backend
            raise CheckpointError(f"save to {uri} failed: {type(exc).__name__}: {exc}") from exc
        seconds = time.perf_counter() - start
        self.last_seconds = seconds
        return api.SaveResult(uri, mode, tuple(files), saved, tombs, seconds), staged.save_id

    def _supersede_staged(self, mode: api.SaveMode) -> None:
        """A delta or base just applied its effects at once: a pending staged delta or base
        is dropped, its late commit refused. It would clear the first tombstone batches
        *now* pending (deleted after this save, never published) and subtract the
        delta_score this save already subtracted (keys pushed since missing from the next
        delta); this save read everything it did, so nothing of it is lost
        (``docs/decisions.md``, issue 25 (a)). Hold the tables' ``maintenance``."""
        if mode in (api.SaveMode.DELTA, api.SaveMode.BASE):
            self.staged.drop_if(
                SaveEffects.resets_deltas, f"a later {mode.name.lower()} save applied its effects"
            )

    def forget(self, table: TieredTable, gone: npt.NDArray[np.uint64]) -> None:
        """Drop the keys a shrink of ``table`` deleted from the staged save's effects (their
        rows get reused). Hold ``effects_lock``."""
        self.staged.update(functools.partial(_forget, table=table, gone=gone))


def _forget(
    effects: SaveEffects, *, table: TieredTable, gone: npt.NDArray[np.uint64]
) -> SaveEffects:
    """``effects`` without the keys a shrink of ``t`` deleted (their rows get reused)."""
    tables = tuple(e.forget(gone) if e.table is table else e for e in effects.tables)
    return SaveEffects(effects.save_id, effects.uri, tables)
