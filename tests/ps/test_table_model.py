"""A model test of the sparse table: a capped, tiered shard against an unlimited one.

Hypothesis drives both shards with the same random program (pulls, pushes, demotions,
plain, staged and snapshot saves committed early or late, shrinks, loads, N -> M
reshards of the capped shard's checkpoint) while it injects
faults into the capped shard's disk store at any call (``put``, ``get``, ``delete``,
``replace``, ``shard_rows``; the two kinds of error the store raises: ``DiskFullError``
and the plain exception RocksDB's binding raises for an I/O error). After every step every
key's full row, exact counters, tombstones and key count are identical, and so is the
content of every save. An operation the fault made fail must leave the capped shard as if
it had not run, or as if it had finished (then the reference runs it too).

Keys a full disk made the tier evict (tombstoned, counted) are the one allowed difference:
they leave the comparison for good.

The capped shard runs under its memory governor with a tables-only budget (deterministic:
no RSS feedback), so pushes, pulls and loads demote and promote on their own; a rule
demotes explicitly too. ``make test`` runs 25 programs of up to 18 steps (~380 checked
steps, ~12 s); ``make test-deep`` (STREAMTRAIN_DEEP=1) runs 300 of up to 40. What the
first runs found beyond issue 25's six: a save's side effects failing on a disk read
applied the RAM part only (now disk first, and a failed commit stays pending), and a
shrink whose disk writes failed left RAM decayed and disk rows not (now retried).

The second test puts a pull from another thread at each point where a promotion, demotion
or compaction publishes a change, and checks what it sees.
"""

from __future__ import annotations

import itertools
import os
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from streamtrain_ps.api import SaveMode, SparsePush
from streamtrain_ps.client.local import LocalPS
from streamtrain_ps.config import PSConfig, SparseOptimizerConfig, TableConfig
from streamtrain_ps.saves import checkpoint, load_plan
from streamtrain_ps.shard import Shard
from streamtrain_ps.tier import compaction, tiering
from streamtrain_ps.tier.disk_store import DiskFullError, DiskStore
from streamtrain_ps.tier.memory_limit import MemoryBudget

T = "embedding"
D = 3
KEYS = 240
L = 4
LIMIT = 9_000  # table bytes: ~100 keys in RAM, the rest on disk
DEEP = os.environ.get("STREAMTRAIN_DEEP") == "1"
STORE_CALLS = ("put", "get", "delete", "replace", "shard_rows")

MACHINES = itertools.count()
#: State-machine steps run in this process (printed by ``-s``; see the module docstring).
STEPS = [0]


class StoreIOError(Exception):
    """What the RocksDB binding raises for an I/O error: a plain exception, not ENOSPC."""


class Faults:
    """Faults armed on ``DiskStore`` methods: the ``after``-th next call raises once."""

    def __init__(self) -> None:
        self.armed: dict[str, tuple[int, type[Exception]]] = {}
        self.enabled = True
        self.fired = 0
        self._real = {name: getattr(DiskStore, name) for name in STORE_CALLS}

    def install(self) -> None:
        for name in STORE_CALLS:
            setattr(DiskStore, name, self._wrapped(name))

    def uninstall(self) -> None:
        for name, real in self._real.items():
            setattr(DiskStore, name, real)

    def _wrapped(self, name: str) -> Callable[..., Any]:
        real = self._real[name]

        def call(store: DiskStore, *args: Any, **kwargs: Any) -> Any:
            if self.enabled and name in self.armed:
                after, kind = self.armed[name]
                if after == 0:
                    del self.armed[name]
                    self.fired += 1
                    raise kind(f"{name}: injected fault")
                self.armed[name] = (after - 1, kind)
            return real(store, *args, **kwargs)

        return call

    @contextmanager
    def off(self) -> Iterator[None]:
        self.enabled = False
        try:
            yield
        finally:
            self.enabled = True


