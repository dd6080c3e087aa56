"""Resource builders as pure functions: names, DNS, labels, owner references, security,
credentials, probes, resources and the per-job NetworkPolicy."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import yaml

from streamtrain_operator.job.spec import Job, ResourcesSpec, SpecError, load_job, parse_job
from streamtrain_operator.kube import desired, disk_tier
from streamtrain_operator.kube import resources as r

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = {"ps.json": '{"tables": []}', "worker.json": '{"ps": []}'}
OWNER = r.Owner(name="ctr-online", uid="0b6a2f4e-6d1c-4d8e-9a8e-3f0e8c1d2b7a")
OPTIONS = r.Options(operator_namespace="streamtrain-system")


@pytest.fixture
def job() -> Job:
    return load_job(ROOT / "crds/examples/ctr-online.yaml")


def _build(job: Job, **kw: Any) -> dict[str, dict[str, Any]]:
    args: dict[str, Any] = {
        "configs": CONFIGS,
        "scale": r.Scale(ps=job.spec.ps.replicas, workers=job.spec.workers.replicas),
        "generation": 3,
        "owner": OWNER,
        "options": OPTIONS,
    }
    args.update(kw)
    return {f"{o['kind']}/{o['metadata']['name']}": o for o in r.build(job, **args)}


def test_names_are_deterministic_and_apply_order_puts_config_first(job: Job) -> None:
    objs = r.build(
        job, configs=CONFIGS, scale=r.Scale(2, 4), generation=3, owner=OWNER, options=OPTIONS
    )
    assert [f"{o['kind']}/{o['metadata']['name']}" for o in objs] == [
        "ConfigMap/ctr-online-config",
        "NetworkPolicy/ctr-online-ps",
        "NetworkPolicy/ctr-online-worker",
        "Service/ctr-online-ps",
        "StatefulSet/ctr-online-ps",
        "Service/ctr-online-worker",
        "StatefulSet/ctr-online-worker",
    ]
    again = r.build(
        job, configs=CONFIGS, scale=r.Scale(2, 4), generation=3, owner=OWNER, options=OPTIONS
    )
    assert objs == again
    assert [(k, n) for k, n in r.child_names(job, OPTIONS)] == [
        (o["kind"], o["metadata"]["name"]) for o in objs
    ]


def test_every_object_is_owned_by_the_job_and_labelled(job: Job) -> None:
    for obj in _build(job).values():
        meta = obj["metadata"]
        assert meta["namespace"] == "ads"
        (ref,) = meta["ownerReferences"]
        assert ref == {
            "apiVersion": "streamtrain.io/v1alpha1",
            "kind": "StreamingTrainingJob",
            "name": "ctr-online",
            "uid": OWNER.uid,
            "controller": True,
            "blockOwnerDeletion": True,
        }
        assert meta["labels"]["streamtrain.io/job"] == "ctr-online"
        assert meta["labels"]["streamtrain.io/generation"] == "3"
        assert meta["labels"]["app.kubernetes.io/managed-by"] == "streamtrain-operator"


def test_stable_dns_names_per_shard(job: Job) -> None:
    assert r.ps_addresses(job, 2, OPTIONS) == [
        "ctr-online-ps-0.ctr-online-ps.ads.svc:50051",
        "ctr-online-ps-1.ctr-online-ps.ads.svc:50051",
    ]
    assert r.worker_addresses(job, 1, OPTIONS) == [
        "ctr-online-worker-0.ctr-online-worker.ads.svc:50061"
    ]
    svc = _build(job)["Service/ctr-online-ps"]["spec"]
    assert svc["clusterIP"] == "None"
    assert svc["publishNotReadyAddresses"] is True
    assert svc["selector"] == {"streamtrain.io/job": "ctr-online", "streamtrain.io/role": "ps"}
    sts = _build(job)["StatefulSet/ctr-online-ps"]["spec"]
    assert sts["serviceName"] == "ctr-online-ps"
    assert sts["selector"]["matchLabels"] == svc["selector"]
    assert sts["template"]["metadata"]["labels"]["streamtrain.io/role"] == "ps"


def test_pods_are_locked_down(job: Job) -> None:
    for role in ("ps", "worker"):
        pod = _build(job)[f"StatefulSet/ctr-online-{role}"]["spec"]["template"]["spec"]
        assert pod["automountServiceAccountToken"] is False
        assert pod["securityContext"]["runAsNonRoot"] is True
        assert pod["securityContext"]["runAsUser"] == r.RUN_AS_UID
        (c,) = pod["containers"]
        sc = c["securityContext"]
        assert sc["readOnlyRootFilesystem"] is True
        assert sc["allowPrivilegeEscalation"] is False
        assert sc["capabilities"] == {"drop": ["ALL"]}
        # A writable /tmp is the only writable path.
        assert {m["mountPath"]: m.get("readOnly", False) for m in c["volumeMounts"]} == {
            "/etc/streamtrain": True,
            "/tmp": False,
        }


def test_credentials_only_through_the_secret_ref(job: Job) -> None:
    for role in ("ps", "worker"):
        (c,) = _build(job)[f"StatefulSet/ctr-online-{role}"]["spec"]["template"]["spec"][
            "containers"
        ]
        assert c["envFrom"] == [{"secretRef": {"name": "s3-credentials"}}]
        assert all("value" not in e or "SECRET" not in e["name"] for e in c["env"])
    no_secret = replace(job, spec=replace(job.spec, storageSecretRef=None))
    (c,) = _build(no_secret)["StatefulSet/ctr-online-ps"]["spec"]["template"]["spec"]["containers"]
    assert "envFrom" not in c


def test_commands_probes_and_resources(job: Job) -> None:
    ps = _build(job)["StatefulSet/ctr-online-ps"]["spec"]["template"]["spec"]["containers"][0]
    assert ps["image"] == "registry.example.com/streamtrain-ps:0.1.0"
    assert ps["command"] == ["python", "-m", "streamtrain_ps"]
    assert ps["args"][ps["args"].index("--num-shards") + 1] == "2"
    assert "--shard-index-from-hostname" in ps["args"]
    assert ps["args"][ps["args"].index("--config") + 1] == "/etc/streamtrain/ps.json"
    assert ps["readinessProbe"]["grpc"] == {
        "port": 50051,
        "service": "streamtrain.ps.v1.ParameterServer",
    }
    assert ps["livenessProbe"]["grpc"] == {"port": 50051}
    assert ps["resources"] == {"requests": {"cpu": "4", "memory": "32Gi"}}
    worker = _build(job)["StatefulSet/ctr-online-worker"]["spec"]["template"]["spec"]["containers"][
        0
    ]
    assert worker["image"] == "registry.example.com/streamtrain-worker:0.1.0"
    assert worker["command"] == ["python", "-m", "streamtrain_worker"]
    assert worker["resources"] == {"requests": {"cpu": "8", "memory": "16Gi"}}
    assert {"name": "OMP_NUM_THREADS", "value": "1"} in worker["env"]
    assert worker["readinessProbe"]["grpc"]["service"] == "streamtrain.worker.v1.Worker"


def test_scale_is_the_schedulers_but_the_shard_count_is_the_specs(job: Job) -> None:
    objs = _build(job, scale=r.Scale(ps=0, workers=0))
    ps = objs["StatefulSet/ctr-online-ps"]["spec"]
    assert ps["replicas"] == 0
    args = ps["template"]["spec"]["containers"][0]["args"]
    assert args[args.index("--num-shards") + 1] == "2"
    assert objs["StatefulSet/ctr-online-worker"]["spec"]["replicas"] == 0


def test_config_changes_roll_the_pods_but_generation_changes_do_not(job: Job) -> None:
    def template(objs: dict[str, dict[str, Any]]) -> Any:
        return objs["StatefulSet/ctr-online-ps"]["spec"]["template"]

    base = template(_build(job))
    assert template(_build(job, generation=4)) == base
    changed = template(_build(job, configs={**CONFIGS, "ps.json": "{}"}))
    assert changed != base
    assert changed["metadata"]["annotations"] != base["metadata"]["annotations"]
    assert _build(job)["ConfigMap/ctr-online-config"]["data"] == CONFIGS


def test_network_policy_admits_only_this_job_and_the_operator(job: Job) -> None:
    policy = _build(job)["NetworkPolicy/ctr-online-ps"]["spec"]
    assert policy["podSelector"]["matchLabels"] == {
        "streamtrain.io/job": "ctr-online",
        "streamtrain.io/role": "ps",
    }
    grpc, metrics = policy["ingress"]
    assert grpc["ports"] == [{"port": 50051, "protocol": "TCP"}]
    job_peer, operator_peer = grpc["from"]
    assert job_peer == {"podSelector": {"matchLabels": {"streamtrain.io/job": "ctr-online"}}}
    assert operator_peer["namespaceSelector"]["matchLabels"] == {
        "kubernetes.io/metadata.name": "streamtrain-system"
    }
    assert metrics == {"ports": [{"port": 9100, "protocol": "TCP"}]}
    without = _build(job, options=replace(OPTIONS, network_policy=False))
    assert "NetworkPolicy/ctr-online-ps" not in without


def test_a_name_too_long_for_a_statefulset_names_the_field(job: Job) -> None:
    long = replace(job, name="x" * 46)
    with pytest.raises(SpecError) as error:
        _build(long)
    assert error.value.path == "metadata.name"
    assert _build(replace(job, name="x" * 45))  # the longest that fits


def _ps_pod(job: Job, **ps: Any) -> dict[str, Any]:
    spec = replace(job.spec, ps=replace(job.spec.ps, **ps))
    pod: dict[str, Any] = _build(replace(job, spec=spec))["StatefulSet/ctr-online-ps"]
    return pod["spec"]["template"]["spec"]


def _disk_mounts(pod: dict[str, Any]) -> list[dict[str, Any]]:
    (c,) = pod["containers"]
    return [m for m in c["volumeMounts"] if m["name"] == "disk-tier"]


def test_a_disk_limit_gets_an_empty_dir_of_its_size_plus_headroom(job: Job) -> None:
    pod = _ps_pod(job, diskLimit=40 << 30)  # 40 GiB + a quarter for compactions
    assert _disk_mounts(pod) == [{"name": "disk-tier", "mountPath": disk_tier.DISK_DIR}]
    (disk,) = [v for v in pod["volumes"] if v["name"] == "disk-tier"]
    assert disk == {"name": "disk-tier", "emptyDir": {"sizeLimit": f"{50 << 10}Mi"}}
    args = pod["containers"][0]["args"]
    assert args[args.index("--disk-path") + 1] == disk_tier.DISK_DIR
    small = _ps_pod(job, diskLimit=100 << 20)  # headroom at least 256 MiB
    assert next(v for v in small["volumes"] if v["name"] == "disk-tier")["emptyDir"] == {
        "sizeLimit": "356Mi"
    }
    worker = _build(replace(job, spec=replace(job.spec, ps=replace(job.spec.ps, diskLimit=1))))
    (wc,) = worker["StatefulSet/ctr-online-worker"]["spec"]["template"]["spec"]["containers"]
    assert "--disk-path" not in wc["args"] and len(wc["volumeMounts"]) == 2


def test_a_storage_class_gets_a_generic_ephemeral_volume_per_pod(job: Job) -> None:
    pod = _ps_pod(job, diskLimit=8 << 30, diskStorageClass="local-ssd")
    (disk,) = [v for v in pod["volumes"] if v["name"] == "disk-tier"]
    assert disk == {
        "name": "disk-tier",
        "ephemeral": {
            "volumeClaimTemplate": {
                "spec": {
                    "accessModes": ["ReadWriteOnce"],
                    "storageClassName": "local-ssd",
                    "resources": {"requests": {"storage": f"{10 << 10}Mi"}},
                }
            }
        },
    }
    assert len(_disk_mounts(pod)) == 1


def test_a_memory_limit_alone_spills_to_the_node_s_disk_and_no_limit_gets_no_volume(
    job: Job,
) -> None:
    assert job.spec.ps.memoryLimit is None and "memory" not in job.spec.ps.resources.limits
    none = _ps_pod(job)
    assert _disk_mounts(none) == [] and "--disk-path" not in none["containers"][0]["args"]
    capped = _ps_pod(job, memoryLimit=24 << 30)
    assert [v for v in capped["volumes"] if v["name"] == "disk-tier"] == [
        {"name": "disk-tier", "emptyDir": {}}
    ]
    limits = replace(job.spec.ps.resources, limits={"memory": "32Gi"})  # memoryLimit from it
    assert len(_disk_mounts(_ps_pod(job, resources=limits))) == 1


def test_a_storage_class_without_a_disk_limit_is_refused_naming_the_field() -> None:
    text = (ROOT / "crds/examples/ctr-online.yaml").read_text()
    manifest = yaml.safe_load(text)
    manifest["spec"]["ps"]["diskStorageClass"] = "local-ssd"
    with pytest.raises(SpecError, match=r"spec\.ps\.diskStorageClass.*diskLimit > 0"):
        parse_job(manifest)


def test_tls_renders_the_job_certificate_flags_mount_and_health_probes(job: Job) -> None:
    options = replace(
        OPTIONS, tls="cert-manager", tls_issuer={"kind": "ClusterIssuer", "name": "ca"}
    )
    objs = {
        f"{o['kind']}/{o['metadata']['name']}": o
        for o in r.build(
            job, configs=CONFIGS, scale=r.Scale(2, 2), generation=1, owner=OWNER, options=options
        )
    }
    cert = objs[f"Certificate/{job.name}-tls"]["spec"]
    ns = job.namespace
    assert cert["secretName"] == f"{job.name}-tls"
    assert cert["issuerRef"] == {"kind": "ClusterIssuer", "name": "ca"}
    assert set(cert["dnsNames"]) == {
        r.job_identity(job),
        f"*.{job.name}-ps.{ns}.svc",
        f"*.{job.name}-worker.{ns}.svc",
    }
    assert {"server auth", "client auth"} <= set(cert["usages"])
    for role in r.ROLES:
        pod = objs[f"StatefulSet/{job.name}-{role}"]["spec"]["template"]["spec"]
        (c,) = pod["containers"]
        args = c["args"]
        assert args[args.index("--tls-ca") + 1] == f"{r.TLS_DIR}/ca.crt"
        assert args[args.index("--tls-control-peer") + 1] == "streamtrain-operator"
        # Only the PS admits the job's own pods (pulls and pushes); workers the operator only.
        assert ("--tls-data-peer" in args) == (role == "ps")
        if role == "ps":
            assert args[args.index("--tls-data-peer") + 1] == r.job_identity(job)
        assert {"name": "tls", "mountPath": r.TLS_DIR, "readOnly": True} in c["volumeMounts"]
        assert {
            "name": "tls",
            "secret": {"secretName": f"{job.name}-tls", "defaultMode": 0o440},
        } in pod["volumes"]
        for probe in ("readinessProbe", "livenessProbe", "startupProbe"):
            assert c[probe]["grpc"]["port"] == options.health_port
        policy = objs[f"NetworkPolicy/{job.name}-{role}"]["spec"]
        ports = {p["port"] for rule in policy["ingress"] for p in rule["ports"]}
        assert options.health_port in ports
    assert ("Certificate", f"{job.name}-tls") in r.child_names(job, options)
    # secret mode: the user's Secret is mounted, no Certificate is requested.
    plain = r.build(
        job,
        configs=CONFIGS,
        scale=r.Scale(1, 1),
        generation=1,
        owner=OWNER,
        options=replace(options, tls="secret"),
    )
    assert not [o for o in plain if o["kind"] == "Certificate"]


def test_metadata_addresses_are_cut_out_of_every_storage_ip_block(job: Job) -> None:
    options = replace(
        OPTIONS,
        storage_egress=(
            {"to": [{"ipBlock": {"cidr": "169.254.0.0/16", "except": ["169.254.1.0/24"]}}]},
            {"to": [{"ipBlock": {"cidr": "::/0"}}, {"podSelector": {}}]},
            {"to": [{"ipBlock": {"cidr": "10.0.0.0/8"}}]},
        ),
    )
    egress = _build(job, options=options)[f"NetworkPolicy/{job.name}-ps"]["spec"]["egress"]
    blocks = [p["ipBlock"] for rule in egress for p in rule.get("to", ()) if "ipBlock" in p]
    assert blocks == [
        {"cidr": "169.254.0.0/16", "except": ["169.254.1.0/24", "169.254.169.254/32"]},
        {"cidr": "::/0", "except": ["fd00:ec2::254/128"]},
        {"cidr": "10.0.0.0/8"},  # holds no metadata address: unchanged
    ]


def test_job_pods_get_default_resources_and_a_bounded_disk_tier() -> None:
    """The minimal example sets no resources: the operator runs it with the defaults (no
    BestEffort pod), the PS capped below the default memory limit and its disk tier's
    emptyDir bounded; a job that sets resources keeps its own."""
    job = load_job(ROOT / "crds/examples/minimal.yaml")
    assert not job.spec.ps.resources.requests and not job.spec.ps.resources.limits
    objs = {
        f"{o['kind']}/{o['metadata']['name']}": o
        for o in desired.desired(job, "uid", r.Scale(1, 1), 1, OPTIONS)
    }
    for role, default in (
        ("ps", OPTIONS.default_ps_resources),
        ("worker", OPTIONS.default_worker_resources),
    ):
        pod = objs[f"StatefulSet/{job.name}-{role}"]["spec"]["template"]["spec"]
        (c,) = pod["containers"]
        assert c["resources"] == default
        assert c["resources"]["requests"]["memory"] and c["resources"]["limits"]["memory"]
    pod = objs[f"StatefulSet/{job.name}-ps"]["spec"]["template"]["spec"]
    (disk,) = [v for v in pod["volumes"] if v["name"] == "disk-tier"]
    assert disk["emptyDir"]["sizeLimit"].endswith("Mi")
    ps_config = json.loads(objs[f"ConfigMap/{job.name}-config"]["data"]["ps.json"])
    assert 0 < ps_config["memoryLimit"] < 4 << 30
    assert ps_config["diskLimit"] == OPTIONS.default_disk_limit
    # Own resources are kept as they are.
    own = replace(
        job.spec,
        workers=replace(job.spec.workers, resources=ResourcesSpec(requests={"cpu": "2"})),
    )
    kept = r.with_defaults(replace(job, spec=own), OPTIONS)
    assert kept.spec.workers.resources == ResourcesSpec(requests={"cpu": "2"})
