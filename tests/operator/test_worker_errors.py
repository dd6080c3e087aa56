"""How the driver reads a worker's failed call: refusal, unreachable, or may have pushed."""

from __future__ import annotations

import grpc
import pytest

from streamtrain_operator.run import worker_errors
from streamtrain_worker.refusals import Reason, trailing_metadata


class FakeRpcError(grpc.RpcError):
    """What ``grpc.aio`` raises: a status code, details and the worker's refusal reason."""

    def __init__(self, code: grpc.StatusCode, details: str, reason: Reason | None = None) -> None:
        self._code, self._details, self._reason = code, details, reason

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._details

    def trailing_metadata(self) -> tuple[tuple[str, str], ...]:
        return () if self._reason is None else trailing_metadata(self._reason)


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
