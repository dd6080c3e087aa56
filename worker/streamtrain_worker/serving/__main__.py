"""``streamtrain serve | deliver | rollback | pin`` (``python -m streamtrain_worker.serving``).

- ``serve --export ROOT``: the embedded table, delivered in this process (one machine);
  ``serve --export ROOT --redis URL``: rows from Redis, delivered by ``deliver`` (or by
  this process with ``--deliver``).
- ``deliver --export ROOT --redis URL``: follow the donefile into Redis (``--once``: the
  pending lines, then exit).
- ``rollback --url http://HOST:PORT`` / ``pin --url ... VERSION`` (0 unpins): ask a server;
  with ``--redis URL`` instead, change the state in Redis (every server follows it).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import signal
import sys
import threading
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence

import redis
import torch

from streamtrain_worker.serving.delivery import Applied, Delivery
from streamtrain_worker.serving.scoring import Scorer
from streamtrain_worker.serving.server import Server, run_http
from streamtrain_worker.serving.tables import (
    CACHE_BYTES,
    EmbeddedTable,
    RedisTable,
    VersionedTable,
)
from streamtrain_worker.serving.versions import Guard, GuardError

log = logging.getLogger("streamtrain.serving")
Hook = Callable[[str, int], None]


def _no_hook(point: str, vid: int) -> None:
    pass


def _guard(args: argparse.Namespace) -> Guard:
    drop = None if args.max_auc_drop < 0 else args.max_auc_drop
    return Guard(max_auc_drop=drop, copc_min=args.copc_min, copc_max=args.copc_max)


def _guard_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--max-auc-drop",
        type=float,
        default=0.05,
        help="refuse a model whose pass AUC is this much below the live one's (-1: off)",
    )
    p.add_argument("--copc-min", type=float, help="refuse a model whose pass COPC is below")
    p.add_argument("--copc-max", type=float, help="refuse a model whose pass COPC is above")


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="streamtrain", description="online serving")
    sub = p.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="serve the newest verified model over HTTP and gRPC")
    serve.add_argument("--export", required=True, help="export root (fsspec URL)")
    serve.add_argument("--redis", help="Redis URL (default: the embedded in-process table)")
    serve.add_argument("--prefix", default="st:", help="Redis key prefix of this model")
    serve.add_argument("--deliver", action="store_true", help="with --redis: deliver too")
    serve.add_argument("--name", default="streamtrain", help="the model name in the API")
    serve.add_argument("--host", default="0.0.0.0")
    serve.add_argument("--http-port", type=int, default=8080)
    serve.add_argument("--grpc-port", type=int, default=8081, help="0: no gRPC")
    serve.add_argument("--poll-seconds", type=float, default=0.2)
    serve.add_argument(
        "--torch-threads",
        type=int,
        default=1,
        help="intra-op threads per request (1: small batches, many requests in parallel)",
    )
    serve.add_argument(
        "--bucket-cache-mb",
        type=int,
        default=CACHE_BYTES >> 20,
        help="with --redis: MB of immutable Redis buckets kept in process (0: none)",
    )
    _guard_args(serve)
    deliver = sub.add_parser("deliver", help="follow an export's donefile into Redis")
    deliver.add_argument("--export", required=True)
    deliver.add_argument("--redis", required=True)
    deliver.add_argument("--prefix", default="st:")
    deliver.add_argument("--once", action="store_true", help="apply what is pending, then exit")
    deliver.add_argument("--poll-seconds", type=float, default=0.2)
    _guard_args(deliver)
    for name in ("rollback", "pin"):
        cmd = sub.add_parser(name, help=f"{name} the served model")
        where = cmd.add_mutually_exclusive_group(required=True)
        where.add_argument("--url", help="a server's HTTP address, e.g. http://localhost:8080")
        where.add_argument("--redis", help="change the state in Redis directly")
        cmd.add_argument("--prefix", default="st:")
        cmd.add_argument("--name", default="streamtrain")
        if name == "pin":
            cmd.add_argument("version", type=int, help="version id (0: follow the live model)")
    return p


def cmd_serve(args: argparse.Namespace, hook: Hook) -> int:
    # Measured: batch-1 requests take ~50 ms with torch's default threads on a busy 2-core
    # machine, ~3 ms with one (docs/serving.md).
    torch.set_num_threads(max(1, args.torch_threads))
    # A request waits at most this long for the GIL held by the delivery or refresh thread
    # (Python's default: 5 ms, half the latency goal).
    sys.setswitchinterval(0.001)
    table: VersionedTable = EmbeddedTable()
    if args.redis:
        table = RedisTable.connect(args.redis, args.prefix, args.bucket_cache_mb << 20)
    guard = _guard(args)
    delivery = None
    if not args.redis or args.deliver:
        delivery = Delivery(args.export, table, guard, hook=hook)
    server = Server(args.name, Scorer(args.export, table), delivery, poll_seconds=args.poll_seconds)
    grpc_server = None
    if args.grpc_port:
        grpc_server, _ = server.grpc_server(f"{args.host}:{args.grpc_port}")
        grpc_server.start()
    server.start_background()

    async def main() -> None:
        runner = await run_http(server.app(), args.host, args.http_port)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        log.info("serving %s on :%d (gRPC :%d)", args.name, args.http_port, args.grpc_port)
        await stop.wait()
        await runner.cleanup()

    try:
        asyncio.run(main())
    finally:
        server.stop()
        if grpc_server is not None:
            grpc_server.stop(1)
    return 0


def cmd_deliver(args: argparse.Namespace, hook: Hook) -> int:
    table = RedisTable.connect(args.redis, args.prefix)
    delivery = Delivery(args.export, table, _guard(args), hook=hook)
    if args.once:
        for applied in delivery.step():
            print(json.dumps(_applied(applied)), flush=True)
        return 0
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    delivery.follow(stop, args.poll_seconds)
    return 0


def _applied(applied: Applied) -> dict[str, object]:
    return {
        "key": applied.line.key,
        "version": applied.version.id if applied.version else None,
        "accepted": bool(applied.version and applied.version.accepted),
        "refusal": applied.refusal.reason if applied.refusal else None,
        "seconds": round(applied.seconds, 4),
    }


def cmd_switch(args: argparse.Namespace) -> int:
    if args.redis:
        table = RedisTable.connect(args.redis, args.prefix)
        state = table.rollback() if args.command == "rollback" else table.pin(args.version)
        print(json.dumps({"served": state.served}))
        return 0
    path = "rollback" if args.command == "rollback" else "pin"
    body = b"{}" if path == "rollback" else json.dumps({"version": args.version}).encode()
    url = f"{args.url.rstrip('/')}/v2/models/{args.name}/{path}"
    req = urllib.request.Request(url, body, {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            print(resp.read().decode())
    except urllib.error.HTTPError as exc:
        print(f"error: {url}: {exc.code} {exc.read().decode()}", file=sys.stderr)
        return 1
    return 0


def main(argv: Sequence[str] | None = None, *, hook: Hook = _no_hook) -> int:
    """The command line; ``hook`` is the delivery's (``delivery.POINTS``: tests kill there)."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    args = _parser().parse_args(argv)
    try:
        if args.command == "serve":
            return cmd_serve(args, hook)
        if args.command == "deliver":
            return cmd_deliver(args, hook)
        return cmd_switch(args)
    except (GuardError, LookupError, OSError, redis.RedisError) as exc:
        print(f"error: {' '.join(str(exc).split())}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
