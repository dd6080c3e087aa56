"""Validated settings of a PS shard, parsed from the JSON the operator renders.

The JSON uses the same camelCase names as the ``StreamingTrainingJob`` spec
(``spec.sparse`` and ``spec.dense``), so a PaddleRec user recognises every field. Defaults
and bounds are declared here, once, with :func:`streamtrain_ps.plumbing.settings.setting`: the job
spec composes :class:`SparseConfig` and :class:`DenseConfig` as its ``sparse`` and ``dense``
sections (so the CRD is generated from these declarations), the operator renders every
field explicitly, and one parser (:func:`streamtrain_ps.plumbing.settings.parse`) reads both the
manifest and this JSON.

Example::

    {"logicalShards": 64, "seed": 0, "maxMessageBytes": 268435456,
     "tables": [{"name": "embedding", "embedxDim": 8, "embedxThreshold": 10, ...,
                 "optimizer": {"type": "adagrad", "learningRate": 0.05, ...}}],
     "dense": {"optimizer": {"type": "adam", "learningRate": 0.001}}}
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import ClassVar, Literal

from streamtrain_ps.plumbing.settings import ConfigError, Document, setting
from streamtrain_ps.sharding import DEFAULT_LOGICAL_SHARDS

__all__ = [
    "CAPPED_REQUEST_KEYS",
    "REQUEST_KEYS",
    "ConfigError",
    "DenseConfig",
    "DenseOptimizerConfig",
    "PSConfig",
    "SparseConfig",
    "SparseOptimizerConfig",
    "TableConfig",
]

#: Most keys per request a client (``RemotePS``) sends by default. A server thread's arena
#: keeps pages of the largest request it merged, so smaller requests leave less behind: a
#: shard process grown to 10M keys over gRPC held 45-48 B/key with 65,536 and 39-42 with
#: 16,384, at the same speeds (docs/benchmarks.md, issue 12). A training batch's unique
#: keys (5k-15k per shard) fit in one request.
REQUEST_KEYS = 16_384
#: Most keys a capped shard admits in one request, whatever ``maxKeysPerRequest`` allows:
#: it reserves scratch for the largest request it admits
#: (``memory_limit.capped_request_keys``). Four client requests' worth, so clients with a
#: larger ``request_keys`` still work and the reserve covers what a process of this
#: size holds beside its requests (measured: a reserve sized for 16,384 keys left RSS
#: 12-26 MB past the limit, one for 65,536 within 4 MB).
CAPPED_REQUEST_KEYS = 4 * REQUEST_KEYS

SparseOptimizerType = Literal["adagrad", "std_adagrad", "adam", "ftrl", "scale_free_adagrad"]
DenseOptimizerType = Literal["adam", "sgd"]
OccurrenceSteps = Literal["none", "embed", "all"]


@dataclass(frozen=True)
class SparseOptimizerConfig:
    """Update rule of the sparse table (docs/design.md §4)."""

    type: SparseOptimizerType = setting(
        "adagrad",
        "adagrad (one accumulator per part), std_adagrad (per dimension), adam, ftrl "
        "(FTRL-Proximal, per dimension) or scale_free_adagrad (PyTorch's Adagrad: per "
        "dimension, the step g / sqrt(G) with G from 0, so the first is learningRate * sign(g)).",
    )
    # embed_w is the per-key weight of the wide (linear) part: a per-coordinate linear
    # learner's rule (FTRL-Proximal) may suit it while embedx keeps AdaGrad (docs/decisions.md).
    embedType: SparseOptimizerType | None = setting(
        None, "The embed part's update rule; unset: type."
    )
    learningRate: float = setting(0.05, "Step size.", exclusive_minimum=0)
    initialG2sum: float = setting(3.0, "AdaGrad's G0.", exclusive_minimum=0)
    # The embed part (embed_w, the per-key weight a wide model adds to the logit) sees
    # gradients of the loss itself, the embedx part gradients damped by the MLP: PaddlePaddle
    # likewise configures embed_sgd_param and embedx_sgd_param apart (docs/decisions.md).
    # AdaGrad's first steps are lr * g and its late ones lr * sqrt(G0) * g / sqrt(G). 0.1
    # and 0.75 (a new key's first steps doubled, a head key's late ones kept) gained ~0.002
    # on the stream families but cost Criteo 0.003, outside its run-to-run spread once the
    # dense sync kept a worker's own counts: unset by default (docs/decisions.md, issue 26).
    embedLearningRate: float | None = setting(
        None, "The embed part's step size; null: learningRate.", exclusive_minimum=0
    )
    embedInitialG2sum: float | None = setting(
        None, "The embed part's AdaGrad G0; null: initialG2sum.", exclusive_minimum=0
    )
    initialRange: float = setting(1e-4, "embedx starts uniform in +-initialRange.", minimum=0)
    weightBounds: tuple[float, float] = setting((-10.0, 10.0), "[low, high] clip of every weight.")
    beta1: float = setting(0.9, "Adam only.", minimum=0, exclusive_maximum=1)
    beta2: float = setting(0.999, "Adam only.", minimum=0, exclusive_maximum=1)
    epsilon: float = setting(1e-8, "Adam and scale_free_adagrad only.", exclusive_minimum=0)
    ftrlAlpha: float = setting(0.05, "FTRL only: alpha (step size).", exclusive_minimum=0)
    ftrlBeta: float = setting(1.0, "FTRL only: beta (step smoothing).", exclusive_minimum=0)
    ftrlL1: float = setting(0.0, "FTRL only: L1 strength (exact zeros).", minimum=0)
    ftrlL2: float = setting(0.0, "FTRL only: L2 strength.", minimum=0)
    # A key in n examples of a batch gets its mean gradient pushed once; one step of it is
    # ~1/n of what n online steps learn, so a context key in every row (hour of day) learns
    # batchSize times slower than a per-coordinate learner. Taking the n steps from one
    # stale prediction overshoots instead (every head key corrects the same error: Avazu
    # COPC 29, Criteo -0.019 AUC, the families -0.01): off by default (docs/decisions.md).
    occurrenceSteps: OccurrenceSteps = setting(
        "none",
        "Which parts take one step of the key's mean gradient per occurrence in the batch "
        "(AdaGrad and FTRL: n online steps, the accumulators growing per occurrence; Adam: "
        "one step): none, embed (embed_w only) or all.",
    )

    @property
    def embed_type(self) -> SparseOptimizerType:
        """The embed part's rule (``embedType``, else ``type``)."""
        return self.type if self.embedType is None else self.embedType

    @property
    def embed_learning_rate(self) -> float:
        """The embed part's step size (``embedLearningRate``, else ``learningRate``)."""
        return self.learningRate if self.embedLearningRate is None else self.embedLearningRate

    @property
    def embed_initial_g2sum(self) -> float:
        """The embed part's AdaGrad G0 (``embedInitialG2sum``, else ``initialG2sum``)."""
        return self.initialG2sum if self.embedInitialG2sum is None else self.embedInitialG2sum

    @property
    def signature(self) -> str:
        """The rules as saves record them: ``type``, or ``embed:<rule>,embedx:<rule>`` when
        the parts differ (a checkpoint's state only fits a config with the same)."""
        if self.embed_type == self.type:
            return self.type
        return f"embed:{self.embed_type},embedx:{self.type}"

    def _validate(self, path: str) -> None:
        lo, hi = self.weightBounds
        if not lo < hi:
            raise ConfigError(
                f"{path}.weightBounds",
                f"must be [low, high] with low < high, got {list(self.weightBounds)}",
            )


