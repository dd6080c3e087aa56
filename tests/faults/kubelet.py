"""A tiny kubelet: the StatefulSets the operator writes to the (emulated) API become local
processes, so the operator runs a job end to end with nothing of Kubernetes but its API.

It polls the namespace's StatefulSets and, for every wanted replica, runs the pod
template's container — its ``command`` + ``args`` exactly as rendered
(``resources.container_args``), its ``env`` — as a child process, and keeps a ``Pod``
object in the API for it (labels of the template, a uid, ``containerStatuses`` with a
restart count) because that is what the operator's supervisor watches to notice a
restarted PS. Like the real kubelet it restarts a container that exits (same pod, same
port, ``restartCount`` + 1) — after ``restart_delay`` seconds, standing for the real
kubelet's crash-loop back-off (10 s, doubling up to 5 minutes), during which the pod's
``restartCount`` has not changed yet and its port does not answer — replaces pods whose
template changed, and stops pods on scale-down or deletion. ``close`` stops everything.

Only what Kubernetes itself provides is substituted, each substitution explicit:

- cluster DNS and fixed ports: each pod's stable ``<pod>.<service>.<ns>.svc:<port>`` is
  given a free 127.0.0.1 port (``reserve``), the container's ``--port`` is rewritten to it
  and ``--host`` to 127.0.0.1; the operator dials the same names through
  ``STREAMTRAIN_ENDPOINT_MAP`` (``endpoint_map``), the pods' rendered configs get the
  names replaced (as the pods' resolver would); metrics ports become 0;
- the hostname a StatefulSet pod gets (``--shard-index-from-hostname``) becomes
  ``--shard-index <ordinal>``;
- volumes: the ConfigMap's keys are written to a directory standing for the mount path
  (``/etc/streamtrain``), the ``/tmp`` emptyDir is a fresh directory; arguments and env
  values under a mount path are remapped;
- ``python`` is ``sys.executable``, with this process's ``PYTHONPATH`` (the image's code is
  the tree under test); ``fieldRef`` env values are the pod's name/namespace.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import sys
import threading
import time
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from streamtrain_ps.plumbing.launch import Launched, free_port, launch

log = logging.getLogger(__name__)

#: Seconds between two looks at the API and at the processes.
POLL_SECONDS = 0.1
#: Seconds a SIGTERM'd pod gets before SIGKILL (the PS drains RPCs on SIGTERM).
GRACE_SECONDS = 10.0


@dataclass
class Container:
    """One pod's process (``streamtrain_ps.plumbing.launch``, the launcher of local mode, in a
    session of its own so a signal to the test's group does not reach it); ``restarts``
    counts how often the kubelet restarted it, each run logging to its own file."""

    pod: str
    args: list[str]
    env: dict[str, str]
    workdir: Path
    template: str  # the template it was made from (JSON): a change replaces the pod
    launched: Launched | None = None
    restarts: int = 0
    logs: list[Path] = field(default_factory=list)
    #: When the kubelet first saw the process exited (``None`` while it runs).
    exited_at: float | None = None

    def start(self) -> None:
        path = self.workdir / f"container-{self.restarts}.log"
        self.logs.append(path)
        self.launched = launch(
            self.pod, self.args, path, env=self.env, cwd=self.workdir, new_session=True
        )

    @property
    def pid(self) -> int:
        assert self.launched is not None
        return self.launched.pid

    def running(self) -> bool:
        return self.launched is not None and not self.launched.exited()

    def exited(self) -> bool:
        return self.launched is not None and self.launched.exited()

    def kill(self) -> None:
        """SIGKILL (a crash)."""
        assert self.launched is not None
        self.launched.kill()

    def stop(self) -> None:
        """SIGTERM (graceful, as Kubernetes does), SIGKILL after the grace period."""
        if self.launched is not None:
            self.launched.stop(GRACE_SECONDS)

    def output(self) -> str:
        return "".join(p.read_text(errors="replace") for p in self.logs if p.exists())


class Kubelet:
    """Runs the pods of every StatefulSet in ``namespace`` (see the module docstring).

    A context manager: entering starts the polling thread, leaving stops every pod.
    ``failures`` collects what went wrong in the thread (the test asserts it is empty).
    """

    def __init__(
        self, api_url: str, namespace: str, root: Path, restart_delay: float = 0.0
    ) -> None:
        configuration = client.Configuration()
        configuration.host = api_url
        self.api = client.ApiClient(configuration)
        self.namespace = namespace
        self.root = root
        #: Seconds between a container's exit and its restart (the back-off).
        self.restart_delay = restart_delay
        #: ``<pod dns>:<port>`` -> ``127.0.0.1:<free port>``.
        self.endpoints: dict[str, str] = {}
        #: ``<pod dns>:<port>`` -> another local address, in the pods' configs only (the
        #: operator dials ``endpoints``): e.g. the workers reach the PS through a ``Gate``.
        self.routes: dict[str, str] = {}
        self.containers: dict[str, Container] = {}
        self.failures: list[str] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="kubelet", daemon=True)

    # ------------------------------------------------------------------ the test's side

    def reserve(self, endpoints: Iterable[str]) -> dict[str, str]:
        """Give each stable ``host:port`` a local port; returns the whole map (what the
        operator gets as ``STREAMTRAIN_ENDPOINT_MAP``)."""
        with self._lock:
            for endpoint in endpoints:
                self.endpoints.setdefault(endpoint, f"127.0.0.1:{free_port(below_ephemeral=True)}")
            return dict(self.endpoints)

    def endpoint_map(self) -> str:
        with self._lock:
            return json.dumps(self.endpoints)

    def running(self) -> dict[str, int]:
        """Pod name -> pid of the pods whose process is alive."""
        with self._lock:
            return {name: c.pid for name, c in self.containers.items() if c.running()}

    def kill(self, pod: str) -> int:
        """SIGKILL a pod's process (a crash); the kubelet restarts it. Returns its pid."""
        with self._lock:
            container = self.containers[pod]
            container.kill()
            return container.pid

    def restarts(self, pod: str) -> int:
        with self._lock:
            return self.containers[pod].restarts

    def __enter__(self) -> Kubelet:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(60)
        with self._lock:
            containers, self.containers = list(self.containers.values()), {}
        for c in containers:
            c.stop()
        self.api.close()

    # ------------------------------------------------------------------ the loop

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self._sync()
            except Exception as exc:  # reported to the test, never silently lost
                log.exception("kubelet sync failed")
                self.failures.append(f"{type(exc).__name__}: {exc}")
            self._stop.wait(POLL_SECONDS)

    def _sync(self) -> None:
        apps, core = client.AppsV1Api(self.api), client.CoreV1Api(self.api)
        sets = apps.list_namespaced_stateful_set(self.namespace).items
        wanted: dict[str, tuple[dict[str, Any], int]] = {}
        for obj in sets:
            raw = self.api.sanitize_for_serialization(obj)
            for ordinal in range(int(raw["spec"].get("replicas") or 0)):
                wanted[f"{raw['metadata']['name']}-{ordinal}"] = (raw, ordinal)
        # Every peer's name first: a worker's config names the PS pods.
        self.reserve(self._dns(name, sts) for name, (sts, _) in wanted.items())
        with self._lock:
            current = dict(self.containers)
        for name, container in current.items():
            spec = wanted.get(name)
            template = None if spec is None else _template_key(spec[0])
            if template != container.template:  # scaled down, deleted, or a new template
                self._remove(core, name, container)
        for name, (sts, ordinal) in wanted.items():
            existing = self.containers.get(name)
            if existing is None:
                self._create(core, name, sts, ordinal)
            elif existing.exited() and not self._stop.is_set():
                now = time.monotonic()
                if existing.exited_at is None:
                    existing.exited_at = now
                if now - existing.exited_at >= self.restart_delay:
                    self._restart(core, existing)

    def _remove(self, core: client.CoreV1Api, name: str, container: Container) -> None:
        container.stop()
        with self._lock:
            self.containers.pop(name, None)
        with contextlib.suppress(ApiException):
            core.delete_namespaced_pod(name, self.namespace)

    def _restart(self, core: client.CoreV1Api, container: Container) -> None:
        """A container that exited is started again in the same pod (restartPolicy
        Always), which only the restart count tells apart."""
        container.restarts += 1
        container.exited_at = None
        container.start()
        core.patch_namespaced_pod(container.pod, self.namespace, {"status": _pod_status(container)})

    def _create(
        self, core: client.CoreV1Api, name: str, sts: Mapping[str, Any], ordinal: int
    ) -> None:
        template = sts["spec"]["template"]
        (spec,) = template["spec"]["containers"]
        dns = self._dns(name, sts)
        local = self.reserve([dns])[dns]
        workdir = self.root / name
        mounts = self._volumes(workdir, template["spec"], spec)
        args = _args(spec["args"], ordinal, local.rsplit(":", 1)[1], mounts)
        env = {"PATH": "/usr/bin:/bin"}
        # The image's code is the tree under test: the same imports as this process.
        if "PYTHONPATH" in os.environ:
            env["PYTHONPATH"] = os.environ["PYTHONPATH"]
        for item in spec.get("env", []):
            if "value" in item:
                env[item["name"]] = _remap(item["value"], mounts)
            else:
                path = item["valueFrom"]["fieldRef"]["fieldPath"]
                env[item["name"]] = {"metadata.name": name, "metadata.namespace": self.namespace}[
                    path
                ]
        command = list(spec["command"])
        if command[0] == "python":
            command[0] = sys.executable
        container = Container(name, command + args, env, workdir, _template_key(sts))
        container.start()
        with self._lock:
            self.containers[name] = container
        pod: Any = {  # the client sends plain dicts as they are
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": name,
                "namespace": self.namespace,
                "labels": dict(template["metadata"].get("labels", {})),
            },
            "spec": {"containers": [{"name": spec["name"], "image": spec["image"]}]},
            "status": _pod_status(container),
        }
        core.create_namespaced_pod(self.namespace, pod)

    def _dns(self, pod: str, sts: Mapping[str, Any]) -> str:
        """The pod's stable gRPC ``host:port`` (what ``resources.pod_dns_name`` renders)."""
        (spec,) = sts["spec"]["template"]["spec"]["containers"]
        port = next(p["containerPort"] for p in spec["ports"] if p["name"] == "grpc")
        return f"{pod}.{sts['spec']['serviceName']}.{self.namespace}.svc:{port}"

    def _volumes(
        self, workdir: Path, pod: Mapping[str, Any], container: Mapping[str, Any]
    ) -> dict[str, Path]:
        """Materialise the container's volume mounts; mount path -> local directory."""
        volumes = {v["name"]: v for v in pod.get("volumes", [])}
        mounts: dict[str, Path] = {}
        for mount in container.get("volumeMounts", []):
            local = workdir / mount["name"]
            local.mkdir(parents=True, exist_ok=True)
            mounts[mount["mountPath"]] = local
            source = volumes[mount["name"]]
            if "configMap" in source:
                data = client.CoreV1Api(self.api).read_namespaced_config_map(
                    source["configMap"]["name"], self.namespace
                )
                for key, text in (data.data or {}).items():
                    (local / key).write_text(self._resolve(text))
        return mounts

    def _resolve(self, text: str) -> str:
        """What a pod's resolver does to the stable names in its config: local ports."""
        with self._lock:
            for name, local in self.endpoints.items():
                text = text.replace(name, self.routes.get(name, local))
        return text


