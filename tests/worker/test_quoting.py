"""RFC 4180 quoted fields in the delimited formats (avazu, csv), checked case by case and
against Python's ``csv`` module (``strict=True``) on generated lines."""

from __future__ import annotations

import csv
import hashlib
import io
from pathlib import Path
from typing import Any, Literal

import numpy.typing as npt
import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

from streamtrain_tools.bench.worker import quoting as bench_quoting
from streamtrain_tools.samples import SAMPLES_DIR
from streamtrain_worker.data.config import AVAZU_CATEGORICAL, AVAZU_SLOTS, DataConfig
from streamtrain_worker.data.errors import BadDataError, CorruptFileError, DataConfigError
from streamtrain_worker.data.formats import Format, ParsedBlock, line_format
from streamtrain_worker.data.formats.kernel import (
    BAD_COLUMNS,
    BAD_LABEL,
    TEXT_AFTER_QUOTE,
    UNTERMINATED_QUOTE,
)
from streamtrain_worker.data.hashing import feature_sign
from streamtrain_worker.data.reader import iter_batches

from .conftest import AVAZU, MISSING, bags, parse

#: sha256 of (keys, offsets, labels) of the Avazu sample parsed by the kernels of commit
#: bb3c5c2, before quoting existed: the sample has no quotes, so nothing may change.
AVAZU_DIGEST_BEFORE_QUOTING = "0a94989b4a8eceefeaad9e2f40342e988dc22e39a21dfc8a43112b2ee3044e81"
CSV_DIGEST_BEFORE_QUOTING = "254901ad082fd333b1ff9e3a9c72c47fc65caa7c19a431149779110096bd0492"


def csv_format(columns: dict[str, Any], **extra: Any) -> Format:
    return line_format(DataConfig.from_dict({"format": "csv", "columns": columns, **extra}))


def digest(parsed: ParsedBlock) -> str:
    arrays: list[npt.NDArray[Any]] = [
        parsed.batch.keys.astype("<u8"),
        parsed.batch.offsets.astype("<i8"),
        parsed.batch.labels.astype("<f4"),
    ]
    h = hashlib.sha256()
    for array in arrays:
        h.update(array.tobytes())
    return h.hexdigest()


COMPANY = {"y": "label", "company": "company", "city": "city"}


def test_a_delimiter_inside_quotes_is_data() -> None:
    parsed = parse(csv_format(COMPANY), b'y,company,city\n1,"Acme, Inc.",Berlin\n')
    assert parsed.bad_lines.tolist() == []
    assert bags(parsed, 0) == [[feature_sign(0, b"Acme, Inc.")], [feature_sign(1, b"Berlin")]]


def test_doubled_quotes_are_one_literal_quote_in_every_kind() -> None:
    fmt = csv_format(
        {
            "y": "label",
            "says": "says",
            "tags": {"slot": "tags", "kind": "multi", "separator": "|"},
        }
    )
    text = b'y,says,tags\n0,"say ""hi""","a|""b""|c"\n1,"""",""""""\n'
    parsed = parse(fmt, text)
    assert parsed.batch.labels.tolist() == [0.0, 1.0]
    assert bags(parsed, 0) == [
        [feature_sign(0, b'say "hi"')],
        [feature_sign(1, t) for t in (b"a", b'"b"', b"c")],
    ]
    assert bags(parsed, 1) == [[feature_sign(0, b'"')], [feature_sign(1, b'""')]]


def test_empty_quoted_fields_are_empty_cells() -> None:
    fmt = csv_format({"y": "label", "u": "u", "age": {"slot": "age", "kind": "bucket"}})
    parsed = parse(fmt, b'y,u,age\n1,"",""\n0,,\n"",u,3\n')
    # An empty quoted cell is the same empty token (or missing integer) as an empty cell.
    empty = [[feature_sign(0, b"")], [feature_sign(1, MISSING)]]
    assert bags(parsed, 0) == bags(parsed, 1) == empty
    assert parsed.bad_lines.tolist() == [4]
    assert parsed.bad_reasons.tolist() == [BAD_LABEL]


