"""Every PromQL query of the chart's Grafana dashboards parses and returns series on a real
Prometheus (Debian's ``prometheus`` package) scraping real metric endpoints: a PS shard
process, a worker process and the operator's metrics, as the chart's monitors would.

Grafana variables are substituted as a user selecting one job would (``$namespace``,
``$job``, ``$shard``, ``$__rate_interval``). ``promtool check config`` validates the
scrape configuration the test uses.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml
from prometheus_client import CollectorRegistry, start_http_server

from streamtrain_operator.job import render
from streamtrain_operator.job.spec import load_job
from streamtrain_operator.kube.metrics import OperatorMetrics
from streamtrain_ps.api import SaveMode, SparsePush
from streamtrain_ps.client.remote import RemotePS
from streamtrain_ps.plumbing.launch import free_port
from streamtrain_ps.plumbing.startup import LISTENING
from streamtrain_tools.bench.serving.models import Export, keys_of, lines, rows_for
from streamtrain_worker.publishing.model_folder import ModelKind
from streamtrain_worker.serving.delivery import Delivery
from streamtrain_worker.serving.scoring import Scorer
from streamtrain_worker.serving.server import Server
from streamtrain_worker.serving.tables import EmbeddedTable

from .processes import OutputProcess

ROOT = Path(__file__).resolve().parents[2]
DASHBOARDS = sorted((ROOT / "charts/streamtrain/dashboards").glob("*.json"))
NAMESPACE, JOB = "ads", "ctr-test"
METRICS = re.compile(r"metrics on http://(\S+:\d+)/metrics")


class Process(OutputProcess):
    """A component process; its merged output is read by a thread (no blocking reads)."""

    def expect(self, *patterns: re.Pattern[str], timeout: float = 90.0) -> list[str]:
        """Wait for a line matching each pattern; return the first group of each."""
        found: dict[re.Pattern[str], str] = {}
        deadline = time.monotonic() + timeout
        while len(found) < len(patterns):
            line = self.next_line(deadline)
            if line is None:
                raise AssertionError(
                    "no " + ", ".join(p.pattern for p in patterns) + "\n" + "".join(self.output)
                )
            for p in patterns:
                if (m := p.search(line)) is not None:
                    found[p] = m.group(1)
        return [found[p] for p in patterns]


def _get(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=10) as response:
        return json.loads(response.read())


def _until(check: Callable[[], Any], what: str, timeout: float = 90.0) -> Any:
    deadline = time.monotonic() + timeout
    while not (value := check()):
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        threading.Event().wait(0.25)
    return value


@pytest.fixture(scope="module")
def endpoints(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """A real PS shard and worker (metrics on port 0), plus the operator's metrics."""
    tmp = tmp_path_factory.mktemp("components")
    job = load_job(ROOT / "crds/examples/minimal.yaml")
    ps_json = json.loads(render.render_ps(job.spec))
    # The job's roots are s3://; the traffic below saves to this directory (allow-listed).
    ps_json["storageRoots"] = [*ps_json.get("storageRoots", []), str(tmp)]
    (tmp / "ps.json").write_text(json.dumps(ps_json))
    ps = Process(
        [sys.executable, "-m", "streamtrain_ps", "--port", "0", "--metrics-port", "0",
         "--config", str(tmp / "ps.json"), "--memory-limit", str(512 << 20),
         "--disk-path", str(tmp / "ps-disk")],
        tmp,
    )  # fmt: skip
    processes = [ps]
    try:
        ps_grpc, ps_metrics = ps.expect(LISTENING, METRICS)
        (tmp / "worker.json").write_text(render.render_worker(job.spec, [ps_grpc]))
        worker = Process(
            [sys.executable, "-m", "streamtrain_worker", "--port", "0", "--metrics-port", "0",
             "--config", str(tmp / "worker.json")],
            tmp,
        )  # fmt: skip
        processes.append(worker)
        _, worker_metrics = worker.expect(LISTENING, METRICS)
        registry = CollectorRegistry()
        operator = OperatorMetrics(registry)
        server, thread = start_http_server(0, addr="127.0.0.1", registry=registry)
        serving = _serving(tmp / "export")
        serving_http, serving_thread = start_http_server(
            0, addr="127.0.0.1", registry=serving.metrics.registry
        )
        try:
            yield {
                "serving": f"127.0.0.1:{serving_http.server_port}",
                "serving_server": serving,
                "ps_grpc": ps_grpc,
                "ps": ps_metrics,
                "worker": worker_metrics,
                "operator": f"127.0.0.1:{server.server_port}",
                "operator_metrics": operator,
                "config": render.ps_config(job.spec),
                "tmp": tmp,
            }
        finally:
            server.shutdown()
            server.server_close()
            thread.join(10)
            serving_http.shutdown()
            serving_http.server_close()
            serving_thread.join(10)
    finally:
        for p in processes:
            p.stop()


