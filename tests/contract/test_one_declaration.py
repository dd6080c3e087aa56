"""Every setting is declared once: the job spec composes the PS's and the worker's own
sections, the CRD says exactly what those declarations say, and a field that appears in
two sections is either a ``same_as`` copy of the one declaration or a different setting
that happens to share a name (listed below, with why)."""

from __future__ import annotations

import inspect
from collections import defaultdict
from dataclasses import MISSING, Field, fields
from typing import Any

import pytest

from streamtrain_operator import main
from streamtrain_operator.job import spec as S  # noqa: N812 -- short alias for a long module
from streamtrain_operator.kube import resources
from streamtrain_ps.config import DenseConfig, PSConfig, SparseConfig, SparseOptimizerConfig
from streamtrain_ps.plumbing.settings import as_json, field_hints, is_section, strip_optional
from streamtrain_tools import crdgen
from streamtrain_worker.config import ModelConfig, WorkerConfig
from streamtrain_worker.data.config import DataConfig

#: Names shared by settings that are different on purpose.
DIFFERENT_SETTINGS = {
    "path": "each section's own storage root (logs, checkpoints, exports)",
    "type": "each optimizer's and the model's own kind, with their own enums",
    "learningRate": "the sparse and the dense optimizer are tuned apart",
    "beta1": "the sparse and the dense optimizer are tuned apart",
    "beta2": "the sparse and the dense optimizer are tuned apart",
    "epsilon": "the sparse and the dense optimizer are tuned apart",
    "replicas": "PS shards and workers scale apart",
    "metrics_port": "the operator's own /metrics vs the pods' (component_metrics_port)",
}

#: Spec path -> the class that declares it, in the package that owns it.
COMPONENT_SECTIONS = {
    "sparse": SparseConfig,
    "sparse.optimizer": SparseOptimizerConfig,
    "dense": DenseConfig,
    "model": ModelConfig,
    "data": DataConfig,
}

ROOTS: tuple[type[Any], ...] = (
    S.JobSpec,
    PSConfig,
    WorkerConfig,
    main.OperatorConfig,
    resources.Options,
)


def _sections() -> set[type[Any]]:
    seen: set[type[Any]] = set()
    stack = list(ROOTS)
    while stack:
        cls = stack.pop()
        if cls in seen:
            continue
        seen.add(cls)
        for hint in field_hints(cls).values():
            inner = strip_optional(hint)[0]
            inner = (getattr(inner, "__args__", None) or (inner,))[0]  # tuple[Table, ...]
            if is_section(inner):
                stack.append(inner)
    return seen


def _declarations() -> dict[str, list[tuple[type[Any], Field[Any]]]]:
    """Every leaf setting by name, with the class that holds it (inherited fields once,
    at the class that declares them)."""
    by_name: dict[str, list[tuple[type[Any], Field[Any]]]] = defaultdict(list)
    for cls in _sections():
        hints = field_hints(cls)
        for f in fields(cls):
            if is_section(strip_optional(hints[f.name])[0]):
                continue
            owner = next(c for c in cls.__mro__ if f.name in inspect.get_annotations(c))
            if (owner, f) not in by_name[f.name]:
                by_name[f.name].append((owner, f))
    return by_name


def test_the_spec_composes_the_components_own_sections() -> None:
    hints = field_hints(S.JobSpec)
    for path, cls in COMPONENT_SECTIONS.items():
        owner = hints[path.split(".")[0]]
        if "." in path:
            owner = field_hints(owner)[path.split(".")[1]]
        assert owner is cls or issubclass(owner, cls), path
    # spec.data only insists on two fields the worker can do without.
    assert set(S.DataSpec.__annotations__) == {"path", "startDay"}


def test_every_setting_is_declared_once() -> None:
    declared = _declarations()
    assert len(declared) > 90
    for name, places in declared.items():
        originals = [(c, f) for c, f in places if "sameAs" not in f.metadata]
        copies = [(c, f) for c, f in places if "sameAs" in f.metadata]
        where = [c.__name__ for c, _ in originals]
        if len(originals) > 1:
            assert name in DIFFERENT_SETTINGS, f"{name} is declared in {where}"
        for cls, f in copies:
            origin_name = f.metadata["sameAs"]
            assert any(f"{c.__name__}.{o.name}" == origin_name for c, o in _all_fields()), (
                f"{cls.__name__}.{name} copies {origin_name}, which is not a declared setting"
            )


def _all_fields() -> list[tuple[type[Any], Field[Any]]]:
    return [(c, f) for c in _sections() for f in fields(c)]


@pytest.mark.parametrize("path", sorted(COMPONENT_SECTIONS))
def test_the_crd_section_is_the_components_declaration(path: str) -> None:
    """The CRD's schema of spec.<path> carries the owning package's doc, default and bounds
    for every field: the API server, the local runner and the component check one thing."""
    cls = COMPONENT_SECTIONS[path]
    node = crdgen.openapi_schema(crdgen.crd())["properties"]["spec"]
    for part in path.split("."):
        node = node["properties"][part]
    props = node["properties"]
    assert list(props) == [f.name for f in fields(cls)]
    for f in fields(cls):
        prop = props[f.name]
        assert prop["description"] == f.metadata["doc"], f.name
        default = f.default if f.default_factory is MISSING else f.default_factory()
        if default is MISSING or is_section(type(default)):
            pass
        elif default is None:
            assert "default" not in prop, f.name
        else:
            assert prop["default"] == as_json(default), f.name
        for key in ("minimum", "maximum", "minLength", "maxLength", "pattern"):
            if key in f.metadata:
                assert prop[key] == f.metadata[key], (f.name, key)
        for key in ("exclusiveMinimum", "exclusiveMaximum"):
            if key in f.metadata:
                bound = "minimum" if key == "exclusiveMinimum" else "maximum"
                assert (prop[bound], prop[key]) == (f.metadata[key], True), (f.name, key)
    if cls is not DataConfig:  # spec.data requires path and startDay (DataSpec)
        section = {k: v for k, v in node.items() if k not in ("description", "default")}
        assert section == crdgen.object_schema(cls)


def test_operator_tls_needs_its_certificate_directory() -> None:
    from streamtrain_operator.main import OperatorConfig, SettingsError

    with pytest.raises(SettingsError) as err:
        OperatorConfig.from_env({"STREAMTRAIN_TLS": "cert-manager"})
    assert err.value.path == "STREAMTRAIN_TLS_DIR"
    cfg = OperatorConfig.from_env({"STREAMTRAIN_TLS": "secret", "STREAMTRAIN_TLS_DIR": "/etc/t"})
    files = cfg.tls_files()
    assert files is not None and str(files.ca) == "/etc/t/ca.crt"
    assert cfg.options().tls == "secret"
    assert OperatorConfig.from_env({}).tls_files() is None
