"""Load a shard's numba kernels from their cache while the job's other processes start.

A numba kernel is loaded from its on-disk cache (or compiled) at its first call, in the
calling thread, and the process's first load also builds numba's typing registries: the
first save of a fresh shard took 0.5 s instead of 0.07 s (``make bench-e2e``'s genesis
checkpoint, 0.3 s of the start-up), the first pull and push likewise. A shard is ready
(``listening on``) after ~0.6 s while a worker's torch import takes ~2 s, so
``start_warm_up`` runs every kernel an uncapped shard calls once on scratch tables
(``warm_table_kernels``: a capped shard runs ``warm_kernels``, with the disk tier's, before
measuring its budget) in a daemon thread started once the shard announced itself: the loads
happen in that idle time. A call that
comes before it finished waits on numba's compile lock for the same load, never loads
twice. Scratch tables only: nothing of the shard's state is touched.
"""

from __future__ import annotations

import logging
import tempfile
import threading
from concurrent import futures
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from streamtrain_ps.api import SaveMode
from streamtrain_ps.config import PSConfig
from streamtrain_ps.plumbing.heap import release_scratch_memory
from streamtrain_ps.tier.tiering import DiskOptions, TieredTable

log = logging.getLogger(__name__)


def start_warm_up(config: PSConfig) -> threading.Thread | None:
    """``warm_table_kernels`` in a daemon thread, or ``None`` for a capped shard (it warmed its
    kernels before measuring its memory budget). A failure is logged: the first call then
    loads its kernel itself and reports any real error."""
    if config.memoryLimit:
        return None

    def run() -> None:
        try:
            warm_table_kernels(config)
        except Exception:
            log.exception("loading the kernels ahead of the first call failed")

    thread = threading.Thread(target=run, name="kernel-warm-up", daemon=True)
    thread.start()
    return thread


def warm_kernels(config: PSConfig) -> None:
    """Run every kernel a capped shard uses (push, admission, pull, demotion, promotion,
    shrink of both tiers, a save's selection and copy) once on scratch tables, load the
    disk tier's library and start gRPC (``warm_rpc``), so the fixed overhead measured next
    includes their code and numba's compilation (or cache load) never lands on the table
    budget later."""
    with tempfile.TemporaryDirectory(prefix="streamtrain-warm-") as tmp:
        _warm_tables(config, Path(tmp))
    warm_rpc()
    release_scratch_memory()


def warm_table_kernels(config: PSConfig) -> None:
    """Run the kernels an uncapped shard calls (push, admission, pull, shrink, a save's
    selection and copy) once on scratch tables held in memory. Not the disk tier's
    demotion and promotion, which only a capped shard calls, nor ``warm_rpc``, which is for
    a capped shard's budget (an uncapped shard's own server is already serving): 0.34
    CPU-seconds instead of ``warm_kernels``' 0.55 in a shard process (docs/benchmarks.md)."""
    _warm_tables(config, None)
    release_scratch_memory()


def _warm_tables(config: PSConfig, disk_dir: Path | None) -> None:
    """``_exercise`` a scratch table per configured table; with a disk tier under
    ``disk_dir`` and its moves when one is given."""
    for i, tc in enumerate(config.tables):
        disk = None if disk_dir is None else DiskOptions(disk_dir / str(i), 0, config.logicalShards)
        t = TieredTable(tc, seed=config.seed, disk=disk)
        try:
            _exercise(t, config.logicalShards, tiers=disk is not None)
        finally:
            t.close()


def warm_rpc() -> None:
    """Start a throwaway gRPC server, call it once over loopback and stop it, so gRPC's
    process-wide threads and pools, which the shard's own server starts and keeps, are in
    the fixed overhead measured next instead of eating the table budget later (measured:
    a shard process held ~8-11 MB more after its server had served requests)."""
    import grpc
    from grpc_health.v1 import health, health_pb2, health_pb2_grpc

    pool = futures.ThreadPoolExecutor(2, thread_name_prefix="warm-rpc")
    server = grpc.server(pool)
    health_pb2_grpc.add_HealthServicer_to_server(health.HealthServicer(), server)
    try:
        port = server.add_insecure_port("127.0.0.1:0")
    except RuntimeError:  # no loopback to bind: nothing to warm
        pool.shutdown()
        return
    server.start()
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = health_pb2_grpc.HealthStub(channel)
            stub.Check(health_pb2.HealthCheckRequest(), timeout=30)
    except grpc.RpcError:
        log.warning("the gRPC warm-up call failed; the fixed overhead may be measured low")
    finally:
        server.stop(None).wait()
        pool.shutdown()


def _frozen(a: npt.NDArray[Any]) -> npt.NDArray[Any]:
    """A read-only view, as ``wire`` decodes a request (``np.frombuffer``): numba compiles a
    kernel once per argument type, and read-only arrays are a type of their own."""
    view = a.view()
    view.setflags(write=False)
    return view


def _exercise(t: TieredTable, logical_shards: int, tiers: bool = True) -> None:
    n = 2048
    keys = np.arange(1, n + 1, dtype=np.uint64)
    grads = np.zeros((n, t.layout.embedx_dim + 1), np.float32)
    big = np.full(n, 1e3, np.float32)
    no_slots = np.empty(0, np.uint32)
    t.push_merged(t.merge(keys, grads, big, big, no_slots, (logical_shards, 1, 0)), False)
    t.pull(keys)
    # The same calls with the request's arrays read-only, as a shard's RPCs make them.
    ro_keys, ro_grads, ro_big, ro_slots = (_frozen(x) for x in (keys, grads, big, no_slots))
    merged = t.merge(ro_keys, ro_grads, ro_big, ro_big, ro_slots, (logical_shards, 1, 0))
    t.push_merged(merged, False)
    t.pull(ro_keys)
    if tiers:
        t.demote(0)  # every key to disk
        t.pull(keys)  # promoted back
        t.demote(t.ram_bytes() // 2)  # a clock sweep
        t.pull(keys)
        t.demote(t.ram_bytes() // 2, exact=True)  # the order an eviction uses
    t.shrink_keys()
    for mode in (SaveMode.DELTA, SaveMode.CHECKPOINT):
        rows, offsets = t.saves.rows_by_logical_shard(logical_shards, mode)
        for s in range(logical_shards):
            part_rows, part_keys, _, _ = t.saves.snapshot_part(
                rows[offsets[s] : offsets[s + 1]], mode, s
            )
            # A committed save's side effect (nothing saved: a zero delta changes nothing).
            zero = np.zeros(part_rows.size, np.float64)
            t.saves.apply_save(part_keys, part_rows, zero, False, t.moves)
