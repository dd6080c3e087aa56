"""Compaction of a table's RAM slabs: the live rows moved down into freed rows, and the
freed tail's pages given back to the OS.

Why: rows freed by a demotion stay resident for reuse, so a RAM tier's resident bytes are
its slabs' *high-water* mark, not its live rows. While a capped shard's key set keeps
growing, the in-RAM filter of its disk keys (``disk_filter``) grows with every key sent to
disk, and the governor makes room for it by demoting rows, whose pages it never got back:
at 100M keys under a 2 GiB limit the tables held 1,947.7 MB resident against a 1,712 MB
table budget (``docs/benchmarks.md``, issue 12). Compacting after each demotion makes the
resident table follow the live one.

How (all under the table's exclusive lock, so no reader holds a row id):

- **primary rows** (``compact_primary``): every live row at or above the live count moves
  into a free row below it (as many of one as of the other), its slot re-pointed, its
  touched bit carried along; the high-water mark drops to the live count and the free list
  empties. Finding a row's slot is one probe from its key's home slot; a free row's key
  column holds a free-list link, so the free rows of the tail are marked first.
- **embedx rows** (``compact_embedx``): the same for the embedx slab, whose rows have no
  link back to their primary row: one sequential pass over the (now dense) primary rows
  finds the admitted ones pointing past the live embedx count and re-points them. That
  pass reads the whole primary slab, so it runs only when a fair share of the embedx slab
  is free (``EMBEDX_FREE_SHARE``).
- **release** (``address_space.release_rows``): the tail's whole pages are dropped with
  ``madvise(MADV_DONTNEED)`` and read as zeros again, as never-written rows do; the bytes
  of partly covered pages are zeroed.

The moves change row ids, never contents: a key's row is bit-identical before and after,
and the caller bumps its move counter so a save's recorded row ids are looked up again.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
from numba import njit

from streamtrain_ps.engine import address_space
from streamtrain_ps.engine import index as ix
from streamtrain_ps.engine import kernels as kn
from streamtrain_ps.engine import packed as pk
from streamtrain_ps.engine.index import Int
from streamtrain_ps.engine.slabs import Arrays
from streamtrain_ps.tier import tier_kernels as tk

#: Compact the embedx slab once this share of its rows is free (its pass reads every
#: primary row, so it is amortised over at least this share of the embedx rows).
EMBEDX_FREE_SHARE = 1 / 32


@njit(nogil=True, cache=True)
def compact_primary(
    slots: npt.NDArray[np.int32],
    keys: npt.NDArray[np.uint64],
    meta: npt.NDArray[np.int64],
    slab: npt.NDArray[np.float32],
    touched: npt.NDArray[np.uint8],
) -> Int:
    """Move the live rows at or above ``meta[COUNT]`` into the free rows below it (module
    docstring); returns rows moved. Rows from the live count up to the old high-water mark
    are left holding stale bytes for the caller to release."""
    count = meta[ix.COUNT]
    high = meta[ix.NEXT_ROW]
    nfree = meta[ix.FREE_LEN]
    if high <= count:
        return 0
    free_in_tail = np.zeros(high - count, dtype=np.bool_)
    dest = _free_rows_below(keys, meta[ix.FREE_HEAD], nfree, count, free_in_tail)
    mask = np.int64(slots.size - 1)
    moved = 0
    for src in range(count, high):
        if free_in_tail[src - count]:
            continue
        dst = dest[moved]
        moved += 1
        key = keys[src]
        i = ix.home(key, mask)
        while slots[i] != src:
            i = (i + 1) & mask
        keys[dst] = key
        slab[dst, :] = slab[src, :]
        tk.set_touched(touched, dst, tk.touched_bit(touched, src))
        slots[i] = np.int32(dst)
    for src in range(count, high):  # released rows start untouched
        tk.set_touched(touched, src, 0)
    meta[ix.NEXT_ROW] = count
    meta[ix.FREE_LEN] = 0
    meta[ix.FREE_HEAD] = 0
    return moved


@njit(nogil=True, cache=True, inline="always")
def _free_rows_below(
    links: npt.NDArray[np.generic],
    head: Int,
    n: Int,
    below: Int,
    in_tail: npt.NDArray[np.bool_],
) -> npt.NDArray[np.int64]:
    """Walk a free list of ``n`` rows threaded through ``links`` (next row + 1): the rows
    below ``below``, and (when ``in_tail`` has room) each other row marked at its offset
    from ``below``."""
    dest = np.empty(n, dtype=np.int64)
    nd = 0
    r = np.int64(head)
    for _ in range(n):
        if r < below:
            dest[nd] = r
            nd += 1
        elif in_tail.size:
            in_tail[r - below] = True
        r = np.int64(links[r]) - 1
    return dest[:nd]


@njit(nogil=True, cache=True)
def compact_embedx(
    slab_u32: npt.NDArray[np.uint32],
    count: Int,
    xslab: npt.NDArray[np.float32],
    xslab_u32: npt.NDArray[np.uint32],
    meta: npt.NDArray[np.int64],
) -> Int:
    """Move the live embedx rows at or above the live embedx count into free ones below
    it, re-pointing their primary rows; rows ``:count`` must all be live (run after
    ``compact_primary``). Returns rows moved."""
    xhigh = meta[kn.X_NEXT]
    nfree = meta[kn.X_FREE_LEN]
    xlive = xhigh - nfree
    if nfree <= 0:
        return 0
    no_tail = np.zeros(0, dtype=np.bool_)
    dest = _free_rows_below(xslab_u32[:, 0], meta[kn.X_FREE_HEAD], nfree, xlive, no_tail)
    last = slab_u32.shape[1] - 1
    moved = 0
    for r in range(count):
        w = slab_u32[r, last]
        if w & pk.ADMITTED:
            src = np.int64(w & pk.XROW_MASK)
            if src >= xlive:
                dst = dest[moved]
                moved += 1
                xslab[dst, :] = xslab[src, :]
                slab_u32[r, last] = pk.ADMITTED | np.uint32(dst)
    meta[kn.X_NEXT] = xlive
    meta[kn.X_FREE_LEN] = 0
    meta[kn.X_FREE_HEAD] = 0
    return moved


def compact(a: Arrays, meta: npt.NDArray[np.int64], touched: npt.NDArray[np.uint8]) -> int:
    """Compact ``a``'s primary slab (at a cost that follows its free rows, not the table)
    and, once ``EMBEDX_FREE_SHARE`` of it is free, its embedx slab, and give the freed
    tails' pages back; returns rows moved. The caller holds the table's exclusive lock and
    counts the move (row ids changed)."""
    high = int(meta[ix.NEXT_ROW])
    moved = int(compact_primary(a.slots, a.keys, meta, a.slab, touched))
    count = int(meta[ix.COUNT])
    address_space.release_rows(a.keys, count, high)
    address_space.release_rows(a.slab, count, high)
    xhigh = int(meta[kn.X_NEXT])
    xfree = int(meta[kn.X_FREE_LEN])
    if xfree and xfree >= xhigh * EMBEDX_FREE_SHARE:
        moved += int(compact_embedx(a.slab_u32, int(meta[ix.COUNT]), a.xslab, a.xslab_u32, meta))
        address_space.release_rows(a.xslab, int(meta[kn.X_NEXT]), xhigh)
    return moved
