"""Versioned sparse tables for serving: rows of a version never change once written.

A request is scored with one version id; it reads that version's rows only, so a delta
being written (a new version, invisible until its commit) never mixes into it. The
delivery state (``versions.DeliveryState``) is stored beside the rows and changed only by
``commit`` (cursor, head, live: one atomic write) and ``pin`` (the pinned field alone).

- ``EmbeddedTable``: in-process; a version is an immutable ``SparseModel`` (sorted keys and
  their rows), a delta is folded into a copy by ``predict.apply_chain``; the default on one
  machine.
- ``RedisTable``: Redis; rows in buckets (a string of packed records each), copy-on-write
  per bucket: a version owns the buckets it changed and shares the others through its
  bucket map (docs/serving.md, "Redis layout").
"""

from __future__ import annotations

import json
import logging
import threading
import uuid
from abc import ABC, abstractmethod
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt
import redis

from streamtrain_worker.publishing.predict import SparseModel, apply_chain
from streamtrain_worker.serving.versions import (
    DeliveryState,
    Version,
    state_fields,
    state_from_fields,
)

log = logging.getLogger(__name__)

#: One save: keys, their rows, tombstones (``streamtrain_ps.saves.checkpoint.read_sparse``).
Part = tuple[npt.NDArray[np.uint64], npt.NDArray[np.float32], npt.NDArray[np.uint64]]
Rows = tuple[npt.NDArray[np.float32], npt.NDArray[np.bool_]]
#: Fields ``commit`` writes; ``pinned`` is only ever written by ``pin``.
_COMMIT_FIELDS = ("cursor", "head", "live", "history", "refused")
#: Accepted versions remembered in the state (their rows are kept only while needed).
HISTORY = 16


class VersionGoneError(LookupError):
    """The version's rows were dropped (the caller scores with the served version again)."""


class VersionedTable(ABC):
    """What the delivery writes and the server reads (module docstring)."""

    @abstractmethod
    def state(self) -> DeliveryState: ...

    def served(self) -> int:
        """``state().served`` alone (what a server polls for: cheaper than the state)."""
        return self.state().served

    def warm(self, vid: int) -> None:
        """Read ahead what requests will read from ``vid`` (before it is served)."""
        del vid  # by default nothing to read ahead (the embedded table is in memory)

    @abstractmethod
    def write(self, version: Version, parent: Version | None, parts: Sequence[Part]) -> int:
        """Store ``version``'s rows: ``parts`` applied in order onto ``parent``'s rows (or an
        empty table); invisible until ``commit``. Returns the version's row count."""

    @abstractmethod
    def _commit_fields(self, fields: Mapping[str, str]) -> None: ...

    @abstractmethod
    def _pin_field(self, value: str) -> None: ...

    @abstractmethod
    def lookup(self, vid: int, keys: npt.NDArray[np.uint64]) -> Rows:
        """Rows of ``keys`` in version ``vid`` and which were found (a miss: zeros)."""

    @abstractmethod
    def drop(self, vids: set[int]) -> None:
        """Free the rows of versions ``vids`` (rows other versions share stay)."""

    @abstractmethod
    def stored(self) -> set[int]:
        """Versions whose rows are (possibly partly) stored."""

    def commit(self, version: Version | None, cursor: int, refused: bool = False) -> None:
        """Atomically: the cursor moves to ``cursor``; ``version`` (if any) becomes the head,
        and the live version if accepted; a refusal is counted."""
        s = self.state()
        head, live, history = s.head, s.live, s.history
        if version is not None:
            head = version
            if version.accepted:
                live = version.id
                history = (*history, version)[-HISTORY:]
        new = DeliveryState(cursor, head, live, s.pinned, history, s.refused + int(refused))
        fields = state_fields(new)
        self._commit_fields({k: fields[k] for k in _COMMIT_FIELDS})

    def pin(self, vid: int) -> DeliveryState:
        """Serve accepted version ``vid`` until unpinned (0: follow the live version)."""
        s = self.state()
        if vid and not any(v.id == vid for v in s.history):
            stored = ", ".join(f"{v.id} ({v.key})" for v in s.history) or "none"
            raise LookupError(f"version {vid} is not an accepted stored version ({stored})")
        if vid and vid not in self.stored():
            raise LookupError(f"version {vid} was dropped")
        self._pin_field(str(vid))
        return self.state()

    def rollback(self) -> DeliveryState:
        """Pin the accepted version before the served one."""
        prev = self.state().previous()
        if prev is None:
            raise LookupError("no earlier accepted version to roll back to")
        return self.pin(prev.id)


