"""The typed modules of a dict model's homogeneous form (:mod:`.homogenize`).

A dict model's per-type values become tables over *all* rows (storage order, or a batch's
rows), each meaningful on its own type's rows:

- :class:`HeteroLayer` is one ``HeteroConv``: for a destination ``v`` of type ``t``,
  ``out[v] = aggr_{r = (s, ·, t)} conv_r((x_s, x_t), E_r)[v]``, where ``x_s`` is the input
  table's first ``width_s`` columns. It is a conv for the engine (a batch-aware adapter,
  :mod:`hopserve.worker.convs.hetero`): each relation conv runs on the batch's in-edges of
  its relation, which is exact because a relation conv's output for ``v`` depends on
  ``v``'s row and its in-edges of that relation only (the support matrix's ``exact``
  status).
- :class:`TypedRows` is a per-type module (``lin_dict[t]``) on its type's rows.
- :class:`TypedMerge` joins per-type values into one table (row of type ``t`` from ``t``'s
  value), where a ``HeteroConv`` reads different values per type.

The node-wise two take ``node_ids`` (the storage ids of their rows, ``None`` for all rows
in storage order), which the block code generator passes (``needs_node_ids``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from hopserve.worker.hetero.layout import TypeLayout

__all__ = [
    "DictConvLayer",
    "HeteroLayer",
    "ParamKwargs",
    "RelationCall",
    "TypedMerge",
    "TypedRows",
    "csc_indptr",
    "edge_columns",
    "group_relations",
    "relation_edge_data",
]


def edge_columns(edge_attr: Tensor | None, edge_weight: Tensor | None) -> dict[str, Tensor | None]:
    """The store's edge columns by name (what :attr:`RelationCall.edge_data` names), from
    the homogeneous form's ``edge_attr`` / ``edge_weight`` arguments."""
    return {"features": edge_attr, "weight": edge_weight}


def relation_edge_data(
    call: RelationCall, columns: dict[str, Tensor | None], on: Tensor
) -> dict[str, Tensor]:
    """The edge data keywords of one relation conv: each column's rows of the edges ``on``
    selects (the relation's)."""
    out = {}
    for param, column in call.edge_data:
        values = columns.get(column)
        if values is None:
            raise ValueError(f"relation {call.key} takes edge data '{param}' ({column}), not given")
        out[param] = values[on]
    return out


def group_relations(outs: list[Tensor], aggr: str) -> Tensor:
    """PyG ``HeteroConv``'s aggregation of one destination type's relation outputs."""
    from torch_geometric.nn.conv.hetero_conv import group

    return group(outs, aggr)


@dataclass(frozen=True)
class RelationCall:
    """One relation conv of a :class:`HeteroLayer`."""

    key: tuple[str, str, str]  # the HeteroConv's key (src, name, dst)
    relation: int  # the relation's id in the graph's edge_type column
    src: int  # source type index in the layout
    dst: int  # destination type index
    edge_data: tuple[tuple[str, str], ...] = ()  # (conv parameter, edge column) pairs


@contextlib.contextmanager
def zero_in_degree_allowed(module: nn.Module) -> Iterator[None]:
    """DGL convs (``GraphConv``, ``GATConv``, ...) refuse a graph with a node without
    in-edges unless built with ``allow_zero_in_degree``; a batch's typed subgraph has such
    nodes among its sources (their in-edges are not in it) and their rows are dropped, so
    the check is lifted there. A destination has all its in-edges: where the model's own
    forward would refuse one, the load-time probe does too."""
    saved = [
        (m, m._allow_zero_in_degree)
        for m in module.modules()
        if isinstance(getattr(m, "_allow_zero_in_degree", None), bool)
    ]
    for m, _ in saved:
        m._allow_zero_in_degree = True
    try:
        yield
    finally:
        for m, value in saved:
            m._allow_zero_in_degree = value


