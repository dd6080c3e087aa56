"""Every parser on real sample rows (Criteo, Avazu, iPinYou) and on broken rows."""

from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streamtrain_tools.samples import SAMPLES_DIR
from streamtrain_worker.data.config import AVAZU_CATEGORICAL, AVAZU_SLOTS, DataConfig
from streamtrain_worker.data.errors import CorruptFileError, DataConfigError
from streamtrain_worker.data.formats import line_format
from streamtrain_worker.data.formats.kernel import (
    BAD_COLUMNS,
    BAD_LABEL,
    BAD_NUMBER,
    BAD_TOKEN,
    MISSING_LABEL,
    UNKNOWN_FEATURE,
)
from streamtrain_worker.data.hashing import feature_sign

from .conftest import AVAZU, MISSING, bags, parse

CRITEO = SAMPLES_DIR / "criteo_kaggle_sample_train.txt"
IPINYOU = SAMPLES_DIR / "ipinyou_deepctr_train.fm.txt"
FEATINDEX = SAMPLES_DIR / "ipinyou_deepctr_featindex.fm.txt"


def reference_bucket(v: int) -> int:
    return max(v, -64) if v <= 2 else 3 + int(math.log(v) ** 2)


def test_criteo_sample_parses_completely() -> None:
    raw = CRITEO.read_bytes()
    parsed = parse(line_format(DataConfig.from_dict({"format": "criteo"})), raw)
    batch = parsed.batch
    assert (batch.size, parsed.lines, parsed.bad_lines.size) == (7200, 7200, 0)
    assert int(batch.labels.sum()) == 1549
    assert np.all(np.diff(batch.offsets) == 1)  # one key per slot per example
    first = raw.split(b"\n", 1)[0].split(b"\t")
    expected = []
    for slot, cell in enumerate(first[1:]):
        if slot < 13:
            value = MISSING if cell == b"" else reference_bucket(int(cell)) & ((1 << 64) - 1)
            expected.append([feature_sign(slot, value)])
        else:
            expected.append([feature_sign(slot, cell)])
    assert bags(parsed, 0) == expected
    assert batch.labels[0] == float(first[0])


def test_criteo_broken_rows_are_counted_with_line_numbers() -> None:
    good = CRITEO.read_bytes().split(b"\n")[:3]
    fields = good[0].split(b"\t")
    short = b"\t".join(fields[:-1])
    not_int = b"\t".join([fields[0], b"12x", *fields[2:]])
    bad_label = b"\t".join([b"yes", *fields[1:]])
    text = b"\n".join([good[0], short, b"", not_int, good[1], bad_label, good[2]]) + b"\r\n"
    parsed = parse(line_format(DataConfig.from_dict({"format": "criteo"})), text)
    assert parsed.batch.size == 3
    assert parsed.lines == 6  # the blank line is not a data line
    assert parsed.bad_lines.tolist() == [2, 4, 6]
    assert parsed.bad_reasons.tolist() == [BAD_COLUMNS, BAD_NUMBER, BAD_LABEL]
    assert parsed.physical_lines == 7


def test_avazu_sample_uses_the_header_and_derives_hour_and_weekday() -> None:
    raw = AVAZU.read_bytes()
    fmt = line_format(DataConfig.from_dict({"format": "avazu"}))
    parsed = parse(fmt, raw)
    batch = parsed.batch
    assert (batch.size, parsed.bad_lines.size) == (8087, 0)
    assert int(batch.labels.sum()) == 1397
    assert batch.num_slots == len(AVAZU_SLOTS) == 23
    assert np.all(np.diff(batch.offsets) == 1)
    hour_slot, weekday_slot = AVAZU_SLOTS.index("hour"), AVAZU_SLOTS.index("weekday")
    # 14102100 is 2014-10-21 (a Tuesday: Monday is 0), hour 00.
    assert bags(parsed, 0)[hour_slot] == [feature_sign(hour_slot, 0)]
    assert bags(parsed, 0)[weekday_slot] == [feature_sign(weekday_slot, 1)]
    header, first = raw.split(b"\n")[:2]
    names = header.decode().split(",")
    cells = dict(zip(names, first.split(b","), strict=True))
    site = AVAZU_SLOTS.index("site_id")
    assert bags(parsed, 0)[site] == [feature_sign(site, cells["site_id"])]


