"""hopserve client SDK: node embeddings over gRPC, blocking and asyncio.

Imports only grpcio, protobuf and numpy (never torch), so ``pip install hopserve`` is
enough to query a server::

    from hopserve.client import EmbeddingClient

    with EmbeddingClient("localhost:50051") as client:
        emb = client.get_embeddings("sage", [3, 1, 4])  # float32 [3, dim]

    # a secured server: TLS with your CA, a bearer token (scope embeddings:read)
    EmbeddingClient("hopserve.internal:50051", root_certificates="ca.crt", token=token)

:class:`AsyncEmbeddingClient` has the same methods as coroutines; :class:`AdminClient`
and :class:`AsyncAdminClient` load and switch model versions and update graphs (scope
``admin``). Failures raise
:class:`HopserveError` subclasses carrying the gRPC status; :mod:`hopserve.proto.tensors`
packs and unpacks the raw tensors of the wire format.
"""

from hopserve.client.admin import (
    AdminClient,
    AsyncAdminClient,
    GraphInfo,
    GraphUpdateResult,
    UnloadResult,
)
from hopserve.client.aio import AsyncEmbeddingClient
from hopserve.client.errors import (
    DeadlineExceededError,
    HopserveError,
    InvalidArgumentError,
    MalformedResponseError,
    NotFoundError,
    PermissionDeniedError,
    ResourceExhaustedError,
    UnauthenticatedError,
    UnavailableError,
)
from hopserve.client.results import (
    BlockInfo,
    EmbeddingResult,
    Footprint,
    ModelInfo,
    NodeTypeInfo,
)
from hopserve.client.sync import EmbeddingClient
from hopserve.proto.tensors import decode_embeddings, encode_embeddings

__all__ = [
    "AdminClient",
    "AsyncAdminClient",
    "AsyncEmbeddingClient",
    "BlockInfo",
    "DeadlineExceededError",
    "EmbeddingClient",
    "EmbeddingResult",
    "Footprint",
    "GraphInfo",
    "GraphUpdateResult",
    "HopserveError",
    "InvalidArgumentError",
    "MalformedResponseError",
    "ModelInfo",
    "NodeTypeInfo",
    "NotFoundError",
    "PermissionDeniedError",
    "ResourceExhaustedError",
    "UnauthenticatedError",
    "UnavailableError",
    "UnloadResult",
    "decode_embeddings",
    "encode_embeddings",
]
