"""Each sparse update rule against a direct NumPy transcription of docs/design.md §4.

The reference keeps its own float64 copy of every key's state, applies the formulas to the
merged pushes, and must agree with the engine's float32 rows (pulled values *and* the
optimizer slots) after every round.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from streamtrain_ps.api import SaveMode, SparsePush
from streamtrain_ps.client.local import LocalPS
from streamtrain_ps.config import PSConfig, SparseOptimizerConfig, TableConfig
from streamtrain_ps.engine.accessor import (
    CLICK,
    DELTA,
    EMBED_STATE,
    EMBED_W,
    SHOW,
    UNSEEN,
    RowLayout,
)
from streamtrain_ps.saves import checkpoint
from streamtrain_ps.shard import Shard

D = 4
N_KEYS = 300
KINDS = ["adagrad", "std_adagrad", "adam", "ftrl", "scale_free_adagrad"]


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

    def rule(self, w, state, g, shows, part="embedx"):  # type: ignore[no-untyped-def]
        """One step, or with ``occurrenceSteps`` covering the part one per occurrence:
        ``shows`` rounded, at least 1, steps of the same mean gradient."""
        o = self.o
        covered = o.occurrenceSteps == "all" or (o.occurrenceSteps == "embed" and part == "embed")
        steps = np.maximum(np.rint(shows), 1) if covered else np.ones(len(shows))
        if part == "embed":  # the embed part's own rule, step size and G0, where set
            o = replace(
                o,
                type=o.embedType or o.type,
                learningRate=o.embedLearningRate or o.learningRate,
                initialG2sum=o.embedInitialG2sum or o.initialG2sum,
            )
        lo, hi = o.weightBounds
        d = w.shape[1]
        if o.type == "ftrl":  # McMahan et al. 2013, Algorithm 1 per coordinate, per step
            z, n = state[:, :d], state[:, d:]
            for k in range(int(steps.max())):
                on = (k < steps)[:, None]
                n_new = n + g * g
                z_new = z + g - (np.sqrt(n_new) - np.sqrt(n)) / o.ftrlAlpha * w
                closed = -(z_new - np.sign(z_new) * o.ftrlL1) / (
                    (o.ftrlBeta + np.sqrt(n_new)) / o.ftrlAlpha + o.ftrlL2
                )
                w_new = np.clip(np.where(np.abs(z_new) <= o.ftrlL1, 0.0, closed), lo, hi)
                z, n, w = np.where(on, z_new, z), np.where(on, n_new, n), np.where(on, w_new, w)
            state = np.concatenate([z, n], axis=1)
        elif o.type == "adagrad":
            G = state[:, 0]
            a = np.mean(g * g, axis=1)
            g0 = o.initialG2sum
            ratio = sum(
                np.where(k < steps, np.sqrt(g0 / (g0 + G + k * a)), 0.0)
                for k in range(int(steps.max()))
            )
            w = np.clip(w - o.learningRate * g * ratio[:, None], lo, hi)
            state = state.copy()
            state[:, 0] = G + steps * a
        elif o.type == "std_adagrad":
            G = state
            g0 = o.initialG2sum
            ratio = sum(
                np.where((k < steps)[:, None], np.sqrt(g0 / (g0 + G + k * g * g)), 0.0)
                for k in range(int(steps.max()))
            )
            w = np.clip(w - o.learningRate * g * ratio, lo, hi)
            state = G + steps[:, None] * g * g
        elif o.type == "scale_free_adagrad":  # PyTorch's Adagrad: G first, then the step
            G = state
            ratio = sum(
                np.where((k <= steps)[:, None], 1.0 / (np.sqrt(G + k * g * g) + o.epsilon), 0.0)
                for k in range(1, int(steps.max()) + 1)
            )
            w = np.clip(w - o.learningRate * g * ratio, lo, hi)
            state = G + steps[:, None] * g * g
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
    kind: str,
    bounds: tuple[float, float],
    lr: float,
    embed: tuple[float, float] | None = None,
    **opt_fields: object,
) -> PSConfig:
    """``embed``: the embed part's own (learning rate, G0); None shares the embedx part's."""
    opt = SparseOptimizerConfig(type=kind, learningRate=lr, weightBounds=bounds, initialRange=0.01)  # type: ignore[arg-type]
    opt = replace(opt, **opt_fields)  # type: ignore[arg-type]
    embed_lr, embed_g0 = embed if embed is not None else (None, None)
    opt = replace(opt, embedLearningRate=embed_lr, embedInitialG2sum=embed_g0)
    return PSConfig(
        tables=(TableConfig(embedxDim=D, embedxThreshold=0.0, optimizer=opt),), logicalShards=4
    )


FTRL_CASES: list[dict[str, object]] = [
    {"ftrlAlpha": 0.1, "ftrlBeta": 1.0, "ftrlL1": 0.0, "ftrlL2": 0.0},
    {"ftrlAlpha": 0.5, "ftrlBeta": 0.5, "ftrlL1": 1.0, "ftrlL2": 1.0},  # many exact zeros
]


_RULE_CASES = [
    (kind, bounds, lr, embed, ftrl)
    for kind in KINDS
    for bounds, lr, embed in [
        ((-10.0, 10.0), 0.05, None),
        ((-0.02, 0.02), 0.5, None),
        ((-10.0, 10.0), 0.05, (0.3, 0.5)),
    ]
    for ftrl in (FTRL_CASES if kind == "ftrl" else FTRL_CASES[:1])  # only FTRL reads them
]


@pytest.mark.parametrize(("kind", "bounds", "lr", "embed", "ftrl"), _RULE_CASES)
def test_update_rule_matches_numpy_transcription(
    kind: str,
    bounds: tuple[float, float],
    lr: float,
    embed: tuple[float, float] | None,
    ftrl: dict[str, object],
) -> None:
    _check_against_reference(_config(kind, bounds, lr, embed, **ftrl), bounds)


@pytest.mark.parametrize("embedx_kind", ["adagrad", "adam", "scale_free_adagrad"])
@pytest.mark.parametrize("ftrl", FTRL_CASES)
def test_an_ftrl_embed_part_beside_another_embedx_rule(
    embedx_kind: str, ftrl: dict[str, object]
) -> None:
    cfg = _config(embedx_kind, (-10.0, 10.0), 0.05, embedType="ftrl", **ftrl)
    lay = RowLayout.of(cfg.tables[0])
    assert lay.embedx_w == EMBED_STATE + 2, "z and n of one embed weight"
    _check_against_reference(cfg, (-10.0, 10.0))


def _check_against_reference(cfg: PSConfig, bounds: tuple[float, float]) -> None:
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
        SparsePush(
            keys, np.zeros((n, D + 1), np.float32), np.ones(n, np.float32), np.zeros(n, np.float32)
        ),
    )
    full = table.saves.copy_rows(table.rows_of(keys))[1].astype(np.float64)
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
        updated = shard.push_sparse("embedding", SparsePush(pk, grads, shows, clicks))
        uk, g, s, c = _merge(pk, grads, shows, clicks)
        assert updated == uk.size
        idx = np.array([pos[int(k)] for k in uk])
        scale = np.where(s > 0, 1.0 / np.where(s > 0, s, 1), 1.0)
        g = g * scale[:, None]
        show[idx] += s
        click[idx] += c
        delta[idx] += (s - c) * tc.nonclkCoeff + c * tc.clickCoeff
        ew[idx], es[idx] = ref.rule(ew[idx], es[idx], g[:, :1], s, part="embed")
        xw[idx], xs[idx] = ref.rule(xw[idx], xs[idx], g[:, 1:], s)

        pulled = shard.pull_sparse("embedding", keys)
        np.testing.assert_allclose(pulled[:, 0], show, rtol=1e-6)
        np.testing.assert_allclose(pulled[:, 1], click, rtol=1e-6)
        np.testing.assert_allclose(pulled[:, 2:3], ew, rtol=2e-4, atol=2e-6)
        np.testing.assert_allclose(pulled[:, 3:], xw, rtol=2e-4, atol=2e-6)

    full = table.saves.copy_rows(table.rows_of(keys))[1].astype(np.float64)
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
        ps.push_sparse(
            "embedding", SparsePush(keys, zeros, np.ones(n, np.float32), np.zeros(n, np.float32))
        )
        rows.append(ps.pull_sparse("embedding", keys))
        ps.close()
    np.testing.assert_array_equal(rows[0], rows[1])
    assert not np.array_equal(rows[0][:, 2:], rows[2][:, 2:]), "another seed, other weights"
    init = rows[0][:, 2:]
    assert np.abs(init).max() <= 0.01 and np.abs(init).min() > 0
    assert abs(float(init.mean())) < 0.002, "centred uniform"


@pytest.mark.parametrize("ftrl", FTRL_CASES)
def test_an_ftrl_warm_start_keeps_the_weights_it_loaded(
    tmp_path: Path, ftrl: dict[str, object]
) -> None:
    """A base (inference) save carries no state: each FTRL part restarts at the z whose
    closed form is its loaded weight, so a first step of zero gradients moves nothing."""
    src = Shard(_config("adagrad", (-10.0, 10.0), 0.5))
    keys = np.arange(1, 400, dtype=np.uint64)
    n = keys.size
    rng = np.random.default_rng(3)
    for _ in range(3):
        grads = rng.normal(0, 1, (n, D + 1)).astype(np.float32)
        src.push_sparse(
            "embedding", SparsePush(keys, grads, np.ones(n, np.float32), np.zeros(n, np.float32))
        )
    uri = str(tmp_path / "batch")
    checkpoint.publish(uri, [src.save(uri, SaveMode.BATCH)], config=src.config)
    warm = Shard(_config("ftrl", (-10.0, 10.0), 0.05, **ftrl))
    warm.load(uri)
    loaded = warm.pull_sparse("embedding", keys)
    np.testing.assert_array_equal(loaded, src.pull_sparse("embedding", keys))
    zeros = np.zeros((n, D + 1), np.float32)
    warm.push_sparse(
        "embedding", SparsePush(keys, zeros, np.zeros(n, np.float32), np.zeros(n, np.float32))
    )
    np.testing.assert_allclose(warm.pull_sparse("embedding", keys), loaded, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("rule", KINDS)
@pytest.mark.parametrize("dim", [1, 8])
def test_init_part_writes_only_its_own_weights_and_state(rule: str, dim: int) -> None:
    """A part's init stays inside ``dim`` weights and ``state_width`` state columns: the
    rest of the row (the packed word, a neighbour row) keeps what it held."""
    from streamtrain_ps.engine.optim import OPTIMIZER_CODES, init_part, state_width, table_params

    kind = OPTIMIZER_CODES[rule]
    used = dim + state_width(kind, dim)
    slab = np.full((3, used + 4), 7.0, dtype=np.float32)
    fp = table_params(SparseOptimizerConfig(initialRange=0.01))[1]
    init_part(slab, 1, 0, dim, dim, kind, True, np.uint64(0), np.uint64(42), fp, 0)
    assert (slab[1, used:] == 7.0).all(), slab[1]
    assert (slab[[0, 2]] == 7.0).all()
    assert (slab[1, :used] != 7.0).all()


@pytest.mark.parametrize("steps", ["embed", "all"])
@pytest.mark.parametrize("kind", KINDS)
def test_one_step_per_occurrence_where_occurrence_steps_say_so(kind: str, steps: str) -> None:
    cfg = _config(kind, (-10.0, 10.0), 0.05, **FTRL_CASES[0], occurrenceSteps=steps)
    _check_against_reference(cfg, (-10.0, 10.0))


def test_a_key_in_every_row_learns_as_much_as_its_occurrences_would() -> None:
    """With occurrence steps, a key pushed once with show n moves as far as n pushes of
    show 1 with the same mean gradient (AdaGrad), and about n times further than one such
    push would move it on its own while G is still small."""
    key = np.array([7], np.uint64)
    grad = np.full((1, D + 1), 0.2, np.float32)
    moved = {}
    for label, pushes, show in (("batch", 1, 32.0), ("online", 32, 1.0), ("one", 1, 1.0)):
        shard = Shard(_config("adagrad", (-10.0, 10.0), 0.05, occurrenceSteps="all"))
        for _ in range(pushes):
            shard.push_sparse(
                "embedding",
                SparsePush(key, grad * show, np.array([show], np.float32), np.zeros(1, np.float32)),
            )
        moved[label] = float(shard.pull_sparse("embedding", key)[0, 2])
    np.testing.assert_allclose(moved["batch"], moved["online"], rtol=1e-5)
    assert moved["batch"] < 25 * moved["one"] < 0  # ~32 steps, each a little smaller


def test_a_scale_free_embedx_moves_a_rare_id_as_far_as_a_frequent_one() -> None:
    """The scale-free rule's first step is ``lr * sign(g)`` whatever the gradient's size,
    where Paddle's AdaGrad moves by ``lr * g``: an embedx gradient damped to 0.01 by the
    network moves the weight 100x less under the latter (docs/decisions.md, issue 26)."""
    key = np.array([7], np.uint64)
    moved = {}
    for kind in ("adagrad", "scale_free_adagrad"):
        for size in (1.0, 0.01):
            shard = Shard(_config(kind, (-10.0, 10.0), 0.05))
            one, no_click = np.ones(1, np.float32), np.zeros(1, np.float32)
            zero = np.zeros((1, D + 1), np.float32)
            # creates it, admits embedx
            shard.push_sparse("embedding", SparsePush(key, zero, one, no_click))
            before = shard.pull_sparse("embedding", key)
            grad = np.full((1, D + 1), size, np.float32)
            shard.push_sparse("embedding", SparsePush(key, grad, one, no_click))
            after = shard.pull_sparse("embedding", key)
            moved[kind, size] = float((before - after)[0, 3:].mean())
    np.testing.assert_allclose(moved["scale_free_adagrad", 1.0], 0.05, rtol=1e-5)
    np.testing.assert_allclose(moved["scale_free_adagrad", 0.01], 0.05, rtol=1e-5)
    np.testing.assert_allclose(moved["adagrad", 0.01], 0.0005, rtol=1e-4)
