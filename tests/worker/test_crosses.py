"""Crossed slots (``data.crosses``): against a pure-Python reference, on every format."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streamtrain_tools.samples import SAMPLES_DIR
from streamtrain_worker.data.batch import Batch, concat_batches, slice_batch
from streamtrain_worker.data.config import DataConfig
from streamtrain_worker.data.crosses import cross_batch
from streamtrain_worker.data.errors import DataConfigError
from streamtrain_worker.data.formats import line_format, make_format
from streamtrain_worker.data.hashing import GOLDEN, _fmix64_py

from .conftest import AVAZU, bags, parse

MASK = (1 << 64) - 1


def reference_cross(left: int, right: int, slot: int) -> int:
    """The crossed key, written from the module docstring's formula with Python integers."""
    salt = _fmix64_py(((slot + 1) * GOLDEN) & MASK)
    return _fmix64_py(_fmix64_py(left ^ GOLDEN) ^ right ^ salt)


def reference_bags(
    example: list[list[int]], pairs: list[tuple[int, int]], single_keys: bool = False
) -> list[list[int]]:
    out = [list(bag) for bag in example]
    for c, (a, b) in enumerate(pairs):
        slot = len(example) + c
        if single_keys and (len(example[a]), len(example[b])) != (1, 1):
            out.append([])
            continue
        out.append([reference_cross(x, y, slot) for x in example[a] for y in example[b]])
    return out


def batch_of(examples: list[list[list[int]]], num_slots: int) -> Batch:
    keys = [k for example in examples for bag in example for k in bag]
    sizes = [len(bag) for example in examples for bag in example]
    return Batch(
        labels=np.zeros(len(examples), dtype=np.float32),
        keys=np.array(keys, dtype=np.uint64),
        offsets=np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64),
        num_slots=num_slots,
    )


def batch_bags(batch: Batch, example: int) -> list[list[int]]:
    s = batch.num_slots
    return [
        batch.keys[batch.offsets[example * s + k] : batch.offsets[example * s + k + 1]].tolist()
        for k in range(s)
    ]


@st.composite
def crossed_batches(draw: st.DrawFn) -> tuple[list[list[list[int]]], int, list[tuple[int, int]]]:
    num_slots = draw(st.integers(2, 5))
    key = st.integers(0, MASK)
    bag = st.lists(key, max_size=3)
    examples = draw(st.lists(st.lists(bag, min_size=num_slots, max_size=num_slots), max_size=6))
    slot = st.integers(0, num_slots - 1)
    pair = st.tuples(slot, slot).filter(lambda p: p[0] != p[1])
    pairs = draw(st.lists(pair, max_size=4))
    return examples, num_slots, pairs


@settings(deadline=None, max_examples=150)
@given(crossed_batches(), st.booleans())
def test_crossed_slots_match_the_reference(
    case: tuple[list[list[list[int]]], int, list[tuple[int, int]]], single_keys: bool
) -> None:
    examples, num_slots, pairs = case
    positions = np.array(pairs, dtype=np.int64).reshape(-1, 2)
    crossed = cross_batch(batch_of(examples, num_slots), positions, single_keys)
    assert crossed.num_slots == num_slots + len(pairs)
    assert crossed.size == len(examples)
    for e, example in enumerate(examples):
        assert batch_bags(crossed, e) == reference_bags(example, pairs, single_keys)


@settings(deadline=None, max_examples=40)
@given(crossed_batches(), st.integers(0, 6))
def test_crossing_commutes_with_cutting_and_joining_batches(
    case: tuple[list[list[list[int]]], int, list[tuple[int, int]]], cut: int
) -> None:
    """The reader re-chunks parsed blocks: a crossed slot must not depend on the cut."""
    examples, num_slots, pairs = case
    cut = min(cut, len(examples))
    positions = np.array(pairs, dtype=np.int64).reshape(-1, 2)
    whole = batch_of(examples, num_slots)
    parts = [slice_batch(whole, 0, cut), slice_batch(whole, cut, len(examples))]
    joined = concat_batches([cross_batch(p, positions) for p in parts])
    direct = cross_batch(whole, positions)
    assert joined.keys.tolist() == direct.keys.tolist()
    assert joined.offsets.tolist() == direct.offsets.tolist()


def test_order_matters_and_the_slot_position_salts() -> None:
    example = [[[11], [22], [33]]]
    ab = cross_batch(batch_of(example, 3), np.array([[0, 1], [1, 0], [0, 1]]))
    first, reversed_, again = batch_bags(ab, 0)[3:]
    assert first != reversed_  # user*item is not item*user
    assert first != again  # the same pair in another crossed slot is another key


def test_the_slot_format_appends_the_crossed_slots() -> None:
    cfg = DataConfig.from_dict(
        {"format": "slot", "slots": ["user", "item", "hist"], "crosses": ["user*item", "hist*item"]}
    )
    fmt = make_format(cfg)
    assert fmt.num_slots == 5
    parsed = parse(fmt, b"click:1 5:user 7:item 9:hist 10:hist\nclick:0 5:user 8:item\n")
    plain = parse(
        make_format(
            DataConfig.from_dict(
                {"format": "slot", "slots": ["user", "item", "hist"], "crosses": []}
            )
        ),
        b"click:1 5:user 7:item 9:hist 10:hist\nclick:0 5:user 8:item\n",
    )
    for e in range(2):
        assert bags(parsed, e) == reference_bags(bags(plain, e), [(0, 1), (2, 1)])
    assert bags(parsed, 1)[4] == []  # an empty history crosses into nothing
    assert parsed.batch.labels.tolist() == [1.0, 0.0]


