"""Support matrix: which conv classes run exactly on a batch, through which adapter.

Status per class:

* ``exact`` — 1-hop in-neighbour aggregation; the default adapter is exact as is.
* ``adapted`` — depends on a whole-graph statistic; a dedicated adapter supplies it.
* ``refused`` — cannot be evaluated layer by layer (e.g. K-hop propagation inside one
  module); loading a model that uses it fails with the reason, and the node-wise
  fallback (``hopserve.NodewiseEvaluator``) is the way to serve it.

Classes are looked up along the MRO, so a user subclass of ``SAGEConv`` inherits
``SAGEConv``'s entry. Unknown ``MessagePassing`` subclasses are refused until registered
with :func:`register_conv`.

DGL rows (``dgl.nn.pytorch``) are loaded the first time a DGL module is seen (or by
:func:`support_matrix`), so ``import dgl`` never happens for PyG-only models. Unknown DGL
convs (any class defined in ``dgl.nn.pytorch.conv``) are leaves for the tracer and are
refused until registered, like unknown ``MessagePassing`` subclasses.
"""

from __future__ import annotations

import inspect
import logging
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from torch import nn

from hopserve.worker.convs.base import ConvAdapter, UnsupportedConvError

Status = Literal["exact", "adapted", "refused"]

NODEWISE_ADVICE = (
    "Serve it with the exact (slower) node-wise fallback: set `fallback: nodewise` in the "
    "model's config (hopserve.make_evaluator(..., fallback='nodewise') in Python)"
)
"""What every refusal recommends; usable from the YAML config and from Python."""
AdapterFactory = Callable[[nn.Module], ConvAdapter]


@dataclass(frozen=True)
class ConvSupport:
    """One row of the support matrix."""

    status: Status
    factory: AdapterFactory | None
    note: str


_MATRIX: dict[type, ConvSupport] = {}
_BUILTINS_LOADED = False
_DGL_LOADED = False
# Refused before tracing (their models cannot even be traced to a per-node graph).
_EARLY_REFUSALS: dict[type, str] = {}

log = logging.getLogger(__name__)


def register_conv(
    cls: type,
    adapter: AdapterFactory | None = None,
    *,
    pair: bool = True,
    note: str = "registered by user",
    style: str | None = None,
) -> type:
    """Declare ``cls`` a 1-hop conv the engine may split on (usable as a decorator).

    Args:
        cls: the conv module class (any ``nn.Module`` with ``forward(x, edge_index, ...)``).
        adapter: a factory ``conv -> ConvAdapter``; default runs the conv on the batch.
        pair: whether ``forward`` accepts a ``(x_src, x_dst)`` pair (PyG bipartite input);
            if not, the conv runs on the square batch and destination rows are sliced.
        note: shown in the support matrix.
        style: ``"pyg"`` (``forward(x, edge_index)``) or ``"dgl"`` (``forward(graph, feat)``,
            run on a DGL block); default: ``"dgl"`` for subclasses of ``dgl.nn`` modules
            and for forwards whose first argument is ``graph``/``g``/``block``.
    """
    if style is None:
        style = "dgl" if _is_dgl_class(cls) or _graph_first(cls) else "pyg"
    if style not in ("pyg", "dgl"):
        raise ValueError(f"style must be 'pyg', 'dgl' or None, got {style!r}")
    if adapter is None and style == "dgl":
        from hopserve.worker.convs.dgl_conv import DGLConvAdapter

        adapter = DGLConvAdapter
    if adapter is None:
        from hopserve.worker.convs.message_passing import MessagePassingAdapter

        def adapter(conv: nn.Module) -> ConvAdapter:
            return MessagePassingAdapter(conv, pair=pair)

    _MATRIX[cls] = ConvSupport("exact", adapter, note)
    return cls


def _graph_first(cls: type) -> bool:
    """Whether ``cls.forward`` takes the graph first (DGL's ``forward(graph, feat)``)."""
    try:
        params = [p for p in inspect.signature(cls.forward).parameters if p != "self"]
    except (TypeError, ValueError):
        return False
    return bool(params) and params[0] in ("graph", "g", "block")


def _refuse(cls: type, note: str) -> None:
    _MATRIX[cls] = ConvSupport("refused", None, note)


