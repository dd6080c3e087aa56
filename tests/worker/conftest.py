"""Helpers the worker's parser tests share: where the sample data is, and how one block
of text is parsed and read back per slot.

``test_formats.py`` (every format on real rows) and ``test_quoting.py`` (RFC 4180 quoting)
drive the parsers the same way; one copy keeps their notion of "a parsed block" the same.
"""

from __future__ import annotations

import numpy as np

from streamtrain_tools.samples import SAMPLES_DIR
from streamtrain_worker.data.formats import Format, ParsedBlock

AVAZU = SAMPLES_DIR / "avazu_sample_train.csv"
#: The key a missing numeric value hashes from (the kernels' sentinel).
MISSING = 1 << 63


def parse(fmt: Format, text: bytes, path: str = "mem") -> ParsedBlock:
    """Parse ``text`` as one block of a file at ``path`` (its header line, if the format
    has one, split off first as a reader would)."""
    header = None
    if fmt.has_header:
        header, _, text = text.partition(b"\n")
    parser = fmt.for_file(path, header)
    return parser.parse(np.frombuffer(text, dtype=np.uint8), 2 if fmt.has_header else 1)


def bags(parsed: ParsedBlock, example: int) -> list[list[int]]:
    """The keys of every slot of example ``example`` (one list per slot)."""
    b = parsed.batch
    s = b.num_slots
    return [
        b.keys[b.offsets[example * s + k] : b.offsets[example * s + k + 1]].tolist()
        for k in range(s)
    ]
