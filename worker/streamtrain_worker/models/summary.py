"""Layers whose state is a statistic of all the training data, summed on the PS.

Some of a model's state is not learned by gradients but counted: the data norm's column
moments (``models.data_norm``) and the click rate behind the logit offset
(``models.base_rate``). Each such layer keeps its counts in a ``stats`` buffer. In
training, what a batch adds goes into ``pending``; the trainer drains every layer's
``pending`` into one flat vector, pushes it beside the dense gradient to a PS dense vector
with the summary rule (``values = decay * values + pushed``: sums over every worker's
batches), and loads the sums back into ``stats`` at every dense sync. The flat layout is
the layers' ``stats`` in module registration order, so it is fixed by the model's
structure; the buffers travel with the exported TorchScript, so serving applies the same
statistics as training.

A layer whose statistics need another decay than the model's ``summaryDecayRate`` (the
calibration window of ``models.calibration``: a few hundred examples, not all the data)
names its own vector (``vector``) and per-push ``decay``; ``summary_groups`` splits the
layers by vector, and every batch's part of each vector is pushed on its own, so the PS
decays once per batch whether or not pushes were merged.
"""

import torch
from torch import nn


class SummaryLayer(nn.Module):
    """A layer with summed statistics: ``stats`` (the PS sums) and ``pending`` (this
    worker's contributions since the last drain), of the same shape."""

    # Real annotations: TorchScript reads them, so this module does without
    # ``from __future__ import annotations``.
    stats: torch.Tensor
    pending: torch.Tensor

    def __init__(self, initial: torch.Tensor, vector: str = "", decay: float = 0.0) -> None:
        super().__init__()
        #: The PS summary vector holding ``stats``: "" the model's main one (decayed by
        #: ``model.summaryDecayRate``), else a vector of its own decayed by ``decay``.
        self.vector = vector
        self.decay = float(decay)
        self.register_buffer("stats", initial.detach().clone().float())
        self.register_buffer("pending", torch.zeros_like(self.stats), persistent=False)


def summary_layers(model: nn.Module) -> list[SummaryLayer]:
    """The model's summary layers, in a fixed order (module registration order)."""
    return [m for m in model.modules() if isinstance(m, SummaryLayer)]


def summary_groups(layers: list[SummaryLayer]) -> dict[str, list[SummaryLayer]]:
    """``layers`` by PS vector (``SummaryLayer.vector``), each list in module order; the
    layers of one named vector must share its decay."""
    groups: dict[str, list[SummaryLayer]] = {}
    for layer in layers:
        group = groups.setdefault(layer.vector, [])
        if group and layer.vector and group[0].decay != layer.decay:
            raise ValueError(
                f"summary vector {layer.vector!r}: decays {group[0].decay} and {layer.decay}"
            )
        group.append(layer)
    return groups


def gather_stats(layers: list[SummaryLayer]) -> torch.Tensor:
    """All layers' statistics as one flat vector (the PS summary vector's layout)."""
    if not layers:
        return torch.zeros(0)
    return torch.cat([n.stats.reshape(-1) for n in layers])


def scatter_stats(layers: list[SummaryLayer], values: torch.Tensor) -> None:
    """Load a flat summary vector back into the layers' ``stats`` buffers."""
    expected = sum(n.stats.numel() for n in layers)
    if values.shape != (expected,):
        raise ValueError(
            f"summary statistics (data norm, base rate, calibration): expected {expected} "
            f"values, got {tuple(values.shape)}"
        )
    offset = 0
    with torch.no_grad():
        for n in layers:
            size = n.stats.numel()
            n.stats.copy_(values[offset : offset + size].view_as(n.stats))
            offset += size


def drain_pending(layers: list[SummaryLayer]) -> torch.Tensor:
    """The batch contributions accumulated since the last drain, flat; resets them."""
    if not layers:
        return torch.zeros(0)
    out = torch.cat([n.pending.reshape(-1) for n in layers])
    for n in layers:
        n.pending.zero_()
    return out
