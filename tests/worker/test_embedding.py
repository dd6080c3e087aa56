"""The PS-backed embedding gives exactly nn.EmbeddingBag(mode="sum")'s gradients."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
import pytest
import torch

from streamtrain_ps.api import SparsePush
from streamtrain_worker.data.batch import Batch
from streamtrain_worker.training.embedding import Lookup, prepare

DIM = 4  # embedx dim


class RecordingTable:
    """The two PSLike calls the bridge makes, over a fixed table of known rows.

    The bridge's contract is what it pulls and what it pushes, so this records pushes
    instead of applying an optimizer (the PS update rules are tested with the PS).
    """

    def __init__(self, keys: npt.NDArray[np.uint64], rows: npt.NDArray[np.float32]) -> None:
        self.index = {int(k): i for i, k in enumerate(keys)}
        self.rows = rows
        self.pulled: list[npt.NDArray[np.uint64]] = []
        self.pushed: list[tuple[npt.NDArray[np.uint64], ...]] = []

    def pull_sparse(self, table: str, keys: npt.NDArray[np.uint64]) -> npt.NDArray[np.float32]:
        assert table == "emb"
        self.pulled.append(keys.copy())
        out = np.zeros((keys.shape[0], self.rows.shape[1]), dtype=np.float32)
        for i, k in enumerate(keys.tolist()):
            if k in self.index:
                out[i] = self.rows[self.index[k]]
        return out

    def push_sparse(self, table: str, push: SparsePush) -> None:
        self.pushed.append((push.keys, push.grads, push.shows, push.clicks, push.slots))


def make_batch(rng: np.random.Generator, examples: int, slots: int, vocab: int) -> Batch:
    """Random bags of 0-4 keys (many empty bags, many repeated keys, repeats in a bag)."""
    lengths = rng.integers(0, 5, size=examples * slots)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    keys = (rng.integers(0, vocab, size=int(offsets[-1])) * 7919 + 11).astype(np.uint64)
    labels = (rng.random(examples) < 0.4).astype(np.float32)
    return Batch(labels=labels, keys=keys, offsets=offsets, num_slots=slots)


@pytest.fixture
def setup() -> tuple[Batch, RecordingTable, npt.NDArray[np.uint64], npt.NDArray[np.float32]]:
    rng = np.random.default_rng(7)
    batch = make_batch(rng, examples=16, slots=5, vocab=12)
    absent = np.array([3, 5, 2**63 + 1], dtype=np.uint64)  # in the table, not in the batch
    vocab_keys = np.unique(np.concatenate([batch.keys, absent]))
    rows = rng.normal(size=(vocab_keys.shape[0], 3 + DIM)).astype(np.float32)
    rows[:, :2] = rng.integers(0, 50, size=(vocab_keys.shape[0], 2))  # show, click stats
    return batch, RecordingTable(vocab_keys, rows), vocab_keys, rows


@pytest.mark.parametrize("upstream_kind", ["dyadic", "gaussian"])
def test_gradients_equal_embedding_bag(setup, upstream_kind: str) -> None:  # type: ignore[no-untyped-def]
    batch, ps, vocab_keys, rows = setup
    assert (np.diff(batch.offsets) == 0).any(), "the batch must contain empty bags"
    assert (np.diff(batch.offsets) > 1).any(), "the batch must repeat keys within bags"
    prepared = prepare(batch, ps, "emb", DIM)
    lookup = Lookup(prepared, cvm=False)

    # Reference: a full-table nn.EmbeddingBag over contiguous ids of the same keys.
    bag = torch.nn.EmbeddingBag(vocab_keys.shape[0], 1 + DIM, mode="sum")
    with torch.no_grad():
        bag.weight.copy_(torch.from_numpy(rows[:, 2:]))
    ids = torch.from_numpy(np.searchsorted(vocab_keys, batch.keys).astype(np.int64))
    ref = bag(ids, torch.from_numpy(batch.offsets[:-1])).view(batch.size, batch.num_slots, -1)

    g = torch.Generator().manual_seed(1)
    if upstream_kind == "dyadic":
        # multiples of 1/8: every partial sum is exact in float32, so the two sides must
        # agree bitwise whatever order they accumulate in.
        upstream = torch.randint(-64, 64, ref.shape, generator=g).float() / 8
    else:
        upstream = torch.randn(ref.shape, generator=g)
    (lookup.pooled * upstream).sum().backward()
    (ref * upstream).sum().backward()

    push = lookup.sparse_push()
    ref_grad = bag.weight.grad
    assert ref_grad is not None
    rows_of_push = torch.from_numpy(np.searchsorted(vocab_keys, push.keys))
    if upstream_kind == "dyadic":
        assert torch.equal(torch.from_numpy(push.grads), ref_grad[rows_of_push])
    else:  # float32 sums in another order: equal up to rounding
        torch.testing.assert_close(torch.from_numpy(push.grads), ref_grad[rows_of_push])
    # keys absent from the batch have zero gradient in EmbeddingBag and are not pushed
    assert set(push.keys.tolist()) == set(batch.keys.tolist())
    absent = np.setdiff1d(np.arange(vocab_keys.shape[0]), rows_of_push.numpy())
    assert absent.shape == (3,)
    assert not ref_grad[torch.from_numpy(absent)].any()
    assert len(ps.pulled) == 1
    assert np.array_equal(np.sort(ps.pulled[0]), np.unique(batch.keys))  # each key once


def test_show_click_and_slot_counts(setup) -> None:  # type: ignore[no-untyped-def]
    batch, ps, _, _ = setup
    prepared = prepare(batch, ps, "emb", DIM)
    key_bag = batch.bag_of_key()
    key_example = key_bag // batch.num_slots
    for i, key in enumerate(prepared.unique_keys.tolist()):
        occurrences = batch.keys == key
        assert prepared.shows[i] == occurrences.sum()
        assert prepared.clicks[i] == batch.labels[key_example[occurrences]].sum()
        assert prepared.slots[i] in set((key_bag[occurrences] % batch.num_slots).tolist())
    lookup = Lookup(prepared, cvm=False)
    lookup.pooled.sum().backward()
    ps.push_sparse("emb", lookup.sparse_push())  # type: ignore[arg-type]
    keys, grads, shows, clicks, slots = ps.pushed[0]
    assert grads.shape == (keys.shape[0], 1 + DIM)
    assert shows.sum() == batch.keys.shape[0]
    assert clicks.sum() == batch.labels[batch.bag_of_key() // batch.num_slots].sum()
    assert slots.dtype == np.uint32


@pytest.mark.parametrize("in_prepare", [False, True])
def test_cvm_features(setup, in_prepare: bool) -> None:  # type: ignore[no-untyped-def]
    batch, ps, vocab_keys, rows = setup
    lookup = Lookup(prepare(batch, ps, "emb", DIM, cvm=in_prepare), cvm=True)
    if in_prepare:  # the prefetch thread's columns are the ones the lookup computes itself
        alone = Lookup(prepare(batch, ps, "emb", DIM), cvm=True, requires_grad=False)
        assert torch.equal(lookup.pooled, alone.pooled)
    assert lookup.pooled.shape == (batch.size, batch.num_slots, 3 + DIM)
    for b in (0, 3, 17):
        keys = batch.keys[batch.offsets[b] : batch.offsets[b + 1]]
        stats = rows[np.searchsorted(vocab_keys, keys), :2].sum(axis=0)
        example, slot = divmod(b, batch.num_slots)
        got = lookup.pooled[example, slot].detach().numpy()
        assert got[0] == pytest.approx(np.log(stats[0] + 1), rel=1e-6)
        assert got[1] == pytest.approx(np.log(stats[1] + 1) - np.log(stats[0] + 1), abs=1e-6)
    # the CVM columns carry no gradient to the PS: only embed_w/embedx do
    lookup.pooled[..., :2].sum().backward()
    assert not lookup.sparse_push().grads.any()


def test_sequence_embeddings_and_gradients(setup) -> None:  # type: ignore[no-untyped-def]
    batch, ps, vocab_keys, rows = setup
    lookup = Lookup(prepare(batch, ps, "emb", DIM), cvm=False)
    seq, mask = lookup.sequence(2)
    lengths = np.diff(batch.offsets)[2 :: batch.num_slots]
    assert seq.shape == (batch.size, int(lengths.max()), 1 + DIM)
    assert mask.sum().item() == lengths.sum()
    for e in range(batch.size):
        start = batch.offsets[e * batch.num_slots + 2]
        for j in range(int(lengths[e])):
            expected = rows[np.searchsorted(vocab_keys, batch.keys[start + j]), 2:]
            np.testing.assert_array_equal(seq[e, j].detach().numpy(), expected)
        assert not seq[e, int(lengths[e]) :].detach().numpy().any()
    # gradient of the sum of the sequence embeddings = per key, its occurrences in slot 2
    (seq * mask[..., None]).sum().backward()
    push = lookup.sparse_push()
    in_slot = batch.keys[batch.slot_of_key() == 2]
    for key, grad in zip(push.keys.tolist(), push.grads, strict=True):
        assert np.all(grad == float((in_slot == key).sum()))
    with pytest.raises(ValueError, match="sequence slot"):
        lookup.sequence(batch.num_slots)


def test_wrong_embedding_dim_is_a_clear_error(setup) -> None:  # type: ignore[no-untyped-def]
    batch, ps, _, _ = setup
    with pytest.raises(ValueError, match="embeddingDim must equal"):
        prepare(batch, ps, "emb", DIM + 1)


def test_row_shared_steps_scale_a_context_key_by_its_rows_and_leave_rare_keys(
    setup,  # type: ignore[no-untyped-def]
) -> None:
    """An hour key in all 8 rows, beside a rare id per row and a head key in rows 0-3:
    rows 0-3 hold two batch-wide keys, rows 4-7 one, so the hour key's C is 1.5 and its
    gradient is scaled by 8 / 1.5; the head key's C is 2 (4 / 2 = 2); rare ids keep theirs."""
    _, ps, _, _ = setup
    hour, head = 1000, 2000
    keys, offsets = [], [0]
    for row in range(8):
        bag = [[hour], [3000 + row], [head] if row < 4 else []]
        for slot_keys in bag:
            keys += slot_keys
            offsets.append(len(keys))
    batch = Batch(
        labels=np.zeros(8, np.float32),
        keys=np.asarray(keys, np.uint64),
        offsets=np.asarray(offsets, np.int64),
        num_slots=3,
    )
    expected = {hour: 8 / 1.5, head: 2.0, **{3000 + r: 1.0 for r in range(8)}}
    pushed = {}
    for parts in ("none", "embed", "all"):
        prepared = prepare(batch, ps, "emb", DIM, step_parts=parts)
        lookup = Lookup(prepared, cvm=False)
        lookup.pooled.sum().backward()  # every occurrence's gradient is 1
        push = lookup.sparse_push()
        pushed[parts] = {int(k): g for k, g in zip(push.keys, push.grads, strict=True)}
    for key, scale in expected.items():
        plain = pushed["none"][key]
        np.testing.assert_allclose(plain, float(keys.count(key)))  # the summed gradient
        np.testing.assert_allclose(pushed["all"][key], plain * scale, rtol=1e-6)
        np.testing.assert_allclose(pushed["embed"][key][0], plain[0] * scale, rtol=1e-6)
        np.testing.assert_array_equal(pushed["embed"][key][1:], plain[1:])


