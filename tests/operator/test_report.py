"""The per-pass metrics file and ``streamtrain report``: rows as recorded, undefined metrics
left empty, published models attached to their pass, and a page that really renders its
plots in headless Chromium (a screenshot, not only the HTML)."""

from __future__ import annotations

import json
import shutil
import subprocess
from dataclasses import replace
from pathlib import Path

import pytest
from PIL import Image

from streamtrain_operator import cli
from streamtrain_operator.job.plan import StepKey, StepKind
from streamtrain_operator.job.progress import PassRecord, Progress, Published
from streamtrain_operator.local import runner
from streamtrain_operator.local.passlog import COLUMNS, PassLog, read_rows
from streamtrain_operator.local.report import load_rows, render_html
from streamtrain_operator.run.state import LocalStateFile

CHROMIUM = "/usr/bin/chromium"
#: matplotlib's first colour (the plotted lines), as RGB.
LINE_BLUE = (0x1F, 0x77, 0xB4)


def record(day: str, p: int, auc: float | None = 0.7) -> PassRecord:
    metrics = {
        "loss": 0.45 - 0.01 * p,
        "copc": 1.02,
        "predicted_ctr": 0.1,
        "actual_ctr": 0.102,
        "examples": 8000.0,
        "examplesPerSecond": 4000.0 + 100 * p,
        "seconds": 2.0,
        "bytes": 123456.0,
    }
    if auc is not None:
        metrics["auc"] = auc + 0.01 * p
    return PassRecord(day, p, 1, metrics, wait_seconds=0.5 * p)


def published(day: str, p: int, kind: StepKind = StepKind.DELTA) -> Published:
    return Published(StepKey(day, p, kind), f"/m/{day}/{kind.value}-{p}")


def test_pass_log_writes_one_row_per_pass_with_the_models_published_after_it(
    tmp_path: Path,
) -> None:
    path = tmp_path / "metrics.csv"
    log = PassLog(path)
    progress = Progress(history=(record("20261101", 1),))
    log.on_progress(progress)  # the record at start: already in the file
    progress = progress.add_pass(record("20261101", 2, auc=None))
    log.on_progress(progress)
    progress = replace(progress, export=published("20261101", 2))
    log.on_progress(progress)
    progress = replace(progress, export=published("20261101", 2, StepKind.BASE))
    log.on_progress(progress)
    progress = progress.add_pass(record("20261102", 1))
    log.on_progress(progress)
    assert path.read_text().splitlines()[0] == ",".join(COLUMNS)
    log.flush()  # the run stops: the pending pass is written without a model
    rows = read_rows(path)
    assert [(r["day"], r["pass"]) for r in rows] == [("20261101", 2), ("20261102", 1)]
    assert rows[0]["auc"] is None  # undefined, not a placeholder
    assert rows[0]["modelPublished"] == "/m/20261101/delta-2 /m/20261101/base-2"
    assert rows[1]["modelPublished"] == ""
    assert rows[1]["auc"] == 0.71
    assert rows[1]["examples"] == 8000.0 and rows[1]["bytes"] == 123456.0
    assert rows[1]["waitSeconds"] == 0.5 and rows[1]["predictedCtr"] == 0.1
    # A resumed run appends after the earlier rows, with no second header.
    again = PassLog(path)
    again.on_progress(progress)
    again.on_progress(progress.add_pass(record("20261102", 2)))
    again.flush()
    text = path.read_text()
    assert text.count("day,pass") == 1 and len(read_rows(path)) == 3


def test_report_reads_a_state_file_a_custom_resource_and_a_metrics_file(tmp_path: Path) -> None:
    progress = Progress(
        history=(record("20261101", 1), record("20261101", 2)), export=published("20261101", 2)
    )
    state = tmp_path / "state.json"
    LocalStateFile(state).save(progress)
    rows = load_rows(state)
    assert [r["modelPublished"] for r in rows] == ["", "/m/20261101/delta-2"]
    cr = tmp_path / "cr.json"
    cr.write_text(
        json.dumps(
            {
                "kind": "StreamingTrainingJob",
                "status": {"phase": "Training", "scheduler": progress.to_dict()},
            }
        )
    )
    assert load_rows(cr) == rows
    bad = tmp_path / "other.json"
    bad.write_text('{"phase": "x"}')
    assert cli.main(["report", str(bad), "-o", str(tmp_path / "x.html")]) == cli.EXIT_USAGE


def test_an_empty_history_says_so() -> None:
    page = render_html([], "t")
    assert "No pass has completed yet." in page and "<svg" not in page


def _screenshot(page: Path, png: Path, profile: Path) -> None:
    assert Path(CHROMIUM).exists() or shutil.which("chromium"), (
        "headless Chromium is missing: run `make test-deps`"
    )
    command = [
        CHROMIUM if Path(CHROMIUM).exists() else "chromium",
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        f"--user-data-dir={profile}",
        f"--screenshot={png}",
        "--window-size=1300,1000",
        page.resolve().as_uri(),
    ]
    done = subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0 and png.exists(), done.stderr


def test_the_report_renders_its_plots_in_headless_chromium(tmp_path: Path) -> None:
    history = tuple(record(day, p) for day in ("20261101", "20261102") for p in range(1, 5))
    state = tmp_path / "state.json"
    LocalStateFile(state).save(Progress(history=history))
    page = tmp_path / "report" / "run.html"
    assert cli.main(["report", str(state), "-o", str(page)]) == 0
    text = page.read_text()
    assert text.count("<svg") == 8  # every metric has a plot, inline
    # Self-contained: nothing to fetch (no script, stylesheet, image or font by URL).
    assert "<script" not in text and "<link" not in text and "src=" not in text
    png = tmp_path / "shot.png"
    _screenshot(page, png, tmp_path / "profile")
    image = Image.open(png).convert("RGB")
    assert image.size == (1300, 1000)
    colours = image.getcolors(maxcolors=1 << 20)
    assert colours is not None
    # A blank or unstyled page has a handful of colours; anti-aliased plots have hundreds,
    # and the plotted lines themselves are matplotlib's blue.
    assert len(colours) > 200, len(colours)
    blue = sum(
        n for n, rgb in colours if all(abs(a - b) < 12 for a, b in zip(rgb, LINE_BLUE, strict=True))
    )
    assert blue > 500, blue


def test_a_cold_kernel_cache_is_detected(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``streamtrain run`` says why its first pass will be slow when numba's cache is empty."""
    monkeypatch.setenv("NUMBA_CACHE_DIR", str(tmp_path))
    assert not runner.kernels_cached()
    (tmp_path / "streamtrain_ps" / "index.insert_many-273.py311.nbi").parent.mkdir()
    (tmp_path / "streamtrain_ps" / "index.insert_many-273.py311.nbi").write_bytes(b"")
    assert runner.kernels_cached()
    assert runner.COLD_CACHE == (
        "  the numba kernels are not cached yet: the first pass compiles them, once (tens of "
        "seconds); `python -m streamtrain_tools.warm_cache` does it ahead (`make install` does)"
    )
