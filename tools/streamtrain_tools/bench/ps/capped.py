"""The memory-capped phase of ``make bench-ps-scale``: one shard process under a
``memoryLimit`` against the same shard uncapped, side by side in one run.

The issue's point is a shard limited to 2 GiB holding 100M keys. That takes tens of
minutes to grow on a 2-core box, so the default is the same limit *per key* at a smaller
table (``--capped-keys``, default 4M; ``--capped-keys 100000000`` for the full size):

- **limit** = the fixed overhead of a shard process (measured in a fresh interpreter as
  the shard measures it: interpreter, numpy, numba code, RocksDB, gRPC modules), plus the
  scratch reserve of one request in flight (``capped_request_reserve_bytes``: a constant
  of the process, like the overhead, not a per-key cost), plus ``--capped-bytes-per-key``
  (default 20 B: (2 GiB − ~170 MB of overhead) / 100M keys) times the keys. Scaled down
  this way the tables get about the bytes per key they get under 2 GiB at 100M keys
  (~15 B); ``--capped-scale-reserve`` leaves the reserve out (the earlier rounds' limit,
  where it takes half of the 80 MB at 4M keys). Most keys go to disk either way.
- **growth**: both shards get every key once (score 0.1, the long tail), then the
  ``HOT_SHARE`` most popular keys of the Zipf law again (score 0.5), so the hot set is
  what the capped shard keeps in RAM; keys/s of each growth step, for the capped shard past
  its cap the rate at which it takes new keys.
- **warm-up**: one untimed-for-the-ratio pass pulling each Zipf batch once, the same for
  both shards: the capped shard promotes the batches' disk keys here (the issue's target is
  the throughput "when the Zipf hot set fits in RAM", a steady state). Reported on its own:
  ``*_warmup_pull_unique_keys_per_s`` and ``capped_warmup_promotions`` (read from the
  shard's metrics), so the warm-up is measured, not hidden.
- **pulls**: the Zipf batches of the uncapped bench (a key space 10x the table, so some
  draws hit disk keys, promoted, and some keys no tier holds), unique keys/s of each shard,
  alternated twice, best of each; ``capped_pull_ratio`` = capped / uncapped (target ≥ 0.5).
  Zipf pushes likewise (``capped_push_ratio``). ``capped_timed_promotions``: keys the
  capped shard still promoted inside the timed windows.
- **RSS**: a thread samples the capped process's VmRSS every ``SAMPLE_SECONDS`` for its
  whole life; ``capped_rss_max_over_limit_bytes`` = the largest sample minus the limit
  (≤ 0: never past it), with VmHWM at the end beside it and the same figure per phase
  (``capped_rss_over_limit_<phase>_bytes``: grow, hot_push, warmup, pull, push).
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import Any
from urllib.request import urlopen

import numpy as np

import streamtrain_ps
import streamtrain_tools as bench
from streamtrain_ps.api import SparsePush
from streamtrain_ps.client.remote import RemotePS
from streamtrain_ps.config import CAPPED_REQUEST_KEYS, PSConfig
from streamtrain_ps.plumbing.launch import Launched, free_port
from streamtrain_ps.service.process import shard_process
from streamtrain_ps.tier.memory_limit import (
    SPARE_RPC_THREADS,
    STORE_OUTSIDE_CACHE,
    request_scratch_bytes,
)
from streamtrain_tools.bench.ps.scale import DIM, TABLE, config, rss, spread, throughput, zipf_ranks

#: Share of the table pushed again (more shows): the Zipf head the capped RAM tier keeps.
HOT_SHARE = 0.1
SAMPLE_SECONDS = 0.05
#: Run in a fresh interpreter: what a shard process holds before its first key, measured
#: as the shard measures it (the allocator bounded, every kernel warm, RocksDB loaded).
OVERHEAD = (
    "import streamtrain_ps.__main__\n"
    "from streamtrain_ps.tier.memory_limit import bound_allocator, current_rss_bytes\n"
    "from streamtrain_ps.tier.warmup import warm_kernels\n"
    "from streamtrain_tools.bench.ps.scale import config\n"
    "bound_allocator()\n"
    "warm_kernels(config())\n"
    "print(current_rss_bytes())\n"
)


class RssSampler:
    """Samples a process's VmRSS from a thread until ``stop``; ``peak`` is the largest."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.peak = 0
        #: The largest sample since the last ``phase_peak``.
        self.recent = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="rss-sampler", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                now = rss(self.pid)
            except (OSError, RuntimeError):  # the process is gone
                return
            self.peak = max(self.peak, now)
            self.recent = max(self.recent, now)
            self._stop.wait(SAMPLE_SECONDS)

    def phase_peak(self) -> int:
        """The largest sample since the previous call (one phase's peak), then restart."""
        try:
            now = rss(self.pid)
        except (OSError, RuntimeError):
            now = 0
        peak, self.recent = max(self.recent, now), 0
        return peak

    def stop(self) -> int:
        self._stop.set()
        self._thread.join()
        return self.peak


