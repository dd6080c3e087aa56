# ruff: noqa: RUF009  -- _f() is a dataclasses.field() wrapper carrying doc and bounds.
"""The ``StreamingTrainingJob`` manifest, parsed once into frozen, typed dataclasses.

This module is the single source of truth for the job's fields and their defaults: the CRD
schema (``crds/``) is generated from these dataclasses, the local runner and the Kubernetes
operator both parse manifests with :func:`parse_job`, and :mod:`streamtrain_operator.job.render`
renders every field explicitly into the PS and worker JSON, so no component ever falls
back to a second, silently different default.

Every field carries introspectable metadata (``dataclasses.fields(cls)[i].metadata``; the
field helper and the generic parser it drives live in ``fields.py``):

- ``doc``: what the field means and why one would change it (becomes the CRD description);
- ``minimum`` / ``maximum`` / ``exclusiveMinimum``: numeric bounds (inclusive unless named);
- ``pattern``: a regular expression a string must match;
- ``itemMinimum``: lower bound of every item of a numeric list.

Enumerations are ``Literal`` types (see :func:`enum_values`); optional fields are
``X | None`` with default ``None``; a field without a default is required. Cross-field rules
(``endDay >= startDay``, ``splitIntervalMinutes`` divides a day, ...) live in each class's
``_validate``. Every error is a :class:`SpecError` whose message starts with the field's
full path, e.g. ``spec.data.splitIntervalMinutes: must divide 1440, got 7``.

Names follow PaddleRec's online-training vocabulary (``splitIntervalMinutes``,
``splitsPerPass``, ``embedxThreshold``, ``deleteAfterUnseenDays``, ...) so a PaddleRec user
recognises every knob.
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Literal

from streamtrain_operator.job.fields import (
    SpecError,
    enum_values,
    field_hints,
    parse_dataclass,
)
from streamtrain_operator.job.fields import spec_field as _f
from streamtrain_ps.config import (
    DenseConfig,
    DenseOptimizerConfig,
    SparseOptimizerConfig,
    TableConfig,
)
from streamtrain_ps.sharding import DEFAULT_LOGICAL_SHARDS
from streamtrain_worker.config import ModelConfig
from streamtrain_worker.data.config import DataConfig
from streamtrain_worker.data.errors import DataConfigError

__all__ = [
    "API_VERSION",
    "KIND",
    "Job",
    "JobSpec",
    "SpecError",
    "enum_values",
    "field_hints",
    "load_job",
    "parse_day",
    "parse_job",
    "parse_spec",
]

API_VERSION = "streamtrain.io/v1alpha1"
KIND = "StreamingTrainingJob"
MINUTES_PER_DAY = 24 * 60
DAY_PATTERN = r"^[0-9]{8}$"

DataFormat = Literal["slot", "criteo", "avazu", "libsvm", "csv"]
OnMissing = Literal["keepWaiting", "fail"]
ModelType = Literal["slot_dnn", "wide_deep", "deepfm", "din"]
SparseOptimizerType = Literal["adagrad", "std_adagrad", "adam"]
DenseOptimizerType = Literal["adam", "sgd"]
FolderLayout = Literal["HHMM", "HH"]

# The PS-side defaults, read once so the spec's defaults are the PS's defaults.
_TABLE = TableConfig()
_SPARSE_OPT = SparseOptimizerConfig()
#: The worker's model defaults, for the fields whose default is the worker's own choice.
_MODEL = ModelConfig()
_DENSE_OPT = DenseOptimizerConfig()


def parse_day(value: str, path: str) -> dt.date:
    """``YYYYMMDD`` -> date, with an error naming the field."""
    if not re.fullmatch(DAY_PATTERN, value):
        raise SpecError(path, f"must be a day YYYYMMDD, got {value!r}")
    try:
        return dt.datetime.strptime(value, "%Y%m%d").date()
    except ValueError as exc:
        raise SpecError(path, f"not a calendar day: {value!r}") from exc


@dataclass(frozen=True)
class DataSpec:
    """Where the logs land and how they are cut into passes (ARCHITECTURE.md §3)."""

    path: str = _f(
        doc="Root of the time-sliced logs: <path>/<YYYYMMDD>/<HHMM>/part-*. Any "
        "fsspec URL (local path, s3://...). A relative local path is resolved "
        "against the manifest's directory.",
        minLength=1,
    )
    startDay: str = _f(doc="First day trained, YYYYMMDD.", pattern=DAY_PATTERN)
    endDay: str | None = _f(
        None, "Last day trained (inclusive), YYYYMMDD; omit to run forever.", pattern=DAY_PATTERN
    )
    format: DataFormat = _f("slot", "Line format of the part files.")
    layout: FolderLayout = _f(
        "HHMM", "Folder names inside a day: HHMM (e.g. 0130) or, for hourly splits only, HH."
    )
    splitIntervalMinutes: int = _f(
        60, "Minutes covered by one folder; must divide 1440.", minimum=1, maximum=MINUTES_PER_DAY
    )
    splitsPerPass: int = _f(
        1,
        "Consecutive folders that form one pass; must divide the "
        "folders of a day so every pass is whole.",
        minimum=1,
    )
    donefile: str = _f("_SUCCESS", "File whose presence marks a folder complete.", minLength=1)
    pollSeconds: float = _f(
        60.0, "How often a missing donefile is looked for again.", exclusiveMinimum=0
    )
    missingDeadlineSeconds: float = _f(
        3600.0,
        "A folder still without its donefile this long after the wait for its pass "
        "began raises the DataMissing condition naming it; then onMissing decides.",
        exclusiveMinimum=0,
    )
    onMissing: OnMissing = _f(
        "keepWaiting",
        "Past missingDeadlineSeconds: keepWaiting (the "
        "condition stays until data arrives) or fail the job.",
    )
    maxBadLineFraction: float = _f(
        0.001,
        "A file with a larger fraction of unparsable lines fails the pass, naming the file.",
        minimum=0,
        maximum=1,
    )
    numSlots: int | None = _f(
        None,
        "Slots per example (slot and libsvm formats, unless slots names them); criteo (39) "
        "and avazu (23) are fixed by the format.",
        minimum=1,
    )
    slots: tuple[str, ...] | None = _f(
        None, "slot and libsvm formats: explicit slot names, in order (optional)."
    )
    labelSlot: str = _f("click", "slot format: the slot whose feasign is the click label.")
    columns: dict[str, Any] = _f(
        {},
        "csv only: column (name, or 0-based index without a header) -> slot name, or "
        "{slot, kind: categorical|bucket|multi, separator}; exactly one column maps to "
        "'label'.",
    )
    delimiter: str = _f(",", "csv only: field delimiter (one character).", minLength=1)
    header: bool = _f(True, "csv only: every file starts with a header line.")
    quoteChar: str = _f(
        '"',
        "avazu and csv: quote character of RFC 4180 quoted fields (the delimiter inside "
        "quotes is data, a doubled quote is one literal quote; no newlines inside quotes); "
        "an empty string turns quoting off.",
        pattern="^[ -~]?$",
    )
    fieldMap: str | None = _f(
        None, "libsvm only: URL of a field:value<TAB>index file mapping indices to fields."
    )
    sequenceSlot: int | None = _f(
        None, "DIN only: index of the slot holding the behaviour sequence.", minimum=0
    )

    @property
    def folders_per_day(self) -> int:
        return MINUTES_PER_DAY // self.splitIntervalMinutes

    @property
    def passes_per_day(self) -> int:
        return self.folders_per_day // self.splitsPerPass

    @property
    def start_date(self) -> dt.date:
        return parse_day(self.startDay, "spec.data.startDay")

    @property
    def end_date(self) -> dt.date | None:
        return None if self.endDay is None else parse_day(self.endDay, "spec.data.endDay")

    def _validate(self, path: str) -> None:
        if MINUTES_PER_DAY % self.splitIntervalMinutes:
            raise SpecError(
                f"{path}.splitIntervalMinutes", f"must divide 1440, got {self.splitIntervalMinutes}"
            )
        if self.folders_per_day % self.splitsPerPass:
            raise SpecError(
                f"{path}.splitsPerPass",
                f"must divide the {self.folders_per_day} folders of a day, "
                f"got {self.splitsPerPass}",
            )
        if self.layout == "HH" and self.splitIntervalMinutes % 60:
            raise SpecError(
                f"{path}.layout", "HH folders need splitIntervalMinutes to be a multiple of 60"
            )
        start = parse_day(self.startDay, f"{path}.startDay")
        if self.endDay is not None and parse_day(self.endDay, f"{path}.endDay") < start:
            raise SpecError(
                f"{path}.endDay", f"must be >= startDay {self.startDay}, got {self.endDay}"
            )
        # Format options are the data layer's to judge: one parser, same messages.
        try:
            self.data_config(path)
        except DataConfigError as exc:
            field_path = str(exc).split(":", 1)[0]
            raise SpecError(field_path, str(exc).split(":", 1)[1].strip()) from exc

    def data_config(self, path: str = "spec.data") -> DataConfig:
        """This section as the worker's ``DataConfig`` (same field names, every field)."""
        return DataConfig.from_dict(
            {
                f.name: list(v) if isinstance(v := getattr(self, f.name), tuple) else v
                for f in fields(self)
            },
            path,
        )


