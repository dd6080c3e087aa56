"""The time-sliced log layout, pure: which folders form a pass, and how days advance.

Logs land in ``<root>/<YYYYMMDD>/<HHMM>/part-*`` (or ``<root>/<YYYYMMDD>/<HH>/`` with hourly
folder names). A day is cut into ``1440 / splitIntervalMinutes`` folders; pass ``p`` (1-based)
of a day is the ``splitsPerPass`` consecutive folders starting at folder ``(p - 1) *
splitsPerPass``. A folder is complete only when its donefile (``_SUCCESS`` by default) exists.

Nothing here does I/O (import-linter keeps it so), so the scheduler (which never imports
torch) and the worker compute the same plan; ``layout`` is the storage side (donefiles,
listings) through fsspec.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator

from streamtrain_worker.data.errors import LayoutError

MINUTES_PER_DAY = 24 * 60
DEFAULT_DONEFILE = "_SUCCESS"


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


def folder_hour(name: str) -> int:
    """The hour of day of a folder named ``HHMM`` (or ``HH``)."""
    if len(name) not in (2, 4) or not name.isdigit() or int(name[:2]) > 23:
        raise LayoutError(f"folder {name!r}: not an HHMM or HH time slice")
    return int(name[:2])


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
