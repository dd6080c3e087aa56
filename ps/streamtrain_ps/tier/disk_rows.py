"""The rules on *full rows* (the disk tier's unit: a checkpoint row plus exact hot counters)
that RAM rows get from the slab kernels: shrink, a save's filter, a save's side effects,
and which keys a load keeps in RAM.

Each builds a scratch table from the rows when it needs a kernel (``slabs.build_content``),
so disk rows follow the very code RAM rows do and a key's results do not depend on its
tier. No I/O and no locking: ``tiering.TieredTable`` reads and writes the store.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

from streamtrain_ps.api import SaveMode
from streamtrain_ps.engine import index as ix
from streamtrain_ps.engine import kernels as kn
from streamtrain_ps.engine import snapshot as sn
from streamtrain_ps.engine.accessor import CLICK, DELTA, SHOW, UNSEEN, RowLayout
from streamtrain_ps.engine.slabs import Arrays, HotCounters, build_content

Rows = tuple[npt.NDArray[np.uint64], npt.NDArray[np.float32], HotCounters]


def no_hot() -> HotCounters:
    return HotCounters(np.empty(0, np.int64), np.empty((0, 3), np.float64))


def shift_hot(hot: HotCounters, start: int) -> HotCounters:
    """``hot`` for the rows ``start:`` of the array it indexes."""
    keep = hot.positions >= start
    return HotCounters(hot.positions[keep] - start, hot.counts[keep])


def mask(n: int, idx: npt.NDArray[np.int64]) -> npt.NDArray[np.bool_]:
    m = np.zeros(n, dtype=np.bool_)
    m[idx] = True
    return m


def select_hot(hot: HotCounters, keep: npt.NDArray[np.bool_]) -> HotCounters:
    """``hot`` for ``rows[keep]`` (positions renumbered)."""
    new_pos = np.cumsum(keep) - 1
    sel = keep[hot.positions]
    return HotCounters(new_pos[hot.positions[sel]], hot.counts[sel])


def gather(lay: RowLayout, a: Arrays, rows: npt.NDArray[np.int64]) -> Rows:
    """Keys, full rows and exact hot counters of ``rows`` of (scratch) arrays ``a``."""
    keys = np.empty(rows.size, dtype=np.uint64)
    full = np.empty((rows.size, lay.width), dtype=np.float32)
    pos = np.empty(rows.size, dtype=np.int64)
    counts = np.empty((rows.size, 3), dtype=np.float64)
    args: Any = (a.keys, a.slab, a.slab_u32, a.xslab, a.hot, a.slot_ids, rows, keys, full)
    kernel: Any = sn.gather  # numba's Dispatcher stub does not model *args
    nh = int(kernel(*args, pos, counts, lay.xptr, lay.xflag))
    return keys, full, HotCounters(pos[:nh], counts[:nh])


def shrink(
    lay: RowLayout, ap: npt.NDArray[np.float64], rows: Rows
) -> tuple[npt.NDArray[np.uint64], Rows]:
    """The shrink kernel on full rows: (keys deleted, the rows left, decayed)."""
    keys, full, hot = rows
    scratch = build_content(lay, keys, full, np.empty(0, np.uint64), hot)
    a, meta = scratch.arrays, scratch.meta
    deleted = np.empty(keys.size, dtype=np.uint64)
    args = (a.slots, a.keys, meta, a.slab, a.slab_u32, a.xslab, a.xslab_u32, a.hot)
    nd = int(kn.shrink_kernel(*args, ap, deleted))
    live = np.empty(int(meta[ix.COUNT]), dtype=np.int64)
    ix.live_rows(a.slots, live)
    return deleted[:nd].copy(), gather(lay, a, live)


def passes(
    full: npt.NDArray[np.float32],
    hot: HotCounters,
    mode: SaveMode,
    save_params: npt.NDArray[np.float64],
) -> npt.NDArray[np.bool_]:
    """``snapshot._passes`` on full rows (float64 arithmetic, exact hot counters)."""
    if mode in (SaveMode.CHECKPOINT, SaveMode.BATCH):
        return np.ones(full.shape[0], dtype=np.bool_)
    show = full[:, SHOW].astype(np.float64)
    click = full[:, CLICK].astype(np.float64)
    delta = full[:, DELTA].astype(np.float64)
    show[hot.positions], click[hot.positions], delta[hot.positions] = hot.counts.T
    sp = save_params
    ok = ((show - click) * sp[0] + click * sp[1] >= sp[2]) & (full[:, UNSEEN] <= sp[3])
    return ok & (delta >= sp[4]) if mode == SaveMode.DELTA else ok


def after_save(
    lay: RowLayout, rows: Rows, saved_delta: npt.NDArray[np.floating], unseen_inc: bool
) -> Rows:
    """A committed save's side effects (``snapshot.after_save``) on full rows."""
    keys, full, hot = rows
    s = build_content(lay, keys, full, np.empty(0, np.uint64), hot).arrays
    at = np.arange(keys.size, dtype=np.int64)  # a fresh build puts key i at row i
    sn.after_save(s.slab, s.slab_u32, s.xslab_u32, s.hot, at, saved_delta, unseen_inc)
    return gather(lay, s, at)


def ram_split(
    lay: RowLayout,
    coeffs: tuple[float, float],
    rows: Rows,
    ram_budget: int,
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]] | None:
    """For a load: (rows to spill to disk, rows to keep in RAM), each sorted, keeping the
    hottest (shrink order: highest score, then most recently seen) within ``ram_budget``
    bytes; None when all fit (or ``ram_budget`` is 0: no limit)."""
    keys, full, hot = rows
    if ram_budget <= 0:
        return None
    admitted = float(np.mean(full[:, lay.xflag] >= 0)) if keys.size else 0.0
    per_key = 8 + 4 * lay.primary_width + 4 * lay.x_width * admitted
    slot_bytes = 4 * ix.needed_capacity(keys.size)
    fits = int(max(0, ram_budget - slot_bytes) // per_key)
    if fits >= keys.size:
        return None
    show = full[:, SHOW].astype(np.float64)
    click = full[:, CLICK].astype(np.float64)
    show[hot.positions], click[hot.positions] = hot.counts[:, 0], hot.counts[:, 1]
    score = (show - click) * coeffs[0] + click * coeffs[1]
    order = np.lexsort((-full[:, UNSEEN], score))  # coldest first
    return np.sort(order[: keys.size - fits]), np.sort(order[keys.size - fits :])
