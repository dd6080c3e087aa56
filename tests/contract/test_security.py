"""Security properties of what we ship, asserted on the rendered objects (docs/security.md):

- PS and worker pods: no API token, non-root fixed uid, read-only root filesystem, no
  privilege escalation, every capability dropped, seccomp RuntimeDefault, no host namespaces
  or host paths; credentials only through ``envFrom`` of the job's Secret reference;
- NetworkPolicies: the PS port only from the job's pods and the operator, the worker control
  port only from the operator, every listening container port covered by a policy;
- the operator's RBAC: exactly the verbs its code uses (plus documented read/update
  tolerances), never Secrets, pods/exec or wildcards; only the operator gets a token;
- the images run as the fixed non-root uid;
- no credential in a URL, and no log call that formats a whole config, spec or environment;
- gRPC message and key-count limits on both servers.
"""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from streamtrain_operator.job import render
from streamtrain_operator.job.spec import SpecError, load_job, parse_job
from streamtrain_operator.kube import disk_tier
from streamtrain_operator.kube import resources as r
from streamtrain_ps.config import PSConfig
from streamtrain_ps.service.server import channel_options
from streamtrain_tools.chart import objects as chart_objects

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "streamtrain"
EXAMPLES = sorted((ROOT / "crds" / "examples").glob("*.yaml"))
OPTIONS = r.Options()


def _objects(example: Path) -> dict[str, dict[str, Any]]:
    job = load_job(example)
    configs = {
        r.PS_CONFIG_FILE: render.render_ps(job.spec),
        r.WORKER_CONFIG_FILE: render.render_worker(
            job.spec, r.ps_addresses(job, job.spec.ps.replicas, OPTIONS)
        ),
    }
    objs = r.build(
        job,
        configs=configs,
        scale=r.Scale(job.spec.ps.replicas, job.spec.workers.replicas),
        generation=1,
        owner=r.Owner(job.name, "uid-1"),
        options=OPTIONS,
    )
    return {f"{o['kind']}/{o['metadata']['name'].removeprefix(job.name + '-')}": o for o in objs}


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.name)
@pytest.mark.parametrize("role", ["ps", "worker"])
def test_pods_are_locked_down(example: Path, role: str) -> None:
    pod = _objects(example)[f"StatefulSet/{role}"]["spec"]["template"]["spec"]
    assert pod["automountServiceAccountToken"] is False  # they never call the API server
    assert pod["enableServiceLinks"] is False
    assert not {"hostNetwork", "hostPID", "hostIPC", "serviceAccountName"} & set(pod)
    psc = pod["securityContext"]
    assert psc["runAsNonRoot"] is True and psc["runAsUser"] == r.RUN_AS_UID != 0
    assert psc["runAsGroup"] != 0
    assert psc["seccompProfile"] == {"type": "RuntimeDefault"}
    assert all("hostPath" not in v for v in pod["volumes"])
    (container,) = pod["containers"]
    sc = container["securityContext"]
    assert sc["allowPrivilegeEscalation"] is False
    assert sc["readOnlyRootFilesystem"] is True
    assert sc["privileged"] is False
    assert sc["capabilities"] == {"drop": ["ALL"]}
    writable = [m["mountPath"] for m in container["volumeMounts"] if not m.get("readOnly")]
    # The only writable paths: an emptyDir with a size limit, and a PS's disk tier volume
    # (an emptyDir, or a PVC per pod) when it has a memory or disk limit.
    disk = disk_tier.disk_volume(load_job(example)) if role == "ps" else None
    assert writable == ["/tmp"] + ([disk_tier.DISK_DIR] if disk is not None else [])
    (tmp,) = [v for v in pod["volumes"] if v["name"] == "tmp"]
    assert tmp["emptyDir"]["sizeLimit"]
    assert [v for v in pod["volumes"] if v["name"] == "disk-tier"] == ([disk] if disk else [])


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.name)
def test_credentials_only_by_secret_reference(example: Path) -> None:
    job = load_job(example)
    objs = _objects(example)
    for role in ("ps", "worker"):
        (container,) = objs[f"StatefulSet/{role}"]["spec"]["template"]["spec"]["containers"]
        secret_like = re.compile(r"SECRET|PASSWORD|TOKEN|KEY|CREDENTIAL", re.IGNORECASE)
        for env in container["env"]:
            assert not secret_like.search(env["name"]), f"{role}: literal env {env['name']}"
            assert "secretKeyRef" not in env.get("valueFrom", {})
        if job.spec.storageSecretRef:
            assert container["envFrom"] == [{"secretRef": {"name": job.spec.storageSecretRef}}]
        else:
            assert "envFrom" not in container
    rendered = json.dumps(objs["ConfigMap/config"]["data"])
    assert not re.search(r"(?i)secret|password|aws_|token", rendered), "secret-ish config"


