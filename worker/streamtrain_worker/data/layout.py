"""The storage side of the time-sliced layout: whether a folder is complete, and its files.

A folder is complete only when its donefile (``_SUCCESS`` by default) exists; its data files
are listed with what identifies their version (etag or mtime), so a replay can check it
finds the same data. Everything goes through fsspec, so the same code serves local disks
and object stores. Which folders form a pass is ``timeslices`` (pure).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import fsspec
from fsspec.spec import AbstractFileSystem

from streamtrain_worker.data.timeslices import DEFAULT_DONEFILE

# Files that writers use while a part is still in flight, or that carry metadata only.
_IGNORED_SUFFIXES = (".tmp", ".crc", "._COPYING_", ".inprogress", ".partial")


def _resolve(url: str, fs: AbstractFileSystem | None) -> tuple[AbstractFileSystem, str]:
    if fs is not None:
        return fs, url  # fsspec filesystems accept their own URLs as paths
    resolved, path = fsspec.core.url_to_fs(url)
    return resolved, path


def folder_ready(
    folder: str, donefile: str = DEFAULT_DONEFILE, fs: AbstractFileSystem | None = None
) -> bool:
    """True when ``<folder>/<donefile>`` exists: the writer has finished the folder."""
    resolved, path = _resolve(folder, fs)
    return bool(resolved.exists(f"{path.rstrip('/')}/{donefile}"))


def is_data_file_name(name: str, donefile: str = DEFAULT_DONEFILE) -> bool:
    """Whether a file name in a folder is a data part (not the donefile, hidden or temporary)."""
    if name == donefile or not name or name[0] in "._":
        return False
    return not name.endswith(_IGNORED_SUFFIXES)


#: Listing fields that identify one version of an object, most specific first: the store's
#: etag (S3, GCS, Azure), then the modification time (local disks, HDFS).
_VERSION_FIELDS = (
    "ETag",
    "etag",
    "md5Hash",
    "mtime",
    "LastModified",
    "last_modified",
    "updated",
    "created",
)


@dataclass(frozen=True)
class DataFile:
    """One data file as listed: what a replay must find again to train the same data."""

    path: str
    size: int
    #: The store's etag or the modification time (``""`` when the store reports neither).
    version: str = ""


@dataclass(frozen=True)
class FolderListing:
    """A folder's data files, and the names skipped as not data (sub-folders, hidden files,
    markers, temporary files; the donefile is expected and not counted)."""

    files: list[DataFile] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)


def file_version(entry: Mapping[str, Any]) -> str:
    """The version of a listed file: etag if the store has one, else its mtime."""
    for key in _VERSION_FIELDS:
        value = entry.get(key)
        if value not in (None, ""):
            return str(value)
    return ""


def scan_folder(
    folder: str, donefile: str = DEFAULT_DONEFILE, fs: AbstractFileSystem | None = None
) -> FolderListing:
    """The data files of a folder (sorted by path) and the names it skipped.

    Skipped: sub-folders, hidden files (``.x``), markers and temporary files (``_x``,
    ``*.tmp``, ``*.crc``, ``*._COPYING_``, ``*.inprogress``, ``*.partial``). Paths keep the
    caller's style: with a URL (``s3://…``) they are URLs, with a plain path they are plain
    paths. A missing folder is empty (an empty pass is valid; the scheduler's donefile check
    and recorded file lists tell a missing folder from an empty one).
    """
    resolved, path = _resolve(folder, fs)
    if not resolved.exists(path):
        return FolderListing()
    keep_protocol = "://" in folder
    listing = FolderListing()
    for entry in resolved.ls(path, detail=True):
        name = str(entry["name"]).rstrip("/").rsplit("/", 1)[-1]
        if entry.get("type") != "file":
            listing.skipped.append(name + "/")
            continue
        if name == donefile:
            continue
        if not is_data_file_name(name, donefile):
            listing.skipped.append(name)
            continue
        full = str(entry["name"])
        listing.files.append(
            DataFile(
                resolved.unstrip_protocol(full) if keep_protocol else full,
                int(entry["size"] or 0),
                file_version(entry),
            )
        )
    listing.files.sort(key=lambda f: f.path)
    listing.skipped.sort()
    return listing


def list_part_files(
    folder: str, donefile: str = DEFAULT_DONEFILE, fs: AbstractFileSystem | None = None
) -> list[tuple[str, int]]:
    """The data files of a folder as ``(path, size)``, sorted by path (see ``scan_folder``)."""
    return [(f.path, f.size) for f in scan_folder(folder, donefile, fs).files]
