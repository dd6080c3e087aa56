"""The nogil batch kernels of a sparse table (pull, push, shrink, save snapshots).

They operate on the arrays ``streamtrain_ps.table`` hands them and do no locking and no
allocation of table storage: the caller holds the right lock and has reserved room. The
hash-index probes are written inline with prefetching (see ``index.lookup_many``): a helper
taking arrays costs ~15 ns per call in numba, as much as the whole lookup.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
from numba import njit

from streamtrain_ps import index as ix
from streamtrain_ps.accessor import (
    AP_EMBEDX_THRESHOLD,
    CLICK,
    DELTA,
    EMBED_STATE,
    EMBED_W,
    SHOW,
    SLOT,
    UNSEEN,
    decay_and_test,
    score,
)
from streamtrain_ps.index import Int
from streamtrain_ps.optim import ADAM, init_part, update_part

PF = ix.PREFETCH

# meta[] counters after the index's own.
EXPANDED = 4
ADMISSIONS = 5
EVICTIONS = 6

# ``ip`` int64 layout parameters for kernels.
IP_DIM = 0
IP_KIND = 1
IP_XW = 2
IP_XS = 3
IP_XFLAG = 4
IP_SIZE = 5

# Error codes of ``merge_push``.
OK = 0
BAD_GRAD = 1
BAD_SHOW = 2
BAD_CLICK = 3
NOT_OWNED = 4
OVERFLOW = 5

_S24 = np.uint64(24)


@njit(nogil=True, cache=True)
def merge_push(
    keys: npt.NDArray[np.uint64],
    grads: npt.NDArray[np.float32],
    shows: npt.NDArray[np.float32],
    clicks: npt.NDArray[np.float32],
    slots: npt.NDArray[np.uint32],
    logical_shards: Int,
    num_shards: Int,
    shard_index: Int,
    part: Int,
    parts: Int,
) -> tuple[
    Int,
    Int,
    npt.NDArray[np.uint64],
    npt.NDArray[np.float32],
    npt.NDArray[np.float32],
    npt.NDArray[np.float32],
    npt.NDArray[np.uint32],
]:
    """Validate a push and sum repeated keys (a small local hash table; no lock needed).

    Only keys of ``part`` of ``parts`` (a power of two; by bits 24.. of the key's mix, so all
    copies of a key are in one part) are looked at: two threads can merge one request.
    Returns ``(error code, index of the offending entry or number of unique keys, keys,
    grads, shows, clicks, slots)``; slots of a repeated key: the last one wins.
    """
    n = keys.size
    dim = grads.shape[1]
    cap = 16
    while cap < 2 * n:
        cap *= 2
    mask = cap - 1
    table = np.full(cap, -1, dtype=np.int32)
    uk = np.empty(n, dtype=np.uint64)
    ug = np.empty((n, dim), dtype=np.float32)
    us = np.empty(n, dtype=np.float32)
    uc = np.empty(n, dtype=np.float32)
    usl = np.empty(n, dtype=np.uint32)
    has_slots = slots.size == n
    u = 0
    pmask = np.uint64(parts - 1)
    want = np.uint64(part)
    for i in range(n):
        key = keys[i]
        if parts > 1 and (ix.mix64(key) >> _S24) & pmask != want:
            continue
        s = shows[i]
        c = clicks[i]
        if not (s >= 0.0 and np.isfinite(s)):
            return BAD_SHOW, i, uk, ug, us, uc, usl
        if not (c >= 0.0 and np.isfinite(c)):
            return BAD_CLICK, i, uk, ug, us, uc, usl
        for j in range(dim):
            if not np.isfinite(grads[i, j]):
                return BAD_GRAD, i, uk, ug, us, uc, usl
        if num_shards > 1:
            logical = np.int64(ix.mix64(key) % np.uint64(logical_shards))
            if logical % num_shards != shard_index:
                return NOT_OWNED, i, uk, ug, us, uc, usl
        h = ix.home(key, mask)
        while True:
            t = table[h]
            if t < 0:
                table[h] = np.int32(u)
                uk[u] = key
                for j in range(dim):
                    ug[u, j] = grads[i, j]
                us[u] = s
                uc[u] = c
                usl[u] = slots[i] if has_slots else 0
                u += 1
                break
            if uk[t] == key:
                for j in range(dim):
                    ug[t, j] += grads[i, j]
                us[t] += s
                uc[t] += c
                if has_slots:
                    usl[t] = slots[i]
                break
            h = int((h + 1) & mask)
    for t in range(u):  # finite inputs can still sum to inf (float32 overflow)
        if not (np.isfinite(us[t]) and np.isfinite(uc[t])):
            return OVERFLOW, t, uk, ug, us, uc, usl
        for j in range(dim):
            if not np.isfinite(ug[t, j]):
                return OVERFLOW, t, uk, ug, us, uc, usl
    return OK, u, uk[:u], ug[:u], us[:u], uc[:u], usl[:u]


@njit(nogil=True, cache=True)
def update_rows(
    slab: npt.NDArray[np.float32],
    slab_u32: npt.NDArray[np.uint32],
    rows: npt.NDArray[np.int64],
    created: npt.NDArray[np.bool_],
    start: Int,
    stop: Int,
    keys: npt.NDArray[np.uint64],
    grads: npt.NDArray[np.float32],
    shows: npt.NDArray[np.float32],
    clicks: npt.NDArray[np.float32],
    slots: npt.NDArray[np.uint32],
    has_slots: bool,
    ip: npt.NDArray[np.int64],
    ap: npt.NDArray[np.float64],
    fp: npt.NDArray[np.float64],
    seed: np.uint64,
) -> Int:
    """Apply merged pushes ``start:stop`` to their (distinct) rows; returns admissions.

    The rows were found or created by ``index.insert_many`` first, so two threads may run
    disjoint ranges of one push at once: they never touch the same row or the index.
    """
    dim = ip[IP_DIM]
    kind = ip[IP_KIND]
    xw = ip[IP_XW]
    xs = ip[IP_XS]
    xflag = ip[IP_XFLAG]
    threshold = ap[AP_EMBEDX_THRESHOLD]
    admitted = 0
    for i in range(start, stop):
        if i + PF < stop:
            ix.prefetch(slab, rows[i + PF])
        row = rows[i]
        key = keys[i]
        if created[i]:  # the row is all zeros: embed part, then mark embedx "not admitted"
            init_part(slab, row, EMBED_W, EMBED_STATE, 1, kind, kind == ADAM, seed, key, fp)
            slab[row, xflag] = -1.0
        show = np.float64(shows[i])
        click = np.float64(clicks[i])
        slab[row, SHOW] += shows[i]
        slab[row, CLICK] += clicks[i]
        slab[row, DELTA] += score(show, click, ap)
        slab[row, UNSEEN] = 0.0
        if has_slots:
            slab_u32[row, SLOT] = slots[i]
        scale = 1.0 / show if show > 0.0 else 1.0
        update_part(slab, row, EMBED_W, EMBED_STATE, 1, kind, grads, i, 0, scale, fp)
        if slab[row, xflag] >= 0.0:
            update_part(slab, row, xw, xs, dim, kind, grads, i, 1, scale, fp)
        elif score(slab[row, SHOW], slab[row, CLICK], ap) >= threshold:
            # Admission: this push's embedx gradient was computed against zeros; drop it.
            init_part(slab, row, xw, xs, dim, kind, True, seed, key, fp)
            admitted += 1
    return admitted


@njit(nogil=True, cache=True)
def pull_kernel(
    arr_slots: npt.NDArray[np.int32],
    arr_keys: npt.NDArray[np.uint64],
    slab: npt.NDArray[np.float32],
    keys: npt.NDArray[np.uint64],
    out: npt.NDArray[np.float32],
    xw: Int,
) -> None:
    dim = out.shape[1] - 3
    homes = ix.homes_of(arr_slots, keys)
    n = keys.size
    for i in range(n):
        if i + 2 * PF < n:  # see index.lookup_many
            ix.prefetch(arr_slots, homes[i + 2 * PF])
        if i + PF < n:
            ahead = arr_slots[homes[i + PF]]
            if ahead >= 0:
                ix.prefetch(arr_keys, ahead)
                ix.prefetch(slab, ahead)
        r = ix.find_at(arr_slots, arr_keys, keys[i], homes[i])
        if r < 0:
            for j in range(dim + 3):
                out[i, j] = 0.0
        else:
            out[i, 0] = slab[r, SHOW]
            out[i, 1] = slab[r, CLICK]
            out[i, 2] = slab[r, EMBED_W]
            for j in range(dim):
                out[i, 3 + j] = slab[r, xw + j]


@njit(nogil=True, cache=True)
def shrink_kernel(
    arr_slots: npt.NDArray[np.int32],
    arr_keys: npt.NDArray[np.uint64],
    meta: npt.NDArray[np.int64],
    slab: npt.NDArray[np.float32],
    ap: npt.NDArray[np.float64],
    xflag: Int,
    deleted: npt.NDArray[np.uint64],
) -> Int:
    rows = np.empty(meta[ix.COUNT], dtype=np.int64)
    n = ix.live_rows(arr_slots, rows)
    nd = 0
    for t in range(n):
        row = rows[t]
        if decay_and_test(slab, row, ap):
            key = arr_keys[row]
            if slab[row, xflag] >= 0.0:
                meta[EXPANDED] -= 1
            ix.remove(arr_slots, arr_keys, meta, key)
            slab[row, :] = 0.0  # a reused row starts from zeros, like a fresh one
            deleted[nd] = key
            nd += 1
    meta[EVICTIONS] += nd
    return nd


@njit(nogil=True, cache=True)
def group_rows(
    arr_slots: npt.NDArray[np.int32],
    arr_keys: npt.NDArray[np.uint64],
    count: Int,
    logical_shards: Int,
    rows_out: npt.NDArray[np.int64],
    offsets: npt.NDArray[np.int64],
) -> None:
    """Counting sort of live rows by logical shard: rows of shard s are
    ``rows_out[offsets[s]:offsets[s + 1]]``."""
    rows = np.empty(count, dtype=np.int64)
    n = ix.live_rows(arr_slots, rows)
    shard = np.empty(n, dtype=np.int64)
    for t in range(n):
        shard[t] = np.int64(ix.mix64(arr_keys[rows[t]]) % np.uint64(logical_shards))
        offsets[shard[t] + 1] += 1
    for s in range(logical_shards):
        offsets[s + 1] += offsets[s]
    fill = offsets[:-1].copy()
    for t in range(n):
        rows_out[fill[shard[t]]] = rows[t]
        fill[shard[t]] += 1


@njit(nogil=True, cache=True)
def gather(
    arr_keys: npt.NDArray[np.uint64],
    slab: npt.NDArray[np.float32],
    rows: npt.NDArray[np.int64],
    keys_out: npt.NDArray[np.uint64],
    rows_out: npt.NDArray[np.float32],
) -> None:
    for t in range(rows.size):
        keys_out[t] = arr_keys[rows[t]]
        rows_out[t, :] = slab[rows[t], :]


@njit(nogil=True, cache=True)
def after_save(
    slab: npt.NDArray[np.float32],
    rows: npt.NDArray[np.int64],
    saved_delta: npt.NDArray[np.float32],
    unseen_inc: bool,
) -> None:
    """Side effects of a successful save: delta_score -= what was saved (so pushes that
    arrived meanwhile still count towards the next delta), or unseen_days += 1."""
    for t in range(rows.size):
        if unseen_inc:
            slab[rows[t], UNSEEN] += 1.0
        else:
            slab[rows[t], DELTA] -= saved_delta[t]
