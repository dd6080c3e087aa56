"""``python -m streamtrain_tools.bench.ps.load --json`` (``make bench-load``): concurrent clients
against two PS shard processes — throughput, latency, memory, and proof that nothing is lost.

Two ``python -m streamtrain_ps`` children (shard 0 and 1 of 2) run on 127.0.0.1 port 0. The
table (``--keys`` keys, embedxDim 8, embedx admitted at once) is first grown by pushing every
key once. Then, for each N in ``--clients`` (default 1, 4, 16), N threads — each with its own
``RemotePS``, i.e. its own channels and connections, like N workers — loop for ``--seconds``:
pull a batch of ``--batch`` Zipf-drawn keys (rank r with P ~ 1/r), then push gradients with
show 1 and click 0/1 for the same keys, exactly what a training worker does per batch.

Measured per N: client calls/s and keys/s (pull + push, keys as the caller passed them,
duplicates included), p50/p99 latency of pulls and pushes, and the PS processes' RSS. At the
end the bench checks the three properties the issue asks for:

- **no lost update**: every client counts what it pushed per key (a batch is pushed whole, so
  ``uses(batch) x bincount(batch)`` is exact); one final pull of every key must return
  exactly those show and click totals. There is no shrink and ``showClickDecayRate`` is 1, and
  every total stays below 2**24 (checked), so float32 sums are exact integers;
- **no deadlock**: every client thread ends within its deadline plus ``--grace``;
- **bounded memory**: once every key exists the table does not grow, so the servers' RSS after
  the last N must stay within ``--rss-slack`` bytes of their RSS after growing.

A human table goes to stdout, then the LAST line is one JSON object
(``{"n1": {...}, "n4": {...}, "n16": {...}, "lost_updates": 0, ...}``). The exit status is 1
if any property fails, so CI can run a short version (``tests/ps/test_load_totals.py``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from streamtrain_ps.api import SparsePush
from streamtrain_ps.client.remote import RemotePS, RetryPolicy
from streamtrain_ps.config import PSConfig, SparseOptimizerConfig, TableConfig
from streamtrain_ps.service.process import shard_process
from streamtrain_tools.bench.ps.run import all_keys, rss_bytes

TABLE = "embedding"
EMBEDX_DIM = 8
SERVERS = 2
#: float32 holds every integer below 2**24 exactly; above it totals could round.
EXACT_LIMIT = 2**24


@dataclass(frozen=True)
class LoadSettings:
    """What one run does (the command-line flags)."""

    clients: tuple[int, ...] = (1, 4, 16)
    seconds: float = 10.0
    keys: int = 1_000_000
    batch: int = 4096
    pool: int = 16
    click_rate: float = 0.05
    seed: int = 0
    #: Extra time a client may take past its deadline before it counts as deadlocked.
    grace: float = 60.0
    #: Allowed RSS growth of each server after the table is grown (gRPC buffers, allocator).
    rss_slack: int = 256 * 1024 * 1024


def load_config(settings: LoadSettings) -> PSConfig:
    """One table whose show/click totals are exact: no decay, embedx admitted at once."""
    return PSConfig(
        tables=(
            TableConfig(
                name=TABLE,
                embedxDim=EMBEDX_DIM,
                embedxThreshold=0.0,
                showClickDecayRate=1.0,
                optimizer=SparseOptimizerConfig(type="adagrad"),
            ),
        ),
        maxKeysPerRequest=max(settings.batch, settings.keys),
    )


@dataclass
class Batch:
    """A pre-drawn batch: key indices into the key space, and what a push of it carries."""

    index: npt.NDArray[np.int64]
    clicks: npt.NDArray[np.float32]
    grads: npt.NDArray[np.float32]


def zipf_pool(settings: LoadSettings, seed: int) -> list[Batch]:
    """``settings.pool`` batches with rank r drawn log-uniformly (P ~ 1/r), bounded by the
    key space; drawn before the clock starts so the client measures the PS, not numpy."""
    rng = np.random.default_rng(seed)
    log_n = np.log(settings.keys)
    out = []
    for _ in range(settings.pool):
        ranks = np.floor(np.exp(rng.random(settings.batch) * log_n)).astype(np.int64) - 1
        index = np.clip(ranks, 0, settings.keys - 1)
        clicks = (rng.random(settings.batch) < settings.click_rate).astype(np.float32)
        grads = (rng.standard_normal((settings.batch, EMBEDX_DIM + 1)) * 0.01).astype(np.float32)
        out.append(Batch(index, clicks, grads))
    return out


@dataclass
class ClientResult:
    """What one client did; ``uses[b]`` counts completed pushes of pool batch ``b``."""

    uses: npt.NDArray[np.int64]
    pull_seconds: list[float] = field(default_factory=list)
    push_seconds: list[float] = field(default_factory=list)
    keys: int = 0
    errors: list[str] = field(default_factory=list)
    finished: bool = False


def run_client(
    ps: RemotePS, keys: npt.NDArray[np.uint64], pool: list[Batch], stop_at: float, seed: int
) -> ClientResult:
    """Pull then push random pool batches until ``stop_at`` (``time.monotonic``).

    A push is counted only once it returned, and a failed push ends the client: a push
    that raised may or may not have been applied, so counting it either way would make the
    lost-update check guess. The error is reported instead (and fails the run).
    """
    rng = np.random.default_rng(seed)
    res = ClientResult(uses=np.zeros(len(pool), dtype=np.int64))
    ones = np.ones(pool[0].index.size, dtype=np.float32)
    try:
        while time.monotonic() < stop_at:
            b = int(rng.integers(len(pool)))
            batch = pool[b]
            k = keys[batch.index]
            t0 = time.perf_counter()
            ps.pull_sparse(TABLE, k)
            t1 = time.perf_counter()
            ps.push_sparse(TABLE, SparsePush(k, batch.grads, ones, batch.clicks))
            t2 = time.perf_counter()
            res.uses[b] += 1
            res.pull_seconds.append(t1 - t0)
            res.push_seconds.append(t2 - t1)
            res.keys += 2 * k.size
    except Exception as exc:  # reported in the result and fails the run; never swallowed
        res.errors.append(f"{type(exc).__name__}: {exc}")
    res.finished = True
    return res


def totals_of(
    pool: list[Batch], uses: npt.NDArray[np.int64], n_keys: int
) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]:
    """Exact per-key show and click totals of ``uses[b]`` pushes of each pool batch."""
    shows = np.zeros(n_keys, dtype=np.float64)
    clicks = np.zeros(n_keys, dtype=np.float64)
    for b, count in enumerate(uses):
        if count:
            batch = pool[b]
            shows += count * np.bincount(batch.index, minlength=n_keys)
            clicks += count * np.bincount(batch.index, weights=batch.clicks, minlength=n_keys)
    return shows, clicks


def _percentile_ms(samples: list[float], q: float) -> float:
    return float(np.percentile(samples, q) * 1000) if samples else float("nan")


def run_phase(
    endpoints: Sequence[str],
    config: PSConfig,
    keys: npt.NDArray[np.uint64],
    pools: list[list[Batch]],
    *,
    n: int,
    settings: LoadSettings,
) -> tuple[dict[str, Any], list[ClientResult]]:
    """N clients for ``settings.seconds``; returns the phase's numbers and client results."""
    retry = RetryPolicy(max_attempts=5, initial_backoff=0.05, total_seconds=10.0, rpc_timeout=30.0)
    results: list[ClientResult | None] = [None] * n
    with ExitStack() as stack:
        clients = [stack.enter_context(RemotePS(endpoints, config, retry=retry)) for _ in range(n)]
        for c in clients:
            c.wait_ready(timeout=30)
        start_gate = threading.Barrier(n + 1)
        stop_at = [0.0]

        def body(i: int) -> None:
            start_gate.wait()
            results[i] = run_client(
                clients[i], keys, pools[i], stop_at[0], settings.seed * 1000 + n * 100 + i
            )

        threads = [threading.Thread(target=body, args=(i,), name=f"client-{i}") for i in range(n)]
        for t in threads:
            t.start()
        stop_at[0] = time.monotonic() + settings.seconds
        start = time.perf_counter()
        start_gate.wait()
        hard_deadline = time.monotonic() + settings.seconds + settings.grace
        for t in threads:
            t.join(timeout=max(0.0, hard_deadline - time.monotonic()))
        wall = time.perf_counter() - start
        stuck = [t.name for t in threads if t.is_alive()]
        if stuck:
            # Never hang the bench: report and stop the whole process from main().
            raise DeadlockError(f"N={n}: clients {stuck} still running {settings.grace}s late")
    done = [r for r in results if r is not None]
    pulls = [s for r in done for s in r.pull_seconds]
    pushes = [s for r in done for s in r.push_seconds]
    calls = len(pulls) + len(pushes)
    phase = {
        "clients": n,
        "seconds": round(wall, 3),
        "requests_per_s": round(calls / wall, 1),
        "keys_per_s": round(sum(r.keys for r in done) / wall),
        "pull_p50_ms": round(_percentile_ms(pulls, 50), 3),
        "pull_p99_ms": round(_percentile_ms(pulls, 99), 3),
        "push_p50_ms": round(_percentile_ms(pushes, 50), 3),
        "push_p99_ms": round(_percentile_ms(pushes, 99), 3),
        "errors": sum(len(r.errors) for r in done),
        "finished": sum(r.finished for r in done),
    }
    return phase, done


