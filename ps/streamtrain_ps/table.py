"""One sparse table of one shard: hash index + contiguous float32 row slab + its locking.

State is one immutable ``_Arrays`` tuple (slots, keys column, slab) swapped as a whole when
anything grows, so a reader that took ``self._arrays`` once sees arrays that belong
together (a row id found in ``slots`` is always inside ``keys`` and ``slab``), even while a
writer reallocates. Growth is geometric with ``np.zeros`` (untouched pages are not
resident), done before a kernel runs, so kernels never reallocate.

Consistency (``TableLock``):

- pulls are *readers*: any number run at once, and they run concurrently with one pusher.
  A pull sees each key either before or after a concurrent push of it (a row may be read
  mid-update: some columns new, some old — the usual asynchronous-SGD contract).
- pushes are *writers*: serialised per table by one mutex, so totals are exact.
  Merging duplicate keys of a request happens before the mutex is taken.
- shrink and load are *exclusive*: they wait for readers to drain and block new ones,
  because deletion moves entries in ``slots`` and load swaps the whole table.
- saves hold ``maintenance`` (no shrink/load meanwhile) and take the writer mutex only while
  copying one logical shard's rows, so pulls and pushes keep flowing during a save.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import NamedTuple

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
    RowLayout,
    accessor_params,
    decay_and_test,
    score,
)
from streamtrain_ps.config import TableConfig
from streamtrain_ps.index import Int
from streamtrain_ps.optim import ADAM, init_part, params_vector, update_part

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


class TableLock:
    """Readers share; one writer at a time alongside readers; exclusive excludes all."""

    def __init__(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._readers = 0
        self._exclusive = False
        self._writer = threading.Lock()
        self.maintenance = threading.Lock()

    @contextmanager
    def read(self) -> Iterator[None]:
        with self._cond:
            while self._exclusive:
                self._cond.wait()
            self._readers += 1
        try:
            yield
        finally:
            with self._cond:
                self._readers -= 1
                if self._readers == 0:
                    self._cond.notify_all()

    @contextmanager
    def write(self) -> Iterator[None]:
        with self._writer:
            yield

    @contextmanager
    def exclusive(self) -> Iterator[None]:
        with self._writer:
            with self._cond:
                self._exclusive = True
                while self._readers:
                    self._cond.wait()
            try:
                yield
            finally:
                with self._cond:
                    self._exclusive = False
                    self._cond.notify_all()


class _Arrays(NamedTuple):
    slots: npt.NDArray[np.int32]
    keys: npt.NDArray[np.uint64]
    slab: npt.NDArray[np.float32]


@njit(nogil=True, cache=True)
def merge_push(  # noqa: PLR0917 - kernels take their arrays positionally
    keys: npt.NDArray[np.uint64],
    grads: npt.NDArray[np.float32],
    shows: npt.NDArray[np.float32],
    clicks: npt.NDArray[np.float32],
    slots: npt.NDArray[np.uint32],
    logical_shards: Int,
    num_shards: Int,
    shard_index: Int,
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

    Returns ``(error code, index of the offending entry or number of unique keys, keys,
    grads, shows, clicks, slots)``; slots of a repeated key: the last one wins.
    """
    n = keys.size
    dim = grads.shape[1]
    cap = 16
    while cap < 2 * n:
        cap *= 2
    mask = cap - 1
    table = np.full(cap, -1, dtype=np.int64)
    uk = np.empty(n, dtype=np.uint64)
    ug = np.empty((n, dim), dtype=np.float32)
    us = np.empty(n, dtype=np.float32)
    uc = np.empty(n, dtype=np.float32)
    usl = np.empty(n, dtype=np.uint32)
    has_slots = slots.size == n
    u = 0
    for i in range(n):
        key = keys[i]
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
                table[h] = u
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
    return OK, u, uk[:u], ug[:u], us[:u], uc[:u], usl[:u]


@njit(nogil=True, cache=True)
def _push_kernel(  # noqa: PLR0917 - kernels take their arrays positionally
    arr_slots: npt.NDArray[np.int32],
    arr_keys: npt.NDArray[np.uint64],
    meta: npt.NDArray[np.int64],
    slab: npt.NDArray[np.float32],
    slab_u32: npt.NDArray[np.uint32],
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
) -> None:
    dim = ip[IP_DIM]
    kind = ip[IP_KIND]
    xw = ip[IP_XW]
    xs = ip[IP_XS]
    xflag = ip[IP_XFLAG]
    threshold = ap[AP_EMBEDX_THRESHOLD]
    admitted = 0
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
        key = keys[i]
        row, created = ix.find_or_insert_at(arr_slots, arr_keys, meta, key, homes[i])
        if created:  # the row is all zeros: embed part, then mark embedx "not admitted"
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
    meta[EXPANDED] += admitted
    meta[ADMISSIONS] += admitted


