"""Avazu CSV with its header (``id,click,hour,C1,banner_pos,…,C21``): named columns → slots.

``id`` is dropped, ``click`` is the label, ``hour`` (``YYMMDDHH``) becomes two slots — hour of
day and weekday, because the date itself never repeats in a stream — and every other
configured column is a categorical slot (``config.AVAZU_SLOTS``). Columns are found by name
in each file's header, so column order may differ between files; extra columns are ignored.
Fields may be quoted (``DataConfig.quoteChar``), the header included.
"""

from __future__ import annotations

import csv

import numpy as np

from streamtrain_worker.data.config import AVAZU_CATEGORICAL, AVAZU_SLOTS, DataConfig
from streamtrain_worker.data.errors import CorruptFileError
from streamtrain_worker.data.formats.delimited import (
    CATEGORICAL,
    HOUR,
    LABEL,
    SKIP,
    ColumnPlan,
    DelimitedParser,
)


def split_header(header: bytes, delimiter: str, path: str, quote: str = "") -> list[str]:
    """Column names of a header line (UTF-8, surrounding blanks stripped).

    With a ``quote`` the header is split by Python's ``csv`` module under the rules the
    kernel applies to data lines (``strict``: text after a closing quote is an error), so
    writers that quote every cell (pandas' ``QUOTE_ALL``) name their columns the same way.
    """
    try:
        text = header.decode("utf-8").rstrip("\r\n")
    except UnicodeDecodeError as exc:
        raise CorruptFileError(f"{path}: header is not UTF-8: {exc}") from exc
    if not quote:
        return [name.strip() for name in text.split(delimiter)]
    try:
        (names,) = csv.reader([text], delimiter=delimiter, quotechar=quote, strict=True)
    except csv.Error as exc:
        raise CorruptFileError(f"{path}: malformed quoting in the header line: {exc}") from exc
    return [name.strip() for name in names] or [""]


class AvazuFormat:
    """Avazu's column plan, resolved per file from its header."""

    num_slots = len(AVAZU_SLOTS)
    has_header = True

    def __init__(self, config: DataConfig | None = None) -> None:
        self._quote = config.quoteChar if config is not None else '"'

    def for_file(self, path: str, header: bytes | None) -> DelimitedParser:
        if header is None:
            raise CorruptFileError(f"{path}: avazu files need a header line")
        names = split_header(header, ",", path, self._quote)
        required = ("click", "hour", *AVAZU_CATEGORICAL)
        missing = [n for n in required if n not in names]
        if missing:
            raise CorruptFileError(f"{path}: header lacks avazu columns {missing}")
        n = len(names)
        kinds = np.full(n, SKIP, dtype=np.int8)
        slots = np.full(n, -1, dtype=np.int32)
        slots2 = np.full(n, -1, dtype=np.int32)
        slot_of = {name: i for i, name in enumerate(AVAZU_SLOTS)}
        for col, name in enumerate(names):
            if name == "click":
                kinds[col] = LABEL
            elif name == "hour":
                kinds[col] = HOUR
                slots[col] = slot_of["hour"]
                slots2[col] = slot_of["weekday"]
            elif name in AVAZU_CATEGORICAL:
                kinds[col] = CATEGORICAL
                slots[col] = slot_of[name]
        return DelimitedParser(
            ColumnPlan(
                delimiter=ord(","),
                quote=ord(self._quote) if self._quote else -1,
                num_columns=n,
                min_columns=n,
                kinds=kinds,
                slots=slots,
                slots2=slots2,
                separators=np.zeros(n, dtype=np.uint8),
                num_slots=self.num_slots,
            )
        )
