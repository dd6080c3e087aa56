"""``python -m streamtrain_tools.bench.ps.tls_cost --json`` (``make bench-tls``): what mutual TLS
costs a worker's pull and push, against the same shard build with it off.

Two ``python -m streamtrain_ps`` children on 127.0.0.1: one plaintext, one serving mutual TLS
with authorisation (``--tls-*`` flags, certificates from a throwaway CA made with
``trustme``, as the chart's cert-manager issuer would). One ``RemotePS`` each (the TLS one
with the job's certificate) runs a worker's step — pull ``--batch`` Zipf-drawn keys, push
their gradients — ``--steps`` times per round; rounds alternate plain and TLS so machine
noise hits both. Reported: steps/s per mode (median over rounds) and the ratio TLS/plain;
the LAST line is one JSON object. ``make bench-e2e`` runs local mode, which keeps plaintext
on loopback, so the cost is measured here, on the data path itself.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from collections.abc import Sequence
from contextlib import ExitStack
from pathlib import Path

import numpy as np

from streamtrain_ps.api import SparsePush
from streamtrain_ps.client.remote import RemotePS
from streamtrain_ps.config import PSConfig, SparseOptimizerConfig, TableConfig
from streamtrain_ps.plumbing.launch import launch, python_argv, stop_all
from streamtrain_ps.plumbing.tls import TLSFiles

TABLE = "embedding"
JOB = "bench.default.job.streamtrain.io"
OPERATOR = "streamtrain-operator"


def _pki(root: Path) -> tuple[TLSFiles, TLSFiles]:
    """(server, job client) certificates of a fresh CA."""
    import trustme  # dev dependency: only this benchmark makes certificates

    ca = trustme.CA()
    ca.cert_pem.write_to_path(str(root / "ca.pem"))
    out = []
    for name, ids in (("server", ("127.0.0.1", JOB)), ("job", (JOB,))):
        leaf = ca.issue_cert(*ids)
        leaf.private_key_pem.write_to_path(str(root / f"{name}.key"))
        (root / f"{name}.pem").write_bytes(b"".join(b.bytes() for b in leaf.cert_chain_pems))
        out.append(TLSFiles(root / f"{name}.pem", root / f"{name}.key", root / "ca.pem"))
    return out[0], out[1]


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m streamtrain_tools.bench.ps.tls_cost")
    p.add_argument("--batch", type=int, default=4096, help="keys per pull and push")
    p.add_argument("--steps", type=int, default=200, help="steps per round and mode")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    config = PSConfig(
        tables=(
            TableConfig(
                name=TABLE, embedxDim=8, embedxThreshold=0.0, optimizer=SparseOptimizerConfig()
            ),
        ),
        logicalShards=8,
    )
    with tempfile.TemporaryDirectory(prefix="bench-tls-") as tmp, ExitStack() as stack:
        root = Path(tmp)
        server, job = _pki(root)
        (root / "ps.json").write_text(config.to_json())
        base = ["-m", "streamtrain_ps", "--port", "0", "--config", str(root / "ps.json")]
        base += ["--log-level", "WARNING"]
        tls = [
            *("--tls-cert", str(server.cert), "--tls-key", str(server.key)),
            *("--tls-ca", str(server.ca), "--tls-control-peer", OPERATOR),
            *("--tls-data-peer", JOB),
        ]
        env = dict(os.environ)
        children = {
            mode: launch(
                f"ps-{mode}",
                python_argv(base + extra, die_with_parent=True),
                root / f"{mode}.log",
                announce=True,
                env=env,
            )
            for mode, extra in (("plain", []), ("tls", tls))
        }
        stack.callback(stop_all, children.values(), 30.0)
        clients = {
            "plain": RemotePS([children["plain"].wait_listening(120)], config),
            "tls": RemotePS([children["tls"].wait_listening(120)], config, tls=job),
        }
        for c in clients.values():
            stack.callback(c.close)
        rng = np.random.default_rng(0)
        ranks = np.arange(1, 1_000_001, dtype=np.float64)
        probs = (1 / ranks) / (1 / ranks).sum()
        batches = [
            rng.choice(1_000_000, size=args.batch, p=probs).astype(np.uint64) + 1 for _ in range(16)
        ]
        grads = np.full((args.batch, 9), 0.01, np.float32)
        shows = np.ones(args.batch, np.float32)
        clicks = np.zeros(args.batch, np.float32)

        def run(client: RemotePS, steps: int) -> float:
            start = time.perf_counter()
            for i in range(steps):
                keys = batches[i % len(batches)]
                client.pull_sparse(TABLE, keys)
                client.push_sparse(TABLE, SparsePush(keys, grads, shows, clicks))
            return steps / (time.perf_counter() - start)

        for c in clients.values():  # warm: kernels compiled, table grown, channels up
            run(c, 20)
        rates: dict[str, list[float]] = {"plain": [], "tls": []}
        for r in range(args.rounds):
            order = ("plain", "tls") if r % 2 == 0 else ("tls", "plain")
            for mode in order:
                rates[mode].append(run(clients[mode], args.steps))
    result = {
        "batch": args.batch,
        "steps": args.steps,
        "rounds": args.rounds,
        "plain_steps_per_s": round(statistics.median(rates["plain"]), 1),
        "tls_steps_per_s": round(statistics.median(rates["tls"]), 1),
    }
    result["tls_over_plain"] = round(result["tls_steps_per_s"] / result["plain_steps_per_s"], 3)
    print(
        f"pull+push of {args.batch} keys: plain {result['plain_steps_per_s']} steps/s, "
        f"mutual TLS {result['tls_steps_per_s']} steps/s (ratio {result['tls_over_plain']})"
    )
    if args.json:
        print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
