"""Parse throughput per format on the real samples, through the whole reader path.

``measure`` times ``iter_batches`` (file read from the page cache, block cutting, the numba
kernel, re-chunking into batches of 512) over a sample file repeated until ``min_seconds``
have passed, after one untimed warm-up pass that compiles (or loads cached) kernels. The slot
format has no public sample here, so it is measured on a synthetic stream (``synth``).

``python -m streamtrain_tools.bench.worker.parse --json`` prints one JSON object as its last line:
``{"parse_lines_per_s": {"criteo": …, "avazu": …, "libsvm": …, "csv": …, "slot": …}}``.

``--kernel`` times the format kernels alone instead (``measure_kernel``: the best of 7 parses
of one block, in CPU seconds of the process, so other work on the machine disturbs it less):
what a change to a kernel costs, compared between two checkouts run alternately.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import numpy as np

from streamtrain_tools.samples import SAMPLES_DIR
from streamtrain_worker.data import layout, synth, timeslices
from streamtrain_worker.data.config import AVAZU_CATEGORICAL, DataConfig
from streamtrain_worker.data.formats import make_format
from streamtrain_worker.data.reader import iter_batches

BATCH_SIZE = 512


def sample_configs(data_dir: Path) -> dict[str, tuple[DataConfig, Path]]:
    """The config and sample file of every format that has a real sample."""
    csv_columns: dict[str, object] = {"click": "label"}
    csv_columns.update({name: name for name in AVAZU_CATEGORICAL})
    return {
        "criteo": (
            DataConfig.from_dict({"format": "criteo"}),
            data_dir / "criteo_kaggle_sample_train.txt",
        ),
        "avazu": (DataConfig.from_dict({"format": "avazu"}), data_dir / "avazu_sample_train.csv"),
        "libsvm": (
            DataConfig.from_dict(
                {
                    "format": "libsvm",
                    "fieldMap": str(data_dir / "ipinyou_deepctr_featindex.fm.txt"),
                }
            ),
            data_dir / "ipinyou_deepctr_train.fm.txt",
        ),
        "csv": (
            DataConfig.from_dict({"format": "csv", "columns": csv_columns}),
            data_dir / "avazu_sample_train.csv",
        ),
    }


def measure(
    config: DataConfig | str,
    path: Path | str,
    *,
    min_seconds: float = 0.5,
    data_dir: Path = SAMPLES_DIR,
) -> float:
    """Lines per second of reading ``path`` through ``iter_batches``.

    ``config`` is a ``DataConfig`` or the name of a format with a real sample (its sample
    config from ``sample_configs(data_dir)``; the libSVM one needs iPinYou's field map there).
    """
    if isinstance(config, str):
        samples = sample_configs(data_dir)
        if config not in samples:
            raise ValueError(
                f"no sample config for format {config!r}; use one of {sorted(samples)}"
            )
        config = samples[config][0]
    files = [str(path)]
    fmt = make_format(config)  # built once, as a worker does across passes (field maps load once)
    for _ in iter_batches(
        files, config, BATCH_SIZE, fmt=fmt
    ):  # warm-up: kernel compile / cache load
        pass
    lines = 0
    start = time.perf_counter()
    elapsed = 0.0
    repeat = 1
    while repeat == 1 or elapsed < min_seconds:
        for batch in iter_batches(files * repeat, config, BATCH_SIZE, fmt=fmt):
            lines += batch.size
        elapsed = time.perf_counter() - start
        repeat *= 2
    return lines / elapsed


def measure_kernel(config: DataConfig, path: Path, *, copies: int = 4, runs: int = 7) -> float:
    """Lines per CPU second of the format's kernel alone over ``copies`` of ``path`` in one
    block (the best of ``runs``; the first parse, which compiles or loads it, untimed)."""
    raw = path.read_bytes()
    fmt = make_format(config)
    header = None
    if fmt.has_header:
        header, _, raw = raw.partition(b"\n")
    parser = fmt.for_file(str(path), header)
    block = np.frombuffer(raw * copies, dtype=np.uint8)
    lines = raw.count(b"\n") * copies
    parser.parse(block, 1)
    best = float("inf")
    for _ in range(runs):
        start = time.process_time()
        parser.parse(block, 1)
        best = min(best, time.process_time() - start)
    return lines / best


def measure_slot(workdir: Path, *, min_seconds: float = 0.5) -> float:
    """Slot-format throughput on one synthetic folder (20,000 rows with a sequence slot)."""
    cfg = synth.SynthConfig(
        out=str(workdir),
        days=1,
        split_interval_minutes=1440,
        rows_per_folder=20_000,
        files_per_folder=1,
    )
    synth.generate(cfg)
    data = DataConfig.from_dict(synth.data_config(cfg))
    (path, _), *_ = layout.list_part_files(
        timeslices.pass_folders(cfg.out, cfg.start, 1, 1440, 1)[0]
    )
    return measure(data, path, min_seconds=min_seconds)


def measure_all(data_dir: Path = SAMPLES_DIR, *, min_seconds: float = 0.5) -> dict[str, float]:
    """Lines/s of every format (real samples; synthetic for the slot format)."""
    results = {
        name: measure(cfg, path, min_seconds=min_seconds)
        for name, (cfg, path) in sample_configs(data_dir).items()
    }
    with tempfile.TemporaryDirectory(prefix="bench-parse-") as tmp:
        results["slot"] = measure_slot(Path(tmp), min_seconds=min_seconds)
    return results


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m streamtrain_tools.bench.worker.parse")
    parser.add_argument("--json", action="store_true", help="only the JSON result line")
    parser.add_argument("--data-dir", type=Path, default=SAMPLES_DIR)
    parser.add_argument("--min-seconds", type=float, default=1.0)
    parser.add_argument("--kernel", action="store_true", help="the format kernels alone")
    args = parser.parse_args(argv)
    if args.kernel:
        results = {
            name: measure_kernel(cfg, path)
            for name, (cfg, path) in sample_configs(args.data_dir).items()
        }
    else:
        results = measure_all(args.data_dir, min_seconds=args.min_seconds)
    if not args.json:
        for name, rate in results.items():
            print(f"{name:>7}: {rate:,.0f} lines/s")
    print(json.dumps({"parse_lines_per_s": {k: round(v) for k, v in results.items()}}))


if __name__ == "__main__":
    main()
