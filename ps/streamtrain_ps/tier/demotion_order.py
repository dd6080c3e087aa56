"""Which RAM rows a demotion takes: the shrink rule's order (lowest score, then longest
unseen) with a recency term, so keys in use are not sent to disk just after they came back.

Why the recency term: a key that a pull promotes from disk is a tail key, so it has the
lowest score in RAM, and in the shrink order alone the next demotion took exactly such keys
again: a capped shard moved the same keys back and forth every few batches. Pulls do not
change a score, so the order needs a second input: a *touched* bit per RAM row (CLOCK's
second chance), set by a pull that finds the row and by a promotion that places it, and
cleared for every row once a demotion ran. A demotion takes untouched rows first, coldest
first; touched rows, coldest first, only when untouched ones are too few.

The bits are one per row of the primary slab (0.125 B a key, in the table's RAM budget).
Pulls set them under the reader lock, so two concurrent pulls may lose one of each other's
bits in a shared byte: that only lets a key be demoted sooner. Which tier a key lives in
never changes its values, so the order affects speed only.

Two ways to choose, by what the choice decides:

- ``sweep_cold`` (every demotion while the disk tier has room): a clock hand moves over
  the slot array from where the last sweep stopped and takes the untouched rows below the
  score that ``SWEEP_SHARE`` of a sample lies under, clearing the touched bits it passes.
  It reads a sample and the slots it passes, so a demotion of ``n`` keys costs about
  ``n / SWEEP_SHARE`` slots whatever the table's size. The exact order needed a scan of every
  RAM row per demotion (~4 passes of random row reads), which at 100M keys under 2 GiB took
  longer than a request's deadline while it held the writer lock (docs/decisions.md).
  Which cold keys go first only changes speed, so "about the coldest" is enough here.
- ``coldest_rows`` (a demotion that must evict because the disk tier is full too): the
  exact shrink-rule order over every RAM row, since what is evicted changes the model.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

from streamtrain_ps.engine.slabs import Arrays
from streamtrain_ps.tier import tier_kernels as tk

#: Rows sampled to estimate the score below which a demotion's keys lie.
COLD_SAMPLE = 65_536
#: A sweep takes rows below the score this share of the sampled rows lies under (or twice
#: the share it needs, when that is more: one sweep stays within about half a lap): it
#: passes about ``1 / SWEEP_SHARE`` rows per row taken, and empties a quarter of a region at
#: a time, so linear-probing runs do not pile up ahead of the hand.
SWEEP_SHARE = 0.25


class TouchedBits:
    """One bit per RAM row: pulled or promoted since the last demotion."""

    def __init__(self) -> None:
        self.bits = np.zeros(0, dtype=np.uint8)

    def resident_bytes(self, rows_used: int) -> int:
        """Bytes of the bitmap that are resident: those of the rows ever used (untouched
        pages of the zeroed bitmap are not)."""
        return min(self.bits.nbytes, (rows_used + 7) // 8)

    def covers(self, rows: int) -> bool:
        return self.bits.size * 8 >= rows

    def cover(self, rows: int) -> None:
        """Bits for ``rows`` rows (call under the table's writer lock)."""
        if not self.covers(rows):
            bits = np.zeros(rows // 8 + 1, dtype=np.uint8)
            bits[: self.bits.size] = self.bits
            self.bits = bits

    def mark(self, rows: npt.NDArray[np.int64]) -> None:
        tk.mark_rows(self.bits, rows, True)

    def clear(self) -> None:
        """A demotion ran: the next window's second chances start now."""
        self.bits[:] = 0


def coldest_rows(
    a: Arrays, count: int, ap: npt.NDArray[np.float64], bits: TouchedBits, salt: int, n: int
) -> npt.NDArray[np.int64]:
    """About the ``n`` coldest of the ``count`` live rows of ``a``, coldest first: untouched
    rows first, touched ones only when those are too few (module docstring). ``salt`` picks
    other rows among ties each time (see ``tier_kernels.collect_cold``)."""
    bits.cover(a.keys.shape[0])
    rows = _collect_cold(a, count, ap, bits.bits, salt, n, tk.UNTOUCHED)
    if rows.size < n:
        more = _collect_cold(a, count, ap, bits.bits, salt, n - rows.size, tk.TOUCHED)
        rows = np.concatenate([rows, more])
    return rows


def _collect_cold(
    a: Arrays,
    count: int,
    ap: npt.NDArray[np.float64],
    bits: npt.NDArray[np.uint8],
    salt: int,
    n: int,
    want: int,
) -> npt.NDArray[np.int64]:
    """About the ``n`` coldest live rows of the ``want`` kind, coldest first (lowest score,
    then longest unseen). The score below which ``n`` rows lie is estimated from a sample of
    at most ``COLD_SAMPLE`` rows, so the scratch is O(n + sample), not O(keys): a demotion
    must not need memory in proportion to the table it relieves."""
    stride = max(1, count // COLD_SAMPLE)
    sample = np.empty(min(count, COLD_SAMPLE), dtype=np.float64)
    picked = (ap, bits, want, sample)
    m = int(tk.sample_scores(a.slots, a.slab, a.slab_u32, a.hot, stride, *picked))
    if not m:
        return np.empty(0, dtype=np.int64)
    kind = m * stride  # about how many rows of that kind
    threshold = float(np.quantile(sample[:m], min(1.0, n / max(kind, 1)), method="higher"))
    rows = np.empty(n, dtype=np.int64)
    scores = np.empty(n, dtype=np.float64)
    unseen = np.empty(n, dtype=np.float32)
    slabs = (a.slots, a.slab, a.slab_u32, a.xslab_u32, a.hot)
    args = (*slabs, threshold, ap, salt, bits, want, rows, scores, unseen)
    kernel: Any = tk.collect_cold  # numba's Dispatcher stub does not model *args
    got = int(kernel(*args))
    order = np.lexsort((-unseen[:got], scores[:got]))
    return rows[:got][order]


class ClockHand:
    """Where the next sweep starts (a slot), and how often one ran (salts its ties)."""

    def __init__(self) -> None:
        self.slot = 0
        self.sweeps = 0


def sweep_cold(
    a: Arrays, count: int, ap: npt.NDArray[np.float64], bits: TouchedBits, hand: ClockHand, n: int
) -> npt.NDArray[np.int64]:
    """About ``n`` cold rows of the ``count`` live rows, found by the clock hand (module
    docstring), coldest first; advances ``hand`` past the slots it visited."""
    bits.cover(a.keys.shape[0])
    size = a.slots.size
    probes = min(COLD_SAMPLE, size)
    sample = np.empty(probes, dtype=np.float64)
    start = (hand.sweeps * 0x9E3779B97F4A7C15) % size
    slabs = (a.slots, a.slab, a.slab_u32, a.hot)
    m = int(tk.sample_slot_scores(*slabs, start, size // probes, ap, sample))
    threshold, cut = np.inf, np.uint64(0xFFFFFFFF)
    if m:
        share = min(1.0, max(SWEEP_SHARE, 2 * n / max(count, 1)))  # within half a lap
        s = np.sort(sample[:m])
        threshold = float(s[min(m - 1, int(np.ceil(share * m)) - 1)])
        below = int(np.searchsorted(s, threshold, side="left"))
        ties = int(np.searchsorted(s, threshold, side="right")) - below
        want = share * m - below  # how many of the tied rows the share still needs
        cut = np.uint64(min(1.0, max(want, 1.0) / ties) * 4294967295.0)
    rows = np.empty(n, dtype=np.int64)
    scores = np.empty(n, dtype=np.float64)
    unseen = np.empty(n, dtype=np.float32)
    rows_of = (a.slots, a.slab, a.slab_u32, a.xslab_u32, a.hot)
    picked = (ap, bits.bits, hand.slot, threshold, cut, hand.sweeps, rows, scores, unseen)
    kernel: Any = tk.sweep_cold  # numba's Dispatcher stub does not model *args
    got, hand.slot = (int(v) for v in kernel(*rows_of, *picked))
    hand.sweeps += 1
    tk.mark_rows(bits.bits, rows[:got], False)  # the sweep marked what it took
    order = np.lexsort((-unseen[:got], scores[:got]))
    return rows[:got][order]
