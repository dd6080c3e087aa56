"""``python -m streamtrain_tools.bench.ps.scale --json`` (``make bench-ps-scale``): one PS
shard at the long tail.

One shard, one table: embedxDim 8, SparseAdaGrad, ``embedxThreshold`` 10. Per table size
(``--sizes``, default 10M; 50M and 100M take minutes and ~10 GB each, so they are opt-in):

- **bytes per key**, unadmitted and admitted: resident-memory growth of the process while
  the table grows to N keys pushed once (score 0.1: not admitted), then while every key is
  admitted (a push with score 10); plus ``memory_bytes`` from stats. Index and counters are
  included (RSS is everything the process holds).
- **peak RSS** of growth, admission, checkpoint, delta save, shrink, load over the live
  table as the driver's restore does it (``discard_live``: verified, released, rebuilt),
  and beside them a keep-live load (all or nothing: old + new table until the swap,
  ``peak_ratio_load_keep_live``) and a restore into a fresh shard, as a ratio to
  the steady state after the step, both counted above the process's RSS before the table
  existed (``/proc/self/clear_refs`` resets the peak before each step).
- **unique keys per second**, pull and push, 1 and 2 caller threads, for Zipf batches (a key
  space 10x the table, exponent ``--zipf``: the table holds the N most popular keys, the
  rest of a batch are tail keys the pushes create) and for uniform batches over the table
  (a working set far beyond the CPU cache). Duplicates-included figures are printed beside.
- **delta save + publish** after the throughput phase (every key scanned, the touched ones
  written) and once more right after it (every key scanned, none written: the part of a
  pass transition that grows with the table), a checkpoint, a shrink and a load of that
  checkpoint, in seconds.
- the same bytes per key and throughputs for a shard **process grown over gRPC** (``--rpc-
  keys``, default the first size; ``--skip-rpc`` to leave it out).
- a **memory-capped** shard process against the same shard uncapped (``ps_capped``:
  ``capped_pull_ratio``, ``capped_rss_max_over_limit_bytes``; ``--capped-keys 0`` skips it).

The human table goes to stdout; the LAST line is one JSON object (worst case over sizes for
``unadmitted_bytes_per_key``, ``admitted_bytes_per_key``, ``peak_rss_ratio``; the per-size
figures under ``sizes``).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from streamtrain_ps.api import SaveMode, SparsePush
from streamtrain_ps.client.remote import RemotePS
from streamtrain_ps.config import PSConfig, SparseOptimizerConfig, TableConfig
from streamtrain_ps.plumbing.heap import MAX_RELEASE_DELAY, release_scratch_memory
from streamtrain_ps.saves import checkpoint
from streamtrain_ps.service.process import shard_process
from streamtrain_ps.shard import Shard

TABLE = "embedding"
DIM = 8
CHUNK = 1_000_000
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)

PS = Shard | RemotePS


def config() -> PSConfig:
    table = TableConfig(
        name=TABLE,
        embedxDim=DIM,
        embedxThreshold=10.0,
        optimizer=SparseOptimizerConfig(type="adagrad"),
    )
    return PSConfig(tables=(table,), maxKeysPerRequest=CHUNK)


def spread(n: int) -> npt.NDArray[np.uint64]:
    """Key space of ``n`` signs in popularity order (an odd multiplier is a bijection)."""
    with np.errstate(over="ignore"):
        return np.arange(1, n + 1, dtype=np.uint64) * _GOLDEN


def zipf_ranks(rng: np.random.Generator, space: int, size: int, s: float) -> npt.NDArray[np.int64]:
    """Ranks 0..space-1 with P(rank r) ~ (r + 1)^-s (inverse CDF of the continuous law)."""
    u = rng.random(size)
    a = 1.0 - s
    r = (1.0 + u * ((space + 1.0) ** a - 1.0)) ** (1.0 / a) - 1.0
    return np.minimum(r.astype(np.int64), space - 1)


def rss(pid: int | None = None, field: str = "VmRSS") -> int:
    for line in Path(f"/proc/{pid or 'self'}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no {field} in /proc/{pid or 'self'}/status")


def settled_rss(pid: int) -> int:
    """RSS of a shard process once it stops falling: its server trims the heap within a
    second of a bulk load (``streamtrain_ps.plumbing.heap``), as a pod's memory would settle."""
    time.sleep(MAX_RELEASE_DELAY + 0.25)
    last = rss(pid)
    for _ in range(12):
        time.sleep(0.25)
        now = rss(pid)
        if abs(now - last) < 1 << 20:
            return now
        last = now
    return last


