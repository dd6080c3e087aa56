"""Generate the StreamingTrainingJob CRD (and its reference page) from the settings declarations.

The CRD's openAPIV3Schema is *derived*, never hand-written: types from the type hints,
``default:`` from the declared defaults, enums from ``Literal`` types, bounds, patterns and
descriptions from each ``setting(...)`` declaration (:mod:`streamtrain_ps.plumbing.settings`) of the
sections :mod:`streamtrain_operator.job.spec` composes — the PS's ``sparse``/``dense``, the
worker's ``model``/``data``, the operator's own. So the defaults and bounds Kubernetes
applies, the ones the local runner applies and the ones the PS and workers check are one
set and cannot drift apart — the trap of an older system where unset fields silently
turned shrink and filtering off.

What a per-field schema cannot say lives in :data:`SPEC_RULES` as CEL
``x-kubernetes-validations``: cross-field rules mirroring the spec's ``_validate`` methods
(``endDay >= startDay``, ``splitIntervalMinutes`` divides a day, ...) and transition rules
with ``oldSelf`` (``ps.replicas`` only changes while the job is suspended;
``ps.logicalShards`` never changes). The status has an explicit schema so the API server
keeps what the operator writes; only the scheduler's opaque progress document and kopf's
own bookkeeping preserve unknown fields.

``python -m streamtrain_tools.crdgen`` (``make crds``) writes three files (the reference is
rendered by ``crdref.py``):
``crds/streamtrain.io_streamingtrainingjobs.yaml``, the chart's templated copy and
``docs/crd-reference.md``; ``--check`` fails when any committed file is stale.
"""

from __future__ import annotations

import argparse
import copy
import sys
import typing
from dataclasses import MISSING, Field, fields, is_dataclass
from pathlib import Path
from typing import Any

import yaml

from streamtrain_operator.job import spec as specmod
from streamtrain_operator.job.plan import StepKind
from streamtrain_operator.job.progress import Phase
from streamtrain_ps.config import SparseOptimizerConfig
from streamtrain_ps.plumbing.settings import enum_values, field_hints, is_section, strip_optional
from streamtrain_tools.crdref import render_reference

GROUP = "streamtrain.io"
VERSION = "v1alpha1"
PLURAL = "streamingtrainingjobs"
SINGULAR = "streamingtrainingjob"
SHORT_NAMES = ("stj",)
CRD_NAME = f"{PLURAL}.{GROUP}"
CRD_FILE = Path("crds") / f"{GROUP}_{PLURAL}.yaml"
CHART_CRD_FILE = Path("charts") / "streamtrain" / "templates" / "crd.yaml"
REFERENCE_FILE = Path("docs") / "crd-reference.md"

#: Phases of a job, in lifecycle order (the scheduler's ``Phase`` constants).
PHASES = tuple(
    value for name, value in vars(Phase).items() if name.isupper() and isinstance(value, str)
)

#: Fields holding Kubernetes resource quantities ("4", 4, "32Gi").
_QUANTITY_MAPS = {(specmod.ResourcesSpec, "requests"), (specmod.ResourcesSpec, "limits")}


