"""Malformed StreamingTrainingJobs: hypothesis mutates one field of the full sample CR
(``crds/examples/ctr-online.yaml``) — a wrong type, an absurd value, or the field removed —
and checks the two gates a bad CR meets:

- the CRD's openAPIV3Schema (what the API server enforces; ``jsonschema`` here), and
- ``streamtrain_operator.job.spec`` parsing (what the operator and ``streamtrain run`` enforce).

Whatever a gate rejects, its message must point at the mutated field (the field itself, a
field below it, or the enclosing object; for ``spec.data`` also a field the format requires).
Whatever the schema rejects, the spec parser must reject too, because local mode has no API
server in front of it (exceptions: explicit nulls, and pod resources, see below). And a bad
CR handed to the real ``reconcile`` handler becomes a ``SpecValid=False`` condition naming
the field, while the next (valid) job is reconciled as usual.
"""

from __future__ import annotations

import asyncio
import copy
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, cast

import jsonschema
import kopf
import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry

from streamtrain_operator.job.spec import SpecError
from streamtrain_operator.kube import handlers
from streamtrain_operator.kube.daemon import Runtime
from streamtrain_operator.kube.desired import read_job
from streamtrain_operator.kube.metrics import OperatorMetrics
from streamtrain_operator.kube.resources import Options
from streamtrain_tools import crdgen

ROOT = Path(__file__).resolve().parents[2]
SAMPLE = ROOT / "crds" / "examples" / "ctr-online.yaml"
Path_ = tuple[str | int, ...]


def _sample() -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load(SAMPLE.read_text())
    return data


SCHEMA = crdgen.openapi_schema(yaml.safe_load((ROOT / crdgen.CRD_FILE).read_text()))
VALIDATOR = jsonschema.Draft4Validator(SCHEMA)


def _leaves(value: Any, path: Path_ = ()) -> Iterator[Path_]:
    """Every field of the sample's spec, objects and lists included (not list items)."""
    if path:
        yield path
    if isinstance(value, dict):
        for k, v in value.items():
            yield from _leaves(v, (*path, k))


FIELDS = sorted(_leaves(_sample()["spec"]), key=str)
ABSURD = [
    -1,
    0,
    -(10**18),
    10**18,
    1e308,
    -1e-308,
    "",
    "x" * 5000,
    "../../../etc/passwd",
    "\u202e\u0000",
    "20261399",
    [],
    {},
    None,
    True,
    [None],
    {"unexpected": 1},
]


def _dotted(path: Path_) -> str:
    return ".".join(["spec", *(str(p) for p in path)])


def _related(error_path: str, mutated: str) -> bool:
    """The error names the mutated field, something inside it, or an enclosing object."""
    error_path = error_path.split("[", 1)[0]
    return (
        error_path == mutated
        or error_path.startswith(mutated + ".")
        or mutated.startswith(error_path + ".")
    )


def _mutate(manifest: dict[str, Any], path: Path_, value: Any, remove: bool) -> None:
    obj = manifest["spec"]
    for p in path[:-1]:
        obj = obj[p]
    if remove:
        del obj[path[-1]]
    else:
        obj[path[-1]] = value


def _schema_error(manifest: dict[str, Any]) -> str | None:
    errors = sorted(VALIDATOR.iter_errors(manifest), key=lambda e: len(e.absolute_path))
    if not errors:
        return None
    err = errors[0]
    where = ".".join(str(p) for p in err.absolute_path if not isinstance(p, int))
    if err.validator == "required":  # the missing property is in the message, not the path
        missing = str(err.message).split("'")[1]
        where = f"{where}.{missing}" if where else missing
    return where


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    path=st.sampled_from(FIELDS),
    value=st.one_of(
        st.sampled_from(ABSURD),
        st.integers(),
        st.floats(allow_nan=False),
        st.text(max_size=40),
        st.lists(st.integers(-3, 3), max_size=3),
    ),
    remove=st.booleans(),
)
def test_a_mutated_field_is_rejected_by_name_or_accepted_by_both_gates(
    path: Path_, value: Any, remove: bool
) -> None:
    manifest = _sample()
    _mutate(manifest, path, value, remove)
    mutated = _dotted(path)
    schema_error = _schema_error(manifest)
    try:
        read_job(manifest, Options())
        spec_error = None
    except SpecError as exc:
        spec_error = exc
        assert str(exc).startswith(exc.path), str(exc)
    if schema_error is not None:
        assert _related(schema_error, mutated), (schema_error, mutated)
        # Two documented exceptions: an explicit null, which the API server prunes before
        # validating (so null = absent, as the parser treats it), and pod resources, which
        # local mode ignores and the API server checks as quantities.
        null = not remove and value is None
        if not null and "resources" not in path:
            assert spec_error is not None, f"the schema rejects {mutated}={value!r}, the spec not"
    if spec_error is not None:
        assert _related(spec_error.path, mutated) or path[:1] == ("data",), (
            spec_error.path,
            mutated,
        )


