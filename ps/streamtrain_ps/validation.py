"""Argument checks shared by every PS entry point.

``Shard`` (behind ``LocalPS`` and the gRPC servicer) and ``RemotePS`` (the client) must
reject the same malformed call with the same ``InvalidRequestError`` field and message, so
a caller sees one behaviour whether the PS is in-process or across the network. Keeping the
check in one function is what makes that true rather than merely intended.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

from streamtrain_ps import api
from streamtrain_ps.errors import InvalidRequestError


def require_array(
    value: object, field: str, dtype: type[np.generic], shape: tuple[int, ...] | None
) -> npt.NDArray[Any]:
    """``value`` itself if it is a numpy array of ``dtype`` and ``shape``, else
    ``InvalidRequestError(field, ...)``; ``shape=None`` means any 1-D length.

    The array is returned as given (no copy): callers that hand it to a kernel needing
    contiguous memory make it contiguous themselves.
    """
    if not isinstance(value, np.ndarray):
        raise InvalidRequestError(field, f"must be a numpy array, got {type(value).__name__}")
    if value.dtype != dtype:
        raise InvalidRequestError(
            field, f"must have dtype {np.dtype(dtype).name}, got {value.dtype}"
        )
    if shape is None:
        if value.ndim != 1:
            raise InvalidRequestError(field, f"must be 1-D, got shape {value.shape}")
    elif value.shape != shape:
        raise InvalidRequestError(field, f"must have shape {shape}, got {value.shape}")
    return value


def contiguous_array(
    value: object, field: str, dtype: type[np.generic], shape: tuple[int, ...] | None
) -> npt.NDArray[Any]:
    """``require_array``, made contiguous for the kernels (what ``Shard`` takes)."""
    return np.ascontiguousarray(require_array(value, field, dtype, shape))


def require_finite(values: npt.NDArray[np.float32], field: str) -> None:
    if not np.isfinite(values).all():
        raise InvalidRequestError(field, "must be finite")


def dense_name(name: str) -> str:
    if not isinstance(name, str) or not name:
        raise InvalidRequestError("name", "must name a dense vector")
    return name


def save_mode(mode: api.SaveMode | int) -> api.SaveMode:
    try:
        return api.SaveMode(int(mode))
    except (ValueError, TypeError):
        raise InvalidRequestError(
            "mode", f"must be 0 (checkpoint), 1 (delta), 2 (base) or 3 (batch), got {mode!r}"
        ) from None