def _load_builtins() -> None:
    global _BUILTINS_LOADED
    if _BUILTINS_LOADED:
        return
    _BUILTINS_LOADED = True
    try:
        import torch_geometric.nn as pyg
    except ImportError:  # PyG is an optional extra
        return
    from hopserve.worker.convs.gcn import GCNAdapter
    from hopserve.worker.convs.message_passing import MessagePassingAdapter

    def pair(conv: nn.Module) -> ConvAdapter:
        return MessagePassingAdapter(conv, pair=True)

    for name, note in [
        ("SAGEConv", "mean/max/sum/lstm; fused SpMM for sum/mean"),
        ("GraphConv", "fused SpMM for sum/mean"),
        ("GINConv", "fused SpMM for sum/mean"),
        ("GATConv", "multi-head; self-loops per destination"),
        ("GATv2Conv", "multi-head; self-loops per destination"),
        ("TransformerConv", "multi-head attention over in-neighbours"),
        ("EdgeConv", "max over in-neighbours of MLP(x_i, x_j - x_i)"),
    ]:
        _MATRIX[getattr(pyg, name)] = ConvSupport("exact", pair, note)
    _MATRIX[pyg.GCNConv] = ConvSupport(
        "adapted", GCNAdapter, "symmetric normalization from whole-graph degrees"
    )
    for name, note in [
        ("APPNP", "propagates K hops inside one module"),
        ("SGConv", "propagates K hops inside one module (and needs global degrees)"),
        ("SSGConv", "propagates K hops inside one module"),
        ("TAGConv", "propagates K hops inside one module"),
        ("ChebConv", "K-hop Chebyshev filter with whole-graph Laplacian"),
        ("ARMAConv", "stacks of propagation inside one module"),
        ("MixHopConv", "mixes several powers of the adjacency"),
        ("GCN2Conv", "needs the initial-residual input and global degrees"),
        ("LGConv", "needs whole-graph degrees (no adapter yet)"),
    ]:
        if hasattr(pyg, name):
            _refuse(getattr(pyg, name), note)


# --------------------------------------------------------------------------- DGL
def _is_dgl_class(cls: type) -> bool:
    """Whether ``cls`` or a base class is defined in DGL's PyTorch ``nn`` package."""
    return any(c.__module__.startswith("dgl.nn.") for c in cls.__mro__)


def _load_dgl_builtins(import_dgl: bool = False) -> None:
    """Add DGL's rows once ``dgl`` is imported (by the user's model, or here on request)."""
    global _DGL_LOADED
    if _DGL_LOADED:
        return
    if "dgl" not in sys.modules and not import_dgl:
        return
    try:
        import dgl.nn.pytorch as dglnn
    except Exception as err:  # not installed, or a build that does not load with this torch
        log.debug("DGL rows of the support matrix unavailable: %s", err)
        return
    _DGL_LOADED = True
    from hopserve.worker.convs.dgl_conv import DGLConvAdapter
    from hopserve.worker.convs.dgl_graphconv import DGLGraphConvAdapter

    for name, note in [
        ("SAGEConv", "mean/gcn/pool; lstm in edge-id order (see README)"),
        ("GATConv", "multi-head, residual; edge softmax over all in-edges"),
        ("GATv2Conv", "multi-head, residual; edge softmax over all in-edges"),
        ("GINConv", "sum/max/mean, learnable eps, apply_func"),
        ("EdgeConv", "max over in-neighbours of theta(x_j - x_i) + phi(x_i)"),
        ("DotGatConv", "dot-product attention over in-neighbours"),
        ("AGNNConv", "cosine attention over in-neighbours"),
    ]:
        _MATRIX[getattr(dglnn, name)] = ConvSupport("exact", DGLConvAdapter, note)
    _MATRIX[dglnn.GraphConv] = ConvSupport(
        "adapted",
        DGLGraphConvAdapter,
        "norm both/left scale by whole-graph source out-degrees: computed once per graph",
    )
    for name, note in [
        ("APPNPConv", "propagates k hops inside one module"),
        ("SGConv", "propagates k hops inside one module (and needs global degrees)"),
        ("TAGConv", "propagates k hops inside one module"),
        ("ChebConv", "K-hop Chebyshev filter with whole-graph Laplacian"),
        ("GCN2Conv", "needs the initial-residual input and global degrees"),
        ("TWIRLSConv", "iterated propagation inside one module"),
        ("GatedGraphConv", "n_steps of propagation inside one module, over edge types"),
        ("RelGraphConv", "needs per-edge relation types; the graph store has no edge types"),
        ("GINEConv", "needs edge features (not supported yet)"),
        ("NNConv", "needs edge features (not supported yet)"),
        ("GMMConv", "needs edge pseudo-coordinates (not supported yet)"),
        ("EGATConv", "needs edge features (not supported yet)"),
        ("CFConv", "needs edge features (not supported yet)"),
        ("EGNNConv", "needs node coordinates and edge features (not supported yet)"),
    ]:
        if hasattr(dglnn, name):
            _refuse(getattr(dglnn, name), note)
    hetero = (
        "runs on a heterogeneous graph (per-type node features and relations); "
        "hopserve's graph store is homogeneous. Convert with dgl.to_homogeneous and a "
        "homogeneous model, or serve it outside hopserve"
    )
    for name in ("HeteroGraphConv", "HGTConv"):
        if hasattr(dglnn, name):
            _refuse(getattr(dglnn, name), hetero)
            _EARLY_REFUSALS[getattr(dglnn, name)] = hetero


