"""What the operator renders actually runs: the job's supervisor (the kopf daemon's body)
applies its objects to a fake API whose "kubelet" starts every pod of every StatefulSet as
a local process — the container's command, args and env exactly as rendered, the
ConfigMap's files where the volume is mounted, the Secret through ``envFrom`` — and the
real driver trains the job's pass against them, through the real status store. Each
rendered gRPC probe (startup, liveness, readiness) is executed against its pod as the
kubelet would.

Only what Kubernetes itself would provide is emulated, each substitution explicit:
- cluster DNS: ``<job>-ps-0.<job>-ps.<ns>.svc:50051`` -> ``127.0.0.1:<port>`` (the pods
  listen on port 0 on 127.0.0.1 instead of the rendered fixed port on 0.0.0.0);
- the StatefulSet ordinal, which Kubernetes gives the PS through its hostname:
  ``--shard-index-from-hostname`` -> ``--shard-index <ordinal>``;
- volumes: the ConfigMap's keys become files in a directory standing for the mount path,
  the ``/tmp`` emptyDir a fresh directory.
"""

from __future__ import annotations

import asyncio
import copy
import json
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from prometheus_client import CollectorRegistry

from streamtrain_operator.kube import resources as r
from streamtrain_operator.kube.daemon import GrpcConnector, JobSupervisor, Runtime
from streamtrain_operator.kube.metrics import OperatorMetrics
from streamtrain_ps.plumbing.startup import listening_address
from streamtrain_worker.data.synth import SynthConfig, generate

from .processes import OutputProcess

DAY = "20261101"
SECRET = {"AWS_ACCESS_KEY_ID": "local-test-key", "AWS_SECRET_ACCESS_KEY": "local-test-secret"}


class LocalPod(OutputProcess):
    """One pod of a rendered StatefulSet, run as a local process."""

    grace = 30.0

    def __init__(
        self, name: str, ordinal: int, template: Mapping[str, Any], config: Mapping[str, str],
        root: Path, dns: Mapping[str, str],
    ) -> None:  # fmt: skip
        (container,) = template["spec"]["containers"]
        workdir = root / name
        mounts: dict[str, Path] = {}
        for mount in container["volumeMounts"]:
            local = workdir / mount["name"]
            local.mkdir(parents=True, exist_ok=True)
            mounts[mount["mountPath"]] = local
            if mount["name"] == "config":
                for key, rendered in config.items():
                    text = rendered
                    for name_, address in dns.items():  # cluster DNS, as the pod resolves it
                        text = text.replace(name_, address)
                    (local / key).write_text(text)
        args = self._args(container["args"], ordinal, mounts)
        env = {"PATH": "/usr/bin:/bin"}
        for item in container["env"]:
            if "value" in item:
                env[item["name"]] = self._path(item["value"], mounts)
            else:
                field = item["valueFrom"]["fieldRef"]["fieldPath"]
                env[item["name"]] = {"metadata.name": name, "metadata.namespace": "ads"}[field]
        for source in container.get("envFrom", []):
            assert source["secretRef"]["name"] == "s3-credentials"
            env.update(SECRET)
        self.name = name
        self.env = env
        command = [
            sys.executable if container["command"][0] == "python" else container["command"][0]
        ]
        super().__init__(command + container["command"][1:] + args, workdir, env)

    @staticmethod
    def _path(value: str, mounts: Mapping[str, Path]) -> str:
        for mount, local in mounts.items():
            if value == mount or value.startswith(mount + "/"):
                return str(local) + value[len(mount) :]
        return value

    def _args(self, rendered: list[str], ordinal: int, mounts: Mapping[str, Path]) -> list[str]:
        out: list[str] = []
        it = iter(rendered)
        for arg in it:
            if arg == "--host":
                out += [arg, "127.0.0.1"]
                next(it)
            elif arg in ("--port", "--metrics-port"):
                out += [arg, "0"]
                next(it)
            elif arg == "--shard-index-from-hostname":
                out += ["--shard-index", str(ordinal)]
            else:
                out.append(self._path(arg, mounts))
        return out

    def address(self, timeout: float = 120.0) -> str:
        deadline = time.monotonic() + timeout
        while True:
            line = self.next_line(deadline)
            if line is None:
                raise AssertionError(f"{self.name} did not start:\n" + "".join(self.output))
            if (address := listening_address(line)) is not None:
                return address


