"""What every model shares: the spec it is built from, the MLP block, and the registry.

The registry is filled by ``@register`` decorators when the model modules are imported
(``streamtrain_worker.models`` imports them all) and is only read afterwards; it maps a
config's ``model.type`` to a class, so adding a model never touches the training loop.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import TypeVar

import torch
from torch import nn

from streamtrain_worker.config import ModelConfig
from streamtrain_worker.models.base_rate import BaseRate, rate_step_scale
from streamtrain_worker.models.calibration import ResidualCalibration, window_decay
from streamtrain_worker.models.context_rate import ContextRate
from streamtrain_worker.models.data_norm import DEFAULT_PRIOR, DataNorm, slot_prior


@dataclass(frozen=True)
class ModelSpec:
    """The shape of the network's input and its hyper-parameters."""

    num_slots: int
    embedding_dim: int  # embedx width D
    cvm: bool
    hidden_units: tuple[int, ...]
    sequence_slot: int | None = None
    target_slot: int = 0
    attention_units: tuple[int, ...] = (64, 32)
    normalize_embeddings: bool = False
    #: Pseudo-examples (mean 0, variance 1) the data-norm statistics start from.
    norm_prior: float = DEFAULT_PRIOR
    #: slot_dnn only: the embed_w column of every slot also adds to the logit.
    wide: bool = False
    #: slot_dnn only: DCN-v2 cross layers over the MLP input, added to the logit.
    cross_layers: int = 0
    #: slot_dnn only: the FM pairwise term over the slots' embedx vectors.
    fm: bool = False
    #: Rank of each cross layer's matrix; 0: full rank.
    cross_rank: int = 0
    #: Slots whose ``[value, missing]`` inputs (``data.ordinal``) the model takes, in order.
    ordinal_slots: tuple[int, ...] = ()
    #: Add the base rate's log-odds to the logit (``models.base_rate``); a plain network
    #: (the benchmarks' PyTorch references) has none.
    base_rate: bool = False
    #: The base rate's pseudo-example label (``model.priorClickRate``).
    prior_rate: float = 0.5
    #: Examples in the residual calibration's window (``models.calibration``); 0: none.
    calibration_window: float = 0.0
    #: Its pseudo-clicks (``model.calibrationPseudoClicks``).
    calibration_pseudo_clicks: float = 0.5
    #: In training, move to the current pass's own residual where it differs from the
    #: earlier passes' beyond its noise (``models.calibration``).
    calibration_pass_split: bool = False
    #: Apply the window's correction by how much the stream's rate moves between passes
    #: beyond its noise (``models.calibration``, ``RateMovement``).
    calibration_evidence: bool = False
    #: Examples per batch: the window decays once per batch (``window_decay``).
    batch_size: int = 64
    #: Offset the logit by the context slot's counted click rate (``models.context_rate``;
    #: built only with ``base_rate`` and ``cvm``, whose counts it reads).
    context_rate: bool = False

    @classmethod
    def from_config(
        cls,
        model: ModelConfig,
        num_slots: int,
        sequence_slot: int | None = None,
        ordinal_slots: tuple[int, ...] = (),
    ) -> ModelSpec:
        """The spec of ``model`` over ``num_slots``; ``ordinal_slots`` (the data layout's,
        ``DataConfig.ordinal_slots``) are kept only for a model type that takes them, with
        ``model.ordinalInputs`` on."""
        model_class = registered().get(model.type)
        takes_ordinal = model.ordinalInputs and model_class is not None and model_class.uses_ordinal
        return cls(
            num_slots=num_slots,
            embedding_dim=model.embeddingDim,
            cvm=model.cvm,
            hidden_units=model.hiddenUnits,
            sequence_slot=sequence_slot,
            target_slot=model.targetSlot,
            attention_units=model.attentionUnits,
            normalize_embeddings=model.normalizeEmbeddings,
            norm_prior=model.dataNormPrior,
            wide=model.wide,
            cross_layers=model.crossLayers,
            cross_rank=model.crossRank,
            fm=model.fmInteractions,
            ordinal_slots=tuple(ordinal_slots) if takes_ordinal else (),
            base_rate=model.baseRateOffset,
            prior_rate=model.priorClickRate,
            calibration_window=model.calibrationWindow if model.residualCalibration else 0.0,
            calibration_pseudo_clicks=model.calibrationPseudoClicks,
            calibration_pass_split=model.calibrationPassSplit,
            calibration_evidence=model.calibrationEvidence,
            batch_size=model.batchSize,
            context_rate=model.contextRate,
        )

    @property
    def slot_width(self) -> int:
        """Width ``W`` of one pooled slot: [cvm_show, cvm_click,] embed_w, embedx..."""
        return self.embed_offset + 1 + self.embedding_dim

    @property
    def num_ordinal(self) -> int:
        return len(self.ordinal_slots)

    @property
    def embed_offset(self) -> int:
        """Column of embed_w in a pooled slot row (after the 2 CVM columns, if any)."""
        return 2 if self.cvm else 0