def test_criteo_and_libsvm_field_map_slots_can_be_crossed() -> None:
    raw = (SAMPLES_DIR / "criteo_kaggle_sample_train.txt").read_bytes()[:20000]
    raw = raw[: raw.rfind(b"\n") + 1]
    crossed = parse(
        make_format(DataConfig.from_dict({"format": "criteo", "crosses": ["C1*C2"]})), raw
    )
    plain = parse(make_format(DataConfig.from_dict({"format": "criteo"})), raw)
    assert crossed.batch.num_slots == 40
    assert crossed.bad_lines.tolist() == plain.bad_lines.tolist()
    assert bags(crossed, 3) == reference_bags(bags(plain, 3), [(13, 14)])
    featindex = SAMPLES_DIR / "ipinyou_deepctr_featindex.fm.txt"
    libsvm = {"format": "libsvm", "fieldMap": str(featindex), "numSlots": 16}
    fmt = make_format(DataConfig.from_dict({**libsvm, "crosses": ["weekday*hour"]}))
    assert fmt.num_slots == 17
    with pytest.raises(
        DataConfigError, match=r"data\.crosses\[0\]: 'weekday\*nope': no slot 'nope'"
    ):
        make_format(DataConfig.from_dict({**libsvm, "crosses": ["weekday*nope"]}))


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ("user*itm", r"no slot 'itm' \(slots: user, item\)"),
        ("user*user", "name two different slots"),
        ("user", "name two different slots"),
        ("user*item*user", "name two different slots"),
    ],
)
def test_a_bad_cross_names_its_entry(entry: str, message: str) -> None:
    with pytest.raises(DataConfigError, match=rf"data\.crosses\[1\]: .*{message}"):
        DataConfig.from_dict(
            {"format": "slot", "slots": ["user", "item"], "crosses": ["item*user", entry]}
        )


def test_unset_crosses_cross_every_pair_of_a_small_schema_but_the_sequence() -> None:
    synth = ["user", "item", "category", "device", "position", "hour", "hist"]
    cfg = DataConfig.from_dict({"format": "slot", "slots": synth, "sequenceSlot": 6})
    fmt = make_format(cfg)
    assert fmt.num_slots == 7 + 15  # the 15 pairs of the six slots other than hist
    line = b"click:1 1:user 2:item 3:category 4:device 5:position 6:hour 7:hist 8:hist\n"
    parsed = parse(fmt, line + b"click:0 1:user 2:item 3:category 4:device 5:position 7:hist\n")
    plain = make_format(DataConfig.from_dict({**cfg.to_dict(), "crosses": []}))
    assert plain.num_slots == 7
    pairs = list(cfg.crossed_positions(tuple(synth)))
    assert (0, 1) in pairs and all(6 not in pair for pair in pairs)
    expected = reference_bags(bags(parse(plain, line), 0), pairs, single_keys=True)
    assert bags(parsed, 0) == expected
    assert [len(bag) for bag in bags(parsed, 1)[7:]].count(0) == 5  # no hour: 5 pairs empty
    named = make_format(DataConfig.from_dict({**cfg.to_dict(), "crosses": ["hist*item"]}))
    assert [len(bag) for bag in bags(parse(named, line), 0)] == [1] * 6 + [2, 2]


def test_a_wide_schema_is_not_crossed_unless_asked() -> None:
    assert make_format(DataConfig.from_dict({"format": "criteo"})).num_slots == 39
    assert make_format(DataConfig.from_dict({"format": "avazu"})).num_slots == 23
    nine = {"format": "slot", "numSlots": 9}
    assert make_format(DataConfig.from_dict(nine)).num_slots == 9
    assert make_format(DataConfig.from_dict({**nine, "sequenceSlot": 0})).num_slots == 9 + 28
    assert make_format(DataConfig.from_dict({**nine, "crosses": ["1*2"]})).num_slots == 10


def test_the_crossed_format_keeps_the_line_formats_bookkeeping() -> None:
    """Bad lines, blank lines and line numbers are the line format's, crosses or not."""
    cfg = {"format": "slot", "slots": ["user", "item"], "crosses": ["user*item"]}
    text = b"click:1 1:user 2:item\n\nclick:x 3:user\nclick:0 3:user 4:item\n"
    crossed = parse(make_format(DataConfig.from_dict(cfg)), text)
    plain = parse(line_format(DataConfig.from_dict(cfg)), text)
    assert (crossed.lines, crossed.physical_lines) == (plain.lines, plain.physical_lines)
    assert (crossed.lines, crossed.physical_lines) == (3, 4)
    assert crossed.bad_lines.tolist() == plain.bad_lines.tolist() == [3]
    assert crossed.bad_reasons.tolist() == plain.bad_reasons.tolist()
    avazu = {"format": "avazu", "crosses": ["site_id*app_id"]}
    assert make_format(DataConfig.from_dict(avazu)).has_header
    raw = AVAZU.read_bytes()[:20000]
    raw = raw[: raw.rfind(b"\n") + 1]
    crossed = parse(make_format(DataConfig.from_dict(avazu)), raw)  # the header binds columns
    plain = parse(line_format(DataConfig.from_dict(avazu)), raw)
    assert crossed.batch.size == plain.batch.size > 10
    assert bags(crossed, 5) == reference_bags(bags(plain, 5), [(2, 5)])


def test_the_automatic_crosses_skip_a_multi_valued_bag_and_named_ones_do_not() -> None:
    text = b"click:1 1:1 5:1 2:2\n"
    auto = parse(make_format(DataConfig.from_dict({"format": "slot", "numSlots": 2})), text)
    assert [len(bag) for bag in bags(auto, 0)] == [2, 1, 0]
    named = {"format": "slot", "numSlots": 2, "crosses": ["1*2"]}
    assert [len(bag) for bag in bags(parse(make_format(DataConfig.from_dict(named)), text), 0)] == [
        2,
        1,
        2,
    ]
