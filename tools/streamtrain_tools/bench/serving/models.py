"""A real export folder written by hand for the serving tests and ``bench.serving``: the PS
part codec and manifest, a TorchScript network, ``MODEL.json`` and donefile lines — the
writers a job uses — with rows the caller chooses (NaN rows, a metric drop, every key
changed, 100k-key deltas) and no training in between."""

from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import torch

from streamtrain_ps.api import SavedFile, SaveMode, SaveResult
from streamtrain_ps.saves import partfile
from streamtrain_ps.saves.checkpoint import publish
from streamtrain_worker.data.config import DataConfig
from streamtrain_worker.data.hashing import feature_sign
from streamtrain_worker.models import ModelSpec, build_model
from streamtrain_worker.publishing.export import export_dense
from streamtrain_worker.publishing.model_folder import (
    DONEFILE,
    DoneLine,
    ModelFile,
    ModelKind,
    ModelManifest,
    Serving,
    model_key,
)

SLOTS = ["user", "item", "hist"]
DIM = 4
TABLE = "embedding"
#: No crossed slots: every key a row holds is one ``keys_of`` lists and the tables write.
DATA = DataConfig.from_dict({"format": "slot", "slots": SLOTS, "labelSlot": "click", "crosses": []})


def keys_of(ids: range | list[int]) -> npt.NDArray[np.uint64]:
    """The feature signs of ids ``ids`` in every slot (``<id>:<slot>`` tokens)."""
    return np.array(
        [feature_sign(s, str(i)) for s in range(len(SLOTS)) for i in ids], dtype=np.uint64
    )


def rows_for(keys: npt.NDArray[np.uint64], seed: int, dim: int = DIM) -> npt.NDArray[np.float32]:
    """``[show, click, embed_w, embedx...]`` rows, different per ``seed``."""
    rng = np.random.default_rng(seed)
    values = rng.normal(0, 0.5, (keys.shape[0], 3 + dim)).astype(np.float32)
    values[:, 0] = rng.integers(5, 50, keys.shape[0])
    values[:, 1] = values[:, 0] * 0.1
    return values


def lines(ids: list[int], labelled: bool = True) -> str:
    """Slot lines over ``ids`` (the same id in every slot), label ``click:<id % 2>``."""
    out = []
    for i in ids:
        tokens = [f"{i}:{slot}" for slot in SLOTS]
        if labelled:
            tokens.append(f"click:{i % 2}")
        out.append(" ".join(tokens))
    return "\n".join(out) + "\n"


@dataclass
class Export:
    """An export root; ``publish_*`` writes one model and its donefile line."""

    root: Path
    seed: int = 0
    dim: int = DIM
    published: list[str] = field(default_factory=list)

    def _sparse(
        self,
        uri: Path,
        mode: SaveMode,
        keys: npt.NDArray[np.uint64],
        values: npt.NDArray[np.float32],
        tombstones: npt.NDArray[np.uint64],
    ) -> None:
        data_dir = partfile.new_data_dir(0)
        header = {
            "kind": "sparse",
            "table": TABLE,
            "logicalShard": 0,
            "logicalShards": 1,
            "mode": int(mode),
            "embedxDim": self.dim,
            "optimizer": "adagrad",
            "columns": ["show", "click", "embed_w"] + [f"embedx_w{j}" for j in range(self.dim)],
        }
        arrays: dict[str, npt.NDArray[Any]] = {
            "keys": keys.astype(np.uint64),
            "values": values.astype(np.float32).reshape(-1),
            "tombstones": tombstones.astype(np.uint64),
        }
        data = partfile.encode_part(header, arrays)
        rel = partfile.sparse_path(data_dir, TABLE, 0)
        (uri / rel).parent.mkdir(parents=True)
        (uri / rel).write_bytes(data)
        saved = SavedFile(rel, len(data), hashlib.sha256(data).hexdigest(), int(keys.size))
        result = SaveResult(str(uri), mode, (saved,), int(keys.size), int(tombstones.size), 0.0)
        publish(str(uri), [result])

    def publish(
        self,
        kind: ModelKind,
        day: str,
        pass_index: int,
        keys: npt.NDArray[np.uint64],
        values: npt.NDArray[np.float32],
        tombstones: npt.NDArray[np.uint64] | None = None,
        *,
        base: str | None = None,
        metrics: dict[str, float] | None = None,
        dense_scale: float = 1.0,
    ) -> str:
        key = model_key(kind, day, pass_index)
        folder = self.root / key
        tombs = np.zeros(0, np.uint64) if tombstones is None else tombstones
        mode = {ModelKind.DELTA: SaveMode.DELTA, ModelKind.BASE: SaveMode.BASE}.get(
            kind, SaveMode.BATCH
        )
        self._sparse(folder / "sparse", mode, keys, values, tombs)
        spec = ModelSpec(num_slots=len(SLOTS), embedding_dim=self.dim, cvm=True, hidden_units=(8,))
        net = build_model("slot_dnn", spec, seed=self.seed + len(self.published))
        if dense_scale != 1.0:
            with torch.no_grad():
                for p in net.parameters():
                    p.mul_(dense_scale)
        export_dense(net, "slot_dnn", str(folder / "dense"))
        files = tuple(
            ModelFile.of(str(p.relative_to(folder)), p.read_bytes())
            for p in sorted(folder.rglob("*"))
            if p.is_file()
        )
        manifest = ModelManifest(
            key=key,
            kind=kind,
            day=day,
            pass_index=pass_index,
            base=base,
            save_mode=int(mode),
            keys=int(keys.size),
            tombstones=int(tombs.size),
            metrics=dict(metrics if metrics is not None else {"auc": 0.7, "copc": 1.0}),
            files=files,
            serving=Serving(DATA.to_dict(), TABLE, 1 << 12, "slot_dnn"),
        )
        (folder / "MODEL.json").write_bytes(manifest.render())
        # The donefile line last, atomically (a copy renamed over it), as a job writes it.
        line = DoneLine(key, kind, day, pass_index, base, time.time())
        donefile = self.root / DONEFILE
        text = donefile.read_text() if donefile.exists() else ""
        tmp = self.root / f".tmp-{DONEFILE}"
        tmp.write_text(text + line.render() + "\n")
        tmp.replace(donefile)
        self.published.append(key)
        return key
