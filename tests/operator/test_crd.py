"""The generated CRD: fresh, structural, defaults equal to the spec dataclasses', CEL rules
that accept the samples and reject what the spec rejects, samples valid against the schema."""

from __future__ import annotations

import copy
from dataclasses import asdict
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from streamtrain_operator.job.spec import SpecError, parse_job, parse_spec
from streamtrain_tools import crdgen, validate

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((ROOT / "crds" / "examples").glob("*.yaml"))


def _committed_crd() -> dict[str, Any]:
    return yaml.safe_load((ROOT / crdgen.CRD_FILE).read_text())


def _schema() -> dict[str, Any]:
    return crdgen.openapi_schema(_committed_crd())


def _spec_schema() -> dict[str, Any]:
    return _schema()["properties"]["spec"]


def _load(path: Path) -> dict[str, Any]:
    return yaml.safe_load(path.read_text())


def test_committed_files_equal_a_fresh_generation() -> None:
    stale = [
        str(p.relative_to(ROOT))
        for p, text in crdgen.outputs(ROOT).items()
        if p.read_text() != text
    ]
    assert stale == [], f"run `make crds` and commit: {stale}"


def test_identity_printer_columns_and_status_subresource() -> None:
    crd = _committed_crd()
    assert crd["metadata"]["name"] == "streamingtrainingjobs.streamtrain.io"
    assert crd["spec"]["group"] == "streamtrain.io"
    assert crd["spec"]["names"]["shortNames"] == ["stj"]
    (version,) = crd["spec"]["versions"]
    assert version["name"] == "v1alpha1" and version["served"] and version["storage"]
    assert version["subresources"] == {"status": {}}
    columns = {c["name"]: c["jsonPath"] for c in version["additionalPrinterColumns"]}
    assert columns == {
        "Phase": ".status.phase",
        "Day": ".status.current.day",
        "Pass": ".status.current.pass",
        "AUC": ".status.metrics.auc",
        "Age": ".metadata.creationTimestamp",
    }


def _walk_nodes(schema: dict[str, Any], path: str = "") -> list[tuple[str, dict[str, Any]]]:
    out = [(path, schema)]
    for name, prop in schema.get("properties", {}).items():
        out += _walk_nodes(prop, f"{path}.{name}")
    if "items" in schema:
        out += _walk_nodes(schema["items"], f"{path}[]")
    if isinstance(schema.get("additionalProperties"), dict):
        out += _walk_nodes(schema["additionalProperties"], f"{path}{{}}")
    return out


def test_schema_is_structural() -> None:
    """Every node has a type (or is int-or-string), objects never mix properties with
    additionalProperties, and only the opaque status documents preserve unknown fields."""
    preserving = []
    for path, node in _walk_nodes(_schema()):
        if node.get("x-kubernetes-int-or-string"):
            continue
        if node.get("x-kubernetes-preserve-unknown-fields") and "type" not in node:
            preserving.append(path)
            continue
        assert "type" in node, path
        assert not ("properties" in node and "additionalProperties" in node), path
        if node.get("x-kubernetes-preserve-unknown-fields"):
            preserving.append(path)
    assert preserving == [".spec.data.columns{}", ".status.scheduler", ".status.kopf"]


def test_schema_defaults_equal_dataclass_defaults() -> None:
    """What the API server stores after defaulting parses to exactly what the dataclasses
    build from the bare manifest: one set of defaults, never two."""
    for example in EXAMPLES:
        spec = _load(example)["spec"]
        defaulted = crdgen.apply_defaults(_spec_schema(), spec)
        assert defaulted != spec  # defaulting really filled something in
        assert asdict(parse_spec(defaulted)) == asdict(parse_spec(spec)), example.name


def test_every_defaulted_field_is_rendered_in_the_defaulted_manifest() -> None:
    """After defaulting, every field the dataclass knows is present (none left to a second,
    implicit default somewhere else), except optional fields whose default is null."""
    spec = crdgen.apply_defaults(_spec_schema(), _load(ROOT / "crds/examples/minimal.yaml")["spec"])
    parsed = asdict(parse_spec(spec))

    def missing(full: dict[str, Any], got: dict[str, Any], path: str) -> list[str]:
        out = []
        for key, value in full.items():
            if key not in got:
                if value is not None:
                    out.append(f"{path}.{key}")
            elif isinstance(value, dict) and value and isinstance(got[key], dict):
                out += missing(value, got[key], f"{path}.{key}")
        return out

    assert missing(parsed, spec, "spec") == []


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.name)
def test_examples_validate_against_the_schema_and_parse(example: Path) -> None:
    manifest = _load(example)
    jsonschema.Draft4Validator(_schema()).validate(manifest)
    job = parse_job(manifest)
    assert job.name == manifest["metadata"]["name"]


