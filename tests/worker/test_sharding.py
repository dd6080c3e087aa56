"""File assignment: deterministic, balanced by size, every file exactly once."""

from __future__ import annotations

import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from streamtrain_worker.data.sharding import assign_files, worker_files


def test_largest_first_onto_least_loaded() -> None:
    files = [("a", 10), ("b", 7), ("c", 5), ("d", 4), ("e", 1)]
    # 10 -> w0, 7 -> w1, 5 -> w1 (7 < 10), 4 -> w0 (10 < 12), 1 -> w1 (12 < 14)
    assert assign_files(files, 2) == [["a", "d"], ["b", "c", "e"]]


def test_ties_go_to_the_lower_index_and_lists_are_sorted() -> None:
    files = [("x/0300/p", 1), ("x/0100/p", 1), ("x/0200/p", 1)]
    assert assign_files(files, 3) == [["x/0100/p"], ["x/0200/p"], ["x/0300/p"]]
    assert assign_files(files, 1) == [["x/0100/p", "x/0200/p", "x/0300/p"]]


def test_more_workers_than_files_and_empty_listing() -> None:
    assert assign_files([("only", 3)], 3) == [["only"], [], []]
    assert assign_files([], 2) == [[], []]


def test_invalid_inputs() -> None:
    with pytest.raises(ValueError, match="num_workers"):
        assign_files([("a", 1)], 0)
    with pytest.raises(ValueError, match="duplicate"):
        assign_files([("a", 1), ("a", 2)], 2)
    with pytest.raises(ValueError, match="negative size"):
        assign_files([("a", -1)], 2)
    with pytest.raises(ValueError, match="worker 2"):
        worker_files([("a", 1)], 2, 2)


@given(
    sizes=st.lists(st.integers(min_value=0, max_value=10_000), min_size=0, max_size=40),
    workers=st.integers(min_value=1, max_value=8),
)
def test_properties(sizes: list[int], workers: int) -> None:
    files = [(f"f{i:03d}", s) for i, s in enumerate(sizes)]
    shuffled = files[:]
    random.Random(len(sizes)).shuffle(shuffled)
    plan = assign_files(files, workers)
    assert assign_files(shuffled, workers) == plan  # independent of listing order
    flat = [p for ps in plan for p in ps]
    assert sorted(flat) == sorted(p for p, _ in files)  # each file exactly once
    assert all(ps == sorted(ps) for ps in plan)
    size_of = dict(files)
    loads = [sum(size_of[p] for p in ps) for ps in plan]
    # Greedy LPT guarantee: no worker exceeds the lightest by more than the largest file.
    assert max(loads) - min(loads) <= max(sizes, default=0)
    assert [worker_files(files, workers, w) for w in range(workers)] == plan
