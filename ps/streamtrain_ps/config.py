"""Validated settings of a PS shard, parsed from the JSON the operator renders.

The JSON uses the same camelCase names as the ``StreamingTrainingJob`` spec
(``spec.sparse`` and ``spec.dense``), so a PaddleRec user recognises every field. Defaults
live here and only here for the PS side; the operator's spec dataclasses render every field
explicitly, so there is never a second, silently different set of defaults.

Example::

    {"logicalShards": 64, "seed": 0, "maxMessageBytes": 268435456,
     "tables": [{"name": "embedding", "embedxDim": 8, "embedxThreshold": 10, ...,
                 "optimizer": {"type": "adagrad", "learningRate": 0.05, ...}}],
     "dense": {"optimizer": {"type": "adam", "learningRate": 0.001}}}
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields
from typing import Any, Literal, TypeVar

from streamtrain_ps.sharding import DEFAULT_LOGICAL_SHARDS

SparseOptimizerType = Literal["adagrad", "std_adagrad", "adam"]
DenseOptimizerType = Literal["adam", "sgd"]


class ConfigError(ValueError):
    """A setting is missing, mistyped or out of range; the message names the field."""


@dataclass(frozen=True)
class SparseOptimizerConfig:
    """Update rule for one sparse table (docs/design.md §4)."""

    type: SparseOptimizerType = "adagrad"
    learningRate: float = 0.05
    initialG2sum: float = 3.0
    #: embedx (and embed_w for Adam) start at U(-initialRange, +initialRange).
    initialRange: float = 1e-4
    weightBounds: tuple[float, float] = (-10.0, 10.0)
    beta1: float = 0.9
    beta2: float = 0.999
    epsilon: float = 1e-8


@dataclass(frozen=True)
class TableConfig:
    """One sparse table with the CTR accessor's statistics and thresholds."""

    name: str = "embedding"
    embedxDim: int = 8
    #: embedx is admitted (allocated and initialised) once score >= this.
    embedxThreshold: float = 10.0
    nonclkCoeff: float = 0.1
    clickCoeff: float = 1.0
    showClickDecayRate: float = 0.98
    deleteThreshold: float = 0.8
    deleteAfterUnseenDays: int = 30
    baseThreshold: float = 1.5
    deltaThreshold: float = 0.25
    deltaKeepDays: int = 16
    optimizer: SparseOptimizerConfig = field(default_factory=SparseOptimizerConfig)

    @property
    def pull_dim(self) -> int:
        """Width of a pulled row: show, click, embed_w, embedx_w."""
        return 3 + self.embedxDim

    @property
    def push_dim(self) -> int:
        """Width of a pushed gradient row: embed_g, embedx_g."""
        return 1 + self.embedxDim


@dataclass(frozen=True)
class DenseOptimizerConfig:
    type: DenseOptimizerType = "adam"
    learningRate: float = 0.001
    beta1: float = 0.9
    beta2: float = 0.999
    epsilon: float = 1e-8


@dataclass(frozen=True)
class DenseConfig:
    optimizer: DenseOptimizerConfig = field(default_factory=DenseOptimizerConfig)


@dataclass(frozen=True)
class PSConfig:
    """Everything one shard needs besides its index and the shard count (command line)."""

    tables: tuple[TableConfig, ...] = (TableConfig(),)
    dense: DenseConfig = field(default_factory=DenseConfig)
    logicalShards: int = DEFAULT_LOGICAL_SHARDS
    seed: int = 0
    #: gRPC send/receive limit; larger requests are rejected with RESOURCE_EXHAUSTED.
    maxMessageBytes: int = 256 * 1024 * 1024
    #: Most keys one PullSparse/PushSparse request may carry.
    maxKeysPerRequest: int = 4_000_000

    def table(self, name: str) -> TableConfig:
        for t in self.tables:
            if t.name == name:
                return t
        raise KeyError(name)

    def to_dict(self) -> dict[str, Any]:
        return _to_jsonable(asdict(self))

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)

    @classmethod
    def from_dict(cls, data: Any, path: str = "ps") -> PSConfig:
        return _parse_ps(data, path)

    @classmethod
    def from_json(cls, text: str) -> PSConfig:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"ps config: not valid JSON: {exc}") from exc
        return cls.from_dict(data)


def _to_jsonable(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _to_jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_to_jsonable(v) for v in value]
    return value


T = TypeVar("T")


def _check_keys(data: Any, cls: type, path: str) -> dict[str, Any]:
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: must be an object, got {type(data).__name__}")
    known = {f.name for f in fields(cls)}
    unknown = sorted(set(data) - known)
    if unknown:
        raise ConfigError(f"{path}.{unknown[0]}: unknown field (known: {', '.join(sorted(known))})")
    return data


def _number(data: dict[str, Any], key: str, default: float, path: str) -> float:
    value = data.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ConfigError(f"{path}.{key}: must be a number, got {value!r}")
    return float(value)


def _integer(data: dict[str, Any], key: str, default: int, path: str, minimum: int = 0) -> int:
    value = data.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"{path}.{key}: must be an integer, got {value!r}")
    if value < minimum:
        raise ConfigError(f"{path}.{key}: must be >= {minimum}, got {value}")
    return value


def _positive(value: float, key: str, path: str) -> float:
    if not value > 0:
        raise ConfigError(f"{path}.{key}: must be > 0, got {value}")
    return value