def mlp(in_features: int, hidden: Sequence[int], out_features: int = 1) -> nn.Sequential:
    """Linear+ReLU per hidden width, then a linear output layer."""
    layers: list[nn.Module] = []
    width = in_features
    for units in hidden:
        layers += [nn.Linear(width, units), nn.ReLU()]
        width = units
    layers.append(nn.Linear(width, out_features))
    return nn.Sequential(*layers)


class SlotInputNorm(nn.Module):
    """``(B, S, W)`` pooled slots -> ``(B, S * W)``, normalised as configured.

    The two CVM features per slot are log counts (up to ~10) next to embeddings that start
    near 0: fed raw, they swamp the MLP (Criteo sample: AUC ~0.55 instead of ~0.68 after two
    passes), so they are always normalised (:class:`DataNorm`, Paddle's ``data_norm``:
    global statistics summed on the PS, the same in training and serving). The embedding
    columns are normalised too only with ``embeddings``: that divides their gradient by
    their (tiny) standard deviation, which speeds up embeddings that barely move (tiny
    streams, lazily admitted embedx) but costs ~0.01 progressive AUC on the bench-e2e
    protocol against raw embeddings, for plain PyTorch as for the PS path
    (``docs/decisions.md``). Without CVM and ``embeddings`` it is a plain flatten, like the
    textbook ``EmbeddingBag`` + MLP.
    """

    def __init__(
        self, num_slots: int, slot_width: int, cvm: bool, embeddings: bool, prior: float
    ) -> None:
        super().__init__()
        self.cvm_only = cvm and not embeddings
        if embeddings:
            # The prior guards the CVM columns; the embedding columns keep a prior of one
            # so their tiny spread is amplified soon (models.data_norm says why).
            columns = slot_prior(num_slots, slot_width, cvm, prior)
            self.norm: nn.Module = DataNorm(num_slots * slot_width, columns)
        elif cvm:
            self.norm = DataNorm(2 * num_slots, prior)
        else:
            self.norm = nn.Identity()

    def forward(self, pooled: torch.Tensor) -> torch.Tensor:
        if not self.cvm_only:
            return self.norm(pooled.flatten(1))
        b = pooled.shape[0]
        counts = self.norm(pooled[:, :, :2].reshape(b, -1)).view(b, -1, 2)
        return torch.cat([counts, pooled[:, :, 2:]], dim=2).flatten(1)


