"""``make bench-peer``'s pure parts: the Criteo rows in the peer's input format, the role
environment, and the medians and ratios. Nothing here imports the peer's library."""

from __future__ import annotations

import io
import subprocess
import sys
from pathlib import Path

import pytest

from streamtrain_tools.bench.peer import pipe as peer_format
from streamtrain_tools.bench.peer import run as peer
from streamtrain_tools.samples import SAMPLES_DIR
from streamtrain_worker.data.formats.kernel import bucket

SAMPLE = SAMPLES_DIR / "criteo_kaggle_sample_train.txt"


def groups(line: str) -> list[list[int]]:
    """A MultiSlot line as its groups of values (each group: count, then the values)."""
    numbers = [int(x) for x in line.split()]
    out = []
    while numbers:
        count = numbers.pop(0)
        out.append(numbers[:count])
        del numbers[:count]
    return out


def test_a_criteo_row_becomes_show_click_and_one_sign_per_slot() -> None:
    row = "1\t5\t\t-3\t" + "\t".join(["7"] * 10) + "\t68fd1e64\t" + "\t".join([""] * 25)
    out = groups(peer_format.convert_line(row, 1))
    assert len(out) == 2 + 39
    assert out[:2] == [[1], [1]]  # one show, the click label
    signs = [g[0] for g in out[2:]]
    assert all(len(g) == 1 for g in out[2:])
    assert all(0 < s < 1 << 38 for s in signs)
    # slot i's signs carry i + 1 in their high bits: equal tokens in two slots never meet
    assert [s >> 32 for s in signs] == list(range(1, 40))
    assert signs[0] == peer_format.sign(0, str(bucket(5)))
    assert signs[1] == peer_format.sign(1, peer_format.MISSING)
    assert signs[2] == peer_format.sign(2, "-3")
    assert signs[13] == peer_format.sign(13, "68fd1e64")
    assert signs[14] == peer_format.sign(14, "")  # an empty C-column is a token of its own
    assert peer_format.convert_line(row.replace("1", "0", 1), 1).startswith("1 1 1 0 ")


def test_integer_buckets_are_this_repositorys() -> None:
    """The peer sees the same integer features as ours: the bucketing of our Criteo parser."""
    for v in [*range(-70, 40), 100, 1382, 10**6, 2**31]:
        assert peer_format.bucket(v) == bucket(v), v


def test_the_sample_converts_without_sign_collisions() -> None:
    """Every distinct (slot, token) of the real sample gets a sign of its own."""
    lines = SAMPLE.read_text().splitlines()
    converted = list(peer_format.convert(lines))
    assert len(converted) == len(lines) == 7200
    tokens: set[tuple[int, str]] = set()
    for line in lines:
        columns = line.split("\t")
        for slot in range(39):
            text = columns[1 + slot]
            if slot < 13:
                text = str(peer_format.bucket(int(text))) if text else peer_format.MISSING
            tokens.add((slot, text))
    signs = {g[0] for line in converted for g in groups(line)[2:]}
    assert len(signs) == len(tokens)
    labels = [groups(line)[1][0] for line in converted]
    assert sum(labels) == 1549  # the sample's positives (data/samples/README.md)