class LocalCluster:
    """A fake API server plus a kubelet: StatefulSets become local processes."""

    def __init__(self, body: dict[str, Any], root: Path) -> None:
        self.body = body
        self.root = root
        self.objects: dict[tuple[str, str], dict[str, Any]] = {}
        self.running: dict[str, list[LocalPod]] = {}
        self.dns: dict[str, str] = {}  # filled as pods start; the connector reads it
        self.events: list[tuple[str, str]] = []
        self.statuses: list[dict[str, Any]] = []
        self.probes_passed: list[tuple[str, str]] = []

    # -- the KubeAPI protocol ------------------------------------------------------------
    def apply(self, obj: Mapping[str, Any]) -> str:
        key = (obj["kind"], obj["metadata"]["name"])
        existed = key in self.objects
        self.objects[key] = copy.deepcopy(dict(obj))
        if obj["kind"] == "StatefulSet":
            self._reconcile_pods(obj["metadata"]["name"])
        return "patched" if existed else "created"

    def delete(self, kind: str, namespace: str, name: str) -> bool:
        gone = self.objects.pop((kind, name), None) is not None
        if kind == "StatefulSet":
            self._stop(name)
        return gone

    def scale(self, namespace: str, name: str, replicas: int) -> None:
        self.objects[("StatefulSet", name)]["spec"]["replicas"] = replicas
        self._reconcile_pods(name)

    def patch_status(self, namespace: str, name: str, status: Mapping[str, Any]) -> None:
        self.statuses.append(copy.deepcopy(dict(status)))
        self.body.setdefault("status", {}).update(copy.deepcopy(dict(status)))

    def event(self, job: Mapping[str, str], type_: str, reason: str, message: str) -> None:
        self.events.append((reason, message))

    def pods(self, namespace: str, selector: Mapping[str, str]) -> dict[str, tuple[str, int]]:
        """A pod's identity is its process: a new pid is a recreated pod."""
        role = selector["streamtrain.io/role"]
        return {p.name: (str(p.proc.pid), 0) for p in self.running.get(f"ctr-online-{role}", [])}

    # -- the kubelet ----------------------------------------------------------------------
    def _reconcile_pods(self, sts_name: str) -> None:
        sts = self.objects[("StatefulSet", sts_name)]
        want = sts["spec"]["replicas"]
        if len(self.running.get(sts_name, [])) == want:
            return
        self._stop(sts_name)
        running = self.running.setdefault(sts_name, [])
        config = self.objects[("ConfigMap", "ctr-online-config")]["data"]
        service = sts["spec"]["serviceName"]
        port = sts["spec"]["template"]["spec"]["containers"][0]["ports"][0]["containerPort"]
        (container,) = sts["spec"]["template"]["spec"]["containers"]
        for i in range(want):
            name = f"{sts_name}-{i}"
            pod = LocalPod(name, i, sts["spec"]["template"], config, self.root, self.dns)
            running.append(pod)
            address = pod.address()
            self.dns[f"{name}.{service}.ads.svc:{port}"] = address
            for kind in ("startupProbe", "livenessProbe", "readinessProbe"):
                self._probe(address, container[kind], port)
                self.probes_passed.append((name, kind))

    @staticmethod
    def _probe(address: str, probe: Mapping[str, Any], container_port: int) -> None:
        """What the kubelet's ``grpc:`` probe does: Health/Check on the probed port."""
        assert probe["grpc"]["port"] == container_port
        with grpc.insecure_channel(address) as channel:
            stub = health_pb2_grpc.HealthStub(channel)
            request = health_pb2.HealthCheckRequest(service=probe["grpc"].get("service", ""))
            answer = stub.Check(request, timeout=probe["timeoutSeconds"] * 4)
        assert answer.status == health_pb2.HealthCheckResponse.SERVING, probe

    def _stop(self, sts_name: str) -> None:
        for pod in self.running.pop(sts_name, []):
            pod.stop()

    def stop_all(self) -> None:
        for name in list(self.running):
            self._stop(name)


