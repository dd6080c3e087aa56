"""The arrays behind one sparse table (compact rows) and building them whole for a load.

- ``slots`` + ``keys``: the hash index (``streamtrain_ps.engine.index``).
- ``slab``: one primary row per key: the full row's columns from ``delta_score`` up to
  ``embedx_w`` plus the packed word (slot code, unseen_days or the embedx pointer:
  ``streamtrain_ps.engine.packed``).
- ``xslab``: one row per *admitted* key: embedx weights, their optimizer state and the
  key's packed word.
- ``hot``: float64 (show, click, delta_score) of the few keys whose counters outgrew float32
  (a hot key's primary row holds show = -1 and the entry's index in CLICK's bits).
- ``slot_map`` + ``slot_ids``: the table's slot dictionary (slot id <-> 15-bit code).

All of them are swapped as one ``Arrays`` tuple when any grows, so a reader holding one
tuple sees arrays that belong together.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import NamedTuple

import numpy as np
import numpy.typing as npt

from streamtrain_ps.engine import index as ix
from streamtrain_ps.engine import kernels as kn
from streamtrain_ps.engine import packed as pk
from streamtrain_ps.engine.accessor import (
    P_CLICK,
    P_DELTA,
    P_SHOW,
    PRIMARY_FROM,
    SLOT,
    UNSEEN,
    RowLayout,
)
from streamtrain_ps.engine.address_space import reserved_zeros
from streamtrain_ps.engine.kernels import EXPANDED, SLOTS_USED


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


class Part(NamedTuple):
    """One piece of a load (``load_plan.TablePayload`` has this shape): keys, full rows,
    tombstones and the exact counters of hot keys at ``hot_rows`` of ``rows``."""

    keys: npt.NDArray[np.uint64]
    rows: npt.NDArray[np.float32]
    tombstones: npt.NDArray[np.uint64]
    hot_rows: npt.NDArray[np.int64]
    hot_counts: npt.NDArray[np.float64]


#: Rows ``require_finite_rows`` checks at a time (a load of 100M keys must not allocate a
#: flag per value at once).
FINITE_CHECK_ROWS = 65_536


def build_content(
    layout: RowLayout,
    keys: npt.NDArray[np.uint64],
    rows: npt.NDArray[np.float32],
    tombstones: npt.NDArray[np.uint64],
    hot: HotCounters | None,
) -> TableContent:
    """A table's whole content from full rows (see ``SparseTable.build``)."""
    hot = hot or HotCounters(np.empty(0, np.int64), np.empty((0, 3), np.float64))
    return build_from_parts(layout, keys.size, [Part(keys, rows, tombstones, *hot)])


def build_from_parts(layout: RowLayout, total: int, parts: Iterable[Part]) -> TableContent:
    """A table's whole content from ``total`` keys arriving in ``parts``, each copied into
    the new arrays and dropped before the next is read (a load never holds the full rows
    of a whole save). Both slabs are sized for ``total`` up front: pages never written
    stay unmapped, so the embedx slab costs only what admitted keys use (parts holding more
    keys than ``total`` make the arrays grow).

    Raises ``ValueError`` for a key listed twice, a row holding inf or NaN
    (``require_finite_rows``), an unseen_days that is not a whole number >= 0 (values past
    ``packed.UNSEEN_MAX`` saturate there) or more distinct slot ids than a table holds."""
    lay = layout
    meta = ix.new_meta(kn.TABLE_META_SIZE)
    a = empty_arrays(total, total, lay)
    xp = lay.xptr
    tombs = []
    for p in parts:
        n = p.keys.size
        base = int(meta[ix.NEXT_ROW])
        if base + n > a.keys.shape[0]:  # more keys than announced: grow (in place)
            a = _grown(a, meta, n)
        require_finite_rows(p.rows, p.hot_counts)
        words = packed_words(p.rows, meta, a)
        out = np.empty(n, dtype=np.int64)
        created = np.zeros(n, dtype=np.bool_)
        ix.insert_many(a.slots, a.keys, meta, p.keys, out, created)
        if not created.all():
            raise ValueError(f"key {int(p.keys[np.argmin(created)])} is listed twice")
        # A fresh index hands out rows base, base + 1, ... in order; embedx rows likewise.
        admitted = p.rows[:, lay.xflag] >= 0
        na = int(np.count_nonzero(admitted))
        xb = int(meta[kn.X_NEXT])
        a.slab[base : base + n, :-1] = p.rows[:, PRIMARY_FROM:xp]
        words_here = words.copy()
        words_here[admitted] = pk.ADMITTED | np.arange(xb, xb + na, dtype=np.uint32)
        a.slab_u32[base : base + n, -1] = words_here
        a.xslab[xb : xb + na, :-1] = p.rows[admitted, xp:]
        a.xslab_u32[xb : xb + na, -1] = words[admitted]
        meta[EXPANDED] += na
        meta[kn.X_NEXT] += na
        a = _place_hot(a, meta, base, n, p.hot_rows, p.hot_counts)
        tombs.append(p.tombstones)
    tombstones = np.concatenate(tombs) if tombs else np.empty(0, dtype=np.uint64)
    return TableContent(a, meta, tombstones)


