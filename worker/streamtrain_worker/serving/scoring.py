"""Online scoring: a request's rows parsed by the training data layer, its sparse rows read
from one version of the table, its scores from that version's network.

``Scorer.current`` is one immutable ``LiveModel`` (version record, network, parser),
replaced as a whole when the served version changes; a request takes it once, so every
row of a request and its response's version come from the same version.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, cast

import fsspec
import numpy as np
import numpy.typing as npt
import torch

from streamtrain_ps.api import PSLike
from streamtrain_worker.data.batch import Batch
from streamtrain_worker.data.config import DataConfig
from streamtrain_worker.data.formats import REASONS, Format, make_format
from streamtrain_worker.publishing.export import load_dense
from streamtrain_worker.publishing.model_folder import read_manifest
from streamtrain_worker.publishing.predict import forward
from streamtrain_worker.serving.tables import VersionedTable, VersionGoneError
from streamtrain_worker.serving.versions import Version

log = logging.getLogger(__name__)
#: Rows one request may carry.
MAX_ROWS = 10_000


class RequestError(ValueError):
    """A bad request; ``field`` names what is wrong (HTTP 400, gRPC INVALID_ARGUMENT)."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field


class NotReadyError(RuntimeError):
    """No verified model is served yet (HTTP 503, gRPC UNAVAILABLE)."""


@dataclass(frozen=True)
class LiveModel:
    """Everything a request needs from one version."""

    version: Version
    dense: torch.jit.ScriptModule
    meta: dict[str, Any]
    data: DataConfig
    table: str
    fmt: Format
    width: int  # 3 + embedding dim


@dataclass(frozen=True)
class Scored:
    version: Version
    scores: npt.NDArray[np.float64]
    missed: int  # keys the table did not hold (scored as zeros, as training pulls them)


class _VersionView:
    """``pull_sparse`` over one version of the table (what ``predict.forward`` calls)."""

    def __init__(self, table: VersionedTable, vid: int) -> None:
        self.table, self.vid, self.missed = table, vid, 0

    def pull_sparse(self, _table: str, keys: npt.NDArray[np.uint64]) -> npt.NDArray[np.float32]:
        rows, hit = self.table.lookup(self.vid, keys)
        self.missed += int(hit.shape[0] - np.count_nonzero(hit))
        return rows


class Scorer:
    """Scores requests with the served version of ``table`` (models read from ``root``)."""

    def __init__(self, root: str, table: VersionedTable) -> None:
        self.root = root.rstrip("/")
        self.table = table
        self._fs, path = fsspec.core.url_to_fs(self.root)
        self._path = str(path).rstrip("/")
        self._lock = threading.Lock()
        self._loaded: dict[int, LiveModel] = {}
        self.current: LiveModel | None = None

    def refresh(self) -> LiveModel | None:
        """Serve the table's served version (loading its network first); the swap is one
        reference assignment, so a request sees the old or the new model, whole."""
        served = self.table.served()
        if served == 0:
            return self.current
        if self.current is not None and self.current.version.id == served:
            return self.current
        state = self.table.state()
        served = state.served
        version = state.version(served)
        if version is None:
            log.warning("served version %s has no record", served)
            return self.current
        model = self._load(version)
        try:
            self.table.warm(version.id)
        except Exception:  # a cold cache is slower, not wrong
            log.exception("cannot read ahead version %s", version.id)
        self.current = model
        with self._lock:
            keep = {served, *state.kept()}
            for vid in list(self._loaded):
                if vid not in keep:
                    del self._loaded[vid]
        return model

    def _load(self, version: Version) -> LiveModel:
        with self._lock:
            found = self._loaded.get(version.id)
        if found is not None:
            return found
        manifest = read_manifest(self._fs, self._path, version.key)
        serving = manifest.serving_info(f"{self._path}/{version.key}/MODEL.json")
        dense, meta = load_dense(f"{self.root}/{version.key}/dense")
        data = DataConfig.from_dict(serving.data)
        width = 3 + int(meta["embeddingDim"])
        set_width = getattr(self.table, "set_width", None)
        if set_width is not None:
            set_width(width)
        model = LiveModel(version, dense, meta, data, serving.table, make_format(data, True), width)
        with self._lock:
            self._loaded[version.id] = model
        return model

    def score(self, rows: Sequence[str] | None, columns: Sequence[Any] | None) -> Scored:
        """Score raw rows (the job's format) or column maps with exactly one version."""
        model = self.current
        if model is None:
            raise NotReadyError("no verified model is served yet")
        for _attempt in range(3):
            batch = parse_request(model, rows, columns)
            view = _VersionView(self.table, model.version.id)
            try:
                scores = forward(model.dense, model.meta, model.table, batch, cast(PSLike, view))
            except VersionGoneError:
                # Rows dropped under us (served version moved long ago): use the new one.
                fresh = self.refresh()
                if fresh is None or fresh is model:
                    raise
                model = fresh
                continue
            return Scored(model.version, scores, view.missed)
        raise NotReadyError("the served version kept changing")