def reset_peak(pid: int | None = None) -> None:
    """Reset VmHWM (the peak RSS) to the current RSS (Linux >= 4.0)."""
    Path(f"/proc/{pid or 'self'}/clear_refs").write_text("5")


def settle() -> None:
    gc.collect()
    release_scratch_memory()


def push_all(ps: PS, keys: npt.NDArray[np.uint64], show: float, click: float) -> None:
    for lo in range(0, keys.size, CHUNK):
        k = keys[lo : lo + CHUNK]
        n = k.size
        ps.push_sparse(
            TABLE,
            SparsePush(
                k,
                np.zeros((n, DIM + 1), np.float32),
                np.full(n, show, np.float32),
                np.full(n, click, np.float32),
            ),
        )


class Step:
    """Time one step and its peak RSS above ``base``; ``ratio`` = peak / steady after."""

    def __init__(self, base: int, pid: int | None = None) -> None:
        self.base = base
        self.pid = pid

    def run(self, fn: Callable[[], object]) -> dict[str, float]:
        settle()
        reset_peak(self.pid)
        t0 = time.perf_counter()
        fn()
        seconds = time.perf_counter() - t0
        peak = rss(self.pid, "VmHWM")
        settle()
        steady = rss(self.pid)
        ratio = (peak - self.base) / max(steady - self.base, 1)
        return {"seconds": seconds, "peak_ratio": ratio, "steady": steady - self.base}


def throughput(
    fn: Callable[[npt.NDArray[np.uint64]], object], batches: list[Any], threads: int, seconds: float
) -> tuple[float, float]:
    """(unique keys/s, keys/s) of ``fn`` called back to back by ``threads`` threads."""
    fn(batches[0])
    uniq = [int(np.unique(b).size) for b in batches]
    done = [[0, 0] for _ in range(threads)]
    stop_at = time.perf_counter() + seconds
    barrier = threading.Barrier(threads + 1)

    def loop(t: int) -> None:
        barrier.wait()
        i = t
        while time.perf_counter() < stop_at:
            fn(batches[i % len(batches)])
            done[t][0] += uniq[i % len(batches)]
            done[t][1] += batches[i % len(batches)].size
            i += threads

    workers = [threading.Thread(target=loop, args=(t,)) for t in range(threads)]
    for w in workers:
        w.start()
    start = time.perf_counter()
    barrier.wait()
    for w in workers:
        w.join()
    took = time.perf_counter() - start
    return sum(d[0] for d in done) / took, sum(d[1] for d in done) / took


def speeds(ps: PS, n: int, args: argparse.Namespace) -> dict[str, float]:
    """Pull/push unique keys/s for Zipf and uniform batches, best of 1 and 2 threads."""
    rng = np.random.default_rng(args.seed)
    space = spread(10 * n)
    table = space[:n]
    dists = {
        "zipf": [space[zipf_ranks(rng, space.size, args.batch, args.zipf)] for _ in range(8)],
        "uniform": [table[rng.integers(0, n, args.batch)] for _ in range(8)],
    }
    grads = (rng.standard_normal((args.batch, DIM + 1)) * 0.01).astype(np.float32)
    shows = np.ones(args.batch, np.float32)
    clicks = (rng.random(args.batch) < 0.05).astype(np.float32)
    ops: dict[str, Callable[[npt.NDArray[np.uint64]], object]] = {
        "pull": lambda b: ps.pull_sparse(TABLE, b),
        "push": lambda b: ps.push_sparse(TABLE, SparsePush(b, grads, shows, clicks)),
    }
    res: dict[str, float] = {}
    for dist, batches in dists.items():
        res[f"{dist}_unique_fraction"] = float(np.mean([np.unique(b).size for b in batches]))
        res[f"{dist}_unique_fraction"] /= args.batch
        for op, fn in ops.items():
            best = max(throughput(fn, batches, t, args.seconds) for t in (1, 2))
            res[f"{op}_{dist}_unique_keys_per_s"] = best[0]
            res[f"{op}_{dist}_keys_per_s"] = best[1]
    return res


