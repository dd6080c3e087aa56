"""Slot DNN (PaddleRec's ``slot_dnn``): concatenated pooled slots (+ CVM) into an MLP."""

from __future__ import annotations

import torch

from streamtrain_worker.models.base import DenseModel, ModelSpec, mlp, register


@register("slot_dnn")
class SlotDNN(DenseModel):
    def __init__(self, spec: ModelSpec) -> None:
        super().__init__(spec)
        self.mlp = mlp(spec.num_slots * spec.slot_width, spec.hidden_units)

    def forward(
        self,
        pooled: torch.Tensor,
        seq: torch.Tensor | None = None,
        seq_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        return self.mlp(pooled.flatten(1)).squeeze(1)