@dataclass(frozen=True)
class ModelSpec:
    """The network on top of the PS-backed embedding."""

    type: ModelType = _f("slot_dnn", "Model from the worker's model zoo.")
    embeddingDim: int = _f(
        8, "embedx width per key (the PS table's embedxDim).", minimum=1, maximum=1024
    )
    hiddenUnits: tuple[int, ...] = _f((512, 256, 128), "MLP hidden layer widths.", itemMinimum=1)
    batchSize: int = _f(64, "Examples per mini-batch.", minimum=1)
    cvm: bool = _f(
        True, "Add PaddlePaddle's continuous value model inputs (log show, log CTR) per slot."
    )
    denseSyncSteps: int = _f(10, "Pull dense parameters from the PS every K steps.", minimum=1)
    normalizeEmbeddings: bool = _f(
        True,
        "slot_dnn only: normalise the embedding columns of the MLP input too. false: "
        "only the CVM columns (embeddings raw, as plain PyTorch): +0.01 AUC on the Criteo "
        "bench, slower learning on tiny streams.",
    )
    summaryDecayRate: float = _f(
        _MODEL.summaryDecayRate,
        "Data norm (slot_dnn and din input normalisation, PaddlePaddle's data_norm): its "
        "statistics are summed on the PS over all workers, decayed by this factor at every "
        "push. 1 never forgets; lower follows drifting inputs faster.",
        exclusiveMinimum=0,
        maximum=1,
    )
    dataNormPrior: float = _f(
        _MODEL.dataNormPrior,
        "Data norm: the CVM columns' statistics start as this many pseudo-examples of mean "
        "0, variance 1 (the embedding columns' as one).",
        exclusiveMinimum=0,
    )
    targetSlot: int = _f(0, "DIN only: the slot holding the target item.", minimum=0)
    attentionUnits: tuple[int, ...] = _f((64, 32), "DIN only: attention MLP widths.", itemMinimum=1)


