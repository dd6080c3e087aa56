"""The CTR accessor: row layout, score, admission, shrink and save-mode filters (§4).

The *logical* (full) row of a key is a run of float32 columns::

    slot | unseen_days | delta_score | show | click | embed_w | embed state
         | embedx_w[embedxDim] | embedx state

``slot`` holds the uint32 slot id bit-for-bit (read through a ``uint32`` view of the slab).
The state widths depend on the optimizer (``optim.state_width``); with SparseAdaGrad and
embedxDim 8 a full row is 16 floats = 64 bytes. Checkpoints and tools see full rows.

*Physically* a table keeps two slabs (see docs/ps-engine.md, "compact rows"): every key has
a primary row, the full row's columns from ``delta_score`` up to ``embedx_w`` followed by one
packed uint32 word (slot code, unseen_days, or the embedx pointer:
``streamtrain_ps.engine.packed``); admitted keys also own one embedx row, the full row's
columns from ``embedx_w`` on plus the packed word moved there at admission. A never-admitted
key costs no embedx memory at all.

Everything here is pure: numpy on copies, or nogil kernels reading a row.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
from numba import njit

from streamtrain_ps.api import SaveMode
from streamtrain_ps.config import TableConfig
from streamtrain_ps.engine.index import Float, Int
from streamtrain_ps.engine.optim import (
    ADAM,
    FTRL,
    OPTIMIZER_CODES,
    PART_EMBED,
    PART_EMBEDX,
    flag_offset,
    ftrl_z_np,
    state_width,
    table_params,
)

SLOT = 0
UNSEEN = 1
DELTA = 2
SHOW = 3
CLICK = 4
EMBED_W = 5
EMBED_STATE = 6
#: Full-row column of a primary row's first column (slot and unseen_days are packed).
PRIMARY_FROM = DELTA
# Primary-row columns (full-row column - PRIMARY_FROM).
P_DELTA = DELTA - PRIMARY_FROM
P_SHOW = SHOW - PRIMARY_FROM
P_CLICK = CLICK - PRIMARY_FROM
P_EMBED_W = EMBED_W - PRIMARY_FROM
P_EMBED_STATE = EMBED_STATE - PRIMARY_FROM

# Indices into the float64 accessor parameter vector ``ap``.
AP_NONCLK = 0
AP_CLICK = 1
AP_EMBEDX_THRESHOLD = 2
AP_DECAY = 3
AP_DELETE_THRESHOLD = 4
AP_DELETE_AFTER_DAYS = 5
AP_SIZE = 6


@dataclass(frozen=True)
class RowLayout:
    """Column offsets of one table's rows (derived from its config, never stored)."""

    embedx_dim: int
    kind: int  # the embedx part's rule: optim.ADAGRAD / STD_ADAGRAD / ADAM / FTRL
    embed_kind: int  # the embed part's rule

    @classmethod
    def of(cls, table: TableConfig) -> RowLayout:
        opt = table.optimizer
        return cls(table.embedxDim, OPTIMIZER_CODES[opt.type], OPTIMIZER_CODES[opt.embed_type])

    @property
    def embedx_w(self) -> int:
        return EMBED_STATE + state_width(self.embed_kind, 1)

    @property
    def embedx_state(self) -> int:
        return self.embedx_w + self.embedx_dim

    @property
    def xflag(self) -> int:
        """Column that is -1 until embedx is admitted (see ``optim.flag_offset``)."""
        return self.embedx_state + flag_offset(self.kind, self.embedx_dim)

    @property
    def width(self) -> int:
        return self.embedx_state + state_width(self.kind, self.embedx_dim)

    @property
    def xptr(self) -> int:
        """Full-row column where the embedx slab's columns begin (== ``embedx_w``; also the
        column the init hash of embedx uses)."""
        return self.embedx_w

    @property
    def primary_width(self) -> int:
        """Columns of a primary row: the full row's ``PRIMARY_FROM:embedx_w`` + the packed
        word (``streamtrain_ps.engine.packed``)."""
        return self.embedx_w - PRIMARY_FROM + 1

    @property
    def x_width(self) -> int:
        """Columns of an embedx row: the full row's ``embedx_w:width`` + the packed word."""
        return self.width - self.embedx_w + 1

    @property
    def pull_dim(self) -> int:
        return 3 + self.embedx_dim

    def columns(self) -> list[str]:
        """Column names of a full row, recorded in checkpoint headers."""
        d = self.embedx_dim
        names = ["slot", "unseen_days", "delta_score", "show", "click", "embed_w"]
        names += [f"embed_state{j}" for j in range(state_width(self.embed_kind, 1))]
        names += [f"embedx_w{j}" for j in range(d)]
        names += [f"embedx_state{j}" for j in range(state_width(self.kind, d))]
        return names

    def inference_columns(self) -> npt.NDArray[np.int64]:
        """Columns of the inference value: show, click, embed_w, embedx_w (the pull layout)."""
        cols = [SHOW, CLICK, EMBED_W, *range(self.embedx_w, self.embedx_w + self.embedx_dim)]
        return np.asarray(cols, dtype=np.int64)


