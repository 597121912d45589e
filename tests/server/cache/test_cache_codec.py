"""hopserve.server.cache.codec and CacheNamespace: keys, packed rows, validation."""

from __future__ import annotations

import numpy as np
import pytest

from hopserve.server.cache import CacheNamespace, codec
from hopserve.server.cache.codec import as_node_ids, as_rows, decode_rows, encode_rows, make_keys


def test_key_format_is_versioned() -> None:
    ns = CacheNamespace("cora-gcn", "3", "g7", dim=4, variant="f10-5.s1")
    keys = make_keys("hopserve", ns, np.array([0, 12345]))
    assert keys == ["hopserve:cora-gcn:3:g7:f10-5.s1:0", "hopserve:cora-gcn:3:g7:f10-5.s1:12345"]


@pytest.mark.parametrize(
    "kwargs",
    [
        {"model": "a:b"},
        {"model": ""},
        {"graph_version": "g 1"},
        {"variant": "x:y"},
        {"dim": 0},
        {"dim": True},
    ],
)
def test_namespace_rejects_unsafe_components(kwargs: dict[str, object]) -> None:
    fields: dict[str, object] = {"model": "m", "model_version": "1", "graph_version": "g", "dim": 2}
    with pytest.raises(ValueError, match="CacheNamespace"):
        CacheNamespace(**{**fields, **kwargs})  # type: ignore[arg-type]


def test_variant_for() -> None:
    assert CacheNamespace.variant_for(None) == "exact"
    assert CacheNamespace.variant_for([]) == "exact"
    assert CacheNamespace.variant_for([10, 5]) == "f10-5"
    assert CacheNamespace.variant_for((10, 5), seed=42) == "f10-5.s42"


NS = CacheNamespace("m", "1", "g", dim=3)


def test_rows_round_trip_exact_bytes() -> None:
    rng = np.random.default_rng(0)
    rows = as_rows(rng.standard_normal((5, 3)), 5, 3)
    keys = make_keys("hopserve", NS, np.arange(5))
    stored_keys, packed = encode_rows(rows, keys)
    assert stored_keys == keys
    assert all(len(v) == 20 + 16 + 12 for v in packed)  # header + MAC + 3 float32
    assert packed[2].endswith(rows[2].astype("<f4").tobytes())
    mask, out, rejected = decode_rows([*packed, None], [*keys, "hopserve:m:1:g:exact:9"], 3)
    assert mask.tolist() == [True] * 5 + [False]
    assert not rejected
    assert out.dtype == np.float32 and out[:5].tobytes() == rows.tobytes()
    assert not out[5].any()


def test_wrong_length_value_is_a_miss_and_counted() -> None:
    keys = make_keys("hopserve", NS, np.arange(4))
    _, (good,) = encode_rows(np.arange(3, dtype="<f4").reshape(1, 3), keys[:1])
    raw_row = np.arange(3, dtype="<f4").tobytes()  # the pre-envelope format: refused
    mask, out, rejected = decode_rows([good, b"abc", good + b"x", raw_row], keys, 3)
    assert mask.tolist() == [True, False, False, False]
    assert rejected == {"format": 3}
    assert not out[1:].any()


def _forge(value: bytes, payload: bytes) -> bytes:
    return value[: len(value) - len(payload)] + payload


@pytest.mark.parametrize(
    "payload",
    [
        np.full(3, np.nan, "<f4").tobytes(),
        np.zeros(3, "<f4").tobytes(),
        np.full(3, 1e30, "<f4").tobytes(),
        b"\x00\x01\x02\x03" * 3,
    ],
    ids=["nan", "zeros", "1e30", "bytes"],
)
def test_a_payload_overwritten_in_place_fails_the_checksum(payload: bytes) -> None:
    keys = make_keys("hopserve", NS, np.arange(1))
    _, (value,) = encode_rows(np.ones((1, 3), "<f4"), keys)
    mask, _, rejected = decode_rows([_forge(value, payload)], keys, 3)
    assert not mask.any() and rejected == {"checksum": 1}


def test_a_value_under_another_key_or_secret_is_refused() -> None:
    keys = make_keys("hopserve", NS, np.arange(2))
    other_graph = make_keys("hopserve", CacheNamespace("m", "1", "g2", dim=3), np.arange(1))
    _, values = encode_rows(np.ones((2, 3), "<f4"), keys, secret=b"s" * 16)
    swapped = decode_rows(values[::-1], keys, 3, secret=b"s" * 16)
    assert not swapped[0].any() and swapped[2] == {"checksum": 2}
    moved = decode_rows(values[:1], other_graph, 3, secret=b"s" * 16)
    assert moved[2] == {"checksum": 1}
    unkeyed = decode_rows(values, keys, 3)
    assert unkeyed[2] == {"checksum": 2}
    assert decode_rows(values, keys, 3, secret=b"s" * 16)[0].all()


def test_a_forged_envelope_with_non_finite_values_is_refused() -> None:
    """Someone who knows the unkeyed format can forge the checksum, not NaN rows."""
    keys = make_keys("hopserve", NS, np.arange(2))
    rows = np.array([[np.nan, 0, 0], [0, np.inf, 0]], "<f4")
    assert encode_rows(rows, keys) == ([], [])  # never stored
    forged = []
    for key, row in zip(keys, rows, strict=True):  # build the envelope by hand
        _, (template,) = encode_rows(np.zeros((1, 3), "<f4"), [key])
        header = template[:20]
        forged.append(header + codec._mac(key, header, row.tobytes(), None) + row.tobytes())
    mask, out, rejected = decode_rows(forged, keys, 3)
    assert not mask.any() and rejected == {"nonfinite": 2} and not out.any()


def test_argument_validation() -> None:
    assert as_node_ids([1, 2]).dtype == np.int64
    assert as_node_ids(np.array([], dtype=np.float64)).size == 0
    with pytest.raises(ValueError, match="1-D"):
        as_node_ids(np.zeros((2, 2), dtype=np.int64))
    with pytest.raises(ValueError, match="integers"):
        as_node_ids(np.array([1.5]))
    with pytest.raises(ValueError, match=r"shape \(2, 3\)"):
        as_rows(np.zeros((2, 4)), 2, 3)


def test_rows_carry_their_graph_sequence_and_format_1_reads_as_sequence_0() -> None:
    keys = make_keys("hopserve", NS, np.arange(2))
    rows = np.ones((2, 3), "<f4")
    _, values = encode_rows(rows, keys, seq=41)
    mask, out, seqs, rejected = codec.decode_rows_seq([*values, None], [*keys, keys[0]], 3)
    assert mask.tolist() == [True, True, False] and seqs.tolist() == [41, 41, 0]
    # A value written before sequences existed (format 1, no seq field) is still a row.
    header = codec._HEADER_V1.pack(b"HSE", 1, 1, 3)
    payload = rows[0].tobytes()
    old = header + codec._mac(keys[0], header, payload, None) + payload
    mask, out, seqs, rejected = codec.decode_rows_seq([old], keys[:1], 3)
    assert mask.all() and seqs.tolist() == [0] and not rejected
    # The sequence is under the MAC: raising it (to dodge invalidation) breaks the check.
    bumped = bytearray(values[0])
    bumped[12] ^= 0xFF
    mask, _, _, rejected = codec.decode_rows_seq([bytes(bumped)], keys[:1], 3)
    assert not mask.any() and rejected == {"checksum": 1}
