"""Who may run with whom on one sparse table (see ``streamtrain_ps.engine.table``'s docstring).

Readers (pulls) share; one writer (a push, or a save copying rows) runs alongside readers;
exclusive work (shrink, load) excludes everybody; ``maintenance`` keeps saves, shrinks and
loads from overlapping.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager


class TableLock:
    """Readers share; one writer at a time alongside readers; exclusive excludes all."""

    def __init__(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._readers = 0
        self._exclusive = False
        self._writer = threading.Lock()
        self.maintenance = threading.Lock()

    @contextmanager
    def read(self) -> Iterator[None]:
        with self._cond:
            while self._exclusive:
                self._cond.wait()
            self._readers += 1
        try:
            yield
        finally:
            with self._cond:
                self._readers -= 1
                if self._readers == 0:
                    self._cond.notify_all()

    @contextmanager
    def write(self) -> Iterator[None]:
        with self._writer:
            yield

    @contextmanager
    def exclusive(self) -> Iterator[None]:
        with self._writer:
            with self._cond:
                self._exclusive = True
                while self._readers:
                    self._cond.wait()
            try:
                yield
            finally:
                with self._cond:
                    self._exclusive = False
                    self._cond.notify_all()
