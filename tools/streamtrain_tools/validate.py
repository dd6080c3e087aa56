"""``streamtrain validate FILE...``: check StreamingTrainingJob manifests offline.

What ``kubectl apply`` would check at admission, without a cluster, and what the operator
would check after it, in one go: the spec's own parser (types, bounds, unknown fields,
cross-field rules: the clearest messages, so it goes first), then the CRD's OpenAPI schema
(after the API server's defaulting) and its CEL rules, both from the CRD generated in memory
from the same declarations (``crdgen``), so nothing here can disagree with ``crds/``.
Transition rules (``oldSelf``) are skipped: they compare an update with the stored object.

Each problem is printed once, as ``error: FILE: FIELD: MESSAGE``; exit 0 when every file is
valid, 1 otherwise (2 for a file that cannot be read).
"""

from __future__ import annotations

import argparse
import functools
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from streamtrain_operator.job.spec import SpecError, manifest_syntax_error, parse_job
from streamtrain_tools import crdgen

EXIT_INVALID = 1
EXIT_UNREADABLE = 2


@functools.cache
def _schema() -> dict[str, Any]:
    """The CRD's OpenAPI schema, generated once per process."""
    return crdgen.openapi_schema(crdgen.crd())


def _at(document: Any, path: str) -> Any:
    for part in path.split("."):
        if not isinstance(document, dict) or part not in document:
            return None
        document = document[part]
    return document


def cel_violations(
    spec: dict[str, Any], old: dict[str, Any] | None = None
) -> list[tuple[str, str]]:
    """Every CEL rule of the CRD where the API server evaluates it (after defaulting), as
    ``(field, message)`` of each rule that rejects ``spec``; transition rules only with
    ``old`` (the stored spec of an update)."""
    import celpy  # cel-python: only for this check

    env = celpy.Environment()
    schema = _schema()["properties"]["spec"]
    spec = crdgen.apply_defaults(schema, spec)
    old = None if old is None else crdgen.apply_defaults(schema, old)
    out = []
    for cls, rules in crdgen.SPEC_RULES.items():
        where = crdgen.rule_path(cls)
        value = _at({"spec": spec}, where)
        if value is None:
            continue  # an optional section that is absent: its rules do not run
        for rule in rules:
            transition = "oldSelf" in rule["rule"]
            if transition and old is None:
                continue
            activation = {"self": celpy.json_to_cel(value)}
            if transition:
                activation["oldSelf"] = celpy.json_to_cel(_at({"spec": old}, where))
            if not bool(env.program(env.compile(rule["rule"])).evaluate(activation)):
                out.append((where + rule.get("fieldPath", ""), str(rule["message"])))
    return out


def schema_errors(manifest: dict[str, Any]) -> list[tuple[str, str]]:
    """What the CRD's OpenAPI schema rejects, as ``(field, message)``."""
    import jsonschema

    validator = jsonschema.Draft4Validator(_schema())
    return [
        (".".join(str(p) for p in e.absolute_path) or "manifest", e.message)
        for e in sorted(validator.iter_errors(manifest), key=lambda e: list(e.absolute_path))
    ]


def problems(manifest: Any, base_dir: Path) -> list[tuple[str, str]]:
    """Every problem of one manifest document, each once: the spec parser's (it stops at
    the first), else the schema's, else the CEL rules'."""
    try:
        parse_job(manifest, base_dir=base_dir)
    except SpecError as exc:
        return [(exc.path, exc.message)]
    return schema_errors(manifest) or cel_violations(manifest.get("spec") or {})


def validate_file(path: Path) -> list[str]:
    """The error lines of one file (empty: valid)."""
    try:
        documents = [d for d in yaml.safe_load_all(path.read_text()) if d is not None]
    except yaml.YAMLError as exc:
        return [f"error: {manifest_syntax_error(path, exc)}"]
    if not documents:
        return [f"error: {path}: no manifest in the file"]
    lines = []
    for i, document in enumerate(documents):
        where = str(path) if len(documents) == 1 else f"{path} (document {i + 1})"
        for field, message in problems(document, path.resolve().parent):
            lines.append(f"error: {where}: {field}: {message}")
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="streamtrain validate", description=__doc__.split("\n")[0] if __doc__ else None
    )
    p.add_argument("files", nargs="+", type=Path, metavar="FILE")
    args = p.parse_args(argv)
    code = 0
    for path in args.files:
        try:
            errors = validate_file(path)
        except OSError as exc:
            print(f"error: {path}: {exc.strerror or exc}", file=sys.stderr)
            code = max(code, EXIT_UNREADABLE)
            continue
        for line in errors:
            print(line, file=sys.stderr)
        if errors:
            code = max(code, EXIT_INVALID)
        else:
            print(f"{path}: valid")
    return code


if __name__ == "__main__":
    sys.exit(main())
