"""The PS shard process (``python -m streamtrain_ps``): one shard until SIGTERM.

Prints ``listening on HOST:PORT`` (flushed, ``streamtrain_ps.plumbing.startup``) once the server
accepts RPCs, so a launcher that passes ``--port 0`` reads the bound port from the first
line of output. In a StatefulSet the shard index comes from the pod's hostname
(``<name>-<ordinal>``) with ``--shard-index-from-hostname``.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import re
import socket
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from prometheus_client import CollectorRegistry

import streamtrain_ps
from streamtrain_ps.config import ConfigError, PSConfig
from streamtrain_ps.plumbing import tls as tls_flags
from streamtrain_ps.plumbing.grpc_serving import serve_metrics, started, stop_on_signals
from streamtrain_ps.plumbing.heap import reuse_large_buffers
from streamtrain_ps.plumbing.launch import Launched, launch, python_argv
from streamtrain_ps.plumbing.startup import announce
from streamtrain_ps.plumbing.tls import TLSConfigError
from streamtrain_ps.service.server import DEFAULT_WORKERS, PSServer, serve_until
from streamtrain_ps.service.servicer import CONTROL_METHODS
from streamtrain_ps.shard import Shard
from streamtrain_ps.tier.memory_limit import MemoryLimitError
from streamtrain_ps.tier.warmup import start_warm_up

log = logging.getLogger("streamtrain_ps")


def shard_index_from_hostname(hostname: str) -> int:
    """The StatefulSet ordinal: the trailing ``-<digits>`` of the pod's hostname."""
    match = re.search(r"-(\d+)$", hostname.split(".", 1)[0])
    if match is None:
        raise ValueError(f"hostname {hostname!r} does not end in -<ordinal> (StatefulSet pod name)")
    return int(match.group(1))


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m streamtrain_ps", description=__doc__)
    p.add_argument("--port", type=int, required=True, help="gRPC port; 0 picks a free one")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (0.0.0.0 in a pod)")
    p.add_argument("--config", type=Path, help="PS config JSON (default: built-in defaults)")
    p.add_argument("--shard-index", type=int, default=0)
    p.add_argument("--shard-index-from-hostname", action="store_true")
    p.add_argument("--num-shards", type=int, default=1)
    p.add_argument("--metrics-port", type=int, help="serve Prometheus metrics on this port")
    p.add_argument("--workers", type=int, default=DEFAULT_WORKERS, help="RPC thread pool size")
    p.add_argument("--grace", type=float, default=10.0, help="seconds to drain RPCs on SIGTERM")
    p.add_argument("--log-level", default="INFO")
    tls_flags.add_arguments(p)
    p.add_argument(
        "--memory-limit",
        type=int,
        help="bytes of RAM the shard process may hold (overrides the config's memoryLimit; "
        "0: unlimited)",
    )
    p.add_argument("--disk-path", help="directory of the disk tier (overrides diskPath)")
    args = p.parse_args(argv)
    if args.shard_index_from_hostname:
        try:
            args.shard_index = shard_index_from_hostname(socket.gethostname())
        except ValueError as exc:
            p.error(str(exc))
    if args.num_shards < 1:
        p.error(f"--num-shards must be >= 1, got {args.num_shards}")
    if not 0 <= args.shard_index < args.num_shards:
        p.error(f"--shard-index {args.shard_index} not in [0, {args.num_shards})")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    try:
        config = PSConfig.from_json(args.config.read_text()) if args.config else PSConfig()
    except (OSError, ConfigError) as exc:
        print(f"error: --config {args.config}: {exc}", file=sys.stderr)
        return 2
    if args.memory_limit is not None:
        if args.memory_limit < 0:
            print(f"error: --memory-limit must be >= 0, got {args.memory_limit}", file=sys.stderr)
            return 2
        config = dataclasses.replace(config, memoryLimit=args.memory_limit)
    if args.disk_path:
        config = dataclasses.replace(config, diskPath=args.disk_path)
    if not config.memoryLimit:
        # Every batch brings a dense gradient of 1-2 MB and every dense sync takes the
        # parameters: kept for reuse, their buffers are not faulted in afresh each time
        # (streamtrain_ps.plumbing.heap). A capped shard gives freed memory back instead: its limit
        # is on its resident memory.
        reuse_large_buffers()
    try:
        tls = tls_flags.from_args(args)
    except TLSConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    try:
        shard = Shard(config, shard_index=args.shard_index, num_shards=args.num_shards)
    except MemoryLimitError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    registry = CollectorRegistry()
    server = PSServer(
        shard,
        config,
        host=args.host,
        port=args.port,
        # a capped shard: no more RPC threads than its scratch reserve counts messages for
        max_workers=min(args.workers, shard.memory_budget.rpc_threads or args.workers),
        registry=registry,
        shard_index=args.shard_index,
        tls=tls,
        peers=tls_flags.policy_from_args(args, CONTROL_METHODS),
        health_port=args.health_port,
    )
    # Signals are handled before the address is announced: a launcher may stop the shard
    # the moment it learns the address, and that SIGTERM must drain, not kill.
    with stop_on_signals(args.grace) as stop:
        if not started(server):
            return 1
        http = serve_metrics(args.metrics_port, args.host, registry)
        if http is not None:
            log.info("metrics on http://%s:%d/metrics", args.host, http.server_port)
        announce(server.address, f"shard {args.shard_index} of {args.num_shards}")
        start_warm_up(config)
        try:
            serve_until(server, stop, args.grace)
        finally:
            if http is not None:
                http.shutdown()
            shard.close()
    return 0


@contextmanager
def shard_process(
    config: PSConfig,
    workdir: Path,
    *,
    index: int = 0,
    count: int = 1,
    workers: int | None = None,
    log_level: str = "WARNING",
    start_timeout: float = 120.0,
    metrics_port: int | None = None,
) -> Iterator[Launched]:
    """PS shard ``index`` of ``count`` with ``config`` (written under ``workdir``, with its
    log) on a free port, for the benchmarks; stopped gracefully when the context exits.
    ``metrics_port``: serve its Prometheus metrics there (the tier's move counters)."""
    config_path = workdir / f"ps-{index}-of-{count}.json"
    config_path.write_text(config.to_json())
    env = dict(os.environ)
    # The child must import this very package even when it is not installed.
    source_root = str(Path(streamtrain_ps.__file__).resolve().parents[1])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (source_root, env.get("PYTHONPATH")) if p)
    args = [
        *("-m", "streamtrain_ps", "--port", "0", "--config", str(config_path)),
        *("--shard-index", str(index), "--num-shards", str(count), "--log-level", log_level),
    ]
    if workers is not None:
        args += ["--workers", str(workers)]
    if metrics_port is not None:
        args += ["--metrics-port", str(metrics_port)]
    child = launch(
        f"ps-{index}",
        python_argv(args, die_with_parent=True),
        workdir / f"ps-{index}-of-{count}.log",
        announce=True,
        env=env,
    )
    try:
        child.wait_listening(start_timeout)
        yield child
    finally:
        child.stop(grace=60.0)
