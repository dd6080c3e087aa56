"""Named flat float32 vectors (the dense network's parameters) with Adam or SGD.

Workers push gradients and pull parameters asynchronously; each vector has its own lock and
a version counter (pushes applied), so pushes to one vector are serialised and exact while
different vectors update in parallel. A vector is created by ``init`` — the first writer
wins, later callers get the current values back (every worker initialises its network the
same way and adopts whatever is already on the PS).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

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


class DenseVector:
    """One vector; Adam state is allocated even for SGD so checkpoints have one shape."""

    def __init__(self, values: npt.NDArray[np.float32], config: DenseOptimizerConfig) -> None:
        self._config = config
        self._lock = threading.Lock()
        self._state = DenseState(
            values=np.array(values, dtype=np.float32, copy=True),
            m=np.zeros(values.size, dtype=np.float32),
            v=np.zeros(values.size, dtype=np.float32),
            step=0,
            version=0,
        )

    @property
    def size(self) -> int:
        return int(self._state.values.size)

    def pull(self) -> tuple[npt.NDArray[np.float32], int]:
        with self._lock:
            return self._state.values.copy(), self._state.version

    def push(self, grads: npt.NDArray[np.float32]) -> int:
        c = self._config
        g = grads.astype(np.float64)
        with self._lock:
            s = self._state
            w = s.values.astype(np.float64)
            if c.type == "sgd":
                w -= c.learningRate * g
            else:
                s.step += 1
                m = c.beta1 * s.m + (1.0 - c.beta1) * g
                v = c.beta2 * s.v + (1.0 - c.beta2) * g * g
                lr_t = c.learningRate * np.sqrt(1.0 - c.beta2**s.step) / (1.0 - c.beta1**s.step)
                w -= lr_t * m / (np.sqrt(v) + c.epsilon)
                s.m = m.astype(np.float32)
                s.v = v.astype(np.float32)
            s.values = w.astype(np.float32)
            s.version += 1
            return s.version

    def snapshot(self) -> DenseState:
        with self._lock:
            s = self._state
            return DenseState(s.values.copy(), s.m.copy(), s.v.copy(), s.step, s.version)

    @classmethod
    def restore(cls, state: DenseState, config: DenseOptimizerConfig) -> DenseVector:
        vec = cls(state.values, config)
        vec._state = DenseState(
            state.values.copy(), state.m.copy(), state.v.copy(), state.step, state.version
        )
        return vec


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
        self, name: str, values: npt.NDArray[np.float32]
    ) -> tuple[npt.NDArray[np.float32], int]:
        """Create ``name`` from ``values`` unless it exists; return the current values."""
        with self._lock:
            vec = self._vectors.get(name)
            if vec is None:
                vec = DenseVector(values, self._config)
                self._vectors[name] = vec
        if vec.size != values.size:
            raise InvalidRequestError(
                "values", f"dense vector {name!r} has {vec.size} values, got {values.size}"
            )
        return vec.pull()

    def get(self, name: str) -> DenseVector:
        with self._lock:
            vec = self._vectors.get(name)
        if vec is None:
            raise UnknownTableError("dense vector", name)
        return vec

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
