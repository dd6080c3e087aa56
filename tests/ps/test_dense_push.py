"""``DensePush`` puts the dense gradients on the wire from their arrays: its bytes must be
the ``PushSparseRequest`` that protobuf builds with the same ``dense`` entries."""

from __future__ import annotations

import numpy as np

from streamtrain_ps.client.dense_push import DensePush
from streamtrain_ps.proto import ps_pb2
from streamtrain_ps.service import wire


def rows_request() -> ps_pb2.PushSparseRequest:
    enc = wire.encode_push(
        np.array([3, 1, 2], np.uint64),
        np.arange(27, dtype=np.float32).reshape(3, 9),
        np.ones(3, np.float32),
        np.zeros(3, np.float32),
        np.array([0, 4, 38], np.uint32),
    )
    return ps_pb2.PushSparseRequest(
        table="t",
        **enc,
    )


def test_a_dense_push_is_the_message_protobuf_builds() -> None:
    rng = np.random.default_rng(0)
    dense = [
        ("mlp", rng.normal(size=345_279).astype(np.float32)),  # a length past 2^14: 3-byte
        ("data_norm ë", rng.normal(size=17).astype(np.float32)),  # varints; a UTF-8 name
        ("empty", np.zeros(0, np.float32)),
    ]
    push = DensePush(rows_request(), dense)
    push.id.CopyFrom(ps_pb2.RequestId(client_id=b"c" * 16, seq=300, acked_below=7))
    expected = rows_request()
    expected.id.CopyFrom(ps_pb2.RequestId(client_id=b"c" * 16, seq=300, acked_below=7))
    for name, values in dense:
        expected.dense.add(name=name, grads=values.tobytes())
    parsed = ps_pb2.PushSparseRequest.FromString(push.serialize())
    assert parsed == expected
    assert [
        np.array_equal(np.frombuffer(d.grads, np.float32), v)
        for (_, v), d in zip(dense, parsed.dense, strict=True)
    ] == [True, True, True]


def test_entries_already_in_the_request_come_first_and_a_dense_only_push_parses() -> None:
    request = ps_pb2.PushSparseRequest(table="t", dim=9)
    request.dense.add(name="first", grads=np.ones(2, np.float32).tobytes())
    parsed = ps_pb2.PushSparseRequest.FromString(
        DensePush(request, [("second", np.full(3, 2.0, np.float32))]).serialize()
    )
    assert [d.name for d in parsed.dense] == ["first", "second"]
    assert parsed.keys == b"" and parsed.table == "t" and parsed.dim == 9
    assert np.frombuffer(parsed.dense[1].grads, np.float32).tolist() == [2.0, 2.0, 2.0]
