"""``python -m streamtrain_ps.demo`` (``make demo`` until the scheduler lands).

Starts two PS shard processes on free ports and walks through a pull / push / save / load
round trip over gRPC with ``RemotePS``, printing what happens: unknown keys pull as zeros,
keys are created on first push, embedx is admitted once a key's score reaches
``embedxThreshold``, a checkpoint is written and published, a fresh single shard loads it
(2 servers -> 1: files are per logical shard) and pulls bit-identical values. Both shards
are stopped with SIGTERM (graceful). Takes a few seconds.
"""

from __future__ import annotations

import argparse
import shutil
import sys
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from pathlib import Path

import numpy as np

from streamtrain_ps.api import SaveMode
from streamtrain_ps.config import PSConfig, SparseOptimizerConfig, TableConfig
from streamtrain_ps.launch import shard_process
from streamtrain_ps.remote import RemotePS

TABLE = "embedding"


def demo_config() -> PSConfig:
    return PSConfig(
        tables=(
            TableConfig(
                name=TABLE,
                embedxDim=4,
                embedxThreshold=2.0,  # score = 0.1 * nonclicks + 1.0 * clicks
                optimizer=SparseOptimizerConfig(learningRate=0.05, initialRange=0.01),
            ),
        ),
        logicalShards=8,
    )


@contextmanager
def shard(config: PSConfig, out: Path, index: int, count: int) -> Iterator[str]:
    """A shard process; prints its banner and how it stopped."""
    with shard_process(config, out, index=index, count=count) as child:
        print(f"  shard {index}/{count}: {child.banner}")
        yield child.address
    print(
        f"  shard {index}/{count}: SIGTERM -> stopped gracefully (exit {child.process.returncode})"
    )


def show(title: str, keys: np.ndarray, rows: np.ndarray) -> None:
    print(f"  {title}")
    print("      key   show  click  embed_w  embedx_w")
    for k, r in zip(keys.tolist(), rows, strict=True):
        embedx = " ".join(f"{v:+.4f}" for v in r[3:])
        print(f"    {k:5d}  {r[0]:5.1f}  {r[1]:5.1f}  {r[2]:+.4f}  [{embedx}]")


def run(out: Path) -> bool:
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    config = demo_config()
    dim = config.table(TABLE).embedxDim
    keys = np.array([11, 22, 33, 44], dtype=np.uint64)
    ckpt = (out / "checkpoint").resolve().as_uri()

    print("1. Two PS shards on free ports")
    with ExitStack() as stack:
        endpoints = [stack.enter_context(shard(config, out, i, 2)) for i in range(2)]
        ps = stack.enter_context(RemotePS(endpoints, config))
        ps.wait_ready()

        print("\n2. Pull before any push: unknown keys pull as zeros and are not created")
        show("pull", keys, ps.pull_sparse(TABLE, keys))
        print(f"  keys in the table: {ps.stats().tables[0].keys}")

        print("\n3. Push one impression per key (key 44 twice in the batch: merged client-side)")
        batch = np.array([11, 22, 33, 44, 44], dtype=np.uint64)
        grads = np.full((batch.size, 1 + dim), 0.5, np.float32)
        ps.push_sparse(
            TABLE, batch, grads, np.ones(5, np.float32), np.array([0, 1, 0, 1, 1], np.float32)
        )
        show(
            "pull: keys created; embedx still zero where score < 2.0",
            keys,
            ps.pull_sparse(TABLE, keys),
        )
        print(
            f"  keys: {ps.stats().tables[0].keys}, expanded: {ps.stats().tables[0].expanded_keys}"
        )

        print(
            "\n4. Two more clicks on key 22: its score reaches embedxThreshold -> embedx admitted"
        )
        ps.push_sparse(
            TABLE,
            np.array([22], np.uint64),
            np.full((1, 1 + dim), 0.5, np.float32),
            np.array([2], np.float32),
            np.array([2], np.float32),
        )
        before = ps.pull_sparse(TABLE, keys)
        show("pull", keys, before)
        print(f"  expanded keys: {ps.stats().tables[0].expanded_keys}")

        print("\n5. A dense vector (Adam): init, push a gradient, pull")
        ps.init_dense("dnn.w", np.linspace(-1, 1, 5, dtype=np.float32))
        ps.push_dense("dnn.w", np.ones(5, np.float32))
        dense = ps.pull_dense("dnn.w")
        print(f"  dnn.w = {np.array2string(dense, precision=4)}")

        print(f"\n6. Save a checkpoint (mode 0) to {ckpt}")
        result = ps.save(ckpt, SaveMode.CHECKPOINT)
        for f in result.files:
            print(f"  {f.path:56} {f.rows:3d} rows  {f.size:6d} B  sha256 {f.sha256[:12]}…")
        print(f"  {result.keys_saved} keys saved, then MANIFEST.json published")

    print("\n7. A fresh single shard (2 servers -> 1) loads the checkpoint")
    with ExitStack() as stack:
        endpoint = stack.enter_context(shard(config, out, 0, 1))
        ps = stack.enter_context(RemotePS([endpoint], config))
        ps.wait_ready()
        print(f"  keys loaded: {ps.load(ckpt)}")
        after = ps.pull_sparse(TABLE, keys)
        show("pull after load", keys, after)
        same = bool(np.array_equal(before, after) and np.array_equal(dense, ps.pull_dense("dnn.w")))
        print(f"  bit-identical to before the save: {same}")
    print(f"\n{'OK' if same else 'MISMATCH'}: output in {out}")
    return same


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m streamtrain_ps.demo", description=__doc__)
    p.add_argument("--out", type=Path, default=Path("demo-run/ps-demo"), help="output folder")
    args = p.parse_args(argv)
    return 0 if run(args.out) else 1


if __name__ == "__main__":
    sys.exit(main())