@njit(nogil=True, cache=True)
def _pull_kernel(  # noqa: PLR0917 - kernels take their arrays positionally
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
def _shrink_kernel(  # noqa: PLR0917 - kernels take their arrays positionally
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
def _group_rows(  # noqa: PLR0917 - kernels take their arrays positionally
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
def _gather(
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
def _after_save(
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


class SparseTable:
    """One table: values of the keys a shard owns, updated by the table's optimizer."""

    def __init__(self, config: TableConfig, seed: int = 0, capacity: int = 0) -> None:
        self.config = config
        self.name = config.name
        self.layout = RowLayout.of(config)
        self.lock = TableLock()
        opt = config.optimizer
        self._fp = params_vector(
            opt.learningRate,
            opt.initialG2sum,
            opt.initialRange,
            opt.weightBounds,
            opt.beta1,
            opt.beta2,
            opt.epsilon,
        )
        self._ap = accessor_params(config)
        lay = self.layout
        self._ip = np.array(
            [lay.embedx_dim, lay.kind, lay.embedx_w, lay.embedx_state, lay.xflag], dtype=np.int64
        )
        self._seed = table_seed(seed, config.name)
        self._meta = ix.new_meta()
        self._arrays = _empty_arrays(capacity, lay.width)
        self._tombstones: list[npt.NDArray[np.uint64]] = []

    # -- hot paths ------------------------------------------------------------------------

    def pull(self, keys: npt.NDArray[np.uint64]) -> npt.NDArray[np.float32]:
        out = np.empty((keys.size, self.layout.pull_dim), dtype=np.float32)
        with self.lock.read():
            a = self._arrays
            _pull_kernel(a.slots, a.keys, a.slab, keys, out, self.layout.embedx_w)
        return out

    def rows_of(self, keys: npt.NDArray[np.uint64]) -> npt.NDArray[np.int64]:
        """Row id of each key (-1 if absent); for tools and tests that read full rows."""
        out = np.empty(keys.size, dtype=np.int64)
        with self.lock.read():
            a = self._arrays
            ix.lookup_many(a.slots, a.keys, keys, out)
        return out

    def push_merged(
        self,
        keys: npt.NDArray[np.uint64],
        grads: npt.NDArray[np.float32],
        shows: npt.NDArray[np.float32],
        clicks: npt.NDArray[np.float32],
        slots: npt.NDArray[np.uint32] | None,
    ) -> None:
        """Apply a push whose keys are unique (see ``merge_push``)."""
        slot_arr = slots if slots is not None else np.empty(0, dtype=np.uint32)
        with self.lock.write():
            a = self._reserve(keys.size)
            _push_kernel(
                a.slots,
                a.keys,
                self._meta,
                a.slab,
                a.slab.view(np.uint32),
                keys,
                grads,
                shows,
                clicks,
                slot_arr,
                slots is not None,
                self._ip,
                self._ap,
                self._fp,
                self._seed,
            )

    def _reserve(self, extra: int) -> _Arrays:
        """Arrays with room for ``extra`` new keys; call with the writer lock held."""
        a = self._arrays
        count = int(self._meta[ix.COUNT])
        high = int(self._meta[ix.NEXT_ROW])
        need_rows = high + max(0, extra - int(self._meta[ix.FREE_LEN]))
        slots = ix.grown_slots(a.slots, a.keys, count + extra)
        keys = ix.grown_rows(a.keys, high, need_rows)
        slab = ix.grown_rows(a.slab, high, need_rows)
        if slots is not a.slots or keys is not a.keys or slab is not a.slab:
            a = _Arrays(slots, keys, slab)
            self._arrays = a
        return a

    # -- maintenance ----------------------------------------------------------------------

    def shrink(self) -> tuple[int, int]:
        """Decay and delete (§4); deleted keys become tombstones. Returns (before, deleted)."""
        with self.lock.maintenance, self.lock.exclusive():
            a = self._arrays
            before = int(self._meta[ix.COUNT])
            deleted = np.empty(before, dtype=np.uint64)
            nd = int(
                _shrink_kernel(
                    a.slots, a.keys, self._meta, a.slab, self._ap, self.layout.xflag, deleted
                )
            )
            if nd:
                self._tombstones.append(deleted[:nd].copy())
        return before, nd

    def rows_by_logical_shard(
        self, logical_shards: int
    ) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
        """(rows, offsets): live rows grouped by logical shard. Hold ``lock.maintenance``."""
        with self.lock.write():
            a = self._arrays
            count = int(self._meta[ix.COUNT])
            rows = np.empty(count, dtype=np.int64)
            offsets = np.zeros(logical_shards + 1, dtype=np.int64)
            _group_rows(a.slots, a.keys, count, logical_shards, rows, offsets)
        return rows, offsets

    def copy_rows(
        self, rows: npt.NDArray[np.int64]
    ) -> tuple[npt.NDArray[np.uint64], npt.NDArray[np.float32]]:
        """Keys and full rows of ``rows``, copied under the writer lock (a consistent view)."""
        keys = np.empty(rows.size, dtype=np.uint64)
        values = np.empty((rows.size, self.layout.width), dtype=np.float32)
        with self.lock.write():
            a = self._arrays
            _gather(a.keys, a.slab, rows, keys, values)
        return keys, values

    def after_save(
        self, rows: npt.NDArray[np.int64], saved_delta: npt.NDArray[np.float32], unseen_inc: bool
    ) -> None:
        with self.lock.write():
            _after_save(self._arrays.slab, rows, saved_delta, unseen_inc)

    def tombstones(self) -> npt.NDArray[np.uint64]:
        """Keys deleted since tombstones were last cleared (unique, sorted)."""
        if not self._tombstones:
            return np.empty(0, dtype=np.uint64)
        return np.unique(np.concatenate(self._tombstones))

    def clear_tombstones(self) -> None:
        self._tombstones = []

    def replace(
        self,
        keys: npt.NDArray[np.uint64],
        rows: npt.NDArray[np.float32],
        tombstones: npt.NDArray[np.uint64],
    ) -> None:
        """Swap in a whole new content (load). Built outside the lock, swapped exclusively."""
        lay = self.layout
        meta = ix.new_meta()
        a = _empty_arrays(keys.size, lay.width)
        out = np.empty(keys.size, dtype=np.int64)
        created = np.zeros(keys.size, dtype=np.bool_)
        ix.insert_many(a.slots, a.keys, meta, keys, out, created)
        if not created.all():
            raise ValueError("duplicate keys")
        a.slab[out] = rows
        meta[EXPANDED] = int(np.count_nonzero(rows[:, lay.xflag] >= 0))
        with self.lock.exclusive():
            meta[ADMISSIONS] = self._meta[ADMISSIONS]
            meta[EVICTIONS] = self._meta[EVICTIONS]
            self._meta = meta
            self._arrays = a
            self._tombstones = [tombstones.copy()] if tombstones.size else []

    # -- introspection --------------------------------------------------------------------

    def __len__(self) -> int:
        return int(self._meta[ix.COUNT])

    @property
    def expanded_keys(self) -> int:
        return int(self._meta[EXPANDED])

    @property
    def admissions_total(self) -> int:
        return int(self._meta[ADMISSIONS])

    @property
    def evictions_total(self) -> int:
        return int(self._meta[EVICTIONS])

    def memory_bytes(self) -> int:
        """Bytes in use: the slot array plus key and row storage up to the high-water mark
        (capacity beyond it is reserved address space that was never touched)."""
        a = self._arrays
        high = int(self._meta[ix.NEXT_ROW])
        return int(a.slots.nbytes + high * (a.keys.itemsize + a.slab.shape[1] * 4))


def table_seed(seed: int, name: str) -> np.uint64:
    """Per-table init seed: FNV-1a of the name mixed with the configured seed."""
    h = 0xCBF29CE484222325
    for byte in name.encode():
        h = ((h ^ byte) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return np.uint64(h ^ ((seed * 0x9E3779B97F4A7C15) & 0xFFFFFFFFFFFFFFFF))


def _empty_arrays(capacity: int, width: int) -> _Arrays:
    rows = max(capacity, 1024)
    return _Arrays(
        np.full(ix.needed_capacity(capacity), ix.EMPTY, dtype=np.int32),
        ix.zeros_aligned((rows,), np.uint64),
        ix.zeros_aligned((rows, width), np.float32),
    )
