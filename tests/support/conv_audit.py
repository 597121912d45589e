"""The conv coverage audit: every conv PyG and DGL export is exact or refused with a reason.

For every class of ``torch_geometric.nn.conv.__all__`` and every ``nn.Module`` class of
``dgl.nn.pytorch.conv``, :data:`PYG_CASES` / :data:`DGL_CASES` say how to build it with
typical arguments (a class without a row is reported by :func:`missing_cases`, so a new
PyG or DGL release is noticed). Two such convs are wrapped in a small model, loaded the
way the engine loads a model (``make_evaluator(..., fallback="error")``, self-check on)
and, unless refused, evaluated on a small random graph for all nodes (full) and for a
target subset (partial), both compared with the model's own full-graph forward
(:func:`support.assert_exact`). Outcomes (:class:`Row`):

* ``exact`` / ``adapted`` — both evaluations equal the forward (``adapted``: through a
  dedicated adapter that supplies a whole-graph statistic); the reason column says how;
* ``refused`` — the load raised the engine's refusal (``ModelTraceError``) from the
  support matrix (an ``UnsupportedConvError``), with its short reason;
* ``crash`` / ``wrong`` — anything else: another exception, a refusal that wraps a crash
  (a probe-graph failure), a refusal by the load's self-check (the matrix let through a
  conv that is not exact), or a result that differs. The audit tests fail on these.

``bench/support_matrix.py`` renders the rows into ``docs/support_matrix.md``
(:func:`render_section`); the audit tests check the committed file is up to date.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from support import assert_exact, random_edge_index

D_IN, HIDDEN, D_OUT = 6, 8, 4
D_EDGE = 3  # edge feature width of the audit graph
RELATIONS = 3  # relations of the audit graph's typed edges (edge_type)
NODE_TYPES = 2  # node types of the audit graph when a conv takes node type ids
NODE_TYPED = "node types"  # Case.edge of a conv taking node type and relation ids
NUM_NODES, NUM_EDGES = 24, 60
TARGETS = (NUM_NODES - 1, 0, 5, 5, 11)  # the isolated last node and a duplicate
BATCH_NODES = 4
NODEWISE_NODES = 400  # the node-wise column's graph (see nodewise_graph)

Builder = Callable[[type, int, int], nn.Module]  # (class, in width, out width) -> conv


@dataclass(frozen=True)
class Case:
    """How to build one conv class for the audit.

    Attributes:
        build: ``(cls, d_in, d_out) -> conv``.
        variant: shown after the class name when a class has several cases.
        same_width: the conv keeps its input width (``d_out`` is ignored): the model
            projects the features to ``HIDDEN`` first.
        history: the conv reads the stack of earlier layers' outputs ``[N, L, C]``
            (``DNAConv``).
        edge: the conv's parameter taking edge data (``"edge_weight"``: the graph's edge
            weights; ``"edge_type"`` / ``"etypes"``: its relation ids, ``RELATIONS``
            relations; any other name, e.g. ``"edge_attr"``: its ``[E, edge_dim]`` edge
            features), passed by a model whose ``forward`` takes ``edge_weight`` /
            ``edge_type`` / ``edge_attr`` (DGL: ``efeat``); :data:`NODE_TYPED`: node
            type ids and relation ids on a typed audit graph of ``NODE_TYPES`` types
            (DGL ``forward(g, x, ntype, etype)``; PyG ``forward(x, edge_index,
            node_type, edge_type, edge_attr)``, with edge features); ``""``: none.
    """

    build: Builder
    variant: str = ""
    same_width: bool = False
    history: bool = False
    edge: str = ""
    edge_dim: int = 3  # width of the edge features when ``edge`` takes them
    first_output: bool = False  # the conv returns a tuple: the model uses its node rows [0]
    # A second per-node input the model computes: "x_0" (the initial representation, GCNII),
    # "pos" (positions: the first 3 feature columns), "pos+normal" (and normals, the next 3).
    node_input: str = ""


@dataclass(frozen=True)
class Row:
    """One audited conv: ``status`` in exact / adapted / refused / crash / wrong."""

    library: str  # "pyg" | "dgl"
    conv: str  # class name
    variant: str  # the case's variant ("" for a class's typical case)
    status: str
    reason: str
    nodewise: str = ""  # refused rows: what the node-wise fallback does with the model

    @property
    def label(self) -> str:
        return f"{self.conv} ({self.variant})" if self.variant else self.conv


def _mlp(a: int, b: int) -> nn.Module:
    return nn.Sequential(nn.Linear(a, b), nn.ReLU(), nn.Linear(b, b))


def _heads(o: int) -> int:
    """Per-head width of a 2-head conv whose concatenated heads are ``o`` wide."""
    return max(1, o // 2)


def _c(**kw: Any) -> Builder:
    """``cls(d_in, d_out, **kw)``."""
    return lambda cls, i, o: cls(i, o, **kw)


def _same(**kw: Any) -> Builder:
    """``cls(**kw)`` for width-keeping convs without channel arguments."""
    return lambda cls, i, o: cls(**kw)


_META = (["a"], [("a", "to", "a")])  # a one-type heterogeneous schema

PYG_CASES: dict[str, tuple[Case, ...]] = {
    "MessagePassing": (Case(_same(aggr="add"), same_width=True),),  # the bare base class
    "SimpleConv": (
        Case(_same(aggr="mean", combine_root="sum"), same_width=True),
        Case(_same(aggr="sum", combine_root="self_loop"), "self_loop", same_width=True),
    ),
    "GCNConv": (Case(_c()), Case(_c(), "edge_weight", edge="edge_weight")),
    "ChebConv": (Case(_c(K=2)),),
    "SAGEConv": (Case(_c()), Case(_c(aggr="max"), "max")),
    "CuGraphSAGEConv": (Case(_c()),),
    "GraphConv": (Case(_c()), Case(_c(), "edge_weight", edge="edge_weight")),
    "GravNetConv": (Case(_c(space_dimensions=2, propagate_dimensions=2, k=3)),),
    "GatedGraphConv": (Case(lambda cls, i, o: cls(i, num_layers=2), same_width=True),),
    "ResGatedGraphConv": (
        Case(_c()),
        Case(_c(edge_dim=D_EDGE), "edge_dim=3", edge="edge_attr"),
    ),
    "GATConv": (
        Case(lambda cls, i, o: cls(i, _heads(o), heads=2)),
        Case(
            lambda cls, i, o: cls(i, _heads(o), heads=2, edge_dim=D_EDGE),
            "edge_dim=3",
            edge="edge_attr",
        ),
    ),  # fmt: skip
    "CuGraphGATConv": (Case(lambda cls, i, o: cls(i, _heads(o), heads=2)),),
    "FusedGATConv": (Case(lambda cls, i, o: cls(i, _heads(o), heads=2, add_self_loops=False)),),
    "GATv2Conv": (
        Case(lambda cls, i, o: cls(i, _heads(o), heads=2)),
        Case(
            lambda cls, i, o: cls(i, _heads(o), heads=2, edge_dim=D_EDGE),
            "edge_dim=3",
            edge="edge_attr",
        ),
    ),  # fmt: skip
    "TransformerConv": (
        Case(lambda cls, i, o: cls(i, _heads(o), heads=2)),
        Case(
            lambda cls, i, o: cls(i, _heads(o), heads=2, edge_dim=D_EDGE),
            "edge_dim=3",
            edge="edge_attr",
        ),
    ),  # fmt: skip
    "AGNNConv": (Case(_same(), same_width=True),),
    "TAGConv": (Case(_c(K=2)),),
    "GINConv": (Case(lambda cls, i, o: cls(_mlp(i, o), train_eps=True)),),
    "GINEConv": (Case(lambda cls, i, o: cls(_mlp(i, o), edge_dim=D_EDGE), edge="edge_attr"),),
    "ARMAConv": (Case(_c()),),
    "SGConv": (Case(_c(K=2)),),
    "SSGConv": (Case(_c(alpha=0.1, K=2)),),
    "APPNP": (Case(_same(K=2, alpha=0.1), same_width=True),),
    "MFConv": (Case(_c(max_degree=4)),),
    "RGCNConv": (
        Case(_c(num_relations=RELATIONS), edge="edge_type"),
        Case(_c(num_relations=RELATIONS, num_bases=2, aggr="add"), "bases, sum", edge="edge_type"),
        Case(_c(num_relations=RELATIONS, num_blocks=2), "blocks", edge="edge_type"),
    ),
    "FastRGCNConv": (Case(_c(num_relations=RELATIONS), edge="edge_type"),),
    "CuGraphRGCNConv": (Case(_c(num_relations=RELATIONS), edge="edge_type"),),
    "RGATConv": (
        Case(_c(num_relations=RELATIONS), edge="edge_type"),
        Case(
            _c(num_relations=RELATIONS, attention_mechanism="within-relation"),
            "within-relation",
            edge="edge_type",
        ),
        # not mod="scaled": PyG 2.8's reset_parameters leaves its l2 uninitialized
        # (torch.full's result is dropped), so its own forward is garbage, NaN at times
    ),
    "SignedConv": (Case(_c(first_aggr=True)),),
    "DNAConv": (Case(lambda cls, i, o: cls(i, heads=2), same_width=True, history=True),),
    "PointNetConv": (Case(lambda cls, i, o: cls(local_nn=nn.Linear(i + 3, o)), node_input="pos"),),
    "GMMConv": (Case(_c(dim=D_EDGE, kernel_size=3), edge="edge_attr"),),
    "SplineConv": (Case(_c(dim=2, kernel_size=3)),),
    "NNConv": (Case(lambda cls, i, o: cls(i, o, nn=nn.Linear(D_EDGE, i * o)), edge="edge_attr"),),
    "CGConv": (
        Case(lambda cls, i, o: cls(i), same_width=True),
        Case(lambda cls, i, o: cls(i, dim=D_EDGE), "dim=3", same_width=True, edge="edge_attr"),
    ),
    "EdgeConv": (Case(lambda cls, i, o: cls(_mlp(2 * i, o), aggr="max")),),
    "DynamicEdgeConv": (Case(lambda cls, i, o: cls(_mlp(2 * i, o), k=3)),),
    "XConv": (Case(_c(dim=3, kernel_size=4)),),
    "PPFConv": (
        Case(lambda cls, i, o: cls(local_nn=nn.Linear(i + 4, o)), node_input="pos+normal"),
    ),
    "FeaStConv": (Case(_c(heads=2)),),
    "PointTransformerConv": (Case(_c(), node_input="pos"),),
    "HypergraphConv": (Case(_c()),),
    "LEConv": (Case(_c()), Case(_c(), "edge_weight", edge="edge_weight")),
    "PNAConv": (
        Case(
            _c(
                aggregators=["mean", "min", "max", "std"],
                scalers=["identity", "amplification", "attenuation", "linear"],
                deg=torch.tensor([1, 4, 6, 3, 2]),
            )
        ),
        Case(
            _c(
                aggregators=["mean", "max"],
                scalers=["identity", "amplification"],
                deg=torch.tensor([1, 4, 6, 3, 2]),
                edge_dim=D_EDGE,
            ),
            "edge_dim=3",
            edge="edge_attr",
        ),
    ),
    "ClusterGCNConv": (Case(_c(diag_lambda=0.5)),),
    "GENConv": (
        Case(_c()),
        Case(_c(aggr="powermean", learn_p=True), "powermean"),
        Case(_c(edge_dim=D_EDGE), "edge_dim=3", edge="edge_attr"),
    ),
    "GCN2Conv": (
        Case(lambda cls, i, o: cls(i, alpha=0.1), same_width=True, node_input="x_0"),
        Case(
            lambda cls, i, o: cls(i, alpha=0.1, theta=0.5, layer=2, shared_weights=False),
            "theta, two weights",
            same_width=True,
            node_input="x_0",
        ),
        Case(
            lambda cls, i, o: cls(i, alpha=0.2),
            "edge_weight",
            same_width=True,
            node_input="x_0",
            edge="edge_weight",
        ),
    ),
    "PANConv": (Case(_c(filter_size=2)),),
    "WLConv": (Case(_same(), same_width=True),),
    "WLConvContinuous": (Case(_same(), same_width=True),),
    "FiLMConv": (
        Case(_c()),
        Case(_c(num_relations=RELATIONS), f"num_relations={RELATIONS}", edge="edge_type"),
    ),
    "SuperGATConv": (Case(lambda cls, i, o: cls(i, _heads(o), heads=2)),),
    "FAConv": (
        Case(lambda cls, i, o: cls(i), same_width=True, node_input="x_0"),
        Case(
            lambda cls, i, o: cls(i, eps=0.3, normalize=False),
            "normalize=False, edge_weight",
            same_width=True,
            node_input="x_0",
            edge="edge_weight",
        ),
    ),
    "EGConv": (
        Case(_c(num_heads=2, num_bases=2)),
        Case(
            _c(aggregators=["sum", "mean", "max"], num_heads=2, num_bases=2, add_self_loops=False),
            "sum/mean/max, no self-loops",
        ),
    ),
    "PDNConv": (Case(_c(edge_dim=D_EDGE, hidden_channels=4), edge="edge_attr"),),
    "GeneralConv": (
        Case(_c()),
        Case(_c(attention=True, heads=2), "attention"),
        Case(_c(in_edge_channels=D_EDGE), "in_edge_channels=3", edge="edge_attr"),
    ),
    "HGTConv": (Case(lambda cls, i, o: cls(i, o, metadata=_META, heads=2)),),
    "HEATConv": (
        Case(
            _c(
                num_node_types=NODE_TYPES,
                num_edge_types=RELATIONS,
                edge_type_emb_dim=2,
                edge_dim=2,
                edge_attr_emb_dim=2,
            ),
            edge=NODE_TYPED,
            edge_dim=2,
        ),
    ),
    "HeteroConv": (Case(lambda cls, i, o: cls({("a", "to", "a"): _pyg("SAGEConv")(i, o)})),),
    "HANConv": (Case(lambda cls, i, o: cls(i, o, metadata=_META, heads=2)),),
    "LGConv": (
        Case(_same(), same_width=True),
        Case(_same(), "edge_weight", same_width=True, edge="edge_weight"),
    ),
    "PointGNNConv": (
        Case(
            lambda cls, i, o: cls(mlp_h=_mlp(i, 3), mlp_f=_mlp(i + 3, i), mlp_g=_mlp(i, i)),
            same_width=True,
            node_input="pos",
        ),
    ),
    "GPSConv": (
        Case(lambda cls, i, o: cls(i, _pyg("GINConv")(_mlp(i, i)), heads=2), same_width=True),
    ),
    "AntiSymmetricConv": (
        Case(lambda cls, i, o: cls(i), same_width=True),
        Case(lambda cls, i, o: cls(i, num_iters=2), "num_iters=2", same_width=True),
    ),
    "DirGNNConv": (Case(lambda cls, i, o: cls(_pyg("SAGEConv")(i, o))),),
    # one block of o / 2 columns per power, so the second conv reads the first's width
    "MixHopConv": (Case(lambda cls, i, o: cls(i, o // 2, powers=[1, 2])),),
    "MeshCNNConv": (Case(_c()),),
}


def _pyg(name: str) -> type:
    return getattr(importlib.import_module("torch_geometric.nn.conv"), name)


def _dgl(name: str) -> type:
    return getattr(importlib.import_module("dgl.nn.pytorch"), name)


def _dgl_pna(dir_aggr: bool) -> Builder:
    aggrs = ["dir1-av", "mean", "max"] if dir_aggr else ["mean", "max", "std"]
    return _c(aggregators=aggrs, scalers=["identity", "amplification"], delta=1.5)


DGL_CASES: dict[str, tuple[Case, ...]] = {
    "AGNNConv": (Case(_same(), same_width=True),),
    "APPNPConv": (Case(_same(k=2, alpha=0.1), same_width=True),),
    "AtomicConv": (
        Case(
            lambda cls, i, o: cls(
                interaction_cutoffs=torch.tensor([1.0, 2.0]),
                rbf_kernel_means=torch.tensor([0.0, 1.0]),
                rbf_kernel_scaling=torch.tensor([1.0, 1.0]),
            ),
            same_width=True,
            edge="distances",
            edge_dim=1,
        ),
    ),
    "CFConv": (Case(lambda cls, i, o: cls(i, 3, 8, o), edge="edge_feats"),),
    "ChebConv": (Case(_c(k=2)),),
    "CuGraphGATConv": (Case(lambda cls, i, o: cls(i, _heads(o), num_heads=2)),),
    "CuGraphRelGraphConv": (Case(_c(num_rels=RELATIONS), edge="etypes"),),
    "CuGraphSAGEConv": (Case(_c()),),
    "DenseChebConv": (Case(_c(k=2)),),
    "DenseGraphConv": (Case(_c()),),
    "DenseSAGEConv": (Case(_c()),),
    "DGNConv": (Case(_dgl_pna(True)),),
    "DotGatConv": (Case(lambda cls, i, o: cls(i, _heads(o), num_heads=2)),),
    "EdgeConv": (Case(_c()),),
    "EdgeGATConv": (Case(lambda cls, i, o: cls(i, 3, _heads(o), num_heads=2), edge="edge_feat"),),
    "EGATConv": (
        Case(
            lambda cls, i, o: cls(i, 3, _heads(o), 3, num_heads=2),
            edge="efeats",
            first_output=True,
        ),
    ),
    "EGNNConv": (
        Case(lambda cls, i, o: cls(i, 8, o), node_input="pos"),
        Case(
            lambda cls, i, o: cls(i, 8, o, edge_feat_size=D_EDGE),
            "edge_feat_size=3",
            node_input="pos",
            edge="edge_feat",
        ),
    ),
    "GATConv": (
        Case(lambda cls, i, o: cls(i, _heads(o), num_heads=2)),
        Case(lambda cls, i, o: cls(i, _heads(o), num_heads=2), "edge_weight", edge="edge_weight"),
    ),
    "GatedGCNConv": (Case(lambda cls, i, o: cls(i, 3, o), edge="edge_feat", first_output=True),),
    "GatedGraphConv": (Case(lambda cls, i, o: cls(i, i, n_steps=2, n_etypes=1), same_width=True),),
    "GATv2Conv": (Case(lambda cls, i, o: cls(i, _heads(o), num_heads=2)),),
    "GCN2Conv": (
        Case(lambda cls, i, o: cls(i, layer=1), same_width=True, node_input="x_0"),
        Case(
            lambda cls, i, o: cls(i, layer=2, lambda_=0.5, project_initial_features=False),
            "two weights",
            same_width=True,
            node_input="x_0",
        ),
        Case(
            lambda cls, i, o: cls(i, layer=1),
            "edge_weight",
            same_width=True,
            node_input="x_0",
            edge="edge_weight",
        ),
    ),
    "GINConv": (Case(lambda cls, i, o: cls(_mlp(i, o), "sum", learn_eps=True)),),
    "GINEConv": (
        Case(lambda cls, i, o: cls(_mlp(i, i)), same_width=True, edge="edge_feat", edge_dim=8),
    ),
    "GMMConv": (Case(_c(dim=3, n_kernels=3), edge="pseudo"),),
    "EdgeWeightNorm": (Case(_same(), same_width=True),),
    "GraphConv": (
        Case(_c()),
        Case(_c(), "edge_weight", edge="edge_weight"),
        Case(_c(norm="left"), "norm=left, edge_weight", edge="edge_weight"),
    ),
    "GroupRevRes": (
        Case(lambda cls, i, o: cls(_dgl("GraphConv")(i // 2, i // 2), groups=2), same_width=True),
    ),
    "HGTConv": (
        Case(
            lambda cls, i, o: cls(i, _heads(o), 2, num_ntypes=NODE_TYPES, num_etypes=RELATIONS),
            edge=NODE_TYPED,
        ),
    ),
    "NNConv": (Case(lambda cls, i, o: cls(i, o, nn.Linear(3, i * o)), edge="efeat"),),
    "PNAConv": (
        Case(_dgl_pna(False)),
        Case(
            _c(aggregators=["mean", "max"], scalers=["identity"], delta=1.5, edge_feat_size=3),
            "edge_feat_size=3",
            edge="edge_feat",
        ),
    ),
    "RelGraphConv": (
        Case(_c(num_rels=RELATIONS), edge="etypes"),
        Case(
            _c(num_rels=RELATIONS, regularizer="basis", num_bases=2, self_loop=False),
            "basis",
            edge="etypes",
        ),
        Case(_c(num_rels=RELATIONS, regularizer="bdd", num_bases=2), "bdd", edge="etypes"),
    ),
    "SAGEConv": (Case(_c(aggregator_type="mean")), Case(_c(aggregator_type="pool"), "pool")),
    "SGConv": (Case(_c(k=2)),),
    "TAGConv": (Case(_c(k=2)),),
    "TWIRLSConv": (Case(lambda cls, i, o: cls(i, o, 8, prop_step=2)),),
    "TWIRLSUnfoldingAndAttention": (
        Case(lambda cls, i, o: cls(i, alp=1.0, lam=1.0, prop_step=2), same_width=True),
    ),
}


# ------------------------------------------------------------------------------ classes
def pyg_classes() -> dict[str, type]:
    """Every class ``torch_geometric.nn.conv`` exports (its ``__all__``)."""
    conv = importlib.import_module("torch_geometric.nn.conv")
    return {name: getattr(conv, name) for name in conv.__all__}


def dgl_classes() -> dict[str, type]:
    """Every ``nn.Module`` class ``dgl.nn.pytorch.conv`` exposes."""
    conv = importlib.import_module("dgl.nn.pytorch.conv")
    return {
        name: obj
        for name, obj in vars(conv).items()
        if inspect.isclass(obj) and issubclass(obj, nn.Module)
    }


CLASSES = {"pyg": pyg_classes, "dgl": dgl_classes}
CASES = {"pyg": PYG_CASES, "dgl": DGL_CASES}


def missing_cases(library: str) -> list[str]:
    """Classes the library exports that the audit has no constructor arguments for."""
    return sorted(set(CLASSES[library]()) - set(CASES[library]))


def library_version(library: str) -> str:
    module = importlib.import_module("torch_geometric" if library == "pyg" else "dgl")
    return str(module.__version__)


# ------------------------------------------------------------------------------- models
class PyGTwoConvs(nn.Module):
    """``conv2(relu(conv1(inp(x))))``, PyG style."""

    def __init__(self, conv1: nn.Module, conv2: nn.Module, inp: nn.Module) -> None:
        super().__init__()
        self.inp, self.conv1, self.conv2 = inp, conv1, conv2

    def forward(self, x, edge_index):
        h = self.conv1(self.inp(x), edge_index).relu()
        return self.conv2(h, edge_index)


class PyGWeightedTwoConvs(nn.Module):
    """``conv2(relu(conv1(inp(x), w)), w)`` with the graph's edge weights, PyG style."""

    def __init__(self, conv1: nn.Module, conv2: nn.Module, inp: nn.Module, param: str) -> None:
        super().__init__()
        self.inp, self.conv1, self.conv2, self.param = inp, conv1, conv2, param

    def forward(self, x, edge_index, edge_weight):
        h = self.conv1(self.inp(x), edge_index, **{self.param: edge_weight}).flatten(1).relu()
        return self.conv2(h, edge_index, **{self.param: edge_weight}).flatten(1)


