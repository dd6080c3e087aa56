"""The worker control service the pass scheduler calls: RunPass, ExportDense, Reset, Health.

``WorkerServicer`` is thin: it turns a request into a ``PassReader`` + ``Trainer.run_pass``
call (or an export) and maps failures to gRPC status codes in one place (``_status``):

- a second concurrent RunPass/ExportDense/Reset -> ``FAILED_PRECONDITION``, reason ``BUSY``
  (one at a time: a worker trains one pass; overlapping passes would double-count and race
  the model) — except an ExportDense of a PS snapshot, which fills a copy of the network
  and runs beside a pass;
- a request from an older generation than one already seen -> ``FAILED_PRECONDITION``,
  reason ``STALE_GENERATION``;
- a pass cancelled by a ``Reset`` of a newer generation -> ``ABORTED``, reason ``CANCELLED``;
- PS unreachable after the client's retries (``PSUnavailableError``) -> ``UNAVAILABLE``;
- a PS shard's ``memoryLimit`` too small for a push of the pass (``MemoryLimitError`` with
  its ``WorkingSet``) -> ``RESOURCE_EXHAUSTED``, reason ``MEMORY_LIMIT``, the PS's numbers
  forwarded as they came (the driver ends the job with a condition naming them);
- a data error — a file over the bad-line limit, a corrupt file — -> ``DATA_LOSS``, reason
  ``BAD_DATA`` (the scheduler treats it as permanent: the job fails, no retry); a missing
  file -> ``NOT_FOUND``, reason ``FILE_GONE`` (the scheduler's ``DataChanged``); a listed
  path that is a directory or unreadable -> ``FAILED_PRECONDITION``; anything else ->
  ``INTERNAL``. Every status carries a message naming the cause (file, endpoint, field), for
  people; callers branch on the ``refusals.Reason`` in the trailing metadata, never on the
  message.

``Reset(generation)`` is how a new scheduler generation takes over (after an operator or PS
restart the old one's ``RunPass`` may still be running here, pushing into a model that is
about to be reloaded): a running pass of an older generation is cancelled at its next batch
boundary — its queued pushes are flushed first — and the reset waits for it to end, so when
``Reset`` returns nothing of the old generation can push any more, and later requests of
that generation are refused as stale.

A RunPass may name this worker's files of the next pass (``next_files``): they are read and
parsed from the pass's last batch on (beside its end and the transition), and the next
RunPass uses that reader if it names the same files, unchanged since
(``training/read_ahead.py``); a ``Reset`` drops it.

The trainer (and with it ``init_dense`` on the PS) is built lazily on the first call, so a
worker that starts before its PS comes up still starts, serves health, and trains once the
PS answers. ``WorkerServer`` wires the servicer into the serving skeleton it shares with the PS
(``streamtrain_ps.plumbing.grpc_serving``: health service, message limits, and
``stop(grace)`` flipping health to NOT_SERVING first for a graceful SIGTERM).
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, NoReturn

import grpc

from streamtrain_ps.api import PSLike
from streamtrain_ps.errors import (
    InvalidRequestError,
    MemoryLimitError,
    PSError,
    PSUnavailableError,
)
from streamtrain_ps.plumbing.grpc_serving import GrpcServer
from streamtrain_ps.plumbing.tls import PeerPolicy, TLSFiles, authorising_interceptor, describe_peer
from streamtrain_ps.service.storage_policy import check_uri
from streamtrain_worker.config import WorkerConfig
from streamtrain_worker.control.refusals import Reason, trailing_metadata
from streamtrain_worker.data.batch import Batch
from streamtrain_worker.data.errors import DataError
from streamtrain_worker.data.formats import make_format
from streamtrain_worker.data.reader import PassReader
from streamtrain_worker.metrics import format_metric
from streamtrain_worker.monitoring import WorkerMetrics
from streamtrain_worker.proto import worker_pb2, worker_pb2_grpc
from streamtrain_worker.proto.share import PassShare
from streamtrain_worker.publishing.export import export_dense
from streamtrain_worker.training.read_ahead import Outcome, ReadAhead
from streamtrain_worker.training.train import PassCancelledError, Trainer

log = logging.getLogger(__name__)

SERVICE_NAME: str = worker_pb2.DESCRIPTOR.services_by_name["Worker"].full_name
#: Every method of the worker is the scheduler's: over mutual TLS only the operator's
#: identity may call them (``streamtrain_ps.plumbing.tls.PeerPolicy``).
CONTROL_METHODS = frozenset(worker_pb2.DESCRIPTOR.services_by_name["Worker"].methods_by_name)
#: PassResults carry two histograms of ``numBuckets`` uint64s; leave room for large ones.
MAX_MESSAGE_BYTES = 64 * 1024 * 1024


class StaleGenerationError(ValueError):
    """A request of an older scheduler generation than one this worker already served."""


def _reason(exc: BaseException) -> Reason | None:
    """The refusal a caller may act on, sent beside the status code."""
    if isinstance(exc, PassCancelledError):
        return Reason.CANCELLED
    if isinstance(exc, StaleGenerationError):
        return Reason.STALE_GENERATION
    if isinstance(exc, DataError):  # BadDataError, CorruptFileError
        return Reason.BAD_DATA
    if isinstance(exc, FileNotFoundError | NotADirectoryError):
        return Reason.FILE_GONE
    return None


def _extra(exc: BaseException) -> tuple[tuple[str, str], ...]:
    """Trailing metadata forwarded from the PS (a memory-limit refusal's numbers)."""
    if isinstance(exc, MemoryLimitError) and exc.working_set is not None:
        return exc.working_set.metadata()
    return ()


def _status(exc: BaseException) -> grpc.StatusCode:
    """The one mapping from worker-side failures to gRPC status codes."""
    if isinstance(exc, PSUnavailableError):
        return grpc.StatusCode.UNAVAILABLE
    if isinstance(exc, MemoryLimitError) and exc.working_set is not None:
        return grpc.StatusCode.RESOURCE_EXHAUSTED
    if isinstance(exc, PassCancelledError):
        return grpc.StatusCode.ABORTED
    if isinstance(exc, DataError):  # BadDataError, CorruptFileError
        return grpc.StatusCode.DATA_LOSS
    if isinstance(exc, FileNotFoundError | NotADirectoryError):
        return grpc.StatusCode.NOT_FOUND
    if isinstance(exc, IsADirectoryError | PermissionError):  # a path the request named
        return grpc.StatusCode.FAILED_PRECONDITION
    if isinstance(exc, PSError | ValueError):
        return grpc.StatusCode.FAILED_PRECONDITION
    return grpc.StatusCode.INTERNAL


#: How long a Reset waits for a cancelled pass to reach its next batch boundary and flush.
CANCEL_WAIT_SECONDS = 60.0


class WorkerServicer(worker_pb2_grpc.WorkerServicer):
    """Runs one pass at a time for the scheduler."""

    def __init__(
        self,
        config: WorkerConfig,
        ps: PSLike,
        *,
        worker_index: int = 0,
        monitoring: WorkerMetrics | None = None,
        after_build: Callable[[], object] | None = None,
    ) -> None:
        self.config = config
        self.ps = ps
        self.worker_index = worker_index
        self.monitoring = monitoring
        #: Called once the trainer is built (``__main__``: start loading the parse kernels,
        #: so that it does not slow the build itself, which the scheduler waits for).
        self._after_build = after_build
        self._busy = threading.Lock()
        # Exports of a PS snapshot run beside a pass (not under ``_busy``), one at a time.
        self._snapshot_export = threading.Lock()
        self._trainer: Trainer | None = None
        self._generation = 0
        #: Generation of the RunPass in progress (None when none runs), and the flag a
        #: newer generation's Reset raises to stop it (both written under ``_busy``).
        self._running: int | None = None
        self._cancel = threading.Event()
        #: The next pass's reader, started from a RunPass's ``next_files``.
        self.read_ahead = ReadAhead(self._reader, on_outcome=self._count_read_ahead)

    def _reader(self, files: Sequence[str]) -> PassReader:
        return PassReader(list(files), self.config.data, self.config.model.batchSize)

    def _count_read_ahead(self, outcome: Outcome) -> None:
        if self.monitoring is not None:
            self.monitoring.read_ahead.labels(outcome=outcome.value).inc()

    @property
    def trainer(self) -> Trainer:
        """The trainer, built (and the dense table initialised) on first use."""
        if self._trainer is None:
            self._trainer = Trainer(
                self.config,
                self.ps,
                # The format, not the config: a libsvm field map names its slots.
                num_slots=make_format(self.config.data).num_slots,
                sequence_slot=self.config.data.sequenceSlot,
                monitoring=self.monitoring,
            )
            if self._after_build is not None:
                self._after_build()
        return self._trainer

    @contextmanager
    def _exclusive(self, what: str, context: grpc.ServicerContext) -> Iterator[None]:
        if not self._busy.acquire(blocking=False):
            _abort(
                context,
                grpc.StatusCode.FAILED_PRECONDITION,
                f"{what}: worker is busy with another call",
                Reason.BUSY,
            )
        try:
            yield
        finally:
            self._busy.release()

    def _guarded(
        self,
        what: str,
        context: grpc.ServicerContext,
        fn: Callable[[], Any],
        exclusive: bool = True,
    ) -> Any:
        """Run ``fn`` (alone on this worker unless ``exclusive`` is false); an error aborts
        the call with the status it maps to."""
        with self._exclusive(what, context) if exclusive else contextlib.nullcontext():
            try:
                return fn()
            except Exception as exc:
                code = _status(exc)
                log.exception("worker %d: %s failed", self.worker_index, what)
                _abort(
                    context, code, f"{what}: {type(exc).__name__}: {exc}", _reason(exc), _extra(exc)
                )

    def RunPass(  # noqa: N802 - gRPC method name
        self, request: Any, context: grpc.ServicerContext
    ) -> Any:
        share = PassShare.from_request(request)
        what = f"RunPass(day={share.day}, pass={share.pass_index}, gen={share.generation})"
        log.info("%s requested by %s", what, describe_peer(context))

        def run() -> Any:
            if share.generation < self._generation:
                raise StaleGenerationError(
                    f"stale generation {share.generation}: already at {self._generation}"
                )
            self._generation = share.generation
            self._cancel.clear()
            self._running = share.generation
            ahead = self.read_ahead.take(share.files)
            reader = ahead or self._reader(share.files)
            batches: Iterable[Batch] = reader
            if share.next_files:
                next_files = list(share.next_files)
                batches = _then(reader, lambda: self.read_ahead.begin(next_files))
            try:
                with reader:
                    metrics = self.trainer.run_pass(
                        batches, train=share.train, should_stop=self._cancel.is_set
                    )
                    stats = reader.stats
            finally:
                self._running = None
            metrics.bad_lines = stats.bad_lines
            metrics.files_read = stats.files
            metrics.files_read_ahead = stats.files if ahead is not None else 0
            if self.monitoring is not None:
                self.monitoring.bad_lines.inc(stats.bad_lines)
            log.info(
                "worker %d: %s: %d examples, auc %s, loss %s in %.1fs",
                self.worker_index,
                what,
                metrics.examples,
                format_metric(metrics.auc),
                format_metric(metrics.loss),
                metrics.seconds,
            )
            return metrics.to_proto(share.day, share.pass_index, share.generation)

        return self._guarded(what, context, run)

    def ExportDense(  # noqa: N802 - gRPC method name
        self, request: Any, context: grpc.ServicerContext
    ) -> Any:
        log.info("ExportDense %s requested by %s", request.uri, describe_peer(context))
        ps = self.config.ps.config
        try:  # the job's export and checkpoint roots, as on the PS (storage_policy)
            check_uri(request.uri, ps.storageRoots, ps.storageSchemes)
        except InvalidRequestError as exc:
            _abort(context, grpc.StatusCode.INVALID_ARGUMENT, str(exc))

        def run() -> Any:
            trainer = self.trainer
            trainer.sync_dense()  # export what the PS holds, not a stale local copy
            files = export_dense(trainer.model, self.config.model.type, request.uri)
            return worker_pb2.ExportDenseResponse(files=files)

        def run_snapshot() -> Any:
            # The model of the moment the PS snapshot was taken, in a copy of the network:
            # the pass training beside it keeps the trainer's.
            with self._snapshot_export:
                model = self.trainer.snapshot_model(request.snapshot_id)
                files = export_dense(model, self.config.model.type, request.uri)
            return worker_pb2.ExportDenseResponse(files=files)

        if request.snapshot_id:
            what = f"ExportDense({request.uri}, snapshot {request.snapshot_id})"
            return self._guarded(what, context, run_snapshot, exclusive=False)
        return self._guarded(f"ExportDense({request.uri})", context, run)

    def Reset(  # noqa: N802 - gRPC method name
        self, request: Any, context: grpc.ServicerContext
    ) -> Any:
        newer = int(request.generation)
        log.info("Reset(gen=%d) requested by %s", newer, describe_peer(context))
        running = self._running
        if newer and running is not None and running < newer:
            log.warning(
                "worker %d: generation %d cancels the pass of generation %d",
                self.worker_index,
                newer,
                running,
            )
            self._cancel.set()
            # The pass stops at its next batch boundary; wait for it (and its flush) here so
            # that nothing of the old generation pushes once Reset has answered.
            if self._busy.acquire(timeout=CANCEL_WAIT_SECONDS):
                self._busy.release()

        def run() -> Any:
            self._generation = max(self._generation, newer)
            self.read_ahead.drop()  # a restore follows: the hinted pass is not the next one
            self.trainer.sync_dense()
            return worker_pb2.ResetResponse()

        return self._guarded(f"Reset(gen={newer})", context, run)

    def close(self) -> None:
        self.read_ahead.drop()
        if self._trainer is not None:
            self._trainer.close()


def _then(batches: Iterable[Batch], start: Callable[[], None]) -> Iterator[Batch]:
    """``batches``, calling ``start`` once the last is out of the reader: the next pass's
    read ahead then parses beside this pass's last batches, its final flush and the pass
    transition — where the worker's CPU is least used — not beside its busy steady state."""
    yield from batches
    start()


def _abort(
    context: grpc.ServicerContext,
    code: grpc.StatusCode,
    message: str,
    reason: Reason | None = None,
    extra: tuple[tuple[str, str], ...] = (),
) -> NoReturn:
    """Abort with ``reason`` (if any) and ``extra`` metadata (which may carry its own)."""
    if extra:
        context.set_trailing_metadata(extra)
    elif reason is not None:
        context.set_trailing_metadata(trailing_metadata(reason))
    context.abort(code, message)
    raise AssertionError("context.abort returned")  # grpc raises; this line is unreachable


class WorkerServer(GrpcServer):
    """The control service and health on a ``grpc.server``; ``start()`` returns the port.

    Binding, health, message limits and the graceful stop (NOT_SERVING first, then let an
    in-flight pass finish within ``grace``) are ``streamtrain_ps.plumbing.grpc_serving.GrpcServer``.
    """

    def __init__(
        self,
        servicer: WorkerServicer,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        max_workers: int = 4,
        tls: TLSFiles | None = None,
        peers: PeerPolicy | None = None,
        health_port: int | None = None,
    ) -> None:
        self.servicer = servicer
        super().__init__(
            credentials=tls.server_credentials() if tls is not None else None,
            interceptors=[authorising_interceptor(peers)] if peers is not None else [],
            health_port=health_port,
            max_inflight_bytes=2 * MAX_MESSAGE_BYTES,
            max_concurrent_rpcs=4 * max_workers,
            what="worker server",
            service_name=SERVICE_NAME,
            host=host,
            port=port,
            max_workers=max_workers,
            thread_name_prefix="worker-rpc",
            max_message_bytes=MAX_MESSAGE_BYTES,
        )
        worker_pb2_grpc.add_WorkerServicer_to_server(servicer, self._server)

    def close(self, grace: float | None = 5.0) -> None:
        super().close(grace)
        self.servicer.close()
