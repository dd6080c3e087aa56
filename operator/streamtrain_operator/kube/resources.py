"""Pure builders: the Kubernetes objects of one StreamingTrainingJob, from its typed spec.

Nothing here talks to the API server (that is ``kube.py``) and nothing reads the clock, so
every object is a deterministic function of its inputs and tests compare plain dicts.

Per job (``<job>`` is ``metadata.name``):

- ``ConfigMap <job>-config`` — the rendered component configs (``ps.json``, ``worker.json``);
- ``StatefulSet <job>-ps`` + headless ``Service <job>-ps`` — shard ``i`` is the pod
  ``<job>-ps-<i>``, reachable as ``<job>-ps-<i>.<job>-ps.<ns>.svc`` from the moment it
  exists (``publishNotReadyAddresses``), so the scheduler can address a shard that is
  still loading;
- ``StatefulSet <job>-worker`` + headless ``Service <job>-worker`` — the same for workers;
- ``NetworkPolicy <job>-ps`` (optional) — only this job's pods and the operator reach the PS
  port;
- ``NetworkPolicy <job>-worker`` (optional) — only the operator reaches the worker control
  port (RunPass/ExportDense write models with the job's credentials and fence generations);
- ``Certificate <job>-tls`` (``tls: cert-manager``) — the job's identity for mutual TLS,
  issued into the Secret ``<job>-tls`` (with ``tls: secret`` the user provides that Secret).
  PS and worker pods mount it; PS shards admit pulls and pushes from the job's identity and
  control calls from the operator's only, workers admit the operator's only.

Every object carries an owner reference to the job (deleting the job deletes them), the
same label set (selectable by job, role and restart generation) and no secret material:
storage credentials enter pods only through ``envFrom`` of ``spec.storageSecretRef``.
Pods run as a fixed non-root uid with a read-only root filesystem, no privilege escalation,
no capabilities and no service-account token (they never call the API server).
"""

from __future__ import annotations

import hashlib
import ipaddress
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Literal

from streamtrain_operator.job.render import ps_memory_limit
from streamtrain_operator.job.spec import API_VERSION, KIND, Job, ResourcesSpec, SpecError
from streamtrain_operator.kube.disk_tier import DISK_DIR, disk_volume
from streamtrain_ps.plumbing.settings import setting
from streamtrain_ps.proto import ps_pb2
from streamtrain_worker.proto import worker_pb2

#: Pods of every image run as this uid/gid (the images create it; see docs/images.md).
RUN_AS_UID = 65532
CONFIG_DIR = "/etc/streamtrain"
PS_CONFIG_FILE = "ps.json"
WORKER_CONFIG_FILE = "worker.json"
#: The fully qualified gRPC services whose health the readiness probes ask for (from the
#: protos, so a package rename cannot leave every pod unready).
PS_HEALTH_SERVICE: str = ps_pb2.DESCRIPTOR.services_by_name["ParameterServer"].full_name
WORKER_HEALTH_SERVICE: str = worker_pb2.DESCRIPTOR.services_by_name["Worker"].full_name
MANAGED_BY = "streamtrain-operator"
LABEL_JOB = "streamtrain.io/job"
LABEL_ROLE = "streamtrain.io/role"
LABEL_GENERATION = "streamtrain.io/generation"
ANNOTATION_CONFIG_HASH = "streamtrain.io/config-hash"
#: A StatefulSet's name + "-" + 10-char revision hash must fit a 63-char label value.
MAX_STATEFULSET_NAME = 52
ROLES = ("ps", "worker")
TLS_DIR = "/etc/streamtrain/tls"
TLSMode = Literal["off", "cert-manager", "secret"]


