"""Argument checks of the client SDK: every bad argument fails before anything is sent.

Each check raises :class:`~hopserve.client.errors.InvalidArgumentError` naming the bad
value, and returns the value in its wire form.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from hopserve.client.errors import InvalidArgumentError
from hopserve.proto.v1 import embedding_pb2 as pb

#: ``cache_policy`` argument -> ``hopserve.v1.CachePolicy``.
CACHE_POLICIES: dict[str, int] = {
    "use": pb.CACHE_USE,
    "refresh": pb.CACHE_REFRESH,
    "bypass": pb.CACHE_BYPASS,
}

INT32_MAX = 2**31 - 1
UINT64_MAX = 2**64 - 1
_INT64 = np.iinfo(np.int64)


def as_node_ids(node_ids: npt.ArrayLike) -> np.ndarray:
    """Validate ``node_ids`` and return them as a 1-D int64 array.

    Raises:
        InvalidArgumentError: Not 1-D, empty, not integers, or outside int64.
    """
    try:
        arr = np.asarray(node_ids)
    except (TypeError, ValueError) as exc:
        raise InvalidArgumentError(f"node_ids is not array-like: {exc}") from None
    if arr.ndim != 1:
        raise InvalidArgumentError(f"node_ids must be 1-D, got shape {arr.shape}")
    if arr.size == 0:
        raise InvalidArgumentError("node_ids is empty")
    if arr.dtype.kind not in "iu":
        raise InvalidArgumentError(f"node_ids must be integers, got dtype {arr.dtype}")
    if arr.dtype.kind == "u" and int(arr.max()) > _INT64.max:
        raise InvalidArgumentError(f"node id {int(arr.max())} does not fit in int64")
    return arr.astype(np.int64, copy=False)


def check_int(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int | np.integer):
        raise InvalidArgumentError(f"{name} must be an integer, got {value!r}")
    return int(value)


def check_fanouts(fanouts: Sequence[int] | None) -> list[int]:
    """Validate per-layer fanouts (``-1`` = all neighbours, else ``>= 1``); None -> []."""
    if fanouts is None:
        return []
    if isinstance(fanouts, str | bytes) or not isinstance(fanouts, Sequence | np.ndarray):
        raise InvalidArgumentError(f"fanouts must be a sequence of ints, got {fanouts!r}")
    out = [check_int("fanouts entry", f) for f in fanouts]
    for layer, f in enumerate(out, start=1):
        if f != -1 and not 1 <= f <= INT32_MAX:
            raise InvalidArgumentError(
                f"fanouts[{layer - 1}] (layer {layer}) must be -1 (all) or >= 1, got {f}"
            )
    return out


def check_cache_policy(cache_policy: str) -> int:
    """Map ``"use" | "refresh" | "bypass"`` (any case) to ``hopserve.v1.CachePolicy``."""
    key = cache_policy.lower() if isinstance(cache_policy, str) else None
    if key not in CACHE_POLICIES:
        raise InvalidArgumentError(
            f"cache_policy must be one of {sorted(CACHE_POLICIES)}, got {cache_policy!r}"
        )
    return CACHE_POLICIES[key]


def check_model(model: str) -> str:
    """Validate a model name (non-empty string)."""
    if not isinstance(model, str) or not model:
        raise InvalidArgumentError(f"model must be a non-empty string, got {model!r}")
    return model


def check_version(version: str | int | None) -> str:
    """Model version as the wire string; None -> "" (latest)."""
    if version is None:
        return ""
    if isinstance(version, bool) or not isinstance(version, str | int):
        raise InvalidArgumentError(f"model_version must be a str, int or None, got {version!r}")
    return str(version)


def check_timeout(name: str, timeout: float | None) -> float | None:
    """Validate a timeout in seconds: None (no deadline) or a finite number > 0."""
    if timeout is None:
        return None
    if isinstance(timeout, bool) or not isinstance(timeout, int | float):
        raise InvalidArgumentError(f"{name} must be a number of seconds or None, got {timeout!r}")
    if not (timeout > 0 and math.isfinite(timeout)):
        raise InvalidArgumentError(f"{name} must be > 0 and finite, got {timeout!r}")
    return float(timeout)


def check_seconds(name: str, value: float) -> float:
    """A required duration: a finite number of seconds > 0."""
    if value is None:
        raise InvalidArgumentError(f"{name} must be a number of seconds, got None")
    return check_timeout(name, value)  # type: ignore[return-value]


def check_seed(seed: int) -> int:
    """A sampling seed in ``[0, 2**64)``."""
    seed = check_int("seed", seed)
    if not 0 <= seed <= UINT64_MAX:
        raise InvalidArgumentError(f"seed must be in [0, 2**64), got {seed}")
    return seed
