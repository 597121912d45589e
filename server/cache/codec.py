"""Keys and values as stored in the cache: versioned key strings, enveloped float32 rows.

Key: ``{prefix}:{model}:{model_version}:{graph_version}:{variant}:{node_id}``; in a Redis
Cluster ``{prefix}:{{model}:{model_version}:{graph_version}:{variant}:{bucket}}:{node_id}``
(:func:`make_cluster_keys`: the part in braces is the hash tag).

Value: an integrity envelope around one row (all little-endian)::

    magic  b"HSE"   3 bytes  hopserve embedding
    format u8       1 byte   ENVELOPE_FORMAT (1)
    dtype  u8       1 byte   1 = float32
    pad             3 bytes  zero
    dim    u32      4 bytes  row width
    seq    u64      8 bytes  graph sequence the row was computed at (format 2)
    mac             16 bytes BLAKE2b-128 of (key, header, payload), keyed when the cache
                             has an integrity key
    payload         dim * 4  the row, float32

Format 1 (written before graphs took updates) has no ``seq`` and reads as sequence 0.

The MAC covers the key string, so the model, both versions, the sampling variant and the
node id are bound to the row: a value copied under another key, a truncated or bit-flipped
payload, a row of another width or format all fail the check. A row that passes but holds
NaN or Inf is refused too (a forged envelope cannot smuggle non-finite values in). Any
failure is a miss, never a row: the front-end recomputes it and its write-back overwrites
the bad value. Without a key the MAC is a checksum (it detects corruption, not a forger
who knows the format); with ``cache.integrity_key_file`` it is a keyed MAC.
"""

from __future__ import annotations

import hashlib
import hmac
import struct
from collections import Counter
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from hopserve.server.cache.base import CacheNamespace

__all__ = [
    "ENVELOPE_FORMAT",
    "REJECT_REASONS",
    "as_node_ids",
    "as_rows",
    "decode_rows",
    "decode_rows_seq",
    "encode_rows",
    "make_cluster_keys",
    "make_keys",
    "namespace_prefix",
]

ROW_DTYPE = np.dtype("<f4")
"""Stored dtype: little-endian float32, whatever the host byte order."""

ENVELOPE_FORMAT = 2
"""Version of the value layout written; format 1 is still read (as sequence 0), any other
format is a miss."""

REJECT_REASONS = ("format", "checksum", "nonfinite")
"""Why a stored value is refused: ``format`` (length, magic, format, dtype or dim do not
match), ``checksum`` (the MAC does not match key and payload), ``nonfinite`` (NaN/Inf)."""

_HEADER = struct.Struct("<3sBB3xIQ")
_HEADER_V1 = struct.Struct("<3sBB3xI")
_MAGIC = b"HSE"
_DTYPE_FLOAT32 = 1
_MAC_BYTES = 16
_PAYLOAD_AT = _HEADER.size + _MAC_BYTES


def namespace_prefix(prefix: str, namespace: CacheNamespace) -> str:
    """The common start of every key in ``namespace`` (ends with ``:``)."""
    ns = namespace
    return f"{prefix}:{ns.model}:{ns.model_version}:{ns.graph_version}:{ns.variant}:"


def make_keys(prefix: str, namespace: CacheNamespace, node_ids: np.ndarray) -> list[str]:
    """One key per node id, in order."""
    head = namespace_prefix(prefix, namespace)
    return [head + str(i) for i in node_ids.tolist()]


def make_cluster_keys(
    prefix: str, namespace: CacheNamespace, node_ids: np.ndarray, buckets: int
) -> list[str]:
    """One Redis Cluster key per node id, in order, hash-tagged by namespace and bucket.

    ``hopserve:{cora:1:g1:exact:17}:12345`` is node 12345 of bucket ``12345 % buckets``.
    Redis Cluster hashes only the tag (the part in braces) to pick one of its 16384 slots,
    so a namespace's rows live in at most ``buckets`` slots, and one lookup needs at most
    ``buckets`` MGETs however many ids it has (an MGET must stay within one slot).

    The trade-off is ``buckets``: fewer buckets mean fewer commands per lookup (each is
    a slot lookup and a pack in redis-py, and a dispatch in Redis), more buckets spread a
    namespace's rows and traffic more evenly over the masters (a master holds about
    ``buckets / masters`` of them, give or take the square root) and make each slot, the
    unit Redis moves when resharding, smaller. Every namespace (model, version, graph,
    sampling variant) hashes to its own set of slots, so several of them even out.
    The prefix stays outside the tag, so ``SCAN MATCH hopserve:*`` still finds the keys.
    """
    ns = namespace
    head = f"{prefix}:{{{ns.model}:{ns.model_version}:{ns.graph_version}:{ns.variant}:"
    return [
        f"{head}{bucket}}}:{node}"
        for node, bucket in zip(node_ids.tolist(), np.mod(node_ids, buckets).tolist(), strict=True)
    ]


