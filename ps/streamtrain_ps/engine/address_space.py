"""Row arrays that grow in place: rows reserved as address space, committed when written.

A table's key column and slabs grow with their key count. Growing by copying into a larger
array holds the old and the new copy at once: for a moment the table needs its size again
(a 10M-key table peaked at 1.37x its steady memory). Instead each of these arrays is a view
of an anonymous ``mmap`` reserved far beyond its rows (``MAP_NORESERVE``: no memory is
committed for it; the kernel backs a page when it is first written, like any untouched
``np.zeros`` page). Growing is a longer view of the same mapping: nothing is copied, and
readers holding the shorter view keep reading the same memory.

Like numpy's own large arrays, a reservation asks for transparent huge pages: slabs are read
at random, and with 4 KiB pages a 10M-key table's pulls, pushes and shrinks ran 2-10x slower
(TLB misses).

Where the reservation is refused (strict overcommit, an address-space limit) or used up,
``grown`` falls back to a copy into a fresh reservation (``np.zeros`` when even that fails).
"""

from __future__ import annotations

import contextlib
import mmap
from typing import Any

import numpy as np
import numpy.typing as npt

#: Rows an array reserves beyond its first capacity at least (virtual only).
RESERVE_ROWS = 1 << 27
#: A transparent huge page (x86-64); releases start at such a boundary.
HUGE_PAGE = 2 << 20
#: Linux's MAP_NORESERVE (the ``mmap`` module does not export it).
MAP_NORESERVE = 0x4000


def reserved_zeros(
    rows: int, row_shape: tuple[int, ...], dtype: npt.DTypeLike, reserve: int = 0
) -> npt.NDArray[Any]:
    """A zeroed ``(rows, *row_shape)`` array in a mapping with room for ``max(reserve,
    RESERVE_ROWS, rows)`` rows; an ordinary ``np.zeros`` array if the mapping is refused."""
    dt = np.dtype(dtype)
    per_row = dt.itemsize * int(np.prod(row_shape, dtype=np.int64))
    room = max(reserve, RESERVE_ROWS, rows)
    try:
        flags = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | MAP_NORESERVE
        buf = mmap.mmap(-1, max(room * per_row, 1), flags=flags)
    except (OSError, OverflowError, ValueError):
        return np.zeros((rows, *row_shape), dtype=dt)
    with contextlib.suppress(AttributeError, OSError):  # not Linux, or THP disabled
        buf.madvise(mmap.MADV_HUGEPAGE)
    return _view(buf, rows, row_shape, dt)


def mapped_zeros(nbytes: int) -> npt.NDArray[np.uint8]:
    """``nbytes`` zeroed bytes in an anonymous mapping of their own (page-aligned, asking
    for transparent huge pages), unmapped when the array is freed; ``np.zeros`` if the
    mapping is refused.

    For a table's arrays that are replaced whole (the slot array at each rehash): through
    ``malloc`` an array below glibc's *dynamic* mmap threshold (raised up to 32 MiB by
    every large block freed) comes from the heap of the thread that asked, and an RPC
    thread's heap keeps its freed top resident (``malloc_trim`` releases the top of the
    main heap only): measured, a shard process grown to 10M keys over gRPC held ~28 MiB
    more than its table in its threads' heaps (docs/benchmarks.md, issue 12).
    """
    try:
        buf = mmap.mmap(-1, max(nbytes, 1), flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    except (OSError, OverflowError, ValueError):
        return np.zeros(nbytes, dtype=np.uint8)
    with contextlib.suppress(AttributeError, OSError):  # not Linux, or THP disabled
        buf.madvise(mmap.MADV_HUGEPAGE)
    return np.frombuffer(buf, dtype=np.uint8, count=nbytes)


def grown(arr: npt.NDArray[Any], used: int, rows: int) -> npt.NDArray[Any]:
    """``arr`` with ``rows`` rows (more than it has), keeping rows ``:used``: a longer view
    of its mapping when it has room, else a copy into a new reservation."""
    buf = _mapping(arr)
    row_shape = arr.shape[1:]
    if buf is not None:
        per_row = arr.dtype.itemsize * int(np.prod(row_shape, dtype=np.int64))
        if rows * per_row <= len(buf):
            return _view(buf, rows, row_shape, arr.dtype)
    new = reserved_zeros(rows, row_shape, arr.dtype, reserve=4 * rows)
    new[:used] = arr[:used]
    return new


def _view(buf: mmap.mmap, rows: int, row_shape: tuple[int, ...], dt: np.dtype[Any]) -> Any:
    count = rows * int(np.prod(row_shape, dtype=np.int64))
    return np.frombuffer(buf, dtype=dt, count=count).reshape((rows, *row_shape))


def _mapping(arr: npt.NDArray[Any]) -> mmap.mmap | None:
    """The reservation ``arr`` is the start of (made by this module), or None."""
    base: Any = arr
    while isinstance(base, np.ndarray):
        base = base.base
    if isinstance(base, memoryview):  # np.frombuffer's base
        base = base.obj
    if not isinstance(base, mmap.mmap) or not arr.flags.c_contiguous:
        return None
    start = np.frombuffer(base, dtype=np.uint8, count=1).ctypes.data
    return base if arr.ctypes.data == start else None


def release_rows(arr: npt.NDArray[Any], start: int, end: int) -> None:
    """Give rows ``start:end`` of ``arr`` back to the OS, leaving them zeroed: the pages
    among them from the first huge-page boundary on are dropped (``MADV_DONTNEED``: they
    read as zeros and cost nothing until written again; starting at a boundary leaves the
    huge pages below intact), the bytes before it are zeroed. An array that is not a
    reservation of this module is zeroed in place."""
    if end <= start:
        return
    buf = _mapping(arr)
    if buf is None:
        arr[start:end] = 0
        return
    row_bytes = arr.dtype.itemsize * int(np.prod(arr.shape[1:], dtype=np.int64))
    lo, hi = start * row_bytes, end * row_bytes
    flat = np.frombuffer(buf, dtype=np.uint8, count=hi)
    base = flat.ctypes.data  # huge pages lie on boundaries of the address, not the offset
    first = -(-(base + lo) // HUGE_PAGE) * HUGE_PAGE - base
    last = (base + hi) // mmap.PAGESIZE * mmap.PAGESIZE - base
    if last <= first:
        flat[lo:hi] = 0
        return
    flat[lo:first] = 0
    flat[last:hi] = 0
    buf.madvise(mmap.MADV_DONTNEED, first, last - first)
