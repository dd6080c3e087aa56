"""Fixtures of the fault-injection suite (``make test-faults``); helpers in ``harness.py``."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from .harness import (
    DETERMINISTIC,
    START,
    Job,
    Reference,
    Run,
    checkpoint_of,
    read_checkpoint,
    reap,
)


@pytest.fixture
def job(tmp_path: Path) -> Iterator[Job]:
    """A job directory; every run started through it is killed and reaped at teardown."""
    runs: list[Run] = []
    yield Job(tmp_path, runs)
    reap(runs)


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Reference]:
    """The :data:`~harness.DETERMINISTIC` one-day job run to the end without a fault (once
    per test module), the reference its cases compare with; its processes are reaped after
    the module."""
    runs: list[Run] = []
    try:
        job = Job(tmp_path_factory.mktemp("clean"), runs).write(days=1, **DETERMINISTIC)
        code, output = job.run()
        assert code == 0, output
        yield Reference(read_checkpoint(checkpoint_of(job.root, START, 4)), job.root / "export")
    finally:
        reap(runs)