def fixed_overhead() -> int:
    """A shard process's fixed overhead (``OVERHEAD``; an uncapped shard process compiles
    lazily and a capped one sizes its slot array for its limit, so neither shows it)."""
    # the child imports these very packages even when they are not installed
    roots = [str(Path(str(m.__file__)).resolve().parents[1]) for m in (streamtrain_ps, bench)]
    path = os.pathsep.join([*roots, os.environ.get("PYTHONPATH", "")])
    env = {**os.environ, "PYTHONPATH": path}
    out = subprocess.run(
        [sys.executable, "-c", OVERHEAD], capture_output=True, text=True, check=True, env=env
    )
    return int(out.stdout.strip().splitlines()[-1])


def promotions(port: int) -> int:
    """Keys the shard serving metrics on ``port`` has promoted from disk so far."""
    with urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        text = r.read().decode()
    found = re.findall(r"^streamtrain_ps_promotions_total\{[^}]*\} (\S+)$", text, re.M)
    return int(sum(float(v) for v in found))


def grow(ps: RemotePS, keys: np.ndarray, batch: int, show: float) -> float:
    """Push ``keys`` once in batches (no click); returns keys/s."""
    start = time.perf_counter()
    grads = np.zeros((batch, DIM + 1), np.float32)
    shows = np.full(batch, show, np.float32)
    clicks = np.zeros(batch, np.float32)
    for lo in range(0, keys.size, batch):
        k = keys[lo : lo + batch]
        ps.push_sparse(TABLE, SparsePush(k, grads[: k.size], shows[: k.size], clicks[: k.size]))
    return keys.size / (time.perf_counter() - start)


def capped_phase(args: argparse.Namespace, work: Path) -> dict[str, float]:
    """Grow an uncapped and a capped shard process alike, then measure both (module
    docstring). Returns the figures (``capped_*``)."""
    n = args.capped_keys
    keys = spread(n)
    hot = keys[: int(n * HOT_SHARE)]
    # Both shards admit requests of the size RemotePS sends (a capped shard's scratch
    # reserve holds its largest admitted request: ``memory_limit.request_scratch_bytes``).
    base = replace(config(), maxKeysPerRequest=min(args.batch, CAPPED_REQUEST_KEYS))
    (work / "uncapped").mkdir()
    (work / "capped").mkdir()
    overhead = fixed_overhead()
    request, message = request_scratch_bytes(base)
    reserve = 0 if args.capped_scale_reserve else request + SPARE_RPC_THREADS * message
    reserve += 0 if args.capped_scale_reserve else STORE_OUTSIDE_CACHE
    with shard_process(base, work / "uncapped") as free_child:
        limit = overhead + reserve + int(n * args.capped_bytes_per_key)
        res: dict[str, float] = {
            "capped_keys": n,
            "capped_limit_bytes": limit,
            "capped_fixed_overhead_bytes": overhead,
            "capped_request_reserve_bytes": reserve,
        }
        capped_cfg = replace(base, memoryLimit=limit, diskPath=str(work / "disk"))
        port = free_port()
        with shard_process(capped_cfg, work / "capped", metrics_port=port) as cap_child:
            _measure(args, res, free_child.address, base, (cap_child, port), capped_cfg, keys, hot)
    peak = res["capped_rss_peak_bytes"]
    res["capped_rss_max_over_limit_bytes"] = peak - limit
    res["capped_pull_ratio"] = (
        res["capped_pull_zipf_unique_keys_per_s"] / res["uncapped_pull_zipf_unique_keys_per_s"]
    )
    res["capped_push_ratio"] = (
        res["capped_push_zipf_unique_keys_per_s"] / res["uncapped_push_zipf_unique_keys_per_s"]
    )
    return res


