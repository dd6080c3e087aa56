"""A vectorised uint64 key -> row hash index: the only way a shard finds a key's row.

Layout (what makes it cheap, ~13-16 bytes per key including the key itself):

- ``keys``: one ``uint64`` per *row*, the key stored in that row. Rows are handed out in
  order (``meta[NEXT_ROW]`` is the high-water mark) and reused after deletion through an
  intrusive free list threaded through ``keys`` of the free rows, so the free list costs
  no memory of its own.
- ``slots``: an open-addressing array of ``int32`` row ids (``-1`` = empty), a power of two
  kept at load factor <= 0.75 (see ``needed_capacity``). Linear probing; deletion by backward
  shift, so there are no tombstone slots and probe lengths never degrade.
- ``meta``: the mutable scalars (count, high-water mark, free-list head and length, plus the
  counters the table keeps) in one small ``int64`` array so nogil kernels can update them.

The home slot comes from the *high* half of the splitmix64 mix of the key: the logical shard
of a key is ``mix64(key) % logicalShards``, so on one server all keys share the low bits of
the mix whenever the shard counts are powers of two; using those bits would cluster.

Every kernel is ``@njit(nogil=True, cache=True)``: the caller releases the GIL for the whole
batch. These functions do no locking; ``streamtrain_ps.engine.table`` decides who may call what
concurrently (readers only ever *probe*; a probe racing an insert sees the key or not, and
a probe never follows a row id beyond the arrays it was handed).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeAlias, cast

import numpy as np
import numpy.typing as npt
from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic

from streamtrain_ps.engine import address_space

#: Scalar types of kernel arguments: numba passes numpy scalars, Python passes ints.
Int: TypeAlias = int | np.integer[Any]
Float: TypeAlias = float | np.floating[Any]

EMPTY = -1

# meta[] slots. The table keeps its own counters after these (see table.py).
COUNT = 0
NEXT_ROW = 1
FREE_HEAD = 2
FREE_LEN = 3
META_SIZE = 8

MAX_LOAD = 0.75
MIN_SLOTS = 16

_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
_S30 = np.uint64(30)
_S27 = np.uint64(27)
_S31 = np.uint64(31)
_S32 = np.uint64(32)


#: How many keys ahead the batch kernels prefetch (slots at 2x, keys/rows at 1x).
PREFETCH = 16


@intrinsic
def _prefetch(typingctx: Any, arr: Any, idx: Any) -> Any:
    """Hint the CPU to fetch ``arr[idx]`` (1-D) or row ``arr[idx, 0]`` (2-D) into cache.

    Batch kernels look keys up ``PREFETCH`` positions ahead so the random memory accesses
    of many keys overlap instead of stalling one after another (about 2-3x on a table much
    larger than the caches). A hint only: it never faults and changes no value.
    """
    if not isinstance(arr, types.Array) or not isinstance(idx, types.Integer):
        return None
    sig = types.void(arr, idx)

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        aryty = signature.args[0]
        ary = context.make_array(aryty)(context, builder, args[0])
        zero = ir.Constant(ir.IntType(64), 0)
        first = context.cast(builder, args[1], signature.args[1], types.intp)
        index = [first] + [zero] * (aryty.ndim - 1)
        ptr = cgutils.get_item_pointer(context, builder, aryty, ary, index, wraparound=False)
        i8p = ir.IntType(8).as_pointer()
        i32 = ir.IntType(32)
        fnty = ir.FunctionType(ir.VoidType(), [i8p, i32, i32, i32])
        fn = cgutils.get_or_insert_function(builder.module, fnty, "llvm.prefetch.p0")
        # read access, high temporal locality, data cache
        builder.call(fn, [builder.bitcast(ptr, i8p), i32(0), i32(3), i32(1)])
        return context.get_dummy_value()

    return sig, codegen


#: ``prefetch(arr, i)`` inside kernels (typed for mypy; numba sees the intrinsic).
prefetch = cast(Callable[[Any, Any], None], _prefetch)


@njit(nogil=True, cache=True, inline="always")
def mix64(key: np.uint64) -> np.uint64:
    """splitmix64 finaliser (same as ``streamtrain_ps.sharding.mix64``, one key)."""
    z = key
    z = (z ^ (z >> _S30)) * _M1
    z = (z ^ (z >> _S27)) * _M2
    return z ^ (z >> _S31)


@njit(nogil=True, cache=True, inline="always")
def home(key: np.uint64, mask: Int) -> Int:
    """Home slot of ``key`` in a table of ``mask + 1`` slots (high half of the mix)."""
    return np.int64(mix64(key) >> _S32) & mask


@njit(nogil=True, cache=True, inline="always")
def find(slots: npt.NDArray[np.int32], keys: npt.NDArray[np.uint64], key: np.uint64) -> Int:
    """Row of ``key`` or -1."""
    return find_at(slots, keys, key, home(key, np.int64(slots.size - 1)))


@njit(nogil=True, cache=True, inline="always")
def find_at(
    slots: npt.NDArray[np.int32], keys: npt.NDArray[np.uint64], key: np.uint64, start: Int
) -> Int:
    """Row of ``key`` or -1, probing from its home slot ``start``."""
    mask = np.int64(slots.size - 1)
    i = start
    while True:
        r = slots[i]
        if r < 0:
            return -1
        if keys[r] == key:
            return np.int64(r)
        i = (i + 1) & mask


@njit(nogil=True, cache=True, inline="always")
def find_or_insert(
    slots: npt.NDArray[np.int32],
    keys: npt.NDArray[np.uint64],
    meta: npt.NDArray[np.int64],
    key: np.uint64,
) -> tuple[Int, bool]:
    """Row of ``key``, creating it if absent; the caller guarantees room (``reserve``).

    The new row's key is written before the slot is published, so a concurrent probe either
    misses the key or finds a row that already carries it.
    """
    return find_or_insert_at(slots, keys, meta, key, home(key, np.int64(slots.size - 1)))


@njit(nogil=True, cache=True, inline="always")
def find_or_insert_at(
    slots: npt.NDArray[np.int32],
    keys: npt.NDArray[np.uint64],
    meta: npt.NDArray[np.int64],
    key: np.uint64,
    start: Int,
) -> tuple[Int, bool]:
    """``find_or_insert`` probing from the home slot ``start``."""
    mask = np.int64(slots.size - 1)
    i = start
    while True:
        r = slots[i]
        if r < 0:
            break
        if keys[r] == key:
            return np.int64(r), False
        i = (i + 1) & mask
    if meta[FREE_LEN] > 0:
        row = meta[FREE_HEAD]
        meta[FREE_HEAD] = np.int64(keys[row]) - 1
        meta[FREE_LEN] -= 1
    else:
        row = meta[NEXT_ROW]
        meta[NEXT_ROW] += 1
    keys[row] = key
    slots[i] = np.int32(row)
    meta[COUNT] += 1
    return np.int64(row), True


@njit(nogil=True, cache=True, inline="always")
def remove(
    slots: npt.NDArray[np.int32],
    keys: npt.NDArray[np.uint64],
    meta: npt.NDArray[np.int64],
    key: np.uint64,
) -> Int:
    """Delete ``key``; returns its (now free) row or -1. Backward-shift deletion."""
    mask = np.int64(slots.size - 1)
    i = home(key, mask)
    while True:
        r = slots[i]
        if r < 0:
            return -1
        if keys[r] == key:
            break
        i = (i + 1) & mask
    row = np.int64(slots[i])
    j = i
    while True:
        j = (j + 1) & mask
        rj = slots[j]
        if rj < 0:
            break
        h = home(keys[rj], mask)
        # The entry at j may move into the hole at i unless its home lies in (i, j].
        stays = (i < h <= j) if i <= j else (h > i or h <= j)
        if not stays:
            slots[i] = rj
            i = j
    slots[i] = EMPTY
    # Push the row on the intrusive free list: keys[row] = next free row + 1 (0 = none).
    keys[row] = np.uint64(meta[FREE_HEAD] + 1) if meta[FREE_LEN] > 0 else np.uint64(0)
    meta[FREE_HEAD] = row
    meta[FREE_LEN] += 1
    meta[COUNT] -= 1
    return row


@njit(nogil=True, cache=True)
def lookup_many(
    slots: npt.NDArray[np.int32],
    keys: npt.NDArray[np.uint64],
    query: npt.NDArray[np.uint64],
    out: npt.NDArray[np.int64],
) -> None:
    homes = homes_of(slots, query)
    n = query.size
    for i in range(n):
        # Inline on purpose: a helper taking arrays costs ~15 ns a call in numba.
        if i + 2 * PREFETCH < n:
            prefetch(slots, homes[i + 2 * PREFETCH])
        if i + PREFETCH < n:
            r = slots[homes[i + PREFETCH]]
            if r >= 0:
                prefetch(keys, r)
        out[i] = find_at(slots, keys, query[i], homes[i])


@njit(nogil=True, cache=True)
def count_missing(
    slots: npt.NDArray[np.int32], keys: npt.NDArray[np.uint64], query: npt.NDArray[np.uint64]
) -> Int:
    """How many of the (distinct) ``query`` keys are absent: the room a push really needs."""
    homes = homes_of(slots, query)
    n = query.size
    missing = 0
    for i in range(n):
        if i + 2 * PREFETCH < n:  # see lookup_many
            prefetch(slots, homes[i + 2 * PREFETCH])
        if i + PREFETCH < n:
            r = slots[homes[i + PREFETCH]]
            if r >= 0:
                prefetch(keys, r)
        if find_at(slots, keys, query[i], homes[i]) < 0:
            missing += 1
    return missing


@njit(nogil=True, cache=True)
def homes_of(slots: npt.NDArray[np.int32], query: npt.NDArray[np.uint64]) -> npt.NDArray[np.int64]:
    """Home slot of every query key (a cheap sequential pass before the random ones)."""
    mask = np.int64(slots.size - 1)
    homes = np.empty(query.size, dtype=np.int64)
    for i in range(query.size):
        homes[i] = home(query[i], mask)
    return homes


@njit(nogil=True, cache=True)
def insert_many(
    slots: npt.NDArray[np.int32],
    keys: npt.NDArray[np.uint64],
    meta: npt.NDArray[np.int64],
    query: npt.NDArray[np.uint64],
    out: npt.NDArray[np.int64],
    created: npt.NDArray[np.bool_],
) -> None:
    homes = homes_of(slots, query)
    n = query.size
    for i in range(n):
        if i + 2 * PREFETCH < n:  # see lookup_many
            prefetch(slots, homes[i + 2 * PREFETCH])
        if i + PREFETCH < n:
            r = slots[homes[i + PREFETCH]]
            if r >= 0:
                prefetch(keys, r)
        out[i], created[i] = find_or_insert_at(slots, keys, meta, query[i], homes[i])


@njit(nogil=True, cache=True)
def take_rows(
    keys: npt.NDArray[np.uint64],
    meta: npt.NDArray[np.int64],
    query: npt.NDArray[np.uint64],
    out: npt.NDArray[np.int64],
) -> None:
    """Rows for ``query`` (distinct keys absent from the index; room reserved), a freed one
    first, each holding its key but *not yet in ``slots``*: no reader finds them until
    ``publish_rows``. Lets a writer fill a row before readers can see it (a promotion:
    ``insert_many`` would publish an all-zero row)."""
    for i in range(query.size):
        if meta[FREE_LEN] > 0:
            row = meta[FREE_HEAD]
            meta[FREE_HEAD] = np.int64(keys[row]) - 1
            meta[FREE_LEN] -= 1
        else:
            row = meta[NEXT_ROW]
            meta[NEXT_ROW] += 1
        keys[row] = query[i]
        out[i] = row


@njit(nogil=True, cache=True)
def publish_rows(
    slots: npt.NDArray[np.int32],
    keys: npt.NDArray[np.uint64],
    meta: npt.NDArray[np.int64],
    rows: npt.NDArray[np.int64],
) -> None:
    """Put rows from ``take_rows`` (their keys absent from the index) into ``slots``: each
    one slot write, so a reader sees the key absent or its finished row."""
    mask = np.int64(slots.size - 1)
    for t in range(rows.size):
        i = home(keys[rows[t]], mask)
        while slots[i] >= 0:
            i = (i + 1) & mask
        slots[i] = np.int32(rows[t])
        meta[COUNT] += 1


@njit(nogil=True, cache=True)
def remove_many(
    slots: npt.NDArray[np.int32],
    keys: npt.NDArray[np.uint64],
    meta: npt.NDArray[np.int64],
    query: npt.NDArray[np.uint64],
    out: npt.NDArray[np.int64],
) -> None:
    for i in range(query.size):
        out[i] = remove(slots, keys, meta, query[i])


@njit(nogil=True, cache=True)
def rehash(
    old_slots: npt.NDArray[np.int32],
    keys: npt.NDArray[np.uint64],
    new_slots: npt.NDArray[np.int32],
) -> None:
    """Re-insert every row of ``old_slots`` into the (empty) ``new_slots``."""
    mask = np.int64(new_slots.size - 1)
    for s in range(old_slots.size):
        r = old_slots[s]
        if r < 0:
            continue
        i = home(keys[r], mask)
        while new_slots[i] >= 0:
            i = (i + 1) & mask
        new_slots[i] = r


@njit(nogil=True, cache=True)
def live_rows(slots: npt.NDArray[np.int32], out: npt.NDArray[np.int64]) -> Int:
    """Write the row ids of all live keys (in slot order) to ``out``; returns how many."""
    n = 0
    for s in range(slots.size):
        r = slots[s]
        if r >= 0:
            out[n] = r
            n += 1
    return n


def needed_capacity(count: int) -> int:
    """Smallest power-of-two slot count that holds ``count`` keys at load <= MAX_LOAD."""
    cap = MIN_SLOTS
    while count > cap * MAX_LOAD:
        cap *= 2
    return cap


def new_meta(size: int = META_SIZE) -> npt.NDArray[np.int64]:
    """The index's scalars, plus room for ``size - META_SIZE`` counters of the caller."""
    return np.zeros(max(size, META_SIZE), dtype=np.int64)


