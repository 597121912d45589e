"""Plain result types returned by the clients (no protobuf objects leak to callers).

:class:`BlockInfo` is the contract's (:mod:`hopserve.proto.contract`): one layer of a
served model, the same type the front-end and the workers exchange.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from hopserve.proto.contract import STAGES, BlockInfo
from hopserve.proto.fields import from_message
from hopserve.proto.v1 import embedding_pb2 as pb

__all__ = ["TIMING_STAGES", "BlockInfo", "EmbeddingResult", "ModelInfo", "NodeTypeInfo"]

#: Keys of :attr:`EmbeddingResult.timing`, in pipeline order (``StageTiming`` fields): the
#: contract's stage names, then ``total``.
TIMING_STAGES = (*STAGES, "total")


def _dtype_name(dtype: int) -> str:
    return {pb.DTYPE_FLOAT32: "float32"}.get(dtype, "unspecified")


@dataclass(frozen=True)
class NodeTypeInfo:
    """One node type of a typed graph (``hopserve.v1.NodeTypeInfo``): store-wide IDs
    ``offset .. offset + count - 1`` (nodes updates added to a type with own IDs come after
    every type's); ``node_type=name`` asks by the type's own IDs (``own_ids``) or by its
    positions ``0..count-1``. ``output_dim``: the width of the model's embeddings of this
    type (a row's first ``output_dim`` values; the rest of ``ModelInfo.dim`` is zero
    padding), 0 when the model outputs none of this type."""

    name: str
    count: int
    offset: int
    feature_dim: int
    own_ids: bool = False
    output_dim: int = 0


@dataclass(frozen=True)
class ModelInfo:
    """Metadata of one served model (``hopserve.v1.ModelInfo``).

    Attributes:
        name: Model name, the ``model`` argument of the embedding calls.
        version: Model version.
        dim: Width of the served embeddings.
        num_layers: Number of layers L; a ``fanouts`` argument must have this length.
        graph_num_nodes: Nodes in the served graph.
        graph_num_edges: Edges in the served graph.
        graph_version: Graph snapshot version.
        ready: Whether the model accepts requests now.
        blocks: The layers in order.
        description: Free-form description.
        dtype: Element type of the embeddings, ``"float32"``.
        graph_seq: Graph sequence (updates applied on top of ``graph_version``).
        state: ``"loading"``, ``"ready"``, ``"failed"`` or ``"draining"``.
        is_default: Served to requests that name no version.
        traffic_percent: Share of unversioned requests this version gets.
        node_types: Node types of a typed graph (:class:`NodeTypeInfo`: name, count,
            offset, feature width, own IDs, the model's output width for the type) in
            storage-id order (empty: untyped); ``node_type`` of the embedding calls.
        relations: Relation names of the graph's typed edges, by id (empty: untyped).
        output_types: Node types the model outputs embeddings for (a dict model's;
            empty: every node). Requests for other types are refused.
    """

    name: str
    version: str
    dim: int
    num_layers: int
    graph_num_nodes: int
    graph_num_edges: int
    graph_version: str
    ready: bool
    blocks: tuple[BlockInfo, ...] = ()
    description: str = ""
    dtype: str = "float32"
    graph_seq: int = 0
    state: str = ""
    is_default: bool = True
    traffic_percent: int = 100
    node_types: tuple[NodeTypeInfo, ...] = ()
    relations: tuple[str, ...] = ()
    output_types: tuple[str, ...] = ()

    @classmethod
    def from_proto(cls, msg: pb.ModelInfo) -> ModelInfo:
        """Convert a ``hopserve.v1.ModelInfo`` message."""
        return from_message(
            msg,
            cls,
            blocks=tuple(from_message(b, BlockInfo) for b in msg.blocks),
            dtype=_dtype_name(msg.dtype),
            node_types=tuple(from_message(t, NodeTypeInfo) for t in msg.node_types),
            relations=tuple(msg.relations),
            output_types=tuple(msg.output_types),
        )


@dataclass(frozen=True)
class Footprint:
    """What computing one row touched (``hopserve.v1.TargetFootprint``).

    Attributes:
        frontier_sizes: Nodes computed per layer for this row alone, ``|V^0| … |V^L|``.
        max_degree: Largest in-degree among the nodes its layers aggregate over.
        hub: Whether ``max_degree`` reached the server's ``hub_degree``.
    """

    frontier_sizes: tuple[int, ...]
    max_degree: int
    hub: bool


@dataclass(frozen=True)
class EmbeddingResult:
    """Embeddings of a request plus what the server reported about computing them.

    When the client split the request into several RPCs, timings, per-layer compute and
    cache hits are summed over them.

    Attributes:
        embeddings: ``[len(node_ids), dim]`` float32, rows in request order.
        model: Model name that computed the rows.
        model_version: Resolved model version (equal for all rows).
        graph_version: Graph snapshot version (equal for all rows).
        timing: Server seconds per stage, keyed by :data:`TIMING_STAGES`.
        layer_compute: Server compute seconds per layer (layer 1 first); may be empty.
        cache_hits: Rows served from the embedding cache.
        graph_seq: Graph sequence the rows are exact for (updates on top of
            ``graph_version``; the highest over the RPCs of a split request).
        footprints: One per row when asked for (``footprint=True``), else empty.
    """

    embeddings: np.ndarray
    model: str
    model_version: str
    graph_version: str
    timing: dict[str, float] = field(default_factory=dict)
    layer_compute: tuple[float, ...] = ()
    cache_hits: int = 0
    graph_seq: int = 0
    footprints: tuple[Footprint, ...] = ()
