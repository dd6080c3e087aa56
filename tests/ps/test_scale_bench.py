"""``make bench-ps-scale`` plumbing on a tiny table: every step runs and the last line is
the JSON summary. Memory and speed are not asserted here (that is the benchmark's job)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from streamtrain_tools.bench.ps import scale as ps_scale


def test_the_last_line_is_the_json_summary(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    args = ["--sizes", "20000", "--batch", "2000", "--seconds", "0.05", "--skip-rpc"]
    args += ["--capped-keys", "0"]
    assert ps_scale.main([*args, "--workdir", str(tmp_path), "--json"]) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    per = result["sizes"]["20000"]
    for field in ("delta_save_seconds", "checkpoint_seconds", "shrink_seconds", "load_seconds"):
        assert per[field] > 0, field
    for op in ("pull", "push"):
        for dist in ("zipf", "uniform"):
            assert per[f"{op}_{dist}_unique_keys_per_s"] > 0
    # the table's own accounting is exact at any size: key + slots + 24 B rows (+ 40 B admitted)
    assert 38 < per["unadmitted_memory_bytes_per_key"] < 40
    assert per["admitted_memory_bytes_per_key"] == pytest.approx(
        per["unadmitted_memory_bytes_per_key"] + 40
    )
    assert per["restore_seconds"] > 0 and per["peak_ratio_restore"] > 0
    assert per["keys_after_throughput"] > 20000, "the Zipf tail created keys"


def test_the_capped_phase_reports_its_ratio_and_rss_against_the_limit(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    # 250 B a key above the overhead (50 MB): a shard takes the store's, the scratch's and
    # the huge-page shares out of it and needs 8 MiB of tables left; the probe's overhead
    # and the shard's own measurement differ by a few MB, so no less
    args = ["--sizes", "20000", "--batch", "20000", "--seconds", "0.05", "--skip-rpc"]
    args += ["--capped-keys", "200000", "--capped-bytes-per-key", "250"]
    assert ps_scale.main([*args, "--workdir", str(tmp_path), "--json"]) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert result["capped_pull_ratio"] > 0 and result["capped_push_ratio"] > 0
    assert result["capped_limit_bytes"] > result["capped_fixed_overhead_bytes"] > 0
    peak = result["capped_rss_peak_bytes"]
    assert result["capped_rss_max_over_limit_bytes"] == peak - result["capped_limit_bytes"]
    assert peak >= result["capped_fixed_overhead_bytes"], "sampled while it held its keys"


def test_zipf_ranks_have_a_hot_head_and_a_long_tail() -> None:
    ranks = ps_scale.zipf_ranks(np.random.default_rng(0), 1_000_000, 200_000, 1.1)
    assert ranks.min() >= 0 and ranks.max() < 1_000_000
    assert np.mean(ranks == 0) > 0.05, "rank 0 is the most popular key"
    assert np.mean(ranks >= 100_000) > 0.05, "the last 90 % of the key space still draws"
