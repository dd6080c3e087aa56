"""The one feature-sign scheme every format uses: 64-bit sign of (slot index, token).

A token becomes a 64-bit *value* first, then the value is salted with its slot:

1. ``value``:
   - integer tokens the format already defines (PaddleRec feasigns, libSVM feature indices,
     Criteo/csv integer buckets, Avazu hour-of-day / weekday): the integer itself, as
     unsigned 64-bit (two's complement for negative buckets);
   - text tokens (Criteo C-columns, Avazu and csv categorical cells, an empty cell included):
     ``fmix64(fnv1a64(bytes) ^ len(bytes))`` over the raw UTF-8 bytes, where ``fnv1a64``
     starts at ``0xcbf29ce484222325`` and does ``h = (h ^ byte) * 0x100000001b3`` per byte.
     A quoted CSV cell hashes its unquoted content (``"a,b"`` is the token ``a,b``, and
     ``"abc"`` has the value of ``abc``; ``hash_unescaped`` undoes doubled quotes).
2. ``sign = fmix64(value ^ salt(slot))`` with
   ``salt(slot) = fmix64((slot + 1) * 0x9E3779B97F4A7C15)``.

``fmix64`` is MurmurHash3's 64-bit finalizer (``x ^= x >> 33; x *= 0xff51afd7ed558ccd;
x ^= x >> 33; x *= 0xc4ceb9fe1a85ec53; x ^= x >> 33``), a bijection: within one slot distinct
values never collide, and the same value in two slots gives unrelated signs. All arithmetic is
modulo 2**64, so signs are identical across processes, machines and Python versions (unlike
``hash()``). The slot is its *position* in the config's slot list: appending slots keeps old
signs valid, reordering them does not.

The numba functions are used inside the format kernels; ``token_value``/``feature_sign``/
``feature_signs`` are the same scheme for Python callers (tests, the synthetic generator).
Both steps of the sign are bijections, so ``feature_values`` inverts it: an integer token's
value comes back from its sign exactly (``data.ordinal`` reads ordinal slots that way).
"""

from __future__ import annotations

import numba
import numpy as np
import numpy.typing as npt

FNV_OFFSET = 0xCBF29CE484222325
FNV_PRIME = 0x100000001B3
GOLDEN = 0x9E3779B97F4A7C15
_M1 = 0xFF51AFD7ED558CCD
_M2 = 0xC4CEB9FE1A85EC53
_MASK = (1 << 64) - 1
#: Multiplicative inverses of ``_M1`` and ``_M2`` modulo 2**64 (``fmix64``'s inverse).
_M1_INV = pow(_M1, -1, 1 << 64)
_M2_INV = pow(_M2, -1, 1 << 64)


@numba.njit(inline="always", cache=True)
def fmix64(x: np.uint64) -> np.uint64:
    """MurmurHash3's 64-bit finalizer (a bijection on 64-bit integers)."""
    x ^= x >> np.uint64(33)
    x *= np.uint64(_M1)
    x ^= x >> np.uint64(33)
    x *= np.uint64(_M2)
    x ^= x >> np.uint64(33)
    return x


@numba.njit(inline="always", cache=True)
def hash_bytes(data: npt.NDArray[np.uint8], start: int, end: int) -> np.uint64:
    """``value`` of the text token ``data[start:end]`` (FNV-1a then fmix64 with the length)."""
    h = np.uint64(FNV_OFFSET)
    for i in range(start, end):
        h = (h ^ np.uint64(data[i])) * np.uint64(FNV_PRIME)
    return fmix64(h ^ np.uint64(end - start))


@numba.njit(inline="always", cache=True)
def hash_unescaped(data: npt.NDArray[np.uint8], start: int, end: int, quote: int) -> np.uint64:
    """``value`` of the content of a quoted CSV field whose raw bytes ``data[start:end]``
    contain doubled quotes (``""`` is one literal ``"``).

    It hashes the unescaped bytes without copying them, so the cell ``"a ""b"" c"`` gets
    exactly the value of the token ``a "b" c``: how a writer chose to quote a cell never
    changes its sign.
    """
    h = np.uint64(FNV_OFFSET)
    n = 0
    i = start
    while i < end:
        h = (h ^ np.uint64(data[i])) * np.uint64(FNV_PRIME)
        n += 1
        i += 2 if data[i] == quote else 1
    return fmix64(h ^ np.uint64(n))


