"""Save snapshots of a sparse table: live rows grouped by logical shard, full rows copied
out of the compact slabs, and the side effects of a committed save.

Like ``kernels``, these do no locking; ``SparseTable`` holds the writer lock around them.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
from numba import njit

from streamtrain_ps.engine import index as ix
from streamtrain_ps.engine import packed as pk
from streamtrain_ps.engine.accessor import (
    CLICK,
    DELTA,
    P_CLICK,
    P_DELTA,
    P_SHOW,
    PRIMARY_FROM,
    SHOW,
    SLOT,
    UNSEEN,
)
from streamtrain_ps.engine.index import Int


@njit(nogil=True, cache=True)
def group_rows(
    arr_slots: npt.NDArray[np.int32],
    arr_keys: npt.NDArray[np.uint64],
    logical_shards: Int,
    rows_out: npt.NDArray[np.int64],
    offsets: npt.NDArray[np.int64],
) -> None:
    """Counting sort of live rows (in slot order) by logical shard: rows of shard s are
    ``rows_out[offsets[s]:offsets[s + 1]]``. Two passes over the index, recomputing each
    key's shard, so the only memory per key is ``rows_out`` (a save's peak)."""
    ls = np.uint64(logical_shards)
    for s in range(arr_slots.size):
        r = arr_slots[s]
        if r >= 0:
            offsets[np.int64(ix.mix64(arr_keys[r]) % ls) + 1] += 1
    for s in range(logical_shards):
        offsets[s + 1] += offsets[s]
    fill = offsets[:-1].copy()
    for s in range(arr_slots.size):
        r = arr_slots[s]
        if r >= 0:
            shard = np.int64(ix.mix64(arr_keys[r]) % ls)
            rows_out[fill[shard]] = r
            fill[shard] += 1


@njit(nogil=True, cache=True)
def gather(
    arr_keys: npt.NDArray[np.uint64],
    slab: npt.NDArray[np.float32],
    slab_u32: npt.NDArray[np.uint32],
    xslab: npt.NDArray[np.float32],
    hot: npt.NDArray[np.float64],
    slot_ids: npt.NDArray[np.uint32],
    rows: npt.NDArray[np.int64],
    keys_out: npt.NDArray[np.uint64],
    rows_out: npt.NDArray[np.float32],
    hot_pos: npt.NDArray[np.int64],
    hot_out: npt.NDArray[np.float64],
    xptr: Int,
    xflag: Int,
) -> Int:
    """Keys and *full* rows (the logical layout) of ``rows``: slot id and unseen_days from
    the packed word, the primary columns, then the embedx row, or zeros with the "not
    admitted" flag (-1 at ``xflag``). Hot keys' counters go into the full row rounded to
    float32 and exactly into ``hot_out`` (show, click, delta_score) at the positions listed
    in ``hot_pos``; returns how many."""
    width = rows_out.shape[1]
    xslab_u32 = xslab.view(np.uint32)
    out_u32 = rows_out.view(np.uint32)
    nh = 0
    for t in range(rows.size):
        r = rows[t]
        keys_out[t] = arr_keys[r]
        p = pk.word_of(slab_u32, xslab_u32, r)
        out_u32[t, SLOT] = slot_ids[pk.code_of(p)]
        rows_out[t, UNSEEN] = pk.unseen_of(p)
        for j in range(PRIMARY_FROM, xptr):
            rows_out[t, j] = slab[r, j - PRIMARY_FROM]
        if slab[r, P_SHOW] < 0.0:
            h = slab_u32[r, P_CLICK]
            for j in range(3):
                hot_out[nh, j] = hot[h, j]
            rows_out[t, SHOW] = hot[h, 0]
            rows_out[t, CLICK] = hot[h, 1]
            rows_out[t, DELTA] = hot[h, 2]
            hot_pos[nh] = t
            nh += 1
        xr = pk.xrow_of(slab_u32, r)
        if xr >= 0:
            for j in range(xptr, width):
                rows_out[t, j] = xslab[xr, j - xptr]
        else:
            for j in range(xptr, width):
                rows_out[t, j] = 0.0
            rows_out[t, xflag] = -1.0
    return nh


@njit(nogil=True, cache=True)
def after_save(
    slab: npt.NDArray[np.float32],
    slab_u32: npt.NDArray[np.uint32],
    xslab_u32: npt.NDArray[np.uint32],
    hot: npt.NDArray[np.float64],
    rows: npt.NDArray[np.int64],
    saved_delta: npt.NDArray[np.floating],
    unseen_inc: bool,
) -> None:
    """Side effects of a successful save: delta_score -= what was saved (so pushes that
    arrived meanwhile still count towards the next delta), or unseen_days += 1. A hot
    key's exact delta is in its side-table entry (``saved_delta`` is float64 then)."""
    for t in range(rows.size):
        r = rows[t]
        if unseen_inc:  # saturates at packed.UNSEEN_MAX
            p = pk.word_of(slab_u32, xslab_u32, r)
            unseen = np.int64(pk.unseen_of(p)) + 1
            pk.set_word(slab_u32, xslab_u32, r, pk.pack(pk.code_of(p), unseen))
        elif slab[r, P_SHOW] < 0.0:
            hot[slab_u32[r, P_CLICK], 2] -= np.float64(saved_delta[t])
        else:
            slab[r, P_DELTA] -= np.float32(saved_delta[t])


