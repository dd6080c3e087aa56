"""The nogil batch kernels of a sparse table (pull, push, shrink, save snapshots).

They operate on the arrays ``streamtrain_ps.engine.table`` hands them and do no locking and no
allocation of table storage: the caller holds the right lock and has reserved room. The
hash-index probes are written inline with prefetching (see ``index.lookup_many``): a helper
taking arrays costs ~15 ns per call in numba, as much as the whole lookup.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
from numba import njit

from streamtrain_ps.engine import index as ix
from streamtrain_ps.engine import packed as pk
from streamtrain_ps.engine.accessor import (
    AP_DECAY,
    AP_DELETE_AFTER_DAYS,
    AP_DELETE_THRESHOLD,
    AP_EMBEDX_THRESHOLD,
    EMBED_W,
    P_CLICK,
    P_DELTA,
    P_EMBED_STATE,
    P_EMBED_W,
    P_SHOW,
    decay_and_test,
    score,
)
from streamtrain_ps.engine.index import Int
from streamtrain_ps.engine.optim import (
    ADAM,
    PART_EMBED,
    PART_EMBEDX,
    grad_scale,
    init_part,
    update_part,
)

PF = ix.PREFETCH

# meta[] counters after the index's own.
EXPANDED = 4
ADMISSIONS = 5
EVICTIONS = 6
# The embedx slab's allocator: high-water mark and a free list threaded through column 0
# (uint32 bits: next free row + 1, 0 = end) of its free rows.
X_NEXT = 7
X_FREE_HEAD = 8
X_FREE_LEN = 9
# The hot-counter side table's allocator (free list through the int64 bits of column 0).
HOT_NEXT = 10
HOT_FREE_HEAD = 11
HOT_FREE_LEN = 12
# Slot ids in the table's slot dictionary beyond code 0 (``packed.slot_code``).
SLOTS_USED = 13
#: Push updates refused because the row would have held inf or NaN (``update_rows``).
REFUSED = 14
TABLE_META_SIZE = 16

#: A key whose show, click or |delta_score| reaches this moves its three counters to the
#: float64 side table (exact far past float32's 2^24); float32 still counts in steps of
#: 1/8 here. ``shrink`` moves a key back once all three decay below a quarter of it.
HOT_FROM = float(2**20)
HOT_BACK = HOT_FROM / 4
#: The largest float32: exact (float64) counters are read as float32 by pulls and saves.
F32_MAX = float(np.finfo(np.float32).max)
# ``todo`` bits ``update_rows`` leaves for the serial ``settle_rows`` pass.
TODO_ADMIT = 1
TODO_HOT = 2
#: ``update_rows`` returns admissions + promotions * PROMOTED (both need room reserved)
#: + refused updates * REFUSED (a chunk has at most ``table.APPLY_CHUNK`` < 2^20 keys).
PROMOTED = 1 << 20
REFUSED_UNIT = 1 << 40

# ``ip`` int64 layout parameters for kernels.
IP_DIM = 0
IP_KIND = 1
IP_XPTR = 2  # the full row's embedx_w column (the init hash column of embedx)
IP_EMBED_KIND = 3  # the embed part's rule (IP_KIND: the embedx part's)
IP_SIZE = 4

# Error codes of ``merge_push``.
OK = 0
BAD_GRAD = 1
BAD_SHOW = 2
BAD_CLICK = 3
NOT_OWNED = 4
OVERFLOW = 5

_S24 = np.uint64(24)
_EXP = np.uint32(0x7F800000)  # float32's exponent bits


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
    xslab: npt.NDArray[np.float32],
    hot: npt.NDArray[np.float64],
    rows: npt.NDArray[np.int64],
    created: npt.NDArray[np.bool_],
    todo: npt.NDArray[np.uint8],
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
    """Apply merged pushes ``start:stop`` to their (distinct) rows. Keys that reach the
    admission threshold or the hot-counter limit are marked in ``todo`` for ``settle_rows``;
    returns admissions + promotions * ``PROMOTED`` + refused * ``REFUSED_UNIT``.

    A key whose updated row (counters, weights, state) would hold inf or NaN is put back
    as it was before this push and counted as refused (``finite_or_restore``): the show
    floor and gradient clip (``optim``) make that unreachable for finite inputs, and this
    keeps it so whatever a rule's arithmetic does.

    The rows were found or created by ``index.insert_many`` first, so two threads may run
    disjoint ranges of one push at once: they never touch the same row, the index or an
    allocator (admission and promotion allocate, so they run afterwards on one thread).
    A hot key (show < 0, see ``pull_kernel``) counts in its float64 side-table entry.
    ``slots`` holds slot *codes* (``packed``), translated by the caller.
    """
    dim = ip[IP_DIM]
    kind = ip[IP_KIND]
    ekind = ip[IP_EMBED_KIND]
    xslab_u32 = xslab.view(np.uint32)
    threshold = ap[AP_EMBEDX_THRESHOLD]
    pending = 0
    half = PF // 2
    p_keep = np.empty(slab.shape[1], dtype=np.float32)  # the row before the push
    x_keep = np.empty(xslab.shape[1], dtype=np.float32)
    h_keep = np.empty(3, dtype=np.float64)
    for i in range(start, stop):
        if i + PF < stop:
            ix.prefetch(slab, rows[i + PF])
        if i + half < stop:  # its primary row was prefetched PF/2 keys ago
            ahead = pk.xrow_of(slab_u32, rows[i + half])
            if ahead >= 0:
                ix.prefetch(xslab, ahead)
        row = rows[i]
        key = keys[i]
        embed = fp[PART_EMBED]
        if created[i]:  # all zeros: slot 0, unseen 0, embedx not admitted
            rand = ekind == ADAM
            init_part(
                slab, row, P_EMBED_W, P_EMBED_STATE, 1, ekind, rand, seed, key, embed, EMBED_W
            )
        show = np.float64(shows[i])
        click = np.float64(clicks[i])
        mark = 0
        xr = pk.xrow_of(slab_u32, row)
        for j in range(p_keep.size):
            p_keep[j] = slab[row, j]
        if xr >= 0:
            for j in range(x_keep.size):
                x_keep[j] = xslab[xr, j]
        if slab[row, P_SHOW] < 0.0:  # hot: exact float64 counters in the side table
            h = slab_u32[row, P_CLICK]
            for j in range(3):
                h_keep[j] = hot[h, j]
            hot[h, 0] += show
            hot[h, 1] += click
            hot[h, 2] += score(show, click, ap)
            now = score(hot[h, 0], hot[h, 1], ap)
        else:
            slab[row, P_SHOW] += shows[i]
            slab[row, P_CLICK] += clicks[i]
            slab[row, P_DELTA] += score(show, click, ap)
            now = score(slab[row, P_SHOW], slab[row, P_CLICK], ap)  # float32 operands, as ever
            if max(slab[row, P_SHOW], slab[row, P_CLICK], abs(slab[row, P_DELTA])) >= HOT_FROM:
                mark = TODO_HOT
        # unseen_days = 0, and the slot (code) of this push if it has slots
        code = slots[i] if has_slots else pk.code_of(pk.word_of(slab_u32, xslab_u32, row))
        pk.set_word(slab_u32, xslab_u32, row, pk.pack(code, 0))
        scale = grad_scale(show)
        update_part(slab, row, P_EMBED_W, P_EMBED_STATE, 1, ekind, grads, i, 0, scale, embed, show)
        if xr >= 0:
            update_part(xslab, xr, 0, dim, dim, kind, grads, i, 1, scale, fp[PART_EMBEDX], show)
        if not finite_or_restore(
            slab, xslab, hot, slab_u32, xslab_u32, row, xr, p_keep, x_keep, h_keep
        ):
            todo[i] = 0
            pending += REFUSED_UNIT
            continue
        if xr < 0 and now >= threshold:
            # Admission: this push's embedx gradient was computed against zeros; drop it.
            mark |= TODO_ADMIT
            pending += 1
        if mark & TODO_HOT:
            pending += PROMOTED
        todo[i] = mark
    return pending


@njit(nogil=True, cache=True, inline="always")
def finite_or_restore(
    slab: npt.NDArray[np.float32],
    xslab: npt.NDArray[np.float32],
    hot: npt.NDArray[np.float64],
    slab_u32: npt.NDArray[np.uint32],
    xslab_u32: npt.NDArray[np.uint32],
    row: Int,
    xr: Int,
    p_keep: npt.NDArray[np.float32],
    x_keep: npt.NDArray[np.float32],
    h_keep: npt.NDArray[np.float64],
) -> bool:
    """Whether ``row`` (and its embedx row ``xr``, its side-table entry if hot) is finite
    after a push; if not, they are put back to ``*_keep`` (the last column of each slab row
    is a packed word, not a number, and is not checked). Exact counters must stay within
    float32's range too: pulls and saves' full rows read them as float32."""
    # Exponent bits all set: inf or NaN (the packed word's bits are left out).
    bad = False
    for j in range(slab_u32.shape[1] - 1):
        bad |= (slab_u32[row, j] & _EXP) == _EXP
    if xr >= 0:
        for j in range(xslab_u32.shape[1] - 1):
            bad |= (xslab_u32[xr, j] & _EXP) == _EXP
    ok = not bad
    hot_row = p_keep[P_SHOW] < 0.0
    if hot_row:
        h = slab_u32[row, P_CLICK]
        for j in range(3):
            ok &= abs(hot[h, j]) <= F32_MAX
    if ok:
        return True
    for j in range(p_keep.size):
        slab[row, j] = p_keep[j]
    if xr >= 0:
        for j in range(x_keep.size):
            xslab[xr, j] = x_keep[j]
    if hot_row:
        h = slab_u32[row, P_CLICK]
        for j in range(3):
            hot[h, j] = h_keep[j]
    return False


@njit(nogil=True, cache=True)
def settle_rows(
    slab: npt.NDArray[np.float32],
    slab_u32: npt.NDArray[np.uint32],
    xslab: npt.NDArray[np.float32],
    xslab_u32: npt.NDArray[np.uint32],
    hot: npt.NDArray[np.float64],
    meta: npt.NDArray[np.int64],
    rows: npt.NDArray[np.int64],
    todo: npt.NDArray[np.uint8],
    n: Int,
    keys: npt.NDArray[np.uint64],
    ip: npt.NDArray[np.int64],
    fp: npt.NDArray[np.float64],
    seed: np.uint64,
) -> Int:
    """The allocating half of a push, on one thread (the caller reserved room): every key
    marked ``TODO_ADMIT`` in ``todo[:n]`` gets an embedx row (a freed one first) with its
    initial weights; every key marked ``TODO_HOT`` moves its counters to the side table.
    Pointers are written last, so readers see a part either before or after. Returns
    admissions."""
    dim = ip[IP_DIM]
    kind = ip[IP_KIND]
    xptr = ip[IP_XPTR]
    hot_i64 = hot.view(np.int64)
    done = 0
    for i in range(n):
        if todo[i] & TODO_HOT:
            if meta[HOT_FREE_LEN] > 0:
                h = meta[HOT_FREE_HEAD]
                meta[HOT_FREE_HEAD] = hot_i64[h, 0] - 1
                meta[HOT_FREE_LEN] -= 1
            else:
                h = meta[HOT_NEXT]
                meta[HOT_NEXT] += 1
            row = rows[i]
            hot[h, 0] = slab[row, P_SHOW]
            hot[h, 1] = slab[row, P_CLICK]
            hot[h, 2] = slab[row, P_DELTA]
            slab[row, P_DELTA] = 0.0
            slab_u32[row, P_CLICK] = np.uint32(h)
            slab[row, P_SHOW] = -1.0
        if not todo[i] & TODO_ADMIT:
            continue
        if meta[X_FREE_LEN] > 0:
            xr = meta[X_FREE_HEAD]
            meta[X_FREE_HEAD] = np.int64(xslab_u32[xr, 0]) - 1
            meta[X_FREE_LEN] -= 1
        else:
            xr = meta[X_NEXT]
            meta[X_NEXT] += 1
        init_part(xslab, xr, 0, dim, dim, kind, True, seed, keys[i], fp[PART_EMBEDX], xptr)
        pk.admit(slab_u32, xslab_u32, rows[i], xr)
        done += 1
    return done


@njit(nogil=True, cache=True)
def pull_kernel(
    arr_slots: npt.NDArray[np.int32],
    arr_keys: npt.NDArray[np.uint64],
    slab: npt.NDArray[np.float32],
    slab_u32: npt.NDArray[np.uint32],
    xslab: npt.NDArray[np.float32],
    hot: npt.NDArray[np.float64],
    keys: npt.NDArray[np.uint64],
    out: npt.NDArray[np.float32],
    missed: npt.NDArray[np.uint8],
    touched: npt.NDArray[np.uint8],
) -> Int:
    """Pull rows; returns how many keys were *stale*: hot keys whose side-table entry lies
    beyond the ``hot`` array this caller holds (the table grew it meanwhile). The caller
    pulls again with the current arrays then.

    For the disk tier (both may be empty: not recorded): ``missed[i] = 1`` for a key absent
    from RAM, and each found row's bit in ``touched`` (one bit a row) is set, the recency
    mark a demotion respects. Concurrent pulls may lose a bit to each other's byte write:
    that only lets a key be demoted sooner, never changes a value."""
    dim = out.shape[1] - 3
    stale = 0
    hcap = hot.shape[0]
    homes = ix.homes_of(arr_slots, keys)
    n = keys.size
    xcap = xslab.shape[0]
    half = PF // 2
    for i in range(n):
        if i + 2 * PF < n:  # see index.lookup_many
            ix.prefetch(arr_slots, homes[i + 2 * PF])
        if i + PF < n:
            ahead = arr_slots[homes[i + PF]]
            if ahead >= 0:
                ix.prefetch(arr_keys, ahead)
                ix.prefetch(slab, ahead)
        if i + half < n:  # its primary row was prefetched PF/2 keys ago: now its embedx row
            mid = arr_slots[homes[i + half]]
            if mid >= 0:
                xm = pk.xrow_of(slab_u32, mid)
                if 0 <= xm < xcap:
                    ix.prefetch(xslab, xm)
        r = ix.find_at(arr_slots, arr_keys, keys[i], homes[i])
        if r < 0:
            for j in range(dim + 3):
                out[i, j] = 0.0
            if missed.size:
                missed[i] = 1
            continue
        if (r >> 3) < touched.size:
            touched[r >> 3] |= np.uint8(1 << (r & 7))
        show = slab[r, P_SHOW]
        if show < 0.0:  # hot key: counters in the side table at the index in CLICK's bits
            h = slab_u32[r, P_CLICK]
            if h >= hcap:
                stale += 1
                continue
            out[i, 0] = hot[h, 0]
            out[i, 1] = hot[h, 1]
        else:
            out[i, 0] = show
            out[i, 1] = slab[r, P_CLICK]
        out[i, 2] = slab[r, P_EMBED_W]
        xr = pk.xrow_of(slab_u32, r)
        # A pointer past the slab we hold: admitted after we took the arrays (pulls as 0).
        if 0 <= xr < xcap:
            for j in range(dim):
                out[i, 3 + j] = xslab[xr, j]
        else:
            for j in range(dim):
                out[i, 3 + j] = 0.0
    return stale


@njit(nogil=True, cache=True, inline="always")
def free_hot_entry(hot: npt.NDArray[np.float64], meta: npt.NDArray[np.int64], h: Int) -> None:
    """Zero side-table entry ``h`` and push it on the side table's free list."""
    hot[h, :] = 0.0
    hot.view(np.int64)[h, 0] = meta[HOT_FREE_HEAD] + 1 if meta[HOT_FREE_LEN] else 0
    meta[HOT_FREE_HEAD] = h
    meta[HOT_FREE_LEN] += 1


