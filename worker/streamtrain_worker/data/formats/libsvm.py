"""libSVM / libFM / libFFM lines: ``label idx:val …`` or ``label field:idx:val …``.

The label is a number (> 0 → click, so libSVM's ``+1``/``-1`` work). A feature index becomes
a token of value ``idx`` (an integer, see ``hashing``) in a slot chosen by:

- the field of a ``field:idx:val`` token (``0 <= field < num_slots``), else
- the ``fieldMap`` file (iPinYou's ``featindex``: ``field:value<TAB>index`` lines): an index
  not in the map makes the line bad (the map does not match the data), an index whose field
  is not a configured slot is dropped, else
- slot 0 when there is a single slot.

A feature whose value parses as zero is absent (libSVM's sparse convention); other values
are not kept (``Batch`` has no per-key weights): features are treated as binary. Fields
become slots in the order of ``slots`` when configured, else in first-appearance order of
the map file.
"""

from __future__ import annotations

import fsspec
import numba
import numpy as np
import numpy.typing as npt

from streamtrain_worker.data.config import DataConfig
from streamtrain_worker.data.errors import DataConfigError
from streamtrain_worker.data.formats.kernel import (
    BAD_LABEL,
    BAD_NUMBER,
    BAD_TOKEN,
    MISSING_LABEL,
    OK,
    U8,
    UNKNOWN_FEATURE,
    ParsedBlock,
    find_sorted,
    line_scratch,
    parse_int,
    parse_label,
    parse_number,
    parse_uint64,
    report,
    run_kernel,
    settle_line,
)
from streamtrain_worker.data.hashing import sign_of


def load_field_map(url: str) -> tuple[list[str], npt.NDArray[np.uint64], npt.NDArray[np.int32]]:
    """Fields in first-appearance order, and per map line its feature index and field number.

    Read with pyarrow's CSV reader (tab-separated, no quoting), vectorised: iPinYou's 133k
    lines load in well under 0.1 s, so a worker may rebuild the format every pass.
    pyarrow is imported here, not with the module: every worker imports the formats, and
    pyarrow's import (~75 ms) would sit on its start-up for the one format that needs it.
    """
    import pyarrow as pa
    import pyarrow.compute as pc
    from pyarrow import csv as pa_csv

    options = (
        pa_csv.ReadOptions(column_names=["name", "index"]),
        pa_csv.ParseOptions(delimiter="\t", quote_char=False),
        pa_csv.ConvertOptions(column_types={"name": pa.string(), "index": pa.uint64()}),
    )
    try:
        with fsspec.open(url, "rb") as f:
            table = pa_csv.read_csv(f, *options)
    except (pa.ArrowInvalid, ValueError) as exc:
        raise DataConfigError(
            "data.fieldMap", f"{url} is not field:value<TAB>index lines: {exc}"
        ) from exc
    names = pc.list_element(pc.split_pattern(table["name"], ":", max_splits=1), 0)
    encoded = pc.dictionary_encode(names).combine_chunks()
    fields = [str(x) for x in encoded.dictionary.to_pylist()]
    if any(not f for f in fields) or table["index"].null_count:
        raise DataConfigError("data.fieldMap", f"{url} has a line without a field or an index")
    indices = np.asarray(table["index"].combine_chunks(), dtype=np.uint64)
    field_of = np.asarray(encoded.indices, dtype=np.int32)
    return fields, indices, field_of


