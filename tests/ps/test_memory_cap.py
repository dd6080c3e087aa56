"""The memory limit is a process budget: a shard process grown by pushes of new keys well
past its table budget keeps its peak RSS (VmHWM, read by the process itself at the end) at
the limit, while keys keep arriving and the cold ones move to the disk tier."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

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