def test_avazu_column_order_comes_from_each_header() -> None:
    lines = AVAZU.read_bytes().split(b"\n")[:50]
    rows = [line.split(b",") for line in lines if line]
    order = list(reversed(range(len(rows[0]))))
    shuffled = b"\n".join(b",".join(r[i] for i in order) for r in rows) + b"\n"
    fmt = line_format(DataConfig.from_dict({"format": "avazu"}))
    original = parse(fmt, b"\n".join(lines) + b"\n")
    permuted = parse(fmt, shuffled)
    assert np.array_equal(original.batch.keys, permuted.batch.keys)
    assert np.array_equal(original.batch.labels, permuted.batch.labels)
    with pytest.raises(CorruptFileError, match=r"mem: header lacks avazu columns \['click'\]"):
        parse(fmt, lines[0].replace(b",click,", b",clicks,") + b"\n")


def test_avazu_broken_rows() -> None:
    header, first = AVAZU.read_bytes().split(b"\n")[:2]
    cells = first.split(b",")
    bad_hour = b",".join([*cells[:2], b"1410210", *cells[3:]])
    bad_month = b",".join([*cells[:2], b"14132100", *cells[3:]])
    text = b"\n".join([header, first, bad_hour, b",".join(cells[:-2]), bad_month, first])
    parsed = parse(line_format(DataConfig.from_dict({"format": "avazu"})), text)
    assert parsed.batch.size == 2
    assert parsed.bad_lines.tolist() == [3, 4, 5]
    assert parsed.bad_reasons.tolist() == [BAD_NUMBER, BAD_COLUMNS, BAD_NUMBER]


def ipinyou_config(**extra: object) -> DataConfig:
    return DataConfig.from_dict({"format": "libsvm", "fieldMap": str(FEATINDEX), **extra})


def test_ipinyou_libsvm_with_the_featindex_field_map() -> None:
    fmt = line_format(ipinyou_config(numSlots=16))
    raw = IPINYOU.read_bytes()
    parsed = parse(fmt, raw)
    batch = parsed.batch
    assert (batch.size, parsed.bad_lines.size) == (26773, 0)
    assert int(batch.labels.sum()) == 255
    assert np.all(np.diff(batch.offsets) == 1)  # 16 one-hot fields, one per slot
    fields: dict[int, str] = {}
    order: list[str] = []
    for line in FEATINDEX.read_text().splitlines():
        name, index = line.rsplit("\t", 1)
        field = name.split(":", 1)[0]
        fields[int(index)] = field
        if field not in order:
            order.append(field)
    assert order[:3] == ["weekday", "hour", "useragent"]
    tokens = raw.split(b"\n", 1)[0].split()[1:]
    expected: list[list[int]] = [[] for _ in order]
    for token in tokens:
        feature = int(token.split(b":")[0])
        slot = order.index(fields[feature])
        expected[slot].append(feature_sign(slot, feature))
    assert bags(parsed, 0) == expected


def test_libsvm_map_must_match_num_slots_and_can_drop_fields() -> None:
    with pytest.raises(DataConfigError, match=r"data\.numSlots: is 3 but the field map gives 16"):
        line_format(ipinyou_config(numSlots=3))
    fmt = line_format(ipinyou_config(slots=["hour", "weekday"]))
    parsed = parse(fmt, b"1 1:1 6:1 31:1\n")
    assert bags(parsed, 0) == [[feature_sign(0, 6)], [feature_sign(1, 1)]]


def test_libsvm_broken_rows_and_field_aware_tokens() -> None:
    fmt = line_format(ipinyou_config(numSlots=16))
    text = b"0 1:1\n1 999999999:1\n0 1:x\n0 a:1\n2:1 1:1\n-1 1:1 6:0\n"
    parsed = parse(fmt, text)
    assert parsed.batch.labels.tolist() == [0.0, 0.0]
    assert bags(parsed, 1)[1] == []  # 6:0 is an absent feature
    assert parsed.bad_lines.tolist() == [2, 3, 4, 5]
    assert parsed.bad_reasons.tolist() == [UNKNOWN_FEATURE, BAD_NUMBER, BAD_NUMBER, MISSING_LABEL]
    ffm = line_format(DataConfig.from_dict({"format": "libsvm", "numSlots": 3}))
    parsed = parse(ffm, b"+1 0:5:1 2:7:0.5 2:8:1 1:3:0\n1 3:1:1\n1 4:1\n")
    assert bags(parsed, 0) == [[feature_sign(0, 5)], [], [feature_sign(2, 7), feature_sign(2, 8)]]
    assert parsed.bad_reasons.tolist() == [BAD_TOKEN, BAD_TOKEN]  # field 3 >= 3; no field
    single = line_format(DataConfig.from_dict({"format": "libsvm"}))
    assert bags(parse(single, b"1 4:1 9:2.5\n"), 0) == [[feature_sign(0, 4), feature_sign(0, 9)]]


