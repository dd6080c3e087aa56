"""A fault sweep of the storage path: the process dies at the k-th storage write, every k.

A small job (one day of two passes, two workers, one PS shard of two logical shards,
``checkpoint.keep: 1``) runs in-process — the real ``Driver`` and scheduler, the real
in-process PS (``LocalPS``), scripted workers that push fixed gradients — with its
checkpoints, models, donefile and recorded pass file lists on a ``killfs://`` memory
filesystem (``ps.faultfs``'s, with its own store) and its progress record in a store on the
same count. A storage write is every ``pipe_file`` (checkpoint and model parts, manifests,
``MODEL.json``, donefile, pass file lists), ``mv`` and ``rm`` (pruning, cleanup) there, and
every save of the progress record. A clean run counts them (52); then for every k, twice:

- the kill: the k-th write raises :class:`Killed` — a ``BaseException``, which nothing in
  the product catches, so the run aborts there — and every write after it (from threads of
  the same save still running) fails alike: nothing written after the kill point is
  durable. The PS dies with the process: the rerun gets a new, empty one. (An exception
  rather than a SIGKILL per point: a real kill costs a process start, seconds per point;
  ``test_checkpoint_kill.py``, ``test_export_kill.py`` and ``test_scheduler_kill.py`` SIGKILL
  the real CLI at chosen points.)
- or the failure: only the k-th write fails, with ``OSError`` (the product's own path: the
  step retries, then fails the job with a condition; a failed record write ends the
  process);
- the rerun, over the same storage and record with nothing armed, must succeed, and:
  every pass is recorded once; the model (every key's row, the dense vector) equals the
  clean run's bit for bit — nothing trained twice, nothing lost; the donefile lists every
  model once, in step order, each verifying against its ``MODEL.json``; the chain served at
  the last delta equals the clean run's; the record names a checkpoint that exists.
"""

from __future__ import annotations

import contextlib
import errno
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import fsspec
import numpy as np
import numpy.typing as npt
import pytest

from faults.harness import ModelState, assert_same_model, read_checkpoint
from ps.faultfs import FailingFileSystem
from scripted_workers import DenseWorker, run, write_folder
from streamtrain_operator.job import render
from streamtrain_operator.job.plan import StepKey, StepKind
from streamtrain_operator.job.progress import Phase, Progress
from streamtrain_operator.job.spec import Job, parse_job
from streamtrain_operator.run.export import read_donefile, verify_model
from streamtrain_operator.run.state import MemoryStateStore
from streamtrain_ps.client.local import LocalPS
from streamtrain_ps.saves.checkpoint import read_sparse
from streamtrain_worker.publishing.predict import apply_chain, model_chain

pytestmark = pytest.mark.faults

PROTOCOL = "killfs"
DAY = "20261101"


class Killed(BaseException):
    """The process died at this storage write."""


@dataclass
class KillPlan:
    """Counts storage writes. ``kill``: from the ``at``-th on, each one raises
    :class:`Killed`; otherwise only the ``at``-th fails, with ``OSError`` (a full disk, a
    store's error: the product retries or fails the job, the run goes on or ends)."""

    at: int | None = None
    kill: bool = True
    writes: int = 0
    dead: bool = False
    failed: bool = False
    lock: ClassVar[threading.Lock] = threading.Lock()

    def write(self, what: str) -> None:
        with self.lock:
            if self.dead:
                raise Killed(f"{what}: after the kill")
            self.writes += 1
            if self.writes != self.at:
                return
            if self.kill:
                self.dead = True
                raise Killed(f"{what}: storage write {self.writes}")
            self.failed = True
            raise OSError(errno.EIO, f"storage write {self.writes} failed (injected)", what)


class KillFileSystem(FailingFileSystem):
    """``faultfs``'s memory filesystem (own store) whose writes consult the kill plan."""

    protocol = PROTOCOL
    store: ClassVar[dict[str, Any]] = {}
    pseudo_dirs: ClassVar[list[str]] = [""]
    plan: ClassVar[KillPlan] = KillPlan()

    @classmethod
    def _strip_protocol(cls, path: Any) -> Any:
        if isinstance(path, str) and path.startswith(f"{PROTOCOL}://"):
            path = path[len(PROTOCOL) + 3 :]
        return super()._strip_protocol(path)

    def pipe_file(self, path: str, value: bytes, mode: str = "overwrite", **kwargs: Any) -> None:
        self.plan.write(f"put {path}")
        super().pipe_file(path, value, mode, **kwargs)

    def mv(self, path1: Any, path2: Any, *args: Any, **kwargs: Any) -> None:
        self.plan.write(f"mv {path1}")
        super().mv(path1, path2, *args, **kwargs)

    def rm(self, path: Any, *args: Any, **kwargs: Any) -> None:
        self.plan.write(f"rm {path}")
        super().rm(path, *args, **kwargs)


