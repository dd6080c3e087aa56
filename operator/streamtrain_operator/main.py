"""The operator's entry point: ``kopf run -m streamtrain_operator.main --standalone``.

Only wiring lives here (the crate-operator layout): settings are read from the environment
once, at startup, into a validated :class:`OperatorConfig`; kopf is configured (our own
finalizer and annotation prefixes, chosen once and never changed — changing them would
orphan every existing job's finalizer; watch and request timeouts; no cluster scanning, so
the RBAC stays minimal); the :class:`~streamtrain_operator.kube.daemon.Runtime` is built and
put in kopf's memo; the handlers of ``handlers.py`` are registered.

``--standalone`` because exactly one operator runs (the chart's Deployment: one replica,
``Recreate``): no peering objects are needed. ``--liveness`` is passed by the chart.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import kopf
from kubernetes import client, config
from prometheus_client import CollectorRegistry, start_http_server

from streamtrain_operator.kube import handlers, resources
from streamtrain_operator.kube.api import GROUP, PLURAL, VERSION, Kube
from streamtrain_operator.kube.daemon import GrpcConnector, Runtime
from streamtrain_operator.kube.metrics import OperatorMetrics

PREFIX = "streamtrain.io"
FINALIZER = f"{PREFIX}/finalizer"
RESOURCE: dict[str, Any] = {"group": GROUP, "version": VERSION, "plural": PLURAL}


class SettingsError(ValueError):
    """An environment setting is malformed; the message names the variable."""


def _int(env: Mapping[str, str], name: str, default: int, minimum: int = 0) -> int:
    raw = env.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise SettingsError(f"{name}: must be an integer, got {raw!r}") from None
    if value < minimum:
        raise SettingsError(f"{name}: must be >= {minimum}, got {value}")
    return value


def _seconds(env: Mapping[str, str], name: str, default: float) -> float:
    raw = env.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = float(raw)
    except ValueError:
        raise SettingsError(f"{name}: must be a number of seconds, got {raw!r}") from None
    if not value > 0:
        raise SettingsError(f"{name}: must be > 0, got {value}")
    return value


def _json(env: Mapping[str, str], name: str, default: Any) -> Any:
    raw = env.get(name)
    if not raw:
        return default
    try:
        return json.loads(raw)
    except json.JSONDecodeError as exc:
        raise SettingsError(f"{name}: not valid JSON: {exc}") from None


@dataclass(frozen=True)
class OperatorConfig:
    """Operator-wide settings (the chart sets them as environment variables)."""

    namespace: str = "default"
    metrics_port: int = 9090
    ps_port: int = 50051
    worker_port: int = 50061
    component_metrics_port: int = 9100
    network_policy: bool = True
    operator_labels: Mapping[str, str] = field(
        default_factory=lambda: {"app.kubernetes.io/name": "streamtrain"}
    )
    metrics_from: tuple[Mapping[str, Any], ...] = ()
    watch_timeout_seconds: int = 300
    request_timeout_seconds: int = 60
    #: One attempt of waiting for a job's pods to answer gRPC health.
    ready_timeout_seconds: int = 10
    #: How often the supervisor lists a job's pods to notice a restarted PS or worker.
    #: 15 s is cheap for the API server; the operator fault tests
    #: (``tests/faults/test_operator_kill.py``) poll faster so a killed PS pod is noticed
    #: within their time budget.
    restart_poll_seconds: float = 15.0
    #: API server URL for an operator outside the cluster without a kubeconfig (tests).
    kube_server: str | None = None
    #: ``host:port`` rewrites for gRPC endpoints (see ``GrpcConnector``).
    endpoint_map: Mapping[str, str] = field(default_factory=dict)

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> OperatorConfig:
        labels = _json(env, "STREAMTRAIN_OPERATOR_LABELS", None)
        metrics_from = _json(env, "STREAMTRAIN_METRICS_FROM", [])
        endpoint_map = _json(env, "STREAMTRAIN_ENDPOINT_MAP", {})
        if labels is not None and not isinstance(labels, dict):
            raise SettingsError("STREAMTRAIN_OPERATOR_LABELS: must be a JSON object")
        if not isinstance(metrics_from, list):
            raise SettingsError("STREAMTRAIN_METRICS_FROM: must be a JSON list")
        if not isinstance(endpoint_map, dict):
            raise SettingsError("STREAMTRAIN_ENDPOINT_MAP: must be a JSON object")
        policy = env.get("STREAMTRAIN_NETWORK_POLICY", "true").lower()
        if policy not in ("true", "false"):
            raise SettingsError(f"STREAMTRAIN_NETWORK_POLICY: true or false, got {policy!r}")
        base = cls()
        return cls(
            namespace=env.get("POD_NAMESPACE") or base.namespace,
            metrics_port=_int(env, "STREAMTRAIN_METRICS_PORT", base.metrics_port),
            ps_port=_int(env, "STREAMTRAIN_PS_PORT", base.ps_port, 1),
            worker_port=_int(env, "STREAMTRAIN_WORKER_PORT", base.worker_port, 1),
            component_metrics_port=_int(
                env, "STREAMTRAIN_COMPONENT_METRICS_PORT", base.component_metrics_port, 1
            ),
            network_policy=policy == "true",
            operator_labels=labels or base.operator_labels,
            metrics_from=tuple(metrics_from),
            watch_timeout_seconds=_int(
                env, "STREAMTRAIN_WATCH_TIMEOUT_SECONDS", base.watch_timeout_seconds, 1
            ),
            request_timeout_seconds=_int(
                env, "STREAMTRAIN_REQUEST_TIMEOUT_SECONDS", base.request_timeout_seconds, 1
            ),
            ready_timeout_seconds=_int(
                env, "STREAMTRAIN_READY_TIMEOUT_SECONDS", base.ready_timeout_seconds, 1
            ),
            restart_poll_seconds=_seconds(
                env, "STREAMTRAIN_RESTART_POLL_SECONDS", base.restart_poll_seconds
            ),
            kube_server=env.get("STREAMTRAIN_KUBE_SERVER") or None,
            endpoint_map={str(k): str(v) for k, v in endpoint_map.items()},
        )

    def options(self) -> resources.Options:
        return resources.Options(
            ps_port=self.ps_port,
            worker_port=self.worker_port,
            metrics_port=self.component_metrics_port,
            network_policy=self.network_policy,
            operator_namespace=self.namespace,
            operator_labels=dict(self.operator_labels),
            metrics_from=self.metrics_from,
        )


def configure(settings: kopf.OperatorSettings, cfg: OperatorConfig) -> None:
    """kopf settings, chosen once: prefixes, timeouts, no scanning, quiet event posting."""
    settings.persistence.finalizer = FINALIZER
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=PREFIX)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=PREFIX, key="last-handled-configuration"
    )
    settings.watching.server_timeout = cfg.watch_timeout_seconds
    settings.watching.client_timeout = cfg.watch_timeout_seconds + 60
    settings.networking.request_timeout = cfg.request_timeout_seconds
    settings.networking.connect_timeout = min(10, cfg.request_timeout_seconds)
    # We know our one resource; scanning CRDs and namespaces would need more RBAC.
    settings.scanning.disabled = True
    # Handler logs become Events only for problems; we post the lifecycle events ourselves.
    settings.posting.level = logging.WARNING


def api_client(cfg: OperatorConfig) -> client.ApiClient:
    """The kubernetes client for ``kube.py``: in-cluster, else kubeconfig, else a URL."""
    configuration = client.Configuration()
    if cfg.kube_server:
        configuration.host = cfg.kube_server
    else:
        try:
            config.load_incluster_config(client_configuration=configuration)
        except config.ConfigException:
            config.load_kube_config(client_configuration=configuration)
    return client.ApiClient(configuration)


def build_runtime(cfg: OperatorConfig, registry: CollectorRegistry) -> Runtime:
    return Runtime(
        kube=Kube(api_client(cfg), request_timeout=cfg.request_timeout_seconds),
        metrics=OperatorMetrics(registry),
        options=cfg.options(),
        connector=GrpcConnector(cfg.endpoint_map),
        ready_timeout=cfg.ready_timeout_seconds,
        restart_poll_seconds=cfg.restart_poll_seconds,
    )


@kopf.on.startup()
async def startup(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    cfg = OperatorConfig.from_env(os.environ)
    configure(settings, cfg)
    registry = CollectorRegistry()
    memo.config = cfg
    memo.runtime = build_runtime(cfg, registry)
    memo.metrics_server = (
        start_http_server(cfg.metrics_port, registry=registry) if cfg.metrics_port else None
    )


@kopf.on.cleanup()
async def cleanup(memo: kopf.Memo, **_: Any) -> None:
    server = memo.get("metrics_server")
    if server is not None:
        httpd, thread = server
        httpd.shutdown()
        httpd.server_close()
        thread.join(timeout=5)
    runtime: Runtime | None = memo.get("runtime")
    if runtime is not None and isinstance(runtime.kube, Kube):
        runtime.kube.api.close()


@kopf.on.login()
def login(memo: kopf.Memo, **kwargs: Any) -> kopf.ConnectionInfo | None:
    """kopf's own connection: the configured URL (tests), else the kubernetes client's
    (in-cluster or kubeconfig). kopf logs in after the startup handler set ``memo.config``."""
    cfg: OperatorConfig = memo.config
    if cfg.kube_server:
        return kopf.ConnectionInfo(
            server=cfg.kube_server, insecure=True, default_namespace="default"
        )
    return kopf.login_via_client(memo=memo, **kwargs)


kopf.on.create(**RESOURCE)(handlers.reconcile)
kopf.on.resume(**RESOURCE)(handlers.reconcile)
kopf.on.update(**RESOURCE, field="spec")(handlers.reconcile)
kopf.daemon(**RESOURCE, cancellation_timeout=10.0)(handlers.run_job)
kopf.on.delete(**RESOURCE)(handlers.forget)
