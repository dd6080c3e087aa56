"""Every manifest we ship or the operator renders passes ``kubernetes-validate --strict``
(offline schemas bundled with the package), for the default and non-default chart values
and for every sample job."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from streamtrain_operator.job.spec import load_job
from streamtrain_operator.kube import resources as r
from streamtrain_tools.chart import objects as chart_objects

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "streamtrain"
KUBE_VERSION = "1.31.0"
#: Prometheus Operator kinds: not built into Kubernetes, so not in the bundled schemas
#: (tests/contract/test_chart.py checks their shape).
NOT_BUILT_IN = {"ServiceMonitor", "PodMonitor", "PrometheusRule", "Certificate", "Issuer"}
VALUE_SETS: dict[str, dict[str, Any]] = {
    "defaults": {},
    "cluster-scope": {
        "rbac": {"scope": "cluster"},
        "tls": {"mode": "secret", "operatorSecret": "op"},
    },
    "namespaced": {
        "rbac": {"scope": "namespace"},
        "watchNamespaces": ["ads", "ml"],
        "crds": {"install": False},
        "networkPolicy": {"enabled": False},
        "operator": {"logLevel": "verbose"},
    },
    "monitoring": {
        "metrics": {
            "serviceMonitor": {"enabled": True, "labels": {"release": "kps"}},
            "podMonitor": {"enabled": True, "namespaces": ["ads"]},
            "prometheusRule": {"enabled": True},
        },
        "dashboards": {"namespace": "monitoring", "labels": {"grafana_dashboard": "1"}},
        "image": {"tag": "0.1.1", "pullPolicy": "Always"},
        "imagePullSecrets": [{"name": "regcred"}],
        "nodeSelector": {"kubernetes.io/os": "linux"},
        "tolerations": [{"key": "dedicated", "operator": "Exists", "effect": "NoSchedule"}],
    },
}


def _chart_objects(values: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    return chart_objects(values)


def _validate(obj: dict[str, Any]) -> None:
    try:
        kubernetes_validate.validate(obj, KUBE_VERSION, strict=True)
    except kubernetes_validate.ValidationError as exc:
        pytest.fail(f"{obj['kind']}/{obj['metadata']['name']}: {exc.message} at {list(exc.path)}")


@pytest.mark.parametrize("values", VALUE_SETS.values(), ids=VALUE_SETS.keys())
def test_rendered_chart_is_valid(values: dict[str, Any]) -> None:
    objects = _chart_objects(values)
    assert objects
    for obj in objects:
        if obj["kind"] not in NOT_BUILT_IN:
            _validate(obj)


def test_the_crd_itself_is_valid() -> None:
    _validate(yaml.safe_load((ROOT / "crds/streamtrain.io_streamingtrainingjobs.yaml").read_text()))


@pytest.mark.parametrize(
    "example", sorted((ROOT / "crds/examples").glob("*.yaml")), ids=lambda p: p.name
)
@pytest.mark.parametrize("network_policy", [True, False])
def test_operator_rendered_objects_are_valid(example: Path, network_policy: bool) -> None:
    job = load_job(example)
    objects = r.build(
        job,
        configs={"ps.json": "{}", "worker.json": "{}"},
        scale=r.Scale(ps=job.spec.ps.replicas, workers=job.spec.workers.replicas),
        generation=1,
        owner=r.Owner(name=job.name, uid="6f0e0c8a-4b8f-4d2e-8d43-0c6f1b2a9e11"),
        options=r.Options(
            network_policy=network_policy,
            metrics_from=({"namespaceSelector": {"matchLabels": {"name": "monitoring"}}},),
        ),
    )
    assert len(objects) == (7 if network_policy else 5)
    for obj in objects:
        _validate(obj)
