"""The context's counted click rate: a slot whose key is in every row of a batch (an hour
of day) offsets the logit by that key's own click rate, counted on the PS.

Why: a time-sliced stream's folders each hold one context (an hourly folder, one hour of
day), and the click rate can move by tens of points from one to the next (issue 26). The
base rate (``models.base_rate``) counts the rate of all the data; the residual calibration
(``models.calibration``) follows the pass's rate within a pass but carries the pass's own
correction into the model published after it, which is scored on the next pass, another
hour. The hour's key, meanwhile, learns little of its hour's rate: trained on the
calibrated logit, it sees no error the window already took (docs/decisions.md). What the
next hour's rate is the PS already knows: every key's show and click counts, pulled with
its row, are the CVM columns of its slot. A slot found constant within training batches
is a context; its key's rate, shrunk to the base rate by ``CONTEXT_PRIOR_EXAMPLES``, gives
``log-odds(context rate) - log-odds(base rate)``, added to the logit after the base rate,
counted like it, with no gradient. A key of tomorrow's same hour then starts from today's
rate, and an hour not seen yet from the base rate (its counts are zero).

In training, a context is offset by its counts from before the current pass: those
pulled with the first batch in which the pass met its key (``follow_keys``: the first
example's keys, given by the trainer), which hold none of the pass's pushes on this
worker and, as every worker starts the pass together, few of any other's. Within the
pass the residual calibration follows the pass's rate; an offset that also rose with the
pass's own counts stacked on it, and the window, holding predictions made before the
offset rose, over-corrected: day 1 of every stream family lost AUC (docs/decisions.md).
Scored outside training (an export, serving) the counts are the PS's, the pass's own
included: the model published after an hour scores the next hour from that hour's counts.

The network does not see a context slot's row (``DenseModel.network_inputs`` zeroes it):
the offset is the one owner of what a context says. On an hour's first day its key's
embedding and CVM columns learned the hour's rate while the offset was still 0 (the key
unseen); fed to the network on the next day, beside the offset that now counts it, they
counted the rate twice, and the model published after one hour scored the next one off
by what the network had kept of the hour before (docs/decisions.md).

Which slots are contexts is a summary statistic (``models.summary``): per slot, the share
of recent training batches in which every row pooled the same row, summed on the PS in a
vector of its own (a checkpoint written before this layer existed restores without it and
starts counting) and exported with the model, so serving (a request of one row is constant
in every slot) applies the offset of the slots training found constant. Of several context
slots (an hour and a date), the one whose offset is largest counts: they describe one
slice, and their sum would count its rate twice.
"""

import torch

from streamtrain_worker.models.summary import SummaryLayer

#: Pseudo-examples at the base rate a context key's own counts are shrunk toward: a new
#: hour's first batch (64 rows) moves the offset about 40 % of the way to its rate.
CONTEXT_PRIOR_EXAMPLES = 100.0
#: Pseudo-batches (none constant) the context shares start from: a slot is a context once
#: its batches were constant at least as often as not, which takes a few batches.
CONTEXT_PRIOR_BATCHES = 4.0
#: The PS summary vector of the counts, and its decay per batch: about the last 1,000
#: batches count.
CONTEXT_VECTOR = "context_rate"
CONTEXT_BATCH_DECAY = 0.999
#: The share of constant training batches from which a slot counts as a context.
CONTEXT_SHARE = 0.5
#: A context key's rate is clamped to [floor, 1 - floor], as the base rate's.
CONTEXT_RATE_FLOOR = 1e-6


