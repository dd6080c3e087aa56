"""Kernels that move rows between a table's RAM slabs and full rows (the disk tier's unit).

- ``sample_scores`` and ``collect_cold``: a sample of the live rows' scores (exact
  counters for hot keys), then the rows at or below a score with their unseen_days, for
  choosing the coldest keys in the shrink rule's order with scratch in proportion to them.
  Both can leave out (or keep only) rows whose *touched* bit is set: a row pulled or
  promoted since the last demotion gets a second chance (``touched_bit``).
- ``sample_slot_scores`` and ``sweep_cold``: the same choice made by a clock hand that
  reads only a sample and the slots it passes, so a demotion's cost follows the keys it
  moves rather than the table (a sweep clears the touched bits it passes).
- ``mark_rows``: set or clear rows' touched bits.
- ``release_rows``: take keys out of RAM (index, embedx row, side-table entry) without
  counting them as evictions — they moved, they were not deleted.
- ``place_rows``: put full rows (with exact hot counters) of keys absent from RAM back into
  the slabs, exactly as they were gathered.
- ``release`` and ``place``: those two on a table's arrays (``slabs.Arrays``).

No locking here; ``tiering.TieredTable`` holds the right lock around each.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt
from numba import njit

from streamtrain_ps.engine import index as ix
from streamtrain_ps.engine import packed as pk
from streamtrain_ps.engine.accessor import (
    P_CLICK,
    P_DELTA,
    P_SHOW,
    PRIMARY_FROM,
    SLOT,
    UNSEEN,
    RowLayout,
    score,
)
from streamtrain_ps.engine.index import Int
from streamtrain_ps.engine.kernels import (
    EXPANDED,
    HOT_FREE_HEAD,
    HOT_FREE_LEN,
    HOT_NEXT,
    SLOTS_USED,
    X_FREE_HEAD,
    X_FREE_LEN,
    X_NEXT,
    free_embedx_row,
    free_hot_entry,
)
from streamtrain_ps.engine.slabs import Arrays, HotCounters


@njit(nogil=True, cache=True)
def _row_score(
    slab: npt.NDArray[np.float32],
    slab_u32: npt.NDArray[np.uint32],
    hot: npt.NDArray[np.float64],
    r: Int,
    ap: npt.NDArray[np.float64],
) -> float | np.floating[Any]:
    if slab[r, P_SHOW] < 0.0:
        h = slab_u32[r, P_CLICK]
        return score(hot[h, 0], hot[h, 1], ap)
    return score(np.float64(slab[r, P_SHOW]), np.float64(slab[r, P_CLICK]), ap)


#: ``want`` of ``sample_scores`` and ``collect_cold``: every row, untouched rows, touched rows.
ANY = -1
UNTOUCHED = 0
TOUCHED = 1


@njit(nogil=True, cache=True, inline="always")
def touched_bit(touched: npt.NDArray[np.uint8], r: Int) -> Int:
    """Row ``r``'s touched bit (0 beyond the bitmap)."""
    if (r >> 3) >= touched.size:
        return 0
    return (touched[r >> 3] >> (r & 7)) & 1


@njit(nogil=True, cache=True, inline="always")
def set_touched(touched: npt.NDArray[np.uint8], r: Int, on: Int) -> None:
    """Set (``on``) or clear row ``r``'s touched bit (nothing beyond the bitmap)."""
    if (r >> 3) < touched.size:
        if on:
            touched[r >> 3] |= np.uint8(1 << (r & 7))
        else:
            touched[r >> 3] &= np.uint8(~(1 << (r & 7)) & 0xFF)


@njit(nogil=True, cache=True)
def mark_rows(touched: npt.NDArray[np.uint8], rows: npt.NDArray[np.int64], on: bool) -> None:
    """Set (``on``) or clear the touched bits of ``rows`` (those inside the bitmap)."""
    for t in range(rows.size):
        set_touched(touched, rows[t], on)


@njit(nogil=True, cache=True)
def sample_scores(
    arr_slots: npt.NDArray[np.int32],
    slab: npt.NDArray[np.float32],
    slab_u32: npt.NDArray[np.uint32],
    hot: npt.NDArray[np.float64],
    stride: Int,
    ap: npt.NDArray[np.float64],
    touched: npt.NDArray[np.uint8],
    want: Int,
    out: npt.NDArray[np.float64],
) -> Int:
    """Scores of every ``stride``-th live row of the ``want`` kind (slot order: keys are
    hashed, so an unbiased sample) into ``out``; returns how many."""
    n = 0
    seen = 0
    for s in range(arr_slots.size):
        r = arr_slots[s]
        if r < 0 or (want >= 0 and touched_bit(touched, r) != want):
            continue
        if seen % stride == 0 and n < out.size:
            out[n] = _row_score(slab, slab_u32, hot, r, ap)
            n += 1
        seen += 1
    return n


