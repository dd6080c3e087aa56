"""The job spec: one set of defaults, and every error names its field."""

from __future__ import annotations

import copy
import dataclasses
from pathlib import Path
from typing import Any

import pytest
import yaml

from streamtrain_operator.job import spec as S  # noqa: N812 -- short alias for a long module
from streamtrain_ps.config import DenseConfig, PSConfig, TableConfig

MINIMAL: dict[str, Any] = {
    "apiVersion": S.API_VERSION,
    "kind": S.KIND,
    "metadata": {"name": "ctr-online", "namespace": "ads"},
    "spec": {
        "data": {"path": "s3://logs/ctr", "startDay": "20261101", "format": "criteo"},
        "checkpoint": {"path": "s3://models/ckpt"},
        "export": {"path": "s3://models/serving"},
    },
}


def with_spec(**changes: Any) -> dict[str, Any]:
    """MINIMAL with dotted-path overrides, e.g. ``**{"data.splitsPerPass": 5}``."""
    m = copy.deepcopy(MINIMAL)
    for dotted, value in changes.items():
        node = m["spec"]
        *parents, leaf = dotted.split(".")
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = value
    return m


def test_minimal_manifest_gets_documented_defaults() -> None:
    job = S.parse_job(MINIMAL)
    assert (job.name, job.namespace) == ("ctr-online", "ads")
    d = job.spec.data
    assert (d.splitIntervalMinutes, d.splitsPerPass, d.donefile) == (60, 1, "_SUCCESS")
    assert (d.onMissing, d.endDay, d.passes_per_day) == ("keepWaiting", None, 24)
    assert job.spec.checkpoint.everyPasses == 6
    assert job.spec.export.deltaEveryPasses == 1
    assert job.spec.model.hiddenUnits == (512, 256, 128)
    assert (job.spec.ps.replicas, job.spec.workers.replicas, job.spec.suspend) == (1, 1, False)


def test_sparse_and_dense_defaults_are_the_ps_defaults() -> None:
    """One set of defaults: an empty spec.sparse renders exactly the PS's own defaults."""
    job = S.parse_job(MINIMAL)
    assert job.spec.sparse.table_config(embedding_dim=8) == TableConfig()
    assert job.spec.dense == DenseConfig()
    assert job.spec.ps.logicalShards == PSConfig().logicalShards


def test_every_field_is_documented() -> None:
    seen = 0
    stack: list[type[Any]] = [S.JobSpec]
    while stack:
        cls = stack.pop()
        hints = S.field_hints(cls)
        for f in dataclasses.fields(cls):
            assert f.metadata.get("doc"), f"{cls.__name__}.{f.name} has no doc"
            seen += 1
            if dataclasses.is_dataclass(hints[f.name]):
                stack.append(hints[f.name])
    assert seen > 60


def test_enums_are_introspectable() -> None:
    hints = S.field_hints(S.DataSpec)
    assert S.enum_values(hints["onMissing"]) == ("keepWaiting", "fail")
    assert "criteo" in (S.enum_values(hints["format"]) or ())
    assert S.enum_values(hints["path"]) is None


