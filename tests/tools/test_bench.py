"""The worker benchmark's plumbing (not its speed): both sides train, one JSON line last."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from streamtrain_tools.bench.worker import read_ahead
from streamtrain_tools.bench.worker import run as bench


def test_bench_prints_one_json_object_last(capsys: pytest.CaptureFixture[str]) -> None:
    """Three sides on two data sets in one run (shape only: speeds of a quick run mean
    nothing); the ratios are the medians of the per-round ratios."""
    bench.main(["--json", "--quick"])
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 1
    result = json.loads(lines[-1])
    for name in ("criteo", "long_tail"):
        data = result[name]
        rounds = data["rounds"]
        assert set(rounds) == {"torch", "local", "grpc"}
        assert all(len(r) == 1 and r[0] > 0 for r in rounds.values())
        assert result[f"grpc_ratio_{name}"] == data["paired_median"]["grpc_vs_torch"]
        assert data["paired_median"]["grpc_vs_torch"] == pytest.approx(
            rounds["grpc"][0] / rounds["torch"][0], rel=1e-2
        )
        assert 0 < data["unique_keys_per_batch"] <= data["keys_per_batch"]
        assert data["cpu_us_per_example"]["grpc_ps"] >= 0
        assert result[f"grpc_cpu_ratio_{name}"] == data["cpu_ratio_grpc_vs_torch"] > 0
        # every batch pulls and pushes its unique keys, and pushes its dense gradient
        assert all(v > 0 for v in data["wire_bytes_per_example"].values())
    assert result["criteo"]["examples_per_round"] == 3 * 512
    # the long tail's table holds its whole key space, beyond the stream's own keys
    assert result["long_tail"]["table_keys"] == 39 * 1024
    assert set(result["parse_lines_per_s"]) >= {"criteo", "avazu", "libsvm"}
    assert (result["slots"], result["dims"], result["hidden_units"]) == (39, 9, [512, 256, 128])


def test_long_tail_keys_stay_in_each_slots_range() -> None:
    from streamtrain_tools.bench.worker import long_tail

    (batch,) = long_tail.batches(count=1, batch_size=64, slots=3, keys_per_slot=16, ctr=0.5, seed=0)
    slot = batch.slot_of_key()
    assert batch.size == 64 and batch.keys.size == 64 * 3
    assert np.array_equal(batch.keys // 16, slot.astype(np.uint64))
    assert set(np.unique(batch.labels)) <= {0.0, 1.0}
    with pytest.raises(ValueError, match="power of 2"):
        long_tail.batches(count=1, batch_size=1, slots=1, keys_per_slot=12, ctr=0.5, seed=0)


def test_reference_protocol_and_both_sides_score_every_pass() -> None:
    """bench_reference cuts the sample like bench-e2e (24 x 300 rows, batches restart at
    every pass) and both sides return one progressive AUC per pass."""
    from streamtrain_tools.bench.quality import reference as ref

    passes = ref.load_passes(ref.SAMPLES_DIR)
    assert len(passes) == 24
    assert [b.size for b in passes[0]] == [32] * 9 + [12]
    assert all(sum(b.size for b in p) == 300 for p in passes)
    short = passes[:2]
    torch_aucs = ref.TorchReference(short, seed=0).run()
    ps_aucs = ref.run_ps(short, ref.ps_config(0, {"runtime": {"overlap": False}}))
    assert len(torch_aucs) == len(ps_aucs) == 2
    assert all(0.0 < a < 1.0 for a in torch_aucs + ps_aucs)


def test_reference_ps_side_mirrors_the_bench_e2e_manifest(tmp_path: Path) -> None:
    """The in-process PS side must train what ``make bench-e2e`` renders, or iterating on
    it says nothing about the real benchmark."""
    from streamtrain_operator.job import render
    from streamtrain_operator.job.spec import load_job
    from streamtrain_tools.bench.quality import reference as ref
    from streamtrain_tools.bench.worker import e2e as bench_e2e

    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(bench_e2e.manifest(ref.BATCH, 1, 0.05)))
    rendered = render.worker_config(load_job(path).spec, ["127.0.0.1:1"])
    mine = ref.ps_config(0)
    assert mine.model == rendered.model
    assert mine.runtime == rendered.runtime
    assert mine.ps.config.tables == rendered.ps.config.tables
    assert mine.ps.config.dense == rendered.ps.config.dense


def test_bench_e2e_no_cvm_side_changes_only_the_cvm_columns(tmp_path: Path) -> None:
    """``--no-cvm-side`` trains the same job with plain PyTorch's input shape: only
    ``model.cvm`` differs between the two rendered worker configs."""
    import dataclasses

    from streamtrain_operator.job import render
    from streamtrain_operator.job.spec import load_job
    from streamtrain_tools.bench.worker import e2e as bench_e2e

    configs = []
    for cvm in (True, False):
        path = tmp_path / f"job-{cvm}.yaml"
        path.write_text(yaml.safe_dump(bench_e2e.manifest(512, 1, 0.05, cvm=cvm)))
        configs.append(render.worker_config(load_job(path).spec, ["127.0.0.1:1"]))
    with_cvm, without = configs
    assert with_cvm.model.cvm and not without.model.cvm
    assert dataclasses.replace(without.model, cvm=True) == with_cvm.model
    assert without.runtime == with_cvm.runtime and without.ps == with_cvm.ps


def test_bench_e2e_plain_pytorch_trains_the_jobs_own_network() -> None:
    """``train_vs_torch`` compares like with like: plain PyTorch runs the network the job's
    workers build (CVM columns, ordinal inputs, base rate), fed by counts it keeps itself."""
    from streamtrain_tools.bench.worker import e2e as bench_e2e
    from streamtrain_worker.models import build_model
    from streamtrain_worker.models.summary import gather_stats

    torch.sparse.check_sparse_tensor_invariants.disable()  # as the benchmarks do
    spec = bench_e2e.job_spec()
    assert spec.cvm and spec.base_rate and len(spec.ordinal_slots) == 13
    config = bench.bench_config(1)
    data = bench.criteo(bench.SAMPLES_DIR, config, repeats=1, limit=3)
    baseline = bench.TorchBaseline(data, spec, seed=0, summary_decay=0.95)
    workers_model = build_model("slot_dnn", spec, seed=0)
    shapes = [p.shape for p in baseline.dense.parameters()]
    assert shapes == [p.shape for p in workers_model.parameters()]
    first_layer = next(s for s in shapes if len(s) == 2)
    assert first_layer[1] > 39 * 9  # wider than the textbook network
    before = gather_stats(baseline.summaries).clone()

    assert baseline.run() == 3 * 512
    keys = sum(b.keys.size for b in data.batches)
    clicks = sum(float(b.labels @ np.diff(b.offsets[:: b.num_slots])) for b in data.batches)
    assert baseline.counts is not None
    assert baseline.counts.sum(0).tolist() == pytest.approx([keys, clicks])
    assert not gather_stats(baseline.summaries).equal(before)  # counted like the PS does
    textbook = bench.TorchBaseline(data, bench_e2e.job_spec(cvm=False), seed=0)
    assert textbook.counts is None and textbook.run() == 3 * 512


def test_step_timer_splits_training_from_the_transitions_between_passes() -> None:
    """bench-e2e's step accounting: start-up until the first step, each step until the next
    one starts, and everything but training counted as transition time."""
    from streamtrain_tools.bench.worker.e2e import StepTimer

    timer = StepTimer()
    timer.started = 0.0
    timer.steps = [(2.0, "checkdata"), (2.5, "train"), (6.5, "save_delta"), (7.5, "train")]
    timer.finished = 10.0
    report = timer.report(passes=2)
    assert report["startup_seconds"] == 2.0
    assert report["step_seconds"]["train"] == {"total": 6.5, "count": 2}
    assert report["step_seconds"]["save_delta"] == {"total": 1.0, "count": 1}
    assert report["transition_seconds_per_pass"] == (8.0 - 6.5) / 2
    # the parts of steps add up by name
    timer.phase("sparse", 0.25)
    timer.phase("sparse", 0.5)
    timer.phase("launch", 2.0)
    phases = timer.report(passes=2)["phase_seconds"]
    assert phases == {
        "launch": {"total": 2.0, "count": 1},
        "sparse": {"total": 0.75, "count": 2},
    }


def test_sizing_names_the_limit_that_binds_first() -> None:
    from streamtrain_tools.bench.ps.sizing import Costs, Resources, predict

    costs = Costs(
        worker_cpu=100e-6, sparse_cpu=40e-6, dense_cpu=5e-6, sparse_bytes=1e3, dense_bytes=3e3
    )
    res = Resources(worker_cores=1, ps_cores=1, nic_bytes_per_s=1e12)
    assert predict(costs, res, 1, 1) == (pytest.approx(10_000), "workers")
    # 64 workers on one shard: the shard's CPU (sparse + dense) binds
    assert predict(costs, res, 64, 1) == (pytest.approx(1 / 45e-6), "dense shard CPU")
    # more shards spread only the sparse part: the dense vector's shard stays the bound
    rate, binding = predict(costs, res, 64, 32)
    assert binding == "dense shard CPU" and rate == pytest.approx(1 / (40e-6 / 32 + 5e-6))
    slow_nic = Resources(worker_cores=1, ps_cores=1, nic_bytes_per_s=1e7)
    assert predict(costs, slow_nic, 64, 32)[1] == "dense shard network"


def test_bench_read_ahead_measures_both_kinds_of_pass(capsys: pytest.CaptureFixture[str]) -> None:
    """Passes alternate in pairs: 2-3 and 6-7 read ahead, 4-5 not (0-1 left out)."""
    read_ahead.main(["--json", "--passes", "8"])
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert (result["passes_read_ahead"], result["passes_plain"]) == (4, 2)
    assert result["fixed_ms_read_ahead"] > 0 and result["fixed_ms_plain"] > 0
