"""``make bench-ps`` (``python -m streamtrain_tools.bench.ps --json``): shard throughput, memory.

One shard, one table with ``embedxDim`` 8 and ``embedxThreshold`` 0 (every key expanded),
SparseAdaGrad. The table is grown to ``--keys`` keys (default 10M), then batches of
``--batch`` keys (default 100k) are drawn Zipf-like: rank ``r`` has probability ~ 1/r over
all keys (log-uniform ranks, bounded at the table size), so a batch has a hot head and a long
tail like real feature signs. Measured:

- in-process ``Shard.pull_sparse`` / ``push_sparse`` keys/s (``--threads`` callers);
- the same through ``RemotePS`` against ``python -m streamtrain_ps`` on 127.0.0.1
  (a subprocess, grown to the same size over gRPC);
- bytes per fully expanded key: resident-memory growth of the process holding the table
  while it grows, divided by the keys (in-process shard; the server's is printed too).

Keys/s counts the keys of the batches as the caller passed them (duplicates included), which
is what a worker experiences. A human table goes to stdout, then the LAST line is one JSON
object with ``pull_keys_per_s``, ``push_keys_per_s``, ``rpc_pull_keys_per_s``,
``rpc_push_keys_per_s`` and ``bytes_per_key``.
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

import numpy as np
import numpy.typing as npt

from streamtrain_ps.api import SparsePush
from streamtrain_ps.client.remote import RemotePS
from streamtrain_ps.config import PSConfig, SparseOptimizerConfig, TableConfig
from streamtrain_ps.plumbing.heap import release_scratch_memory
from streamtrain_ps.service.process import shard_process
from streamtrain_ps.shard import Shard

TABLE = "embedding"
GROW_CHUNK = 1_000_000
#: Smallest table whose RSS growth is a real measurement: its slab (64 B/key, grown x1.5)
#: exceeds glibc's largest mmap threshold (32 MiB), so it is fresh, counted memory.
MIN_RSS_KEYS = 1_000_000
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)


def bench_config(batch: int) -> PSConfig:
    return PSConfig(
        tables=(
            TableConfig(
                name=TABLE,
                embedxDim=8,
                embedxThreshold=0.0,
                optimizer=SparseOptimizerConfig(type="adagrad"),
            ),
        ),
        maxKeysPerRequest=max(batch, GROW_CHUNK),
    )


def all_keys(n: int) -> npt.NDArray[np.uint64]:
    """``n`` distinct, well-spread feature signs (an odd multiplier is a bijection mod 2^64)."""
    with np.errstate(over="ignore"):
        return np.arange(1, n + 1, dtype=np.uint64) * _GOLDEN


def zipf_batches(
    keys: npt.NDArray[np.uint64], batch: int, count: int, seed: int
) -> list[npt.NDArray[np.uint64]]:
    """Batches whose rank r is drawn with P ~ 1/r (log-uniform), bounded by the table size."""
    rng = np.random.default_rng(seed)
    log_n = np.log(keys.size)
    out = []
    for _ in range(count):
        ranks = np.floor(np.exp(rng.random(batch) * log_n)).astype(np.int64) - 1
        out.append(keys[np.clip(ranks, 0, keys.size - 1)])
    return out


class PushData:
    """Gradients, shows and clicks for one batch size (reused: generating them is not timed)."""

    def __init__(self, batch: int, dim: int, seed: int) -> None:
        rng = np.random.default_rng(seed)
        self.grads = (rng.standard_normal((batch, dim)) * 0.01).astype(np.float32)
        self.shows = np.ones(batch, np.float32)
        self.clicks = (rng.random(batch) < 0.05).astype(np.float32)


def rss_bytes(pid: int | None = None) -> int:
    """Resident set size from /proc (Linux)."""
    path = f"/proc/{pid or 'self'}/status"
    for line in Path(path).read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmRSS in {path}")


def grow(push: Callable[[str, SparsePush], object], keys: npt.NDArray[np.uint64], dim: int) -> None:
    """Push every key once (show 1), so every key exists and (threshold 0) is expanded."""
    for start in range(0, keys.size, GROW_CHUNK):
        chunk = keys[start : start + GROW_CHUNK]
        n = chunk.size
        grads = np.zeros((n, dim), np.float32)
        push(TABLE, SparsePush(chunk, grads, np.ones(n, np.float32), np.zeros(n, np.float32)))


def warm_up(config: PSConfig, dim: int) -> None:
    """Compile (or load) every numba kernel on a throwaway shard — including the ones only a
    growing table runs (resize, rehash) — so the JIT's own memory is not counted as table
    memory."""
    shard = Shard(config)
    keys = all_keys(200_000)
    for chunk in np.array_split(keys, 4):
        data = PushData(chunk.size, dim, 0)
        shard.push_sparse(TABLE, SparsePush(chunk, data.grads, data.shows, data.clicks))
        shard.pull_sparse(TABLE, chunk)
    shard.close()


def throughput(
    fn: Callable[[npt.NDArray[np.uint64]], object],
    batches: Sequence[npt.NDArray[np.uint64]],
    threads: int,
    seconds: float,
) -> float:
    """Keys/s of ``fn`` called back to back by ``threads`` threads for ~``seconds``."""
    fn(batches[0])  # warm-up: numba dispatch, channel connect
    done = [0] * threads
    stop_at = time.perf_counter() + seconds
    barrier = threading.Barrier(threads + 1)

    def loop(t: int) -> None:
        barrier.wait()
        i = t
        while time.perf_counter() < stop_at:
            b = batches[i % len(batches)]
            fn(b)
            done[t] += b.size
            i += threads

    workers = [threading.Thread(target=loop, args=(t,)) for t in range(threads)]
    for w in workers:
        w.start()
    start = time.perf_counter()
    barrier.wait()
    for w in workers:
        w.join()
    return sum(done) / (time.perf_counter() - start)


def grow_table(config: PSConfig, keys: npt.NDArray[np.uint64]) -> tuple[Shard, dict[str, float]]:
    """A shard grown to ``keys`` (all expanded) and what growing it cost: ``grow_s``,
    ``bytes_per_key`` (RSS growth / keys) and ``table_memory_bytes_per_key`` (stats).

    RSS growth is only meaningful from ``MIN_RSS_KEYS`` keys on: below, the slabs are under
    glibc's mmap threshold (<= 32 MiB) and may land in heap memory the process already holds
    resident, so growth can read as ~0 (it did, once, for 20k keys). Freed memory is handed
    back to the OS before the baseline is taken: the bulk pushes' ``malloc_trim`` would
    otherwise release it *during* the measurement and hide table memory."""
    dim = config.table(TABLE).push_dim
    warm_up(config, dim)
    gc.collect()
    release_scratch_memory()
    before = rss_bytes()
    shard = Shard(config)
    t0 = time.perf_counter()
    grow(shard.push_sparse, keys, dim)
    grow_s = time.perf_counter() - t0
    bytes_per_key = (rss_bytes() - before) / keys.size
    stats = shard.stats().tables[0]
    assert stats.keys == keys.size and stats.expanded_keys == keys.size, stats
    return shard, {
        "grow_s": grow_s,
        "bytes_per_key": bytes_per_key,
        "table_memory_bytes_per_key": stats.memory_bytes / keys.size,
    }


def pull_push_throughput(
    ps: Shard | RemotePS,
    batches: list[npt.NDArray[np.uint64]],
    dim: int,
    args: argparse.Namespace,
) -> dict[str, float]:
    """``pull_t<N>`` and ``push_t<N>`` keys/s of ``ps`` with 1 and ``args.threads`` threads,
    measured the same way in-process and over gRPC so the two columns compare."""
    res: dict[str, float] = {}
    data = PushData(args.batch, dim, args.seed)
    for threads in sorted({1, args.threads}):
        res[f"pull_t{threads}"] = throughput(
            lambda b: ps.pull_sparse(TABLE, b), batches, threads, args.seconds
        )
        res[f"push_t{threads}"] = throughput(
            lambda b: ps.push_sparse(TABLE, SparsePush(b, data.grads, data.shows, data.clicks)),
            batches,
            threads,
            args.seconds,
        )
    return res


def bench_in_process(
    config: PSConfig,
    keys: npt.NDArray[np.uint64],
    batches: list[npt.NDArray[np.uint64]],
    args: argparse.Namespace,
) -> dict[str, float]:
    dim = config.table(TABLE).push_dim
    shard, res = grow_table(config, keys)
    res.update(pull_push_throughput(shard, batches, dim, args))
    shard.close()
    return res


def bench_rpc(
    config: PSConfig,
    keys: npt.NDArray[np.uint64],
    batches: list[npt.NDArray[np.uint64]],
    args: argparse.Namespace,
) -> dict[str, float]:
    dim = config.table(TABLE).push_dim
    with (
        tempfile.TemporaryDirectory() as tmp,
        shard_process(config, Path(tmp), workers=args.server_workers) as child,
        RemotePS(
            [child.address],
            config,
            channels_per_server=args.channels,
            request_keys=args.request_keys,
        ) as ps,
    ):
        ps.wait_ready()
        warm = min(1000, keys.size // 10)
        grow(ps.push_sparse, keys[:warm], dim)  # JIT and gRPC buffers are not table memory
        before = rss_bytes(child.process.pid)
        t0 = time.perf_counter()
        grow(ps.push_sparse, keys[warm:], dim)
        res: dict[str, float] = {
            "grow_s": time.perf_counter() - t0,
            "server_bytes_per_key": (rss_bytes(child.process.pid) - before) / (keys.size - warm),
        }
        res.update(pull_push_throughput(ps, batches, dim, args))
    return res


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m streamtrain_tools.bench.ps", description=__doc__)
    p.add_argument("--keys", type=int, default=10_000_000, help="table size")
    p.add_argument("--batch", type=int, default=100_000, help="keys per batch")
    p.add_argument("--batches", type=int, default=16, help="distinct batches cycled through")
    p.add_argument("--seconds", type=float, default=4.0, help="duration of each measurement")
    p.add_argument("--threads", type=int, default=os.cpu_count() or 2, help="concurrent callers")
    p.add_argument("--channels", type=int, default=2, help="gRPC channels to the server")
    p.add_argument("--request-keys", type=int, default=65_536, help="keys per RPC (client split)")
    p.add_argument("--server-workers", type=int, default=16, help="server RPC threads")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--skip-rpc", action="store_true", help="in-process only")
    p.add_argument("--skip-local", action="store_true", help="gRPC only")
    p.add_argument("--json", action="store_true", help="end with one JSON line (always printed)")
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    config = bench_config(args.batch)
    keys = all_keys(args.keys)
    batches = zipf_batches(keys, args.batch, args.batches, args.seed)
    unique = float(np.mean([np.unique(b).size / b.size for b in batches]))
    print(
        f"PS shard bench: {args.keys:,} keys, embedxDim 8 (all expanded), SparseAdaGrad, "
        f"batches of {args.batch:,} Zipf-like keys ({unique:.0%} unique), "
        f"{args.threads} caller threads, {os.cpu_count()} cores, "
        f"load average {os.getloadavg()[0]:.1f}",
        flush=True,
    )
    local = {} if args.skip_local else bench_in_process(config, keys, batches, args)
    gc.collect()
    remote = {} if args.skip_rpc else bench_rpc(config, keys, batches, args)
    t = args.threads

    def best(res: dict[str, float], op: str) -> int:
        return round(max(res.get(f"{op}_t1", 0.0), res.get(f"{op}_t{t}", 0.0)))

    rows = [
        ("grow to table size (s)", "grow_s", "grow_s"),
        ("pull keys/s, 1 thread", "pull_t1", "pull_t1"),
        (f"pull keys/s, {t} threads", f"pull_t{t}", f"pull_t{t}"),
        ("push keys/s, 1 thread", "push_t1", "push_t1"),
        (f"push keys/s, {t} threads", f"push_t{t}", f"push_t{t}"),
        ("RSS bytes per expanded key", "bytes_per_key", "server_bytes_per_key"),
        ("table memory_bytes per key", "table_memory_bytes_per_key", ""),
    ]
    print(f"{'':32} {'in-process':>14} {'gRPC 127.0.0.1':>16}")
    for name, a, b in rows:
        cells = [f"{r[k]:,.1f}" if k in r else "-" for r, k in ((local, a), (remote, b))]
        print(f"{name:32} {cells[0]:>14} {cells[1]:>16}")
    result = {
        "pull_keys_per_s": best(local, "pull"),
        "push_keys_per_s": best(local, "push"),
        "rpc_pull_keys_per_s": best(remote, "pull"),
        "rpc_push_keys_per_s": best(remote, "push"),
        "bytes_per_key": round(local.get("bytes_per_key", 0.0), 1),
        # False: the table is too small for RSS growth to mean anything (see grow_table)
        "bytes_per_key_measurable": args.keys >= MIN_RSS_KEYS and not args.skip_local,
        "table_memory_bytes_per_key": round(local.get("table_memory_bytes_per_key", 0.0), 1),
        "server_bytes_per_key": round(remote.get("server_bytes_per_key", 0.0), 1),
        "keys": args.keys,
        "batch": args.batch,
        "threads": t,
    }
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
