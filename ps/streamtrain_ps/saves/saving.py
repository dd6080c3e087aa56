"""Writing a shard's save: one part file per owned logical shard and table, plus dense
vectors, and the side effects the save implies (``staging.TableEffects``).

Split out of ``shard.py``, which orchestrates (locks, staging, errors); this module only
turns table contents into part files.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from streamtrain_ps import api, sharding
from streamtrain_ps.engine.accessor import DELTA
from streamtrain_ps.engine.dense import DenseState
from streamtrain_ps.saves import checkpoint, partfile
from streamtrain_ps.saves.staging import TableEffects
from streamtrain_ps.tier.tiering import TieredTable


def write_tables(
    writer: checkpoint.PartSink,
    tables: list[TieredTable],
    mode: api.SaveMode,
    logical_shards: int,
    owned: Sequence[int],
) -> tuple[list[api.SavedFile], list[TableEffects], int, int]:
    """Write one part per owned logical shard and table; return the files, the side effects
    the save implies (applied now or staged by the caller), keys saved and tombstones.

    The caller holds every table's maintenance lock; each part's rows are copied under the
    table's writer lock (a consistent copy per logical shard, see ps-engine.md)."""
    L = logical_shards
    files: list[api.SavedFile] = []
    effects: list[TableEffects] = []
    saved = tomb_total = 0
    with_effects = mode != api.SaveMode.CHECKPOINT
    for t in tables:
        rows, offsets = t.saves.rows_by_logical_shard(L, mode)
        with_tombs = mode in (api.SaveMode.CHECKPOINT, api.SaveMode.DELTA)
        pending, mark = t.saves.tombstones_marked()
        if not with_tombs:
            pending = np.empty(0, dtype=np.uint64)
        pending_ls = sharding.logical_shard(pending, L)
        clears = mode in (api.SaveMode.DELTA, api.SaveMode.BASE)
        parts: list[tuple[npt.NDArray[np.uint64], npt.NDArray[np.int64], npt.NDArray[Any]]]
        parts = []
        lay = t.layout
        for logical in owned:
            part_rows = rows[offsets[logical] : offsets[logical + 1]]
            # Both tiers: the RAM rows and the disk rows of this logical shard.
            part_rows, keys, full, hot = t.saves.snapshot_part(part_rows, mode, logical)
            delta = full[:, DELTA].astype(np.float64)
            delta[hot.positions] = hot.counts[:, 2]  # exact for keys past float32's range
            tomb = pending[pending_ls == logical]
            if mode == api.SaveMode.DELTA and tomb.size:  # usually none: skip the sort
                tomb = np.setdiff1d(tomb, keys)
            values = full if mode == api.SaveMode.CHECKPOINT else full[:, lay.inference_columns()]
            header = {
                "kind": "sparse",
                "table": t.name,
                "logicalShard": logical,
                "logicalShards": L,
                "mode": int(mode),
                "embedxDim": lay.embedx_dim,
                "optimizer": t.config.optimizer.signature,
                "columns": lay.columns()
                if mode == api.SaveMode.CHECKPOINT
                else ["show", "click", "embed_w"] + [f"embedx_w{j}" for j in range(lay.embedx_dim)],
            }
            arrays = {"keys": keys, "values": values, "tombstones": tomb}
            if mode == api.SaveMode.CHECKPOINT and hot.positions.size:
                # Exact counters of hot keys (float64; the rows hold them rounded). Only
                # present when there are any, so other parts are unchanged.
                arrays["hot_rows"] = hot.positions
                arrays["hot_counts"] = hot.counts
            data = partfile.encode_part(header, arrays)
            path = partfile.sparse_path(writer.data_dir, t.name, logical)
            files.append(writer.write(path, data, rows=int(keys.size)))
            if with_effects:
                parts.append((keys, part_rows, delta))
            saved += int(keys.size)
            tomb_total += int(tomb.size)
        if with_effects:
            effects.append(_table_effects(t, parts, mode, mark if clears else -1))
    return files, effects, saved, tomb_total


def write_dense(
    writer: checkpoint.PartSink, vectors: Mapping[str, DenseState]
) -> list[api.SavedFile]:
    """One part per dense vector with its Adam state (mode 0 saves of every table)."""
    files = []
    for name, st in vectors.items():
        header = {
            "kind": "dense",
            "name": name,
            "mode": 0,
            "step": st.step,
            "version": st.version,
            "summaryDecay": st.summary_decay,
        }
        arrays: dict[str, npt.NDArray[Any]] = {"values": st.values, "m": st.m, "v": st.v}
        if st.sums is not None:
            arrays["sums"] = st.sums
        data = partfile.encode_part(header, arrays)
        files.append(
            writer.write(partfile.dense_path(writer.data_dir, name), data, rows=st.values.size)
        )
    return files


def _table_effects(
    t: TieredTable,
    parts: list[tuple[npt.NDArray[np.uint64], npt.NDArray[np.int64], npt.NDArray[Any]]],
    mode: api.SaveMode,
    tombstone_mark: int,
) -> TableEffects:
    def cat(i: int, dtype: type[np.generic]) -> npt.NDArray[Any]:
        return np.concatenate([p[i] for p in parts]) if parts else np.empty(0, dtype=dtype)

    return TableEffects(
        table=t,
        keys=cat(0, np.uint64),
        rows=cat(1, np.int64),
        saved_delta=cat(2, np.float64),
        unseen_inc=mode == api.SaveMode.BATCH,
        tombstone_mark=tombstone_mark,
        moves=t.moves,
    )
