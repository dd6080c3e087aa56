"""Delimited text (Criteo TSV, Avazu CSV, generic CSV): one numba kernel driven by a column plan.

A ``ColumnPlan`` says, per column, what the cell is: skipped, the label, a categorical token,
an integer to bucket, a multi-valued cell (``a|b|c``) or Avazu's ``YYMMDDHH`` hour (two
tokens: hour of day and weekday). The three formats differ only in how they build the plan
(fixed for Criteo, from the header for Avazu and csv).

Quoting follows RFC 4180 as Python's ``csv`` module reads it with ``strict=True``, one physical
line at a time: a field that *starts* with the plan's quote byte runs to the next lone quote,
a doubled quote inside it is one literal quote, and the delimiter inside it is data. The
field's value is its unquoted content, so ``"abc"`` and ``abc`` give the same sign. A quote
elsewhere in a field is an ordinary byte (``ab"c``). An unterminated quote, or text between
a closing quote and the next delimiter (``"a"b``), makes the line bad. Lines are cut at every
newline before tokenising, so a newline inside quotes is unsupported: the line holding the
opening quote is bad as unterminated, and its continuation is parsed as a line of its own.

Why quotes are checked only where a field starts: that is the one place RFC 4180 gives a
quote meaning, so an unquoted line pays one byte comparison per field and the inner loop over
the bytes of a field stays exactly the delimiter scan it was before quoting existed.
"""

from __future__ import annotations

from dataclasses import dataclass

import numba
import numpy as np
import numpy.typing as npt

from streamtrain_worker.data.formats.kernel import (
    BAD_COLUMNS,
    BAD_LABEL,
    BAD_NUMBER,
    MISSING_LABEL,
    MISSING_VALUE,
    OK,
    TEXT_AFTER_QUOTE,
    U8,
    UNTERMINATED_QUOTE,
    ParsedBlock,
    bucket,
    line_scratch,
    parse_int,
    parse_label,
    report,
    run_kernel,
    settle_line,
)
from streamtrain_worker.data.hashing import hash_bytes, hash_unescaped, sign_of

SKIP = 0
LABEL = 1
CATEGORICAL = 2
BUCKET = 3
MULTI = 4
HOUR = 5


@dataclass(frozen=True)
class ColumnPlan:
    """Per-column parse instructions (arrays, so the kernel reads them without Python)."""

    delimiter: int
    #: Quote byte (``"`` by default), or -1 when quoting is off (Criteo, ``quoteChar: ""``).
    quote: int
    #: Exact column count a line must have; -1 means "at least ``min_columns``".
    num_columns: int
    min_columns: int
    kinds: npt.NDArray[np.int8]
    slots: npt.NDArray[np.int32]
    #: Second slot (HOUR: the weekday slot); -1 otherwise.
    slots2: npt.NDArray[np.int32]
    separators: npt.NDArray[np.uint8]
    num_slots: int


class DelimitedParser:
    """Parses blocks of one file under a fixed ``ColumnPlan``."""

    def __init__(self, plan: ColumnPlan) -> None:
        self._plan = plan
        p = plan
        self._params = (
            p.delimiter,
            p.quote,
            p.num_columns,
            p.min_columns,
            p.kinds,
            p.slots,
            p.slots2,
            p.separators,
            p.num_slots,
        )

    @property
    def plan(self) -> ColumnPlan:
        """The plan this parser was built with."""
        return self._plan

    @property
    def params(self) -> tuple[object, ...]:
        """The kernel's format parameters, in signature order (``bench_quoting`` reuses them
        to drive an older kernel on the same plan)."""
        return self._params

    def parse(self, block: U8, first_line: int) -> ParsedBlock:
        return run_kernel(_kernel, self._params, block, first_line, self._plan.num_slots)


@numba.njit(inline="always", cache=True)
def _weekday(year: int, month: int, day: int) -> int:
    """Monday=0 weekday of a civil date (days-from-civil, valid for the Gregorian calendar)."""
    y = year - 1 if month <= 2 else year
    era = y // 400
    yoe = y - era * 400
    mp = month - 3 if month > 2 else month + 9
    doy = (153 * mp + 2) // 5 + day - 1
    doe = yoe * 365 + yoe // 4 - yoe // 100 + doy
    days = era * 146097 + doe - 719468  # days since 1970-01-01, a Thursday
    return (days + 3) % 7


