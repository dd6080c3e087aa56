"""A/B of the delimited kernel: this tree's (with RFC 4180 quoting) against an older copy.

Quoting added a branch where each field starts to the hot loop of every delimited format
(Criteo, Avazu, csv). Whole-reader runs of ``bench_parse`` on the shared 2-core machine
swing by ±30 % from one run to the next with other people's load, far more than the few per
cent at stake, so this times the two kernels *in one process on the same bytes*, alternating
old and new every repetition (ABBA order), and reports the median of the per-pair ratios.
The inputs and column plans are ``bench_parse.sample_configs``' real samples; the old kernel
gets the same plan minus the quote byte (its signature before quoting existed).

    git show bb3c5c2:worker/streamtrain_worker/data/formats/delimited.py > /tmp/old_delimited.py
    python -m streamtrain_worker.data.bench_quoting --old /tmp/old_delimited.py --json

The last line is one JSON object: per format ``old_lines_per_s``, ``new_lines_per_s`` and
``ratio`` (new / old lines/s, median of pairs; > 0.95 is the target), plus the new kernel on
the Avazu sample rewritten with every cell quoted (``avazu_all_quoted_lines_per_s``).
"""

from __future__ import annotations

import argparse
import csv
import importlib.util
import io
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import numpy as np

from streamtrain_worker import bench_parse
from streamtrain_worker.data.formats import make_format
from streamtrain_worker.data.formats.delimited import DelimitedParser
from streamtrain_worker.data.formats.kernel import U8, run_kernel

FORMATS = ("criteo", "avazu", "csv")


def load_module(path: Path) -> ModuleType:
    """Import a copy of ``delimited.py`` under its own name (numba caches it beside it)."""
    spec = importlib.util.spec_from_file_location("old_delimited", path)
    if spec is None or spec.loader is None:
        raise ValueError(f"{path}: not an importable Python file")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while it executes
    spec.loader.exec_module(module)
    return module


def _timer(run: Callable[[], int]) -> Callable[[], tuple[float, int]]:
    def timed() -> tuple[float, int]:
        start = time.perf_counter()
        lines = run()
        return time.perf_counter() - start, lines

    return timed


def compare(old: ModuleType, parser: DelimitedParser, block: U8, repeats: int) -> dict[str, float]:
    """Lines/s of the old and new kernel on ``block`` and the median per-pair ratio."""
    plan = parser.plan
    params = parser.params
    old_params = params[:1] + params[2:]  # the quote byte is the one new parameter
    if params[1] != plan.quote:
        raise AssertionError("parser params no longer start with (delimiter, quote)")

    def run_old() -> int:
        return run_kernel(old._kernel, old_params, block, 1, plan.num_slots).batch.size

    def run_new() -> int:
        return parser.parse(block, 1).batch.size

    if run_old() != run_new():
        raise AssertionError("old and new kernels disagree on the example count")
    timed_old, timed_new = _timer(run_old), _timer(run_new)
    olds: list[float] = []
    news: list[float] = []
    lines = 0
    for i in range(repeats):
        first, second = (timed_old, timed_new) if i % 2 == 0 else (timed_new, timed_old)
        (t1, lines), (t2, _) = first(), second()
        olds.append(t1 if first is timed_old else t2)
        news.append(t2 if first is timed_old else t1)
    ratios = [o / n for o, n in zip(olds, news, strict=True)]
    return {
        "old_lines_per_s": round(lines / statistics.median(olds)),
        "new_lines_per_s": round(lines / statistics.median(news)),
        "ratio": round(statistics.median(ratios), 4),
    }


def all_quoted(raw: bytes) -> bytes:
    """``raw`` CSV with every cell quoted, as pandas' ``QUOTE_ALL`` writes it."""
    out = io.StringIO()
    writer = csv.writer(out, quoting=csv.QUOTE_ALL, lineterminator="\n")
    writer.writerows(csv.reader(io.StringIO(raw.decode())))
    return out.getvalue().encode()


def run(old_path: Path, data_dir: Path, repeats: int, copies: int) -> dict[str, object]:
    """The A/B per delimited format, then the quoted-path throughput."""
    old = load_module(old_path)
    samples = bench_parse.sample_configs(data_dir)
    results: dict[str, object] = {}
    for name in FORMATS:
        config, path = samples[name]
        fmt = make_format(config)
        raw = path.read_bytes()
        header = None
        if fmt.has_header:
            head, _, raw = raw.partition(b"\n")
            header = head
        parser = fmt.for_file(str(path), header)
        if not isinstance(parser, DelimitedParser):
            raise TypeError(f"{name}: not a delimited format")
        block = np.frombuffer(raw * copies, dtype=np.uint8)
        results[name] = compare(old, parser, block, repeats)
    config, path = samples["avazu"]
    quoted = all_quoted(path.read_bytes())
    head, _, body = quoted.partition(b"\n")
    parser = make_format(config).for_file(str(path), head)
    block = np.frombuffer(body * copies, dtype=np.uint8)
    times = []
    lines = 0
    for _ in range(max(3, repeats // 4)):
        start = time.perf_counter()
        lines = parser.parse(block, 1).batch.size
        times.append(time.perf_counter() - start)
    results["avazu_all_quoted_lines_per_s"] = round(lines / statistics.median(times))
    return results


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m streamtrain_worker.data.bench_quoting")
    parser.add_argument("--old", type=Path, required=True, help="an older delimited.py")
    parser.add_argument("--data-dir", type=Path, default=bench_parse.DEFAULT_DATA)
    parser.add_argument("--repeats", type=int, default=40, help="timed pairs per format")
    parser.add_argument("--copies", type=int, default=3, help="sample copies per block")
    parser.add_argument("--json", action="store_true", help="only the JSON result line")
    args = parser.parse_args(argv)
    results = run(args.old, args.data_dir, args.repeats, args.copies)
    if not args.json:
        for name in FORMATS:
            print(f"{name:>7}: {results[name]}")
    print(json.dumps(results))


if __name__ == "__main__":
    main()