class PyGEdgeAttrTwoConvs(nn.Module):
    """``conv2(relu(conv1(inp(x), e)), e)`` with the graph's edge features, PyG style."""

    def __init__(self, conv1: nn.Module, conv2: nn.Module, inp: nn.Module, param: str) -> None:
        super().__init__()
        self.inp, self.conv1, self.conv2, self.param = inp, conv1, conv2, param

    def forward(self, x, edge_index, edge_attr):
        h = self.conv1(self.inp(x), edge_index, **{self.param: edge_attr}).flatten(1).relu()
        return self.conv2(h, edge_index, **{self.param: edge_attr}).flatten(1)


class PyGTypedTwoConvs(nn.Module):
    """``conv2(relu(conv1(inp(x), t)), t)`` with the graph's relation ids, PyG style."""

    def __init__(self, conv1: nn.Module, conv2: nn.Module, inp: nn.Module, param: str) -> None:
        super().__init__()
        self.inp, self.conv1, self.conv2, self.param = inp, conv1, conv2, param

    def forward(self, x, edge_index, edge_type):
        h = self.conv1(self.inp(x), edge_index, **{self.param: edge_type}).flatten(1).relu()
        return self.conv2(h, edge_index, **{self.param: edge_type}).flatten(1)


class DGLTypedTwoConvs(nn.Module):
    """``conv2(g, relu(conv1(g, inp(x), t)), t)`` with the graph's relation ids, DGL style."""

    def __init__(self, conv1: nn.Module, conv2: nn.Module, inp: nn.Module, param: str) -> None:
        super().__init__()
        self.inp, self.conv1, self.conv2, self.param = inp, conv1, conv2, param

    def forward(self, g, x, etype):
        h = self.conv1(g, self.inp(x), **{self.param: etype}).flatten(1).relu()
        return self.conv2(g, h, **{self.param: etype}).flatten(1)