@pytest.mark.parametrize(
    ("row", "message"),
    [
        ("1\t2\t3", "line 7: 3 tab-separated columns, expected 40"),
        ("x" + "\t" * 39, "line 7: label 'x' is not 0 or 1"),
        ("0\tabc" + "\t" * 38, "line 7: I1 = 'abc' is not an integer"),
    ],
)
def test_a_malformed_row_names_its_line(row: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        peer_format.convert_line(row, 7)


def test_the_pipe_runs_under_a_bare_interpreter(tmp_path: Path) -> None:
    """The peer runs the file as its pipe command under its own interpreter, where this
    repository's packages are absent: isolated mode (-I) ignores PYTHONPATH."""
    rows = SAMPLE.read_text().splitlines(keepends=True)[:5]
    done = subprocess.run(
        [sys.executable, "-I", peer_format.__file__],
        input="".join(rows) + "\n",
        capture_output=True,
        text=True,
        check=True,
    )
    sink = io.StringIO()
    peer_format.pipe(io.StringIO("".join(rows)), sink)
    assert done.stdout == sink.getvalue()
    assert len(done.stdout.splitlines()) == 5
    bad = subprocess.run(
        [sys.executable, "-I", peer_format.__file__],
        input=rows[0] + "0\t1\n",
        capture_output=True,
        text=True,
        check=False,
    )
    assert bad.returncode == 2
    assert "line 2: 2 tab-separated columns" in bad.stderr


def test_role_environment_of_a_one_server_one_worker_job() -> None:
    server = peer.role_env("PSERVER", 7001, 7002)
    worker = peer.role_env("TRAINER", 7001, 7002)
    for env in (server, worker):
        assert env["PADDLE_PSERVERS_IP_PORT_LIST"] == "127.0.0.1:7001"
        assert env["PADDLE_TRAINER_ENDPOINTS"] == "127.0.0.1:7002"
        assert env["PADDLE_TRAINERS_NUM"] == "1"
    assert (server["PADDLE_PORT"], worker["PADDLE_PORT"]) == ("7001", "7002")
    assert worker["PADDLE_TRAINER_ID"] == "0" and "PADDLE_TRAINER_ID" not in server
    with pytest.raises(ValueError, match="role 'HETER'"):
        peer.role_env("HETER", 1, 2)


def stats(pos: int, neg: int) -> dict[str, list[int]]:
    """Histograms with the positives above the negatives (AUC 1) or, empty, undefined."""
    return {"pos": [0, pos], "neg": [neg, 0]}


def test_a_peer_run_reads_its_figures_from_the_workers_result() -> None:
    passes = [
        {
            "examples": 600,
            "load_seconds": 0.5,
            "eval_seconds": 1.0,
            "train_seconds": 2.0,
            "save_seconds": 0.25,
            "train_stats": stats(100, 500),
            "eval_stats": stats(100, 500) if i else stats(0, 600),
        }
        for i in range(24)
    ]
    result = {"passes": passes, "day_end_seconds": 3.0, "first_pass_started": 1005.0}
    run = peer.PeerRun.from_result(result, wall=120.0, launched=1000.0)
    figures = run.figures()
    assert figures["train_ex_per_s"] == 24 * 600 / (24 * 2.0)
    assert figures["e2e_ex_per_s"] == 24 * 600 / 120.0
    assert figures["e2e_ex_per_s_without_eval"] == 24 * 600 / (120.0 - 24.0)
    assert figures["startup_seconds"] == 5.0
    assert figures["step_seconds"] == {
        "load": 12.0,
        "eval": 24.0,
        "train": 48.0,
        "save": 6.0,
        "day_end": 3.0,
    }
    assert figures["train_auc_mean_13_24"] == 1.0
    assert run.eval_aucs[0] is None  # one class: no AUC, and passes 13-24 are unaffected
    assert figures["eval_auc_mean_13_24"] == 1.0
    with pytest.raises(ValueError, match="no pass"):
        peer.PeerRun.from_result({**result, "passes": []}, wall=1.0, launched=0.0)


def test_mean_13_24_needs_all_twelve_passes() -> None:
    assert peer.mean_13_24([0.0] * 12 + [0.7] * 6 + [0.8] * 6) == pytest.approx(0.75)
    assert peer.mean_13_24([0.7] * 23) is None
    assert peer.mean_13_24([0.7] * 20 + [None] + [0.7] * 3) is None


def test_ratios_are_medians_of_per_round_ratios() -> None:
    def side(train: float, e2e: float, **extra: float) -> dict[str, float]:
        return {"train_ex_per_s": train, "e2e_ex_per_s": e2e, **extra}

    rounds = [
        {
            "ours": side(9000, 6000, throughput_auc_mean_13_24=0.8),
            "peer_saves_off": side(3000, 1000, train_auc_mean_13_24=0.79),
            "peer_saves_on": side(3000, 500),
        },
        {  # a loaded round: every side slower, the ratios barely move
            "ours": side(4000, 3000, throughput_auc_mean_13_24=0.82),
            "peer_saves_off": side(2000, 600, train_auc_mean_13_24=0.81),
            "peer_saves_on": side(2000, 400),
        },
        {
            "ours": side(8000, 5000, throughput_auc_mean_13_24=0.81),
            "peer_saves_off": side(4000, 1000, train_auc_mean_13_24=0.80),
            "peer_saves_on": side(4000, 250),
        },
    ]
    summary = peer.summarize(rounds)
    assert summary["train_ratio"] == 2.0  # per round 3, 2, 2
    assert summary["e2e_ratio_saves_off"] == 5.0  # 6, 5, 5
    assert summary["e2e_ratio_saves_on"] == 12.0  # 12, 7.5, 20
    medians = summary["medians"]
    assert medians["ours"] == {
        "train_ex_per_s": 8000,
        "e2e_ex_per_s": 5000,
        "auc_mean_13_24": 0.81,
    }
    assert medians["peer_saves_off"]["train_auc_mean_13_24"] == 0.8
    assert medians["peer_saves_on"]["train_auc_mean_13_24"] is None
    with pytest.raises(ValueError, match="no rounds"):
        peer.summarize([])