def _maybe_dgl(cls: type) -> None:
    if not _DGL_LOADED and _is_dgl_class(cls):
        _load_dgl_builtins(import_dgl=True)


def load_time_refusal(model: nn.Module) -> str | None:
    """A reason to refuse ``model`` before tracing (e.g. a heterograph conv), or ``None``.

    Such modules take per-type feature dicts, so tracing would fail with an unrelated
    error; this names the module and the reason instead.
    """
    for qual, module in model.named_modules():
        _maybe_dgl(type(module))
        for cls in type(module).__mro__:
            if cls in _EARLY_REFUSALS:
                where = f"'{qual}' " if qual else ""
                return (
                    f"module {where}({type(module).__name__}) cannot be evaluated layer by "
                    f"layer: {_EARLY_REFUSALS[cls]}."
                )
    return None


def support_matrix() -> dict[str, tuple[Status, str]]:
    """``{class name: (status, note)}`` for documentation and ``hopserve convs``.

    DGL classes (listed when ``dgl`` imports) are keyed ``dgl.<Name>`` so they do not
    collide with PyG's classes of the same name.
    """
    _load_builtins()
    _load_dgl_builtins(import_dgl=True)
    return {
        (f"dgl.{cls.__name__}" if _is_dgl_class(cls) else cls.__name__): (s.status, s.note)
        for cls, s in _MATRIX.items()
    }


def is_conv_module(module: nn.Module) -> bool:
    """Whether the tracer must treat ``module`` as a conv (a leaf that aggregates)."""
    _load_builtins()
    _maybe_dgl(type(module))
    if any(cls in _MATRIX for cls in type(module).__mro__):
        return True
    if any(c.__module__.startswith("dgl.nn.pytorch.conv") for c in type(module).__mro__):
        return True
    try:
        from torch_geometric.nn import MessagePassing
    except ImportError:
        return False
    return isinstance(module, MessagePassing)


def adapter_for(module: nn.Module, qualname: str) -> ConvAdapter:
    """Return the adapter that runs ``module`` exactly on a batch, or refuse with a reason."""
    _load_builtins()
    _maybe_dgl(type(module))
    flow = getattr(module, "flow", "source_to_target")
    if flow != "source_to_target":
        raise UnsupportedConvError(
            f"conv '{qualname}' ({type(module).__name__}) uses flow={flow!r}; "
            "only 'source_to_target' (PyG's default) is supported"
        )
    for cls in type(module).__mro__:
        support = _MATRIX.get(cls)
        if support is None:
            continue
        if support.status == "refused":
            raise UnsupportedConvError(
                f"conv '{qualname}' ({type(module).__name__}) cannot be evaluated layer by "
                f"layer: {support.note}. {NODEWISE_ADVICE}."
            )
        assert support.factory is not None
        adapter = support.factory(module)
        if hasattr(adapter, "qualname"):
            adapter.qualname = qualname
        return adapter
    raise UnsupportedConvError(
        f"conv '{qualname}' ({type(module).__name__}) is not in hopserve's support matrix. "
        "If it aggregates 1-hop in-neighbours only, register it with "
        "hopserve.register_conv(" + type(module).__name__ + "). Otherwise: " + NODEWISE_ADVICE + "."
    )
