"""The synthetic stream: layout, donefiles, oracle AUC, determinism, drift, delayed donefiles."""

from __future__ import annotations

import itertools
import json
import time
from pathlib import Path

import numpy as np
import pytest

from streamtrain_worker.data import layout, synth, timeslices
from streamtrain_worker.data.config import DataConfig
from streamtrain_worker.data.reader import iter_batches


def small(out: Path, **extra: object) -> synth.SynthConfig:
    options: dict[str, object] = {
        "out": str(out),
        "days": 2,
        "split_interval_minutes": 240,
        "splits_per_pass": 3,
        "rows_per_folder": 400,
        "num_users": 2000,
        "num_items": 500,
    }
    options.update(extra)
    return synth.SynthConfig(**options)  # type: ignore[arg-type]


def test_layout_donefiles_and_readable_data(tmp_path: Path) -> None:
    cfg = small(tmp_path)
    result = synth.generate(cfg)
    assert len(result.folders) == 12  # 2 days x 6 folders of 4 hours
    assert result.folders[:2] == [f"{tmp_path}/20261101/0000", f"{tmp_path}/20261101/0400"]
    for folder in result.folders:
        assert layout.folder_ready(folder)
        assert [Path(p).name for p, _ in layout.list_part_files(folder)] == [
            "part-00000",
            "part-00001",
        ]
    data = DataConfig.from_dict(json.loads((tmp_path / "data.json").read_text()))
    assert data.slot_names == synth.SLOTS
    assert data.sequenceSlot == synth.SEQUENCE_SLOT
    files = [
        p
        for f in timeslices.pass_folders(str(tmp_path), "20261102", 2, 240, 3)
        for p, _ in layout.list_part_files(f)
    ]
    batches = list(iter_batches(files, data, 256))
    assert sum(b.size for b in batches) == 1200
    assert data.num_slots == len(synth.SLOTS) + 15  # the pairs of the six single slots
    counts = np.diff(batches[0].offsets).reshape(-1, data.num_slots)
    assert np.all(counts[:, :6] == 1)
    assert np.all((counts[:, 6] >= 3) & (counts[:, 6] <= 12))  # the behaviour sequence
    assert np.all(counts[:, 7:] == 1)


def test_oracle_auc_is_informative_and_recorded(tmp_path: Path) -> None:
    result = synth.generate(small(tmp_path))
    oracle = json.loads((tmp_path / "oracle.json").read_text())
    assert [(p["day"], p["pass_index"]) for p in oracle["passes"]] == [
        ("20261101", 1),
        ("20261101", 2),
        ("20261102", 1),
        ("20261102", 2),
    ]
    for p in result.passes:
        assert p.rows == 1200
        assert 0 < p.positives < p.rows
        assert p.oracle_auc > 0.6
    assert oracle["passes"][0]["oracle_auc"] == result.passes[0].oracle_auc


def test_deterministic_by_seed(tmp_path: Path) -> None:
    synth.generate(small(tmp_path / "a", seed=3))
    synth.generate(small(tmp_path / "b", seed=3))
    synth.generate(small(tmp_path / "c", seed=4))
    part = Path("20261102") / "0400" / "part-00001"
    assert (tmp_path / "a" / part).read_bytes() == (tmp_path / "b" / part).read_bytes()
    assert (tmp_path / "a" / part).read_bytes() != (tmp_path / "c" / part).read_bytes()


def test_new_features_appear_each_day(tmp_path: Path) -> None:
    synth.generate(small(tmp_path, new_feature_fraction=0.2))

    def items(day: str) -> set[int]:
        ids: set[int] = set()
        for part in (tmp_path / day).glob("*/part-*"):
            for token in part.read_text().split():
                value, _, slot = token.partition(":")
                if slot == "item":
                    ids.add(int(value))
        return ids

    first, second = items("20261101"), items("20261102")
    assert max(first) < 500  # day one only knows the initial ids
    assert {i for i in second if i >= 500}  # day two brings brand-new ids


def test_auc_matches_pairwise_counting() -> None:
    rng = np.random.default_rng(0)
    scores = rng.integers(0, 5, 60).astype(np.float64)  # many ties
    labels = rng.integers(0, 2, 60)
    wins = 0.0
    pairs = 0
    for i, j in itertools.product(np.flatnonzero(labels == 1), np.flatnonzero(labels == 0)):
        pairs += 1
        wins += 1.0 if scores[i] > scores[j] else 0.5 if scores[i] == scores[j] else 0.0
    assert synth.auc(scores, labels) == pytest.approx(wins / pairs)
    assert synth.auc(scores, np.zeros(60, dtype=np.int64)) == 0.5


