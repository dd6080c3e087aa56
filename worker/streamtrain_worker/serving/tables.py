"""Versioned sparse tables for serving: rows of a version never change once written.

A request is scored with one version id; it reads that version's rows only, so a delta
being written (a new version, invisible until its commit) never mixes into it. The
delivery state (``versions.DeliveryState``) is stored beside the rows and changed only by
``commit`` (cursor, head, live: one atomic write) and ``pin`` (the pinned field alone).

- ``EmbeddedTable``: in-process; a version is an immutable ``SparseModel`` (sorted keys and
  their rows), a delta is folded into a copy by ``predict.apply_chain``; the default on one
  machine.
- ``RedisTable``: Redis; rows in small hashes (packed float32 values, listpack-encoded),
  copy-on-write per bucket: a version owns the buckets it changed and shares the others
  through its bucket map (docs/serving.md, "Redis layout").
"""

from __future__ import annotations

import json
import logging
import threading
import time
from abc import ABC, abstractmethod
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


#: Reads every bucket's fields in one round trip: KEYS are bucket hashes, ARGV starts with
#: one field count per key, then the fields; the reply is the values in order (nil: absent).
_LOOKUP_LUA = """
local out = {}
local pos = #KEYS + 1
for i, k in ipairs(KEYS) do
  local n = tonumber(ARGV[i])
  local vals = redis.call('HMGET', k, unpack(ARGV, pos, pos + n - 1))
  pos = pos + n
  for j = 1, n do out[#out + 1] = vals[j] end
end
return out
"""
#: Copy-on-write of buckets inside Redis. ARGV: the record width (8 + row bytes), then per
#: bucket: the parent's bucket ("" for none), the new bucket, its deleted keys (8 bytes
#: each, concatenated), its set records (key then row, concatenated). Returns the change
#: in rows over all buckets.
_APPLY_LUA = """
local rec = tonumber(ARGV[1])
local i = 2
local delta = 0
while i <= #ARGV do
  local src, dst, dels, sets = ARGV[i], ARGV[i + 1], ARGV[i + 2], ARGV[i + 3]
  i = i + 4
  local before = 0
  if src ~= '' then
    before = redis.call('HLEN', src)
    redis.call('COPY', src, dst, 'REPLACE')
  else
    redis.call('DEL', dst)
  end
  local args = {}
  for o = 1, #dels, 8 do
    args[#args + 1] = string.sub(dels, o, o + 7)
    if #args == 1000 or o + 8 > #dels then
      redis.call('HDEL', dst, unpack(args))
      args = {}
    end
  end
  for o = 1, #sets, rec do
    args[#args + 1] = string.sub(sets, o, o + 7)
    args[#args + 1] = string.sub(sets, o + 8, o + rec - 1)
    if #args == 2000 or o + rec > #sets then
      redis.call('HSET', dst, unpack(args))
      args = {}
    end
  end
  delta = delta + redis.call('HLEN', dst) - before
end
return delta
"""
#: Rows per bucket a base is sized for; the listpack limits below leave room to grow.
ROWS_PER_BUCKET = 32
LISTPACK_ENTRIES = 512
_WRITE_CHUNK = 256  # buckets per script call (a few ms of Redis time each)