@pytest.mark.parametrize(
    ("patch", "field"),
    [
        ({"data": {"format": "parquet"}}, "spec.data.format"),
        ({"data": {"startDay": "2026-11-01"}}, "spec.data.startDay"),
        ({"data": {"pollSeconds": 0}}, "spec.data.pollSeconds"),
        ({"ps": {"replicas": 0}}, "spec.ps.replicas"),
        ({"sparse": {"optimizer": {"weightBounds": [1]}}}, "spec.sparse.optimizer.weightBounds"),
        ({"model": {"hiddenUnits": [64, 0]}}, "spec.model.hiddenUnits"),
        ({"workers": {"replicas": "4"}}, "spec.workers.replicas"),
    ],
)
def test_schema_and_spec_reject_the_same_bad_values(patch: dict[str, Any], field: str) -> None:
    manifest = _load(ROOT / "crds/examples/ctr-online.yaml")
    _merge(manifest["spec"], patch)
    with pytest.raises(jsonschema.ValidationError) as schema_error:
        jsonschema.Draft4Validator(_schema()).validate(manifest)
    assert ".".join(str(p) for p in schema_error.value.absolute_path).startswith(
        field.replace("spec.", "spec.", 1).split("[")[0]
    )
    with pytest.raises(SpecError) as spec_error:
        parse_job(manifest)
    assert spec_error.value.path.startswith(field)


def _merge(into: dict[str, Any], patch: dict[str, Any]) -> None:
    for key, value in patch.items():
        if isinstance(value, dict) and isinstance(into.get(key), dict):
            _merge(into[key], value)
        else:
            into[key] = value


# ------------------------------------------------------------------------------ CEL rules


def _violations(spec: dict[str, Any], old: dict[str, Any] | None = None) -> list[str]:
    """The fields of every CEL rule of the CRD that rejects ``spec`` (``streamtrain
    validate``'s evaluation, where the API server would run them, after defaulting)."""
    return [field for field, _ in validate.cel_violations(spec, old)]


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.name)
def test_cel_rules_accept_the_examples(example: Path) -> None:
    spec = _load(example)["spec"]
    assert _violations(spec) == []
    assert _violations(spec, old=copy.deepcopy(spec)) == []


@pytest.mark.parametrize(
    ("patch", "field"),
    [
        ({"data": {"endDay": "20261031"}}, "spec.data.endDay"),
        ({"data": {"splitIntervalMinutes": 7}}, "spec.data.splitIntervalMinutes"),
        ({"data": {"splitsPerPass": 5}}, "spec.data.splitsPerPass"),
        ({"data": {"splitIntervalMinutes": 30, "layout": "HH"}}, "spec.data.layout"),
        (
            {"sparse": {"optimizer": {"weightBounds": [3, -3]}}},
            "spec.sparse.optimizer.weightBounds",
        ),
    ],
)
def test_cel_rules_mirror_the_spec_cross_field_checks(patch: dict[str, Any], field: str) -> None:
    spec = _load(ROOT / "crds/examples/ctr-online.yaml")["spec"]
    _merge(spec, patch)
    assert _violations(spec) == [field]
    with pytest.raises(SpecError) as error:
        parse_spec(spec)
    assert error.value.path == field


def test_ps_replicas_change_only_while_suspended() -> None:
    old = _load(ROOT / "crds/examples/ctr-online.yaml")["spec"]
    grown = copy.deepcopy(old)
    grown["ps"]["replicas"] = 3
    assert _violations(grown, old=old) == ["spec.ps.replicas"]
    suspended = {**copy.deepcopy(old), "suspend": True}
    assert _violations({**grown, "suspend": True}, old=suspended) == []
    # Resuming and re-sharding in one update is fine: the pods are at zero already.
    assert _violations(grown, old=suspended) == []
    # Workers scale any time (the change takes effect at the next pass).
    more_workers = copy.deepcopy(old)
    more_workers["workers"]["replicas"] = 9
    assert _violations(more_workers, old=old) == []


def test_logical_shards_never_change() -> None:
    old = {**_load(ROOT / "crds/examples/ctr-online.yaml")["spec"], "suspend": True}
    new = copy.deepcopy(old)
    new["ps"]["logicalShards"] = 128
    assert _violations(new, old=old) == ["spec.ps.logicalShards"]
