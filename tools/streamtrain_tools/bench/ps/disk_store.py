"""``python -m streamtrain_tools.bench.ps.disk_store --json``: choose the PS disk tier's store.

Batch put and batch get of ``--keys`` 64-bit keys with ``--value-bytes`` values (a PS full
row is ~100 B at embedxDim 8) in RocksDB (``rocksdict``) and LMDB (``lmdb``); disk bytes
per key after the writes (and a compaction / sync); and whether a size cap is enforced by
the store (a put past the cap fails cleanly and the store stays readable). The last line is
one JSON object; ``docs/decisions.md`` records the choice.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from typing import Any

import numpy as np

BATCH = 65_536


def _dir_bytes(path: str) -> int:
    total = 0
    for root, _, files in os.walk(path):
        for f in files:
            total += os.stat(os.path.join(root, f)).st_blocks * 512
    return total


def _data(n: int, value_bytes: int, seed: int) -> tuple[list[bytes], list[bytes], list[bytes]]:
    rng = np.random.default_rng(seed)
    keys = rng.integers(0, 2**63, size=n, dtype=np.uint64).astype(">u8")
    values = rng.standard_normal((n, value_bytes // 4)).astype(np.float32)
    kb = [k.tobytes() for k in keys]
    vb = [v.tobytes() for v in values]
    probe = [kb[i] for i in rng.integers(0, n, size=min(n, 200_000))]
    return kb, vb, probe


def _timed(fn: Callable[[], Any]) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def bench_lmdb(path: str, kb: list[bytes], vb: list[bytes], probe: list[bytes]) -> dict[str, Any]:
    import lmdb

    env = lmdb.open(path, map_size=1 << 34, subdir=True, sync=False, writemap=True)

    def put() -> None:
        for i in range(0, len(kb), BATCH):
            with env.begin(write=True) as txn:
                txn.cursor().putmulti(zip(kb[i : i + BATCH], vb[i : i + BATCH], strict=True))

    def get() -> None:
        with env.begin() as txn:
            cur = txn.cursor()
            got = cur.getmulti(probe)
            assert len(got) == len(probe)

    put_s = _timed(put)
    get_s = _timed(get)
    env.sync(True)
    disk = _dir_bytes(path)
    env.close()
    # Size cap: a small map_size is a hard limit (MapFullError), the store stays readable.
    capped = tempfile.mkdtemp(dir=os.path.dirname(path))
    env = lmdb.open(capped, map_size=4 << 20, subdir=True)
    written = 0
    try:
        for k, v in zip(kb, vb, strict=True):
            with env.begin(write=True) as txn:
                txn.put(k, v)
            written += 1
    except lmdb.MapFullError:
        pass
    with env.begin() as txn:
        readable = txn.stat()["entries"] == written
    data_bytes = os.stat(os.path.join(capped, "data.mdb")).st_size  # lock.mdb is not data
    enforced = written < len(kb) and readable and data_bytes <= 4 << 20
    env.close()
    return {
        "put_keys_per_s": len(kb) / put_s,
        "get_keys_per_s": len(probe) / get_s,
        "disk_bytes_per_key": disk / len(kb),
        "cap_enforced": enforced,
    }


def bench_rocksdb(
    path: str, kb: list[bytes], vb: list[bytes], probe: list[bytes]
) -> dict[str, Any]:
    from rocksdict import Options, Rdict, WriteBatch, WriteOptions

    opts = Options(raw_mode=True)
    db: Any = Rdict(path, opts)
    wo = WriteOptions()
    wo.disable_wal = True  # type: ignore[method-assign,assignment]  # a property

    def put() -> None:
        for i in range(0, len(kb), BATCH):
            wb = WriteBatch(raw_mode=True)
            for k, v in zip(kb[i : i + BATCH], vb[i : i + BATCH], strict=True):
                wb.put(k, v)
            db.write(wb, wo)

    def get() -> None:
        got = db[probe]
        assert len(got) == len(probe)

    put_s = _timed(put)
    db.flush()
    db.compact_range(None, None)
    get_s = _timed(get)
    disk = _dir_bytes(path)
    db.close()
    # RocksDB's own space limit (SstFileManager) is not exposed by rocksdict: a cap would
    # be our accounting of live bytes, and compaction needs temporary extra space.
    return {
        "put_keys_per_s": len(kb) / put_s,
        "get_keys_per_s": len(probe) / get_s,
        "disk_bytes_per_key": disk / len(kb),
        "cap_enforced": False,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--keys", type=int, default=1_000_000)
    p.add_argument("--value-bytes", type=int, default=100)
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    kb, vb, probe = _data(args.keys, args.value_bytes, 0)
    out: dict[str, Any] = {"keys": args.keys, "value_bytes": args.value_bytes}
    for name, fn in (("lmdb", bench_lmdb), ("rocksdb", bench_rocksdb)):
        d = tempfile.mkdtemp(prefix=f"store-{name}-")
        try:
            out[name] = fn(os.path.join(d, "db"), kb, vb, probe)
        finally:
            shutil.rmtree(d, ignore_errors=True)
        print(name, out[name])
    if args.json:
        print(json.dumps(out))


if __name__ == "__main__":
    main()
