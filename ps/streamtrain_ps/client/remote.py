"""``RemotePS``: the ``PSLike`` protocol over N PS servers reached by gRPC.

A pull deduplicates keys (``dedup.unique_inverse``, one linear-time hash pass), routes
every unique key to its server (``sharding.server_of_key``), splits each server's share into
requests that respect ``maxKeysPerRequest`` and ``maxMessageBytes``, sends them all at once
(gRPC futures: the servers work in parallel and one server works on several chunks in
parallel), and scatters the answers back into the caller's order. A push first merges rows
of the same key (sums of gradients, shows and clicks — what the server would do anyway, for
fewer bytes), then routes and fans out the same way.

Retries and the status -> exception mapping live in ``streamtrain_ps.client.rpc`` (re-exported
here: ``RetryHook``, ``error_from_rpc``, and the ``RetryPolicy`` of ``plumbing.retry``), so
local and remote PS raise alike.

Exactly-once across failures: every push carries a request id (random client id, sequence
number) so a retry of a push whose answer was lost is not applied again; saves are two-phase
(servers stage their side effects, which are committed only after the manifest is
published); loads are two-phase (every server verifies its parts into memory before any
swaps them in).
"""

from __future__ import annotations

import itertools
import logging
import os
import threading
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

import numpy as np
import numpy.typing as npt

from streamtrain_ps import api, sharding
from streamtrain_ps.client.dedup import merge_duplicates, unique_inverse
from streamtrain_ps.client.dense_push import DensePush
from streamtrain_ps.client.rpc import FanOut, RetryHook, error_from_rpc
from streamtrain_ps.config import REQUEST_KEYS, PSConfig, TableConfig
from streamtrain_ps.errors import PSError, UnknownTableError
from streamtrain_ps.plumbing.retry import RetryPolicy
from streamtrain_ps.plumbing.tls import TLSFiles
from streamtrain_ps.proto import ps_pb2
from streamtrain_ps.saves import checkpoint
from streamtrain_ps.service import wire
from streamtrain_ps.validation import require_array

__all__ = ["RemotePS", "RetryHook", "RetryPolicy", "error_from_rpc", "save_result"]

log = logging.getLogger(__name__)

#: Headroom below maxMessageBytes for the non-payload fields of a message.
_MESSAGE_OVERHEAD = 4096