class DGLNodeTypedTwoConvs(nn.Module):
    """``conv2(g, relu(conv1(g, inp(x), nt, et)), nt, et)`` over node type and relation
    ids, DGL style (DGL's HGT example)."""

    def __init__(self, conv1: nn.Module, conv2: nn.Module, inp: nn.Module) -> None:
        super().__init__()
        self.inp, self.conv1, self.conv2 = inp, conv1, conv2

    def forward(self, g, x, ntype, etype):
        h = self.conv1(g, self.inp(x), ntype, etype).flatten(1).relu()
        return self.conv2(g, h, ntype, etype).flatten(1)


class PyGNodeTypedTwoConvs(nn.Module):
    """``conv2(relu(conv1(inp(x), …)), …)`` over node type ids, relation ids and edge
    features, PyG style (``HEATConv``)."""

    def __init__(self, conv1: nn.Module, conv2: nn.Module, inp: nn.Module) -> None:
        super().__init__()
        self.inp, self.conv1, self.conv2 = inp, conv1, conv2

    def forward(self, x, edge_index, node_type, edge_type, edge_attr):
        h = self.conv1(self.inp(x), edge_index, node_type, edge_type, edge_attr).relu()
        return self.conv2(h, edge_index, node_type, edge_type, edge_attr)


