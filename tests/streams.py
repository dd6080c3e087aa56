"""The tests' one synthetic-stream writer: ``streamtrain_worker.data.synth`` with the small sizes
the end-to-end and fault-injection jobs run on (importable as ``streams``: ``tests`` is on
the path of pytest and of the fault tests' subprocesses)."""

from __future__ import annotations

from pathlib import Path

from streamtrain_worker.data.synth import SynthConfig, generate

#: The first day of every test stream.
START = "20261101"


def write_stream(
    root: Path,
    *,
    days: int = 1,
    rows_per_folder: int = 120,
    split_interval_minutes: int = 360,
    num_users: int = 200,
    num_items: int = 100,
    seed: int = 3,
) -> Path:
    """A synthetic stream from :data:`START`, two part files and a donefile per folder,
    under ``root/data`` (returned). The default is 6-hourly folders: 4 passes a day."""
    data = root / "data"
    generate(
        SynthConfig(
            out=str(data),
            days=days,
            start=START,
            split_interval_minutes=split_interval_minutes,
            rows_per_folder=rows_per_folder,
            files_per_folder=2,
            num_users=num_users,
            num_items=num_items,
            seed=seed,
        )
    )
    return data
