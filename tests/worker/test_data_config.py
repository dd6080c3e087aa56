"""DataConfig: defaults, round trip, slot names per format, errors that name the field."""

from __future__ import annotations

from typing import Any

import pytest

from streamtrain_worker.data.config import AVAZU_SLOTS, CRITEO_SLOTS, DataConfig
from streamtrain_worker.data.errors import DataConfigError


def test_defaults_and_round_trip() -> None:
    cfg = DataConfig.from_dict({"format": "criteo"})
    assert (cfg.maxBadLineFraction, cfg.donefile, cfg.labelSlot) == (0.001, "_SUCCESS", "click")
    assert DataConfig.from_dict(cfg.to_dict()) == cfg
    csv = DataConfig.from_dict(
        {"format": "csv", "columns": {"y": "label", "t": {"slot": "tags", "kind": "multi"}}}
    )
    assert DataConfig.from_dict(csv.to_dict()) == csv


def test_the_operator_fields_are_accepted() -> None:
    cfg = DataConfig.from_dict(
        {
            "path": "s3://logs/ctr",
            "startDay": "20261101",
            "endDay": None,
            "format": "slot",
            "layout": "HH",
            "splitIntervalMinutes": 60,
            "splitsPerPass": 2,
            "donefile": "DONE",
            "pollSeconds": 5,
            "missingDeadlineSeconds": 600,
            "onMissing": "fail",
            "maxBadLineFraction": 0,
            "numSlots": 3,
            "columns": {},
            "sequenceSlot": 2,
            "slots": None,
            "labelSlot": "click",
            "delimiter": ",",
            "header": True,
            "quoteChar": "'",
            "fieldMap": None,
        }
    )
    assert cfg.pollSeconds == 5.0
    assert cfg.slot_names == ("1", "2", "3")


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        ({"format": "criteo"}, CRITEO_SLOTS),
        ({"format": "avazu"}, AVAZU_SLOTS),
        ({"format": "slot", "slots": ["u", "i"]}, ("u", "i")),
        ({"format": "libsvm", "numSlots": 2}, ("0", "1")),
        ({"format": "libsvm"}, ("0",)),
        ({"format": "csv", "columns": {"a": "x", "b": "label", "c": "y", "d": "x"}}, ("x", "y")),
    ],
)
def test_slot_names_per_format(data: dict[str, Any], expected: tuple[str, ...]) -> None:
    cfg = DataConfig.from_dict(data)
    assert cfg.slot_names == expected
    pairs = len(expected) * (len(expected) - 1) // 2 if len(expected) <= 8 else 0
    assert cfg.num_slots == len(expected) + pairs  # unset crosses: every pair of a few slots
    assert DataConfig.from_dict({**data, "crosses": []}).num_slots == len(expected)
    assert len(CRITEO_SLOTS) == 39 and len(AVAZU_SLOTS) == 23


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ([], r"^data: must be an object"),
        ({"formatt": "slot"}, r"^data\.formatt: unknown field"),
        ({"format": "parquet"}, r"^data\.format: must be one of"),
        ({"format": "criteo", "maxBadLineFraction": 2}, r"^data\.maxBadLineFraction: must be <= 1"),
        (
            {"format": "criteo", "maxBadLineFraction": "low"},
            r"^data\.maxBadLineFraction: must be a number",
        ),
        ({"format": "criteo", "splitsPerPass": 1.5}, r"^data\.splitsPerPass: must be an integer"),
        ({"format": "criteo", "header": "yes"}, r"^data\.header: must be true or false"),
        ({"format": "criteo", "layout": "HMS"}, r"^data\.layout"),
        ({"format": "criteo", "donefile": ""}, r"^data\.donefile"),
        ({"format": "criteo", "numSlots": 40}, r"^data\.numSlots: is 40 but format criteo has 39"),
        ({"format": "slot"}, r"^data\.numSlots: the slot format needs"),
        ({"format": "slot", "slots": ["a", "click"]}, r"^data\.labelSlot: 'click' is also"),
        ({"format": "slot", "slots": ["a", "a"]}, r"^data\.slots: slot names must be unique"),
        ({"format": "slot", "slots": ["a", ""]}, r"^data\.slots\[1\]: must not be empty"),
        ({"format": "slot", "slots": "a"}, r"^data\.slots: must be a list"),
        ({"format": "criteo", "sequenceSlot": 39}, r"^data\.sequenceSlot: must be in 0\.\.38"),
        ({"format": "csv", "columns": {"a": "x"}}, r"^data\.columns: exactly one column"),
        ({"format": "csv", "columns": {"a": "label"}}, r"^data\.columns: map at least one"),
        (
            {"format": "csv", "columns": {"a": "label", "b": {"slot": "x", "kind": "list"}}},
            r"^data\.columns\.b\.kind",
        ),
        (
            {"format": "csv", "header": False, "columns": {"a": "label", "1": "x"}},
            r"^data\.columns\.a: without a header",
        ),
        ({"format": "csv", "delimiter": "::", "columns": {"a": "label"}}, r"^data\.delimiter"),
        (
            {"format": "csv", "columns": {"a": "label", "b": 3}},
            r"^data\.columns\.b: must be a slot",
        ),
    ],
)
def test_errors_name_the_field(data: Any, message: str) -> None:
    with pytest.raises(DataConfigError, match=message):
        DataConfig.from_dict(data)
