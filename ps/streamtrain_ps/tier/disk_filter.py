"""An in-RAM filter of the keys on a table's disk tier: a key it rules out is in no tier's
store, so a pull or push skips RocksDB for it.

Why: once a shard's disk tier holds keys, every pull or push looked all of its RAM misses
up in RocksDB (about 10 µs a key, even for a miss that RocksDB's own bloom filters answer:
the call, the key encoding and the block-cache lookup are per key), so a capped shard took
*new* keys at ~40k keys/s. A new key is a miss of both tiers; this filter answers it in
RAM in a few nanoseconds.

What it is: a *blocked* Bloom filter over the 64-bit keys (every key's bits lie in one
64-byte block, so a query costs one cache miss), ``BITS_PER_KEY`` bits and ``PROBES`` bits
per key (about 0.2 % false positives per part when full). It only ever answers "maybe on
disk" or "certainly not":

- **added to** when keys are demoted (and built from the spilled keys at a load);
- **never cleared** by a promotion or a deletion: such keys leave stale bits, i.e. false
  positives, which cost one RocksDB lookup and nothing else; never a false negative;
- **grown without rescanning the store**: when the keys added pass its capacity, a new
  filter joins the old ones (a scalable Bloom filter: a query ORs them), as large as all
  before it together, so a filter of n keys has O(log n) parts and at most twice the bytes
  it needs (measured: a part 3x the total before it and power-of-two sizes took 5.6 B per
  disk key, most of a small shard's table budget);
- **rebuilt** from the store's live keys after a shrink (which reads them anyway), which
  drops stale bits and merges the parts into one.

Its bytes count in the table's RAM budget (``TieredTable.ram_bytes``): about 1.75 B per
disk key (up to twice that right after a part joins), and the next part's bytes from the
moment the last one is half full (``growth_reserve``).
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
from numba import njit

from streamtrain_ps.engine.index import PREFETCH, Int, mix64, prefetch

#: 14 bits and 7 probes (7 x 9 bits of one 64-bit hash): ~0.2 % false positives per full
#: part, ~1.5 % over the ~8 parts of a few million disk keys. 10 bits and 6 probes (~1 % a
#: part) let 6.8 % of a capped shard's misses through to RocksDB at ~10 us each: as long
#: as the whole RAM pull of a Zipf batch (docs/benchmarks.md).
BITS_PER_KEY = 14
PROBES = 7
#: A block is one cache line: 8 words of 64 bits.
BLOCK_WORDS = 8
#: The smallest part (keys): a small table's filter stays small against its budget.
MIN_CAPACITY = 1 << 10
#: A new part holds this many times the keys of all parts before it (1: the filter's
#: bytes at most double its need, right after a part is added; parts ~ log2 of keys).
GROWTH = 1
#: Once the last part is this full, the next part's bytes are reserved (``growth_reserve``).
RESERVE_FROM = 0.5

_SEED = np.uint64(0x9E3779B97F4A7C15)
_S9 = np.uint64(9)
_S32 = np.uint64(32)
_S6 = np.uint64(6)
_LOW9 = np.uint64(511)
_LOW6 = np.uint64(63)
_ONE = np.uint64(1)


@njit(nogil=True, cache=True, inline="always")
def _block(h: np.uint64, nblocks: np.uint64) -> np.int64:
    """Block of hash ``h`` in [0, nblocks): its high 32 bits scaled (no power-of-two size
    needed, so a part is no larger than its keys need)."""
    return np.int64(((h >> _S32) * nblocks) >> _S32)


@njit(nogil=True, cache=True)
def add_keys(blocks: npt.NDArray[np.uint64], keys: npt.NDArray[np.uint64]) -> None:
    """Set every key's ``PROBES`` bits in its block (``blocks``: (n, 8))."""
    nblocks = np.uint64(blocks.shape[0])
    for i in range(keys.size):
        h = mix64(keys[i] ^ _SEED)
        b = _block(h, nblocks)
        g = mix64(h)
        for _ in range(PROBES):
            bit = g & _LOW9
            blocks[b, np.int64(bit >> _S6)] |= _ONE << (bit & _LOW6)
            g >>= _S9


