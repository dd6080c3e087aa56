"""Crossed slots: a pair of slots becomes one more slot whose keys are the pairs' keys.

A linear learner's quadratic features (Vowpal Wabbit's ``-q ui``) and Wide & Deep's cross
products give every (user, item) pair a weight of its own from its first occurrence; a deep
model otherwise has to learn the pair through both ids' embeddings, which a long-tail id
gets only after many shows. ``data.crosses`` names the pairs (``"user*item"``, checked by
``DataConfig``); each adds a slot after the format's own, so the positions the rest of the
job names (``sequenceSlot``, a model's ``targetSlot``) keep their meaning, and the crossed
keys are ordinary feature signs the parameter server admits, learns and shrinks.

The key crossing ``a`` (slot x) with ``b`` (slot y) in crossed slot ``s`` is
``fmix64(fmix64(a ^ GOLDEN) ^ b ^ salt(s))``: ordered (``x*y`` differs from ``y*x``) and
salted with the crossed slot's position like every other sign. A bag of ``n`` keys crossed
with a bag of ``m`` gives ``n·m`` keys (each with each); an empty bag gives none. The
automatic crosses (``crosses`` unset) pair single keys only: a bag of more gives none.
"""

from __future__ import annotations

import dataclasses

import numba
import numpy as np
import numpy.typing as npt

from streamtrain_worker.data.batch import Batch
from streamtrain_worker.data.formats.kernel import U8, BlockParser, Format, ParsedBlock
from streamtrain_worker.data.hashing import GOLDEN, fmix64, slot_salt


@numba.njit(inline="always", cache=True)
def _crossed_count(left: int, right: int, single_keys: bool) -> int:
    """Keys a bag of ``left`` keys crossed with one of ``right`` gives (the one rule both
    passes of the kernel follow)."""
    if not single_keys:
        return left * right
    return 1 if left == 1 and right == 1 else 0


@numba.njit(nogil=True, cache=True)
def _cross_kernel(
    keys: npt.NDArray[np.uint64],
    offsets: npt.NDArray[np.int64],
    num_slots: int,
    pairs: npt.NDArray[np.int64],
    single_keys: bool,
) -> tuple[npt.NDArray[np.uint64], npt.NDArray[np.int64]]:
    examples = (offsets.shape[0] - 1) // num_slots
    crosses = pairs.shape[0]
    width = num_slots + crosses
    salts = np.empty(crosses, dtype=np.uint64)
    for c in range(crosses):
        salts[c] = slot_salt(num_slots + c)
    total = keys.shape[0]
    for e in range(examples):
        base = e * num_slots
        for c in range(crosses):
            a, b = base + pairs[c, 0], base + pairs[c, 1]
            total += _crossed_count(
                offsets[a + 1] - offsets[a], offsets[b + 1] - offsets[b], single_keys
            )
    out_keys = np.empty(total, dtype=np.uint64)
    out_offsets = np.empty(examples * width + 1, dtype=np.int64)
    out_offsets[0] = 0
    n = 0
    golden = np.uint64(GOLDEN)
    for e in range(examples):
        base = e * num_slots
        for s in range(num_slots):
            for k in range(offsets[base + s], offsets[base + s + 1]):
                out_keys[n] = keys[k]
                n += 1
            out_offsets[e * width + s + 1] = n
        for c in range(crosses):
            a, b = base + pairs[c, 0], base + pairs[c, 1]
            count = _crossed_count(
                offsets[a + 1] - offsets[a], offsets[b + 1] - offsets[b], single_keys
            )
            if count:
                for i in range(offsets[a], offsets[a + 1]):
                    left = fmix64(keys[i] ^ golden)
                    for j in range(offsets[b], offsets[b + 1]):
                        out_keys[n] = fmix64(left ^ keys[j] ^ salts[c])
                        n += 1
            out_offsets[e * width + num_slots + c + 1] = n
    return out_keys, out_offsets


def cross_batch(batch: Batch, pairs: npt.NDArray[np.int64], single_keys: bool = False) -> Batch:
    """``batch`` with one crossed slot per row of ``pairs`` appended to every example;
    ``single_keys``: a pair of bags is crossed only when each holds exactly one key."""
    if pairs.shape[0] == 0:
        return batch
    keys, offsets = _cross_kernel(batch.keys, batch.offsets, batch.num_slots, pairs, single_keys)
    return Batch(
        labels=batch.labels, keys=keys, offsets=offsets, num_slots=batch.num_slots + len(pairs)
    )


class _CrossingParser:
    def __init__(self, inner: BlockParser, pairs: npt.NDArray[np.int64], single: bool) -> None:
        self._inner = inner
        self._pairs = pairs
        self._single = single

    def parse(self, block: U8, first_line: int) -> ParsedBlock:
        parsed = self._inner.parse(block, first_line)
        return dataclasses.replace(
            parsed, batch=cross_batch(parsed.batch, self._pairs, self._single)
        )


class CrossedFormat:
    """A format whose batches carry the crossed slots after its own."""

    def __init__(self, inner: Format, pairs: npt.NDArray[np.int64], single_keys: bool) -> None:
        self._inner = inner
        self._pairs = pairs
        self._single_keys = single_keys
        self.num_slots = inner.num_slots + int(pairs.shape[0])
        self.has_header = inner.has_header

    def for_file(self, path: str, header: bytes | None) -> BlockParser:
        return _CrossingParser(self._inner.for_file(path, header), self._pairs, self._single_keys)
