"""PyG rows of the support matrix: every conv of ``torch_geometric.nn.conv``, exact or why not.

Three kinds of row (see :mod:`.registry`):

* exact through :class:`~.message_passing.MessagePassingAdapter`: 1-hop convs whose
  every per-destination statistic (a softmax, a degree, a std) reads only the
  destination's own in-edges, which a batch holds in full. ``pair`` convs take
  ``(x_src, x_dst)``; ``square`` convs accept one tensor only and run on the square
  batch, their destination rows sliced out;
* adapted: a dedicated adapter supplies a whole-graph statistic (GCN-normalized convs)
  or runs an inner conv through its own adapter (``AntiSymmetricConv``);
* refused, with the reason (K hops inside one module, two edge sets, out-neighbours,
  dynamic graphs, heterogeneous graphs, another library's kernel).

Second per-node inputs (``ConvAdapter.node_inputs``): the initial representation ``x_0``
of ``GCN2Conv`` / ``FAConv`` (read on destination rows, :mod:`.gcn2`) and the positions /
normals of the point-cloud convs (source rows, :mod:`.message_passing`), values the model
computes from its features; the split passes them to the adapter by name.

Edge data (the graph store's ``edge_weight`` / ``edge_features``): convs whose forward
takes ``edge_weight`` or ``edge_attr`` get the rows of their batch's edges when the
model passes its ``edge_weight`` / ``edge_attr`` argument (:mod:`.message_passing`;
GCN-normalized ones through :mod:`.gcn`). Some rows depend on how the conv was built
(a GCN-normalized conv called with data it cannot take): their factory refuses such
instances with an :class:`~.base.UnsupportedConvError` whose ``reason`` the matrix shows.

Typed edges (the store's ``edge_type`` column, relation ids): ``RGCNConv``,
``FastRGCNConv``, ``RGATConv`` and ``FiLMConv(num_relations > 1)`` get the relation id
of each batch edge when the model passes its ``edge_type`` argument. Each aggregates per
destination (a per-relation mean or sum, an attention softmax over the destination's
in-edges, within or across relations), so a batch holding every in-edge of its
destinations is exact.
"""

from __future__ import annotations

from torch import nn

from hopserve.worker.convs.base import ConvAdapter

EDGE_DATA = "; edge data from the graph store's edge columns"
EDGE_TYPES = "; relation ids (edge_type) from the graph store's edge_type column"
DICT_MODEL = (
    "takes per-type dicts: served inside a dict model (forward(x_dict, edge_index_dict)) on "
    "a typed store, {how} (docs/heterogeneous.md); not inside a homogeneous model"
)
POSITIONS = (
    "; positions are a per-node input the model computes from the features, read on the "
    "batch's source rows"
)
KNN = "builds its own k-nearest-neighbour graph from the features (no edge_index)"
CUGRAPH = (
    "runs on cugraph-ops' CUDA kernels (pylibcugraphops); serve the equivalent PyG conv "
    "({base}) instead"
)


def _pair(conv: nn.Module) -> ConvAdapter:
    from hopserve.worker.convs.message_passing import MessagePassingAdapter

    return MessagePassingAdapter(conv, pair=True)


def _pair_unfused(conv: nn.Module) -> ConvAdapter:
    from hopserve.worker.convs.message_passing import MessagePassingAdapter

    return MessagePassingAdapter(conv, pair=True, fuse=False)


def _square(conv: nn.Module) -> ConvAdapter:
    from hopserve.worker.convs.message_passing import MessagePassingAdapter

    return MessagePassingAdapter(conv, pair=False, fuse=False)


def _simple(conv: nn.Module) -> ConvAdapter:
    """``SimpleConv``: ``combine_root="self_loop"`` adds loops, so it needs a square batch."""
    return _square(conv) if conv.combine_root == "self_loop" else _pair(conv)


