"""The refusal vocabulary read from trailing metadata, whatever shape the client hands it."""

from __future__ import annotations

from streamtrain_worker.control.refusals import (
    REASON_KEY,
    Reason,
    is_busy,
    reason_of,
    trailing_metadata,
)


class FailedCallError(Exception):
    """An RPC error as both grpc clients expose it: ``trailing_metadata()``."""

    def __init__(self, metadata: object) -> None:
        super().__init__("failed")
        self._metadata = metadata

    def trailing_metadata(self) -> object:
        return self._metadata


def test_every_reason_round_trips() -> None:
    for reason in Reason:
        assert reason_of(FailedCallError(trailing_metadata(reason))) is reason


def test_no_reason_unknown_reason_and_non_rpc_errors_are_none() -> None:
    assert reason_of(FailedCallError(None)) is None
    assert reason_of(FailedCallError((("other-key", "busy"),))) is None
    assert reason_of(FailedCallError(((REASON_KEY, "from-a-newer-worker"),))) is None
    assert reason_of(ValueError("worker is busy with another call")) is None  # text is not read
    assert not is_busy(ValueError("busy"))


def test_bytes_values_are_read_too() -> None:
    assert is_busy(FailedCallError(((REASON_KEY, b"busy"),)))