@dataclass(frozen=True)
class SparseOptimizerSpec:
    """Update rule of the sparse table (ARCHITECTURE.md §4)."""

    type: SparseOptimizerType = _f(
        _SPARSE_OPT.type, "adagrad (one accumulator per part), std_adagrad (per dimension) or adam."
    )
    learningRate: float = _f(_SPARSE_OPT.learningRate, "Step size.", exclusiveMinimum=0)
    initialG2sum: float = _f(_SPARSE_OPT.initialG2sum, "AdaGrad's G0.", exclusiveMinimum=0)
    initialRange: float = _f(
        _SPARSE_OPT.initialRange, "embedx starts uniform in +-initialRange.", minimum=0
    )
    weightBounds: tuple[float, float] = _f(
        _SPARSE_OPT.weightBounds, "[low, high] clip of every weight."
    )
    beta1: float = _f(_SPARSE_OPT.beta1, "Adam only.", minimum=0, exclusiveMaximum=1)
    beta2: float = _f(_SPARSE_OPT.beta2, "Adam only.", minimum=0, exclusiveMaximum=1)
    epsilon: float = _f(_SPARSE_OPT.epsilon, "Adam only.", exclusiveMinimum=0)

    def _validate(self, path: str) -> None:
        lo, hi = self.weightBounds
        if not lo < hi:
            raise SpecError(
                f"{path}.weightBounds",
                f"must be [low, high] with low < high, got {self.weightBounds}",
            )