def config(disk: Path | None = None, limit: int = 0) -> PSConfig:
    table = TableConfig(
        name=T,
        embedxDim=D,
        embedxThreshold=2.0,
        deleteThreshold=0.25,
        baseThreshold=0.3,
        deltaThreshold=0.2,
        optimizer=SparseOptimizerConfig(type="ftrl", embedType="adagrad", initialRange=0.01),
    )
    return PSConfig(
        tables=(table,),
        logicalShards=L,
        memoryLimit=limit,
        diskPath=str(disk) if disk else "",
    )


def save_content(uri: str, cfg: PSConfig) -> dict[int, np.ndarray] | None:
    """A save's rows by key (full rows plus exact counters for a checkpoint) and its
    tombstones (under key -1 - key), or None if it was never published."""
    try:
        mode = checkpoint.read_manifest(uri).mode
    except Exception:
        return None
    out: dict[int, np.ndarray] = {}
    if mode == SaveMode.CHECKPOINT:
        tp = load_plan.load_payload(uri, cfg, 0, 1).tables[T]
        exact = np.zeros((tp.keys.size, 3))
        exact[tp.hot_rows] = tp.hot_counts
        rows = np.concatenate([tp.rows[:, 1:].astype(np.float64), exact], axis=1)
        keys, tombs = tp.keys, tp.tombstones
    else:
        keys, rows, tombs = checkpoint.read_sparse(uri, T)
    for k, r in zip(keys.tolist(), rows, strict=True):
        out[int(k)] = r
    for k in tombs.tolist():
        out[-1 - int(k)] = np.zeros(0)
    return out


def assert_same(capped: dict[int, np.ndarray], ref: dict[int, np.ndarray], lost: set[int]) -> None:
    skip = lost | {-1 - k for k in lost}
    a = {k: v for k, v in capped.items() if k not in skip}
    b = {k: v for k, v in ref.items() if k not in skip}
    assert a.keys() == b.keys(), (sorted(a.keys() - b.keys()), sorted(b.keys() - a.keys()))
    for k, row in a.items():
        np.testing.assert_array_equal(row, b[k], err_msg=f"key {k}")


