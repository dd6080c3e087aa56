"""A run's per-pass metrics as a CSV file a user can open (``<workdir>/metrics.csv``).

One row per trained pass, the global metrics the scheduler recorded (summed over workers:
histograms for AUC, sums for loss, CTRs and examples), the donefile wait, the bytes read and
the models published after the pass (space-separated URIs). Undefined metrics (an empty pass
has no AUC) are empty cells, never a placeholder. The file is appended to: a resumed run adds
its passes after the earlier ones. A row is written once the steps after its pass are done (so
the models published after it are known), at the latest when the run stops.

:func:`pass_row` is also how ``streamtrain report`` turns a state file's or a custom
resource's history into the same rows.
"""

from __future__ import annotations

import csv
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from streamtrain_operator.job.progress import PassRecord, Progress, Published

#: Columns: (CSV header, key in a pass record's metrics or a record field).
COLUMNS = (
    "day",
    "pass",
    "generation",
    "auc",
    "loss",
    "copc",
    "predictedCtr",
    "actualCtr",
    "examples",
    "examplesPerSecond",
    "seconds",
    "waitSeconds",
    "bytes",
    "attempts",
    "modelPublished",
)
#: CSV column -> the metric's name in ``PassRecord.metrics`` (the worker's summary).
METRIC_KEYS = {
    "auc": "auc",
    "loss": "loss",
    "copc": "copc",
    "predictedCtr": "predicted_ctr",
    "actualCtr": "actual_ctr",
    "examples": "examples",
    "examplesPerSecond": "examplesPerSecond",
    "seconds": "seconds",
    "bytes": "bytes",
}
FILE_NAME = "metrics.csv"

Row = dict[str, Any]


def pass_row(record: PassRecord, published: str = "") -> Row:
    """One pass as a row: numbers as floats, an undefined metric as ``None``."""
    row: Row = {
        "day": record.day,
        "pass": record.pass_index,
        "generation": record.generation,
        "waitSeconds": record.wait_seconds,
        "attempts": record.attempts,
        "modelPublished": published,
    }
    for column, key in METRIC_KEYS.items():
        row[column] = record.metrics.get(key)
    return row


def history_rows(progress: Progress) -> list[Row]:
    """The rows of every pass in a progress record (its last export marks its pass)."""
    published = progress.export
    rows = []
    for record in progress.history:
        uri = ""
        if published is not None and (published.key.day, published.key.pass_index) == (
            record.day,
            record.pass_index,
        ):
            uri = published.uri
        rows.append(pass_row(record, uri))
    return rows


def _cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:.6g}"
    return str(value)


def read_rows(path: Path) -> list[Row]:
    """Rows of a metrics file, numbers parsed back (an empty cell is ``None``)."""
    with path.open(newline="") as f:
        out = []
        for raw in csv.DictReader(f):
            row: Row = {}
            for key, text in raw.items():
                if key in ("day", "modelPublished"):
                    row[key] = text
                elif key in ("pass", "generation", "attempts"):
                    row[key] = int(text)
                else:
                    row[key] = float(text) if text else None
            out.append(row)
        return out


class PassLog:
    """Appends a row per new pass to ``path`` as a run progresses (``on_progress``)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._seen = -1
        self._pending: PassRecord | None = None
        #: Models published since the pending pass (a delta; base and batch at day end).
        self._published: list[str] = []
        self._last_export: Published | None = None

    def on_progress(self, progress: Progress) -> None:
        if self._seen < 0:  # the record at start: its passes are in the file already
            self._seen = len(progress.history)
            self._last_export = progress.export
            return
        export = progress.export
        if export is not None and export != self._last_export:
            self._last_export = export
            if self._pending is not None:
                self._published.append(export.uri)
        new = progress.history[self._seen :]
        self._seen = len(progress.history)
        for record in new:
            self.flush()
            self._pending = record

    def flush(self) -> None:
        """Write the pending row (at the next pass, and when the run stops)."""
        if self._pending is None:
            return
        self._append([pass_row(self._pending, " ".join(self._published))])
        self._pending, self._published = None, []

    def _append(self, rows: Iterable[Mapping[str, Any]]) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        new_file = not self.path.exists() or self.path.stat().st_size == 0
        with self.path.open("a", newline="") as f:
            writer = csv.writer(f)
            if new_file:
                writer.writerow(COLUMNS)
            for row in rows:
                writer.writerow([_cell(row.get(c)) for c in COLUMNS])