@njit(nogil=True, cache=True)
def may_contain(
    blocks: npt.NDArray[np.uint64], keys: npt.NDArray[np.uint64], out: npt.NDArray[np.bool_]
) -> Int:
    """``out[i] |= key i may be in this part``; returns how many are set after.

    Each key's block is a random cache miss in a part of megabytes: the block of the key
    ``PREFETCH`` places ahead is fetched meanwhile, so the misses overlap (the query of a
    capped pull's misses is the largest cost it adds to a pull, ``docs/benchmarks.md``)."""
    nblocks = np.uint64(blocks.shape[0])
    n = 0
    size = keys.size
    for i in range(size):
        ahead = i + PREFETCH
        if ahead < size and not out[ahead]:
            prefetch(blocks, _block(mix64(keys[ahead] ^ _SEED), nblocks))
        if not out[i]:
            h = mix64(keys[i] ^ _SEED)
            b = _block(h, nblocks)
            g = mix64(h)
            hit = True
            for _ in range(PROBES):
                bit = g & _LOW9
                if not (blocks[b, np.int64(bit >> _S6)] >> (bit & _LOW6)) & _ONE:
                    hit = False
                    break
                g >>= _S9
            out[i] = hit
        if out[i]:
            n += 1
    return n


def _part_bytes(capacity: int) -> int:
    """Bytes of a part sized for ``capacity`` keys (whole blocks)."""
    return max(1, -(-capacity * BITS_PER_KEY // (BLOCK_WORDS * 64))) * BLOCK_WORDS * 8


class _Part:
    """One Bloom filter sized for ``capacity`` keys."""

    def __init__(self, capacity: int) -> None:
        nblocks = _part_bytes(capacity) // (BLOCK_WORDS * 8)
        self.blocks = np.zeros((nblocks, BLOCK_WORDS), dtype=np.uint64)
        self.capacity = capacity
        self.added = 0


class DiskKeyFilter:
    """The set of keys that may be on disk (see the module docstring). Not thread-safe:
    ``TieredTable`` adds under its exclusive lock and queries under its writer lock."""

    def __init__(self, keys: npt.NDArray[np.uint64] | None = None) -> None:
        self._parts: list[_Part] = []
        if keys is not None and keys.size:
            self.add(keys)

    @property
    def nbytes(self) -> int:
        return sum(int(p.blocks.nbytes) for p in self._parts)

    def growth_reserve(self) -> int:
        """Bytes of the part that joins next, once the last part is ``RESERVE_FROM`` full
        (else 0). A part joins at once and as large as all before it (117 MB at 67M disk
        keys), in the middle of a demotion: counted only then, it pushed a capped shard's
        RSS ~100 MB past its limit. Counted ahead, the governor sheds its room a step per
        request while the last part fills (each demoted key fills it too, but a step
        demotes ~18x fewer keys than the room it frees in a part: 32 B a RAM row against
        1.75 B a filter key)."""
        if not self._parts:
            return 0
        last = self._parts[-1]
        if last.added < RESERVE_FROM * last.capacity:
            return 0
        total = sum(p.capacity for p in self._parts)
        return _part_bytes(max(MIN_CAPACITY, GROWTH * total))

    def add(self, keys: npt.NDArray[np.uint64]) -> None:
        """Record ``keys`` as possibly on disk."""
        lo = 0
        while lo < keys.size:
            if not self._parts or self._parts[-1].added >= self._parts[-1].capacity:
                total = sum(p.capacity for p in self._parts)
                self._parts.append(_Part(max(MIN_CAPACITY, GROWTH * total, keys.size - lo)))
            part = self._parts[-1]
            take = min(keys.size - lo, part.capacity - part.added)
            add_keys(part.blocks, np.ascontiguousarray(keys[lo : lo + take]))
            part.added += take
            lo += take

    def maybe(self, keys: npt.NDArray[np.uint64]) -> npt.NDArray[np.bool_]:
        """A mask of ``keys`` that may be on disk (False: certainly not)."""
        out = np.zeros(keys.size, dtype=np.bool_)
        k = np.ascontiguousarray(keys)
        for p in self._parts:
            if may_contain(p.blocks, k, out) == keys.size:
                break
        return out