def test_quoted_and_unquoted_cells_mix_and_give_the_same_signs() -> None:
    fmt = csv_format({"y": "label", "u": "u", "n": {"slot": "n", "kind": "bucket"}})
    parsed = parse(fmt, b'"y","u","n"\n"1","abc","30"\n1,abc,30\n0,"abc",30\n0,ab"c,"-1"\n')
    assert parsed.batch.labels.tolist() == [1.0, 1.0, 0.0, 0.0]
    same = [[feature_sign(0, b"abc")], [feature_sign(1, 3 + 11)]]  # 3 + floor(ln(30)^2)
    assert bags(parsed, 0) == bags(parsed, 1) == bags(parsed, 2) == same
    # A quote inside an unquoted cell is an ordinary byte (RFC 4180 gives it no meaning there).
    assert bags(parsed, 3) == [[feature_sign(0, b'ab"c')], [feature_sign(1, (1 << 64) - 1)]]


def test_unterminated_quotes_and_text_after_a_quote_are_bad_lines() -> None:
    text = (
        b"y,company,city\n"
        b'1,"Acme, Inc.",Berlin\n'
        b'0,"Acme, Inc.,Berlin\n'  # line 3: never closed
        b'0,"Acme" Inc.,Berlin\n'  # line 4: text after the closing quote
        b"\n"
        b'1,Acme,"Berlin\r\n'  # line 6: unterminated at the end of the line (CRLF)
        b'1,"Acme",Berlin\n'
        b'1,"say \\"hi\\"",Berlin\n'  # line 8: Spark's default backslash escape is not RFC 4180
    )
    parsed = parse(csv_format(COMPANY), text)
    assert parsed.batch.size == 2
    assert parsed.lines == 6
    assert parsed.bad_lines.tolist() == [3, 4, 6, 8]
    assert parsed.bad_reasons.tolist() == [
        UNTERMINATED_QUOTE,
        TEXT_AFTER_QUOTE,
        UNTERMINATED_QUOTE,
        TEXT_AFTER_QUOTE,
    ]


def test_the_reader_reports_quote_errors_with_line_numbers(tmp_path: Path) -> None:
    path = tmp_path / "part-0.csv"
    rows = [b'%d,"shop %d, north",Berlin' % (i % 2, i) for i in range(200)]
    rows[6] = b'1,"shop, north,Berlin'
    rows[150] = b'0,"shop"x,Berlin'
    path.write_bytes(b"y,company,city\n" + b"\n".join(rows) + b"\n")
    cfg = DataConfig.from_dict({"format": "csv", "columns": COMPANY, "maxBadLineFraction": 0.001})
    with pytest.raises(BadDataError) as info:
        for _ in iter_batches([str(path)], cfg, 64, block_bytes=512):
            pass
    message = str(info.value)
    assert "2 bad of 200 lines" in message
    assert "first bad lines 8 (unterminated quoted field" in message
    assert "152 (text between a closing quote and the delimiter)" in message


def test_a_newline_inside_quotes_is_unsupported() -> None:
    # Lines are cut at every newline: the opening line is unterminated, and the continuation
    # is read as a line of its own (here one column short).
    parsed = parse(csv_format(COMPANY), b'y,company,city\n1,"Acme\nInc.",Berlin\n0,Acme,Bonn\n')
    assert parsed.batch.size == 1
    assert parsed.bad_lines.tolist() == [2, 3]
    assert parsed.bad_reasons.tolist() == [UNTERMINATED_QUOTE, BAD_COLUMNS]


def test_quote_char_is_configurable_and_can_be_turned_off() -> None:
    single = csv_format(COMPANY, quoteChar="'", delimiter=";")
    parsed = parse(single, b"y;company;city\n1;'Acme; ''Inc.''';\"Berlin\"\n")
    assert bags(parsed, 0) == [[feature_sign(0, b"Acme; 'Inc.'")], [feature_sign(1, b'"Berlin"')]]
    off = csv_format(COMPANY, quoteChar="")
    parsed = parse(off, b'y,company,city\n1,"Acme",Berlin\n1,"Acme, Inc.",Berlin\n0,"x,y\n')
    assert bags(parsed, 0) == [[feature_sign(0, b'"Acme"')], [feature_sign(1, b"Berlin")]]
    assert bags(parsed, 1) == [[feature_sign(0, b'"x')], [feature_sign(1, b"y")]]
    assert parsed.bad_lines.tolist() == [3]  # "Acme, Inc." is two cells without quoting
    assert parsed.bad_reasons.tolist() == [BAD_COLUMNS]