class DeadlockError(RuntimeError):
    """A client did not finish within its deadline plus the grace period."""


def grow_table(ps: RemotePS, keys: npt.NDArray[np.uint64], chunk: int = 200_000) -> None:
    """Push every key once (show 1, click 0): after this the table never grows again."""
    for start in range(0, keys.size, chunk):
        k = keys[start : start + chunk]
        ps.push_sparse(
            TABLE,
            SparsePush(
                k,
                np.zeros((k.size, EMBEDX_DIM + 1), np.float32),
                np.ones(k.size, np.float32),
                np.zeros(k.size, np.float32),
            ),
        )


def run(settings: LoadSettings, workdir: Path, log: Any = print) -> dict[str, Any]:
    """The whole bench; returns the JSON result (``ok`` says whether every check passed)."""
    config = load_config(settings)
    keys = all_keys(settings.keys)
    max_n = max(settings.clients)
    pools = [zipf_pool(settings, settings.seed * 7919 + i) for i in range(max_n)]
    expected_shows = np.ones(settings.keys, dtype=np.float64)  # the growing push
    expected_clicks = np.zeros(settings.keys, dtype=np.float64)
    result: dict[str, Any] = {}
    with ExitStack() as stack:
        children = [
            stack.enter_context(shard_process(config, workdir, index=i, count=SERVERS))
            for i in range(SERVERS)
        ]
        endpoints = [c.address for c in children]
        pids = [c.process.pid for c in children]
        with RemotePS(endpoints, config) as admin:
            admin.wait_ready(timeout=30)
            grow_table(admin, keys)
            rss_grown = [rss_bytes(p) for p in pids]
            log(
                f"grown: {settings.keys:,} keys on {SERVERS} shards, "
                f"RSS {[f'{r / 2**20:.0f} MiB' for r in rss_grown]}"
            )
            errors = 0
            for n in settings.clients:
                phase, done = run_phase(endpoints, config, keys, pools, n=n, settings=settings)
                phase["ps_rss_bytes"] = [rss_bytes(p) for p in pids]
                result[f"n{n}"] = phase
                errors += phase["errors"]
                for i, r in enumerate(done):
                    s, c = totals_of(pools[i], r.uses, settings.keys)
                    expected_shows += s
                    expected_clicks += c
                    for e in r.errors:
                        log(f"  N={n} client {i}: {e}")
            pulled = admin.pull_sparse(TABLE, keys)
            stats = admin.stats()
        rss_end = [rss_bytes(p) for p in pids]
    exact = bool(expected_shows.max() < EXACT_LIMIT)
    lost_shows = np.count_nonzero(pulled[:, 0].astype(np.float64) != expected_shows)
    lost_clicks = np.count_nonzero(pulled[:, 1].astype(np.float64) != expected_clicks)
    growth = [e - g for e, g in zip(rss_end, rss_grown, strict=True)]
    table = stats.tables[0]
    result.update(
        {
            "lost_updates": int(max(lost_shows, lost_clicks)),
            "keys_with_wrong_show": int(lost_shows),
            "keys_with_wrong_click": int(lost_clicks),
            "shows_expected": int(expected_shows.sum()),
            "shows_in_table": int(pulled[:, 0].astype(np.float64).sum()),
            "totals_exact_in_float32": exact,
            "deadlock": False,
            "errors": errors,
            "table_keys": table.keys,
            "table_memory_bytes": table.memory_bytes,
            "ps_rss_after_grow_bytes": rss_grown,
            "ps_rss_end_bytes": rss_end,
            "ps_rss_growth_bytes": growth,
            "memory_bounded": all(g <= settings.rss_slack for g in growth),
            "keys": settings.keys,
            "batch": settings.batch,
            "seconds_per_n": settings.seconds,
            "servers": SERVERS,
            "cores": os.cpu_count(),
        }
    )
    result["ok"] = bool(
        result["lost_updates"] == 0
        and exact
        and errors == 0
        and result["memory_bounded"]
        and table.keys == settings.keys
    )
    return result


