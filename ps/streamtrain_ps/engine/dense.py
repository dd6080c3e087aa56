"""Named flat float32 vectors: the dense network's parameters (Adam or SGD) and summed
statistics (the *summary* rule).

Workers push gradients and pull parameters asynchronously; each vector has its own lock and
a version counter (pushes applied), so pushes to one vector are serialised and exact while
different vectors update in parallel. A vector is created by ``init`` — the first writer
wins, later callers get the current values back (every worker initialises its network the
same way and adopts whatever is already on the PS).

A summary vector (Paddle's ``summary`` dense rule, used by ``data_norm``) is not trained: a
push adds the worker's batch statistics, ``values = decay * values + pushed``. Summing on
the PS is what makes input normalisation global — every worker, and the exported model,
normalise with the statistics of all the data seen, not of one batch or one worker
(``docs/decisions.md``).
"""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
from numba import njit

from streamtrain_ps.config import DenseOptimizerConfig
from streamtrain_ps.errors import InvalidRequestError, UnknownTableError


@dataclass
class DenseState:
    """Everything a checkpoint stores of one vector."""

    values: npt.NDArray[np.float32]
    m: npt.NDArray[np.float32]
    v: npt.NDArray[np.float32]
    step: int
    version: int
    #: Set for a summary vector (pushes are added with this decay); None for parameters.
    summary_decay: float | None = None
    #: A summary vector's sums in float64 (``values`` is their float32 copy): summed
    #: statistics reach billions of examples, where float32 drops whole batches.
    sums: npt.NDArray[np.float64] | None = None

    def copy(self) -> DenseState:
        sums = None if self.sums is None else self.sums.copy()
        return DenseState(
            self.values.copy(),
            self.m.copy(),
            self.v.copy(),
            self.step,
            self.version,
            self.summary_decay,
            sums,
        )


class DenseVector:
    """One vector; Adam state is allocated even for SGD so checkpoints have one shape."""

    def __init__(
        self,
        values: npt.NDArray[np.float32],
        config: DenseOptimizerConfig,
        summary_decay: float | None = None,
    ) -> None:
        self._config = config
        self._lock = threading.Lock()
        self._state = DenseState(
            values=np.array(values, dtype=np.float32, copy=True),
            m=np.zeros(values.size, dtype=np.float32),
            v=np.zeros(values.size, dtype=np.float32),
            step=0,
            version=0,
            summary_decay=summary_decay,
            sums=None if summary_decay is None else np.asarray(values, dtype=np.float64).copy(),
        )

    @property
    def summary_decay(self) -> float | None:
        return self._state.summary_decay

    @property
    def size(self) -> int:
        return int(self._state.values.size)

    def pull(self) -> tuple[npt.NDArray[np.float32], int]:
        with self._lock:
            return self._state.values.copy(), self._state.version

    def push(self, grads: npt.NDArray[np.float32]) -> int:
        """Apply one gradient in place (float32 numba kernel, GIL released): the old
        float64 version made ~10 temporaries and took 15-27 ms per push of a 512-256-128
        MLP on a busy box; this one makes none. The bias correction is computed in float64
        once per push; the per-element math is float32 like the stored state."""
        c = self._config
        g = np.ascontiguousarray(grads, dtype=np.float32)
        with self._lock:
            s = self._state
            if s.summary_decay is not None:
                assert s.sums is not None  # set with summary_decay (constructor, restore)
                _summary_kernel(s.sums, s.values, g, s.summary_decay)
            elif c.type == "sgd":
                _sgd_kernel(s.values, g, np.float32(c.learningRate))
            else:
                s.step += 1
                lr_t = c.learningRate * math.sqrt(1.0 - c.beta2**s.step) / (1.0 - c.beta1**s.step)
                _adam_kernel(
                    s.values,
                    s.m,
                    s.v,
                    g,
                    np.float32(lr_t),
                    np.float32(c.beta1),
                    np.float32(1.0 - c.beta1),  # in float64: float32(1) - float32(0.999)
                    np.float32(c.beta2),  # is 1.3e-5 off 0.001, which v would inherit
                    np.float32(1.0 - c.beta2),
                    np.float32(c.epsilon),
                )
            s.version += 1
            return s.version

    def snapshot(self) -> DenseState:
        with self._lock:
            s = self._state
            return s.copy()

    @classmethod
    def restore(cls, state: DenseState, config: DenseOptimizerConfig) -> DenseVector:
        vec = cls(state.values, config)
        vec._state = state.copy()
        if state.summary_decay is not None and state.sums is None:  # saved before float64
            vec._state.sums = state.values.astype(np.float64)
        return vec


