"""An empty pass (no example) is recorded as empty and never reports a placeholder metric.

The real driver runs a day of two passes — the first with data, the second over folders
that are complete but hold no part file — with scripted workers on a real ``LocalPS``; the
operator's real job supervisor observes it (status patches merged as the API server does,
Prometheus gauges). What an SRE must see after the empty pass: ``examples`` 0 and no AUC,
loss or COPC in the pass record, the CR status (the previous pass's AUC removed, not kept
under the new pass's count), the export manifest and the progress line; and gauges that
keep the last *defined* values (an empty pass trained nothing: the model is unchanged).
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from fakes import FakeConnection, FakeKube, Memo, Stop, job_body, make_job, metric
from prometheus_client import CollectorRegistry

from scripted_workers import FakeWorker, no_sleep, write_folder
from streamtrain_operator.job import render
from streamtrain_operator.job.progress import PassRecord
from streamtrain_operator.kube import handlers
from streamtrain_operator.kube.daemon import Runtime
from streamtrain_operator.kube.metrics import OperatorMetrics
from streamtrain_operator.local.reporting import EMPTY_PASS, format_pass
from streamtrain_operator.run.driver import Driver
from streamtrain_operator.run.export import verify_model
from streamtrain_ps.client.local import LocalPS
from streamtrain_worker.metrics import PassMetrics
from streamtrain_worker.proto.share import PassShare

DAY = "20261101"
JOB = {"namespace": "ads", "job": "ctr-online"}


class RankingWorker(FakeWorker):
    """``FakeWorker`` (one example per file, labels 0, 1, 0, ...) whose predictions rank
    the clicks first: AUC 1.0, so no assertion below can pass by meeting a 0.5 placeholder."""

    async def run_pass(self, share: PassShare) -> Any:
        result = await super().run_pass(share)
        labels = np.arange(len(share.files)) % 2
        m = PassMetrics(num_buckets=100)
        m.add(np.where(labels == 1, 0.8, 0.2), labels, np.full(len(share.files), 0.6))
        return m.to_proto(share.day, share.pass_index, int(result.generation))


def _run_day_with_an_empty_second_pass(tmp_path: Path) -> tuple[dict[str, Any], Runtime]:
    """Pass 1 (folder 0000) has three part files; pass 2 (folder 1200) only its donefile."""
    job = make_job(tmp_path)
    write_folder(tmp_path, DAY, "0000")
    empty = tmp_path / "data" / DAY / "1200"
    empty.mkdir(parents=True)
    (empty / "_SUCCESS").touch()
    ps = LocalPS(render.ps_config(job.spec))
    workers = [RankingWorker(ps, 0), RankingWorker(ps, 1)]
    ticks = iter(range(10_000))

    def real_driver(spec: Any, _ps: Any, _workers: Any, store: Any, **kw: Any) -> Driver:
        # The CR's spec points at S3; the local one runs the same plan on tmp_path.
        return Driver(
            job.spec,
            ps,
            workers,
            store,
            clock=lambda: float(next(ticks)),
            sleep=no_sleep,
            observer=kw["observer"],
        )

    body = job_body(workers={"replicas": 2})
    kube = FakeKube(body)
    rt = Runtime(
        kube=kube,
        metrics=OperatorMetrics(CollectorRegistry()),
        connector=lambda job, scale, options: FakeConnection(),
        driver_factory=real_driver,
        clock=lambda: 1.8e9,
        ready_timeout=0.01,
        restart_poll_seconds=0.01,
        idle_poll_seconds=0.01,
    )
    asyncio.run(handlers.run_job(body=body, memo=Memo(runtime=rt), stopped=Stop()))
    return body, rt


def test_an_empty_pass_has_no_auc_in_status_and_leaves_the_gauges(tmp_path: Path) -> None:
    body, rt = _run_day_with_an_empty_second_pass(tmp_path)
    status = body["status"]
    assert status["phase"] == "Succeeded", status.get("message")
    history = [PassRecord.from_dict(r) for r in status["scheduler"]["history"]]
    first, empty = history
    # Pass 1: three examples (one per file), both classes: every metric defined.
    assert first.metrics["examples"] == 3 and first.metrics["auc"] == 1.0
    assert {"loss", "copc"} <= set(first.metrics)
    # Pass 2 is recorded, as empty: no quality metric at all, not a placeholder.
    assert (empty.pass_index, empty.metrics["examples"], empty.metrics["files"]) == (2, 0, 0)
    assert not {"auc", "loss", "copc", "mae", "rmse", "bucket_error"} & set(empty.metrics)
    # The CR status after the merge-patches: the AUC of pass 1 is gone, not left behind.
    assert status["metrics"]["examples"] == "0"
    assert not {"auc", "loss", "copc"} & set(status["metrics"])
    # Gauges: pass 1's values stay; the pass and its (zero) examples are counted.
    assert metric(rt, "streamtrain_job_auc", **JOB) == 1.0
    assert metric(rt, "streamtrain_job_loss", **JOB) == pytest.approx(0.6)
    assert metric(rt, "streamtrain_job_copc", **JOB) == pytest.approx(1 / 1.2)
    assert metric(rt, "streamtrain_job_passes_completed_total", **JOB) == 2
    assert metric(rt, "streamtrain_job_examples_total", **JOB) == 3
    # The day's models are still published (the chain stays whole); the empty pass's
    # delta manifest carries its metrics as they are — without an AUC.
    manifest = verify_model(str(tmp_path / "export"), f"{DAY}/delta-2")
    assert manifest.metrics["examples"] == 0 and "auc" not in manifest.metrics
    assert verify_model(str(tmp_path / "export"), f"{DAY}/delta-1").metrics["auc"] == 1.0
    # The progress line (streamtrain run, streamtrain status) says what happened.
    line = format_pass(empty, 2)
    assert f"pass  2/2  {EMPTY_PASS}         0 ex" in line and "auc" not in line
    assert json.dumps(status["metrics"])  # no NaN/inf smuggled into the status
    # ... and so does the Kubernetes Event of the pass.
    assert isinstance(rt.kube, FakeKube)
    passes = [m for _, reason, m in rt.kube.events if reason == "PassCompleted"]
    assert passes[-1] == f"day {DAY} pass 2: {EMPTY_PASS}", passes
