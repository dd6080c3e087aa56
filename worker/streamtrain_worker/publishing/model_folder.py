"""The published model folder: ``donefile.txt`` and each model's ``MODEL.json``.

Layout under an export root (any fsspec URL)::

    <root>/donefile.txt                  one JSON line per published model, in order
    <root>/<day>/delta-<pass>/MODEL.json the model's manifest, written after its parts
    <root>/<day>/delta-<pass>/sparse/    PS save (its own MANIFEST.json, streamtrain_ps)
    <root>/<day>/delta-<pass>/dense/     dense.pt + dense.json (publishing.export)
    <root>/<day>/base/                   the base published at the end of <day - 1>
    <root>/<day>/batch/                  the day's batch model

A model exists for readers once its donefile line exists; the line names the manifest, and
the manifest lists every file of the model with size and sha256. The operator writes this
folder (``streamtrain_operator.run.export``), the predictor reads it
(``streamtrain_worker.publishing.predict``); this module is the one place that knows the file names,
the key shapes, the line and manifest fields, and how to check them. Bad input raises
``ModelFormatError`` naming the file (and the donefile line).

Pure: no torch, and no storage library — the readers take the filesystem (an fsspec
filesystem, or anything with ``exists`` and ``cat_file``) from their caller, so the job
model (which builds model keys) and the torch-free operator both import it.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Protocol, TypeVar

DONEFILE = "donefile.txt"
MODEL_MANIFEST = "MODEL.json"
FORMAT = "streamtrain-model"
FORMAT_VERSION = 1

_DAY = re.compile(r"[0-9]{8}")
T = TypeVar("T")


class ModelFormatError(ValueError):
    """A donefile line or ``MODEL.json`` that breaks the format (the message names where)."""


class ModelKind(StrEnum):
    DELTA = "delta"  # the keys changed since the last delta, plus tombstones (save mode 1)
    BASE = "base"  # every key, the starting point of the next day's deltas (mode 2)
    BATCH = "batch"  # every key, the day's batch model (mode 3)


def model_key(kind: ModelKind, day: str, pass_index: int = 0) -> str:
    """The folder of a model relative to the export root: ``<day>/delta-<pass>``,
    ``<day>/base`` or ``<day>/batch`` (``pass_index`` only names a delta)."""
    if kind is ModelKind.DELTA:
        return f"{day}/delta-{pass_index}"
    return f"{day}/{kind.value}"


class Files(Protocol):
    """The two filesystem calls the readers make (an fsspec filesystem has both)."""

    def exists(self, path: str) -> bool: ...

    def cat_file(self, path: str) -> bytes: ...


# -- field checks ---------------------------------------------------------------------------


def _get(data: Mapping[str, Any], name: str, kind: type[T] | tuple[type, ...], where: str) -> T:
    if name not in data:
        raise ModelFormatError(f"{where}: field {name!r} is missing")
    value = data[name]
    if isinstance(value, bool) or not isinstance(value, kind):
        raise ModelFormatError(f"{where}: field {name!r} has the wrong type: {value!r}")
    return value  # type: ignore[return-value]


def _number(data: Mapping[str, Any], name: str, where: str) -> float:
    value: float = _get(data, name, (int, float), where)
    if not math.isfinite(value):
        raise ModelFormatError(f"{where}: field {name!r} is not a finite number: {value!r}")
    return float(value)


def _count(data: Mapping[str, Any], name: str, where: str) -> int:
    value: int = _get(data, name, int, where)
    if value < 0:
        raise ModelFormatError(f"{where}: field {name!r} is negative: {value}")
    return value


def _kind(data: Mapping[str, Any], where: str) -> ModelKind:
    value: str = _get(data, "kind", str, where)
    try:
        return ModelKind(value)
    except ValueError:
        kinds = ", ".join(k.value for k in ModelKind)
        raise ModelFormatError(f"{where}: field 'kind' is {value!r}, not one of {kinds}") from None


def _day(data: Mapping[str, Any], where: str) -> str:
    value: str = _get(data, "day", str, where)
    if not _DAY.fullmatch(value):
        raise ModelFormatError(f"{where}: field 'day' is {value!r}, not YYYYMMDD")
    return value


def _relative(value: str, name: str, where: str) -> str:
    """A path below the export root or model folder: no way out of it."""
    parts = value.split("/")
    if not value or value.startswith("/") or any(p in ("", ".", "..") for p in parts):
        raise ModelFormatError(f"{where}: field {name!r} is not a relative path: {value!r}")
    return value


def _base(data: Mapping[str, Any], where: str) -> str | None:
    if data.get("base") is None:
        if "base" not in data:
            raise ModelFormatError(f"{where}: field 'base' is missing")
        return None
    return _relative(_get(data, "base", str, where), "base", where)


def _json_object(text: str | bytes, where: str) -> dict[str, Any]:
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise ModelFormatError(f"{where}: not JSON: {exc}") from None
    if not isinstance(data, dict):
        raise ModelFormatError(f"{where}: not a JSON object")
    return data


# -- donefile.txt ---------------------------------------------------------------------------


@dataclass(frozen=True)
class DoneLine:
    """One published model, as listed in the donefile."""

    key: str  # "20261101/delta-3", relative to the export root
    kind: ModelKind
    day: str  # the day whose passes the model holds (a base lives under the next day)
    pass_index: int
    #: Key of the base a delta applies to; ``None``: no base, the delta applies to every
    #: delta without a base before it (the job's first day, or ``export.base: false``).
    base: str | None
    published_at: float

    def render(self) -> str:
        """The line, without its newline."""
        return json.dumps(
            {
                "key": self.key,
                "kind": self.kind.value,
                "day": self.day,
                "pass": self.pass_index,
                "base": self.base,
                "manifest": f"{self.key}/{MODEL_MANIFEST}",
                "publishedAt": self.published_at,
            },
            sort_keys=True,
        )

    @classmethod
    def parse(cls, text: str, where: str) -> DoneLine:
        """One line; ``where`` (``<file>:<line>``) prefixes every error."""
        d = _json_object(text, where)
        key = _relative(_get(d, "key", str, where), "key", where)
        manifest = _get(d, "manifest", str, where)
        if manifest != f"{key}/{MODEL_MANIFEST}":
            raise ModelFormatError(
                f"{where}: field 'manifest' is {manifest!r}, expected '{key}/{MODEL_MANIFEST}'"
            )
        return cls(
            key=key,
            kind=_kind(d, where),
            day=_day(d, where),
            pass_index=_count(d, "pass", where),
            base=_base(d, where),
            published_at=_number(d, "publishedAt", where),
        )


def parse_donefile(text: str, path: str) -> list[DoneLine]:
    """Every line of a donefile (blank lines skipped), oldest first; errors name
    ``path:line``. A key listed twice is an error: a model is published once."""
    lines: list[DoneLine] = []
    seen: set[str] = set()
    for number, raw in enumerate(text.splitlines(), start=1):
        if not raw.strip():
            continue
        line = DoneLine.parse(raw, f"{path}:{number}")
        if line.key in seen:
            raise ModelFormatError(f"{path}:{number}: model {line.key!r} is listed twice")
        seen.add(line.key)
        lines.append(line)
    return lines


def with_line(text: str, line: DoneLine, path: str) -> str | None:
    """The donefile ``text`` with ``line`` appended; ``None`` when its key is already listed
    (so a redone publication writes nothing)."""
    if any(d.key == line.key for d in parse_donefile(text, path)):
        return None
    return text + line.render() + "\n"


def read_donefile(fs: Files, root: str) -> list[DoneLine]:
    """The donefile below ``root`` (a path on ``fs``); none yet: an empty list."""
    path = f"{root.rstrip('/')}/{DONEFILE}"
    if not fs.exists(path):
        return []
    return parse_donefile(fs.cat_file(path).decode(), path)


# -- MODEL.json -----------------------------------------------------------------------------


@dataclass(frozen=True)
class ModelFile:
    """One file of a model, relative to its folder, as checked by readers."""

    path: str
    size: int
    sha256: str
    rows: int | None = None  # sparse parts: the rows they hold

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"path": self.path, "size": self.size, "sha256": self.sha256}
        if self.rows is not None:
            d["rows"] = self.rows
        return d

    @classmethod
    def from_dict(cls, d: Any, where: str) -> ModelFile:
        if not isinstance(d, dict):
            raise ModelFormatError(f"{where}: not a JSON object")
        digest: str = _get(d, "sha256", str, where)
        if not re.fullmatch(r"[0-9a-f]{64}", digest):
            raise ModelFormatError(f"{where}: field 'sha256' is not a sha256 digest: {digest!r}")
        rows = _count(d, "rows", where) if "rows" in d else None
        path = _relative(_get(d, "path", str, where), "path", where)
        return cls(path, _count(d, "size", where), digest, rows)

    @classmethod
    def of(cls, path: str, data: bytes, rows: int | None = None) -> ModelFile:
        """The entry for ``data`` stored at ``path``."""
        return cls(path, len(data), hashlib.sha256(data).hexdigest(), rows)

    def check(self, data: bytes, where: str) -> None:
        """Raise unless ``data`` (read from ``where``) is this file, byte for byte."""
        if len(data) != self.size or hashlib.sha256(data).hexdigest() != self.sha256:
            raise ModelFormatError(f"{where}: size or checksum mismatch")


@dataclass(frozen=True)
class Serving:
    """What a reader needs to score examples exactly as training read them."""

    data: dict[str, Any]  # the data config (streamtrain_worker.data.config.DataConfig)
    table: str  # the sparse table of the PS save
    num_buckets: int  # AUC histogram resolution (same buckets, same AUC)
    model: str  # the model type


@dataclass(frozen=True)
class ModelManifest:
    """A model's ``MODEL.json``: what it is, its pass metrics, and every file it holds."""

    key: str
    kind: ModelKind
    day: str
    pass_index: int
    base: str | None
    save_mode: int  # streamtrain_ps.api.SaveMode of the sparse part
    keys: int
    tombstones: int
    metrics: dict[str, float]
    files: tuple[ModelFile, ...]
    serving: Serving | None = field(default=None)

    def render(self) -> bytes:
        d: dict[str, Any] = {
            "format": FORMAT,
            "version": FORMAT_VERSION,
            "key": self.key,
            "kind": self.kind.value,
            "day": self.day,
            "pass": self.pass_index,
            "base": self.base,
            "saveMode": self.save_mode,
            "keys": self.keys,
            "tombstones": self.tombstones,
            "metrics": dict(self.metrics),
            "files": [f.to_dict() for f in self.files],
        }
        if self.serving is not None:
            s = self.serving
            d.update(data=s.data, table=s.table, numBuckets=s.num_buckets, model=s.model)
        return json.dumps(d, indent=1, sort_keys=True).encode()

    @classmethod
    def parse(cls, data: str | bytes, path: str) -> ModelManifest:
        """A ``MODEL.json`` read from ``path`` (named in every error)."""
        d = _json_object(data, path)
        if d.get("format") != FORMAT or d.get("version") != FORMAT_VERSION:
            raise ModelFormatError(
                f"{path}: format {d.get('format')!r} version {d.get('version')!r}, "
                f"expected {FORMAT!r} version {FORMAT_VERSION}"
            )
        metrics: dict[str, Any] = _get(d, "metrics", dict, path)
        for name in metrics:
            _number(metrics, name, f"{path}: metrics")
        files: list[Any] = _get(d, "files", list, path)
        return cls(
            key=_relative(_get(d, "key", str, path), "key", path),
            kind=_kind(d, path),
            day=_day(d, path),
            pass_index=_count(d, "pass", path),
            base=_base(d, path),
            save_mode=_count(d, "saveMode", path),
            keys=_count(d, "keys", path),
            tombstones=_count(d, "tombstones", path),
            metrics=dict(metrics),
            files=tuple(ModelFile.from_dict(f, f"{path}: files[{i}]") for i, f in enumerate(files)),
            serving=_serving(d, path),
        )

    def serving_info(self, path: str) -> Serving:
        """The serving fields, which a reader needs (an error naming ``path`` without them)."""
        if self.serving is None:
            raise ModelFormatError(f"{path}: no 'data', 'table', 'numBuckets' and 'model'")
        return self.serving


