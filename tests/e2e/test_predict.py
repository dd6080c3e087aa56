"""The reference predictor scores exactly like training on the same model state."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from pathlib import Path

import pytest

from streamtrain_operator.job.progress import Phase
from streamtrain_operator.job.spec import load_job
from streamtrain_operator.local.cluster import LocalCluster
from streamtrain_operator.run.driver import Driver
from streamtrain_operator.run.state import MemoryStateStore
from streamtrain_worker.metrics import PassMetrics
from streamtrain_worker.proto.share import PassShare

from .conftest import streamtrain


@pytest.mark.timeout(240)
def test_predictor_auc_equals_evaluate_only_run_pass(job_file: Callable[..., Path]) -> None:
    # Shrink keeps everything (no decay, no deletion) and exports keep every key, so the
    # day's delta chain, the next day's base and the PS after the job are one model state.
    path = job_file(
        days=1,
        rows_per_folder=200,
        sparse={"showClickDecayRate": 1.0, "deleteThreshold": 0.0},
    )
    root = path.parent
    job = load_job(path)
    files = [str(p) for p in sorted((root / "data" / "20261101" / "1200").glob("part-*"))]
    cluster = LocalCluster(job, root / "work")

    async def train_then_evaluate() -> PassMetrics:
        conn = await cluster.connect(60)
        try:
            progress = await Driver(job.spec, conn.ps, conn.workers, MemoryStateStore()).run()
            assert progress.phase == Phase.SUCCEEDED, progress.message
            # Worker 0 exported the dense network (with the PS's data-norm statistics).
            share = PassShare.of("20261101", 3, files, progress.generation, train=False)
            result = await conn.workers[0].run_pass(share)
            return PassMetrics.from_proto(result)
        finally:
            await conn.close()

    try:
        cluster.start()
        evaluated = asyncio.run(train_then_evaluate())
    finally:
        cluster.stop()
    assert evaluated.examples == 200

    for model, chain_length in (("20261101/delta-4", 4), ("20261102/base", 1)):
        run = streamtrain(
            "predict", "--export", "export", "--model", model, "--json", *files, cwd=root
        )
        assert run.returncode == 0, run.stderr
        predicted = json.loads(run.stdout.strip().splitlines()[-1])
        assert len(predicted["chain"]) == chain_length
        assert predicted["examples"] == evaluated.examples
        assert predicted["auc"] == pytest.approx(evaluated.auc, abs=1e-4), model
        assert predicted["loss"] == pytest.approx(evaluated.loss, abs=1e-4), model
        assert predicted["copc"] == pytest.approx(evaluated.copc, abs=1e-4), model

    # No example, and examples of one class only: what is undefined is null in the JSON
    # (never a placeholder AUC 0.5 or loss 0), and said as n/a on the human line.
    lines = [x for f in files for x in Path(f).read_text().splitlines(keepends=True)]
    negatives = [x for x in lines if not {"1:click", "click:1"} & set(x.split())]
    assert 0 < len(negatives) < len(lines)
    (root / "one-class").write_text("".join(negatives))
    (root / "empty").write_text("")
    for name, examples in (("empty", 0), ("one-class", len(negatives))):
        run = streamtrain("predict", "--export", "export", str(root / name), cwd=root)
        assert run.returncode == 0, run.stderr
        human, raw = run.stdout.strip().splitlines()[-2:]
        predicted = json.loads(raw)
        assert predicted["examples"] == examples and predicted["auc"] is None, name
        assert "auc n/a" in human, human
        if examples:
            assert predicted["loss"] > 0 and predicted["copc"] == 0.0
        else:
            assert predicted["loss"] is None and predicted["copc"] is None