def _final_ops(
    parts: Sequence[Part], dim: int
) -> tuple[npt.NDArray[np.uint64], npt.NDArray[np.bool_], npt.NDArray[np.float32]]:
    """The last operation on every key over ``parts`` in order (each part: its tombstones,
    then its rows, as ``predict.apply_chain``): keys, whether it is a set (else a delete),
    and the rows of the sets, in key order."""
    keys, sets, rows, row_of = [], [], [], []
    offset = 0
    for k, v, t in parts:
        keys += [np.asarray(t, np.uint64), np.asarray(k, np.uint64)]
        sets += [np.zeros(t.shape[0], bool), np.ones(k.shape[0], bool)]
        row_of += [np.full(t.shape[0], -1, np.int64), np.arange(k.shape[0]) + offset]
        rows.append(np.asarray(v, np.float32).reshape(-1, dim))
        offset += k.shape[0]
    if not keys:
        return np.zeros(0, np.uint64), np.zeros(0, bool), np.zeros((0, dim), np.float32)
    all_keys = np.concatenate(keys)
    # The last occurrence of every key: unique over the reversed sequence.
    _, first_rev = np.unique(all_keys[::-1], return_index=True)
    last = all_keys.shape[0] - 1 - first_rev
    is_set = np.concatenate(sets)[last]
    values = np.concatenate(rows)[np.concatenate(row_of)[last][is_set]]
    return all_keys[last], is_set, values


def _fold_sorted(table: SparseModel, part: Part) -> SparseModel:
    """``predict.apply_chain`` of one save onto a table whose keys are sorted: the keys to
    drop found by binary search (measured: np.isin over the whole table took 0.65 s of a
    1.3 s apply of a 100k-key delta to 200k keys)."""
    keys, values, tombstones = part
    drop = np.zeros(table.keys.shape[0], dtype=bool)
    if table.keys.shape[0]:
        for probe in (np.asarray(tombstones, np.uint64), np.asarray(keys, np.uint64)):
            pos = np.minimum(np.searchsorted(table.keys, probe), table.keys.shape[0] - 1)
            drop[pos[table.keys[pos] == probe]] = True
    merged_keys = np.concatenate([table.keys[~drop], np.asarray(keys, np.uint64)])
    merged = np.concatenate([table.values[~drop], np.asarray(values, np.float32)])
    order = np.argsort(merged_keys, kind="stable")
    return SparseModel(merged_keys[order], merged[order])


def mix_bucket(keys: npt.NDArray[np.uint64], bits: int) -> npt.NDArray[np.int64]:
    """Bucket of every key: the top ``bits`` of a multiplicative hash (Fibonacci hashing)."""
    if bits == 0:
        return np.zeros(keys.shape[0], dtype=np.int64)
    with np.errstate(over="ignore"):
        mixed = keys.astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15)
    return (mixed >> np.uint64(64 - bits)).astype(np.int64)


