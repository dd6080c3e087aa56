"""The operator's entry point: ``kopf run -m streamtrain_operator.main --standalone``.

Only wiring lives here (the crate-operator layout): settings are read from the environment
once, at startup, into a validated :class:`OperatorConfig` (each declared once with its
variable, parsed by ``streamtrain_ps.plumbing.settings.parse_env``); kopf is configured (our own
finalizer and annotation prefixes, chosen once and never changed — changing them would
orphan every existing job's finalizer; watch and request timeouts; no cluster scanning, so
the RBAC stays minimal); the :class:`~streamtrain_operator.kube.daemon.Runtime` is built and
put in kopf's memo; the handlers of ``handlers.py`` are registered.

``--standalone``: kopf's peering only pauses operators of lower priority (two of equal
priority both go on), so it is no fence; a job is driven only by the holder of its Lease
(``kube/lease.py``), whatever number of operator pods runs. ``--liveness`` is passed by the
chart.
"""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import kopf
from kubernetes import client, config
from prometheus_client import CollectorRegistry, start_http_server

from streamtrain_operator.kube import handlers
from streamtrain_operator.kube.api import GROUP, PLURAL, VERSION, Kube
from streamtrain_operator.kube.daemon import GrpcConnector, Runtime
from streamtrain_operator.kube.metrics import OperatorMetrics
from streamtrain_operator.kube.resources import Options, TLSMode
from streamtrain_ps.plumbing.settings import ConfigError, parse_env, same_as, setting
from streamtrain_ps.plumbing.tls import TLSFiles

PREFIX = "streamtrain.io"
FINALIZER = f"{PREFIX}/finalizer"
RESOURCE: dict[str, Any] = {"group": GROUP, "version": VERSION, "plural": PLURAL}


class SettingsError(ConfigError):
    """An environment setting is malformed; ``path`` is the variable's name."""


