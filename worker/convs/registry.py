"""Support matrix: which conv classes run exactly on a batch, through which adapter.

Status per class:

* ``exact`` — 1-hop in-neighbour aggregation; the default adapter is exact as is.
* ``adapted`` — depends on a whole-graph statistic; a dedicated adapter supplies it.
* ``refused`` — cannot be evaluated layer by layer (e.g. K-hop propagation inside one
  module); loading a model that uses it fails with the reason, and the node-wise
  fallback (``hopserve.NodewiseEvaluator``) is the way to serve it.

The rows themselves are :mod:`.pyg_support` (every conv ``torch_geometric.nn.conv``
exports) and :mod:`.dgl_support` (``dgl.nn.pytorch``); the conv coverage audit
(``tests/support/conv_audit.py``) checks each is exact or refused as stated, and
``bench/support_matrix.py`` writes them to ``docs/support_matrix.md``. A row's factory
may refuse an instance as built (``CGConv(dim=3)`` needs edge features): it raises
:class:`~.base.UnsupportedConvError` with the short reason.

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
    pair: bool | None = None,
    note: str = "registered by user",
    style: str | None = None,
) -> type:
    """Declare ``cls`` a 1-hop conv the engine may split on (usable as a decorator).

    Args:
        cls: the conv module class (any ``nn.Module`` with ``forward(x, edge_index, ...)``).
        adapter: a factory ``conv -> ConvAdapter``; default runs the conv on the batch.
        pair: whether ``forward`` accepts a ``(x_src, x_dst)`` pair (PyG bipartite input);
            if not, the conv runs on the square batch and destination rows are sliced.
            Default: read from the annotation of ``forward``'s first argument (a
            ``Tuple`` / ``PairTensor`` → pair, a plain ``Tensor`` → square, none → pair).
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

        takes_pair = _accepts_pair(cls) if pair is None else pair

        def adapter(conv: nn.Module) -> ConvAdapter:
            return MessagePassingAdapter(conv, pair=takes_pair)

    _MATRIX[cls] = ConvSupport("exact", adapter, note)
    return cls


def _accepts_pair(cls: type) -> bool:
    """Whether ``cls.forward``'s feature argument is annotated to take a pair (default yes).

    PyG annotates pair-capable convs ``Union[Tensor, OptPairTensor]`` (``SAGEConv``) and the
    others ``Tensor`` (``PNAConv``, which fails on a pair).
    """
    try:
        params = [p for n, p in inspect.signature(cls.forward).parameters.items() if n != "self"]
    except (TypeError, ValueError):
        return True
    if not params or params[0].annotation is inspect.Parameter.empty:
        return True
    text = params[0].annotation
    text = text if isinstance(text, str) else repr(text)
    return any(word in text for word in ("Tuple", "tuple", "Pair"))


def _graph_first(cls: type) -> bool:
    """Whether ``cls.forward`` takes the graph first (DGL's ``forward(graph, feat)``)."""
    try:
        params = [p for p in inspect.signature(cls.forward).parameters if p != "self"]
    except (TypeError, ValueError):
        return False
    return bool(params) and params[0] in ("graph", "g", "block")


def _load_builtins(import_pyg: bool = False) -> None:
    """Add PyG's rows once ``torch_geometric`` is imported (by the user's model, or here on
    request): a model holding a PyG module has imported it, and a DGL-only process need
    not pay for importing PyG (about 60 MB of modules)."""
    global _BUILTINS_LOADED
    if _BUILTINS_LOADED:
        return
    if "torch_geometric" not in sys.modules and not import_pyg:
        return
    _BUILTINS_LOADED = True
    try:
        import torch_geometric.nn.conv as pyg
    except ImportError:  # PyG is an optional extra
        return
    from hopserve.worker.convs.pyg_support import EARLY, ROWS

    _add_rows(pyg, ROWS, EARLY)


def _pyg_module(name: str) -> type | None:
    """``torch_geometric.nn.<name>`` if PyG is already imported (else no module of the
    model can be one)."""
    if "torch_geometric" not in sys.modules:
        return None
    try:
        import torch_geometric.nn as pyg_nn
    except ImportError:
        return None
    return getattr(pyg_nn, name, None)


def _add_rows(module: object, rows: dict, early: tuple[str, ...]) -> None:
    """Rows ``{name: (status, factory, note)}`` of ``module``'s classes (a class missing
    from the installed release is skipped, one the user registered keeps its entry);
    ``early`` ones are refused before tracing."""
    for name, (status, factory, note) in rows.items():
        cls = getattr(module, name, None)
        if cls is None or cls in _MATRIX:
            continue
        _MATRIX[cls] = ConvSupport(status, factory, note)
        if name in early:
            _EARLY_REFUSALS[cls] = note


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
    from hopserve.worker.convs.dgl_support import EARLY, ROWS

    _add_rows(dglnn, ROWS, EARLY)


def _maybe_dgl(cls: type) -> None:
    if not _DGL_LOADED and _is_dgl_class(cls):
        _load_dgl_builtins(import_dgl=True)


