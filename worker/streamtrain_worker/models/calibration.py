"""Online residual calibration: the logit offset that corrects what the base rate leaves.

Why: the base rate (``models.base_rate``) is the click rate of all the data so far, and the
network's output bias moves about one learning rate a step, so on a stream whose click rate
moves between adjacent hourly folders (9 % -> 41 %) a pass is predicted at roughly the
previous pass's rate: per-pass COPC swings by tens of percent (issue 26). This layer keeps,
over a recent window of trained examples, the sum of the labels and the sum of the
probabilities the model predicted before this correction, and adds the difference of their
log-odds to the logit:
``log((clicks + k) / (examples - clicks + k)) - log((predicted + k) / (examples - predicted + k))``.
At a low click rate that is ``log((clicks + k) / (predicted + k))``; at 40 % the plain
ratio under-corrects (a model at 5 % on a 40 % stream: ratio 8, +2.08 on the logit, 30 %).
``k`` pseudo-clicks (and as many pseudo-non-clicks) shrink it toward 0 where the window
holds few clicks (a low-CTR stream).

The window is a summary statistic (``models.summary``) in its own PS summary vector, whose
decay is per push: every batch's sums are pushed as one part and the PS applies
``sums = decay * sums + batch``, with ``decay = (1 - 1 / window) ** batchSize`` (the
window's weights sum to about ``window`` examples of all workers' batches). So the window
is checkpointed with the model, a restarted job continues from the same sums, every worker
loads the same sums at each dense sync (and adds its own batches locally in between, like
the base rate), and a PS snapshot's export carries the sums of its moment.

A pass is a time slice (an hour's folder), and its click rate can be tens of points from
the previous one's, which the window then follows only as fast as it forgets. So the
layer also keeps the window's part from the current pass (``pass_sums``, this worker's,
decayed alike, emptied at every pass's start). Where that part's residual differs from
the earlier passes' part by more than its noise, the correction moves from the window's
to the pass's own by ``max(0, 1 - 4 var / gap**2)`` (``var`` the sampling variance of the
pass part's click log-odds, ``gap`` the difference of the two residuals: a positive-part
James-Stein weight that starts at a gap of two standard errors). A jump of tens of
points is many standard errors after a few dozen of the pass's examples; on a stream
whose passes share their rate the gap is noise and the window corrects as before. A
replayed pass starts from empty sums again, so a restart still scores bit-identically.
Outside training (an evaluation pass, an export, serving) the window alone corrects: an
export is scored on the passes after its own, which start from the window.

Test then train: a batch is observed after it was scored, so no prediction sees its own
labels.
"""

import torch

from streamtrain_worker.models.summary import SummaryLayer

#: The PS summary vector of the window (``SummaryLayer.vector``).
CALIBRATION_VECTOR = "calibration"
#: How many variances a pass's gap to the earlier passes must exceed before the correction
#: moves to the pass's own: 4, a gap of two standard errors (a steady stream's gaps are
#: noise and must not move it; docs/decisions.md, issue 26).
SPLIT_SIGNIFICANCE = 4.0


def window_decay(window: float, batch_size: int) -> float:
    """The per-batch decay of a window of ``window`` examples at ``batch_size``."""
    if window <= 0:
        raise ValueError(f"model.calibrationWindow: must be > 0, got {window}")
    return (1.0 - 1.0 / window) ** batch_size if window > 1 else 0.0


def residual(sums: torch.Tensor, k: float) -> torch.Tensor:
    """The log-odds of ``sums``' clicks minus those of its predictions, ``k`` pseudo-clicks
    (and non-clicks) on each side (``sums``: ``[examples, clicks, predicted]``)."""
    examples, clicks, predicted = sums[0], sums[1], sums[2]
    observed = torch.log(clicks + k) - torch.log(examples - clicks + k)
    expected = torch.log(predicted + k) - torch.log(examples - predicted + k)
    return observed - expected


def click_log_odds_variance(sums: torch.Tensor, k: float) -> torch.Tensor:
    """The sampling variance of ``sums``' click log-odds (with ``k`` pseudo-clicks)."""
    return 1.0 / (sums[1] + k) + 1.0 / (sums[0] - sums[1] + k)


class ResidualCalibration(SummaryLayer):
    """``logits -> logits`` + the log-odds of the window's clicks minus those of its
    predictions (``stats``: ``[examples, clicks, predicted]``, decayed per batch), or in
    training with ``pass_split`` the current pass's own where it differs beyond its noise."""

    pass_sums: torch.Tensor

    def __init__(self, decay: float, pseudo_clicks: float, pass_split: bool = False) -> None:
        if not 0.0 <= decay < 1.0:
            raise ValueError(f"calibration window decay: must be in [0, 1), got {decay}")
        if pseudo_clicks <= 0:
            raise ValueError(f"model.calibrationPseudoClicks: must be > 0, got {pseudo_clicks}")
        # The window starts empty (no correction); its own PS vector and per-batch decay.
        super().__init__(torch.zeros(3), vector=CALIBRATION_VECTOR, decay=decay)
        self.pseudo_clicks = float(pseudo_clicks)
        self.pass_split = bool(pass_split)
        self.split_significance = SPLIT_SIGNIFICANCE
        self.register_buffer("pass_sums", torch.zeros(3), persistent=False)

    def offset(self) -> torch.Tensor:
        """The logit correction of the current window (and pass)."""
        k = self.pseudo_clicks
        window = residual(self.stats, k)
        if not self.pass_split or not self.training:
            return window
        own = residual(self.pass_sums, k)
        # ``stats`` is the PS's as of the last dense sync, which may lag this worker's
        # latest pushes: the earlier part is clipped to sums a window can hold.
        earlier = torch.clamp(self.stats - self.pass_sums, min=0.0)
        examples = earlier[0]
        earlier = torch.stack(
            [examples, torch.minimum(earlier[1], examples), torch.minimum(earlier[2], examples)]
        )
        gap = own - residual(earlier, k)
        variance = click_log_odds_variance(self.pass_sums, k)
        threshold = self.split_significance * variance
        keep = torch.clamp(1.0 - threshold / (gap * gap + 1e-12), min=0.0)
        return window + keep * (own - window)

    def forward(self, logits: torch.Tensor) -> torch.Tensor:
        return logits + self.offset()

    @torch.jit.unused
    def begin_pass(self) -> None:
        """A new pass (time slice): its own sums start empty."""
        self.pass_sums.zero_()

    @torch.jit.unused
    def observe(self, labels: torch.Tensor, logits: torch.Tensor) -> None:
        """Add a scored batch: its labels and the probabilities ``logits`` (this layer's
        output for the batch, scored with the current window) had before the correction.
        ``stats`` follows locally what the PS does with the push (decay, then add)."""
        with torch.no_grad():
            raw = torch.sigmoid(logits.detach().float() - self.offset())
            count = torch.tensor(float(labels.numel()))
            seen = torch.stack([count, labels.sum().float(), raw.sum()])
            self.pending += seen
            self.stats.mul_(self.decay)
            self.stats += seen
            self.pass_sums.mul_(self.decay)
            self.pass_sums += seen