def in_process(n: int, args: argparse.Namespace, work: Path) -> dict[str, float]:
    cfg = config()
    warm = Shard(cfg)  # compile every kernel first: JIT memory is not table memory
    wk = spread(300_000)[-200_000:]
    push_all(warm, wk, 1.0, 0.0)
    push_all(warm, wk, 10.0, 10.0)
    warm.pull_sparse(TABLE, wk)
    warm.shrink(TABLE)
    warm.close()
    del warm
    keys = spread(n)  # the bench's own key array (8 B/key) is not table memory
    settle()
    base = rss()
    step = Step(base)
    shard = Shard(cfg)
    res: dict[str, float] = {}
    grow = step.run(lambda: push_all(shard, keys, 1.0, 0.0))
    res["unadmitted_bytes_per_key"] = grow["steady"] / n
    res["unadmitted_memory_bytes_per_key"] = shard.stats().tables[0].memory_bytes / n
    admit = step.run(lambda: push_all(shard, keys, 10.0, 10.0))
    assert shard.stats().tables[0].expanded_keys == n
    res["admitted_bytes_per_key"] = admit["steady"] / n
    res["admitted_memory_bytes_per_key"] = shard.stats().tables[0].memory_bytes / n
    first = step.run(lambda: save(shard, str(work / "delta0"), SaveMode.DELTA))
    res.update(speeds(shard, n, args))
    grown = len(shard.table(TABLE))  # the Zipf pushes created tail keys
    after_pass = step.run(lambda: save(shard, str(work / "delta1"), SaveMode.DELTA))
    # Right after a delta nothing changed: this one scans every key and writes none (the
    # part of a pass transition that grows with the table, not with the pass's traffic).
    delta = step.run(lambda: save(shard, str(work / "delta2"), SaveMode.DELTA))
    ck = step.run(lambda: save(shard, str(work / "ck"), SaveMode.CHECKPOINT))
    shrink = step.run(lambda: shard.shrink(TABLE))
    # All or nothing (the default): the old table stays until the new one is swapped in,
    # ~2x the table, so the largest sizes leave it out (--keep-live-up-to).
    if n <= args.keep_live_up_to:
        keep_live = step.run(lambda: shard.load(str(work / "ck")))
        res["load_keep_live_seconds"] = keep_live["seconds"]
        res["peak_ratio_load_keep_live"] = keep_live["peak_ratio"]
    # The driver's restore over a live table: verified first, then released and rebuilt.
    load = step.run(lambda: shard.load(str(work / "ck"), discard_live=True))
    shard.close()
    res.update(
        keys_after_throughput=grown,
        first_delta_all_rows_seconds=first["seconds"],
        delta_after_pass_seconds=after_pass["seconds"],
        delta_save_seconds=delta["seconds"],
        checkpoint_seconds=ck["seconds"],
        shrink_seconds=shrink["seconds"],
        load_seconds=load["seconds"],
    )
    steps = {
        "grow": grow,
        "admit": admit,
        "delta": delta,
        "checkpoint": ck,
        "shrink": shrink,
        "load": load,
    }
    for name, st in steps.items():
        res[f"peak_ratio_{name}"] = st["peak_ratio"]
    # "load" is the driver's (discard_live); a keep-live load holds old + new table until
    # the swap (~2x by design) and is reported beside, as ``peak_ratio_load_keep_live``.
    res["peak_rss_ratio"] = max(st["peak_ratio"] for st in steps.values())
    return res


def restore(uri: str) -> dict[str, float]:
    """Load a checkpoint into a fresh shard (the driver's restore after a failure: there is
    no old table to keep): seconds and peak RSS ratio."""
    settle()
    fresh = Shard(config())
    st = Step(rss()).run(lambda: fresh.load(uri))
    fresh.close()
    return {"restore_seconds": st["seconds"], "peak_ratio_restore": st["peak_ratio"]}


def save(shard: Shard, uri: str, mode: SaveMode) -> None:
    checkpoint.publish(uri, [shard.save(uri, mode)], config=shard.config)