def _internal_adapter(module: nn.Module) -> AdapterFactory | None:
    """The adapter of an engine-made conv (a dict model's ``HeteroLayer``), else ``None``.

    These are not user convs and not rows of the support matrix."""
    from hopserve.worker.hetero.modules import DictConvLayer, HeteroLayer

    if isinstance(module, (HeteroLayer, DictConvLayer)):
        from hopserve.worker.convs.hetero import DictConvAdapter, HeteroLayerAdapter
        from hopserve.worker.convs.hgt import HGTAdapter, is_plain_hgt

        if isinstance(module, HeteroLayer):
            return HeteroLayerAdapter
        return HGTAdapter if is_plain_hgt(module) else DictConvAdapter
    return None


def early_refusal(model: nn.Module) -> UnsupportedConvError | None:
    """The refusal of ``model`` before tracing (e.g. a heterograph conv), or ``None``.

    Such modules take per-type feature dicts, so tracing would fail with an unrelated
    error; this names the module and the reason instead (``reason``: the short one).
    Modules inside an engine-made conv (the ``HeteroConv`` a ``HeteroLayer`` runs) are
    not the user's to refuse.
    """
    inside: list[str] = []
    for qual, module in model.named_modules():
        if any(qual.startswith(f"{p}.") for p in inside):
            continue
        if _internal_adapter(module) is not None:
            inside.append(qual)
            continue
        _maybe_dgl(type(module))
        for cls in type(module).__mro__:
            if cls in _EARLY_REFUSALS:
                where = f"'{qual}' " if qual else ""
                return UnsupportedConvError(
                    f"module {where}({type(module).__name__}) cannot be evaluated layer by "
                    f"layer: {_EARLY_REFUSALS[cls]}.",
                    reason=_EARLY_REFUSALS[cls],
                )
    return None


def load_time_refusal(model: nn.Module) -> str | None:
    """The message of :func:`early_refusal`, or ``None``."""
    err = early_refusal(model)
    return None if err is None else str(err)


def support_matrix() -> dict[str, tuple[Status, str]]:
    """``{class name: (status, note)}`` for documentation and ``hopserve convs``.

    DGL classes (listed when ``dgl`` imports) are keyed ``dgl.<Name>`` so they do not
    collide with PyG's classes of the same name.
    """
    _load_builtins(import_pyg=True)
    _load_dgl_builtins(import_dgl=True)
    return {
        (f"dgl.{cls.__name__}" if _is_dgl_class(cls) else cls.__name__): (s.status, s.note)
        for cls, s in _MATRIX.items()
    }


def conv_status(module: nn.Module) -> Status | None:
    """The support matrix's status of ``module``'s class (along the MRO), or ``None``."""
    _load_builtins()
    _maybe_dgl(type(module))
    for cls in type(module).__mro__:
        if cls in _MATRIX:
            return _MATRIX[cls].status
    return None


def is_conv_module(module: nn.Module) -> bool:
    """Whether the tracer must treat ``module`` as a conv (a leaf that aggregates)."""
    _load_builtins()
    if _internal_adapter(module) is not None:
        return True
    _maybe_dgl(type(module))
    if any(cls in _MATRIX for cls in type(module).__mro__):
        return True
    if any(c.__module__.startswith("dgl.nn.pytorch.conv") for c in type(module).__mro__):
        return True
    message_passing = _pyg_module("MessagePassing")
    return message_passing is not None and isinstance(module, message_passing)


def adapter_for(module: nn.Module, qualname: str) -> ConvAdapter:
    """Return the adapter that runs ``module`` exactly on a batch, or refuse with a reason.

    Raises:
        UnsupportedConvError: the message names the conv and the way to serve it anyway;
            ``reason`` is the support matrix's short reason.
    """
    _load_builtins()
    internal = _internal_adapter(module)
    if internal is not None:
        return internal(module)
    _maybe_dgl(type(module))
    name = type(module).__name__
    flow = getattr(module, "flow", "source_to_target")
    if flow != "source_to_target":
        raise UnsupportedConvError(
            f"conv '{qualname}' ({name}) uses flow={flow!r}; "
            "only 'source_to_target' (PyG's default) is supported",
            reason=f"flow={flow!r} (only 'source_to_target' is supported)",
        )
    for cls in type(module).__mro__:
        support = _MATRIX.get(cls)
        if support is None:
            continue
        reason = support.note
        if support.status != "refused":
            assert support.factory is not None
            try:
                adapter = support.factory(module)
            except UnsupportedConvError as err:  # refused as built (e.g. with edge features)
                reason = err.reason
            else:
                if hasattr(adapter, "qualname"):
                    adapter.qualname = qualname
                return adapter
        raise UnsupportedConvError(
            f"conv '{qualname}' ({name}) cannot be evaluated layer by layer: {reason}. "
            f"{NODEWISE_ADVICE}.",
            reason=reason,
        )
    raise UnsupportedConvError(
        f"conv '{qualname}' ({name}) is not in hopserve's support matrix. "
        "If it aggregates 1-hop in-neighbours only, register it with "
        f"hopserve.register_conv({name}). Otherwise: {NODEWISE_ADVICE}.",
        reason="not in the support matrix (register_conv it if it aggregates 1-hop "
        "in-neighbours only)",
    )