class ContextRate(SummaryLayer):
    """``logits -> logits + log-odds(context rate) - log-odds(base rate)``; ``stats`` is
    ``[batches, constant batches of slot 0, ..., of slot S - 1]``."""

    # Real annotations: TorchScript reads them (no ``from __future__ import annotations``).
    anchor: torch.Tensor
    anchor_key: torch.Tensor
    anchored: torch.Tensor
    followed: torch.Tensor
    constant: torch.Tensor

    def __init__(self, num_slots: int) -> None:
        initial = torch.zeros(1 + num_slots)
        initial[0] = CONTEXT_PRIOR_BATCHES
        super().__init__(initial, CONTEXT_VECTOR, CONTEXT_BATCH_DECAY)
        self.prior_examples = CONTEXT_PRIOR_EXAMPLES
        self.share = CONTEXT_SHARE
        self.floor = CONTEXT_RATE_FLOOR
        #: Per slot, the counts ``[shows, clicks]`` of the context key first met in the
        #: current training pass, as pulled then (before the pass's own pushes), the key,
        #: and whether a key was met (``begin_pass`` forgets them).
        self.register_buffer("anchor", torch.zeros(num_slots, 2), persistent=False)
        self.register_buffer(
            "anchor_key", torch.zeros(num_slots, dtype=torch.int64), persistent=False
        )
        self.register_buffer("anchored", torch.zeros(num_slots), persistent=False)
        #: Between ``follow_keys`` and the batch's ``observe``: 1 (the anchors and
        #: ``constant`` are this batch's), and per slot 1 where the batch is constant.
        self.register_buffer("followed", torch.zeros(1), persistent=False)
        self.register_buffer("constant", torch.zeros(num_slots), persistent=False)

    def begin_pass(self) -> None:
        """A training pass starts: no context key met yet."""
        self.anchored.zero_()

    def follow_keys(self, pooled: torch.Tensor, keys: torch.Tensor) -> None:
        """The training batch about to be scored: ``keys`` ``(S,)`` its first example's key
        of each slot. A constant slot whose key the pass has not met yet anchors at the
        counts pulled now. A batch of one row is constant in every slot and is no evidence:
        it is not followed."""
        with torch.no_grad():
            if pooled.shape[0] < 2:
                return
            counts = _counts(pooled[:1])[0]
            self.constant.copy_(_constant_slots(pooled))
            new = self.constant * ((self.anchored == 0) | (self.anchor_key != keys))
            fresh = new > 0
            self.anchor[fresh] = counts[fresh]
            self.anchor_key[fresh] = keys[fresh]
            self.anchored[fresh] = 1.0
            self.followed.fill_(1.0)

    def contexts(self) -> torch.Tensor:
        """``(S,)``: 1 for a slot counted as a context, else 0."""
        return (self.stats[1:] >= self.share * self.stats[0]).float()

    def forward(
        self, logits: torch.Tensor, pooled: torch.Tensor, rate: torch.Tensor
    ) -> torch.Tensor:
        """``pooled`` ``(B, S, W)`` with the CVM columns first (``log(S + 1)``, ``log(C +
        1) - log(S + 1)``); ``rate`` the base rate the logit is offset by already."""
        counts = _counts(pooled)
        if self.training and bool(self.followed[0] > 0):
            # In training a context is scored by what was known before its pass: the
            # pass's own rate is the calibration's to follow (the module's doc).
            use = (self.constant * self.anchored).view(1, -1, 1) > 0
            counts = torch.where(use, self.anchor.unsqueeze(0), counts)
        shows = counts[:, :, 0]
        clicks = torch.minimum(counts[:, :, 1], shows)
        shrunk = (clicks + self.prior_examples * rate) / (shows + self.prior_examples)
        shrunk = torch.clamp(shrunk, self.floor, 1.0 - self.floor)
        offsets = torch.log(shrunk) - torch.log1p(-shrunk) - (torch.log(rate) - torch.log1p(-rate))
        offsets = offsets * self.contexts().unsqueeze(0)
        largest = offsets.abs().argmax(dim=1, keepdim=True)
        return logits + offsets.gather(1, largest).squeeze(1)

    def observe(self) -> None:
        """Count which slots the trained batch ``follow_keys`` was given pooled the same row
        in every example of (a batch not followed counts as no evidence). ``stats``
        follows locally what the PS does with the push (decay, then add)."""
        with torch.no_grad():
            self.stats.mul_(self.decay)
            if bool(self.followed[0] > 0):
                seen = torch.cat([torch.ones(1), self.constant])
                self.pending += seen
                self.stats += seen
            self.followed.zero_()


def _counts(pooled: torch.Tensor) -> torch.Tensor:
    """``(B, S, 2)``: the PS's ``[shows, clicks]`` behind the CVM columns of ``pooled``."""
    cvm = pooled[:, :, :2].detach()
    shows = torch.clamp(torch.expm1(cvm[:, :, 0]), min=0.0)
    clicks = torch.clamp(torch.expm1(cvm[:, :, 0] + cvm[:, :, 1]), min=0.0)
    return torch.stack([shows, clicks], dim=2)


def _constant_slots(pooled: torch.Tensor) -> torch.Tensor:
    """``(S,)``: 1 where every row of ``pooled`` holds the same pooled row as the first."""
    return (pooled == pooled[:1]).all(dim=2).all(dim=0).float()