def slot_config(**extra: object) -> DataConfig:
    return DataConfig.from_dict(
        {"format": "slot", "slots": ["user", "item", "hist"], "sequenceSlot": 2, **extra}
    )


def test_slot_lines_multi_valued_in_order() -> None:
    fmt = line_format(slot_config())
    text = (
        b"click:1 11:user 22:item 7:hist 5:hist 9:hist 3:unknown\n"
        b"44:item 0:click\n"
        b"  \n"
        b"18446744073709551615:user click:0\t6:hist\n"
    )
    parsed = parse(fmt, text)
    assert parsed.batch.labels.tolist() == [1.0, 0.0, 0.0]
    assert bags(parsed, 0) == [
        [feature_sign(0, 11)],
        [feature_sign(1, 22)],
        [feature_sign(2, 7), feature_sign(2, 5), feature_sign(2, 9)],
    ]
    assert bags(parsed, 1) == [[], [feature_sign(1, 44)], []]
    assert bags(parsed, 2)[0] == [feature_sign(0, 2**64 - 1)]
    assert parsed.lines == 3


def test_slot_broken_rows() -> None:
    fmt = line_format(slot_config())
    text = (
        b"click:1 11:user\n"
        b"11:user 22:item\n"
        b"click:1 x1:user\n"
        b"click:1 11user\n"
        b"click:maybe 1:user\n"
        b"click:0 18446744073709551616:user\n"
    )
    parsed = parse(fmt, text)
    assert parsed.batch.size == 1
    assert parsed.bad_lines.tolist() == [2, 3, 4, 5, 6]
    assert parsed.bad_reasons.tolist() == [
        MISSING_LABEL,
        BAD_NUMBER,
        BAD_TOKEN,
        BAD_LABEL,
        BAD_NUMBER,
    ]


def test_paddlerec_slot_dnn_style_numeric_label_slot() -> None:
    # PaddleRec slot_dnn demo rows look like "0:1 13030533623378965644:408 ...": slot 1 is the
    # click. With a numeric label slot only the feasign:slot form is a label.
    fmt = line_format(
        DataConfig.from_dict({"format": "slot", "labelSlot": "1", "slots": ["408", "334"]})
    )
    parsed = parse(fmt, b"0:1 13030533623378965644:408 10711181114198415597:334 1:408\n1:1\n")
    assert parsed.batch.labels.tolist() == [0.0, 1.0]
    assert bags(parsed, 0) == [
        [feature_sign(0, 13030533623378965644), feature_sign(0, 1)],
        [feature_sign(1, 10711181114198415597)],
    ]


def test_generic_csv_matches_avazu_on_real_rows() -> None:
    columns: dict[str, object] = {"click": "label"}
    columns.update({name: name for name in AVAZU_CATEGORICAL})
    csv = line_format(DataConfig.from_dict({"format": "csv", "columns": columns}))
    avazu = line_format(DataConfig.from_dict({"format": "avazu"}))
    raw = b"\n".join(AVAZU.read_bytes().split(b"\n")[:200]) + b"\n"
    a, b = parse(csv, raw), parse(avazu, raw)
    n = len(AVAZU_CATEGORICAL)
    assert a.batch.size == b.batch.size == 199
    for example in (0, 100, 198):
        assert bags(a, example) == bags(b, example)[:n]


