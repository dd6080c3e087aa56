"""The packed word of a compact row: slot id, unseen_days and the embedx pointer in 4 bytes.

A primary row ends in one uint32 word ``W`` (its last column):

- bit 31 clear (the key's embedx is not admitted): ``W`` *is* the packed word ``P`` =
  ``slot code << 16 | unseen_days``;
- bit 31 set (admitted): the low 31 bits are the key's row in the embedx slab, and ``P``
  moved to that row's last column at admission.

So a never-admitted key pays 4 bytes for all three fields, and an admitted one 8. Why this
works without changing any rule:

- ``unseen_days`` only ever counts whole saves up from 0 (``+= 1`` per batch save, ``= 0``
  on a push) and is compared with ``deleteAfterUnseenDays`` and ``deltaKeepDays``; a
  uint16 holds 65,535 days (179 years of daily saves). It saturates there, which changes
  no comparison with a threshold below it (a larger threshold never fires at all).
- the slot id is a uint32 on the wire, but a table sees few distinct values (one per
  feature slot): each gets a 15-bit *code* from the table's slot dictionary (``slot_ids``:
  code -> id; ``slot_map``: an open-addressing map id -> code). Code 0 is slot id 0 (what a
  push without slots stores), so a zeroed row means "slot 0, unseen 0, not admitted".

Everything here is an inline nogil kernel helper; callers hold the table's locks.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
from numba import njit

from streamtrain_ps.engine.index import Int

ADMITTED = np.uint32(1 << 31)
XROW_MASK = np.uint32((1 << 31) - 1)
UNSEEN_MAX = 0xFFFF
#: Distinct slot ids a table can hold (codes 0 .. SLOT_CODES - 1; 0 is slot id 0).
SLOT_CODES = 1 << 15
#: Size of the id -> code map (load <= 0.5).
SLOT_MAP_SIZE = 2 * SLOT_CODES
_S16 = np.uint32(16)
_LOW16 = np.uint32(0xFFFF)
_GOLDEN32 = np.uint32(0x9E3779B1)


@njit(nogil=True, cache=True, inline="always")
def xrow_of(slab_u32: npt.NDArray[np.uint32], r: Int) -> Int:
    """Embedx row of primary row ``r``, or -1 when not admitted."""
    w = slab_u32[r, slab_u32.shape[1] - 1]
    if w & ADMITTED:
        return np.int64(w & XROW_MASK)
    return np.int64(-1)


@njit(nogil=True, cache=True, inline="always")
def word_of(
    slab_u32: npt.NDArray[np.uint32], xslab_u32: npt.NDArray[np.uint32], r: Int
) -> np.uint32:
    """The packed word ``P`` (slot code, unseen_days) of primary row ``r``."""
    w = slab_u32[r, slab_u32.shape[1] - 1]
    if w & ADMITTED:
        return xslab_u32[np.int64(w & XROW_MASK), xslab_u32.shape[1] - 1]
    return w


@njit(nogil=True, cache=True, inline="always")
def set_word(
    slab_u32: npt.NDArray[np.uint32], xslab_u32: npt.NDArray[np.uint32], r: Int, p: np.uint32
) -> None:
    """Store the packed word ``P`` of primary row ``r`` wherever it lives."""
    last = slab_u32.shape[1] - 1
    w = slab_u32[r, last]
    if w & ADMITTED:
        xslab_u32[np.int64(w & XROW_MASK), xslab_u32.shape[1] - 1] = p
    else:
        slab_u32[r, last] = p


@njit(nogil=True, cache=True, inline="always")
def pack(code: Int, unseen: Int) -> np.uint32:
    return np.uint32((np.uint32(code) << _S16) | np.uint32(min(unseen, UNSEEN_MAX)))


@njit(nogil=True, cache=True, inline="always")
def unseen_of(p: np.uint32) -> np.float32:
    """unseen_days as the float32 the full row (and every rule) uses."""
    return np.float32(p & _LOW16)


@njit(nogil=True, cache=True, inline="always")
def code_of(p: np.uint32) -> Int:
    return np.int64(p >> _S16)


@njit(nogil=True, cache=True, inline="always")
def admit(
    slab_u32: npt.NDArray[np.uint32], xslab_u32: npt.NDArray[np.uint32], r: Int, xr: Int
) -> None:
    """Point primary row ``r`` at embedx row ``xr``: ``P`` moves there first, the pointer is
    published last (a concurrent pull sees the key either before or after)."""
    last = slab_u32.shape[1] - 1
    xslab_u32[xr, xslab_u32.shape[1] - 1] = slab_u32[r, last]
    slab_u32[r, last] = ADMITTED | np.uint32(xr)


@njit(nogil=True, cache=True, inline="always")
def slot_code(
    slot_map: npt.NDArray[np.int32],
    slot_ids: npt.NDArray[np.uint32],
    meta: npt.NDArray[np.int64],
    used: Int,
    slot: np.uint32,
) -> Int:
    """Code of ``slot``, adding it to the dictionary if new (``meta[used]`` counts codes
    beyond 0); -1 when all ``SLOT_CODES`` are taken."""
    if slot == 0:
        return np.int64(0)
    mask = slot_map.size - 1
    i = np.int64((np.uint32(slot) * _GOLDEN32) >> _S16) & mask
    while True:
        c = slot_map[i]
        if c == 0:
            break
        if slot_ids[c] == slot:
            return np.int64(c)
        i = (i + 1) & mask
    code = meta[used] + 1
    if code >= SLOT_CODES:
        return np.int64(-1)
    slot_ids[code] = slot
    slot_map[i] = np.int32(code)
    meta[used] += 1
    return np.int64(code)


@njit(nogil=True, cache=True)
def slot_codes(
    slot_map: npt.NDArray[np.int32],
    slot_ids: npt.NDArray[np.uint32],
    meta: npt.NDArray[np.int64],
    used: Int,
    slots: npt.NDArray[np.uint32],
    out: npt.NDArray[np.uint32],
) -> Int:
    """Codes of ``slots`` into ``out``; returns the index of the first slot id that found
    the dictionary full, or -1."""
    for i in range(slots.size):
        c = slot_code(slot_map, slot_ids, meta, used, slots[i])
        if c < 0:
            return np.int64(i)
        out[i] = np.uint32(c)
    return np.int64(-1)


def new_slot_dictionary() -> tuple[npt.NDArray[np.int32], npt.NDArray[np.uint32]]:
    """An empty (slot_map, slot_ids) pair: only slot id 0 (code 0) is known."""
    return np.zeros(SLOT_MAP_SIZE, dtype=np.int32), np.zeros(SLOT_CODES, dtype=np.uint32)
