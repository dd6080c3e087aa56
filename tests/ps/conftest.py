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

import pytest

import streamtrain_ps
from streamtrain_ps.client.remote import RemotePS, RetryPolicy
from streamtrain_ps.config import PSConfig, SparseOptimizerConfig, TableConfig
from streamtrain_ps.plumbing.launch import Launched, launch
from streamtrain_ps.plumbing.startup import LISTENING, listening_address
from streamtrain_ps.service.server import PSServer
from streamtrain_ps.shard import Shard

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