class HeteroLayer(nn.Module):
    """Relation convs joined per destination type (see the module doc): a ``HeteroConv``,
    or one relation conv of a ``to_hetero`` model (whose joins are ops of their own).

    Args:
        convs: the user's relation convs (shared, not copied), one per call.
        calls: which relation each conv runs on, in the model's order.
        aggr: ``HeteroConv``'s aggregation over a destination type's relations.
        layout: the store's node types and relations.
        in_widths: true width of each source/destination type's input (type index -> cols).
        out_width: output columns (the widest destination type's; narrower ones padded),
            or the per-row shape of outputs with more dimensions (heads).
    """

    def __init__(
        self,
        convs: Sequence[nn.Module],
        calls: Sequence[RelationCall],
        aggr: str,
        layout: TypeLayout,
        in_widths: dict[int, int],
        out_width: int | tuple[int, ...],
    ) -> None:
        super().__init__()
        self.convs = nn.ModuleList(convs)
        self.calls = tuple(calls)
        self.aggr = aggr
        self.layout = layout
        self.in_widths = dict(in_widths)
        self.out_shape = (int(out_width),) if isinstance(out_width, int) else tuple(out_width)
        self.out_width = self.out_shape[0]
        self.num_relations = len(layout.relations)  # the relation ids the edge column holds
        self.edge_dim: int | None = None  # edge feature width, when relation convs read them
        by_dst: dict[int, list[int]] = {}
        for k, call in enumerate(self.calls):
            by_dst.setdefault(call.dst, []).append(k)
        self.by_dst = tuple((t, tuple(ks)) for t, ks in by_dst.items())

    def forward(
        self,
        x: Tensor,
        edge_index: Tensor,
        edge_type: Tensor,
        edge_attr: Tensor | None = None,
        edge_weight: Tensor | None = None,
    ) -> Tensor:
        """The layer on the whole graph: rows in storage order; ``edge_attr`` /
        ``edge_weight``: the store's edge columns, for relation convs taking edge data."""
        columns = edge_columns(edge_attr, edge_weight)
        n = x.shape[0]
        types = self.layout.types_of(None, n, x.device)
        out = x.new_zeros((n, *self.out_shape))
        for t, ks in self.by_dst:
            rows = (types == t).nonzero().squeeze(1)
            if rows.numel() == 0:
                continue
            outs = []
            for k in ks:
                call, conv = self.calls[k], self.convs[k]
                on = edge_type == call.relation
                ei = edge_index[:, on]
                kw = relation_edge_data(call, columns, on)
                x_dst = x[:, : self.in_widths[call.dst]]
                if call.src == call.dst:
                    y = conv(x_dst, ei, **kw)
                else:
                    y = conv((x[:, : self.in_widths[call.src]], x_dst), ei, **kw)
                outs.append(y.index_select(0, rows))
            y = group_relations(outs, self.aggr)
            out[rows, : y.shape[1]] = y
        return out

    def extra_repr(self) -> str:
        rels = ", ".join("__".join(c.key) for c in self.calls)
        return f"relations=[{rels}], aggr={self.aggr!r}, out_width={self.out_width}"


class TypedRows(nn.Module):
    """``module`` applied to the rows of one node type; zero rows elsewhere (a per-type
    module such as ``lin_dict[t]`` of a dict model)."""

    needs_node_ids = True

    def __init__(self, module: nn.Module, type_index: int, layout: TypeLayout) -> None:
        super().__init__()
        self.module = module
        self.type_index = int(type_index)
        self.layout = layout

    def forward(self, x: Tensor, node_ids: Tensor | None = None) -> Tensor:
        rows = self.layout.rows_of(node_ids, x.shape[0], self.type_index, x.device)
        y = self.module(x.index_select(0, rows))
        out = y.new_zeros((x.shape[0], *y.shape[1:]))
        return out.index_copy_(0, rows, y)

    def extra_repr(self) -> str:
        return f"type={self.layout.names[self.type_index]!r}"


class TypedMerge(nn.Module):
    """One table from per-type values: a row of type ``types[k]`` is ``values[k]``'s row,
    zero-padded to the widest value; rows of other types are zero."""

    needs_node_ids = True

    def __init__(self, types: Sequence[int], layout: TypeLayout) -> None:
        super().__init__()
        self.types = tuple(int(t) for t in types)
        self.layout = layout

    def forward(self, *values: Tensor, node_ids: Tensor | None = None) -> Tensor:
        n = values[0].shape[0]
        width = max(int(v.shape[1]) for v in values)
        out = values[0].new_zeros(n, width)
        types = self.layout.types_of(node_ids, n, out.device)
        for t, v in zip(self.types, values, strict=True):
            rows = (types == t).nonzero().squeeze(1)
            out[rows, : v.shape[1]] = v.index_select(0, rows)
        return out

    def extra_repr(self) -> str:
        return f"types={[self.layout.names[t] for t in self.types]}"


def csc_indptr(dst: Tensor, num_dst: int) -> Tensor:
    """The CSC ``indptr`` (``[num_dst + 1]``, int64) of edges grouped by destination
    (``dst`` non-decreasing, below ``num_dst``)."""
    indptr = torch.zeros(num_dst + 1, dtype=torch.long, device=dst.device)
    torch.cumsum(torch.bincount(dst, minlength=num_dst), 0, out=indptr[1:])
    return indptr


