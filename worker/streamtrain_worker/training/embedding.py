"""The PS-backed embedding: an autograd bridge between a ``Batch`` and a ``PSLike`` table.

Per batch the bridge works on the batch's *unique* keys only:

1. ``prepare`` (may run in a prefetch thread): deduplicate the keys, pull their rows
   ``[show, click, embed_w, embedx...]`` once, and count per unique key its occurrences
   (show) and its occurrences in clicked examples (click) and its slot, and group the
   occurrences by key (``pooling.KeyBags``, which the pooling's backward needs).
2. ``lookup``: the pulled ``[embed_w, embedx...]`` block becomes a leaf tensor ``W`` of shape
   ``(U, 1 + D)`` that requires grad, and every bag ``b = example * S + slot`` is pooled by
   sum — ``nnf.embedding_bag(inverse, W, offsets, mode="sum")``, with a backward that pools
   the output gradient by key instead of sorting (``pooling.sum_pool``). Because the batch
   is expressed over ``W`` instead of over the full table, ``W.grad`` after backward is the
   rows of the gradient ``nn.EmbeddingBag(mode="sum")`` would give the full table for the
   same keys (rows of keys absent from the batch are zero there and are not sent).
3. ``sparse_push``: ``W.grad`` (the gradient of the *sum* of per-example losses, the PS
   convention), shows, clicks and slots, ready for ``PSLike.push_sparse``.

CVM (Paddle's continuous value model): with ``cvm`` on, each slot's pooled row is
``[log(S + 1), log(C + 1) - log(S + 1), embed_w, embedx...]`` where ``S`` and ``C`` are the
*sums over the bag's keys of the PS show and click statistics* (the accumulated, decayed
counts pulled from the table, not this batch's counts). They are inputs, not parameters:
no gradient flows to them; the PS updates show/click from the pushed counts instead.
(The network reads the click column with the base rate as its prior:
``DenseModel.network_inputs``.) They depend on the pulled rows only, so
``prepare(cvm=True)`` computes them in the prefetch thread. So are the numeric inputs of
the ordinal slots (``data.ordinal``: read from the keys themselves;
``prepare(ordinal_slots=...)``), exposed as ``Lookup.ordinal``.

Per-key (unpooled) embeddings of one slot (DIN's behaviour sequence) come from
``Lookup.sequence``: a ``(B, L, 1 + D)`` tensor indexed from the same ``W`` (so its
gradients accumulate into the same unique-key rows) and a ``(B, L)`` mask.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
import torch
from torch.nn import functional as nnf

from streamtrain_ps.api import PSLike, SparsePush
from streamtrain_ps.client.dedup import unique_inverse
from streamtrain_worker.data.batch import Batch
from streamtrain_worker.data.ordinal import ordinal_inputs
from streamtrain_worker.training.pooling import KeyBags, sum_pool


@dataclass(frozen=True)
class PreparedBatch:
    """A batch plus everything about its unique keys that does not depend on the model."""

    batch: Batch
    unique_keys: npt.NDArray[np.uint64]  # (U,)
    inverse: torch.Tensor  # (nnz,) int64: position of every key in unique_keys
    offsets: torch.Tensor  # (B*S + 1,) int64
    weights: npt.NDArray[np.float32]  # (U, 1 + D) pulled [embed_w, embedx...], contiguous
    show_click: npt.NDArray[np.float32]  # (U, 2) pulled [show, click] (PS statistics)
    shows: npt.NDArray[np.float32]  # (U,) occurrences in this batch
    clicks: npt.NDArray[np.float32]  # (U,) occurrences in clicked examples of this batch
    slots: npt.NDArray[np.uint32]  # (U,) slot of the key (its last occurrence)
    #: The bags of every unique key (the backward of the pooling: ``training.pooling``).
    by_key: KeyBags
    pull_seconds: float = 0.0
    #: ``(B*S, 2)`` CVM columns of every bag (``cvm_columns``), when prepared with ``cvm``.
    cvm: torch.Tensor | None = None
    #: ``(B, K, 2)`` ``[value, missing]`` of the K ordinal slots asked for, or None.
    ordinal: torch.Tensor | None = None
    #: ``(U,)`` what each key's pushed gradient is multiplied by (``shared_step_scale``,
    #: ``model.rowSharedSteps``) and which parts (``"embed"`` or ``"all"``), or None.
    step_scale: npt.NDArray[np.float32] | None = None
    step_parts: str = "none"

    @property
    def num_unique(self) -> int:
        return int(self.unique_keys.shape[0])


def count_keys(
    batch: Batch,
    inverse: npt.NDArray[np.int64],
    num_unique: int,
    bag: npt.NDArray[np.int64],
    occurrences: npt.NDArray[np.int64],
) -> tuple[npt.NDArray[np.float32], npt.NDArray[np.float32], npt.NDArray[np.uint32]]:
    """Per unique key: occurrences, occurrences in clicked examples, and slot, from each
    key's bag (``batch.bag_of_key()``) and the occurrences per key (``prepare`` computes
    both once: the pooling's ``KeyBags`` needs them too)."""
    example = bag // batch.num_slots
    shows = occurrences.astype(np.float32)
    key_labels = batch.labels[example].astype(np.float64)
    clicks = np.bincount(inverse, weights=key_labels, minlength=num_unique).astype(np.float32)
    slots = np.zeros(num_unique, dtype=np.uint32)
    slots[inverse] = (bag % batch.num_slots).astype(np.uint32)
    return shows, clicks, slots


