"""Dense Adam/SGD: the in-place float32 numba kernel follows the float64 reference formula.

The reference is the previous implementation's math (float64, bias-corrected step size);
the kernel computes per element in float32 like the stored state, so results agree to
float32 rounding (rtol 1e-5 over 30 steps), not bit for bit.
"""

from __future__ import annotations

import numpy as np
import pytest

from streamtrain_ps.config import DenseOptimizerConfig, DenseOptimizerType
from streamtrain_ps.engine.dense import DenseVector


def reference(
    c: DenseOptimizerConfig, w0: np.ndarray, grads: list[np.ndarray]
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    w = w0.astype(np.float64)
    m = np.zeros_like(w)
    v = np.zeros_like(w)
    for t, g32 in enumerate(grads, start=1):
        g = g32.astype(np.float64)
        if c.type == "sgd":
            w -= c.learningRate * g
            continue
        m = c.beta1 * m + (1 - c.beta1) * g
        v = c.beta2 * v + (1 - c.beta2) * g * g
        lr_t = c.learningRate * np.sqrt(1 - c.beta2**t) / (1 - c.beta1**t)
        w -= lr_t * m / (np.sqrt(v) + c.epsilon)
    return w, m, v


@pytest.mark.parametrize("kind", ["adam", "sgd"])
def test_dense_update_matches_the_reference_formula(kind: DenseOptimizerType) -> None:
    c = DenseOptimizerConfig(type=kind, learningRate=0.01)
    rng = np.random.default_rng(3)
    w0 = rng.normal(size=1000).astype(np.float32)
    grads = [rng.normal(scale=s, size=1000).astype(np.float32) for s in np.geomspace(1e-3, 10, 30)]
    vec = DenseVector(w0, c)
    for i, g in enumerate(grads, start=1):
        assert vec.push(g) == i
    w, m, v = reference(c, w0, grads)
    state = vec.snapshot()
    assert state.values.dtype == np.float32
    np.testing.assert_allclose(state.values, w, rtol=1e-5, atol=1e-6)
    if kind == "adam":
        assert state.step == len(grads)
        np.testing.assert_allclose(state.m, m, rtol=1e-5, atol=1e-7)
        np.testing.assert_allclose(state.v, v, rtol=1e-5, atol=1e-9)
    pulled, version = vec.pull()
    pulled[:] = 0  # a pull is a copy: the vector is updated in place, never shared
    assert version == len(grads) and np.array_equal(vec.pull()[0], state.values)


def test_summary_vector_adds_pushes_with_decay() -> None:
    """A summary vector is not trained: each push is added after decaying the sum."""
    w0 = np.array([1e4, 0.0, 1e4], dtype=np.float32)
    vec = DenseVector(w0, DenseOptimizerConfig(), summary_decay=0.5)
    pushes = [np.array([256.0, 10.0, 300.0], np.float32), np.array([128.0, -4.0, 90.0], np.float32)]
    expected = w0.astype(np.float64)
    for g in pushes:
        vec.push(g)
        expected = 0.5 * expected + g
    np.testing.assert_allclose(vec.pull()[0], expected, rtol=1e-6)
    assert vec.snapshot().summary_decay == 0.5
    assert vec.snapshot().step == 0  # no optimizer step was taken


def test_summary_rule_is_part_of_a_vectors_identity() -> None:
    from streamtrain_ps.engine.dense import DenseStore
    from streamtrain_ps.errors import InvalidRequestError

    store = DenseStore(DenseOptimizerConfig())
    store.init("stats", np.ones(3, np.float32), summary_decay=0.99)
    store.init("w", np.ones(3, np.float32))
    with pytest.raises(InvalidRequestError, match="rule summary") as summary:
        store.init("stats", np.ones(3, np.float32))
    assert summary.value.field == "summary"
    with pytest.raises(InvalidRequestError, match="rule optimizer"):
        store.init("w", np.ones(3, np.float32), summary_decay=0.99)
    restored = DenseStore(DenseOptimizerConfig())
    restored.replace(store.snapshot())
    restored.push("stats", np.ones(3, np.float32))
    np.testing.assert_allclose(restored.get("stats").pull()[0], 0.99 + 1.0, rtol=1e-6)


def test_summary_sums_accumulate_in_float64_where_float32_would_drop_pushes() -> None:
    """At 2**25 (float32 spacing 4) a float32 sum ignores +1; a day of statistics gets
    there. The sums are float64; pulls see their float32 copy."""
    start = float(2**25)
    vec = DenseVector(np.array([start], np.float32), DenseOptimizerConfig(), summary_decay=1.0)
    one = np.ones(1, np.float32)
    for _ in range(1000):
        vec.push(one)
    assert vec.pull()[0][0] == start + 1000  # float32: 2**25 after every push
    state = vec.snapshot()
    assert state.sums is not None and state.sums.dtype == np.float64
    again = DenseVector.restore(state, DenseOptimizerConfig())
    again.push(one)
    assert again.snapshot().sums is not None
    np.testing.assert_array_equal(again.snapshot().sums, [start + 1001])


def test_adam_kernel_is_the_float32_formula_bit_for_bit() -> None:
    """The kernel (vectorised: ``error_model="numpy"``) performs exactly the float32 operations
    of the formula in order — the same bits as numpy's elementwise float32 arithmetic."""
    c = DenseOptimizerConfig(type="adam", learningRate=0.01)
    rng = np.random.default_rng(7)
    w = rng.normal(size=4099).astype(np.float32)  # not a multiple of any vector width
    m = np.zeros_like(w)
    v = np.zeros_like(w)
    vec = DenseVector(w, c)
    f32 = np.float32
    b1, c1, b2, c2 = f32(c.beta1), f32(1.0 - c.beta1), f32(c.beta2), f32(1.0 - c.beta2)
    for t in range(1, 6):
        g = rng.normal(scale=10.0 ** (t - 3), size=w.size).astype(np.float32)
        g[:3] = 0.0  # zero gradients: v stays 0, the divisor is eps alone
        vec.push(g)
        lr_t = f32(c.learningRate * np.sqrt(1.0 - c.beta2**t) / (1.0 - c.beta1**t))
        m = b1 * m + c1 * g
        v = b2 * v + c2 * g * g
        w = w - lr_t * m / (np.sqrt(v) + f32(c.epsilon))
    state = vec.snapshot()
    assert np.array_equal(state.m, m) and np.array_equal(state.v, v)
    assert np.array_equal(state.values, w)
