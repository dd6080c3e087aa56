"""The worker benchmark's plumbing (not its speed): both sides train, one JSON line last."""

from __future__ import annotations

import json

import pytest

from streamtrain_worker import bench


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
