"""bench-quality's plumbing (not its numbers): every learner scores every pass of tiny
streams, one JSON object last, each learner's AUCs those of a model that learned something."""

from __future__ import annotations

import json
import math
import random
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from streamtrain_tools.bench.quality import run as quality
from streamtrain_tools.bench.quality.learners import PassScore, previous_rate_scores
from streamtrain_tools.bench.quality.streams import build, family_config

AVAZU_HEADER = (
    "id,click,hour,C1,banner_pos,site_id,site_domain,site_category,app_id,app_domain,"
    "app_category,device_id,device_ip,device_model,device_type,device_conn_type,C14,C15,C16,"
    "C17,C18,C19,C20,C21"
)


def tiny_samples(folder: Path, rows: int = 1200) -> Path:
    """Criteo- and Avazu-shaped files whose click rate depends on one column (learnable)."""
    rng = random.Random(0)
    criteo, avazu = [], [AVAZU_HEADER]
    for i in range(rows):
        hot = rng.random() < 0.3
        click = int(rng.random() < (0.6 if hot else 0.1))
        ints = [str(rng.randint(0, 50)) if rng.random() < 0.9 else "" for _ in range(13)]
        cats = [f"{rng.randrange(16):08x}" for _ in range(25)]
        criteo.append("\t".join([str(click), *ints, "cafe0001" if hot else "beef0002", *cats]))
        cells = [f"{rng.randrange(8):x}" for _ in range(21)]
        cells[2] = "hotsite" if hot else "coldsite"
        avazu.append(",".join([str(i), str(click), "14102100", *cells]))
    (folder / "criteo_kaggle_sample_train.txt").write_text("\n".join(criteo) + "\n")
    (folder / "avazu_sample_train.csv").write_text("\n".join(avazu) + "\n")
    tiny_ipinyou(folder, rows * 4, rng)
    return folder


def tiny_ipinyou(folder: Path, rows: int, rng: random.Random) -> None:
    """An iPinYou-shaped libSVM file (3 one-hot fields, one of them learnable) and its map."""
    fields = {"domain": 2, "slot": 8, "creative": 8}
    index, featindex = {}, []
    for field, values in fields.items():
        for v in range(values):
            index[field, v] = len(featindex)
            featindex.append(f"{field}:{v}\t{index[field, v]}")
    lines = []
    for _ in range(rows):
        hot = rng.random() < 0.3
        click = int(rng.random() < (0.6 if hot else 0.1))
        cells = [index["domain", int(hot)], index["slot", rng.randrange(8)]]
        cells.append(index["creative", rng.randrange(8)])
        lines.append(" ".join([str(click), *(f"{i}:1" for i in cells)]))
    (folder / "ipinyou_deepctr_train.fm.txt").write_text("\n".join(lines) + "\n")
    (folder / "ipinyou_deepctr_featindex.fm.txt").write_text("\n".join(featindex) + "\n")


