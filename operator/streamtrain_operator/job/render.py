"""Render the JSON each component receives from the one parsed spec.

The PS gets ``streamtrain_ps.config.PSConfig`` JSON and every worker gets
``streamtrain_worker.config.WorkerConfig`` JSON. Both are built here as the components' own
config objects with every field set from the spec (whose ``sparse``, ``dense``, ``model``
and ``data`` sections already are those components' own classes), so a component never
falls back to a default of its own for anything the job specifies, and what is rendered is
by construction what the component parses (``tests/contract/test_render_contract.py``
proves it through the JSON text). Pure functions: no I/O.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from streamtrain_operator.job.spec import JobSpec, SpecError
from streamtrain_ps.config import PSConfig
from streamtrain_worker.config import MetricsConfig, PSClientConfig, RuntimeConfig, WorkerConfig

#: The one sparse table a job trains (multi-table jobs are not in the spec yet).
TABLE = "embedding"


def ps_config(spec: JobSpec) -> PSConfig:
    """What every PS shard of the job runs with (its index and count come on the command line)."""
    return PSConfig(
        tables=(spec.sparse.table_config(spec.model.embeddingDim, name=TABLE),),
        dense=spec.dense,
        logicalShards=spec.ps.logicalShards,
        seed=spec.seed,
        memoryLimit=ps_memory_limit(spec),
        diskLimit=spec.ps.diskLimit,
        # Save and Load only below the job's own roots (streamtrain_ps.service.storage_policy).
        storageRoots=(spec.checkpoint.path, spec.export.path),
    )


#: Binary and decimal suffixes of Kubernetes quantities.
_UNITS = {"": 1, "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15, "E": 10**18}
_UNITS |= {f"{p}i": 1024 ** (i + 1) for i, p in enumerate("KMGTPE")}


def memory_bytes(quantity: str, path: str) -> int:
    """A Kubernetes memory quantity ("32Gi", "500M", "1e9") in bytes."""
    m = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?(?:[eE][0-9]+)?)([kMGTPE]i?|Ki)?\s*", quantity)
    if m is None:
        raise SpecError(path, f"not a memory quantity: {quantity!r}")
    return int(float(m.group(1)) * _UNITS[m.group(2) or ""])


def ps_memory_limit(spec: JobSpec) -> int:
    """``spec.ps.memoryLimit``, or derived from the pod's memory limit: headroom of a
    quarter of it (at least two maximal gRPC messages) for buffers, the interpreter and a
    request's scratch. 0 (unlimited) without either."""
    if spec.ps.memoryLimit is not None:
        return spec.ps.memoryLimit
    pod = spec.ps.resources.limits.get("memory")
    if pod is None:
        return 0
    total = memory_bytes(pod, "spec.ps.resources.limits.memory")
    limit = total - max(total // 4, 2 * PSConfig().maxMessageBytes)
    if limit <= 0:
        raise SpecError(
            "spec.ps.memoryLimit",
            f"resources.limits.memory {pod} leaves no room for the tables after "
            f"{total - limit} bytes of headroom; set spec.ps.memoryLimit or more memory",
        )
    return limit


def worker_config(spec: JobSpec, ps_endpoints: Sequence[str]) -> WorkerConfig:
    """What every worker runs with; ``ps_endpoints`` in PS shard-index order."""
    return WorkerConfig(
        model=spec.model,
        data=spec.data.data_config(),
        table=TABLE,
        ps=PSClientConfig(endpoints=tuple(ps_endpoints), config=ps_config(spec)),
        seed=spec.seed,
        metrics=MetricsConfig(),
        runtime=RuntimeConfig(
            numThreads=spec.workers.numThreads,
            overlap=spec.workers.overlap,
            prefetchBatches=spec.workers.prefetchBatches,
            pushQueueDepth=spec.workers.pushQueueDepth,
            inOrderExamples=spec.workers.inOrderExamples,
            maxMergedPushes=spec.workers.maxMergedPushes,
        ),
    )


def render_ps(spec: JobSpec) -> str:
    """The PS JSON (``python -m streamtrain_ps --config``)."""
    return ps_config(spec).to_json()


def render_worker(spec: JobSpec, ps_endpoints: Sequence[str]) -> str:
    """The worker JSON (``python -m streamtrain_worker --config``)."""
    return worker_config(spec, ps_endpoints).to_json()