def test_quoted_headers_and_malformed_ones() -> None:
    fmt = csv_format({"click": "label", "site, id": "site"})
    parsed = parse(fmt, b'"click","site, id"\n1,a\n')
    assert bags(parsed, 0) == [[feature_sign(0, b"a")]]
    with pytest.raises(CorruptFileError, match=r"mem: malformed quoting in the header line"):
        parse(fmt, b'"click"x,site\n1,a\n')


def test_avazu_sample_parses_exactly_as_before_quoting_existed() -> None:
    raw = AVAZU.read_bytes()
    columns: dict[str, Any] = {"click": "label", **{name: name for name in AVAZU_CATEGORICAL}}
    avazu = parse(line_format(DataConfig.from_dict({"format": "avazu"})), raw)
    generic = parse(csv_format(columns), raw)
    assert avazu.batch.size == generic.batch.size == 8087
    assert digest(avazu) == AVAZU_DIGEST_BEFORE_QUOTING
    assert digest(generic) == CSV_DIGEST_BEFORE_QUOTING
    # Independently of the golden digests: every cell of a sample of rows, hashed in Python.
    lines = raw.decode().splitlines()
    names = lines[0].split(",")
    for example in range(0, 8087, 997):
        cells = dict(zip(names, lines[example + 1].split(","), strict=True))
        for slot, name in enumerate(AVAZU_CATEGORICAL):
            assert bags(avazu, example)[slot] == [feature_sign(slot, cells[name])]
    # The sample rewritten with every cell quoted (pandas' QUOTE_ALL) gives the same signs.
    out = io.StringIO()
    writer = csv.writer(out, quoting=csv.QUOTE_ALL, lineterminator="\n")
    writer.writerows(csv.reader(io.StringIO(raw.decode())))
    quoted = out.getvalue().encode()
    assert quoted.count(b'"') == 2 * 24 * 8088
    assert digest(parse(line_format(DataConfig.from_dict({"format": "avazu"})), quoted)) == (
        AVAZU_DIGEST_BEFORE_QUOTING
    )
    assert digest(parse(csv_format(columns), quoted)) == CSV_DIGEST_BEFORE_QUOTING
    hour = AVAZU_SLOTS.index("hour")
    assert bags(avazu, 0)[hour] == [feature_sign(hour, 0)]


def test_criteo_never_quotes() -> None:
    fmt = line_format(DataConfig.from_dict({"format": "criteo"}))
    cells = [b"1", *[b"1"] * 13, b'"ab', *[b"cd"] * 25]
    parsed = parse(fmt, b"\t".join(cells) + b"\n")
    assert parsed.bad_lines.tolist() == []
    assert bags(parsed, 0)[13] == [feature_sign(13, b'"ab')]


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"quoteChar": "''"}, r"^data\.quoteChar: must be one ASCII character"),
        ({"quoteChar": "\n"}, r"^data\.quoteChar: must be one ASCII character"),
        ({"quoteChar": "«"}, r"^data\.quoteChar: must be one ASCII character"),
        ({"quoteChar": 7}, r"^data\.quoteChar: must be a string"),
        ({"quoteChar": ";", "delimiter": ";"}, r"^data\.quoteChar: must differ from the delimit"),
        (
            {"columns": {"y": "label", "t": {"slot": "t", "kind": "multi", "separator": "'"}}},
            r"^data\.columns\.t\.separator: must be one character, not the delimiter or the quo",
        ),
    ],
)
def test_quote_char_errors_name_the_field(data: dict[str, Any], message: str) -> None:
    raw: dict[str, Any] = {"format": "csv", "columns": {"y": "label", "u": "u"}, "quoteChar": "'"}
    with pytest.raises(DataConfigError, match=message):
        DataConfig.from_dict({**raw, **data})
    with pytest.raises(DataConfigError, match=r"^data\.quoteChar: must differ from the delim"):
        DataConfig.from_dict({"format": "avazu", "quoteChar": ","})
    # Criteo and the other formats never quote, so there the delimiter does not matter.
    assert DataConfig.from_dict({"format": "criteo", "quoteChar": ","}).quoteChar == ","


def test_quote_char_default_and_round_trip() -> None:
    cfg = DataConfig.from_dict({"format": "csv", "columns": COMPANY})
    assert (cfg.quoteChar, cfg.quote_byte) == ('"', 34)
    off = DataConfig.from_dict({"format": "csv", "columns": COMPANY, "quoteChar": ""})
    assert off.quote_byte == -1
    assert DataConfig.from_dict(off.to_dict()) == off


