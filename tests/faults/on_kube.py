"""A job on the real operator against KMock, its pods run by ``kubelet.py``: the setup of
``test_operator_kill.py``.

:class:`KubeJob` wires the three parts — the emulated API (``kmock_api.ApiServer``), the
kubelet, and the operator as a real subprocess (``python -m kopf run -m
faults.operator_main --standalone``), which the tests SIGKILL like a node losing the
operator pod and start again like its Deployment would. The operator reaches the pods
through ``STREAMTRAIN_ENDPOINT_MAP`` (the stable DNS names -> the kubelet's local ports),
and its exact crash points come from the pause hook (``pause.PauseHook``, armed by
``STREAMTRAIN_PAUSE``), which ``faults.operator_main`` injects into the operator's runtime.
Waiting is polling with a deadline.
"""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from streamtrain_operator.job.progress import Phase, Progress
from streamtrain_operator.job.spec import parse_job
from streamtrain_operator.kube import resources
from streamtrain_ps.saves import checkpoint

from .gate import Gate, owners
from .harness import SLOTS, START, read_sparse_table, start_logged, wait_for
from .kmock_api import GROUP, PLURAL, VERSION, ApiServer
from .kubelet import Kubelet

NAMESPACE = "ads"
NAME = "online"
#: Two 12-hour folders a day: two passes.
SPLIT_MINUTES = 720


def manifest(root: Path) -> dict[str, Any]:
    """1 PS, 2 workers, a small MLP; data, checkpoints and exports under ``root``."""
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "StreamingTrainingJob",
        "metadata": {"name": NAME, "namespace": NAMESPACE},
        "spec": {
            "image": "streamtrain-worker:test",
            "psImage": "streamtrain-ps:test",
            "data": {
                "path": str(root / "data"),
                "format": "slot",
                "slots": SLOTS,
                "labelSlot": "click",
                "startDay": START,
                "endDay": START,
                "splitIntervalMinutes": SPLIT_MINUTES,
                "pollSeconds": 0.1,
            },
            "model": {"hiddenUnits": [8], "batchSize": 32, "denseSyncSteps": 1},
            "sparse": {"embedxThreshold": 1, "baseThreshold": 0, "deltaThreshold": 0},
            "ps": {"replicas": 1, "logicalShards": 4},
            "workers": {"replicas": 2, "passRetries": 2},
            "checkpoint": {"path": str(root / "ckpt"), "everyPasses": 1, "keep": 10},
            "export": {"path": str(root / "export"), "retries": 1, "retryBackoffSeconds": 0.05},
            "seed": 7,
        },
    }


@dataclass
class OperatorProcess:
    """One ``kopf run`` of the operator; its output goes to a file (a pipe could fill)."""

    process: subprocess.Popen[str]
    log: Path

    @property
    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def check_running(self) -> None:
        if self.process.poll() is not None:
            raise AssertionError(
                f"the operator exited ({self.process.returncode}):\n{self.output[-6000:]}"
            )

    def wait_output(self, text: str, timeout: float = 60) -> None:
        """Poll the operator's output until it contains ``text``."""

        def found() -> bool:
            self.check_running()
            return text in self.output

        try:
            wait_for(found, timeout, f"the operator to log {text!r}")
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{self.output[-6000:]}") from None

    def kill(self) -> None:
        """SIGKILL: no cleanup handler, no last status write — a lost operator pod."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
        self.process.wait(30)

    def stop(self) -> None:
        """SIGTERM (kopf stops gracefully), SIGKILL if it takes longer than 30 s."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.kill()


