"""Why the worker control service refused or ended a call, as data a caller can branch on.

Every failed control RPC carries a gRPC status code (``control._status``) and a message
for people; no caller parses the message. Where a caller acts on why a call failed, the
worker also sends the trailing metadata ``streamtrain-reason`` with a ``Reason``, and the
caller branches on that (``streamtrain_operator.run.worker_errors``), not on the code's
name: the driver, taking over a job, asks a ``BUSY`` worker again and gives up on anything
else; bad data and a vanished file end the job. Torch-free, so the operator imports it
(import-linter).
"""

from __future__ import annotations

from enum import StrEnum

from streamtrain_ps import errors as ps_errors

#: Trailing-metadata key of a refused or ended call's ``Reason`` (the PS uses it too).
REASON_KEY = ps_errors.REASON_KEY


class Reason(StrEnum):
    """A refusal the caller may act on (the status code stays the coarse class)."""

    #: ``FAILED_PRECONDITION``: another RunPass/ExportDense/Reset runs (one at a time).
    BUSY = "busy"
    #: ``FAILED_PRECONDITION``: the request's generation is older than one already seen.
    STALE_GENERATION = "stale-generation"
    #: ``ABORTED``: a Reset of a newer generation cancelled the pass at a batch boundary.
    CANCELLED = "cancelled"
    #: ``RESOURCE_EXHAUSTED``: a PS shard refused a push of the pass because its
    #: ``memoryLimit`` cannot hold the request's working set; the PS's numbers
    #: (``streamtrain_ps.errors.WorkingSet``) are forwarded beside it. Retrying fails alike.
    MEMORY_LIMIT = ps_errors.MEMORY_LIMIT_REASON
    #: ``DATA_LOSS``: a file of the pass is over the bad-line limit or corrupt. Permanent:
    #: the same data fails alike.
    BAD_DATA = "bad-data"
    #: ``NOT_FOUND``: a file the request named is gone (the data changed after listing).
    FILE_GONE = "file-gone"


def trailing_metadata(reason: Reason) -> tuple[tuple[str, str], ...]:
    """What the worker sets on the call's context before aborting it."""
    return ((REASON_KEY, reason.value),)


def reason_of(exc: BaseException) -> Reason | None:
    """The ``Reason`` a failed call carries: ``None`` without one, or for no RPC error.

    Works for ``grpc.RpcError`` and ``grpc.aio.AioRpcError`` alike (both expose
    ``trailing_metadata()``); an unknown value (a newer worker) is ``None``.
    """
    trailing = getattr(exc, "trailing_metadata", None)
    if not callable(trailing):
        return None
    for key, value in trailing() or ():
        if key == REASON_KEY:
            text = value.decode() if isinstance(value, bytes) else str(value)
            return Reason(text) if text in Reason._value2member_map_ else None
    return None


def is_busy(exc: BaseException) -> bool:
    """The worker refused the call because it runs another one: ask again later."""
    return reason_of(exc) is Reason.BUSY
