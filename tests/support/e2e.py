"""Helpers of the front-end end-to-end tests: raw stub calls and expected rows."""

from __future__ import annotations

from typing import Any

import grpc
import numpy as np
import pytest
import torch

from hopserve import LayerwiseEvaluator
from hopserve.proto.v1 import embedding_pb2 as pb
from hopserve.proto.v1 import embedding_pb2_grpc

MODEL = "sage"
ATOL, RTOL = 1e-5, 1e-4
REDIS_LABELS = {"model": MODEL, "backend": "redis"}


def expected(evaluator: LayerwiseEvaluator, ids: Any, **kw: Any) -> np.ndarray:
    return evaluator.evaluate(
        torch.from_numpy(np.ascontiguousarray(ids, dtype=np.int64)), **kw
    ).numpy()


def raw(
    target: str,
    request: Any,
    method: str = "GetEmbeddings",
    timeout: float | None = 10.0,
) -> Any:
    """Call ``method`` with the generated stub (no client-side validation); a stream is
    returned as the list of its chunks."""
    with grpc.insecure_channel(target) as channel:
        stub = embedding_pb2_grpc.EmbeddingServiceStub(channel)
        answer = getattr(stub, method)(request, timeout=timeout)
        return list(answer) if method == "StreamEmbeddings" else answer


def raw_error(target: str, request: Any, method: str = "GetEmbeddings", **kw: Any) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as info:
        raw(target, request, method, **kw)
    return info.value


def request(ids: Any, model: str = MODEL, **options: Any) -> pb.GetEmbeddingsRequest:
    return pb.GetEmbeddingsRequest(
        model=model,
        node_ids=[int(i) for i in ids],
        options=pb.QueryOptions(**options),
    )


def pick(all_ids: np.ndarray, seed: int, n: int) -> np.ndarray:
    return np.random.default_rng(seed).choice(all_ids, size=n, replace=True)
