"""Online residual calibration: the logit offset that corrects what the base rate leaves.

Why: the base rate (``models.base_rate``) is the click rate of all the data so far, and the
network's output bias moves about one learning rate a step, so on a stream whose click rate
moves between adjacent hourly folders (9 % -> 41 %) a pass is predicted at roughly the
previous pass's rate: per-pass COPC swings by tens of percent (issue 26). This layer keeps,
over a recent window of trained examples (exponentially decayed by examples), the sum of
the labels and the sum of the probabilities the model predicted before this correction,
and adds the difference of their log-odds to the logit:
``log((clicks + k) / (examples - clicks + k)) - log((predicted + k) / (examples - predicted + k))``.
At a low click rate that is ``log((clicks + k) / (predicted + k))``; at 40 % the plain
ratio under-corrects (a model at 5 % on a 40 % stream: ratio 8, +2.08 on the logit, 30 %).
``k`` pseudo-clicks (and as many pseudo-non-clicks) shrink it toward 0 where the window
holds few clicks (a low-CTR stream).

Test then train: a batch is observed after it was scored, so no prediction sees its own
labels. The sums are a plain buffer, local to each worker and not summed on the PS (a
recent window is what each worker's own batches estimate best; the PS summary vector
keeps its size, so checkpoints stay compatible); they travel with the exported
TorchScript, so a published model carries the correction of its moment.
"""

import math

import torch
from torch import nn


class ResidualCalibration(nn.Module):
    """``logits -> logits`` + the log-odds of the window's clicks minus those of its
    predictions (``sums``: ``[examples, clicks, predicted]``, decayed by examples)."""

    # A real annotation: TorchScript reads it (no ``from __future__ import annotations``).
    sums: torch.Tensor

    def __init__(self, window: float, pseudo_clicks: float) -> None:
        super().__init__()
        if window <= 0:
            raise ValueError(f"model.calibrationWindow: must be > 0, got {window}")
        if pseudo_clicks <= 0:
            raise ValueError(f"model.calibrationPseudoClicks: must be > 0, got {pseudo_clicks}")
        #: Per-example decay: the window's weight sums to ``window`` examples.
        self.log_decay = math.log1p(-1.0 / window) if window > 1 else -math.inf
        self.pseudo_clicks = float(pseudo_clicks)
        # [examples, clicks, predicted] of the window; starts empty (no correction).
        self.register_buffer("sums", torch.zeros(3))

    def offset(self) -> torch.Tensor:
        """The logit correction of the current window."""
        k = self.pseudo_clicks
        examples, clicks, predicted = self.sums[0], self.sums[1], self.sums[2]
        observed = torch.log(clicks + k) - torch.log(examples - clicks + k)
        expected = torch.log(predicted + k) - torch.log(examples - predicted + k)
        return observed - expected

    def forward(self, logits: torch.Tensor) -> torch.Tensor:
        return logits + self.offset()

    @torch.jit.unused
    def observe(self, labels: torch.Tensor, logits: torch.Tensor) -> None:
        """Add a scored batch: its labels and the probabilities ``logits`` (this layer's
        output for the batch, scored with the current window) had before the correction."""
        with torch.no_grad():
            raw = torch.sigmoid(logits.detach().float() - self.offset())
            decay = math.exp(self.log_decay * labels.numel())
            count = torch.tensor(float(labels.numel()))
            seen = torch.stack([count, labels.sum().float(), raw.sum()])
            self.sums.mul_(decay).add_(seen)

    @torch.no_grad()
    @torch.jit.unused
    def copy_from(self, other: "ResidualCalibration") -> None:
        """Take ``other``'s window (a snapshot copy of the network takes the trainer's)."""
        self.sums.copy_(other.sums)
