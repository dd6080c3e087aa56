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
``k`` pseudo-clicks (and as many pseudo-non-clicks; default half a count, the empirical
log-odds' Haldane-Anscombe correction) keep a window without clicks finite; how much of a
noisy correction to apply is the evidence's and the pass split's business (below).

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
to the pass's own by ``max(0, 1 - 2.25 var / gap**2)`` (``var`` the sampling variance of
the pass part's click log-odds, ``gap`` the difference of the two residuals: a
positive-part James-Stein weight that starts at a gap of one and a half standard errors).
A jump of tens of points is many standard errors after a few dozen of the pass's
examples; on a stream whose passes share their rate the gap is noise and the window
corrects as before. A replayed pass starts from empty sums again, so a restart still
scores bit-identically.
Outside training (an evaluation pass, an export, serving) the window alone corrects: an
export is scored on the passes after its own, which start from the window. How much of the
window's residual carries over to the next pass is itself measured (``ResidualPersistence``):
an hour's residual says little of the next hour's, a drift's says much.

How much of the window's correction to apply is the stream's own evidence
(``evidence``, an empirical-Bayes shrinkage). The calibration is for streams whose click
rate moves between time slices (an hour of day); on a stream whose rate holds still the
window's residual is sampling noise added to every prediction. At each training pass's
start the layer counts the window's click log-odds and their sampling variance, over all
passes so far: the variance between passes beyond the noise, ``tau2``, is how much the
rate moves, and the window's correction is applied times ``tau2 / (tau2 + var)``
(``var`` the residual's own sampling variance). The first passes put
``EVIDENCE_PRIOR_PASSES`` passes' weight on the whole correction, so a fresh model
calibrates as before until the stream has shown its kind; a pass's jump of three
standard errors (the split above) is evidence of its own and is followed unshrunk. Per pass,
not per batch: a memory of a few thousand examples sees one hour of a long pass and
took the correction away mid-pass (docs/decisions.md).

What the network learns: trained on the corrected logit, a key in every row of a batch
(the hour of day) gets no gradient for the rate the window already corrects and learns
little of its hour's rate; ``model.calibrationSparesContextKeys`` (off by default) gives
such keys the gradient of the loss at the logit before the correction
(``uncalibrated_gradient_ratio``).

Test then train, example by example: a batch is observed after it was scored, and in
training (``follow_labels``) each example of a batch is scored with the sums of the
examples before it in the batch as well, as an online learner scores each example after
learning from the one before. A pass's first batch is otherwise scored wholly at the
previous pass's rate, and on short passes (700-2,000 rows, 11-31 batches) that one batch
held most of a pass's COPC error where the rate jumps (docs/decisions.md, issue 26). No
prediction sees its own label; serving and evaluation score with the window alone.
"""

import torch
from torch import nn
from torch.nn import functional as nnf

from streamtrain_worker.models.summary import SummaryLayer

#: The largest log of ``uncalibrated_gradient_ratio``: a finite product with any finite
#: float32 gradient of an example's logit.
MAX_LOG_GRADIENT_RATIO = 30.0
#: The PS summary vector of the window (``SummaryLayer.vector``).
CALIBRATION_VECTOR = "calibration"
#: How many variances a pass's gap to the earlier passes must exceed before the correction
#: moves to the pass's own: 2.25, a gap of one and a half standard errors. The plug-in
#: empirical-Bayes weight would start at one; that followed noise on low-CTR and stationary
#: streams, two held the families' jumps back a batch (docs/decisions.md, issue 26).
SPLIT_SIGNIFICANCE = 2.25
#: With the evidence, the significance at which a pass's gap is followed whatever the
#: stream's history: 9, three standard errors (a stationary stream's gaps rarely reach it).
STRICT_SPLIT_SIGNIFICANCE = 9.0
#: The PS summary vector of the evidence (``RateMovement``).
EVIDENCE_VECTOR = "calibration_evidence"
#: Passes of prior weight on the whole correction while the evidence is young: a fresh
#: model calibrates as before until a few passes have shown the stream's kind.
EVIDENCE_PRIOR_PASSES = 2.0
#: The PS summary vector of the residual's persistence (``ResidualPersistence``).
PERSISTENCE_VECTOR = "calibration_persistence"
#: Pairs of passes of prior weight on the window's own correction in an export.
PERSISTENCE_PRIOR_PAIRS = 4.0


def uncalibrated_gradient_ratio(
    logits: torch.Tensor, offsets: torch.Tensor, labels: torch.Tensor
) -> torch.Tensor:
    """Per example, the log loss's gradient at the logit before the correction
    (``logits - offsets``) over its gradient at the calibrated ``logits``: ``(p_raw - y) /
    (p - y)``, in log space so that a saturated prediction stays finite (the ratio is
    within ``exp(+-|offset|)``, and at most ``exp(MAX_LOG_GRADIENT_RATIO)``: a calibrated
    gradient that small is zero in float32 anyway)."""
    raw = logits - offsets
    clicked = labels > 0.5
    # y = 0: p_raw / p; y = 1: (1 - p_raw) / (1 - p).
    sign = torch.where(clicked, -1.0, 1.0)
    log_ratio = nnf.logsigmoid(sign * raw) - nnf.logsigmoid(sign * logits)
    return torch.exp(torch.clamp(log_ratio, max=MAX_LOG_GRADIENT_RATIO))


def window_decay(window: float, batch_size: int) -> float:
    """The per-batch decay of a window of ``window`` examples at ``batch_size``."""
    if window <= 0:
        raise ValueError(f"model.calibrationWindow: must be > 0, got {window}")
    return (1.0 - 1.0 / window) ** batch_size if window > 1 else 0.0


def click_log_odds(sums: torch.Tensor, k: float) -> torch.Tensor:
    """The log-odds of ``sums``' clicks with ``k`` pseudo-clicks (and non-clicks)."""
    return torch.log(sums[1] + k) - torch.log(sums[0] - sums[1] + k)


def residual(sums: torch.Tensor, k: float) -> torch.Tensor:
    """The log-odds of ``sums``' clicks minus those of its predictions, ``k`` pseudo-clicks
    (and non-clicks) on each side (``sums``: ``[examples, clicks, predicted]``)."""
    examples, predicted = sums[0], sums[2]
    expected = torch.log(predicted + k) - torch.log(examples - predicted + k)
    return click_log_odds(sums, k) - expected


def click_log_odds_variance(sums: torch.Tensor, k: float) -> torch.Tensor:
    """The sampling variance of ``sums``' click log-odds (with ``k`` pseudo-clicks)."""
    return 1.0 / (sums[1] + k) + 1.0 / (sums[0] - sums[1] + k)


def log_odds_noise(
    sums: torch.Tensor, k: float, decay: float, expected: torch.Tensor
) -> torch.Tensor:
    """The sampling variance of the click log-odds of ``sums`` (``k`` pseudo-clicks) where
    the clicks vary about ``expected``: the delta method, the count varying as
    ``expected (n - expected) / n`` over ``1 + decay`` (a window decayed by ``decay`` per
    batch holds ``1 + decay`` times its summed weights in effective examples)."""
    # In double: the product of two large float32 counts stays finite.
    examples, clicks, around = sums[0].double(), sums[1].double(), expected.double()
    slope = 1.0 / (clicks + k) + 1.0 / (examples - clicks + k)
    count_variance = around * (examples - around) / torch.clamp(examples, min=1.0)
    return (slope * slope * torch.clamp(count_variance, min=0.0) / (1.0 + decay)).float()


def window_noise(sums: torch.Tensor, k: float, decay: float) -> torch.Tensor:
    """The sampling variance of ``residual(sums, k)`` where the clicks follow the
    predictions (nothing to correct)."""
    return log_odds_noise(sums, k, decay, sums[2])


def _beyond(gap: torch.Tensor, threshold: torch.Tensor) -> torch.Tensor:
    """The positive-part James-Stein weight of ``gap`` against ``threshold`` (its variance
    times the significance): 0 below it, toward 1 far beyond it."""
    return torch.clamp(1.0 - threshold / (gap * gap + 1e-12), min=0.0)


class RateMovement(SummaryLayer):
    """Over every pass so far (``stats``, never decayed): ``[passes, sum of the window's
    click log-odds at each pass start, sum of their squares, sum of their sampling
    variances]``, one term per training pass of each worker."""

    def __init__(self) -> None:
        super().__init__(torch.zeros(4), vector=EVIDENCE_VECTOR, decay=1.0)
        self.prior_passes = EVIDENCE_PRIOR_PASSES

    def strength(self, noise: torch.Tensor) -> torch.Tensor:
        """The share of a correction of noise variance ``noise`` to apply: ``tau2 / (tau2 +
        noise)``, ``tau2`` the variance of the rate between passes beyond its noise, with
        ``EVIDENCE_PRIOR_PASSES`` passes' weight on 1 (the whole correction)."""
        # In double: the squares of any finite float32 sums stay finite.
        stats = self.stats.double()
        spreads = torch.clamp(stats[0] - 1.0, min=0.0)  # a variance needs two passes
        filled = spreads / (spreads + self.prior_passes)
        passes = torch.clamp(stats[0], min=1.0)
        mean = stats[1] / passes
        spread = stats[2] / passes - mean * mean - stats[3] / passes
        signal = torch.clamp(spread, min=0.0)
        shrunk = signal / (signal + torch.clamp(noise.double(), min=0.0) + 1e-12)
        return (filled * shrunk + (1.0 - filled)).float()

    @torch.jit.unused
    def record(self, log_odds: torch.Tensor, noise: torch.Tensor) -> None:
        """Count the window's log-odds and their sampling variance at a pass start. The
        vector never decays, so the other batches' pushes (zeros) change nothing here."""
        seen = torch.stack([torch.ones(()), log_odds, log_odds * log_odds, noise]).float()
        self.pending += seen
        self.stats += seen


class ResidualPersistence(SummaryLayer):
    """What a model exported after one pass should correct on the next: over the training
    passes of every worker (``stats``, never decayed), ``[passes, sum r, sum r', sum r**2,
    sum r r']``, ``r`` the window's residual as a pass starts (what an export of the pass
    before applies to it) and ``r'`` the residual of that pass's own examples (what it
    needed). An export applies their least-squares line, ``mean r' + slope (r - mean
    r)`` with the slope in [0, 1]: where a pass's residual carries over (drift) the
    window's, where the next hour's differs (an hour of day) the stream's mean, with
    ``PERSISTENCE_PRIOR_PAIRS`` pairs of weight on the window's own until the stream has
    shown its kind.

    A pass's pair is pushed as it grows, each batch the change of the pair's terms, so
    the pass's pushes sum to its whole pair: a pass replayed from its start after a
    restart pushes the same changes, and the vector stays bit-identical."""

    opened: torch.Tensor
    pass_totals: torch.Tensor

    def __init__(self) -> None:
        super().__init__(torch.zeros(5), vector=PERSISTENCE_VECTOR, decay=1.0)
        self.prior_pairs = PERSISTENCE_PRIOR_PAIRS
        # This worker's training pass in hand: ``[opened, r]`` (opened 1 when the window
        # held examples as it started) and its own undecayed sums. Rebuilt by a replay.
        self.register_buffer("opened", torch.zeros(2), persistent=False)
        self.register_buffer("pass_totals", torch.zeros(3), persistent=False)

    def predict(self, window: torch.Tensor, fallback: torch.Tensor) -> torch.Tensor:
        """The correction to export for a window residual ``window``; ``fallback`` where
        the pairs are few."""
        # In double: the squares of any finite float32 sums stay finite.
        stats = self.stats.double()
        spreads = torch.clamp(stats[0] - 1.0, min=0.0)  # a slope needs two pairs
        filled = spreads / (spreads + self.prior_pairs)
        pairs = torch.clamp(stats[0], min=1.0)
        mean_r, mean_next = stats[1] / pairs, stats[2] / pairs
        var_r = stats[3] / pairs - mean_r * mean_r
        cov = stats[4] / pairs - mean_r * mean_next
        slope = torch.clamp(cov / torch.clamp(var_r, min=1e-12), min=0.0, max=1.0)
        line = mean_next + slope * (window.double() - mean_r)
        return (filled * line + (1.0 - filled) * fallback.double()).float()

    @torch.jit.unused
    def open_pass(self, window: torch.Tensor | None) -> None:
        """A training pass starts from a window of residual ``window`` (None: empty)."""
        self.pass_totals.zero_()
        self.opened.zero_()
        if window is not None and bool(torch.isfinite(window)):
            self.opened.copy_(torch.stack([torch.ones(()), window.float()]))

    @torch.jit.unused
    def add(self, seen: torch.Tensor, k: float) -> None:
        """A trained batch's ``[examples, clicks, predicted]``: its change of the pair."""
        before = self._pair(k)
        self.pass_totals += seen
        change = self._pair(k) - before
        self.pending += change
        self.stats += change

    def _pair(self, k: float) -> torch.Tensor:
        """The pass's pair terms so far: ``[1, r, r', r**2, r r']``, or zeros."""
        if float(self.opened[0]) <= 0.0 or float(self.pass_totals[0]) < 1.0:
            return torch.zeros(5)
        r, needed = self.opened[1], residual(self.pass_totals, k)
        return torch.stack([torch.ones(()), r, needed, r * r, r * needed]).float()


class ResidualCalibration(SummaryLayer):
    """``logits -> logits`` + the log-odds of the window's clicks minus those of its
    predictions (``stats``: ``[examples, clicks, predicted]``, decayed per batch), or in
    training with ``pass_split`` the current pass's own where it differs beyond its noise."""

    pass_sums: torch.Tensor
    batch_labels: torch.Tensor
    scored_offsets: torch.Tensor

    def __init__(
        self,
        decay: float,
        pseudo_clicks: float,
        pass_split: bool = False,
        evidence: bool = False,
    ) -> None:
        if not 0.0 <= decay < 1.0:
            raise ValueError(f"calibration window decay: must be in [0, 1), got {decay}")
        if pseudo_clicks <= 0:
            raise ValueError(f"model.calibrationPseudoClicks: must be > 0, got {pseudo_clicks}")
        # The window starts empty (no correction); its own PS vector and per-batch decay.
        super().__init__(torch.zeros(3), vector=CALIBRATION_VECTOR, decay=decay)
        self.pseudo_clicks = float(pseudo_clicks)
        self.pass_split = bool(pass_split)
        self.split_significance = SPLIT_SIGNIFICANCE
        self.strict_significance = STRICT_SPLIT_SIGNIFICANCE
        self.register_buffer("pass_sums", torch.zeros(3), persistent=False)
        # The batch being scored in training (``follow_labels``), and what ``forward``
        # scored it with; empty outside a training step.
        self.register_buffer("batch_labels", torch.zeros(0), persistent=False)
        self.register_buffer("scored_offsets", torch.zeros(0), persistent=False)
        # Zero or one evidence (TorchScript: a list, not an Optional).
        self.evidence = nn.ModuleList([RateMovement()] if evidence else [])
        # Zero or one persistence, with the evidence: what an export applies.
        self.persistence = nn.ModuleList([ResidualPersistence()] if evidence else [])
        self.pass_starting = False

    def strength(self) -> torch.Tensor:
        """The share of the correction to apply: the evidence's, 1 without one."""
        return self._strength(self.stats)

    def _strength(self, stats: torch.Tensor) -> torch.Tensor:
        out = torch.ones(())
        for evidence in self.evidence:
            assert isinstance(evidence, RateMovement)
            noise = window_noise(stats, self.pseudo_clicks, self.decay)
            out = out * evidence.strength(noise)
        return out

    def offset(self) -> torch.Tensor:
        """The logit correction of the current window (and pass), times the strength."""
        return self._correction(self.stats, self.pass_sums)

    def _correction(self, stats: torch.Tensor, pass_sums: torch.Tensor) -> torch.Tensor:
        """The correction of window sums ``stats`` and pass sums ``pass_sums`` (``(3,)``, or
        ``(3, B)``: one column per example)."""
        k = self.pseudo_clicks
        window = residual(stats, k)
        strength = self._strength(stats)
        shrunk = strength * window
        if not self.training:
            for persistence in self.persistence:
                assert isinstance(persistence, ResidualPersistence)
                shrunk = persistence.predict(window, shrunk)
            return shrunk
        if not self.pass_split:
            return shrunk
        own = residual(pass_sums, k)
        # ``stats`` holds this worker's every batch (a dense sync adds back its pushes in
        # flight, ``Trainer._load_pulled``); the earlier part is still clipped to sums a
        # window can hold, whatever finite sums a sync or a test hands in.
        earlier = torch.clamp(stats - pass_sums, min=0.0)
        examples = earlier[0]
        earlier = torch.stack(
            [examples, torch.minimum(earlier[1], examples), torch.minimum(earlier[2], examples)]
        )
        gap = own - residual(earlier, k)
        variance = click_log_odds_variance(pass_sums, k)
        # On a stream whose rate holds still, a jump of three standard errors is still
        # evidence of its own, followed whatever the history says (at strength 1, without
        # evidence, the 1.5-standard-error weight is the larger one).
        keep = torch.maximum(
            strength * _beyond(gap, self.split_significance * variance),
            _beyond(gap, self.strict_significance * variance),
        )
        return shrunk + keep * (own - shrunk)

    def forward(self, logits: torch.Tensor) -> torch.Tensor:
        if self.training and 0 < logits.numel() == self.batch_labels.numel():
            return self._progressive(logits)
        return logits + self.offset()

    @torch.jit.unused
    def _progressive(self, logits: torch.Tensor) -> torch.Tensor:
        """``logits`` corrected example by example: each with the sums plus the batch's
        examples before it (their labels, and their probabilities before the correction)."""
        raw = torch.sigmoid(logits.detach().float())
        seen = torch.stack([torch.ones_like(raw), self.batch_labels, raw])
        before = torch.cumsum(seen.double(), dim=1).float() - seen
        offsets = self._correction(
            self.stats.unsqueeze(1) + before, self.pass_sums.unsqueeze(1) + before
        )
        self.scored_offsets = offsets.detach()
        return logits + offsets

    def batch_offset(self) -> torch.Tensor:
        """The correction the batch in hand was scored with: per example in a training
        step, else the current one."""
        if self.scored_offsets.numel() > 0:
            return self.scored_offsets
        return self.offset()

    @torch.jit.unused
    def follow_labels(self, labels: torch.Tensor) -> None:
        """The next training batch's labels: ``forward`` scores each of its examples with
        the ones before it counted (test then train, example by example)."""
        self.batch_labels = labels.detach().float().reshape(-1)

    @torch.jit.unused
    def begin_pass(self) -> None:
        """A new pass (time slice): its own sums start empty; a training pass's first
        batch gives the evidence the window as the pass starts."""
        self.pass_sums.zero_()
        self.pass_starting = self.training
        self._forget_batch()

    @torch.jit.unused
    def _forget_batch(self) -> None:
        empty = torch.zeros(0)
        self.batch_labels, self.scored_offsets = empty, empty

    @torch.jit.unused
    def observe(self, labels: torch.Tensor, logits: torch.Tensor) -> None:
        """Add a scored batch: its labels and the probabilities ``logits`` (this layer's
        output for the batch) had before the correction it was scored with
        (``batch_offset``).
        ``stats`` follows locally what the PS does with the push (decay, then add)."""
        with torch.no_grad():
            raw = torch.sigmoid(logits.detach().float() - self.batch_offset())
            self._forget_batch()
            k = self.pseudo_clicks
            if self.pass_starting:  # the window this pass started from
                filled = float(self.stats[0]) >= 1.0
                for persistence in self.persistence:
                    assert isinstance(persistence, ResidualPersistence)
                    persistence.open_pass(residual(self.stats, k) if filled else None)
                if filled:
                    for evidence in self.evidence:
                        assert isinstance(evidence, RateMovement)
                        noise = log_odds_noise(self.stats, k, self.decay, self.stats[1])
                        evidence.record(click_log_odds(self.stats, k), noise)
            self.pass_starting = False
            count = torch.tensor(float(labels.numel()))
            seen = torch.stack([count, labels.sum().float(), raw.sum()])
            self.pending += seen
            self.stats.mul_(self.decay)
            self.stats += seen
            self.pass_sums.mul_(self.decay)
            self.pass_sums += seen
            for persistence in self.persistence:
                assert isinstance(persistence, ResidualPersistence)
                persistence.add(seen, k)
