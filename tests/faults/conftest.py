"""Fixtures of the fault-injection suite (``make test-faults``); helpers in ``harness.py``."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from .harness import Job, Run, reap


@pytest.fixture
def job(tmp_path: Path) -> Iterator[Job]:
    """A job directory; every run started through it is killed and reaped at teardown."""
    runs: list[Run] = []
    yield Job(tmp_path, runs)
    reap(runs)
