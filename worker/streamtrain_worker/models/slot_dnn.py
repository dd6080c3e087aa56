"""Slot DNN (PaddleRec's ``slot_dnn``): concatenated pooled slots (+ CVM), normalised, into
an MLP.

The input is normalised per feature like Paddle's ``data_norm`` does for this model: the CVM
features (log counts up to ~10) and the embeddings (initialised near 0) differ in scale by
orders of magnitude, and without it the MLP learns the embeddings very slowly (on the Criteo
sample, AUC ~0.55 instead of ~0.68 after two passes). ``InputNorm`` is a batch norm: its
affine weights are dense parameters (on the PS like every weight); its running mean and
variance are buffers kept by each worker and exported with the model (every worker sees the
same distribution, so their statistics agree closely).
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as nnf

from streamtrain_worker.models.base import DenseModel, ModelSpec, mlp, register


class InputNorm(nn.BatchNorm1d):
    """Batch norm that uses its running statistics for a batch of one example (where batch
    statistics are undefined), so a pass may end with a single-example batch."""

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        batch_stats = self.training and input.shape[0] > 1
        momentum = 0.1 if self.momentum is None else self.momentum
        return nnf.batch_norm(
            input,
            self.running_mean,
            self.running_var,
            self.weight,
            self.bias,
            batch_stats,
            momentum,
            self.eps,
        )


@register("slot_dnn")
class SlotDNN(DenseModel):
    def __init__(self, spec: ModelSpec) -> None:
        super().__init__(spec)
        width = spec.num_slots * spec.slot_width
        self.norm = InputNorm(width)
        self.mlp = mlp(width, spec.hidden_units)

    def forward(
        self,
        pooled: torch.Tensor,
        seq: torch.Tensor | None = None,
        seq_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        return self.mlp(self.norm(pooled.flatten(1))).squeeze(1)
