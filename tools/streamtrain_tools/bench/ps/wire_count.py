"""``CountingPS``: a ``PSLike`` wrapper that adds up the payload bytes a worker exchanges.

Counted per call family, requests and responses together: the arrays' ``nbytes`` as they
cross the ``PSLike`` interface (keys, rows, gradients, shows, clicks, slots, dense vectors),
which is what ``streamtrain_ps.service.wire`` puts in the messages' ``bytes`` fields; gRPC/HTTP2
framing and the small scalar fields (a few dozen bytes a message) are not included.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from streamtrain_ps.api import PSLike, SparsePush


class CountingPS:
    """Forwards to ``inner``; ``bytes`` maps sparse_pull, sparse_push, dense to a total."""

    def __init__(self, inner: PSLike) -> None:
        self._inner = inner
        self._lock = threading.Lock()
        self.bytes: dict[str, int] = {}
        self.reset()

    def reset(self) -> None:
        with self._lock:
            self.bytes = {"sparse_pull": 0, "sparse_push": 0, "dense": 0}

    def _add(self, what: str, *arrays: npt.NDArray[Any] | None) -> None:
        n = sum(a.nbytes for a in arrays if a is not None)
        with self._lock:
            self.bytes[what] += n

    def pull_sparse(self, table: str, keys: npt.NDArray[np.uint64]) -> npt.NDArray[np.float32]:
        rows = self._inner.pull_sparse(table, keys)
        self._add("sparse_pull", keys, rows)
        return rows

    def push_sparse(self, table: str, push: SparsePush) -> None:
        self._inner.push_sparse(table, push)
        self._add("sparse_push", *(a for _, a in push.per_key()), push.keys)

    def push_batch(
        self,
        table: str,
        push: SparsePush,
        dense: Sequence[tuple[str, npt.NDArray[np.float32]]] = (),
    ) -> None:
        self._inner.push_batch(table, push, dense)
        self._add("sparse_push", *(a for _, a in push.per_key()), push.keys)
        self._add("dense", *(g for _, g in dense))

    def init_dense(
        self, name: str, values: npt.NDArray[np.float32], summary_decay: float | None = None
    ) -> npt.NDArray[np.float32]:
        out = self._inner.init_dense(name, values, summary_decay)
        self._add("dense", values, out)
        return out

    def pull_dense(self, name: str, snapshot_id: str = "") -> npt.NDArray[np.float32]:
        out = self._inner.pull_dense(name, snapshot_id)
        self._add("dense", out)
        return out

    def push_dense(self, name: str, grads: npt.NDArray[np.float32]) -> None:
        self._inner.push_dense(name, grads)
        self._add("dense", grads)

    def __getattr__(self, name: str) -> Any:  # save, load, shrink, stats, close
        return getattr(self._inner, name)
