"""Model zoo: registry, forward/backward shapes, TorchScript-ability of every model."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from streamtrain_worker.models import DenseModel, ModelSpec, build_model, registered
from streamtrain_worker.models.data_norm import norms_of
from streamtrain_worker.publishing.export import script

B, S, D, L = 6, 5, 4, 7


def inputs(spec: ModelSpec) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    pooled = torch.randn(B, S, spec.slot_width, generator=g, requires_grad=True)
    seq = torch.randn(B, L, 1 + D, generator=g, requires_grad=True)
    mask = torch.arange(L).unsqueeze(0) < torch.tensor([0, 1, 3, 7, 2, 5]).unsqueeze(1)
    return pooled, seq, mask


def spec_for(name: str, cvm: bool) -> ModelSpec:
    return ModelSpec(
        num_slots=S,
        embedding_dim=D,
        cvm=cvm,
        hidden_units=(8, 4),
        sequence_slot=3 if name == "din" else None,
        target_slot=1,
        attention_units=(6,),
    )


def test_registry_has_the_zoo() -> None:
    assert {"slot_dnn", "wide_deep", "deepfm", "din"} <= set(registered())
    with pytest.raises(ValueError, match="unknown model type 'lr'"):
        build_model("lr", spec_for("slot_dnn", True))
    with pytest.raises(TypeError):
        registered()["x"] = DenseModel  # type: ignore[index]


@pytest.mark.parametrize("cvm", [True, False])
@pytest.mark.parametrize("name", ["slot_dnn", "wide_deep", "deepfm", "din"])
def test_forward_backward_shapes(name: str, cvm: bool) -> None:
    spec = spec_for(name, cvm)
    model = build_model(name, spec, seed=3)
    pooled, seq, mask = inputs(spec)
    logits = model(pooled, seq, mask) if model.uses_sequence else model(pooled)
    assert logits.shape == (B,)
    logits.sum().backward()
    assert pooled.grad is not None and pooled.grad.shape == pooled.shape
    assert pooled.grad.abs().sum() > 0
    for p in model.parameters():
        assert p.grad is not None and p.grad.shape == p.shape
    if model.uses_sequence:
        assert seq.grad is not None and seq.grad.shape == seq.shape
        # padding positions get no gradient; example 0 has no behaviours at all
        assert not seq.grad[~mask].any()
        assert seq.grad[mask].abs().sum() > 0
    # the same seed builds the same parameters; TorchScript gives the same logits
    again = build_model(name, spec, seed=3)
    for a, b in zip(model.parameters(), again.parameters(), strict=True):
        assert torch.equal(a, b)
    scripted = script(model)
    with torch.no_grad():
        args = (pooled, seq, mask) if model.uses_sequence else (pooled,)
        torch.testing.assert_close(scripted(*args), model(*args))


def test_deepfm_second_order_is_pairwise_dot_products() -> None:
    spec = spec_for("deepfm", cvm=False)
    model = build_model("deepfm", spec)
    pooled, _, _ = inputs(spec)
    with torch.no_grad():
        v = pooled[:, :, 1:]
        pairs = sum((v[:, s] * v[:, t]).sum(1) for s in range(S) for t in range(s + 1, S))
        expected = (
            pooled[:, :, 0].sum(1) + pairs + model.bias + model.deep(pooled.flatten(1)).squeeze(1)
        )
        torch.testing.assert_close(model(pooled), expected)


@pytest.mark.parametrize("cvm", [True, False])
def test_slot_dnn_wide_part_adds_every_slots_embed_w_to_the_logit(cvm: bool) -> None:
    narrow = dataclasses.replace(spec_for("slot_dnn", cvm), wide=False)
    wide = dataclasses.replace(narrow, wide=True)
    with_wide, without = (
        build_model("slot_dnn", wide, seed=1),
        build_model("slot_dnn", narrow, seed=1),
    )
    pooled, _, _ = inputs(wide)
    with torch.no_grad():
        expected = without(pooled) + pooled[:, :, wide.embed_offset].sum(1)
        torch.testing.assert_close(with_wide(pooled), expected)
        torch.testing.assert_close(script(with_wide)(pooled), expected)
    # embed_w's gradient now carries the loss's own gradient (1 per logit), not only the MLP's
    with_wide(pooled).sum().backward()
    assert pooled.grad is not None
    mlp_only = pooled.detach().clone().requires_grad_(True)
    without(mlp_only).sum().backward()
    assert mlp_only.grad is not None
    diff = pooled.grad - mlp_only.grad
    torch.testing.assert_close(diff[:, :, wide.embed_offset], torch.ones(B, S))
    diff[:, :, wide.embed_offset] = 0
    assert not diff.any(), "only the embed_w column gains the wide gradient"


@pytest.mark.parametrize("cvm", [True, False])
def test_slot_dnn_fm_term_adds_the_pairwise_dot_products_of_the_embedx_vectors(cvm: bool) -> None:
    plain = dataclasses.replace(spec_for("slot_dnn", cvm), wide=True)
    fm = dataclasses.replace(plain, fm=True)
    model, reference = build_model("slot_dnn", fm, seed=1), build_model("slot_dnn", plain, seed=1)
    pooled, _, _ = inputs(fm)
    with torch.no_grad():
        v = pooled[:, :, fm.embed_offset + 1 :]
        pairs = sum((v[:, s] * v[:, t]).sum(1) for s in range(S) for t in range(s + 1, S))
        expected = reference(pooled) + pairs
        torch.testing.assert_close(model(pooled), expected)
        torch.testing.assert_close(script(model)(pooled), expected)


def _cross_matrix(layer: torch.nn.Module) -> tuple[torch.Tensor, torch.Tensor]:
    """The ``W``, ``b`` of one cross layer, whether full rank or factored as ``U V``."""
    if isinstance(layer, torch.nn.Linear):
        return layer.weight, layer.bias
    down, up = layer
    return up.weight @ down.weight, up.bias


@pytest.mark.parametrize(("cvm", "rank"), [(True, 0), (False, 0), (True, 3)])
def test_slot_dnn_cross_layers_start_silent_then_add_x0_times_a_linear_map(
    cvm: bool, rank: int
) -> None:
    plain = dataclasses.replace(spec_for("slot_dnn", cvm), wide=True)
    crossed = dataclasses.replace(plain, cross_layers=2, cross_rank=rank)
    model = build_model("slot_dnn", crossed, seed=1)
    reference = build_model("slot_dnn", plain, seed=1)
    width = S * crossed.slot_width
    pooled, _, _ = inputs(crossed)
    with torch.no_grad():
        # the read-out starts at zero: the model predicts as one without cross layers
        torch.testing.assert_close(model(pooled), reference(pooled))
        model.cross_out[0].weight.normal_()
        x0 = model.norm(pooled)
        x = x0
        for layer in model.cross:
            w, b = _cross_matrix(layer)
            assert w.shape == (width, width)
            assert torch.linalg.matrix_rank(w) == (rank or width)
            x = x0 * (x @ w.T + b) + x
        expected = reference(pooled) + (x * model.cross_out[0].weight).sum(1)
        torch.testing.assert_close(model(pooled), expected)
        torch.testing.assert_close(script(model)(pooled), expected)
    model(pooled).sum().backward()
    for p in model.parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, "every cross weight learns"


def test_din_validates_its_slots() -> None:
    with pytest.raises(ValueError, match="sequenceSlot"):
        build_model("din", ModelSpec(num_slots=S, embedding_dim=D, cvm=False, hidden_units=(4,)))
    bad = ModelSpec(S, D, False, (4,), sequence_slot=2, target_slot=2)
    with pytest.raises(ValueError, match="must differ"):
        build_model("din", bad)


def test_slot_dnn_trains_on_a_batch_of_one() -> None:
    """A pass may end with a one-example batch, where batch statistics are undefined."""
    spec = spec_for("slot_dnn", cvm=True)
    # Seeded: with a (8, 4) MLP an unlucky draw leaves every last-layer ReLU dead for one
    # example, and the gradient is legitimately zero.
    model = build_model("slot_dnn", spec, seed=0).train()
    pooled = inputs(spec)[0][:1].detach().requires_grad_(True)
    model(pooled).sum().backward()
    assert pooled.grad is not None and pooled.grad.abs().sum() > 0


def _adopt_batch_statistics(norm: torch.nn.Module, x: torch.Tensor) -> None:
    """Set a DataNorm's global statistics to exactly those of ``x`` (no prior)."""
    (data_norm,) = norms_of(norm)
    mean = x.mean(dim=0)
    data_norm.stats.copy_(
        torch.stack([torch.full_like(mean, x.shape[0]), x.sum(0), (x * x).sum(0)])
    )