@dataclass(frozen=True)
class SparseConfig:
    """The sparse table with the CTR accessor (docs/design.md §4).

    Everything a job sets for its sparse table (``spec.sparse``); :class:`TableConfig` adds
    the table's name and width.
    """

    embedxThreshold: float = setting(
        10.0, "embedx is admitted once a key's score reaches this.", minimum=0
    )
    nonclkCoeff: float = setting(0.1, "Score weight of a non-click show.", minimum=0)
    clickCoeff: float = setting(1.0, "Score weight of a click.", minimum=0)
    showClickDecayRate: float = setting(
        0.98, "Daily shrink multiplies show and click by this.", exclusive_minimum=0, maximum=1
    )
    deleteThreshold: float = setting(
        0.8, "Shrink deletes keys whose score is below this.", minimum=0
    )
    deleteAfterUnseenDays: int = setting(
        30, "Shrink deletes keys unseen for more days than this.", minimum=0
    )
    baseThreshold: float = setting(
        1.5, "Inference exports keep keys whose score reaches this.", minimum=0
    )
    deltaThreshold: float = setting(
        0.25, "A delta export keeps keys whose score grew by this since the last export.", minimum=0
    )
    deltaKeepDays: int = setting(
        16, "Inference exports drop keys unseen for more days than this.", minimum=0
    )
    optimizer: SparseOptimizerConfig = setting(SparseOptimizerConfig, "Sparse update rule.")

    def table_config(self, embedding_dim: int, name: str = "embedding") -> TableConfig:
        """These settings as the PS table ``name`` with embedx width ``embedding_dim``."""
        shared = {f.name: getattr(self, f.name) for f in fields(SparseConfig)}
        return TableConfig(name=name, embedxDim=embedding_dim, **shared)


