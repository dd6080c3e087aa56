"""A/B of the delimited kernel: this tree's (with RFC 4180 quoting) against an older copy.

Quoting added a branch where each field starts to the hot loop of every delimited format
(Criteo, Avazu, csv). Whole-reader runs of ``bench_parse`` on the shared 2-core machine
swing by ±30 % from one run to the next with other people's load, far more than the few per
cent at stake, so this times the two kernels *in one process on the same bytes*, alternating
old and new every repetition (ABBA order), and reports the median of the per-pair ratios.
The inputs and column plans are ``bench_parse.sample_configs``' real samples; the old kernel
gets the same plan minus the quote byte (its signature before quoting existed).

    git show bb3c5c2:worker/streamtrain_worker/data/formats/delimited.py > /tmp/old_delimited.py
    python -m streamtrain_tools.bench.worker.quoting --old /tmp/old_delimited.py --json

The last line is one JSON object: per format ``old_lines_per_s``, ``new_lines_per_s`` and
``ratio`` (new / old lines/s, median of pairs; > 0.95 is the target), an A/A control (the
new kernel against itself: its distance from 1.0 is the method's noise), and the new kernel on
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

from streamtrain_tools.bench.worker import parse as bench_parse
from streamtrain_tools.samples import SAMPLES_DIR
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


def paired(run_a: Callable[[], int], run_b: Callable[[], int], repeats: int) -> dict[str, float]:
    """Time ``run_a`` and ``run_b`` back to back ``repeats`` times (ABBA order, so drifting
    load hits both alike): lines/s of each (median time) and the median of the per-pair
    ratios ``time_a / time_b`` (> 1: b is faster)."""
    times_a: list[float] = []
    times_b: list[float] = []
    lines = 0
    for i in range(repeats):
        order = ((run_a, times_a), (run_b, times_b))
        for run, times in order if i % 2 == 0 else order[::-1]:
            start = time.perf_counter()
            lines = run()
            times.append(time.perf_counter() - start)
    ratios = [a / b for a, b in zip(times_a, times_b, strict=True)]
    return {
        "a_lines_per_s": round(lines / statistics.median(times_a)),
        "b_lines_per_s": round(lines / statistics.median(times_b)),
        "ratio": round(statistics.median(ratios), 4),
    }


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
    result = paired(run_old, run_new, repeats)
    return {
        "old_lines_per_s": result["a_lines_per_s"],
        "new_lines_per_s": result["b_lines_per_s"],
        "ratio": result["ratio"],
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
    # Control: the new kernel against itself shows how far this method's ratio strays
    # from 1.0 on the machine at hand.
    config, path = samples["avazu"]
    head, _, body = path.read_bytes().partition(b"\n")
    control = make_format(config).for_file(str(path), head)
    block = np.frombuffer(body * copies, dtype=np.uint8)

    def run_control() -> int:
        return control.parse(block, 1).batch.size

    results["control_avazu_new_vs_new_ratio"] = paired(run_control, run_control, repeats)["ratio"]
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
    parser = argparse.ArgumentParser(prog="python -m streamtrain_tools.bench.worker.quoting")
    parser.add_argument("--old", type=Path, required=True, help="an older delimited.py")
    parser.add_argument("--data-dir", type=Path, default=SAMPLES_DIR)
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
