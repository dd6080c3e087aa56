"""Why a merged push was refused, as the ``InvalidRequestError`` naming the field and the
entry: the merge kernel reports a code and the first offending position; this turns it
into words (a bad gradient row, show or click, a repeated key's overflowing sum, a key
sent to the wrong server)."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from streamtrain_ps import sharding
from streamtrain_ps.engine.kernels import BAD_CLICK, BAD_GRAD, BAD_SHOW, NOT_OWNED, OVERFLOW
from streamtrain_ps.engine.table import Merged
from streamtrain_ps.errors import InvalidRequestError


def raise_push_errors(
    parts: list[Merged],
    keys: npt.NDArray[np.uint64],
    shows: npt.NDArray[np.float32],
    clicks: npt.NDArray[np.float32],
    route: tuple[int, int, int],
) -> None:
    """Raise the error of the first refused part (``route``: logical shards, servers, this
    server's index, for naming the owner of a key sent to the wrong server)."""
    for p in parts:
        _raise_push_error(p, keys, shows, clicks, route)


def _raise_push_error(
    p: Merged,
    keys: npt.NDArray[np.uint64],
    shows: npt.NDArray[np.float32],
    clicks: npt.NDArray[np.float32],
    route: tuple[int, int, int],
) -> None:
    logical_shards, num_shards, shard_index = route
    at = int(p.n)
    if p.code == BAD_GRAD:
        raise InvalidRequestError("grads", f"row {at} is not finite")
    if p.code == BAD_SHOW:
        raise InvalidRequestError("shows", f"entry {at} must be finite and >= 0, got {shows[at]}")
    if p.code == BAD_CLICK:
        raise InvalidRequestError("clicks", f"entry {at} must be finite and >= 0, got {clicks[at]}")
    if p.code == OVERFLOW:
        raise InvalidRequestError(
            "grads", f"the repeated rows of key {int(p.keys[at])} sum to a non-finite value"
        )
    if p.code == NOT_OWNED:
        logical = int(sharding.logical_shard(keys[at : at + 1], logical_shards)[0])
        raise InvalidRequestError(
            "keys",
            f"key {int(keys[at])} (logical shard {logical}) belongs to server "
            f"{logical % num_shards} of {num_shards}, not {shard_index}",
        )
