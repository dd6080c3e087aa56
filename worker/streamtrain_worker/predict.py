"""The reference predictor: load a published inference model and score raw examples.

``python -m streamtrain_worker.predict --export ROOT [--model KEY] FILE...`` (also
``streamtrain predict``). A model is found through the export donefile (``ROOT/donefile.txt``,
one JSON line per published model; the folder's format is ``model_folder``):

- a ``base`` or ``batch`` model is complete on its own;
- a ``delta-<pass>`` model is its base (``null`` for the first day: an empty table) plus
  every delta of the same day up to that pass, applied in publication order: each delta's
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
import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, cast

import fsspec
import numpy as np
import numpy.typing as npt
import torch

from streamtrain_ps.api import PSLike
from streamtrain_ps.saves.checkpoint import read_sparse
from streamtrain_worker.data.config import DataConfig
from streamtrain_worker.data.reader import PassReader
from streamtrain_worker.embedding import Lookup, prepare
from streamtrain_worker.export import load_dense
from streamtrain_worker.metrics import DERIVED_METRICS, PassMetrics, format_metric
from streamtrain_worker.model_folder import (
    MODEL_MANIFEST,
    DoneLine,
    ModelKind,
    read_donefile,
    read_manifest,
    verify_files,
)

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
    deltas = [
        d
        for d in lines
        if d.kind is ModelKind.DELTA
        and d.day == target.day
        and d.base == target.base
        and d.pass_index <= target.pass_index
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


def score(model: LoadedModel, files: Sequence[str], batch_size: int = 1024) -> PassMetrics:
    """Predict every example of ``files``; the metrics of those predictions."""
    metrics = PassMetrics(num_buckets=model.num_buckets)
    dim = int(model.meta["embeddingDim"])
    cvm = bool(model.meta["cvm"])
    seq_slot = model.meta.get("sequenceSlot")
    uses_seq = any(i["name"] == "seq" for i in model.meta["inputs"])
    # Exports from before the ordinal inputs have no such key: none.
    ordinal_slots = tuple(int(s) for s in model.meta.get("ordinalSlots", []))
    ps = cast(PSLike, model.sparse)
    with torch.no_grad(), PassReader(list(files), model.data, batch_size) as reader:
        for batch in reader:
            if batch.size == 0:
                continue
            prepared = prepare(batch, ps, model.table, dim, cvm, ordinal_slots)
            lookup = Lookup(prepared, cvm, requires_grad=False)
            if uses_seq and seq_slot is not None:
                seq, mask = lookup.sequence(int(seq_slot))
                preds = model.dense(lookup.pooled, seq, mask, lookup.ordinal)
            else:
                preds = model.dense(lookup.pooled, None, None, lookup.ordinal)
            p = preds.numpy().astype(np.float64)
            y = batch.labels.astype(np.float64)
            pc = np.clip(p, EPS, 1 - EPS)
            losses = -(y * np.log(pc) + (1 - y) * np.log(1 - pc))
            metrics.add(p, y, losses)
        metrics.bad_lines = reader.stats.bad_lines
        metrics.files_read = reader.stats.files
    return metrics


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="streamtrain predict", description=__doc__.split("\n")[0])
    p.add_argument("--export", required=True, help="export root (fsspec URL)")
    p.add_argument("--model", help="model key, e.g. 20261102/delta-3 (default: the newest)")
    p.add_argument("--batch-size", type=int, default=1024)
    p.add_argument("--json", action="store_true", help="print only one JSON object")
    p.add_argument("files", nargs="+", help="data files in the model's training format")
    args = p.parse_args(argv)
    try:
        model = load_model(args.export, args.model)
    except (ModelNotFoundError, OSError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    metrics = score(model, args.files, args.batch_size)
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
        print(f"model {model.key} ({' + '.join(model.chain)}), {result['keys']:,} keys")
        print(
            f"{metrics.examples:,} examples: auc {format_metric(metrics.auc)}"
            f"  loss {format_metric(metrics.loss)}  copc {format_metric(metrics.copc, '.3f')}"
            f"  mae {format_metric(metrics.mae)}  rmse {format_metric(metrics.rmse)}"
        )
    print(json.dumps(result, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