class EmbeddedTable(VersionedTable):
    """In-process versions (module docstring); thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._fields: dict[str, str] = {}
        self._versions: dict[int, SparseModel] = {}

    def state(self) -> DeliveryState:
        with self._lock:
            return state_from_fields(self._fields)

    def write(self, version: Version, parent: Version | None, parts: Sequence[Part]) -> int:
        dim = parts[0][1].shape[1] if parts and parts[0][1].ndim == 2 else 0
        if parent is None:
            table = apply_chain(parts, dim)
        else:
            with self._lock:
                table = self._versions[parent.id]
            for part in parts:
                table = _fold_sorted(table, part)
        with self._lock:
            self._versions[version.id] = table
        return int(table.keys.shape[0])

    def _commit_fields(self, fields: Mapping[str, str]) -> None:
        with self._lock:
            self._fields.update(fields)

    def _pin_field(self, value: str) -> None:
        with self._lock:
            self._fields["pinned"] = value

    def table(self, vid: int) -> SparseModel:
        with self._lock:
            found = self._versions.get(vid)
        if found is None:
            raise VersionGoneError(f"version {vid} is not stored")
        return found

    def lookup(self, vid: int, keys: npt.NDArray[np.uint64]) -> Rows:
        t = self.table(vid)
        out = np.zeros((keys.shape[0], t.values.shape[1]), dtype=np.float32)
        if t.keys.shape[0] == 0:
            return out, np.zeros(keys.shape[0], dtype=bool)
        pos = np.minimum(np.searchsorted(t.keys, keys), t.keys.shape[0] - 1)
        hit = t.keys[pos] == keys
        out[hit] = t.values[pos[hit]]
        return out, hit

    def drop(self, vids: set[int]) -> None:
        with self._lock:
            for vid in vids:
                self._versions.pop(vid, None)

    def stored(self) -> set[int]:
        with self._lock:
            return set(self._versions)


#: Rows per bucket a base is sized for.
ROWS_PER_BUCKET = 32
#: Buckets per MGET/MSET (~0.7 MB of rows: well under a ms of Redis time, so lookups interleave).
_CHUNK = 512
_MIX = np.uint64(0x9E3779B97F4A7C15)
#: Bytes of bucket strings a serving process keeps (``RedisTable``'s read cache).
CACHE_BYTES = 256 << 20
#: Buckets a server remembers reading, to read ahead for a new version (``RedisTable.warm``).
_HOT_BUCKETS = 4096


def _mix(keys: npt.NDArray[np.uint64]) -> npt.NDArray[np.uint64]:
    """Fibonacci hash of every key: a bijection of the 64-bit keys (an odd multiplier), whose
    top bits are the bucket (``mix_bucket``) and whose order is a bucket's record order."""
    with np.errstate(over="ignore"):
        return keys.astype(np.uint64) * _MIX


def _record(width: int) -> np.dtype[Any]:
    """One row in a bucket: 8-byte little-endian key, then the row's float32 values."""
    return np.dtype([("k", "<u8"), ("v", "<f4", (width,))])