def run(capsys: pytest.CaptureFixture[str], argv: list[str]) -> dict[str, Any]:
    assert quality.main(["--json", "--quick", *argv]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    result: dict[str, Any] = json.loads(lines[-1])
    return result


def check_learner(summary: dict[str, Any], windows: list[str], passes: int) -> None:
    assert list(summary["windows"]) == windows
    assert len(summary["copc_per_pass"]) == passes
    spread = summary["copc_spread"]
    assert 0 <= spread["within_band"] <= spread["passes_min_clicks"] <= passes
    for window in summary["windows"].values():
        assert 0.5 < window["auc"] < 1.0
        assert window["loss"] > 0 and window["copc"] > 0


def test_the_three_learners_side_by_side_on_the_long_tail_stream(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    result = run(capsys, ["--streams", "longtail", "--workdir", str(tmp_path)])
    stream = result["streams"]["longtail"]
    assert (stream["passes"], stream["windows"]) == (8, ["day 1", "day 2"])
    assert all(0.6 < auc < 1.0 for auc in stream["oracle_auc"].values())
    learners = stream["learners"]
    vw = [k for k in learners if k.startswith("vw ")]
    assert len(vw) >= 3 and learners["vw_best"] in vw
    for name in ["streamtrain", "torch", *vw]:
        check_learner(learners[name], ["day 1", "day 2"], 8)
    # Every pass after the first scored by the delta published after the pass before.
    # So is VW's: its model after the pass before, predicting only.
    for name in ("streamtrain", learners["vw_best"]):
        following = learners[name]["next_pass"]["copc_per_pass"]
        assert following[0] is None and all(c is not None and c > 0 for c in following[1:])
    assert (
        learners[learners["vw_best"]]["next_pass"]["copc_per_pass"][1:]
        != learners[learners["vw_best"]]["copc_per_pass"][1:]
    )
    previous = stream["previous_rate"]["copc_per_pass"]
    assert previous[0] is None and all(c is not None and c > 0 for c in previous[1:])
    for key in ("streamtrain_minus_vw_best", "streamtrain_minus_torch"):
        assert set(stream[key]) == {"day 1", "day 2"}


def test_the_sample_streams_read_alike_by_vw_and_torch(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    data = tiny_samples(tmp_path)
    names = ["criteo", "avazu", "ipinyou"]
    argv = ["--streams", *names, "--learners", "vw", "torch", "--data-dir", str(data)]
    result = run(capsys, [*argv, "--workdir", str(tmp_path / "runs")])
    for name in names:
        stream = result["streams"][name]
        assert (stream["passes"], stream["windows"]) == (8, ["passes 5-8"])
        for learner, summary in stream["learners"].items():
            if learner != "vw_best":
                check_learner(summary, ["passes 5-8"], 8)


def test_vw_sees_the_tokens_the_slots_hold(tmp_path: Path) -> None:
    data = tiny_samples(tmp_path)
    criteo = build("criteo", tmp_path / "c", quick=True, data_dir=data)
    first = next(criteo.vw_lines(next(criteo.passes[0][1].glob("part-*"))))
    label, _, features = first.partition(" |f ")
    assert label in ("1", "-1")
    tokens = features.split()
    assert len([t for t in tokens if t.startswith("C")]) == 26
    assert all(t.split("_")[1].lstrip("n").isdigit() for t in tokens if t.startswith("I"))


def test_families_draw_a_printed_seed_that_reproduces_them(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    argv = ["--streams", "hourly", "lowctr", "--learners", "vw"]
    first = run(capsys, [*argv, "--workdir", str(tmp_path / "a")])
    seed = first["family_seed"]
    again = run(capsys, [*argv, "--workdir", str(tmp_path / "b"), "--family-seed", str(seed)])
    other = run(capsys, [*argv, "--workdir", str(tmp_path / "c"), "--family-seed", str(seed + 7)])
    for name in ("hourly", "lowctr"):
        stream = first["streams"][name]
        assert stream["windows"] == ["day 1", "day 2"]
        repeat = again["streams"][name]
        assert stream["oracle_auc"] == repeat["oracle_auc"]
        best = stream["learners"]["vw_best"]
        assert repeat["learners"]["vw_best"] == best
        # VW is deterministic: the same seed gives the same scores.
        assert stream["learners"][best]["windows"] == repeat["learners"][best]["windows"]
        assert stream["oracle_auc"] != other["streams"][name]["oracle_auc"]
    # The families differ in kind: the low-CTR family clicks far less than the hourly one
    # (over all passes of a fixed draw: one hour's offset can take either rate far off).
    rates = {}
    for name in ("hourly", "lowctr"):
        data = build(name, tmp_path / "d", quick=True, family_seed=0)
        lines = [
            line
            for _, folder in data.passes
            for part in folder.glob("part-*")
            for line in part.read_text().splitlines()
        ]
        rates[name] = sum(line.startswith("click:1") for line in lines) / len(lines)
    assert rates["lowctr"] < 0.05 and rates["hourly"] > 0.1, rates


def test_the_table_has_a_row_per_stream_and_window(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    assert (
        quality.main(
            [
                "--quick",
                "--streams",
                "pairs",
                "--learners",
                "vw",
                "--family-seed",
                "3",
                "--workdir",
                str(tmp_path / "t"),
            ]
        )
        == 0
    )
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "family seed: 3 (--family-seed 3 reproduces)"
    rows = [line for line in lines if line.startswith("| pairs day")]
    assert [r.split(" | ")[0] for r in rows] == ["| pairs day 1", "| pairs day 2"]
    assert all("of 4 |" in r for r in rows)


def test_the_next_pass_spread_counts_the_band_and_the_mean_log_error_per_window() -> None:
    """Of the passes with at least 500 clicks: how many are within 0.9-1.1, and the mean
    ``|log COPC|`` of them; a window without such a pass has no error."""

    folders = ["20261101/0000", "20261101/0030", "20261101/0100", "20261102/0000"]
    days = SimpleNamespace(
        windows={"day 1": [0, 1, 2], "day 2": [3]},
        passes=[(f[:8], Path(f)) for f in folders],
    )
    scores = [
        PassScore(5000, 500, 0.7, 0.3, 2.0),
        PassScore(5000, 600, 0.7, 0.3, 0.95),
        PassScore(5000, 100, 0.7, 0.3, 5.0),  # too few clicks to count
        PassScore(5000, 499, 0.7, 0.3, 1.0),
    ]
    spread = quality.next_pass_spread(days, [None, *scores[1:]])  # type: ignore[arg-type]
    assert spread["per_window"] == {"day 1": [1, 1], "day 2": [0, 0]}
    assert spread["error_per_window"]["day 1"] == pytest.approx(abs(math.log(0.95)), abs=1e-4)
    assert spread["error_per_window"]["day 2"] is None
    both = quality.next_pass_spread(days, scores)  # type: ignore[arg-type]
    want = (math.log(2.0) + abs(math.log(0.95))) / 2
    assert both["error_per_window"]["day 1"] == pytest.approx(want, abs=1e-4)
    assert quality.mean_log_error([0.0]) == pytest.approx(-math.log(sys.float_info.min))
    # pass 1 (00:30) and pass 3 (day 2's 00:00) are of an hour seen before, pass 2 is not
    assert quality.hours_seen_before(days) == [False, True, False, True]  # type: ignore[arg-type]
    assert both["by_hour"] == {"seen": [1, 1], "new": [0, 1]}
    scores[2] = PassScore(5000, 700, 0.7, 0.3, 1.05)  # a new hour's pass, in the band
    assert quality.next_pass_spread(days, scores)["by_hour"] == {  # type: ignore[arg-type]
        "seen": [1, 1],
        "new": [1, 2],
    }


def test_the_previous_rate_reference_is_each_pass_rate_over_the_one_before() -> None:
    scores = [
        PassScore(1000, 100, 0.7, 0.3, 1.0),
        PassScore(2000, 400, 0.7, 0.3, 1.0),
        PassScore(500, 50, None, None, None),
    ]
    previous = previous_rate_scores(scores)
    assert previous[0] is None
    assert [p.copc for p in previous[1:] if p is not None] == pytest.approx([2.0, 0.5])
    assert all(p.auc is None for p in previous[1:] if p is not None)


def test_the_issue_shape_lengthens_the_passes_and_keeps_the_kinds(tmp_path: Path) -> None:
    """``--family-shape issue``: the issue's held-back streams' days and pass sizes (3 x 24
    x 4,000 rows; 2 x 48 x 2,000), the same kinds (rates, groups, drift) as the bench's."""
    for name, days, rows in [("hourly", 3, 4000), ("lowctr", 3, 4000), ("halfhour", 2, 2000)]:
        bench = family_config(name, tmp_path / name, quick=False, seed=1)
        issue = family_config(name, tmp_path / name, quick=False, seed=1, shape="issue")
        assert (issue.days, issue.rows_per_folder) == (days, rows)
        assert issue.split_interval_minutes == bench.split_interval_minutes
        assert issue.hour_strength == bench.hour_strength
        assert issue.num_groups == bench.num_groups
    with pytest.raises(ValueError, match="family shape 'huge'"):
        family_config("hourly", tmp_path, quick=False, seed=1, shape="huge")