@dataclass(frozen=True)
class TableConfig(SparseConfig):
    """One sparse table: the job's sparse settings plus its name and embedx width."""

    name: str = setting("embedding", "Table name, unique within the PS.", min_length=1)
    embedxDim: int = setting(8, "embedx width per key.", minimum=1, maximum=1024)

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
    """Update rule of the dense parameters held by the PS."""

    type: DenseOptimizerType = setting("adam", "adam or sgd.")
    learningRate: float = setting(0.001, "Step size.", exclusive_minimum=0)
    beta1: float = setting(0.9, "Adam only.", minimum=0, exclusive_maximum=1)
    beta2: float = setting(0.999, "Adam only.", minimum=0, exclusive_maximum=1)
    epsilon: float = setting(1e-8, "Adam only.", exclusive_minimum=0)


@dataclass(frozen=True)
class DenseConfig:
    """Dense parameters (the MLP), stored and updated on the PS."""

    optimizer: DenseOptimizerConfig = setting(DenseOptimizerConfig, "Dense update rule.")


@dataclass(frozen=True)
class PSConfig(Document):
    """Everything one shard needs besides its index and the shard count (command line)."""

    document: ClassVar[str] = "ps"

    tables: tuple[TableConfig, ...] = setting(
        (TableConfig(),), "The sparse tables; names are unique.", min_items=1
    )
    dense: DenseConfig = setting(DenseConfig, "The dense parameters.")
    logicalShards: int = setting(
        DEFAULT_LOGICAL_SHARDS,
        "Fixed key-routing granularity for the "
        "life of the model; replicas can change, this cannot.",
        minimum=1,
    )
    seed: int = setting(0, "Seeds every random initialisation; same seed, same model.", minimum=0)
    maxMessageBytes: int = setting(
        256 * 1024 * 1024,
        "gRPC send/receive limit; larger requests are rejected with RESOURCE_EXHAUSTED.",
        minimum=1024,
    )
    maxKeysPerRequest: int = setting(
        4_000_000, "Most keys one PullSparse/PushSparse request may carry.", minimum=1
    )
    maxInflightBytes: int | None = setting(
        None,
        "Request bytes a shard serves at once; more is answered RESOURCE_EXHAUSTED "
        "(overloaded: clients back off and retry). Omitted: twice maxMessageBytes; 0: no cap.",
        minimum=0,
    )
    storageRoots: tuple[str, ...] = setting(
        (),
        "URIs under which Save and Load may write and read (the operator sets the job's "
        "checkpoint and export roots); empty: anywhere the schemes allow "
        "(streamtrain_ps.service.storage_policy).",
    )
    storageSchemes: tuple[str, ...] = setting(
        ("file", "s3", "s3a", "gs", "gcs", "abfs", "abfss", "az", "hdfs", "memory"),
        "URL schemes Save and Load may use (a plain path is file); never http, never a "
        "chained URL.",
        min_items=1,
    )
    memoryLimit: int | None = setting(
        None,
        "Bytes of RAM one shard process may hold (its RSS: the measured fixed overhead, the "
        "disk tier's cache and a scratch reserve are taken from it, the rest holds tables); "
        "past it the coldest keys move to the disk tier. In-process shards (LocalPS): the "
        "table budget. Omitted or 0: unlimited.",
        minimum=0,
    )
    diskLimit: int = setting(
        0,
        "Bytes the disk tier of one shard may hold; when RAM and disk are full the coldest "
        "keys are evicted (counted). 0: only the filesystem's size.",
        minimum=0,
    )
    diskPath: str = setting(
        "",
        "Directory of the disk tier (a fresh subdirectory per shard); empty: a temporary "
        "directory.",
    )

    def _validate(self, path: str) -> None:
        names = [t.name for t in self.tables]
        if len(set(names)) != len(names):
            raise ConfigError(f"{path}.tables", f"table names must be unique, got {names}")

    @property
    def inflight_bytes(self) -> int:
        """The server's cap on request bytes in flight (``maxInflightBytes``; 0: none)."""
        if self.maxInflightBytes is None:
            return 2 * self.maxMessageBytes
        return self.maxInflightBytes

    def table(self, name: str) -> TableConfig:
        for t in self.tables:
            if t.name == name:
                return t
        raise KeyError(name)
