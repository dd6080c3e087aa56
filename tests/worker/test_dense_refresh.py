"""With overlap a training pass pulls the dense parameters beside its steps: the training
thread never waits for a dense pull, and every pull is loaded at a batch boundary."""

from __future__ import annotations

import threading

import numpy as np

from streamtrain_ps.client.local import LocalPS
from streamtrain_worker.config import WorkerConfig
from streamtrain_worker.training.train import Trainer

from .conftest import run, worker_config


class HeldDensePS:
    """LocalPS whose dense pulls are recorded by thread and, once ``hold`` is set, whose
    pulls of the dense parameters (the large vector, slow on a busy PS) wait until
    ``pushes_before_release`` more batches have been pushed."""

    def __init__(self, ps: LocalPS, pushes_before_release: int = 0) -> None:
        self.ps = ps
        self.pull_threads: list[str] = []
        self.pulled: list[str] = []
        self.pushes = 0
        self.hold = False
        self._release_at = pushes_before_release
        self._released = threading.Event()

    def pull_dense(self, name: str) -> np.ndarray:
        self.pull_threads.append(threading.current_thread().name)
        self.pulled.append(name)
        if self.hold and name.endswith(".dense"):
            self._release_at += self.pushes
            assert self._released.wait(timeout=60), "no push arrived while a dense pull waited"
        return self.ps.pull_dense(name)

    def push_batch(self, table, push, dense=()):  # type: ignore[no-untyped-def]
        self.ps.push_batch(table, push, dense=dense)
        self.pushes += 1
        if self.hold and self.pushes >= self._release_at:
            self._released.set()

    def __getattr__(self, name: str) -> object:
        return getattr(self.ps, name)


def _trainer(overlap: bool, ps_wrapper: HeldDensePS | None = None) -> tuple[Trainer, HeldDensePS]:
    cfg = WorkerConfig.from_dict({**worker_config().to_dict(), "runtime": {"overlap": overlap}})
    ps = ps_wrapper or HeldDensePS(LocalPS(cfg.ps.config))
    return Trainer(cfg, ps, cfg.data.num_slots), ps  # type: ignore[arg-type]


def test_a_training_pass_pulls_dense_beside_its_steps_and_loads_every_pull(
    chunks: list[str],
) -> None:
    trainer, ps = _trainer(overlap=True)
    try:
        ps.pull_threads.clear()
        loaded = trainer.dense_version
        run(trainer, chunks[:1])  # 6 batches of 200, denseSyncSteps 2: a pull at 0, 2, 4, 6
    finally:
        trainer.close()
    assert ps.pull_threads, "the pass refreshed nothing"
    assert all(t.startswith("dense-refresh") for t in ps.pull_threads), ps.pull_threads
    # every dense vector (parameters, each summary layer's statistics) once a refresh, each
    # refresh loaded once
    vectors = len(set(ps.pulled))
    assert len(ps.pulled) % vectors == 0, ps.pulled
    assert trainer.dense_version - loaded == len(ps.pulled) // vectors


def test_the_steps_go_on_while_a_dense_pull_waits(
    chunks: list[str],
) -> None:
    """The pass-start pull is answered only after three batches were pushed: a training
    thread waiting for it would never push them."""
    cfg = worker_config()
    held = HeldDensePS(LocalPS(cfg.ps.config), pushes_before_release=3)
    trainer, _ = _trainer(overlap=True, ps_wrapper=held)
    try:
        held.hold = True
        assert run(trainer, chunks[:1]).examples == 1200
    finally:
        trainer.close()
    assert held.pushes == 6


def test_without_overlap_and_in_evaluation_the_training_thread_pulls(
    chunks: list[str],
) -> None:
    for overlap, train in ((False, True), (True, False)):
        trainer, ps = _trainer(overlap)
        try:
            ps.pull_threads.clear()
            run(trainer, chunks[:1], train=train)
        finally:
            trainer.close()
        assert ps.pull_threads
        assert set(ps.pull_threads) == {threading.current_thread().name}, (overlap, train)
