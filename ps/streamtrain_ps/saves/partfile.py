"""A save's part files: their names and paths, and the codec (pure; no I/O).

A part file is ``MAGIC | uint32 header length | JSON header | raw little-endian arrays``;
the header names each array with dtype, shape and offset and repeats what the part is
(table, logical shard, mode, columns), so a misplaced file is caught, not loaded.
"""

from __future__ import annotations

import json
import re
import struct
import uuid
from collections.abc import Mapping
from typing import Any

import numpy as np
import numpy.typing as npt

from streamtrain_ps.errors import CheckpointError

MAGIC = b"STPSPART"
_DTYPES: dict[str, np.dtype[Any]] = {
    "<u8": np.dtype("<u8"),
    "<f4": np.dtype("<f4"),
    "<f8": np.dtype("<f8"),
    "<i8": np.dtype("<i8"),
}
_SAFE_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,99}")
_SPARSE_PATH = re.compile(r"(?P<dir>data-[^/]+)/sparse/(?P<table>[^/]+)/part-(?P<ls>\d{5})\.bin")
_DENSE_PATH = re.compile(r"(?P<dir>data-[^/]+)/dense/(?P<name>[^/]+)\.bin")


# -- names and paths ----------------------------------------------------------------------


def encode_name(name: str) -> str:
    """A table or vector name as one safe path component (hex-escaped if needed)."""
    if _SAFE_NAME.fullmatch(name):
        return name
    return "~" + name.encode().hex()


def decode_name(component: str) -> str:
    return bytes.fromhex(component[1:]).decode() if component.startswith("~") else component


def sparse_path(data_dir: str, table: str, logical: int) -> str:
    return f"{data_dir}/sparse/{encode_name(table)}/part-{logical:05d}.bin"


def dense_path(data_dir: str, name: str) -> str:
    return f"{data_dir}/dense/{encode_name(name)}.bin"


def new_data_dir(shard_index: int) -> str:
    return f"data-s{shard_index:03d}-{uuid.uuid4().hex[:12]}"


# -- the part codec -----------------------------------------------------------------------


def encode_part(header: Mapping[str, Any], arrays: Mapping[str, npt.NDArray[Any]]) -> bytes:
    """Serialise a header and named arrays (little-endian, C order)."""
    specs = []
    blobs = []
    offset = 0
    for name, arr in arrays.items():
        a = np.ascontiguousarray(arr, dtype=arr.dtype.newbyteorder("<"))
        specs.append({"name": name, "dtype": a.dtype.str, "shape": list(a.shape), "offset": offset})
        blobs.append(a.tobytes())
        offset += a.nbytes
    head = json.dumps({**header, "arrays": specs}, sort_keys=True).encode()
    return b"".join([MAGIC, struct.pack("<I", len(head)), head, *blobs])


def decode_part(data: bytes, what: str) -> tuple[dict[str, Any], dict[str, npt.NDArray[Any]]]:
    """Inverse of ``encode_part``; any inconsistency is a ``CheckpointError`` naming ``what``."""
    if len(data) < len(MAGIC) + 4 or not data.startswith(MAGIC):
        raise CheckpointError(f"{what}: not a streamtrain part file")
    (hlen,) = struct.unpack_from("<I", data, len(MAGIC))
    start = len(MAGIC) + 4
    try:
        header = json.loads(data[start : start + hlen])
        body = memoryview(data)[start + hlen :]
        arrays: dict[str, npt.NDArray[Any]] = {}
        for spec in header["arrays"]:
            dtype = _DTYPES[spec["dtype"]]
            shape = tuple(int(s) for s in spec["shape"])
            count = int(np.prod(shape, dtype=np.int64))
            off = int(spec["offset"])
            if off < 0 or off + count * dtype.itemsize > len(body):
                raise ValueError(f"array {spec['name']} runs past the end of the file")
            arr = np.frombuffer(body, dtype=dtype, count=count, offset=off).reshape(shape)
            arrays[str(spec["name"])] = arr.astype(dtype.newbyteorder("="))
    except (ValueError, KeyError, TypeError) as exc:
        raise CheckpointError(f"{what}: malformed part file: {exc}") from exc
    return header, arrays


def parse_path(path: str) -> dict[str, Any]:
    """What a part path names (its kind, table and logical shard, or dense vector)."""
    m = _SPARSE_PATH.fullmatch(path)
    if m:
        return {"kind": "sparse", "table": decode_name(m["table"]), "logicalShard": int(m["ls"])}
    m = _DENSE_PATH.fullmatch(path)
    if m:
        return {"kind": "dense", "name": decode_name(m["name"])}
    raise CheckpointError(f"{path}: not a part path written by a shard")