def over_rpc(n: int, args: argparse.Namespace, work: Path) -> dict[str, float]:
    cfg = config()
    with (
        shard_process(cfg, work) as child,
        RemotePS([child.address], cfg, channels_per_server=2) as ps,
    ):
        ps.wait_ready()
        pid = child.process.pid
        warm = spread(300_000)[-200_000:]  # JIT, gRPC buffers: not table memory
        push_all(ps, warm, 1.0, 0.0)
        push_all(ps, warm, 10.0, 10.0)
        ps.pull_sparse(TABLE, warm)
        keys = spread(n)
        base = settled_rss(pid)
        push_all(ps, keys, 1.0, 0.0)
        unadmitted = settled_rss(pid) - base
        push_all(ps, keys, 10.0, 10.0)
        admitted = settled_rss(pid) - base
        res = {
            "rpc_unadmitted_bytes_per_key": unadmitted / n,
            "rpc_admitted_bytes_per_key": admitted / n,
        }
        res.update({f"rpc_{k}": v for k, v in speeds(ps, n, args).items()})
    return res


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m streamtrain_tools.bench.ps.scale", description=__doc__
    )
    p.add_argument(
        "--sizes",
        default="10000000",
        help="comma-separated table sizes (50M and 100M need ~5 and ~10 GB)",
    )
    p.add_argument("--rpc-keys", type=int, default=0, help="gRPC table size (default: first)")
    p.add_argument("--batch", type=int, default=100_000, help="keys per batch")
    p.add_argument("--zipf", type=float, default=1.1, help="Zipf exponent of the key stream")
    p.add_argument("--seconds", type=float, default=2.0, help="duration of each measurement")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--workdir", default=None, help="where saves go (default: a temp dir)")
    p.add_argument("--skip-rpc", action="store_true", help="in-process only")
    p.add_argument(
        "--capped-keys",
        type=int,
        default=4_000_000,
        help="keys of the memory-capped phase (0: skip it; 100000000 for the issue's size)",
    )
    p.add_argument(
        "--capped-bytes-per-key",
        type=float,
        default=20.0,
        help="capped limit above the fixed overhead per key (20: 2 GiB for 100M keys)",
    )
    p.add_argument(
        "--capped-scale-reserve",
        action="store_true",
        help="no request reserve in the capped limit beside the per-key bytes (earlier rounds)",
    )
    p.add_argument(
        "--keep-live-up-to",
        type=int,
        default=60_000_000,
        help="largest size that also measures a keep-live load (old + new table: ~2x)",
    )
    p.add_argument("--json", action="store_true", help="end with one JSON line (always printed)")
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",")]
    print(
        f"PS scale bench: sizes {sizes}, embedxDim {DIM}, SparseAdaGrad, embedxThreshold 10, "
        f"batches of {args.batch:,}, Zipf {args.zipf} over 10x the table, "
        f"{os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f}",
        flush=True,
    )
    per_size: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory(dir=args.workdir) as tmp:
        for n in sizes:
            d = Path(tmp) / f"n{n}"
            d.mkdir()
            per_size[str(n)] = in_process(n, args, d)
            per_size[str(n)].update(restore(str(d / "ck")))
            report(f"in-process, {n:,} keys", per_size[str(n)])
        rpc: dict[str, float] = {}
        if not args.skip_rpc:
            rpc = over_rpc(args.rpc_keys or sizes[0], args, Path(tmp))
            report(f"gRPC shard process, {args.rpc_keys or sizes[0]:,} keys", rpc)
        capped: dict[str, float] = {}
        if args.capped_keys:
            # imported here: the capped phase builds on this module's helpers
            from streamtrain_tools.bench.ps.capped import capped_phase

            d = Path(tmp) / "capped"
            d.mkdir()
            capped = capped_phase(args, d)
            report(f"memory-capped shard process vs uncapped, {args.capped_keys:,} keys", capped)
    first = per_size[str(sizes[0])]
    result: dict[str, Any] = {
        "unadmitted_bytes_per_key": max(r["unadmitted_bytes_per_key"] for r in per_size.values()),
        "admitted_bytes_per_key": max(r["admitted_bytes_per_key"] for r in per_size.values()),
        "peak_rss_ratio": max(r["peak_rss_ratio"] for r in per_size.values()),
        "peak_ratio_restore": max(r["peak_ratio_restore"] for r in per_size.values()),
        "peak_ratio_load_keep_live": max(
            (
                r["peak_ratio_load_keep_live"]
                for r in per_size.values()
                if "peak_ratio_load_keep_live" in r
            ),
            default=None,
        ),
        "delta_save_seconds_10m": first["delta_save_seconds"] * 1e7 / sizes[0],
        "delta_after_pass_seconds_10m": first["delta_after_pass_seconds"] * 1e7 / sizes[0],
        **{k: v for k, v in rpc.items() if "bytes" in k or "unique_keys" in k},
        **capped,
        "sizes": {n: {k: round(v, 3) for k, v in r.items()} for n, r in per_size.items()},
    }
    print(json.dumps(_rounded(result)), flush=True)
    return 0


def report(title: str, res: dict[str, float]) -> None:
    print(f"\n{title}")
    for k, v in res.items():
        print(f"  {k:42} {v:>16,.2f}")


def _rounded(obj: Any) -> Any:
    if isinstance(obj, float):
        return round(obj, 3)
    if isinstance(obj, dict):
        return {k: _rounded(v) for k, v in obj.items()}
    return obj


if __name__ == "__main__":
    sys.exit(main())