def _serving(d: Mapping[str, Any], path: str) -> Serving | None:
    names = ("data", "table", "numBuckets", "model")
    if not any(n in d for n in names):
        return None
    return Serving(
        data=_get(d, "data", dict, path),
        table=_get(d, "table", str, path),
        num_buckets=_count(d, "numBuckets", path),
        model=_get(d, "model", str, path),
    )


def read_manifest(fs: Files, root: str, key: str) -> ModelManifest:
    """The ``MODEL.json`` of model ``key`` below ``root`` (a path on ``fs``)."""
    path = f"{root.rstrip('/')}/{key}/{MODEL_MANIFEST}"
    manifest = ModelManifest.parse(fs.cat_file(path), path)
    if manifest.key != key:
        raise ModelFormatError(f"{path}: field 'key' is {manifest.key!r}, expected {key!r}")
    return manifest


def verify_files(
    fs: Files,
    root: str,
    manifest: ModelManifest,
    wanted: Callable[[ModelFile], bool] = lambda f: True,
) -> None:
    """Check the size and sha256 of every (``wanted``) file the manifest lists."""
    folder = f"{root.rstrip('/')}/{manifest.key}"
    for f in manifest.files:
        if wanted(f):
            f.check(fs.cat_file(f"{folder}/{f.path}"), f"{folder}/{f.path}")
