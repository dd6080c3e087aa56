"""A long-tail stream through ``streamtrain run`` under a small ``spec.ps.memoryLimit``
finishes with the same model as without one: part of the table lives on the disk tier
during the run (the cap leaves the tables less than the stream's keys need), and every
sparse row and dense array of the final checkpoint is bit-identical."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import yaml

from faults.harness import DETERMINISTIC, assert_same_model, checkpoint_of, read_checkpoint
from streams import START, write_stream
from streamtrain_ps.config import PSConfig, TableConfig
from streamtrain_ps.tier.memory_limit import MemoryBudget, request_scratch_bytes

from .conftest import manifest, streamtrain

#: Measures a shard process's fixed overhead as the shard does (kernels warm, RocksDB loaded).
OVERHEAD = (
    "import streamtrain_ps.__main__\n"  # what a shard process imports (gRPC, protobuf)
    "from streamtrain_ps.config import PSConfig, TableConfig\n"
    "from streamtrain_ps.tier.memory_limit import bound_allocator, current_rss_bytes\n"
    "from streamtrain_ps.tier.warmup import warm_kernels\n"
    "bound_allocator()\n"
    "warm_kernels(PSConfig(tables=(TableConfig(name='embedding', embedxDim=64),)))\n"
    "print(current_rss_bytes())\n"
)
#: Above the overhead: the disk tier's cache (1/8 of the rest, ~24 MiB), the scratch
#: reserve (one request of 65,536 64-wide keys in flight, two more waiting messages and
#: RocksDB outside its cache: ~150 MiB, ``memory_limit.request_scratch_bytes``), the tables'
#: huge-page slack (6 MiB) and ~15.6 MiB of tables (8 MiB at the least the shard accepts),
#: less than the stream's ~75k keys of 64-wide rows take (~22 MB). Both margins are ~7 MB:
#: a shard's measured overhead moves by a few MB between fresh interpreters (more under
#: load), and this test's measurement is not the shard's.
TABLES_AND_RESERVES = 195 << 20


def fixed_overhead() -> int:
    """The second of two measurements: the first may compile kernels into numba's cache
    (its compiler's memory then counts), which the shard then only loads."""
    for _ in range(2):
        out = subprocess.run(
            [sys.executable, "-c", OVERHEAD], capture_output=True, text=True, check=True
        )
    return int(out.stdout.strip().splitlines()[-1])


def test_a_capped_long_tail_run_ends_with_the_uncapped_model(tmp_path: Path) -> None:
    limit = fixed_overhead() + TABLES_AND_RESERVES
    models = {}
    for name, ps in (("uncapped", {}), ("capped", {"memoryLimit": limit})):
        root = tmp_path / name
        write_stream(root, days=1, rows_per_folder=9000, num_users=10**6, num_items=5 * 10**5)
        spec = manifest(
            root,
            1,
            **{
                **DETERMINISTIC,
                "model": {"hiddenUnits": [8], "batchSize": 256, "embeddingDim": 64},
                "sparse": {"embedxThreshold": 0, "baseThreshold": 0, "deltaThreshold": 0},
                "ps": {"replicas": 1, "logicalShards": 8, **ps},
                "seed": 7,
            },
        )
        (root / "job.yaml").write_text(yaml.safe_dump(spec))
        run = streamtrain("run", str(root / "job.yaml"), cwd=root, timeout=180)
        assert run.returncode == 0, run.stdout + run.stderr
        models[name] = read_checkpoint(checkpoint_of(root, START, 4))
        logs = "".join(p.read_text() for p in root.rglob("logs/ps-*.log"))
        assert ("cold keys go to disk" in logs) == (name == "capped"), logs[-2000:]
    assert len(models["capped"].keys) > 5_000  # after the end-of-day shrink
    assert_same_model(models["capped"], models["uncapped"])


def test_a_limit_too_small_for_a_pass_ends_the_run_with_a_condition(tmp_path: Path) -> None:
    """Batches of 16,000 rows push ~40k new 128-wide keys, sent as requests of 16,384 keys
    (~9 MB each): more than half of the 12 MiB the limit leaves for tables (the limit the
    shard's own split gives for that, from the measured overhead). The run fails at the
    first pass that does not fit, without retrying it, naming the field, the measured
    working set and a value."""
    table = TableConfig(name="embedding", embedxDim=128)
    ps_config = PSConfig(tables=(table,), logicalShards=8)
    budget = MemoryBudget.measure(
        1 << 34, fixed_overhead(), request=request_scratch_bytes(ps_config)
    )
    root = tmp_path
    write_stream(root, days=1, rows_per_folder=16000, num_users=10**6, num_items=5 * 10**5)
    spec = manifest(
        root,
        1,
        **{
            **DETERMINISTIC,
            "model": {"hiddenUnits": [8], "batchSize": 16384, "embeddingDim": 128},
            "sparse": {"embedxThreshold": 0, "baseThreshold": 0, "deltaThreshold": 0},
            "ps": {
                "replicas": 1,
                "logicalShards": 8,
                "memoryLimit": budget.limit_for_tables(12 << 20),
            },
            "seed": 7,
        },
    )
    (root / "job.yaml").write_text(yaml.safe_dump(spec))
    run = streamtrain("run", str(root / "job.yaml"), cwd=root, timeout=180)
    assert run.returncode == 1, run.stdout + run.stderr
    assert "error: MemoryLimitTooSmall: pass " in run.stderr, run.stderr
    assert re.search(r"spec\.ps\.memoryLimit \(\d+ bytes\) is too small", run.stderr)
    assert re.search(
        r"one push of \d+ unique keys \(worker-0\) needs \d+ bytes of PS RAM", run.stderr
    )
    assert re.search(r"Set spec\.ps\.memoryLimit to at least \d+ bytes \(\d+Mi\)", run.stderr)
    status = streamtrain("status", str(root / "job.yaml"), cwd=root)
    # The failure is said once: in the phase line, not again as a condition line.
    assert "Failed (MemoryLimitTooSmall: pass " in status.stdout, status.stdout
    assert status.stdout.count("MemoryLimitTooSmall") == 1, status.stdout
    logs = "".join(p.read_text() for p in root.rglob("logs/worker-*.log"))
    assert logs.count("MemoryLimitError") >= 1
    assert "restor" not in run.stdout.lower(), run.stdout  # no restore and retry of the pass