@numba.njit(inline="always", cache=True)
def slot_salt(slot: int) -> np.uint64:
    """Per-slot salt ``fmix64((slot + 1) * GOLDEN)``."""
    return fmix64(np.uint64(slot + 1) * np.uint64(GOLDEN))


@numba.njit(inline="always", cache=True)
def sign_of(slot: int, value: np.uint64) -> np.uint64:
    """The feature sign of ``value`` in ``slot``."""
    return fmix64(value ^ slot_salt(slot))


@numba.njit(nogil=True, cache=True)
def _signs_kernel(
    slots: npt.NDArray[np.int64], values: npt.NDArray[np.uint64]
) -> npt.NDArray[np.uint64]:
    out = np.empty(values.shape[0], dtype=np.uint64)
    for i in range(values.shape[0]):
        out[i] = sign_of(slots[i], values[i])
    return out


def _fmix64_py(x: int) -> int:
    x ^= x >> 33
    x = (x * _M1) & _MASK
    x ^= x >> 33
    x = (x * _M2) & _MASK
    x ^= x >> 33
    return x


def token_value(token: bytes | str | int) -> int:
    """``value`` of a token: integers as unsigned 64-bit, text by the byte hash."""
    if isinstance(token, int):
        return token & _MASK
    raw = token.encode() if isinstance(token, str) else token
    h = FNV_OFFSET
    for byte in raw:
        h = ((h ^ byte) * FNV_PRIME) & _MASK
    return _fmix64_py(h ^ len(raw))


def feature_sign(slot: int, token: bytes | str | int) -> int:
    """The 64-bit sign of one token in ``slot`` (pure Python; for tests and tools)."""
    salt = _fmix64_py(((slot + 1) * GOLDEN) & _MASK)
    return _fmix64_py(token_value(token) ^ salt)


def feature_signs(
    slots: npt.NDArray[np.integer], values: npt.NDArray[np.integer]
) -> npt.NDArray[np.uint64]:
    """Vectorised signs of integer ``values`` (cast to uint64) in ``slots``."""
    slots64 = np.ascontiguousarray(slots, dtype=np.int64)
    values64 = np.ascontiguousarray(values).astype(np.uint64, copy=False)
    if slots64.shape != values64.shape:
        raise ValueError(f"slots {slots64.shape} and values {values64.shape} differ in shape")
    result: npt.NDArray[np.uint64] = _signs_kernel(slots64, values64)
    return result


def _unfmix64(x: npt.NDArray[np.uint64]) -> npt.NDArray[np.uint64]:
    """``fmix64``'s inverse, vectorised: ``x ^= x >> 33`` undoes itself on 64 bits, and each
    multiplication is undone by the multiplier's inverse."""
    shift = np.uint64(33)
    x = x ^ (x >> shift)
    x = x * np.uint64(_M2_INV)
    x = x ^ (x >> shift)
    x = x * np.uint64(_M1_INV)
    result: npt.NDArray[np.uint64] = x ^ (x >> shift)
    return result


def feature_values(
    slots: npt.NDArray[np.integer], signs: npt.NDArray[np.uint64]
) -> npt.NDArray[np.uint64]:
    """The token ``value`` behind every sign of ``slots``: ``feature_signs``'s inverse.

    ``salt(slot)`` is ``unfmix64(sign of value 0 in slot)``, so the salt comes from the one
    definition in ``sign_of`` rather than a copy of it.
    """
    slots64 = np.ascontiguousarray(slots, dtype=np.int64)
    signs64 = np.ascontiguousarray(signs, dtype=np.uint64)
    if slots64.shape != signs64.shape:
        raise ValueError(f"slots {slots64.shape} and signs {signs64.shape} differ in shape")
    zero_signs = _signs_kernel(slots64, np.zeros(signs64.shape, dtype=np.uint64))
    return _unfmix64(signs64) ^ _unfmix64(zero_signs)