def _context_batch(rng: np.random.Generator) -> tuple[Batch, dict[str, int]]:
    """12 rows over 3 slots: an hour key in slot 0 of every row; a head key in slot 2 of
    rows 0-5, twice each (12 occurrences, as many as the batch has rows, in half of
    them); 1-3 rare ids per row in slot 1."""
    hour, head = 1000, 2000
    keys: list[int] = []
    offsets = [0]
    for row in range(12):
        rare = [int(k) for k in 3000 + rng.choice(40, size=int(rng.integers(1, 4)))]
        for slot_keys in ([hour], rare, [head, head] if row < 6 else []):
            keys += slot_keys
            offsets.append(len(keys))
    batch = Batch(
        labels=(rng.random(12) < 0.4).astype(np.float32),
        keys=np.asarray(keys, np.uint64),
        offsets=np.asarray(offsets, np.int64),
        num_slots=3,
    )
    return batch, {"hour": hour, "head": head}


@pytest.mark.parametrize("cvm", [False, True])
def test_context_keys_relearn_the_uncalibrated_loss_and_the_rest_keep_the_calibrated(
    cvm: bool,
) -> None:
    """Against two plain backwards through a nonlinear head: after ``relearn_context_keys``
    the hour key's row is the gradient of the loss at the logit before the correction, and
    every other row (the head key as frequent as the batch, the rare ids) the calibrated
    loss's."""
    from torch.nn import functional as nnf

    from streamtrain_worker.models.calibration import uncalibrated_gradient_ratio

    rng = np.random.default_rng(3)
    batch, named = _context_batch(rng)
    vocab = np.unique(batch.keys)
    rows = rng.normal(size=(vocab.shape[0], 3 + DIM)).astype(np.float32)
    rows[:, :2] = rng.integers(0, 50, size=(vocab.shape[0], 2))
    ps = RecordingTable(vocab, rows)
    torch.manual_seed(0)
    head = torch.nn.Sequential(
        torch.nn.Flatten(),
        torch.nn.Linear(3 * (1 + DIM + 2 * cvm), 8),
        torch.nn.Tanh(),
        torch.nn.Linear(8, 1),
        torch.nn.Flatten(0),
    )
    labels = torch.from_numpy(batch.labels)
    offsets = torch.from_numpy(rng.normal(scale=1.5, size=12).astype(np.float32))

    def gradient(corrected: bool) -> tuple[dict[int, npt.NDArray[np.float32]], Lookup]:
        lookup = Lookup(prepare(batch, ps, "emb", DIM, cvm=cvm), cvm=cvm)
        logits = head(lookup.pooled) + (offsets if corrected else 0.0)
        nnf.binary_cross_entropy_with_logits(logits, labels, reduction="sum").backward()
        push = lookup.sparse_push()
        return {int(k): g.copy() for k, g in zip(push.keys, push.grads, strict=True)}, lookup

    calibrated, _ = gradient(True)
    uncalibrated, _ = gradient(False)
    lookup = Lookup(prepare(batch, ps, "emb", DIM, cvm=cvm), cvm=cvm, keep_pooled_grad=True)
    logits = head(lookup.pooled) + offsets
    nnf.binary_cross_entropy_with_logits(logits, labels, reduction="sum").backward()
    ratio = uncalibrated_gradient_ratio(logits.detach(), offsets, labels)
    assert lookup.relearn_context_keys(ratio) == 1
    push = lookup.sparse_push()
    got = {int(k): g for k, g in zip(push.keys, push.grads, strict=True)}
    for key, grad in got.items():
        want = uncalibrated[key] if key == named["hour"] else calibrated[key]
        np.testing.assert_allclose(grad, want, rtol=1e-4, atol=1e-6)
    assert not np.allclose(calibrated[named["hour"]], uncalibrated[named["hour"]], atol=1e-3)


