"""What every format shares: numba helpers for numbers and bags, and the block driver.

Each format is one numba kernel that walks the raw bytes of a block line by line (no
per-line Python), tokenises a line into ``(slot, sign)`` pairs in a scratch buffer, and — only
if the whole line parsed — commits it: a counting sort by slot writes the keys bag-major
(``example * S + slot``) into the ``Batch`` CSR, keeping input order inside a slot so
behaviour sequences stay ordered. A bad line is recorded (absolute line number and a reason
code) and dropped. Kernels release the GIL, so the reader's background thread parses while
the training thread computes.

Kernel contract (all formats)::

    kernel(data, first_line, *format_params,
           labels, keys, offsets, bad_lines, bad_reasons, stats) -> None

``stats`` receives ``[examples, keys, lines, bad, consumed_bytes, physical_lines]``. A kernel
stops early (at a line boundary) when ``keys`` is full; ``run_kernel`` then continues with a
larger buffer, so no estimate can ever drop data.

The line scanner is shared: ``line_scratch`` (the per-line scratch), ``settle_line``
(commit a parsed line or record a bad one) and ``report`` (the counters into ``stats``).
Each format's kernel is only the short loop that calls them around its own tokenizer, and
finds its lines' ends itself: seven lines, because as a shared function (even inlined) that
byte scan cost the delimited formats 5 % of their parse rate (``docs/decisions.md``). numba
cannot cache a kernel that receives the tokenizer as an argument or closes over it
(measured: every process then recompiles, ~3 s per format), and cached kernels are what
keep worker start-up and the tests fast.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import numba
import numpy as np
import numpy.typing as npt

from streamtrain_worker.data.batch import Batch, concat_batches

OK = 0
BAD_COLUMNS = 1
BAD_NUMBER = 2
BAD_LABEL = 3
MISSING_LABEL = 4
UNKNOWN_FEATURE = 5
BAD_TOKEN = 6
UNTERMINATED_QUOTE = 7
TEXT_AFTER_QUOTE = 8
REASONS = {
    BAD_COLUMNS: "wrong column count",
    BAD_NUMBER: "unparsable number",
    BAD_LABEL: "unparsable label",
    MISSING_LABEL: "no label",
    UNKNOWN_FEATURE: "feature index not in the field map",
    BAD_TOKEN: "malformed token",
    # Lines are cut at every newline, so a quoted field holding a newline also ends up here.
    UNTERMINATED_QUOTE: "unterminated quoted field (newlines inside quotes are unsupported)",
    TEXT_AFTER_QUOTE: "text between a closing quote and the delimiter",
}
#: ``value`` of an empty integer cell (no bucket can reach it).
MISSING_VALUE = np.uint64(1 << 63)

U8 = npt.NDArray[np.uint8]
Kernel = Callable[..., None]


@dataclass(frozen=True)
class ParsedBlock:
    """The examples of one block plus what the bad-line policy needs."""

    batch: Batch
    lines: int  # data lines seen (good + bad; blank lines excluded)
    bad_lines: npt.NDArray[np.int64]  # 1-based line numbers in the file
    bad_reasons: npt.NDArray[np.int8]  # REASONS codes, aligned with bad_lines
    physical_lines: int  # lines consumed, blank ones included (advances numbering)


class BlockParser(Protocol):
    """Parses blocks of one file (formats with headers bind the header's columns)."""

    def parse(self, block: U8, first_line: int) -> ParsedBlock: ...


class Format(Protocol):
    """A line format: its slot count and a per-file ``BlockParser``."""

    num_slots: int
    has_header: bool

    def for_file(self, path: str, header: bytes | None) -> BlockParser: ...


@numba.njit(inline="always", cache=True)
def max_line_length(data: U8) -> int:
    """Longest line in bytes (one line never emits more than its bytes + 2 keys)."""
    best = 0
    start = 0
    for i in range(data.shape[0]):
        if data[i] == 10:
            best = max(best, i - start)
            start = i + 1
    return max(best, data.shape[0] - start)


@numba.njit(inline="always", cache=True)
def parse_int(data: U8, a: int, b: int) -> tuple[bool, int]:
    """Signed decimal integer in ``data[a:b]`` (at most 18 digits)."""
    if a >= b:
        return False, 0
    neg = False
    if data[a] == 45 or data[a] == 43:  # '-' '+'
        neg = data[a] == 45
        a += 1
    if a >= b or b - a > 18:
        return False, 0
    v = 0
    for i in range(a, b):
        d = data[i] - 48
        if d < 0 or d > 9:
            return False, 0
        v = v * 10 + d
    return True, -v if neg else v


@numba.njit(inline="always", cache=True)
def parse_uint64(data: U8, a: int, b: int) -> tuple[bool, np.uint64]:
    """Unsigned decimal in ``data[a:b]`` up to 2**64-1 (PaddleRec feasigns use all 64 bits)."""
    v = np.uint64(0)
    if a >= b or b - a > 20:
        return False, v
    limit = np.uint64(1844674407370955161)  # (2**64 - 1) // 10
    for i in range(a, b):
        d = np.uint64(data[i] - 48)
        if data[i] < 48 or data[i] > 57:
            return False, v
        if v > limit or (v == limit and d > np.uint64(5)):
            return False, v
        v = v * np.uint64(10) + d
    return True, v


@numba.njit(inline="always", cache=True)
def parse_number(data: U8, a: int, b: int) -> tuple[bool, int]:
    """Sign of a decimal number ``[+-]digits[.digits]``: (ok, -1 / 0 / +1)."""
    if a >= b:
        return False, 0
    neg = False
    if data[a] == 45 or data[a] == 43:
        neg = data[a] == 45
        a += 1
    digits = 0
    nonzero = False
    dot = False
    for i in range(a, b):
        c = data[i]
        if c == 46 and not dot:
            dot = True
        elif 48 <= c <= 57:
            digits += 1
            nonzero = nonzero or c != 48
        else:
            return False, 0
    if digits == 0:
        return False, 0
    if not nonzero:
        return True, 0
    return True, -1 if neg else 1


@numba.njit(inline="always", cache=True)
def parse_label(data: U8, a: int, b: int) -> int:
    """Click label of a number: 1 if positive, 0 if zero or negative (libSVM's -1), -1 if bad."""
    ok, sign = parse_number(data, a, b)
    if not ok:
        return -1
    return 1 if sign > 0 else 0


@numba.njit(inline="always", cache=True)
def bucket(v: int) -> int:
    """Criteo-style integer bucket: small values (<= 2) stay exact (clamped at -64), larger
    ones fall into ``3 + floor(ln(v)^2)`` so resolution shrinks as values grow."""
    if v <= 2:
        return max(v, -64)
    lv = math.log(v)
    return 3 + int(lv * lv)


@numba.njit(inline="always", cache=True)
def find_sorted(table: npt.NDArray[np.uint64], key: np.uint64) -> int:
    """Index of ``key`` in the sorted ``table``, or -1."""
    lo = 0
    hi = table.shape[0]
    while lo < hi:
        mid = (lo + hi) >> 1
        if table[mid] < key:
            lo = mid + 1
        else:
            hi = mid
    if lo < table.shape[0] and table[lo] == key:
        return lo
    return -1


@numba.njit(inline="always", cache=True)
def commit_line(
    line_slots: npt.NDArray[np.int32],
    line_keys: npt.NDArray[np.uint64],
    m: int,
    num_slots: int,
    counts: npt.NDArray[np.int64],
    keys: npt.NDArray[np.uint64],
    nk: int,
    offsets: npt.NDArray[np.int64],
    example: int,
) -> int:
    """Write one parsed line's keys bag-major (stable counting sort by slot); new key count."""
    for s in range(num_slots):
        counts[s] = 0
    for i in range(m):
        counts[line_slots[i]] += 1
    base = nk
    for s in range(num_slots):
        c = counts[s]
        counts[s] = base
        base += c
        offsets[example * num_slots + s + 1] = base
    for i in range(m):
        s = line_slots[i]
        keys[counts[s]] = line_keys[i]
        counts[s] += 1
    return base


@numba.njit(inline="always", cache=True)
def line_scratch(length: int) -> tuple[npt.NDArray[np.int32], npt.NDArray[np.uint64]]:
    """Per-line scratch for lines up to ``length`` bytes (a line emits at most its bytes + 2
    keys), with room to spare; a kernel calls it only when a longer line comes (replacing
    the arrays costs reference counting, too much to pay on every line)."""
    size = 2 * (length + 2)
    return np.empty(size, dtype=np.int32), np.empty(size, dtype=np.uint64)


@numba.njit(inline="always", cache=True)
def settle_line(
    status: int,
    m: int,
    label: float,
    line_slots: npt.NDArray[np.int32],
    line_keys: npt.NDArray[np.uint64],
    num_slots: int,
    counts: npt.NDArray[np.int64],
    labels: npt.NDArray[np.float32],
    keys: npt.NDArray[np.uint64],
    offsets: npt.NDArray[np.int64],
    bad_lines: npt.NDArray[np.int64],
    bad_reasons: npt.NDArray[np.int8],
    line_number: int,
    examples: int,
    nkeys: int,
    nbad: int,
) -> tuple[bool, int, int, int]:
    """Commit a parsed line's ``m`` keys (``status`` OK) or record line ``line_number`` as
    bad. Returns ``(fits, examples, keys, bad)``; ``fits`` is false (nothing done) when
    ``keys`` cannot hold the line: the kernel stops before it. (The counters travel as
    values, not in ``stats``, so they stay in registers: kept in the array they cost the
    kernels 10-15 % of their parse rate, measured.)"""
    fits = True
    if status == OK:
        if nkeys + m > keys.shape[0]:
            fits = False
        else:
            labels[examples] = label
            nkeys = commit_line(
                line_slots, line_keys, m, num_slots, counts, keys, nkeys, offsets, examples
            )
            examples += 1
    else:
        bad_lines[nbad] = line_number
        bad_reasons[nbad] = status
        nbad += 1
    return fits, examples, nkeys, nbad


@numba.njit(inline="always", cache=True)
def report(
    stats: npt.NDArray[np.int64],
    examples: int,
    nkeys: int,
    lines: int,
    nbad: int,
    pos: int,
    physical: int,
) -> None:
    """A kernel's ``stats`` (module docstring)."""
    stats[0] = examples
    stats[1] = nkeys
    stats[2] = lines
    stats[3] = nbad
    stats[4] = pos
    stats[5] = physical


def run_kernel(
    kernel: Kernel, params: tuple[object, ...], block: U8, first_line: int, num_slots: int
) -> ParsedBlock:
    """Drive ``kernel`` over a whole block, growing the key buffer when a kernel stops early."""
    parts: list[Batch] = []
    bad: list[npt.NDArray[np.int64]] = []
    reasons: list[npt.NDArray[np.int8]] = []
    lines = 0
    physical = 0
    pos = 0
    key_cap = block.shape[0] // 4 + 64
    while True:
        sub = block[pos:]
        cap = int(np.count_nonzero(sub == 10)) + 1
        labels = np.empty(cap, dtype=np.float32)
        keys = np.empty(key_cap, dtype=np.uint64)
        offsets = np.empty(cap * num_slots + 1, dtype=np.int64)
        offsets[0] = 0  # the kernel writes every later boundary of the examples it commits
        bad_lines = np.empty(cap, dtype=np.int64)
        bad_reasons = np.empty(cap, dtype=np.int8)
        stats = np.zeros(6, dtype=np.int64)
        kernel(
            sub,
            first_line + physical,
            *params,
            labels,
            keys,
            offsets,
            bad_lines,
            bad_reasons,
            stats,
        )
        examples, nkeys, nlines, nbad, consumed, nphys = (int(x) for x in stats)
        if examples or not parts:
            parts.append(
                Batch(
                    labels=labels[:examples],
                    keys=keys[:nkeys],
                    offsets=offsets[: examples * num_slots + 1],
                    num_slots=num_slots,
                )
            )
        bad.append(bad_lines[:nbad])
        reasons.append(bad_reasons[:nbad])
        lines += nlines
        physical += nphys
        pos += consumed
        if pos >= block.shape[0]:
            break
        # The key buffer filled up: continue after the last committed line with more room
        # (one line never emits more keys than it has bytes plus two).
        key_cap = max(2 * key_cap, max_line_length(block[pos:]) + 2)
    batch = parts[0] if len(parts) == 1 else concat_batches(parts)
    return ParsedBlock(
        batch=batch,
        lines=lines,
        bad_lines=np.concatenate(bad),
        bad_reasons=np.concatenate(reasons),
        physical_lines=physical,
    )
