"""``streamtrain validate``: offline checks of manifests — exit 0 for valid files, 1 with one
line per problem naming the file and the field; the schema and CEL checks on their own."""

from __future__ import annotations

import copy
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from streamtrain_tools import validate

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((ROOT / "crds" / "examples").glob("*.yaml")) + sorted(
    (ROOT / "examples").glob("*.yaml")
)


def _example() -> dict[str, Any]:
    manifest: dict[str, Any] = yaml.safe_load((ROOT / "crds/examples/ctr-online.yaml").read_text())
    return manifest


def test_the_shipped_examples_are_valid(capsys: pytest.CaptureFixture[str]) -> None:
    assert validate.main([str(p) for p in EXAMPLES]) == 0
    out = capsys.readouterr().out
    assert out.splitlines() == [f"{p}: valid" for p in EXAMPLES]


def test_an_invalid_manifest_is_named_with_its_field_once(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = _example()
    bad["spec"]["data"]["splitIntervalMinutes"] = 7  # the spec, the schema's CEL rule: once
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(bad))
    good = ROOT / "crds/examples/minimal.yaml"
    assert validate.main([str(good), str(path)]) == validate.EXIT_INVALID
    captured = capsys.readouterr()
    assert captured.out == f"{good}: valid\n"
    assert captured.err == (
        f"error: {path}: spec.data.splitIntervalMinutes: must divide 1440, got 7\n"
    )


def test_a_yaml_error_and_a_missing_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "broken.yaml"
    path.write_text("kind: [StreamingTrainingJob\n")
    assert validate.main([str(path)]) == validate.EXIT_INVALID
    assert capsys.readouterr().err == (
        f"error: {path}:2:1: not valid YAML: expected ',' or ']', but got '<stream end>' "
        "(while parsing a flow sequence)\n"
    )
    assert validate.main([str(tmp_path / "nope.yaml")]) == validate.EXIT_UNREADABLE
    assert (
        capsys.readouterr().err == f"error: {tmp_path / 'nope.yaml'}: No such file or directory\n"
    )


def test_the_crd_schema_and_cel_rules_on_their_own() -> None:
    """Each layer rejects on its own (the spec parser, run first, usually answers before)."""
    manifest = _example()
    assert validate.schema_errors(manifest) == []
    typed = copy.deepcopy(manifest)
    typed["spec"]["workers"]["replicas"] = "4"
    assert validate.schema_errors(typed) == [
        ("spec.workers.replicas", "'4' is not of type 'integer'")
    ]
    spec = copy.deepcopy(manifest["spec"])
    spec["data"]["endDay"] = "20261031"
    assert validate.cel_violations(spec) == [("spec.data.endDay", "endDay must be >= startDay")]


def test_the_cli_runs_it(tmp_path: Path) -> None:
    bad = _example()
    bad["spec"]["data"]["formatt"] = "slot"
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(bad))
    done = subprocess.run(
        [sys.executable, "-m", "streamtrain_operator.cli", "validate", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 1
    assert done.stderr.startswith(
        f"error: {path}: spec.data.formatt: unknown field; did you mean format? (known: "
    ), done.stderr
