"""Slot DNN (PaddleRec's ``slot_dnn``): concatenated pooled slots (+ CVM), normalised, into
an MLP.

The input is normalised per feature like Paddle's ``data_norm`` does for this model
(``SlotInputNorm``): the CVM features (log counts up to ~10) and the embeddings (initialised
near 0) differ in scale by orders of magnitude, and without it the MLP learns the
embeddings very slowly (on the Criteo sample, AUC ~0.55 instead of ~0.68 after two passes).
``model.normalizeEmbeddings`` (default false) decides whether the embedding columns are
normalised too or fed raw, as plain PyTorch does: raw wins on the real samples, normalised
learns much faster on tiny streams (``docs/decisions.md``). The normalisation
statistics are global: summed on the PS from every worker's batches (``DataNorm``), the
same in training and in the exported model.
"""

from __future__ import annotations

import torch

from streamtrain_worker.models.base import DenseModel, ModelSpec, SlotInputNorm, mlp, register


@register("slot_dnn")
class SlotDNN(DenseModel):
    def __init__(self, spec: ModelSpec) -> None:
        super().__init__(spec)
        width = spec.num_slots * spec.slot_width
        self.norm = SlotInputNorm(
            spec.num_slots, spec.slot_width, spec.cvm, spec.normalize_embeddings, spec.norm_prior
        )
        self.mlp = mlp(width, spec.hidden_units)
        # Column of embed_w in a pooled slot, or -1 without the wide part (TorchScript
        # wants a plain int, not an Optional).
        self.wide_col = spec.embed_offset if spec.wide else -1

    def forward(
        self,
        pooled: torch.Tensor,
        seq: torch.Tensor | None = None,
        seq_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        logits = self.mlp(self.norm(pooled)).squeeze(1)
        if self.wide_col >= 0:
            logits = logits + pooled[:, :, self.wide_col].sum(dim=1)
        return logits