def _measure(
    args: argparse.Namespace,
    res: dict[str, float],
    free_address: str,
    base: PSConfig,
    capped_shard: tuple[Launched, int],
    capped_cfg: PSConfig,
    keys: np.ndarray,
    hot: np.ndarray,
) -> None:
    """Grow both shards, warm both up, measure both, sample the capped one's RSS throughout
    (into ``res``); ``capped_shard``: the capped process and its metrics port."""
    cap_child, port = capped_shard
    rng = np.random.default_rng(args.seed)
    space = spread(10 * keys.size)
    batches = [space[zipf_ranks(rng, space.size, args.batch, args.zipf)] for _ in range(8)]
    grads = (rng.standard_normal((args.batch, DIM + 1)) * 0.01).astype(np.float32)
    ones = np.ones(args.batch, np.float32)
    clicks = (rng.random(args.batch) < 0.05).astype(np.float32)
    limit = int(res["capped_limit_bytes"])

    def phase_done(name: str) -> None:
        res[f"capped_rss_over_limit_{name}_bytes"] = sampler.phase_peak() - limit

    with (
        RemotePS([free_address], base) as free,
        RemotePS([cap_child.address], capped_cfg) as capped,
    ):
        sampler = RssSampler(cap_child.pid)
        try:
            free.wait_ready()
            capped.wait_ready()
            sides = {"uncapped": free, "capped": capped}
            for side, ps in sides.items():
                res[f"{side}_grow_keys_per_s"] = grow(ps, keys, args.batch, 1.0)
                if side == "capped":
                    phase_done("grow")
                res[f"{side}_hot_push_keys_per_s"] = grow(ps, hot, args.batch, 5.0)
            phase_done("hot_push")
            before = promotions(port)
            uniq = sum(int(np.unique(b).size) for b in batches)
            for side, ps in sides.items():
                start = time.perf_counter()
                for b in batches:
                    ps.pull_sparse(TABLE, b)
                res[f"{side}_warmup_pull_unique_keys_per_s"] = uniq / (time.perf_counter() - start)
            res["capped_warmup_promotions"] = (warm := promotions(port)) - before
            phase_done("warmup")
            for op in ("pull", "push"):
                for _ in range(2):  # alternated, so both see the same box load
                    for side, ps in sides.items():
                        fn: Any = (
                            (lambda b, ps=ps: ps.pull_sparse(TABLE, b))
                            if op == "pull"
                            else (
                                lambda b, ps=ps: ps.push_sparse(
                                    TABLE, SparsePush(b, grads, ones, clicks)
                                )
                            )
                        )
                        got = max(throughput(fn, batches, t, args.seconds)[0] for t in (1, 2))
                        key = f"{side}_{op}_zipf_unique_keys_per_s"
                        res[key] = max(res.get(key, 0.0), got)
                phase_done(op)
                if op == "pull":
                    res["capped_timed_pull_promotions"] = promotions(port) - warm
            res["capped_timed_promotions"] = promotions(port) - warm
            res["capped_hwm_bytes"] = rss(cap_child.pid, "VmHWM")
        finally:
            res["capped_rss_peak_bytes"] = sampler.stop()