class RedisTable(VersionedTable):
    """Versions in Redis under ``<prefix>`` (docs/serving.md, "Redis layout")::

    <prefix>meta            hash: the delivery state (versions.state_fields), stored,
                            width (float32 values of a row), epoch (a random id set by
                            the first write under the prefix)
    <prefix>map:<v>         string: uint32 owner version of each bucket of version v
    <prefix>r:<owner>:<b>   string: the bucket's records (8-byte key, float32 row) sorted
                            by the keys' hash; absent: an empty bucket

    A version is written copy-on-write per bucket, built in numpy on the client: the
    touched buckets of the parent are read once (pipelined MGETs), merged with the delta
    in one vectorised pass and written back as new keys (pipelined MSETs); untouched
    buckets are shared through the map. Nothing is visible before ``commit``.

    A committed bucket key never changes until it is deleted, so lookups keep the buckets
    they read in an LRU cache of ``cache_bytes``: a request whose buckets were read before
    makes no Redis round trip (a round trip was ~90% of a batch-1 request's time). A key
    name is immutable only while the data under the prefix lives: if it is flushed and
    written again, version ids and bucket names repeat with other rows, so the caches are
    keyed to the prefix's ``epoch`` and emptied when a poll of ``served`` sees it change.
    """

    def __init__(
        self, client: redis.Redis, prefix: str = "st:", cache_bytes: int = CACHE_BYTES
    ) -> None:
        self._r = client
        self._p = prefix
        self._maps: dict[int, npt.NDArray[np.uint32]] = {}
        self._maps_lock = threading.Lock()
        self._width = 0
        self._cache: OrderedDict[str, bytes] = OrderedDict()
        self._cache_bytes = 0
        self._cache_limit = cache_bytes
        self._cache_lock = threading.Lock()
        #: Buckets lookups read (bounded like the cache): what ``warm`` reads ahead.
        self._hot: OrderedDict[int, None] = OrderedDict()
        #: The prefix's epoch the caches hold rows of (``served`` empties them on a change).
        self._epoch: bytes | None = None

    @classmethod
    def connect(cls, url: str, prefix: str = "st:", cache_bytes: int = CACHE_BYTES) -> RedisTable:
        return cls(redis.Redis.from_url(url), prefix, cache_bytes)

    # -- state -------------------------------------------------------------------------

    def state(self) -> DeliveryState:
        raw: dict[bytes, bytes] = self._r.hgetall(f"{self._p}meta")  # type: ignore[assignment]
        return state_from_fields({k.decode(): v for k, v in raw.items()})

    def served(self) -> int:
        pinned, live, epoch = self._r.hmget(f"{self._p}meta", ["pinned", "live", "epoch"])
        if epoch != self._epoch:
            self._forget(epoch)  # type: ignore[arg-type]
        return int(pinned or 0) or int(live or 0)

    def _forget(self, epoch: bytes | None) -> None:
        """Empty every cache: the data under the prefix is not the data they were read from."""
        with self._maps_lock:
            self._maps.clear()
        with self._cache_lock:
            self._cache.clear()
            self._cache_bytes = 0
            self._hot.clear()
        self._epoch = epoch

    def _commit_fields(self, fields: Mapping[str, str]) -> None:
        # One HSET of every field: atomic in Redis (a single command).
        self._r.hset(f"{self._p}meta", mapping=dict(fields))  # type: ignore[arg-type]

    def _pin_field(self, value: str) -> None:
        self._r.hset(f"{self._p}meta", "pinned", value)

    def stored(self) -> set[int]:
        raw = self._r.hget(f"{self._p}meta", "stored")
        return set(json.loads(raw)) if raw else set()

    def _set_stored(self, vids: set[int]) -> None:
        self._r.hset(f"{self._p}meta", "stored", json.dumps(sorted(vids)))

    # -- rows --------------------------------------------------------------------------

    def bucket_map(self, vid: int) -> npt.NDArray[np.uint32]:
        """Owner version of every bucket of ``vid`` (immutable: cached)."""
        with self._maps_lock:
            found = self._maps.get(vid)
        if found is not None:
            return found
        raw = self._r.get(f"{self._p}map:{vid}")
        if raw is None:
            raise VersionGoneError(f"version {vid} is not stored in Redis")
        owners = np.frombuffer(raw, dtype="<u4").astype(np.uint32)  # type: ignore[arg-type]
        with self._maps_lock:
            self._maps[vid] = owners
        return owners

    def _bucket_key(self, owner: int, bucket: int) -> str:
        return f"{self._p}r:{owner}:{bucket}"

    def warm(self, vid: int) -> None:
        """Read the buckets lookups read lately, as ``vid`` owns them, into the cache: the
        first requests on a new version then make no round trip either."""
        if self._cache_limit:
            with self._cache_lock:
                hot = list(self._hot)
            self._cached_read(self.bucket_map(vid), sorted(hot), note=False)

    def _cached_read(
        self, owners: npt.NDArray[np.uint32], buckets: Sequence[int], note: bool = True
    ) -> bytes:
        """``_read`` through the cache (only committed versions are looked up, and their
        bucket keys are immutable; an absent bucket is not cached)."""
        names = [self._bucket_key(int(owners[b]), b) for b in buckets]
        with self._cache_lock:
            if note and self._cache_limit:
                for b in buckets:
                    self._hot[b] = None
                    self._hot.move_to_end(b)
                while len(self._hot) > _HOT_BUCKETS:
                    self._hot.popitem(last=False)
            found = [self._cache.get(n) for n in names]
            for n, blob in zip(names, found, strict=True):
                if blob is not None:
                    self._cache.move_to_end(n)
        missing = [i for i, blob in enumerate(found) if blob is None]
        if missing:
            replies = self._mget([names[i] for i in missing])
            with self._cache_lock:
                for i, blob in zip(missing, replies, strict=True):
                    found[i] = blob
                    if blob and self._cache_limit and names[i] not in self._cache:
                        self._cache[names[i]] = blob
                        self._cache_bytes += len(blob)
                while self._cache_bytes > self._cache_limit and self._cache:
                    self._cache_bytes -= len(self._cache.popitem(last=False)[1])
        return b"".join(blob for blob in found if blob)

    def _read(self, owners: npt.NDArray[np.uint32], buckets: Sequence[int]) -> bytes:
        """The records of ``buckets`` (increasing) under their owners, concatenated."""
        names = [self._bucket_key(int(owners[b]), b) for b in buckets]
        return b"".join(blob for blob in self._mget(names) if blob)

    def _mget(self, names: Sequence[str]) -> list[bytes | None]:
        replies: list[list[bytes | None]]
        if len(names) <= _CHUNK:
            replies = [self._r.mget(names)] if names else []  # type: ignore[list-item]
        else:
            pipe = self._r.pipeline(transaction=False)
            for start in range(0, len(names), _CHUNK):
                pipe.mget(names[start : start + _CHUNK])
            replies = pipe.execute()
        return [blob for reply in replies for blob in reply]

    def write(self, version: Version, parent: Version | None, parts: Sequence[Part]) -> int:
        vid = version.id
        self._clear_partial(vid)
        width = next((p[1].shape[1] for p in parts if p[1].ndim == 2), 0)
        stored = json.dumps(sorted(self.stored() | {vid}))
        self._r.hsetnx(f"{self._p}meta", "epoch", uuid.uuid4().hex)
        epoch = self._r.hget(f"{self._p}meta", "epoch")
        if epoch != self._epoch:  # parents are read through the caches too
            self._forget(epoch)  # type: ignore[arg-type]
        self._r.hset(f"{self._p}meta", mapping={"stored": stored, "width": width})
        self._width = width
        rec = _record(width)
        keys, sets, rows = _final_ops(parts, width)
        row_of = np.cumsum(sets) - 1  # a set's row in ``rows``
        # Every operation in hash order: the order of the records in the buckets.
        order = np.argsort(_mix(keys))
        keys, sets, row_of = keys[order], sets[order], row_of[order]
        op_mix = _mix(keys)
        new = np.empty(int(np.count_nonzero(sets)), dtype=rec)
        new["k"], new["v"] = keys[sets], rows[row_of[sets]]
        new_mix = op_mix[sets]
        if parent is None:
            count = new.shape[0]
            bits = max(0, int(np.ceil(np.log2(max(1.0, count / ROWS_PER_BUCKET)))))
            owners = np.full(1 << bits, vid, dtype=np.uint32)
            touched = np.arange(1 << bits)
            kept, kept_mix, removed = np.zeros(0, dtype=rec), np.zeros(0, np.uint64), 0
        else:
            owners = self.bucket_map(parent.id).copy()
            bits = int(np.log2(owners.shape[0]))
            hits = np.bincount(mix_bucket(keys, bits), minlength=owners.shape[0])
            touched = np.flatnonzero(hits)
            # The parent's touched buckets, less every key the delta deletes or sets.
            old = np.frombuffer(self._read(owners, touched.tolist()), dtype=rec)
            old_mix = _mix(old["k"])
            pos = np.minimum(np.searchsorted(op_mix, old_mix), max(0, op_mix.shape[0] - 1))
            gone = op_mix[pos] == old_mix
            kept, kept_mix, removed = old[~gone], old_mix[~gone], int(np.count_nonzero(gone))
        # Merge two hash-sorted runs: each new record goes after the kept ones below it.
        merged = np.empty(kept.shape[0] + new.shape[0], dtype=rec)
        at_new = np.searchsorted(kept_mix, new_mix) + np.arange(new.shape[0])
        is_new = np.zeros(merged.shape[0], dtype=bool)
        is_new[at_new] = True
        merged[at_new] = new
        merged[~is_new] = kept
        merged_mix = np.empty(merged.shape[0], dtype=np.uint64)
        merged_mix[at_new], merged_mix[~is_new] = new_mix, kept_mix
        # Each touched bucket's slice (its number: the hash's top bits); empty ones are absent.
        edges = np.searchsorted(
            merged_mix >> np.uint64(64 - bits) if bits else np.zeros(merged.shape[0], np.uint64),
            np.r_[touched, owners.shape[0]].astype(np.uint64),
        )
        sizes = np.diff(edges) * rec.itemsize
        owners[touched] = vid
        blob = merged.tobytes()
        full = np.flatnonzero(sizes)
        lows, highs = (
            (edges[full] * rec.itemsize).tolist(),
            (edges[full + 1] * rec.itemsize).tolist(),
        )
        buckets = touched[full].tolist()
        pipe = self._r.pipeline(transaction=False)
        for start in range(0, len(buckets), _CHUNK):
            pipe.mset(
                {
                    self._bucket_key(vid, buckets[j]): blob[lows[j] : highs[j]]
                    for j in range(start, min(start + _CHUNK, len(buckets)))
                }
            )
        pipe.execute()
        self._r.set(f"{self._p}map:{vid}", owners.astype("<u4").tobytes())
        with self._maps_lock:
            self._maps[vid] = owners
        return (parent.keys if parent is not None else 0) - removed + int(new.shape[0])

    def _clear_partial(self, vid: int) -> None:
        """What an interrupted attempt at ``vid`` left (it was marked stored before its first
        bucket was written, so a first attempt scans nothing)."""
        if vid in self.stored():
            self.drop({vid})

    def lookup(self, vid: int, keys: npt.NDArray[np.uint64]) -> Rows:
        owners = self.bucket_map(vid)
        bits = int(np.log2(owners.shape[0]))
        n = keys.shape[0]
        if not self._width:
            self._width = int(self._r.hget(f"{self._p}meta", "width") or 0)
        if n == 0:
            return np.zeros((0, self._width), dtype=np.float32), np.zeros(0, dtype=bool)
        wanted = _mix(keys)
        touched = np.unique(mix_bucket(keys, bits)).tolist()
        records = np.frombuffer(self._cached_read(owners, touched), dtype=_record(self._width))
        rows = np.zeros((n, self._width), dtype=np.float32)
        if records.shape[0] == 0:
            return rows, np.zeros(n, dtype=bool)
        have = _mix(records["k"])  # sorted: buckets in order, each sorted by hash
        pos = np.minimum(np.searchsorted(have, wanted), records.shape[0] - 1)
        hit = have[pos] == wanted
        rows[hit] = records["v"][pos[hit]]
        return rows, hit

    def set_width(self, width: int) -> None:
        """Row width (3 + embedding dim): the size of a bucket's records."""
        self._width = width

    def drop(self, vids: set[int]) -> None:
        stored = self.stored()
        keep = stored - vids
        shared: set[tuple[int, int]] = set()
        for k in keep:
            try:
                owners = self.bucket_map(k)
            except VersionGoneError:
                continue
            shared.update((int(o), b) for b, o in enumerate(owners.tolist()) if o in vids)
        for vid in vids:
            try:
                owners = self.bucket_map(vid)
            except VersionGoneError:  # an attempt cut before its map: whatever it wrote
                self._delete(list(self._r.scan_iter(match=f"{self._p}r:{vid}:*", count=1000)))
                owners = np.zeros(0, dtype=np.uint32)
            mine = [b for b, o in enumerate(owners.tolist()) if o == vid and (vid, b) not in shared]
            self._delete([self._bucket_key(vid, b) for b in mine])
            self._r.delete(f"{self._p}map:{vid}")
            with self._maps_lock:
                self._maps.pop(vid, None)
        self._set_stored(keep)

    def _delete(self, names: Sequence[str | bytes]) -> None:
        for start in range(0, len(names), 1000):
            self._r.delete(*names[start : start + 1000])

    def served_memory(self, vid: int, width: int) -> tuple[int, int]:
        """Bytes Redis reports (MEMORY USAGE) for version ``vid``'s buckets and map, and its
        rows (records of ``width`` float32 values)."""
        owners = self.bucket_map(vid)
        pipe = self._r.pipeline(transaction=False)
        for b, owner in enumerate(owners.tolist()):
            pipe.memory_usage(self._bucket_key(owner, b), samples=0)
            pipe.strlen(self._bucket_key(owner, b))
        replies = pipe.execute()
        used = sum(int(x or 0) for x in replies[0::2])
        used += int(self._r.memory_usage(f"{self._p}map:{vid}", samples=0) or 0)
        rows = sum(int(x) for x in replies[1::2]) // _record(width).itemsize
        return used, rows