class PyGInitialResidual(nn.Module):
    """``x_0 = relu(inp(x))``, then ``conv2(relu(conv1(x_0, x_0)), x_0)``: every conv reads
    the initial representation too (GCNII's and FAGCN's use)."""

    def __init__(self, conv1: nn.Module, conv2: nn.Module, inp: nn.Module) -> None:
        super().__init__()
        self.inp, self.conv1, self.conv2 = inp, conv1, conv2

    def forward(self, x, edge_index):
        x_0 = self.inp(x).relu()
        h = self.conv1(x_0, x_0, edge_index).relu()
        return self.conv2(h, x_0, edge_index)


class PyGWeightedInitialResidual(PyGInitialResidual):
    """:class:`PyGInitialResidual` with the graph's edge weights."""

    def forward(self, x, edge_index, edge_weight):
        x_0 = self.inp(x).relu()
        h = self.conv1(x_0, x_0, edge_index, edge_weight).relu()
        return self.conv2(h, x_0, edge_index, edge_weight)


class PyGPositions(nn.Module):
    """Point-cloud convs: positions are the features' first 3 columns, normals (when the
    conv takes them) the next 3, normalized: ``conv(h, pos[, normal], edge_index)``."""

    def __init__(self, conv1: nn.Module, conv2: nn.Module, inp: nn.Module, normals: bool) -> None:
        super().__init__()
        self.inp, self.conv1, self.conv2, self.normals = inp, conv1, conv2, normals

    def forward(self, x, edge_index):
        pos = x[:, :3]
        if self.normals:
            normal = torch.nn.functional.normalize(x[:, 3:6], dim=-1)
            h = self.conv1(self.inp(x), pos, normal, edge_index).relu()
            return self.conv2(h, pos, normal, edge_index)
        h = self.conv1(self.inp(x), pos, edge_index).relu()
        return self.conv2(h, pos, edge_index)