def _csc(edge_index: Tensor, num_dst: int) -> tuple[str, tuple[Tensor, Tensor, Tensor]]:
    """A relation's edges of a batch (grouped by destination, ascending: the batch's CSC
    order) as DGL's ``("csc", (indptr, indices, edge ids))``: the format its in-edge
    kernels read, made without the sort a COO graph costs on first use."""
    src = edge_index[0]
    indptr = csc_indptr(edge_index[1], num_dst)
    return "csc", (indptr, src, torch.arange(src.numel(), device=src.device))


class ParamKwargs(nn.Module):
    """Keyword tensors of a ``HeteroGraphConv``'s relation convs that the model computes
    from its parameters only (DGL's rgcn-hetero example passes each relation's weight,
    made from a basis, as ``mod_kwargs={etype: {"weight": W_r}}``): ``fn`` is that part of
    the model's graph, run at each call, so the tensors follow the parameters.

    Args:
        fn: a graph module without inputs returning the tensors, in ``keys`` order.
        keys: ``(etype, conv parameter)`` of each tensor.
    """

    def __init__(self, fn: nn.Module, keys: Sequence[tuple[str, str]]) -> None:
        super().__init__()
        self.fn = fn
        self.keys = tuple(keys)

    def forward(self) -> dict[str, dict[str, Tensor]]:
        out: dict[str, dict[str, Tensor]] = {}
        for (etype, param), value in zip(self.keys, self.fn(), strict=True):
            out.setdefault(etype, {})[param] = value
        return out


