"""Shared PS fixtures: real shards behind real gRPC servers on 127.0.0.1 port 0.

``ps_cluster(n)`` starts ``n`` in-process servers (one ``Shard`` each) and stops them at
teardown; ``spawn_ps(...)`` runs ``python -m streamtrain_ps`` as a subprocess through the product's
launcher (``streamtrain_ps.plumbing.launch``) and reads the bound port from its start-up
line (``streamtrain_ps.plumbing.startup``). Engine fixtures may be
appended below.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import streamtrain_ps
from streamtrain_ps.api import SparsePush
from streamtrain_ps.client.remote import RemotePS, RetryPolicy
from streamtrain_ps.config import PSConfig, SparseOptimizerConfig, TableConfig
from streamtrain_ps.plumbing.launch import Launched, launch
from streamtrain_ps.plumbing.startup import LISTENING, listening_address
from streamtrain_ps.service.server import PSServer
from streamtrain_ps.shard import Shard
from streamtrain_ps.tier.memory_limit import MemoryBudget

from . import faultfs

PS_SOURCE_ROOT = Path(streamtrain_ps.__file__).resolve().parents[1]


def small_config(**overrides: object) -> PSConfig:
    """Two small tables; embedx admitted at once for ``embedding`` so pulls show values."""
    base: dict[str, object] = {
        "tables": (
            TableConfig(
                name="embedding",
                embedxDim=4,
                embedxThreshold=0.0,
                optimizer=SparseOptimizerConfig(initialRange=0.01),
            ),
            TableConfig(name="other", embedxDim=2),
        ),
        "logicalShards": 16,
    }
    base.update(overrides)
    return PSConfig(**base)  # type: ignore[arg-type]


@dataclass
class Cluster:
    """In-process servers; ``shards[i]`` is what ``servers[i]`` serves."""

    config: PSConfig
    shards: list[Shard]
    servers: list[PSServer]
    clients: list[RemotePS] = field(default_factory=list)

    @property
    def endpoints(self) -> list[str]:
        return [s.address for s in self.servers]

    def client(self, **kwargs: object) -> RemotePS:
        kwargs.setdefault(
            "retry", RetryPolicy(max_attempts=3, initial_backoff=0.01, total_seconds=5)
        )
        ps = RemotePS(self.endpoints, self.config, **kwargs)  # type: ignore[arg-type]
        self.clients.append(ps)
        ps.wait_ready(timeout=10)
        return ps

    def stop(self) -> None:
        for c in self.clients:
            c.close()
        for s in self.servers:
            s.close(grace=0)
        for shard in self.shards:
            shard.close()


@pytest.fixture
def ps_cluster() -> Iterator[Callable[..., Cluster]]:
    """Factory: ``ps_cluster(n, config=None)`` -> a started ``Cluster`` of ``n`` servers."""
    started: list[Cluster] = []

    def start(n: int = 1, config: PSConfig | None = None, **server_kwargs: object) -> Cluster:
        cfg = config or small_config()
        shards = [Shard(cfg, shard_index=i, num_shards=n) for i in range(n)]
        servers = [
            PSServer(shard, cfg, shard_index=i, **server_kwargs)  # type: ignore[arg-type]
            for i, shard in enumerate(shards)
        ]
        cluster = Cluster(cfg, shards, servers)
        started.append(cluster)
        for s in servers:
            s.start()
        return cluster

    yield start
    for cluster in started:
        cluster.stop()


@dataclass
class SpawnedPS:
    """A PS shard process started by the product's launcher, its output watched."""

    child: Launched
    address: str = ""
    #: Output up to and including the start-up line.
    startup: list[str] = field(default_factory=list)

    @property
    def process(self) -> subprocess.Popen[str]:
        return self.child.process

    def lines_until(self, needle: str | re.Pattern[str], timeout: float = 20.0) -> list[str]:
        """Output lines up to and including the first one containing (matching) ``needle``."""
        seen: list[str] = []
        deadline = time.monotonic() + timeout
        while True:
            line = self.child.next_line(deadline)
            if line is None:
                raise AssertionError(f"no line with {needle!r} in {timeout} s; output:\n{seen}")
            seen.append(line.rstrip("\n"))
            if needle.search(line) if isinstance(needle, re.Pattern) else needle in line:
                return seen


