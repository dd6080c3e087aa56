"""The PS exception tree, classified by what the caller should do.

- ``PSError``: base of everything below.
  - ``InvalidRequestError``: the request is malformed (wrong dim, length, dtype, mode);
    the message names the field. gRPC ``INVALID_ARGUMENT``. Never retry.
  - ``UnknownTableError``: no sparse table or dense vector of that name. gRPC ``NOT_FOUND``.
  - ``CheckpointError``: a save/load target is missing, incomplete or corrupt (checksum
    mismatch); nothing was loaded. gRPC ``FAILED_PRECONDITION``.
  - ``RequestTooLargeError``: more keys than ``maxKeysPerRequest``. gRPC ``RESOURCE_EXHAUSTED``.
    - ``MemoryLimitError``: ``spec.ps.memoryLimit`` cannot hold what it must; from a request,
      it carries the measured ``WorkingSet``, sent as trailing metadata (``REASON_KEY`` =
      ``MEMORY_LIMIT_REASON`` plus the numbers), so a caller two hops away (the driver, via
      the worker) can end the job with a condition instead of retrying the pass.
  - ``PSUnavailableError``: (client side) the servers did not answer after the configured
    retries. Retry later or fail the pass.

One place (``streamtrain_ps.service.servicer``) maps these to gRPC status codes, and one place
(``streamtrain_ps.client.remote``) maps status codes back, so local and remote PS raise alike.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, fields


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


#: Trailing-metadata key of a machine-readable reason (the worker's refusals use it too).
REASON_KEY = "streamtrain-reason"
#: ``REASON_KEY``'s value on a ``MemoryLimitError`` that carries a ``WorkingSet``.
MEMORY_LIMIT_REASON = "memory-limit"
#: Prefix of the ``WorkingSet`` numbers' metadata keys (``streamtrain-ws-<field>``).
WORKING_SET_PREFIX = "streamtrain-ws-"


@dataclass(frozen=True)
class WorkingSet:
    """What one request needed of a shard's memory limit, as measured when it was refused.

    Bytes are the RAM tier's accounting (``TieredTable.key_bytes`` per unique key).
    ``suggested_memory_limit`` is the smallest ``memoryLimit`` whose table budget would hold
    the request (the shard's own split, ``memory_limit.MemoryBudget``); the disk numbers say
    whether the disk tier was full too (``disk_limit`` 0: no cap).
    """

    keys: int
    needed_bytes: int
    table_budget: int
    memory_limit: int
    suggested_memory_limit: int
    disk_bytes: int = 0
    disk_limit: int = 0
    disk_full: bool = False

    def metadata(self) -> tuple[tuple[str, str], ...]:
        """The reason and every number as ASCII trailing metadata."""
        numbers = (
            (WORKING_SET_PREFIX + f.name.replace("_", "-"), str(int(getattr(self, f.name))))
            for f in fields(self)
        )
        return ((REASON_KEY, MEMORY_LIMIT_REASON), *numbers)

    @classmethod
    def from_metadata(cls, items: Iterable[tuple[str, str | bytes]]) -> WorkingSet | None:
        """Read ``metadata()`` back (``None`` unless the reason and every number are there)."""
        meta = {k: v.decode() if isinstance(v, bytes) else str(v) for k, v in items}
        if meta.get(REASON_KEY) != MEMORY_LIMIT_REASON:
            return None
        texts = [meta.get(WORKING_SET_PREFIX + f.name.replace("_", "-"), "") for f in fields(cls)]
        if not all(t.lstrip("-").isdigit() for t in texts):
            return None
        keys, need, budget, limit, suggested, disk, disk_limit, full = map(int, texts)
        return cls(keys, need, budget, limit, suggested, disk, disk_limit, bool(full))


class MemoryLimitError(RequestTooLargeError):
    """The memory limit cannot hold what it must (``spec.ps.memoryLimit`` too small).

    ``working_set`` is set when a request was refused (measured numbers); ``None`` when the
    shard could not start under its limit."""

    def __init__(self, message: str, working_set: WorkingSet | None = None) -> None:
        super().__init__(message)
        self.working_set = working_set


class PSUnavailableError(PSError):
    """The PS did not answer after the configured retries."""