def shared_step_scale(
    batch: Batch,
    inverse: npt.NDArray[np.int64],
    bag: npt.NDArray[np.int64],
    occurrences: npt.NDArray[np.int64],
) -> npt.NDArray[np.float32]:
    """Per unique key ``max(1, n / C)``: ``n`` its occurrences in the batch, ``C`` the mean
    over its occurrences of how many occurrences of batch-wide keys (``n > 1``) their row
    holds.

    The PS steps with a key's mean gradient, one step per batch: a key in every row (an
    hour of day) learns ~batchSize times slower than an online learner. Taking ``n`` steps
    overshoots, because every head key of a row corrects the row's error at once
    (docs/decisions.md, issue 26). Scaled by this, a row's correction is shared among its
    batch-wide keys: an hour key among rare ids steps with ~``n`` times its mean gradient,
    each of 20 head keys of an Avazu row with ~``n / 20``; a key seen once keeps its
    gradient, and no key steps less than with its mean.
    """
    example = bag // batch.num_slots
    wide = occurrences[inverse] > 1
    per_row = np.bincount(example[wide], minlength=batch.size).astype(np.float64)
    summed = np.bincount(inverse, weights=per_row[example], minlength=occurrences.shape[0])
    n = occurrences.astype(np.float64)
    mean_wide = np.maximum(summed / np.maximum(n, 1.0), 1.0)
    return np.where(n > 1, np.maximum(n / mean_wide, 1.0), 1.0).astype(np.float32)


def cvm_columns(
    inverse: torch.Tensor, show_click: npt.NDArray[np.float32], offsets: torch.Tensor
) -> torch.Tensor:
    """Per bag ``[log(S + 1), log(C + 1) - log(S + 1)]`` of its keys' summed PS show ``S``
    and click ``C``: inputs, not parameters (no gradient flows to them)."""
    stats = nnf.embedding_bag(
        inverse, torch.from_numpy(show_click), offsets, mode="sum", include_last_offset=True
    )
    logs = torch.log1p(stats)
    logs[:, 1] -= logs[:, 0]
    return logs