class PyGHistory(nn.Module):
    """Convs reading the stack of earlier representations ``[N, L, C]`` (DNAConv's use)."""

    def __init__(self, conv1: nn.Module, conv2: nn.Module, inp: nn.Module) -> None:
        super().__init__()
        self.inp, self.conv1, self.conv2 = inp, conv1, conv2

    def forward(self, x, edge_index):
        hist = self.inp(x).relu().unsqueeze(1)
        h = self.conv1(hist, edge_index).relu()
        hist = torch.cat([hist, h.unsqueeze(1)], dim=1)
        return self.conv2(hist, edge_index)


class DGLWeightedTwoConvs(nn.Module):
    """``conv2(g, relu(conv1(g, inp(x), w)), w)`` with the graph's edge weights, DGL style."""

    def __init__(self, conv1: nn.Module, conv2: nn.Module, inp: nn.Module, param: str) -> None:
        super().__init__()
        self.inp, self.conv1, self.conv2, self.param = inp, conv1, conv2, param

    def forward(self, g, x, edge_weight):
        h = self.conv1(g, self.inp(x), **{self.param: edge_weight}).flatten(1).relu()
        return self.conv2(g, h, **{self.param: edge_weight}).flatten(1)


class DGLEdgeFeatTwoConvs(nn.Module):
    """``conv2(g, relu(conv1(g, inp(x), e)), e)`` with the graph's edge features, DGL style;
    ``first``: the convs return ``(node rows, edge rows)`` and the model uses the first."""

    def __init__(
        self, conv1: nn.Module, conv2: nn.Module, inp: nn.Module, param: str, first: bool = False
    ) -> None:
        super().__init__()
        self.inp, self.conv1, self.conv2, self.param = inp, conv1, conv2, param
        self.first = first

    def _rows(self, out):
        return (out[0] if self.first else out).flatten(1)

    def forward(self, g, x, efeat):
        h = self._rows(self.conv1(g, self.inp(x), **{self.param: efeat})).relu()
        return self._rows(self.conv2(g, h, **{self.param: efeat}))