def test_credentials_in_a_url_are_refused_naming_the_field() -> None:
    manifest = yaml.safe_load((ROOT / "crds/examples/ctr-online.yaml").read_text())
    for field in ("data", "checkpoint", "export"):
        bad = json.loads(json.dumps(manifest))
        bad["spec"][field]["path"] = "s3://AKIAEXAMPLE:wJalrXUtnFEMI@bucket/models"
        with pytest.raises(SpecError) as err:
            parse_job(bad)
        assert err.value.path == f"spec.{field}.path"
        assert "wJalrXUtnFEMI" not in str(err.value)  # the message does not echo the secret
    ok = json.loads(json.dumps(manifest))
    ok["spec"]["checkpoint"]["path"] = "hdfs://namenode:8020/ckpt"  # host:port is no password
    parse_job(ok)


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.name)
def test_network_policies_admit_only_the_job_and_the_operator(example: Path) -> None:
    objs = _objects(example)
    job = load_job(example)
    job_peer = {"podSelector": {"matchLabels": {r.LABEL_JOB: job.name}}}
    operator_peer = {
        "namespaceSelector": {
            "matchLabels": {"kubernetes.io/metadata.name": OPTIONS.operator_namespace}
        },
        "podSelector": {"matchLabels": dict(OPTIONS.operator_labels)},
    }
    allowed = {"ps": [job_peer, operator_peer], "worker": [operator_peer]}
    for role, port in (("ps", OPTIONS.ps_port), ("worker", OPTIONS.worker_port)):
        policy = objs[f"NetworkPolicy/{role}"]["spec"]
        assert policy["policyTypes"] == ["Ingress", "Egress"]
        assert policy["podSelector"]["matchLabels"] == {r.LABEL_JOB: job.name, r.LABEL_ROLE: role}
        by_port = {rule["ports"][0]["port"]: rule for rule in policy["ingress"]}
        assert by_port[port]["from"] == allowed[role]
        # Every port the container listens on is covered by a rule of its policy.
        (c,) = objs[f"StatefulSet/{role}"]["spec"]["template"]["spec"]["containers"]
        assert {p["containerPort"] for p in c["ports"]} == set(by_port)
        labels = objs[f"StatefulSet/{role}"]["spec"]["template"]["metadata"]["labels"]
        assert policy["podSelector"]["matchLabels"].items() <= labels.items()
        # Egress: DNS, the storage rule (metadata cut out), workers also their job's PS.
        egress = policy["egress"]
        assert {(p["port"], p["protocol"]) for p in egress[0]["ports"]} == {
            (53, "UDP"),
            (53, "TCP"),
        }
        blocks = [
            peer["ipBlock"] for rule in egress for peer in rule.get("to", ()) if "ipBlock" in peer
        ]
        assert blocks and all("169.254.169.254/32" in b["except"] for b in blocks)
        in_job = [rule for rule in egress if rule["ports"][0]["port"] == OPTIONS.ps_port]
        if role == "worker":
            assert in_job == [
                {
                    "to": [
                        {
                            "podSelector": {
                                "matchLabels": {r.LABEL_JOB: job.name, r.LABEL_ROLE: "ps"}
                            }
                        }
                    ],
                    "ports": [{"port": OPTIONS.ps_port, "protocol": "TCP"}],
                }
            ]
        else:
            assert in_job == []


# -- the operator: RBAC, token, image ----------------------------------------------------------

#: What the operator's code does with the API (docs/security.md lists why, call by call).
NEEDED: dict[tuple[str, str], set[str]] = {
    ("streamtrain.io", "streamingtrainingjobs"): {"get", "list", "watch", "patch"},
    ("streamtrain.io", "streamingtrainingjobs/status"): {"patch"},
    ("apps", "statefulsets"): {"create", "patch", "delete"},
    ("", "services"): {"create", "patch", "delete"},
    ("", "configmaps"): {"create", "patch", "delete"},
    ("networking.k8s.io", "networkpolicies"): {"create", "patch", "delete"},
    # tls.mode=cert-manager (the default): each job's Certificate (kube.api._Certificates).
    ("cert-manager.io", "certificates"): {"create", "patch", "delete"},
    ("", "pods"): {"list"},
    ("", "events"): {"create"},
    ("coordination.k8s.io", "leases"): {"get", "create", "patch"},
}
#: Granted beyond NEEDED, harmless: reads, and update (the same power as patch).
TOLERATED = {"get", "list", "watch", "update"}


