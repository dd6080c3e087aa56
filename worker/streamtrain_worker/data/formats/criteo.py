"""Criteo Kaggle TSV: ``label, I1..I13, C1..C26`` → 39 slots.

I-columns are integers (possibly negative or empty) bucketed by ``kernel.bucket`` (empty → its
own ``MISSING_VALUE`` token); C-columns are 32-bit hex strings hashed as text (empty → the
empty token, which is a valid "missing" feature of its own). A line must have exactly 40
tab-separated columns. Criteo's TSV is never quoted, so quoting is off (``quoteChar`` does not
apply): a quote byte stays part of its token, as in every earlier release.
"""

from __future__ import annotations

import numpy as np

from streamtrain_worker.data.formats.delimited import (
    BUCKET,
    CATEGORICAL,
    LABEL,
    ColumnPlan,
    DelimitedParser,
)

NUM_INTEGER = 13
NUM_CATEGORICAL = 26
NUM_COLUMNS = 1 + NUM_INTEGER + NUM_CATEGORICAL


class CriteoFormat:
    """The fixed Criteo column plan; files have no header."""

    num_slots = NUM_INTEGER + NUM_CATEGORICAL
    has_header = False

    def __init__(self) -> None:
        kinds = np.array(
            [LABEL] + [BUCKET] * NUM_INTEGER + [CATEGORICAL] * NUM_CATEGORICAL, np.int8
        )
        slots = np.array([-1, *range(self.num_slots)], dtype=np.int32)
        self._parser = DelimitedParser(
            ColumnPlan(
                delimiter=ord("\t"),
                quote=-1,
                num_columns=NUM_COLUMNS,
                min_columns=NUM_COLUMNS,
                kinds=kinds,
                slots=slots,
                slots2=np.full(NUM_COLUMNS, -1, dtype=np.int32),
                separators=np.zeros(NUM_COLUMNS, dtype=np.uint8),
                num_slots=self.num_slots,
            )
        )

    def for_file(self, path: str, header: bytes | None) -> DelimitedParser:
        return self._parser