@dataclass(frozen=True)
class Options:
    """Operator-wide settings that are not part of any job's spec (from the chart)."""

    ps_port: int = setting(50051, "gRPC port of the PS pods.", minimum=1)
    worker_port: int = setting(50061, "gRPC port of the worker pods.", minimum=1)
    metrics_port: int = setting(9100, "Port of the PS and worker pods' /metrics.", minimum=1)
    network_policy: bool = setting(
        True, "Render the per-job NetworkPolicy (the chart's networkPolicy.enabled)."
    )
    #: Where the operator runs: the NetworkPolicy lets it in.
    operator_namespace: str = "streamtrain-system"
    operator_labels: dict[str, str] = setting(
        {"app.kubernetes.io/name": "streamtrain"},
        "How the operator's pod is labelled (JSON object): the jobs' NetworkPolicy lets it in.",
    )
    metrics_from: tuple[dict[str, Any], ...] = setting(
        (),
        "NetworkPolicyPeer objects allowed to scrape the jobs' metrics (JSON list); empty: anyone.",
    )
    image_registries: tuple[str, ...] = setting(
        (),
        "Prefixes job images must start with, e.g. registry.example.com/ml/ (JSON list); a "
        "job naming another image is refused (SpecValid=False naming the field). Empty: any.",
    )
    storage_egress: tuple[dict[str, Any], ...] = setting(
        (
            {
                "to": [{"ipBlock": {"cidr": "0.0.0.0/0"}}],
                "ports": [{"port": 443, "protocol": "TCP"}],
            },
        ),
        "NetworkPolicyEgressRule objects: where PS and worker pods may reach their storage "
        "(JSON list). Cloud metadata addresses are always cut out of every ipBlock.",
    )
    default_ps_resources: dict[str, Any] = setting(
        {"requests": {"cpu": "1", "memory": "4Gi"}, "limits": {"memory": "4Gi"}},
        "Resources of a job's PS containers when spec.ps.resources is empty (JSON object; "
        "the PS caps its tables below the memory limit, spilling to its disk tier).",
    )
    default_worker_resources: dict[str, Any] = setting(
        {"requests": {"cpu": "1", "memory": "2Gi"}, "limits": {"memory": "4Gi"}},
        "Resources of a job's worker containers when spec.workers.resources is empty.",
    )
    default_disk_limit: int = setting(
        20 << 30,
        "spec.ps.diskLimit of a capped PS that sets none: its disk tier's bytes (the "
        "volume's sizeLimit adds headroom).",
        minimum=1,
    )
    #: Cluster DNS suffix of Services.
    cluster_domain: str = "svc"
    tls: TLSMode = setting(
        "off",
        "Mutual TLS between the operator, PS shards and workers: cert-manager (the operator "
        "requests each job's Certificate), secret (the user provides the Secret <job>-tls "
        "with tls.crt, tls.key, ca.crt) or off (plaintext). The chart turns it on.",
    )
    tls_issuer: dict[str, Any] = setting(
        {"kind": "Issuer", "name": "streamtrain-ca"},
        "cert-manager issuerRef of the jobs' Certificates (JSON object).",
    )
    operator_identity: str = setting(
        "streamtrain-operator",
        "DNS name in the operator's certificate: the one identity PS shards and workers "
        "admit control calls from.",
        min_length=1,
    )
    health_port: int = setting(
        50070,
        "With TLS: plaintext gRPC health port of PS and worker pods (kubelet probes speak no TLS).",
        minimum=1,
    )


@dataclass(frozen=True)
class Owner:
    """The job object that owns every child (from the custom resource's metadata)."""

    name: str
    uid: str

    def reference(self) -> dict[str, Any]:
        return {
            "apiVersion": API_VERSION,
            "kind": KIND,
            "name": self.name,
            "uid": self.uid,
            "controller": True,
            "blockOwnerDeletion": True,
        }


@dataclass(frozen=True)
class Scale:
    """Replica counts to render: the scheduler decides them, not the spec alone (suspend
    scales to zero, a worker change waits for the next pass)."""

    ps: int
    workers: int


# ----------------------------------------------------------------------------- defaults


def _defaulted(res: ResourcesSpec, default: Mapping[str, Any]) -> ResourcesSpec:
    """``res``, or the default when the spec leaves both requests and limits empty (a
    partial spec is the user's choice: mixing in defaults could put a request above a
    limit)."""
    if res.requests or res.limits:
        return res
    return ResourcesSpec(
        requests=dict(default.get("requests", {})), limits=dict(default.get("limits", {}))
    )