class DictConvLayer(nn.Module):
    """A conv that takes per-type dicts itself (PyG ``HGTConv``), on the homogeneous form.

    On any set of rows with their in-edges (the whole graph, or a batch's destinations
    and their sources), the rows are split into per-type tables by their storage ids, the
    edges into per-relation ``edge_index`` tensors in per-type positions, the conv runs on
    that typed subgraph, and its per-type outputs go back to the rows. A destination's
    result is exact when the conv's output for a node reads its own row and its in-edges
    only (``HGTConv``: attention over the node's in-edges across relations).

    Args:
        conv: the user's conv (shared, not copied).
        layout: the store's node types and relations.
        relations: ``(relation id, (src, name, dst))`` of the edge types the call passes.
        in_widths: true input width per type index in the call's ``x_dict``.
        out_width: output columns (the widest output type's), or the per-row shape.
        style: ``"pyg"`` (``conv(x_dict, edge_index_dict)``) or ``"dgl"``
            (``conv(heterograph, x_dict)``: DGL's ``HeteroGraphConv``).
    """

    def __init__(
        self,
        conv: nn.Module,
        layout: TypeLayout,
        relations: Sequence[tuple[int, tuple[str, str, str]]],
        in_widths: dict[int, int],
        out_width: int | tuple[int, ...],
        style: str = "pyg",
    ) -> None:
        super().__init__()
        self.conv = conv
        self.layout = layout
        self.relations = tuple((int(r), tuple(k)) for r, k in relations)
        self.in_widths = dict(in_widths)
        self.out_shape = (int(out_width),) if isinstance(out_width, int) else tuple(out_width)
        self.out_width = self.out_shape[0]
        self.num_relations = len(layout.relations)
        self.style = style
        # DGL's mod_kwargs: {etype: ((conv parameter, edge column), ...)}, each relation
        # conv's edge data from the store's columns (rows of its relation's edges)
        self.edge_data: dict[str, tuple[tuple[str, str], ...]] = {}
        self.edge_dim: int | None = None  # edge feature width, when relation convs read them
        # DGL's mod_kwargs computed from the model's parameters (per-relation weights)
        self.param_kwargs: ParamKwargs | None = None

    def relation_kwargs(self) -> dict[str, dict[str, Tensor]]:
        """``{etype: {conv parameter: tensor}}`` of :attr:`param_kwargs` (empty without)."""
        return {} if self.param_kwargs is None else self.param_kwargs()

    def forward(
        self,
        x: Tensor,
        edge_index: Tensor,
        edge_type: Tensor,
        edge_attr: Tensor | None = None,
        edge_weight: Tensor | None = None,
    ) -> Tensor:
        """The conv on the whole graph: rows in storage order; ``edge_attr`` /
        ``edge_weight``: the store's edge columns, for relation convs taking edge data."""
        types = self.layout.types_of(None, x.shape[0], x.device)
        columns = edge_columns(edge_attr, edge_weight)
        return self.on_rows(x, types, edge_index[0], edge_index[1], edge_type, columns)

    def on_rows(
        self,
        x: Tensor,
        types: Tensor,
        src: Tensor,
        dst: Tensor,
        etype: Tensor,
        columns: dict[str, Tensor | None] | None = None,
        num_dst: int | None = None,
    ) -> Tensor:
        """The conv on rows ``x`` of types ``types`` with edges ``src -> dst`` (row
        positions) of relations ``etype`` (``columns``: the edges' rows of the store's edge
        columns); rows of types the conv does not output are 0. Edges whose ends are not of
        their relation's types are left out (a typed store has none; the load-time probe
        graph has).

        ``num_dst`` (a batch: rows ``[0, num_dst)`` are its destinations, every edge ends
        at one, and so each type's destinations come first among its rows): a DGL conv
        runs on a *block* (DGL's own layer-wise form: ``HeteroGraphConv`` hands each
        relation conv the source rows and the destination rows), so no output is computed
        for a row that is only a source; only the first ``num_dst`` rows are returned."""
        n = x.shape[0]
        index = self.layout.names.index
        pos = torch.zeros(n, dtype=torch.long, device=x.device)
        x_dict, rows = {}, {}
        ends = {index(k[0]) for _, k in self.relations} | {index(k[2]) for _, k in self.relations}
        for t in sorted(set(self.in_widths) | ends):
            rows[t] = (types == t).nonzero().squeeze(1)
            pos[rows[t]] = torch.arange(rows[t].numel(), device=x.device)
            if t in self.in_widths:
                x_dict[self.layout.names[t]] = x.index_select(0, rows[t])[:, : self.in_widths[t]]
        edge_index_dict, mod_kwargs = {}, {}
        src_types, dst_types = types.index_select(0, src), types.index_select(0, dst)
        src_pos, dst_pos = pos.index_select(0, src), pos.index_select(0, dst)
        for rel, key in self.relations:
            on = (etype == rel) & (src_types == index(key[0])) & (dst_types == index(key[2]))
            on = on.nonzero().squeeze(1)
            edge_index_dict[key] = torch.stack(
                [src_pos.index_select(0, on), dst_pos.index_select(0, on)]
            )
            data = self.edge_data.get(key[1])
            if data:
                call = RelationCall(key, rel, index(key[0]), index(key[2]), data)
                mod_kwargs[key[1]] = relation_edge_data(call, columns or {}, on)
        for etype, kw in self.relation_kwargs().items():
            mod_kwargs.setdefault(etype, {}).update(kw)
        block = self.style == "dgl" and num_dst is not None
        if self.style == "dgl":
            import dgl

            names = self.layout.names
            counts = {names[t]: int(r.numel()) for t, r in rows.items()}
            if block:  # destinations: each type's first rows, those below num_dst
                firsts = {t: int(torch.searchsorted(r, num_dst)) for t, r in rows.items()}
                rows = {t: r[: firsts[t]] for t, r in rows.items()}
                graph = dgl.create_block(
                    {k: _csc(e, firsts[index(k[2])]) for k, e in edge_index_dict.items()},
                    num_src_nodes=counts,
                    num_dst_nodes={names[t]: k for t, k in firsts.items()},
                    device=x.device,
                )
            else:
                edges = {k: (e[0], e[1]) for k, e in edge_index_dict.items()}
                graph = dgl.heterograph(edges, num_nodes_dict=counts, device=x.device)
            from dgl.nn.pytorch import HeteroGraphConv

            inputs: object = x_dict
            if block and type(self.conv) is HeteroGraphConv:
                # Its relations into a type without destinations in this batch are left
                # out (they have no row to compute; a residual GATConv's view of 0 rows
                # fails): the destination inputs of the other types, as it slices them.
                dst_inputs = {
                    names[t]: x_dict[names[t]][:k]
                    for t, k in firsts.items()
                    if k and names[t] in x_dict
                }
                inputs = (x_dict, dst_inputs)
            with zero_in_degree_allowed(self.conv):
                result = self.conv(graph, inputs, mod_kwargs=mod_kwargs or None)
        else:
            result = self.conv(x_dict, edge_index_dict)
        out = x.new_zeros((num_dst if block else n, *self.out_shape))
        for name, y in result.items():
            t = index(name)
            if y is not None and t in rows:
                out[rows[t], : y.shape[1]] = y
        return out

    def extra_repr(self) -> str:
        rels = ", ".join("__".join(k) for _, k in self.relations)
        return f"relations=[{rels}], out_width={self.out_width}"
