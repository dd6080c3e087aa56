"""Input normalisation with global, summed statistics (the role of Paddle's ``data_norm``).

Each column ``j`` is standardised as ``y = (x - mean_j) / sqrt(var_j + epsilon)`` with
``mean_j = sum_j / count_j`` and ``var_j = squares_j / count_j - mean_j**2``, where
``count``, ``sum`` and ``squares`` (the sum of ``x**2``) are summed over *all* the training
data seen so far, by every worker: they live in a PS dense vector with the summary rule
(``streamtrain_ps.engine.dense``: ``values = decay * values + pushed``), and each worker pushes its
batches' contributions with the dense gradients and pulls the sums when it syncs.

Why not ``BatchNorm``: streaming CTR batches are not i.i.d. A batch comes from one time
slice, so features such as the hour or the day's campaign are (nearly) constant within it.
Batch statistics then zero such a column during training (its batch variance is ~0), while
the running statistics used at inference normalise it against the mix of all slices: the
exported model saw inputs 15 standard deviations from anything it was trained on, and the
demo's served COPC was 2-10 where training reported ~1 (``docs/decisions.md``). With summed
statistics, training and serving apply the very same transform, every worker agrees, and
the statistics are checkpointed with the model.

Why raw moments (``x**2``), not Paddle's squared deviations from the current mean: the
deviations are taken from a mean that is still moving (it starts at the prior's 0), and
those early, inflated terms stay in the sum; raw moments add up exactly across batches,
workers and decay. In float32 the variance of a column whose mean is 100x its standard
deviation loses ~3 digits, harmless for a normaliser (``var`` is clamped at 0).

The statistics start from ``prior`` pseudo-examples with mean 0 and variance 1 (Paddle
starts from 1e4 of them), so a model that has seen no data is the identity; ``prior`` may
be one count per column. ``SlotInputNorm`` gives the embedding columns 1: light, because
embeddings start with tiny variances that a heavy prior would overstate for thousands of
examples, yet not negligible: with 0.01, statistics from the first, still near-zero
embeddings scaled the grown ones up to 316-fold and the loss spiked. The CVM columns get the
job's ``dataNormPrior`` (default 100): a fresh job's keys are all new, so its first batches'
log counts are all exactly 0, and one pseudo-example let them collapse the variance and blow
the standardised counts up once keys had shows (docs/decisions.md, issue 10). ``epsilon``
(1e-4, Paddle's ``squared_sum_epsilon``) is added to the variance: it caps the scale at 100
and gives a column that is constant everywhere a finite one.

Statistics are buffers, not parameters: no gradient flows into them. Two things are
borrowed from batch norm's training behaviour, because without them small streams learn
much more slowly (the synthetic e2e stream: AUC 0.48-0.60 instead of 0.66-0.74 over its
first passes, ``docs/decisions.md``): a learned per-column affine (``weight``, ``bias``;
Paddle's ``enable_scale_and_shift``), and a backward pass that subtracts the batch mean of
the gradient from the inputs' gradient (batch norm's centring term). Early in training the
batch-common part of the gradient is the calibration error (every prediction too high);
centred, it goes to the biases instead of pushing every embedding the same way. The
forward value is unchanged: the centring adds ``c - c.detach()``, exactly 0.
"""

import torch
from torch import nn

from streamtrain_worker.models.summary import SummaryLayer

#: Pseudo-examples of the initial statistics (mean 0, variance 1) of the CVM columns.
DEFAULT_PRIOR = 100.0
#: Added to the variance: caps the scale at 100 (Paddle's ``squared_sum_epsilon``).
DEFAULT_EPSILON = 1e-4


class DataNorm(SummaryLayer):
    """``(B, F)`` -> ``(B, F)`` standardised with the global statistics in ``stats``, then
    scaled and shifted by the learned ``weight`` and ``bias``.

    ``stats`` is ``(3, F)``: count, sum, sum of squares — the layout of the PS summary
    vector. In training mode every forward also adds the batch's contribution to
    ``pending`` (same layout); the trainer drains it into the next push
    (``models.summary.drain_pending``). The same forward runs under TorchScript for serving.
    """

    def __init__(
        self,
        width: int,
        prior: float | torch.Tensor = DEFAULT_PRIOR,
        epsilon: float = DEFAULT_EPSILON,
    ) -> None:
        counts = torch.as_tensor(prior, dtype=torch.float32).expand(width)
        if bool((counts <= 0).any()):
            raise ValueError(f"data norm prior must be > 0, got {prior}")
        stats = torch.zeros(3, width)
        stats[0] = counts  # per column: pseudo-examples of mean 0, variance 1
        stats[2] = counts
        super().__init__(stats)
        self.epsilon = epsilon
        self.weight = nn.Parameter(torch.ones(width))
        self.bias = nn.Parameter(torch.zeros(width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        count = self.stats[0]
        mean = self.stats[1] / count
        var = torch.clamp(self.stats[2] / count - mean * mean, min=0.0)
        scale = torch.rsqrt(var + self.epsilon)
        y = (x - mean) * scale
        if self.training:
            seen = x.detach()
            self.pending[0] += float(seen.shape[0])
            self.pending[1] += seen.sum(0)
            self.pending[2] += (seen * seen).sum(0)
            if x.shape[0] > 1:  # a batch of one keeps its gradient
                # Adds exactly 0; its gradient subtracts the batch mean of the input gradient.
                centre = x.mean(0) * scale
                y = y - (centre - centre.detach())
        return y * self.weight + self.bias


def slot_prior(
    num_slots: int, slot_width: int, cvm: bool, prior: float, extra: int = 0
) -> torch.Tensor:
    """Per-column prior of ``num_slots`` pooled slots (CVM columns first when ``cvm``)
    followed by ``extra`` embedding-like columns: ``prior`` on the CVM columns, 1 elsewhere."""
    columns = torch.ones(num_slots, slot_width)
    if cvm:
        columns[:, :2] = prior
    return torch.cat([columns.flatten(), torch.ones(extra)])


def norms_of(model: nn.Module) -> list[DataNorm]:
    """The model's data-norm layers, in a fixed order (module registration order)."""
    return [m for m in model.modules() if isinstance(m, DataNorm)]
