"""Numeric inputs of ordinal slots, read back from their feature signs (pure logic).

An ordinal slot's token is an integer whose order means something: a bucketed count
(Criteo's I-columns, a csv column of kind ``bucket``) or Avazu's hour of day and weekday
(``DataConfig.ordinal_slots`` says which slots are). As keys, bucket 7 and bucket 8 are as
unrelated as two ad ids: each is learned from its own rows only, and a rare bucket barely
at all. Standard CTR models (DLRM, DeepFM on Criteo) also give the MLP such features as
numbers, so it can use that 7 lies between 6 and 8. No parser needs to carry them: the
sign of an integer token is a bijection of (slot, value) (``data.hashing``), so the value
comes back from the key exactly (``feature_values``).

Per example and ordinal slot the input is ``[value, missing]``: ``value`` the token's
integer as a signed number (the bucket number itself: the buckets already compress large
counts logarithmically; the mean if a bag holds several tokens), or 0 with ``missing`` 1
when the bag is empty or holds only the missing-value token (an empty integer cell) or
keys that are no ordinal token (``LIMIT``). The model standardises both columns
(``models.slot_dnn``); a log of the bucket number was measured 0.0008 AUC below the
bucket itself on Criteo (``docs/decisions.md``).
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from streamtrain_worker.data.batch import Batch
from streamtrain_worker.data.hashing import feature_values

#: Columns per ordinal slot: the value, the missing flag.
WIDTH = 2
#: Largest magnitude read as a number. The formats' ordinal tokens are far smaller (a
#: bucket of any 64-bit integer is at most 1,903, an hour 23): a key the parsers did not
#: make (a synthetic benchmark key in a Criteo slot) would decode to some 64-bit integer,
#: and ~1e18 in the MLP's input overflows the data norm. Such a value counts as missing,
#: like the missing-value token (-2**63 as a signed value) does.
LIMIT = 1 << 20


def ordinal_inputs(batch: Batch, slots: tuple[int, ...]) -> npt.NDArray[np.float32]:
    """``(B, len(slots), 2)``: ``[value, missing]`` of every example's ordinal ``slots``.

    Only the ordinal bags' keys are touched (found through the CSR offsets), not every key
    of the batch: the prefetch thread pays ~B * K key inversions.
    """
    b, s, k = batch.size, batch.num_slots, len(slots)
    if any(not 0 <= slot < s for slot in slots):
        raise ValueError(f"ordinal slots {slots} not all in [0, {s})")
    out = np.zeros((b, k, WIDTH), dtype=np.float32)
    out[:, :, 1] = 1.0
    if k == 0 or b == 0:
        return out
    slot_of_cell = np.asarray(slots, dtype=np.int64)
    bags = (np.arange(b, dtype=np.int64)[:, None] * s + slot_of_cell[None, :]).ravel()
    starts = batch.offsets[bags]
    lengths = batch.offsets[bags + 1] - starts
    # Every key of those bags, with its cell (example * K + ordinal column).
    cell = np.repeat(np.arange(b * k, dtype=np.int64), lengths)
    first = np.repeat(starts - (np.cumsum(lengths) - lengths), lengths)
    position = first + np.arange(cell.shape[0], dtype=np.int64)
    values = feature_values(np.tile(slot_of_cell, b)[cell], batch.keys[position])
    signed = values.view(np.int64)
    present = (signed >= -LIMIT) & (signed <= LIMIT)  # MISSING_VALUE is -2**63
    cell, signed = cell[present], signed[present]
    sums = np.bincount(cell, weights=signed.astype(np.float64), minlength=b * k)
    counts = np.bincount(cell, minlength=b * k)
    has = counts > 0
    flat = out.reshape(b * k, WIDTH)
    flat[has, 0] = sums[has] / counts[has]
    flat[has, 1] = 0.0
    return out
