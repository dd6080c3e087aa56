"""DIN (Deep Interest Network): attention of the target item over the behaviour sequence.

The target item is the pooled ``[embed_w, embedx]`` of ``target_slot``; the behaviour
sequence is the unpooled per-key embeddings of the data's ``sequenceSlot``. An attention
MLP scores every behaviour ``k`` against the target ``q`` from ``[q, k, q - k, q * k]``;
the user interest is the score-weighted sum of behaviours (unnormalised, as in the DIN
paper, so the interest's magnitude reflects how much matching history there is; padding
is masked out). The interest vector is concatenated to all pooled slots, normalised with
global statistics (``DataNorm``, as in ``slot_dnn``), and fed to the MLP.
"""

from __future__ import annotations

import torch

from streamtrain_worker.models.base import DenseModel, ModelSpec, mlp, register
from streamtrain_worker.models.data_norm import DataNorm, slot_prior


@register("din")
class DIN(DenseModel):
    uses_sequence = True

    def __init__(self, spec: ModelSpec) -> None:
        super().__init__(spec)
        if spec.sequence_slot is None:
            raise ValueError("din needs data.sequenceSlot (the behaviour-sequence slot)")
        for name, slot in (("sequenceSlot", spec.sequence_slot), ("targetSlot", spec.target_slot)):
            if not 0 <= slot < spec.num_slots:
                raise ValueError(f"din: {name} {slot} not in [0, {spec.num_slots})")
        if spec.sequence_slot == spec.target_slot:
            raise ValueError("din: targetSlot must differ from sequenceSlot")
        self.target_slot = spec.target_slot
        self.embed_col = spec.embed_offset
        item = 1 + spec.embedding_dim
        self.attention = mlp(4 * item, spec.attention_units)
        width = spec.num_slots * spec.slot_width + item
        # See slot_dnn: log counts vs embeddings; the interest columns are embeddings.
        prior = slot_prior(spec.num_slots, spec.slot_width, spec.cvm, spec.norm_prior, item)
        self.norm = DataNorm(width, prior)
        self.mlp = mlp(width, spec.hidden_units)

    def forward(
        self,
        pooled: torch.Tensor,
        seq: torch.Tensor | None = None,
        seq_mask: torch.Tensor | None = None,
        ordinal: torch.Tensor | None = None,
    ) -> torch.Tensor:
        if seq is None or seq_mask is None:
            raise ValueError("din needs the behaviour sequence embeddings and mask")
        inputs = self.network_inputs(pooled)
        query = inputs[:, self.target_slot, self.embed_col :]  # (B, E)
        q = query.unsqueeze(1).expand(-1, seq.shape[1], -1)  # (B, L, E)
        scores = self.attention(torch.cat([q, seq, q - seq, q * seq], dim=2)).squeeze(2)
        scores = scores * seq_mask.to(scores.dtype)
        interest = torch.bmm(scores.unsqueeze(1), seq).squeeze(1)  # (B, E)
        features = torch.cat([inputs.flatten(1), interest], dim=1)
        return self.counted_offsets(self.mlp(self.norm(features)).squeeze(1), pooled)
