"""The gRPC servicer: decode with ``wire``, call the ``Shard``, encode — nothing else.

This module is the one place that maps PS errors to gRPC status codes:

=============================  =====================  ===============================
exception                      status                 trailing metadata
=============================  =====================  ===============================
``InvalidRequestError``        ``INVALID_ARGUMENT``   ``streamtrain-field-bin``
``UnknownTableError``          ``NOT_FOUND``          ``streamtrain-{kind,name}-bin``
``MemoryLimitError`` (request)  ``RESOURCE_EXHAUSTED``  ``streamtrain-reason: memory-limit``
                                                      and ``streamtrain-ws-*`` (numbers)
``RequestTooLargeError``       ``RESOURCE_EXHAUSTED``
``CheckpointError``            ``FAILED_PRECONDITION``
any other ``PSError``          ``INTERNAL``
anything unexpected            ``INTERNAL``           (traceback logged, server stays up)
=============================  =====================  ===============================

The details string is ``str(exc)``, so the message a remote caller sees is the message a
local caller would have seen; the metadata lets ``streamtrain_ps.client.remote`` rebuild the same
exception class with the same fields. Every RPC's latency and non-OK code is recorded in
``PSMetrics``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from typing import NoReturn, Protocol, TypeVar

import grpc
import numpy as np
import numpy.typing as npt

from streamtrain_ps import api
from streamtrain_ps.config import PSConfig, TableConfig
from streamtrain_ps.errors import (
    CheckpointError,
    InvalidRequestError,
    MemoryLimitError,
    RequestTooLargeError,
    UnknownTableError,
)
from streamtrain_ps.plumbing.tls import describe_peer
from streamtrain_ps.proto import ps_pb2, ps_pb2_grpc
from streamtrain_ps.service import metrics, wire
from streamtrain_ps.service.idempotency import RecentRequests
from streamtrain_ps.service.metrics import PSMetrics
from streamtrain_ps.service.storage_policy import check_uri

log = logging.getLogger(__name__)

R = TypeVar("R")

# Binary ("-bin") metadata: names are arbitrary UTF-8, and ASCII-only header values would
# turn an odd table name into a transport error.
FIELD_KEY = "streamtrain-field-bin"
KIND_KEY = "streamtrain-kind-bin"
NAME_KEY = "streamtrain-name-bin"


#: Methods only the operator's identity may call over mutual TLS (``tls.PeerPolicy``).
CONTROL_METHODS = frozenset({"Save", "FinishSave", "Load", "Shrink"})


class ShardStatsLike(metrics.ShardStatsLike, Protocol):
    """What ``Stats`` and the metrics collector read of ``Shard.stats()``."""

    @property
    def dense_names(self) -> Sequence[str]: ...
    @property
    def shard_index(self) -> int: ...
    @property
    def num_shards(self) -> int: ...


class ShardLike(Protocol):
    """What the servicer needs of ``streamtrain_ps.shard.Shard``."""

    def pull_sparse(self, table: str, keys: npt.NDArray[np.uint64]) -> npt.NDArray[np.float32]: ...

    def request_slot(self, keys: int) -> AbstractContextManager[None]: ...

    def push_sparse(self, table: str, push: api.SparsePush) -> int: ...

    def init_dense(
        self, name: str, values: npt.NDArray[np.float32], summary_decay: float | None = None
    ) -> tuple[npt.NDArray[np.float32], int]: ...

    def pull_dense(
        self, name: str, snapshot_id: str = ""
    ) -> tuple[npt.NDArray[np.float32], int]: ...

    def push_dense(self, name: str, grads: npt.NDArray[np.float32]) -> int: ...

    def save(self, uri: str, mode: api.SaveMode, table: str | None = None) -> api.SaveResult: ...

    def stage_save(
        self,
        uri: str,
        mode: api.SaveMode,
        table: str | None = None,
        save_id: str | None = None,
    ) -> tuple[api.SaveResult, str]: ...

    def finish_save(self, save_id: str, commit: bool) -> bool: ...

    def snapshot_save(
        self, mode: api.SaveMode | int, snapshot_id: str, table: str | None = None
    ) -> api.SaveResult: ...

    def write_snapshot(self, uri: str, snapshot_id: str) -> api.SaveResult: ...

    def drop_snapshot(self, snapshot_id: str) -> None: ...

    def load(self, uri: str, discard_live: bool = False) -> int: ...

    def prepare_load(
        self, uri: str, load_id: str | None = None, discard_live: bool = False
    ) -> int: ...

    def finish_load(self, uri: str, commit: bool, load_id: str | None = None) -> int: ...

    def shrink(self, table: str | None = None) -> api.ShrinkResult: ...

    def stats(self) -> ShardStatsLike: ...


Metadata = tuple[tuple[str, str | bytes], ...]


def status_of(exc: BaseException) -> tuple[grpc.StatusCode, Metadata]:
    """The status code and trailing metadata for an exception raised while serving."""
    if isinstance(exc, InvalidRequestError):
        return grpc.StatusCode.INVALID_ARGUMENT, ((FIELD_KEY, _utf8(exc.field)),)
    if isinstance(exc, UnknownTableError):
        return grpc.StatusCode.NOT_FOUND, (
            (KIND_KEY, _utf8(exc.kind)),
            (NAME_KEY, _utf8(exc.name)),
        )
    if isinstance(exc, MemoryLimitError) and exc.working_set is not None:
        return grpc.StatusCode.RESOURCE_EXHAUSTED, exc.working_set.metadata()
    if isinstance(exc, RequestTooLargeError):
        return grpc.StatusCode.RESOURCE_EXHAUSTED, ()
    if isinstance(exc, CheckpointError):
        return grpc.StatusCode.FAILED_PRECONDITION, ()
    return grpc.StatusCode.INTERNAL, ()


class PSServicer(ps_pb2_grpc.ParameterServerServicer):
    """Thin adapter from ``ps.proto`` to one ``Shard``; thread-safe because the shard is."""

    def __init__(
        self,
        shard: ShardLike,
        config: PSConfig,
        metrics: PSMetrics,
        recent: RecentRequests | None = None,
    ) -> None:
        self._shard = shard
        self._config = config
        self._metrics = metrics
        #: Applied push ids, so a retried push whose answer was lost is not applied twice.
        self.recent = recent if recent is not None else RecentRequests()

    def _once(self, method: str, rid: ps_pb2.RequestId, apply: Callable[[], R]) -> tuple[R, bool]:
        """Run a push at most once per request id (no id: always)."""
        if not rid.client_id:
            return apply(), False
        result, duplicate = self.recent.run(rid.client_id, rid.seq, rid.acked_below, apply)
        if duplicate:
            self._metrics.observe_duplicate(method)
        return result, duplicate

    # -- sparse ---------------------------------------------------------------------------

    def PullSparse(  # noqa: N802 - named by ps.proto
        self, request: ps_pb2.PullSparseRequest, context: grpc.ServicerContext
    ) -> ps_pb2.PullSparseResponse:
        def run() -> ps_pb2.PullSparseResponse:
            table = self._table(request.table)
            with self._shard.request_slot(len(request.keys) // wire.KEY_DTYPE.itemsize):
                keys = wire.decode_keys(request.keys, max_keys=self._config.maxKeysPerRequest)
                values = self._shard.pull_sparse(table.name, keys)
                data, dim = wire.encode_matrix(values)
                del values
                return ps_pb2.PullSparseResponse(values=data, dim=dim)

        return self._serve("PullSparse", context, run)

    def PushSparse(  # noqa: N802 - named by ps.proto
        self, request: ps_pb2.PushSparseRequest, context: grpc.ServicerContext
    ) -> ps_pb2.PushSparseResponse:
        def run() -> ps_pb2.PushSparseResponse:
            table = self._table(request.table)
            push = wire.decode_push(
                request.keys,
                request.grads,
                request.dim,
                request.shows,
                request.clicks,
                slots=request.slots,
                push_dim=table.push_dim,
                max_keys=self._config.maxKeysPerRequest,
            )
            dense = [
                (_dense_name(d.name), wire.decode_floats(d.grads, "dense.grads"))
                for d in request.dense
            ]

            def apply() -> int:
                # Dense first: an unknown vector (a restarted, empty PS) fails with nothing
                # applied; the rows' own checks only fail for a broken client.
                for name, grads in dense:
                    self._shard.push_dense(name, grads)
                if push.keys.size == 0:
                    return 0
                return self._shard.push_sparse(table.name, push)

            with self._shard.request_slot(push.size):
                updated, duplicate = self._once("PushSparse", request.id, apply)
            return ps_pb2.PushSparseResponse(keys_updated=updated, duplicate=duplicate)

        return self._serve("PushSparse", context, run)

    # -- dense ----------------------------------------------------------------------------

    def InitDense(  # noqa: N802 - named by ps.proto
        self, request: ps_pb2.InitDenseRequest, context: grpc.ServicerContext
    ) -> ps_pb2.DenseValues:
        def run() -> ps_pb2.DenseValues:
            name = _dense_name(request.name)
            values = wire.decode_floats(request.values, "values")
            if values.size == 0:
                raise InvalidRequestError("values", "must not be empty")
            decay = request.summary.decay if request.HasField("summary") else None
            current, version = self._shard.init_dense(name, values, decay)
            return ps_pb2.DenseValues(
                name=name, values=wire.encode_floats(current), version=version
            )

        return self._serve("InitDense", context, run)

    def PullDense(  # noqa: N802 - named by ps.proto
        self, request: ps_pb2.PullDenseRequest, context: grpc.ServicerContext
    ) -> ps_pb2.DenseValues:
        def run() -> ps_pb2.DenseValues:
            name = _dense_name(request.name)
            values, version = self._shard.pull_dense(name, request.snapshot_id)
            return ps_pb2.DenseValues(name=name, values=wire.encode_floats(values), version=version)

        return self._serve("PullDense", context, run)

    def PushDense(  # noqa: N802 - named by ps.proto
        self, request: ps_pb2.PushDenseRequest, context: grpc.ServicerContext
    ) -> ps_pb2.PushDenseResponse:
        def run() -> ps_pb2.PushDenseResponse:
            name = _dense_name(request.name)
            grads = wire.decode_floats(request.grads, "grads")
            version, duplicate = self._once(
                "PushDense", request.id, lambda: self._shard.push_dense(name, grads)
            )
            return ps_pb2.PushDenseResponse(version=version, duplicate=duplicate)

        return self._serve("PushDense", context, run)

    # -- control plane --------------------------------------------------------------------

    def Save(  # noqa: N802 - named by ps.proto
        self, request: ps_pb2.SaveRequest, context: grpc.ServicerContext
    ) -> ps_pb2.SaveResponse:
        def run() -> ps_pb2.SaveResponse:
            uri = "" if request.snapshot else self._uri(request.uri)
            _audit("Save", uri or f"snapshot {request.save_id}", context)
            try:
                mode = api.SaveMode(request.mode)
            except ValueError:
                raise InvalidRequestError(
                    "mode",
                    f"must be 0 (checkpoint), 1 (delta), 2 (base) or 3 (batch), got {request.mode}",
                ) from None
            table = self._table(request.table).name if request.table else None
            save_id = ""
            if request.snapshot:
                result = self._shard.snapshot_save(mode, request.save_id, table)
                save_id = request.save_id
            elif request.from_snapshot:
                result = self._shard.write_snapshot(uri, request.from_snapshot)
                if result.mode != mode:
                    raise InvalidRequestError(
                        "mode", f"snapshot {request.from_snapshot} is mode {int(result.mode)}"
                    )
            elif request.stage:
                result, save_id = self._shard.stage_save(uri, mode, table, request.save_id or None)
            else:
                result = self._shard.save(uri, mode, table)
            self._metrics.observe_save(mode.name.lower(), result.seconds)
            response = save_response(result)
            response.save_id = save_id
            return response

        return self._serve("Save", context, run)

    def FinishSave(  # noqa: N802 - named by ps.proto
        self, request: ps_pb2.FinishSaveRequest, context: grpc.ServicerContext
    ) -> ps_pb2.FinishSaveResponse:
        def run() -> ps_pb2.FinishSaveResponse:
            _audit("FinishSave", self._uri(request.uri), context)
            if not request.save_id:
                raise InvalidRequestError("save_id", "must name a staged save")
            if not request.commit:  # also frees a snapshot of that id (published or not)
                self._shard.drop_snapshot(request.save_id)
            applied = self._shard.finish_save(request.save_id, request.commit)
            return ps_pb2.FinishSaveResponse(applied=applied)

        return self._serve("FinishSave", context, run)

    def Load(  # noqa: N802 - named by ps.proto
        self, request: ps_pb2.LoadRequest, context: grpc.ServicerContext
    ) -> ps_pb2.LoadResponse:
        def run() -> ps_pb2.LoadResponse:
            uri = self._uri(request.uri)
            _audit("Load", uri, context)
            start = time.perf_counter()
            phase = request.phase
            discard = request.discard_live
            if phase == ps_pb2.LOAD_ONE_SHOT:
                keys = self._shard.load(uri, discard_live=discard)
            elif phase == ps_pb2.LOAD_PREPARE:
                keys = self._shard.prepare_load(uri, request.load_id or None, discard_live=discard)
            elif phase in (ps_pb2.LOAD_COMMIT, ps_pb2.LOAD_ABORT):
                commit = phase == ps_pb2.LOAD_COMMIT
                keys = self._shard.finish_load(uri, commit, request.load_id or None)
            else:
                raise InvalidRequestError("phase", f"unknown load phase {phase}")
            seconds = time.perf_counter() - start
            if phase != ps_pb2.LOAD_ABORT:
                self._metrics.observe_load(seconds)
            return ps_pb2.LoadResponse(keys_loaded=keys, seconds=seconds)

        return self._serve("Load", context, run)

    def Shrink(  # noqa: N802 - named by ps.proto
        self, request: ps_pb2.ShrinkRequest, context: grpc.ServicerContext
    ) -> ps_pb2.ShrinkResponse:
        def run() -> ps_pb2.ShrinkResponse:
            table = self._table(request.table).name if request.table else None
            _audit("Shrink", table or "all tables", context)
            r = self._shard.shrink(table)
            return ps_pb2.ShrinkResponse(
                keys_before=r.keys_before, deleted=r.deleted, keys_after=r.keys_after
            )

        return self._serve("Shrink", context, run)

    def Stats(  # noqa: N802 - named by ps.proto
        self, request: ps_pb2.StatsRequest, context: grpc.ServicerContext
    ) -> ps_pb2.StatsResponse:
        def run() -> ps_pb2.StatsResponse:
            s = self._shard.stats()
            return ps_pb2.StatsResponse(
                tables=[
                    ps_pb2.TableStats(
                        name=t.name,
                        keys=t.keys,
                        expanded_keys=t.expanded_keys,
                        memory_bytes=t.memory_bytes,
                    )
                    for t in s.tables
                ],
                shard_index=s.shard_index,
                num_shards=s.num_shards,
                dense_names=list(s.dense_names),
            )

        return self._serve("Stats", context, run)

    # -- plumbing -------------------------------------------------------------------------

    def _table(self, name: str) -> TableConfig:
        if not name:
            raise InvalidRequestError("table", "must name a sparse table")
        try:
            return self._config.table(name)
        except KeyError:
            raise UnknownTableError("table", name) from None

    def _uri(self, uri: str) -> str:
        """A Save/Load URI the job's allow-list admits (``storage_policy``)."""
        return check_uri(uri, self._config.storageRoots, self._config.storageSchemes)

    def _serve(self, method: str, context: grpc.ServicerContext, run: Callable[[], R]) -> R:
        """Run one RPC body, recording its latency, and turn any exception into a status."""
        start = time.perf_counter()
        try:
            result = run()
        except Exception as exc:  # the one catch-all: map, log if unexpected, never crash
            code, metadata = status_of(exc)
            if code is grpc.StatusCode.INTERNAL:
                log.exception("%s failed unexpectedly", method)
                details = f"{method}: internal error: {type(exc).__name__}: {exc}"
            else:
                details = str(exc)
            self._metrics.observe_rpc(method, code.name, time.perf_counter() - start)
            _abort(context, code, details, metadata)
        self._metrics.observe_rpc(method, "OK", time.perf_counter() - start)
        return result


def _audit(method: str, what: str, context: grpc.ServicerContext) -> None:
    """One INFO line per control call: what, and who asked (address and certificate)."""
    log.info("%s %s requested by %s", method, what, describe_peer(context))


def _abort(
    context: grpc.ServicerContext,
    code: grpc.StatusCode,
    details: str,
    metadata: Metadata,
) -> NoReturn:
    if metadata:
        context.set_trailing_metadata(metadata)
    context.abort(code, details)
    raise AssertionError("ServicerContext.abort returned")  # pragma: no cover - grpc raises


def _utf8(text: str) -> bytes:
    return text.encode("utf-8", "surrogatepass")


def _dense_name(name: str) -> str:
    if not name:
        raise InvalidRequestError("name", "must name a dense vector")
    return name


def save_response(result: api.SaveResult) -> ps_pb2.SaveResponse:
    """``SaveResult`` -> proto (``remote.save_result`` is the inverse)."""
    return ps_pb2.SaveResponse(
        files=[
            ps_pb2.FileEntry(path=f.path, size=f.size, sha256=f.sha256, rows=f.rows)
            for f in result.files
        ],
        keys_saved=result.keys_saved,
        tombstones=result.tombstones,
        seconds=result.seconds,
    )