class DGLTwoConvs(nn.Module):
    """``conv2(g, relu(conv1(g, inp(x))))``, DGL style; heads are flattened."""

    def __init__(self, conv1: nn.Module, conv2: nn.Module, inp: nn.Module) -> None:
        super().__init__()
        self.inp, self.conv1, self.conv2 = inp, conv1, conv2

    def forward(self, g, x):
        h = self.conv1(g, self.inp(x)).flatten(1).relu()
        return self.conv2(g, h).flatten(1)


class DGLInitialResidual(nn.Module):
    """:class:`PyGInitialResidual`, DGL style: ``conv(g, h, x_0)``."""

    def __init__(self, conv1: nn.Module, conv2: nn.Module, inp: nn.Module) -> None:
        super().__init__()
        self.inp, self.conv1, self.conv2 = inp, conv1, conv2

    def forward(self, g, x):
        x_0 = self.inp(x).relu()
        h = self.conv1(g, x_0, x_0).relu()
        return self.conv2(g, h, x_0)


class DGLWeightedInitialResidual(DGLInitialResidual):
    """:class:`DGLInitialResidual` with the graph's edge weights."""

    def forward(self, g, x, edge_weight):
        x_0 = self.inp(x).relu()
        h = self.conv1(g, x_0, x_0, edge_weight).relu()
        return self.conv2(g, h, x_0, edge_weight)


class DGLPositions(nn.Module):
    """Coordinates are the features' first 3 columns: ``conv(g, h, pos)[0]`` (EGNN's node
    rows; its updated coordinates are not used here)."""

    def __init__(self, conv1: nn.Module, conv2: nn.Module, inp: nn.Module) -> None:
        super().__init__()
        self.inp, self.conv1, self.conv2 = inp, conv1, conv2

    def forward(self, g, x):
        pos = x[:, :3]
        h = self.conv1(g, self.inp(x), pos)[0].relu()
        return self.conv2(g, h, pos)[0]


class DGLEdgeFeatPositions(DGLPositions):
    """:class:`DGLPositions` with the graph's edge features."""

    def forward(self, g, x, efeat):
        pos = x[:, :3]
        h = self.conv1(g, self.inp(x), pos, efeat)[0].relu()
        return self.conv2(g, h, pos, efeat)[0]


def build_model(library: str, cls: type, case: Case, seed: int = 0) -> nn.Module:
    """Two convs of ``case`` in the library's model, seeded, in eval mode."""
    torch.manual_seed(seed)
    if case.same_width:
        inp, d1, d2, d3 = nn.Linear(D_IN, HIDDEN), HIDDEN, HIDDEN, HIDDEN
    else:
        inp, d1, d2, d3 = nn.Identity(), D_IN, HIDDEN, D_OUT
    conv1, conv2 = case.build(cls, d1, d2), case.build(cls, d2, d3)
    if case.node_input == "x_0":
        weighted = case.edge == "edge_weight"
        if library == "dgl":
            residual = DGLWeightedInitialResidual if weighted else DGLInitialResidual
        else:
            residual = PyGWeightedInitialResidual if weighted else PyGInitialResidual
        return residual(conv1, conv2, inp).eval()
    if case.node_input and library == "dgl":
        positions = DGLEdgeFeatPositions if case.edge else DGLPositions
        return positions(conv1, conv2, inp).eval()
    if case.node_input.startswith("pos"):
        return PyGPositions(conv1, conv2, inp, normals="normal" in case.node_input).eval()
    if case.edge == NODE_TYPED:
        typed = DGLNodeTypedTwoConvs if library == "dgl" else PyGNodeTypedTwoConvs
        return typed(conv1, conv2, inp).eval()
    if case.edge in TYPE_PARAMS:
        typed = DGLTypedTwoConvs if library == "dgl" else PyGTypedTwoConvs
        return typed(conv1, conv2, inp, case.edge).eval()
    if case.edge:
        weighted = case.edge == "edge_weight"
        if library == "dgl" and not weighted:
            return DGLEdgeFeatTwoConvs(conv1, conv2, inp, case.edge, case.first_output).eval()
        if library == "dgl":
            return DGLWeightedTwoConvs(conv1, conv2, inp, case.edge).eval()
        edge_model = PyGWeightedTwoConvs if weighted else PyGEdgeAttrTwoConvs
        return edge_model(conv1, conv2, inp, case.edge).eval()
    wrapper = PyGHistory if case.history else PyGTwoConvs
    if library == "dgl":
        wrapper = DGLTwoConvs
    return wrapper(conv1, conv2, inp).eval()


# -------------------------------------------------------------------------------- audit
def audit_graph(library: str) -> tuple[torch.Tensor, torch.Tensor]:
    """``(edge_index, x)``: self-loops, duplicate edges and (PyG) an isolated last node.

    DGL's graph has a self-loop on every node, as DGL users add them: most DGL convs
    refuse zero-in-degree nodes (``allow_zero_in_degree=False``, covered elsewhere).
    """
    edge_index = random_edge_index(NUM_NODES, NUM_EDGES, seed=5)
    if library == "dgl":
        loops = torch.arange(NUM_NODES).repeat(2, 1)
        edge_index = torch.cat([edge_index, loops], dim=1)
    x = torch.randn(NUM_NODES, D_IN, generator=torch.Generator().manual_seed(6))
    return edge_index, x


