"""``LocalPS``: the ``PSLike`` protocol in-process, over one or more ``Shard`` objects.

It routes keys exactly as the remote client does (``sharding.server_of_key`` /
``server_of_dense``), so a model trained with ``LocalPS(config, num_shards=N)`` saves the
same parts as N servers would, and tests of N -> M re-sharding need no network. Saves publish
the manifest after every shard wrote its parts; loads read and verify every shard's part of
the checkpoint before any shard swaps its content in.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import numpy as np
import numpy.typing as npt

from streamtrain_ps import api, sharding
from streamtrain_ps.config import PSConfig
from streamtrain_ps.errors import CheckpointError, InvalidRequestError, UnknownTableError
from streamtrain_ps.saves import checkpoint
from streamtrain_ps.shard import Shard
from streamtrain_ps.tier.memory_limit import MemoryBudget

R = TypeVar("R")


class LocalPS:
    """N in-process shards behind the ``PSLike`` interface. Thread-safe."""

    def __init__(self, config: PSConfig, num_shards: int = 1) -> None:
        if num_shards < 1:
            raise ValueError(f"num_shards must be >= 1, got {num_shards}")
        self.config = config
        self.num_shards = num_shards
        # In-process shards share their caller's process (a worker, a test): its RSS is not
        # theirs to bound, so ``memoryLimit`` is each shard's table budget here.
        budget = MemoryBudget.tables_only(config.memoryLimit or 0)
        self.shards = [Shard(config, i, num_shards, budget) for i in range(num_shards)]
        self._pool = ThreadPoolExecutor(num_shards, "localps") if num_shards > 1 else None

    # -- routing ----------------------------------------------------------------------------

    def _each(self, fn: Callable[[Shard], R]) -> list[R]:
        """``fn`` on every shard, in parallel (the kernels release the GIL)."""
        if self._pool is None:
            return [fn(s) for s in self.shards]
        return list(self._pool.map(fn, self.shards))

    def _settled(self, fn: Callable[[Shard], R]) -> list[R]:
        """``_each`` that lets every shard finish before raising the first failure (so an
        abort that follows finds every shard's staged state in place)."""
        outcomes: list[tuple[R | None, BaseException | None]] = self._each(
            lambda s: _outcome(fn, s)
        )
        for _, exc in outcomes:
            if exc is not None:
                raise exc
        return [r for r, _ in outcomes]  # type: ignore[misc]

    def _route(self, keys: npt.NDArray[np.uint64]) -> list[npt.NDArray[np.int64]]:
        """Positions of ``keys`` per shard."""
        if not isinstance(keys, np.ndarray) or keys.dtype != np.uint64 or keys.ndim != 1:
            raise InvalidRequestError("keys", "must be a 1-D uint64 numpy array")
        servers = sharding.server_of_key(keys, self.config.logicalShards, self.num_shards)
        order = np.argsort(servers, kind="stable")
        bounds = np.searchsorted(servers[order], np.arange(self.num_shards + 1))
        return [order[bounds[i] : bounds[i + 1]] for i in range(self.num_shards)]

    def _dense_shard(self, name: str) -> Shard:
        return self.shards[sharding.server_of_dense(name, self.num_shards)]

    # -- PSLike -----------------------------------------------------------------------------

    def pull_sparse(self, table: str, keys: npt.NDArray[np.uint64]) -> npt.NDArray[np.float32]:
        if self.num_shards == 1:
            return self.shards[0].pull_sparse(table, keys)
        parts = self._route(keys)
        dim = self._pull_dim(table)
        out = np.empty((keys.size, dim), dtype=np.float32)

        def pull(shard: Shard) -> None:
            pos = parts[shard.shard_index]
            if pos.size:
                out[pos] = shard.pull_sparse(table, keys[pos])

        self._each(pull)
        return out

    def push_sparse(self, table: str, push: api.SparsePush) -> None:
        if self.num_shards == 1:
            self.shards[0].push_sparse(table, push)
            return
        keys = push.keys
        parts = self._route(keys)
        n = keys.size
        for field, arr in push.per_key():
            if arr is not None and (not isinstance(arr, np.ndarray) or arr.shape[:1] != (n,)):
                raise InvalidRequestError(field, f"must be a numpy array with {n} rows")

        def one(shard: Shard) -> None:
            pos = parts[shard.shard_index]
            if pos.size:
                shard.push_sparse(table, push.take(pos))

        self._each(one)

    def init_dense(
        self, name: str, values: npt.NDArray[np.float32], summary_decay: float | None = None
    ) -> npt.NDArray[np.float32]:
        return self._dense_shard(name).init_dense(name, values, summary_decay)[0]

    def pull_dense(self, name: str, snapshot_id: str = "") -> npt.NDArray[np.float32]:
        return self._dense_shard(name).pull_dense(name, snapshot_id)[0]

    def push_batch(
        self,
        table: str,
        push: api.SparsePush,
        dense: Sequence[tuple[str, npt.NDArray[np.float32]]] = (),
    ) -> None:
        """The dense gradients, then the rows — the order a server applies them in."""
        for name, values in dense:
            self.push_dense(name, values)
        self.push_sparse(table, push)

    def push_dense(self, name: str, grads: npt.NDArray[np.float32]) -> None:
        self._dense_shard(name).push_dense(name, grads)

    def save(
        self, uri: str, mode: api.SaveMode, meta: Mapping[str, Any] | None = None
    ) -> api.SaveResult:
        """Every shard writes its parts (in parallel) and stages its side effects, the
        manifest is published, then the effects are committed on every shard — or dropped on
        every shard if any part or the manifest failed (two-phase, like ``RemotePS``)."""
        start = time.perf_counter()
        save_id = uuid.uuid4().hex
        try:
            staged = self._settled(lambda s: s.stage_save(uri, mode, save_id=save_id))
            results = [r for r, _ in staged]
            checkpoint.publish(uri, results, meta, config=self.config)
        except BaseException:
            self._each(lambda s: s.finish_save(save_id, commit=False))
            raise
        self._each(lambda s: s.finish_save(save_id, commit=True))
        return api.SaveResult.combined(uri, mode, results, time.perf_counter() - start)

    def snapshot(self, mode: api.SaveMode, snapshot_id: str) -> None:
        """Every shard takes a snapshot save now (``Shard.snapshot_save``); a retry with the
        same id applies nothing twice."""
        self._each(lambda s: s.snapshot_save(mode, snapshot_id))

    def save_snapshot(
        self,
        uri: str,
        mode: api.SaveMode,
        snapshot_id: str,
        meta: Mapping[str, Any] | None = None,
    ) -> api.SaveResult:
        """Every shard writes its parts of the snapshot, then the manifest is published and
        the snapshot freed (a failure keeps it for a retry)."""
        start = time.perf_counter()
        results = self._each(lambda s: s.write_snapshot(uri, snapshot_id))
        if any(r.mode != mode for r in results):
            raise CheckpointError(f"snapshot {snapshot_id} is not a mode {int(mode)} save")
        checkpoint.publish(uri, results, meta, config=self.config)
        self._each(lambda s: s.drop_snapshot(snapshot_id))
        return api.SaveResult.combined(uri, mode, results, time.perf_counter() - start)

    def load(self, uri: str, discard_live: bool = False) -> int:
        """Read and verify every shard's part first; swap in only if all of them are good.
        ``discard_live``: verify every shard's parts first (nothing kept), then each shard
        releases its live tables and builds the save (``shard_loads``)."""
        if discard_live:
            self._each(lambda s: s.verify_save(uri))
            return sum(self._settled(lambda s: s.replace(uri)))
        payloads = self._each(lambda s: s.read_save(uri))
        return sum(
            shard.install(payload) for shard, payload in zip(self.shards, payloads, strict=True)
        )

    def shrink(self) -> api.ShrinkResult:
        results = self._each(lambda s: s.shrink())
        return api.ShrinkResult(
            keys_before=sum(r.keys_before for r in results),
            deleted=sum(r.deleted for r in results),
            keys_after=sum(r.keys_after for r in results),
        )

    def stats(self) -> api.PSStats:
        per_shard = [s.stats() for s in self.shards]
        tables = []
        for t in self.config.tables:
            rows = [ts for s in per_shard for ts in s.tables if ts.name == t.name]
            tables.append(
                api.TableStats(
                    name=t.name,
                    keys=sum(r.keys for r in rows),
                    expanded_keys=sum(r.expanded_keys for r in rows),
                    memory_bytes=sum(r.memory_bytes for r in rows),
                )
            )
        dense = tuple(sorted({n for s in per_shard for n in s.dense_names}))
        return api.PSStats(tables=tuple(tables), dense_names=dense)

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)
        for shard in self.shards:
            shard.close()

    def _pull_dim(self, table: str) -> int:
        try:
            return self.config.table(table).pull_dim
        except KeyError:
            raise UnknownTableError("table", table) from None


def _outcome(fn: Callable[[Shard], R], shard: Shard) -> tuple[R | None, BaseException | None]:
    try:
        return fn(shard), None
    except BaseException as exc:  # re-raised by LocalPS._settled once every shard finished
        return None, exc