def with_defaults(job: Job, options: Options) -> Job:
    """The job as the operator runs it: no pod without requests and limits, no disk tier
    without a bound. The rendered PS config sees the same values, so a defaulted memory
    limit caps the shard's tables (``render.ps_memory_limit``) instead of OOM-killing it."""
    spec = job.spec
    ps = replace(spec.ps, resources=_defaulted(spec.ps.resources, options.default_ps_resources))
    workers = replace(
        spec.workers,
        resources=_defaulted(spec.workers.resources, options.default_worker_resources),
    )
    spec = replace(spec, ps=ps, workers=workers)
    if not ps.diskLimit and ps_memory_limit(spec):
        spec = replace(spec, ps=replace(ps, diskLimit=options.default_disk_limit))
    return replace(job, spec=spec)


# ----------------------------------------------------------------------------- naming


def config_map_name(job: Job) -> str:
    return f"{job.name}-config"


def statefulset_name(job: Job, role: str) -> str:
    return f"{job.name}-{role}"


def service_name(job: Job, role: str) -> str:
    return statefulset_name(job, role)


def network_policy_name(job: Job) -> str:
    return f"{job.name}-ps"


def worker_network_policy_name(job: Job) -> str:
    return f"{job.name}-worker"


def tls_secret_name(job: Job) -> str:
    return f"{job.name}-tls"


def job_identity(job: Job) -> str:
    """The DNS name in the job's certificate: PS shards admit pulls and pushes from it."""
    return f"{job.name}.{job.namespace}.job.streamtrain.io"


def pod_dns_name(job: Job, role: str, index: int, options: Options) -> str:
    """Stable DNS name of pod ``index`` of ``role``: the scheduler dials these."""
    sts = statefulset_name(job, role)
    return f"{sts}-{index}.{service_name(job, role)}.{job.namespace}.{options.cluster_domain}"


def ps_addresses(job: Job, replicas: int, options: Options) -> list[str]:
    return [f"{pod_dns_name(job, 'ps', i, options)}:{options.ps_port}" for i in range(replicas)]


def worker_addresses(job: Job, replicas: int, options: Options) -> list[str]:
    return [
        f"{pod_dns_name(job, 'worker', i, options)}:{options.worker_port}" for i in range(replicas)
    ]


def check_name(job: Job) -> None:
    """Reject a job whose children's names would not be valid (names a field)."""
    longest = statefulset_name(job, "worker")
    if len(longest) > MAX_STATEFULSET_NAME:
        limit = MAX_STATEFULSET_NAME - len("-worker")
        raise SpecError("metadata.name", f"at most {limit} characters, got {len(job.name)}")


def check_images(job: Job, options: Options) -> None:
    """Reject a job whose images are outside the operator's registry allow-list: creating a
    job creates pods running its images with the job's Secret."""
    if not options.image_registries:
        return
    prefixes = [p.rstrip("/") + "/" for p in options.image_registries]
    for field, image in (("spec.image", job.spec.image), ("spec.psImage", job.spec.psImage)):
        if not any(image.startswith(p) for p in prefixes):
            raise SpecError(
                field,
                f"image {image!r} is not from an allowed registry ({', '.join(prefixes)})",
            )


# ----------------------------------------------------------------------------- labels


def selector_labels(job: Job, role: str | None = None) -> dict[str, str]:
    labels = {LABEL_JOB: job.name}
    if role is not None:
        labels[LABEL_ROLE] = role
    return labels


def labels(job: Job, role: str | None, generation: int) -> dict[str, str]:
    """Labels of every child. The generation (bumped on every recovery) is on the objects,
    not in the pod template: changing it must not roll every pod."""
    out = {
        "app.kubernetes.io/name": "streamtrain",
        "app.kubernetes.io/instance": job.name,
        "app.kubernetes.io/managed-by": MANAGED_BY,
        "app.kubernetes.io/part-of": "streamtrain",
        **selector_labels(job, role),
        LABEL_GENERATION: str(generation),
    }
    if role is not None:
        out["app.kubernetes.io/component"] = role
    return out