def test_without_a_context_key_or_a_backward_nothing_is_relearned() -> None:
    rng = np.random.default_rng(4)
    batch, _ = _context_batch(rng)
    keep = np.diff(batch.offsets)
    # The same rows with slot 0 (the hour key) emptied.
    no_hour = Batch(
        labels=batch.labels,
        keys=np.concatenate(
            [
                batch.keys[batch.offsets[i] : batch.offsets[i + 1]]
                for i in range(keep.shape[0])
                if i % 3
            ]
        ),
        offsets=np.concatenate([[0], np.cumsum(np.where(np.arange(keep.shape[0]) % 3, keep, 0))]),
        num_slots=3,
    )
    ps = RecordingTable(
        np.unique(batch.keys), np.ones((np.unique(batch.keys).shape[0], 3 + DIM), np.float32)
    )
    lookup = Lookup(prepare(no_hour, ps, "emb", DIM), cvm=False, keep_pooled_grad=True)
    assert lookup.relearn_context_keys(torch.full((12,), 2.0)) == 0  # no backward yet
    lookup.pooled.sum().backward()
    before = lookup.weight.grad.clone()  # type: ignore[union-attr]
    assert lookup.relearn_context_keys(torch.full((12,), 2.0)) == 0
    torch.testing.assert_close(lookup.weight.grad, before)
