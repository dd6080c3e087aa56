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
    commit_line,
    find_sorted,
    parse_label,
    parse_uint64,
    run_kernel,
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
    # Per-line scratch; a line emits at most (its bytes + 2) keys, so grow it before a long one.
    line_slots = np.empty(256, dtype=np.int32)
    line_keys = np.empty(256, dtype=np.uint64)
    counts = np.empty(num_slots, dtype=np.int64)
    pos = 0
    ne = 0
    nk = 0
    nlines = 0
    nbad = 0
    phys = 0
    while pos < n:
        end = pos
        while end < n and data[end] != 10:
            end += 1
        stop = end
        if stop > pos and data[stop - 1] == 13:
            stop -= 1
        nxt = end + 1 if end < n else n
        if stop - pos + 2 > line_slots.shape[0]:
            line_slots = np.empty(2 * (stop - pos + 2), dtype=np.int32)
            line_keys = np.empty(2 * (stop - pos + 2), dtype=np.uint64)
        blank = True
        for j in range(pos, stop):
            if not _is_blank(data[j]):
                blank = False
                break
        if blank:
            pos = nxt
            phys += 1
            continue
        m, status, label = _tokenize(
            data, pos, stop, label_hash, label_first, slot_hashes, slot_index, line_slots, line_keys
        )
        unlabelled = status == MISSING_LABEL and labels_optional
        if status == OK or unlabelled:
            if nk + m > keys.shape[0]:
                break
            labels[ne] = np.nan if unlabelled else label
            nk = commit_line(line_slots, line_keys, m, num_slots, counts, keys, nk, offsets, ne)
            ne += 1
        else:
            bad_lines[nbad] = first_line + phys
            bad_reasons[nbad] = status
            nbad += 1
        nlines += 1
        phys += 1
        pos = nxt
    stats[0] = ne
    stats[1] = nk
    stats[2] = nlines
    stats[3] = nbad
    stats[4] = pos
    stats[5] = phys