@pytest.mark.parametrize("cvm", [True, False])
def test_slot_dnn_can_normalise_only_the_cvm_columns(cvm: bool) -> None:
    """normalizeEmbeddings false (the default): the CVM log counts are standardised with the global
    statistics, the embeddings reach the MLP as they are (as in plain PyTorch;
    docs/decisions.md)."""
    spec = spec_for("slot_dnn", cvm=cvm)  # the default
    assert not spec.normalize_embeddings
    model = build_model("slot_dnn", spec).eval()
    g = torch.Generator().manual_seed(1)
    pooled = torch.randn(64, S, spec.slot_width, generator=g) * 1e-3
    if cvm:
        pooled[:, :, :2] = torch.rand(64, S, 2, generator=g) * 10.0  # log-count scale
    norm = model.get_submodule("norm")
    if cvm:
        _adopt_batch_statistics(norm, pooled[:, :, :2].reshape(64, -1))
    out = norm(pooled).view(64, S, spec.slot_width)
    col = spec.embed_offset
    assert torch.equal(out[:, :, col:], pooled[:, :, col:])
    if cvm:
        counts = out[:, :, :2]
        assert counts.mean(dim=0).abs().max() < 1e-5
        assert (counts.var(dim=0, unbiased=False) - 1).abs().max() < 1e-3
        assert norms_of(model)[0].stats.shape == (3, 2 * S)
    else:
        assert norms_of(model) == []
    # statistics are not trained: the only parameters are the per-column affine
    assert sum(p.numel() for p in norm.parameters()) == (2 * 2 * S if cvm else 0)
    script(model)  # still exportable


