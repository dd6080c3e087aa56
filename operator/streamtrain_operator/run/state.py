"""Where a job's durable progress lives: a local JSON file, or the custom resource's status.

The scheduler saves ``Progress`` before and after every step; a store only has to make each
save atomic (a reader sees the previous record or the new one, never half of each). The
local store writes a temporary file in the same directory, fsyncs it and renames it over the
state file — rename is atomic on POSIX — then fsyncs the directory so the rename survives a
power cut. On Kubernetes, the operator implements the same protocol with a status patch.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Protocol

from streamtrain_operator.job.progress import Progress
from streamtrain_ps.plumbing import storage


class StateError(RuntimeError):
    """The state file exists but cannot be read as a progress record."""


class StateStore(Protocol):
    """Durable storage of one job's ``Progress``."""

    def load(self) -> Progress | None:
        """The last saved progress, or ``None`` for a job that never ran."""
        ...

    def save(self, progress: Progress) -> None:
        """Replace the stored progress atomically."""
        ...


class LocalStateFile:
    """``StateStore`` over one JSON file on the local disk (local mode)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._last: Progress | None = None

    def load(self) -> Progress | None:
        try:
            text = self.path.read_text()
        except FileNotFoundError:
            return None
        try:
            progress = Progress.from_dict(json.loads(text))
        except (ValueError, KeyError, TypeError) as exc:
            raise StateError(f"{self.path}: not a streamtrain state file: {exc}") from exc
        self._last = progress
        return progress

    def save(self, progress: Progress) -> None:
        if progress == self._last:
            return
        data = json.dumps(progress.to_dict(), indent=1, sort_keys=True).encode()
        storage.write_local_durable(self.path, data)
        self._last = progress


class MemoryStateStore:
    """``StateStore`` in memory (tests, dry runs); keeps every saved version."""

    def __init__(self, initial: Progress | None = None) -> None:
        self.saved: list[Progress] = [] if initial is None else [initial]

    def load(self) -> Progress | None:
        return self.saved[-1] if self.saved else None

    def save(self, progress: Progress) -> None:
        if not self.saved or self.saved[-1] != progress:
            self.saved.append(progress)
