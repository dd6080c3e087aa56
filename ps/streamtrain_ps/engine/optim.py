"""Sparse update rules (docs/design.md §4) as nogil kernels over one row of a slab.

A row has two *parts* that the rules update independently: ``embed`` (width 1) and
``embedx`` (width ``embedxDim``). Each part is weights followed by the rule's state:

- ``adagrad`` (SparseAdaGrad, one accumulator G per part)::

      w <- clip(w - lr * g * sqrt(G0 / (G0 + G)))   # with the OLD G
      G <- G + mean(g^2 over the part)

- ``std_adagrad``: the same with one G per dimension (``G_j += g_j^2``).
- ``scale_free_adagrad`` (PyTorch's ``Adagrad``): one G per dimension, starting at 0, and
  the step divided by the root of the NEW G, so it does not depend on the gradient's scale
  (the first step is ``lr * sign(g)``)::

      G_j <- G_j + g_j^2
      w_j <- clip(w_j - lr * g_j / (sqrt(G_j) + eps))

  Paddle's form above moves a key by ``lr * g`` on its first occurrences: an embedx whose
  gradients arrive damped by the MLP (~0.01) barely moves until it has been seen many
  times; this one moves a rare id's embedx as far as a frequent one's (docs/decisions.md).
- ``adam``: per dimension m, v and per *part* beta powers b1^t, b2^t (a part's step count
  starts when the part starts training: the embedx part at admission)::

      b1^t <- b1^(t-1) * beta1;  b2^t <- ...;  lr_t = lr * sqrt(1 - b2^t) / (1 - b1^t)
      m <- beta1 m + (1 - beta1) g;  v <- beta2 v + (1 - beta2) g^2
      w <- clip(w - lr_t * m / (sqrt(v) + eps))

- ``ftrl`` (FTRL-Proximal, McMahan et al. 2013): per dimension z and n; the weight column
  holds the clipped closed form, so pulls, saves and the tiers read it like any other rule::

      sigma = (sqrt(n + g^2) - sqrt(n)) / alpha;  z <- z + g - sigma * w;  n <- n + g^2
      w <- clip(0 if |z| <= l1 else -(z - sign(z) l1) / ((beta + sqrt(n)) / alpha + l2))

  A part that starts at a random w0 (embedx) starts at z = -w0 (beta/alpha + l2) -
  sign(w0) l1, the z whose closed form is w0, so its first step moves from w0 rather than
  resetting it to 0.

``g`` is the pushed gradient already divided by the key's pushed show (the caller passes
``scale = grad_scale(show)``: 1 / show with show floored at ``SHOW_FLOOR``, or 1 when show
is 0), then clipped to ``±GRAD_BOUND``. Arithmetic is float64, storage float32.

Why the two bounds: a finite push with show 1e-25 and gradient 1 used to scale to 1e25,
whose square is inf in float32: FTRL's ``n`` became inf, the next push's ``sigma`` NaN
(inf - inf) and the key's weights stuck at 0 for good; AdaGrad's G went inf and froze the
key. With the floor and the clip a step's g^2 is at most 1e12, so float32 state needs
~1e26 pushes to overflow; the caller still checks each updated row is finite and leaves a
row that would not be unchanged (``kernels.update_rows``), so no input reaches inf or NaN.

Per occurrence (``occurrenceSteps``; off by default, it overshoots: docs/decisions.md): a
key that occurs ``n`` times in the batch takes ``n`` steps of that mean gradient, as a
per-coordinate online learner would take ``n`` steps of its per-example gradients: AdaGrad moves by
``lr * g * sum_{k<n} sqrt(G0 / (G0 + G + k g^2))`` and adds ``n g^2`` to G; FTRL runs its
update ``n`` times; ``scale_free_adagrad`` moves by ``lr * g * sum_{1<=k<=n} 1 / sqrt(G + k g^2)``;
Adam takes one step. With ``n = 1`` nothing changes; a key in every
row of a batch of 64 (an hour-of-day key) learns ~64 steps' worth instead of one — and so
does every head key of every slot, all correcting the same error from the same prediction.

Initialisation is a counter-based hash of ``(seed, table, key, column)``, not a stateful
RNG: the same key gets the same initial weights whatever the shard layout, the batch order
or the thread that created it, so runs are reproducible.
"""

from __future__ import annotations

import math

import numpy as np
import numpy.typing as npt
from numba import njit