def test_delayed_donefiles_arrive_in_order(tmp_path: Path) -> None:
    cfg = small(tmp_path, days=1, rows_per_folder=20)
    result, writer = synth.generate_delayed(cfg, delay_seconds=0.2)
    try:
        assert not layout.folder_ready(result.folders[-1])
        deadline = time.monotonic() + 30
        while not layout.folder_ready(result.folders[-1]) and time.monotonic() < deadline:
            time.sleep(0.01)  # polling with a timeout
        assert all(layout.folder_ready(f) for f in result.folders)
    finally:
        writer.stop()
    assert writer.written == len(result.folders)


def test_cli_writes_and_reports(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    synth.main(
        [
            "--out", str(tmp_path), "--days", "1", "--start", "20261231",
            "--split-interval-minutes", "720", "--rows-per-folder", "50", "--seed", "7",
        ]
    )  # fmt: skip
    lines = capsys.readouterr().out.strip().splitlines()
    assert json.loads(lines[0])["day"] == "20261231"
    summary = json.loads(lines[-1])
    assert (summary["folders"], summary["passes"]) == (2, 2)
    assert layout.folder_ready(str(tmp_path / "20261231" / "1200"))


def test_group_interaction_adds_signal_only_when_asked(tmp_path: Path) -> None:
    plain = synth.generate(small(tmp_path / "plain", seed=5))
    same = synth.generate(small(tmp_path / "same", seed=5, num_groups=0, group_strength=3.0))
    grouped = synth.generate(small(tmp_path / "grouped", seed=5, num_groups=4, group_strength=1.5))
    part = Path("20261102") / "0400" / "part-00001"
    # num_groups 0 draws nothing: the stream of a seed is what it was before the option.
    assert (tmp_path / "plain" / part).read_bytes() == (tmp_path / "same" / part).read_bytes()
    assert [p.oracle_auc for p in same.passes] == [p.oracle_auc for p in plain.passes]
    # A strong hidden user-group x item-group term makes the clicks easier to rank for the
    # generator (which knows the groups), on every pass.
    for with_groups, without in zip(grouped.passes, plain.passes, strict=True):
        assert with_groups.oracle_auc > without.oracle_auc


def test_cli_rejects_a_negative_group_count(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="num_groups"):
        synth.main(["--out", str(tmp_path), "--num-groups", "-1"])


def test_hour_effect_and_base_rate_are_settable(tmp_path: Path) -> None:
    plain = synth.generate(small(tmp_path / "plain", seed=5))
    same = synth.generate(small(tmp_path / "same", seed=5, hour_strength=0.0))
    hourly = synth.generate(
        small(
            tmp_path / "hourly",
            seed=5,
            days=1,
            split_interval_minutes=60,
            splits_per_pass=1,
            rows_per_folder=2000,
            hour_strength=1.5,
        )
    )
    rare = synth.generate(small(tmp_path / "rare", seed=5, base_logit=-4.5))
    assert [p.oracle_auc for p in same.passes] == [p.oracle_auc for p in plain.passes]
    # A strong per-hour offset: the click rate of adjacent hours differs by several points
    # somewhere in the day (the mild sine of the default moves it by ~1 point an hour).
    rates = np.array([p.positives / p.rows for p in hourly.passes])
    assert np.abs(np.diff(rates)).max() > 0.1
    rare_rate = sum(p.positives for p in rare.passes) / sum(p.rows for p in rare.passes)
    plain_rate = sum(p.positives for p in plain.passes) / sum(p.rows for p in plain.passes)
    assert rare_rate < 0.05 < plain_rate


def test_cli_takes_the_hour_effect(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    synth.main(
        [
            "--out",
            str(tmp_path),
            "--days",
            "1",
            "--split-interval-minutes",
            "720",
            "--rows-per-folder",
            "50",
            "--num-users",
            "100",
            "--num-items",
            "50",
            "--hour-strength",
            "1.0",
            "--base-logit",
            "-3",
        ]
    )
    oracle = json.loads((tmp_path / "oracle.json").read_text())
    assert oracle["config"]["hour_strength"] == 1.0
    assert oracle["config"]["base_logit"] == -3.0