@numba.njit(inline="always", cache=True)
def _hour(
    data: U8,
    a: int,
    b: int,
    slot: int,
    weekday_slot: int,
    line_slots: npt.NDArray[np.int32],
    line_keys: npt.NDArray[np.uint64],
    m: int,
) -> int:
    """Avazu ``YYMMDDHH``: emit hour-of-day and weekday tokens at ``m``; status code."""
    ok, v = parse_int(data, a, b)
    if not ok or b - a != 8:
        return BAD_NUMBER
    hour = v % 100
    dd = (v // 100) % 100
    mm = (v // 10000) % 100
    yy = v // 1000000
    if hour > 23 or mm < 1 or mm > 12 or dd < 1 or dd > 31:
        return BAD_NUMBER
    line_slots[m] = slot
    line_keys[m] = sign_of(slot, np.uint64(hour))
    line_slots[m + 1] = weekday_slot
    line_keys[m + 1] = sign_of(weekday_slot, np.uint64(_weekday(2000 + yy, mm, dd)))
    return OK


@numba.njit(nogil=True, cache=True)
def _tokenize(
    data: U8,
    a: int,
    b: int,
    delimiter: int,
    quote: int,
    num_columns: int,
    min_columns: int,
    kinds: npt.NDArray[np.int8],
    slots: npt.NDArray[np.int32],
    slots2: npt.NDArray[np.int32],
    separators: npt.NDArray[np.uint8],
    line_slots: npt.NDArray[np.int32],
    line_keys: npt.NDArray[np.uint64],
) -> tuple[int, int, int]:
    """(keys, status, label) of the line ``data[a:b]``."""
    m = 0
    label = -1
    col = 0
    i = a
    # The first error is kept while the columns are still counted, so a short or long line
    # reports "wrong column count" rather than whichever cell happened to break first. A
    # quoting error ends the line at once: past it the columns cannot be counted.
    err = OK
    while True:
        # A field starts at i; its content is data[start:end]. ``escaped``: it holds doubled
        # quotes, so text must be hashed unescaped (numbers with a quote in them are bad anyway).
        start = i
        escaped = False
        if i < b and data[i] == quote:
            i += 1
            start = i
            while True:
                if i == b:
                    return 0, UNTERMINATED_QUOTE, 0
                if data[i] == quote:
                    if i + 1 < b and data[i + 1] == quote:
                        escaped = True
                        i += 2
                        continue
                    break
                i += 1
            end = i
            i += 1
            if i < b and data[i] != delimiter:
                return 0, TEXT_AFTER_QUOTE, 0
        else:
            while i < b and data[i] != delimiter:
                i += 1
            end = i
        if err == OK and col < kinds.shape[0]:
            kind = kinds[col]
            slot = slots[col]
            if kind == CATEGORICAL:
                line_slots[m] = slot
                if escaped:
                    line_keys[m] = sign_of(slot, hash_unescaped(data, start, end, quote))
                else:
                    line_keys[m] = sign_of(slot, hash_bytes(data, start, end))
                m += 1
            elif kind == LABEL:
                label = parse_label(data, start, end)
                if label < 0:
                    err = BAD_LABEL
            elif kind == BUCKET:
                value = MISSING_VALUE
                ok = True
                if end > start:
                    ok, v = parse_int(data, start, end)
                    value = np.uint64(np.int64(bucket(v)))
                if ok:
                    line_slots[m] = slot
                    line_keys[m] = sign_of(slot, value)
                    m += 1
                else:
                    err = BAD_NUMBER
            elif kind == MULTI:
                piece = start
                for j in range(start, end + 1):
                    if j == end or data[j] == separators[col]:
                        if j > piece:
                            line_slots[m] = slot
                            if escaped:
                                value = hash_unescaped(data, piece, j, quote)
                            else:
                                value = hash_bytes(data, piece, j)
                            line_keys[m] = sign_of(slot, value)
                            m += 1
                        piece = j + 1
            elif kind == HOUR:
                err = _hour(data, start, end, slot, slots2[col], line_slots, line_keys, m)
                if err == OK:
                    m += 2
        col += 1
        if i >= b:
            break
        i += 1  # past the delimiter; a delimiter ending the line leaves one empty field
    if (num_columns >= 0 and col != num_columns) or col < min_columns:
        return 0, BAD_COLUMNS, 0
    if err != OK:
        return 0, err, 0
    if label < 0:
        return 0, MISSING_LABEL, 0
    return m, OK, label


@numba.njit(nogil=True, cache=True)
def _kernel(
    data: U8,
    first_line: int,
    delimiter: int,
    quote: int,
    num_columns: int,
    min_columns: int,
    kinds: npt.NDArray[np.int8],
    slots: npt.NDArray[np.int32],
    slots2: npt.NDArray[np.int32],
    separators: npt.NDArray[np.uint8],
    num_slots: int,
    labels: npt.NDArray[np.float32],
    keys: npt.NDArray[np.uint64],
    offsets: npt.NDArray[np.int64],
    bad_lines: npt.NDArray[np.int64],
    bad_reasons: npt.NDArray[np.int8],
    stats: npt.NDArray[np.int64],
) -> None:
    n = data.shape[0]
    line_slots, line_keys = line_scratch(126)
    counts = np.empty(num_slots, dtype=np.int64)
    pos = examples = nkeys = lines = nbad = physical = 0
    while pos < n:
        end = pos
        while end < n and data[end] != 10:
            end += 1
        stop = end
        if stop > pos and data[stop - 1] == 13:
            stop -= 1
        nxt = end + 1 if end < n else n
        if stop - pos + 2 > line_slots.shape[0]:
            line_slots, line_keys = line_scratch(stop - pos)
        if stop > pos:
            m, status, label = _tokenize(
                data,
                pos,
                stop,
                delimiter,
                quote,
                num_columns,
                min_columns,
                kinds,
                slots,
                slots2,
                separators,
                line_slots,
                line_keys,
            )
            fits, examples, nkeys, nbad = settle_line(
                status, m, label, line_slots, line_keys, num_slots, counts, labels, keys,
                offsets, bad_lines, bad_reasons, first_line + physical, examples, nkeys, nbad,
            )  # fmt: skip
            if not fits:
                break
            lines += 1
        physical += 1
        pos = nxt
    report(stats, examples, nkeys, lines, nbad, pos, physical)