def _serving(root: Path) -> Server:
    """An online predictor serving one published model (its metrics for the serving row)."""
    ex = Export(root)
    keys = keys_of(range(10))
    ex.publish(ModelKind.DELTA, "20261101", 1, keys, rows_for(keys, 1))
    table = EmbeddedTable()
    server = Server("ctr", Scorer(str(root), table), Delivery(str(root), table))
    assert server.delivery is not None
    server.delivery.step()
    server.scorer.refresh()
    return server


def _exercise_serving(endpoints: dict[str, Any]) -> None:
    """Requests (some keys unknown) so latency and missed-lookup series move."""
    server: Server = endpoints["serving_server"]
    for _ in range(3):
        scored = server.infer(lines([1, 2, 77]).splitlines(), None)
        server.metrics.latency.labels("http").observe(0.003)
        assert scored.missed > 0


def _exercise_ps(endpoints: dict[str, Any]) -> None:
    """Real PS traffic so latency, save, load, admission and eviction series exist."""
    with RemotePS([endpoints["ps_grpc"]], endpoints["config"]) as ps:
        ps.wait_ready(30)
        table = endpoints["config"].tables[0]
        keys = np.arange(1, 2001, dtype=np.uint64)
        ps.pull_sparse(table.name, keys)
        grads = np.full((keys.size, table.push_dim), 0.01, dtype=np.float32)
        shows = np.full(keys.size, 20.0, dtype=np.float32)
        ps.push_sparse(
            table.name, SparsePush(keys, grads, shows, np.ones(keys.size, dtype=np.float32))
        )
        uri = str(endpoints["tmp"] / "ckpt")
        ps.save(uri, SaveMode.CHECKPOINT)
        ps.load(uri)
        ps.shrink()


def _exercise_operator(metrics: OperatorMetrics, n: int) -> None:
    metrics.set_phase(NAMESPACE, JOB, "Training")
    metrics.set_generation(NAMESPACE, JOB, 2)
    metrics.pass_completed(
        NAMESPACE,
        JOB,
        duration_seconds=40.0 + n,
        wait_seconds=3.0,
        metrics={"auc": 0.78, "loss": 0.45, "copc": 1.02, "examples": 5000.0},
    )
    metrics.exported(NAMESPACE, JOB)
    metrics.checkpointed(NAMESPACE, JOB)
    metrics.restarted(NAMESPACE, JOB, "worker")