@njit(nogil=True, cache=True, inline="always")
def _passes(
    slab: npt.NDArray[np.float32],
    slab_u32: npt.NDArray[np.uint32],
    xslab_u32: npt.NDArray[np.uint32],
    hot: npt.NDArray[np.float64],
    r: Int,
    sp: npt.NDArray[np.float64],
    with_delta: bool,
) -> bool:
    """``accessor.save_filter`` for primary row ``r``; hot keys use their exact counters.
    ``sp`` = (nonclkCoeff, clickCoeff, baseThreshold, deltaKeepDays, deltaThreshold).
    unseen_days is tested last: an admitted key's lives in its embedx row (a random read)."""
    if slab[r, P_SHOW] < 0.0:
        h = slab_u32[r, P_CLICK]
        show = hot[h, 0]
        click = hot[h, 1]
        delta = hot[h, 2]
    else:
        show = np.float64(slab[r, P_SHOW])
        click = np.float64(slab[r, P_CLICK])
        delta = np.float64(slab[r, P_DELTA])
    if not (show - click) * sp[0] + click * sp[1] >= sp[2]:
        return False
    if with_delta and not delta >= sp[4]:
        return False
    return pk.unseen_of(pk.word_of(slab_u32, xslab_u32, r)) <= sp[3]


@njit(nogil=True, cache=True)
def save_keep(
    slab: npt.NDArray[np.float32],
    slab_u32: npt.NDArray[np.uint32],
    xslab_u32: npt.NDArray[np.uint32],
    hot: npt.NDArray[np.float64],
    rows: npt.NDArray[np.int64],
    sp: npt.NDArray[np.float64],
    with_delta: bool,
    keep: npt.NDArray[np.bool_],
) -> Int:
    """The save filter (``_passes``) of each of ``rows``, tested just before the copy."""
    n = 0
    for t in range(rows.size):
        keep[t] = _passes(slab, slab_u32, xslab_u32, hot, rows[t], sp, with_delta)
        n += keep[t]
    return n


@njit(nogil=True, cache=True)
def select_rows(
    arr_slots: npt.NDArray[np.int32],
    arr_keys: npt.NDArray[np.uint64],
    slab: npt.NDArray[np.float32],
    slab_u32: npt.NDArray[np.uint32],
    xslab_u32: npt.NDArray[np.uint32],
    hot: npt.NDArray[np.float64],
    high: Int,
    sp: npt.NDArray[np.float64],
    with_delta: bool,
    out: npt.NDArray[np.int64],
) -> Int:
    """Live rows that pass the save filter, by one *sequential* pass over the primary slab
    (rows ``0..high``) — a delta of a large table writes few rows, and visiting every key
    in index order is a random access per key. A passing row counts only if the index maps
    its key to it (free rows hold a free-list link in ``keys``). Returns how many."""
    n = 0
    for r in range(high):
        live = _passes(slab, slab_u32, xslab_u32, hot, r, sp, with_delta)
        if live and ix.find(arr_slots, arr_keys, arr_keys[r]) == r:
            out[n] = r
            n += 1
    return n