def _rule(rule: str, message: str, field_path: str | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {"rule": rule, "message": message}
    if field_path is not None:
        out["fieldPath"] = field_path
        out["reason"] = "FieldValueInvalid"
    return out


#: CEL rules per spec class. Each mirrors a check of the spec's ``_validate`` so kubectl
#: rejects a bad manifest at admission instead of the operator failing it later. Format
#: options (csv columns, slot counts) are the data layer's to judge and stay out of CEL.
SPEC_RULES: dict[type, list[dict[str, Any]]] = {
    specmod.DataSpec: [
        _rule(
            "!has(self.endDay) || self.endDay >= self.startDay",
            "endDay must be >= startDay",
            ".endDay",
        ),
        _rule(
            "1440 % self.splitIntervalMinutes == 0",
            "splitIntervalMinutes must divide 1440 (the minutes of a day)",
            ".splitIntervalMinutes",
        ),
        _rule(
            "(1440 / self.splitIntervalMinutes) % self.splitsPerPass == 0",
            "splitsPerPass must divide the folders of a day",
            ".splitsPerPass",
        ),
        _rule(
            "self.layout != 'HH' || self.splitIntervalMinutes % 60 == 0",
            "HH folders need splitIntervalMinutes to be a multiple of 60",
            ".layout",
        ),
    ],
    SparseOptimizerConfig: [
        _rule(
            "self.weightBounds[0] < self.weightBounds[1]",
            "weightBounds must be [low, high] with low < high",
            ".weightBounds",
        ),
    ],
    specmod.JobSpec: [
        # Transition rules: re-sharding happens only from a checkpoint, i.e. while suspended.
        _rule(
            "oldSelf.suspend || self.ps.replicas == oldSelf.ps.replicas",
            "ps.replicas can only change while the job is suspended (spec.suspend: true)",
            ".ps.replicas",
        ),
        _rule(
            "self.ps.logicalShards == oldSelf.ps.logicalShards",
            "ps.logicalShards is fixed for the life of the model",
            ".ps.logicalShards",
        ),
    ],
}


# ------------------------------------------------------------------------------ schema


def _doc(f: Field[Any]) -> str:
    return str(f.metadata.get("doc", "")).strip()


def _class_doc(cls: type) -> str:
    return (cls.__doc__ or "").strip().split("\n\n")[0].replace("\n", " ")


def _jsonable(value: Any) -> Any:
    if isinstance(value, tuple | list):
        return [_jsonable(v) for v in value]
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    return value


def _bounds(meta: typing.Mapping[str, Any]) -> dict[str, Any]:
    """Declared bounds as OpenAPI v3.0 keywords (exclusive bounds are boolean flags there)."""
    out: dict[str, Any] = {}
    if "minimum" in meta:
        out["minimum"] = meta["minimum"]
    if "maximum" in meta:
        out["maximum"] = meta["maximum"]
    if "exclusiveMinimum" in meta:
        out["minimum"] = meta["exclusiveMinimum"]
        out["exclusiveMinimum"] = True
    if "exclusiveMaximum" in meta:
        out["maximum"] = meta["exclusiveMaximum"]
        out["exclusiveMaximum"] = True
    return out


def _item_meta(meta: typing.Mapping[str, Any]) -> dict[str, Any]:
    """The bounds every item of a list is declared with (``item_minimum=``, ...)."""
    pairs = (("itemMinimum", "minimum"), ("itemMinLength", "minLength"))
    return {bound: meta[key] for key, bound in pairs if key in meta}


def _type_schema(hint: Any, meta: typing.Mapping[str, Any], owner: type, name: str) -> Any:
    hint, optional = strip_optional(hint)
    if is_section(hint):
        schema = object_schema(hint)
    elif (choices := enum_values(hint)) is not None:
        kind = "string" if all(isinstance(c, str) for c in choices) else "integer"
        schema = {"type": kind, "enum": list(choices)}
    elif typing.get_origin(hint) is tuple:
        args = typing.get_args(hint)
        variadic = len(args) == 2 and args[1] is Ellipsis
        item = _type_schema(args[0], _item_meta(meta), owner, name)
        schema = {"type": "array", "items": item}
        if not variadic:
            schema["minItems"] = schema["maxItems"] = len(args)
        elif "minItems" in meta:
            schema["minItems"] = meta["minItems"]
    elif typing.get_origin(hint) is dict:
        if (owner, name) in _QUANTITY_MAPS:
            value: dict[str, Any] = {
                "anyOf": [{"type": "integer"}, {"type": "string"}],
                "x-kubernetes-int-or-string": True,
            }
        elif typing.get_args(hint)[1] is Any:
            # Free-form values (e.g. csv columns: a slot name or {slot, kind, ...}), judged
            # by the layer that owns them; the API server keeps them as written.
            value = {"x-kubernetes-preserve-unknown-fields": True}
        else:
            value = {"type": "string"}
        # Bounded so the API server's CEL cost estimate of rules over the map stays finite.
        schema = {"type": "object", "additionalProperties": value, "maxProperties": 1024}
    elif hint is bool:
        schema = {"type": "boolean"}
    elif hint is str:
        schema = {"type": "string"}
        # maxLength also bounds the CEL cost of comparing strings (days).
        for key in ("minLength", "pattern", "maxLength"):
            if key in meta:
                schema[key] = meta[key]
    elif hint is int:
        schema = {"type": "integer", **_bounds(meta)}
    elif hint is float:
        schema = {"type": "number", **_bounds(meta)}
    else:  # a programming error in a declaration, caught by the CRD tests
        raise TypeError(f"{owner.__name__}.{name}: no schema for {hint!r}")
    if optional:
        schema["nullable"] = True
    return schema


def object_schema(cls: type) -> dict[str, Any]:
    """The structural schema of one spec dataclass, defaults included."""
    hints = field_hints(cls)
    props: dict[str, Any] = {}
    required: list[str] = []
    for f in fields(cls):
        prop = _type_schema(hints[f.name], f.metadata, cls, f.name)
        doc = _doc(f)
        if not doc and isinstance(hints[f.name], type) and is_dataclass(hints[f.name]):
            doc = _class_doc(hints[f.name])
        prop = {"description": doc, **prop} if doc else prop
        if f.default is not MISSING and f.default is not None:
            prop["default"] = _jsonable(f.default)
        elif f.default_factory is not MISSING:
            made = f.default_factory()
            # A nested section defaults to {} so the API server descends and fills in its
            # fields' own defaults; the dataclass does the same with default_factory.
            prop["default"] = {} if is_dataclass(made) else _jsonable(made)
        elif f.default is MISSING:
            required.append(f.name)
        props[f.name] = prop
    schema: dict[str, Any] = {"type": "object", "properties": props}
    if required:
        schema["required"] = required
    rules = SPEC_RULES.get(cls)
    if rules:
        schema["x-kubernetes-validations"] = rules
    return schema


def _step(description: str, extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """A step key ``day/pass/step`` (``plan.StepKey``) plus extra fields."""
    steps = [k.value for k in StepKind]
    props: dict[str, Any] = {
        "day": {"type": "string", "description": "Day, YYYYMMDD."},
        "pass": {"type": "integer", "description": "Pass index within the day, from 1."},
        "step": {"type": "string", "enum": steps, "description": "Step of the pass."},
    }
    props.update(extra or {})
    return {"type": "object", "description": description, "properties": props}


def status_schema() -> dict[str, Any]:
    """The status the operator writes; explicit, so the API server prunes nothing it needs."""
    time = {"type": "string", "format": "date-time"}
    published = {
        "kind": {"type": "string", "enum": [k.value for k in StepKind]},
        "uri": {"type": "string", "description": "Where it was published."},
    }
    condition = {
        "type": "object",
        "required": ["type", "status"],
        "properties": {
            "type": {"type": "string", "description": "Ready, Degraded, DataMissing, ..."},
            "status": {"type": "string", "enum": ["True", "False", "Unknown"]},
            "reason": {"type": "string", "description": "CamelCase machine-readable reason."},
            "message": {"type": "string", "description": "Human-readable detail."},
            "lastTransitionTime": time,
            "observedGeneration": {"type": "integer"},
        },
    }
    return {
        "type": "object",
        "description": "Observed state, written by the operator only.",
        "properties": {
            "phase": {"type": "string", "enum": list(PHASES), "description": "Lifecycle phase."},
            "observedGeneration": {
                "type": "integer",
                "description": "metadata.generation of the spec the operator last acted on.",
            },
            "generation": {
                "type": "integer",
                "description": "Restart generation: bumped on every PS recovery; pod labels "
                "carry it so results of older generations are ignored.",
            },
            "current": _step("The step in progress.", {"startedAt": time}),
            "lastCompleted": _step("The last completed step."),
            "lastCheckpoint": _step("The last published checkpoint.", published),
            "lastExport": _step("The last published inference model.", published),
            "metrics": {
                "type": "object",
                "description": "Global metrics of the last completed pass (decimal strings).",
                "additionalProperties": {"type": "string"},
            },
            "message": {"type": "string", "description": "Why the job is in this phase."},
            "conditions": {
                "type": "array",
                "items": condition,
                "x-kubernetes-list-type": "map",
                "x-kubernetes-list-map-keys": ["type"],
            },
            "scheduler": {
                "type": "object",
                "description": "The scheduler's durable progress (opaque, versioned by the "
                "scheduler); an operator restart resumes from it.",
                "x-kubernetes-preserve-unknown-fields": True,
            },
            "kopf": {
                "type": "object",
                "description": "kopf's bookkeeping.",
                "x-kubernetes-preserve-unknown-fields": True,
            },
        },
    }


def crd() -> dict[str, Any]:
    """The whole CustomResourceDefinition object."""
    spec_schema = object_schema(specmod.JobSpec)
    spec_schema["description"] = "Desired state of a streaming training job."
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {
            "name": CRD_NAME,
            "annotations": {
                f"{GROUP}/generated-by": "streamtrain_tools.crdgen (make crds); do not edit",
            },
        },
        "spec": {
            "group": GROUP,
            "scope": "Namespaced",
            "names": {
                "kind": specmod.KIND,
                "listKind": f"{specmod.KIND}List",
                "plural": PLURAL,
                "singular": SINGULAR,
                "shortNames": list(SHORT_NAMES),
                "categories": ["streamtrain"],
            },
            "versions": [
                {
                    "name": VERSION,
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}},
                    "additionalPrinterColumns": [
                        {"name": "Phase", "type": "string", "jsonPath": ".status.phase"},
                        {"name": "Day", "type": "string", "jsonPath": ".status.current.day"},
                        {"name": "Pass", "type": "integer", "jsonPath": ".status.current.pass"},
                        {"name": "AUC", "type": "string", "jsonPath": ".status.metrics.auc"},
                        {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
                    ],
                    "schema": {
                        "openAPIV3Schema": {
                            "type": "object",
                            "description": "A model trained pass by pass on time-sliced logs, "
                            "day after day, with parameter servers and PyTorch workers.",
                            "required": ["spec"],
                            "properties": {
                                "apiVersion": {"type": "string"},
                                "kind": {"type": "string"},
                                "metadata": {"type": "object"},
                                "spec": spec_schema,
                                "status": status_schema(),
                            },
                        }
                    },
                }
            ],
        },
    }