@njit(nogil=True, cache=True, inline="always")
def free_embedx_row(
    xslab: npt.NDArray[np.float32],
    xslab_u32: npt.NDArray[np.uint32],
    meta: npt.NDArray[np.int64],
    xr: Int,
) -> None:
    """Zero embedx row ``xr`` (a reused row starts from zeros) and push it on the free list."""
    meta[EXPANDED] -= 1
    xslab[xr, :] = 0.0
    xslab_u32[xr, 0] = np.uint32(meta[X_FREE_HEAD] + 1) if meta[X_FREE_LEN] else 0
    meta[X_FREE_HEAD] = xr
    meta[X_FREE_LEN] += 1


@njit(nogil=True, cache=True)
def shrink_kernel(
    arr_slots: npt.NDArray[np.int32],
    arr_keys: npt.NDArray[np.uint64],
    meta: npt.NDArray[np.int64],
    slab: npt.NDArray[np.float32],
    slab_u32: npt.NDArray[np.uint32],
    xslab: npt.NDArray[np.float32],
    xslab_u32: npt.NDArray[np.uint32],
    hot: npt.NDArray[np.float64],
    ap: npt.NDArray[np.float64],
    deleted: npt.NDArray[np.uint64],
) -> Int:
    """Decay and delete (§4). Hot keys decay in float64 and return to float32 counters
    once all three fall below ``HOT_BACK``; a deleted key frees its embedx row and its
    side-table entry."""
    rows = np.empty(meta[ix.COUNT], dtype=np.int64)
    n = ix.live_rows(arr_slots, rows)
    nd = 0
    rate = ap[AP_DECAY]
    half = PF // 2
    for t in range(n):
        if t + PF < n:  # rows are in slot order, i.e. random: fetch ahead (see pull_kernel)
            ix.prefetch(slab, rows[t + PF])
        if t + half < n:  # an admitted key's unseen_days is in its embedx row
            ahead = pk.xrow_of(slab_u32, rows[t + half])
            if ahead >= 0:
                ix.prefetch(xslab, ahead)
        row = rows[t]
        unseen = pk.unseen_of(pk.word_of(slab_u32, xslab_u32, row))
        if slab[row, P_SHOW] < 0.0:
            h = np.int64(slab_u32[row, P_CLICK])
            show = hot[h, 0] * rate
            click = hot[h, 1] * rate
            hot[h, 0] = show
            hot[h, 1] = click
            gone = (
                score(show, click, ap) < ap[AP_DELETE_THRESHOLD]
                or unseen > ap[AP_DELETE_AFTER_DAYS]
            )
            back = max(show, click, abs(hot[h, 2])) < HOT_BACK
            if back and not gone:
                slab[row, P_SHOW] = show
                slab[row, P_CLICK] = click
                slab[row, P_DELTA] = hot[h, 2]
            if gone or back:
                free_hot_entry(hot, meta, h)
        else:
            gone = decay_and_test(slab, row, unseen, ap)
        if gone:
            key = arr_keys[row]
            xr = pk.xrow_of(slab_u32, row)
            if xr >= 0:
                free_embedx_row(xslab, xslab_u32, meta, xr)
            ix.remove(arr_slots, arr_keys, meta, key)
            slab[row, :] = 0.0  # a reused row starts from zeros, like a fresh one
            deleted[nd] = key
            nd += 1
    meta[EVICTIONS] += nd
    return nd