def as_node_ids(node_ids: np.ndarray | Sequence[int]) -> np.ndarray:
    """Validate and return ``node_ids`` as a 1-D int64 array.

    Raises:
        ValueError: not one-dimensional or not integers.
    """
    ids = np.asarray(node_ids)
    if ids.ndim != 1:
        raise ValueError(f"node_ids must be 1-D (got shape {ids.shape})")
    if ids.size and not np.issubdtype(ids.dtype, np.integer):
        raise ValueError(f"node_ids must be integers (got dtype {ids.dtype})")
    return ids.astype(np.int64, copy=False)


def as_rows(rows: np.ndarray, n: int, dim: int) -> np.ndarray:
    """Validate ``rows`` against ``[n, dim]`` and return them C-contiguous little-endian f32.

    Raises:
        ValueError: wrong shape.
    """
    array = np.asarray(rows)
    if array.shape != (n, dim):
        raise ValueError(f"rows must have shape ({n}, {dim}) (got {array.shape})")
    return np.ascontiguousarray(array, dtype=ROW_DTYPE)


def _mac(key: str, header: bytes, payload: bytes, secret: bytes | None) -> bytes:
    h = hashlib.blake2b(digest_size=_MAC_BYTES, key=secret or b"", person=b"hopserve-row")
    h.update(key.encode())
    h.update(b"\0")
    h.update(header)
    h.update(payload)
    return h.digest()


def encode_rows(
    rows: np.ndarray, keys: Sequence[str], secret: bytes | None = None, seq: int = 0
) -> tuple[list[str], list[bytes]]:
    """Envelope each finite row of a ``[N, dim]`` little-endian float32 array, computed at
    graph sequence ``seq``.

    Returns:
        ``(keys, values)`` of the rows to store: rows holding NaN or Inf are left out
        (they would be refused on read anyway).
    """
    dim = rows.shape[1]
    header = _HEADER.pack(_MAGIC, ENVELOPE_FORMAT, _DTYPE_FLOAT32, dim, int(seq))
    finite = np.isfinite(rows).all(axis=1)
    buffer = rows.tobytes()
    width = dim * ROW_DTYPE.itemsize
    out_keys, values = [], []
    for i in np.flatnonzero(finite).tolist():
        payload = buffer[i * width : (i + 1) * width]
        out_keys.append(keys[i])
        values.append(header + _mac(keys[i], header, payload, secret) + payload)
    return out_keys, values


def decode_rows(
    values: Sequence[bytes | None],
    keys: Sequence[str],
    dim: int,
    secret: bytes | None = None,
) -> tuple[np.ndarray, np.ndarray, Counter[str]]:
    """Open stored envelopes (``None`` = absent) and check them against their keys.

    Returns:
        ``(hit_mask [N], rows float32 [N, dim], rejected)``: a value that fails any check
        is a miss, its row zero, and counted in ``rejected`` by reason
        (:data:`REJECT_REASONS`); it is never returned as a row.
    """
    mask, rows, _, rejected = decode_rows_seq(values, keys, dim, secret)
    return mask, rows, rejected


def decode_rows_seq(
    values: Sequence[bytes | None],
    keys: Sequence[str],
    dim: int,
    secret: bytes | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, Counter[str]]:
    """:func:`decode_rows` plus each row's graph sequence (int64 ``[N]``, 0 for misses)."""
    n = len(values)
    width = dim * ROW_DTYPE.itemsize
    prefix = _HEADER_V1.pack(_MAGIC, ENVELOPE_FORMAT, _DTYPE_FLOAT32, dim)
    old = _HEADER_V1.pack(_MAGIC, 1, _DTYPE_FLOAT32, dim)
    rejected: Counter[str] = Counter()
    accepted: list[int] = []
    payloads: list[bytes] = []
    seqs = np.zeros(n, dtype=np.int64)
    for i, value in enumerate(values):
        if value is None:
            continue
        if value[: _HEADER_V1.size] == old and len(value) == _HEADER_V1.size + _MAC_BYTES + width:
            header, at = old, _HEADER_V1.size  # format 1: sequence 0
        elif len(value) == _PAYLOAD_AT + width and value[: _HEADER_V1.size] == prefix:
            header, at = value[: _HEADER.size], _HEADER.size
            seqs[i] = _HEADER.unpack(header)[-1]
        else:
            rejected["format"] += 1
            continue
        payload = value[at + _MAC_BYTES :]
        mac = _mac(keys[i], header, payload, secret)
        if not hmac.compare_digest(mac, value[at : at + _MAC_BYTES]):
            rejected["checksum"] += 1
            continue
        accepted.append(i)
        payloads.append(payload)
    mask = np.zeros(n, dtype=bool)
    rows = np.zeros((n, dim), dtype=np.float32)
    if accepted:
        got = np.frombuffer(b"".join(payloads), dtype=ROW_DTYPE).reshape(-1, dim)
        finite = np.isfinite(got).all(axis=1)
        if not finite.all():
            rejected["nonfinite"] += int((~finite).sum())
        positions = np.asarray(accepted)[finite]
        rows[positions] = got[finite]
        mask[positions] = True
    seqs[~mask] = 0
    return mask, rows, seqs, rejected
