"""Retrying what failed transiently: one ``RetryPolicy`` and one backoff formula for every
client that retries.

``RemotePS`` retries unavailable PS shards (``client.rpc``: by status code, bounded by
attempts and total time, each attempt under a deadline) and the operator retries the storage
steps of a publication and a checkpoint (``streamtrain_operator.run.export.with_retries``: by
exception type, bounded by attempts). What they retry differs; how many times, and how long
they wait before retry ``i``, is this one policy.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


def backoff_delay(
    retry: int, initial: float, multiplier: float = 2.0, cap: float = math.inf
) -> float:
    """Seconds to wait before retry ``retry`` (0: the first): ``initial * multiplier**retry``,
    at most ``cap``."""
    return min(initial * multiplier**retry, cap)


@dataclass(frozen=True)
class RetryPolicy:
    """How often a call is tried, and the waits between tries (``delay``).

    ``total_seconds`` bounds the time spent retrying (for a caller that watches the clock:
    the PS client). ``retry_on`` is what a caller that retries by exception type retries
    (the operator's storage steps); the PS client decides by status code instead. The
    deadlines bound one attempt of a caller whose attempts are RPCs (the PS client).
    """

    max_attempts: int = 10
    initial_backoff: float = 0.05
    max_backoff: float = 2.0
    multiplier: float = 2.0
    total_seconds: float = 30.0
    #: Exceptions worth retrying, for a caller that retries by exception type.
    retry_on: tuple[type[BaseException], ...] = (OSError,)
    #: Deadline of one attempt of a data-plane RPC (pull, push, dense, stats).
    rpc_timeout: float = 60.0
    #: Deadline of one attempt of Save / Load / Shrink (big tables take minutes).
    control_timeout: float = 3600.0

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise ValueError(f"max_attempts must be >= 1, got {self.max_attempts}")
        if not 0 <= self.initial_backoff <= self.max_backoff:
            raise ValueError("need 0 <= initial_backoff <= max_backoff")

    @classmethod
    def storage(
        cls,
        retries: int,
        backoff_seconds: float,
        retry_on: tuple[type[BaseException], ...] = (OSError,),
    ) -> RetryPolicy:
        """``retries`` more attempts after the first, waiting ``backoff_seconds * 2**i``
        before retry ``i``, with no cap and no time bound (the job spec's ``export``)."""
        return cls(
            max_attempts=retries + 1,
            initial_backoff=backoff_seconds,
            max_backoff=math.inf,
            total_seconds=math.inf,
            retry_on=retry_on,
        )

    def delay(self, retry: int) -> float:
        """Seconds to wait before retry ``retry`` (0: the first)."""
        return backoff_delay(retry, self.initial_backoff, self.multiplier, self.max_backoff)
