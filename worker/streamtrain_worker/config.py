"""Validated settings of one worker, parsed from the JSON the operator renders.

The JSON uses the camelCase names of the ``StreamingTrainingJob`` spec (``spec.model``,
``spec.data``), so the operator renders its spec sections nearly verbatim. Defaults live
here and only here for the worker side; the operator renders every field explicitly, so
there is never a second, silently different set of defaults. Unknown fields are errors (a
typo must not silently fall back to a default), and every error names the field's path.

This module never imports torch: the operator imports it to render and validate.

Example::

    {"table": "embedding", "seed": 0,
     "model": {"type": "slot_dnn", "embeddingDim": 8, "hiddenUnits": [512, 256, 128],
               "batchSize": 64, "cvm": true, "denseSyncSteps": 10,
               "normalizeEmbeddings": true, ...},
     "data": {...},                                    # streamtrain_worker.data.config
     "ps": {"endpoints": ["ps-0.ps:7000", "ps-1.ps:7000"], "timeoutSeconds": 60,
            "maxRetrySeconds": 30, "config": {...}},          # streamtrain_ps.config
     "metrics": {"numBuckets": 65536},
     "runtime": {"numThreads": 1, "overlap": true, "prefetchBatches": 2, "pushQueueDepth": 4,
                 "maxMergedPushes": 1}}
"""

from __future__ import annotations

import json
import typing
from dataclasses import MISSING, asdict, dataclass, field, fields, is_dataclass
from typing import Any, Literal

from streamtrain_ps.config import ConfigError, PSConfig
from streamtrain_worker.data.config import DataConfig

__all__ = [
    "ConfigError",
    "MetricsConfig",
    "ModelConfig",
    "ModelType",
    "PSClientConfig",
    "RuntimeConfig",
    "WorkerConfig",
]

ModelType = Literal["slot_dnn", "wide_deep", "deepfm", "din"]


@dataclass(frozen=True)
class ModelConfig:
    """The network on top of the PS-backed embedding (``docs/worker.md``)."""

    #: Registered model name (``streamtrain_worker.models``).
    type: ModelType = "slot_dnn"
    #: embedx width; must equal the PS table's ``embedxDim``. Each slot's pooled input is
    #: ``1 + embeddingDim`` wide (embed_w + embedx), plus 2 CVM features when ``cvm``.
    embeddingDim: int = 8
    #: MLP hidden layer widths (ReLU between them, one sigmoid logit on top).
    hiddenUnits: tuple[int, ...] = (512, 256, 128)
    #: Examples per mini-batch (the last batch of a pass may be smaller).
    batchSize: int = 64
    #: Add Paddle's continuous value model features log(show+1), log(click+1)-log(show+1)
    #: per slot, from the PS show/click statistics of the slot's keys.
    cvm: bool = True
    #: Pull the dense parameters from the PS every K steps (and at pass start).
    denseSyncSteps: int = 10
    #: slot_dnn only: normalise the embedding columns of the MLP input too, not just the
    #: CVM ones. It speeds up embeddings that barely move (tiny streams, lazily admitted
    #: embedx) but, on the Criteo bench-e2e protocol, cost ~0.01 progressive AUC against
    #: raw embeddings (plain PyTorch's setup; measured with batch norm); docs/decisions.md.
    normalizeEmbeddings: bool = True
    #: Data norm (the input normalisation of slot_dnn and din, Paddle's ``data_norm``): its
    #: statistics are summed on the PS; each push decays the sums by this factor first
    #: (Paddle's ``summary_decay_rate``). 1 never forgets; lower adapts faster to drift.
    summaryDecayRate: float = 0.9999999
    #: Data norm: the CVM columns' statistics start as this many pseudo-examples of mean 0,
    #: variance 1 (the embedding columns' as one); ``models.data_norm`` says why.
    dataNormPrior: float = 100.0
    #: DIN only: the slot holding the target item (the behaviour sequence slot comes from
    #: the data config's ``sequenceSlot``).
    targetSlot: int = 0
    #: DIN only: hidden widths of the attention MLP.
    attentionUnits: tuple[int, ...] = (64, 32)

    def _validate(self, path: str) -> None:
        _require(self.embeddingDim >= 1, path, "embeddingDim", "must be >= 1")
        _require(self.batchSize >= 1, path, "batchSize", "must be >= 1")
        _require(self.denseSyncSteps >= 1, path, "denseSyncSteps", "must be >= 1")
        _require(self.targetSlot >= 0, path, "targetSlot", "must be >= 0")
        _require(0 < self.summaryDecayRate <= 1, path, "summaryDecayRate", "must be in (0, 1]")
        _require(self.dataNormPrior > 0, path, "dataNormPrior", "must be > 0")
        _require(
            all(u >= 1 for u in self.hiddenUnits), path, "hiddenUnits", "every width must be >= 1"
        )
        _require(
            all(u >= 1 for u in self.attentionUnits),
            path,
            "attentionUnits",
            "every width must be >= 1",
        )