# -- the handler: a bad CR becomes a condition; the next job is served ----------------------


class RecordingKube:
    """The part of the kube layer ``reconcile`` uses; status patches land in the body."""

    def __init__(self) -> None:
        self.applied: list[tuple[str, str]] = []
        self.status: dict[str, dict[str, Any]] = {}

    def apply(self, obj: Mapping[str, Any]) -> str:
        self.applied.append((obj["kind"], obj["metadata"]["name"]))
        return "created"

    def patch_status(self, namespace: str, name: str, status: Mapping[str, Any]) -> None:
        self.status.setdefault(name, {}).update(copy.deepcopy(dict(status)))


class Memo(dict[str, Any]):
    __getattr__ = dict.get

    def __setattr__(self, key: str, value: Any) -> None:
        self[key] = value


BAD = [
    (("ps", "replicas"), "two"),
    (("model", "hiddenUnits"), [64, -1]),
    (("sparse", "showClickDecayRate"), 7.5),
    (("data", "format"), "parquet"),
    (("data", "startDay"), "yesterday"),
    (("checkpoint", "everyPasses"), 0),
]


def _body(name: str) -> dict[str, Any]:
    body = _sample()
    body["metadata"].update({"name": name, "uid": f"uid-{name}", "generation": 1})
    body["status"] = {}
    return body


def test_bad_jobs_become_conditions_and_good_jobs_keep_being_served() -> None:
    kube = RecordingKube()
    metrics = OperatorMetrics(CollectorRegistry())
    runtime = Runtime(kube=cast(Any, kube), metrics=metrics, clock=lambda: 1e9)  # partial API

    async def reconcile(body: dict[str, Any]) -> None:
        memo = Memo(runtime=runtime)
        await handlers.reconcile(body=body, meta=body["metadata"], status={}, memo=memo)

    for i, (path, value) in enumerate(BAD):
        bad = _body(f"bad-{i}")
        _mutate(bad, path, value, remove=False)
        with pytest.raises(kopf.PermanentError):
            asyncio.run(reconcile(bad))
        status = kube.status[f"bad-{i}"]
        (cond,) = status["conditions"]
        assert (cond["type"], cond["status"], cond["reason"]) == (
            "SpecValid",
            "False",
            "InvalidSpec",
        )
        assert cond["message"].startswith(_dotted(path)), cond["message"]
        assert status["phase"] == "Failed"
        assert not any(name.startswith(f"bad-{i}") for _, name in kube.applied)

        good = _body(f"good-{i}")
        asyncio.run(reconcile(good))
        assert kube.status[f"good-{i}"]["conditions"][0]["status"] == "True"
        assert ("StatefulSet", f"good-{i}-ps") in kube.applied


def test_an_image_outside_the_registry_allow_list_is_refused_naming_the_field() -> None:
    """Creating a job creates pods running its images with its Secret: with
    ``image_registries`` set, another registry's image is ``SpecValid=False`` naming the
    field, and nothing is applied."""
    kube = RecordingKube()
    options = Options(image_registries=("registry.example.com/ml",))
    runtime = Runtime(
        kube=cast(Any, kube),
        metrics=OperatorMetrics(CollectorRegistry()),
        options=options,
        clock=lambda: 1e9,
    )
    memo = Memo(runtime=runtime)
    body = _body("foreign")
    body["spec"]["image"] = "registry.example.com/ml/streamtrain-worker:1"
    body["spec"]["psImage"] = "evil.example.org/ml/miner:latest"
    with pytest.raises(kopf.PermanentError):
        asyncio.run(handlers.reconcile(body=body, meta=body["metadata"], status={}, memo=memo))
    (cond,) = kube.status["foreign"]["conditions"]
    assert cond["status"] == "False"
    assert cond["message"].startswith("spec.psImage: image 'evil.example.org/ml/miner:latest'")
    assert kube.applied == []
    # A lookalike prefix is no match: "registry.example.com/ml-evil/..." is another path.
    body = _body("lookalike")
    body["spec"]["image"] = body["spec"]["psImage"] = "registry.example.com/ml-evil/x:1"
    with pytest.raises(kopf.PermanentError):
        asyncio.run(handlers.reconcile(body=body, meta=body["metadata"], status={}, memo=memo))
    assert kube.status["lookalike"]["conditions"][0]["message"].startswith("spec.image:")
    good = _body("allowed")
    good["spec"]["image"] = "registry.example.com/ml/streamtrain-worker:1"
    good["spec"]["psImage"] = "registry.example.com/ml/streamtrain-ps:1"
    asyncio.run(handlers.reconcile(body=good, meta=good["metadata"], status={}, memo=memo))
    assert kube.status["allowed"]["conditions"][0]["status"] == "True"