@njit(nogil=True, cache=True)
def collect_cold(
    arr_slots: npt.NDArray[np.int32],
    slab: npt.NDArray[np.float32],
    slab_u32: npt.NDArray[np.uint32],
    xslab_u32: npt.NDArray[np.uint32],
    hot: npt.NDArray[np.float64],
    threshold: float,
    ap: npt.NDArray[np.float64],
    salt: Int,
    touched: npt.NDArray[np.uint8],
    want: Int,
    rows: npt.NDArray[np.int64],
    scores: npt.NDArray[np.float64],
    unseen: npt.NDArray[np.float32],
) -> Int:
    """Live rows of the ``want`` kind scoring at most ``threshold`` (those strictly below
    first, then ties, up to ``rows.size``) with their score and unseen_days; returns how
    many.

    Ties are taken *spread over the slot array*: each with the probability that fills
    ``rows`` (a hash of its slot and ``salt``), then the shortfall from a salted start.
    Taking them in slot order emptied one run of slots per demotion while new keys land
    everywhere, so the slots left alone longest filled up: linear-probing runs grew until
    a capped shard took ~8k new keys/s."""
    n = 0
    ties = 0
    size = arr_slots.size
    for s in range(size):
        r = arr_slots[s]
        if r < 0 or (want >= 0 and touched_bit(touched, r) != want):
            continue
        sc = _row_score(slab, slab_u32, hot, r, ap)
        if sc < threshold and n < rows.size:
            rows[n] = r
            scores[n] = sc
            unseen[n] = pk.unseen_of(pk.word_of(slab_u32, xslab_u32, r))
            n += 1
        elif sc == threshold:
            ties += 1
    if n >= rows.size or ties == 0:
        return n
    cut = np.uint64(min(1.0, (rows.size - n) / ties) * 4294967295.0)
    salt64 = np.uint64(salt)
    for second in range(2):
        for i in range(size):
            if n >= rows.size:
                return n
            s = (i + salt) % size
            r = arr_slots[s]
            if r < 0 or (want >= 0 and touched_bit(touched, r) != want):
                continue
            sc = _row_score(slab, slab_u32, hot, r, ap)
            if sc != threshold:
                continue
            picked = (ix.mix64(np.uint64(s) ^ salt64) >> np.uint64(32)) <= cut
            if picked != (second == 0):
                continue
            rows[n] = r
            scores[n] = sc
            unseen[n] = pk.unseen_of(pk.word_of(slab_u32, xslab_u32, r))
            n += 1
    return n