def test_slot_dnn_can_normalise_the_whole_input() -> None:
    """normalizeEmbeddings true normalises every column of the flattened input."""
    spec = dataclasses.replace(spec_for("slot_dnn", cvm=True), normalize_embeddings=True)
    model = build_model("slot_dnn", spec).eval()
    pooled = torch.randn(64, S, spec.slot_width) * 1e-3
    norm = model.get_submodule("norm")
    _adopt_batch_statistics(norm, pooled.flatten(1))
    out = norm(pooled)
    assert out.mean(dim=0).abs().max() < 1e-5
    assert norms_of(model)[0].stats.shape == (3, S * spec.slot_width)


@pytest.mark.parametrize("name", ["slot_dnn", "wide_deep", "deepfm", "din"])
def test_a_context_slot_reaches_the_logit_through_its_counted_rate_alone(name: str) -> None:
    """The network sees a context slot's row zeroed (``DenseModel.network_inputs``): its
    embedding changes nothing and learns nothing, its CVM counts move the logit by the
    context rate's offset exactly; another slot's embedding still counts. Scripted alike."""
    spec = dataclasses.replace(spec_for(name, True), base_rate=True, context_rate=True)
    model = build_model(name, spec, seed=3).train(False)
    (context,) = model.context_rate
    context.stats.copy_(torch.tensor([10.0, 0.0, 0.0, 0.0, 0.0, 10.0]))  # slot 4: a context
    pooled, seq, mask = inputs(spec)
    pooled = pooled.detach()
    pooled[:, 4, :2] = torch.tensor([7.0, -1.0])  # its key's CVM: ~1,100 shows, 37 % clicks

    def logits(x: torch.Tensor, module: torch.nn.Module = model) -> torch.Tensor:
        return module(x, seq, mask) if model.uses_sequence else module(x)

    other = pooled.clone()
    other[:, 4, 2:] = torch.randn(B, spec.slot_width - 2)
    torch.testing.assert_close(logits(other), logits(pooled))
    moved = pooled.clone()
    moved[:, 0, 2:] += 1.0
    assert not torch.allclose(logits(moved), logits(pooled))
    # the counts: the logit moves by the change of the context rate's offset, nothing else
    rate = model.base_rate[0].clamped_rate()
    recounted = pooled.clone()
    recounted[:, 4, :2] = torch.tensor([7.0, -0.2])
    with torch.no_grad():
        change = context(torch.zeros(B), recounted, rate) - context(torch.zeros(B), pooled, rate)
    torch.testing.assert_close(logits(recounted) - logits(pooled), change)
    scripted = script(model)
    with torch.no_grad():
        torch.testing.assert_close(logits(other, scripted), logits(pooled, scripted))
    # in training its row gets no gradient; the other slots' rows do
    model.train()
    grown = pooled.clone().requires_grad_(True)
    logits(grown).sum().backward()
    assert grown.grad is not None
    assert not grown.grad[:, 4].any()
    assert grown.grad[:, :4].abs().sum() > 0


