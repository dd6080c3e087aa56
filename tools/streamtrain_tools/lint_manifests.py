"""``python -m streamtrain_tools.lint_manifests --checkov PATH`` (``make lint-manifests``):
checkov over everything streamtrain puts into a cluster, failing on any check that is not
accepted in ``docs/security.md``.

What is scanned: the chart rendered with its default values and with cluster scope (the
ValidatingAdmissionPolicy, the ClusterRole), and the objects the operator builds for every
``crds/examples/*.yaml`` job (``kube.desired.desired``, with the chart's default options:
mutual TLS from cert-manager, NetworkPolicies, default resources). The accepted checks are the
rows ``| CKV_... | reason |`` of the table under "Accepted checkov checks" in
``docs/security.md``: one list, with its reasons, read by both people and this tool. A failed
check outside it fails the run (exit 1), naming the check, the object and the file; an
accepted check that no longer fails anywhere is reported, so the list shrinks with the code.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from streamtrain_operator.job.spec import load_job
from streamtrain_operator.kube import desired
from streamtrain_operator.kube import resources as r
from streamtrain_tools import chart

ROOT = Path(__file__).resolve().parents[2]
SECURITY_DOC = ROOT / "docs" / "security.md"
HEADING = "## Accepted checkov checks"
CHART_VALUES: dict[str, dict[str, Any]] = {
    "chart-defaults": {},
    "chart-cluster-scope": {"rbac": {"scope": "cluster"}},
}


def accepted_checks(doc: Path = SECURITY_DOC) -> dict[str, str]:
    """check id -> reason, from the table under ``HEADING``."""
    text = doc.read_text()
    if HEADING not in text:
        raise SystemExit(f"{doc}: no '{HEADING}' section")
    section = text.split(HEADING, 1)[1].split("\n## ", 1)[0]
    out = {}
    for m in re.finditer(r"^\|\s*`?(CKV2?_[A-Z0-9_]+)`?\s*\|\s*(.+?)\s*\|\s*$", section, re.M):
        out[m.group(1)] = m.group(2)
    return out


def write_manifests(out: Path) -> list[Path]:
    """Render every scanned manifest into ``out`` (one multi-document file each)."""
    files = [
        _write(out / f"{name}.yaml", chart.objects(values, name="streamtrain"))
        for name, values in CHART_VALUES.items()
    ]
    options = r.Options(tls="cert-manager")
    for example in sorted((ROOT / "crds" / "examples").glob("*.yaml")):
        job = load_job(example)
        scale = r.Scale(job.spec.ps.replicas, job.spec.workers.replicas)
        objs = desired.desired(job, "00000000-0000-0000-0000-000000000000", scale, 1, options)
        files.append(_write(out / f"job-{example.stem}.yaml", objs))
    return files


def _write(path: Path, docs: Sequence[dict[str, Any]]) -> Path:
    path.write_text(yaml.safe_dump_all(list(docs), sort_keys=False))
    return path


def run_checkov(checkov: str, directory: Path) -> list[dict[str, Any]]:
    """The failed checks of checkov's kubernetes framework over ``directory``."""
    proc = subprocess.run(
        [checkov, "-d", str(directory), "--framework", "kubernetes", "-o", "json", "--quiet"],
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode not in (0, 1) or not proc.stdout.strip():
        raise SystemExit(f"checkov failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
    report = json.loads(proc.stdout)
    reports = report if isinstance(report, list) else [report]
    failed: list[dict[str, Any]] = []
    for rep in reports:
        failed += rep.get("results", {}).get("failed_checks", [])
    return failed


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m streamtrain_tools.lint_manifests")
    p.add_argument("--checkov", default="checkov", help="the checkov executable")
    p.add_argument("--keep", type=Path, help="write the manifests here and keep them")
    args = p.parse_args(argv)
    accepted = accepted_checks()
    with tempfile.TemporaryDirectory(prefix="lint-manifests-") as tmp:
        out = args.keep or Path(tmp)
        out.mkdir(parents=True, exist_ok=True)
        files = write_manifests(out)
        failed = run_checkov(args.checkov, out)
    seen = {f["check_id"] for f in failed}
    unaccepted = [f for f in failed if f["check_id"] not in accepted]
    for f in unaccepted:
        where = Path(f.get("file_path", "?")).name
        print(
            f"FAILED {f['check_id']} {f.get('check_name', '')}: {f.get('resource', '?')} "
            f"in {where}",
            file=sys.stderr,
        )
    for check in sorted(set(accepted) - seen):
        print(f"note: accepted check {check} no longer fails; drop it from {SECURITY_DOC.name}")
    print(
        f"checkov over {len(files)} manifest files: {len(failed)} failed checks, "
        f"{len(failed) - len(unaccepted)} of them accepted ({len(seen & set(accepted))} ids), "
        f"{len(unaccepted)} not accepted"
    )
    return 1 if unaccepted else 0


if __name__ == "__main__":
    raise SystemExit(main())