def prepare(
    batch: Batch,
    ps: PSLike,
    table: str,
    embedding_dim: int,
    cvm: bool = False,
    ordinal_slots: tuple[int, ...] = (),
    step_parts: str = "none",
) -> PreparedBatch:
    """Deduplicate the batch's keys and pull their rows once (thread-safe, model-free).

    With ``cvm`` the CVM columns are computed here too: they depend on the pulled rows
    only, so a prefetch thread takes them off the training thread; likewise the inputs of
    ``ordinal_slots`` (none: ``ordinal`` is None). ``step_parts`` (``model.rowSharedSteps``:
    none, embed or all): which parts' gradients ``shared_step_scale`` scales.
    """
    # A linear-time hash dedup (first-seen order), not np.unique's sort: ~5x cheaper.
    unique_keys, inverse = unique_inverse(batch.keys)
    started = time.perf_counter()
    rows = ps.pull_sparse(table, unique_keys)
    pull_seconds = time.perf_counter() - started
    expected = (unique_keys.shape[0], 3 + embedding_dim)
    if rows.shape != expected:
        raise ValueError(
            f"PS table {table!r} returned rows of shape {rows.shape}, expected {expected} "
            f"(model.embeddingDim must equal the table's embedxDim)"
        )
    num_unique = unique_keys.shape[0]
    bag = batch.bag_of_key()
    occurrences = np.bincount(inverse, minlength=num_unique)
    shows, clicks, slots = count_keys(batch, inverse, num_unique, bag, occurrences)
    inverse_t = torch.from_numpy(inverse)
    offsets = torch.from_numpy(np.ascontiguousarray(batch.offsets, dtype=np.int64))
    show_click = np.ascontiguousarray(rows[:, :2], dtype=np.float32)
    return PreparedBatch(
        batch=batch,
        unique_keys=unique_keys,
        inverse=inverse_t,
        offsets=offsets,
        weights=np.ascontiguousarray(rows[:, 2:], dtype=np.float32),
        show_click=show_click,
        shows=shows,
        clicks=clicks,
        slots=slots,
        by_key=KeyBags.of(inverse, bag, occurrences),
        pull_seconds=pull_seconds,
        cvm=cvm_columns(inverse_t, show_click, offsets) if cvm else None,
        ordinal=(torch.from_numpy(ordinal_inputs(batch, ordinal_slots)) if ordinal_slots else None),
        step_scale=(
            None if step_parts == "none" else shared_step_scale(batch, inverse, bag, occurrences)
        ),
        step_parts=step_parts,
    )