@pytest.mark.parametrize("name", ["slot_dnn", "wide_deep", "deepfm", "din"])
@pytest.mark.parametrize("base_rate", [True, False])
def test_a_key_never_shown_reaches_the_network_at_the_base_rate(name: str, base_rate: bool) -> None:
    """Paddle's CVM click column reads a key without shows as a certain click; a slot whose
    keys are usually counted (an hour crossed with a device) then feeds the network an
    input it never trained on whenever a new key comes. With the base rate the network
    sees that rate instead, in every model type."""
    spec = dataclasses.replace(spec_for(name, True), base_rate=base_rate)
    model = build_model(name, spec, seed=3).train(False)
    pooled = _counted_and_new(spec)
    seen = model.network_inputs(pooled)
    if base_rate:
        rate = float(model.base_rate[0].clamped_rate())
        torch.testing.assert_close(seen[:, 1, 1], torch.full((B,), math.log(rate)))
        expected = math.log(10.0 + rate) - math.log(101.0)
        torch.testing.assert_close(seen[:, 2, 1], torch.full((B,), expected))
    else:
        torch.testing.assert_close(seen, pooled)


@pytest.mark.parametrize("name", ["slot_dnn", "wide_deep", "deepfm", "din"])
def test_the_click_columns_prior_is_exported_alike(name: str) -> None:
    """The TorchScript export reads the click columns as training does."""
    spec = dataclasses.replace(spec_for(name, True), base_rate=True)
    model = build_model(name, spec, seed=3).train(False)
    _, seq, mask = inputs(spec)
    pooled = _counted_and_new(spec)

    def logits(module: torch.nn.Module) -> torch.Tensor:
        return module(pooled, seq, mask) if model.uses_sequence else module(pooled)

    with torch.no_grad():
        torch.testing.assert_close(logits(script(model)), logits(model))


def _counted_and_new(spec: ModelSpec) -> torch.Tensor:
    """Inputs with slot 1's key never shown and slot 2's shown 100 times, clicked 10."""
    pooled = inputs(spec)[0].detach()
    pooled[:, 1, :2] = 0.0
    pooled[:, 2, :2] = torch.tensor([math.log(101.0), math.log(11.0 / 101.0)])
    return pooled
