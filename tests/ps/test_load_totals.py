"""The load bench's correctness checks, short: 4 clients against 2 real PS shard processes for
~2 s; every pushed show and click must be in the table, no client may error or hang."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from streamtrain_tools.bench.ps.load import LoadSettings, run, totals_of, zipf_pool


def test_totals_of_counts_every_push_of_every_batch() -> None:
    settings = LoadSettings(keys=50, batch=40, pool=3)
    pool = zipf_pool(settings, seed=1)
    uses = np.array([2, 0, 5])
    shows, clicks = totals_of(pool, uses, settings.keys)
    by_hand_shows = np.zeros(settings.keys)
    by_hand_clicks = np.zeros(settings.keys)
    for b, count in enumerate(uses):
        for _ in range(count):
            for i, c in zip(pool[b].index, pool[b].clicks, strict=True):
                by_hand_shows[i] += 1
                by_hand_clicks[i] += c
    np.testing.assert_array_equal(shows, by_hand_shows)
    np.testing.assert_array_equal(clicks, by_hand_clicks)
    assert shows.sum() == 7 * settings.batch


@pytest.mark.faults
def test_four_clients_lose_no_update(tmp_path: Path) -> None:
    settings = LoadSettings(clients=(4,), seconds=2.0, keys=20_000, batch=512, grace=30.0)
    lines: list[str] = []
    result = run(settings, tmp_path, log=lines.append)
    phase = result["n4"]
    assert phase["finished"] == 4 and phase["errors"] == 0, lines
    assert phase["requests_per_s"] > 0 and phase["pull_p99_ms"] >= phase["pull_p50_ms"] > 0
    # The load really pushed (beyond the one growing push per key) and all of it arrived.
    assert result["shows_expected"] > settings.keys
    assert result["shows_in_table"] == result["shows_expected"]
    assert result["lost_updates"] == 0
    assert result["keys_with_wrong_click"] == 0
    assert result["totals_exact_in_float32"] and result["memory_bounded"]
    assert result["table_keys"] == settings.keys
    assert result["ok"] is True
