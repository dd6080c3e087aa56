"""The arrays behind one sparse table (compact rows) and building them whole for a load.

- ``slots`` + ``keys``: the hash index (``streamtrain_ps.index``).
- ``slab``: one primary row per key: the full row's columns from ``delta_score`` up to
  ``embedx_w`` plus the packed word (slot code, unseen_days or the embedx pointer:
  ``streamtrain_ps.packed``).
- ``xslab``: one row per *admitted* key: embedx weights, their optimizer state and the
  key's packed word.
- ``hot``: float64 (show, click, delta_score) of the few keys whose counters outgrew float32
  (a hot key's primary row holds show = -1 and the entry's index in CLICK's bits).
- ``slot_map`` + ``slot_ids``: the table's slot dictionary (slot id <-> 15-bit code).

All of them are swapped as one ``Arrays`` tuple when any grows, so a reader holding one
tuple sees arrays that belong together.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import numpy.typing as npt

from streamtrain_ps import index as ix
from streamtrain_ps import kernels as kn
from streamtrain_ps import packed as pk
from streamtrain_ps.accessor import P_CLICK, P_DELTA, P_SHOW, PRIMARY_FROM, SLOT, UNSEEN, RowLayout
from streamtrain_ps.kernels import EXPANDED, SLOTS_USED


class Arrays(NamedTuple):
    slots: npt.NDArray[np.int32]
    keys: npt.NDArray[np.uint64]
    slab: npt.NDArray[np.float32]  # primary rows, one per key (accessor: "compact rows")
    xslab: npt.NDArray[np.float32]  # embedx rows, one per admitted key
    hot: npt.NDArray[np.float64]  # exact (show, click, delta_score) of hot keys
    slot_map: npt.NDArray[np.int32]  # slot id -> code (``packed.slot_code``)
    slot_ids: npt.NDArray[np.uint32]  # code -> slot id

    @property
    def slab_u32(self) -> npt.NDArray[np.uint32]:
        return self.slab.view(np.uint32)

    @property
    def xslab_u32(self) -> npt.NDArray[np.uint32]:
        return self.xslab.view(np.uint32)


class HotCounters(NamedTuple):
    """Exact counters of hot keys: ``counts[i]`` = (show, click, delta_score) of the row
    at ``positions[i]`` of an accompanying array of full rows."""

    positions: npt.NDArray[np.int64]
    counts: npt.NDArray[np.float64]


class TableContent(NamedTuple):
    """A table's whole state, built by ``SparseTable.build`` for a load."""

    arrays: Arrays
    meta: npt.NDArray[np.int64]
    tombstones: npt.NDArray[np.uint64]


def build_content(
    layout: RowLayout,
    keys: npt.NDArray[np.uint64],
    rows: npt.NDArray[np.float32],
    tombstones: npt.NDArray[np.uint64],
    hot: HotCounters | None,
) -> TableContent:
    """A table's whole content from full rows (see ``SparseTable.build``).

    Raises ``ValueError`` for an unseen_days that is not a whole number >= 0 (values past
    ``packed.UNSEEN_MAX`` saturate there) or more distinct slot ids than a table holds."""
    lay = layout
    meta = ix.new_meta(kn.TABLE_META_SIZE)
    admitted = rows[:, lay.xflag] >= 0
    na = int(np.count_nonzero(admitted))
    a = empty_arrays(keys.size, na, lay)
    words = packed_words(rows, meta, a)
    out = np.empty(keys.size, dtype=np.int64)
    created = np.zeros(keys.size, dtype=np.bool_)
    ix.insert_many(a.slots, a.keys, meta, keys, out, created)
    if not created.all():
        raise ValueError(f"key {int(keys[np.argmin(created)])} is listed twice")
    # A fresh index hands out rows 0, 1, 2, ... in order; embedx rows likewise.
    xp = lay.xptr
    n = keys.size
    a.slab[:n, :-1] = rows[:, PRIMARY_FROM:xp]
    a.slab_u32[:n, -1] = words
    a.slab_u32[:n, -1][admitted] = pk.ADMITTED | np.arange(na, dtype=np.uint32)
    a.xslab[:na, :-1] = rows[admitted, xp:]
    a.xslab_u32[:na, -1] = words[admitted]
    meta[EXPANDED] = na
    meta[kn.X_NEXT] = na
    if hot is not None and hot.positions.size:
        nh = hot.positions.size
        if hot.positions.min() < 0 or hot.positions.max() >= keys.size:
            raise ValueError("exact counters name rows outside the part (hot_rows)")
        a = a._replace(hot=ix.grown_rows(a.hot, 0, nh))
        a.hot[:nh] = hot.counts
        a.slab[hot.positions, P_DELTA] = 0.0
        a.slab_u32[hot.positions, P_CLICK] = np.arange(nh, dtype=np.uint32)
        a.slab[hot.positions, P_SHOW] = -1.0
        meta[kn.HOT_NEXT] = nh
    return TableContent(a, meta, tombstones.copy())


def packed_words(
    rows: npt.NDArray[np.float32], meta: npt.NDArray[np.int64], a: Arrays
) -> npt.NDArray[np.uint32]:
    """The packed word (slot code, unseen_days) of each full row, coding its slot id in
    ``a``'s dictionary; raises ``ValueError`` as ``build_content`` documents."""
    unseen = rows[:, UNSEEN]
    bad = ~((unseen >= 0) & (unseen == np.floor(unseen)))
    if bad.any():
        at = int(np.argmax(bad))
        raise ValueError(f"row {at}: unseen_days {unseen[at]} is not a whole number >= 0")
    slots = np.ascontiguousarray(rows[:, SLOT]).view(np.uint32)
    codes = np.empty(slots.size, dtype=np.uint32)
    full = int(pk.slot_codes(a.slot_map, a.slot_ids, meta, SLOTS_USED, slots, codes))
    if full >= 0:
        raise ValueError(
            f"row {full}: slot id {int(slots[full])} is one more than the "
            f"{pk.SLOT_CODES} distinct slot ids a table holds"
        )
    days = np.minimum(unseen, pk.UNSEEN_MAX).astype(np.uint32)
    return np.asarray((codes << np.uint32(16)) | days, dtype=np.uint32)


def empty_arrays(capacity: int, x_capacity: int, lay: RowLayout) -> Arrays:
    rows = max(capacity, 1024)
    return Arrays(
        ix.full_aligned(ix.needed_capacity(capacity), ix.EMPTY, np.int32),
        ix.zeros_aligned((rows,), np.uint64),
        ix.zeros_aligned((rows, lay.primary_width), np.float32),
        ix.zeros_aligned((max(x_capacity, 1024), lay.x_width), np.float32),
        ix.zeros_aligned((1024, 3), np.float64),
        *pk.new_slot_dictionary(),
    )