def test_non_default_values_are_kept() -> None:
    m = with_spec(
        **{
            "data.splitIntervalMinutes": 30,
            "data.splitsPerPass": 2,
            "data.endDay": "20261107",
            "data.onMissing": "fail",
            "sparse.optimizer.weightBounds": [-1, 1],
            "model.hiddenUnits": [16, 8],
            "ps.resources": {"requests": {"cpu": 4, "memory": "32Gi"}},
        }
    )
    s = S.parse_job(m).spec
    assert (s.data.passes_per_day, s.data.endDay, s.data.onMissing) == (24, "20261107", "fail")
    assert s.sparse.optimizer.weightBounds == (-1.0, 1.0)
    assert s.model.hiddenUnits == (16, 8)
    assert s.ps.resources.requests == {"cpu": "4", "memory": "32Gi"}


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"data.splitIntervalMinutes": 7}, "spec.data.splitIntervalMinutes: must divide 1440"),
        ({"data.splitIntervalMinutes": 0}, "spec.data.splitIntervalMinutes: must be >= 1"),
        ({"data.splitsPerPass": 5}, "spec.data.splitsPerPass: must divide the 24 folders"),
        ({"data.startDay": "2026-11-01"}, "spec.data.startDay: must match"),
        ({"data.startDay": "20261341"}, "spec.data.startDay: not a calendar day"),
        ({"data.endDay": "20261031"}, "spec.data.endDay: must be >= startDay"),
        ({"data.format": "parquet"}, "spec.data.format: must be one of"),
        ({"data.onMissing": "wait"}, "spec.data.onMissing: must be one of"),
        ({"data.pollSeconds": 0}, "spec.data.pollSeconds: must be > 0"),
        ({"data.maxBadLineFraction": 2}, "spec.data.maxBadLineFraction: must be <= 1"),
        ({"data.layout": "HH", "data.splitIntervalMinutes": 30}, "spec.data.layout: HH"),
        ({"data.format": "csv"}, "spec.data.columns: exactly one column"),
        ({"data.format": "slot"}, "spec.data.numSlots: the slot format needs"),
        ({"data.sequenceSlot": 39}, "spec.data.sequenceSlot: must be in 0..38"),
        ({"data.crosses": ["C1*C2", "C1*C99"]}, "spec.data.crosses[1]: 'C1*C99': no slot 'C99'"),
        ({"data.crosses": ["C1"]}, "spec.data.crosses[0]: 'C1': name two different slots"),
        ({"data.crosses": "C1*C2"}, "spec.data.crosses: must be a list"),
        ({"data.path": ""}, "spec.data.path: must not be empty"),
        ({"data.typo": 1}, "spec.data.typo: unknown field"),
        ({"checkpoint.everyPasses": 0}, "spec.checkpoint.everyPasses: must be >= 1"),
        ({"export.deltaEveryPasses": -1}, "spec.export.deltaEveryPasses: must be >= 0"),
        ({"model.hiddenUnits": [8, 0]}, "spec.model.hiddenUnits[1]: must be >= 1"),
        ({"model.hiddenUnits": 8}, "spec.model.hiddenUnits: must be a list"),
        ({"model.batchSize": 1.5}, "spec.model.batchSize: must be an integer"),
        ({"model.cvm": "yes"}, "spec.model.cvm: must be true or false"),
        ({"sparse.showClickDecayRate": 0}, "spec.sparse.showClickDecayRate: must be > 0"),
        ({"sparse.optimizer.type": "sgd"}, "spec.sparse.optimizer.type: must be one of"),
        ({"sparse.optimizer.weightBounds": [1, -1]}, "spec.sparse.optimizer.weightBounds:"),
        ({"sparse.optimizer.weightBounds": [1]}, "spec.sparse.optimizer.weightBounds: must have 2"),
        ({"dense.optimizer.beta1": 1.0}, "spec.dense.optimizer.beta1: must be < 1"),
        ({"ps.replicas": 0}, "spec.ps.replicas: must be >= 1"),
        ({"workers.replicas": True}, "spec.workers.replicas: must be an integer"),
        ({"workers.resources": {"requests": {"cpu": [1]}}}, "spec.workers.resources.requests.cpu"),
        ({"suspend": None}, "spec.suspend: must not be null"),
        (
            {"checkpoint.besideTraining": True, "ps.memoryLimit": 1 << 30},
            "spec.checkpoint.besideTraining: needs PS shards without a memory limit",
        ),
        (
            {"checkpoint.besideTraining": True, "ps.resources": {"limits": {"memory": "8Gi"}}},
            "spec.checkpoint.besideTraining: needs PS shards without a memory limit",
        ),
    ],
)
def test_errors_name_the_field(changes: dict[str, Any], message: str) -> None:
    with pytest.raises(S.SpecError) as err:
        S.parse_job(with_spec(**changes))
    assert str(err.value).startswith(message), str(err.value)
    assert str(err.value).startswith(err.value.path)


@pytest.mark.parametrize("missing", ["data", "checkpoint", "export"])
def test_required_sections(missing: str) -> None:
    m = copy.deepcopy(MINIMAL)
    del m["spec"][missing]
    with pytest.raises(S.SpecError, match=rf"^spec\.{missing}: required"):
        S.parse_job(m)


def test_manifest_identity_errors() -> None:
    with pytest.raises(S.SpecError, match=r"^kind:"):
        S.parse_job({**MINIMAL, "kind": "Job"})
    with pytest.raises(S.SpecError, match=r"^metadata\.name:"):
        S.parse_job({**MINIMAL, "metadata": {"name": "Not_A_Label"}})
    with pytest.raises(S.SpecError, match=r"^spec: must be an object"):
        S.parse_job({**MINIMAL, "spec": None})


def test_load_job_resolves_relative_paths(tmp_path: Path) -> None:
    m = copy.deepcopy(MINIMAL)
    m["spec"]["data"]["path"] = "data"
    m["spec"]["checkpoint"]["path"] = "/abs/ckpt"
    f = tmp_path / "job.yaml"
    f.write_text(yaml.safe_dump(m))
    spec = S.load_job(f).spec
    assert spec.data.path == str(tmp_path / "data")
    assert spec.checkpoint.path == "/abs/ckpt"
    assert spec.export.path == "s3://models/serving"


def test_spec_is_frozen() -> None:
    spec = S.parse_job(MINIMAL).spec
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.suspend = True  # type: ignore[misc]


@pytest.mark.parametrize("name", ["criteo", "avazu", "synthetic"])
def test_example_manifests_parse(name: str) -> None:
    examples = Path(__file__).resolve().parents[2] / "examples"
    job = S.load_job(examples / f"{name}.yaml")
    assert job.name == name
    assert job.spec.data.path.endswith(f"examples-run/{name}")
    assert job.spec.data.passes_per_day in (4, 12, 24)
