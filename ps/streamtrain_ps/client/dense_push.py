"""A PushSparse request whose dense gradients go on the wire straight from their arrays.

A trained batch's push carries the dense network's gradient (345k floats, 1.38 MB, in the
bench): through upb it was copied three times before gRPC saw it — ``tobytes``, upb's copy
into the message (a ``bytes`` field takes ``bytes`` only, not a ``memoryview``) and
``SerializeToString``: building the bench's push took 4.1–4.7 ms of CPU in a thread of its
own (each fresh 1.38 MB buffer faulted in), 0.09–0.16 ms this way; the worker's push thread
went from ~4 to ~3 µs an example (docs/benchmarks.md, issue 11).
Protobuf's encoding of a message followed by more encoded fields of the same message is the
message with those fields added (a repeated field's entries are appended), so ``DensePush``
lets protobuf serialize the request without its ``dense`` entries and appends each entry's
encoding — the ``DenseGrads`` name, then the gradient from a ``memoryview`` of the array —
in one ``join``: one copy. The server parses the standard message; nothing changes there.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from streamtrain_ps.proto import ps_pb2
from streamtrain_ps.service.wire import VALUE_DTYPE

_LEN = 2  # protobuf's wire type of a length-delimited field


def _tag(message: type, field: str) -> bytes:
    number: int = message.DESCRIPTOR.fields_by_name[field].number  # type: ignore[attr-defined]
    return _varint(number << 3 | _LEN)


def _varint(value: int) -> bytes:
    out = bytearray()
    while value > 0x7F:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


_DENSE = _tag(ps_pb2.PushSparseRequest, "dense")
_NAME = _tag(ps_pb2.DenseGrads, "name")
_GRADS = _tag(ps_pb2.DenseGrads, "grads")


@dataclass(frozen=True)
class DensePush:
    """``request`` plus ``dense`` (name, float32 gradient) entries, serialized as one
    ``PushSparseRequest`` whose ``dense`` field lists them after any it already has."""

    request: ps_pb2.PushSparseRequest
    dense: Sequence[tuple[str, npt.NDArray[np.float32]]]

    @property
    def id(self) -> ps_pb2.RequestId:
        """The request id (set in place, as on a ``PushSparseRequest``)."""
        return self.request.id

    def serialize(self) -> bytes:
        parts: list[bytes | memoryview] = [self.request.SerializeToString()]
        for name, values in self.dense:
            label = name.encode("utf-8")
            flat = np.ascontiguousarray(values, dtype=VALUE_DTYPE).reshape(-1)
            grads = flat.data.cast("B")
            head = _NAME + _varint(len(label)) + label + _GRADS + _varint(grads.nbytes)
            parts += [_DENSE, _varint(len(head) + grads.nbytes), head, grads]
        return b"".join(parts)