@dataclass(frozen=True)
class PSClientConfig:
    """How the worker reaches the parameter servers."""

    #: ``host:port`` of every PS server, in server-index order (key routing depends on it).
    endpoints: tuple[str, ...] = ()
    #: Deadline of one PS RPC attempt.
    timeoutSeconds: float = 60.0
    #: A PS that stays unavailable this long fails the pass with a clear error; shorter
    #: outages are retried with exponential backoff.
    maxRetrySeconds: float = 30.0
    #: The PS servers' own config (the same JSON they get): table dims, logical shards,
    #: message limits. The client routes and sizes requests by it.
    config: PSConfig = field(default_factory=PSConfig)

    def _validate(self, path: str) -> None:
        _require(self.timeoutSeconds > 0, path, "timeoutSeconds", "must be > 0")
        _require(self.maxRetrySeconds >= 0, path, "maxRetrySeconds", "must be >= 0")
        for i, ep in enumerate(self.endpoints):
            host, sep, port = ep.rpartition(":")
            if not (host and sep and port.isdigit()):
                raise ConfigError(f"{path}.endpoints[{i}]: must be host:port, got {ep!r}")


@dataclass(frozen=True)
class MetricsConfig:
    """Pass metrics (``streamtrain_worker.metrics``)."""

    #: AUC histogram resolution. Paddle uses 1,000,000 buckets, but the histograms travel
    #: in every ``PassResult`` as 2 x 8 bytes per bucket: 10^6 buckets are 16 MB, past
    #: gRPC's default 4 MB message limit. 2^16 buckets are 1 MiB and bound the AUC error
    #: from ties inside a bucket far below the AUC's own sampling noise (width 1.5e-5).
    numBuckets: int = 65536

    def _validate(self, path: str) -> None:
        _require(100 <= self.numBuckets <= 1 << 20, path, "numBuckets", "must be in [100, 2^20]")


@dataclass(frozen=True)
class RuntimeConfig:
    """Process resources of the training loop."""

    #: torch intra-op threads. Small by default: pods are sized by CPU requests and the
    #: prefetch and push threads need cores too.
    numThreads: int = 1
    #: Overlap PS traffic with compute (prefetch and push threads). Off: every pull and push
    #: happens in order in the training thread — slower, but bitwise reproducible.
    overlap: bool = True
    #: Batches read, parsed and pulled ahead of the one training.
    prefetchBatches: int = 2
    #: Pushes in flight before training blocks (bounded async queue).
    pushQueueDepth: int = 4
    #: When pushes queue up faster than the PS applies them, up to this many are merged
    #: into one (sparse rows concatenated, dense gradients averaged). 1 (default) disables
    #: merging: a merged push is ONE optimizer step for k batches, and Adam/AdaGrad steps
    #: barely grow with a gradient's size, so merging cuts the effective learning rate by up
    #: to k — by an amount that depends on how loaded the PS is (bench-e2e: -0.003..-0.005
    #: AUC; docs/decisions.md). Raise it only for PS-bound jobs that accept that.
    maxMergedPushes: int = 1

    def _validate(self, path: str) -> None:
        _require(self.numThreads >= 1, path, "numThreads", "must be >= 1")
        _require(self.prefetchBatches >= 1, path, "prefetchBatches", "must be >= 1")
        _require(self.pushQueueDepth >= 1, path, "pushQueueDepth", "must be >= 1")
        _require(self.maxMergedPushes >= 1, path, "maxMergedPushes", "must be >= 1")


