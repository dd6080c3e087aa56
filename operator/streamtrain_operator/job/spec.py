"""The ``StreamingTrainingJob`` manifest, parsed once into frozen, typed dataclasses.

The job spec is *composed*: each package declares the sections it owns with
:func:`streamtrain_ps.plumbing.settings.setting` (one declaration per setting: type, default,
bounds, doc) and this module puts them together —

- ``spec.sparse`` and ``spec.dense``: the PS's :class:`~streamtrain_ps.config.SparseConfig`
  and :class:`~streamtrain_ps.config.DenseConfig`;
- ``spec.model``: the worker's :class:`~streamtrain_worker.config.ModelConfig`;
- ``spec.data``: the worker's :class:`~streamtrain_worker.data.config.DataConfig`, with
  ``path`` and ``startDay`` required (:class:`DataSpec`);
- ``spec.ps``, ``spec.workers``, ``spec.checkpoint``, ``spec.export`` and the top-level
  fields: the operator's own, declared here (a field that means a component's setting, such
  as ``seed`` or ``workers.numThreads``, copies that declaration with ``same_as``).

The CRD schema (``crds/``) and ``docs/crd-reference.md`` are generated from these
declarations (``streamtrain_tools.crdgen``); the local runner and the Kubernetes operator
both parse manifests with :func:`parse_job`, the one parser
(:func:`streamtrain_ps.plumbing.settings.parse`) that the PS and the workers use for the JSON
:mod:`streamtrain_operator.job.render` gives them. Every error is a :class:`SpecError`
whose ``path`` is the field's full path, e.g. ``spec.data.splitIntervalMinutes``.

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
from typing import Any

from streamtrain_ps.config import DenseConfig, PSConfig, SparseConfig
from streamtrain_ps.plumbing.settings import (
    ConfigError,
    enum_values,
    field_hints,
    parse,
    same_as,
    setting,
)
from streamtrain_worker.config import ModelConfig, RuntimeConfig
from streamtrain_worker.data import timeslices
from streamtrain_worker.data.config import DAY_PATTERN, MINUTES_PER_DAY, DataConfig
from streamtrain_worker.data.errors import LayoutError

__all__ = [
    "API_VERSION",
    "KIND",
    "Job",
    "JobSpec",
    "ManifestSyntaxError",
    "SpecError",
    "enum_values",
    "field_hints",
    "load_job",
    "manifest_syntax_error",
    "parse_day",
    "parse_job",
    "parse_spec",
]

API_VERSION = "streamtrain.io/v1alpha1"
KIND = "StreamingTrainingJob"


class SpecError(ConfigError):
    """The manifest is invalid; ``path`` is the offending field's path."""


def parse_day(value: str, path: str) -> dt.date:
    """``YYYYMMDD`` -> date, with an error naming the field."""
    if not re.fullmatch(DAY_PATTERN, value):
        raise SpecError(path, f"must be a day YYYYMMDD, got {value!r}")
    try:
        return timeslices.parse_day(value)
    except LayoutError as exc:
        raise SpecError(path, f"not a calendar day: {value!r}") from exc


@dataclass(frozen=True)
class DataSpec(DataConfig):
    """Where the logs land and how they are cut into passes (docs/design.md §3).

    The worker's data section, with the two fields a job cannot do without required.
    """

    path: str = same_as(DataConfig, "path", required=True)
    startDay: str = same_as(DataConfig, "startDay", required=True)

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

    def data_config(self) -> DataConfig:
        """This section as the worker's ``DataConfig`` (every field)."""
        return DataConfig(**{f.name: getattr(self, f.name) for f in fields(DataConfig)})


@dataclass(frozen=True)
class ResourcesSpec:
    """Kubernetes container resources (quantities as strings: "4", "32Gi")."""

    requests: dict[str, str] = setting({}, "Resource requests, e.g. {cpu: '4', memory: 32Gi}.")
    limits: dict[str, str] = setting({}, "Resource limits.")


