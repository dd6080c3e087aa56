"""The Helm chart, linted and rendered offline with helm-python-sdk (the Helm Go SDK):
default and non-default values, the CRD identical to ``crds/``, least-privilege RBAC in
both scopes, monitors only when enabled, dashboards as labelled ConfigMaps, NOTES."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import celpy
import helm_python as helm
import pytest
import yaml

from streamtrain_operator.job.spec import load_job, parse_job
from streamtrain_operator.kube import resources as r
from streamtrain_tools.chart import objects as chart_objects
from streamtrain_tools.chart import render as render_chart

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "streamtrain"


def _render(values: dict[str, Any] | None = None) -> dict[str, str]:
    return render_chart(values)


def _objects(values: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    return chart_objects(values)


def _by_kind(objs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [o for o in objs if o["kind"] == kind]


@pytest.mark.parametrize(
    "values",
    [
        {},
        {"rbac": {"scope": "namespace"}, "watchNamespaces": ["a"], "crds": {"install": False}},
        {"rbac": {"scope": "cluster"}, "tls": {"mode": "off"}},
    ],
)
def test_chart_lints_clean_in_strict_mode(values: dict[str, Any]) -> None:
    report = helm.lint(CHART, values, strict=True, kube_version="v1.31.0")
    assert report["errors"] == []
    assert [m for m in report["messages"] if m["severity"] >= 2] == []


def test_values_schema_rejects_bad_values_and_accepts_the_defaults() -> None:
    with helm.Chart.load(CHART) as chart:
        chart.validate_schema({})
        for bad in (
            {"rbac": {"scope": "cluster-wide"}},
            {"psPort": 70000},
            {"metrics": {"podMonitor": {"enabled": "yes"}}},
            {"watchNamespaces": ["Not_A_Namespace"]},
            {"unknownKey": 1},
        ):
            with pytest.raises(helm.HelmValuesError):
                chart.validate_schema(bad)


def test_chart_crd_equals_crds_dir_and_is_kept_on_uninstall() -> None:
    committed = yaml.safe_load(
        (ROOT / "crds/streamtrain.io_streamingtrainingjobs.yaml").read_text()
    )
    (crd,) = _by_kind(_objects(), "CustomResourceDefinition")
    annotations = crd["metadata"]["annotations"]
    assert annotations.pop("helm.sh/resource-policy") == "keep"
    assert crd == committed
    (not_kept,) = _by_kind(_objects({"crds": {"keep": False}}), "CustomResourceDefinition")
    assert not_kept == committed
    assert _by_kind(_objects({"crds": {"install": False}}), "CustomResourceDefinition") == []


def test_operator_deployment_single_replica_recreate_liveness_and_locked_down() -> None:
    (dep,) = _by_kind(_objects(), "Deployment")
    spec = dep["spec"]
    assert spec["replicas"] == 1
    assert spec["strategy"] == {"type": "Recreate"}
    pod = spec["template"]["spec"]
    (c,) = pod["containers"]
    assert c["image"] == "registry.example.com/streamtrain-operator:0.1.0"
    assert "--liveness=http://0.0.0.0:8080/healthz" in c["args"]
    assert "--namespace=streamtrain-system" in c["args"]  # namespace scope by default
    assert c["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "liveness"}
    assert c["securityContext"]["readOnlyRootFilesystem"] is True
    assert c["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert pod["securityContext"]["runAsNonRoot"] is True
    env = {e["name"]: e.get("value") for e in c["env"]}
    assert env["STREAMTRAIN_PS_PORT"] == "50051"
    assert json.loads(env["STREAMTRAIN_OPERATOR_LABELS"]) == spec["selector"]["matchLabels"]


def _rules(role: dict[str, Any]) -> dict[tuple[str, str], set[str]]:
    out: dict[tuple[str, str], set[str]] = {}
    for rule in role["rules"]:
        for group in rule["apiGroups"]:
            for res in rule["resources"]:
                out.setdefault((group, res), set()).update(rule["verbs"])
    return out


def test_rbac_is_least_privilege_cluster_scope() -> None:
    objs = _objects({"rbac": {"scope": "cluster"}})
    (role,) = _by_kind(objs, "ClusterRole")
    rules = _rules(role)
    assert "*" not in {v for verbs in rules.values() for v in verbs}
    assert all(g != "*" and res != "*" for g, res in rules)
    assert ("", "secrets") not in rules  # pods read credentials themselves via envFrom
    assert rules[("", "pods")] == {"get", "list", "watch"}
    assert rules[("streamtrain.io", "streamingtrainingjobs/status")] == {"get", "patch", "update"}
    assert "delete" not in rules[("streamtrain.io", "streamingtrainingjobs")]
    assert ("networking.k8s.io", "networkpolicies") in rules
    (binding,) = _by_kind(objs, "ClusterRoleBinding")
    assert binding["subjects"][0]["namespace"] == "streamtrain-system"
    no_np = _rules(
        _by_kind(
            _objects({"rbac": {"scope": "cluster"}, "networkPolicy": {"enabled": False}}),
            "ClusterRole",
        )[0]
    )
    assert ("networking.k8s.io", "networkpolicies") not in no_np


def test_rbac_namespace_scope_renders_roles_per_watched_namespace() -> None:
    objs = _objects({"rbac": {"scope": "namespace"}, "watchNamespaces": ["ads", "ml"]})
    assert _by_kind(objs, "ClusterRole") == [] and _by_kind(objs, "ClusterRoleBinding") == []
    assert sorted(o["metadata"]["namespace"] for o in _by_kind(objs, "Role")) == ["ads", "ml"]
    assert sorted(o["metadata"]["namespace"] for o in _by_kind(objs, "RoleBinding")) == [
        "ads",
        "ml",
    ]
    (dep,) = _by_kind(objs, "Deployment")
    args = dep["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--all-namespaces" not in args
    assert [a for a in args if a.startswith("--namespace=")] == [
        "--namespace=ads",
        "--namespace=ml",
    ]
    default_ns = _objects({"rbac": {"scope": "namespace"}})
    assert [o["metadata"]["namespace"] for o in _by_kind(default_ns, "Role")] == [
        "streamtrain-system"
    ]


def test_monitors_render_only_when_enabled_with_their_labels() -> None:
    assert _by_kind(_objects(), "ServiceMonitor") == []
    assert _by_kind(_objects(), "PodMonitor") == []
    objs = _objects(
        {
            "metrics": {
                "serviceMonitor": {"enabled": True, "labels": {"release": "kps"}},
                "podMonitor": {"enabled": True, "labels": {"team": "ads"}, "namespaces": ["ads"]},
            }
        }
    )
    (sm,) = _by_kind(objs, "ServiceMonitor")
    assert sm["metadata"]["labels"]["release"] == "kps"
    (svc,) = _by_kind(objs, "Service")
    assert sm["spec"]["selector"]["matchLabels"].items() <= svc["metadata"]["labels"].items()
    assert sm["spec"]["endpoints"][0]["port"] == svc["spec"]["ports"][0]["name"] == "metrics"
    (pm,) = _by_kind(objs, "PodMonitor")
    assert pm["metadata"]["labels"]["team"] == "ads"
    assert pm["spec"]["namespaceSelector"] == {"matchNames": ["ads"]}
    # The operator labels its job pods managed-by streamtrain-operator, port "metrics".
    assert pm["spec"]["selector"]["matchLabels"] == {
        "app.kubernetes.io/managed-by": "streamtrain-operator"
    }
    assert pm["spec"]["podMetricsEndpoints"][0]["port"] == "metrics"


def test_dashboards_are_labelled_configmaps_with_valid_json() -> None:
    dashboards = sorted(p.name for p in (CHART / "dashboards").glob("*.json"))
    assert len(dashboards) >= 2
    maps = [
        o
        for o in _by_kind(_objects(), "ConfigMap")
        if "grafana_dashboard" in o["metadata"]["labels"]
    ]
    assert sorted(k for m in maps for k in m["data"]) == dashboards
    for m in maps:
        assert m["metadata"]["labels"]["grafana_dashboard"] == "1"
        for text in m["data"].values():
            board = json.loads(text)
            assert board["title"].startswith("streamtrain")
            assert board["panels"]
    assert [o for o in _by_kind(_objects({"dashboards": {"enabled": False}}), "ConfigMap")] == []
    elsewhere = _objects({"dashboards": {"namespace": "monitoring"}})
    assert {o["metadata"]["namespace"] for o in _by_kind(elsewhere, "ConfigMap")} == {"monitoring"}


def test_notes_tell_how_to_submit_a_job() -> None:
    notes = _render()["streamtrain/templates/NOTES.txt"]
    assert "kind: StreamingTrainingJob" in notes
    assert "kubectl -n <namespace> get stj" in notes
    assert "storageSecretRef" in notes
    # The sample in NOTES is itself a valid job.
    sample = notes.split("apply -f -\n", 1)[1].split("   YAML", 1)[0]
    manifest = yaml.safe_load("\n".join(line[3:] for line in sample.splitlines()))
    assert parse_job(manifest).spec.storageSecretRef == "s3-credentials"


def test_serving_renders_deployments_service_pdb_monitor_and_the_redis_secret() -> None:
    assert not [o for o in _objects() if "serving" in o["metadata"]["name"]]
    values = {
        "serving": {
            "enabled": True,
            "job": "ctr",
            "exportPath": "s3://bucket/models",
            "redis": {"existingSecret": "redis-auth"},
            "serviceMonitor": {"enabled": True},
            "guard": {"maxAucDrop": None, "copcMin": 0.8, "copcMax": 1.25},
        }
    }
    report = helm.lint(CHART, values, strict=True, kube_version="v1.31.0")
    assert report["errors"] == []
    objs = [o for o in _objects(values) if "serving" in o["metadata"]["name"]]
    kinds = sorted(o["kind"] for o in objs)
    assert kinds == ["Deployment", "Deployment", "PodDisruptionBudget", "Service", "ServiceMonitor"]
    serve, deliver = sorted(_by_kind(objs, "Deployment"), key=lambda d: d["metadata"]["name"])
    assert deliver["spec"]["replicas"] == 1 and deliver["spec"]["strategy"]["type"] == "Recreate"
    (container,) = serve["spec"]["template"]["spec"]["containers"]
    assert container["readinessProbe"]["httpGet"]["path"] == "/v2/health/ready"
    assert "--redis=$(STREAMTRAIN_REDIS_URL)" in container["args"]
    assert {"--max-auc-drop=-1", "--copc-min=0.8", "--copc-max=1.25"} <= set(container["args"])
    env = {e["name"]: e for e in container["env"]}
    assert env["STREAMTRAIN_REDIS_URL"]["valueFrom"]["secretKeyRef"] == {
        "name": "redis-auth",
        "key": "url",
    }
    (pdb,) = _by_kind(objs, "PodDisruptionBudget")
    labels = serve["spec"]["template"]["metadata"]["labels"]
    assert pdb["spec"]["selector"]["matchLabels"].items() <= labels.items()
    (svc,) = _by_kind(objs, "Service")
    assert svc["spec"]["selector"].items() <= labels.items()
    assert {p["name"] for p in svc["spec"]["ports"]} == {"http", "grpc"}
    # Without Redis: the embedded table, no delivery pod, no secret.
    embedded = {"serving": {"enabled": True, "exportPath": "/models", "redis": {"url": ""}}}
    objs = [o for o in _objects(embedded) if "serving" in o["metadata"]["name"]]
    (serve,) = _by_kind(objs, "Deployment")
    (container,) = serve["spec"]["template"]["spec"]["containers"]
    assert not any(a.startswith("--redis") for a in container["args"])
    with helm.Chart.load(CHART) as chart, pytest.raises(helm.HelmValuesError):
        chart.validate_schema({"serving": {"enabled": True, "redis": {"url": "http://x"}}})


def _env(deployment: dict[str, Any]) -> dict[str, str]:
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    return {e["name"]: e.get("value", "") for e in container["env"]}


def test_default_install_turns_mutual_tls_on_with_cert_manager() -> None:
    objs = _objects()
    (deployment,) = _by_kind(objs, "Deployment")
    env = _env(deployment)
    assert env["STREAMTRAIN_TLS"] == "cert-manager"
    assert env["STREAMTRAIN_TLS_DIR"] == "/etc/streamtrain/tls"
    assert json.loads(env["STREAMTRAIN_TLS_ISSUER"]) == {"kind": "Issuer", "name": "streamtrain-ca"}
    pod = deployment["spec"]["template"]["spec"]
    (tls_volume,) = [v for v in pod["volumes"] if v["name"] == "tls"]
    certs = {c["metadata"]["name"]: c["spec"] for c in _by_kind(objs, "Certificate")}
    operator_cert = certs[tls_volume["secret"]["secretName"]]
    assert operator_cert["dnsNames"] == [env["STREAMTRAIN_OPERATOR_IDENTITY"]]
    assert operator_cert["usages"] == ["digital signature", "key encipherment", "client auth"]
    issuers = {i["metadata"]["name"] for i in _by_kind(objs, "Issuer")}
    assert "streamtrain-ca" in issuers  # the self-signed CA chain, createIssuer: true

    off = _objects({"tls": {"mode": "off"}})
    (deployment,) = _by_kind(off, "Deployment")
    assert _env(deployment)["STREAMTRAIN_TLS"] == "off"
    assert "STREAMTRAIN_TLS_DIR" not in _env(deployment)
    assert not _by_kind(off, "Certificate") and not _by_kind(off, "Issuer")

    own = _objects({"tls": {"mode": "secret", "operatorSecret": "my-operator-tls"}})
    (deployment,) = _by_kind(own, "Deployment")
    (tls_volume,) = [
        v for v in deployment["spec"]["template"]["spec"]["volumes"] if v["name"] == "tls"
    ]
    assert tls_volume["secret"]["secretName"] == "my-operator-tls"
    assert not _by_kind(own, "Certificate")


def test_default_install_is_namespace_scoped() -> None:
    objs = _objects()
    assert _by_kind(objs, "ClusterRole") == [] and _by_kind(objs, "ClusterRoleBinding") == []
    assert [o["metadata"]["namespace"] for o in _by_kind(objs, "Role")] == ["streamtrain-system"]
    (dep,) = _by_kind(objs, "Deployment")
    args = dep["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--all-namespaces" not in args and "--namespace=streamtrain-system" in args
    assert _by_kind(objs, "ValidatingAdmissionPolicy") == []


def _cel(value: Any) -> Any:
    """JSON to CEL values; booleans explicitly (``celpy.json_to_cel`` turns them into ints,
    bool being an int subclass)."""
    if isinstance(value, bool):
        return celpy.celtypes.BoolType(value)
    if isinstance(value, dict):
        return celpy.celtypes.MapType(
            {celpy.celtypes.StringType(k): _cel(v) for k, v in value.items()}
        )
    if isinstance(value, list):
        return celpy.celtypes.ListType([_cel(v) for v in value])
    return celpy.json_to_cel(value)


def _admit(policy: dict[str, Any], request: dict[str, Any]) -> list[str]:
    """The messages of the policy's failed validations for ``request`` (none: admitted),
    evaluated with cel-python as the API server would: match conditions, then variables."""
    env = celpy.Environment()

    def run(expression: str, activation: dict[str, Any]) -> Any:
        return env.program(env.compile(expression)).evaluate(activation)

    obj, old = request.get("object"), request.get("oldObject")
    activation: dict[str, Any] = {
        "request": _cel(request["request"]),
        "object": _cel(obj),
        "oldObject": _cel(old),
    }
    spec = policy["spec"]
    if not all(bool(run(c["expression"], activation)) for c in spec["matchConditions"]):
        return []
    variables: dict[str, Any] = {}
    for var in spec["variables"]:
        activation["variables"] = celpy.celtypes.MapType(
            {celpy.celtypes.StringType(k): v for k, v in variables.items()}
        )
        variables[var["name"]] = run(var["expression"], activation)
    activation["variables"] = celpy.celtypes.MapType(
        {celpy.celtypes.StringType(k): v for k, v in variables.items()}
    )
    return [v["message"] for v in spec["validations"] if not bool(run(v["expression"], activation))]


def test_cluster_scope_holds_the_operator_to_job_owned_token_free_pods() -> None:
    objs = _objects({"rbac": {"scope": "cluster"}})
    (policy,) = _by_kind(objs, "ValidatingAdmissionPolicy")
    (binding,) = _by_kind(objs, "ValidatingAdmissionPolicyBinding")
    assert binding["spec"] == {
        "policyName": policy["metadata"]["name"],
        "validationActions": ["Deny"],
    }
    (sa,) = _by_kind(objs, "ServiceAccount")
    user = f"system:serviceaccount:streamtrain-system:{sa['metadata']['name']}"
    job = load_job(ROOT / "crds/examples/minimal.yaml")
    built = r.build(
        job,
        configs={"ps.json": "{}", "worker.json": "{}"},
        scale=r.Scale(1, 1),
        generation=1,
        owner=r.Owner(job.name, "6f0e0c8a-4b8f-4d2e-8d43-0c6f1b2a9e11"),
        options=r.Options(),
    )
    sts = next(o for o in built if o["kind"] == "StatefulSet")

    def ask(obj: dict[str, Any], username: str = user, op: str = "CREATE") -> list[str]:
        req = {"operation": op, "userInfo": {"username": username}}
        if op == "DELETE":
            return _admit(policy, {"request": req, "object": None, "oldObject": obj})
        return _admit(policy, {"request": req, "object": obj, "oldObject": None})

    for obj in built:  # everything the operator builds is admitted
        assert ask(obj) == [], obj["kind"]
    assert ask(sts, op="DELETE") == []
    orphan = copy.deepcopy(sts)
    del orphan["metadata"]["ownerReferences"]
    assert ask(orphan) == [
        "the streamtrain operator may only write objects owned by a StreamingTrainingJob"
    ]
    assert ask(orphan, op="DELETE") != []
    assert ask(orphan, username="system:serviceaccount:kube-system:admin") == []  # not ours
    other_sa = copy.deepcopy(sts)
    other_sa["spec"]["template"]["spec"]["serviceAccountName"] = "cluster-admin-sa"
    assert ask(other_sa) == [
        "the streamtrain operator may not set a serviceAccountName on job pods"
    ]
    token = copy.deepcopy(sts)
    token["spec"]["template"]["spec"]["automountServiceAccountToken"] = True
    assert ask(token) == [
        "job pods must not mount an API token (automountServiceAccountToken false)"
    ]
