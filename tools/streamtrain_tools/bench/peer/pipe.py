"""Criteo rows in the peer's input format (``make bench-peer``): the pipe its dataset reads.

PaddlePaddle's parameter-server trainer reads text through a *pipe command*: every file of a
pass is streamed through it, and what comes out must be its ``MultiSlot`` layout, one example
a line: for each fed variable in order, the number of values and then the values. The peer's
model here feeds ``show``, ``click`` and the 39 Criteo slots, one feature sign each, so a row
becomes ``1 1 1 <label> 1 <sign_1> ... 1 <sign_39>``.

The feature signs follow this repository's Criteo format (``streamtrain_worker.data.formats``):
I-columns bucketed by ``3 + floor(ln(v)^2)`` above 2 (exact, clamped at -64, below), an empty
column its own token; C-columns are their hex text, the empty one a token of its own. A sign
is ``(slot + 1) << 32 | crc32(token)``: stable across processes (the pipe runs once per file)
and never 0, which the peer's embedding reserves for padding.

Standard library only, and runnable as a script (``python pipe.py < rows``): it runs
under the peer's own interpreter, in its own virtualenv, where this repository's packages are
not installed. Running the conversion inside the peer's timed run (instead of converting the
files beforehand) charges it the parsing ours pays too.
"""

from __future__ import annotations

import math
import sys
import zlib
from collections.abc import Iterable, Iterator
from typing import TextIO

NUM_INTEGER = 13
NUM_CATEGORICAL = 26
NUM_SLOTS = NUM_INTEGER + NUM_CATEGORICAL
NUM_COLUMNS = 1 + NUM_SLOTS
#: Token of an empty I-column (the C-columns' empty text is already a token of its own).
MISSING = "m"


def bucket(v: int) -> int:
    """The integer bucket of this repository's Criteo format (``kernel.bucket``)."""
    if v <= 2:
        return max(v, -64)
    lv = math.log(v)
    return 3 + int(lv * lv)


def sign(slot: int, token: str) -> int:
    """The feature sign of ``token`` in ``slot`` (0-based): nonzero, below 2^38."""
    return (slot + 1) << 32 | zlib.crc32(token.encode())


def convert_line(line: str, number: int) -> str:
    """One Criteo TSV row (``label, I1..I13, C1..C26``) as a MultiSlot line.

    ``number`` (1-based) names the line in the error of a malformed row.
    """
    columns = line.rstrip("\r\n").split("\t")
    if len(columns) != NUM_COLUMNS:
        raise ValueError(f"line {number}: {len(columns)} tab-separated columns, expected 40")
    label = columns[0]
    if label not in ("0", "1"):
        raise ValueError(f"line {number}: label {label!r} is not 0 or 1")
    parts = ["1 1", f"1 {label}"]
    for slot in range(NUM_INTEGER):
        text = columns[1 + slot]
        if text:
            try:
                token = str(bucket(int(text)))
            except ValueError:
                raise ValueError(
                    f"line {number}: I{slot + 1} = {text!r} is not an integer"
                ) from None
        else:
            token = MISSING
        parts.append(f"1 {sign(slot, token)}")
    for slot in range(NUM_INTEGER, NUM_SLOTS):
        parts.append(f"1 {sign(slot, columns[1 + slot])}")
    return " ".join(parts)


def convert(lines: Iterable[str]) -> Iterator[str]:
    """Every non-empty row of ``lines`` converted (numbered from 1 for errors)."""
    for number, line in enumerate(lines, start=1):
        if line.strip():
            yield convert_line(line, number)


def pipe(source: TextIO, sink: TextIO) -> None:
    """Convert ``source`` into ``sink`` line by line (the peer's pipe command)."""
    for out in convert(source):
        sink.write(out)
        sink.write("\n")


if __name__ == "__main__":
    try:
        pipe(sys.stdin, sys.stdout)
    except ValueError as exc:
        print(f"pipe.py: {exc}", file=sys.stderr)
        sys.exit(2)
