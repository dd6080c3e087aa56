"""Status transitions as pure functions, and the status store the driver saves through:
conditions keep their transition time, the status fits the CRD schema (nothing pruned),
progress survives the round trip through the status."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jsonschema
import yaml

from streamtrain_operator.job.plan import StepKey, StepKind
from streamtrain_operator.job.progress import Condition, PassRecord, Phase, Progress, Published
from streamtrain_operator.job.ps_limits import MEMORY_LIMIT_TOO_SMALL, memory_limit_message
from streamtrain_operator.kube import status as st
from streamtrain_ps.errors import WorkingSet
from streamtrain_tools import crdgen

ROOT = Path(__file__).resolve().parents[2]
T0 = 1_795_000_000.0  # 2026-11-18T11:06:40Z


def _status_schema() -> dict[str, Any]:
    crd = yaml.safe_load((ROOT / crdgen.CRD_FILE).read_text())
    schema: dict[str, Any] = crdgen.openapi_schema(crd)["properties"]["status"]
    return schema


def _pruned(schema: dict[str, Any], value: Any, path: str = "status") -> list[str]:
    """Fields the API server would drop (not in the structural schema)."""
    if schema.get("x-kubernetes-preserve-unknown-fields") or not isinstance(value, dict | list):
        return []
    if isinstance(value, list):
        return [p for i, v in enumerate(value) for p in _pruned(schema["items"], v, f"{path}[{i}]")]
    if "additionalProperties" in schema:
        return [p for k, v in value.items() for p in _pruned(schema["additionalProperties"], v)]
    props = schema.get("properties", {})
    out = [f"{path}.{k}" for k in value if k not in props]
    return out + [
        p for k, v in value.items() if k in props for p in _pruned(props[k], v, f"{path}.{k}")
    ]


def _drop_none(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _drop_none(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_drop_none(v) for v in value]
    return value


def _progress() -> Progress:
    ckpt = StepKey("20261101", 6, StepKind.CHECKPOINT)
    return Progress(
        generation=2,
        phase=Phase.TRAINING,
        current=StepKey("20261101", 8, StepKind.TRAIN),
        current_started=T0,
        completed=StepKey("20261101", 7, StepKind.DELTA),
        checkpoint=Published(ckpt, "s3://m/ckpt/20261101/pass-6-g2"),
        export=Published(StepKey("20261101", 7, StepKind.DELTA), "s3://m/serving/20261101/delta-7"),
        history=tuple(
            PassRecord(
                "20261101",
                p,
                2,
                {"auc": 0.79312345, "loss": 0.4412, "copc": 1.01, "examples": 1843200.0},
            )
            for p in range(1, 31)
        ),
        conditions=(Condition("DataMissing", "False", "DataArrived", "", T0 - 60),),
    )


def test_printer_fields_metrics_and_trimmed_history() -> None:
    status = st.status_from_progress(_progress(), T0 + 5, observed_generation=4)
    assert status["phase"] == "Training"
    assert status["current"] == {
        "day": "20261101",
        "pass": 8,
        "step": "train",
        "startedAt": "2026-11-18T11:06:40Z",
    }
    assert status["lastCompleted"] == {"day": "20261101", "pass": 7, "step": "delta"}
    assert status["lastCheckpoint"]["uri"] == "s3://m/ckpt/20261101/pass-6-g2"
    assert status["lastExport"]["kind"] == "delta"
    # Shown metrics the pass did not record are null: the merge-patch removes old values.
    assert status["metrics"] == {
        "auc": "0.793123",
        "loss": "0.4412",
        "copc": "1.01",
        "examples": "1843200",
        "examplesPerSecond": None,
        "seconds": None,
    }
    assert status["observedGeneration"] == 4
    assert len(status["scheduler"]["history"]) == st.STATUS_HISTORY
    ready = next(c for c in status["conditions"] if c["type"] == "Ready")
    assert ready["status"] == "True" and ready["observedGeneration"] == 4


def test_a_memory_limit_failure_is_the_ready_condition_s_reason_with_the_numbers() -> None:
    ws = WorkingSet(
        keys=80_000,
        needed_bytes=6_400_000,
        table_budget=8 << 20,
        memory_limit=250 << 20,
        suggested_memory_limit=260 << 20,
        disk_bytes=4_000_000,
        disk_limit=4_194_304,
        disk_full=True,
    )
    message = memory_limit_message(ws, "pass 20261101/8", "worker-0")
    progress = Progress(phase=Phase.FAILED, message=f"{MEMORY_LIMIT_TOO_SMALL}: {message}")
    progress = progress.with_condition(
        Condition("Failed", "True", MEMORY_LIMIT_TOO_SMALL, message, T0)
    )
    status = st.status_from_progress(progress, T0 + 1, observed_generation=3)
    conditions = {c["type"]: c for c in status["conditions"]}
    assert conditions["Failed"]["reason"] == MEMORY_LIMIT_TOO_SMALL
    assert conditions["Ready"]["status"] == "False"
    assert conditions["Ready"]["reason"] == MEMORY_LIMIT_TOO_SMALL
    text = conditions["Failed"]["message"]
    assert text.startswith(f"pass 20261101/8: spec.ps.memoryLimit ({250 << 20} bytes)")
    for part in ("80000 unique keys", "6400000 bytes", f"at least {260 << 20} bytes (260Mi)"):
        assert part in text
    assert "spec.ps.diskLimit (4194304 bytes)" in text and "raise spec.ps.diskLimit" in text
    # a failure without a reason of its own keeps the generic one
    plain = st.status_from_progress(Progress(phase=Phase.FAILED, message="x"), T0)
    ready = next(c for c in plain["conditions"] if c["type"] == "Ready")
    assert ready["reason"] == "Failed"


def test_status_fits_the_crd_schema_so_nothing_is_pruned() -> None:
    schema = _status_schema()
    for progress in (Progress(), _progress()):
        status = _drop_none(st.status_from_progress(progress, T0, observed_generation=1))
        jsonschema.Draft4Validator(schema).validate(status)
        assert _pruned(schema, status) == []
    invalid = st.invalid_spec("must be >= 1, got 0", "spec.ps.replicas", T0, 3, {})
    jsonschema.Draft4Validator(schema).validate(invalid)
    assert _pruned(schema, invalid) == []


def test_progress_round_trips_through_the_status() -> None:
    progress = _progress()
    status = st.status_from_progress(progress, T0)
    restored = st.progress_from_status(status)
    assert restored is not None
    assert restored.completed == progress.completed
    assert restored.checkpoint == progress.checkpoint
    assert restored.generation == 2
    assert restored.history == progress.history[-st.STATUS_HISTORY :]
    assert st.progress_from_status({}) is None
    assert st.progress_from_status({"phase": "Pending"}) is None


def test_condition_time_changes_only_when_the_status_flips() -> None:
    first = st.set_condition([], st.condition("PodsReady", False, "Waiting", "0/2", T0))
    same = st.set_condition(first, st.condition("PodsReady", False, "Waiting", "1/2", T0 + 30))
    assert same[0]["lastTransitionTime"] == first[0]["lastTransitionTime"]
    assert same[0]["message"] == "1/2"
    flipped = st.set_condition(same, st.condition("PodsReady", True, "AllReady", "2/2", T0 + 60))
    assert flipped[0]["lastTransitionTime"] == st.rfc3339(T0 + 60)
    both = st.set_condition(flipped, st.condition("SpecValid", True, "Parsed", "", T0))
    assert [c["type"] for c in both] == ["PodsReady", "SpecValid"]


def test_invalid_spec_names_the_field_and_a_fix_recovers() -> None:
    bad = st.invalid_spec("must be >= 1, got 0", "spec.ps.replicas", T0, 2, {})
    assert bad["phase"] == "Failed"
    (cond,) = bad["conditions"]
    assert cond["type"] == "SpecValid" and cond["status"] == "False"
    assert cond["reason"] == "InvalidSpec"
    assert cond["message"].startswith("spec.ps.replicas: ")
    fixed = st.valid_spec(T0 + 10, 3, bad)
    assert fixed["phase"] == "Pending"
    assert fixed["conditions"][0]["status"] == "True"
    # A job that already ran keeps its phase: the scheduler owns it.
    running = {"phase": "Training", "scheduler": {"phase": "Training"}}
    assert "phase" not in st.valid_spec(T0, 3, running)


def test_operator_conditions_survive_scheduler_saves() -> None:
    existing = st.pods_ready(True, "AllReady", "2/2 PS, 4/4 workers", T0, {})
    status = st.status_from_progress(_progress(), T0 + 5, existing=existing)
    types = {c["type"]: c for c in status["conditions"]}
    assert set(types) == {"DataMissing", "PodsReady", "Ready"}
    assert types["PodsReady"]["lastTransitionTime"] == st.rfc3339(T0)


def test_store_patches_once_per_change_and_resumes() -> None:
    patches: list[dict[str, Any]] = []
    store = st.StatusStore(patches.append, None, clock=lambda: T0)
    assert store.load() is None
    progress = _progress()
    store.save(progress)
    store.save(progress)  # no change, no request
    assert len(patches) == 1
    assert patches[0]["phase"] == "Training"
    # An operator restart builds the store from the status it reads: same progress.
    restarted = st.StatusStore(patches.append, store.status, clock=lambda: T0)
    loaded = restarted.load()
    assert loaded is not None and loaded.completed == progress.completed
    store.patch(st.pods_ready(False, "PodRestarted", "ps-1 restarted", T0, store.status))
    assert any(c["type"] == "PodsReady" for c in store.status["conditions"])


def test_phase_patch_keeps_the_scheduler_record() -> None:
    status = st.status_from_progress(_progress(), T0)
    patch = st.phase_patch(Phase.SUSPENDED, "spec.suspend is true", T0 + 1, status)
    assert patch["phase"] == "Suspended"
    assert patch["scheduler"]["lastCompleted"]["pass"] == 7
    assert st.phase_patch(Phase.PENDING, "", T0, {}) == {"phase": "Pending", "message": ""}
