"""PS config: the JSON round trip, and the declared bounds checked on the PS itself (the
same ones the job spec and the CRD apply, since they are one declaration)."""

from __future__ import annotations

from typing import Any

import pytest

from streamtrain_ps.config import ConfigError, PSConfig, SparseConfig, TableConfig


def test_round_trip_and_defaults() -> None:
    cfg = PSConfig(tables=(TableConfig(name="a", embedxDim=4, deltaKeepDays=3),), seed=5)
    assert PSConfig.from_json(cfg.to_json()) == cfg
    assert PSConfig.from_dict({}) == PSConfig()
    assert SparseConfig().table_config(8) == TableConfig()


@pytest.mark.parametrize(
    ("data", "path", "message"),
    [
        ({"tables": []}, "ps.tables", "must have at least 1 item"),
        ({"tables": [{"name": "a"}, {"name": "a"}]}, "ps.tables", "table names must be unique"),
        ({"tables": [{"name": ""}]}, "ps.tables[0].name", "must not be empty"),
        ({"tables": [{"embedxDim": 0}]}, "ps.tables[0].embedxDim", "must be >= 1"),
        ({"tables": [{"embedxDim": 2048}]}, "ps.tables[0].embedxDim", "must be <= 1024"),
        ({"tables": [{"deleteThreshold": -1}]}, "ps.tables[0].deleteThreshold", "must be >= 0"),
        ({"tables": [{"deltaKeepDays": 1.5}]}, "ps.tables[0].deltaKeepDays", "must be an int"),
        ({"tables": [{"showClickDecayRate": 0}]}, "ps.tables[0].showClickDecayRate", "must be >"),
        (
            {"tables": [{"optimizer": {"weightBounds": [1, -1]}}]},
            "ps.tables[0].optimizer.weightBounds",
            "must be [low, high] with low < high",
        ),
        ({"tables": [{"optimizer": {"type": "sgd"}}]}, "ps.tables[0].optimizer.type", "must be"),
        (
            {"tables": [{"optimizer": {"embedType": "sgd"}}]},
            "ps.tables[0].optimizer.embedType",
            "must be one of",
        ),
        (
            {"tables": [{"optimizer": {"ftrlAlpha": 0}}]},
            "ps.tables[0].optimizer.ftrlAlpha",
            "must be >",
        ),
        (
            {"tables": [{"optimizer": {"ftrlBeta": 0}}]},
            "ps.tables[0].optimizer.ftrlBeta",
            "must be >",
        ),
        (
            {"tables": [{"optimizer": {"ftrlL1": -0.1}}]},
            "ps.tables[0].optimizer.ftrlL1",
            "must be >=",
        ),
        ({"tables": [{"optimizer": {"ftrlL2": "a"}}]}, "ps.tables[0].optimizer.ftrlL2", "must be"),
        ({"dense": {"optimizer": {"beta1": 1.0}}}, "ps.dense.optimizer.beta1", "must be < 1"),
        ({"logicalShards": 0}, "ps.logicalShards", "must be >= 1"),
        ({"maxMessageBytes": 10}, "ps.maxMessageBytes", "must be >= 1024"),
        ({"sead": 1}, "ps.sead", "unknown field"),
    ],
)
def test_errors_carry_the_path(data: dict[str, Any], path: str, message: str) -> None:
    with pytest.raises(ConfigError) as caught:
        PSConfig.from_dict(data)
    assert caught.value.path == path
    assert caught.value.message.startswith(message), caught.value.message


def test_not_json() -> None:
    with pytest.raises(ConfigError, match="not valid JSON"):
        PSConfig.from_json("{")
