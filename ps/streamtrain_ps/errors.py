"""The PS exception tree, classified by what the caller should do.

- ``PSError``: base of everything below.
  - ``InvalidRequestError``: the request is malformed (wrong dim, length, dtype, mode);
    the message names the field. gRPC ``INVALID_ARGUMENT``. Never retry.
  - ``UnknownTableError``: no sparse table or dense vector of that name. gRPC ``NOT_FOUND``.
  - ``CheckpointError``: a save/load target is missing, incomplete or corrupt (checksum
    mismatch); nothing was loaded. gRPC ``FAILED_PRECONDITION``.
  - ``RequestTooLargeError``: more keys than ``maxKeysPerRequest``. gRPC ``RESOURCE_EXHAUSTED``.
  - ``PSUnavailableError``: (client side) the servers did not answer after the configured
    retries. Retry later or fail the pass.

One place (``streamtrain_ps.servicer``) maps these to gRPC status codes, and one place
(``streamtrain_ps.remote``) maps status codes back, so local and remote PS raise alike.
"""

from __future__ import annotations


class PSError(Exception):
    """Base class of every error the parameter server raises on purpose."""


class InvalidRequestError(PSError, ValueError):
    """A malformed request; ``field`` names the offending field."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field


class UnknownTableError(PSError, KeyError):
    """No sparse table or dense vector with this name."""

    def __init__(self, kind: str, name: str) -> None:
        super().__init__(f"unknown {kind} {name!r}")
        self.kind = kind
        self.name = name

    def __str__(self) -> str:  # KeyError quotes its argument; keep the plain message
        return str(self.args[0])


class CheckpointError(PSError):
    """A save or load could not be completed; the previous state is untouched."""


class RequestTooLargeError(PSError):
    """A request carries more keys or bytes than the configured limits."""


class PSUnavailableError(PSError):
    """The PS did not answer after the configured retries."""
