"""A sparse table with a disk tier: RAM rows (``SparseTable``) plus cold keys' full rows in
a ``DiskStore``, so a shard under a memory limit keeps every key instead of dying.

- **Demotion** (``demote``, called by the shard when its RAM tier passes its budget): the
  coldest keys (``demotion_order``: the shrink rule's order, keys used since the last
  demotion last) are copied out as full rows with exact counters and removed from RAM;
  keys that do not fit under the disk cap are evicted (tombstoned, counted). The slabs are
  then compacted and the freed rows' pages given back (``compaction``), so what the
  demotion freed leaves the process's RSS.
- **Promotion**: a pull or push of a disk key puts its full row back into RAM first (under
  the writer lock, atomically with the push), so its results are bit-identical to a key
  that never left RAM.
- **Maintenance covers both tiers** (the rules on full rows are in ``disk_rows``): a
  shrink decays and deletes disk rows with the same kernel (on a scratch table built from
  them); a save writes a logical shard's RAM rows plus its disk rows, through the same
  filter; a save's side effects apply by key to whichever tier holds the key; a load
  fills RAM up to the budget and spills the rest.
- **During a save** demotion waits (it needs ``lock.maintenance``) and a promotion leaves
  the disk copy in place (a *shadow*), so a save that has not reached that key's logical
  shard yet still finds it; shadows are deleted at the next demotion, shrink or load, and a
  save prefers a key's RAM row over its shadow.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from concurrent.futures import Executor
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt

from streamtrain_ps.config import TableConfig
from streamtrain_ps.engine import index as ix
from streamtrain_ps.engine import kernels as kn
from streamtrain_ps.engine.kernels import EVICTIONS
from streamtrain_ps.engine.slabs import HotCounters, TableContent, require_finite_rows
from streamtrain_ps.engine.table import Merged, SparseTable
from streamtrain_ps.tier import compaction
from streamtrain_ps.tier import disk_rows as dr
from streamtrain_ps.tier import tier_kernels as tk
from streamtrain_ps.tier.demotion_order import ClockHand, TouchedBits, coldest_rows, sweep_cold
from streamtrain_ps.tier.disk_filter import DiskKeyFilter
from streamtrain_ps.tier.disk_store import DiskFullError, DiskStore, StoreMemory, tree_bytes
from streamtrain_ps.tier.tiered_saves import TieredSaves

log = logging.getLogger(__name__)

#: Demotions and promotions move rows in chunks of this many keys, so their scratch (full
#: rows, encoded values, RocksDB batches: ~300 B a key) stays a few MB whatever the batch.
MOVE_CHUNK = 8_192


#: Attempts of a store call that must not leave a shrink half done (``_retried``).
STORE_ATTEMPTS = 3


def _retried(call: Callable[[], object], what: str) -> None:
    """``call()``, again after a storage error, up to ``STORE_ATTEMPTS`` times."""
    for attempt in range(1, STORE_ATTEMPTS + 1):
        try:
            call()
            return
        except Exception as exc:
            if attempt == STORE_ATTEMPTS:
                raise
            log.warning("%s: disk store call failed (%s); retrying", what, exc)


@dataclass(frozen=True)
class DiskOptions:
    """Where a table's disk tier lives, its cap (0 = only the filesystem's size) and the
    shard's RocksDB memory budget its store shares (None: a small one of its own).
    ``volume``: the directory the cap covers (the shard's ``diskPath``): a store opened
    counts every byte there outside ``path`` against the cap (None: only its own)."""

    path: Path
    limit_bytes: int
    logical_shards: int
    memory: StoreMemory | None = None
    volume: Path | None = None


@dataclass(frozen=True)
class TieredContent:
    """A load's new content: RAM arrays plus the spilled rows' store (or None)."""

    ram: TableContent
    disk: DiskStore | None
    filter: DiskKeyFilter


class TieredTable(SparseTable):
    """``SparseTable`` whose cold keys may live on disk (see the module docstring)."""

    saves: TieredSaves

    def __init__(
        self,
        config: TableConfig,
        seed: int = 0,
        capacity: int = 0,
        helpers: Executor | None = None,
        disk: DiskOptions | None = None,
    ) -> None:
        super().__init__(config, seed=seed, capacity=capacity, helpers=helpers)
        self.saves = TieredSaves(self)  # its save side covers the disk rows too
        self._disk_opts = disk
        self._disk: DiskStore | None = None
        #: Keys that may be on disk: a RAM miss it rules out never reaches the store.
        self._filter = DiskKeyFilter()
        self._generation = 0
        self._shadows: list[npt.NDArray[np.uint64]] = []
        #: Rows pulled or promoted since the last demotion (``demotion_order``; recorded
        #: once the table has a disk tier).
        self._touched = TouchedBits()
        #: Where the next demotion's sweep starts (``demotion_order.sweep_cold``).
        self._hand = ClockHand()
        #: Bumped by every demotion: rows recorded before it may hold other keys now.
        self.moves = 0
        self.promotions_total = 0
        self.demotions_total = 0
        self.pressure_evictions_total = 0
        #: Called after each chunk a promotion or demotion moved (the governor trims the
        #: heap there near the limit: one push of disk keys moves rows for seconds).
        self.after_move: Callable[[], object] | None = None

    # -- accounting -------------------------------------------------------------------------

    def ram_bytes(self) -> int:
        """Bytes the RAM tier holds resident: slot array, key + primary row per live key
        (demotions compact, ``compaction``), embedx rows to their high-water mark, hot
        entries, the disk keys' filter with its next part's room, the touched bits."""
        a = self._arrays
        m = self._meta
        per_key = a.keys.itemsize + a.slab.shape[1] * 4
        xrows = int(m[kn.X_NEXT])
        return int(
            a.slots.nbytes
            + len(self) * per_key
            + xrows * a.xslab.shape[1] * 4
            + self.hot_keys * a.hot.shape[1] * 8
            + self._filter_bytes()
            + self._touched.resident_bytes(int(m[ix.NEXT_ROW]))
        )

    def memory_bytes(self) -> int:
        return super().memory_bytes() + self._filter.nbytes

    def key_bytes(self) -> float:
        """Average RAM bytes per key besides the slot array (a new key's cost estimate)."""
        n = len(self)
        if not n:
            lay = self.layout
            return 8 + 4 * lay.primary_width
        return (self.ram_bytes() - self._arrays.slots.nbytes - self._filter_bytes()) / n

    def _filter_bytes(self) -> int:
        """The filter of disk keys and the room its next part will take (``disk_filter``)."""
        return self._filter.nbytes + self._filter.growth_reserve()

    @property
    def disk_keys(self) -> int:
        return len(self._disk) - self._shadow_count() if self._disk is not None else 0

    def disk_bytes(self) -> int:
        return self._disk.stored_bytes() if self._disk is not None else 0

    def __len__(self) -> int:
        return int(self._meta[ix.COUNT])

    @property
    def total_keys(self) -> int:
        """Keys in both tiers."""
        return len(self) + self.disk_keys

    def _shadow_count(self) -> int:
        return sum(int(s.size) for s in self._shadows)

    @property
    def disk_store(self) -> DiskStore | None:
        """The disk tier's store, None until the first demotion or spilling load opens it."""
        return self._disk

    def _store(self) -> DiskStore:
        if self._disk is None:
            self._disk = self._new_store()
        return self._disk

    def _new_store(self) -> DiskStore:
        o = self._disk_opts
        if o is None:
            raise RuntimeError(f"table {self.name!r} has no disk tier configured")
        self._generation += 1
        path = o.path / f"gen-{self._generation}"
        foreign = 0
        if o.volume is not None and o.limit_bytes > 0:  # this table's stores count apart
            foreign = max(0, tree_bytes(o.volume) - tree_bytes(o.path))
        width, shards = self.layout.width, o.logical_shards
        return DiskStore(path, width, shards, o.limit_bytes, o.memory, foreign)

    # -- promotion --------------------------------------------------------------------------

    def pull(
        self,
        keys: npt.NDArray[np.uint64],
        make_room: Callable[[int], object] | None = None,
    ) -> npt.NDArray[np.float32]:
        """``SparseTable.pull``, then only the RAM misses the disk filter does not rule out
        are looked up on disk and promoted (the filter over a whole batch cost more than the
        pull); ``make_room(n)`` first, with how many keys may come into RAM."""
        if self._disk is None:
            return super().pull(keys)
        if not self._touched.covers(self._arrays.keys.shape[0]):
            with self.lock.write():
                self._touched.cover(self._arrays.keys.shape[0])
        missed = np.zeros(keys.size, dtype=np.uint8)
        out = self._pull_ram(keys, missed, self._touched.bits)
        if not len(self._disk):
            return out
        miss = np.flatnonzero(missed)
        if not miss.size:
            return out
        uniq, inverse = np.unique(keys[miss], return_inverse=True)
        with self.lock.read():
            maybe = np.flatnonzero(self._filter.maybe(uniq))
            if maybe.size and not self._any_held(uniq[maybe]):
                return out  # the filter's false positives: zeros, as super().pull left them
        if not maybe.size:  # no tier holds them: zeros, as super().pull left them
            return out
        if make_room is not None:
            make_room(int(maybe.size))
        with self.lock.write():
            values, found = self._fetch_locked(uniq[maybe])
        cols = self.layout.inference_columns()
        pulled = np.zeros((uniq.size, cols.size), dtype=np.float32)
        pulled[maybe[found]] = values[:, cols]
        out[miss] = pulled[inverse]
        return out

    def _any_held(self, keys: npt.NDArray[np.uint64]) -> bool:
        """Whether any of ``keys`` (RAM misses the filter let through) is on disk, or in RAM
        by now. Reader lock held: a pull whose candidates are all false positives then
        needs no writer lock (a promotion puts a key in RAM before it deletes it from disk,
        and a demotion waits for readers, so no key is in neither meanwhile)."""
        if self._disk is not None and self._disk.get(keys)[0].any():
            return True
        a = self._arrays
        rows = np.empty(keys.size, dtype=np.int64)
        ix.lookup_many(a.slots, a.keys, keys, rows)
        return bool((rows >= 0).any())

    def _fetch_locked(
        self, keys: npt.NDArray[np.uint64]
    ) -> tuple[npt.NDArray[np.float32], npt.NDArray[np.bool_]]:
        """Full rows of unique ``keys`` that were not in RAM a moment ago: those in RAM now
        (promoted by someone else) are gathered, disk ones promoted. Writer lock held."""
        a = self._arrays
        rows = np.empty(keys.size, dtype=np.int64)
        ix.lookup_many(a.slots, a.keys, keys, rows)
        in_ram = rows >= 0
        full = np.zeros((keys.size, self.layout.width), dtype=np.float32)
        if in_ram.any():
            full[in_ram] = self.saves.gather_locked(rows[in_ram])[1]
        found = in_ram.copy()
        rest = np.flatnonzero(~in_ram)
        for lo in range(0, rest.size, MOVE_CHUNK):
            part = rest[lo : lo + MOVE_CHUNK]
            found_disk, disk_full, _ = self._promote_locked(keys[part], filtered=True)
            full[part[found_disk]] = disk_full
            found[part[found_disk]] = True
            self._moved()
        return full[found], found

    def _before_push(self, parts: list[Merged]) -> None:
        if self._disk is None or not len(self._disk):
            return
        for p in parts:
            k = p.keys[: int(p.n)]
            rows = np.empty(k.size, dtype=np.int64)
            a = self._arrays
            ix.lookup_many(a.slots, a.keys, k, rows)
            absent = k[rows < 0]
            for lo in range(0, absent.size, MOVE_CHUNK):
                self._promote_locked(absent[lo : lo + MOVE_CHUNK])
                self._moved()

    def _promote_locked(
        self, keys: npt.NDArray[np.uint64], filtered: bool = False
    ) -> tuple[npt.NDArray[np.bool_], npt.NDArray[np.float32], HotCounters]:
        """Move the disk-resident ones of ``keys`` (unique, absent from RAM) into RAM.
        Returns (found on disk, their full rows, hot counters). Writer lock held.
        ``filtered``: the caller already kept only keys the filter does not rule out."""
        store = self._store() if self._disk_opts is not None else None
        if store is None or not keys.size:
            return (
                np.zeros(keys.size, np.bool_),
                np.empty((0, self.layout.width), np.float32),
                dr.no_hot(),
            )
        found = np.zeros(keys.size, dtype=np.bool_)
        maybe = np.arange(keys.size) if filtered else np.flatnonzero(self._filter.maybe(keys))
        if not maybe.size:
            return found, np.empty((0, self.layout.width), np.float32), dr.no_hot()
        on_disk, full, hot = store.get(keys[maybe])
        found[maybe[on_disk]] = True
        k = keys[found]
        if k.size:
            self._place_locked(k, full, hot)
            self.promotions_total += int(k.size)
            if self.lock.maintenance.locked():  # a save may still read the disk copy
                self._shadows.append(k)
            else:
                self._flush_shadows_locked()
                try:
                    store.delete(k, int(hot.positions.size))
                except BaseException:
                    self._shadows.append(k)  # in RAM now: the disk copy is a shadow
                    raise
        return found, full, hot

    def _moved(self) -> None:
        if self.after_move is not None:
            self.after_move()

    def _place_locked(
        self, keys: npt.NDArray[np.uint64], full: npt.NDArray[np.float32], hot: HotCounters
    ) -> None:
        """Put promoted keys' full rows into RAM, marked touched (a demotion right after
        must not send them straight back). Pulls run meanwhile (they do not wait for the
        writer lock): the rows are filled first and put in the index last, so a pull sees
        a key absent (and looks on disk, waiting for this writer) or its whole row."""
        lay = self.layout
        a = self._reserve(int(keys.size))
        rows = np.empty(keys.size, dtype=np.int64)
        ix.take_rows(a.keys, self._meta, keys, rows)
        admitted = int(np.count_nonzero(full[:, lay.xflag] >= 0))
        a = self._reserve_x(admitted, int(hot.positions.size))
        tk.place(a, self._meta, rows, full, hot, lay)
        self._touched.cover(self._arrays.keys.shape[0])
        self._touched.mark(rows)
        ix.publish_rows(a.slots, a.keys, self._meta, rows)

    def _flush_shadows_locked(self) -> None:
        """Delete disk copies of keys promoted during a save (no save runs now)."""
        if self._shadows and self._disk is not None:
            self._disk.delete(np.unique(np.concatenate(self._shadows)))
        self._shadows = []

    # -- demotion ---------------------------------------------------------------------------

    def demote(self, target_bytes: int, exact: bool = False) -> int:
        """Move cold keys to disk until the RAM tier is at most ``target_bytes``
        (``demotion_order``: about the coldest while the disk has room, exactly the
        coldest when some must be evicted or ``exact``). Keys the disk cannot take are
        evicted (tombstoned, counted). Waits for a running save. Returns keys moved or
        evicted."""
        with self.lock.maintenance, self.lock.exclusive():
            self._flush_shadows_locked()
            excess = self.ram_bytes() - target_bytes
            if excess <= 0 or not len(self):
                return 0
            n = min(int(np.ceil(excess / self.key_bytes())), len(self))
            store = self._store()
            if store.room() >= n and not exact:  # which cold ones only changes speed
                rows = sweep_cold(self._arrays, len(self), self._ap, self._touched, self._hand, n)
            else:  # some will be evicted: exactly the coldest, in the shrink rule's order
                salt = (self.moves * 0x9E3779B97F4A7C15) % self._arrays.slots.size
                rows = coldest_rows(self._arrays, len(self), self._ap, self._touched, salt, n)
                self._touched.clear()
            evict = rows.size - min(rows.size, store.room())  # the coldest go first
            evicted = released = 0
            try:
                for lo in range(0, rows.size, MOVE_CHUNK):
                    chunk = rows[lo : lo + MOVE_CHUNK]
                    keys, full, hot = self.saves.gather_locked(chunk)
                    out = max(0, min(chunk.size, evict - lo))  # evicted, not stored
                    try:
                        store.put(keys[out:], full[out:], dr.shift_hot(hot, out))
                        self._filter.add(keys[out:])
                    except DiskFullError as exc:
                        log.warning("table %s: %s; evicting instead", self.name, exc)
                        out = chunk.size
                    tk.release(self._arrays, self._meta, chunk)
                    released += chunk.size
                    self._moved()
                    if out:
                        self.saves.add_tombstones(keys[:out].copy())
                        self._meta[EVICTIONS] += out
                        self.pressure_evictions_total += out
                        evicted += out
            finally:
                # Also when a chunk failed (a storage error other than a full disk): the
                # chunks before it moved, so the demotion ends as if it had finished with
                # them: rows compacted and ``moves`` bumped, or a staged save's commit would
                # apply its effects by row ids that new keys reuse.
                if released:
                    compaction.compact(self._arrays, self._meta, self._touched.bits)
                    self.demotions_total += released - evicted
                    self.moves += 1
            return int(rows.size)

    # -- shrink -----------------------------------------------------------------------------

    def shrink_keys(self) -> tuple[int, npt.NDArray[np.uint64]]:
        """Decay and delete in both tiers (the same kernel for disk rows)."""
        with self.lock.maintenance, self.lock.exclusive():
            self._flush_shadows_locked()
            before_disk = self.disk_keys
            before, gone = self._shrink_locked()
            if self._disk is None or not len(self._disk):
                self._filter = DiskKeyFilter()  # only stale bits left
                return before, gone
            gone_disk = [gone]
            live: list[npt.NDArray[np.uint64]] = []
            for logical in range(self._disk_opts.logical_shards if self._disk_opts else 0):
                gone_disk.append(self._shrink_disk_shard(logical, live))
            # Rebuilt from the live disk keys: drops promoted and deleted keys' stale bits.
            self._filter = DiskKeyFilter(np.concatenate(live) if live else None)
            all_gone = np.concatenate(gone_disk)
            if all_gone.size > gone.size:
                self.saves.add_tombstones(all_gone[gone.size :])
            return before + before_disk, all_gone

    def _shrink_disk_shard(
        self, logical: int, live_keys: list[npt.NDArray[np.uint64]]
    ) -> npt.NDArray[np.uint64]:
        """Shrink one logical shard's disk rows; appends the keys left to ``live_keys``."""
        store = self._store()
        read: list[tuple[npt.NDArray[np.uint64], npt.NDArray[np.float32], HotCounters]] = []
        _retried(lambda: read.append(store.shard_rows(logical)), f"table {self.name}: shrink")
        rows = read[-1]
        if not rows[0].size:
            return np.empty(0, np.uint64)
        gone, kept = dr.shrink(self.layout, self._ap, rows)
        # Retried: RAM and the shards before this one are shrunk already, so a transient
        # storage error must not leave this shard's rows undecayed (both writes are safe
        # to repeat: counts change only once a write succeeded).
        _retried(lambda: store.delete(gone), f"table {self.name}: shrink")
        _retried(lambda: store.replace(*kept), f"table {self.name}: shrink")
        self._meta[EVICTIONS] += gone.size
        live_keys.append(kept[0])
        return gone

    # -- load -------------------------------------------------------------------------------

    def build_tiered(
        self,
        keys: npt.NDArray[np.uint64],
        rows: npt.NDArray[np.float32],
        tombstones: npt.NDArray[np.uint64],
        hot: HotCounters | None,
        ram_budget: int,
    ) -> TieredContent:
        """``build`` that keeps the hottest keys in RAM up to ``ram_budget`` bytes (0 = all)
        and spills the rest into a fresh disk store (a load). Nothing is swapped in."""
        hot = hot or dr.no_hot()
        require_finite_rows(rows, hot.counts)  # spilled rows are not built below
        coeffs = (self.config.nonclkCoeff, self.config.clickCoeff)
        split = dr.ram_split(self.layout, coeffs, (keys, rows, hot), ram_budget)
        if split is None or self._disk_opts is None:
            return TieredContent(self.build(keys, rows, tombstones, hot), None, DiskKeyFilter())
        spill, stay = split
        store = self._new_store()
        try:
            store.put(keys[spill], rows[spill], dr.select_hot(hot, dr.mask(keys.size, spill)))
            ram = self.build(
                keys[stay], rows[stay], tombstones, dr.select_hot(hot, dr.mask(keys.size, stay))
            )
        except BaseException:
            store.close()
            raise
        return TieredContent(ram, store, DiskKeyFilter(keys[spill]))

    def install_tiered(self, content: TieredContent) -> None:
        """Swap in a ``build_tiered`` content: RAM arrays and disk store together. The
        caller holds ``lock.maintenance`` (``Shard.install``)."""
        old = self._disk
        self.install(content.ram)
        self._disk = content.disk
        self._filter = content.filter
        self._shadows = []
        self._touched = TouchedBits()
        self.moves += 1
        if old is not None:
            old.close()

    def close(self) -> None:
        """Close and delete the disk tier's files."""
        if self._disk is not None:
            self._disk.close()
            self._disk = None
        self._filter = DiskKeyFilter()