def _parse_sparse_optimizer(data: Any, path: str) -> SparseOptimizerConfig:
    d = _check_keys(data, SparseOptimizerConfig, path)
    base = SparseOptimizerConfig()
    kind = d.get("type", base.type)
    if kind not in ("adagrad", "std_adagrad", "adam"):
        raise ConfigError(f"{path}.type: must be one of adagrad, std_adagrad, adam, got {kind!r}")
    bounds = d.get("weightBounds", list(base.weightBounds))
    if (
        not isinstance(bounds, list | tuple)
        or len(bounds) != 2
        or not all(isinstance(b, int | float) and not isinstance(b, bool) for b in bounds)
        or not bounds[0] < bounds[1]
    ):
        raise ConfigError(
            f"{path}.weightBounds: must be [low, high] with low < high, got {bounds!r}"
        )
    beta1 = _number(d, "beta1", base.beta1, path)
    beta2 = _number(d, "beta2", base.beta2, path)
    for key, beta in (("beta1", beta1), ("beta2", beta2)):
        if not 0 <= beta < 1:
            raise ConfigError(f"{path}.{key}: must be in [0, 1), got {beta}")
    return SparseOptimizerConfig(
        type=kind,
        learningRate=_positive(
            _number(d, "learningRate", base.learningRate, path), "learningRate", path
        ),
        initialG2sum=_positive(
            _number(d, "initialG2sum", base.initialG2sum, path), "initialG2sum", path
        ),
        initialRange=_number(d, "initialRange", base.initialRange, path),
        weightBounds=(float(bounds[0]), float(bounds[1])),
        beta1=beta1,
        beta2=beta2,
        epsilon=_positive(_number(d, "epsilon", base.epsilon, path), "epsilon", path),
    )


def _parse_table(data: Any, path: str) -> TableConfig:
    d = _check_keys(data, TableConfig, path)
    base = TableConfig()
    name = d.get("name", base.name)
    if not isinstance(name, str) or not name:
        raise ConfigError(f"{path}.name: must be a non-empty string, got {name!r}")
    decay = _number(d, "showClickDecayRate", base.showClickDecayRate, path)
    if not 0 < decay <= 1:
        raise ConfigError(f"{path}.showClickDecayRate: must be in (0, 1], got {decay}")
    return TableConfig(
        name=name,
        embedxDim=_integer(d, "embedxDim", base.embedxDim, path, minimum=1),
        embedxThreshold=_number(d, "embedxThreshold", base.embedxThreshold, path),
        nonclkCoeff=_number(d, "nonclkCoeff", base.nonclkCoeff, path),
        clickCoeff=_number(d, "clickCoeff", base.clickCoeff, path),
        showClickDecayRate=decay,
        deleteThreshold=_number(d, "deleteThreshold", base.deleteThreshold, path),
        deleteAfterUnseenDays=_integer(
            d, "deleteAfterUnseenDays", base.deleteAfterUnseenDays, path
        ),
        baseThreshold=_number(d, "baseThreshold", base.baseThreshold, path),
        deltaThreshold=_number(d, "deltaThreshold", base.deltaThreshold, path),
        deltaKeepDays=_integer(d, "deltaKeepDays", base.deltaKeepDays, path),
        optimizer=_parse_sparse_optimizer(d.get("optimizer", {}), f"{path}.optimizer"),
    )


def _parse_dense(data: Any, path: str) -> DenseConfig:
    d = _check_keys(data, DenseConfig, path)
    opt_path = f"{path}.optimizer"
    o = _check_keys(d.get("optimizer", {}), DenseOptimizerConfig, opt_path)
    base = DenseOptimizerConfig()
    kind = o.get("type", base.type)
    if kind not in ("adam", "sgd"):
        raise ConfigError(f"{opt_path}.type: must be one of adam, sgd, got {kind!r}")
    return DenseConfig(
        optimizer=DenseOptimizerConfig(
            type=kind,
            learningRate=_positive(
                _number(o, "learningRate", base.learningRate, opt_path), "learningRate", opt_path
            ),
            beta1=_number(o, "beta1", base.beta1, opt_path),
            beta2=_number(o, "beta2", base.beta2, opt_path),
            epsilon=_positive(_number(o, "epsilon", base.epsilon, opt_path), "epsilon", opt_path),
        )
    )


def _parse_ps(data: Any, path: str) -> PSConfig:
    d = _check_keys(data, PSConfig, path)
    base = PSConfig()
    raw_tables = d.get("tables", [{}])
    if not isinstance(raw_tables, list) or not raw_tables:
        raise ConfigError(f"{path}.tables: must be a non-empty list")
    tables = tuple(_parse_table(t, f"{path}.tables[{i}]") for i, t in enumerate(raw_tables))
    names = [t.name for t in tables]
    if len(set(names)) != len(names):
        raise ConfigError(f"{path}.tables: table names must be unique, got {names}")
    return PSConfig(
        tables=tables,
        dense=_parse_dense(d.get("dense", {}), f"{path}.dense"),
        logicalShards=_integer(d, "logicalShards", base.logicalShards, path, minimum=1),
        seed=_integer(d, "seed", base.seed, path),
        maxMessageBytes=_integer(d, "maxMessageBytes", base.maxMessageBytes, path, minimum=1024),
        maxKeysPerRequest=_integer(d, "maxKeysPerRequest", base.maxKeysPerRequest, path, minimum=1),
    )
