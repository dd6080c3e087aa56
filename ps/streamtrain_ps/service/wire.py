"""The one codec between numpy arrays and the raw little-endian bytes of ``ps.proto``.

Keys travel as ``uint64``, values and gradients as row-major ``float32`` with an explicit
``dim``, shows and clicks as ``float32``, slots as ``uint32``. Decoding is zero-copy
(``np.frombuffer`` over the message's bytes, so the arrays are read-only) and strict: every
malformed field raises ``InvalidRequestError`` naming the proto field, because the server
must answer ``INVALID_ARGUMENT <field>`` rather than crash or guess. Encoding copies exactly
once (``tobytes``) — protobuf ``bytes`` fields need an immutable ``bytes`` object.

The request-level helpers (``decode_push``, ``encode_push``) keep the servicer and the
remote client from re-implementing the cross-field checks (equal lengths, dim).
"""

from __future__ import annotations

from typing import TypedDict

import numpy as np
import numpy.typing as npt

from streamtrain_ps.api import SparsePush
from streamtrain_ps.errors import InvalidRequestError, RequestTooLargeError

KEY_DTYPE = np.dtype("<u8")
VALUE_DTYPE = np.dtype("<f4")
SLOT_DTYPE = np.dtype("<u4")


def _decode(data: bytes, dtype: np.dtype, field: str) -> npt.NDArray:
    if not isinstance(data, bytes | bytearray | memoryview):
        raise InvalidRequestError(field, f"must be bytes, got {type(data).__name__}")
    size = len(data)
    if size % dtype.itemsize:
        raise InvalidRequestError(
            field,
            f"length {size} is not a multiple of {dtype.itemsize} ({dtype.name} little-endian)",
        )
    return np.frombuffer(data, dtype=dtype)


def decode_keys(
    data: bytes, field: str = "keys", *, allow_empty: bool = True, max_keys: int | None = None
) -> npt.NDArray[np.uint64]:
    """``uint64`` keys from raw bytes; ``max_keys`` exceeded is ``RequestTooLargeError``."""
    keys = _decode(data, KEY_DTYPE, field)
    if not allow_empty and keys.size == 0:
        raise InvalidRequestError(field, "must not be empty")
    if max_keys is not None and keys.size > max_keys:
        raise RequestTooLargeError(f"{field}: {keys.size} keys exceed maxKeysPerRequest {max_keys}")
    return keys


def encode_keys(keys: npt.ArrayLike, field: str = "keys") -> bytes:
    """Raw bytes of integer keys. Signed keys are reinterpreted bit for bit (two's complement),
    which is how int64 tensors carry 64-bit feature signs."""
    arr = np.asarray(keys)
    if arr.dtype.kind not in "iu":
        raise InvalidRequestError(field, f"keys must be integers, got dtype {arr.dtype}")
    if arr.ndim != 1:
        raise InvalidRequestError(field, f"keys must be 1-D, got shape {arr.shape}")
    return np.ascontiguousarray(arr, dtype=KEY_DTYPE).tobytes()


def decode_floats(data: bytes, field: str, n: int | None = None) -> npt.NDArray[np.float32]:
    """A flat ``float32`` vector; with ``n`` its length must equal ``n``."""
    arr = _decode(data, VALUE_DTYPE, field)
    if n is not None and arr.size != n:
        raise InvalidRequestError(field, f"has {arr.size} values, expected {n} (one per key)")
    return arr


def encode_floats(values: npt.ArrayLike, field: str = "values") -> bytes:
    """Raw bytes of a flat ``float32`` vector (any float or integer input is converted)."""
    arr = np.asarray(values)
    if arr.dtype.kind not in "fiub":
        raise InvalidRequestError(field, f"must be numeric, got dtype {arr.dtype}")
    return np.ascontiguousarray(arr, dtype=VALUE_DTYPE).reshape(-1).tobytes()


