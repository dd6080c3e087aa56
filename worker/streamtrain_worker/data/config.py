"""The ``data`` section of a job, declared once and parsed into a frozen dataclass.

:class:`DataConfig` *is* the job's ``spec.data``: every field is declared here with
:func:`streamtrain_ps.plumbing.settings.setting` (type, default, bounds, doc), the operator's spec
composes this class (the CRD is generated from it) and renders it verbatim to the workers,
and both parse it with the one parser. The scheduling fields (path, days, splits, donefile)
are the operator's to use and the reader ignores them; the format options are the data
layer's. Unknown fields are errors (a typo must not fall back to a default) and every
error is a :class:`DataConfigError` carrying the field's path.

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

import datetime as dt
import itertools
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

from streamtrain_ps.plumbing.settings import ConfigError, Document, parse, setting
from streamtrain_worker.data.errors import DataConfigError

DataFormat = Literal["slot", "criteo", "avazu", "libsvm", "csv"]
FolderLayout = Literal["HHMM", "HH"]
OnMissing = Literal["keepWaiting", "fail"]
CsvKind = Literal["categorical", "bucket", "multi"]
#: Joins the two slot names of a crossed slot in ``crosses`` ("user*item").
CROSS_MARK = "*"
#: Unset ``crosses`` crosses every pair of up to this many slots (28 pairs); a wider schema
#: (Criteo's 39 slots, Avazu's 23) would multiply its keys per row by ~S/2 (decisions.md).
AUTO_CROSS_MAX_SLOTS = 8
#: A day folder's name, YYYYMMDD.
DAY_PATTERN = r"^[0-9]{8}$"
MINUTES_PER_DAY = 24 * 60

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
#: Slots whose integer token is ordinal (``ordinal_slots``): Criteo's bucketed I-columns,
#: Avazu's hour of day and weekday.
CRITEO_ORDINAL = CRITEO_SLOTS[:13]
AVAZU_ORDINAL = ("hour", "weekday")
LABEL = "label"


@dataclass(frozen=True)
class CsvColumn:
    """One csv column feeding a slot (``kind``: see :class:`CsvColumnOptions`)."""

    column: str
    slot: str
    kind: CsvKind = "categorical"
    separator: str = "|"


@dataclass(frozen=True)
class CsvColumnOptions:
    """The object form of a ``columns`` entry: ``{slot, kind, separator}``."""

    slot: str = setting(doc="The slot the column feeds; 'label' is the click.", min_length=1)
    kind: CsvKind = setting(
        "categorical",
        "categorical (the cell's bytes are a token), bucket (an integer bucketed like "
        "Criteo's I-columns) or multi (the cell holds several tokens split by separator).",
    )
    separator: str = setting("|", "multi only: the separator of the tokens of a cell.")


@dataclass(frozen=True)
class DataConfig(Document):
    """Where the logs land and how they are cut into passes (docs/design.md §3).

    The worker reads only the format options; the scheduling fields (path, days, splits,
    donefile, deadlines) are the operator's, declared here so ``spec.data`` has one owner.
    See the module docstring for slot naming per format.
    """

    document: ClassVar[str] = "data"
    errors: ClassVar[type[ConfigError]] = DataConfigError

    path: str | None = setting(
        None,
        "Root of the time-sliced logs: <path>/<YYYYMMDD>/<HHMM>/part-*. Any "
        "fsspec URL (local path, s3://...). A relative local path is resolved "
        "against the manifest's directory.",
        min_length=1,
    )
    startDay: str | None = setting(
        None, "First day trained, YYYYMMDD.", pattern=DAY_PATTERN, max_length=8
    )
    endDay: str | None = setting(
        None,
        "Last day trained (inclusive), YYYYMMDD; omit to run forever.",
        pattern=DAY_PATTERN,
        max_length=8,
    )
    format: DataFormat = setting("slot", "Line format of the part files.")
    layout: FolderLayout = setting(
        "HHMM", "Folder names inside a day: HHMM (e.g. 0130) or, for hourly splits only, HH."
    )
    splitIntervalMinutes: int = setting(
        60, "Minutes covered by one folder; must divide 1440.", minimum=1, maximum=MINUTES_PER_DAY
    )
    splitsPerPass: int = setting(
        1,
        "Consecutive folders that form one pass; must divide the "
        "folders of a day so every pass is whole.",
        minimum=1,
    )
    donefile: str = setting(
        "_SUCCESS", "File whose presence marks a folder complete.", min_length=1
    )
    pollSeconds: float = setting(
        60.0, "How often a missing donefile is looked for again.", exclusive_minimum=0
    )
    missingDeadlineSeconds: float = setting(
        3600.0,
        "A folder still without its donefile this long after the wait for its pass "
        "began raises the DataMissing condition naming it; then onMissing decides.",
        exclusive_minimum=0,
    )
    onMissing: OnMissing = setting(
        "keepWaiting",
        "Past missingDeadlineSeconds: keepWaiting (the "
        "condition stays until data arrives) or fail the job.",
    )
    maxBadLineFraction: float = setting(
        0.001,
        "A file with a larger fraction of unparsable lines fails the job, naming the file "
        "and its first bad lines; checked per file before any of its examples is trained, "
        "and not retried (condition reason BadData).",
        minimum=0,
        maximum=1,
    )
    numSlots: int | None = setting(
        None,
        "Slots per example (slot and libsvm formats, unless slots names them); criteo (39) "
        "and avazu (23) are fixed by the format.",
        minimum=1,
    )
    slots: tuple[str, ...] | None = setting(
        None,
        "slot and libsvm formats: explicit slot names, in order (optional).",
        item_min_length=1,
    )
    labelSlot: str = setting("click", "slot format: the slot whose feasign is the click label.")
    columns: dict[str, Any] = setting(
        {},
        "csv only: column (name, or 0-based index without a header) -> slot name, or "
        "{slot, kind: categorical|bucket|multi, separator}; exactly one column maps to "
        "'label'.",
    )
    delimiter: str = setting(
        ",", "csv only: field delimiter (one character).", min_length=1, max_length=1
    )
    header: bool = setting(True, "csv only: every file starts with a header line.")
    quoteChar: str = setting(
        '"',
        "avazu and csv: quote character of RFC 4180 quoted fields (the delimiter inside "
        "quotes is data, a doubled quote is one literal quote; no newlines inside quotes); "
        "an empty string turns quoting off.",
        pattern="^[ -~]?$",
        pattern_doc="one ASCII character (not a newline) or empty",
    )
    fieldMap: str | None = setting(
        None, "libsvm only: URL of a field:value<TAB>index file mapping indices to fields."
    )
    sequenceSlot: int | None = setting(
        None, "DIN only: index of the slot holding the behaviour sequence.", minimum=0
    )
    crosses: tuple[str, ...] | None = setting(
        None,
        "Pairs of slots crossed into one more slot each, as 'user*item' (VW's -q ui): every "
        "pair of their keys becomes a key of its own, in a slot after the format's. Unset: "
        "every pair of the slots other than sequenceSlot, when there are at most "
        f"{AUTO_CROSS_MAX_SLOTS} of them, crossing single keys only (VW's -q ::); [] none.",
    )

    def _validate(self, path: str) -> None:
        """Cross-field rules (the declarations checked each field alone)."""

        def fail(name: str, message: str) -> DataConfigError:
            return DataConfigError(f"{path}.{name}", message)

        self._validate_schedule(fail)
        if self.delimiter in "\r\n":
            raise fail("delimiter", f"must not be a newline, got {self.delimiter!r}")
        self._validate_quote(fail)
        if self.format == "slot" and self.slots is None and self.numSlots is None:
            raise fail("numSlots", "the slot format needs numSlots or slots")
        if self.format == "csv":
            self._validate_csv(fail, path)
        if self.slots_in_field_map:
            return  # the format checks numSlots against the map it reads
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
        self.crossed_positions(names, path)

    def _validate_schedule(self, fail: Callable[[str, str], DataConfigError]) -> None:
        # Mirrored as CEL rules in the CRD (streamtrain_tools.crdgen.SPEC_RULES).
        if MINUTES_PER_DAY % self.splitIntervalMinutes:
            raise fail("splitIntervalMinutes", f"must divide 1440, got {self.splitIntervalMinutes}")
        folders = MINUTES_PER_DAY // self.splitIntervalMinutes
        if folders % self.splitsPerPass:
            raise fail(
                "splitsPerPass",
                f"must divide the {folders} folders of a day, got {self.splitsPerPass}",
            )
        if self.layout == "HH" and self.splitIntervalMinutes % 60:
            raise fail("layout", "HH folders need splitIntervalMinutes to be a multiple of 60")
        for name in ("startDay", "endDay"):
            day = getattr(self, name)
            try:
                if day is not None:
                    dt.datetime.strptime(day, "%Y%m%d")
            except ValueError:
                raise fail(name, f"not a calendar day: {day!r}") from None
        if self.startDay is not None and self.endDay is not None and self.endDay < self.startDay:
            raise fail("endDay", f"must be >= startDay {self.startDay}, got {self.endDay}")

    def _validate_quote(self, fail: Callable[[str, str], DataConfigError]) -> None:
        # The kernels compare single bytes, so the quote is one ASCII byte (declared); it
        # cannot be the delimiter (avazu's is a comma) or a multi separator, whose bytes mean
        # other things.
        quote = self.quoteChar
        delimiter = "," if self.format == "avazu" else self.delimiter
        if quote and self.format in ("avazu", "csv") and quote == delimiter:
            raise fail("quoteChar", f"must differ from the delimiter {delimiter!r}")

    def _validate_csv(self, fail: Callable[[str, str], DataConfigError], path: str) -> None:
        cols = self.csv_columns(path)
        labels = [c for c in cols if c.slot == LABEL]
        if len(labels) != 1:
            raise fail("columns", f"exactly one column must map to {LABEL!r}, got {len(labels)}")
        for c in cols:
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

    def csv_columns(self, path: str = "data") -> list[CsvColumn]:
        """The csv column mapping in declaration order (object entries parsed as
        :class:`CsvColumnOptions`)."""
        out = []
        for column, spec in self.columns.items():
            where = f"{path}.columns.{column}"
            if isinstance(spec, str):
                out.append(CsvColumn(column=str(column), slot=spec))
            elif isinstance(spec, Mapping):
                options = parse(CsvColumnOptions, spec, where, error=DataConfigError)
                out.append(
                    CsvColumn(
                        column=str(column),
                        slot=options.slot,
                        kind=options.kind,
                        separator=options.separator,
                    )
                )
            else:
                raise DataConfigError(where, "must be a slot name or an object")
        return out

    @property
    def slots_in_field_map(self) -> bool:
        """Whether the slots are the fields of the libsvm field map (``slots`` not set)."""
        return self.format == "libsvm" and self.fieldMap is not None and self.slots is None

    @property
    def slot_names(self) -> tuple[str, ...]:
        """Names of slots ``0..num_slots-1`` for this format.

        A libsvm field map without ``slots`` names its slots (and their order) in the map
        file, which a config does not read: ``formats.make_format(config).slot_names`` does
        (the worker asks the format, never the config, for its slot count).
        """
        if self.format == "criteo":
            return CRITEO_SLOTS
        if self.format == "avazu":
            return AVAZU_SLOTS
        if self.slots is not None:
            return self.slots
        if self.format == "slot":
            return tuple(str(i) for i in range(1, (self.numSlots or 0) + 1))
        if self.format == "libsvm":
            if self.slots_in_field_map:
                raise ValueError(
                    f"data.fieldMap {self.fieldMap}: the slots are the map's fields; "
                    "read them with formats.make_format(config).slot_names"
                )
            return tuple(str(i) for i in range(self.numSlots or 1))
        names: list[str] = []
        for c in self.csv_columns():
            if c.slot != LABEL and c.slot not in names:
                names.append(c.slot)
        return tuple(names)

    def crossed_positions(
        self, names: tuple[str, ...], path: str = "data"
    ) -> tuple[tuple[int, int], ...]:
        """The slot positions of each crossed slot among the format's slot ``names``.

        Unset ``crosses``: every pair of the slots but ``sequenceSlot`` if there are at most
        ``AUTO_CROSS_MAX_SLOTS`` (see ``crosses_single_keys``). Raises
        :class:`DataConfigError` naming an entry that is not two known, distinct slot names
        (checked when the section is parsed, and again against a libsvm field map's names
        when its format is made).
        """
        if self.crosses is None:
            crossable = [i for i in range(len(names)) if i != self.sequenceSlot]
            if len(crossable) > AUTO_CROSS_MAX_SLOTS:
                return ()
            return tuple(itertools.combinations(crossable, 2))
        position = {name: i for i, name in enumerate(names)}
        pairs: list[tuple[int, int]] = []
        for i, entry in enumerate(self.crosses):
            parts = entry.split(CROSS_MARK)
            field = f"{path}.crosses[{i}]"
            if len(parts) != 2 or parts[0] == parts[1]:
                raise DataConfigError(field, f"{entry!r}: name two different slots, as 'user*item'")
            for part in parts:
                if part not in position:
                    known = ", ".join(names)
                    raise DataConfigError(field, f"{entry!r}: no slot {part!r} (slots: {known})")
            pairs.append((position[parts[0]], position[parts[1]]))
        return tuple(pairs)

    @property
    def crosses_single_keys(self) -> bool:
        """Whether a crossed slot pairs only bags of one key: the automatic crosses do (a
        multi-valued slot nobody asked to cross would multiply a row's keys), named ones
        cross every key with every key."""
        return self.crosses is None

    @property
    def ordinal_slots(self) -> tuple[int, ...]:
        """Indices of the slots whose token is an ordered integer (``data.ordinal``).

        The format's layout decides, not a setting: Criteo's I-columns, Avazu's hour of
        day and weekday, and a csv slot fed only by columns of kind ``bucket``. Slot and
        libSVM tokens are opaque feature ids (none).
        """
        if self.format == "criteo":
            ordinal: tuple[str, ...] = CRITEO_ORDINAL
        elif self.format == "avazu":
            ordinal = AVAZU_ORDINAL
        elif self.format == "csv":
            kinds: dict[str, set[str]] = {}
            for c in self.csv_columns():
                kinds.setdefault(c.slot, set()).add(c.kind)
            ordinal = tuple(slot for slot, k in kinds.items() if k == {"bucket"})
        else:  # slot and libsvm (whose field map names are the format's to read)
            return ()
        return tuple(i for i, name in enumerate(self.slot_names) if name in ordinal)

    @property
    def quote_byte(self) -> int:
        """The quote as the byte the delimited kernels compare with, or -1 (quoting off)."""
        return ord(self.quoteChar) if self.quoteChar else -1

    @property
    def num_slots(self) -> int:
        """``S``: the slot count of every ``Batch`` this config produces: the format's
        slots, then the crossed ones."""
        names = self.slot_names
        return len(names) + len(self.crossed_positions(names))