def grown_slots(
    slots: npt.NDArray[np.int32], keys: npt.NDArray[np.uint64], count: int
) -> npt.NDArray[np.int32]:
    """``slots`` itself if it holds ``count`` keys at load <= 0.75, else a rehashed copy."""
    cap = needed_capacity(count)
    if cap <= slots.size:
        return slots
    new = full_aligned(cap, EMPTY, np.int32)
    rehash(slots, keys, new)
    return new


def grown_rows(arr: npt.NDArray[Any], used: int, need: int) -> npt.NDArray[Any]:
    """``arr`` if it has ``need`` rows, else one with geometric (x1.5) growth keeping rows
    ``:used``: in place when ``arr`` is a reservation (``address_space``), else a copy.

    Rows beyond ``used`` are untouched (not resident) pages until first written, and fresh
    rows start zeroed.
    """
    if need <= arr.shape[0]:
        return arr
    return address_space.grown(arr, used, max(need, int(arr.shape[0] * 1.5), 1024))


def full_aligned(n: int, value: int, dtype: npt.DTypeLike) -> npt.NDArray[Any]:
    """``np.full`` through ``zeros_aligned`` (large ``np.zeros`` get transparent huge pages,
    which matters for the randomly probed slot array: fewer TLB misses)."""
    arr = zeros_aligned((n,), dtype)
    arr.fill(value)
    return arr


