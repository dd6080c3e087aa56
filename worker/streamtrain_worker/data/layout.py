"""The time-sliced log layout: which folders form a pass, and whether they are ready.

Logs land in ``<root>/<YYYYMMDD>/<HHMM>/part-*`` (or ``<root>/<YYYYMMDD>/<HH>/`` with hourly
folder names). A day is cut into ``1440 / splitIntervalMinutes`` folders; pass ``p`` (1-based)
of a day is the ``splitsPerPass`` consecutive folders starting at folder ``(p - 1) *
splitsPerPass``. A folder is complete only when its donefile (``_SUCCESS`` by default) exists.

The planning functions are pure (no I/O) so the scheduler (which never imports torch) and the
worker compute the same plan; only ``folder_ready`` and ``list_part_files`` touch storage,
through fsspec, so the same code serves local disks and object stores.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import fsspec
from fsspec.spec import AbstractFileSystem

from streamtrain_worker.data.errors import LayoutError

MINUTES_PER_DAY = 24 * 60
DEFAULT_DONEFILE = "_SUCCESS"
# Files that writers use while a part is still in flight, or that carry metadata only.
_IGNORED_SUFFIXES = (".tmp", ".crc", "._COPYING_", ".inprogress", ".partial")


def parse_day(day: str) -> dt.date:
    """The date of a ``YYYYMMDD`` string; ``LayoutError`` for anything else (``20261131``)."""
    if len(day) != 8 or not day.isdigit():
        raise LayoutError(f"day {day!r} is not YYYYMMDD")
    try:
        return dt.date(int(day[:4]), int(day[4:6]), int(day[6:]))
    except ValueError as exc:
        raise LayoutError(f"day {day!r} is not a calendar date: {exc}") from exc


def format_day(date: dt.date) -> str:
    """``YYYYMMDD`` of a date (the folder name of that day)."""
    return date.strftime("%Y%m%d")


def next_day(day: str) -> str:
    """The day after ``day`` (validating it first, so a typo never silently advances)."""
    return format_day(parse_day(day) + dt.timedelta(days=1))


def days_between(start: str, end: str) -> list[str]:
    """Every day from ``start`` to ``end``, both included; empty if ``end`` is before ``start``."""
    first, last = parse_day(start), parse_day(end)
    return [format_day(first + dt.timedelta(days=i)) for i in range((last - first).days + 1)]


def folders_per_day(split_interval_minutes: int) -> int:
    """How many folders a day has; the interval must divide 1440 minutes."""
    if split_interval_minutes <= 0 or MINUTES_PER_DAY % split_interval_minutes:
        raise LayoutError(
            f"splitIntervalMinutes={split_interval_minutes} must be a positive divisor of 1440"
        )
    return MINUTES_PER_DAY // split_interval_minutes


def passes_per_day(split_interval_minutes: int, splits_per_pass: int) -> int:
    """How many passes a day has; ``splitsPerPass`` must divide the folders of a day."""
    folders = folders_per_day(split_interval_minutes)
    if splits_per_pass <= 0 or folders % splits_per_pass:
        raise LayoutError(
            f"splitsPerPass={splits_per_pass} must be a positive divisor of the {folders} "
            f"folders per day (splitIntervalMinutes={split_interval_minutes})"
        )
    return folders // splits_per_pass


def folder_names(split_interval_minutes: int, hourly_names: bool = False) -> list[str]:
    """The folder names of one day, in time order: ``HHMM`` (or ``HH`` when hourly)."""
    count = folders_per_day(split_interval_minutes)
    if hourly_names and split_interval_minutes % 60:
        raise LayoutError(
            f"hourly folder names need splitIntervalMinutes to be a multiple of 60, "
            f"got {split_interval_minutes}"
        )
    names = []
    for i in range(count):
        hour, minute = divmod(i * split_interval_minutes, 60)
        names.append(f"{hour:02d}" if hourly_names else f"{hour:02d}{minute:02d}")
    return names


def pass_folder_names(
    pass_index: int,
    split_interval_minutes: int,
    splits_per_pass: int,
    hourly_names: bool = False,
) -> list[str]:
    """The folder names (``HHMM``) of pass ``pass_index`` (1-based) of any day."""
    total = passes_per_day(split_interval_minutes, splits_per_pass)
    if not 1 <= pass_index <= total:
        raise LayoutError(f"pass {pass_index} is outside 1..{total} for this split configuration")
    names = folder_names(split_interval_minutes, hourly_names)
    start = (pass_index - 1) * splits_per_pass
    return names[start : start + splits_per_pass]


def day_folder(root: str, day: str) -> str:
    """``<root>/<day>``, validating the day."""
    parse_day(day)
    return f"{root.rstrip('/')}/{day}"


def pass_folders(
    root: str,
    day: str,
    pass_index: int,
    split_interval_minutes: int,
    splits_per_pass: int,
    *,
    hourly_names: bool = False,
) -> list[str]:
    """The folders (``<root>/<day>/<HHMM>``) that form pass ``pass_index`` (1-based) of ``day``."""
    base = day_folder(root, day)
    names = pass_folder_names(pass_index, split_interval_minutes, splits_per_pass, hourly_names)
    return [f"{base}/{name}" for name in names]


def next_pass(day: str, pass_index: int, passes_in_a_day: int) -> tuple[str, int]:
    """The (day, pass) after ``(day, pass_index)``: the next pass, or pass 1 of the next day."""
    if not 1 <= pass_index <= passes_in_a_day:
        raise LayoutError(f"pass {pass_index} is outside 1..{passes_in_a_day}")
    if pass_index < passes_in_a_day:
        return check_day(day), pass_index + 1
    return next_day(day), 1


def check_day(day: str) -> str:
    """``day`` itself after validation (keeps callers from passing a malformed day along)."""
    parse_day(day)
    return day


def iter_passes(
    start_day: str,
    end_day: str | None,
    split_interval_minutes: int,
    splits_per_pass: int,
) -> Iterator[tuple[str, int]]:
    """Every (day, pass) from pass 1 of ``start_day`` through ``end_day`` (forever if None)."""
    total = passes_per_day(split_interval_minutes, splits_per_pass)
    day = check_day(start_day)
    last = parse_day(end_day) if end_day is not None else None
    while last is None or parse_day(day) <= last:
        for pass_index in range(1, total + 1):
            yield day, pass_index
        day = next_day(day)


# --- I/O: the only functions here that touch storage --------------------------------------


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
