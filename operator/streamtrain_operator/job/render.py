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

from collections.abc import Sequence

from streamtrain_operator.job.spec import JobSpec
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
    )


def worker_config(spec: JobSpec, ps_endpoints: Sequence[str]) -> WorkerConfig:
    """What every worker runs with; ``ps_endpoints`` in PS shard-index order."""
    return WorkerConfig(
        model=spec.model,
        data=spec.data.data_config(),
        table=TABLE,
        ps=PSClientConfig(endpoints=tuple(ps_endpoints), config=ps_config(spec)),
        seed=spec.seed,
        metrics=MetricsConfig(),
        runtime=RuntimeConfig(numThreads=spec.workers.numThreads, overlap=spec.workers.overlap),
    )


def render_ps(spec: JobSpec) -> str:
    """The PS JSON (``python -m streamtrain_ps --config``)."""
    return ps_config(spec).to_json()


def render_worker(spec: JobSpec, ps_endpoints: Sequence[str]) -> str:
    """The worker JSON (``python -m streamtrain_worker --config``)."""
    return worker_config(spec, ps_endpoints).to_json()
