"""Data norm (Paddle's ``data_norm``): one transform for training and serving, statistics
summed on the PS from every worker's batches.

The regression behind it: with batch norm, a feature constant within a batch (the hour of
a time-sliced folder) was zeroed in training but shifted by many standard deviations at
inference, so exported models were miscalibrated (COPC 2-10 on the demo).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from streamtrain_ps.client.local import LocalPS
from streamtrain_worker.models.data_norm import DEFAULT_EPSILON, DataNorm
from streamtrain_worker.models.summary import (
    drain_pending,
    gather_stats,
    scatter_stats,
    summary_layers,
)
from streamtrain_worker.publishing.export import export_dense, load_dense, script
from streamtrain_worker.training.train import Trainer

from .conftest import run, worker_config


def test_training_forward_accumulates_the_batch_statistics_exactly() -> None:
    norm = DataNorm(3, prior=10.0).train()
    x = torch.tensor([[1.0, 5.0, 2.0], [3.0, 5.0, -2.0], [8.0, 5.0, 0.0]])
    out = norm(x)
    # the prior's statistics (mean 0, variance 1): the identity, up to epsilon
    torch.testing.assert_close(out, x / (1.0 + DEFAULT_EPSILON) ** 0.5)
    pending = drain_pending([norm])
    expected = torch.stack([torch.full((3,), 3.0), x.sum(0), (x * x).sum(0)])
    torch.testing.assert_close(pending, expected.reshape(-1))
    assert not norm.pending.any(), "drained"
    norm.eval()(x)
    assert not norm.pending.any(), "evaluation adds nothing"


def test_raw_moments_sum_exactly_across_batches() -> None:
    """Pushed sums of any split of the data give the statistics of all of it at once."""
    g = torch.Generator().manual_seed(0)
    # CVM-like, embedding-like, plain and wide columns (mean / std <= 50: the float32
    # limit of raw moments is documented in the module)
    scale, shift = torch.tensor([3.0, 0.01, 1.0, 50.0]), torch.tensor([4.5, 0.02, -1.0, 4.0])
    data = torch.randn(300, 4, generator=g) * scale + shift
    norm = DataNorm(4, prior=1e-6, epsilon=1e-9).train()  # epsilon aside
    for chunk in data.split(64):
        norm(chunk)
    scatter_stats([norm], gather_stats([norm]) + drain_pending([norm]))
    out = norm.eval()(data)
    torch.testing.assert_close(out.mean(0), torch.zeros(4), atol=2e-3, rtol=0)
    torch.testing.assert_close(out.std(0, unbiased=False), torch.ones(4), atol=2e-3, rtol=0)


def test_train_eval_and_torchscript_apply_the_same_transform() -> None:
    norm = DataNorm(4)
    scatter_stats(
        [norm], torch.tensor([10.0] * 4 + [20.0, -5.0, 0.0, 7.0] + [50.0, 10.0, 1.0, 4.9])
    )
    x = torch.randn(16, 4)
    trained = norm.train()(x)
    evaluated = norm.eval()(x)
    torch.testing.assert_close(trained, evaluated)
    mean = norm.stats[1] / 10.0
    var = (norm.stats[2] / 10.0 - mean**2).clamp(min=0)  # the last column clamps to 0
    torch.testing.assert_close(evaluated, (x - mean) / torch.sqrt(var + DEFAULT_EPSILON))
    scripted = script(norm)  # what export_dense does
    torch.testing.assert_close(scripted(x), evaluated)


def test_training_gradient_is_centred_within_the_batch_like_batch_norm() -> None:
    """Forward: global statistics only. Backward in training: the batch mean of the
    gradient is removed (batch norm's centring term); in evaluation it is not."""
    norm = DataNorm(3)
    scatter_stats([norm], torch.tensor([4.0] * 3 + [4.0, 0.0, -2.0] + [8.0, 4.0, 2.0]))
    with torch.no_grad():
        norm.weight.copy_(torch.tensor([1.0, 2.0, -0.5]))
    g = torch.randn(8, 3)
    scale = norm.weight / torch.sqrt(torch.tensor([1.0, 1.0, 0.25]) + DEFAULT_EPSILON)
    for training, expected in ((True, scale * (g - g.mean(0))), (False, scale * g)):
        x = torch.randn(8, 3, requires_grad=True)
        (norm.train(training)(x) * g).sum().backward()
        assert x.grad is not None
        torch.testing.assert_close(x.grad, expected)


def test_a_feature_constant_in_every_batch_stays_finite_and_informative() -> None:
    """The hour slot of a time-sliced folder: constant within a batch, varies across them.
    Batch norm zeroed it; data norm keeps it, standardised over all batches."""
    norm = DataNorm(1, prior=1.0).train()
    for hour in range(24):
        norm(torch.full((64, 1), float(hour)))
        scatter_stats([norm], gather_stats([norm]) + drain_pending([norm]))
    out = norm.eval()(torch.tensor([[0.0], [23.0]]))
    assert torch.isfinite(out).all()
    assert out[0, 0] < -1.5 and out[1, 0] > 1.5  # early vs late hour, ~±1.7 std


def test_statistics_are_summed_over_every_worker_on_the_ps(
    chunks: list[str],
    tmp_path: Path,
) -> None:
    cfg = worker_config(summaryDecayRate=1.0, dataNormPrior=100.0, normalizeEmbeddings=True)
    ps = LocalPS(cfg.ps.config, num_shards=2)
    trainers = [Trainer(cfg, ps, cfg.data.num_slots) for _ in range(2)]
    try:
        for trainer, part in zip(trainers, chunks[:2], strict=True):
            run(trainer, [part])
        for trainer in trainers:
            trainer.sync_dense()
        # the base rate's [examples, clicks], the slots' norm, then the ordinal inputs' norm
        # (Criteo's 13 integer columns)
        summary = ps.pull_dense(cfg.summary_name)
        base_rate, pulled = summary[:2], summary[2:]
        np.testing.assert_allclose(base_rate[0], 1.0 + 2400.0, rtol=1e-6)
        slot_columns = cfg.data.num_slots * (3 + cfg.model.embeddingDim)
        stats = pulled[: 3 * slot_columns].reshape(3, -1)
        ordinal = pulled[3 * slot_columns :].reshape(3, -1)
        # count: prior + both workers' 2 x 1,200 examples in every column; the prior is
        # dataNormPrior on the CVM columns and the ordinal inputs, 1 on the embedding columns
        prior = np.ones((cfg.data.num_slots, 3 + cfg.model.embeddingDim))
        prior[:, :2] = 100.0
        np.testing.assert_allclose(stats[0], prior.reshape(-1) + 2400.0, rtol=1e-6)
        np.testing.assert_allclose(ordinal[0], np.full(13 * 2, 100.0 + 2400.0), rtol=1e-6)
        local = [gather_stats(summary_layers(t.model)).numpy()[2:] for t in trainers]
        np.testing.assert_array_equal(local[0], local[1])  # one normalisation everywhere
        np.testing.assert_array_equal(local[0], pulled)
        # the export carries the PS statistics
        exported, _ = load_dense(_export(trainers[0], cfg.model.type, tmp_path))
        buffers = dict(exported.named_buffers())
        np.testing.assert_array_equal(
            buffers["model.norm.norm.stats"].numpy().reshape(-1), local[0][: 3 * slot_columns]
        )
        np.testing.assert_array_equal(
            buffers["model.ordinal_norm.0.stats"].numpy().reshape(-1),
            local[0][3 * slot_columns :],
        )
    finally:
        for trainer in trainers:
            trainer.close()


def test_each_export_writes_the_current_weights_and_statistics(
    chunks: list[str],
    tmp_path: Path,
) -> None:
    """The scripted module is built once per model (it shares the model's tensors): an
    export after more training must carry the new parameters and data-norm statistics, in
    eval mode, and leave the model in the mode it was in."""
    cfg = worker_config()
    trainer = Trainer(cfg, LocalPS(cfg.ps.config), cfg.data.num_slots)
    pooled = torch.randn(5, cfg.data.num_slots, trainer.spec.slot_width)
    ordinal = torch.randn(5, trainer.spec.num_ordinal, 2)
    try:
        outputs = []
        for i, part in enumerate(chunks[:2]):
            run(trainer, [part])
            trainer.model.train()
            exported, _ = load_dense(_export(trainer, cfg.model.type, tmp_path / str(i)))
            assert trainer.model.training
            with torch.no_grad():
                expected = torch.sigmoid(trainer.model.eval()(pooled, None, None, ordinal))
                outputs.append(exported(pooled, None, None, ordinal))
            torch.testing.assert_close(outputs[-1], expected, rtol=0, atol=0)
        assert not torch.equal(outputs[0], outputs[1])  # trained in between: new weights
    finally:
        trainer.close()


def _export(trainer: Trainer, model_type: str, root: Path) -> str:
    export_dense(trainer.model, model_type, str(root / "dense"))
    return str(root / "dense")


@pytest.mark.parametrize("decay", [0.0, 1.5])
def test_summary_decay_rate_is_validated(decay: float) -> None:
    with pytest.raises(ValueError, match="summaryDecayRate"):
        worker_config(summaryDecayRate=decay)


def test_cvm_columns_start_from_the_prior_and_embedding_columns_from_one() -> None:
    """A fresh job's keys are all new, so its first batches' CVM inputs are all exactly 0:
    a light prior would let them collapse the CVM columns' variance and blow up the
    standardised log counts once keys have shows (docs/decisions.md, issue 10). The
    embedding columns keep a prior of one, so their tiny spread is still amplified."""
    from streamtrain_worker.models.base import SlotInputNorm

    inputs = SlotInputNorm(num_slots=2, slot_width=5, cvm=True, embeddings=True, prior=100.0)
    counts = inputs.norm.stats[0].view(2, 5)
    assert counts[:, :2].eq(100.0).all() and counts[:, 2:].eq(1.0).all()
    # 64 examples whose CVM columns are all 0: the CVM scale stays near 1, not ~8.
    inputs.train()(torch.zeros(64, 2, 5))
    norm = inputs.norm
    assert isinstance(norm, DataNorm)
    norm.stats += norm.pending
    var = norm.stats[2] / norm.stats[0] - (norm.stats[1] / norm.stats[0]) ** 2
    assert var.view(2, 5)[:, :2].min() > 0.5
    assert var.view(2, 5)[:, 2:].max() < 0.02
    with pytest.raises(ValueError, match="prior"):
        DataNorm(3, prior=torch.tensor([1.0, 0.0, 1.0]))