TYPE_PARAMS = ("edge_type", "etypes")
"""Conv parameters taking relation ids (PyG ``edge_type``, DGL ``etypes``)."""


def audit_edge_data(num_edges: int, dim: int = D_EDGE) -> tuple[torch.Tensor, torch.Tensor]:
    """``(edge_weight [E], edge_features [E, dim])`` of the audit graph (positive weights)."""
    gen = torch.Generator().manual_seed(7)
    return torch.rand(num_edges, generator=gen) + 0.5, torch.randn(num_edges, dim, generator=gen)


def audit_edge_types(num_edges: int, relations: int = RELATIONS) -> torch.Tensor:
    """``edge_type [E]``: a relation id per edge of the audit graph, ``0..relations-1``."""
    return torch.randint(0, relations, (num_edges,), generator=torch.Generator().manual_seed(8))


def _full_graph(library: str, edge_index: torch.Tensor, num_nodes: int = NUM_NODES) -> object:
    if library == "dgl":
        import dgl

        return dgl.graph((edge_index[0], edge_index[1]), num_nodes=num_nodes)
    return edge_index


def _one_line(text: str, limit: int = 300) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def audit_case(library: str, name: str, cls: type, case: Case) -> Row:
    """Build, load and (unless refused) compare one case; never raises."""
    from hopserve.worker.convs.base import UnsupportedConvError
    from hopserve.worker.convs.registry import support_matrix
    from hopserve.worker.engine.factory import make_evaluator
    from hopserve.worker.trace.tracer import ModelTraceError

    label = f"{name} ({case.variant})" if case.variant else name

    def row(status: str, reason: str, nodewise: str = "") -> Row:
        return Row(library, name, case.variant, status, _one_line(reason), nodewise)

    try:
        model = build_model(library, cls, case)
    except ImportError as err:  # a class that needs another library (cugraph-ops, pyg-lib)
        return _unbuildable(library, name, case.variant, err)
    except Exception as err:  # noqa: BLE001 - the table's arguments are wrong: report it
        return row("crash", f"cannot build with the audit's arguments: {type(err).__name__}: {err}")
    store, forward = case_graph(library, case, model, *audit_graph(library))
    try:
        ev = make_evaluator(
            model,
            store,
            fallback="error",
            init_batch_nodes=BATCH_NODES,
            prefetch=False,
            progress=False,
        )
    except ModelTraceError as err:
        cause = err.__cause__
        if isinstance(cause, UnsupportedConvError):
            nw_store, nw_forward = case_graph(library, case, model, *nodewise_graph(library))
            nodewise = audit_nodewise(model, nw_store, nw_forward, label)
            if nodewise.startswith(("wrong", "crash")):
                return row(nodewise.split(":")[0], nodewise)
            return row("refused", cause.reason, nodewise)
        if cause is None:  # the self-check: the matrix let through a conv that is not exact
            return row("wrong", f"refused outside the support matrix: {err}")
        return row("crash", f"refusal wraps {type(cause).__name__}: {err}")
    except Exception as err:  # noqa: BLE001 - the audit reports every crash
        return row("crash", f"{type(err).__name__}: {err}")
    key = f"dgl.{name}" if library == "dgl" else name
    status, note = support_matrix().get(key, ("exact", "registered"))
    try:
        failure = compare_with_forward(ev, forward, label)
    finally:
        ev.close()
    return row(*failure) if failure else row(status, note)


def case_graph(
    library: str, case: Case, model: nn.Module, edge_index: torch.Tensor, x: torch.Tensor
) -> tuple[object, Callable[[], torch.Tensor]]:
    """``(store, forward)``: the graph ``(edge_index, x)`` with the edge data ``case``
    reads as a graph store, and the model's own full-graph forward on it."""
    from hopserve import GraphStore

    n, e = x.shape[0], edge_index.shape[1]
    weight, edge_feats = audit_edge_data(e, case.edge_dim)
    edge = {}
    inputs: tuple = ()  # the model's graph data arguments, in its forward's order
    if case.edge == NODE_TYPED:  # a typed graph: node type runs, relation ids
        from hopserve.worker.trace.probe import probe_node_types, typed_probe_columns

        ntype = probe_node_types(n, NODE_TYPES)
        etype = audit_edge_types(e)
        edge = typed_probe_columns(ntype, etype, e, D_IN)
        inputs = (ntype, etype)
        if library == "pyg":  # HEATConv: edge features too
            edge["edge_attr"] = edge_feats
            inputs = (ntype, etype, edge_feats)
    elif case.edge in TYPE_PARAMS:
        edge = {"edge_type": audit_edge_types(e)}
    elif case.edge:  # the model's edge data argument, and the store's column
        edge = {"edge_weight": weight} if case.edge == "edge_weight" else {"edge_attr": edge_feats}
    inputs = inputs or tuple(edge.values())
    store = GraphStore.from_edge_index(edge_index, x, **edge)

    def forward() -> torch.Tensor:
        with torch.no_grad():
            if library == "dgl":
                return model(_full_graph(library, edge_index, n), x, *inputs)
            return model(x, edge_index, *inputs)

    return store, forward


def nodewise_graph(library: str) -> tuple[torch.Tensor, torch.Tensor]:
    """``(edge_index, x)`` for the node-wise column: the load-time probe's kind of graph
    (every edge local on a ring, :func:`~hopserve.worker.trace.probe.probe_graph`), large
    enough that a K-hop field of 4 targets is a small part of it; DGL's with a self-loop
    on every node, as :func:`audit_graph`."""
    from hopserve.worker.trace.probe import probe_graph

    edge_index = probe_graph(NODEWISE_NODES, seed=9, degree=2, local=True)
    if library == "dgl":
        loops = torch.arange(NODEWISE_NODES).repeat(2, 1)
        edge_index = torch.cat([edge_index, loops], dim=1)
    x = torch.randn(NODEWISE_NODES, D_IN, generator=torch.Generator().manual_seed(10))
    return edge_index, x


