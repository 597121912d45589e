"""DGL rows of the support matrix: every conv of ``dgl.nn.pytorch``'s conv package, exact or why not.

The same three kinds of row as PyG's (:mod:`.pyg_support`): exact through
:class:`~.dgl_conv.DGLConvAdapter` (the conv's own forward on the batch's DGL block),
adapted (``GraphConv``'s whole-graph out-degrees, ``PNAConv``'s whole-graph node count),
refused with the reason. Rows are keyed by class name and loaded only once ``dgl`` is
imported (:func:`~.registry._load_dgl_builtins`).
"""

from __future__ import annotations

from torch import nn

from hopserve.worker.convs.base import ConvAdapter

EDGE_DATA = "; edge data from the graph store's edge columns"
HETERO = (
    "takes a heterograph and per-type dicts: served inside a dict model (forward(graph, "
    "x_dict)) on a typed store, on each batch's typed subgraph (docs/heterogeneous.md); "
    "not inside a homogeneous model"
)
CUGRAPH = (
    "runs on cugraph-ops' CUDA kernels (pylibcugraphops); serve the equivalent dgl.nn conv "
    "({base}) instead"
)
DENSE = "takes a dense adjacency matrix, not a graph"


def _block(conv: nn.Module) -> ConvAdapter:
    from hopserve.worker.convs.dgl_conv import DGLConvAdapter

    return DGLConvAdapter(conv)


def _block_pair(conv: nn.Module) -> ConvAdapter:
    """A block conv fed ``(x_src, x_dst)`` (it reads source and destination rows apart)."""
    from hopserve.worker.convs.dgl_conv import DGLConvAdapter

    return DGLConvAdapter(conv, pair=True)


def _relgraph(conv: nn.Module) -> ConvAdapter:
    from hopserve.worker.convs.rgcn import DGLRelGraphConvAdapter

    return DGLRelGraphConvAdapter(conv)


def _square(conv: nn.Module) -> ConvAdapter:
    from hopserve.worker.convs.dgl_square import DGLSquareAdapter

    return DGLSquareAdapter(conv)


def _gcn2(conv: nn.Module) -> ConvAdapter:
    from hopserve.worker.convs.dgl_gcn2 import DGLGCN2Adapter

    return DGLGCN2Adapter(conv)


def _egnn(conv: nn.Module) -> ConvAdapter:
    """``EGNNConv``: coordinates as a per-node input, ``(h, coordinates)`` node outputs."""
    from hopserve.worker.convs.dgl_square import DGLSquareAdapter

    return DGLSquareAdapter(conv, node_inputs=("coord_feat",), node_outputs=2)


def _graphconv(conv: nn.Module) -> ConvAdapter:
    from hopserve.worker.convs.dgl_graphconv import DGLGraphConvAdapter

    return DGLGraphConvAdapter(conv)


def _gat(conv: nn.Module) -> ConvAdapter:
    from hopserve.worker.convs.dgl_gat import DGLGATAdapter

    return DGLGATAdapter(conv)


def _hgt(conv: nn.Module) -> ConvAdapter:
    """``HGTConv`` as written: keys and values once per source row (``DGLHGTAdapter``); a
    subclass with its own forward runs that forward on the block."""
    import dgl.nn.pytorch as dglnn

    from hopserve.worker.convs.dgl_conv import DGLConvAdapter
    from hopserve.worker.convs.dgl_hgt import DGLHGTAdapter

    if type(conv).forward is dglnn.HGTConv.forward and type(conv).message is dglnn.HGTConv.message:
        return DGLHGTAdapter(conv)
    return DGLConvAdapter(conv)


def _pna(conv: nn.Module) -> ConvAdapter:
    from hopserve.worker.convs.dgl_pna import DGLPNAAdapter

    return DGLPNAAdapter(conv)