def _template_key(sts: Mapping[str, Any]) -> str:
    return json.dumps(sts["spec"]["template"], sort_keys=True)


def _pod_status(container: Container) -> dict[str, Any]:
    return {
        "phase": "Running",
        "containerStatuses": [
            {
                "name": container.pod.rsplit("-", 2)[-2],
                "image": "local",
                "imageID": "local",
                "ready": True,
                "started": True,
                "restartCount": container.restarts,
            }
        ],
    }


def _remap(value: str, mounts: Mapping[str, Path]) -> str:
    for mount, local in mounts.items():
        if value == mount or value.startswith(mount + "/"):
            return str(local) + value[len(mount) :]
    return value


def _args(rendered: list[str], ordinal: int, port: str, mounts: Mapping[str, Path]) -> list[str]:
    out: list[str] = []
    it: Iterator[str] = iter(rendered)
    for arg in it:
        if arg == "--host":
            out += [arg, "127.0.0.1"]
            next(it)
        elif arg == "--port":
            out += [arg, port]
            next(it)
        elif arg == "--metrics-port":
            out += [arg, "0"]
            next(it)
        elif arg == "--shard-index-from-hostname":
            out += ["--shard-index", str(ordinal)]
        else:
            out.append(_remap(arg, mounts))
    return out