def test_generic_csv_kinds_without_header_and_broken_rows() -> None:
    cfg = DataConfig.from_dict(
        {
            "format": "csv",
            "header": False,
            "delimiter": ";",
            "columns": {
                "0": "label",
                "1": "user",
                "2": {"slot": "tags", "kind": "multi", "separator": "|"},
                "3": {"slot": "age", "kind": "bucket"},
                "4": "tags",
            },
        }
    )
    assert cfg.slot_names == ("user", "tags", "age")
    fmt = line_format(cfg)
    text = b"1;u1;a|b||c;30;z;extra\n0;u2;;;\n1;u3;a;3\n0;u4;a;old;z\n"
    parsed = parse(fmt, text)
    assert parsed.batch.labels.tolist() == [1.0, 0.0]
    assert bags(parsed, 0) == [
        [feature_sign(0, b"u1")],
        [feature_sign(1, t) for t in (b"a", b"b", b"c", b"z")],
        [feature_sign(2, reference_bucket(30))],
    ]
    assert bags(parsed, 1) == [
        [feature_sign(0, b"u2")],
        [feature_sign(1, b"")],
        [feature_sign(2, MISSING)],
    ]
    assert parsed.bad_lines.tolist() == [3, 4]
    assert parsed.bad_reasons.tolist() == [BAD_COLUMNS, BAD_NUMBER]


def test_generic_csv_header_must_name_the_columns() -> None:
    cfg = DataConfig.from_dict({"format": "csv", "columns": {"y": "label", "user": "u"}})
    fmt = line_format(cfg)
    parsed = parse(fmt, b"user,y,other\nalice,1,x\nbob,0\n")
    assert bags(parsed, 0) == [[feature_sign(0, b"alice")]]
    assert parsed.bad_reasons.tolist() == [BAD_COLUMNS]
    with pytest.raises(CorruptFileError, match=r"f.csv: header lacks configured columns \['y'\]"):
        parse(fmt, b"user,x\n", path="f.csv")


def test_long_lines_grow_the_key_buffer() -> None:
    fmt = line_format(slot_config())
    many = b" ".join(b"%d:hist" % i for i in range(5000))
    text = b"click:1 " + many + b"\n" + b"click:0 1:user\n" * 3
    parsed = parse(fmt, text)
    assert parsed.batch.size == 4
    assert bags(parsed, 0)[2] == [feature_sign(2, i) for i in range(5000)]


def test_malformed_field_map_names_the_field(tmp_path: Path) -> None:
    bad = tmp_path / "featindex.txt"
    bad.write_text("weekday:2\t1\nhour:3\tnot-a-number\n")
    cfg = DataConfig.from_dict({"format": "libsvm", "fieldMap": str(bad)})
    with pytest.raises(DataConfigError, match=r"data\.fieldMap: .*featindex\.txt"):
        line_format(cfg)


ALPHABET = b'0123456789:: \t,,;|.-xc"\r\n\n'
FUZZ_CONFIGS = {
    "criteo": {"format": "criteo"},
    "slot": {"format": "slot", "slots": ["1", "2", "c"], "labelSlot": "0"},
    "libsvm": {"format": "libsvm", "numSlots": 3},
    "csv": {
        "format": "csv",
        "header": False,
        "columns": {
            "0": "label",
            "1": "a",
            "2": {"slot": "b", "kind": "multi"},
            "3": {"slot": "c", "kind": "bucket"},
        },
    },
}


@settings(deadline=None, max_examples=60)
@given(
    name=st.sampled_from(sorted(FUZZ_CONFIGS)),
    text=st.lists(st.sampled_from(list(ALPHABET)), max_size=400).map(bytes),
)
def test_arbitrary_bytes_never_break_a_parser(name: str, text: bytes) -> None:
    # Numba does not bounds-check: this guards the scratch and output sizing of every kernel.
    parsed = parse(line_format(DataConfig.from_dict(FUZZ_CONFIGS[name])), text)
    batch = parsed.batch
    assert parsed.lines == batch.size + parsed.bad_lines.shape[0]
    assert np.all(np.diff(batch.offsets) >= 0)
    assert set(batch.labels.tolist()) <= {0.0, 1.0}
    assert np.all(np.diff(parsed.bad_lines) > 0)
    assert parsed.physical_lines == text.count(b"\n") + (
        0 if text.endswith(b"\n") or not text else 1
    )


def test_the_worker_starts_without_importing_pyarrow() -> None:
    """Only a libsvm field map needs pyarrow: a worker process (and every format) starts
    without its ~75 ms import, which sat on the job's start-up."""
    probe = "import sys, streamtrain_worker.__main__; print('pyarrow' in sys.modules)"
    out = subprocess.run(
        [sys.executable, "-c", probe],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
        timeout=120,
    )
    assert out.stdout.strip() == "False", out.stderr