@dataclass(frozen=True)
class OperatorConfig:
    """Operator-wide settings (the chart sets them as environment variables)."""

    namespace: str = setting("default", "The operator's own namespace.", env="POD_NAMESPACE")
    metrics_port: int = setting(
        9090,
        "Port of the operator's /metrics; 0 turns it off.",
        minimum=0,
        env="STREAMTRAIN_METRICS_PORT",
    )
    ps_port: int = same_as(Options, "ps_port", env="STREAMTRAIN_PS_PORT")
    worker_port: int = same_as(Options, "worker_port", env="STREAMTRAIN_WORKER_PORT")
    component_metrics_port: int = same_as(
        Options, "metrics_port", env="STREAMTRAIN_COMPONENT_METRICS_PORT"
    )
    network_policy: bool = same_as(Options, "network_policy", env="STREAMTRAIN_NETWORK_POLICY")
    operator_labels: dict[str, str] = same_as(
        Options, "operator_labels", env="STREAMTRAIN_OPERATOR_LABELS"
    )
    metrics_from: tuple[dict[str, Any], ...] = same_as(
        Options, "metrics_from", env="STREAMTRAIN_METRICS_FROM"
    )
    image_registries: tuple[str, ...] = same_as(
        Options, "image_registries", env="STREAMTRAIN_IMAGE_REGISTRIES"
    )
    storage_egress: tuple[dict[str, Any], ...] = same_as(
        Options, "storage_egress", env="STREAMTRAIN_STORAGE_EGRESS"
    )
    default_ps_resources: dict[str, Any] = same_as(
        Options, "default_ps_resources", env="STREAMTRAIN_DEFAULT_PS_RESOURCES"
    )
    default_worker_resources: dict[str, Any] = same_as(
        Options, "default_worker_resources", env="STREAMTRAIN_DEFAULT_WORKER_RESOURCES"
    )
    default_disk_limit: int = same_as(
        Options, "default_disk_limit", env="STREAMTRAIN_DEFAULT_DISK_LIMIT"
    )
    tls: TLSMode = same_as(Options, "tls", env="STREAMTRAIN_TLS")
    tls_issuer: dict[str, Any] = same_as(Options, "tls_issuer", env="STREAMTRAIN_TLS_ISSUER")
    operator_identity: str = same_as(
        Options, "operator_identity", env="STREAMTRAIN_OPERATOR_IDENTITY"
    )
    health_port: int = same_as(Options, "health_port", env="STREAMTRAIN_HEALTH_PORT")
    tls_dir: str = setting(
        "",
        "Directory of the operator's own tls.crt, tls.key and ca.crt (its identity towards "
        "PS shards and workers); required unless tls is off.",
        env="STREAMTRAIN_TLS_DIR",
    )
    watch_timeout_seconds: int = setting(
        300, "Server-side timeout of a watch.", minimum=1, env="STREAMTRAIN_WATCH_TIMEOUT_SECONDS"
    )
    request_timeout_seconds: int = setting(
        60, "Timeout of one API request.", minimum=1, env="STREAMTRAIN_REQUEST_TIMEOUT_SECONDS"
    )
    ready_timeout_seconds: int = setting(
        10,
        "One attempt of waiting for a job's pods to answer gRPC health.",
        minimum=1,
        env="STREAMTRAIN_READY_TIMEOUT_SECONDS",
    )
    # 15 s is cheap for the API server; the operator fault tests
    # (tests/faults/test_operator_kill.py) poll faster so a killed PS pod is noticed
    # within their time budget.
    restart_poll_seconds: float = setting(
        15.0,
        "How often the supervisor lists a job's pods to notice a restarted PS or worker.",
        exclusive_minimum=0,
        env="STREAMTRAIN_RESTART_POLL_SECONDS",
    )
    pod_name: str | None = setting(
        None,
        "This operator's name in the jobs' driver Leases (the pod name; default: host name).",
        env="POD_NAME",
    )
    kube_server: str | None = setting(
        None,
        "API server URL for an operator outside the cluster without a kubeconfig (tests).",
        env="STREAMTRAIN_KUBE_SERVER",
    )
    endpoint_map: dict[str, str] = setting(
        {},
        "host:port rewrites for gRPC endpoints (JSON object; see GrpcConnector).",
        env="STREAMTRAIN_ENDPOINT_MAP",
    )

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> OperatorConfig:
        """Read every setting from its variable (unset or empty: the default)."""
        cfg = parse_env(cls, env, error=SettingsError)
        if cfg.tls != "off" and not cfg.tls_dir:
            raise SettingsError("STREAMTRAIN_TLS_DIR", f"required with STREAMTRAIN_TLS={cfg.tls}")
        return cfg

    def tls_files(self) -> TLSFiles | None:
        """The operator's certificate, the identity it calls PS shards and workers with."""
        if self.tls == "off":
            return None
        root = Path(self.tls_dir)
        return TLSFiles(cert=root / "tls.crt", key=root / "tls.key", ca=root / "ca.crt")

    def options(self) -> Options:
        return Options(
            ps_port=self.ps_port,
            worker_port=self.worker_port,
            metrics_port=self.component_metrics_port,
            network_policy=self.network_policy,
            operator_namespace=self.namespace,
            operator_labels=dict(self.operator_labels),
            metrics_from=self.metrics_from,
            image_registries=self.image_registries,
            storage_egress=self.storage_egress,
            default_ps_resources=dict(self.default_ps_resources),
            default_worker_resources=dict(self.default_worker_resources),
            default_disk_limit=self.default_disk_limit,
            tls=self.tls,
            tls_issuer=dict(self.tls_issuer),
            operator_identity=self.operator_identity,
            health_port=self.health_port,
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
        connector=GrpcConnector(cfg.endpoint_map, tls=cfg.tls_files()),
        ready_timeout=cfg.ready_timeout_seconds,
        restart_poll_seconds=cfg.restart_poll_seconds,
        identity=cfg.pod_name or f"{socket.gethostname()}-{os.getpid()}",
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