def _rgcn(conv: nn.Module) -> ConvAdapter:
    """Sum/mean RGCN: one typed aggregation and one GEMM (:mod:`.rgcn`); max: generic."""
    if conv.aggr not in ("mean", "add", "sum"):
        return _pair_unfused(conv)
    from hopserve.worker.convs.rgcn import RGCNAdapter

    return RGCNAdapter(conv)


def _gat(conv: nn.Module) -> ConvAdapter:
    """``GATConv``: full layers project sources once per layer (:mod:`.gat`)."""
    from hopserve.worker.convs.gat import GATAdapter

    return GATAdapter(conv)


def _gcn(conv: nn.Module) -> ConvAdapter:
    from hopserve.worker.convs.gcn import GCNAdapter

    return GCNAdapter(conv)


def _lg(conv: nn.Module) -> ConvAdapter:
    from hopserve.worker.convs.gcn_norm import LGConvAdapter

    return LGConvAdapter(conv)


def _dna(conv: nn.Module) -> ConvAdapter:
    from hopserve.worker.convs.gcn_norm import DNAConvAdapter

    return DNAConvAdapter(conv)


def _eg(conv: nn.Module) -> ConvAdapter:
    from hopserve.worker.convs.gcn_norm import EGConvAdapter

    return EGConvAdapter(conv)


def _pdn(conv: nn.Module) -> ConvAdapter:
    from hopserve.worker.convs.gcn_norm import PDNConvAdapter

    return PDNConvAdapter(conv)


def _gcn2(conv: nn.Module) -> ConvAdapter:
    from hopserve.worker.convs.gcn2 import GCN2Adapter

    return GCN2Adapter(conv)


def _fa(conv: nn.Module) -> ConvAdapter:
    from hopserve.worker.convs.gcn2 import FAAdapter

    return FAAdapter(conv)


def _points(*inputs: str, pair: bool = True):  # noqa: ANN202 - a factory of factories
    """Point-cloud convs: positions (and normals) as extra per-node inputs on source rows."""

    def factory(conv: nn.Module) -> ConvAdapter:
        from hopserve.worker.convs.message_passing import MessagePassingAdapter

        return MessagePassingAdapter(conv, pair=pair, fuse=False, node_inputs=inputs)

    return factory


def _antisymmetric(conv: nn.Module) -> ConvAdapter:
    from hopserve.worker.convs.antisymmetric import AntiSymmetricAdapter

    return AntiSymmetricAdapter(conv)