@dataclass(frozen=True)
class PSSpec:
    """The parameter-server shards."""

    replicas: int = setting(
        1,
        "PS shard processes (pods). A checkpoint written by N shards loads into M.",
        minimum=1,
        maximum=1024,
    )
    logicalShards: int = same_as(PSConfig, "logicalShards")
    resources: ResourcesSpec = setting(ResourcesSpec, "Per-shard container resources.")
    memoryLimit: int | None = same_as(
        PSConfig,
        "memoryLimit",
        doc="Bytes of RAM per shard process (its RSS; the process's measured fixed overhead, "
        "the disk tier's cache and a scratch reserve come out of it, the rest holds "
        "tables); past it the coldest keys move to the disk "
        "tier. Omitted: resources.limits.memory minus headroom for gRPC buffers and the "
        "process (a quarter of it, at least 2 x 256 MiB), or unlimited without a limit. "
        "0: unlimited.",
    )
    diskLimit: int = same_as(PSConfig, "diskLimit")
    diskStorageClass: str = setting(
        "",
        "StorageClass of the disk tier's volume on Kubernetes: a generic ephemeral volume, one "
        "PersistentVolumeClaim per PS pod created and deleted with the pod, sized diskLimit "
        "plus a quarter for RocksDB's compactions (at least 256 MiB). Empty: an emptyDir "
        "(the node's disk) with that sizeLimit. Needs diskLimit > 0. A shard gets a disk "
        "tier volume whenever it has a memory limit or a diskLimit.",
    )

    def _validate(self, path: str) -> None:
        if self.diskStorageClass and not self.diskLimit:
            raise SpecError(
                f"{path}.diskStorageClass",
                "needs diskLimit > 0: the volume is sized from it (diskLimit plus headroom)",
            )


@dataclass(frozen=True)
class WorkersSpec:
    """The training workers."""

    replicas: int = setting(
        1,
        "Worker processes (pods); each pass's files are split among them.",
        minimum=1,
        maximum=4096,
    )
    numThreads: int = same_as(RuntimeConfig, "numThreads")
    overlap: bool = same_as(RuntimeConfig, "overlap")
    # Every runtime setting that changes what a worker learns (how stale its pulls may be,
    # how its first batches and queued pushes are applied) is the job's to set.
    prefetchBatches: int = same_as(RuntimeConfig, "prefetchBatches")
    pushQueueDepth: int = same_as(RuntimeConfig, "pushQueueDepth")
    inOrderExamples: int = same_as(RuntimeConfig, "inOrderExamples")
    maxMergedPushes: int = same_as(RuntimeConfig, "maxMergedPushes")
    passRetries: int = setting(
        2,
        "Times a worker's share of a pass is retried after an error before the job fails.",
        minimum=0,
    )
    passTimeoutSeconds: float | None = setting(
        None,
        "A worker share running longer than this counts as an error; omit for no limit.",
        exclusive_minimum=0,
    )
    resources: ResourcesSpec = setting(ResourcesSpec, "Per-worker container resources.")


@dataclass(frozen=True)
class CheckpointSpec:
    """Checkpoints (save mode 0: all keys, all state, dense parameters)."""

    path: str = setting(
        doc="Checkpoint root (fsspec URL): <path>/<day>/pass-<pass>-g<generation>/.", min_length=1
    )
    everyPasses: int = setting(
        6,
        "Checkpoint after every N-th pass of a day (and always at day "
        "end). A restart replays the passes after the last checkpoint.",
        minimum=1,
    )
    keep: int = setting(3, "Published checkpoints kept; older ones are deleted.", minimum=1)
    besideTraining: bool = setting(
        False,
        "Write a checkpoint's files while the next pass trains: every PS shard copies "
        "its rows and dense vectors into memory at the pass boundary (its memory doubles "
        "until they are written) and the checkpoint is recorded once published. Off: the "
        "workers wait for each checkpoint. Needs PS shards without a memory limit.",
    )


