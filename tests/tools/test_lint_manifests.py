"""``make lint-manifests``' checkov gate (``streamtrain_tools.lint_manifests``): the accepted
checks are read from docs/security.md, each with its reason; a failed check outside them
fails the run naming it, accepted ones pass. checkov itself is stood in for by a script
printing its JSON report (the real one runs in ``make lint-manifests``)."""

from __future__ import annotations

import json
import stat
import sys
from pathlib import Path

import pytest

from streamtrain_tools import lint_manifests


def test_every_accepted_check_has_a_reason() -> None:
    accepted = lint_manifests.accepted_checks()
    assert "CKV_K8S_43" in accepted
    assert all(len(reason) > 40 for reason in accepted.values()), accepted


def _fake_checkov(tmp_path: Path, failed: list[str]) -> Path:
    report = {
        "check_type": "kubernetes",
        "results": {
            "failed_checks": [
                {
                    "check_id": c,
                    "check_name": "x",
                    "resource": "StatefulSet.ns.a",
                    "file_path": "/a.yaml",
                }
                for c in failed
            ]
        },
    }
    script = tmp_path / "checkov"
    script.write_text(f"#!{sys.executable}\nprint({json.dumps(json.dumps(report))})\n")
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return script


def test_an_unaccepted_failed_check_fails_the_run_naming_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    keep = tmp_path / "manifests"
    ok = _fake_checkov(tmp_path, ["CKV_K8S_43", "CKV_K8S_11"])
    assert lint_manifests.main(["--checkov", str(ok), "--keep", str(keep)]) == 0
    names = sorted(p.name for p in keep.glob("*.yaml"))
    assert "chart-defaults.yaml" in names and "job-minimal.yaml" in names
    bad = _fake_checkov(tmp_path, ["CKV_K8S_43", "CKV_K8S_16"])
    assert lint_manifests.main(["--checkov", str(bad), "--keep", str(keep)]) == 1
    assert "FAILED CKV_K8S_16" in capsys.readouterr().err
