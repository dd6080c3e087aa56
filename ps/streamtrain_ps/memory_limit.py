"""A shard's memory limit: keep its tables' RAM tier under ``PSConfig.memoryLimit`` by
demoting the coldest keys to the disk tier (``tiering``), and refuse a request that could
never fit.

The limit counts the tables' live bytes (``TieredTable.ram_bytes``: index, rows, embedx
rows, exact counters). Freed rows are reused before a slab grows, so the resident table
stays at about the most it ever held live; the rest of the process (interpreter, gRPC
buffers, a request's scratch) is the headroom the operator leaves between the pod's limit
and this one. Demotion brings the total down to ``LOW_WATER`` of the limit, taking keys
from the table with the most bytes first.
"""

from __future__ import annotations

import resource
import sys
from collections.abc import Sequence

from streamtrain_ps.errors import RequestTooLargeError
from streamtrain_ps.tiering import TieredTable

#: Demotion stops at this share of the limit, so it runs once per few percent of growth.
LOW_WATER = 0.9
#: A single request may use at most this share of the limit (the rest holds other keys).
MAX_REQUEST_SHARE = 0.5


class MemoryLimitError(RequestTooLargeError):
    """The memory limit cannot hold one request's keys (``spec.ps.memoryLimit`` too small)."""


class MemoryGovernor:
    """Applies one shard's ``memoryLimit`` (0: unlimited) to its tables."""

    def __init__(self, limit: int, tables: Sequence[TieredTable]) -> None:
        self.limit = limit
        self._tables = list(tables)
        #: The largest working set (bytes of one request's unique keys) seen.
        self.working_set_bytes = 0

    def check_request(self, table: TieredTable, unique_keys: int) -> None:
        """Refuse a request whose unique keys alone would take more than
        ``MAX_REQUEST_SHARE`` of the limit: demoting could never make room for it."""
        if not self.limit:
            return
        ws = int(unique_keys * table.key_bytes())
        self.working_set_bytes = max(self.working_set_bytes, ws)
        if ws > self.limit * MAX_REQUEST_SHARE:
            raise MemoryLimitError(
                f"spec.ps.memoryLimit ({self.limit} bytes) is too small for the working set: "
                f"one request to table {table.name!r} needs {ws} bytes for {unique_keys} "
                f"keys, more than {int(MAX_REQUEST_SHARE * 100)} % of the limit; raise "
                "spec.ps.memoryLimit (or the PS memory), or use more PS replicas or smaller "
                "batches"
            )

    def ram_bytes(self) -> int:
        return sum(t.ram_bytes() for t in self._tables)

    def enforce(self) -> int:
        """Demote until the RAM tier is under ``LOW_WATER`` of the limit when it is past the
        limit; returns keys moved (or evicted when the disk tier is full too)."""
        if not self.limit:
            return 0
        total = self.ram_bytes()
        if total <= self.limit:
            return 0
        moved = 0
        for t in sorted(self._tables, key=lambda t: t.ram_bytes(), reverse=True):
            excess = self.ram_bytes() - int(self.limit * LOW_WATER)
            if excess <= 0:
                break
            moved += t.demote(t.ram_bytes() - excess)
        return moved


def peak_rss_bytes() -> int:
    """The process's peak resident set size (``getrusage``; kilobytes on Linux)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak if sys.platform == "darwin" else peak * 1024)
