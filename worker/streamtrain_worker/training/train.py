"""The test-then-train loop of one worker over its share of a pass.

For every batch the model predicts first and the metrics take that prediction (progressive
validation: each example is scored by a model that has not trained on it), then the same
forward pass is trained: backward, sparse gradients with show/click to the PS, dense
gradients to the PS dense table. One forward serves both, so testing costs nothing extra.

Gradient conventions: the loss backpropagated is the *sum* of per-example log losses, so
the sparse gradients are what ``PSLike.push_sparse`` expects (the PS divides by show). The
dense gradient pushed is that sum divided by the batch size — the mean-loss gradient, the
usual scale for Adam's epsilon and for SGD learning rates.

Dense parameters live on the PS (``init_dense``: the first worker's initialisation wins,
every worker adopts the PS values). The local copy is refreshed at pass start and every
``denseSyncSteps`` steps (with overlap, by a pull in the background that is loaded at the
next batch boundary after it arrived); in between, the PS keeps applying every worker's
pushes (async data-parallel training with bounded staleness). The counted statistics
(``models.summary``: the data norm's moments, the base rate's clicks, the calibration
window) travel the same way in vectors with the PS summary rule (one per decay): each
trained batch's counts are pushed with its dense gradient and summed on the PS, and the
sums come back with every dense sync; they are checkpointed and snapshotted with the
dense parameters, so a restarted job and an exported model use the same sums. A sync's
pull is taken between two of this worker's pushes, knowing how many it includes, and the
counts of the later ones are added again as it is loaded: a worker never loses its own
latest batches' counts, nor counts one twice.

Overlap (``training.pipeline``): reading, parsing, key dedup and the sparse pull of
the next ``prefetchBatches`` batches run in a background thread while the current batch
computes; pushes go through a bounded queue in another thread and are flushed at pass end.
A prefetched batch may therefore miss the updates of the pushes still in flight: the
same staleness every asynchronous PS has; it also makes runs not bitwise reproducible.
Except at the start: the batches of a worker's first ``inOrderExamples`` examples wait for
the pushes before them and pull their rows again. A fresh job's rows are all zero and its head keys'
AdaGrad steps at their largest, so batches pulled before any push applied all step those
keys the same way, and the overshoot outlasts the start (docs/decisions.md).
``runtime.overlap: false`` runs every pull and push in order in the training thread: with
the same seeds and data, two runs then give bitwise identical results.
"""

from __future__ import annotations

import contextlib
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
import torch
from torch.nn import functional as nnf

from streamtrain_ps.api import PSLike, SparsePush
from streamtrain_ps.errors import InvalidRequestError, UnknownTableError
from streamtrain_worker.config import WorkerConfig
from streamtrain_worker.data.batch import Batch
from streamtrain_worker.metrics import PassMetrics
from streamtrain_worker.models import DenseModel, ModelSpec, build_model
from streamtrain_worker.models.calibration import uncalibrated_gradient_ratio
from streamtrain_worker.models.summary import (
    SummaryLayer,
    drain_pending,
    gather_stats,
    scatter_stats,
    summary_groups,
    summary_layers,
)
from streamtrain_worker.monitoring import WorkerMetrics
from streamtrain_worker.training.embedding import Lookup, PreparedBatch, prepare
from streamtrain_worker.training.pipeline import AsyncPusher, Prefetcher, SingleFlight


class PassCancelledError(RuntimeError):
    """The pass was stopped between two batches because a newer generation took over."""


@dataclass(frozen=True)
class Pending:
    """One trained batch's gradients, waiting in the push queue."""

    sparse: SparsePush
    dense: npt.NDArray[np.float32]
    #: The batch's summary statistics (``models.summary``: the data norm's count, sum and
    #: squares per column, the base rate's examples and clicks, the calibration window's
    #: sums), one array per summary vector (``Trainer.summary_vectors``' order).
    summaries: tuple[npt.NDArray[np.float32], ...]


@dataclass(frozen=True)
class PulledDense:
    """The PS's dense parameters and summary vectors (``Trainer.summary_vectors``' order);
    the summary vectors hold exactly this worker's first ``includes`` pushes."""

    params: npt.NDArray[np.float32]
    summaries: tuple[npt.NDArray[np.float32], ...]
    includes: int = 0


@dataclass(frozen=True)
class SummaryVector:
    """One PS summary vector and the summary layers whose ``stats`` it holds."""

    name: str
    #: The PS's per-push decay (``values = decay * values + pushed``).
    decay: float
    layers: list[SummaryLayer]


