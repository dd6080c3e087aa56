"""A real redis-server per test (free loopback port, its own directory, no persistence), and
the published models the delivery tests share."""

from __future__ import annotations

import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from streamtrain_ps.plumbing.launch import free_port
from streamtrain_tools.bench.serving.models import Export, keys_of, rows_for
from streamtrain_worker.publishing.model_folder import ModelKind

REDIS_SERVER = shutil.which("redis-server") or "/usr/bin/redis-server"


class RedisProcess:
    def __init__(self, workdir: Path) -> None:
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        args = [REDIS_SERVER, "--port", str(self.port), "--bind", "127.0.0.1"]
        args += ["--dir", str(workdir), "--save", "", "--appendonly", "no"]
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        client = redis.Redis.from_url(self.url)
        deadline = time.monotonic() + 10
        while True:
            try:
                client.ping()
                break
            except redis.ConnectionError:
                if time.monotonic() > deadline or self.proc.poll() is not None:
                    raise
                time.sleep(0.02)
        self.client = client

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(10)


@pytest.fixture
def redis_server(tmp_path: Path) -> Iterator[RedisProcess]:
    if not Path(REDIS_SERVER).exists():
        pytest.fail("redis-server is missing: run `make test-deps`")
    server = RedisProcess(tmp_path)
    try:
        yield server
    finally:
        server.stop()


#: Keys probed in the published models of ``three_models`` (some never published).
PROBE = keys_of(range(45))


def three_models(ex: Export) -> list[str]:
    """Day 1: delta-1 (ids 0-39), delta-2 (rows of 0-9 changed, id 5 tombstoned), batch;
    day 2: base (ids 0-29), delta-1 (ids 30-34 new)."""
    k1 = keys_of(range(40))
    ex.publish(ModelKind.DELTA, "20261101", 1, k1, rows_for(k1, 1))
    k2 = keys_of([i for i in range(10) if i != 5])
    ex.publish(ModelKind.DELTA, "20261101", 2, k2, rows_for(k2, 2), keys_of([5]))
    ex.publish(ModelKind.BATCH, "20261101", 0, k1, rows_for(k1, 3))
    kb = keys_of(range(30))
    ex.publish(ModelKind.BASE, "20261102", 0, kb, rows_for(kb, 4))
    k3 = keys_of(range(30, 35))
    ex.publish(ModelKind.DELTA, "20261102", 1, k3, rows_for(k3, 5), base="20261102/base")
    return ex.published