class Lookup:
    """The embedding layer's output for one prepared batch, and its gradient afterwards."""

    def __init__(
        self,
        prepared: PreparedBatch,
        cvm: bool,
        requires_grad: bool = True,
        keep_pooled_grad: bool = False,
    ) -> None:
        self.prepared = prepared
        batch = prepared.batch
        self.weight = torch.from_numpy(prepared.weights).requires_grad_(requires_grad)
        pooled = sum_pool(self.weight, prepared.inverse, prepared.offsets, prepared.by_key)
        #: With ``keep_pooled_grad``, the gradient of the pooled ``(B*S, 1 + D)`` rows,
        #: kept by the backward (``relearn_context_keys`` weighs it again per example).
        self.pooled_grad: torch.Tensor | None = None
        if requires_grad and keep_pooled_grad:
            pooled.register_hook(self._keep_pooled_grad)
        if cvm:
            counts = prepared.cvm
            if counts is None:  # prepared without cvm
                counts = cvm_columns(prepared.inverse, prepared.show_click, prepared.offsets)
            pooled = torch.cat([counts, pooled], dim=1)
        #: (B, S, W) with W = 1 + D, or 3 + D with CVM: the dense network's input.
        self.pooled = pooled.view(batch.size, batch.num_slots, pooled.shape[1])
        #: (B, K, 2) inputs of the ordinal slots, if prepared with any (no gradient).
        self.ordinal = prepared.ordinal

    def _keep_pooled_grad(self, grad: torch.Tensor) -> None:
        self.pooled_grad = grad

    def relearn_context_keys(self, example_weights: torch.Tensor) -> int:
        """After backward (of a lookup made with ``keep_pooled_grad``): the rows of the
        batch's context keys (in every row of the batch, an hour of day) get their pooled
        gradient again with each example's term times ``example_weights`` (``(B,)``), the
        rest of the rows keep theirs. Returns how many keys that was.

        Why: trained on the calibrated logit, a context key's mean error is what the
        calibration already corrects, so the key never learns the rate of its context
        and a model published after one hour predicts the next at the last one's rate
        (``models.calibration``; docs/decisions.md, issue 26). Weighted by the ratio of
        the uncalibrated log loss's gradient to the calibrated one's, these rows learn
        as if trained on the logit before the correction; the Jacobian of an example's
        logit is the same under both losses, so one backward serves both.
        """
        p = self.prepared
        size = p.batch.size
        grad, pooled_grad = self.weight.grad, self.pooled_grad
        if grad is None or pooled_grad is None or size < 2:
            return 0
        context = self._context_keys()
        if context.shape[0] == 0:
            return 0
        per_bag = (example_weights.float() - 1.0).repeat_interleave(p.batch.num_slots)
        by_key = p.by_key
        extra = nnf.embedding_bag(
            by_key.bags,
            pooled_grad.contiguous(),
            by_key.offsets,
            mode="sum",
            include_last_offset=True,
            per_sample_weights=per_bag[by_key.bags],
        )
        rows = torch.from_numpy(context)
        grad[rows] += extra[rows]
        return int(context.shape[0])

    def _context_keys(self) -> npt.NDArray[np.int64]:
        """The unique-key indices of the keys in every row of the batch."""
        p = self.prepared
        size, slots = p.batch.size, p.batch.num_slots
        offsets, bags = p.by_key.offsets.numpy(), p.by_key.bags.numpy()
        candidates = np.flatnonzero(p.shows >= size)
        rows_seen = [
            np.unique(bags[offsets[u] : offsets[u + 1]] // slots).shape[0] for u in candidates
        ]
        return candidates[np.asarray(rows_seen, dtype=np.int64) == size]

    def sequence(self, slot: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Unpooled ``(B, L, 1 + D)`` embeddings of ``slot``'s keys in order, and the mask.

        ``L`` is the longest bag of that slot in the batch (at least 1); padding rows are
        zero and masked out. Gradients flow into the same unique-key rows as the pooling.
        """
        batch = self.prepared.batch
        s = batch.num_slots
        if not 0 <= slot < s:
            raise ValueError(f"sequence slot {slot} not in [0, {s})")
        offsets = batch.offsets
        starts = offsets[slot : batch.size * s : s]
        lengths = offsets[slot + 1 : batch.size * s + 1 : s] - starts
        width = max(int(lengths.max(initial=0)), 1)
        position = np.arange(width, dtype=np.int64)
        mask = position[None, :] < lengths[:, None]
        key_index = np.where(mask, starts[:, None] + position[None, :], 0)
        padded = np.where(mask, self.prepared.inverse.numpy()[key_index], self.weight.shape[0])
        table = torch.cat([self.weight, self.weight.new_zeros(1, self.weight.shape[1])])
        return table[torch.from_numpy(padded)], torch.from_numpy(mask)

    def sparse_push(self, embed_scale: float = 1.0) -> SparsePush:
        """This batch's push of its rows, after backward; the embed part's (embed_w's)
        gradients times ``embed_scale`` (``model.rateScaledSteps``).

        A batch whose loss did not reach the embedding (no backward, e.g. evaluation)
        pushes zero gradients with the batch's counts, so show/click still accumulate.
        """
        p = self.prepared
        grad = self.weight.grad
        grads = np.zeros_like(p.weights) if grad is None else grad.numpy()
        if grad is not None and (p.step_scale is not None or embed_scale != 1.0):
            grads = grads.copy()
            if p.step_scale is not None:
                parts = slice(None) if p.step_parts == "all" else slice(0, 1)
                grads[:, parts] *= p.step_scale[:, None]
            grads[:, 0] *= np.float32(embed_scale)
        return SparsePush(p.unique_keys, grads, p.shows, p.clicks, p.slots)