from streamtrain_ps.config import SparseOptimizerConfig
from streamtrain_ps.engine.index import Float, Int, mix64

ADAGRAD = 0
STD_ADAGRAD = 1
ADAM = 2
FTRL = 3
SCALE_FREE_ADAGRAD = 4

OPTIMIZER_CODES = {
    "adagrad": ADAGRAD,
    "std_adagrad": STD_ADAGRAD,
    "adam": ADAM,
    "ftrl": FTRL,
    "scale_free_adagrad": SCALE_FREE_ADAGRAD,
}

# Indices into the float64 parameter vector ``fp`` every kernel receives.
FP_LR = 0
FP_G0 = 1
FP_RANGE = 2
FP_WLO = 3
FP_WHI = 4
FP_BETA1 = 5
FP_BETA2 = 6
FP_EPS = 7
FP_ALPHA = 8
FP_BETA = 9
FP_L1 = 10
FP_L2 = 11
FP_PER_OCCURRENCE = 12  # 1.0: one step per occurrence of the key in the batch
FP_SIZE = 13

# Rows of the ``(2, FP_SIZE)`` parameter array a table passes its kernels: the embed part
# and the embedx part may have their own learning rate and G0 (``SparseOptimizerConfig``).
PART_EMBED = 0
PART_EMBEDX = 1

#: Shows below this (but > 0) scale a gradient as if they were this: a weighted show of
#: 1e-3 impressions is already far below any real one, and 1 / show must stay bounded.
SHOW_FLOOR = 1e-3
#: Largest |g| a step applies (after scaling by 1 / show): per-impression gradients of a
#: CTR model's embeddings are O(1); 1e6 leaves every sane step alone and keeps g^2 far
#: from float32's range (see the module docstring).
GRAD_BOUND = 1e6

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_S11 = np.uint64(11)


def state_width(kind: int, dim: int) -> int:
    """Floats of optimizer state per part of width ``dim``."""
    if kind == ADAGRAD:
        return 1
    if kind in (STD_ADAGRAD, SCALE_FREE_ADAGRAD):
        return dim
    if kind == FTRL:
        return 2 * dim
    return 2 * dim + 2


def flag_offset(kind: int, dim: int) -> int:
    """Offset (within a part's state) of a value that is >= 0 once the part is initialised.

    A part that is not admitted yet holds -1 there: G (AdaGrad), b1^t (Adam) and n (FTRL)
    are never negative, so the flag costs no memory (see docs/ps-engine.md, "lazy embedx").
    """
    if kind == ADAM:
        return 2 * dim
    return dim if kind == FTRL else 0


@njit(nogil=True, cache=True, inline="always")
def ftrl_z_of(w: Float, fp: npt.NDArray[np.float64]) -> Float:
    """The z (with n = 0) whose FTRL closed form is ``w``: a part's state at init."""
    if w == 0.0:
        return 0.0
    z = -w * (fp[FP_BETA] / fp[FP_ALPHA] + fp[FP_L2])
    return z - fp[FP_L1] if w > 0.0 else z + fp[FP_L1]


def ftrl_z_np(w: npt.NDArray[np.float32], fp: npt.NDArray[np.float64]) -> npt.NDArray[np.float32]:
    """``ftrl_z_of`` over an array of weights (rows built outside the kernels)."""
    w64 = w.astype(np.float64)
    z = -w64 * (fp[FP_BETA] / fp[FP_ALPHA] + fp[FP_L2]) - np.sign(w64) * fp[FP_L1]
    return z.astype(np.float32)


@njit(nogil=True, cache=True, inline="always")
def grad_scale(show: Float) -> Float:
    """What a key's summed gradient is multiplied by: 1 / show (show floored at
    ``SHOW_FLOOR``), or 1 for a push without shows."""
    return 1.0 / max(show, SHOW_FLOOR) if show > 0.0 else 1.0


@njit(nogil=True, cache=True, inline="always")
def scaled_grad(g: Float, scale: Float) -> float:
    """One gradient component as a step applies it: scaled, then clipped to ±GRAD_BOUND."""
    return float(min(max(g * scale, -GRAD_BOUND), GRAD_BOUND))


@njit(nogil=True, cache=True, inline="always")
def uniform_init(seed: np.uint64, key: np.uint64, column: Int, init_range: Float) -> Float:
    """U(-init_range, +init_range) from a hash of (seed, key, column)."""
    h = mix64(mix64(key ^ seed) + np.uint64(column + 1) * _GOLDEN)
    u = np.float64(h >> _S11) * (1.0 / 9007199254740992.0)  # [0, 1) with 53 bits
    return (2.0 * u - 1.0) * init_range


