"""Each sparse update rule against a direct NumPy transcription of docs/design.md §4.

The reference keeps its own float64 copy of every key's state, applies the formulas to the
merged pushes, and must agree with the engine's float32 rows (pulled values *and* the
optimizer slots) after every round.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from streamtrain_ps.accessor import CLICK, DELTA, EMBED_STATE, EMBED_W, SHOW, UNSEEN, RowLayout
from streamtrain_ps.config import PSConfig, SparseOptimizerConfig, TableConfig
from streamtrain_ps.local import LocalPS
from streamtrain_ps.shard import Shard

D = 4
N_KEYS = 300


def _merge(keys, grads, shows, clicks):  # type: ignore[no-untyped-def]
    uk, inv = np.unique(keys, return_inverse=True)
    g = np.zeros((uk.size, grads.shape[1]))
    s = np.zeros(uk.size)
    c = np.zeros(uk.size)
    np.add.at(g, inv, grads.astype(np.float64))
    np.add.at(s, inv, shows.astype(np.float64))
    np.add.at(c, inv, clicks.astype(np.float64))
    return uk, g, s, c


class Reference:
    """State of every key as float64 arrays; one ``part`` per (weights, state) pair."""

    def __init__(self, opt: SparseOptimizerConfig, table: TableConfig) -> None:
        self.o = opt
        self.t = table

    def rule(self, w, state, g, part="embedx"):  # type: ignore[no-untyped-def]
        o = self.o
        if part == "embed":  # the embed part's own step size and G0, where set
            o = replace(
                o,
                learningRate=o.embedLearningRate or o.learningRate,
                initialG2sum=o.embedInitialG2sum or o.initialG2sum,
            )
        lo, hi = o.weightBounds
        d = w.shape[1]
        if o.type == "adagrad":
            G = state[:, 0]
            w = np.clip(
                w - o.learningRate * g * np.sqrt(o.initialG2sum / (o.initialG2sum + G))[:, None],
                lo,
                hi,
            )
            state = state.copy()
            state[:, 0] = G + np.mean(g * g, axis=1)
        elif o.type == "std_adagrad":
            G = state
            w = np.clip(
                w - o.learningRate * g * np.sqrt(o.initialG2sum / (o.initialG2sum + G)), lo, hi
            )
            state = G + g * g
        else:
            m, v = state[:, :d], state[:, d : 2 * d]
            p1 = state[:, 2 * d] * o.beta1
            p2 = state[:, 2 * d + 1] * o.beta2
            lr_t = o.learningRate * np.sqrt(1 - p2) / (1 - p1)
            m = o.beta1 * m + (1 - o.beta1) * g
            v = o.beta2 * v + (1 - o.beta2) * g * g
            w = np.clip(w - lr_t[:, None] * m / (np.sqrt(v) + o.epsilon), lo, hi)
            state = np.concatenate([m, v, p1[:, None], p2[:, None]], axis=1)
        return w, state


def _config(
    kind: str, bounds: tuple[float, float], lr: float, embed: tuple[float, float] | None = None
) -> PSConfig:
    """``embed``: the embed part's own (learning rate, G0); None shares the embedx part's."""
    opt = SparseOptimizerConfig(type=kind, learningRate=lr, weightBounds=bounds, initialRange=0.01)  # type: ignore[arg-type]
    if embed is not None:
        opt = replace(opt, embedLearningRate=embed[0], embedInitialG2sum=embed[1])
    return PSConfig(
        tables=(TableConfig(embedxDim=D, embedxThreshold=0.0, optimizer=opt),), logicalShards=4
    )


@pytest.mark.parametrize("kind", ["adagrad", "std_adagrad", "adam"])
@pytest.mark.parametrize(
    ("bounds", "lr", "embed"),
    [((-10.0, 10.0), 0.05, None), ((-0.02, 0.02), 0.5, None), ((-10.0, 10.0), 0.05, (0.3, 0.5))],
)
def test_update_rule_matches_numpy_transcription(
    kind: str, bounds: tuple[float, float], lr: float, embed: tuple[float, float] | None
) -> None:
    cfg = _config(kind, bounds, lr, embed)
    tc = cfg.tables[0]
    shard = Shard(cfg)
    table = shard.table("embedding")
    lay = RowLayout.of(tc)
    ref = Reference(tc.optimizer, tc)
    rng = np.random.default_rng(11)
    keys = np.unique(rng.integers(0, 2**64 - 1, N_KEYS, dtype=np.uint64, endpoint=True))
    n = keys.size

    # Round 0: zero gradients create every key and admit embedx (threshold 0); the
    # initial weights are whatever the seeded init chose, read back once.
    shard.push_sparse(
        "embedding",
        keys,
        np.zeros((n, D + 1), np.float32),
        np.ones(n, np.float32),
        np.zeros(n, np.float32),
    )
    full = table.copy_rows(table.rows_of(keys))[1].astype(np.float64)
    ew = full[:, [EMBED_W]]
    es = full[:, EMBED_STATE : lay.embedx_w]
    xw = full[:, lay.embedx_w : lay.embedx_state]
    xs = full[:, lay.embedx_state : lay.width]
    assert np.all(xs[:, lay.xflag - lay.embedx_state] >= 0), "threshold 0 admits on first push"
    assert np.any(xw != 0)
    show = np.ones(n)
    click = np.zeros(n)
    delta = show * tc.nonclkCoeff
    pos = {int(k): i for i, k in enumerate(keys)}

    for _ in range(6):
        m = 4 * n
        pk = rng.choice(keys, m)
        grads = rng.normal(0, 1, (m, D + 1)).astype(np.float32)
        shows = rng.integers(0, 3, m).astype(np.float32)  # includes show 0
        clicks = (rng.random(m) < 0.3).astype(np.float32) * np.minimum(shows, 1)
        updated = shard.push_sparse("embedding", pk, grads, shows, clicks)
        uk, g, s, c = _merge(pk, grads, shows, clicks)
        assert updated == uk.size
        idx = np.array([pos[int(k)] for k in uk])
        scale = np.where(s > 0, 1.0 / np.where(s > 0, s, 1), 1.0)
        g = g * scale[:, None]
        show[idx] += s
        click[idx] += c
        delta[idx] += (s - c) * tc.nonclkCoeff + c * tc.clickCoeff
        ew[idx], es[idx] = ref.rule(ew[idx], es[idx], g[:, :1], part="embed")
        xw[idx], xs[idx] = ref.rule(xw[idx], xs[idx], g[:, 1:])

        pulled = shard.pull_sparse("embedding", keys)
        np.testing.assert_allclose(pulled[:, 0], show, rtol=1e-6)
        np.testing.assert_allclose(pulled[:, 1], click, rtol=1e-6)
        np.testing.assert_allclose(pulled[:, 2:3], ew, rtol=2e-4, atol=2e-6)
        np.testing.assert_allclose(pulled[:, 3:], xw, rtol=2e-4, atol=2e-6)

    full = table.copy_rows(table.rows_of(keys))[1].astype(np.float64)
    np.testing.assert_allclose(full[:, EMBED_STATE : lay.embedx_w], es, rtol=2e-4, atol=1e-6)
    np.testing.assert_allclose(full[:, lay.embedx_state : lay.width], xs, rtol=2e-4, atol=1e-6)
    np.testing.assert_allclose(full[:, DELTA], delta, rtol=1e-5)
    assert (full[:, UNSEEN] == 0).all()
    np.testing.assert_allclose(full[:, SHOW], show)
    np.testing.assert_allclose(full[:, CLICK], click)
    lo, hi = bounds
    assert pulled[:, 2:].min() >= lo and pulled[:, 2:].max() <= hi
    if hi < 1:
        assert np.isclose(np.abs(pulled[:, 2:]).max(), hi), "the tight bounds were exercised"


def test_init_is_reproducible_and_independent_of_shard_layout() -> None:
    cfg = _config("adam", (-10.0, 10.0), 0.05)
    keys = np.arange(1, 200, dtype=np.uint64)
    n = keys.size
    zeros = np.zeros((n, D + 1), np.float32)
    rows = []
    for num_shards, seed in ((1, 0), (3, 0), (1, 1)):
        c = replace(cfg, seed=seed)
        ps = LocalPS(c, num_shards)
        ps.push_sparse("embedding", keys, zeros, np.ones(n, np.float32), np.zeros(n, np.float32))
        rows.append(ps.pull_sparse("embedding", keys))
        ps.close()
    np.testing.assert_array_equal(rows[0], rows[1])
    assert not np.array_equal(rows[0][:, 2:], rows[2][:, 2:]), "another seed, other weights"
    init = rows[0][:, 2:]
    assert np.abs(init).max() <= 0.01 and np.abs(init).min() > 0
    assert abs(float(init.mean())) < 0.002, "centred uniform"
