"""Deterministic assignment of a pass's files to workers, balanced by size.

The scheduler calls this (it must stay pure and torch-free) and every restart must give the
same assignment for the same listing, so a replayed pass reads exactly the same data per
worker. Greedy longest-processing-time first: files sorted by size descending (path breaks
ties), each onto the currently least-loaded worker (lowest index breaks ties); each worker then
reads its files in path order, which is time order in the ``<day>/<HHMM>`` layout.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence


def assign_files(files: Sequence[tuple[str, int]], num_workers: int) -> list[list[str]]:
    """Split ``(path, size)`` files across ``num_workers``; every file exactly once.

    Returns one path list per worker (some empty when there are fewer files than workers).
    Duplicate paths or negative sizes are errors: they mean the listing itself is wrong.
    """
    if num_workers < 1:
        raise ValueError(f"num_workers must be >= 1, got {num_workers}")
    paths = [p for p, _ in files]
    if len(set(paths)) != len(paths):
        dupes = sorted({p for p in paths if paths.count(p) > 1})
        raise ValueError(f"duplicate files in the listing: {dupes[:5]}")
    for path, size in files:
        if size < 0:
            raise ValueError(f"file {path} has negative size {size}")
    order = sorted(files, key=lambda f: (-f[1], f[0]))
    heap = [(0, w) for w in range(num_workers)]
    assigned: list[list[str]] = [[] for _ in range(num_workers)]
    for path, size in order:
        load, worker = heapq.heappop(heap)
        assigned[worker].append(path)
        heapq.heappush(heap, (load + size, worker))
    for paths_of_worker in assigned:
        paths_of_worker.sort()
    return assigned


def worker_files(files: Sequence[tuple[str, int]], num_workers: int, worker: int) -> list[str]:
    """The files of one worker (``0 <= worker < num_workers``) under ``assign_files``."""
    if not 0 <= worker < num_workers:
        raise ValueError(f"worker {worker} is outside 0..{num_workers - 1}")
    return assign_files(files, num_workers)[worker]
