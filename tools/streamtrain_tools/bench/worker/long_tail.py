"""A long-tail click stream at the Criteo shape, for benchmarks whose table must not fit a cache.

The Criteo sample has ~7,200 rows and a few hundred thousand distinct keys: its table lives
in the CPU cache and says nothing about a production table. This stream keeps the shape
(``slots`` slots of one key each, 0/1 labels) but draws every slot's key from its own range
of ``keys_per_slot`` ids with P(rank r) ~ 1/r (log-uniform ranks): a hot head and a tail so
long that most of a batch's keys are rare. Ranks are scattered over the slot's range by an
odd multiplier (a bijection mod a power of two), so popular keys are not neighbours in
memory; key ids are ``slot * keys_per_slot + scattered rank``, i.e. contiguous ids in
``[0, slots * keys_per_slot)`` that a plain ``nn.EmbeddingBag`` indexes directly.

``all_keys`` lists the whole key space, so a benchmark can create every row first (the
table is then as large as the key space, millions of rows, before anything is timed).
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from streamtrain_worker.data.batch import Batch

_SCATTER = 0x9E3779B1  # odd: rank -> rank * _SCATTER mod 2^k is a bijection


def num_keys(slots: int, keys_per_slot: int) -> int:
    return slots * keys_per_slot


def all_keys(slots: int, keys_per_slot: int) -> npt.NDArray[np.uint64]:
    """Every key the stream can draw, in id order."""
    return np.arange(num_keys(slots, keys_per_slot), dtype=np.uint64)


def batches(
    *, count: int, batch_size: int, slots: int, keys_per_slot: int, ctr: float, seed: int
) -> list[Batch]:
    """``count`` batches of ``batch_size`` examples; ``keys_per_slot`` must be a power of 2."""
    if keys_per_slot < 2 or keys_per_slot & (keys_per_slot - 1):
        raise ValueError(f"keys_per_slot must be a power of 2 >= 2, got {keys_per_slot}")
    rng = np.random.default_rng(seed)
    log_n = np.log(keys_per_slot)
    base = (np.arange(slots, dtype=np.int64) * keys_per_slot)[None, :]
    out = []
    for _ in range(count):
        ranks = np.floor(np.exp(rng.random((batch_size, slots)) * log_n)).astype(np.int64) - 1
        scattered = (np.clip(ranks, 0, keys_per_slot - 1) * _SCATTER) & (keys_per_slot - 1)
        keys = (base + scattered).astype(np.uint64).reshape(-1)  # example-major, slot-minor
        labels = (rng.random(batch_size) < ctr).astype(np.float32)
        offsets = np.arange(batch_size * slots + 1, dtype=np.int64)
        out.append(Batch(labels=labels, keys=keys, offsets=offsets, num_slots=slots))
    return out
