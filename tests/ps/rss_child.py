"""Child process of test_memory_cap: a shard whose ``memoryLimit`` is its measured fixed
overhead plus ``argv[1]`` MiB, grown by pushes of new keys to ``argv[2]`` times its table
budget. Prints one JSON line: the limit, the budget split, VmHWM, keys per tier."""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

import numpy as np

from streamtrain_ps.api import SparsePush
from streamtrain_ps.config import PSConfig, SparseOptimizerConfig, TableConfig
from streamtrain_ps.shard import Shard
from streamtrain_ps.tier.memory_limit import current_rss_bytes
from streamtrain_ps.tier.warmup import warm_kernels

BATCH = 65_536


def vm(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(field)


def main() -> None:
    table = TableConfig(
        name="t", embedxDim=8, embedxThreshold=10.0, optimizer=SparseOptimizerConfig()
    )
    cfg = PSConfig(tables=(table,), diskPath=tempfile.mkdtemp(prefix="rss-child-"))
    warm_kernels(cfg)
    limit = current_rss_bytes() + int(sys.argv[1]) * (1 << 20)
    shard = Shard(PSConfig(**{**cfg.__dict__, "memoryLimit": limit}))
    budget = shard.memory_budget
    target = int(float(sys.argv[2]) * budget.tables / 40)
    rng = np.random.default_rng(0)
    grads = np.zeros((BATCH, 9), np.float32)
    shows = np.ones(BATCH, np.float32)
    clicks = np.zeros(BATCH, np.float32)
    for _ in range(0, target, BATCH):
        keys = rng.integers(1, 2**63, BATCH, dtype=np.uint64)
        shard.push_sparse("t", SparsePush(keys, grads, shows, clicks))
    st = shard.stats().tables[0]
    print(
        json.dumps(
            {
                "limit": limit,
                "fixed_overhead": budget.fixed_overhead,
                "tables_budget": budget.tables,
                "hwm": vm("VmHWM"),
                "ram_keys": st.keys - st.disk_keys,
                "disk_keys": st.disk_keys,
            }
        )
    )


if __name__ == "__main__":
    main()
