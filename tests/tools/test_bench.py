"""The worker benchmark's plumbing (not its speed): both sides train, one JSON line last."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from streamtrain_tools.bench import worker as bench


def test_bench_prints_one_json_object_last(capsys: pytest.CaptureFixture[str]) -> None:
    bench.main(["--json", "--repeats", "1", "--rounds", "1", "--parse-seconds", "0.01"])
    lines = capsys.readouterr().out.strip().splitlines()
    result = json.loads(lines[-1])
    assert result["examples_per_round"] == 7200
    assert result["torch_ex_per_s"] > 0 and result["ps_ex_per_s"] > 0
    assert result["ratio"] == pytest.approx(
        result["ps_ex_per_s"] / result["torch_ex_per_s"], rel=1e-2
    )
    assert set(result["parse_lines_per_s"]) >= {"criteo", "avazu", "libsvm"}
    assert (result["slots"], result["dims"], result["hidden_units"]) == (39, 9, [512, 256, 128])


def test_reference_protocol_and_both_sides_score_every_pass() -> None:
    """bench_reference cuts the sample like bench-e2e (24 x 300 rows, batches restart at
    every pass) and both sides return one progressive AUC per pass."""
    from streamtrain_tools.bench import reference as ref

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
    from streamtrain_tools.bench import e2e as bench_e2e
    from streamtrain_tools.bench import reference as ref

    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(bench_e2e.manifest(ref.BATCH, 1, 0.05)))
    rendered = render.worker_config(load_job(path).spec, ["127.0.0.1:1"])
    mine = ref.ps_config(0)
    assert mine.model == rendered.model
    assert mine.runtime == rendered.runtime
    assert mine.ps.config.tables == rendered.ps.config.tables
    assert mine.ps.config.dense == rendered.ps.config.dense