@dataclass(frozen=True)
class WorkerConfig:
    """Everything a worker needs besides its index (command line)."""

    #: The data section (``streamtrain_worker.data.config``): format, slots, bad-line limit.
    #: Required: there is no sensible default format.
    data: DataConfig
    model: ModelConfig = field(default_factory=ModelConfig)
    #: Sparse table the embedding pulls from and pushes to.
    table: str = "embedding"
    ps: PSClientConfig = field(default_factory=PSClientConfig)
    #: Seeds dense initialisation and any shuffling; same seed, same model.
    seed: int = 0
    metrics: MetricsConfig = field(default_factory=MetricsConfig)
    runtime: RuntimeConfig = field(default_factory=RuntimeConfig)

    def _validate(self, path: str) -> None:
        _require(bool(self.table), path, "table", "must be a non-empty string")
        _require(self.seed >= 0, path, "seed", "must be >= 0")
        if self.model.type == "din":
            _require(
                self.data.sequenceSlot is not None,
                path,
                "data.sequenceSlot",
                "din needs the behaviour-sequence slot",
            )
        names = [t.name for t in self.ps.config.tables]
        _require(self.table in names, path, "table", f"{self.table!r} is not a PS table ({names})")
        dim = self.ps.config.table(self.table).embedxDim
        _require(
            self.model.embeddingDim == dim,
            path,
            "model.embeddingDim",
            f"{self.model.embeddingDim} differs from the PS table's embedxDim {dim}",
        )

    @property
    def dense_name(self) -> str:
        """Name of the PS dense vector holding this model's dense parameters."""
        return f"{self.table}.{self.model.type}.dense"

    @property
    def norm_name(self) -> str:
        """Name of the PS summary vector holding the model's data-norm statistics."""
        return f"{self.table}.{self.model.type}.datanorm"

    def to_dict(self) -> dict[str, Any]:
        out = typing.cast(dict[str, Any], _jsonable(asdict(self)))
        out["data"] = self.data.to_dict()  # the data layer owns its JSON form
        return out

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)

    @classmethod
    def from_dict(cls, data: Any, path: str = "worker") -> WorkerConfig:
        return _parse(cls, data, path)

    @classmethod
    def from_json(cls, text: str) -> WorkerConfig:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"worker config: not valid JSON: {exc}") from exc
        return cls.from_dict(data)


def _require(ok: bool, path: str, key: str, message: str) -> None:
    if not ok:
        raise ConfigError(f"{path}.{key}: {message}")


def _jsonable(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    return value


def _parse(cls: type[Any], data: Any, path: str) -> Any:
    """Build dataclass ``cls`` from a JSON object, checking every field's type."""
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: must be an object, got {type(data).__name__}")
    known = {f.name: f for f in fields(cls)}
    unknown = sorted(set(data) - set(known))
    if unknown:
        raise ConfigError(f"{path}.{unknown[0]}: unknown field (known: {', '.join(sorted(known))})")
    hints = typing.get_type_hints(cls)
    kwargs: dict[str, Any] = {}
    for name, f in known.items():
        if name in data:
            kwargs[name] = _value(hints[name], data[name], f"{path}.{name}")
        elif f.default is MISSING and f.default_factory is MISSING:
            raise ConfigError(f"{path}.{name}: required")
    obj = cls(**kwargs)
    obj._validate(path)
    return obj


def _value(hint: Any, value: Any, path: str) -> Any:
    origin = typing.get_origin(hint)
    if isinstance(hint, type) and hasattr(hint, "from_dict"):  # another layer's config
        try:
            return hint.from_dict(value, path)
        except ConfigError:
            raise
        except ValueError as exc:  # e.g. the data layer's DataConfigError
            raise ConfigError(str(exc)) from exc
    if isinstance(hint, type) and is_dataclass(hint):
        return _parse(hint, value, path)
    if origin is Literal:
        choices = typing.get_args(hint)
        if value not in choices:
            raise ConfigError(
                f"{path}: must be one of {', '.join(map(str, choices))}, got {value!r}"
            )
        return value
    if origin is tuple:
        if not isinstance(value, list):
            raise ConfigError(f"{path}: must be a list, got {value!r}")
        item = typing.get_args(hint)[0]
        return tuple(_value(item, v, f"{path}[{i}]") for i, v in enumerate(value))
    if origin is dict or hint is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{path}: must be an object, got {value!r}")
        return dict(value)
    if hint is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{path}: must be true or false, got {value!r}")
        return value
    if hint is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{path}: must be an integer, got {value!r}")
        return value
    if hint is float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ConfigError(f"{path}: must be a number, got {value!r}")
        return float(value)
    if hint is str:
        if not isinstance(value, str):
            raise ConfigError(f"{path}: must be a string, got {value!r}")
        return value
    raise TypeError(f"{path}: no parser for {hint!r}")  # a programming error, not bad input