@njit(nogil=True, cache=True, inline="always")
def init_part(
    slab: npt.NDArray[np.float32],
    row: Int,
    wcol: Int,
    scol: Int,
    dim: Int,
    kind: Int,
    random: bool,
    seed: np.uint64,
    key: np.uint64,
    fp: npt.NDArray[np.float64],
    hcol: Int,
) -> None:
    """Initialise weights (U(±range) if ``random`` else 0, clipped) and zero state.

    ``hcol`` is the weights' column in the *logical* full row (``RowLayout.columns``), the
    column the init hash uses: the same key gets the same weights whichever slab stores them.
    """
    lo = fp[FP_WLO]
    hi = fp[FP_WHI]
    for j in range(dim):
        w = uniform_init(seed, key, hcol + j, fp[FP_RANGE]) if random else 0.0
        slab[row, wcol + j] = min(max(w, lo), hi)
    width: Int = 1  # ADAGRAD: one G for the part (``state_width``)
    if kind in (STD_ADAGRAD, SCALE_FREE_ADAGRAD):
        width = dim
    elif kind == FTRL:
        width = 2 * dim
    elif kind == ADAM:
        width = 2 * dim + 2
    for j in range(width):
        slab[row, scol + j] = 0.0
    if kind == FTRL:
        for j in range(dim):
            slab[row, scol + j] = ftrl_z_of(np.float64(slab[row, wcol + j]), fp)
    if kind == ADAM:
        slab[row, scol + 2 * dim] = 1.0
        slab[row, scol + 2 * dim + 1] = 1.0


@njit(nogil=True, cache=True, inline="always")
def update_part(
    slab: npt.NDArray[np.float32],
    row: Int,
    wcol: Int,
    scol: Int,
    dim: Int,
    kind: Int,
    grads: npt.NDArray[np.float32],
    gi: Int,
    goff: Int,
    scale: Float,
    fp: npt.NDArray[np.float64],
    occurrences: Float,
) -> None:
    """Apply ``grads[gi, goff:goff+dim] * scale`` (each clipped, ``scaled_grad``) to one
    part of ``row``: one step, or one per occurrence of the key in the batch
    (``occurrences``, the pushed show) when the part's ``FP_PER_OCCURRENCE`` is set."""
    lr = fp[FP_LR]
    g0 = fp[FP_G0]
    lo = fp[FP_WLO]
    hi = fp[FP_WHI]
    steps = 1
    if fp[FP_PER_OCCURRENCE] > 0.0 and occurrences > 1.5:
        steps = int(occurrences + 0.5)
    if kind == ADAGRAD:
        G = np.float64(slab[row, scol])
        acc = 0.0
        for j in range(dim):
            g = scaled_grad(grads[gi, goff + j], scale)
            acc += g * g
        acc /= dim
        ratio = 0.0  # the steps' summed AdaGrad factors, G growing by acc per occurrence
        for k in range(steps):
            ratio += math.sqrt(g0 / (g0 + G + k * acc))
        for j in range(dim):
            g = scaled_grad(grads[gi, goff + j], scale)
            w = np.float64(slab[row, wcol + j]) - lr * g * ratio
            slab[row, wcol + j] = min(max(w, lo), hi)
        slab[row, scol] = G + steps * acc
    elif kind == STD_ADAGRAD:
        for j in range(dim):
            g = scaled_grad(grads[gi, goff + j], scale)
            G = np.float64(slab[row, scol + j])
            ratio = 0.0
            for k in range(steps):
                ratio += math.sqrt(g0 / (g0 + G + k * g * g))
            w = np.float64(slab[row, wcol + j]) - lr * g * ratio
            slab[row, wcol + j] = min(max(w, lo), hi)
            slab[row, scol + j] = G + steps * g * g
    elif kind == SCALE_FREE_ADAGRAD:
        eps = fp[FP_EPS]
        for j in range(dim):
            g = scaled_grad(grads[gi, goff + j], scale)
            G = np.float64(slab[row, scol + j])
            ratio = 0.0  # the steps' summed factors, each with G after its own g^2
            for k in range(1, steps + 1):
                ratio += 1.0 / (math.sqrt(G + k * g * g) + eps)
            w = np.float64(slab[row, wcol + j]) - lr * g * ratio
            slab[row, wcol + j] = min(max(w, lo), hi)
            slab[row, scol + j] = G + steps * g * g
    elif kind == FTRL:
        alpha = fp[FP_ALPHA]
        beta = fp[FP_BETA]
        l1 = fp[FP_L1]
        l2 = fp[FP_L2]
        for j in range(dim):
            g = scaled_grad(grads[gi, goff + j], scale)
            w = np.float64(slab[row, wcol + j])
            z = np.float64(slab[row, scol + j])
            n = np.float64(slab[row, scol + dim + j])
            for _ in range(steps):
                n_new = n + g * g
                sigma = (math.sqrt(n_new) - math.sqrt(n)) / alpha
                z = z + g - sigma * w
                n = n_new
                w = 0.0
                if abs(z) > l1:
                    w = -(z - math.copysign(l1, z)) / ((beta + math.sqrt(n)) / alpha + l2)
                w = min(max(w, lo), hi)
            slab[row, wcol + j] = w
            slab[row, scol + j] = z
            slab[row, scol + dim + j] = n
    else:
        b1 = fp[FP_BETA1]
        b2 = fp[FP_BETA2]
        eps = fp[FP_EPS]
        p1 = np.float64(slab[row, scol + 2 * dim]) * b1
        p2 = np.float64(slab[row, scol + 2 * dim + 1]) * b2
        lr_t = lr * math.sqrt(1.0 - p2) / (1.0 - p1)
        for j in range(dim):
            g = scaled_grad(grads[gi, goff + j], scale)
            m = b1 * np.float64(slab[row, scol + j]) + (1.0 - b1) * g
            v = b2 * np.float64(slab[row, scol + dim + j]) + (1.0 - b2) * g * g
            w = np.float64(slab[row, wcol + j]) - lr_t * m / (math.sqrt(v) + eps)
            slab[row, wcol + j] = min(max(w, lo), hi)
            slab[row, scol + j] = m
            slab[row, scol + dim + j] = v
        slab[row, scol + 2 * dim] = p1
        slab[row, scol + 2 * dim + 1] = p2


