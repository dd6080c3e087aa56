"""Generic delimited text with a column → slot mapping (``DataConfig.columns``).

With a header, columns are found by name in each file's header and a line must have as many
columns as the header; without one, columns are 0-based indices and a line must have at least
``max(index) + 1`` columns. Several columns may feed one slot (multi-valued), and a ``multi``
column holds several tokens split by its separator. Unmapped columns are skipped. Fields may be
quoted (``DataConfig.quoteChar``, RFC 4180; see ``delimited``), the header line included.
"""

from __future__ import annotations

import numpy as np

from streamtrain_worker.data.config import LABEL as LABEL_SLOT
from streamtrain_worker.data.config import DataConfig
from streamtrain_worker.data.errors import CorruptFileError
from streamtrain_worker.data.formats.avazu import split_header
from streamtrain_worker.data.formats.delimited import (
    BUCKET,
    CATEGORICAL,
    LABEL,
    MULTI,
    SKIP,
    ColumnPlan,
    DelimitedParser,
)

_KINDS = {"categorical": CATEGORICAL, "bucket": BUCKET, "multi": MULTI}


class CsvFormat:
    """Column plan from the config, bound to each file's header when there is one."""

    def __init__(self, config: DataConfig) -> None:
        self._config = config
        self._columns = config.csv_columns()
        self._slot_of = {name: i for i, name in enumerate(config.slot_names)}
        self.num_slots = len(config.slot_names)
        self.has_header = config.header
        self._fixed = (
            None if config.header else self._plan([str(i) for i in range(self._width())], -1)
        )

    def _width(self) -> int:
        return max(int(c.column) for c in self._columns) + 1

    def _plan(self, names: list[str], num_columns: int) -> DelimitedParser:
        n = len(names)
        index = {name: i for i, name in enumerate(names)}
        kinds = np.full(n, SKIP, dtype=np.int8)
        slots = np.full(n, -1, dtype=np.int32)
        separators = np.zeros(n, dtype=np.uint8)
        for c in self._columns:
            col = index[c.column]
            if c.slot == LABEL_SLOT:
                kinds[col] = LABEL
            else:
                kinds[col] = _KINDS[c.kind]
                slots[col] = self._slot_of[c.slot]
                separators[col] = ord(c.separator)
        return DelimitedParser(
            ColumnPlan(
                delimiter=ord(self._config.delimiter),
                quote=self._config.quote_byte,
                num_columns=num_columns,
                min_columns=n,
                kinds=kinds,
                slots=slots,
                slots2=np.full(n, -1, dtype=np.int32),
                separators=separators,
                num_slots=self.num_slots,
            )
        )

    def for_file(self, path: str, header: bytes | None) -> DelimitedParser:
        if self._fixed is not None:
            return self._fixed
        if header is None:
            raise CorruptFileError(f"{path}: the csv config expects a header line")
        names = split_header(header, self._config.delimiter, path, self._config.quoteChar)
        missing = [c.column for c in self._columns if c.column not in names]
        if missing:
            raise CorruptFileError(f"{path}: header lacks configured columns {missing}")
        if len(set(names)) != len(names):
            raise CorruptFileError(f"{path}: header has duplicate column names")
        return self._plan(names, len(names))
