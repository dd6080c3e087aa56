"""Human-readable progress of a job: one line per pass, a progress bar, the current phase.

Plain text. On a terminal the phase of the step in progress (waiting for data, training,
saving) is shown on a status line rewritten in place; in a log file or pipe only complete
lines are written, so output stays readable when redirected.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import TextIO

from streamtrain_operator.job.messages import (
    Action,
    CheckData,
    LoadCheckpoint,
    RunPass,
    Save,
    Shrink,
    Sleep,
)
from streamtrain_operator.job.plan import PassPlan, StepKey, StepKind
from streamtrain_operator.job.progress import PassRecord, Phase, Progress
from streamtrain_operator.job.spec import Job, parse_day

BAR_WIDTH = 20


def progress_bar(done: int, total: int | None, width: int = BAR_WIDTH) -> str:
    """``[#####.....] 12/48`` (or ``12 passes`` for a job without endDay)."""
    if not total:
        return f"{done} passes"
    filled = min(width, round(width * done / total))
    return f"[{'#' * filled}{'.' * (width - filled)}] {done}/{total}"


#: The note of a pass that trained nothing (the quality metrics are then undefined).
EMPTY_PASS = "empty pass: no examples"


def metric(metrics: Mapping[str, float], name: str, spec: str = ".4f") -> str:
    """One metric of a pass record, ``n/a`` when the record has none: a pass of one class
    has no AUC, and a placeholder would read as a measurement."""
    value = metrics.get(name)
    return "n/a" if value is None else format(value, spec)


def format_pass(record: PassRecord, passes_per_day: int) -> str:
    """One line per pass: quality, size, speed and donefile wait.

    An empty pass says so instead of showing quality numbers: nothing was scored, so there
    is no AUC, loss or COPC to show (``docs/scheduler.md``, "Empty passes").
    """
    m = record.metrics
    examples = int(m.get("examples", 0))
    quality = (
        EMPTY_PASS
        if examples == 0
        else f"auc {metric(m, 'auc')}  loss {metric(m, 'loss')}  copc {metric(m, 'copc', '.3f')}"
    )
    return (
        f"day {record.day} pass {record.pass_index:>2}/{passes_per_day}  {quality}"
        f"  {examples:>8,d} ex"
        f"  {m.get('examplesPerSecond', 0.0):>9,.0f} ex/s  wait {record.wait_seconds:.1f}s"
    )


class ProgressPrinter:
    """Prints pass lines and phase changes of one job."""

    def __init__(self, job: Job, out: TextIO, clock: Callable[[], float] = time.monotonic) -> None:
        self.job = job
        self.out = out
        self.tty = out.isatty()
        self.clock = clock
        self.plan = PassPlan.from_spec(job.spec)
        self._seen = -1
        self._status = ""
        self._waiting_for: StepKey | None = None
        self._waiting_since = 0.0
        self._wait_reported = False
        self._condition_shown: tuple[str, StepKey | None] | None = None
        end = job.spec.data.end_date
        days = None if end is None else (end - parse_day(self.plan.start_day, "day")).days + 1
        self.total = None if days is None else days * self.plan.passes_per_day

    def line(self, text: str) -> None:
        if self.tty and self._status:
            self.out.write("\r\033[K")
        self.out.write(text + "\n")
        if self.tty and self._status:
            self.out.write(self._status)
        self.out.flush()

    def status(self, text: str) -> None:
        """A transient status (terminal only; a log gets the phase lines instead)."""
        self._status = text
        if self.tty:
            self.out.write("\r\033[K" + text)
            self.out.flush()

    def on_action(self, action: Action, progress: Progress) -> None:
        if isinstance(action, CheckData):
            if self._waiting_for != action.key:
                self._waiting_for, self._waiting_since = action.key, self.clock()
                return  # the first look: most of the time the data is already there
            waited = self.clock() - self._waiting_since
            text = f"waiting for the donefiles of {action.key.day}/{action.key.pass_index}"
            if self.tty:
                self.status(f"{text} ({waited:.0f}s)")
            elif not self._wait_reported:
                self._wait_reported = True
                self.line(f"  {text} ...")
            return
        if isinstance(action, Sleep):
            return
        if self._waiting_for is not None:
            waited = self.clock() - self._waiting_since
            if self._wait_reported or (self.tty and waited >= 1):
                self.line(f"  data arrived after {waited:.1f}s")
            self._waiting_for, self._wait_reported = None, False
        if isinstance(action, RunPass):
            what = "replaying" if action.replay else "training"
            self.status(f"{what} {action.key.day}/{action.key.pass_index}")
            if action.replay or action.attempt > 1:
                self.line(
                    f"  {what} {action.key.day}/{action.key.pass_index}"
                    + (
                        f" (attempt {action.attempt}, shares {list(action.shares)})"
                        if action.attempt > 1
                        else ""
                    )
                )
        elif isinstance(action, Shrink):
            self.line(f"  {'replaying ' if action.replay else ''}shrink of day {action.key.day}")
        elif isinstance(action, Save) and not action.replay:
            kind = action.key.kind
            verb = "checkpoint" if kind == StepKind.CHECKPOINT else f"export {kind.value}"
            self.line(f"  {verb} -> {action.uri}")
        elif isinstance(action, LoadCheckpoint):
            self.line(f"  resuming from checkpoint {action.uri}")

    def on_progress(self, progress: Progress) -> None:
        history = progress.history
        if self._seen < 0:
            self._seen = len(history)
            return
        for record in history[self._seen :]:
            done = len(history)
            self.line(
                f"{format_pass(record, self.plan.passes_per_day)}  {progress_bar(done, self.total)}"
            )
        self._seen = len(history)
        # Once per appearance or change (of its reason or of the pass it is about), not per
        # poll: the message's "after Ns" grows with every poll.
        cond = progress.condition("DataMissing")
        if cond is None or cond.status != "True":
            self._condition_shown = None
        elif self._condition_shown != (cond.reason, progress.current):
            self._condition_shown = (cond.reason, progress.current)
            self.line(f"  condition DataMissing: {cond.message}")

    def finish(self, progress: Progress) -> None:
        self._status = ""
        last = progress.last_pass
        auc = "" if last is None else f", last auc {metric(last.metrics, 'auc')}"
        if progress.phase == Phase.FAILED:  # the caller shows the error, once
            self.line(f"{self.job.name}: {progress.phase} after {len(progress.history)} passes")
            return
        self.line(f"{self.job.name}: {progress.phase} ({progress.message or 'done'}){auc}")
