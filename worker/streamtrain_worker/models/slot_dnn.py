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

The ordinal slots' numeric inputs (``data.ordinal``: the bucket number of each of
Criteo's integer columns and a missing flag, Avazu's hour of day and weekday) join the MLP
input, standardised by their own ``DataNorm`` (prior ``dataNormPrior``, as the CVM columns:
a fresh job's first batches must not set their scale). Beside each bucket's own key they let
the MLP use the order of the buckets: +0.004 AUC on Criteo (``docs/decisions.md``).

``model.crossLayers`` adds DCN-v2 cross layers (Wang et al., 2021) beside the MLP: over the
same input ``x0``, ``x <- x0 * (W x + b) + x`` per layer, and a linear read-out of the last
``x`` added to the logit. Each layer multiplies the input by a learned linear map of itself:
the pairwise feature products a linear learner gets from explicit crosses (VW's ``-q``),
learned densely instead of hashed per pair. The read-out starts at zero, so a model with
cross layers predicts exactly as one without them until it has trained. A full-rank ``W`` is
``width**2`` weights a layer (Criteo's 429 inputs: two layers double the dense vector the
PS updates and the worker pulls); ``model.crossRank`` r factors it as ``U V`` (DCN-v2's
low-rank form, ``2 * width * r`` weights), which kept the long-tail stream's gain at r 32
(``docs/decisions.md``).

``model.fmInteractions`` adds a factorisation machine's pairwise term (Rendle, 2010) over
the slots' raw embedx vectors: ``sum_{i<j} <v_i, v_j>``, computed as
``((sum v)^2 - sum v^2) / 2``. A user x item interaction no single id carries is then
learned in the PS embeddings themselves, each pair's product with its own gradient, as
VW's ``-q`` learns a weight per pair.
"""

from __future__ import annotations

import torch
from torch import nn

from streamtrain_worker.data.ordinal import WIDTH as ORDINAL_WIDTH
from streamtrain_worker.models.base import DenseModel, ModelSpec, SlotInputNorm, mlp, register
from streamtrain_worker.models.data_norm import DataNorm


@register("slot_dnn")
class SlotDNN(DenseModel):
    uses_ordinal = True

    def __init__(self, spec: ModelSpec) -> None:
        super().__init__(spec)
        self.norm = SlotInputNorm(
            spec.num_slots, spec.slot_width, spec.cvm, spec.normalize_embeddings, spec.norm_prior
        )
        # Zero or one norm of the ordinal inputs (TorchScript: a list, not an Optional).
        ordinal = ORDINAL_WIDTH * spec.num_ordinal
        self.ordinal_norm = nn.ModuleList([DataNorm(ordinal, spec.norm_prior)] if ordinal else [])
        width = spec.num_slots * spec.slot_width + ordinal
        self.mlp = mlp(width, spec.hidden_units)
        self.cross = nn.ModuleList(
            [_cross_map(width, spec.cross_rank) for _ in range(spec.cross_layers)]
        )
        # A list of zero or one read-outs: TorchScript compiles every branch, so an
        # optional module is an empty list rather than None.
        self.cross_out = nn.ModuleList([_zero_linear(width)] if spec.cross_layers else [])
        # Column of embed_w in a pooled slot, or -1 without the wide part (TorchScript
        # wants a plain int, not an Optional).
        self.wide_col = spec.embed_offset if spec.wide else -1
        # First embedx column for the FM term, or -1 without it.
        self.fm_col = spec.embed_offset + 1 if spec.fm else -1

    def forward(
        self,
        pooled: torch.Tensor,
        seq: torch.Tensor | None = None,
        seq_mask: torch.Tensor | None = None,
        ordinal: torch.Tensor | None = None,
    ) -> torch.Tensor:
        inputs = self.network_inputs(pooled)
        x0 = self.norm(inputs)
        for norm in self.ordinal_norm:
            if ordinal is None:
                raise ValueError("this model takes the ordinal slots' inputs: pass ordinal")
            x0 = torch.cat([x0, norm(ordinal.flatten(1))], dim=1)
        logits = self.mlp(x0).squeeze(1)
        x = x0
        for layer in self.cross:
            x = x0 * layer(x) + x
        for out in self.cross_out:
            logits = logits + out(x).squeeze(1)
        if self.wide_col >= 0:
            logits = logits + inputs[:, :, self.wide_col].sum(dim=1)
        if self.fm_col >= 0:
            v = inputs[:, :, self.fm_col :]
            pairs = v.sum(dim=1).square() - v.square().sum(dim=1)
            logits = logits + 0.5 * pairs.sum(dim=1)
        return self.counted_offsets(logits, pooled)


def _zero_linear(width: int) -> nn.Linear:
    """A ``width -> 1`` linear map without bias that starts at zero."""
    out = nn.Linear(width, 1, bias=False)
    nn.init.zeros_(out.weight)
    return out


def _cross_map(width: int, rank: int) -> nn.Module:
    """``x -> W x + b`` of one cross layer: full rank, or ``U (V x) + b`` with ``rank > 0``."""
    if rank == 0:
        return nn.Linear(width, width)
    return nn.Sequential(nn.Linear(width, rank, bias=False), nn.Linear(rank, width))
