"""Wide & Deep: the per-slot ``embed_w`` scalars are the wide (linear) part; the deep MLP
sees the embedx vectors (and CVM features). ``embed_w`` is the PS's first-order weight, so
the wide part is a logistic regression over the same feature signs, learned by the PS."""

from __future__ import annotations

import torch
from torch import nn

from streamtrain_worker.models.base import DenseModel, ModelSpec, mlp, register


@register("wide_deep")
class WideDeep(DenseModel):
    def __init__(self, spec: ModelSpec) -> None:
        super().__init__(spec)
        self.embed_col = spec.embed_offset
        deep_width = spec.num_slots * (spec.slot_width - 1)
        self.deep = mlp(deep_width, spec.hidden_units)
        self.wide_bias = nn.Parameter(torch.zeros(1))

    def forward(
        self,
        pooled: torch.Tensor,
        seq: torch.Tensor | None = None,
        seq_mask: torch.Tensor | None = None,
        ordinal: torch.Tensor | None = None,
    ) -> torch.Tensor:
        c = self.embed_col
        inputs = self.network_inputs(pooled)
        wide = inputs[:, :, c].sum(dim=1) + self.wide_bias
        deep_in = torch.cat([inputs[:, :, :c], inputs[:, :, c + 1 :]], dim=2).flatten(1)
        return self.counted_offsets(wide + self.deep(deep_in).squeeze(1), pooled)
