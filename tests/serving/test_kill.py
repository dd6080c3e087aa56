"""SIGKILL of the delivery and of the server (delivering in-process) at each step of a
version: the rerun resumes at the right donefile line, nothing is applied twice, and the
Redis content equals an uninterrupted delivery's."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import numpy as np
import pytest

from streamtrain_tools.bench.serving.models import Export, lines
from streamtrain_worker.serving.delivery import Delivery
from streamtrain_worker.serving.tables import RedisTable

from .conftest import PROBE, RedisProcess, free_port, three_models

HERE = Path(__file__).parent


def run_kill_cli(*args: str, kill: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "STREAMTRAIN_SERVING_KILL": kill}
    env["PYTHONPATH"] = os.pathsep.join([str(HERE.parent.parent), *sys.path])
    return subprocess.run(
        [sys.executable, "-m", "tests.serving.kill_cli", *args],
        env=env,
        check=False,
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=HERE.parent.parent,
    )


def assert_same_as_clean(client: object, root: Path, prefix: str) -> None:
    clean = RedisTable(client, "clean:")  # type: ignore[arg-type]
    Delivery(str(root), clean, grace_seconds=0).step()
    killed = RedisTable(client, prefix)  # type: ignore[arg-type]
    state = killed.state()
    assert state.cursor == 5 and state.live == 5 and state.refused == 0
    assert [v.key for v in state.history] == [v.key for v in clean.state().history]
    for vid in (4, 5):
        a, hit_a = killed.lookup(vid, PROBE)
        b, hit_b = clean.lookup(vid, PROBE)
        np.testing.assert_array_equal(hit_a, hit_b)
        np.testing.assert_array_equal(a, b)


# Every step of every version is killed in-process (test_delivery.py, fast); a real
# SIGKILL of the process here at the two widest windows.
@pytest.mark.parametrize(("point", "version"), [("midwrite", 4), ("committed", 2)])
def test_a_killed_deliver_resumes_exactly_once(
    redis_server: RedisProcess, tmp_path: Path, point: str, version: int
) -> None:
    ex = Export(tmp_path / "export")
    three_models(ex)
    args = ["deliver", "--export", str(ex.root), "--redis", redis_server.url, "--prefix", "k:"]
    killed = run_kill_cli(*args, "--once", kill=f"{point}@{version}")
    assert killed.returncode == -9, killed.stderr[-2000:]
    state = RedisTable(redis_server.client, "k:").state()
    # Killed before its commit: the line is pending; after it: consumed.
    assert state.cursor == (version if point == "committed" else version - 1)
    rerun = run_kill_cli(*args, "--once", kill="")
    assert rerun.returncode == 0, rerun.stderr[-2000:]
    applied = [json.loads(x) for x in rerun.stdout.splitlines()]
    assert [a["key"] for a in applied] == ex.published[state.cursor :]
    assert_same_as_clean(redis_server.client, ex.root, "k:")
    leftovers = {int(k.split(b":")[2]) for k in redis_server.client.scan_iter(match="k:r:*")}
    assert leftovers <= RedisTable(redis_server.client, "k:").stored()


@pytest.mark.parametrize("point", ["midwrite"])
def test_a_killed_server_resumes_its_delivery_and_serves(
    redis_server: RedisProcess, tmp_path: Path, point: str
) -> None:
    ex = Export(tmp_path / "export")
    three_models(ex)
    port = free_port()
    args = ["serve", "--export", str(ex.root), "--redis", redis_server.url, "--prefix", "s:"]
    args += ["--deliver", "--http-port", str(port), "--grpc-port", "0", "--host", "127.0.0.1"]
    killed = run_kill_cli(*args, kill=f"{point}@4")
    assert killed.returncode == -9, killed.stderr[-2000:]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    server = subprocess.Popen(
        [sys.executable, "-m", "streamtrain_worker.serving", *args],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        body = {"inputs": [{"name": "rows", "data": lines([1, 2, 31]).splitlines()}]}
        deadline = time.monotonic() + 60
        reply = None
        while time.monotonic() < deadline:
            try:
                req = urllib.request.Request(
                    f"http://127.0.0.1:{port}/v2/models/streamtrain/infer",
                    json.dumps(body).encode(),
                    {"Content-Type": "application/json"},
                )
                with urllib.request.urlopen(req, timeout=5) as resp:
                    reply = json.loads(resp.read())
                if reply["model_version"] == ex.published[-1]:
                    break
            except OSError:
                pass
            time.sleep(0.1)
        assert reply is not None and reply["model_version"] == ex.published[-1], reply
    finally:
        server.terminate()
        server.wait(20)
    assert_same_as_clean(redis_server.client, ex.root, "s:")
