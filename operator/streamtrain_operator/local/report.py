"""``streamtrain report``: a run's passes as one self-contained HTML page with plots.

Input: a run's metrics file (``metrics.csv``, ``passlog``), its local state file, or a job's
status as JSON (``kubectl get stj NAME -o json``: the custom resource, or its ``status``,
whose ``scheduler`` record keeps the last passes).
Output: one HTML file with the plots inline as SVG (matplotlib, no script, no network), so
it opens from disk, attaches to a mail or a ticket, and renders the same everywhere.
"""

from __future__ import annotations

import html
import io
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from streamtrain_operator.job.progress import Progress
from streamtrain_operator.local.passlog import Row, history_rows, read_rows

#: (title, y label, [(column, legend)]) of each plot, in page order.
PLOTS: tuple[tuple[str, str, tuple[tuple[str, str], ...]], ...] = (
    ("AUC (progressive validation)", "AUC", (("auc", "AUC"),)),
    ("Log loss", "loss", (("loss", "loss"),)),
    ("COPC (clicks / predicted clicks; 1 is calibrated)", "COPC", (("copc", "COPC"),)),
    ("CTR", "CTR", (("predictedCtr", "predicted"), ("actualCtr", "actual"))),
    ("Throughput", "examples/s", (("examplesPerSecond", "examples/s"),)),
    ("Examples per pass", "examples", (("examples", "examples"),)),
    ("Donefile wait", "seconds", (("waitSeconds", "wait"),)),
    ("Data read per pass", "bytes", (("bytes", "bytes"),)),
)
#: Table columns shown under the plots (the CSV has them all).
TABLE = (
    ("day", "day", ""),
    ("pass", "pass", ""),
    ("auc", "AUC", ".4f"),
    ("loss", "loss", ".4f"),
    ("copc", "COPC", ".3f"),
    ("predictedCtr", "pred. CTR", ".4f"),
    ("actualCtr", "actual CTR", ".4f"),
    ("examples", "examples", ",.0f"),
    ("examplesPerSecond", "ex/s", ",.0f"),
    ("waitSeconds", "wait s", ".1f"),
    ("bytes", "bytes", ",.0f"),
    ("modelPublished", "published", ""),
)


class ReportError(ValueError):
    """The input is neither a metrics file nor a state or status record."""


def load_rows(path: Path) -> list[Row]:
    """The pass rows of a metrics CSV, a state file or a job's status JSON."""
    if path.suffix == ".csv":
        return read_rows(path)
    try:
        data = json.loads(path.read_text())
    except ValueError as exc:
        raise ReportError(f"{path}: neither a metrics .csv nor JSON: {exc}") from exc
    if isinstance(data, dict) and isinstance(data.get("status"), dict):
        data = data["status"]  # a whole custom resource
    if isinstance(data, dict) and isinstance(data.get("scheduler"), dict):
        data = data["scheduler"]  # a status: the progress record (its last passes)
    if not isinstance(data, dict) or "history" not in data:
        raise ReportError(f"{path}: no pass history (expected a state file or a job's status)")
    try:
        return history_rows(Progress.from_dict(data))
    except (KeyError, TypeError, ValueError) as exc:
        raise ReportError(f"{path}: not a streamtrain state record: {exc}") from exc


def _svg(rows: Sequence[Row], ylabel: str, series: Sequence[tuple[str, str]]) -> str:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    xs = list(range(1, len(rows) + 1))
    fig, ax = plt.subplots(figsize=(5.8, 2.5), dpi=96)
    try:
        for column, label in series:
            points = [
                (x, r[column]) for x, r in zip(xs, rows, strict=True) if r.get(column) is not None
            ]
            if points:
                ax.plot(
                    *zip(*points, strict=True), marker="o", markersize=3, linewidth=1.5, label=label
                )
        days = [i for i in range(1, len(rows)) if rows[i]["day"] != rows[i - 1]["day"]]
        for i in days:
            ax.axvline(i + 0.5, color="#999999", linewidth=0.8, linestyle=":")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_xlabel("pass (dotted lines: day boundaries)")
        ax.set_ylabel(ylabel)
        ax.grid(True, alpha=0.3)
        if len(series) > 1:
            ax.legend(loc="best", fontsize="small")
        fig.tight_layout()
        buf = io.StringIO()
        fig.savefig(buf, format="svg")
    finally:
        plt.close(fig)
    text = buf.getvalue()
    return text[text.index("<svg") :]  # drop the XML prolog: the SVG sits inside HTML


def _cell(value: Any, spec: str) -> str:
    if value is None or value == "":
        return "n/a" if spec else ""
    return html.escape(format(value, spec) if spec else str(value))


def render_html(rows: Sequence[Row], title: str) -> str:
    """The page: a summary line, one plot per metric, the table of passes."""
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>{html.escape(title)}</title>",
        "<style>body{font-family:sans-serif;margin:2em;color:#222}"
        ".plots{display:grid;grid-template-columns:repeat(auto-fill,minmax(560px,1fr));gap:0 1em}"
        "figure{margin:0}h2{font-size:1.1em}table{border-collapse:collapse;font-size:13px}"
        "td,th{border:1px solid #ccc;padding:2px 6px;text-align:right}</style>",
        f"</head><body><h1>{html.escape(title)}</h1>",
    ]
    if not rows:
        parts.append("<p>No pass has completed yet.</p></body></html>")
        return "\n".join(parts)
    first, last = rows[0], rows[-1]
    parts.append(
        f"<p>{len(rows)} passes, {first['day']}/{first['pass']} to {last['day']}/{last['pass']}; "
        f"last AUC {_cell(last.get('auc'), '.4f')}.</p>"
    )
    parts.append('<div class="plots">')
    for heading, ylabel, series in PLOTS:
        if any(r.get(c) is not None for r in rows for c, _ in series):
            parts.append(
                f"<figure><h2>{html.escape(heading)}</h2>{_svg(rows, ylabel, series)}</figure>"
            )
    parts.append("</div><h2>Passes</h2><table><tr>")
    parts += [f"<th>{html.escape(label)}</th>" for _, label, _ in TABLE]
    parts.append("</tr>")
    for r in rows:
        cells = "".join(f"<td>{_cell(r.get(c), spec)}</td>" for c, _, spec in TABLE)
        parts.append(f"<tr>{cells}</tr>")
    parts.append("</table></body></html>")
    return "\n".join(parts)


def write_report(source: Path, out: Path, title: str | None = None) -> int:
    """Render ``source`` into ``out``; the number of passes shown."""
    rows = load_rows(source)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(render_html(rows, title or f"streamtrain run: {source}"))
    return len(rows)
