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

from streamtrain_worker.predict import SparseModel, apply_chain
from streamtrain_worker.serving.versions import (
    DeliveryState,
    Version,
    state_fields,
    state_from_fields,
)

log = logging.getLogger(__name__)

#: One save: keys, their rows, tombstones (``streamtrain_ps.checkpoint.read_sparse``).
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
        start: list[Part] = []
        if parent is not None:
            with self._lock:
                base = self._versions[parent.id]
            dim = base.values.shape[1]
            start = [(base.keys, base.values, np.zeros(0, np.uint64))]
        table = apply_chain([*start, *parts], dim)
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
#: Rows per bucket a base is sized for; the listpack limits below leave room to grow.
ROWS_PER_BUCKET = 32
LISTPACK_ENTRIES = 512
_WRITE_CHUNK = 512  # buckets per pipeline


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
        if parent is None:
            total = sum(p[0].shape[0] for p in parts)
            bits = max(0, int(np.ceil(np.log2(max(1.0, total / ROWS_PER_BUCKET)))))
            owners = np.full(1 << bits, vid, dtype=np.uint32)
            parent_owners = None
        else:
            parent_owners = self.bucket_map(parent.id)
            owners = parent_owners.copy()
            bits = int(np.log2(owners.shape[0]))
        # Changes per bucket: later parts win; a tombstone deletes, a row inserts/replaces.
        changes: dict[int, dict[bytes, bytes | None]] = {}
        for keys, values, tombstones in parts:
            for arr, rows in ((tombstones, None), (keys, values)):
                if arr.shape[0] == 0:
                    continue
                buckets = mix_bucket(arr, bits)
                kb = np.ascontiguousarray(arr, dtype="<u8").tobytes()
                vb = None if rows is None else np.ascontiguousarray(rows, dtype="<f4").tobytes()
                width = 0 if rows is None else 4 * rows.shape[1]
                for i, b in enumerate(buckets.tolist()):
                    field = kb[8 * i : 8 * i + 8]
                    value = None if vb is None else vb[width * i : width * (i + 1)]
                    changes.setdefault(b, {})[field] = value
        touched = sorted(changes)
        total_rows = 0
        for start in range(0, len(touched), _WRITE_CHUNK):
            chunk = touched[start : start + _WRITE_CHUNK]
            old: list[dict[bytes, bytes]] = [{} for _ in chunk]
            if parent_owners is not None:
                pipe = self._r.pipeline(transaction=False)
                for b in chunk:
                    pipe.hgetall(self._bucket_key(int(parent_owners[b]), b))
                old = pipe.execute()
            pipe = self._r.pipeline(transaction=False)
            for b, content in zip(chunk, old, strict=True):
                for field, value in changes[b].items():
                    if value is None:
                        content.pop(field, None)
                    else:
                        content[field] = value
                key = self._bucket_key(vid, b)
                pipe.delete(key)
                if content:
                    pipe.hset(key, mapping=content)  # type: ignore[arg-type]
                owners[b] = vid
            pipe.execute()
        total_rows = (
            self._count_rows(owners)
            if parent is not None
            else len({f for c in changes.values() for f, v in c.items() if v is not None})
        )
        self._r.set(f"{self._p}map:{vid}", owners.astype("<u4").tobytes())
        with self._maps_lock:
            self._maps[vid] = owners
        return total_rows

    def _count_rows(self, owners: npt.NDArray[np.uint32]) -> int:
        pipe = self._r.pipeline(transaction=False)
        for b, owner in enumerate(owners.tolist()):
            pipe.hlen(self._bucket_key(owner, b))
        return int(sum(pipe.execute()))

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
