"""The codec: round trips, little-endian layout, and strict validation naming the field."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streamtrain_ps.errors import InvalidRequestError, RequestTooLargeError
from streamtrain_ps.service import wire


@given(st.lists(st.integers(min_value=0, max_value=2**64 - 1), max_size=50))
@settings(max_examples=50, deadline=None)
def test_keys_round_trip(keys: list[int]) -> None:
    arr = np.array(keys, dtype=np.uint64)
    out = wire.decode_keys(wire.encode_keys(arr))
    assert out.dtype == np.uint64
    np.testing.assert_array_equal(out, arr)


def test_keys_are_little_endian_uint64() -> None:
    assert wire.encode_keys(np.array([1, 2**63], dtype=np.uint64)) == (
        (1).to_bytes(8, "little") + (2**63).to_bytes(8, "little")
    )


def test_signed_keys_are_reinterpreted_bit_for_bit() -> None:
    out = wire.decode_keys(wire.encode_keys(np.array([-1, 5], dtype=np.int64)))
    np.testing.assert_array_equal(out, np.array([2**64 - 1, 5], dtype=np.uint64))


def test_decode_is_zero_copy_and_read_only() -> None:
    data = wire.encode_keys(np.arange(4, dtype=np.uint64))
    keys = wire.decode_keys(data)
    assert not keys.flags.writeable
    assert keys.base is not None


@pytest.mark.parametrize("bad", [np.array([1.5]), np.array(["a"]), np.zeros((2, 2), np.uint64)])
def test_encode_keys_rejects_non_integer_or_non_flat(bad: np.ndarray) -> None:
    with pytest.raises(InvalidRequestError) as info:
        wire.encode_keys(bad)
    assert info.value.field == "keys"


def test_decode_keys_checks_length_emptiness_and_limit() -> None:
    with pytest.raises(InvalidRequestError, match="keys: length 7 is not a multiple of 8"):
        wire.decode_keys(b"\0" * 7)
    with pytest.raises(InvalidRequestError, match="must not be empty"):
        wire.decode_keys(b"", allow_empty=False)
    with pytest.raises(RequestTooLargeError, match="3 keys exceed maxKeysPerRequest 2"):
        wire.decode_keys(b"\0" * 24, max_keys=2)
    with pytest.raises(InvalidRequestError, match="keys: must be bytes"):
        wire.decode_keys("abc")  # type: ignore[arg-type]


def test_matrix_round_trip_and_dim_checks() -> None:
    m = np.arange(12, dtype=np.float64).reshape(4, 3)
    data, dim = wire.encode_matrix(m)
    assert dim == 3
    out = wire.decode_matrix(data, dim, "values", n=4, expected_dim=3)
    assert out.dtype == np.float32
    np.testing.assert_array_equal(out, m.astype(np.float32))
    with pytest.raises(InvalidRequestError) as info:
        wire.decode_matrix(data, 4, "grads", expected_dim=3)
    assert info.value.field == "dim"
    with pytest.raises(InvalidRequestError, match="dim: must be positive"):
        wire.decode_matrix(data, 0, "grads")
    with pytest.raises(InvalidRequestError, match="grads: has 12 floats, not a multiple of dim 5"):
        wire.decode_matrix(data, 5, "grads")
    with pytest.raises(InvalidRequestError, match=r"grads: has 4 rows of dim 3, expected 5"):
        wire.decode_matrix(data, 3, "grads", n=5)
    with pytest.raises(InvalidRequestError, match="values: length 5 is not a multiple of 4"):
        wire.decode_matrix(b"\0" * 5, 1, "values")
    with pytest.raises(InvalidRequestError, match=r"must be 2-D"):
        wire.encode_matrix(np.zeros(3, np.float32))


def test_floats_and_slots() -> None:
    shows = wire.decode_floats(wire.encode_floats([1, 2, 3]), "shows", 3)
    np.testing.assert_array_equal(shows, np.array([1, 2, 3], np.float32))
    with pytest.raises(InvalidRequestError, match="clicks: has 3 values, expected 2"):
        wire.decode_floats(wire.encode_floats([1, 2, 3]), "clicks", 2)
    assert wire.decode_slots(b"", 5) is None
    assert wire.encode_slots(None) == b""
    slots = wire.decode_slots(wire.encode_slots(np.array([7, 8], np.int64)), 2)
    assert slots is not None
    assert slots.dtype == np.uint32
    np.testing.assert_array_equal(slots, [7, 8])
    with pytest.raises(InvalidRequestError, match="slots: has 2 slots, expected 3"):
        wire.decode_slots(wire.encode_slots([1, 2]), 3)
    with pytest.raises(InvalidRequestError, match="slots: must be integers"):
        wire.encode_slots(np.array([1.5]))


def test_push_round_trip() -> None:
    rng = np.random.default_rng(0)
    keys = rng.integers(0, 2**63, size=5, dtype=np.uint64)
    grads = rng.standard_normal((5, 9)).astype(np.float32)
    shows = np.ones(5, np.float32)
    clicks = np.zeros(5, np.float32)
    enc = wire.encode_push(keys, grads, shows, clicks, np.arange(5))
    batch = wire.decode_push(
        enc["keys"],
        enc["grads"],
        enc["dim"],
        enc["shows"],
        enc["clicks"],
        slots=enc["slots"],
        push_dim=9,
    )
    np.testing.assert_array_equal(batch.keys, keys)
    np.testing.assert_array_equal(batch.grads, grads)
    np.testing.assert_array_equal(batch.shows, shows)
    np.testing.assert_array_equal(batch.clicks, clicks)
    assert batch.slots is not None
    np.testing.assert_array_equal(batch.slots, np.arange(5))


@pytest.mark.parametrize(
    ("field", "kwargs"),
    [
        ("grads", {"grads": np.zeros((4, 9), np.float32)}),
        ("grads", {"grads": np.zeros(5, np.float32)}),
        ("shows", {"shows": np.zeros(4, np.float32)}),
        ("clicks", {"clicks": np.zeros((5, 1), np.float32)}),
        ("slots", {"slots": np.zeros(6, np.uint32)}),
    ],
)
def test_encode_push_names_the_mismatched_field(field: str, kwargs: dict[str, np.ndarray]) -> None:
    args: dict[str, np.ndarray | None] = {
        "keys": np.arange(5, dtype=np.uint64),
        "grads": np.zeros((5, 9), np.float32),
        "shows": np.zeros(5, np.float32),
        "clicks": np.zeros(5, np.float32),
        "slots": None,
    }
    args.update(kwargs)
    with pytest.raises(InvalidRequestError) as info:
        wire.encode_push(**args)  # type: ignore[arg-type]
    assert info.value.field == field


def test_decode_push_cross_checks_fields() -> None:
    enc = wire.encode_push(
        np.arange(3, dtype=np.uint64), np.zeros((3, 9)), np.ones(3), np.zeros(3), None
    )
    ok = dict(enc)
    for field, change in [
        ("dim", {"dim": 5}),
        ("grads", {"grads": enc["grads"][:-36]}),
        ("shows", {"shows": enc["shows"][:4]}),
        ("clicks", {"clicks": enc["clicks"] + b"\0\0\0\0"}),
        ("slots", {"slots": b"\0" * 4}),
        ("keys", {"keys": enc["keys"][:-1]}),
    ]:
        fields = {**ok, **change}
        with pytest.raises(InvalidRequestError) as info:
            wire.decode_push(
                fields["keys"],  # type: ignore[arg-type]
                fields["grads"],  # type: ignore[arg-type]
                fields["dim"],  # type: ignore[arg-type]
                fields["shows"],  # type: ignore[arg-type]
                fields["clicks"],  # type: ignore[arg-type]
                slots=fields["slots"],  # type: ignore[arg-type]
                push_dim=9,
            )
        assert info.value.field == field, change