class RemotePS:
    """``PSLike`` over ``endpoints`` (``host:port``, index = server index). Thread-safe."""

    def __init__(
        self,
        endpoints: Sequence[str],
        config: PSConfig,
        *,
        retry: RetryPolicy | None = None,
        channels_per_server: int = 2,
        request_keys: int = REQUEST_KEYS,
        on_retry: RetryHook | None = None,
        tls: TLSFiles | None = None,
    ) -> None:
        if request_keys < 1:
            raise ValueError(f"request_keys must be >= 1, got {request_keys}")
        self.endpoints = tuple(endpoints)
        self._config = config
        self._request_keys = min(request_keys, config.maxKeysPerRequest)
        self._fanout = FanOut(
            endpoints,
            config,
            retry=retry,
            channels_per_server=channels_per_server,
            on_retry=on_retry,
            tls=tls,
        )
        self._call_all = self._fanout.call_all
        # Request ids of pushes (see the module docstring).
        self._client_id = os.urandom(16)
        self._seq = itertools.count(1)
        self._inflight: set[int] = set()
        self._ids_lock = threading.Lock()

    # -- lifecycle ------------------------------------------------------------------------

    def wait_ready(self, timeout: float = 10.0) -> None:
        """Block until every channel is connected, then check that endpoint ``i`` serves
        shard ``i`` of ``len(endpoints)`` (a misordered list would misroute every key).
        Raises ``PSUnavailableError`` on timeout, ``PSError`` on a mismatch."""
        self._fanout.wait_connected(timeout)
        req = ps_pb2.StatsRequest()
        stats = self._call_all("Stats", [(i, req) for i in range(self.num_servers)])
        for i, (ep, st) in enumerate(zip(self.endpoints, stats, strict=True)):
            if (st.shard_index, st.num_shards) != (i, self.num_servers):
                raise PSError(
                    f"{ep} serves shard {st.shard_index} of {st.num_shards}, but is endpoint "
                    f"{i} of {self.num_servers} here: the endpoint list must be in shard order"
                )

    def close(self) -> None:
        self._fanout.close()

    def __enter__(self) -> RemotePS:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def num_servers(self) -> int:
        return len(self.endpoints)

    # -- sparse ---------------------------------------------------------------------------

    def pull_sparse(self, table: str, keys: npt.NDArray[np.uint64]) -> npt.NDArray[np.float32]:
        t = self._table(table)
        k = require_array(keys, "keys", np.uint64, None)
        uniq, inverse = unique_inverse(k)
        per_key = 4 * t.pull_dim  # the response dominates
        calls: list[tuple[int, ps_pb2.PullSparseRequest]] = []
        spans: list[npt.NDArray[np.intp] | slice] = []
        for server, idx in self._route(uniq):
            for span in self._chunks(idx, per_key):
                request = ps_pb2.PullSparseRequest(table=t.name, keys=wire.encode_keys(uniq[span]))
                calls.append((server, request))
                spans.append(span)
        responses = self._call_all("PullSparse", calls)
        parts = [
            wire.decode_matrix(
                r.values, r.dim, "values", n=len(c.keys) // 8, expected_dim=t.pull_dim
            )
            for (_, c), r in zip(calls, responses, strict=True)
        ]
        if len(parts) == 1:  # one request: gather straight from the response buffer
            return parts[0][inverse]
        out = np.empty((uniq.size, t.pull_dim), dtype=np.float32)
        for span, rows in zip(spans, parts, strict=True):
            out[span] = rows
        return out[inverse]

    def push_sparse(self, table: str, push: api.SparsePush) -> None:
        self._send_pushes(self._push_requests(table, push))

    def push_batch(
        self,
        table: str,
        push: api.SparsePush,
        dense: Sequence[tuple[str, npt.NDArray[np.float32]]] = (),
    ) -> None:
        """``push_sparse`` plus ``push_dense`` of every ``(name, grads)`` of ``dense``, in as
        few RPCs as there are servers involved: each vector's gradient rides in the
        PushSparse request that goes to its server (``PushSparseRequest.dense``), under that
        request's id, so a retry applies rows and vectors at most once, together."""
        calls: list[tuple[int, Any]] = list(self._push_requests(table, push))
        by_server: dict[int, list[tuple[str, npt.NDArray[np.float32]]]] = {}
        for name, values in dense:
            g = require_array(values, "grads", np.float32, None)
            by_server.setdefault(self._dense_server(name), []).append((name, g))
        for server, parts in by_server.items():
            i = next((i for i, (s, _) in enumerate(calls) if s == server), None)
            if i is None:  # no rows for that server: a request with dense parts only
                request = ps_pb2.PushSparseRequest(table=table, dim=self._table(table).push_dim)
                calls.append((server, request))
                i = len(calls) - 1
            # Serialized from the arrays, not copied into the message (``DensePush``).
            calls[i] = (server, DensePush(calls[i][1], parts))
        self._send_pushes(calls)

    def _push_requests(
        self, table: str, push: api.SparsePush
    ) -> list[tuple[int, ps_pb2.PushSparseRequest]]:
        """Validate, merge repeated keys, route and chunk one push into requests."""
        t = self._table(table)
        k = require_array(push.keys, "keys", np.uint64, None)
        n = k.size
        g = require_array(push.grads, "grads", np.float32, (n, t.push_dim))
        s = require_array(push.shows, "shows", np.float32, (n,))
        c = require_array(push.clicks, "clicks", np.float32, (n,))
        slots = push.slots
        sl = None if slots is None else require_array(slots, "slots", np.uint32, (n,))
        k, g, s, c, sl = merge_duplicates(k, g, s, c, sl)
        per_key = 8 + 4 * t.push_dim + 12
        calls: list[tuple[int, ps_pb2.PushSparseRequest]] = []
        for server, idx in self._route(k):
            for span in self._chunks(idx, per_key):
                enc = wire.encode_push(
                    k[span], g[span], s[span], c[span], None if sl is None else sl[span]
                )
                calls.append(
                    (
                        server,
                        ps_pb2.PushSparseRequest(
                            table=t.name,
                            **enc,
                        ),
                    )
                )
        return calls

    def _send_pushes(
        self, calls: Sequence[tuple[int, ps_pb2.PushSparseRequest | DensePush]]
    ) -> None:
        with self._request_ids(len(calls)) as ids:
            for (_, request), rid in zip(calls, ids, strict=True):
                request.id.CopyFrom(rid)
            self._call_all("PushSparse", calls)

    # -- dense ----------------------------------------------------------------------------

    def init_dense(
        self, name: str, values: npt.NDArray[np.float32], summary_decay: float | None = None
    ) -> npt.NDArray[np.float32]:
        v = require_array(values, "values", np.float32, None)
        req = ps_pb2.InitDenseRequest(name=name, values=wire.encode_floats(v))
        if summary_decay is not None:
            req.summary.decay = summary_decay
        (resp,) = self._call_all("InitDense", [(self._dense_server(name), req)])
        return wire.decode_floats(resp.values, "values").copy()

    def pull_dense(self, name: str, snapshot_id: str = "") -> npt.NDArray[np.float32]:
        req = ps_pb2.PullDenseRequest(name=name, snapshot_id=snapshot_id)
        (resp,) = self._call_all("PullDense", [(self._dense_server(name), req)])
        return wire.decode_floats(resp.values, "values").copy()

    def push_dense(self, name: str, grads: npt.NDArray[np.float32]) -> None:
        g = require_array(grads, "grads", np.float32, None)
        req = ps_pb2.PushDenseRequest(name=name, grads=wire.encode_floats(g, "grads"))
        with self._request_ids(1) as (rid,):
            req.id.CopyFrom(rid)
            self._call_all("PushDense", [(self._dense_server(name), req)])

    # -- control plane --------------------------------------------------------------------

    def save(
        self,
        uri: str,
        mode: api.SaveMode,
        meta: Mapping[str, Any] | None = None,
        table: str | None = None,
    ) -> api.SaveResult:
        """Save on every server in parallel, then publish the manifest (all or nothing).
        ``meta`` (e.g. day and pass) is recorded in the manifest next to the server count.

        Two-phase: servers write their parts and *stage* the side effects (delta_score,
        tombstones, unseen_days); after the manifest is published every server commits
        them; if any server or the publish failed, every server drops them, so a retried
        delta contains every changed key. A commit that fails after publishing is logged,
        not raised: the manifest is complete, and the server that missed the commit only
        puts a superset of keys into its next delta.
        """
        start = time.perf_counter()
        mode = api.SaveMode(mode)
        save_id = uuid.uuid4().hex
        req = ps_pb2.SaveRequest(
            uri=uri, mode=int(mode), table=table or "", stage=True, save_id=save_id
        )
        everyone = range(self.num_servers)
        try:
            responses = self._call_all(
                "Save", [(i, req) for i in everyone], control=True, settle=True
            )
            results = [save_result(uri, mode, r) for r in responses]
            checkpoint.publish(
                uri, results, {**self._manifest_meta(mode), **(meta or {})}, config=self._config
            )
        except BaseException:
            self._finish_save(uri, save_id, commit=False)
            raise
        self._finish_save(uri, save_id, commit=True)
        return api.SaveResult.combined(uri, mode, results, time.perf_counter() - start)

    def snapshot(self, mode: api.SaveMode, snapshot_id: str) -> None:
        """Every server takes a snapshot save now (``Shard.snapshot_save``): its parts in
        memory, its side effects applied. A retried call (same id) applies nothing twice."""
        req = ps_pb2.SaveRequest(mode=int(api.SaveMode(mode)), snapshot=True, save_id=snapshot_id)
        everyone = range(self.num_servers)
        self._call_all("Save", [(i, req) for i in everyone], control=True, settle=True)

    def save_snapshot(
        self,
        uri: str,
        mode: api.SaveMode,
        snapshot_id: str,
        meta: Mapping[str, Any] | None = None,
    ) -> api.SaveResult:
        """Every server writes its parts of the snapshot, then the manifest is published;
        the snapshot is freed after (a failure keeps it, so the call can be retried)."""
        start = time.perf_counter()
        mode = api.SaveMode(mode)
        req = ps_pb2.SaveRequest(uri=uri, mode=int(mode), from_snapshot=snapshot_id)
        everyone = range(self.num_servers)
        responses = self._call_all("Save", [(i, req) for i in everyone], control=True, settle=True)
        results = [save_result(uri, mode, r) for r in responses]
        checkpoint.publish(
            uri, results, {**self._manifest_meta(mode), **(meta or {})}, config=self._config
        )
        self._finish_save(uri, snapshot_id, commit=False)
        return api.SaveResult.combined(uri, mode, results, time.perf_counter() - start)

    def _finish_save(self, uri: str, save_id: str, commit: bool) -> None:
        """Commit or abort a staged save on every server; failures are logged (see
        ``save``: neither a lost commit nor a lost abort can make a published save wrong)."""
        req = ps_pb2.FinishSaveRequest(uri=uri, save_id=save_id, commit=commit)
        try:
            self._call_all("FinishSave", [(i, req) for i in range(self.num_servers)])
        except PSError as exc:
            what = "commit" if commit else "abort"
            log.warning("%s of staged save %s of %s failed: %s", what, save_id, uri, exc)

    def load(self, uri: str, discard_live: bool = False) -> int:
        """Load a published save on every server, all or nothing across servers: every
        server first reads and verifies its parts into memory (PREPARE); only if all
        succeeded do they swap in (COMMIT), otherwise all drop them (ABORT) and the
        ``CheckpointError`` (or ``PSUnavailableError``) is raised with every server still
        serving its previous state.

        ``discard_live``: PREPARE only verifies every part (nothing is built), so a bad save
        is refused on every server before any drops anything; COMMIT then releases each
        server's live tables and builds the save in their place (~1x the table's memory
        instead of 2x). A COMMIT that fails leaves that server empty: the error says so,
        and the caller loads again."""
        everyone = range(self.num_servers)
        load_id = uuid.uuid4().hex

        def phase(p: ps_pb2.LoadPhase) -> list[Any]:  # settled: an abort follows every prepare
            req = ps_pb2.LoadRequest(uri=uri, phase=p, load_id=load_id, discard_live=discard_live)
            return self._call_all("Load", [(i, req) for i in everyone], control=True, settle=True)

        try:
            prepared = phase(ps_pb2.LOAD_PREPARE)
        except BaseException:
            try:
                phase(ps_pb2.LOAD_ABORT)
            except PSError as exc:  # a newer prepare or a restart drops it anyway
                log.warning("abort of prepared load %s failed: %s", uri, exc)
            raise
        phase(ps_pb2.LOAD_COMMIT)
        return sum(int(r.keys_loaded) for r in prepared)

    def shrink(self, table: str | None = None) -> api.ShrinkResult:
        req = ps_pb2.ShrinkRequest(table=table or "")
        rs = self._call_all("Shrink", [(i, req) for i in range(self.num_servers)], control=True)
        return api.ShrinkResult(
            keys_before=sum(r.keys_before for r in rs),
            deleted=sum(r.deleted for r in rs),
            keys_after=sum(r.keys_after for r in rs),
        )

    def stats(self) -> api.PSStats:
        """Tables summed over servers; dense names of every server."""
        req = ps_pb2.StatsRequest()
        responses = self._call_all("Stats", [(i, req) for i in range(self.num_servers)])
        totals: dict[str, list[int]] = {}
        dense: set[str] = set()
        for r in responses:
            for t in r.tables:
                acc = totals.setdefault(t.name, [0, 0, 0])
                acc[0] += t.keys
                acc[1] += t.expanded_keys
                acc[2] += t.memory_bytes
            dense.update(r.dense_names)
        return api.PSStats(
            tables=tuple(api.TableStats(name, *acc) for name, acc in totals.items()),
            dense_names=tuple(sorted(dense)),
        )

    # -- plumbing -------------------------------------------------------------------------

    @contextmanager
    def _request_ids(self, n: int) -> Iterator[list[ps_pb2.RequestId]]:
        """``n`` fresh request ids, in flight until the block exits; ``acked_below`` tells
        the server which older ids it may forget (none of them will be sent again)."""
        with self._ids_lock:
            seqs = [next(self._seq) for _ in range(n)]
            self._inflight.update(seqs)
            floor = min(self._inflight, default=0)
        try:
            yield [
                ps_pb2.RequestId(client_id=self._client_id, seq=s, acked_below=floor) for s in seqs
            ]
        finally:
            with self._ids_lock:
                self._inflight.difference_update(seqs)

    def _table(self, name: str) -> TableConfig:
        try:
            return self._config.table(name)
        except KeyError:
            raise UnknownTableError("table", name) from None

    def _dense_server(self, name: str) -> int:
        return sharding.server_of_dense(name, self.num_servers)

    def _manifest_meta(self, mode: api.SaveMode) -> dict[str, Any]:
        return {
            "mode": int(mode),
            "logicalShards": self._config.logicalShards,
            "numServers": self.num_servers,
            "tables": [t.name for t in self._config.tables],
        }

    def _route(
        self, keys: npt.NDArray[np.uint64]
    ) -> list[tuple[int, npt.NDArray[np.intp] | slice]]:
        """(server, positions of its keys) for every server that owns some of ``keys``."""
        if self.num_servers == 1:
            return [(0, slice(0, keys.size))] if keys.size else []
        servers = sharding.server_of_key(keys, self._config.logicalShards, self.num_servers)
        order = np.argsort(servers, kind="stable")
        bounds = np.searchsorted(servers[order], np.arange(self.num_servers + 1))
        return [
            (s, order[bounds[s] : bounds[s + 1]])
            for s in range(self.num_servers)
            if bounds[s + 1] > bounds[s]
        ]

    def _chunks(
        self, idx: npt.NDArray[np.intp] | slice, per_key_bytes: int
    ) -> list[npt.NDArray[np.intp] | slice]:
        """Split one server's positions into requests within the key and message limits."""
        by_bytes = max(1, (self._config.maxMessageBytes - _MESSAGE_OVERHEAD) // per_key_bytes)
        size = min(self._request_keys, by_bytes)
        if isinstance(idx, slice):
            start, stop = idx.start or 0, idx.stop
            return [slice(i, min(i + size, stop)) for i in range(start, stop, size)]
        return [idx[i : i + size] for i in range(0, idx.size, size)]


def save_result(uri: str, mode: api.SaveMode, resp: ps_pb2.SaveResponse) -> api.SaveResult:
    """Proto -> ``SaveResult`` (``servicer.save_response`` is the inverse)."""
    return api.SaveResult(
        uri=uri,
        mode=mode,
        files=tuple(api.SavedFile(f.path, f.size, f.sha256, f.rows) for f in resp.files),
        keys_saved=resp.keys_saved,
        tombstones=resp.tombstones,
        seconds=resp.seconds,
    )
