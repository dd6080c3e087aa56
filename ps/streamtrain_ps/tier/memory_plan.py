"""How a shard's ``memoryLimit`` sizes its parts, decided in one place when it starts.

A capped shard measures its fixed overhead after warming its kernels (``MemoryBudget``),
then sizes from that split: RocksDB's shared cache (``StoreMemory``), each table's slabs up
front (untouched pages are not resident, so reaching the budget never copies a slab: a copy
would hold old and new at once), the gate of the requests in flight (``RequestGate``), the
most keys one request may carry, and the governor that keeps the process under the limit.
An uncapped shard gets the unlimited split: no store budget, no reserve, no gate.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from streamtrain_ps.config import PSConfig, TableConfig
from streamtrain_ps.engine.accessor import RowLayout
from streamtrain_ps.tier.disk_store import StoreMemory
from streamtrain_ps.tier.memory_limit import (
    MemoryBudget,
    MemoryGovernor,
    bound_allocator,
    capped_request_keys,
    request_bytes_per_key,
    request_scratch_bytes,
)
from streamtrain_ps.tier.request_gate import RequestGate
from streamtrain_ps.tier.tiering import TieredTable
from streamtrain_ps.tier.warmup import warm_kernels


@dataclass(frozen=True)
class MemoryPlan:
    """The sizes ``config.memoryLimit`` gives a shard's parts (module docstring)."""

    config: PSConfig
    budget: MemoryBudget
    #: RocksDB's memory, shared by every table's store (``None``: uncapped).
    store: StoreMemory | None
    #: Bytes of slabs reserved per table up front (0: grow on demand).
    table_bytes: int
    #: Most keys of one request (0: only ``maxKeysPerRequest``): a process budget's reserve
    #: holds ``capped_request_keys`` (a table-only budget reserves nothing).
    max_request_keys: int

    @classmethod
    def of(cls, config: PSConfig, budget: MemoryBudget | None = None) -> MemoryPlan:
        """``budget``: how ``config.memoryLimit`` is split; default measured here
        (``MemoryBudget.measure`` after warming the kernels: a process budget)."""
        limit = config.memoryLimit or 0
        if budget is None:
            budget = MemoryBudget.unlimited()
            if limit:
                bound_allocator()
                warm_kernels(config)
                budget = MemoryBudget.measure(
                    limit, num_tables=len(config.tables), request=request_scratch_bytes(config)
                )
        return cls(
            config=config,
            budget=budget,
            store=StoreMemory(budget.store) if limit else None,
            table_bytes=budget.tables // max(1, len(config.tables)) if limit else 0,
            max_request_keys=capped_request_keys(config) if budget.request_bytes else 0,
        )

    def table_capacity(self, table: TableConfig) -> int:
        """Rows of ``table``'s primary slab the table budget holds (index and row)."""
        return self.table_bytes // (8 + 4 * RowLayout.of(table).primary_width)

    def request_gate(self) -> RequestGate:
        """Sparse requests served at once: as many as the scratch reserve holds, by bytes
        (a capped shard; the servicer holds it around a request's decode, work, encode)."""
        return RequestGate(
            self.budget.requests_in_flight * self.budget.request_bytes,
            request_bytes_per_key(self.config),
        )

    def governor(
        self, tables: Sequence[TieredTable], in_flight: Callable[[], int]
    ) -> MemoryGovernor:
        """The governor that keeps ``tables`` (and the process) within the split."""
        return MemoryGovernor(
            self.budget,
            list(tables),
            disk_limit=self.config.diskLimit,
            store=self.store,
            in_flight=in_flight,
        )
