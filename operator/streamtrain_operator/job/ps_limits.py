"""What a PS shard's refusal of a pass's working set means to the job, in words.

A shard whose ``spec.ps.memoryLimit`` cannot hold one push of the pass refuses it with the
measured numbers (``streamtrain_ps.errors.WorkingSet``); retrying the pass would be refused
alike, so the job fails with a condition that names the field, the measured working set and
the value to set (and ``spec.ps.diskLimit`` when the disk tier was full too). Pure: the
driver maps the worker's error to a ``WorkingSet`` (``run.worker_errors``) and hands it here.
"""

from __future__ import annotations

from streamtrain_ps.errors import WorkingSet

#: The ``Failed`` condition's reason (and the ``Ready`` condition's) for such a refusal.
MEMORY_LIMIT_TOO_SMALL = "MemoryLimitTooSmall"

_MIB = 1 << 20


def quantity(n: int) -> str:
    """Bytes as a Kubernetes quantity an operator can paste (MiB, rounded up)."""
    return f"{-(-n // _MIB)}Mi"


def memory_limit_message(ws: WorkingSet, where: str, source: str) -> str:
    """The condition's message: field, measured working set, budget, what to set."""
    text = (
        f"{where}: spec.ps.memoryLimit ({ws.memory_limit} bytes) is too small for the pass's "
        f"working set: one push of {ws.keys} unique keys ({source}) needs {ws.needed_bytes} bytes "
        f"of PS RAM, more than half of the {ws.table_budget} bytes the limit leaves for "
        "tables. Set spec.ps.memoryLimit to at least "
        f"{ws.suggested_memory_limit} bytes ({quantity(ws.suggested_memory_limit)}), or "
        "spread the keys over more PS replicas (spec.ps.replicas) or push smaller batches "
        "(spec.model.batchSize)"
    )
    if ws.disk_full:
        cap = f"spec.ps.diskLimit ({ws.disk_limit} bytes)" if ws.disk_limit else "its filesystem"
        text += (
            f". The disk tier is full too ({ws.disk_bytes} bytes stored, at {cap}): raise "
            "spec.ps.diskLimit as well, or the shard evicts keys the pass needs"
        )
    return text