@njit(nogil=True, cache=True)
def sample_slot_scores(
    arr_slots: npt.NDArray[np.int32],
    slab: npt.NDArray[np.float32],
    slab_u32: npt.NDArray[np.uint32],
    hot: npt.NDArray[np.float64],
    start: Int,
    step: Int,
    ap: npt.NDArray[np.float64],
    out: npt.NDArray[np.float64],
) -> Int:
    """Scores of the live rows at slots ``start``, ``start + step``, ... (one lap, at most
    ``out.size`` probes; keys are hashed, so an unbiased sample that reads only the probed
    rows, not the table); returns how many."""
    size = arr_slots.size
    n = 0
    for i in range(min(out.size, (size + step - 1) // step)):
        r = arr_slots[(start + i * step) % size]
        if r >= 0:
            out[n] = _row_score(slab, slab_u32, hot, r, ap)
            n += 1
    return n


@njit(nogil=True, cache=True)
def sweep_cold(
    arr_slots: npt.NDArray[np.int32],
    slab: npt.NDArray[np.float32],
    slab_u32: npt.NDArray[np.uint32],
    xslab_u32: npt.NDArray[np.uint32],
    hot: npt.NDArray[np.float64],
    ap: npt.NDArray[np.float64],
    touched: npt.NDArray[np.uint8],
    hand: Int,
    threshold: float,
    tie_cut: np.uint64,
    salt: Int,
    rows: npt.NDArray[np.int64],
    scores: npt.NDArray[np.float64],
    unseen: npt.NDArray[np.float32],
) -> tuple[Int, Int]:
    """A clock hand's sweep from slot ``hand``: a touched row loses its bit and is passed
    over (its second chance); an untouched row scoring below ``threshold`` is taken, one
    scoring exactly ``threshold`` with probability ``tie_cut / 2**32`` (a hash of its slot
    and ``salt``, so ties go spread over the laps, not as one run of slots). Stops once
    ``rows`` is full; after two laps (every bit cleared by then) it takes any live row.
    A taken row's bit is set so no later lap takes it twice: the caller clears them. Every
    live row needs a bit (``TouchedBits.cover``).
    Returns (rows taken, the slot after the last one visited)."""
    size = arr_slots.size
    n = 0
    salt64 = np.uint64(salt)
    s = hand % size
    for step in range(3 * size):
        if n >= rows.size:
            break
        s = (hand + step) % size
        r = arr_slots[s]
        if r < 0:
            continue
        bit = np.uint8(1 << (r & 7))
        if touched[r >> 3] & bit:
            if step < size:  # first lap: the second chance; later: taken by this sweep
                touched[r >> 3] &= np.uint8(~bit & 0xFF)
            continue
        sc = _row_score(slab, slab_u32, hot, r, ap)
        if step < 2 * size:
            if sc > threshold:
                continue
            if sc == threshold and (ix.mix64(np.uint64(s) ^ salt64) >> np.uint64(32)) > tie_cut:
                continue
        touched[r >> 3] |= bit  # a later lap must not take it again
        rows[n] = r
        scores[n] = sc
        unseen[n] = pk.unseen_of(pk.word_of(slab_u32, xslab_u32, r))
        n += 1
    return n, (s + 1) % size


@njit(nogil=True, cache=True)
def release_rows(
    arr_slots: npt.NDArray[np.int32],
    arr_keys: npt.NDArray[np.uint64],
    meta: npt.NDArray[np.int64],
    slab: npt.NDArray[np.float32],
    slab_u32: npt.NDArray[np.uint32],
    xslab: npt.NDArray[np.float32],
    xslab_u32: npt.NDArray[np.uint32],
    hot: npt.NDArray[np.float64],
    rows: npt.NDArray[np.int64],
) -> None:
    """Remove the keys of live ``rows`` from RAM, freeing their embedx rows and side-table
    entries (the caller copied them first, ``snapshot.gather``)."""
    for t in range(rows.size):
        r = rows[t]
        if slab[r, P_SHOW] < 0.0:
            free_hot_entry(hot, meta, np.int64(slab_u32[r, P_CLICK]))
        xr = pk.xrow_of(slab_u32, r)
        if xr >= 0:
            free_embedx_row(xslab, xslab_u32, meta, xr)
        ix.remove(arr_slots, arr_keys, meta, arr_keys[r])
        slab[r, :] = 0.0


@njit(nogil=True, cache=True)
def place_rows(
    slab: npt.NDArray[np.float32],
    slab_u32: npt.NDArray[np.uint32],
    xslab: npt.NDArray[np.float32],
    xslab_u32: npt.NDArray[np.uint32],
    hot: npt.NDArray[np.float64],
    slot_map: npt.NDArray[np.int32],
    slot_ids: npt.NDArray[np.uint32],
    meta: npt.NDArray[np.int64],
    rows: npt.NDArray[np.int64],
    full: npt.NDArray[np.float32],
    hot_pos: npt.NDArray[np.int64],
    hot_counts: npt.NDArray[np.float64],
    xptr: Int,
    xflag: Int,
) -> None:
    """Write full rows into fresh primary ``rows`` (keys just inserted; room reserved):
    primary columns and packed word, an embedx row for admitted keys (a freed one first), a
    side-table entry for hot keys. The embedx pointer is written last (readers see
    before/after). The table's slot ids fit its dictionary (pushes and loads check), so
    every slot id gets a code."""
    hot_i64 = hot.view(np.int64)
    width = full.shape[1]
    full_u32 = full.view(np.uint32)
    for t in range(rows.size):
        r = rows[t]
        for j in range(PRIMARY_FROM, xptr):
            slab[r, j - PRIMARY_FROM] = full[t, j]
        code = pk.slot_code(slot_map, slot_ids, meta, SLOTS_USED, full_u32[t, SLOT])
        slab_u32[r, slab_u32.shape[1] - 1] = pk.pack(max(code, 0), np.int64(full[t, UNSEEN]))
        if full[t, xflag] >= 0.0:
            if meta[X_FREE_LEN] > 0:
                xr = meta[X_FREE_HEAD]
                meta[X_FREE_HEAD] = np.int64(xslab_u32[xr, 0]) - 1
                meta[X_FREE_LEN] -= 1
            else:
                xr = meta[X_NEXT]
                meta[X_NEXT] += 1
            for j in range(xptr, width):
                xslab[xr, j - xptr] = full[t, j]
            meta[EXPANDED] += 1
            pk.admit(slab_u32, xslab_u32, r, xr)
    for i in range(hot_pos.size):
        r = rows[hot_pos[i]]
        if meta[HOT_FREE_LEN] > 0:
            h = meta[HOT_FREE_HEAD]
            meta[HOT_FREE_HEAD] = hot_i64[h, 0] - 1
            meta[HOT_FREE_LEN] -= 1
        else:
            h = meta[HOT_NEXT]
            meta[HOT_NEXT] += 1
        for j in range(3):
            hot[h, j] = hot_counts[i, j]
        slab[r, P_DELTA] = 0.0
        slab_u32[r, P_CLICK] = np.uint32(h)
        slab[r, P_SHOW] = -1.0


def release(a: Arrays, meta: npt.NDArray[np.int64], rows: npt.NDArray[np.int64]) -> None:
    """``release_rows`` on a table's arrays."""
    release_rows(a.slots, a.keys, meta, a.slab, a.slab_u32, a.xslab, a.xslab_u32, a.hot, rows)


def place(
    a: Arrays,
    meta: npt.NDArray[np.int64],
    rows: npt.NDArray[np.int64],
    full: npt.NDArray[np.float32],
    hot: HotCounters,
    layout: RowLayout,
) -> None:
    """``place_rows`` on a table's arrays (``rows``: the keys' fresh primary rows)."""
    slabs = (a.slab, a.slab_u32, a.xslab, a.xslab_u32, a.hot, a.slot_map, a.slot_ids)
    place_rows(*slabs, meta, rows, full, hot.positions, hot.counts, layout.xptr, layout.xflag)