class KubeJob:
    """The API, the kubelet, the operator runs and the job's files under ``root``."""

    def __init__(self, root: Path, restart_delay: float = 0.0) -> None:
        self.root = root
        self.restart_delay = restart_delay
        self.pause_file = root / "paused"
        self.operators: list[OperatorProcess] = []
        self.body = manifest(root)
        self._api_server = ApiServer()
        self._kubelet: Kubelet | None = None
        self._api: client.ApiClient | None = None
        self._gates: list[Gate] = []
        self.ps_endpoints: list[str] = []

    # ------------------------------------------------------------------ lifecycle

    def __enter__(self) -> KubeJob:
        self._api_server.__enter__()
        try:
            self._kubelet = Kubelet(
                self._api_server.url, NAMESPACE, self.root / "pods", self.restart_delay
            )
            self._kubelet.__enter__()
            configuration = client.Configuration()
            configuration.host = self._api_server.url
            self._api = client.ApiClient(configuration)
            job = parse_job(self.body)
            options = resources.Options()
            self.ps_endpoints = resources.ps_addresses(job, job.spec.ps.replicas, options)
            self.kubelet.reserve(
                self.ps_endpoints
                + resources.worker_addresses(job, job.spec.workers.replicas, options)
            )
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        """Operators first (they would recreate what the kubelet stops), then the pods,
        then the API."""
        try:
            for op in self.operators:
                op.kill()
            if self._kubelet is not None:
                self._kubelet.close()
            for gate in self._gates:
                gate.close()
            if self._api is not None:
                self._api.close()
        finally:
            self._api_server.__exit__()

    @property
    def kubelet(self) -> Kubelet:
        assert self._kubelet is not None
        return self._kubelet

    @property
    def api(self) -> client.ApiClient:
        assert self._api is not None
        return self._api

    def gate_ps(self) -> Gate:
        """Route the workers' PS traffic through a :class:`Gate` (the operator still dials
        the PS directly); call before the pods start."""
        (endpoint,) = self.ps_endpoints
        gate = Gate(self.kubelet.endpoints[endpoint])
        self._gates.append(gate)
        self.kubelet.routes[endpoint] = gate.address
        return gate

    def wait_inside_pass(self, gate: Gate, timeout: float = 30) -> None:
        """Wait until every worker pod has a request held in ``gate``: each is inside its
        ``RunPass`` and cannot leave it until the gate opens."""
        workers = {n: p for n, p in self.kubelet.running().items() if "-worker-" in n}
        inside: set[str] = set()

        def check() -> bool:
            inside.update(owners(gate.held(), workers))
            return inside == set(workers)

        try:
            wait_for(check, timeout, "every worker to be inside the pass")
        except AssertionError as exc:
            raise AssertionError(
                f"{exc}: only {sorted(inside)} of {sorted(workers)}; the gate: {gate.describe()}"
            ) from None

    def start_operator(self, pause: str | None = None) -> OperatorProcess:
        """``kopf run`` the operator (``pause``: e.g. ``after:train@1``, see ``pause.py``)."""
        env = {
            **os.environ,
            "PYTHONUNBUFFERED": "1",
            "STREAMTRAIN_KUBE_SERVER": self._api_server.url,
            "STREAMTRAIN_METRICS_PORT": "0",
            "POD_NAMESPACE": "streamtrain-system",
            "STREAMTRAIN_READY_TIMEOUT_SECONDS": "2",
            "STREAMTRAIN_RESTART_POLL_SECONDS": "0.5",
            "STREAMTRAIN_ENDPOINT_MAP": self.kubelet.endpoint_map(),
        }
        log = self.root / f"operator-{len(self.operators)}.log"
        args = ["run", "-m", "faults.operator_main", "--standalone", "--all-namespaces"]
        process = start_logged(
            ["kopf", *args],
            cwd=self.root,
            log=log,
            env=env,
            pause=pause,
            pause_file=self.pause_file,
        )
        op = OperatorProcess(process, log)
        self.operators.append(op)
        return op

    # ------------------------------------------------------------------ the job

    def create(self) -> None:
        client.CustomObjectsApi(self.api).create_namespaced_custom_object(
            GROUP, VERSION, NAMESPACE, PLURAL, self.body
        )

    def get(self) -> dict[str, Any]:
        obj: Any = client.CustomObjectsApi(self.api).get_namespaced_custom_object(
            GROUP, VERSION, NAMESPACE, PLURAL, NAME
        )
        return dict(obj)

    def status(self) -> dict[str, Any]:
        return dict(self.get().get("status") or {})

    def progress(self) -> Progress | None:
        scheduler = self.status().get("scheduler")
        return Progress.from_dict(scheduler) if scheduler else None

    def statefulsets(self) -> list[str]:
        items = client.AppsV1Api(self.api).list_namespaced_stateful_set(NAMESPACE).items
        return sorted(str(s.metadata.name) for s in items if s.metadata is not None)

    def events(self) -> list[tuple[str, str]]:
        try:
            items = client.CoreV1Api(self.api).list_namespaced_event(NAMESPACE).items
        except ApiException:
            return []
        return [(str(e.reason), str(e.message)) for e in items]

    def wait(
        self, op: OperatorProcess, check: Callable[[dict[str, Any]], bool], what: str,
        timeout: float = 60,
    ) -> dict[str, Any]:  # fmt: skip
        """Poll the job's status until ``check`` holds (failing early if the operator or
        the kubelet failed)."""
        found: list[dict[str, Any]] = []

        def probe() -> bool:
            op.check_running()
            assert not self.kubelet.failures, self.kubelet.failures
            status = self.status()
            if check(status):
                found.append(status)
                return True
            return False

        try:
            wait_for(probe, timeout, what)
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{op.output[-6000:]}") from None
        return found[0]

    def wait_paused(self, op: OperatorProcess, timeout: float = 60) -> str:
        """Wait for the pause hook to hold; what it holds at (``after train 20261101/1``)."""

        def check() -> bool:
            op.check_running()
            return self.pause_file.exists() and self.pause_file.read_text().endswith("\n")

        try:
            wait_for(check, timeout, f"the operator to pause ({self.pause_file})")
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{op.output[-6000:]}") from None
        return self.pause_file.read_text().strip()

    def kill_paused(self, op: OperatorProcess) -> None:
        """SIGKILL the paused operator, then remove the pause file (removing it first
        would release the pause: the step's outcome would be recorded)."""
        op.kill()
        self.pause_file.unlink()


# --------------------------------------------- what the operator-on-kube tests compare

#: Rows per data folder of the operator-on-kube jobs.
ROWS = 150


def succeeded(status: dict[str, Any]) -> bool:
    return status.get("phase") == Phase.SUCCEEDED


@dataclass(frozen=True)
class Counts:
    """Every key of a checkpoint's sparse table with its ``show`` and ``click``."""

    keys: npt.NDArray[np.uint64]  # sorted
    show: npt.NDArray[np.float32]
    click: npt.NDArray[np.float32]


def read_counts(uri: str, table: str = "embedding") -> Counts:
    """The sparse rows of the checkpoint at ``uri`` (checksums verified); the dense part is
    not read — its layout is the worker's business, not this test's."""
    columns, keys, rows = read_sparse_table(checkpoint.read_manifest(uri), table)
    show, click = columns.index("show"), columns.index("click")
    return Counts(keys, rows[:, show], rows[:, click])


def same_counts(got: Counts, want: Counts) -> None:
    """Every key's show and click equal ``want``'s: each example counted once, the shrink's
    decay applied once (order-independent, unlike the trained weights)."""
    assert got.keys.tobytes() == want.keys.tobytes()
    assert got.show.tobytes() == want.show.tobytes()
    assert got.click.tobytes() == want.click.tobytes()