def _chart_objects(values: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    return chart_objects(values)


@pytest.mark.parametrize("scope", ["cluster", "namespace"])
def test_operator_rbac_is_what_the_code_needs(scope: str) -> None:
    objs = _chart_objects({"rbac": {"scope": scope}})
    kind = "ClusterRole" if scope == "cluster" else "Role"
    roles = [o for o in objs if o["kind"] == kind]
    assert roles
    for role in roles:
        granted: dict[tuple[str, str], set[str]] = {}
        for rule in role["rules"]:
            for group in rule["apiGroups"]:
                for res in rule["resources"]:
                    granted.setdefault((group, res), set()).update(rule["verbs"])
        for key, verbs in NEEDED.items():
            assert verbs <= granted.get(key, set()), f"{key}: the operator needs {verbs}"
        for key, verbs in granted.items():
            extra = verbs - NEEDED.get(key, set())
            assert extra <= TOLERATED, f"{key}: {extra} is more than the operator needs"
            assert "*" not in verbs and "*" not in key
        assert not {k for k in granted if k[1] in ("secrets", "pods/exec", "pods/attach")}


def test_only_the_operator_pod_gets_an_api_token() -> None:
    pods = [
        o["spec"]["template"]["spec"]
        for o in _chart_objects()
        if o["kind"] in ("Deployment", "StatefulSet", "DaemonSet", "Job")
    ]
    (operator,) = pods
    assert operator["automountServiceAccountToken"] is True
    assert operator["securityContext"]["runAsNonRoot"] is True
    (c,) = operator["containers"]
    assert c["securityContext"]["allowPrivilegeEscalation"] is False
    assert c["securityContext"]["readOnlyRootFilesystem"] is True
    assert c["securityContext"]["capabilities"] == {"drop": ["ALL"]}


@pytest.mark.parametrize("dockerfile", ["Dockerfile.ps", "Dockerfile.worker"])
def test_images_run_as_the_fixed_non_root_uid(dockerfile: str) -> None:
    stages: dict[str, list[str]] = {}
    current = ""
    for line in (ROOT / dockerfile).read_text().splitlines():
        m = re.match(r"FROM\s+\S+(?:\s+AS\s+(\S+))?", line.strip(), re.IGNORECASE)
        if m:
            current = m.group(1) or f"stage{len(stages)}"
            stages[current] = []
        elif current:
            stages[current].append(line.strip())
    final = [
        name for name, lines in stages.items() if any(x.startswith("ENTRYPOINT") for x in lines)
    ]
    assert final, f"{dockerfile}: no stage with an ENTRYPOINT"
    for name in final:
        users = [x for x in stages[name] if x.startswith("USER ")]
        assert users and users[-1] == f"USER {r.RUN_AS_UID}:{r.RUN_AS_UID}", (dockerfile, name)


# -- code: limits and logging -------------------------------------------------------------------


def test_grpc_servers_have_message_limits() -> None:
    from streamtrain_worker.control.service import MAX_MESSAGE_BYTES

    config = PSConfig()
    options = dict(channel_options(config))
    assert options["grpc.max_receive_message_length"] == config.maxMessageBytes <= 256 * 2**20
    assert options["grpc.max_send_message_length"] == config.maxMessageBytes
    assert 0 < config.maxKeysPerRequest <= config.maxMessageBytes // 8
    assert MAX_MESSAGE_BYTES <= 64 * 2**20


_LOG_METHODS = {"debug", "info", "warning", "error", "exception", "critical", "log"}
_LOGGERS = {"log", "logger", "logging", "LOG"}
#: Objects that carry settings or the environment: formatting one whole could leak secrets.
_WHOLE = {"config", "cfg", "spec", "body", "manifest", "environ", "env", "settings", "options"}


def _arg_is_whole(arg: ast.expr) -> str | None:
    """The name if ``arg`` is a whole settings object (``cfg``, ``self.config``, ``vars(x)``,
    ``os.environ``), not one field of it (``cfg.port``)."""
    if isinstance(arg, ast.Name) and arg.id in _WHOLE:
        return arg.id
    if isinstance(arg, ast.Attribute) and arg.attr in _WHOLE | {"__dict__"}:
        return arg.attr
    if isinstance(arg, ast.Call) and getattr(arg.func, "id", "") in ("vars", "asdict", "dict"):
        return getattr(arg.func, "id", "")
    if isinstance(arg, ast.Call) and getattr(arg.func, "attr", "") in ("to_json", "to_dict"):
        return getattr(arg.func, "attr", "")
    return None


def test_no_log_call_formats_a_whole_config_spec_or_environment() -> None:
    offenders = []
    for package in (
        "ps/streamtrain_ps",
        "worker/streamtrain_worker",
        "operator/streamtrain_operator",
    ):
        for path in sorted((ROOT / package).rglob("*.py")):
            tree = ast.parse(path.read_text(), str(path))
            for node in ast.walk(tree):
                if not (
                    isinstance(node, ast.Call)
                    and isinstance(node.func, ast.Attribute)
                    and node.func.attr in _LOG_METHODS
                    and isinstance(node.func.value, ast.Name)
                    and node.func.value.id in _LOGGERS
                ):
                    continue
                for arg in [*node.args[1:], *(k.value for k in node.keywords)]:
                    whole = _arg_is_whole(arg)
                    if whole is not None:
                        offenders.append(f"{path.relative_to(ROOT)}:{node.lineno}: {whole}")
    assert offenders == []