@dataclass(frozen=True)
class SparseSpec:
    """The sparse table with the CTR accessor (ARCHITECTURE.md §4)."""

    embedxThreshold: float = _f(
        _TABLE.embedxThreshold, "embedx is admitted once a key's score reaches this.", minimum=0
    )
    nonclkCoeff: float = _f(_TABLE.nonclkCoeff, "Score weight of a non-click show.", minimum=0)
    clickCoeff: float = _f(_TABLE.clickCoeff, "Score weight of a click.", minimum=0)
    showClickDecayRate: float = _f(
        _TABLE.showClickDecayRate,
        "Daily shrink multiplies show and click by this.",
        exclusiveMinimum=0,
        maximum=1,
    )
    deleteThreshold: float = _f(
        _TABLE.deleteThreshold, "Shrink deletes keys whose score is below this.", minimum=0
    )
    deleteAfterUnseenDays: int = _f(
        _TABLE.deleteAfterUnseenDays,
        "Shrink deletes keys unseen for more days than this.",
        minimum=0,
    )
    baseThreshold: float = _f(
        _TABLE.baseThreshold, "Inference exports keep keys whose score reaches this.", minimum=0
    )
    deltaThreshold: float = _f(
        _TABLE.deltaThreshold,
        "A delta export keeps keys whose score grew by this since the last export.",
        minimum=0,
    )
    deltaKeepDays: int = _f(
        _TABLE.deltaKeepDays,
        "Inference exports drop keys unseen for more days than this.",
        minimum=0,
    )
    optimizer: SparseOptimizerSpec = _f(SparseOptimizerSpec, "Sparse update rule.")

    def table_config(self, embedding_dim: int, name: str = "embedding") -> TableConfig:
        """This section as the PS's ``TableConfig`` (same field names)."""
        o = self.optimizer
        return TableConfig(
            name=name,
            embedxDim=embedding_dim,
            embedxThreshold=self.embedxThreshold,
            nonclkCoeff=self.nonclkCoeff,
            clickCoeff=self.clickCoeff,
            showClickDecayRate=self.showClickDecayRate,
            deleteThreshold=self.deleteThreshold,
            deleteAfterUnseenDays=self.deleteAfterUnseenDays,
            baseThreshold=self.baseThreshold,
            deltaThreshold=self.deltaThreshold,
            deltaKeepDays=self.deltaKeepDays,
            optimizer=SparseOptimizerConfig(
                type=o.type,
                learningRate=o.learningRate,
                initialG2sum=o.initialG2sum,
                initialRange=o.initialRange,
                weightBounds=o.weightBounds,
                beta1=o.beta1,
                beta2=o.beta2,
                epsilon=o.epsilon,
            ),
        )


@dataclass(frozen=True)
class DenseOptimizerSpec:
    """Update rule of the dense parameters held by the PS."""

    type: DenseOptimizerType = _f(_DENSE_OPT.type, "adam or sgd.")
    learningRate: float = _f(_DENSE_OPT.learningRate, "Step size.", exclusiveMinimum=0)
    beta1: float = _f(_DENSE_OPT.beta1, "Adam only.", minimum=0, exclusiveMaximum=1)
    beta2: float = _f(_DENSE_OPT.beta2, "Adam only.", minimum=0, exclusiveMaximum=1)
    epsilon: float = _f(_DENSE_OPT.epsilon, "Adam only.", exclusiveMinimum=0)


@dataclass(frozen=True)
class DenseSpec:
    """Dense parameters (the MLP), stored and updated on the PS."""

    optimizer: DenseOptimizerSpec = _f(DenseOptimizerSpec, "Dense update rule.")

    def dense_config(self) -> DenseConfig:
        o = self.optimizer
        return DenseConfig(
            optimizer=DenseOptimizerConfig(
                type=o.type,
                learningRate=o.learningRate,
                beta1=o.beta1,
                beta2=o.beta2,
                epsilon=o.epsilon,
            )
        )