def apply_defaults(schema: dict[str, Any], value: Any) -> Any:
    """Structural defaulting as the API server does it: a missing property with a
    ``default`` gets it, then defaulting descends into every object present. Returns a new
    value; used to prove that schema defaults and dataclass defaults agree."""
    if not isinstance(value, dict) or schema.get("type") != "object":
        if isinstance(value, list) and schema.get("type") == "array":
            return [apply_defaults(schema["items"], v) for v in value]
        return value
    out = dict(value)
    for name, prop in schema.get("properties", {}).items():
        if name not in out and "default" in prop:
            out[name] = copy.deepcopy(prop["default"])
        if name in out:
            out[name] = apply_defaults(prop, out[name])
    return out


def openapi_schema(document: dict[str, Any]) -> dict[str, Any]:
    """The openAPIV3Schema of a CRD document (for validating sample CRs)."""
    schema: dict[str, Any] = document["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    return schema


# ----------------------------------------------------------------------------- rendering

_HEADER = "# Generated by `make crds` from the settings declarations; do not edit.\n"


def render_crd(document: dict[str, Any]) -> str:
    return _HEADER + yaml.safe_dump(document, sort_keys=False, width=100)


def render_chart_crd(document: dict[str, Any]) -> str:
    """The chart's copy: the same document behind ``crds.install``, optionally kept on
    uninstall. Written as text (not fromYaml/toYaml in the template), because Helm's
    round trip turns large integers into floats."""
    body = yaml.safe_dump(document, sort_keys=False, width=100)
    if "{{" in body:
        raise ValueError("the CRD contains '{{', which Helm would treat as a template")
    anchor = "  annotations:\n"
    keep = "    {{- if .Values.crds.keep }}\n    helm.sh/resource-policy: keep\n    {{- end }}\n"
    return (
        _HEADER.replace("# ", "{{- /* ", 1).rstrip("\n")
        + " */}}\n{{- if .Values.crds.install }}\n"
        + body.replace(anchor, anchor + keep, 1)
        + "{{- end }}\n"
    )


def rule_path(cls: type) -> str:
    """Where a spec class sits in the manifest, e.g. ``spec.data`` for DataSpec."""
    paths: dict[type, str] = {specmod.JobSpec: "spec"}
    queue: list[tuple[type, str]] = [(specmod.JobSpec, "spec")]
    while queue:
        owner, path = queue.pop()
        hints = field_hints(owner)
        for f in fields(owner):
            hint = strip_optional(hints[f.name])[0]
            if is_section(hint):
                paths.setdefault(hint, f"{path}.{f.name}")
                queue.append((hint, f"{path}.{f.name}"))
    return paths[cls]


# ---------------------------------------------------------------------------------- CLI


def outputs(root: Path) -> dict[Path, str]:
    """Every generated file, keyed by its path under ``root``."""
    document = crd()
    return {
        root / CRD_FILE: render_crd(document),
        root / CHART_CRD_FILE: render_chart_crd(document),
        root / REFERENCE_FILE: render_reference(document),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", type=Path, default=Path.cwd(), help="repository root")
    parser.add_argument("--check", action="store_true", help="fail if a file is stale")
    args = parser.parse_args(argv)
    stale = []
    for path, text in outputs(args.root).items():
        current = path.read_text() if path.exists() else None
        if current == text:
            continue
        if args.check:
            stale.append(str(path))
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
            print(f"wrote {path}")
    if stale:
        print("stale generated files (run `make crds`): " + ", ".join(stale), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
