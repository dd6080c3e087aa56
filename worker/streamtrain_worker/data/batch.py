"""The parsed form of a mini-batch, shared by every format parser and every model.

A batch of ``B`` examples over ``S`` slots is a CSR of "bags": bag ``b = example * S + slot``
holds ``keys[offsets[b]:offsets[b + 1]]`` (64-bit feature signs, in input order, so a
behaviour-sequence slot keeps its order). This is exactly ``nn.EmbeddingBag``'s
``(input, offsets)`` form, so pooling is one call and no per-example Python objects exist.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt


@dataclass(frozen=True)
class Batch:
    labels: npt.NDArray[np.float32]  # (B,) 0/1 clicks
    keys: npt.NDArray[np.uint64]  # (nnz,) feature signs, bag-major
    offsets: npt.NDArray[np.int64]  # (B * S + 1,) bag boundaries into keys
    num_slots: int  # S

    def __post_init__(self) -> None:
        if self.offsets.shape != (self.size * self.num_slots + 1,):
            expected = self.size * self.num_slots + 1
            raise ValueError(f"offsets has shape {self.offsets.shape}, expected ({expected},)")
        if int(self.offsets[-1]) != self.keys.shape[0]:
            raise ValueError(
                f"offsets end at {int(self.offsets[-1])} but there are {self.keys.shape[0]} keys"
            )

    @property
    def size(self) -> int:
        return int(self.labels.shape[0])

    def bag_of_key(self) -> npt.NDArray[np.int64]:
        """Bag index of every key (``example * S + slot``)."""
        counts = np.diff(self.offsets)
        return np.repeat(np.arange(counts.shape[0], dtype=np.int64), counts)

    def first_example_keys(self) -> npt.NDArray[np.int64]:
        """``(S,)``: the first key of each of the first example's bags (its bits as int64),
        -1 for an empty bag or an empty batch."""
        out = np.full(self.num_slots, -1, dtype=np.int64)
        if self.size == 0:
            return out
        starts, ends = self.offsets[: self.num_slots], self.offsets[1 : self.num_slots + 1]
        filled = ends > starts
        out[filled] = self.keys[starts[filled]].view(np.int64)
        return out

    def slot_of_key(self) -> npt.NDArray[np.uint32]:
        """Slot index of every key, in ``[0, S)``."""
        return (self.bag_of_key() % self.num_slots).astype(np.uint32)


def concat_batches(batches: list[Batch]) -> Batch:
    """One batch from several with the same slot count (used to re-chunk parsed blocks)."""
    if not batches:
        raise ValueError("concat_batches needs at least one batch")
    num_slots = batches[0].num_slots
    if any(b.num_slots != num_slots for b in batches):
        raise ValueError("batches have different slot counts")
    offsets = [batches[0].offsets]
    base = int(batches[0].offsets[-1])
    for b in batches[1:]:
        offsets.append(b.offsets[1:] + base)
        base += int(b.offsets[-1])
    return Batch(
        labels=np.concatenate([b.labels for b in batches]),
        keys=np.concatenate([b.keys for b in batches]),
        offsets=np.concatenate(offsets),
        num_slots=num_slots,
    )


def slice_batch(batch: Batch, start: int, stop: int) -> Batch:
    """Examples ``[start, stop)`` of a batch, sharing no memory with later mutation."""
    s = batch.num_slots
    lo, hi = int(batch.offsets[start * s]), int(batch.offsets[stop * s])
    return Batch(
        labels=batch.labels[start:stop].copy(),
        keys=batch.keys[lo:hi].copy(),
        offsets=batch.offsets[start * s : stop * s + 1] - lo,
        num_slots=s,
    )