class LibsvmFormat:
    """libSVM/FM/FFM lines with an optional feature-index → field map."""

    has_header = False

    def __init__(self, config: DataConfig) -> None:
        map_keys = np.zeros(0, dtype=np.uint64)
        map_slots = np.zeros(0, dtype=np.int32)
        has_map = config.fieldMap is not None
        if config.fieldMap is None:
            names = config.slot_names
        else:
            order, keys, field_of = load_field_map(config.fieldMap)
            names = config.slots if config.slots is not None else tuple(order)
            if config.numSlots is not None and config.numSlots != len(names):
                raise DataConfigError(
                    "data.numSlots",
                    f"is {config.numSlots} but the field map gives {len(names)} "
                    f"fields ({', '.join(names[:20])})",
                )
            slot_of = {name: i for i, name in enumerate(names)}
            slot_of_field = np.array([slot_of.get(f, -1) for f in order], dtype=np.int32)
            slots = slot_of_field[field_of]
            order_idx = np.argsort(keys, kind="stable")
            map_keys, map_slots = keys[order_idx], slots[order_idx]
            if np.any(map_keys[1:] == map_keys[:-1]):
                raise DataConfigError("data.fieldMap", f"{config.fieldMap} maps an index twice")
        self.slot_names = names
        self.num_slots = len(names)
        self._params = (map_keys, map_slots, has_map, self.num_slots)

    def for_file(self, path: str, header: bytes | None) -> LibsvmFormat:
        return self

    def parse(self, block: U8, first_line: int) -> ParsedBlock:
        return run_kernel(_kernel, self._params, block, first_line, self.num_slots)


@numba.njit(nogil=True, cache=True)
def _tokenize(
    data: U8,
    a: int,
    b: int,
    map_keys: npt.NDArray[np.uint64],
    map_slots: npt.NDArray[np.int32],
    has_map: bool,
    num_slots: int,
    line_slots: npt.NDArray[np.int32],
    line_keys: npt.NDArray[np.uint64],
) -> tuple[int, int, int]:
    m = 0
    label = -1
    i = a
    while i < b:
        while i < b and (data[i] == 32 or data[i] == 9):
            i += 1
        if i >= b:
            break
        start = i
        c1 = -1
        c2 = -1
        colons = 0
        while i < b and data[i] != 32 and data[i] != 9:
            if data[i] == 58:
                colons += 1
                if c1 < 0:
                    c1 = i
                else:
                    c2 = i
            i += 1
        if label < 0:
            if colons:
                return 0, MISSING_LABEL, 0
            label = parse_label(data, start, i)
            if label < 0:
                return 0, BAD_LABEL, 0
            continue
        if colons == 1:
            ok, index = parse_uint64(data, start, c1)
            value_at = c1 + 1
        elif colons == 2:
            ok, index = parse_uint64(data, c1 + 1, c2)
            value_at = c2 + 1
        else:
            return 0, BAD_TOKEN, 0
        if not ok:
            return 0, BAD_NUMBER, 0
        ok_value, value_sign = parse_number(data, value_at, i)
        if not ok_value:
            return 0, BAD_NUMBER, 0
        if colons == 2:
            ok_field, field = parse_int(data, start, c1)
            if not ok_field or field < 0 or field >= num_slots:
                return 0, BAD_TOKEN, 0
            slot = field
        elif has_map:
            found = find_sorted(map_keys, index)
            if found < 0:
                return 0, UNKNOWN_FEATURE, 0
            slot = map_slots[found]
        elif num_slots == 1:
            slot = 0
        else:
            return 0, BAD_TOKEN, 0
        if value_sign == 0 or slot < 0:
            continue
        line_slots[m] = slot
        line_keys[m] = sign_of(slot, index)
        m += 1
    if label < 0:
        return 0, MISSING_LABEL, 0
    return m, OK, label


@numba.njit(nogil=True, cache=True)
def _kernel(
    data: U8,
    first_line: int,
    map_keys: npt.NDArray[np.uint64],
    map_slots: npt.NDArray[np.int32],
    has_map: bool,
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
        while stop > pos and (data[stop - 1] == 13 or data[stop - 1] == 32):
            stop -= 1
        nxt = end + 1 if end < n else n
        if stop - pos + 2 > line_slots.shape[0]:
            line_slots, line_keys = line_scratch(stop - pos)
        if stop > pos:
            m, status, label = _tokenize(
                data, pos, stop, map_keys, map_slots, has_map, num_slots, line_slots, line_keys
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
