"""The save side of a ``TieredTable``: ``TableSaves`` extended to the disk rows, so a save
writes a logical shard's RAM rows plus its disk rows through the same filter, and a
committed save's side effects apply by key to whichever tier holds the key.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

from streamtrain_ps.api import SaveMode
from streamtrain_ps.engine import index as ix
from streamtrain_ps.engine import snapshot as sn
from streamtrain_ps.engine.slabs import HotCounters
from streamtrain_ps.engine.table_saves import TableSaves
from streamtrain_ps.tier import disk_rows as dr

if TYPE_CHECKING:
    from streamtrain_ps.tier.tiering import TieredTable


class TieredSaves(TableSaves["TieredTable"]):
    """The save side of a tiered ``table`` (module docstring)."""

    def snapshot_part(
        self, rows: npt.NDArray[np.int64], mode: SaveMode, logical: int
    ) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.uint64], npt.NDArray[np.float32], HotCounters]:
        """``snapshot`` of one logical shard's RAM ``rows`` plus its disk rows (row -1),
        both through the save filter; a key in RAM and on disk (a shadow) is saved once,
        from RAM."""
        rows, keys, full, hot = self.snapshot(rows, mode)
        t: TieredTable = self.table
        disk = t.disk_store
        if disk is None or not len(disk):
            return rows, keys, full, hot
        with t.lock.write():
            dk, dfull, dhot = disk.shard_rows(logical)
        keep = ~np.isin(dk, keys) & dr.passes(dfull, dhot, mode, self.save_params())
        dk, dfull, dhot = dk[keep], dfull[keep], dr.select_hot(dhot, keep)
        all_hot = HotCounters(
            np.concatenate([hot.positions, dhot.positions + keys.size]),
            np.concatenate([hot.counts, dhot.counts]),
        )
        return (
            np.concatenate([rows, np.full(dk.size, -1, np.int64)]),
            np.concatenate([keys, dk]),
            np.concatenate([full, dfull]),
            all_hot,
        )

    def apply_save(
        self,
        keys: npt.NDArray[np.uint64],
        rows: npt.NDArray[np.int64],
        saved_delta: npt.NDArray[np.floating],
        unseen_inc: bool,
        moves: int,
    ) -> None:
        """A committed save's side effects. Rows recorded before a demotion (``moves``
        changed) or read from disk (-1) are found again by key, in whichever tier."""
        t: TieredTable = self.table
        if moves == t.moves and (rows >= 0).all():
            self.after_save(rows, saved_delta, unseen_inc)
            return
        with t.lock.write():
            a = t._arrays
            disk = t.disk_store
            cur = np.empty(keys.size, dtype=np.int64)
            ix.lookup_many(a.slots, a.keys, keys, cur)
            ram = cur >= 0
            # Disk rows first: a storage error there leaves the RAM rows untouched too, so a
            # failed commit changes nothing (it is retried whole).
            if disk is not None and not ram.all():
                found, full, hot = disk.get(keys[~ram])
                if found.any():
                    delta = saved_delta[~ram][found]
                    disk_rows = (keys[~ram][found], full, hot)
                    disk.replace(*dr.after_save(t.layout, disk_rows, delta, unseen_inc))
            sn.after_save(
                a.slab, a.slab_u32, a.xslab_u32, a.hot, cur[ram], saved_delta[ram], unseen_inc
            )