@dataclass(frozen=True)
class ResourcesSpec:
    """Kubernetes container resources (quantities as strings: "4", "32Gi")."""

    requests: dict[str, str] = _f({}, "Resource requests, e.g. {cpu: '4', memory: 32Gi}.")
    limits: dict[str, str] = _f({}, "Resource limits.")


@dataclass(frozen=True)
class PSSpec:
    """The parameter-server shards."""

    replicas: int = _f(
        1,
        "PS shard processes (pods). A checkpoint written by N shards loads into M.",
        minimum=1,
        maximum=1024,
    )
    logicalShards: int = _f(
        DEFAULT_LOGICAL_SHARDS,
        "Fixed key-routing granularity for the "
        "life of the model; replicas can change, this cannot.",
        minimum=1,
    )
    resources: ResourcesSpec = _f(ResourcesSpec, "Per-shard container resources.")


@dataclass(frozen=True)
class WorkersSpec:
    """The training workers."""

    replicas: int = _f(
        1,
        "Worker processes (pods); each pass's files are split among them.",
        minimum=1,
        maximum=4096,
    )
    numThreads: int = _f(1, "torch intra-op threads per worker.", minimum=1)
    overlap: bool = _f(
        True,
        "Overlap PS pulls and pushes with compute (faster). false: every pull and push in "
        "order, so the same seed and data give a bitwise identical model.",
    )
    passRetries: int = _f(
        2,
        "Times a worker's share of a pass is retried after an error before the job fails.",
        minimum=0,
    )
    passTimeoutSeconds: float | None = _f(
        None,
        "A worker share running longer than this counts as an error; omit for no limit.",
        exclusiveMinimum=0,
    )
    resources: ResourcesSpec = _f(ResourcesSpec, "Per-worker container resources.")


@dataclass(frozen=True)
class CheckpointSpec:
    """Checkpoints (save mode 0: all keys, all state, dense parameters)."""

    path: str = _f(
        doc="Checkpoint root (fsspec URL): <path>/<day>/pass-<pass>-g<generation>/.", minLength=1
    )
    everyPasses: int = _f(
        6,
        "Checkpoint after every N-th pass of a day (and always at day "
        "end). A restart replays the passes after the last checkpoint.",
        minimum=1,
    )
    keep: int = _f(3, "Published checkpoints kept; older ones are deleted.", minimum=1)


@dataclass(frozen=True)
class ExportSpec:
    """Inference models for serving (ARCHITECTURE.md §6)."""

    path: str = _f(
        doc="Export root (fsspec URL): <path>/<day>/base/ and "
        "<path>/<day>/delta-<pass>/, listed in <path>/donefile.txt.",
        minLength=1,
    )
    deltaEveryPasses: int = _f(
        1, "Publish a delta model after every N-th pass of a day; 0 disables deltas.", minimum=0
    )
    base: bool = _f(True, "Publish a base model at every day end (for the next day).")
    batchModel: bool = _f(
        True,
        "Write the batch model (save mode 3, all keys) at every day "
        "end; it also ages every key's unseen_days, so turning it off "
        "disables unseen-days eviction.",
    )
    retries: int = _f(
        5,
        "Storage errors during an export are retried this many times with exponential backoff.",
        minimum=0,
    )
    retryBackoffSeconds: float = _f(1.0, "First retry delay; doubles each attempt.", minimum=0)