class DenseModel(nn.Module):
    """Base of every model: pooled slot embeddings (+ optional sequence) -> logits ``(B,)``.

    ``forward(pooled, seq, seq_mask, ordinal)``: ``pooled`` is ``(B, S, W)``; ``seq``
    ``(B, L, 1 + D)`` and ``seq_mask`` ``(B, L)`` are the behaviour sequence's unpooled
    embeddings, given only to models with ``uses_sequence`` (None otherwise); ``ordinal``
    ``(B, K, 2)`` holds the numeric inputs of ``spec.ordinal_slots`` (``data.ordinal``),
    given when that is not empty, which only a model with ``uses_ordinal`` asks for. The
    signature is the same for every model so the TorchScript export and the training loop
    need no per-model branches. Every model feeds its network ``network_inputs(pooled)``
    (the context slots' rows zeroed, the click columns at the base rate's prior) and ends
    its forward with ``counted_offsets`` (the base rate's log-odds, the context's, then the
    residual calibration's correction).
    """

    uses_sequence: bool = False
    uses_ordinal: bool = False

    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        self.spec = spec
        # Zero or one base-rate offset (TorchScript: a list, not an Optional).
        self.base_rate = nn.ModuleList([BaseRate(spec.prior_rate)] if spec.base_rate else [])
        # Zero or one residual calibration, applied after the base rate.
        self.calibration = nn.ModuleList(
            [
                ResidualCalibration(
                    window_decay(spec.calibration_window, spec.batch_size),
                    spec.calibration_pseudo_clicks,
                    spec.calibration_pass_split,
                    spec.calibration_evidence,
                )
            ]
            if spec.calibration_window > 0
            else []
        )
        # With CVM the network reads the click columns at the base rate's prior (a plain
        # bool: TorchScript compiles the branch on it).
        self.smooth_clicks = spec.cvm
        # Zero or one context rate, applied after the base rate, before the calibration.
        self.context_rate = nn.ModuleList(
            [ContextRate(spec.num_slots)]
            if spec.context_rate and spec.base_rate and spec.cvm
            else []
        )

    def network_inputs(self, pooled: torch.Tensor) -> torch.Tensor:
        """What the network sees of ``pooled``: the context slots' rows (``spec.context_rate``)
        zeroed, so a context speaks through its counted rate alone; its embedding and CVM
        columns, learned and counted while the offset was not there yet (an hour's first
        day), would count its rate a second time (``models.context_rate``). With CVM and a
        base rate, the other click columns read with a pseudo-show at that rate
        (``BaseRate.smoothed_click_columns``): a key never shown is not a certain click.
        The prior comes first, so a context's row stays all zeros."""
        if self.smooth_clicks:
            for offset in self.base_rate:
                assert isinstance(offset, BaseRate)
                pooled = offset.smoothed_click_columns(pooled)
        for context in self.context_rate:
            assert isinstance(context, ContextRate)
            pooled = pooled * (1.0 - context.contexts()).view(1, -1, 1)
        return pooled

    def counted_offsets(self, logits: torch.Tensor, pooled: torch.Tensor) -> torch.Tensor:
        """``logits`` plus the offsets counted rather than learned: the base rate's log-odds
        (``spec.base_rate``), the context's (``spec.context_rate``, read from ``pooled``'s
        CVM columns), then the residual calibration's correction
        (``spec.calibration_window``). Every model type ends its forward here."""
        for offset in self.base_rate:
            logits = offset(logits)
            assert isinstance(offset, BaseRate)
            for context in self.context_rate:
                logits = context(logits, pooled, offset.clamped_rate())
        for correction in self.calibration:
            logits = correction(logits)
        return logits

    def rate_step_scale(self) -> float:
        """What the embed part's gradients are multiplied by (``model.rateScaledSteps``):
        ``base_rate.rate_step_scale`` of the counted rate, 1 without a base rate."""
        for offset in self.base_rate:
            assert isinstance(offset, BaseRate)
            return rate_step_scale(offset.rate())
        return 1.0

    def calibration_offset(self) -> torch.Tensor:
        """The residual calibration's correction of the logit for the batch in hand (per
        example in a training step; 0 without one)."""
        total = torch.zeros(())
        for correction in self.calibration:
            assert isinstance(correction, ResidualCalibration)
            total = total + correction.batch_offset()
        return total

    def follow_labels(self, labels: torch.Tensor) -> None:
        """The labels of the training batch about to be scored: the calibration scores each
        example with the batch's earlier examples counted (``models.calibration``)."""
        for correction in self.calibration:
            assert isinstance(correction, ResidualCalibration)
            correction.follow_labels(labels)

    def follow_keys(self, pooled: torch.Tensor, keys: torch.Tensor) -> None:
        """The training batch about to be scored: its pooled input and ``keys`` ``(S,)``,
        its first example's key of each slot (the context rate anchors a pass's context
        keys at their counts from before the pass, ``models.context_rate``)."""
        for context in self.context_rate:
            assert isinstance(context, ContextRate)
            context.follow_keys(pooled.detach(), keys)

    def begin_pass(self) -> None:
        """A new pass starts: the calibration's and the context rate's per-pass sums start
        empty."""
        for context in self.context_rate:
            assert isinstance(context, ContextRate)
            context.begin_pass()
        for correction in self.calibration:
            assert isinstance(correction, ResidualCalibration)
            correction.begin_pass()

    def observe_labels(self, labels: torch.Tensor, logits: torch.Tensor) -> None:
        """Count a trained batch's labels into the base rate and the calibration window,
        and which of its slots were constant (``follow_keys``) into the context rate,
        after the batch was scored: ``logits`` are the model's output for it."""
        for context in self.context_rate:
            assert isinstance(context, ContextRate)
            context.observe()
        for correction in self.calibration:
            assert isinstance(correction, ResidualCalibration)
            correction.observe(labels, logits)
        for offset in self.base_rate:
            assert isinstance(offset, BaseRate)
            offset.observe(labels)

    def forward(
        self,
        pooled: torch.Tensor,
        seq: torch.Tensor | None = None,
        seq_mask: torch.Tensor | None = None,
        ordinal: torch.Tensor | None = None,
    ) -> torch.Tensor:
        raise NotImplementedError


M = TypeVar("M", bound=type[DenseModel])


class _Registry:
    """Model name -> class; written by ``register`` at import time, read afterwards."""

    def __init__(self) -> None:
        self._models: dict[str, type[DenseModel]] = {}

    def register(self, name: str) -> Callable[[M], M]:
        def decorate(cls: M) -> M:
            if name in self._models:
                raise ValueError(f"model {name!r} is already registered")
            self._models[name] = cls
            return cls

        return decorate

    def view(self) -> Mapping[str, type[DenseModel]]:
        return MappingProxyType(self._models)


_REGISTRY = _Registry()
register = _REGISTRY.register


def registered() -> Mapping[str, type[DenseModel]]:
    """Every registered model, read-only."""
    return _REGISTRY.view()


def build_model(name: str, spec: ModelSpec, seed: int = 0) -> DenseModel:
    """Instantiate model ``name``; parameters are initialised from ``seed`` only.

    The global torch RNG is forked, so building a model never perturbs other randomness.
    """
    models = registered()
    if name not in models:
        raise ValueError(f"unknown model type {name!r} (registered: {', '.join(sorted(models))})")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return models[name](spec)