class TieredModel(RuleBasedStateMachine):
    """The capped shard (``capped``) must behave as the unlimited one (``ref``)."""

    def __init__(self) -> None:
        super().__init__()
        self.faults = Faults()
        self.faults.install()
        self.dir = Path(os.environ.get("PYTEST_TMP", "/tmp")) / f"model-{next(MACHINES)}"
        self.ref = Shard(config())
        self.capped = Shard(
            config(self.dir / "disk", LIMIT), memory_budget=MemoryBudget.tables_only(LIMIT)
        )
        self.lost: set[int] = set()
        self.evicted = 0
        self.n = 0
        self.staged: tuple[str, str] | None = None
        self.checkpoint: str | None = None

    def teardown(self) -> None:
        self.faults.uninstall()
        self.ref.close()
        self.capped.close()

    def uri(self, who: str) -> str:
        """Saves go to memory (fsspec): a local save fsyncs, seconds per program."""
        self.n += 1
        return f"memory://{self.dir.name}/{who}-{self.n}"

    # -- the comparison -----------------------------------------------------------------------

    def state(self, shard: Shard, who: str) -> dict[int, np.ndarray]:
        """Every key's full row and exact counters (both tiers, as a checkpoint reads them)
        and the pending tombstones, with faults off."""
        t = shard.table(T)
        out: dict[int, np.ndarray] = {}
        with self.faults.off(), t.lock.maintenance:
            rows, offsets = t.saves.rows_by_logical_shard(L)
            for logical in range(L):
                part = rows[offsets[logical] : offsets[logical + 1]]
                _, keys, full, hot = t.saves.snapshot_part(part, SaveMode.CHECKPOINT, logical)
                exact = np.zeros((keys.size, 3))
                exact[hot.positions] = hot.counts
                values = np.concatenate([full[:, 1:].astype(np.float64), exact], axis=1)
                for k, v in zip(keys.tolist(), values, strict=True):
                    out[int(k)] = v
            for k in t.saves.tombstones().tolist():
                out[-1 - int(k)] = np.zeros(0)
        del who
        return out

    def note_evictions(self) -> None:
        """Keys the capped shard evicted under disk pressure leave the comparison (those the
        reference holds and it does not, after an eviction)."""
        evicted = self.capped.table(T).pressure_evictions_total
        if evicted > self.evicted:
            self.evicted = evicted
            capped, ref = self.state(self.capped, "capped"), self.state(self.ref, "ref")
            self.lost |= {k for k in ref.keys() - capped.keys() if k >= 0}

    def settle(self, capped_failed: bool, apply_ref: Callable[[], object]) -> None:
        """After the capped shard ran an operation: if it failed, it must look as if the
        operation had not run (then the reference skips it) or had finished (then the
        reference runs it); if it succeeded, the reference runs it."""
        self.note_evictions()
        if not capped_failed:
            apply_ref()
            return
        capped = self.state(self.capped, "capped")
        try:
            assert_same(capped, self.state(self.ref, "ref"), self.lost)
        except AssertionError:
            apply_ref()
            assert_same(capped, self.state(self.ref, "ref"), self.lost)

    def on_capped(self, fn: Callable[[Shard], object]) -> tuple[bool, object]:
        try:
            return False, fn(self.capped)
        except Exception:  # an injected fault, or what it became (CheckpointError, ...)
            if not self.faults.fired:
                raise
            self.faults.fired = 0
            return True, None

    @invariant()
    def identical(self) -> None:
        STEPS[0] += 1
        self.note_evictions()
        capped, ref = self.state(self.capped, "capped"), self.state(self.ref, "ref")
        assert_same(capped, ref, self.lost)
        kept = {k for k in capped if k >= 0}
        assert self.capped.stats().tables[0].keys == len(kept)  # the count both tiers report
        self.faults.fired = 0

    # -- rules --------------------------------------------------------------------------------

    @initialize(seed=st.integers(0, 2**16))
    def start(self, seed: int) -> None:
        self.push_keys(seed, 120)

    def push_keys(self, seed: int, n: int) -> None:
        rng = np.random.default_rng(seed)
        keys = (rng.zipf(1.3, n) % KEYS + 1).astype(np.uint64)
        grads = rng.normal(0, 1, (n, D + 1)).astype(np.float32)
        shows = rng.integers(0, 4, n).astype(np.float32)
        clicks = np.minimum(shows, rng.integers(0, 2, n)).astype(np.float32)

        def push(s: Shard) -> object:
            return s.push_sparse(T, SparsePush(keys, grads, shows, clicks))

        failed, _ = self.on_capped(push)
        self.settle(failed, lambda: push(self.ref))

    @rule(seed=st.integers(0, 2**16), n=st.integers(1, 60))
    def push(self, seed: int, n: int) -> None:
        self.push_keys(seed, n)

    @rule(seed=st.integers(0, 2**16), n=st.integers(1, 80))
    def pull(self, seed: int, n: int) -> None:
        keys = (np.random.default_rng(seed).integers(1, KEYS + 1, n)).astype(np.uint64)
        failed, got = self.on_capped(lambda s: s.pull_sparse(T, keys))
        self.settle(failed, lambda: None)
        if not failed:
            lost = np.isin(keys, np.array(sorted(self.lost), np.uint64))
            want = self.ref.pull_sparse(T, keys)
            np.testing.assert_array_equal(np.asarray(got)[~lost], want[~lost])

    @rule(share=st.floats(0.0, 1.0))
    def demote(self, share: float) -> None:
        t = self.capped.table(T)
        failed, _ = self.on_capped(lambda s: t.demote(int(t.ram_bytes() * share)))
        self.settle(failed, lambda: None)

    @rule(
        call=st.sampled_from(STORE_CALLS),
        after=st.integers(0, 3),
        kind=st.sampled_from([DiskFullError, StoreIOError]),
    )
    def arm_fault(self, call: str, after: int, kind: type[Exception]) -> None:
        self.faults.armed[call] = (after, kind)

    @rule()
    def shrink(self) -> None:
        failed, _ = self.on_capped(lambda s: s.shrink())
        self.settle(failed, self.ref.shrink)

    @rule(mode=st.sampled_from(list(SaveMode)))
    def save(self, mode: SaveMode) -> None:
        uris = self.uri("capped"), self.uri("ref")

        def save(s: Shard, uri: str) -> object:
            result = s.save(uri, mode)
            dense = {} if mode == SaveMode.CHECKPOINT else None
            checkpoint.publish(uri, [result], dense, config=s.config)
            return result

        failed, _ = self.on_capped(lambda s: save(s, uris[0]))
        self.settle(failed, lambda: save(self.ref, uris[1]))
        if not failed:
            a, b = save_content(uris[0], self.capped.config), save_content(uris[1], self.ref.config)
            assert a is not None and b is not None
            assert_same(a, b, self.lost)
            if mode == SaveMode.CHECKPOINT:
                self.checkpoint = uris[1]

    @rule(mode=st.sampled_from([SaveMode.DELTA, SaveMode.BASE, SaveMode.BATCH]))
    def stage(self, mode: SaveMode) -> None:
        uris = self.uri("capped"), self.uri("ref")

        def stage(s: Shard, uri: str) -> str:
            result, save_id = s.stage_save(uri, mode)
            checkpoint.publish(uri, [result], None, config=s.config)
            return save_id

        failed, capped_id = self.on_capped(lambda s: stage(s, uris[0]))
        if failed:  # nothing staged, nothing applied
            self.settle(failed, lambda: None)
            return
        self.staged = (str(capped_id), stage(self.ref, uris[1]))
        a, b = save_content(uris[0], self.capped.config), save_content(uris[1], self.ref.config)
        assert a is not None and b is not None
        assert_same(a, b, self.lost)

    @precondition(lambda self: self.staged is not None)
    @rule(commit=st.booleans())
    def finish_staged(self, commit: bool) -> None:
        assert self.staged is not None
        capped_id, ref_id = self.staged
        self.staged = None
        outcomes: list[object] = []
        for s, sid in ((self.capped, capped_id), (self.ref, ref_id)):
            while True:  # a commit a fault made fail applied nothing: retried (faults fire once)
                try:
                    outcomes.append(s.finish_save(sid, commit))
                except Exception as exc:
                    if s is self.capped and self.faults.fired:
                        self.faults.fired = 0
                        self.settle(True, lambda: None)  # nothing applied meanwhile
                        continue
                    outcomes.append(type(exc).__name__)
                break
        assert outcomes[0] == outcomes[1], outcomes

    @rule(mode=st.sampled_from([SaveMode.DELTA, SaveMode.BASE, SaveMode.BATCH]))
    def snapshot(self, mode: SaveMode) -> None:
        uris = self.uri("capped"), self.uri("ref")
        sid = f"snap-{self.n}"

        def snap(s: Shard, uri: str) -> object:
            s.snapshot_save(mode, sid)
            result = s.write_snapshot(uri, sid)
            checkpoint.publish(uri, [result], None, config=s.config)
            return result

        failed, _ = self.on_capped(lambda s: snap(s, uris[0]))
        self.settle(failed, lambda: snap(self.ref, uris[1]))
        if not failed:
            a, b = save_content(uris[0], self.capped.config), save_content(uris[1], self.ref.config)
            assert a is not None and b is not None
            assert_same(a, b, self.lost)

    @rule(shards=st.integers(2, 3))
    def reshard(self, shards: int) -> None:
        """The capped shard's checkpoint (both tiers) loaded into ``shards`` shards pulls as
        the reference does."""
        uri = self.uri("reshard")
        with self.faults.off():
            result = self.capped.save(uri, SaveMode.CHECKPOINT)
            checkpoint.publish(uri, [result], {}, config=self.capped.config)
            target = LocalPS(config(), num_shards=shards)
            try:
                target.load(uri)
                keys = np.arange(1, KEYS + 1, dtype=np.uint64)
                keep = ~np.isin(keys, np.array(sorted(self.lost), np.uint64))
                want = self.ref.pull_sparse(T, keys)[keep]
                np.testing.assert_array_equal(target.pull_sparse(T, keys)[keep], want)
            finally:
                target.close()

    @precondition(lambda self: self.checkpoint is not None)
    @rule()
    def load(self) -> None:
        uri = self.checkpoint
        assert uri is not None
        failed, _ = self.on_capped(lambda s: s.load(uri))
        if not failed:
            self.lost = set()  # the capped shard has every key of the checkpoint again
        self.settle(failed, lambda: self.ref.load(uri))
        if self.staged is not None:  # a load drops a staged save on both
            self.staged = None


