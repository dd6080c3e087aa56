"""Progress output: one line per pass with a bar; waits shown; terminal-aware."""

from __future__ import annotations

import copy
import io
from dataclasses import replace
from typing import Any

from streamtrain_operator.job.messages import CheckData, RunPass, Save, Sleep
from streamtrain_operator.job.plan import StepKey, StepKind
from streamtrain_operator.job.progress import Condition, PassRecord, Progress
from streamtrain_operator.job.spec import parse_job
from streamtrain_operator.local.reporting import ProgressPrinter, format_pass, progress_bar

MINIMAL: dict[str, Any] = {
    "apiVersion": "streamtrain.io/v1alpha1",
    "kind": "StreamingTrainingJob",
    "metadata": {"name": "r"},
    "spec": {
        "data": {"path": "/d", "startDay": "20261101", "format": "criteo"},
        "checkpoint": {"path": "/c"},
        "export": {"path": "/e"},
    },
}


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def printer(out: io.StringIO, clock: list[float]) -> ProgressPrinter:
    manifest = copy.deepcopy(MINIMAL)
    manifest["spec"]["data"]["endDay"] = "20261102"
    job = parse_job(manifest)
    return ProgressPrinter(job, out, clock=lambda: clock[0])


def record(p: int) -> PassRecord:
    return PassRecord("20261101", p, 1, {"auc": 0.75, "loss": 0.45, "examples": 1000.0}, 3.0)


def test_progress_bar() -> None:
    assert progress_bar(12, 48) == "[#####...............] 12/48"
    assert progress_bar(3, None) == "3 passes"


def test_plain_output_has_pass_lines_waits_and_conditions() -> None:
    out, clock = io.StringIO(), [0.0]
    pr = printer(out, clock)
    key = StepKey("20261101", 1, StepKind.TRAIN)
    pr.on_progress(Progress())
    pr.on_action(CheckData(key), Progress())
    pr.on_action(Sleep(1.0), Progress())
    clock[0] = 7.0
    pr.on_action(CheckData(key), Progress())
    late = Condition("DataMissing", "True", "DonefileLate", "no donefile in /d/0000", 7.0)
    pr.on_progress(Progress().with_condition(late))
    pr.on_action(RunPass(key, (0,), 1, 1), Progress())
    pr.on_progress(replace(Progress(), history=(record(1),)))
    pr.on_action(
        Save(StepKey("20261101", 1, StepKind.DELTA), "/exp/20261101/delta-1", 1), Progress()
    )
    lines = out.getvalue().splitlines()
    assert lines[0] == "  waiting for the donefiles of 20261101/1 ..."
    assert lines[1] == "  condition DataMissing: no donefile in /d/0000"
    assert lines[2] == "  data arrived after 7.0s"
    assert lines[3].startswith("day 20261101 pass  1/24  auc 0.7500  loss 0.4500")
    assert lines[3].endswith("wait 3.0s  [....................] 1/48")
    assert lines[4] == "  export delta -> /exp/20261101/delta-1"
    assert "\r" not in out.getvalue()


def test_terminal_output_rewrites_a_status_line() -> None:
    out, clock = Terminal(), [0.0]
    pr = printer(out, clock)
    key = StepKey("20261101", 1, StepKind.TRAIN)
    pr.on_action(CheckData(key), Progress())
    clock[0] = 2.0
    pr.on_action(CheckData(key), Progress())
    assert out.getvalue().endswith("\r\033[Kwaiting for the donefiles of 20261101/1 (2s)")
    pr.on_action(RunPass(key, (0, 1), 1, 1), Progress())
    assert out.getvalue().endswith("\r\033[Ktraining 20261101/1")


def test_minimal_job_prints_passes_without_a_total() -> None:
    out = io.StringIO()
    pr = ProgressPrinter(parse_job(MINIMAL), out)
    pr.on_progress(Progress())
    pr.on_progress(replace(Progress(), history=(record(1), record(2))))
    assert out.getvalue().splitlines()[-1].endswith("2 passes")


def test_a_pass_line_never_shows_a_number_that_was_not_measured() -> None:
    """One class: the AUC is n/a (not 0.5); no example: the line says the pass was empty."""
    one_class = PassRecord("20261101", 3, 1, {"loss": 0.12, "copc": 0.0, "examples": 40.0})
    line = format_pass(one_class, 24)
    assert "auc n/a  loss 0.1200  copc 0.000" in line and "40 ex" in line
    empty = PassRecord("20261101", 4, 1, {"examples": 0.0, "examplesPerSecond": 0.0}, 2.0)
    line = format_pass(empty, 24)
    assert line.startswith("day 20261101 pass  4/24  empty pass: no examples         0 ex")
    assert "auc" not in line and "loss" not in line
    # ... and the end-of-run summary of a job whose last pass was empty has no AUC either.
    out = io.StringIO()
    p = printer(out, [0.0])
    p.finish(Progress(phase="Succeeded", history=(record(1), empty)))
    assert out.getvalue() == "r: Succeeded (done), last auc n/a\n"


def test_a_condition_is_printed_when_it_appears_or_changes_not_every_poll() -> None:
    out = io.StringIO()
    pr = printer(out, [0.0])
    pr.on_progress(Progress())
    at_2 = StepKey("20261101", 2, StepKind.TRAIN)
    waiting = replace(Progress(), current=at_2)
    for seconds in (3, 4, 5):  # the message grows with every poll
        late = Condition("DataMissing", "True", "DonefileLate", f"no donefile after {seconds}s", 1)
        pr.on_progress(waiting.with_condition(late))
    # The next pass is late too: a new condition, printed once more.
    at_3 = replace(waiting, current=StepKey("20261101", 3, StepKind.TRAIN))
    for seconds in (3, 4):
        late = Condition("DataMissing", "True", "DonefileLate", f"pass 3: after {seconds}s", 2)
        pr.on_progress(at_3.with_condition(late))
    # Cleared, then late again for the same pass (after a restart): printed again.
    pr.on_progress(at_3.with_condition(late).clear_condition("DataMissing", 3, "DataArrived"))
    pr.on_progress(at_3.with_condition(late))
    assert out.getvalue().splitlines() == [
        "  condition DataMissing: no donefile after 3s",
        "  condition DataMissing: pass 3: after 3s",
        "  condition DataMissing: pass 3: after 4s",
    ]


def test_a_failed_run_ends_with_its_phase_and_leaves_the_error_to_the_caller() -> None:
    out = io.StringIO()
    pr = printer(out, [0.0])
    failed = Progress(phase="Failed", message="DataMissing: pass 20261101/2: no donefile")
    pr.finish(replace(failed, history=(record(1),)))
    assert out.getvalue() == "r: Failed after 1 passes\n"