@st.composite
def csv_lines(draw: st.DrawFn) -> tuple[str, str, str]:
    """(delimiter, quote, line): half the lines written by ``csv.writer`` (valid quoting),
    half free text over the same alphabet (unterminated quotes, text after quotes, stray
    quotes), never with a newline."""
    delimiter = draw(st.sampled_from([",", ";", "\t"]))
    quote = draw(st.sampled_from(['"', "'"]))
    alphabet = st.sampled_from(["a", "b", " ", "é", "|", ",", ";", "\t", '"', "'"])
    if draw(st.booleans()):
        fields = draw(st.lists(st.text(alphabet, max_size=5), min_size=1, max_size=6))
        quote_all = draw(st.booleans())
        quoting: Literal[0, 1] = csv.QUOTE_ALL if quote_all else csv.QUOTE_MINIMAL
        out = io.StringIO()
        csv.writer(
            out, delimiter=delimiter, quotechar=quote, quoting=quoting, lineterminator="\n"
        ).writerow(fields)
        return delimiter, quote, out.getvalue()[:-1]
    # Free text: pieces weighted towards the delimiter and the quote, so fields that open a
    # quote (and close it, double it, or never close it) are common rather than rare.
    pieces = st.sampled_from([delimiter, quote, quote, quote + quote, delimiter + quote, "a", " "])
    return delimiter, quote, "".join(draw(st.lists(pieces | alphabet, max_size=12)))


def csv_config(delimiter: str, quote: str, features: int) -> DataConfig:
    columns: dict[str, Any] = {"0": "label"}
    columns.update({str(i): f"s{i}" for i in range(1, features + 1)})
    return DataConfig.from_dict(
        {
            "format": "csv",
            "header": False,
            "delimiter": delimiter,
            "quoteChar": quote,
            "columns": columns,
        }
    )


@settings(deadline=None, max_examples=150)
@given(case=csv_lines())
def test_field_splitting_matches_pythons_csv_module(case: tuple[str, str, str]) -> None:
    delimiter, quote, line = case
    text = "1" + delimiter + line  # column 0 is the label, so every line has one
    try:
        (fields,) = csv.reader([text], delimiter=delimiter, quotechar=quote, strict=True)
    except csv.Error as exc:
        event("the csv module rejects the line")
        parsed = parse(line_format(csv_config(delimiter, quote, 1)), text.encode() + b"\n")
        reason = UNTERMINATED_QUOTE if "unexpected end of data" in str(exc) else TEXT_AFTER_QUOTE
        assert (parsed.batch.size, parsed.bad_reasons.tolist()) == (0, [reason])
        return
    event(f"{len(fields) - 1} feature fields")
    features = len(fields) - 1
    parsed = parse(line_format(csv_config(delimiter, quote, features)), text.encode() + b"\n")
    assert parsed.bad_lines.tolist() == []
    assert bags(parsed, 0) == [[feature_sign(k, fields[k + 1].encode())] for k in range(features)]
    # One configured column more than the line has: exactly the field count is found.
    too_many = parse(line_format(csv_config(delimiter, quote, features + 1)), text.encode())
    assert too_many.bad_reasons.tolist() == [BAD_COLUMNS]


def test_bench_quoting_compares_two_kernels_on_the_samples(tmp_path: Path) -> None:
    # Stand-in for an older delimited.py: the kernel signature before quoting existed.
    old = tmp_path / "old_delimited.py"
    old.write_text(
        "from streamtrain_worker.data.formats.delimited import _kernel as new_kernel\n\n\n"
        "def _kernel(data, first_line, delimiter, *rest):\n"
        "    new_kernel(data, first_line, delimiter, -1, *rest)\n"
    )
    results = bench_quoting.run(old, SAMPLES_DIR, repeats=2, copies=1)
    for name in bench_quoting.FORMATS:
        entry = results[name]
        assert isinstance(entry, dict)
        assert entry["old_lines_per_s"] > 0 and entry["new_lines_per_s"] > 0
        assert entry["ratio"] > 0
    assert isinstance(results["avazu_all_quoted_lines_per_s"], int)
    assert isinstance(results["control_avazu_new_vs_new_ratio"], float)
    assert bench_quoting.all_quoted(b"a,b\n1,\n") == b'"a","b"\n"1",""\n'
