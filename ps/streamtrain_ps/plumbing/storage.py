"""Files on any fsspec URL: resolving a URL, and a durable write (the one implementation).

A durable write replaces a file so readers see the old bytes or the new ones, whole, and
the new ones survive a crash: on a local disk a temporary file in the same directory,
fsynced, renamed over the target (rename is atomic on POSIX), then the directory fsynced
so the rename itself is on disk; on an object store one PUT, which is atomic. A failed
local write removes its temporary file: nothing else would ever collect it.

Used by the PS save's manifest, the published model's files, the run's progress record
and the pass file lists (``docs/decisions.md``).
"""

from __future__ import annotations

import contextlib
import os
import tempfile

import fsspec
from fsspec.implementations.local import LocalFileSystem


def filesystem(uri: str) -> tuple[fsspec.AbstractFileSystem, str]:
    """The file system behind ``uri`` and the path in it, without a trailing ``/``.
    Raises ``ValueError`` or ``ImportError`` for a URL no installed backend serves."""
    fs, path = fsspec.core.url_to_fs(uri)
    return fs, str(path).rstrip("/")


def is_local(fs: fsspec.AbstractFileSystem) -> bool:
    """Whether ``fs`` is this machine's disk (files there need fsync to be durable)."""
    return isinstance(fs, LocalFileSystem)


def write_durable(fs: fsspec.AbstractFileSystem, path: str, data: bytes) -> None:
    """Replace ``path`` with ``data`` durably (module docstring); creates its directory."""
    if is_local(fs):
        write_local_durable(path, data)
    else:
        fs.makedirs(path.rsplit("/", 1)[0], exist_ok=True)
        fs.pipe_file(path, data)


def write_local_durable(path: str | os.PathLike[str], data: bytes) -> None:
    """``write_durable`` on this machine's disk: temp file, fsync, rename, fsync the
    directory; creates the directory."""
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.tmp-", dir=directory)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    fsync_path(directory)


def fsync_path(path: str) -> None:
    """fsync a local file by name, or a directory (making its entries durable)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