@pytest.fixture(scope="module")
def prometheus(
    endpoints: dict[str, Any], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    binary = shutil.which("prometheus")
    assert binary is not None, "Debian's prometheus package is needed (.ci/run installs it)"
    tmp = tmp_path_factory.mktemp("prometheus")
    component = {"namespace": NAMESPACE, "job": JOB}

    def scrape(name: str, target: str, **labels: str) -> dict[str, Any]:
        static: dict[str, Any] = {"targets": [target]}
        if labels:
            static["labels"] = labels
        return {"job_name": name, "static_configs": [static]}

    config = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "scrape_configs": [
            # Like the chart's ServiceMonitor: the operator labels its own series.
            {**scrape("operator", endpoints["operator"]), "honor_labels": True},
            # Like the chart's PodMonitor: job and role from the pod labels, shard from the PS.
            scrape("ps", endpoints["ps"], **component, role="ps"),
            scrape("worker", endpoints["worker"], **component, role="worker"),
            # Like the chart's serving ServiceMonitor: job from the pod's streamtrain.io/job.
            scrape("serving", endpoints["serving"], **component, role="serving"),
        ],
    }
    (tmp / "prometheus.yml").write_text(yaml.safe_dump(config))
    check = subprocess.run(
        ["promtool", "check", "config", str(tmp / "prometheus.yml")],
        capture_output=True,
        text=True,
        check=False,
    )
    assert check.returncode == 0, check.stdout + check.stderr
    port = free_port()
    proc = subprocess.Popen(
        [binary, f"--config.file={tmp / 'prometheus.yml'}", f"--storage.tsdb.path={tmp / 'data'}",
         f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"],
        stdout=subprocess.DEVNULL,
        stderr=(tmp / "prometheus.log").open("w"),
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:

        def ready() -> bool:
            try:
                with urllib.request.urlopen(f"{url}/-/ready", timeout=2) as r:
                    return r.status == 200
            except OSError:
                return False

        _until(ready, "prometheus to be ready", 60)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


def _substitute(expr: str) -> str:
    return (
        expr.replace("$namespace", NAMESPACE)
        .replace("$job", JOB)
        .replace("$shard", ".*")
        .replace("$__rate_interval", "30s")
    )


def _queries() -> list[tuple[str, str, str]]:
    out = []
    for path in DASHBOARDS:
        board = json.loads(path.read_text())
        for panel in board["panels"]:
            for target in panel["targets"]:
                out.append((path.name, panel["title"], target["expr"]))
    return out


def _variable_selectors() -> list[str]:
    out = []
    for path in DASHBOARDS:
        for var in json.loads(path.read_text())["templating"]["list"]:
            if var["type"] == "query":
                match = re.fullmatch(r"label_values\((.+), (\w+)\)", var["definition"])
                assert match is not None, var["definition"]
                out.append(match.group(1))
    return out


def test_every_dashboard_query_returns_series(endpoints: dict[str, Any], prometheus: str) -> None:
    _exercise_ps(endpoints)
    _exercise_serving(endpoints)
    queries = _queries()
    assert len(queries) >= 20
    empty: list[str] = []
    rounds = iter(range(10_000))

    def all_have_data() -> bool:
        _exercise_operator(endpoints["operator_metrics"], next(rounds))
        _exercise_serving(endpoints)
        empty.clear()
        for board, title, expr in queries:
            q = urllib.parse.quote(_substitute(expr))
            answer = _get(f"{prometheus}/api/v1/query?query={q}")
            assert answer["status"] == "success", (board, title, answer)
            if not answer["data"]["result"]:
                empty.append(f"{board} / {title}: {expr}")
        return not empty

    try:
        _until(all_have_data, "every panel to have data", 90)
    except AssertionError:
        pytest.fail("panels without series:\n" + "\n".join(empty))
    for selector in _variable_selectors():
        q = urllib.parse.quote(_substitute(selector))
        series = _get(f"{prometheus}/api/v1/series?match[]={q}")
        assert series["status"] == "success" and series["data"], selector


def test_a_broken_query_is_reported(prometheus: str) -> None:
    """The check above would catch a typo: Prometheus rejects unparsable PromQL."""
    q = urllib.parse.quote("sum by (job (streamtrain_job_auc)")
    with pytest.raises(urllib.error.HTTPError) as error:
        _get(f"{prometheus}/api/v1/query?query={q}")
    assert error.value.code == 400