def _grown(a: Arrays, meta: npt.NDArray[np.int64], n: int) -> Arrays:
    """``a`` with room for ``n`` more keys (and as many embedx rows)."""
    high, xhigh = int(meta[ix.NEXT_ROW]), int(meta[kn.X_NEXT])
    return a._replace(
        slots=ix.grown_slots(a.slots, a.keys, int(meta[ix.COUNT]) + n),
        keys=ix.grown_rows(a.keys, high, high + n),
        slab=ix.grown_rows(a.slab, high, high + n),
        xslab=ix.grown_rows(a.xslab, xhigh, xhigh + n),
    )


def _place_hot(
    a: Arrays,
    meta: npt.NDArray[np.int64],
    base: int,
    n: int,
    positions: npt.NDArray[np.int64],
    counts: npt.NDArray[np.float64],
) -> Arrays:
    """Give the hot keys at ``positions`` of a part placed at rows ``base:base + n`` their
    side-table entries."""
    nh = positions.size
    if not nh:
        return a
    if positions.min() < 0 or positions.max() >= n:
        raise ValueError("exact counters name rows outside the part (hot_rows)")
    h0 = int(meta[kn.HOT_NEXT])
    a = a._replace(hot=ix.grown_rows(a.hot, h0, h0 + nh))
    a.hot[h0 : h0 + nh] = counts
    rows = positions + base
    a.slab[rows, P_DELTA] = 0.0
    a.slab_u32[rows, P_CLICK] = np.arange(h0, h0 + nh, dtype=np.uint32)
    a.slab[rows, P_SHOW] = -1.0
    meta[kn.HOT_NEXT] = h0 + nh
    return a


def require_finite_rows(rows: npt.NDArray[np.float32], hot_counts: npt.NDArray[np.float64]) -> None:
    """``ValueError`` naming the first row (and column) of ``rows`` or the first exact
    counter that is inf or NaN: a table never holds one (``kernels.update_rows``), so a save
    that does was damaged, and loading it would train that key on NaN from then on. The
    slot column holds uint32 bits, not a number, and is not checked."""
    for lo in range(0, rows.shape[0], FINITE_CHECK_ROWS):  # bounded scratch per step
        bad = ~np.isfinite(rows[lo : lo + FINITE_CHECK_ROWS, SLOT + 1 :])
        if bad.any():
            first = np.unravel_index(int(np.argmax(bad)), bad.shape)
            at, col = int(first[0]) + lo, int(first[1]) + SLOT + 1
            raise ValueError(f"row {at}: column {col} is {rows[at, col]}, not a finite number")
    if hot_counts.size and not np.isfinite(hot_counts).all():
        raise ValueError("exact counters (hot_counts) hold inf or NaN")


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
        reserved_zeros(rows, (), np.uint64),
        reserved_zeros(rows, (lay.primary_width,), np.float32),
        reserved_zeros(max(x_capacity, 1024), (lay.x_width,), np.float32),
        ix.zeros_aligned((1024, 3), np.float64),
        *pk.new_slot_dictionary(),
    )