class KillableStore(MemoryStateStore):
    """The progress record: durable (it outlives the run), written on the plan's count."""

    def save(self, progress: Progress) -> None:
        if self.saved and self.saved[-1] == progress:
            return  # no write: the store skips an unchanged record
        KillFileSystem.plan.write("state record")
        super().save(progress)


def fresh_storage(at: int | None = None, kill: bool = True) -> KillPlan:
    """A blank disk, and the plan of this run."""
    fsspec.register_implementation(PROTOCOL, KillFileSystem, clobber=True)
    KillFileSystem.store.clear()
    KillFileSystem.pseudo_dirs[:] = [""]
    KillFileSystem.plan = KillPlan(at, kill)
    return KillFileSystem.plan


def disarm() -> None:
    """Same disk, nothing armed (the rerun)."""
    KillFileSystem.plan = KillPlan()


def make_job(data_root: Path) -> Job:
    return parse_job(
        {
            "apiVersion": "streamtrain.io/v1alpha1",
            "kind": "StreamingTrainingJob",
            "metadata": {"name": "sweep"},
            "spec": {
                "data": {
                    "path": str(data_root),
                    "format": "criteo",
                    "startDay": DAY,
                    "endDay": DAY,
                    "splitIntervalMinutes": 720,
                },
                "model": {"embeddingDim": 2},
                "sparse": {"baseThreshold": 0, "deltaThreshold": 0},
                "ps": {"logicalShards": 2},
                "workers": {"replicas": 2, "passRetries": 1},
                "checkpoint": {"path": f"{PROTOCOL}://ckpt", "everyPasses": 1, "keep": 1},
                "export": {"path": f"{PROTOCOL}://export", "retries": 0},
            },
        }
    )


def run_sweep_job(job: Job, store: KillableStore) -> Progress:
    """One process's run: a new PS (the last one died with its process), new workers."""
    ps = LocalPS(render.ps_config(job.spec))
    progress: Progress = run(job, [DenseWorker(ps, 0), DenseWorker(ps, 1)], ps, store)
    return progress


@dataclass(frozen=True)
class Outcome:
    """What a finished run left, as the invariants compare it."""

    passes: list[tuple[str, int]]
    #: The checkpoint the record names: the model a next run starts from.
    model: ModelState
    models: list[str]
    served: tuple[npt.NDArray[np.uint64], npt.NDArray[np.float32]]


def outcome(job: Job, progress: Progress) -> Outcome:
    assert progress.phase == Phase.SUCCEEDED, progress.message
    assert progress.checkpoint is not None
    assert progress.checkpoint.key == StepKey(DAY, 2, StepKind.CHECKPOINT)
    root = job.spec.export.path
    models = [d.key for d in read_donefile(root)]
    for key in models:
        verify_model(root, key)  # every file MODEL.json lists, with its size and sha256
    chain = model_chain(root, f"{DAY}/delta-2")
    served = apply_chain([read_sparse(f"{root}/{d.key}/sparse", "embedding") for d in chain], 5)
    return Outcome(
        passes=[(r.day, r.pass_index) for r in progress.history],
        model=read_checkpoint(progress.checkpoint.uri),
        models=models,
        served=(served.keys, served.values),
    )


def assert_same(got: Outcome, want: Outcome, where: str) -> None:
    assert got.passes == want.passes, f"{where}: passes recorded {got.passes}"
    assert got.models == want.models, f"{where}: donefile {got.models}"
    assert np.array_equal(got.model.column("show"), want.model.column("show")), where
    assert np.array_equal(got.model.column("click"), want.model.column("click")), where
    assert_same_model(got.model, want.model)
    assert np.array_equal(got.served[0], want.served[0]), f"{where}: served keys differ"
    assert got.served[1].tobytes() == want.served[1].tobytes(), f"{where}: served rows differ"


@pytest.mark.parametrize("kill", [True, False], ids=["kill", "fail"])
def test_a_kill_or_failure_at_any_storage_write_resumes_to_the_clean_outcome(
    tmp_path: Path, kill: bool
) -> None:
    for hhmm in ("0000", "1200"):
        write_folder(tmp_path, DAY, hhmm, parts=2)
    job = make_job(tmp_path / "data")
    clean_plan = fresh_storage()
    want = outcome(job, run_sweep_job(job, KillableStore()))
    assert want.model.keys.size > 0
    assert want.models == [f"{DAY}/delta-1", f"{DAY}/delta-2", "20261102/base", f"{DAY}/batch"]
    total = clean_plan.writes
    assert total > 50, f"only {total} storage writes: the job no longer writes what it did"

    for k in range(1, total + 1):
        where = f"{'killed' if kill else 'failed'} at storage write {k} of {total}"
        plan = fresh_storage(k, kill)
        store = KillableStore()
        if kill:
            with pytest.raises(Killed):
                run_sweep_job(job, store)
        else:
            # A failed step fails the job; a failed record write ends the process.
            with contextlib.suppress(OSError):
                run_sweep_job(job, store)
        assert plan.dead or plan.failed, where
        disarm()
        assert_same(outcome(job, run_sweep_job(job, store)), want, where)
    print(f"storage sweep: {total} points")
