"""``make chart`` (``python -m streamtrain_tools.chart``): the chart rendered offline, to
stdout or one file per template, values files merged and checked against the schema."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from streamtrain_tools import chart


def test_renders_to_stdout_and_to_files(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert chart.main([]) == 0
    docs = [d for d in yaml.safe_load_all(capsys.readouterr().out) if d]
    kinds = {d["kind"] for d in docs}
    assert {"CustomResourceDefinition", "Deployment", "ServiceAccount"} <= kinds
    values = tmp_path / "values.yaml"
    values.write_text(yaml.safe_dump({"metrics": {"podMonitor": {"enabled": True}}}))
    out = tmp_path / "render"
    assert chart.main(["-f", str(values), "--out", str(out)]) == 0
    shown = {
        p for p, text in chart.render(yaml.safe_load(values.read_text())).items() if text.strip()
    }
    assert capsys.readouterr().out == (
        f"rendered {len(shown)} templates of {chart.CHART} into {out}/\n"
    )
    assert {str(p.relative_to(out)) for p in out.rglob("*") if p.is_file()} == shown
    monitor = yaml.safe_load((out / "streamtrain/templates/podmonitor.yaml").read_text())
    assert monitor["kind"] == "PodMonitor"
    assert (out / "streamtrain/templates/NOTES.txt").read_text().strip()