TieredModel.TestCase.settings = settings(
    max_examples=300 if DEEP else 25,
    stateful_step_count=40 if DEEP else 18,
    deadline=None,
    suppress_health_check=list(HealthCheck),
)


@pytest.fixture(autouse=True)
def _model_dir(tmp_path: Path) -> Iterator[None]:
    os.environ["PYTEST_TMP"] = str(tmp_path)
    yield
    os.environ.pop("PYTEST_TMP", None)


def test_the_capped_table_behaves_as_the_unlimited_one() -> None:
    STEPS[0] = 0
    TieredModel.TestCase("runTest").runTest()
    print(f"\nstate-machine steps checked: {STEPS[0]}")


# -- readers at each publish point ----------------------------------------------------------


def test_pulls_at_every_publish_point_of_a_move_see_whole_rows(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A pull from another thread at each step where a promotion, demotion or compaction
    changes what readers can reach: the moves change no value, so every pull must return
    exactly the reference rows (a pull blocked by the move returns them after it)."""
    ref = Shard(config())
    capped = Shard(config(tmp_path / "disk"))
    t = capped.table(T)
    keys = np.arange(1, 401, dtype=np.uint64)
    rng = np.random.default_rng(11)
    for _ in range(3):
        g = rng.normal(0, 1, (keys.size, D + 1)).astype(np.float32)
        s = np.full(keys.size, 2.0, np.float32)
        for shard in (ref, capped):
            shard.push_sparse(T, SparsePush(keys, g, s, s * 0))
    expected = ref.pull_sparse(T, keys)
    seen: list[np.ndarray] = []
    threads: list[threading.Thread] = []

    def reader() -> None:
        th = threading.Thread(target=lambda: seen.append(t.pull(keys)))
        th.start()
        th.join(timeout=0.05)
        threads.append(th)

    points = [
        (tiering.tk, "place"),  # promotion: rows filled
        (tiering.ix, "publish_rows"),  # promotion: rows put in the index
        (tiering.tk, "release"),  # demotion: rows taken out
        (compaction, "compact"),  # demotion: rows moved down
        (DiskStore, "put"),  # demotion: rows written to disk
        (DiskStore, "delete"),  # promotion: disk copies removed
    ]
    for owner, name in points:
        real = getattr(owner, name)

        def wrapped(*args: Any, _real: Any = real, **kwargs: Any) -> Any:
            reader()
            return _real(*args, **kwargs)

        monkeypatch.setattr(owner, name, wrapped)
    for share in (0.0, 0.5):
        t.demote(int(t.ram_bytes() * share))  # demotion and compaction
        np.testing.assert_array_equal(t.pull(keys), expected)  # promotion
    for th in threads:
        th.join()
    assert len(seen) >= 2 * len(points) - 2, len(seen)
    for got in seen:
        np.testing.assert_array_equal(got, expected)
    ref.close()
    capped.close()
