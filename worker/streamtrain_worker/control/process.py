"""The worker process (``python -m streamtrain_worker``): one worker's control server until
SIGTERM.

Prints ``listening on HOST:PORT`` (flushed, ``streamtrain_ps.plumbing.startup``) once the server
accepts RPCs, so a launcher that passes ``--port 0`` reads the bound port from the first
line of output; with ``--metrics-port`` (0 picks a free one) the next line is ``metrics on
http://HOST:PORT/metrics``. The PS servers are reached through ``RemotePS`` at
``ps.endpoints`` of the config; a PS that is down at start is not an error (the first
RunPass waits for it within ``ps.maxRetrySeconds``).
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence
from pathlib import Path

import torch
from prometheus_client import CollectorRegistry

from streamtrain_ps.client.remote import RemotePS, RetryPolicy
from streamtrain_ps.config import ConfigError
from streamtrain_ps.plumbing import tls as tls_flags
from streamtrain_ps.plumbing.grpc_serving import serve_metrics, started, stop_on_signals
from streamtrain_ps.plumbing.heap import reuse_large_buffers
from streamtrain_ps.plumbing.startup import announce
from streamtrain_ps.plumbing.tls import TLSConfigError
from streamtrain_worker.config import WorkerConfig
from streamtrain_worker.control.service import CONTROL_METHODS, WorkerServer, WorkerServicer
from streamtrain_worker.control.warmup import start_warm_up
from streamtrain_worker.monitoring import WorkerMetrics


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m streamtrain_worker", description=__doc__)
    p.add_argument("--port", type=int, required=True, help="gRPC port; 0 picks a free one")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (0.0.0.0 in a pod)")
    p.add_argument(
        "--config",
        type=Path,
        required=True,
        help="worker config JSON; '-' reads it from stdin once the imports are done (local "
        "mode starts workers beside their PS shards and sends the config once the shards' "
        "addresses are known)",
    )
    p.add_argument("--worker-index", type=int, default=0, help="for logs only")
    p.add_argument("--metrics-port", type=int, help="serve Prometheus metrics on this port")
    p.add_argument("--grace", type=float, default=30.0, help="seconds to finish a pass on SIGTERM")
    p.add_argument("--log-level", default="INFO")
    # The same certificate serves the control port and dials the PS shards.
    tls_flags.add_arguments(p)
    return p.parse_args(argv)


def retry_policy(config: WorkerConfig) -> RetryPolicy:
    """Retries bounded by time (``ps.maxRetrySeconds``), not by a count."""
    return RetryPolicy(
        max_attempts=1_000_000,
        total_seconds=config.ps.maxRetrySeconds,
        rpc_timeout=config.ps.timeoutSeconds,
    )


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    try:
        text = sys.stdin.read() if str(args.config) == "-" else args.config.read_text()
        config = WorkerConfig.from_json(text)
    except (OSError, ConfigError) as exc:
        print(f"error: --config {args.config}: {exc}", file=sys.stderr)
        return 2
    if not config.ps.endpoints:
        print(f"error: --config {args.config}: worker.ps.endpoints: required", file=sys.stderr)
        return 2
    try:
        tls = tls_flags.from_args(args)
    except TLSConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    torch.set_num_threads(config.runtime.numThreads)
    torch.set_num_interop_threads(1)
    # Every batch sends a dense gradient of 1-2 MB and every sync receives the parameters:
    # glibc's defaults fault each such buffer in afresh (streamtrain_ps.plumbing.heap).
    reuse_large_buffers()
    ps = RemotePS(config.ps.endpoints, config.ps.config, retry=retry_policy(config), tls=tls)
    registry = CollectorRegistry()
    servicer = WorkerServicer(
        config,
        ps,
        worker_index=args.worker_index,
        monitoring=WorkerMetrics(registry),
        # The parse and dedup kernels load from numba's cache once the trainer is built
        # (the scheduler's first call; then the genesis checkpoint keeps the PS busy), not
        # in the first pass's first batch.
        after_build=lambda: start_warm_up(config.data),
    )
    server = WorkerServer(
        servicer,
        host=args.host,
        port=args.port,
        tls=tls,
        peers=tls_flags.policy_from_args(args, CONTROL_METHODS),
        health_port=args.health_port,
    )
    if not started(server):
        return 1
    http = serve_metrics(args.metrics_port, args.host, registry)
    # Signals are handled before the address is announced: a launcher may stop the worker
    # the moment it learns the address, and that SIGTERM must drain, not kill.
    with stop_on_signals(args.grace) as stop:
        announce(server.address)
        if http is not None:  # second line, after the one launchers wait for
            print(f"metrics on http://{args.host}:{http.server_port}/metrics", flush=True)
        try:
            stop.wait()
            server.close(args.grace)
        finally:
            ps.close()
            if http is not None:
                http.shutdown()
    return 0
