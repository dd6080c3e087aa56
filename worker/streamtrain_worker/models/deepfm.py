"""DeepFM: first order (sum of ``embed_w``) + FM pairwise interactions of the per-slot
embedx vectors + an MLP over all pooled slots, added as logits.

FM second order over slot vectors ``v_s``: ``0.5 * sum_d((sum_s v_sd)^2 - sum_s v_sd^2)``,
the O(S·D) form of ``sum_{s<t} <v_s, v_t>``.
"""

from __future__ import annotations

import torch
from torch import nn

from streamtrain_worker.models.base import DenseModel, ModelSpec, mlp, register


@register("deepfm")
class DeepFM(DenseModel):
    def __init__(self, spec: ModelSpec) -> None:
        super().__init__(spec)
        self.embed_col = spec.embed_offset
        self.deep = mlp(spec.num_slots * spec.slot_width, spec.hidden_units)
        self.bias = nn.Parameter(torch.zeros(1))

    def forward(
        self,
        pooled: torch.Tensor,
        seq: torch.Tensor | None = None,
        seq_mask: torch.Tensor | None = None,
        ordinal: torch.Tensor | None = None,
    ) -> torch.Tensor:
        c = self.embed_col
        inputs = self.network_inputs(pooled)
        first = inputs[:, :, c].sum(dim=1)
        v = inputs[:, :, c + 1 :]
        second = 0.5 * (v.sum(dim=1).pow(2) - v.pow(2).sum(dim=1)).sum(dim=1)
        deep = self.deep(inputs.flatten(1)).squeeze(1)
        return self.counted_offsets(first + second + self.bias + deep, pooled)
