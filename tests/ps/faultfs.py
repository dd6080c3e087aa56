"""``failfs://``: an in-memory fsspec filesystem whose writes fail on command (fault case 5).

It is fsspec's real ``MemoryFileSystem`` with its own store, plus a ``Faults`` plan consulted
on every whole-file write (``pipe_file`` — the one call the PS checkpoint and the model export
use on object stores). A write can fail

- because it is the n-th write (``fail_writes``),
- because its path contains a marker (``fail_paths``, e.g. ``MANIFEST.json``: the final
  PUT that publishes a save),
- because the "disk" is full (``byte_budget``): the bytes that still fit are stored, a
  truncated file like a real full disk leaves, then ``OSError(ENOSPC)``.

Tests ``reset()`` (a blank disk, nothing armed) and ``arm(...)`` the plan. Registration
(by the test's fixture) is process-wide, so the in-process PS servers see it too.
"""

from __future__ import annotations

import errno
import threading
from dataclasses import dataclass, field
from typing import Any, ClassVar

from fsspec.implementations.memory import MemoryFileSystem

from streamtrain_ps.config import PSConfig

PROTOCOL = "failfs"
#: A shard's storage schemes plus this one: shards served over gRPC admit failfs:// URIs.
SCHEMES = (*PSConfig().storageSchemes, PROTOCOL)


@dataclass
class Faults:
    """What to break; counters are updated under ``lock`` (saves write from many threads)."""

    fail_writes: set[int] = field(default_factory=set)
    fail_paths: tuple[str, ...] = ()
    byte_budget: int | None = None
    writes: int = 0
    bytes_written: int = 0
    failures: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def check(self, path: str, size: int) -> int | None:
        """Count a write; return how many bytes fit before failing, or None to let it pass."""
        with self.lock:
            self.writes += 1
            if self.writes in self.fail_writes or any(m in path for m in self.fail_paths):
                self.failures += 1
                return 0
            if self.byte_budget is not None and self.bytes_written + size > self.byte_budget:
                fit = max(0, self.byte_budget - self.bytes_written)
                self.bytes_written += fit
                self.failures += 1
                return fit
            self.bytes_written += size
            return None


class FailingFileSystem(MemoryFileSystem):
    """``MemoryFileSystem`` with a private store and injectable write failures."""

    protocol = PROTOCOL
    store: ClassVar[dict[str, Any]] = {}
    pseudo_dirs: ClassVar[list[str]] = [""]
    faults: ClassVar[Faults] = Faults()

    @classmethod
    def _strip_protocol(cls, path: Any) -> Any:
        # MemoryFileSystem only strips its own "memory://" prefix.
        if isinstance(path, str) and path.startswith(f"{PROTOCOL}://"):
            path = path[len(PROTOCOL) + 3 :]
        return super()._strip_protocol(path)

    def pipe_file(self, path: str, value: bytes, mode: str = "overwrite", **kwargs: Any) -> None:
        fit = self.faults.check(path, len(value))
        if fit is not None:
            if fit:
                super().pipe_file(path, value[:fit], mode, **kwargs)
            raise OSError(errno.ENOSPC, "No space left on device (injected)", path)
        super().pipe_file(path, value, mode, **kwargs)


def reset() -> Faults:
    FailingFileSystem.store.clear()
    FailingFileSystem.pseudo_dirs[:] = [""]
    FailingFileSystem.faults = Faults()
    return FailingFileSystem.faults


def arm(**plan: Any) -> Faults:
    """Replace the fault plan (counters restart at zero)."""
    FailingFileSystem.faults = Faults(**plan)
    return FailingFileSystem.faults


def files(prefix: str = "") -> list[str]:
    """Every stored file path (without protocol) under ``prefix``."""
    return sorted(p for p in FailingFileSystem.store if p.startswith("/" + prefix.lstrip("/")))
