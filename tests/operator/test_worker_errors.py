"""How the driver reads a worker's failed call: refusal, unreachable, or may have pushed."""

from __future__ import annotations

from dataclasses import replace

import grpc
import pytest

from streamtrain_operator.job.ps_limits import MEMORY_LIMIT_TOO_SMALL
from streamtrain_operator.run import worker_errors
from streamtrain_ps.errors import WorkingSet
from streamtrain_worker.control.refusals import Reason, trailing_metadata


class FakeRpcError(grpc.RpcError):
    """What ``grpc.aio`` raises: a status code, details and the worker's refusal reason
    (or the trailing metadata a worker forwards from the PS)."""

    def __init__(
        self,
        code: grpc.StatusCode,
        details: str,
        reason: Reason | None = None,
        metadata: tuple[tuple[str, str], ...] = (),
    ) -> None:
        self._code, self._details, self._reason = code, details, reason
        self._metadata = metadata

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._details

    def trailing_metadata(self) -> tuple[tuple[str, str], ...]:
        return self._metadata or (() if self._reason is None else trailing_metadata(self._reason))


PRECONDITION = grpc.StatusCode.FAILED_PRECONDITION


@pytest.mark.parametrize(
    ("exc", "refused", "unavailable"),
    [
        (FakeRpcError(PRECONDITION, "RunPass(...): worker is busy", Reason.BUSY), 1, 0),
        (FakeRpcError(PRECONDITION, "RunPass(...): stale", Reason.STALE_GENERATION), 1, 0),
        # The message alone decides nothing: the reason is data, not text.
        (FakeRpcError(PRECONDITION, "RunPass(...): worker is busy with another call"), 0, 0),
        # A PS error while training is FAILED_PRECONDITION too: it may have pushed.
        (FakeRpcError(PRECONDITION, "RunPass(...): UnknownTableError: no table 'x'"), 0, 0),
        (FakeRpcError(grpc.StatusCode.UNAVAILABLE, "PS unreachable"), 0, 1),
        (FakeRpcError(grpc.StatusCode.INTERNAL, "RunPass(...): RuntimeError"), 0, 0),
        (ConnectionError("socket closed"), 0, 1),
        (TimeoutError(), 0, 0),
    ],
)
def test_only_a_refusal_is_known_to_have_pushed_nothing(
    exc: BaseException, refused: int, unavailable: int
) -> None:
    assert worker_errors.refused(exc) is bool(refused)
    assert worker_errors.unavailable(exc) is bool(unavailable)


def test_descriptions_name_the_worker_and_the_cause() -> None:
    rpc = FakeRpcError(grpc.StatusCode.DATA_LOSS, "RunPass(...): BadDataError: /d/part-0: ...")
    assert worker_errors.grpc_code(rpc) == "DATA_LOSS"
    assert (
        worker_errors.describe(rpc, "w-1")
        == "w-1: DATA_LOSS: RunPass(...): BadDataError: /d/part-0: ..."
    )
    assert (
        worker_errors.describe(TimeoutError(), "w-1") == "w-1: no answer within passTimeoutSeconds"
    )
    assert worker_errors.describe(OSError("gone"), "w-1") == "w-1: OSError: gone"
    assert worker_errors.grpc_code(OSError()) == ""
    assert worker_errors.busy(FakeRpcError(PRECONDITION, "Reset: busy", Reason.BUSY))
    assert not worker_errors.busy(
        FakeRpcError(PRECONDITION, "Reset: stale", Reason.STALE_GENERATION)
    )


MIB = 1 << 20
WS = WorkingSet(
    keys=120_000,
    needed_bytes=9_600_000,
    table_budget=12 * MIB,
    memory_limit=300 * MIB,
    suggested_memory_limit=317 * MIB,
)


def test_a_ps_memory_limit_refusal_is_permanent_and_names_what_to_set() -> None:
    exhausted = grpc.StatusCode.RESOURCE_EXHAUSTED
    rpc = FakeRpcError(exhausted, "RunPass(...): MemoryLimitError: ...", metadata=WS.metadata())
    assert worker_errors.working_set(rpc) == WS
    assert not worker_errors.refused(rpc)  # it may have pushed: the job ends, no retry
    permanent = worker_errors.permanent(rpc, "pass 20261101/3", "w-0")
    assert permanent is not None
    reason, message = permanent
    assert reason == MEMORY_LIMIT_TOO_SMALL
    assert message.startswith(f"pass 20261101/3: spec.ps.memoryLimit ({300 * MIB} bytes)")
    for part in ("120000 unique keys", "9600000 bytes", f"{12 * MIB} bytes", "317Mi", "w-0"):
        assert part in message
    assert "diskLimit" not in message
    full = FakeRpcError(
        exhausted,
        "RunPass(...): MemoryLimitError: ...",
        metadata=replace(WS, disk_bytes=1000, disk_limit=1024, disk_full=True).metadata(),
    )
    _, message = worker_errors.permanent(full, "pass 20261101/3", "w-0") or ("", "")
    assert "spec.ps.diskLimit (1024 bytes)" in message and "1000 bytes stored" in message


def test_resource_exhausted_without_the_numbers_is_an_ordinary_share_failure() -> None:
    rpc = FakeRpcError(grpc.StatusCode.RESOURCE_EXHAUSTED, "RunPass(...): too many keys")
    assert worker_errors.working_set(rpc) is None
    assert worker_errors.permanent(rpc, "pass 1", "w-0") is None
    bad = FakeRpcError(grpc.StatusCode.DATA_LOSS, "RunPass(...): BadDataError: x", Reason.BAD_DATA)
    assert worker_errors.permanent(bad, "pass 1", "w-0") == (
        "BadData",
        "pass 1: w-0: DATA_LOSS: RunPass(...): BadDataError: x",
    )


def test_a_status_code_alone_decides_nothing_the_reason_does() -> None:
    """``DATA_LOSS``/``NOT_FOUND`` without the worker's reason (not a worker's answer) may
    have pushed: an ordinary share failure; with it, the job ends with the condition."""
    for code in (grpc.StatusCode.DATA_LOSS, grpc.StatusCode.NOT_FOUND):
        assert worker_errors.permanent(FakeRpcError(code, "x"), "pass 1", "w-0") is None
    gone = FakeRpcError(grpc.StatusCode.NOT_FOUND, "RunPass(...): gone", Reason.FILE_GONE)
    assert worker_errors.permanent(gone, "pass 1", "w-0") == (
        "DataChanged",
        "pass 1: a file of the pass is gone: w-0: NOT_FOUND: RunPass(...): gone",
    )