def audit_nodewise(model: nn.Module, store, forward: Callable[[], torch.Tensor], label: str) -> str:  # noqa: ANN001
    """What ``fallback: nodewise`` does with a model the layer-wise engine refuses:
    ``"exact"`` (``"exact, field both ways"``) when its rows, a few targets a forward,
    equal the model's own full-graph forward, full and partial; ``"refused: why"`` when
    the node-wise evaluator refuses it at load; ``"wrong: …"`` / ``"crash: …"`` else."""
    from hopserve.worker.engine.nodewise import NodewiseEvaluator

    try:
        ev = NodewiseEvaluator(model, store, batch_size=BATCH_NODES)
    except ValueError as err:
        return f"refused: {_first_sentence(err)}"
    except Exception as err:  # noqa: BLE001
        return f"crash: node-wise load: {type(err).__name__}: {err}"
    failure = compare_with_forward(ev, forward, f"{label} node-wise")
    if failure:
        return f"{failure[0]}: {failure[1]}"
    return "exact, field both ways" if ev.both_ways else "exact"


def compare_with_forward(
    ev, forward: Callable[[], torch.Tensor], label: str
) -> tuple[str, str] | None:  # noqa: ANN001 - an evaluator
    """``None`` when ``ev``'s rows equal the model's ``forward``, every node and the
    target subset; else ``("wrong" | "crash", why)``."""
    try:
        want = forward()
        targets = torch.tensor(TARGETS)
        assert_exact(ev.evaluate(), want, f"{label} full")
        assert_exact(ev.evaluate(targets=targets), want[targets], f"{label} partial")
    except AssertionError as err:
        return "wrong", str(err)
    except Exception as err:  # noqa: BLE001 - the audit reports every crash
        return "crash", f"{type(err).__name__}: {err}"
    return None


def _first_sentence(err: Exception) -> str:
    """The reason of a node-wise refusal, without the probe's numbers."""
    text = str(err)
    if "differs from its own forward" in text:
        return "its rows depend on nodes outside its receptive field (load-time probe)"
    if "own forward fails on a random probe graph" in text:
        return "its own forward fails on the load-time probe graph"
    return text.split("; ")[0].split(". ")[0]


def _unbuildable(library: str, name: str, variant: str, err: Exception) -> Row:
    """A class that cannot be built here: its support-matrix row, which must refuse it."""
    from hopserve.worker.convs.registry import support_matrix

    key = f"dgl.{name}" if library == "dgl" else name
    status, note = support_matrix().get(key, ("", ""))
    if status != "refused":
        reason = _one_line(f"cannot build ({err}) and not refused")
        return Row(library, name, variant, "crash", reason)
    why = str(err).split(". ")[0].rstrip(".")  # the first sentence, not install advice
    return Row(library, name, variant, "refused", _one_line(f"{note} (not built here: {why})"))


def run_audit(library: str, names: Iterable[str] | None = None) -> list[Row]:
    """Audit every case of ``library``'s classes (or of ``names``), sorted by class name."""
    classes = CLASSES[library]()
    cases = CASES[library]
    rows = []
    for name in sorted(names if names is not None else classes, key=str.lower):
        for case in cases.get(name, ()):
            rows.append(audit_case(library, name, classes[name], case))
    return rows


# ------------------------------------------------------------------------------ render
TITLES = {
    "pyg": "PyTorch Geometric (`torch_geometric.nn.conv`)",
    "dgl": "DGL (`dgl.nn.pytorch.conv`)",
}


def counts(rows: Iterable[Row]) -> dict[str, int]:
    out = {"exact": 0, "adapted": 0, "refused": 0}
    for r in rows:
        out[r.status] = out.get(r.status, 0) + 1
    return out


def _more(n: int) -> str:
    return "1 more row builds" if n == 1 else f"{n} more rows build"


def section_markers(library: str) -> tuple[str, str]:
    return f"<!-- audit:{library}:begin -->", f"<!-- audit:{library}:end -->"


def render_section(library: str, rows: list[Row], version: str) -> str:
    """The generated Markdown of one library, between its markers (no trailing newline)."""
    begin, end = section_markers(library)
    typical = [r for r in rows if not r.variant]
    c = counts(typical)
    lines = [
        begin,
        f"## {TITLES[library]}, version {version}",
        "",
        f"{len(typical)} conv classes, built with typical arguments: {c['exact']} exact, "
        f"{c['adapted']} adapted (exact through a dedicated adapter), {c['refused']} "
        f"refused. {_more(len(rows) - len(typical))} a class with arguments that change "
        "the answer (in parentheses).",
        "",
        "| conv | status | how it runs exactly / why it is refused | `fallback: nodewise` |",
        "|---|---|---|---|",
    ]
    for r in rows:
        variant = f" ({r.variant})" if r.variant else ""
        nodewise = r.nodewise.replace("|", "/") or "—"
        reason = r.reason.replace("|", "/")
        lines.append(f"| `{r.conv}`{variant} | {r.status} | {reason} | {nodewise} |")
    lines.append(end)
    return "\n".join(lines)


def extract_section(text: str, library: str) -> str | None:
    """The committed section of ``library`` in ``text`` (markers included), or ``None``."""
    begin, end = section_markers(library)
    start = text.find(begin)
    stop = text.find(end)
    if start < 0 or stop < start:
        return None
    return text[start : stop + len(end)]


def replace_section(text: str, library: str, section: str) -> str:
    """``text`` with ``library``'s section replaced by ``section`` (appended if absent)."""
    old = extract_section(text, library)
    if old is None:
        return text.rstrip("\n") + "\n\n" + section + "\n"
    return text.replace(old, section)
