"""The documented feature-sign scheme: numba kernels equal the pure-Python spec; stable values."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from streamtrain_worker.data.formats.criteo import CriteoFormat
from streamtrain_worker.data.hashing import feature_sign, feature_signs, token_value

MASK = (1 << 64) - 1


def _spec_fmix(x: int) -> int:
    x ^= x >> 33
    x = (x * 0xFF51AFD7ED558CCD) & MASK
    x ^= x >> 33
    x = (x * 0xC4CEB9FE1A85EC53) & MASK
    return x ^ (x >> 33)


def _spec_sign(slot: int, token: bytes) -> int:
    """docs/data.md, written out independently of the module under test."""
    h = 0xCBF29CE484222325
    for b in token:
        h = ((h ^ b) * 0x100000001B3) & MASK
    value = _spec_fmix(h ^ len(token))
    return _spec_fmix(value ^ _spec_fmix(((slot + 1) * 0x9E3779B97F4A7C15) & MASK))


def test_golden_values_never_change() -> None:
    # Pinned once: if these change, every trained model's keys change with them.
    assert token_value(b"") == _spec_fmix(0xCBF29CE484222325)
    assert feature_sign(0, b"68fd1e64") == _spec_sign(0, b"68fd1e64")
    assert feature_sign(0, 0) == 7175312947680778460
    assert feature_sign(3, 1) == 528017487031107690
    assert feature_sign(7, 2**63 + 5) == 15594046430066951103


@settings(deadline=None)  # the first call compiles the numba kernel
@given(
    slots=st.lists(st.integers(0, 1000), min_size=1, max_size=50),
    value=st.integers(0, 2**64 - 1),
)
def test_vectorised_equals_scalar(slots: list[int], value: int) -> None:
    values = np.array([value] * len(slots), dtype=np.uint64)
    got = feature_signs(np.array(slots), values)
    assert got.tolist() == [feature_sign(s, value) for s in slots]


def test_same_value_in_two_slots_differs_and_slot_is_a_bijection() -> None:
    values = np.arange(100_000, dtype=np.uint64)
    a = feature_signs(np.zeros(values.shape, dtype=np.int64), values)
    b = feature_signs(np.ones(values.shape, dtype=np.int64), values)
    assert np.unique(a).shape[0] == values.shape[0]
    assert np.intersect1d(a, b).shape[0] == 0


def test_text_tokens_in_a_parser_use_the_byte_hash() -> None:
    line = "\t".join(["1"] + [""] * 13 + ["68fd1e64"] + [""] * 25) + "\n"
    parsed = CriteoFormat().for_file("x", None).parse(np.frombuffer(line.encode(), np.uint8), 1)
    keys = parsed.batch.keys
    assert int(keys[13]) == _spec_sign(13, b"68fd1e64")  # C1 is slot 13
    assert int(keys[14]) == _spec_sign(14, b"")  # an empty C2 is the empty token
