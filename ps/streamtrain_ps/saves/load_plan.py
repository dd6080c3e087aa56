"""A load's plan: a published save checked against this shard's config, read one
logical shard at a time (``LoadPlan.table_parts``) so a load can build its tables part by
part instead of holding every row of the save at once; ``load_payload`` reads everything
at once (the disk tier's load, which orders all keys by coldness first); ``LoadPlan.verify``
checks every part without keeping any (a load that discards the live tables first).

The files, the manifest and their verification are ``checkpoint``'s; this module only
decides which of them one shard reads and turns them into table content.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from streamtrain_ps.api import SaveMode
from streamtrain_ps.config import PSConfig
from streamtrain_ps.engine.accessor import RowLayout, rows_from_inference
from streamtrain_ps.engine.dense import DenseState
from streamtrain_ps.engine.slabs import Part
from streamtrain_ps.errors import CheckpointError
from streamtrain_ps.saves.checkpoint import Manifest, read_manifest, read_verified
from streamtrain_ps.sharding import owned_logical_shards, server_of_dense

#: One table's part of a load: keys, full rows, pending tombstones, and the exact float64
#: counters (show, click, delta_score) of hot keys at ``hot_rows`` of ``rows``.
TablePayload = Part


@dataclass(frozen=True)
class Payload:
    """What one shard loads, read and verified before anything is swapped in.

    ``tables`` maps each table to (keys, full rows, pending tombstones); ``dense`` is None
    when the save has no dense vectors (modes 1-3), i.e. the shard keeps its own.
    """

    tables: dict[str, TablePayload]
    dense: dict[str, DenseState] | None


@dataclass(frozen=True)
class LoadPlan:
    """A save checked against this shard's config, its parts not read yet: ``table_parts``
    reads (and verifies) one logical shard at a time, so a load can build its tables part
    by part instead of holding every row of the save at once."""

    manifest: Manifest
    config: PSConfig
    owned: tuple[int, ...]
    shard_index: int
    num_shards: int

    def table_keys(self, table: str) -> int:
        """Keys the owned parts of ``table`` hold (by the manifest)."""
        return sum(int(self.manifest.sparse_part(table, ls)["rows"]) for ls in self.owned)

    def table_parts(self, table: str) -> Iterator[TablePayload]:
        """The owned parts of ``table``, one at a time (``hot_rows`` index the part)."""
        m = self.manifest
        tc = next(t for t in self.config.tables if t.name == table)
        layout = RowLayout.of(tc)
        for logical in self.owned:
            what = f"{m.uri}: table {tc.name!r} part {logical}"
            header, arrays = read_verified(m, m.sparse_part(tc.name, logical))
            if header.get("table") != tc.name or header.get("logicalShard") != logical:
                raise CheckpointError(
                    f"{what}: header says {header.get('table')!r}/{header.get('logicalShard')}"
                )
            k = arrays["keys"]
            if m.mode == SaveMode.CHECKPOINT:
                if header.get("columns") != layout.columns():
                    raise CheckpointError(f"{what}: row columns differ from this table's layout")
                r = arrays["values"].reshape(k.size, layout.width)
            else:
                r = rows_from_inference(arrays["values"].reshape(k.size, layout.pull_dim), tc)
            if "hot_rows" in arrays:  # exact counters of hot keys (checkpoints only)
                hr = arrays["hot_rows"].astype(np.int64)
                hc = arrays["hot_counts"].reshape(-1, 3).astype(np.float64)
            else:
                hr, hc = np.empty(0, dtype=np.int64), np.empty((0, 3), dtype=np.float64)
            yield TablePayload(k, r, arrays["tombstones"], hr, hc)

    def table(self, table: str) -> TablePayload:
        """All owned parts of ``table`` concatenated."""
        width = RowLayout.of(next(t for t in self.config.tables if t.name == table)).width
        keys, rows, tombs, hot_rows, hot_counts = [], [], [], [], []
        offset = 0
        for p in self.table_parts(table):
            keys.append(p.keys)
            rows.append(p.rows)
            tombs.append(p.tombstones)
            hot_rows.append(p.hot_rows + offset)
            hot_counts.append(p.hot_counts)
            offset += p.keys.size
        return TablePayload(
            np.concatenate(keys) if keys else np.empty(0, dtype=np.uint64),
            np.concatenate(rows) if rows else np.empty((0, width), dtype=np.float32),
            np.concatenate(tombs) if tombs else np.empty(0, dtype=np.uint64),
            np.concatenate(hot_rows) if hot_rows else np.empty(0, dtype=np.int64),
            np.concatenate(hot_counts) if hot_counts else np.empty((0, 3), dtype=np.float64),
        )

    def verify(self) -> int:
        """Read, checksum and decode every part this shard would load, one at a time and
        keeping nothing (a load that discards the live tables first checks the save up
        front: a bad one is refused before anything is dropped). Returns the keys."""
        for tc in self.config.tables:
            for _ in self.table_parts(tc.name):
                pass
        self.dense()
        return sum(self.table_keys(tc.name) for tc in self.config.tables)

    def dense(self) -> dict[str, DenseState] | None:
        """The dense vectors this shard owns (mode 0), or None (modes 2/3)."""
        m = self.manifest
        if m.mode != SaveMode.CHECKPOINT:
            return None
        dense = {}
        for name, info in m.dense.items():
            if server_of_dense(name, self.num_shards) != self.shard_index:
                continue
            header, arrays = read_verified(m, m.files[info["path"]])
            dense[name] = DenseState(
                values=arrays["values"].astype(np.float32),
                m=arrays["m"].astype(np.float32),
                v=arrays["v"].astype(np.float32),
                step=int(header["step"]),
                version=int(header["version"]),
                summary_decay=_optional_float(header.get("summaryDecay")),
                sums=arrays["sums"].astype(np.float64) if "sums" in arrays else None,
            )
        return dense


def plan_load(uri: str, config: PSConfig, shard_index: int, num_shards: int) -> LoadPlan:
    """Check the save at ``uri`` against this shard's config (manifest only).

    Mode 0 restores the full state (optimizer slots, dense vectors, tombstones); modes 2/3
    warm-start from inference values with fresh optimizer state; a delta (mode 1) is not a
    complete model and is refused.
    """
    m = read_manifest(uri)
    if m.mode == SaveMode.DELTA:
        raise CheckpointError(f"{uri}: a delta is not a complete model; load a base or checkpoint")
    if m.logical_shards != config.logicalShards:
        raise CheckpointError(
            f"{uri}: saved with logicalShards={m.logical_shards}, this job uses "
            f"{config.logicalShards}; keys would be routed to the wrong servers"
        )
    for tc in config.tables:
        info = m.tables.get(tc.name)
        if info is None:
            raise CheckpointError(f"{uri}: has no table {tc.name!r} (has {sorted(m.tables)})")
        if int(info["embedxDim"]) != tc.embedxDim:
            raise CheckpointError(
                f"{uri}: table {tc.name!r} has embedxDim {info['embedxDim']}, config {tc.embedxDim}"
            )
        if m.mode == SaveMode.CHECKPOINT and info["optimizer"] != tc.optimizer.signature:
            raise CheckpointError(
                f"{uri}: table {tc.name!r} was trained with {info['optimizer']}, "
                f"config says {tc.optimizer.signature}; optimizer state would not fit"
            )
    owned = tuple(owned_logical_shards(shard_index, num_shards, config.logicalShards))
    return LoadPlan(m, config, owned, shard_index, num_shards)


def load_payload(uri: str, config: PSConfig, shard_index: int, num_shards: int) -> Payload:
    """Read the logical shards ``shard_index`` of ``num_shards`` owns from the save at ``uri``
    (``plan_load``), every table whole."""
    plan = plan_load(uri, config, shard_index, num_shards)
    return Payload({tc.name: plan.table(tc.name) for tc in config.tables}, plan.dense())


def _optional_float(value: Any) -> float | None:
    """Header fields added later are absent in older saves (read as None)."""
    return None if value is None else float(value)