# name -> (status, adapter factory, note); a class missing from the installed DGL is skipped.
ROWS: dict[str, tuple[str, object, str]] = {
    # -- exact: the conv's own forward on the batch's block
    "HGTConv": (
        "exact",
        _hgt,
        "typed attention over all in-edges (forward(g, x, ntype, etype)): node type ids "
        "from a typed store's node types, relation ids from its edge types; keys and values "
        "once per source row, the relation maps on the destination side",
    ),
    "SAGEConv": (
        "exact",
        _block,
        "mean/gcn/pool; lstm in edge-id order (see README)" + EDGE_DATA,
    ),
    "GATConv": (
        "exact",
        _gat,
        "multi-head, residual; edge softmax over all in-edges" + EDGE_DATA,
    ),
    "GATv2Conv": ("exact", _block, "multi-head, residual; edge softmax over all in-edges"),
    "GINConv": ("exact", _block, "sum/max/mean, learnable eps, apply_func" + EDGE_DATA),
    "EdgeConv": ("exact", _block, "max over in-neighbours of theta(x_j - x_i) + phi(x_i)"),
    "DotGatConv": ("exact", _block, "dot-product attention over in-neighbours"),
    "AGNNConv": ("exact", _block, "cosine attention over in-neighbours"),
    # -- adapted: a whole-graph statistic
    "GraphConv": (
        "adapted",
        _graphconv,
        "norm both/left scale by whole-graph source out-degrees: computed once per graph"
        + EDGE_DATA,
    ),
    "PNAConv": (
        "adapted",
        _pna,
        "graph-size norm 1/sqrt(N) of the whole graph; degree scalers read the "
        "destination's in-degree" + EDGE_DATA,
    ),
    # -- refused: hops inside one module
    "APPNPConv": ("refused", None, "propagates k hops inside one module"),
    "SGConv": ("refused", None, "propagates k hops inside one module (and needs global degrees)"),
    "TAGConv": ("refused", None, "propagates k hops inside one module"),
    "ChebConv": ("refused", None, "K-hop Chebyshev filter with whole-graph Laplacian"),
    "TWIRLSConv": ("refused", None, "iterated propagation inside one module"),
    "TWIRLSUnfoldingAndAttention": ("refused", None, "iterated propagation inside one module"),
    "GatedGraphConv": (
        "refused",
        None,
        "n_steps of propagation inside one module, over edge types",
    ),
    "GroupRevRes": (
        "refused",
        None,
        "chains its inner conv over feature groups (one hop per group inside one module)",
    ),
    # -- refused: edge data, coordinates, relations
    "RelGraphConv": (
        "exact",
        _relgraph,
        "in-edges summed per relation, then every relation's weight in one GEMM (DGL "
        "multiplies a weight into each edge); relation ids (etypes) from the graph store's "
        "edge_type column",
    ),
    "GINEConv": ("exact", _block, "sum of relu(x_j + e_ij) over in-edges" + EDGE_DATA),
    "NNConv": ("exact", _block, "edge-conditioned weights per in-edge" + EDGE_DATA),
    "GMMConv": (
        "exact",
        _block,
        "Gaussian kernels of each in-edge's pseudo-coordinates" + EDGE_DATA,
    ),
    "EdgeGATConv": ("exact", _block, "attention with edge features over in-edges" + EDGE_DATA),
    "CFConv": ("exact", _block, "continuous filters from edge features, summed" + EDGE_DATA),
    "EGATConv": (
        "exact",
        _block_pair,
        "attention with edge features; its node output (its new edge features are per-edge: "
        "a model may not use them)" + EDGE_DATA,
    ),
    "GatedGCNConv": (
        "exact",
        _square,
        "gated sum over in-edges on the batch's square graph (it reads graph.ndata); its "
        "node output" + EDGE_DATA,
    ),
    "AtomicConv": (
        "exact",
        _square,
        "radial pooling of each in-edge's distance (edge features of width 1), summed; "
        "square batch graph (it reads graph.ndata)" + EDGE_DATA,
    ),
    "EGNNConv": (
        "exact",
        _egnn,
        "messages from both ends and their coordinates' distance, summed; coordinates "
        "(coord_feat, a per-node input the model computes) averaged over in-edges; square "
        "batch graph (it reads graph.ndata)" + EDGE_DATA,
    ),
    "GCN2Conv": (
        "adapted",
        _gcn2,
        "in-degree normalization from whole-graph degrees (with edge_weight, "
        "EdgeWeightNorm's weighted out-degrees from the whole graph); the initial "
        "representation feat_0 read on the destination rows",
    ),
    "EdgeWeightNorm": (
        "refused",
        None,
        "normalizes edge weights by whole-graph degrees and returns per-edge values (not a "
        "conv on node features)",
    ),
    "DGNConv": (
        "refused",
        None,
        "needs the graph Laplacian's eigenvectors (eig_vec), a whole-graph input",
    ),
    # -- refused: not a message-passing graph input
    "DenseChebConv": ("refused", None, DENSE),
    "DenseGraphConv": ("refused", None, DENSE),
    "DenseSAGEConv": ("refused", None, DENSE),
    "HeteroGraphConv": ("refused", None, HETERO),
    # -- refused: another library's kernel
    "CuGraphGATConv": ("refused", None, CUGRAPH.format(base="GATConv")),
    "CuGraphSAGEConv": ("refused", None, CUGRAPH.format(base="SAGEConv")),
    "CuGraphRelGraphConv": (
        "refused",
        None,
        "runs on cugraph-ops' CUDA kernels (pylibcugraphops) and needs edge types",
    ),
}

EARLY = ("HeteroGraphConv",)
"""Refused before tracing: they take per-type feature dicts, so tracing would fail first."""
