"""The PS command-line entry points: ``make bench-ps`` plumbing, ``__main__``
argument handling. Speed is not asserted here (that is the benchmark's job)."""

from __future__ import annotations

import json
import math

import pytest

from streamtrain_ps.service.process import parse_args, shard_index_from_hostname
from streamtrain_tools.bench.ps import dense as bench_dense
from streamtrain_tools.bench.ps import run as bench


def test_bench_last_line_is_the_json_summary(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["--keys", "20000", "--batch", "2000", "--batches", "2", "--seconds", "0.2", "--json"]
    assert bench.main(args) == 0
    last = capsys.readouterr().out.strip().splitlines()[-1]
    result = json.loads(last)
    for field in (
        "pull_keys_per_s",
        "push_keys_per_s",
        "rpc_pull_keys_per_s",
        "rpc_push_keys_per_s",
    ):
        assert result[field] > 0, field
    # RSS growth of a 20k-key table can fall inside memory the process already holds
    # (it read 0 once): the bench says so, and the number must still be a finite float.
    assert isinstance(result["bytes_per_key"], float) and math.isfinite(result["bytes_per_key"])
    assert result["bytes_per_key_measurable"] is False
    # the table's own accounting is exact at any size: a 64 B row + key + index per key
    assert 72 <= result["table_memory_bytes_per_key"] <= 400
    assert result["keys"] == 20000


def test_rss_growth_per_key_is_measured_where_it_is_meaningful() -> None:
    """At ``MIN_RSS_KEYS`` the slabs are fresh mmaps: RSS growth is the table's memory."""
    keys = bench.all_keys(bench.MIN_RSS_KEYS)
    shard, res = bench.grow_table(bench.bench_config(100_000), keys)
    try:
        assert 64 <= res["table_memory_bytes_per_key"] <= 120
        assert 40 <= res["bytes_per_key"] <= 160, res
    finally:
        shard.close()


def test_zipf_batches_have_a_hot_head_and_stay_in_the_table() -> None:
    keys = bench.all_keys(100_000)
    (batch,) = bench.zipf_batches(keys, 50_000, 1, seed=1)
    assert set(batch.tolist()) <= set(keys.tolist())
    unique = len(set(batch.tolist()))
    assert 0.1 * batch.size < unique < 0.9 * batch.size
    assert (batch == keys[0]).sum() > (batch == keys[-1]).sum()


@pytest.mark.parametrize(
    ("hostname", "index"),
    [("ctr-online-ps-0", 0), ("ps-12", 12), ("job-ps-3.job-ps.ads.svc.cluster.local", 3)],
)
def test_shard_index_from_statefulset_hostname(hostname: str, index: int) -> None:
    assert shard_index_from_hostname(hostname) == index


def test_bad_hostname_and_arguments_are_rejected(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(ValueError, match="does not end in -<ordinal>"):
        shard_index_from_hostname("laptop")
    with pytest.raises(SystemExit):
        parse_args(["--port", "0", "--shard-index", "2", "--num-shards", "2"])
    assert "--shard-index 2 not in [0, 2)" in capsys.readouterr().err
    args = parse_args(["--port", "0", "--shard-index", "1", "--num-shards", "2"])
    assert (args.shard_index, args.num_shards, args.host) == (1, 2, "127.0.0.1")


def test_dense_bench_reports_an_mlp_push_time(capsys: pytest.CaptureFixture[str]) -> None:
    assert bench_dense.main(["--layers", "32,16", "--pushes", "3"]) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert result["parameters"] == 32 * 16 + 16 + 16 * 1 + 1
    assert 0 < result["push_ms_median"] <= result["push_ms_p90"]
