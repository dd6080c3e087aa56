"""Lay out the real data samples of ``data/samples/`` as time-sliced folders with donefiles.

``python -m streamtrain_tools.samples criteo --out DIR`` writes
``DIR/<YYYYMMDD>/<HHMM>/part-00000`` plus ``_SUCCESS`` per folder, so the example manifests
in ``examples/`` (and ``make bench-e2e``) run on real rows:

- **criteo**: the Kaggle rows are chronological and carry no timestamp; consecutive blocks of
  ``rows_per_folder`` rows become consecutive hourly folders (7,200 rows = 24 hours x 300).
- **avazu**: every row of the sample has the same hour (14102100), so the slicing is by row
  order only, like Criteo; the header line is repeated in every part (the csv reader expects
  it per file).
- **ipinyou**: libSVM rows of four consecutive hours (16-19) of one day, in that order;
  sliced by row order like the others. Its field map is ``IPINYOU_FIELD_MAP`` beside it.

``repeat`` writes each folder's rows that many times (throughput benchmarks: more work per
pass on the same data). Plain file copying: no parsing, no torch.
"""

from __future__ import annotations

import argparse
import datetime as dt
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from streamtrain_operator.job.spec import parse_day
from streamtrain_worker.data.timeslices import format_day

#: The repository's real data samples (``data/samples/``, sources and licences in its README):
#: the one place tests, tools and benchmarks find them.
SAMPLES_DIR = Path(__file__).resolve().parents[2] / "data" / "samples"
SAMPLES = {
    "criteo": ("criteo_kaggle_sample_train.txt", False),
    "avazu": ("avazu_sample_train.csv", True),
    "ipinyou": ("ipinyou_deepctr_train.fm.txt", False),
}
#: The field map (``data.fieldMap``) of the iPinYou sample's libSVM indices.
IPINYOU_FIELD_MAP = "ipinyou_deepctr_featindex.fm.txt"


@dataclass(frozen=True)
class Layout:
    """What was written: folders in time order and rows per folder (before repetition)."""

    folders: list[Path]
    rows_per_folder: int


def lay_out(
    sample: str,
    out: Path,
    *,
    data_dir: Path = SAMPLES_DIR,
    start_day: str = "20261101",
    rows_per_folder: int = 300,
    interval_minutes: int = 60,
    repeat: int = 1,
    donefile: str = "_SUCCESS",
) -> Layout:
    """Cut ``sample`` into folders of ``rows_per_folder`` consecutive rows (the last partial
    block is dropped so every pass has the same size)."""
    if sample not in SAMPLES:
        raise ValueError(f"unknown sample {sample!r} (known: {', '.join(SAMPLES)})")
    if rows_per_folder < 1 or repeat < 1:
        raise ValueError("rows_per_folder and repeat must be >= 1")
    name, has_header = SAMPLES[sample]
    source = data_dir / name
    if not source.exists():
        raise FileNotFoundError(f"{source}: the data sample is missing")
    lines = source.read_text().splitlines(keepends=True)
    header = lines.pop(0) if has_header else ""
    start = dt.datetime.combine(parse_day(start_day, "start_day"), dt.time())
    folders: list[Path] = []
    for i in range(len(lines) // rows_per_folder):
        at = start + dt.timedelta(minutes=i * interval_minutes)
        folder = out / format_day(at.date()) / at.strftime("%H%M")
        folder.mkdir(parents=True, exist_ok=True)
        block = "".join(lines[i * rows_per_folder : (i + 1) * rows_per_folder])
        (folder / "part-00000").write_text(header + block * repeat)
        (folder / donefile).touch()
        folders.append(folder)
    return Layout(folders, rows_per_folder)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m streamtrain_tools.samples", description=__doc__)
    p.add_argument("sample", choices=sorted(SAMPLES))
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--data-dir", type=Path, default=SAMPLES_DIR)
    p.add_argument("--start-day", default="20261101")
    p.add_argument("--rows-per-folder", type=int, default=300)
    p.add_argument("--repeat", type=int, default=1)
    args = p.parse_args(argv)
    try:
        result = lay_out(
            args.sample,
            args.out,
            data_dir=args.data_dir,
            start_day=args.start_day,
            rows_per_folder=args.rows_per_folder,
            repeat=args.repeat,
        )
    except (OSError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"{len(result.folders)} folders of {result.rows_per_folder} rows under {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