def print_table(result: dict[str, Any], clients: Sequence[int]) -> None:
    head = (
        f"{'N':>3} {'calls/s':>9} {'keys/s':>12} {'pull p50':>9} {'pull p99':>9} "
        f"{'push p50':>9} {'push p99':>9} {'errors':>6}  PS RSS (MiB)"
    )
    print(head)
    for n in clients:
        p = result[f"n{n}"]
        rss = ", ".join(f"{r / 2**20:.0f}" for r in p["ps_rss_bytes"])
        print(
            f"{n:>3} {p['requests_per_s']:>9,.1f} {p['keys_per_s']:>12,} "
            f"{p['pull_p50_ms']:>7.1f}ms {p['pull_p99_ms']:>7.1f}ms "
            f"{p['push_p50_ms']:>7.1f}ms {p['push_p99_ms']:>7.1f}ms {p['errors']:>6}  {rss}"
        )
    print(
        f"lost updates: {result['lost_updates']} (shows expected {result['shows_expected']:,}, "
        f"in table {result['shows_in_table']:,}); deadlock: {result['deadlock']}; "
        f"RSS growth after grow: {[f'{g / 2**20:.1f} MiB' for g in result['ps_rss_growth_bytes']]}"
        f" (bounded: {result['memory_bounded']})"
    )


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m streamtrain_tools.bench.ps.load", description=__doc__
    )
    d = LoadSettings()
    p.add_argument("--clients", default=",".join(map(str, d.clients)), help="N values, e.g. 1,4,16")
    p.add_argument("--seconds", type=float, default=d.seconds, help="load time per N")
    p.add_argument("--keys", type=int, default=d.keys, help="key space (table size)")
    p.add_argument("--batch", type=int, default=d.batch, help="keys per pull/push")
    p.add_argument("--grace", type=float, default=d.grace, help="seconds late = deadlock")
    p.add_argument("--seed", type=int, default=d.seed)
    p.add_argument("--json", action="store_true", help="end with one JSON line (always printed)")
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    clients = tuple(int(x) for x in str(args.clients).split(",") if x.strip())
    if not clients or min(clients) < 1:
        print(
            f"error: --clients must list positive integers, got {args.clients!r}", file=sys.stderr
        )
        return 2
    settings = LoadSettings(
        clients=clients,
        seconds=args.seconds,
        keys=args.keys,
        batch=args.batch,
        grace=args.grace,
        seed=args.seed,
    )
    print(
        f"PS load bench: {SERVERS} shard processes, {settings.keys:,} keys (embedxDim "
        f"{EMBEDX_DIM}, all expanded), Zipf batches of {settings.batch:,} keys, "
        f"N = {list(clients)} clients x {settings.seconds:g}s, {os.cpu_count()} cores",
        flush=True,
    )
    with tempfile.TemporaryDirectory() as tmp:
        try:
            result = run(settings, Path(tmp))
        except DeadlockError as exc:
            print(f"DEADLOCK: {exc}", flush=True)
            print(json.dumps({"deadlock": True, "ok": False, "error": str(exc)}), flush=True)
            os._exit(1)  # stuck client threads must not keep the process alive
    print_table(result, clients)
    print(json.dumps(result), flush=True)
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
