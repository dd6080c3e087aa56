"""``streamtrain run --metrics-port``: a local run serves the operator's job series and its PS
shards' and workers' own on the ports after it, with a Prometheus config that scrapes them
under the labels the chart's dashboards select on."""

from __future__ import annotations

import asyncio
import random
import shutil
import socket
import subprocess
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from streamtrain_operator import cli
from streamtrain_operator.job.plan import StepKey, StepKind
from streamtrain_operator.run.hooks import BEFORE


def _free_ports(count: int) -> int:
    """A base port with ``count`` consecutive free ports after it."""
    for _ in range(200):
        base = random.randrange(20000, 60000 - count)
        socks = []
        try:
            for port in range(base, base + count):
                s = socket.socket()
                socks.append(s)
                s.bind(("127.0.0.1", port))
            return base
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise AssertionError("no free port range")


def _scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        return str(response.read().decode())


class ScrapeAtSecondPass:
    """Holds the run before pass 2 trains, scrapes every endpoint, lets it go on."""

    def __init__(self, ports: list[int]) -> None:
        self.ports = ports
        self.pages: dict[int, str] = {}

    async def hold(self, point: str, key: StepKey) -> None:
        if point == BEFORE and (key.kind, key.pass_index) == (StepKind.TRAIN, 2) and not self.pages:
            for port in self.ports:
                self.pages[port] = await asyncio.to_thread(_scrape, port)


@pytest.mark.timeout(240)
def test_a_local_run_serves_job_ps_and_worker_metrics(
    job_file: Callable[..., Path], capfd: pytest.CaptureFixture[str]
) -> None:
    job = job_file(days=1)
    base = _free_ports(4)  # the job, 1 PS shard, 2 workers
    hook = ScrapeAtSecondPass([base, base + 1, base + 2, base + 3])
    workdir = job.parent / "work"
    args = ["run", str(job), "--workdir", str(workdir), "--metrics-port", str(base)]
    assert cli.main(args, step_hook=hook) == 0
    out = capfd.readouterr().out
    config_path = workdir / "prometheus.yml"
    assert (
        f"e2e: Prometheus metrics on http://127.0.0.1:{base}/metrics (the job) and ports "
        f"{base + 1}-{base + 3} (PS shards, workers); scrape config: {config_path}"
    ) in out
    job_page = hook.pages[base]
    assert 'streamtrain_job_passes_completed_total{job="e2e",namespace="default"} 1.0' in job_page
    assert 'streamtrain_job_auc{job="e2e",namespace="default"}' in job_page
    assert 'streamtrain_job_phase{job="e2e",namespace="default",phase="Training"} 1.0' in job_page
    assert "streamtrain_ps_" in hook.pages[base + 1]
    for worker in (base + 2, base + 3):
        assert "streamtrain_worker_" in hook.pages[worker]

    config = yaml.safe_load(config_path.read_text())
    by_name = {c["job_name"]: c for c in config["scrape_configs"]}
    assert by_name["streamtrain-e2e-run"]["honor_labels"] is True
    workers = by_name["streamtrain-e2e-worker"]
    assert workers["static_configs"] == [
        {"targets": [f"127.0.0.1:{base + 2}", f"127.0.0.1:{base + 3}"]}
    ]
    assert {"target_label": "job", "replacement": "e2e"} in workers["relabel_configs"]
    promtool = shutil.which("promtool")
    assert promtool, "promtool is missing: run `make test-deps`"
    checked = subprocess.run(
        [promtool, "check", "config", str(config_path)], capture_output=True, text=True, check=False
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
