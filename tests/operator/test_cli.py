"""The ``streamtrain`` CLI paths that start no process: errors, status, default paths."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from streamtrain_operator import cli
from streamtrain_operator.job.plan import StepKey, StepKind
from streamtrain_operator.job.progress import Condition, PassRecord, Phase, Progress, Published
from streamtrain_operator.job.spec import load_job
from streamtrain_operator.run.state import LocalStateFile

MANIFEST = {
    "apiVersion": "streamtrain.io/v1alpha1",
    "kind": "StreamingTrainingJob",
    "metadata": {"name": "ctr"},
    "spec": {
        "data": {"path": "data", "startDay": "20261101", "format": "criteo"},
        "checkpoint": {"path": "ckpt"},
        "export": {"path": "s3://models/serving"},
    },
}


def write(tmp_path: Path, manifest: dict[str, object]) -> Path:
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(manifest))
    return path


def test_run_with_an_invalid_manifest_names_the_field(tmp_path: Path) -> None:
    bad = yaml.safe_load(yaml.safe_dump(MANIFEST))
    bad["spec"]["data"]["splitIntervalMinutes"] = 7
    with pytest.raises(SystemExit, match=r"spec\.data\.splitIntervalMinutes: must divide 1440"):
        cli.main(["run", str(write(tmp_path, bad))])


def test_run_with_a_missing_manifest(tmp_path: Path) -> None:
    with pytest.raises(SystemExit, match="No such file"):
        cli.main(["run", str(tmp_path / "nope.yaml")])


def test_a_yaml_error_names_the_file_once_with_line_and_column(tmp_path: Path) -> None:
    path = tmp_path / "job.yaml"
    path.write_text("apiVersion: streamtrain.io/v1alpha1\nspec:\n  data: {path: d\n  x: 1\n")
    with pytest.raises(SystemExit) as exited:
        cli.main(["run", str(path)])
    assert str(exited.value) == (
        f"error: {path}:4:4: not valid YAML: expected ',' or '}}', but got ':' "
        "(while parsing a flow mapping)"
    )


def test_an_unknown_field_suggests_the_closest_known_name(tmp_path: Path) -> None:
    bad = yaml.safe_load(yaml.safe_dump(MANIFEST))
    bad["spec"]["data"]["splitPerPass"] = 2
    path = write(tmp_path, bad)
    with pytest.raises(SystemExit) as exited:
        cli.main(["run", str(path)])
    assert str(exited.value).startswith(
        f"error: {path}: spec.data.splitPerPass: unknown field; did you mean splitsPerPass? "
        "(known: "
    )


def test_a_missing_data_root_is_its_own_error_at_start(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write(tmp_path, MANIFEST)
    assert cli.main(["run", str(path)]) == cli.EXIT_FAILED
    assert capsys.readouterr().err == (
        f"error: {path}: spec.data.path: the data root {tmp_path / 'data'} does not exist "
        "(create it, or fix the path; the job waits for folders inside it, never for the "
        "root itself)\n"
    )


def test_status_shows_a_failure_once(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    state = tmp_path / "state.json"
    message = "pass 20261101/2: no donefile after 1s in /d/20261101/0300"
    failed = Progress(phase=Phase.FAILED, message=f"DataMissing: {message}").with_condition(
        Condition("Failed", "True", "DataMissing", message, 1.0)
    )
    LocalStateFile(state).save(failed)
    assert cli.main(["status", "--state", str(state)]) == 0
    out = capsys.readouterr().out
    assert out.count("no donefile") == 1, out
    assert out.splitlines()[0] == f"phase:           Failed (DataMissing: {message})"


def test_default_state_lives_next_to_local_checkpoints(tmp_path: Path) -> None:
    job = load_job(write(tmp_path, MANIFEST))
    work = cli.default_workdir(job)
    assert work == Path(".streamtrain/ctr")
    assert cli.default_state_path(job, work) == tmp_path / "ckpt" / "_state" / "ctr.json"
    remote = yaml.safe_load(yaml.safe_dump(MANIFEST))
    remote["spec"]["checkpoint"]["path"] = "s3://models/ckpt"
    job = load_job(write(tmp_path, remote))
    assert cli.default_state_path(job, work) == work / "state.json"


def test_status_before_and_after_progress(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    manifest = write(tmp_path, MANIFEST)
    assert cli.main(["status", str(manifest)]) == 0
    assert "no progress recorded yet" in capsys.readouterr().out
    key = StepKey("20261101", 3, StepKind.CHECKPOINT)
    progress = replace(
        Progress(generation=2, phase=Phase.WAITING),
        current=StepKey("20261101", 4, StepKind.TRAIN),
        completed=key,
        checkpoint=Published(key, "/ckpt/20261101/pass-3-g2"),
        history=(PassRecord("20261101", 3, 2, {"auc": 0.7412, "examples": 10.0}),),
    ).with_condition(Condition("DataMissing", "True", "DonefileLate", "no donefile in /d", 1.0))
    LocalStateFile(tmp_path / "ckpt" / "_state" / "ctr.json").save(progress)
    assert cli.main(["status", str(manifest)]) == 0
    out = capsys.readouterr().out
    assert "phase:           WaitingForData" in out
    assert "current:         20261101/4 train" in out
    assert "last checkpoint: 20261101/3 checkpoint -> /ckpt/20261101/pass-3-g2" in out
    assert "auc 0.7412" in out
    assert "condition DataMissing: DonefileLate: no donefile in /d" in out
    assert cli.main(["status", "--state", str(tmp_path / "ckpt/_state/ctr.json"), "--json"]) == 0
    assert '"phase": "WaitingForData"' in capsys.readouterr().out


def test_status_needs_a_manifest_or_a_state_file(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["status"]) == cli.EXIT_USAGE
    assert "give the job manifest or --state" in capsys.readouterr().err


def test_corrupt_state_file_is_a_clear_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    state = tmp_path / "state.json"
    state.write_text("{not json")
    assert cli.main(["status", "--state", str(state)]) == cli.EXIT_USAGE
    assert "not a streamtrain state file" in capsys.readouterr().err