@pytest.fixture
def spawn_ps(tmp_path: Path) -> Iterator[Callable[..., SpawnedPS]]:
    """Factory: run ``python -m streamtrain_ps --port 0`` and wait for its address."""
    children: list[Launched] = []

    def spawn(config: PSConfig | None = None, *extra: str, timeout: float = 60.0) -> SpawnedPS:
        cfg_path = tmp_path / f"ps-{len(children)}.json"
        cfg_path.write_text((config or small_config()).to_json())
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join([str(PS_SOURCE_ROOT), os.environ.get("PYTHONPATH", "")]),
        }
        args = ["-m", "streamtrain_ps", "--port", "0", "--config", str(cfg_path), *extra]
        child = launch(
            f"ps-{len(children)}",
            [sys.executable, *args],
            None,
            announce=True,
            watch=True,
            merge_stderr=True,
            env=env,
        )
        children.append(child)
        spawned = SpawnedPS(child)
        spawned.startup = spawned.lines_until(LISTENING, timeout=timeout)
        address = listening_address(spawned.startup[-1])
        assert address is not None
        spawned.address = address
        return spawned

    yield spawn
    for child in children:
        child.kill()
        child.process.wait(timeout=10)


# -- the disk tier's set-up (test_disk_tier and the tests built on it) ------------------------

#: The disk-tier tests' one table, its embedx width and the key range they push.
TIER_TABLE = "embedding"
TIER_DIM = 4
TIER_KEYS = 6_000


def tier_config(
    tmp: Path | None = None, limit: int = 0, disk: int = 0, kind: str = "adagrad"
) -> PSConfig:
    table = TableConfig(
        name=TIER_TABLE,
        embedxDim=TIER_DIM,
        embedxThreshold=3.0,
        deleteThreshold=0.3,
        baseThreshold=0.5,
        deltaThreshold=0.2,
        # kind: a rule, or embed_rule/embedx_rule for the two parts apart
        optimizer=SparseOptimizerConfig(
            type=kind.rpartition("/")[2],  # type: ignore[arg-type]
            embedType=kind.rpartition("/")[0] or None,  # type: ignore[arg-type]
            initialRange=0.01,
        ),
    )
    return PSConfig(
        tables=(table,),
        logicalShards=8,
        memoryLimit=limit,
        diskLimit=disk,
        diskPath=str(tmp) if tmp else "",
    )


def capped_shard(tmp: Path, limit: int, disk: int = 0, kind: str = "adagrad") -> Shard:
    """A shard whose whole ``limit`` is table budget (tier moves with tiny tables; the
    process budget is tested in test_memory_cap.py)."""
    cfg = tier_config(tmp / "disk", limit, disk, kind)
    return Shard(cfg, memory_budget=MemoryBudget.tables_only(limit))


def tier_step(shards: list[Shard], rng: np.random.Generator, n: int = 400) -> None:
    """One random push (Zipf-ish keys, some hot counters) into every shard alike."""
    keys = (rng.zipf(1.2, n) % TIER_KEYS + 1).astype(np.uint64)
    grads = rng.normal(0, 1, (n, TIER_DIM + 1)).astype(np.float32)
    shows = rng.integers(0, 3, n).astype(np.float32)
    shows[:3] = 2.0**21  # a few keys with counters past float32's exact range
    clicks = np.minimum(shows, rng.integers(0, 2, n)).astype(np.float32)
    for s in shards:
        s.push_sparse(TIER_TABLE, SparsePush(keys, grads, shows, clicks))


# -- the two-phase tests' set-up (test_two_phase and the tests built on it) ------------------

#: The two-phase tests' one table and its embedx width.
TWO_PHASE_TABLE = "embedding"
TWO_PHASE_DIM = 2


def two_phase_config(**table: Any) -> PSConfig:
    base: dict[str, Any] = {
        "embedxDim": TWO_PHASE_DIM,
        "embedxThreshold": 0.0,
        "baseThreshold": 0.0,
    }
    base.update(table)
    return PSConfig(
        tables=(TableConfig(name=TWO_PHASE_TABLE, **base),),
        logicalShards=8,
        storageSchemes=faultfs.SCHEMES,  # shards served over gRPC admit failfs:// URIs
    )


def spread_keys(lo: int, hi: int) -> np.ndarray:
    """Keys ``lo..hi-1`` spread over the logical shards (a multiplicative hash)."""
    return np.arange(lo, hi, dtype=np.uint64) * np.uint64(2654435761) + np.uint64(7)


def two_phase_push(ps: Any, k: np.ndarray, show: float, click: float, seed: int = 0) -> None:
    rng = np.random.default_rng(seed)
    ps.push_sparse(
        TWO_PHASE_TABLE,
        SparsePush(
            k,
            rng.normal(size=(k.size, TWO_PHASE_DIM + 1)).astype(np.float32),
            np.full(k.size, show, np.float32),
            np.full(k.size, click, np.float32),
        ),
    )
