"""Case 7 in local mode: network trouble between the worker and the PS.

The job runs in-process (``LocalCluster`` + ``Driver``, real PS and worker processes) with the
worker dialing the PS through ``tests/ps/netproxy.py``. During pass 2 the proxy cuts the
connection right after the PS applied a request (the worker sees ``UNAVAILABLE`` for work
that was done), refuses the reconnects, and cuts every open connection. Training continues
after recovery, and no gradient is applied twice: with deterministic execution the final
checkpoint is bit-identical to a run without the faults (a push applied twice would change
the show counts and the weights).
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from ps.netproxy import NetProxy
from streamtrain_operator.job.messages import Action, RunPass
from streamtrain_operator.job.progress import Phase, Progress
from streamtrain_operator.job.spec import load_job
from streamtrain_operator.local.cluster import LocalCluster
from streamtrain_operator.run.connection import GrpcConnection
from streamtrain_operator.run.driver import Driver, Observer
from streamtrain_operator.run.state import LocalStateFile

from .harness import START, Job, assert_same_model, checkpoint_of, read_checkpoint


def _run(job: Job, proxies: list[NetProxy], faults: bool) -> Progress:
    """Run the job to the end in this process, workers -> proxy -> PS."""
    spec = load_job(job.path)

    def route(endpoint: str) -> str:
        proxies.append(NetProxy(endpoint))
        return proxies[-1].address

    def on_action(action: Action, progress: Progress) -> None:
        if faults and isinstance(action, RunPass) and action.key.pass_index == 2:
            proxy = proxies[0]
            if proxy.stats.dropped == 0 and proxy.armed() == 0:
                proxy.drop_responses(3)
                proxy.refuse(2)

    async def main() -> Progress:
        cluster = LocalCluster(spec, job.root / "work", ps_route=route)
        conn: GrpcConnection | None = None
        try:
            cluster.start()
            conn = await cluster.connect(60)
            driver = Driver(
                spec.spec,
                conn.ps,
                conn.workers,
                LocalStateFile(job.state_path),
                observer=Observer(on_action=on_action),
                restarts=cluster,
            )
            return await driver.run()
        finally:
            if conn is not None:
                await conn.close()
            cluster.stop()

    return asyncio.run(main())


def _write(job: Job) -> None:
    job.write(
        days=1,
        workers={"replicas": 1, "numThreads": 1, "overlap": False},
        checkpoint={"path": str(job.root / "ckpt"), "everyPasses": 1, "keep": 10},
        data={"path": str(job.root / "data")},
        export={"path": str(job.root / "export")},
    )


@pytest.mark.faults
@pytest.mark.timeout(150)
def test_dropped_and_refused_worker_ps_connections_apply_every_gradient_once(
    job: Job, tmp_path_factory: pytest.TempPathFactory
) -> None:
    _write(job)
    proxies: list[NetProxy] = []
    try:
        progress = _run(job, proxies, faults=True)
        assert progress.phase == Phase.SUCCEEDED, progress.message
        (proxy,) = proxies
        assert proxy.stats.dropped == 3 and proxy.stats.refused == 2, proxy.stats
    finally:
        for p in proxies:
            p.close()
    assert [r.pass_index for r in progress.history] == [1, 2, 3, 4]
    assert all(r.metrics["examples"] == 120 for r in progress.history)

    clean = Job(Path(tmp_path_factory.mktemp("clean")), [])
    _write(clean)
    clean_proxies: list[NetProxy] = []
    try:
        assert _run(clean, clean_proxies, faults=False).phase == Phase.SUCCEEDED
    finally:
        for p in clean_proxies:
            p.close()
    assert_same_model(
        read_checkpoint(checkpoint_of(job.root, START, 4)),
        read_checkpoint(checkpoint_of(clean.root, START, 4)),
    )