def _pod_labels(job: Job, role: str) -> dict[str, str]:
    return {k: v for k, v in labels(job, role, 0).items() if k != LABEL_GENERATION}


def _metadata(
    job: Job, name: str, role: str | None, generation: int, owner: Owner
) -> dict[str, Any]:
    return {
        "name": name,
        "namespace": job.namespace,
        "labels": labels(job, role, generation),
        "ownerReferences": [owner.reference()],
    }


# ----------------------------------------------------------------------------- objects


def config_map(
    job: Job, configs: Mapping[str, str], generation: int, owner: Owner
) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": _metadata(job, config_map_name(job), None, generation, owner),
        "data": dict(sorted(configs.items())),
    }


def config_hash(configs: Mapping[str, str]) -> str:
    """Pods carry this so a config change rolls them (a ConfigMap edit alone would not)."""
    blob = json.dumps(dict(sorted(configs.items())), sort_keys=True).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


def headless_service(
    job: Job, role: str, generation: int, owner: Owner, options: Options
) -> dict[str, Any]:
    port = options.ps_port if role == "ps" else options.worker_port
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _metadata(job, service_name(job, role), role, generation, owner),
        "spec": {
            "clusterIP": "None",
            # Shards are dialled while they load a checkpoint (before they are Ready).
            "publishNotReadyAddresses": True,
            "selector": selector_labels(job, role),
            "ports": [
                {"name": "grpc", "port": port, "targetPort": "grpc", "protocol": "TCP"},
                {
                    "name": "metrics",
                    "port": options.metrics_port,
                    "targetPort": "metrics",
                    "protocol": "TCP",
                },
            ],
        },
    }


