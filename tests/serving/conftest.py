"""A real redis-server per test (free loopback port, its own directory, no persistence)."""

from __future__ import annotations

import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from streamtrain_ps.plumbing.launch import free_port

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