def params_vector(
    learning_rate: float,
    initial_g2sum: float,
    initial_range: float,
    weight_bounds: tuple[float, float],
    beta1: float,
    beta2: float,
    epsilon: float,
    ftrl: tuple[float, float, float, float] = (0.05, 1.0, 0.0, 0.0),
    per_occurrence: bool = False,
) -> npt.NDArray[np.float64]:
    """The ``fp`` vector the kernels read (one array instead of a dozen scalar arguments);
    ``ftrl`` is (alpha, beta, l1, l2); ``per_occurrence``: one step per occurrence."""
    fp = np.zeros(FP_SIZE, dtype=np.float64)
    fp[FP_LR] = learning_rate
    fp[FP_G0] = initial_g2sum
    fp[FP_RANGE] = initial_range
    fp[FP_WLO], fp[FP_WHI] = weight_bounds
    fp[FP_BETA1] = beta1
    fp[FP_BETA2] = beta2
    fp[FP_EPS] = epsilon
    fp[FP_ALPHA], fp[FP_BETA], fp[FP_L1], fp[FP_L2] = ftrl
    fp[FP_PER_OCCURRENCE] = 1.0 if per_occurrence else 0.0
    return fp


def table_params(opt: SparseOptimizerConfig) -> npt.NDArray[np.float64]:
    """The ``(2, FP_SIZE)`` parameters of a table's two parts (rows ``PART_EMBED``,
    ``PART_EMBEDX``): the embed part takes ``embedLearningRate``/``embedInitialG2sum`` where
    set, everything else is shared."""

    ftrl = (opt.ftrlAlpha, opt.ftrlBeta, opt.ftrlL1, opt.ftrlL2)

    def part(lr: float, g0: float, per_occurrence: bool) -> npt.NDArray[np.float64]:
        return params_vector(
            lr,
            g0,
            opt.initialRange,
            opt.weightBounds,
            opt.beta1,
            opt.beta2,
            opt.epsilon,
            ftrl,
            per_occurrence,
        )

    steps = opt.occurrenceSteps
    return np.stack(
        [
            part(opt.embed_learning_rate, opt.embed_initial_g2sum, steps in ("embed", "all")),
            part(opt.learningRate, opt.initialG2sum, steps == "all"),
        ]
    )
