"""Packed wire tensors: numpy arrays <-> the ``bytes`` fields of the hopserve protos.

Embeddings travel as little-endian float32 (``<f4``), row-major, ``n * dim`` values;
node indices (worker protocol) as little-endian int64 (``<i8``). Shapes travel in their
own proto fields, so the decoders take them as arguments and check the byte count.
Shared by the client SDK (``hopserve.client`` re-exports the embedding pair), the
front-end and the workers, so every side packs and checks tensors the same way; imports
numpy only.
"""

from __future__ import annotations

import numpy as np

__all__ = [
    "EMBEDDING_DTYPE",
    "INDEX_DTYPE",
    "decode_embeddings",
    "decode_indices",
    "encode_embeddings",
    "encode_indices",
]

#: Wire dtype of embeddings (``DTYPE_FLOAT32``).
EMBEDDING_DTYPE = np.dtype("<f4")
#: Wire dtype of node-index arrays (``JobRequest.targets`` / ``frontiers``).
INDEX_DTYPE = np.dtype("<i8")

_INT64_MAX = np.iinfo(np.int64).max


def encode_embeddings(embeddings: np.ndarray) -> bytes:
    """Pack a float32 ``[N, dim]`` array as little-endian row-major bytes.

    Args:
        embeddings: 2-D ``float32`` array (any byte order or memory layout), ``dim >= 1``;
            ``N`` may be 0.

    Returns:
        ``N * dim * 4`` bytes; row ``i`` at ``[i * dim * 4, (i + 1) * dim * 4)``.

    Raises:
        ValueError: If the input is not a 2-D float32 array with ``dim >= 1``. Other
            dtypes are refused rather than cast, so that precision is never lost silently.
    """
    if not isinstance(embeddings, np.ndarray):
        raise ValueError(f"embeddings must be a numpy array, got {type(embeddings).__name__}")
    if embeddings.ndim != 2:
        raise ValueError(f"embeddings must be 2-D [N, dim], got shape {embeddings.shape}")
    if embeddings.dtype.kind != "f" or embeddings.dtype.itemsize != 4:
        raise ValueError(f"embeddings must be float32, got dtype {embeddings.dtype}")
    if embeddings.shape[1] < 1:
        raise ValueError(f"embeddings must have dim >= 1, got shape {embeddings.shape}")
    return np.ascontiguousarray(embeddings, dtype=EMBEDDING_DTYPE).tobytes()


def decode_embeddings(data: bytes | bytearray | memoryview, n: int, dim: int) -> np.ndarray:
    """Unpack ``n`` rows of ``dim`` little-endian float32 values.

    Args:
        data: Exactly ``n * dim * 4`` bytes, as written by :func:`encode_embeddings`.
        n: Number of rows, ``>= 0``.
        dim: Number of columns, ``>= 1``.

    Returns:
        A read-only ``[n, dim]`` ``<f4`` view over ``data`` (zero copy); call ``.copy()``
        for a writable array.

    Raises:
        ValueError: If ``n`` or ``dim`` is out of range or the byte count does not match,
            naming the sizes involved.
    """
    n, dim = _check_count("n", n, 0), _check_count("dim", dim, 1)
    expected = n * dim * EMBEDDING_DTYPE.itemsize
    size = memoryview(data).nbytes
    if size != expected:
        raise ValueError(
            f"embedding payload is {size} bytes, expected {expected} "
            f"(n={n} rows x dim={dim} x {EMBEDDING_DTYPE.itemsize} bytes)"
        )
    return np.frombuffer(data, dtype=EMBEDDING_DTYPE).reshape(n, dim)


def encode_indices(indices: np.ndarray) -> bytes:
    """Pack a 1-D integer array as little-endian int64 bytes (``8 * len`` bytes).

    Raises:
        ValueError: If the input is not a 1-D integer array or a value exceeds int64.
    """
    if not isinstance(indices, np.ndarray):
        raise ValueError(f"indices must be a numpy array, got {type(indices).__name__}")
    if indices.ndim != 1:
        raise ValueError(f"indices must be 1-D, got shape {indices.shape}")
    if indices.dtype.kind not in "iu":
        raise ValueError(f"indices must be integers, got dtype {indices.dtype}")
    if indices.dtype.kind == "u" and indices.size and int(indices.max()) > _INT64_MAX:
        raise ValueError(f"index {int(indices.max())} does not fit in int64")
    return np.ascontiguousarray(indices, dtype=INDEX_DTYPE).tobytes()


def decode_indices(data: bytes | bytearray | memoryview) -> np.ndarray:
    """Unpack little-endian int64 bytes into a read-only 1-D ``<i8`` view (zero copy).

    Raises:
        ValueError: If the byte count is not a multiple of 8.
    """
    size = memoryview(data).nbytes
    if size % INDEX_DTYPE.itemsize:
        raise ValueError(f"index payload is {size} bytes, not a multiple of 8 (int64)")
    return np.frombuffer(data, dtype=INDEX_DTYPE)


def _check_count(name: str, value: int, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int | np.integer):
        raise ValueError(f"{name} must be an integer, got {value!r}")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    return int(value)