#: Aligned arrays from this size up get a mapping of their own (``zeros_aligned``).
OWN_MAPPING_BYTES = 1 << 20


def zeros_aligned(
    shape: tuple[int, ...], dtype: npt.DTypeLike, align: int = 64
) -> npt.NDArray[Any]:
    """``np.zeros`` starting on a cache-line boundary, so a 64-byte row is one cache line;
    from ``OWN_MAPPING_BYTES`` up in a mapping of its own (``address_space.mapped_zeros``:
    page-aligned, and given back to the OS when freed, whichever thread frees it)."""
    dt = np.dtype(dtype)
    nbytes = int(np.prod(shape, dtype=np.int64)) * dt.itemsize
    if nbytes >= OWN_MAPPING_BYTES:
        return address_space.mapped_zeros(nbytes).view(dt).reshape(shape)
    buf = np.zeros(nbytes + align, dtype=np.uint8)
    off = (-buf.ctypes.data) % align
    return buf[off : off + nbytes].view(dt).reshape(shape)


class HashIndex:
    """A self-contained index (keys column + slots + free list) with a vectorised API.

    The sparse table embeds the same arrays in its own state so that index and value slabs
    are swapped together; this class is the standalone form used by tests and tools.
    Not thread-safe.
    """

    def __init__(self, capacity: int = 0) -> None:
        self.meta = new_meta()
        self.keys = np.zeros(max(capacity, 16), dtype=np.uint64)
        self.slots = np.full(needed_capacity(capacity), EMPTY, dtype=np.int32)

    def __len__(self) -> int:
        return int(self.meta[COUNT])

    @property
    def high_water(self) -> int:
        """Rows ever handed out (live + free); row ids are < this."""
        return int(self.meta[NEXT_ROW])

    @property
    def free_rows(self) -> int:
        return int(self.meta[FREE_LEN])

    def reserve(self, extra: int) -> None:
        """Make room for ``extra`` more keys without reallocation inside a kernel."""
        self.slots = grown_slots(self.slots, self.keys, len(self) + extra)
        need = self.high_water + max(0, extra - self.free_rows)
        self.keys = grown_rows(self.keys, self.high_water, need)

    def lookup(self, keys: npt.NDArray[np.uint64]) -> npt.NDArray[np.int64]:
        """Row of each key, -1 where absent."""
        q = np.ascontiguousarray(keys, dtype=np.uint64)
        out = np.empty(q.size, dtype=np.int64)
        lookup_many(self.slots, self.keys, q, out)
        return out

    def insert(
        self, keys: npt.NDArray[np.uint64]
    ) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.bool_]]:
        """Row of each key, creating absent ones; also which calls created the key."""
        q = np.ascontiguousarray(keys, dtype=np.uint64)
        self.reserve(q.size)
        out = np.empty(q.size, dtype=np.int64)
        created = np.zeros(q.size, dtype=np.bool_)
        insert_many(self.slots, self.keys, self.meta, q, out, created)
        return out, created

    def delete(self, keys: npt.NDArray[np.uint64]) -> npt.NDArray[np.int64]:
        """Delete keys; returns each key's freed row or -1 if it was absent."""
        q = np.ascontiguousarray(keys, dtype=np.uint64)
        out = np.empty(q.size, dtype=np.int64)
        remove_many(self.slots, self.keys, self.meta, q, out)
        return out

    def rows(self) -> npt.NDArray[np.int64]:
        """Row ids of all live keys."""
        out = np.empty(len(self), dtype=np.int64)
        n = live_rows(self.slots, out)
        return out[:n]

    def nbytes(self) -> int:
        return int(self.slots.nbytes + self.keys.nbytes + self.meta.nbytes)
