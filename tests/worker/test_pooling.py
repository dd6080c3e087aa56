"""The pooling's backward by key gives embedding_bag's own gradient, on both sort paths."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.nn import functional as nnf

from streamtrain_worker.training.pooling import KeyBags, sum_pool


def bags(rng: np.random.Generator, num_bags: int, vocab: int) -> tuple[np.ndarray, np.ndarray]:
    """Unique-key indices per occurrence (every index in [0, vocab) occurs) and offsets."""
    lengths = rng.integers(0, 4, size=num_bags)  # empty bags included
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    inverse = rng.integers(0, vocab, size=int(offsets[-1])).astype(np.int64)
    inverse[:vocab] = np.arange(vocab)  # every unique key occurs at least once
    rng.shuffle(inverse)
    return inverse, offsets


@pytest.mark.parametrize("vocab", [37, 70_000])  # uint16 radix sort, and int64 sort
def test_backward_equals_embedding_bag(vocab: int) -> None:
    rng = np.random.default_rng(vocab)
    inverse, offsets = bags(rng, num_bags=2 * vocab, vocab=vocab)
    bag = np.repeat(np.arange(offsets.shape[0] - 1), np.diff(offsets))
    by_key = KeyBags.of(inverse, bag, np.bincount(inverse, minlength=vocab))
    values = torch.from_numpy(rng.normal(size=(vocab, 3)).astype(np.float32))
    upstream = torch.from_numpy(rng.normal(size=(offsets.shape[0] - 1, 3)).astype(np.float32))
    inv_t, off_t = torch.from_numpy(inverse), torch.from_numpy(offsets)

    ours = values.clone().requires_grad_(True)
    pooled = sum_pool(ours, inv_t, off_t, by_key)
    pooled.backward(upstream)
    reference = values.clone().requires_grad_(True)
    expected = nnf.embedding_bag(inv_t, reference, off_t, mode="sum", include_last_offset=True)
    expected.backward(upstream)

    assert torch.equal(pooled, expected)
    assert ours.grad is not None and reference.grad is not None
    torch.testing.assert_close(ours.grad, reference.grad, rtol=1e-5, atol=1e-5)


def test_key_bags_list_each_keys_bags_in_occurrence_order() -> None:
    inverse = np.array([2, 0, 2, 1, 0, 2], dtype=np.int64)
    bag = np.array([0, 0, 1, 1, 2, 3], dtype=np.int64)
    by_key = KeyBags.of(inverse, bag, np.bincount(inverse, minlength=3))
    assert by_key.offsets.tolist() == [0, 2, 3, 6]
    assert by_key.bags.tolist() == [0, 2, 1, 0, 1, 3]


def test_without_grad_it_is_embedding_bag() -> None:
    inverse = torch.tensor([1, 0, 1])
    offsets = torch.tensor([0, 2, 3])
    weight = torch.tensor([[1.0, 2.0], [10.0, 20.0]])
    by_key = KeyBags.of(inverse.numpy(), np.array([0, 0, 1]), np.array([1, 2]))
    assert sum_pool(weight, inverse, offsets, by_key).tolist() == [[11.0, 22.0], [10.0, 20.0]]
