"""The memory limit is a process budget: a shard process grown by pushes of new keys well
past its table budget keeps its peak RSS (VmHWM, read by the process itself at the end) at
the limit, while keys keep arriving and the cold ones move to the disk tier."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from streamtrain_ps.tier import memory_limit as ml

#: Measured: peak RSS 0.9-1.45 % past a 236 MB limit (docs/benchmarks.md, issue 12).
TOLERANCE = 0.02


def test_peak_rss_stays_at_the_limit_under_a_growing_key_set() -> None:
    child = Path(__file__).with_name("rss_child.py")
    out = subprocess.run(
        [sys.executable, str(child), "64", "1.25"],
        capture_output=True,
        text=True,
        timeout=120,
        env=os.environ.copy(),
        check=True,
    )
    res = json.loads(out.stdout.strip().splitlines()[-1])
    assert res["disk_keys"] > 0.15 * (res["disk_keys"] + res["ram_keys"])
    assert 0 < res["tables_budget"] < res["limit"] - res["fixed_overhead"]
    assert res["hwm"] <= res["limit"] * (1 + TOLERANCE), res


def test_the_heap_is_trimmed_near_the_limit_and_not_again_while_that_leaves_it_high(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """After a request the governor gives freed heap back once RSS is within half the
    scratch reserve of the limit; if a trim cannot get it below that mark (the memory is
    live), only again after RSS grew by ``TRIM_STEP`` (a trim costs milliseconds)."""
    mib = 1 << 20
    budget = ml.MemoryBudget(1000 * mib, 100 * mib, 50 * mib, 100 * mib, 700 * mib)
    governor = ml.MemoryGovernor(budget, [])
    rss = [0]
    trims: list[int] = []

    def trim() -> None:
        trims.append(rss[0])
        rss[0] -= 20 * mib  # what the heap gave back

    monkeypatch.setattr(ml, "current_rss_bytes", lambda: rss[0])
    monkeypatch.setattr(ml, "release_scratch_memory", trim)
    mark = 950 * mib  # limit - scratch / 2
    for value, trimmed in (
        (mark, False),  # at the mark: nothing to do
        (mark + 10 * mib, True),  # past it: trimmed, back below the mark
        (mark + 30 * mib, True),  # past it again: trimmed, still 10 MiB above
        (mark + 15 * mib, False),  # grew less than TRIM_STEP since: not again
        (mark + 10 * mib + ml.TRIM_STEP + mib, True),  # grew more: trimmed again
    ):
        rss[0] = value
        before = len(trims)
        governor.enforce()
        assert (len(trims) > before) == trimmed, (value - mark) // mib