# name -> (status, adapter factory, note); a class missing from the installed PyG is skipped.
ROWS: dict[str, tuple[str, object, str]] = {
    # -- exact: 1-hop, per-destination statistics only
    "SAGEConv": ("exact", _pair, "mean/max/sum/lstm; fused SpMM for sum/mean"),
    "GraphConv": ("exact", _pair, "fused SpMM for sum/mean" + EDGE_DATA),
    "GINConv": ("exact", _pair, "fused SpMM for sum/mean"),
    "GATConv": (
        "exact",
        _gat,
        "multi-head; self-loops per destination; full layers project sources once per "
        "layer" + EDGE_DATA,
    ),
    "GATv2Conv": ("exact", _pair, "multi-head; self-loops per destination" + EDGE_DATA),
    "TransformerConv": ("exact", _pair, "multi-head attention over in-neighbours" + EDGE_DATA),
    "EdgeConv": ("exact", _pair, "max over in-neighbours of MLP(x_i, x_j - x_i)"),
    "ResGatedGraphConv": ("exact", _pair_unfused, "gated sum over in-neighbours" + EDGE_DATA),
    "LEConv": ("exact", _pair_unfused, "sum of a(x_j) - b(x_i) over in-neighbours" + EDGE_DATA),
    "GENConv": (
        "exact",
        _pair_unfused,
        "softmax/powermean aggregation over in-neighbours, then an MLP" + EDGE_DATA,
    ),
    "MFConv": (
        "exact",
        _pair_unfused,
        "weights per destination in-degree (a batch holds every in-edge of a destination)",
    ),
    "FeaStConv": ("exact", _pair_unfused, "soft-assignment attention, self-loops per destination"),
    "GeneralConv": (
        "exact",
        _pair_unfused,
        "sum/mean/attention over in-neighbours" + EDGE_DATA,
    ),
    "WLConvContinuous": (
        "exact",
        _pair_unfused,
        "mean of in-neighbours averaged with the node" + EDGE_DATA,
    ),
    "SimpleConv": (
        "exact",
        _simple,
        "parameter-free aggregation; self_loop on a square batch" + EDGE_DATA,
    ),
    "CGConv": ("exact", _pair_unfused, "gated sum over in-neighbours" + EDGE_DATA),
    "GINEConv": ("exact", _pair_unfused, "sum of MLP(x_j + lin(e_ij)) over in-edges" + EDGE_DATA),
    "NNConv": ("exact", _pair_unfused, "edge-conditioned weights per in-edge" + EDGE_DATA),
    "GMMConv": (
        "exact",
        _pair_unfused,
        "Gaussian kernels of each in-edge's pseudo-coordinates" + EDGE_DATA,
    ),
    "FiLMConv": ("exact", _pair_unfused, "feature-wise modulation by the destination" + EDGE_TYPES),
    "PNAConv": (
        "exact",
        _square,
        "degree scalers read the destination's in-degree, which a batch holds in full; "
        "square batch (the conv takes one tensor)" + EDGE_DATA,
    ),
    "AGNNConv": ("exact", _square, "cosine attention with self-loops, square batch"),
    "ClusterGCNConv": (
        "exact",
        _square,
        "normalized by the destination's in-degree only; square batch",
    ),
    "SuperGATConv": ("exact", _square, "attention in eval mode, self-loops; square batch"),
    # -- adapted: a whole-graph statistic, or an inner conv through its own adapter
    "GCNConv": (
        "adapted",
        _gcn,
        "symmetric normalization from whole-graph degrees (weighted with edge_weight)",
    ),
    "LGConv": (
        "adapted",
        _lg,
        "symmetric normalization from whole-graph degrees (weighted with edge_weight)",
    ),
    "DNAConv": (
        "adapted",
        _dna,
        "attention over the layer history, symmetric normalization from whole-graph degrees",
    ),
    "EGConv": (
        "adapted",
        _eg,
        "symnorm from whole-graph degrees; other aggregators read destinations only",
    ),
    "PDNConv": (
        "adapted",
        _pdn,
        "weights from its mlp over every edge's features, then symmetric normalization from "
        "whole-graph weighted degrees",
    ),
    "AntiSymmetricConv": (
        "adapted",
        _antisymmetric,
        "num_iters=1: its inner conv phi runs through phi's own adapter",
    ),
    # -- refused: K hops inside one module
    "APPNP": ("refused", None, "propagates K hops inside one module"),
    "SGConv": ("refused", None, "propagates K hops inside one module (and needs global degrees)"),
    "SSGConv": ("refused", None, "propagates K hops inside one module"),
    "TAGConv": ("refused", None, "propagates K hops inside one module"),
    "ChebConv": ("refused", None, "K-hop Chebyshev filter with whole-graph Laplacian"),
    "ARMAConv": ("refused", None, "stacks of propagation inside one module"),
    "MixHopConv": ("refused", None, "mixes several powers of the adjacency"),
    "GatedGraphConv": ("refused", None, "num_layers steps of propagation inside one module"),
    "PANConv": ("refused", None, "sums adjacency powers up to filter_size inside one module"),
    # -- exact / adapted: a second per-node input the model computes (x_0, positions)
    "GCN2Conv": (
        "adapted",
        _gcn2,
        "symmetric normalization from whole-graph degrees; the initial representation x_0 "
        "read on the destination rows",
    ),
    "FAConv": (
        "adapted",
        _fa,
        "tanh attention per in-edge over whole-graph symmetric normalization (the raw edge "
        "weights with normalize=False); x_0 read on the destination rows",
    ),
    "PointNetConv": ("exact", _points("pos"), "max of MLP(x_j, pos_j - pos_i)" + POSITIONS),
    "PPFConv": (
        "exact",
        _points("pos", "normal"),
        "max of MLP(x_j, point pair features of pos and normal)"
        + POSITIONS.replace("positions are", "positions and normals are"),
    ),
    "PointTransformerConv": (
        "exact",
        _points("pos"),
        "attention over in-neighbours with position encodings" + POSITIONS,
    ),
    "PointGNNConv": (
        "exact",
        _points("pos", pair=False),
        "max of MLP(pos_j - pos_i + offset(x_i), x_j); square batch (one tensor)" + POSITIONS,
    ),
    # -- refused: edge data the engine does not adapt (yet)
    "SplineConv": (
        "refused",
        None,
        "runs the spline kernels of pyg-lib / torch-spline-conv, which hopserve does not "
        "install or test",
    ),
    "RGCNConv": (
        "exact",
        _rgcn,
        "per-relation mean/sum over in-neighbours, then every relation's weight in one GEMM"
        + EDGE_TYPES,
    ),
    "FastRGCNConv": (
        "exact",
        _rgcn,
        "per-edge relation weights (summed per relation first, as RGCNConv)" + EDGE_TYPES,
    ),
    "RGATConv": ("exact", _square, "relational attention per destination" + EDGE_TYPES),
    "HEATConv": (
        "exact",
        _square,
        "typed attention over all in-edges: node type ids from a typed store's node "
        "types, relation ids from its edge_type column, edge features from its edge columns",
    ),
    "SignedConv": ("refused", None, "needs two edge sets (positive and negative edges)"),
    # -- dict convs: served in dict models on typed stores (worker/hetero), not here
    "HGTConv": (
        "refused",
        None,
        DICT_MODEL.format(
            how="keys and values projected once per source row, the relation maps on the "
            "destination side"
        ),
    ),
    "HANConv": (
        "refused",
        None,
        "its semantic-level attention averages a score over every node of a type, so a "
        "node's output depends on all nodes; serve it outside hopserve",
    ),
    "HeteroConv": (
        "refused",
        None,
        DICT_MODEL.format(how="each relation conv on its relation's in-edges"),
    ),
    # -- refused: not a fixed in-neighbourhood
    "GravNetConv": ("refused", None, KNN),
    "DynamicEdgeConv": ("refused", None, KNN),
    "XConv": ("refused", None, KNN + " over positions"),
    "HypergraphConv": ("refused", None, "aggregates over hyperedges, not an edge list"),
    "DirGNNConv": (
        "refused",
        None,
        "aggregates out-neighbours too (the reversed edges); a batch holds in-edges only",
    ),
    "GPSConv": ("refused", None, "global attention over every node of the graph"),
    "WLConv": (
        "refused",
        None,
        "assigns colour ids in the order it first sees neighbourhoods (stateful hashing)",
    ),
    "MeshCNNConv": (
        "refused",
        None,
        "reads each node's four mesh neighbours in edge-list order (a, b, c, d); the store "
        "keeps in-edges by source",
    ),
    # -- refused: another library's kernel
    "CuGraphSAGEConv": ("refused", None, CUGRAPH.format(base="SAGEConv")),
    "CuGraphGATConv": ("refused", None, CUGRAPH.format(base="GATConv")),
    "CuGraphRGCNConv": (
        "refused",
        None,
        "runs on cugraph-ops' CUDA kernels (pylibcugraphops) and needs edge types",
    ),
    "FusedGATConv": (
        "refused",
        None,
        "runs dgNN's fused kernel on precomputed CSR/CSC inputs; serve GATConv instead",
    ),
}

EARLY = ("HGTConv", "HANConv", "HeteroConv")
"""Refused before tracing: they take per-type feature dicts, so tracing would fail first."""
