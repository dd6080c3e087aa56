"""Inference export of the dense network: TorchScript plus a JSON description of its inputs.

The inference network starts after the embedding layer (docs/design.md §6): its inputs are
the pooled slot embeddings ``(B, S, W)`` — built by the predictor from the sparse KV files
the PS shards export — and, for sequence models, the unpooled behaviour embeddings and
their mask, and for models over ordinal slots their ``[value, missing]`` inputs
(``data.ordinal``; the slots are listed in the JSON). The output is the predicted CTR
(sigmoid of the training logit).

TorchScript is chosen over ``torch.export`` because C++ serving (libtorch) loads it without
Python. torch 2.13 marks ``torch.jit.script``/``load`` deprecated; the warning is silenced
here, in one place, and ``load_dense`` is the supported way to read an export back.

Layout under the export URI (any fsspec URL): ``dense.pt`` (TorchScript) and
``dense.json`` (inputs, shapes, column meaning, model type). The JSON is written last, so
a reader that finds it finds a complete ``dense.pt``.
"""

from __future__ import annotations

import io
import json
import threading
import warnings
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import fsspec
import torch
from torch import nn

from streamtrain_worker.data.ordinal import WIDTH as ORDINAL_WIDTH
from streamtrain_worker.models import DenseModel

MODEL_FILE = "dense.pt"
META_FILE = "dense.json"


@contextmanager
def _torchscript_allowed() -> Iterator[None]:
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=DeprecationWarning, message=r".*torch\.jit")
        yield


class CTRHead(nn.Module):
    """The dense network followed by a sigmoid: what serving calls."""

    def __init__(self, model: DenseModel) -> None:
        super().__init__()
        self.model = model

    def forward(
        self,
        pooled: torch.Tensor,
        seq: torch.Tensor | None = None,
        seq_mask: torch.Tensor | None = None,
        ordinal: torch.Tensor | None = None,
    ) -> torch.Tensor:
        return torch.sigmoid(self.model(pooled, seq, seq_mask, ordinal))


def script(module: nn.Module) -> torch.jit.ScriptModule:
    """``torch.jit.script`` without the deprecation warning (module docstring)."""
    with _torchscript_allowed():
        return torch.jit.script(module)


def describe(model: DenseModel, model_type: str) -> dict[str, Any]:
    """The JSON description of an exported model's inputs and output."""
    spec = model.spec
    columns = ["cvm_log_show", "cvm_log_ctr"] if spec.cvm else []
    columns += ["embed_w"] + [f"embedx_{i}" for i in range(spec.embedding_dim)]
    inputs: list[dict[str, Any]] = [
        {
            "name": "pooled",
            "dtype": "float32",
            "shape": [-1, spec.num_slots, spec.slot_width],
            "columns": columns,
            "pooling": "sum over the slot's feature signs",
        }
    ]
    if model.uses_sequence:
        inputs += [
            {
                "name": "seq",
                "dtype": "float32",
                "shape": [-1, -1, 1 + spec.embedding_dim],
                "columns": columns[spec.embed_offset :],
                "slot": spec.sequence_slot,
            },
            {"name": "seq_mask", "dtype": "bool", "shape": [-1, -1]},
        ]
    if spec.ordinal_slots:
        inputs.append(
            {
                "name": "ordinal",
                "dtype": "float32",
                "shape": [-1, spec.num_ordinal, ORDINAL_WIDTH],
                "columns": ["value", "missing"],
                "slots": list(spec.ordinal_slots),
            }
        )
    return {
        "format": "torchscript",
        "file": MODEL_FILE,
        "model": model_type,
        "numSlots": spec.num_slots,
        "embeddingDim": spec.embedding_dim,
        "cvm": spec.cvm,
        "sequenceSlot": spec.sequence_slot,
        "targetSlot": spec.target_slot,
        "ordinalSlots": list(spec.ordinal_slots),
        "inputs": inputs,
        "output": {"name": "ctr", "dtype": "float32", "shape": [-1], "activation": "sigmoid"},
    }


#: One scripted ``CTRHead`` per model. ``torch.jit.script`` compiles the network (0.1-0.2 s
#: for the slot DNN, a pass transition's largest worker-side cost when exporting every pass),
#: while the result shares the model's parameter and buffer tensors: updated in place by
#: training and dense syncs, a later ``torch.jit.save`` writes the current values. The
#: scripted copy keeps the eval mode it was scripted in, whatever the model's mode later.
_SCRIPTED: weakref.WeakKeyDictionary[DenseModel, torch.jit.ScriptModule] = (
    weakref.WeakKeyDictionary()
)
_SCRIPTED_LOCK = threading.Lock()


def _scripted(model: DenseModel) -> torch.jit.ScriptModule:
    with _SCRIPTED_LOCK:
        scripted = _SCRIPTED.get(model)
        if scripted is None:
            was_training = model.training
            model.eval()
            try:
                scripted = _SCRIPTED[model] = script(CTRHead(model))
            finally:
                model.train(was_training)
        return scripted


def export_dense(model: DenseModel, model_type: str, uri: str) -> list[str]:
    """Write ``dense.pt`` then ``dense.json`` under ``uri``; returns the written URLs.

    An empty URI (or ``/``) is refused: it would put the files at the filesystem root.
    """
    if not uri.strip().strip("/"):
        raise ValueError(f"uri: must name an export directory, got {uri!r}")
    buffer = io.BytesIO()
    with _torchscript_allowed():
        torch.jit.save(_scripted(model), buffer)
    base = uri.rstrip("/")
    fs, root = fsspec.core.url_to_fs(base)
    fs.makedirs(root, exist_ok=True)
    model_url, meta_url = f"{base}/{MODEL_FILE}", f"{base}/{META_FILE}"
    with fsspec.open(model_url, "wb") as f:
        f.write(buffer.getvalue())
    with fsspec.open(meta_url, "w") as f:
        f.write(json.dumps(describe(model, model_type), indent=2, sort_keys=True))
    return [model_url, meta_url]


def load_dense(uri: str) -> tuple[torch.jit.ScriptModule, dict[str, Any]]:
    """Read an export back: the TorchScript module (CTR output) and its description."""
    base = uri.rstrip("/")
    with fsspec.open(f"{base}/{META_FILE}", "r") as f:
        meta = json.loads(f.read())
    with fsspec.open(f"{base}/{meta['file']}", "rb") as f:
        data = f.read()
    with _torchscript_allowed():
        module = torch.jit.load(io.BytesIO(data))
    return module, meta
