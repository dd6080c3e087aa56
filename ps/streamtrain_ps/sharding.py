"""Key routing: feature sign -> logical shard -> PS server.

The logical shard count is fixed for the life of a model (it is recorded in every
checkpoint manifest); the server count is not. Files are written per logical shard, so a
checkpoint written by N servers loads into M servers: server ``i`` of ``M`` owns the logical
shards ``s`` with ``s % M == i``.

Feature signs are often sequential or share low bits (hashes truncated, ids), so the shard
is taken from a splitmix64 finaliser of the key rather than ``key % L``.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

DEFAULT_LOGICAL_SHARDS = 64

_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)


def mix64(keys: npt.NDArray[np.uint64]) -> npt.NDArray[np.uint64]:
    """The splitmix64 finaliser: a bijective, well-spread 64-bit mix of each key."""
    z = np.asarray(keys, dtype=np.uint64).copy()
    with np.errstate(over="ignore"):
        z ^= z >> np.uint64(30)
        z *= _M1
        z ^= z >> np.uint64(27)
        z *= _M2
        z ^= z >> np.uint64(31)
    return z


def logical_shard(keys: npt.NDArray[np.uint64], logical_shards: int) -> npt.NDArray[np.int64]:
    """Logical shard of every key, in ``[0, logical_shards)``."""
    if logical_shards <= 0:
        raise ValueError(f"logical_shards must be positive, got {logical_shards}")
    return (mix64(keys) % np.uint64(logical_shards)).astype(np.int64)


def server_of_logical(
    shards: npt.NDArray[np.int64] | int, num_servers: int
) -> npt.NDArray[np.int64]:
    """Server that owns each logical shard when ``num_servers`` servers run."""
    if num_servers <= 0:
        raise ValueError(f"num_servers must be positive, got {num_servers}")
    return np.asarray(shards, dtype=np.int64) % num_servers


def server_of_key(
    keys: npt.NDArray[np.uint64], logical_shards: int, num_servers: int
) -> npt.NDArray[np.int64]:
    """Server that owns each key."""
    return server_of_logical(logical_shard(keys, logical_shards), num_servers)


def owned_logical_shards(server_index: int, num_servers: int, logical_shards: int) -> list[int]:
    """The logical shards server ``server_index`` of ``num_servers`` owns."""
    if not 0 <= server_index < num_servers:
        raise ValueError(f"server_index {server_index} not in [0, {num_servers})")
    return list(range(server_index, logical_shards, num_servers))


def server_of_dense(name: str, num_servers: int) -> int:
    """Dense vectors live whole on one server, chosen by a stable hash of the name."""
    h = 0xCBF29CE484222325
    for byte in name.encode():
        h = ((h ^ byte) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return h % num_servers
