"""The next pass's files, read and parsed while the current pass trains.

A RunPass used to begin by waiting for its first file to be read and parsed (10-35 ms for a
6,000-row Criteo file, every pass: a file's batches are held until its bad-line fraction is
known, so nothing can train sooner). The scheduler now names, with a RunPass, this worker's
files of the pass expected next when that pass's data is complete (``next_files``); the
worker starts a :class:`PassReader` over them once the current pass's reader has handed out
its last batch, and the next RunPass takes that reader instead of opening the files again.

A hint is only a guess about the future, so nothing depends on it:

- **The RunPass decides what is trained.** The reader read ahead is used only when the
  RunPass names exactly the same files in the same order, and every file still has the
  size, version (the etag or modification time — what the scheduler's recorded file lists
  compare, ``data.layout.file_version``) and inode it had before it was read; otherwise it
  is closed and the files are read again. A file rewritten or replaced between the read
  ahead and the RunPass is therefore trained as its new content, exactly as without a read
  ahead, and the scheduler's own checks (a replay verifies its recorded list before it
  dispatches) see the same files as before.
- **At most one pass ahead.** One reader is held, bounded like any ``PassReader`` (its
  queue of parsed blocks and one file's held blocks); a new hint, a RunPass that names
  other files (the hinted pass never came: a restore, a replay, another assignment) and a
  ``Reset`` close it.
- **Nothing to lose.** The reader lives in the worker's memory only; a restarted worker
  simply reads its next pass when asked. An error the read ahead met (a missing file, bad
  data) is what the same reader would have met: it surfaces only if the RunPass uses it,
  and then as it would without the read ahead.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import StrEnum

import fsspec

from streamtrain_worker.data.layout import file_version
from streamtrain_worker.data.reader import PassReader

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class FileStamp:
    """What identifies one version of a file: if any part differs, it is not the same data."""

    size: int
    #: The store's etag, else the modification time (as the scheduler records it).
    version: str
    #: The inode on a local or network disk (a file replaced by a rename); 0 elsewhere.
    inode: int


def stamp(path: str) -> FileStamp:
    """The stamp of ``path`` now (raises ``OSError`` when it cannot be listed)."""
    fs, inner = fsspec.core.url_to_fs(path)
    info = fs.info(inner)
    return FileStamp(int(info.get("size") or 0), file_version(info), int(info.get("ino") or 0))


class Outcome(StrEnum):
    """What became of a read ahead (the ``outcome`` label of the worker's counter)."""

    USED = "used"
    #: The RunPass named the same files, but one changed since it was read: read again.
    CHANGED = "changed"
    #: Never used: the RunPass named other files, or a newer hint or a Reset replaced it.
    DROPPED = "dropped"


@dataclass
class _Ahead:
    files: tuple[str, ...]
    stamps: tuple[FileStamp, ...]
    reader: PassReader


class ReadAhead:
    """Holds the reader of at most one pass ahead (thread-safe)."""

    def __init__(
        self,
        make_reader: Callable[[Sequence[str]], PassReader],
        *,
        stamp_of: Callable[[str], FileStamp] = stamp,
        on_outcome: Callable[[Outcome], None] | None = None,
    ) -> None:
        self._make_reader = make_reader
        self._stamp_of = stamp_of
        self._on_outcome = on_outcome
        self._lock = threading.Lock()
        self._ahead: _Ahead | None = None
        #: The thread of a ``begin`` not yet joined (``take`` and ``drop`` join it first).
        self._pending: threading.Thread | None = None

    def begin(self, files: Sequence[str]) -> None:
        """``start`` in a thread of its own: stamping the files is a round trip each on an
        object store, which must not hold up the pass being trained. The next ``take`` or
        ``drop`` waits for it, so a read ahead is never installed after either."""
        self._settle()

        def run() -> None:
            try:
                self.start(files)
            except Exception:  # a hint is optional: the next RunPass reads its files itself
                log.warning("reading the next pass ahead failed", exc_info=True)

        thread = threading.Thread(target=run, name="read-ahead", daemon=True)
        with self._lock:
            self._pending = thread
        thread.start()

    def _settle(self) -> None:
        with self._lock:
            pending, self._pending = self._pending, None
        if pending is not None:
            pending.join()

    def start(self, files: Sequence[str]) -> None:
        """Read ``files`` ahead (replacing any earlier read ahead). Files that cannot be
        stamped now (not there yet, unreachable) are not read ahead: the RunPass reads them."""
        self._drop_now()
        if not files:
            return
        try:
            stamps = tuple(self._stamp_of(f) for f in files)
        except OSError as exc:
            log.info("not reading the next pass ahead: %s", exc)
            return
        reader = self._make_reader(list(files))
        reader.start()
        with self._lock:
            previous, self._ahead = self._ahead, _Ahead(tuple(files), stamps, reader)
        if previous is not None:  # a concurrent start: keep the newest
            self._close(previous, Outcome.DROPPED)

    def take(self, files: Sequence[str]) -> PassReader | None:
        """The reader of ``files`` if they were read ahead and are unchanged since; ``None``
        (and whatever was read ahead closed) otherwise. The caller owns the reader."""
        self._settle()
        with self._lock:
            ahead, self._ahead = self._ahead, None
        if ahead is None:
            return None
        if ahead.files != tuple(files):
            self._close(ahead, Outcome.DROPPED)
            return None
        for path, then in zip(ahead.files, ahead.stamps, strict=True):
            try:
                now: FileStamp | OSError = self._stamp_of(path)
            except OSError as exc:
                now = exc
            if now != then:
                log.info(
                    "%s changed since it was read ahead (%s, now %s): reading them again",
                    path,
                    then,
                    now,
                )
                self._close(ahead, Outcome.CHANGED)
                return None
        self._count(Outcome.USED)
        return ahead.reader

    def drop(self) -> None:
        """Close whatever was read ahead (a Reset, the worker's end)."""
        self._settle()
        self._drop_now()

    def _drop_now(self) -> None:
        with self._lock:
            ahead, self._ahead = self._ahead, None
        if ahead is not None:
            self._close(ahead, Outcome.DROPPED)

    def _close(self, ahead: _Ahead, outcome: Outcome) -> None:
        ahead.reader.close()
        self._count(outcome)

    def _count(self, outcome: Outcome) -> None:
        if self._on_outcome is not None:
            self._on_outcome(outcome)