def decode_matrix(
    data: bytes, dim: int, field: str, *, n: int | None = None, expected_dim: int | None = None
) -> npt.NDArray[np.float32]:
    """A row-major ``float32 (n, dim)`` matrix. ``dim`` must be positive and, if given, equal
    ``expected_dim`` (the table's width); ``n`` pins the row count (one row per key)."""
    if expected_dim is not None and dim != expected_dim:
        raise InvalidRequestError("dim", f"is {dim}, the table expects {expected_dim}")
    if dim <= 0:
        raise InvalidRequestError("dim", f"must be positive, got {dim}")
    flat = _decode(data, VALUE_DTYPE, field)
    if flat.size % dim:
        raise InvalidRequestError(field, f"has {flat.size} floats, not a multiple of dim {dim}")
    rows = flat.size // dim
    if n is not None and rows != n:
        raise InvalidRequestError(
            field, f"has {rows} rows of dim {dim}, expected {n} (one per key)"
        )
    return flat.reshape(rows, dim)


def encode_matrix(values: npt.ArrayLike, field: str = "values") -> tuple[bytes, int]:
    """Raw bytes and ``dim`` of a 2-D ``float32`` matrix."""
    arr = np.asarray(values)
    if arr.ndim != 2:
        raise InvalidRequestError(field, f"must be 2-D (n, dim), got shape {arr.shape}")
    if arr.dtype.kind not in "fiub":
        raise InvalidRequestError(field, f"must be numeric, got dtype {arr.dtype}")
    return np.ascontiguousarray(arr, dtype=VALUE_DTYPE).tobytes(), int(arr.shape[1])


def decode_slots(data: bytes, n: int, field: str = "slots") -> npt.NDArray[np.uint32] | None:
    """Slots, one ``uint32`` per key, or ``None`` when the field is empty (slot unknown)."""
    if len(data) == 0:
        return None
    arr = _decode(data, SLOT_DTYPE, field)
    if arr.size != n:
        raise InvalidRequestError(
            field, f"has {arr.size} slots, expected {n} (one per key) or none"
        )
    return arr


def encode_slots(slots: npt.ArrayLike | None, field: str = "slots") -> bytes:
    if slots is None:
        return b""
    arr = np.asarray(slots)
    if arr.dtype.kind not in "iu":
        raise InvalidRequestError(field, f"must be integers, got dtype {arr.dtype}")
    return np.ascontiguousarray(arr, dtype=SLOT_DTYPE).reshape(-1).tobytes()


def decode_push(
    keys: bytes,
    grads: bytes,
    dim: int,
    shows: bytes,
    clicks: bytes,
    *,
    slots: bytes,
    push_dim: int,
    max_keys: int | None = None,
) -> SparsePush:
    """Validate every PushSparse field against the others and the table's ``push_dim``
    (the arrays may be read-only views of the request's bytes)."""
    k = decode_keys(keys, "keys", max_keys=max_keys)
    n = int(k.size)
    return SparsePush(
        keys=k,
        grads=decode_matrix(grads, dim, "grads", n=n, expected_dim=push_dim),
        shows=decode_floats(shows, "shows", n),
        clicks=decode_floats(clicks, "clicks", n),
        slots=decode_slots(slots, n),
    )


class EncodedPush(TypedDict):
    """The byte fields of one PushSparse request, by name, so they unpack into it."""

    keys: bytes
    grads: bytes
    dim: int
    shows: bytes
    clicks: bytes
    slots: bytes


def encode_push(
    keys: npt.ArrayLike,
    grads: npt.ArrayLike,
    shows: npt.ArrayLike,
    clicks: npt.ArrayLike,
    slots: npt.ArrayLike | None = None,
) -> EncodedPush:
    """Encode a push after checking the client's arrays agree, so a caller's shape bug is
    reported locally with the same field names the server would use."""
    k = np.asarray(keys)
    n = k.shape[0] if k.ndim == 1 else -1
    g = np.asarray(grads)
    if g.ndim != 2 or g.shape[0] != n:
        raise InvalidRequestError("grads", f"must have shape ({n}, dim), got {g.shape}")
    for name, arr in (("shows", shows), ("clicks", clicks)):
        if np.shape(arr) != (n,):
            raise InvalidRequestError(name, f"must have shape ({n},), got {np.shape(arr)}")
    if slots is not None and np.shape(slots) != (n,):
        raise InvalidRequestError("slots", f"must have shape ({n},), got {np.shape(slots)}")
    grad_bytes, dim = encode_matrix(g, "grads")
    return EncodedPush(
        keys=encode_keys(k),
        grads=grad_bytes,
        dim=dim,
        shows=encode_floats(shows, "shows"),
        clicks=encode_floats(clicks, "clicks"),
        slots=encode_slots(slots),
    )