def parse_request(
    model: LiveModel, rows: Sequence[str] | None, columns: Sequence[Any] | None
) -> Batch:
    """The request's examples parsed by the data layer (bad rows: ``RequestError``)."""
    if (rows is None) == (columns is None):
        raise RequestError("inputs", "give exactly one of 'rows' and 'columns'")
    if rows is not None:
        field = "rows"
        lines = list(rows)
        for i, row in enumerate(lines):
            if not isinstance(row, str):
                raise RequestError(f"rows[{i}]", f"must be a string, got {type(row).__name__}")
            if "\n" in row or "\r" in row:
                raise RequestError(f"rows[{i}]", "holds a line break")
    else:
        assert columns is not None
        field = "columns"
        lines = [_row_of_columns(model.data, c, f"columns[{i}]") for i, c in enumerate(columns)]
    if not lines:
        raise RequestError(field, "no row")
    if len(lines) > MAX_ROWS:
        raise RequestError(field, f"{len(lines)} rows, at most {MAX_ROWS}")
    header: bytes | None = None
    if model.fmt.has_header:
        header, lines = lines[0].encode(), lines[1:]
        if not lines:
            raise RequestError(field, "only a header row")
    data = ("\n".join(lines) + "\n").encode()
    first = 2 if header is not None else 1
    try:
        parsed = model.fmt.for_file(f"<{field}>", header).parse(
            np.frombuffer(data, dtype=np.uint8), first
        )
    except ValueError as exc:
        raise RequestError(field, str(exc)) from None
    if parsed.bad_lines.shape[0]:
        line = int(parsed.bad_lines[0])
        why = REASONS[int(parsed.bad_reasons[0])]
        raise RequestError(f"{field}[{line - first}]", why)
    blank = parsed.batch.size != len(lines)
    if blank:
        raise RequestError(field, "a row is blank")
    return parsed.batch


def _row_of_columns(data: DataConfig, row: Any, where: str) -> str:
    """A column map ``{slot: value or [values]}`` as a slot line (slot format only)."""
    if data.format != "slot":
        raise RequestError(
            where, f"column maps need the slot format, the model reads {data.format}"
        )
    if not isinstance(row, Mapping):
        raise RequestError(where, f"must be an object, got {type(row).__name__}")
    known = set(data.slot_names)
    tokens = []
    for name, value in row.items():
        if name not in known:
            raise RequestError(f"{where}.{name}", f"not a slot of the model ({sorted(known)})")
        values = value if isinstance(value, list) else [value]
        for v in values:
            if isinstance(v, bool) or not isinstance(v, str | int):
                raise RequestError(
                    f"{where}.{name}", f"a feasign must be a string or an integer: {v!r}"
                )
            text = str(v)
            if not text or any(c.isspace() or c == ":" for c in text):
                raise RequestError(f"{where}.{name}", f"bad feasign {text!r}")
            tokens.append(f"{text}:{name}")
    return " ".join(tokens)


def describe_version(version: Version) -> dict[str, Any]:
    """A version as the API shows it."""
    return {
        "id": version.id,
        "key": version.key,
        "chain": list(version.chain),
        "publishedAt": version.published_at,
        "deliveredAt": version.delivered_at,
        "metrics": version.metrics,
        "keys": version.keys,
        "accepted": version.accepted,
        "refusal": version.refusal,
    }