class RedisTable(VersionedTable):
    """Versions in Redis under ``<prefix>`` (docs/serving.md, "Redis layout")::

    <prefix>meta            hash: the delivery state (versions.state_fields), dim, stored
    <prefix>map:<v>         string: uint32 owner version of each bucket of version v
    <prefix>r:<owner>:<b>   hash: 8-byte little-endian key -> packed float32 row
    """

    def __init__(self, client: redis.Redis, prefix: str = "st:") -> None:
        self._r = client
        self._p = prefix
        self._maps: dict[int, npt.NDArray[np.uint32]] = {}
        self._maps_lock = threading.Lock()
        self._lookup = client.register_script(_LOOKUP_LUA)
        self._apply = client.register_script(_APPLY_LUA)

    @classmethod
    def connect(cls, url: str, prefix: str = "st:") -> RedisTable:
        return cls(redis.Redis.from_url(url), prefix)

    def tune(self, row_bytes: int) -> None:
        """Let bucket hashes stay listpacks (compact) for rows of ``row_bytes``; a managed
        Redis may refuse CONFIG SET: then set these in its configuration."""
        wanted = {
            "hash-max-listpack-value": str(max(64, row_bytes)),
            "hash-max-listpack-entries": str(LISTPACK_ENTRIES),
        }
        try:
            for name, value in wanted.items():
                current = self._r.config_get(name).get(name)
                if current is None or int(current) < int(value):
                    self._r.config_set(name, value)
        except redis.ResponseError as exc:
            log.warning("cannot set %s (%s): buckets may use more memory", wanted, exc)

    # -- state -------------------------------------------------------------------------

    def state(self) -> DeliveryState:
        raw: dict[bytes, bytes] = self._r.hgetall(f"{self._p}meta")  # type: ignore[assignment]
        return state_from_fields({k.decode(): v for k, v in raw.items()})

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

    def write(self, version: Version, parent: Version | None, parts: Sequence[Part]) -> int:
        vid = version.id
        self._clear_partial(vid)
        self._set_stored(self.stored() | {vid})
        dim = next((p[1].shape[1] for p in parts if p[1].ndim == 2), 0)
        self.tune(4 * dim)
        keys, is_set, rows = _final_ops(parts, dim)
        if parent is None:
            count = int(np.count_nonzero(is_set))
            bits = max(0, int(np.ceil(np.log2(max(1.0, count / ROWS_PER_BUCKET)))))
            owners = np.full(1 << bits, vid, dtype=np.uint32)
            parent_owners = None
            total = 0
        else:
            parent_owners = self.bucket_map(parent.id)
            owners = parent_owners.copy()
            bits = int(np.log2(owners.shape[0]))
            total = parent.keys
        buckets = mix_bucket(keys, bits)
        order = np.argsort(buckets, kind="stable")
        rank = np.cumsum(is_set) - 1  # row of each set, in key order
        rows = rows[rank[order][is_set[order]]]
        buckets, keys, is_set = buckets[order], keys[order], is_set[order]
        # Every set as one record (8-byte key, then the row), every delete as its key: a
        # bucket's changes are two byte strings (redis-py packs each argument in Python,
        # which took 1.7 s of a 2.7 s delta when every field was its own argument).
        record = np.empty(int(np.count_nonzero(is_set)), dtype=[("k", "<u8"), ("v", "<f4", (dim,))])
        record["k"] = keys[is_set]
        record["v"] = rows
        set_bytes = record.tobytes()
        del_bytes = np.ascontiguousarray(keys[~is_set], dtype="<u8").tobytes()
        rec = 8 + 4 * dim
        cuts = np.flatnonzero(np.r_[True, buckets[1:] != buckets[:-1], True])
        sets_before = np.r_[0, np.cumsum(is_set)][cuts]
        dels_before = cuts - sets_before
        touched = buckets[cuts[:-1]].tolist()
        for start in range(0, len(touched), _WRITE_CHUNK):
            args: list[bytes | str | int] = [rec]
            for j in range(start, min(start + _WRITE_CHUNK, len(touched))):
                b = touched[j]
                src = "" if parent_owners is None else self._bucket_key(int(parent_owners[b]), b)
                dels = del_bytes[8 * int(dels_before[j]) : 8 * int(dels_before[j + 1])]
                sets = set_bytes[rec * int(sets_before[j]) : rec * int(sets_before[j + 1])]
                args += [src, self._bucket_key(vid, b), dels, sets]
                owners[b] = vid
            # One script per chunk: the Python side sends each delta row once, Redis copies.
            total += int(self._apply(args=args))
        self._r.set(f"{self._p}map:{vid}", owners.astype("<u4").tobytes())
        with self._maps_lock:
            self._maps[vid] = owners
        return total

    def _clear_partial(self, vid: int) -> None:
        """Buckets an interrupted attempt at ``vid`` left (its map was never written)."""
        if self._r.exists(f"{self._p}map:{vid}"):
            self.drop({vid})
        batch = list(self._r.scan_iter(match=f"{self._p}r:{vid}:*", count=1000))
        for start in range(0, len(batch), 1000):
            self._r.delete(*batch[start : start + 1000])

    def lookup(self, vid: int, keys: npt.NDArray[np.uint64]) -> Rows:
        owners = self.bucket_map(vid)
        bits = int(np.log2(owners.shape[0]))
        n = keys.shape[0]
        dim = self._dim_hint
        if n == 0:
            return np.zeros((0, dim), dtype=np.float32), np.zeros(0, dtype=bool)
        buckets = mix_bucket(keys, bits)
        order = np.argsort(buckets, kind="stable")
        sorted_buckets = buckets[order]
        starts = np.flatnonzero(np.r_[True, sorted_buckets[1:] != sorted_buckets[:-1]])
        counts = np.diff(np.r_[starts, n])
        bucket_keys = [self._bucket_key(int(owners[b]), int(b)) for b in sorted_buckets[starts]]
        kb = np.ascontiguousarray(keys[order], dtype="<u8").tobytes()
        fields = [kb[8 * i : 8 * i + 8] for i in range(n)]
        values: list[bytes | None] = self._lookup(
            keys=bucket_keys, args=[*counts.tolist(), *fields]
        )
        hit_sorted = np.array([v is not None for v in values], dtype=bool)
        found = [v for v in values if v is not None]
        if found:
            width = len(found[0]) // 4
            self._dim_hint = width
        width = self._dim_hint
        rows_sorted = np.zeros((n, width), dtype=np.float32)
        if found:
            rows_sorted[hit_sorted] = np.frombuffer(b"".join(found), dtype="<f4").reshape(-1, width)
        rows = np.empty_like(rows_sorted)
        rows[order] = rows_sorted
        hit = np.empty(n, dtype=bool)
        hit[order] = hit_sorted
        return rows, hit

    _dim_hint = 0

    def set_width(self, width: int) -> None:
        """Row width (3 + embedding dim) for lookups that hit nothing."""
        self._dim_hint = width

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
            except VersionGoneError:
                owners = np.zeros(0, dtype=np.uint32)
            mine = [b for b, o in enumerate(owners.tolist()) if o == vid and (vid, b) not in shared]
            for start in range(0, len(mine), 1000):
                self._r.delete(*(self._bucket_key(vid, b) for b in mine[start : start + 1000]))
            self._r.delete(f"{self._p}map:{vid}")
            with self._maps_lock:
                self._maps.pop(vid, None)
        self._set_stored(keep)

    def memory(self) -> dict[str, Any]:
        """Bytes Redis reports for the rows of every stored version (MEMORY USAGE)."""
        total = 0
        rows = 0
        for key in self._r.scan_iter(match=f"{self._p}r:*", count=1000):
            total += int(self._r.memory_usage(key, samples=0) or 0)
            rows += int(self._r.hlen(key))
        for key in self._r.scan_iter(match=f"{self._p}map:*", count=1000):
            total += int(self._r.memory_usage(key, samples=0) or 0)
        return {"bytes": total, "rows": rows, "at": time.time()}
