"""Worker config: round trip, defaults in one place, errors that name the field."""

from __future__ import annotations

import pytest

from streamtrain_worker.config import ConfigError, WorkerConfig
from streamtrain_worker.data.config import DataConfig

CRITEO = {"format": "criteo"}


def test_round_trip_and_defaults() -> None:
    cfg = WorkerConfig(data=DataConfig(format="criteo"))
    assert WorkerConfig.from_json(cfg.to_json()) == cfg
    assert WorkerConfig.from_dict({"data": CRITEO}) == cfg
    assert cfg.data.num_slots == 39
    parsed = WorkerConfig.from_dict(
        {
            "data": CRITEO,
            "model": {"type": "deepfm", "hiddenUnits": [16, 8], "cvm": False},
            "ps": {"endpoints": ["ps-0.ps:7000"], "config": {"logicalShards": 8}},
            "metrics": {"numBuckets": 1000},
        }
    )
    assert parsed.model.type == "deepfm"
    assert parsed.model.hiddenUnits == (16, 8)
    assert parsed.ps.endpoints == ("ps-0.ps:7000",)
    assert parsed.model.embeddingDim == cfg.model.embeddingDim
    assert parsed.ps.config.logicalShards == 8


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"model": {"type": "lr"}}, r"worker\.model\.type: must be one of"),
        ({"model": {"embeddingDim": 0}}, r"worker\.model\.embeddingDim: must be >= 1"),
        ({"model": {"hiddenUnits": [8, "x"]}}, r"worker\.model\.hiddenUnits\[1\]"),
        ({"model": {"cvm": 1}}, r"worker\.model\.cvm: must be true or false"),
        ({"modle": {}}, r"worker\.modle: unknown field"),
        ({"ps": {"endpoints": ["nohost"]}}, r"worker\.ps\.endpoints\[0\]: must be host:port"),
        ({"metrics": {"numBuckets": 10}}, r"worker\.metrics\.numBuckets"),
        ({"runtime": {"numThreads": 0}}, r"worker\.runtime\.numThreads"),
        ({"seed": 1.5}, r"worker\.seed: must be an integer"),
        ({"data": {"format": "parquet"}}, r"worker\.data\.format"),
        ({"model": {"type": "din"}}, r"worker\.data\.sequenceSlot: din needs"),
        ({"ps": {"config": {"logicalShards": 0}}}, r"worker\.ps\.config\.logicalShards"),
        ({"table": "other"}, r"worker\.table: 'other' is not a PS table"),
        ({"model": {"embeddingDim": 4}}, r"worker\.model\.embeddingDim: 4 differs"),
    ],
)
def test_errors_name_the_field(data: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        WorkerConfig.from_dict({"data": CRITEO, **data})


def test_data_is_required() -> None:
    with pytest.raises(ConfigError, match=r"worker\.data: required"):
        WorkerConfig.from_dict({})


def test_not_json() -> None:
    with pytest.raises(ConfigError, match="not valid JSON"):
        WorkerConfig.from_json("{")
