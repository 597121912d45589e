"""Wire tensors: packed little-endian float32 embeddings and int64 index arrays."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from hopserve.proto.tensors import (
    decode_embeddings,
    decode_indices,
    encode_embeddings,
    encode_indices,
)

shapes = st.tuples(st.integers(0, 40), st.integers(1, 24))


@given(
    arr=hnp.arrays(
        dtype=st.sampled_from([np.dtype("<f4"), np.dtype(">f4")]),
        shape=shapes,
        elements=st.floats(width=32, allow_nan=True, allow_infinity=True),
    ),
    transpose=st.booleans(),
)
def test_embeddings_round_trip_bit_exact(arr: np.ndarray, transpose: bool) -> None:
    if transpose and arr.shape[0] >= 1:  # non-contiguous input of the same logical shape
        arr = np.ascontiguousarray(arr.T).T
    data = encode_embeddings(arr)
    assert len(data) == arr.shape[0] * arr.shape[1] * 4
    out = decode_embeddings(data, *arr.shape)
    assert out.shape == arr.shape and out.dtype == np.dtype("<f4")
    # bit-exact, NaN payloads included
    assert np.array_equal(out.view("<u4"), arr.astype("<f4").view("<u4"))


def test_layout_is_little_endian_row_major() -> None:
    arr = np.array([[1.0, 2.0], [3.0, 4.0]], dtype=np.float32)
    assert encode_embeddings(arr) == np.array([1, 2, 3, 4], dtype="<f4").tobytes()


def test_decode_is_zero_copy_read_only() -> None:
    out = decode_embeddings(bytes(8), 1, 2)
    assert not out.flags.writeable


@pytest.mark.parametrize(
    ("arr", "match"),
    [
        (np.zeros((2, 3), dtype=np.float64), "float32, got dtype float64"),
        (np.zeros((2, 3), dtype=np.float16), "float32, got dtype float16"),
        (np.zeros((2, 3), dtype=np.int32), "float32, got dtype int32"),
        (np.zeros(6, dtype=np.float32), r"2-D \[N, dim\], got shape \(6,\)"),
        (np.zeros((1, 2, 3), dtype=np.float32), r"got shape \(1, 2, 3\)"),
        (np.zeros((3, 0), dtype=np.float32), "dim >= 1"),
        ([[1.0, 2.0]], "numpy array, got list"),
    ],
)
def test_encode_rejects(arr: object, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        encode_embeddings(arr)  # type: ignore[arg-type]


@given(n=st.integers(0, 50), dim=st.integers(1, 20), delta=st.integers(-9, 9).filter(bool))
def test_decode_rejects_wrong_length(n: int, dim: int, delta: int) -> None:
    size = max(n * dim * 4 + delta, 0)
    if size == n * dim * 4:
        return
    with pytest.raises(ValueError, match=rf"is {size} bytes, expected {n * dim * 4} \(n={n} "):
        decode_embeddings(bytes(size), n, dim)


@pytest.mark.parametrize(
    ("n", "dim", "match"),
    [(-1, 2, "n must be >= 0"), (1, 0, "dim must be >= 1"), (1.0, 2, "n must be an integer")],
)
def test_decode_rejects_bad_shape(n: object, dim: object, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        decode_embeddings(b"", n, dim)  # type: ignore[arg-type]


@given(
    arr=hnp.arrays(
        dtype=st.sampled_from([np.int64, np.int32, np.uint32, np.dtype(">i8")]),
        shape=st.integers(0, 64),
    )
)
def test_indices_round_trip(arr: np.ndarray) -> None:
    out = decode_indices(encode_indices(arr))
    assert out.dtype == np.dtype("<i8")
    assert np.array_equal(out, arr.astype(np.int64))


def test_indices_reject() -> None:
    with pytest.raises(ValueError, match="multiple of 8"):
        decode_indices(bytes(12))
    with pytest.raises(ValueError, match="integers, got dtype float32"):
        encode_indices(np.zeros(3, dtype=np.float32))
    with pytest.raises(ValueError, match="1-D"):
        encode_indices(np.zeros((2, 2), dtype=np.int64))
    with pytest.raises(ValueError, match="does not fit in int64"):
        encode_indices(np.array([2**63], dtype=np.uint64))