def accessor_params(table: TableConfig) -> npt.NDArray[np.float64]:
    ap = np.zeros(AP_SIZE, dtype=np.float64)
    ap[AP_NONCLK] = table.nonclkCoeff
    ap[AP_CLICK] = table.clickCoeff
    ap[AP_EMBEDX_THRESHOLD] = table.embedxThreshold
    ap[AP_DECAY] = table.showClickDecayRate
    ap[AP_DELETE_THRESHOLD] = table.deleteThreshold
    ap[AP_DELETE_AFTER_DAYS] = table.deleteAfterUnseenDays
    return ap


@njit(nogil=True, cache=True, inline="always")
def score(show: Float, click: Float, ap: npt.NDArray[np.float64]) -> Float:
    """(show - click) * nonclkCoeff + click * clickCoeff."""
    return (show - click) * ap[AP_NONCLK] + click * ap[AP_CLICK]


def score_np(
    show: npt.NDArray[np.float32], click: npt.NDArray[np.float32], table: TableConfig
) -> npt.NDArray[np.float64]:
    """Vectorised ``score`` on copies (save filters)."""
    s = show.astype(np.float64)
    c = click.astype(np.float64)
    return (s - c) * table.nonclkCoeff + c * table.clickCoeff


@njit(nogil=True, cache=True, inline="always")
def decay_and_test(
    slab: npt.NDArray[np.float32], row: Int, unseen: Float, ap: npt.NDArray[np.float64]
) -> bool:
    """Shrink one primary row: decay show and click, then True if the key should be
    deleted (``unseen``: its unseen_days)."""
    rate = ap[AP_DECAY]
    show = np.float32(slab[row, P_SHOW] * rate)
    click = np.float32(slab[row, P_CLICK] * rate)
    slab[row, P_SHOW] = show
    slab[row, P_CLICK] = click
    return score(show, click, ap) < ap[AP_DELETE_THRESHOLD] or unseen > ap[AP_DELETE_AFTER_DAYS]


def save_filter(
    rows: npt.NDArray[np.float32], mode: SaveMode, table: TableConfig
) -> npt.NDArray[np.bool_]:
    """Which snapshot rows a save of ``mode`` writes (copies; the table is not touched).

    0 checkpoint and 3 batch: all. 2 base: score >= baseThreshold and unseen_days <=
    deltaKeepDays. 1 delta: base's test and delta_score >= deltaThreshold.
    """
    n = rows.shape[0]
    if mode in (SaveMode.CHECKPOINT, SaveMode.BATCH):
        return np.ones(n, dtype=np.bool_)
    keep = score_np(rows[:, SHOW], rows[:, CLICK], table) >= table.baseThreshold
    keep &= rows[:, UNSEEN] <= table.deltaKeepDays
    if mode == SaveMode.DELTA:
        keep &= rows[:, DELTA] >= table.deltaThreshold
    return np.asarray(keep, dtype=np.bool_)


def is_admitted(rows: npt.NDArray[np.float32], layout: RowLayout) -> npt.NDArray[np.bool_]:
    """Which full rows have their embedx admitted."""
    return np.asarray(rows[:, layout.xflag] >= 0, dtype=np.bool_)


def rows_from_inference(
    values: npt.NDArray[np.float32], table: TableConfig
) -> npt.NDArray[np.float32]:
    """Full rows from inference values ``[show, click, embed_w, embedx_w...]`` (warm start).

    Optimizer state starts fresh (an FTRL part at the z whose closed form is its weight);
    embedx counts as admitted if it has any non-zero weight or the key's score reaches the
    threshold, otherwise it is zeroed and flagged as such.
    """
    lay = RowLayout.of(table)
    d = lay.embedx_dim
    rows = np.zeros((values.shape[0], lay.width), dtype=np.float32)
    rows[:, SHOW] = values[:, 0]
    rows[:, CLICK] = values[:, 1]
    rows[:, EMBED_W] = values[:, 2]
    embedx = values[:, 3 : 3 + d]
    admitted = np.any(embedx != 0, axis=1) | (
        score_np(values[:, 0], values[:, 1], table) >= table.embedxThreshold
    )
    rows[:, lay.embedx_w : lay.embedx_w + d] = np.where(admitted[:, None], embedx, 0)
    fp = table_params(table.optimizer)
    if lay.embed_kind == ADAM:
        rows[:, EMBED_STATE + 2 : EMBED_STATE + 4] = 1.0
    elif lay.embed_kind == FTRL:
        rows[:, EMBED_STATE] = ftrl_z_np(rows[:, EMBED_W], fp[PART_EMBED])
    x = slice(lay.embedx_w, lay.embedx_w + d)
    if lay.kind == ADAM:
        rows[:, lay.embedx_state + 2 * d : lay.embedx_state + 2 * d + 2] = 1.0
    elif lay.kind == FTRL:
        rows[:, lay.embedx_state : lay.embedx_state + d] = ftrl_z_np(rows[:, x], fp[PART_EMBEDX])
    rows[~admitted, lay.xflag] = -1.0
    return rows