@dataclass(frozen=True)
class ExportSpec:
    """Inference models for serving (docs/design.md §6)."""

    path: str = setting(
        doc="Export root (fsspec URL): <path>/<day>/base/ and "
        "<path>/<day>/delta-<pass>/, listed in <path>/donefile.txt.",
        min_length=1,
    )
    deltaEveryPasses: int = setting(
        1, "Publish a delta model after every N-th pass of a day; 0 disables deltas.", minimum=0
    )
    base: bool = setting(
        True,
        "Publish a base model at every day end (for the next day). Without one, a delta's "
        "serving chain reaches back to the job's first delta.",
    )
    batchModel: bool = setting(
        True,
        "Write the batch model (save mode 3, all keys) at every day "
        "end; it also ages every key's unseen_days, so turning it off "
        "disables unseen-days eviction.",
    )
    retries: int = setting(
        5,
        "Storage errors during an export are retried this many times with exponential backoff.",
        minimum=0,
    )
    retryBackoffSeconds: float = setting(1.0, "First retry delay; doubles each attempt.", minimum=0)


@dataclass(frozen=True)
class JobSpec:
    """``spec`` of a StreamingTrainingJob."""

    data: DataSpec = setting(doc="Input logs and pass layout.")
    checkpoint: CheckpointSpec = setting(doc="Checkpoints.")
    export: ExportSpec = setting(doc="Inference models.")
    image: str = setting("streamtrain-worker:0.1.0", "Worker image.")
    psImage: str = setting("streamtrain-ps:0.1.0", "PS image (no torch).")
    model: ModelConfig = setting(ModelConfig, "The network.")
    sparse: SparseConfig = setting(SparseConfig, "The sparse table.")
    dense: DenseConfig = setting(DenseConfig, "The dense parameters.")
    ps: PSSpec = setting(PSSpec, "Parameter-server shards.")
    workers: WorkersSpec = setting(WorkersSpec, "Training workers.")
    storageSecretRef: str | None = setting(
        None,
        "Secret with storage credentials (e.g. "
        "AWS_ACCESS_KEY_ID), mounted as environment; never "
        "inline.",
    )
    suspend: bool = setting(
        False, "Stop after the current pass and scale to zero; resuming loads the last checkpoint."
    )
    seed: int = same_as(PSConfig, "seed")

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
        capped = self.ps.memoryLimit or self.ps.resources.limits.get("memory")
        if self.checkpoint.besideTraining and capped:
            raise SpecError(
                f"{path}.checkpoint.besideTraining",
                "needs PS shards without a memory limit (spec.ps.memoryLimit and "
                "spec.ps.resources.limits.memory unset): the copy of every row held until "
                "the checkpoint is written is outside a capped shard's budget, and its disk "
                "tier's rows would be copied into memory; turn it off or remove the limit",
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
    return parse(JobSpec, data, path, error=SpecError)


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
        raise manifest_syntax_error(p, exc) from exc
    return parse_job(manifest, base_dir=p.resolve().parent)


class ManifestSyntaxError(SpecError):
    """The manifest file is not YAML; ``path`` is ``FILE:LINE:COLUMN`` (1-based) where the
    parser stopped, so ``str()`` names the file once, as editors and compilers do."""


def manifest_syntax_error(path: str | Path, exc: Exception) -> ManifestSyntaxError:
    """PyYAML's error for the file at ``path``, as a :class:`ManifestSyntaxError`."""
    return ManifestSyntaxError(f"{path}{_yaml_position(exc)}", _yaml_problem(exc))


def _yaml_position(exc: Exception) -> str:
    mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
    return "" if mark is None else f":{mark.line + 1}:{mark.column + 1}"


def _yaml_problem(exc: Exception) -> str:
    """PyYAML's problem and context, without its ``in "<unicode string>"`` lines."""
    problem = getattr(exc, "problem", None) or str(exc)
    context = getattr(exc, "context", None)
    return f"not valid YAML: {problem}" + (f" ({context})" if context else "")


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
