"""Validated settings of one worker, parsed from the JSON the operator renders.

The JSON uses the camelCase names of the ``StreamingTrainingJob`` spec. Every setting is
declared here once with :func:`streamtrain_ps.plumbing.settings.setting` (type, default, bounds,
doc); :class:`ModelConfig` and :class:`~streamtrain_worker.data.config.DataConfig` *are*
the spec's ``model`` and ``data`` sections (the CRD is generated from them), and the
operator renders every field explicitly, so there is never a second, silently different
set of defaults. One parser reads it: unknown fields are errors (a typo must not silently
fall back to a default), and every error carries the field's path.

This module never imports torch: the operator imports it to render and validate.

Example::

    {"table": "embedding", "seed": 0,
     "model": {"type": "slot_dnn", "embeddingDim": 8, "hiddenUnits": [512, 256, 128],
               "batchSize": 64, "cvm": true, "denseSyncSteps": 10,
               "normalizeEmbeddings": false, ...},
     "data": {...},                                    # streamtrain_worker.data.config
     "ps": {"endpoints": ["ps-0.ps:7000", "ps-1.ps:7000"], "timeoutSeconds": 60,
            "maxRetrySeconds": 30, "config": {...}},          # streamtrain_ps.config
     "metrics": {"numBuckets": 65536},
     "runtime": {"numThreads": 1, "overlap": true, "prefetchBatches": 2, "pushQueueDepth": 4,
                 "inOrderExamples": 1280, "maxMergedPushes": 1}}
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Literal

from streamtrain_ps.config import ConfigError, PSConfig, TableConfig
from streamtrain_ps.plumbing.settings import Document, same_as, setting
from streamtrain_worker.data.config import DataConfig

__all__ = [
    "ConfigError",
    "MetricsConfig",
    "ModelConfig",
    "ModelType",
    "PSClientConfig",
    "RuntimeConfig",
    "WorkerConfig",
]

ModelType = Literal["slot_dnn", "wide_deep", "deepfm", "din"]
RowSharedSteps = Literal["none", "embed", "all"]


@dataclass(frozen=True)
class ModelConfig:
    """The network on top of the PS-backed embedding (``docs/worker.md``)."""

    type: ModelType = setting("slot_dnn", "Model from the worker's model zoo.")
    # Each slot's pooled input is 1 + embeddingDim wide (embed_w + embedx), plus 2 CVM
    # features when cvm; the worker checks it equals its PS table's embedxDim.
    embeddingDim: int = same_as(
        TableConfig, "embedxDim", doc="embedx width per key (the PS table's embedxDim)."
    )
    hiddenUnits: tuple[int, ...] = setting(
        (512, 256, 128), "MLP hidden layer widths.", item_minimum=1
    )
    batchSize: int = setting(64, "Examples per mini-batch.", minimum=1)
    cvm: bool = setting(
        True, "Add PaddlePaddle's continuous value model inputs (log show, log CTR) per slot."
    )
    denseSyncSteps: int = setting(10, "Pull dense parameters from the PS every K steps.", minimum=1)
    # Raw embeddings (only the CVM columns normalised) win on the real samples (Avazu
    # +0.003..0.005, Criteo level) and keep every long-tail day above its goal; tiny worlds
    # of a few hundred ids seen dozens of times a pass learn faster normalised
    # (docs/decisions.md, "Learning quality on long-tail streams").
    normalizeEmbeddings: bool = setting(
        False,
        "slot_dnn only: normalise the embedding columns of the MLP input too. false: "
        "only the CVM columns (embeddings raw, as plain PyTorch).",
    )
    summaryDecayRate: float = setting(
        0.9999999,
        "Data norm (slot_dnn and din input normalisation, PaddlePaddle's data_norm): its "
        "statistics are summed on the PS over all workers, decayed by this factor at every "
        "push. 1 never forgets; lower follows drifting inputs faster.",
        exclusive_minimum=0,
        maximum=1,
    )
    dataNormPrior: float = setting(
        100.0,
        "Data norm: the CVM columns' statistics start as this many pseudo-examples of mean "
        "0, variance 1 (the embedding columns' as one).",
        exclusive_minimum=0,
    )
    wide: bool = setting(
        True,
        "slot_dnn only: add every slot's embed_w to the logit, a per-feature logistic "
        "regression learned on the PS beside the MLP: a rare id then learns from the loss "
        "itself, not through the MLP (docs/decisions.md).",
    )
    # Two low-rank layers paid on every stream family (+0.003..+0.018 AUC a day, the pairs
    # a linear learner needs -q for), Criteo and Avazu level (docs/decisions.md, issue 26).
    crossLayers: int = setting(
        2,
        "slot_dnn only: DCN-v2 cross layers over the MLP input (x <- x0 * (W x + b) + x), "
        "their output's linear read-out added to the logit: pairwise (and higher) feature "
        "interactions learned densely. 0: none.",
        minimum=0,
    )
    # VW's -q ui learns a weight per user-item pair; a factorisation machine's pairwise
    # term learns the same products through the PS embeddings, with no dense weight.
    fmInteractions: bool = setting(
        False,
        "slot_dnn only: add the factorisation machine's pairwise term over the slots' raw "
        "embedx vectors, sum over slot pairs of <v_i, v_j>, to the logit (docs/decisions.md).",
    )
    crossRank: int = setting(
        32,
        "slot_dnn only: rank of each cross layer's W, factored as U V (2 * width * rank "
        "weights instead of width**2). 0: full rank.",
        minimum=0,
    )
    # The format's layout says which slots are ordinal (DataConfig.ordinal_slots); this
    # switch only turns their numeric inputs off, e.g. to resume from a checkpoint whose
    # dense vector was trained without them.
    ordinalInputs: bool = setting(
        True,
        "slot_dnn only: also feed the MLP the numeric value of every ordinal slot (Criteo's "
        "integer buckets, Avazu's hour and weekday, csv columns of kind bucket; read from "
        "the keys) and a missing flag, standardised like the CVM columns (docs/decisions.md).",
    )
    # A counted offset, not a faster learned one: the fast learned offset calibrated a
    # fresh model's first passes but cost AUC later (docs/decisions.md). Off only to resume
    # from a checkpoint written without it (its summary vector is 2 values shorter).
    baseRateOffset: bool = setting(
        True,
        "Add to the logit the log-odds of the click rate of all the data trained so far "
        "(summed on the PS like the data norm's statistics): a fresh model is calibrated "
        "from its first batches, and an id never seen is predicted at the base rate. With "
        "cvm the network also reads each click column as log(C + r) - log(S + 1), one "
        "pseudo-show at that rate r (a key never shown is not a certain click).",
    )
    # Before any data a fresh model predicted 0.5 for every example (a flat first batch,
    # COPC 0.03 on a 1 % stream's first pass); one pseudo-example at a typical CTR instead.
    priorClickRate: float = setting(
        0.1,
        "With baseRateOffset: the click rate a fresh model starts from, as one "
        "pseudo-example (the counted rate takes over from the first batch).",
        exclusive_minimum=0,
        exclusive_maximum=1,
    )
    # A per-example correction of what the counted base rate leaves: passes with COPC in
    # 0.9-1.1 on the hour-of-day families +2..+11 a day, Criteo/Avazu AUC -0.002
    # (docs/decisions.md, issue 26). The window: 100 followed faster but cost Criteo/Avazu
    # -0.003/-0.004; 1000 lagged half an hourly pass.
    residualCalibration: bool = setting(
        True,
        "Add to the logit log((clicks + k) / (predicted + k)) over a recent window of the "
        "trained examples (scored before they count): the output follows a click rate that "
        "moves within a pass. The window's sums are a PS summary vector of their own, "
        "checkpointed and exported with the model.",
    )
    calibrationWindow: float = setting(
        300.0,
        "With residualCalibration: the window's length in examples of all workers "
        "(exponential decay once per batch, weights summing to about this many examples).",
        minimum=1,
    )
    calibrationInLoss: bool = setting(
        True,
        "With residualCalibration: train the network on the calibrated logit (true) or on "
        "its logit before the correction (false: the network keeps learning the rate the "
        "window corrects for, and the window covers only what it has not learned yet).",
    )
    # Trained on the calibrated logit, a key in every row of a batch (the hour of day)
    # gets no gradient for the rate the calibration already corrects. Sparing it: AUC
    # level, the next pass predicted better on 700-2,000-row passes and worse on 4,000-row
    # ones (its row-shared steps overshoot): off (docs/decisions.md, issue 26).
    calibrationSparesContextKeys: bool = setting(
        False,
        "With residualCalibration and calibrationInLoss: keys in every row of a batch (a "
        "context such as the hour of day) are trained on the logit before the correction, "
        "so they learn their context's click rate while the rest of the model is trained "
        "on the calibrated logit.",
    )
    # A pass's rate can jump from the last one's (an hour's folder): the 300-example window
    # left such passes at COPC 1.4-1.5 where VW had 1.02-1.05. Day 1 of the families +0.003
    # to +0.013, Criteo and Avazu -0.0015 (docs/decisions.md, issue 26).
    calibrationPassSplit: bool = setting(
        True,
        "With residualCalibration: in training, move the correction to the current pass's "
        "own residual where it differs from the earlier passes' by more than its noise "
        "(a pass is a time slice whose rate can jump from the last one's).",
    )
    # On a stationary stream (the real samples) the window's residual is mostly sampling
    # noise added to every prediction; on a stream whose rate moves it is mostly real
    # (docs/decisions.md, issue 26).
    calibrationEvidence: bool = setting(
        True,
        "With residualCalibration: apply the window's correction times tau2 / (tau2 + its "
        "noise variance), tau2 the variance of the window's click log-odds between pass "
        "starts beyond their noise (empirical Bayes: a stream whose rate holds still gets "
        "little of the window's noise, one whose rate moves between passes all of it).",
    )
    # Half a count in each cell is the empirical log-odds' small-sample correction
    # (Haldane-Anscombe); shrinking a noisy correction is the evidence's and the split's
    # job. 10 shrank a 300-example window at 4 % clicks by a third again: halfhour and
    # drift passes stayed 1.4x over-predicted after a rate drop (docs/decisions.md).
    calibrationPseudoClicks: float = setting(
        0.5,
        "With residualCalibration: pseudo-clicks (and as many non-clicks) added to both "
        "sums (k above): the log-odds of a window with no clicks stay finite, and a "
        "larger k shrinks the correction toward 0 where the window holds few clicks.",
        exclusive_minimum=0,
    )
    # A key in n rows of a batch steps with its mean gradient once; sharing each row's
    # correction among the row's batch-wide keys gives a context key (hour of day) ~n
    # times that step and Avazu's ~20 head keys a row ~n/20 (docs/decisions.md, issue 26).
    rowSharedSteps: RowSharedSteps = setting(
        "all",
        "Which parts of a key seen in n rows of a batch push n / C times its mean gradient "
        "(at least the mean), C the mean over its rows of how many keys seen more than once "
        "in the batch a row holds: none, embed (embed_w only) or all.",
    )
    # AdaGrad's G0 is an absolute gradient scale and a log-loss gradient's size is the
    # label's noise, sqrt(r (1 - r)): at a 3.5 % click rate a key's first steps were 2.2x
    # smaller, relative to what it learns from, than at 20 %. Measured: the low-CTR family
    # +0.005, Criteo level, where doubling every stream's first steps cost Criteo 0.003
    # (docs/decisions.md, issue 26).
    rateScaledSteps: bool = setting(
        True,
        "With baseRateOffset: multiply the embed part's (embed_w's) pushed gradients by "
        "sqrt(0.2 * 0.8 / (r (1 - r))) within [1, 4], r the base rate: a key's AdaGrad "
        "steps then follow a stream below a 20 % click rate as they do one at 20 %.",
    )
    # A folder is a time slice, and a slot constant within its batches (an hour of day) is
    # its context: the context key's PS-counted rate offsets the logit, so the model
    # published after one hour predicts the next at that hour's known rate
    # (models.context_rate; docs/decisions.md, issue 26).
    contextRate: bool = setting(
        True,
        "With baseRateOffset and cvm: a slot whose key is in every row of a training batch "
        "(an hour of day) is a context, and its key's own click rate (the PS's show and "
        "click counts, shrunk to the base rate by 100 examples) offsets the logit.",
    )
    targetSlot: int = setting(0, "DIN only: the slot holding the target item.", minimum=0)
    attentionUnits: tuple[int, ...] = setting(
        (64, 32), "DIN only: attention MLP widths.", item_minimum=1
    )


@dataclass(frozen=True)
class PSClientConfig:
    """How the worker reaches the parameter servers."""

    endpoints: tuple[str, ...] = setting(
        (),
        "host:port of every PS server, in server-index order (key routing depends on it).",
    )
    timeoutSeconds: float = setting(60.0, "Deadline of one PS RPC attempt.", exclusive_minimum=0)
    maxRetrySeconds: float = setting(
        30.0,
        "A PS that stays unavailable this long fails the pass with a clear error; shorter "
        "outages are retried with exponential backoff.",
        minimum=0,
    )
    config: PSConfig = setting(
        PSConfig,
        "The PS servers' own config (the same JSON they get): table dims, logical shards, "
        "message limits. The client routes and sizes requests by it.",
    )

    def _validate(self, path: str) -> None:
        for i, ep in enumerate(self.endpoints):
            host, sep, port = ep.rpartition(":")
            if not (host and sep and port.isdigit()):
                raise ConfigError(f"{path}.endpoints[{i}]", f"must be host:port, got {ep!r}")


@dataclass(frozen=True)
class MetricsConfig:
    """Pass metrics (``streamtrain_worker.metrics``)."""

    # Paddle uses 1,000,000 buckets, but the histograms travel in every PassResult as
    # 2 x 8 bytes per bucket: 10^6 buckets are 16 MB, past gRPC's default 4 MB message
    # limit. 2^16 buckets are 1 MiB and bound the AUC error from ties inside a bucket far
    # below the AUC's own sampling noise (width 1.5e-5).
    numBuckets: int = setting(65536, "AUC histogram resolution.", minimum=100, maximum=1 << 20)


@dataclass(frozen=True)
class RuntimeConfig:
    """Process resources of the training loop."""

    # Small by default: pods are sized by CPU requests and the prefetch and push threads
    # need cores too.
    numThreads: int = setting(1, "torch intra-op threads per worker.", minimum=1)
    overlap: bool = setting(
        True,
        "Overlap PS pulls and pushes with compute (faster). false: every pull and push in "
        "order, so the same seed and data give a bitwise identical model.",
    )
    prefetchBatches: int = setting(
        2, "Batches read, parsed and pulled ahead of the one training.", minimum=1
    )
    pushQueueDepth: int = setting(
        4, "Pushes in flight before training blocks (bounded async queue).", minimum=1
    )
    # Every batch of a fresh job's first, short pass is pulled before any push is applied:
    # all of them step the head keys' weights the same way from the same zero rows, and
    # the overshoot lasts (Criteo sample: pass 2 COPC 2.68, passes 13-24 AUC -0.0035;
    # docs/decisions.md, "Learning quality on long-tail streams"). Counted in examples, not
    # batches: what a fresh model needs in order is a number of updates' worth of data
    # (20 batches of the default 64), and a throughput job's batches of 512 then pay 3.
    inOrderExamples: int = setting(
        1280,
        "With overlap, the batches of a worker's first examples (this many) each wait for "
        "the previous batch's push and pull their rows again, as with overlap false; later "
        "batches overlap. 0: overlap from the first batch.",
        minimum=0,
    )
    # A merged push is ONE optimizer step for k batches, and Adam/AdaGrad steps barely grow
    # with a gradient's size, so merging cuts the effective learning rate by up to k — by
    # an amount that depends on how loaded the PS is (bench-e2e: -0.003..-0.005 AUC;
    # docs/decisions.md). Raise it only for PS-bound jobs that accept that.
    maxMergedPushes: int = setting(
        1,
        "When pushes queue up faster than the PS applies them, up to this many are merged "
        "into one (sparse rows concatenated, dense gradients averaged); 1 disables merging.",
        minimum=1,
    )


@dataclass(frozen=True)
class WorkerConfig(Document):
    """Everything a worker needs besides its index (command line)."""

    document: ClassVar[str] = "worker"

    data: DataConfig = setting(
        doc="The data section: format, slots, bad-line limit. Required: there is no "
        "sensible default format."
    )
    model: ModelConfig = setting(ModelConfig, "The network.")
    table: str = setting(
        "embedding", "Sparse table the embedding pulls from and pushes to.", min_length=1
    )
    ps: PSClientConfig = setting(PSClientConfig, "The parameter servers.")
    seed: int = same_as(PSConfig, "seed")
    metrics: MetricsConfig = setting(MetricsConfig, "Pass metrics.")
    runtime: RuntimeConfig = setting(RuntimeConfig, "Process resources.")

    def _validate(self, path: str) -> None:
        if self.model.type == "din" and self.data.sequenceSlot is None:
            raise ConfigError(f"{path}.data.sequenceSlot", "din needs the behaviour-sequence slot")
        names = [t.name for t in self.ps.config.tables]
        if self.table not in names:
            raise ConfigError(f"{path}.table", f"{self.table!r} is not a PS table ({names})")
        dim = self.ps.config.table(self.table).embedxDim
        if self.model.embeddingDim != dim:
            raise ConfigError(
                f"{path}.model.embeddingDim",
                f"{self.model.embeddingDim} differs from the PS table's embedxDim {dim}",
            )

    @property
    def dense_name(self) -> str:
        """Name of the PS dense vector holding this model's dense parameters."""
        return f"{self.table}.{self.model.type}.dense"

    @property
    def summary_name(self) -> str:
        """Name of the PS summary vector holding the model's counted statistics
        (``models.summary``). It is named after the data norm, its first use: checkpoints
        hold it under this name."""
        return f"{self.table}.{self.model.type}.datanorm"

    def summary_vector_name(self, vector: str) -> str:
        """Name of the PS summary vector ``vector`` (``SummaryLayer.vector``: "" the main
        one, ``summary_name``; e.g. "calibration", the residual calibration's window)."""
        return f"{self.table}.{self.model.type}.{vector}" if vector else self.summary_name