@dataclass(frozen=True)
class JobSpec:
    """``spec`` of a StreamingTrainingJob."""

    data: DataSpec = _f(doc="Input logs and pass layout.")
    checkpoint: CheckpointSpec = _f(doc="Checkpoints.")
    export: ExportSpec = _f(doc="Inference models.")
    image: str = _f("streamtrain-worker:0.1.0", "Worker image.")
    psImage: str = _f("streamtrain-ps:0.1.0", "PS image (no torch).")
    model: ModelSpec = _f(ModelSpec, "The network.")
    sparse: SparseSpec = _f(SparseSpec, "The sparse table.")
    dense: DenseSpec = _f(DenseSpec, "The dense parameters.")
    ps: PSSpec = _f(PSSpec, "Parameter-server shards.")
    workers: WorkersSpec = _f(WorkersSpec, "Training workers.")
    storageSecretRef: str | None = _f(
        None,
        "Secret with storage credentials (e.g. "
        "AWS_ACCESS_KEY_ID), mounted as environment; never "
        "inline.",
    )
    suspend: bool = _f(
        False, "Stop after the current pass and scale to zero; resuming loads the last checkpoint."
    )
    seed: int = _f(0, "Seeds every random initialisation; same seed, same model.", minimum=0)

    def _validate(self, path: str) -> None:
        # A URL's user:password@ would be copied into the rendered ConfigMap, the status,
        # events and logs; credentials belong in the Secret of storageSecretRef.
        for name, url in (
            ("data.path", self.data.path),
            ("checkpoint.path", self.checkpoint.path),
            ("export.path", self.export.path),
        ):
            if _URL_PASSWORD.match(url):
                raise SpecError(
                    f"{path}.{name}",
                    "must not embed credentials (user:password@host); put them in the "
                    "Secret named by storageSecretRef",
                )


#: scheme://user:password@ — a URL carrying a secret in its userinfo.
_URL_PASSWORD = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://[^/@?#]*:[^/@?#]*@")


@dataclass(frozen=True)
class Job:
    """A whole manifest: identity plus the parsed spec."""

    name: str
    namespace: str
    spec: JobSpec


# ----------------------------------------------------------------------------- parsing


def parse_spec(data: Any, path: str = "spec") -> JobSpec:
    """Parse ``spec`` of a StreamingTrainingJob (a JSON/YAML mapping)."""
    result: JobSpec = parse_dataclass(JobSpec, data, path)
    return result


def parse_job(manifest: Any, base_dir: Path | None = None) -> Job:
    """Parse a whole manifest; relative local paths are resolved against ``base_dir``."""
    if not isinstance(manifest, Mapping):
        raise SpecError("manifest", f"must be an object, got {type(manifest).__name__}")
    if manifest.get("apiVersion") != API_VERSION:
        raise SpecError("apiVersion", f"must be {API_VERSION}, got {manifest.get('apiVersion')!r}")
    if manifest.get("kind") != KIND:
        raise SpecError("kind", f"must be {KIND}, got {manifest.get('kind')!r}")
    meta = manifest.get("metadata")
    if not isinstance(meta, Mapping):
        raise SpecError("metadata", "must be an object with a name")
    name = meta.get("name")
    if not isinstance(name, str) or not re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", name):
        raise SpecError("metadata.name", f"must be a DNS label, got {name!r}")
    namespace = meta.get("namespace", "default")
    if not isinstance(namespace, str):
        raise SpecError("metadata.namespace", f"must be a string, got {namespace!r}")
    spec = parse_spec(manifest.get("spec"), "spec")
    if base_dir is not None:
        spec = _resolve_paths(spec, base_dir)
    return Job(name=name, namespace=namespace, spec=spec)


def load_job(path: str | Path) -> Job:
    """Read and parse a YAML manifest file."""
    import yaml  # yaml is only needed when reading files

    p = Path(path)
    try:
        manifest = yaml.safe_load(p.read_text())
    except yaml.YAMLError as exc:
        raise SpecError(str(p), f"not valid YAML: {exc}") from exc
    return parse_job(manifest, base_dir=p.resolve().parent)


def is_local_path(url: str) -> bool:
    return "://" not in url or url.startswith("file://")


def _resolve_paths(spec: JobSpec, base_dir: Path) -> JobSpec:
    from dataclasses import replace

    def fix(url: str) -> str:
        if "://" in url or Path(url).is_absolute():
            return url
        return str((base_dir / url).resolve())

    return replace(
        spec,
        data=replace(spec.data, path=fix(spec.data.path)),
        checkpoint=replace(spec.checkpoint, path=fix(spec.checkpoint.path)),
        export=replace(spec.export, path=fix(spec.export.path)),
    )