@dataclass(frozen=True)
class StepOutput:
    """One batch's prediction and loss (before the update)."""

    preds: npt.NDArray[np.float32]
    losses: npt.NDArray[np.float32]


class Trainer:
    """Owns the dense network and trains it, pass by pass, against a ``PSLike``."""

    def __init__(
        self,
        config: WorkerConfig,
        ps: PSLike,
        num_slots: int,
        sequence_slot: int | None = None,
        monitoring: WorkerMetrics | None = None,
    ) -> None:
        self.config = config
        self.ps = ps
        self.monitoring = monitoring
        self.spec = ModelSpec.from_config(
            config.model, num_slots, sequence_slot, config.data.ordinal_slots
        )
        self.model: DenseModel = build_model(config.model.type, self.spec, seed=config.seed)
        self._params = list(self.model.parameters())
        self._flat_params, self._flat_grads = _flatten(self._params)
        self.summary_vectors = self._summary_vectors(self.model)
        self._pusher: AsyncPusher[Pending] = AsyncPusher(
            self._push, config.runtime.pushQueueDepth, config.runtime.maxMergedPushes
        )
        # Overlap: a training pass's dense pulls run beside its steps (``_run_batches``).
        self._refresh: SingleFlight[PulledDense] = SingleFlight(self._pull_dense, "dense-refresh")
        # This worker's summary statistics of each queued push, by its sequence number: a
        # pull answered before the later ones were applied gets them added again.
        self._counted: deque[tuple[int, tuple[npt.NDArray[np.float32], ...]]] = deque()
        model = config.model
        # Context keys trained on the logit before the calibration (``Lookup``'s
        # ``relearn_context_keys``): only where the calibration is in the loss at all.
        self._context_keys_uncalibrated = (
            model.residualCalibration
            and model.calibrationInLoss
            and model.calibrationSparesContextKeys
        )
        self.dense_version = 0  # dense pulls loaded so far (for tests and logs)
        self.trained_examples = 0  # trained by this worker (the in-order start counts them)
        self.init_dense()
        # The network an export of a PS snapshot fills (``snapshot_model``), built at its
        # first use: its flat parameters and its summary vectors.
        self._snapshot_copy: tuple[DenseModel, torch.Tensor, list[SummaryVector]] | None = None

    def _summary_vectors(self, model: DenseModel) -> list[SummaryVector]:
        """``model``'s summary layers by PS vector: the main one (``summary_name``, decayed
        by ``model.summaryDecayRate``) first, then each layer group with its own decay."""
        out = []
        for vector, layers in summary_groups(summary_layers(model)).items():
            decay = layers[0].decay if vector else self.config.model.summaryDecayRate
            out.append(SummaryVector(self.config.summary_vector_name(vector), decay, layers))
        return sorted(out, key=lambda v: v.name != self.config.summary_name)

    # --- dense parameters ------------------------------------------------------------

    def _load_params(self, values: npt.NDArray[np.float32]) -> None:
        self._fill(self._flat_params, values, f"PS dense vector {self.config.dense_name!r}")
        self.dense_version += 1

    def _fill(self, flat: torch.Tensor, values: npt.NDArray[np.float32], what: str) -> None:
        """Copy ``values`` into a network's flat parameters, refusing another size."""
        if values.shape != (flat.numel(),):
            raise ValueError(
                f"{what} has {values.size} values, the {self.config.model.type} model has "
                f"{flat.numel()} (config mismatch?)"
            )
        with torch.no_grad():
            flat.copy_(torch.from_numpy(values))

    def init_dense(self) -> None:
        """Offer this worker's initial parameters; adopt whatever the PS holds."""
        offered = self._flat_params.numpy().copy()
        self._load_params(self._offer(self.config.dense_name, offered))
        for vector in self.summary_vectors:
            _load_summary(vector, self._init_summary(vector))

    def _init_summary(self, vector: SummaryVector) -> npt.NDArray[np.float32]:
        """Create (or adopt) a PS summary vector from its layers' statistics."""
        offered = gather_stats(vector.layers).numpy().copy()
        return self._offer(vector.name, offered, summary_decay=vector.decay)

    def _offer(
        self, name: str, offered: npt.NDArray[np.float32], summary_decay: float | None = None
    ) -> npt.NDArray[np.float32]:
        """``init_dense``, with the likely cause when the PS holds the vector in another
        shape (a checkpoint written by a model of another shape)."""
        try:
            return self.ps.init_dense(name, offered, summary_decay=summary_decay)
        except InvalidRequestError as exc:
            raise ValueError(
                f"the PS holds {name!r} in another shape than this worker's "
                f"{self.config.model.type} model ({offered.size} values): {exc}. Restored from "
                "a checkpoint of another model shape? model.hiddenUnits, model.embeddingDim, "
                "model.crossLayers, model.crossRank, model.ordinalInputs, "
                "model.baseRateOffset and data.crosses change it; model.calibrationWindow and "
                "model.batchSize the calibration window's decay (docs/operations.md, Upgrades)"
            ) from exc

    def snapshot_model(self, snapshot_id: str) -> DenseModel:
        """The network as the PS's snapshot save ``snapshot_id`` holds it (``PSLike.snapshot``:
        the dense vectors copied with the model's sparse rows between two passes).

        It is a second copy of the network, so the model of that moment can be exported
        while the next pass trains ``self.model``; built once, refilled for every snapshot,
        so callers take turns with it (the worker exports one model at a time).
        """
        params = self.ps.pull_dense(self.config.dense_name, snapshot_id)
        if self._snapshot_copy is None:
            model = build_model(self.config.model.type, self.spec, seed=self.config.seed)
            flat, _ = _flatten(list(model.parameters()))
            self._snapshot_copy = (model, flat, self._summary_vectors(model))
        model, flat, vectors = self._snapshot_copy
        self._fill(flat, params, f"snapshot {snapshot_id}'s {self.config.dense_name!r}")
        for vector in vectors:
            _load_summary(vector, self.ps.pull_dense(vector.name, snapshot_id))
        return model

    def sync_dense(self) -> None:
        """Replace the local dense parameters (and summary statistics) by the PS's."""
        self._load_pulled(self._pull_dense())

    def _pull_dense(self) -> PulledDense:
        """The PS's dense parameters and summary statistics (thread-safe: loads nothing);
        the statistics pulled between two of this worker's pushes, knowing how many of
        them they include.

        Why: the summary vectors are counts, not parameters, and this worker already holds
        its own batches' counts; a pull answered before its queued pushes landed would
        take them back until the next sync, and one answered while a push lands could
        count it twice. ``_load_pulled`` adds the counts of the pushes it does not include
        again. The push thread is held only for the small summary vectors: the parameters'
        pull can wait on a busy PS (a pass start, while it writes the previous model) with
        the pushes going on, as stale as async training allows. A PS that lost the vector
        (restarted empty, before any checkpoint held it) gets this worker's current
        parameters offered again instead of failing every pass from now on.
        """
        try:
            values = self.ps.pull_dense(self.config.dense_name)
        except UnknownTableError:
            values = self._offer(self.config.dense_name, self._flat_params.numpy().copy())
        stats = []
        with self._pusher.between_items() as includes:
            for vector in self.summary_vectors:
                try:
                    stats.append(self.ps.pull_dense(vector.name))
                except UnknownTableError:  # also: a checkpoint written before this vector
                    stats.append(self._init_summary(vector))
        return PulledDense(values, tuple(stats), includes)

    def _load_pulled(self, pulled: PulledDense) -> None:
        self._load_params(pulled.params)
        while self._counted and self._counted[0][0] <= pulled.includes:
            self._counted.popleft()
        for i, (vector, values) in enumerate(
            zip(self.summary_vectors, pulled.summaries, strict=True)
        ):
            sums = np.asarray(values, dtype=np.float32)
            for _, counted in self._counted:  # queued after the pull: as the PS will apply
                sums = np.float32(vector.decay) * sums + counted[i]
            _load_summary(vector, sums)

    def _begin_sync(self, background: bool) -> None:
        """A dense sync: started in the background (loaded by ``_take_refresh``), or now."""
        if background:
            self._refresh.start()
        else:
            self.sync_dense()

    def _take_refresh(self, wait: bool = False) -> None:
        """Load the background dense pull's result, if it has finished (or once it has)."""
        pulled = self._refresh.take(wait)
        if pulled is not None:
            self._load_pulled(pulled)

    # --- one batch -------------------------------------------------------------------

    def prepare(self, batch: Batch) -> PreparedBatch:
        """Model-free per-batch work (dedup, pull, counts); safe in a background thread."""
        model = self.config.model
        return prepare(
            batch,
            self.ps,
            self.config.table,
            model.embeddingDim,
            model.cvm,
            self.spec.ordinal_slots,
            model.rowSharedSteps,
        )

    def forward(self, lookup: Lookup) -> torch.Tensor:
        """Logits of the batch behind ``lookup``."""
        if self.model.uses_sequence:
            assert self.spec.sequence_slot is not None  # checked when the model was built
            seq, mask = lookup.sequence(self.spec.sequence_slot)
            return self.model(lookup.pooled, seq, mask, lookup.ordinal)
        return self.model(lookup.pooled, None, None, lookup.ordinal)

    def step(self, prepared: PreparedBatch, train: bool) -> StepOutput:
        """Predict (for the metrics), then train on the same forward pass."""
        relearn = train and self._context_keys_uncalibrated
        lookup = Lookup(
            prepared, self.config.model.cvm, requires_grad=train, keep_pooled_grad=relearn
        )
        labels = torch.from_numpy(prepared.batch.labels)
        if train:
            self.model.follow_labels(labels)
            keys = torch.from_numpy(prepared.batch.first_example_keys())
            self.model.follow_keys(lookup.pooled, keys)
        with torch.set_grad_enabled(train):
            logits = self.forward(lookup)
            losses = nnf.binary_cross_entropy_with_logits(logits, labels, reduction="none")
            trained_losses = losses
            if train and not self.config.model.calibrationInLoss:
                raw = logits - self.model.calibration_offset().detach()
                trained_losses = nnf.binary_cross_entropy_with_logits(raw, labels, reduction="none")
        out = StepOutput(
            preds=torch.sigmoid(logits.detach()).numpy(), losses=losses.detach().numpy()
        )
        if train:
            self._flat_grads.zero_()
            trained_losses.sum().backward()
            if relearn:
                offsets = self.model.calibration_offset().detach()
                lookup.relearn_context_keys(
                    uncalibrated_gradient_ratio(logits.detach(), offsets, labels)
                )
            self.model.observe_labels(labels, logits)
            dense = self._flat_grads.numpy() * np.float32(1.0 / max(prepared.batch.size, 1))
            summaries = tuple(drain_pending(v.layers).numpy() for v in self.summary_vectors)
            rate_scaled = self.config.model.rateScaledSteps
            embed_scale = self.model.rate_step_scale() if rate_scaled else 1.0
            pending = Pending(lookup.sparse_push(embed_scale), dense, summaries)
            self.trained_examples += prepared.batch.size
            if self.config.runtime.overlap:
                self._counted.append((self._pusher.submit(pending), summaries))
            else:
                self._push([pending])
        return out

    def _push(self, pending: list[Pending]) -> None:
        """Push thread: one push (rows and dense vectors) for all batches that queued up.

        Merging only happens when pushes queue up faster than the PS applies them: the
        sparse pushes are concatenated (the PS sums a key's rows within a request), the
        dense gradients averaged into one optimizer step — the larger-batch equivalent —
        and each batch's summary statistics pushed as a part of their own, in order, so
        the PS decays a summary vector once per batch either way (the calibration window's
        decay is per batch).
        """
        started = time.perf_counter()
        if len(pending) == 1:
            sparse, dense = pending[0].sparse, pending[0].dense
        else:
            sparse = SparsePush.concat([p.sparse for p in pending])
            dense = np.mean([p.dense for p in pending], axis=0, dtype=np.float32)
        vectors = [(self.config.dense_name, dense)]
        for i, vector in enumerate(self.summary_vectors):
            vectors.extend((vector.name, p.summaries[i]) for p in pending)
        # One request per PS server involved (not one per vector): over gRPC each RPC costs
        # both sides a fixed ~0.1-0.3 ms of CPU on top of its bytes.
        self.ps.push_batch(self.config.table, sparse, dense=vectors)
        if self.monitoring is not None:
            self.monitoring.push_seconds.observe(time.perf_counter() - started)

    # --- one pass --------------------------------------------------------------------

    def run_pass(
        self,
        batches: Iterable[Batch],
        train: bool = True,
        should_stop: Callable[[], bool] | None = None,
    ) -> PassMetrics:
        """Test-then-train over ``batches``; returns the pass's metric sums.

        Every push of the pass has reached the PS when this returns, or raises — also
        :class:`PassCancelledError`, raised at the first batch boundary where
        ``should_stop()`` is true. ``bad_lines`` and ``files_read`` are the reader's to fill
        in.
        """
        started = time.perf_counter()
        metrics = PassMetrics(num_buckets=self.config.metrics.numBuckets)
        self.model.train(train)
        self.model.begin_pass()
        try:
            compute = self._run_batches(batches, train, metrics, should_stop)
        except BaseException:
            # Pushes queued before the failure must not fail the *next* pass: wait for them
            # and drop their errors (the pass is failing with the primary error anyway).
            with contextlib.suppress(Exception):
                self._pusher.flush()
            self._refresh.discard()
            self._counted.clear()  # the pushes after a failure were dropped
            raise
        self._pusher.flush()
        metrics.seconds = time.perf_counter() - started
        metrics.train_seconds = compute
        if self.monitoring is not None:
            self.monitoring.passes.inc()
            self.monitoring.loss.set(metrics.loss)
            self.monitoring.auc.set(metrics.auc)
            if metrics.seconds > 0:
                self.monitoring.examples_per_second.set(metrics.examples / metrics.seconds)
        return metrics

    def _run_batches(
        self,
        batches: Iterable[Batch],
        train: bool,
        metrics: PassMetrics,
        should_stop: Callable[[], bool] | None,
    ) -> float:
        """The batch loop of ``run_pass``; returns the seconds spent computing."""
        sync_every = self.config.model.denseSyncSteps
        compute = 0.0
        depth = self.config.runtime.prefetchBatches
        with contextlib.ExitStack() as stack:
            if self.config.runtime.overlap:
                ready: Iterator[PreparedBatch] = stack.enter_context(
                    Prefetcher(batches, self.prepare, depth)
                )
            else:
                ready = map(self.prepare, batches)
            # The pass starts from the PS's dense parameters. With overlap a training pass
            # pulls them in the background and loads them at the first batch boundary after
            # they arrived, as it does every ``denseSyncSteps`` steps: at a pass start the
            # PS is writing the previous pass's model beside it, and a pull in the training
            # thread waited 15-40 ms a pass for it (docs/decisions.md). Evaluation and
            # ``overlap: false`` pull in the training thread, so every step's parameters
            # are exactly the PS's at that moment (bitwise reproducible runs).
            background = train and self.config.runtime.overlap
            self._begin_sync(background)
            for step, prefetched in enumerate(ready, start=1):
                if should_stop is not None and should_stop():
                    raise PassCancelledError(f"pass cancelled before batch {step}")
                t0 = time.perf_counter()
                if prefetched.batch.size == 0:
                    continue
                prepared = prefetched
                if train and self._in_order_start():
                    # The prefetched rows may predate the queued pushes: apply them, pull again.
                    self._pusher.flush()
                    prepared = self.prepare(prefetched.batch)
                if background:
                    self._take_refresh()
                out = self.step(prepared, train)
                metrics.add(out.preds, prepared.batch.labels, out.losses)
                if train and step % sync_every == 0:
                    self._begin_sync(background)
                compute += time.perf_counter() - t0
                if self.monitoring is not None:
                    self.monitoring.pull_seconds.observe(prepared.pull_seconds)
                    self.monitoring.examples.inc(prepared.batch.size)
                    self.monitoring.batches.inc()
            if background:
                self._take_refresh(wait=True)  # nothing of the pass runs on after it
        return compute

    def _in_order_start(self) -> bool:
        """Whether the next trained batch starts within the first ``inOrderExamples`` (overlap
        only: without it every batch is in order anyway)."""
        runtime = self.config.runtime
        return runtime.overlap and self.trained_examples < runtime.inOrderExamples

    def close(self) -> None:
        """Flush outstanding pushes and stop the push thread."""
        try:
            self._pusher.flush()
        finally:
            self._pusher.close()
            self._refresh.close()


def _load_summary(vector: SummaryVector, values: npt.NDArray[np.float32]) -> None:
    """Load a pulled summary vector into its layers' ``stats``."""
    scatter_stats(vector.layers, torch.from_numpy(np.asarray(values, dtype=np.float32)))


def _flatten(params: list[torch.nn.Parameter]) -> tuple[torch.Tensor, torch.Tensor]:
    """Re-home every parameter and its gradient as views of two flat vectors.

    The PS holds the dense network as one flat vector: with the parameters living in one
    buffer, a dense pull is a single copy and the pushed gradient needs no concatenation.
    Gradients accumulate in place into the views (they are never set to None).
    """
    total = sum(p.numel() for p in params)
    flat_params = torch.empty(total)
    flat_grads = torch.zeros(total)
    offset = 0
    with torch.no_grad():
        for p in params:
            n = p.numel()
            flat_params[offset : offset + n].copy_(p.reshape(-1))
            p.data = flat_params[offset : offset + n].view_as(p)
            p.grad = flat_grads[offset : offset + n].view_as(p)
            offset += n
    return flat_params, flat_grads
