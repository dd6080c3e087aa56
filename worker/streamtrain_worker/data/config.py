"""The ``data`` section of a job, parsed once into a frozen dataclass.

The operator renders ``spec.data`` nearly verbatim (camelCase names), so this class accepts
every field of the operator's ``DataSpec`` (the scheduling ones are kept, not used, by the
reader) plus the format options only the data layer needs. Unknown fields are errors (a typo
must not fall back to a default) and every error names the field.

Slots are identified by position ``0..num_slots-1`` everywhere downstream (``Batch`` bags,
``sequenceSlot``, the model's ``targetSlot``); ``slot_names`` gives their names per format:

- ``criteo``: ``I1..I13, C1..C26`` (39 slots);
- ``avazu``: the 21 categorical columns, then ``hour`` (hour of day) and ``weekday``;
- ``slot``: ``slots`` if given, else ``"1".."numSlots"`` (PaddleRec slot ids);
- ``libsvm``: ``slots`` if given, else ``"0".."numSlots-1"`` (fields of ``field:idx:val``
  tokens or of the ``fieldMap`` file, in first-appearance order);
- ``csv``: the distinct slot names of ``columns``, in order of appearance.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from streamtrain_worker.data.errors import DataConfigError

FORMATS = ("slot", "criteo", "avazu", "libsvm", "csv")
CSV_KINDS = ("categorical", "bucket", "multi")
CRITEO_SLOTS = tuple([f"I{i}" for i in range(1, 14)] + [f"C{i}" for i in range(1, 27)])
AVAZU_CATEGORICAL = (
    "C1",
    "banner_pos",
    "site_id",
    "site_domain",
    "site_category",
    "app_id",
    "app_domain",
    "app_category",
    "device_id",
    "device_ip",
    "device_model",
    "device_type",
    "device_conn_type",
    "C14",
    "C15",
    "C16",
    "C17",
    "C18",
    "C19",
    "C20",
    "C21",
)
AVAZU_SLOTS = (*AVAZU_CATEGORICAL, "hour", "weekday")
LABEL = "label"


@dataclass(frozen=True)
class CsvColumn:
    """One csv column feeding a slot.

    ``kind``: ``categorical`` (the cell's bytes are a token), ``bucket`` (an integer bucketed
    like Criteo's I-columns), ``multi`` (the cell holds several tokens split by
    ``separator``, e.g. ``a|b|c``).
    """

    column: str
    slot: str
    kind: str = "categorical"
    separator: str = "|"


@dataclass(frozen=True)
class DataConfig:
    """Validated data settings; see the module docstring for slot naming per format."""

    #: Root of the time-sliced logs (used by the scheduler; the reader gets file lists).
    path: str = ""
    startDay: str | None = None
    endDay: str | None = None
    #: Line format: slot | criteo | avazu | libsvm | csv.
    format: str = "slot"
    #: Folder names inside a day: HHMM or (hourly splits) HH.
    layout: str = "HHMM"
    splitIntervalMinutes: int = 60
    splitsPerPass: int = 1
    #: File whose presence marks a folder complete.
    donefile: str = "_SUCCESS"
    pollSeconds: float = 60.0
    missingDeadlineSeconds: float = 3600.0
    onMissing: str = "keepWaiting"
    #: Bad lines / lines of a file above this fails the pass (BadDataError), before any
    #: example of that file is trained.
    maxBadLineFraction: float = 0.001
    #: Slot count (slot, libsvm); checked against the format's slots when given.
    numSlots: int | None = None
    #: csv: column (name, or 0-based index without a header) -> slot name or
    #: ``{"slot", "kind", "separator"}``; exactly one column maps to ``"label"``.
    columns: Mapping[str, Any] = field(default_factory=dict)
    #: Index of the behaviour-sequence slot (DIN), or None.
    sequenceSlot: int | None = None
    #: Explicit slot names (slot, libsvm formats).
    slots: tuple[str, ...] | None = None
    #: slot format: the slot whose feasign is the click label (``0:click`` / ``click:0``).
    labelSlot: str = "click"
    #: csv: field delimiter (one character); avazu is ``,`` and criteo a tab.
    delimiter: str = ","
    #: csv: whether every file starts with a header line naming the columns.
    header: bool = True
    #: avazu, csv: the quote character of RFC 4180 quoted fields (one ASCII character);
    #: ``""`` turns quoting off, so a quote is an ordinary byte of a token.
    quoteChar: str = '"'
    #: libsvm: fsspec URL of a ``field:value<TAB>index`` file mapping feature indices to
    #: fields (iPinYou's featindex); without it, tokens must be ``field:idx:val``.
    fieldMap: str | None = None

    @classmethod
    def from_dict(cls, data: Any, path: str = "data") -> DataConfig:
        """Parse the rendered JSON object; errors name ``<path>.<field>``."""
        if not isinstance(data, Mapping):
            raise DataConfigError(f"{path}: must be an object, got {type(data).__name__}")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise DataConfigError(f"{path}.{unknown[0]}: unknown field")
        kwargs: dict[str, Any] = {}
        for name, value in data.items():
            kwargs[name] = _coerce(name, value, f"{path}.{name}")
        cfg = cls(**kwargs)
        cfg.validate(path)
        return cfg

    def to_dict(self) -> dict[str, Any]:
        """The camelCase JSON form (round-trips through ``from_dict``)."""
        out: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, tuple):
                value = list(value)
            elif isinstance(value, Mapping):
                value = dict(value)
            out[f.name] = value
        return out

    def validate(self, path: str = "data") -> None:
        """Cross-field rules; raises ``DataConfigError`` naming the field."""

        def fail(name: str, message: str) -> DataConfigError:
            return DataConfigError(f"{path}.{name}: {message}")

        if self.format not in FORMATS:
            raise fail("format", f"must be one of {', '.join(FORMATS)}, got {self.format!r}")
        if self.layout not in ("HHMM", "HH"):
            raise fail("layout", f"must be HHMM or HH, got {self.layout!r}")
        if not 0.0 <= self.maxBadLineFraction <= 1.0:
            raise fail("maxBadLineFraction", f"must be in [0, 1], got {self.maxBadLineFraction}")
        if not self.donefile:
            raise fail("donefile", "must not be empty")
        if self.numSlots is not None and self.numSlots < 1:
            raise fail("numSlots", f"must be >= 1, got {self.numSlots}")
        if len(self.delimiter) != 1 or self.delimiter in "\r\n":
            raise fail(
                "delimiter", f"must be one character (not a newline), got {self.delimiter!r}"
            )
        self._validate_quote(fail)
        if self.format == "slot" and self.slots is None and self.numSlots is None:
            raise fail("numSlots", "the slot format needs numSlots or slots")
        if self.format == "csv":
            self._validate_csv(fail)
        names = self.slot_names
        if len(set(names)) != len(names):
            raise fail("slots", "slot names must be unique")
        if self.numSlots is not None and self.numSlots != len(names):
            raise fail(
                "numSlots", f"is {self.numSlots} but format {self.format} has {len(names)} slots"
            )
        if self.format == "slot" and self.labelSlot in names:
            raise fail("labelSlot", f"{self.labelSlot!r} is also a feature slot")
        if self.sequenceSlot is not None and not 0 <= self.sequenceSlot < len(names):
            raise fail("sequenceSlot", f"must be in 0..{len(names) - 1}, got {self.sequenceSlot}")

    def _validate_quote(self, fail: Callable[[str, str], DataConfigError]) -> None:
        # The kernels compare single bytes, so the quote must be one ASCII byte; it cannot be
        # the delimiter (avazu's is a comma) or a multi separator, whose bytes mean other things.
        quote = self.quoteChar
        if quote == "":
            return
        if len(quote) != 1 or not quote.isascii() or quote in "\r\n":
            raise fail(
                "quoteChar",
                f"must be one ASCII character (not a newline) or empty, got {quote!r}",
            )
        delimiter = "," if self.format == "avazu" else self.delimiter
        if self.format in ("avazu", "csv") and quote == delimiter:
            raise fail("quoteChar", f"must differ from the delimiter {delimiter!r}")

    def _validate_csv(self, fail: Callable[[str, str], DataConfigError]) -> None:
        cols = self.csv_columns()
        labels = [c for c in cols if c.slot == LABEL]
        if len(labels) != 1:
            raise fail("columns", f"exactly one column must map to {LABEL!r}, got {len(labels)}")
        for c in cols:
            if c.kind not in CSV_KINDS:
                raise fail(f"columns.{c.column}.kind", f"must be one of {', '.join(CSV_KINDS)}")
            if c.kind == "multi" and (
                len(c.separator) != 1 or c.separator in (self.delimiter, self.quoteChar)
            ):
                raise fail(
                    f"columns.{c.column}.separator",
                    "must be one character, not the delimiter or the quoteChar",
                )
            if not self.header and not c.column.isdigit():
                raise fail(f"columns.{c.column}", "without a header, columns are 0-based indices")
        if len(cols) == 1:
            raise fail("columns", "map at least one column to a feature slot")

    def csv_columns(self) -> list[CsvColumn]:
        """The csv column mapping in declaration order."""
        out = []
        for column, spec in self.columns.items():
            if isinstance(spec, str):
                out.append(CsvColumn(column=str(column), slot=spec))
            elif isinstance(spec, Mapping):
                unknown = sorted(set(spec) - {"slot", "kind", "separator"})
                if unknown or "slot" not in spec:
                    raise DataConfigError(
                        f"data.columns.{column}: needs 'slot', optional 'kind', 'separator'"
                    )
                out.append(
                    CsvColumn(
                        column=str(column),
                        slot=str(spec["slot"]),
                        kind=str(spec.get("kind", "categorical")),
                        separator=str(spec.get("separator", "|")),
                    )
                )
            else:
                raise DataConfigError(f"data.columns.{column}: must be a slot name or an object")
        return out

    @property
    def slot_names(self) -> tuple[str, ...]:
        """Names of slots ``0..num_slots-1`` for this format."""
        if self.format == "criteo":
            return CRITEO_SLOTS
        if self.format == "avazu":
            return AVAZU_SLOTS
        if self.slots is not None:
            return self.slots
        if self.format == "slot":
            return tuple(str(i) for i in range(1, (self.numSlots or 0) + 1))
        if self.format == "libsvm":
            return tuple(str(i) for i in range(self.numSlots or 1))
        names: list[str] = []
        for c in self.csv_columns():
            if c.slot != LABEL and c.slot not in names:
                names.append(c.slot)
        return tuple(names)

    @property
    def quote_byte(self) -> int:
        """The quote as the byte the delimited kernels compare with, or -1 (quoting off)."""
        return ord(self.quoteChar) if self.quoteChar else -1

    @property
    def num_slots(self) -> int:
        """``S``: the slot count of every ``Batch`` this config produces."""
        return len(self.slot_names)


def _coerce(name: str, value: Any, where: str) -> Any:
    """Type-check one JSON value for field ``name``."""

    def fail(expected: str) -> DataConfigError:
        return DataConfigError(f"{where}: must be {expected}, got {value!r}")

    ints = {"splitIntervalMinutes", "splitsPerPass"}
    floats = {"pollSeconds", "missingDeadlineSeconds", "maxBadLineFraction"}
    optional_ints = {"numSlots", "sequenceSlot"}
    optional_strs = {"startDay", "endDay", "fieldMap"}
    if name in ints or (name in optional_ints and value is not None):
        if isinstance(value, bool) or not isinstance(value, int):
            raise fail("an integer")
        return value
    if name in floats:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise fail("a number")
        return float(value)
    if name in optional_ints or (name in optional_strs and value is None):
        return value
    if name == "header":
        if not isinstance(value, bool):
            raise fail("true or false")
        return value
    if name == "columns":
        if not isinstance(value, Mapping):
            raise fail("an object (column -> slot)")
        return dict(value)
    if name == "slots":
        if value is None:
            return None
        if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
            raise fail("a list of non-empty strings")
        return tuple(value)
    if not isinstance(value, str):
        raise fail("a string")
    return value