def _resources(requests: Mapping[str, str], limits: Mapping[str, str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if requests:
        out["requests"] = dict(requests)
    if limits:
        out["limits"] = dict(limits)
    return out


def _grpc_probe(port: int, service: str | None, period: int, failures: int) -> dict[str, Any]:
    probe: dict[str, Any] = {"grpc": {"port": port}}
    if service:
        probe["grpc"]["service"] = service
    probe.update({"periodSeconds": period, "timeoutSeconds": 5, "failureThreshold": failures})
    return probe


def tls_args(job: Job, role: str, options: Options) -> list[str]:
    """The TLS flags of a component: its certificate, the CA, and whom it admits."""
    if options.tls == "off":
        return []
    data = ["--tls-data-peer", job_identity(job)] if role == "ps" else []
    return [
        "--tls-cert", f"{TLS_DIR}/tls.crt",
        "--tls-key", f"{TLS_DIR}/tls.key",
        "--tls-ca", f"{TLS_DIR}/ca.crt",
        "--tls-control-peer", options.operator_identity,
        *data,
        "--health-port", str(options.health_port),
    ]  # fmt: skip


def container_args(job: Job, role: str, replicas: int, options: Options) -> list[str]:
    """The component's command line (also run as a local process by the contract test)."""
    tls = tls_args(job, role, options)
    if role == "ps":
        disk = ["--disk-path", DISK_DIR] if disk_volume(job) is not None else []
        return [
            "--host", "0.0.0.0",
            "--port", str(options.ps_port),
            "--config", f"{CONFIG_DIR}/{PS_CONFIG_FILE}",
            "--num-shards", str(replicas),
            "--shard-index-from-hostname",
            "--metrics-port", str(options.metrics_port),
            *disk,
            *tls,
        ]  # fmt: skip
    return [
        "--host", "0.0.0.0",
        "--port", str(options.worker_port),
        "--config", f"{CONFIG_DIR}/{WORKER_CONFIG_FILE}",
        "--metrics-port", str(options.metrics_port),
        *tls,
    ]  # fmt: skip


def pod_template(
    job: Job, role: str, replicas: int, configs: Mapping[str, str], options: Options
) -> dict[str, Any]:
    spec = job.spec
    is_ps = role == "ps"
    port = options.ps_port if is_ps else options.worker_port
    res = spec.ps.resources if is_ps else spec.workers.resources
    env: list[dict[str, Any]] = [
        {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        {"name": "POD_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
        # The root filesystem is read-only; libraries that cache under $HOME use the tmpfs.
        {"name": "HOME", "value": "/tmp"},
        {"name": "TMPDIR", "value": "/tmp"},
        {"name": "PYTHONUNBUFFERED", "value": "1"},
    ]
    if not is_ps:
        threads = str(spec.workers.numThreads)
        env += [{"name": "OMP_NUM_THREADS", "value": threads}]
    tls = options.tls != "off"
    # With TLS kubelet probes the plaintext health-only port (it speaks no TLS).
    probe_port = options.health_port if tls else port
    ports = [
        {"name": "grpc", "containerPort": port, "protocol": "TCP"},
        {"name": "metrics", "containerPort": options.metrics_port, "protocol": "TCP"},
    ]
    if tls:
        ports.append({"name": "health", "containerPort": options.health_port, "protocol": "TCP"})
    container: dict[str, Any] = {
        "name": role,
        "image": spec.psImage if is_ps else spec.image,
        "imagePullPolicy": "IfNotPresent",
        "command": ["python", "-m", "streamtrain_ps" if is_ps else "streamtrain_worker"],
        "args": container_args(job, role, replicas, options),
        "env": env,
        "ports": ports,
        # Readiness asks the PS service itself (NOT_SERVING while draining); liveness only
        # asks whether the process answers at all.
        "readinessProbe": _grpc_probe(
            probe_port, PS_HEALTH_SERVICE if is_ps else WORKER_HEALTH_SERVICE, 10, 3
        ),
        "livenessProbe": _grpc_probe(probe_port, None, 20, 6),
        "startupProbe": _grpc_probe(probe_port, None, 5, 60),
        "resources": _resources(res.requests, res.limits),
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True,
            "privileged": False,
            "runAsNonRoot": True,
            "capabilities": {"drop": ["ALL"]},
        },
        "volumeMounts": [
            {"name": "config", "mountPath": CONFIG_DIR, "readOnly": True},
            {"name": "tmp", "mountPath": "/tmp"},
        ],
    }
    if spec.storageSecretRef:
        container["envFrom"] = [{"secretRef": {"name": spec.storageSecretRef}}]
    volumes: list[dict[str, Any]] = [
        {"name": "config", "configMap": {"name": config_map_name(job)}},
        {"name": "tmp", "emptyDir": {"sizeLimit": "1Gi"}},
    ]
    if tls:
        container["volumeMounts"].append({"name": "tls", "mountPath": TLS_DIR, "readOnly": True})
        volumes.append(
            {"name": "tls", "secret": {"secretName": tls_secret_name(job), "defaultMode": 0o440}}
        )
    disk = disk_volume(job) if is_ps else None
    if disk is not None:
        container["volumeMounts"].append({"name": disk["name"], "mountPath": DISK_DIR})
        volumes.append(disk)
    return {
        "metadata": {
            "labels": _pod_labels(job, role),
            "annotations": {ANNOTATION_CONFIG_HASH: config_hash(configs)},
        },
        "spec": {
            "automountServiceAccountToken": False,
            "enableServiceLinks": False,
            # SIGTERM: the PS drains RPCs for its --grace (10 s) before exiting.
            "terminationGracePeriodSeconds": 30,
            "securityContext": {
                "runAsNonRoot": True,
                "runAsUser": RUN_AS_UID,
                "runAsGroup": RUN_AS_UID,
                "fsGroup": RUN_AS_UID,
                "seccompProfile": {"type": "RuntimeDefault"},
            },
            "containers": [container],
            "volumes": volumes,
        },
    }


def statefulset(
    job: Job,
    role: str,
    *,
    replicas: int,
    configs: Mapping[str, str],
    generation: int,
    owner: Owner,
    options: Options,
) -> dict[str, Any]:
    check_name(job)
    # The PS command line carries the shard count, which must not change with suspend's
    # scale-to-zero: render it from the spec, the replica count from the scheduler.
    rendered = job.spec.ps.replicas if role == "ps" else job.spec.workers.replicas
    return {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": _metadata(job, statefulset_name(job, role), role, generation, owner),
        "spec": {
            "replicas": replicas,
            "serviceName": service_name(job, role),
            # Shards and workers are peers, not an ordered quorum: start them all at once.
            "podManagementPolicy": "Parallel",
            "selector": {"matchLabels": selector_labels(job, role)},
            "updateStrategy": {"type": "RollingUpdate"},
            "template": pod_template(job, role, rendered, configs, options),
        },
    }


def certificate(job: Job, generation: int, owner: Owner, options: Options) -> dict[str, Any]:
    """The job's cert-manager Certificate: its identity (client side) and the names of its
    PS and worker pods (server side), into the Secret the pods mount."""
    return {
        "apiVersion": "cert-manager.io/v1",
        "kind": "Certificate",
        "metadata": _metadata(job, tls_secret_name(job), None, generation, owner),
        "spec": {
            "secretName": tls_secret_name(job),
            "dnsNames": [
                job_identity(job),
                *(
                    f"*.{service_name(job, r)}.{job.namespace}.{options.cluster_domain}"
                    for r in ROLES
                ),
            ],
            "usages": ["digital signature", "key encipherment", "server auth", "client auth"],
            "privateKey": {"algorithm": "ECDSA", "size": 256, "rotationPolicy": "Always"},
            "duration": "2160h",
            "renewBefore": "360h",
            "issuerRef": dict(options.tls_issuer),
        },
    }


def _operator_peer(options: Options) -> dict[str, Any]:
    return {
        "namespaceSelector": {
            "matchLabels": {"kubernetes.io/metadata.name": options.operator_namespace}
        },
        "podSelector": {"matchLabels": dict(options.operator_labels)},
    }


def _metrics_rule(options: Options) -> dict[str, Any]:
    rule: dict[str, Any] = {"ports": [{"port": options.metrics_port, "protocol": "TCP"}]}
    if options.metrics_from:
        rule["from"] = [dict(peer) for peer in options.metrics_from]
    return rule


def _health_rules(options: Options) -> list[dict[str, Any]]:
    """With TLS, the plaintext health port, open: it answers health and nothing else, and
    kubelet probes come from the node."""
    if options.tls == "off":
        return []
    return [{"ports": [{"port": options.health_port, "protocol": "TCP"}]}]


#: Instance-metadata services (AWS, GCP, Azure: 169.254.169.254; Alibaba; AWS over IPv6):
#: credentials of the node live there, so no job pod may reach them whatever the values say.
METADATA_CIDRS = ("169.254.169.254/32", "100.100.100.200/32", "fd00:ec2::254/128")


def _without_metadata(peer: Mapping[str, Any]) -> dict[str, Any]:
    """``peer`` with every metadata address inside its ipBlock added to ``except``."""
    block = peer.get("ipBlock")
    if block is None:
        return dict(peer)
    cidr = ipaddress.ip_network(block["cidr"], strict=False)
    cut = [
        m
        for m in METADATA_CIDRS
        if (net := ipaddress.ip_network(m)).version == cidr.version
        and net.subnet_of(cidr)  # type: ignore[arg-type]
        and net != cidr
    ]
    excepts = list(dict.fromkeys([*block.get("except", ()), *cut]))
    return {**peer, "ipBlock": {**block, **({"except": excepts} if excepts else {})}}


def _egress(job: Job, role: str, options: Options) -> list[dict[str, Any]]:
    """DNS, the storage endpoint (metadata addresses cut out) and, for workers, this job's
    PS shards: all a job pod ever dials."""
    rules: list[dict[str, Any]] = [
        {
            "to": [
                {
                    "namespaceSelector": {
                        "matchLabels": {"kubernetes.io/metadata.name": "kube-system"}
                    },
                    "podSelector": {"matchLabels": {"k8s-app": "kube-dns"}},
                }
            ],
            "ports": [{"port": 53, "protocol": "UDP"}, {"port": 53, "protocol": "TCP"}],
        }
    ]
    for rule in options.storage_egress:
        out = dict(rule)
        if "to" in rule:
            out["to"] = [_without_metadata(peer) for peer in rule["to"]]
        rules.append(out)
    if role == "worker":
        rules.append(
            {
                "to": [{"podSelector": {"matchLabels": selector_labels(job, "ps")}}],
                "ports": [{"port": options.ps_port, "protocol": "TCP"}],
            }
        )
    return rules


def network_policy(job: Job, generation: int, owner: Owner, options: Options) -> dict[str, Any]:
    """Only this job's pods and the operator reach the PS gRPC port; metrics stay open
    (or open to ``options.metrics_from``)."""
    operator_peer = _operator_peer(options)
    metrics_rule = _metrics_rule(options)
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": _metadata(job, network_policy_name(job), "ps", generation, owner),
        "spec": {
            "podSelector": {"matchLabels": selector_labels(job, "ps")},
            "policyTypes": ["Ingress", "Egress"],
            "egress": _egress(job, "ps", options),
            "ingress": [
                {
                    "ports": [{"port": options.ps_port, "protocol": "TCP"}],
                    "from": [{"podSelector": {"matchLabels": selector_labels(job)}}, operator_peer],
                },
                metrics_rule,
                *_health_rules(options),
            ],
        },
    }


def worker_network_policy(
    job: Job, generation: int, owner: Owner, options: Options
) -> dict[str, Any]:
    """Only the operator (the job's scheduler) reaches the worker control port: workers
    never call each other, and RunPass/ExportDense/Reset are control-plane calls — anyone
    else could export with the job's storage credentials or fence out the real scheduler
    with a high generation. Metrics as for the PS."""
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": _metadata(job, worker_network_policy_name(job), "worker", generation, owner),
        "spec": {
            "podSelector": {"matchLabels": selector_labels(job, "worker")},
            "policyTypes": ["Ingress", "Egress"],
            "egress": _egress(job, "worker", options),
            "ingress": [
                {
                    "ports": [{"port": options.worker_port, "protocol": "TCP"}],
                    "from": [_operator_peer(options)],
                },
                _metrics_rule(options),
                *_health_rules(options),
            ],
        },
    }


def build(
    job: Job,
    *,
    configs: Mapping[str, str],
    scale: Scale,
    generation: int,
    owner: Owner,
    options: Options,
) -> list[dict[str, Any]]:
    """Every child object of the job, in apply order (config first, pods last)."""
    check_name(job)
    objects = [config_map(job, configs, generation, owner)]
    if options.tls == "cert-manager":
        objects.append(certificate(job, generation, owner, options))
    if options.network_policy:
        objects.append(network_policy(job, generation, owner, options))
        objects.append(worker_network_policy(job, generation, owner, options))
    for role, replicas in (("ps", scale.ps), ("worker", scale.workers)):
        objects.append(headless_service(job, role, generation, owner, options))
        objects.append(
            statefulset(
                job,
                role,
                replicas=replicas,
                configs=configs,
                generation=generation,
                owner=owner,
                options=options,
            )
        )
    return objects


def object_key(obj: Mapping[str, Any]) -> tuple[str, str, str]:
    """(apiVersion/kind, namespace, name): how ``kube.py`` addresses an object."""
    meta = obj["metadata"]
    return f"{obj['apiVersion']}/{obj['kind']}", meta.get("namespace", ""), meta["name"]


def child_names(job: Job, options: Options) -> Sequence[tuple[str, str]]:
    """(kind, name) of every child, e.g. to delete the pods' owners at Succeeded."""
    out = [("ConfigMap", config_map_name(job))]
    if options.tls == "cert-manager":
        out.append(("Certificate", tls_secret_name(job)))
    if options.network_policy:
        out.append(("NetworkPolicy", network_policy_name(job)))
        out.append(("NetworkPolicy", worker_network_policy_name(job)))
    for role in ROLES:
        out += [("Service", service_name(job, role)), ("StatefulSet", statefulset_name(job, role))]
    return out
