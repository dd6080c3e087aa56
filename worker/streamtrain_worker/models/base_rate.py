"""The logit offset of the base rate: every model's output starts from the log-odds of the
click rate of all the data trained on so far.

Why: a fresh network predicts p = 0.5, and with Adam its output bias moves about one
learning rate (0.001) a step, so the log-odds of a 17 % base rate (-1.6) takes ~1,600 steps
and a 1 % one (-4.6) ~4,600. Meanwhile the wide weights of the keys already seen carry the
offset, and every key the model has not seen yet (the bulk of a long-tail stream) is
predicted far too high: a fresh long-tail job's first passes had COPC 0.75-0.86, the iPinYou
sample's first pass 0.03 (docs/decisions.md). A faster-moving learned offset fixes the
start but jitters later; a counted one does not: the click rate is a summary statistic
(``models.summary``), summed on the PS over every worker's trained batches like the data
norm's moments, and the learned bias and weights then only learn what differs from it.

The rate starts from one pseudo-example whose label is the prior click rate
(``model.priorClickRate``, 0.1: a model that has seen no data predicts about a typical CTR,
not 0.5). Unlike the data norm's moments, a worker adds its own
batches to its local ``stats`` at once: the offset is what most of a fresh model's first
batches need, and the next dense sync replaces the local sums by the PS's anyway. A batch
is counted after it is scored, so no prediction sees its own labels.

The rate is also the prior of every CVM click column the network reads
(``smoothed_click_columns``). Paddle's column, ``log(C + 1) - log(S + 1)``, counts one
pseudo-show that clicked, so a key never shown reads as a certain click. For an id slot
most keys start that way, and the network learns what it means; a slot whose keys are
usually well counted (an hour crossed with a device) gets new keys only when a new hour
starts, and a model published after one hour scored the next with inputs far outside what
it had trained on: COPC 9 to 124 on one pass of an hourly stream's first day. With one
pseudo-show at the base rate a new key reads as the stream's rate (docs/decisions.md).
"""

import math

import torch

from streamtrain_worker.models.summary import SummaryLayer

#: The rate is clamped to [floor, 1 - floor]: a stream of one label keeps a finite logit.
RATE_FLOOR = 1e-6
#: ``rate_step_scale``: the label variance r (1 - r) of the click rate the sparse steps'
#: defaults were set at (Criteo's sample 21.5 %, the stream families 20-25 %), and the
#: most a lower rate scales a gradient by (docs/decisions.md, issue 26).
REFERENCE_LABEL_VARIANCE = 0.2 * 0.8
MAX_RATE_STEP_SCALE = 4.0


def rate_step_scale(rate: float) -> float:
    """``sqrt(REFERENCE_LABEL_VARIANCE / (r (1 - r)))``, within [1, ``MAX_RATE_STEP_SCALE``].

    A log-loss gradient is ``p - y``, of size about the label's noise ``sqrt(r (1 - r))``,
    while AdaGrad's ``G0`` is an absolute scale: a low-CTR stream's keys take their first
    steps smaller, relative to what they learn from, than a 20 % one's. Scaled by this,
    their steps follow the same schedule in occurrences; the late steps, ``g / sqrt(G)``,
    do not change. A higher rate keeps the steps as they are: smaller ones never gained.
    A rate that is not a number (a corrupt restored count) scales nothing.
    """
    if not math.isfinite(rate):
        return 1.0
    r = min(max(rate, RATE_FLOOR), 1.0 - RATE_FLOOR)
    scale = (REFERENCE_LABEL_VARIANCE / (r * (1.0 - r))) ** 0.5
    return min(max(scale, 1.0), MAX_RATE_STEP_SCALE)


class BaseRate(SummaryLayer):
    """``logits -> logits + log(r / (1 - r))`` with ``r`` the click rate in ``stats``
    (``[examples, clicks]``)."""

    def __init__(self, prior: float = 0.5) -> None:
        super().__init__(torch.tensor([1.0, prior]))
        self.floor = RATE_FLOOR  # an attribute: TorchScript cannot read module globals

    def forward(self, logits: torch.Tensor) -> torch.Tensor:
        rate = self.clamped_rate()
        return logits + (torch.log(rate) - torch.log1p(-rate))

    def clamped_rate(self) -> torch.Tensor:
        """The counted click rate, clamped to [floor, 1 - floor]."""
        return torch.clamp(self.stats[1] / self.stats[0], self.floor, 1.0 - self.floor)

    def smoothed_click_columns(self, pooled: torch.Tensor) -> torch.Tensor:
        """``pooled`` ``(B, S, W)`` with each CVM click column ``log(C + 1) - log(S + 1)``
        read as ``log(C + r) - log(S + 1)``: one pseudo-show at the base rate ``r``
        instead of one that clicked. Computed as ``column + log1p((r - 1) / (C + 1))``
        from ``log(C + 1)``, finite for any finite counts."""
        clicks_log = torch.clamp(pooled[:, :, 0:1] + pooled[:, :, 1:2], min=0.0)
        prior = torch.log1p((self.clamped_rate() - 1.0) * torch.exp(-clicks_log))
        return torch.cat([pooled[:, :, 0:1], pooled[:, :, 1:2] + prior, pooled[:, :, 2:]], dim=2)

    def rate(self) -> float:
        """The counted click rate as the offset uses it."""
        return float(self.clamped_rate())

    def observe(self, labels: torch.Tensor) -> None:
        """Count a trained batch's labels (after it was scored)."""
        with torch.no_grad():
            seen = torch.stack([torch.tensor(float(labels.numel())), labels.sum().float()])
            self.pending += seen
            self.stats += seen