class NeverStop:
    def is_set(self) -> bool:
        return False

    async def wait(self) -> None:
        await asyncio.Event().wait()


def _manifest(tmp: Path) -> dict[str, Any]:
    generate(
        SynthConfig(
            out=str(tmp / "data"), days=1, start=DAY, split_interval_minutes=1440,
            rows_per_folder=300, files_per_folder=2, num_users=300, num_items=200, seed=3,
        )
    )  # fmt: skip
    return {
        "apiVersion": "streamtrain.io/v1alpha1",
        "kind": "StreamingTrainingJob",
        "metadata": {
            "name": "ctr-online", "namespace": "ads", "generation": 1,
            "uid": "7d0c3c4e-5b0a-4c55-9d0e-1f1e2a3b4c5d",
        },
        "spec": {
            "image": "streamtrain-worker:test",
            "psImage": "streamtrain-ps:test",
            "data": {
                "path": str(tmp / "data"), "format": "slot",
                "slots": ["user", "item", "category", "device", "position", "hour", "hist"],
                "labelSlot": "click", "startDay": DAY, "endDay": DAY,
                "splitIntervalMinutes": 1440, "pollSeconds": 0.2,
            },
            "model": {"hiddenUnits": [16, 8], "batchSize": 64, "denseSyncSteps": 2},
            "sparse": {"embedxThreshold": 1, "baseThreshold": 0, "deltaThreshold": 0},
            "ps": {"replicas": 2, "logicalShards": 8},
            "workers": {"replicas": 2},
            "checkpoint": {"path": str(tmp / "ckpt")},
            "export": {"path": str(tmp / "export")},
            "storageSecretRef": "s3-credentials",
        },
        "status": {},
    }  # fmt: skip


def test_rendered_pods_train_the_job_as_local_processes(tmp_path: Path) -> None:
    body = _manifest(tmp_path)
    cluster = LocalCluster(body, tmp_path / "pods")
    runtime = Runtime(
        kube=cluster,
        metrics=OperatorMetrics(CollectorRegistry()),
        connector=GrpcConnector(cluster.dns),
        ready_timeout=5.0,
        restart_poll_seconds=1.0,
    )
    supervisor = JobSupervisor(runtime, body)
    try:
        asyncio.run(asyncio.wait_for(supervisor.run(NeverStop()), 110))
        started = {
            p: cluster.objects.get(("StatefulSet", p))
            for p in ("ctr-online-ps", "ctr-online-worker")
        }
    finally:
        cluster.stop_all()
    status = body["status"]
    assert status["phase"] == "Succeeded", json.dumps(status, indent=1)[:3000]
    # The pass trained on the rendered pods: global metrics, a published model, a checkpoint.
    assert 0.0 < float(status["metrics"]["auc"]) < 1.0
    assert float(status["metrics"]["examples"]) == 300  # every row of the folder, once
    assert status["lastExport"]["uri"].startswith(str(tmp_path / "export"))
    assert status["lastCheckpoint"]["uri"].startswith(str(tmp_path / "ckpt"))
    assert (tmp_path / "export" / "donefile.txt").exists() or any((tmp_path / "export").iterdir())
    reasons = [reason for reason, _ in cluster.events]
    assert reasons[:2] == ["PassStarted", "PassCompleted"]
    assert {"Exported", "Shrunk", "Succeeded"} <= set(reasons)
    # Succeeded: the StatefulSets are gone (pods stopped), the models stay.
    assert started == {"ctr-online-ps": None, "ctr-online-worker": None}
    assert cluster.running == {}
    # Every rendered gRPC probe (startup, liveness, readiness) answered SERVING on every pod.
    assert len(cluster.probes_passed) == 3 * 4
    ready = next(c for c in status["conditions"] if c["type"] == "PodsReady")
    assert ready["status"] == "True"
    assert r.PS_CONFIG_FILE in cluster.objects[("ConfigMap", "ctr-online-config")]["data"]
