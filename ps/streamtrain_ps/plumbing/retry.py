"""The wait between retries: exponential backoff, one formula for every client that retries.

``RemotePS`` retries unavailable PS shards (``client.rpc.RetryPolicy``: attempts, a total
time bound, the call deadlines) and the operator retries storage steps of a publication
(``streamtrain_operator.run.export.RetryPolicy``: attempts and which errors); what they
retry differs, how long they wait before retry ``i`` does not.
"""

from __future__ import annotations

import math


def backoff_delay(
    retry: int, initial: float, multiplier: float = 2.0, cap: float = math.inf
) -> float:
    """Seconds to wait before retry ``retry`` (0: the first): ``initial * multiplier**retry``,
    at most ``cap``."""
    return min(initial * multiplier**retry, cap)
