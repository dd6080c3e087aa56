"""PaddleRec slot lines: whitespace-separated ``feasign:slot`` tokens plus a label token.

As in PaddleRec's ``slot_dnn`` demo data (``0:1 13030533623378965644:408 …``): each token is
an unsigned 64-bit feasign and the name of its slot; a slot may repeat (multi-valued, order
kept). The label is the token whose slot is ``labelSlot`` (its feasign is the click: > 0 → 1).
When ``labelSlot`` is not a number (default ``click``) the slot-first form ``click:0`` is
accepted too, since no feasign can be a non-number. Tokens of slots not in the config are
ignored (PaddleRec does the same); a token without ``:`` or with a non-integer feasign makes
the line bad; a line without a label token is bad, unless the format was made with
``labels_optional`` (the predictor and the server score unlabelled rows): its label is then
NaN. Slot names are matched by their 64-bit
text hash (a binary search per token, no Python dict on the hot path).
"""

from __future__ import annotations

import numba
import numpy as np
import numpy.typing as npt

from streamtrain_worker.data.config import DataConfig
from streamtrain_worker.data.formats.kernel import (
    BAD_LABEL,
    BAD_NUMBER,
    BAD_TOKEN,
    MISSING_LABEL,
    OK,
    U8,
    ParsedBlock,
    find_sorted,
    line_scratch,
    parse_label,
    parse_uint64,
    report,
    run_kernel,
    settle_line,
)
from streamtrain_worker.data.hashing import hash_bytes, sign_of, token_value


class SlotFormat:
    """The slot-line format for the configured slot names and label slot."""

    has_header = False

    def __init__(self, config: DataConfig, labels_optional: bool = False) -> None:
        names = config.slot_names
        self.num_slots = len(names)
        hashes = np.array([token_value(name) for name in names], dtype=np.uint64)
        order = np.argsort(hashes, kind="stable")
        sorted_hashes = hashes[order]
        if np.any(sorted_hashes[1:] == sorted_hashes[:-1]):
            raise ValueError("two slot names share a 64-bit hash")
        label_first = not config.labelSlot.isdigit()
        self._params = (
            np.uint64(token_value(config.labelSlot)),
            label_first,
            sorted_hashes,
            order.astype(np.int32),
            self.num_slots,
            labels_optional,
        )

    def for_file(self, path: str, header: bytes | None) -> SlotFormat:
        return self

    def parse(self, block: U8, first_line: int) -> ParsedBlock:
        return run_kernel(_kernel, self._params, block, first_line, self.num_slots)


@numba.njit(inline="always", cache=True)
def _is_blank(c: np.uint8) -> bool:
    return c == 32 or c == 9  # noqa: PLR1714 -- numba-friendly


@numba.njit(inline="always", cache=True)
def _blank_line(data: U8, pos: int, stop: int) -> bool:
    """Only spaces and tabs (a slot line of nothing is no data line)."""
    j = pos
    while j < stop and _is_blank(data[j]):
        j += 1
    return j == stop


@numba.njit(nogil=True, cache=True)
def _tokenize(
    data: U8,
    a: int,
    b: int,
    label_hash: np.uint64,
    label_first: bool,
    slot_hashes: npt.NDArray[np.uint64],
    slot_index: npt.NDArray[np.int32],
    line_slots: npt.NDArray[np.int32],
    line_keys: npt.NDArray[np.uint64],
) -> tuple[int, int, int]:
    m = 0
    label = -1
    i = a
    while i < b:
        while i < b and _is_blank(data[i]):
            i += 1
        if i >= b:
            break
        start = i
        colon = -1
        while i < b and not _is_blank(data[i]):
            if data[i] == 58 and colon < 0:
                colon = i
            i += 1
        if colon < 0:
            return 0, BAD_TOKEN, 0
        slot_hash = hash_bytes(data, colon + 1, i)
        if slot_hash == label_hash:
            label = parse_label(data, start, colon)
            if label < 0:
                return 0, BAD_LABEL, 0
            continue
        if label_first and label < 0 and hash_bytes(data, start, colon) == label_hash:
            label = parse_label(data, colon + 1, i)
            if label < 0:
                return 0, BAD_LABEL, 0
            continue
        found = find_sorted(slot_hashes, slot_hash)
        if found < 0:
            continue
        ok, value = parse_uint64(data, start, colon)
        if not ok:
            return 0, BAD_NUMBER, 0
        slot = slot_index[found]
        line_slots[m] = slot
        line_keys[m] = sign_of(slot, value)
        m += 1
    if label < 0:
        return m, MISSING_LABEL, 0
    return m, OK, label


@numba.njit(nogil=True, cache=True)
def _kernel(
    data: U8,
    first_line: int,
    label_hash: np.uint64,
    label_first: bool,
    slot_hashes: npt.NDArray[np.uint64],
    slot_index: npt.NDArray[np.int32],
    num_slots: int,
    labels_optional: bool,
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
        if not _blank_line(data, pos, stop):
            m, status, label = _tokenize(
                data, pos, stop, label_hash, label_first, slot_hashes, slot_index,
                line_slots, line_keys,
            )  # fmt: skip
            unlabelled = status == MISSING_LABEL and labels_optional  # scoring, not training
            fits, examples, nkeys, nbad = settle_line(
                OK if unlabelled else status, m, np.nan if unlabelled else label,
                line_slots, line_keys, num_slots, counts, labels, keys, offsets, bad_lines,
                bad_reasons, first_line + physical, examples, nkeys, nbad,
            )  # fmt: skip
            if not fits:
                break
            lines += 1
        physical += 1
        pos = nxt
    report(stats, examples, nkeys, lines, nbad, pos, physical)
