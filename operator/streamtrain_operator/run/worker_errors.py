"""What a worker's failed call means to the driver: the one reading of worker errors.

Decisions branch on the typed reason the worker sends beside the status
(``streamtrain_worker.control.refusals.Reason``), never on a status code's name or the message. A
``RunPass`` that failed is one of: refused before it started (``BUSY``, or a request of a
``STALE_GENERATION`` — nothing was pushed, the share may be retried alone), a data error
(``BAD_DATA``: permanent), a vanished file (``FILE_GONE``), a PS shard whose
``memoryLimit`` cannot hold one push of the pass (``MEMORY_LIMIT``, with the PS's measured
numbers: permanent), or anything else — which may have pushed part of the share. A call
that never reached a worker (down, restarting) carries no reason: the channel's
``UNAVAILABLE`` status (or a ``ConnectionError``) says so.
"""

from __future__ import annotations

import grpc

from streamtrain_operator.job.ps_limits import MEMORY_LIMIT_TOO_SMALL, memory_limit_message
from streamtrain_ps.errors import WorkingSet
from streamtrain_worker.control.refusals import Reason, reason_of


def busy(exc: BaseException) -> bool:
    """The worker refused a call because it runs another one (``control/service.py``: one
    call at a time; ``refusals.Reason.BUSY``)."""
    return reason_of(exc) is Reason.BUSY


def grpc_code(exc: BaseException) -> str:
    """The status code's name of a gRPC error (``""`` for any other exception), for
    messages."""
    code = getattr(exc, "code", None)
    return getattr(code(), "name", "") if callable(code) else ""


def unavailable(exc: BaseException) -> bool:
    """The worker could not be reached (down, restarting)."""
    code = getattr(exc, "code", None)
    return isinstance(exc, ConnectionError) or (
        callable(code) and code() is grpc.StatusCode.UNAVAILABLE
    )


def refused(exc: BaseException) -> bool:
    """The worker refused a ``RunPass`` before starting it (``control/service.py``): busy with
    another call, or a request of a stale generation. Nothing of that share was pushed."""
    return reason_of(exc) in (Reason.BUSY, Reason.STALE_GENERATION)


def describe(exc: BaseException, worker: str) -> str:
    """The error as a condition message names it: worker, status code, details."""
    details = getattr(exc, "details", None)
    code = getattr(exc, "code", None)
    if callable(details) and callable(code):  # grpc.aio.AioRpcError
        return f"{worker}: {code().name}: {details()}"
    if isinstance(exc, TimeoutError):
        return f"{worker}: no answer within passTimeoutSeconds"
    return f"{worker}: {type(exc).__name__}: {exc}"


def working_set(exc: BaseException) -> WorkingSet | None:
    """The PS's numbers when a PS shard's memory limit refused a push of the pass."""
    trailing = getattr(exc, "trailing_metadata", None)
    if reason_of(exc) is not Reason.MEMORY_LIMIT or not callable(trailing):
        return None
    return WorkingSet.from_metadata(trailing() or ())


def permanent(exc: BaseException, where: str, worker: str) -> tuple[str, str] | None:
    """``(reason, message)`` of a failed share that no retry can fix (the job fails with
    that condition), or ``None``: the data is wrong (``BAD_DATA``), a recorded file
    vanished (``FILE_GONE``), or a PS shard's ``memoryLimit`` is too small for the pass."""
    reason = reason_of(exc)
    if reason is Reason.BAD_DATA:
        return "BadData", f"{where}: {describe(exc, worker)}"
    if reason is Reason.FILE_GONE:
        return "DataChanged", f"{where}: a file of the pass is gone: {describe(exc, worker)}"
    ws = working_set(exc)
    if ws is not None:
        return MEMORY_LIMIT_TOO_SMALL, memory_limit_message(ws, where, worker)
    return None
