"""``streamtrain predict`` scores per row, takes unlabelled rows, and answers bad input with
one line naming the file."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import numpy as np
import pytest

from streamtrain_tools.bench.serving.models import Export, keys_of, lines, rows_for
from streamtrain_worker.publishing import predict
from streamtrain_worker.publishing.model_folder import ModelKind


@pytest.fixture
def export(tmp_path: Path) -> Export:
    ex = Export(tmp_path / "export")
    keys = keys_of(range(20))
    ex.publish(ModelKind.DELTA, "20261101", 1, keys, rows_for(keys, 1))
    gone = keys_of([3])
    ex.publish(ModelKind.DELTA, "20261101", 2, keys[:5], rows_for(keys[:5], 2), gone)
    return ex


def test_rows_csv_carry_the_model_key_and_unlabelled_rows_are_scored_not_counted(
    export: Export, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = tmp_path / "mixed.txt"
    data.write_text(lines([1, 2, 3, 4]) + lines([5, 6], labelled=False))
    assert predict.main(["--export", str(export.root), "--rows", "csv", str(data)]) == 0
    out, err = capsys.readouterr()
    rows = list(csv.DictReader(io.StringIO(out)))
    assert [r["row"] for r in rows] == ["0", "1", "2", "3", "4", "5"]
    assert {r["model"] for r in rows} == {"20261101/delta-2"}
    assert [r["label"] for r in rows] == ["1", "0", "1", "0", "", ""]
    scores = [float(r["score"]) for r in rows]
    assert all(0.0 < s < 1.0 for s in scores)
    summary = json.loads(err.strip().splitlines()[-1])
    assert summary["examples"] == 4  # metrics over the labelled rows only

    # The same rows through the library scorer give the same numbers, row by row.
    model = predict.load_model(str(export.root))
    buffer = io.StringIO()
    predict.score(model, [str(data)], 2, predict.RowWriter(buffer, "jsonl", model.key))
    records = [json.loads(x) for x in buffer.getvalue().splitlines()]
    assert [r["label"] for r in records] == [1, 0, 1, 0, None, None]
    np.testing.assert_allclose([r["score"] for r in records], scores, rtol=0, atol=1e-12)


def test_only_unlabelled_rows_give_scores_and_no_metric(
    export: Export, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = tmp_path / "unlabelled.txt"
    data.write_text(lines([1, 2, 3], labelled=False))
    out_file = tmp_path / "scores.jsonl"
    argv = ["--export", str(export.root), "--rows", "jsonl", "--out", str(out_file), "--json"]
    assert predict.main([*argv, str(data)]) == 0
    summary = json.loads(capsys.readouterr().out.strip())
    assert summary["examples"] == 0 and summary["auc"] is None
    assert len(out_file.read_text().splitlines()) == 3


@pytest.mark.parametrize(
    ("case", "named"),
    [
        ("missing data file", "nowhere.txt"),
        ("no export", "no-export"),
        ("corrupt MODEL.json", "MODEL.json"),
        ("corrupt dense file", "dense.pt"),
        ("garbage data", "garbage.txt"),
        ("unknown model", "20261101/delta-9"),
    ],
)
def test_bad_input_is_one_line_naming_the_file(
    export: Export,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    case: str,
    named: str,
) -> None:
    data = tmp_path / "ok.txt"
    data.write_text(lines([1, 2]))
    root = str(export.root)
    argv = ["--export", root, str(data)]
    if case == "missing data file":
        argv = ["--export", root, str(tmp_path / "nowhere.txt")]
    elif case == "no export":
        argv = ["--export", str(tmp_path / "no-export"), str(data)]
    elif case == "corrupt MODEL.json":
        (export.root / "20261101/delta-2/MODEL.json").write_text("{not json")
    elif case == "corrupt dense file":
        (export.root / "20261101/delta-2/dense/dense.pt").write_bytes(b"junk")
    elif case == "garbage data":
        garbage = tmp_path / "garbage.txt"
        garbage.write_text("no colon here\n" * 5)
        argv = ["--export", root, str(garbage)]
    elif case == "unknown model":
        argv = ["--export", root, "--model", "20261101/delta-9", str(data)]
    assert predict.main(argv) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1, err
    assert err.startswith("error: ") and named in err, err
    assert "Traceback" not in err