# error_model="numpy": without it numba checks every division for a zero divisor (to raise
# ZeroDivisionError), and that branch keeps LLVM from vectorising the loop. The divisor here
# is sqrt(v) + eps > 0, and IEEE division is the same either way: identical bits, 0.98 ->
# 0.13 ms a push of the 345k-parameter bench network (docs/benchmarks.md, issue 11).
@njit(nogil=True, cache=True, error_model="numpy")
def _adam_kernel(
    w: npt.NDArray[np.float32],
    m: npt.NDArray[np.float32],
    v: npt.NDArray[np.float32],
    g: npt.NDArray[np.float32],
    lr_t: np.float32,
    b1: np.float32,
    c1: np.float32,
    b2: np.float32,
    c2: np.float32,
    eps: np.float32,
) -> None:
    """Adam with bias correction folded into ``lr_t``: ``m = b1·m + (1−b1)·g``, ``v = b2·v
    + (1−b2)·g²``, ``w −= lr_t·m/(sqrt(v)+eps)``; every operand float32, in place
    (``c1``, ``c2`` are ``1−b1``, ``1−b2``, rounded once from float64)."""
    for i in range(w.size):
        gi = g[i]
        mi = b1 * m[i] + c1 * gi
        vi = b2 * v[i] + c2 * gi * gi
        m[i] = mi
        v[i] = vi
        w[i] -= lr_t * mi / (np.sqrt(vi) + eps)


@njit(nogil=True, cache=True)
def _summary_kernel(
    sums: npt.NDArray[np.float64],
    values: npt.NDArray[np.float32],
    g: npt.NDArray[np.float32],
    decay: float,
) -> None:
    """``sums = decay * sums + g`` in float64, and ``values`` their float32 copy."""
    for i in range(sums.size):
        sums[i] = decay * sums[i] + g[i]
        values[i] = sums[i]


@njit(nogil=True, cache=True)
def _sgd_kernel(w: npt.NDArray[np.float32], g: npt.NDArray[np.float32], lr: np.float32) -> None:
    for i in range(w.size):
        w[i] -= lr * g[i]


class DenseStore:
    """The dense vectors of one shard, by name."""

    def __init__(self, config: DenseOptimizerConfig) -> None:
        self._config = config
        self._lock = threading.Lock()
        self._vectors: dict[str, DenseVector] = {}

    def names(self) -> tuple[str, ...]:
        with self._lock:
            return tuple(sorted(self._vectors))

    def init(
        self, name: str, values: npt.NDArray[np.float32], summary_decay: float | None = None
    ) -> tuple[npt.NDArray[np.float32], int]:
        """Create ``name`` from ``values`` unless it exists; return the current values.

        An existing vector must agree on size and rule: a parameter vector silently turned
        into a summary (or back) would corrupt the model at the first push.
        """
        with self._lock:
            vec = self._vectors.get(name)
            if vec is None:
                vec = DenseVector(values, self._config, summary_decay)
                self._vectors[name] = vec
        if vec.size != values.size:
            raise InvalidRequestError(
                "values", f"dense vector {name!r} has {vec.size} values, got {values.size}"
            )
        if vec.summary_decay != summary_decay:
            raise InvalidRequestError(
                "summary",
                f"dense vector {name!r} has rule {_rule(vec.summary_decay)}, "
                f"requested {_rule(summary_decay)}",
            )
        return vec.pull()

    def get(self, name: str) -> DenseVector:
        with self._lock:
            vec = self._vectors.get(name)
        if vec is None:
            raise UnknownTableError("dense vector", name)
        return vec

    def pull_all(self) -> dict[str, tuple[npt.NDArray[np.float32], int]]:
        """Every vector's values and version (copies), by name: a snapshot save's dense
        part, without the optimizer state a checkpoint also keeps."""
        with self._lock:
            vectors = dict(self._vectors)
        return {name: vec.pull() for name, vec in vectors.items()}

    def push(self, name: str, grads: npt.NDArray[np.float32]) -> int:
        vec = self.get(name)
        if grads.size != vec.size:
            raise InvalidRequestError(
                "grads", f"dense vector {name!r} has {vec.size} values, got {grads.size}"
            )
        return vec.push(grads)

    def snapshot(self) -> dict[str, DenseState]:
        with self._lock:
            vectors = dict(self._vectors)
        return {name: vec.snapshot() for name, vec in vectors.items()}

    def replace(self, states: dict[str, DenseState]) -> None:
        """Swap in loaded vectors (all at once; vectors not in ``states`` are dropped)."""
        vectors = {name: DenseVector.restore(s, self._config) for name, s in states.items()}
        with self._lock:
            self._vectors = vectors


def _rule(summary_decay: float | None) -> str:
    return "optimizer" if summary_decay is None else f"summary(decay={summary_decay})"
