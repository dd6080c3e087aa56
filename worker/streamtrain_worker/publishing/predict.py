"""The reference predictor: load a published inference model and score raw examples.

``python -m streamtrain_worker.publishing.predict --export ROOT [--model KEY] FILE...`` (also
``streamtrain predict``). A model is found through the export donefile (``ROOT/donefile.txt``,
one JSON line per published model; the folder's format is ``model_folder``):

- a ``base`` or ``batch`` model is complete on its own;
- a ``delta-<pass>`` model is its base plus every delta of the same day up to that pass;
  a delta without a base (``null``: the job's first day, or every day with
  ``export.base: false``) is every delta without a base up to it, back to the job's first
  one (``delta_score`` is reset at every delta, so a key not changed since an earlier day
  is only in that day's delta). Deltas are applied in publication order: each delta's
  tombstones are deleted first, then its keys are inserted or replaced.

The sparse rows ``[show, click, embed_w, embedx...]`` come from the PS save readers
(``streamtrain_ps.saves.checkpoint.read_sparse``, checksums verified) and serve as a read-only
table; examples are parsed by the data layer with the data config the model was trained
with (stored in ``MODEL.json``), pooled exactly as in training (``embedding.prepare`` and
``Lookup``), and scored by the exported TorchScript network. So on the same examples and the
same model state the AUC equals what an evaluate-only ``RunPass`` reports.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import IO, Any, cast

import fsspec
import numpy as np
import numpy.typing as npt
import torch

from streamtrain_ps.api import PSLike
from streamtrain_ps.errors import CheckpointError
from streamtrain_ps.saves.checkpoint import read_sparse
from streamtrain_worker.data.batch import Batch
from streamtrain_worker.data.config import DataConfig
from streamtrain_worker.data.errors import DataError
from streamtrain_worker.data.formats import make_format
from streamtrain_worker.data.reader import PassReader
from streamtrain_worker.metrics import DERIVED_METRICS, PassMetrics, format_metric
from streamtrain_worker.publishing.export import load_dense
from streamtrain_worker.publishing.model_folder import (
    MODEL_MANIFEST,
    DoneLine,
    ModelKind,
    read_donefile,
    read_manifest,
    verify_files,
)
from streamtrain_worker.training.embedding import Lookup, prepare

EPS = 1e-7


class ModelNotFoundError(LookupError):
    """No published model matches the request (the message lists what exists)."""


def _fs(uri: str) -> tuple[fsspec.AbstractFileSystem, str]:
    fs, path = fsspec.core.url_to_fs(uri)
    return fs, str(path).rstrip("/")


def model_chain(root: str, key: str | None = None) -> list[DoneLine]:
    """The donefile lines to apply, in order, to build model ``key`` (default: the newest
    base or delta)."""
    lines = read_donefile(*_fs(root))
    servable = [d for d in lines if d.kind in (ModelKind.BASE, ModelKind.DELTA)]
    if key is None:
        if not servable:
            raise ModelNotFoundError(f"{root}: no published base or delta model")
        target = servable[-1]
    else:
        found = [d for d in lines if d.key == key.strip("/")]
        if not found:
            known = ", ".join(d.key for d in lines[-10:]) or "none"
            raise ModelNotFoundError(f"{root}: no published model {key!r} (latest: {known})")
        target = found[0]
    if target.kind is not ModelKind.DELTA:
        return [target]
    chain = [d for d in lines if d.key == target.base] if target.base else []
    if target.base and not chain:
        raise ModelNotFoundError(f"{root}: delta {target.key} needs base {target.base}")
    upto = (target.day, target.pass_index)
    deltas = [
        d
        for d in lines
        if d.kind is ModelKind.DELTA
        and d.base == target.base
        # Without a base the chain reaches back to the job's first delta (module docstring).
        and (d.day == target.day or target.base is None)
        and (d.day, d.pass_index) <= upto
    ]
    return chain + deltas


@dataclass(frozen=True)
class SparseModel:
    """A read-only sparse table: sorted keys and their ``[show, click, embed_w, embedx...]``."""

    keys: npt.NDArray[np.uint64]
    values: npt.NDArray[np.float32]

    def pull_sparse(self, table: str, keys: npt.NDArray[np.uint64]) -> npt.NDArray[np.float32]:
        """Rows of ``keys``; unknown keys get zeros (as a PS pull would)."""
        out = np.zeros((keys.shape[0], self.values.shape[1]), dtype=np.float32)
        if self.keys.shape[0] == 0:
            return out
        pos = np.minimum(np.searchsorted(self.keys, keys), self.keys.shape[0] - 1)
        hit = self.keys[pos] == keys
        out[hit] = self.values[pos[hit]]
        return out


def apply_chain(parts: Sequence[tuple[Any, Any, Any]], dim: int) -> SparseModel:
    """Fold ``(keys, values, tombstones)`` saves in order into one table."""
    keys = np.zeros(0, dtype=np.uint64)
    values = np.zeros((0, dim), dtype=np.float32)
    for new_keys, new_values, tombstones in parts:
        drop = np.isin(keys, tombstones) | np.isin(keys, new_keys)
        keys = np.concatenate([keys[~drop], np.asarray(new_keys, dtype=np.uint64)])
        values = np.concatenate([values[~drop], np.asarray(new_values, dtype=np.float32)])
    order = np.argsort(keys, kind="stable")
    return SparseModel(keys[order], values[order])


@dataclass
class LoadedModel:
    key: str
    chain: list[str]
    sparse: SparseModel
    dense: torch.jit.ScriptModule
    meta: dict[str, Any]
    data: DataConfig
    table: str
    #: AUC histogram resolution training used (same buckets, same AUC).
    num_buckets: int


def load_model(root: str, key: str | None = None) -> LoadedModel:
    """Base + deltas (tombstones applied) and the dense network of model ``key``."""
    chain = model_chain(root, key)
    target = chain[-1]
    fs, path = _fs(root)
    manifest = read_manifest(fs, path, target.key)
    serving = manifest.serving_info(f"{path}/{target.key}/{MODEL_MANIFEST}")
    verify_files(fs, path, manifest, lambda f: f.path.startswith("dense/"))
    base = root.rstrip("/")
    dense, meta = load_dense(f"{base}/{target.key}/dense")
    dim = 3 + int(meta["embeddingDim"])
    parts = [read_sparse(f"{base}/{d.key}/sparse", serving.table) for d in chain]
    return LoadedModel(
        key=target.key,
        chain=[d.key for d in chain],
        sparse=apply_chain(parts, dim),
        dense=dense,
        meta=meta,
        data=DataConfig.from_dict(serving.data),
        table=serving.table,
        num_buckets=serving.num_buckets,
    )


def forward(
    dense: torch.jit.ScriptModule,
    meta: dict[str, Any],
    table: str,
    batch: Batch,
    ps: PSLike,
) -> npt.NDArray[np.float64]:
    """The predicted CTR of every example of ``batch`` with the sparse rows of ``ps`` (a
    ``pull_sparse``), pooled exactly as in training; the one scoring path of ``predict`` and
    of the server (``streamtrain_worker.serving``), so both give the same number."""
    dim = int(meta["embeddingDim"])
    seq_slot = meta.get("sequenceSlot")
    uses_seq = any(i["name"] == "seq" for i in meta["inputs"])
    # Exports from before the ordinal inputs have no such key: none.
    ordinal_slots = tuple(int(s) for s in meta.get("ordinalSlots", []))
    with torch.no_grad():
        prepared = prepare(batch, ps, table, dim, bool(meta["cvm"]), ordinal_slots)
        lookup = Lookup(prepared, bool(meta["cvm"]), requires_grad=False)
        if uses_seq and seq_slot is not None:
            seq, mask = lookup.sequence(int(seq_slot))
            preds = dense(lookup.pooled, seq, mask, lookup.ordinal)
        else:
            preds = dense(lookup.pooled, None, None, lookup.ordinal)
    return cast("npt.NDArray[np.float64]", preds.numpy().astype(np.float64))


class RowWriter:
    """Per-row scores as CSV (``model,row,label,score``) or JSON lines; an unlabelled row's
    label is empty (CSV) or null (JSON)."""

    def __init__(self, out: IO[str], fmt: str, model: str) -> None:
        self._out, self._fmt, self._model, self._row = out, fmt, model, 0
        if fmt == "csv":
            out.write("model,row,label,score\n")

    def write(self, labels: npt.NDArray[np.float32], preds: npt.NDArray[np.float64]) -> None:
        lines = []
        for y, p in zip(labels.tolist(), preds.tolist(), strict=True):
            label = None if math.isnan(y) else int(y)
            if self._fmt == "csv":
                lines.append(f"{self._model},{self._row},{'' if label is None else label},{p!r}")
            else:
                record = {"model": self._model, "row": self._row, "label": label, "score": p}
                lines.append(json.dumps(record))
            self._row += 1
        if lines:
            self._out.write("\n".join(lines) + "\n")


def score(
    model: LoadedModel,
    files: Sequence[str],
    batch_size: int = 1024,
    rows: RowWriter | None = None,
) -> PassMetrics:
    """Predict every example of ``files`` (each row to ``rows``, if given); the metrics of
    the labelled ones (an unlabelled slot line is scored, not counted)."""
    metrics = PassMetrics(num_buckets=model.num_buckets)
    ps = cast(PSLike, model.sparse)
    fmt = make_format(model.data, labels_optional=True)
    with PassReader(list(files), model.data, batch_size, fmt=fmt) as reader:
        for batch in reader:
            if batch.size == 0:
                continue
            p = forward(model.dense, model.meta, model.table, batch, ps)
            if rows is not None:
                rows.write(batch.labels, p)
            labelled = ~np.isnan(batch.labels)
            y = batch.labels[labelled].astype(np.float64)
            pc = np.clip(p[labelled], EPS, 1 - EPS)
            losses = -(y * np.log(pc) + (1 - y) * np.log(1 - pc))
            metrics.add(p[labelled], y, losses)
        metrics.bad_lines = reader.stats.bad_lines
        metrics.files_read = reader.stats.files
    return metrics


#: What a bad model, export root or data file raises; each names its file (never a traceback).
INPUT_ERRORS = (ModelNotFoundError, OSError, ValueError, DataError, CheckpointError)


def _missing(files: Sequence[str]) -> str | None:
    for f in files:
        fs, path = fsspec.core.url_to_fs(f)
        if not fs.exists(path):
            return f"{f}: no such data file"
    return None


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="streamtrain predict", description=__doc__.split("\n")[0])
    p.add_argument("--export", required=True, help="export root (fsspec URL)")
    p.add_argument("--model", help="model key, e.g. 20261102/delta-3 (default: the newest)")
    p.add_argument("--batch-size", type=int, default=1024)
    p.add_argument("--json", action="store_true", help="print only one JSON object")
    p.add_argument(
        "--rows",
        choices=("csv", "jsonl"),
        help="also write every row's score (with the model key) to --out",
    )
    p.add_argument(
        "--out",
        default="-",
        help="where --rows go (default '-': stdout; the summary then goes to stderr)",
    )
    p.add_argument("files", nargs="+", help="data files in the model's training format")
    args = p.parse_args(argv)
    if args.batch_size < 1:
        p.error(f"--batch-size must be >= 1, got {args.batch_size}")
    summary_out = sys.stderr if args.rows and args.out == "-" else sys.stdout
    try:
        missing = _missing(args.files)
        if missing:
            raise FileNotFoundError(missing)
        model = load_model(args.export, args.model)
        with contextlib.ExitStack() as stack:
            writer = None
            if args.rows:
                out = sys.stdout if args.out == "-" else stack.enter_context(open(args.out, "w"))
                writer = RowWriter(out, args.rows, model.key)
            metrics = score(model, args.files, args.batch_size, writer)
    except INPUT_ERRORS as exc:
        print(f"error: {_one_line(exc)}", file=sys.stderr)
        return 2
    # Every metric name is in the JSON; an undefined one (no example, one class) is null,
    # never a placeholder such as 0.5.
    summary = metrics.summary()
    result: dict[str, Any] = {
        "model": model.key,
        "chain": model.chain,
        "keys": int(model.sparse.keys.shape[0]),
        "examples": metrics.examples,
    }
    result.update({k: summary.get(k) for k in DERIVED_METRICS})
    if not args.json:
        print(
            f"model {model.key} ({' + '.join(model.chain)}), {result['keys']:,} keys",
            file=summary_out,
        )
        print(
            f"{metrics.examples:,} examples: auc {format_metric(metrics.auc)}"
            f"  loss {format_metric(metrics.loss)}  copc {format_metric(metrics.copc, '.3f')}"
            f"  mae {format_metric(metrics.mae)}  rmse {format_metric(metrics.rmse)}",
            file=summary_out,
        )
    print(json.dumps(result, sort_keys=True), file=summary_out)
    return 0


def _one_line(exc: BaseException) -> str:
    """The error's message on one line (an OS error's own text names its file)."""
    if isinstance(exc, FileNotFoundError) and exc.filename:
        return f"{exc.filename}: no such file"
    text = str(exc) or type(exc).__name__
    return " ".join(text.split())


if __name__ == "__main__":
    sys.exit(main())
