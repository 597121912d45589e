"""The adapters of a dict model's typed layers (:mod:`hopserve.worker.hetero.modules`).

:class:`HeteroLayerAdapter` (a ``HeteroConv``, or one relation conv of ``to_hetero``): per
batch and destination type ``t``, each relation ``r = (s, ·, t)`` runs its own conv on the
batch's in-edges of ``r`` (the ``edge_type`` column), with the batch's type-``t``
destinations as the destination side and their ``r``-sources as the source side, then the
``HeteroConv``'s aggregation joins the relations. A same-type relation runs on one square
table whose first rows are the destinations, so a source that is also a destination of
the batch is one row (a conv that adds or removes self-loops sees them as loops).

:class:`DictConvAdapter` (``HGTConv``): the conv on the batch's typed subgraph.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from hopserve.worker.convs.base import ConvAdapter, LayerBatch
from hopserve.worker.convs.layer_table import full_layer
from hopserve.worker.convs.message_passing import (
    aggregates_raw_sources,
    fuses_sparse_aggregation,
)
from hopserve.worker.graph.node_types import relation_triple
from hopserve.worker.graph.relation_csc import RelationCSC
from hopserve.worker.hetero.modules import (
    DictConvLayer,
    HeteroLayer,
    csc_indptr,
    edge_columns,
    group_relations,
    relation_edge_data,
    zero_in_degree_allowed,
)

__all__ = ["DictConvAdapter", "HeteroLayerAdapter"]


# DGL HeteroGraphConv aggregations whose result does not depend on the relations' order.
def _dgl_reducer(agg_fn: Any) -> str | None:
    """``"sum"``, ``"mean"``, ``"max"`` or ``"min"`` when a ``HeteroGraphConv``'s
    ``agg_fn`` is DGL's own (``partial(_agg_func, fn=<DGL's reducer>)``, compared by
    identity: a user's function of the same name is not), whose result does not depend
    on the relations' order; else ``None``."""
    from dgl.nn.pytorch import hetero

    if getattr(agg_fn, "func", None) is not hetero._agg_func:
        return None
    inner = agg_fn.keywords.get("fn")
    reducers = {
        hetero._sum_reduce_func: "sum",
        hetero._mean_reduce_func: "mean",
        hetero._max_reduce_func: "max",
        hetero._min_reduce_func: "min",
    }
    return reducers.get(inner)


def _is_dgl_hetero_graph_conv(conv: Any) -> bool:
    """DGL's own ``HeteroGraphConv`` (not a subclass or a class of the same name: the
    in-place path repeats its forward)."""
    from dgl.nn.pytorch import HeteroGraphConv

    return type(conv) is HeteroGraphConv


# Per edge of a batch's typed subgraph: relation ids and end types (int64 each), the edge
# masks and positions, the per-relation edge lists and DGL's formats of them.
_SUBGRAPH_EDGE_BYTES = 96
# Per edge of a batch read in place (one relation at a time): its relation id, the run's
# relation mask and source-type test, and the relation's edge positions, sources and
# destinations.
_IN_PLACE_EDGE_BYTES = 40


class _TypedAdapter(ConvAdapter):
    """An adapter of a typed layer: reads relation ids, checks the graph's type layout."""

    accepts_edge_data = True

    def prepare(self, graph: Any) -> None:
        """Follow the graph's type ranges (a live graph appends runs to its types); refuse
        a typed graph whose types or relations are not those the model was split for."""
        self.conv.layout.bind(graph)
        super().prepare(graph)


class HeteroLayerAdapter(_TypedAdapter):
    """Runs a :class:`HeteroLayer` on a :class:`LayerBatch` (see the module doc)."""

    @property
    def supports_global_src(self) -> bool:
        """Relation convs that aggregate raw source rows (``SAGEConv`` without projection,
        ``GraphConv``, ``GINConv``) and take no edge data read the layer's stored table in
        place: no gathered source rows, no per-relation source table; a sum or mean is
        one SpMM per relation over the batch's relation edges."""
        layer: HeteroLayer = self.conv
        return all(aggregates_raw_sources(c) for c in layer.convs) and not any(
            call.edge_data for call in layer.calls
        )

    def run(self, x: Tensor, batch: LayerBatch) -> Tensor:
        layer: HeteroLayer = self.conv
        num_dst = batch.num_dst
        dst_types = layer.layout.types_of(batch.dst_nodes, num_dst, x.device)
        src_index = batch.src_index
        in_place = batch.global_src_size is not None  # x: the stored table, by storage id
        x_dst_rows = batch.dst_rows(x)
        out = x.new_zeros((num_dst, *layer.out_shape))
        if in_place:  # by runs of same-type destinations, each run's edges one slice
            by_dst = dict(layer.by_dst)
            split = _relation_split(batch, x, layer.layout)
            edge_type = None if split is not None else self.edge_values(batch)["edge_type"]
            for t, a, b, e0, e1 in _destination_runs(dst_types, batch.indptr):
                if t not in by_dst:
                    continue
                x_dst = x_dst_rows[a:b, : layer.in_widths[t]]
                outs = []
                for k in by_dst[t]:
                    relation = layer.calls[k].relation
                    edges = _run_edges(batch, split, edge_type, relation, (a, b, e0, e1))
                    outs.append(self._relation_in_place(layer, k, x, x_dst, *edges))
                y = group_relations(outs, layer.aggr)
                out[a:b, : y.shape[1]] = y
            return out
        values = self.edge_values(batch)
        edge_type = values["edge_type"]
        columns = edge_columns(values.get("edge_attr"), values.get("edge_weight"))
        dst_index = batch.dst_index
        for t, ks in layer.by_dst:
            dst_sel = (dst_types == t).nonzero().squeeze(1)
            if dst_sel.numel() == 0:
                continue
            pos_in_t = torch.full((num_dst,), -1, dtype=torch.long, device=x.device)
            pos_in_t[dst_sel] = torch.arange(dst_sel.numel(), device=x.device)
            x_dst = x_dst_rows.index_select(0, dst_sel)[:, : layer.in_widths[t]]
            outs = []
            at_t = pos_in_t[dst_index]
            for k in ks:
                # A typed store's relation-r edges all end in type t; the load-time probe
                # graph's need not, and the layer's forward ignores those (rows of t only).
                on = ((edge_type == layer.calls[k].relation) & (at_t >= 0)).nonzero().squeeze(1)
                src = src_index.index_select(0, on)
                dst = at_t.index_select(0, on)
                kw = relation_edge_data(layer.calls[k], columns, on)
                outs.append(self._relation(layer, k, x, x_dst, src, dst, pos_in_t, kw))
            y = group_relations(outs, layer.aggr)
            out[dst_sel, : y.shape[1]] = y
        return out

    @staticmethod
    def _relation_in_place(
        layer: HeteroLayer,
        k: int,
        x: Tensor,
        x_dst: Tensor,
        src: Tensor,
        dst: Tensor | None,
        indptr: Tensor | None,
    ) -> Tensor:
        """One relation conv (a raw-source aggregator, :attr:`supports_global_src`) over
        the stored table ``x`` read in place: ``src`` are storage ids, grouped by
        destination among the batch's destinations of the relation's type, given as each
        edge's position ``dst`` (non-decreasing) or as CSC offsets ``indptr`` (the other
        ``None``). Its pair form equals its square form (no self-loops), so a same-type
        relation runs as a pair too."""
        call, conv = layer.calls[k], layer.convs[k]
        num_t = x_dst.shape[0]
        width = layer.in_widths[call.src]
        fused = width == x.shape[1] and fuses_sparse_aggregation(conv)
        if dst is None and not fused:
            dst = _destinations(indptr)
        if width != x.shape[1]:  # a narrower type: a table of its rows, not a strided view
            uniq, local = _compact(src, x.shape[0])
            return conv((x.index_select(0, uniq)[:, :width], x_dst), torch.stack([local, dst]))
        if fused:
            crow = csc_indptr(dst, num_t) if indptr is None else indptr
            ones = torch.ones(src.numel(), dtype=x.dtype, device=x.device)
            adj = torch.sparse_csr_tensor(
                crow, src, ones, size=(num_t, x.shape[0]), check_invariants=False
            )
            return conv((x, x_dst), adj)
        return conv((x, x_dst), torch.stack([src, dst]))

    @staticmethod
    def _relation(
        layer: HeteroLayer,
        k: int,
        x: Tensor,
        x_dst: Tensor,
        src: Tensor,
        dst: Tensor,
        pos_in_t: Tensor,
        edge_kw: dict[str, Tensor],
    ) -> Tensor:
        """One relation conv's output for the batch's destinations of its type
        (``edge_kw``: its edge data keywords, rows of the ``src``/``dst`` edges)."""
        call, conv = layer.calls[k], layer.convs[k]
        num_t = x_dst.shape[0]
        if call.src != call.dst:
            uniq, local = _compact(src, x.shape[0])
            x_src = x.index_select(0, uniq)[:, : layer.in_widths[call.src]]
            return conv((x_src, x_dst), torch.stack([local, dst]), **edge_kw)
        # One square table: the destinations first, then the other sources.
        num_dst = pos_in_t.numel()
        at_dst = torch.full_like(src, -1)
        in_batch = src < num_dst
        at_dst[in_batch] = pos_in_t[src[in_batch]]
        is_dst = at_dst >= 0
        others, at_others = _compact(src, x.shape[0], keep=~is_dst)
        local = torch.where(is_dst, at_dst, num_t + at_others)
        width = layer.in_widths[call.dst]
        table = torch.cat([x_dst, x.index_select(0, others)[:, :width]])
        return conv(table, torch.stack([local, dst]), **edge_kw)[:num_t]


def _relation_split(batch: LayerBatch, x: Tensor, layout: Any) -> RelationCSC | None:
    """The per-relation CSC of a full layer's contiguous run read in place on the CPU
    (:attr:`LayerBatch.graph`), whose slices replace a scan of the batch's relation ids
    per relation; ``None`` for other batches, and for a graph the layer's type layout is
    not bound to (the load-time probe graph: its relation ids need not be the layer's)."""
    graph = batch.graph
    if graph is None or batch.dst_start is None or x.device.type != "cpu":
        return None
    relations = getattr(graph, "relations", None) or ()
    if not getattr(graph, "node_types", None) or len(relations) != len(layout.relations):
        return None
    if any(relation_triple(r) != t for r, t in zip(relations, layout.relations, strict=True)):
        return None
    return getattr(graph, "relation_csc", None)


def _run_edges(
    batch: LayerBatch,
    split: RelationCSC | None,
    edge_type: Tensor | None,
    relation: int,
    run: tuple[int, int, int, int],
) -> tuple[Tensor, Tensor | None, Tensor | None]:
    """``(src, dst, indptr)``: relation ``relation``'s in-edges of a run of destinations of
    ``batch`` (``run``: its first and end destination and edge, :func:`_destination_runs`;
    global sources: storage ids), grouped by destination. From the per-relation CSC
    ``split``: CSC offsets ``indptr``, ``dst`` ``None``; else by a scan of the batch's
    relation ids ``edge_type``: the run's positions ``dst``, ``indptr`` ``None``."""
    a, b, e0, e1 = run
    if split is not None:
        indptr, src = split.in_edges(relation, batch.dst_start + a, batch.dst_start + b)
        return src.long(), None, indptr
    on = (edge_type[e0:e1] == relation).nonzero().squeeze(1).add_(e0)
    dst = batch.dst_index.index_select(0, on).sub_(a)
    return batch.src_index.index_select(0, on), dst, None


def _destinations(indptr: Tensor) -> Tensor:
    """Each edge's destination position from CSC offsets ``indptr`` (non-decreasing)."""
    counts = indptr.diff()
    return torch.repeat_interleave(torch.arange(counts.numel(), device=indptr.device), counts)


def _destination_runs(dst_types: Tensor, indptr: Tensor) -> list[tuple[int, int, int, int, int]]:
    """``(type, first, end, first edge, end edge)`` of each run of same-type destinations
    of a batch (a type's rows are storage-id ranges, so a batch's destinations of one
    type come in a few runs, and, its edges being grouped by destination, so do their
    in-edges: each run's are one slice)."""
    n = dst_types.numel()
    if n == 0:
        return []
    starts = (dst_types[1:] != dst_types[:-1]).nonzero().squeeze(1).add_(1).tolist()
    bounds = [0, *starts, n]
    kinds = dst_types[bounds[:-1]].tolist()
    edges = indptr[bounds].tolist()
    return [(t, bounds[k], bounds[k + 1], edges[k], edges[k + 1]) for k, t in enumerate(kinds)]


def _compact(index: Tensor, n: int, keep: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """``(uniq, position)``: the distinct values of ``index`` (``< n``; only where ``keep``,
    when given) ascending, as ``torch.unique`` gives them, and each entry's position among
    them (meaningful where kept). A mark per row, ``O(n + E)``: no sort of the edges;
    a sort (``torch.unique``) when there are far fewer edges than rows."""
    if index.numel() * 16 < n:
        uniq = torch.unique(index if keep is None else index[keep])
        return uniq, torch.searchsorted(uniq, index).clamp_(max=max(uniq.numel() - 1, 0))
    mark = torch.zeros(n, dtype=torch.bool, device=index.device)
    mark[index if keep is None else index[keep]] = True
    uniq = mark.nonzero().squeeze(1)
    position = torch.cumsum(mark, 0).sub_(1)
    return uniq, position.index_select(0, index)


class DictConvAdapter(_TypedAdapter):
    """Runs a :class:`DictConvLayer` on a batch: the conv on the batch's typed subgraph
    (its destinations, their sources and the in-edges between), destination rows kept."""

    def __init__(self, conv: Any) -> None:
        super().__init__(conv)
        self._relation_bytes: dict[int, int] = {}  # per source row width
        self._gat_tables: dict[tuple[str, str, str], Any] = {}  # per relation: a layer's table

    def edge_bytes(self, src_row_bytes: int) -> int:
        """Per in-edge: the typed subgraph's edge lists, or the in-place path's relation
        selections, and the conv's per-edge rows (HGT: gathered keys, queries, values and
        the messages, about five input-wide rows; DGL's ``HeteroGraphConv``: what its
        relation convs keep per edge, by their own adapters), plus the relations' copies of
        the edge features their convs read."""
        layer: DictConvLayer = self.conv
        edge_data = 8 * (self.edge_feature_dim or 0)
        if layer.style == "dgl" and hasattr(layer.conv, "mods"):
            # in place: every batch of a raw-source layer; with GAT relations, full layers
            # only (src_row_bytes 0: a gather-free batch), partial frontiers gather
            in_place = self.supports_global_src and (
                src_row_bytes == 0 or not self.global_src_full_layers_only
            )
            base = _IN_PLACE_EDGE_BYTES if in_place else _SUBGRAPH_EDGE_BYTES
            return base + self._relation_edge_bytes(src_row_bytes) + edge_data
        return 6 * src_row_bytes + edge_data

    def _relation_edge_bytes(self, src_row_bytes: int) -> int:
        """What the ``HeteroGraphConv``'s relation convs keep per edge, the most of them
        (by their own adapters; asked per batch, so worked out once per row width)."""
        known = self._relation_bytes
        if src_row_bytes not in known:
            from hopserve.worker.convs.registry import adapter_for

            mods = self.conv.conv.mods.values()
            known[src_row_bytes] = max(
                (adapter_for(m, "").edge_bytes(src_row_bytes) for m in mods), default=0
            )
        return known[src_row_bytes]

    @property
    def supports_global_src(self) -> bool:
        """A DGL ``HeteroGraphConv`` whose relation convs reduce raw source rows
        (``GraphConv``, ``GINConv``, ``SAGEConv`` mean/gcn; no edge data) and whose
        aggregation over relations does not depend on their order (sum, mean, max, min)
        reads the stored table in place: each relation conv runs on a block of its
        relation's batch edges whose sources are the table's rows by storage id, as the
        homogeneous DGL adapter runs these convs (:mod:`.dgl_conv`); no typed subgraph, no
        gathered source rows."""
        layer: DictConvLayer = self.conv
        mods = getattr(layer.conv, "mods", None)
        if layer.style != "dgl" or mods is None or layer.edge_data:
            return False
        from hopserve.worker.convs.dgl_conv import aggregates_raw_sources

        return (
            _is_dgl_hetero_graph_conv(layer.conv)
            and _dgl_reducer(layer.conv.agg_fn) is not None
            and all(aggregates_raw_sources(m) or _gat_table(m) for m in mods.values())
        )

    @property
    def global_src_full_layers_only(self) -> bool:
        """With a ``GATConv`` relation: its source table is made once per full layer, which
        a partial frontier must not pay for (it gathers its rows instead)."""
        mods = getattr(self.conv.conv, "mods", None) or {}
        return any(_gat_table(m) for m in mods.values())

    def drop_full_layer_table(self) -> None:
        """After a full layer (the engine): its GAT relations' tables go. Each one goes at
        the batch holding its destination type's last row; this drops those of a layer that
        ended before it (an error, a cancellation)."""
        for cache in self._gat_tables.values():
            cache.clear()

    def run(self, x: Tensor, batch: LayerBatch) -> Tensor:
        layer: DictConvLayer = self.conv
        if batch.global_src_size is not None:  # x: the stored table, by storage id
            return self._run_in_place(x, batch)
        values = self.edge_values(batch)
        columns = edge_columns(values.get("edge_attr"), values.get("edge_weight"))
        types = layer.layout.types_of(batch.src_nodes, batch.num_src, x.device)
        out = layer.on_rows(
            x,
            types,
            batch.src_index,
            batch.dst_index,
            values["edge_type"],
            columns,
            num_dst=batch.num_dst,
        )
        return out[: batch.num_dst]

    def _run_in_place(self, x: Tensor, batch: LayerBatch) -> Tensor:
        """:attr:`supports_global_src`: per run of same-type destinations (a type's rows
        are storage-id ranges, so a batch's destinations of one type come in a few runs,
        and, the batch's edges being grouped by destination, so do their in-edges), each
        relation ``(s, r, t)`` whose end types the layer reads (``HeteroGraphConv`` skips
        the others) runs its conv on ``(x, x_dst)`` over a block of the run's edges of
        ``r`` (sources: storage ids; a narrower source type: a compact table of its rows),
        then the ``HeteroGraphConv``'s own aggregation joins them."""
        layer: DictConvLayer = self.conv
        index, num_dst = layer.layout.index, batch.num_dst
        dst_types = layer.layout.types_of(batch.dst_nodes, num_dst, x.device)
        x_dst_rows = batch.dst_rows(x)
        out = x.new_zeros((num_dst, *layer.out_shape))
        relation_kwargs = layer.relation_kwargs()  # per-relation weights, if any
        by_type = {
            t: [
                (rel, key)
                for rel, key in layer.relations
                if index(key[2]) == t and index(key[0]) in layer.in_widths
            ]
            for t in layer.in_widths
        }
        split = _relation_split(batch, x, layer.layout)
        edge_type = None if split is not None else self.edge_values(batch)["edge_type"]
        tables: dict = {}  # GAT relations' tables, taken once a batch (its runs share them)
        for t, a, b, e0, e1 in _destination_runs(dst_types, batch.indptr):
            relations = by_type.get(t)
            if not relations:
                continue
            x_dst = x_dst_rows[a:b, : layer.in_widths[t]]
            outs = []
            for rel, key in relations:
                src, dst, indptr = _run_edges(batch, split, edge_type, rel, (a, b, e0, e1))
                # A typed store's relation edges start at its source type; a store built
                # from a bare edge list with types (the load-time probe graph) need not, and
                # HeteroGraphConv's forward leaves the others out (the destination's type
                # is the run's).
                s = index(key[0])
                # The store's type indices are the layout's: bind() refuses other types.
                kinds = split.source_types if split is not None else None
                of_type = None if kinds and kinds[rel] <= {s} else layer.layout.is_type(src, s)
                if of_type is not None and not bool(of_type.all()):
                    if indptr is not None:
                        dst = _destinations(indptr)
                    src, dst, indptr = src[of_type], dst[of_type], None
                if indptr is None:  # grouped by destination: dst is non-decreasing
                    indptr = csc_indptr(dst, b - a)
                mod = layer.conv._get_module(key)
                if _gat_table(mod) and full_layer(batch):
                    outs.append(self._gat_relation(x, x_dst, src, indptr, key, batch, tables))
                    continue
                outs.append(self._relation_in_place(x, x_dst, src, indptr, key, relation_kwargs))
            y = _aggregate(layer.conv.agg_fn, outs, layer.layout.names[t])
            out[a:b, : y.shape[1]] = y
            for key in [k for k, table in tables.items() if batch.dst_start + b > table[4]]:
                del tables[key]  # past its destination type's last row: no later run reads it
        return out

    def _relation_in_place(
        self,
        x: Tensor,
        x_dst: Tensor,
        src: Tensor,
        indptr: Tensor,
        key: tuple[str, str, str],
        relation_kwargs: dict[str, dict[str, Tensor]],
    ) -> Tensor:
        """Relation ``key``'s conv on a block of edges ``src`` (storage ids) into
        ``x_dst``'s rows, grouped by destination (CSC offsets ``indptr``)."""
        from hopserve.worker.convs.dgl_conv import aggregate_first, hopserve_block, local_edge_ids

        layer: DictConvLayer = self.conv
        num_t = x_dst.shape[0]
        width = layer.in_widths[layer.layout.index(key[0])]
        x_src = x
        if width != x.shape[1]:  # a narrower type: a table of its rows
            uniq, src = _compact(src, x.shape[0])
            x_src = x.index_select(0, uniq)[:, :width]
        eids = local_edge_ids(src.numel(), x.device)
        block = hopserve_block(indptr, src, eids, x_src.shape[0], num_t)
        mod = layer.conv._get_module(key)
        with zero_in_degree_allowed(mod):
            return aggregate_first(mod)(block, (x_src, x_dst), **relation_kwargs.get(key[1], {}))

    def _gat_relation(
        self,
        x: Tensor,
        x_dst: Tensor,
        src: Tensor,
        indptr: Tensor,
        key: tuple[str, str, str],
        batch: LayerBatch,
        tables: dict,
    ) -> Tensor:
        """Relation ``key``'s ``GATConv`` on a full layer, the steps of its ``forward`` on
        ``(x_src, x_dst)`` (DGL 2.1) as :class:`~.dgl_gat.DGLGATAdapter` runs them: the
        source side — ``W h_u`` per head and ``e^l_u = a_l · W h_u`` over every row of the
        source type — once per layer (as the model's whole-graph forward computes it),
        then per run the destinations' ``e^r_v``, the edge softmax over the run's edges
        ``src`` (storage ids, CSC offsets ``indptr``) and one SpMM per head, the residual,
        bias and activation."""
        import dgl

        from hopserve.worker.convs.dgl_conv import _params_key, hopserve_block, local_edge_ids
        from hopserve.worker.convs.layer_table import (
            LayerTableCache,
            csr_weighted_sum,
            per_head_table,
        )

        layer: DictConvLayer = self.conv
        mod = layer.conv._get_module(key)
        heads, width = mod._num_heads, mod._out_feats
        fc_src, fc_dst = getattr(mod, "fc_src", None), getattr(mod, "fc_dst", None)
        if fc_src is None:  # one fc for both sides (in_feats an int)
            fc_src = fc_dst = mod.fc
        s = layer.layout.index(key[0])
        cache = self._gat_tables.setdefault(key, LayerTableCache())

        def make() -> tuple[Tensor, Tensor, Tensor, int, int]:
            rows = layer.layout.rows_of(None, x.shape[0], s, x.device)  # source type's ids
            at = torch.full((x.shape[0],), -1, dtype=torch.long, device=x.device)
            at[rows] = torch.arange(rows.numel(), device=x.device)  # storage id -> table row
            h = x.index_select(0, rows)[:, : layer.in_widths[s]]
            ft, el = per_head_table(h, fc_src.weight, fc_src.bias, mod.attn_l, heads, width)
            # The relation's last reader: the batch holding its destination type's last row
            last_dst = layer.layout.last_row(layer.layout.index(key[2]), x.shape[0])
            return at, ft, el.transpose(0, 1).contiguous(), rows.numel(), last_dst

        table_key = (batch.layer, _params_key(*fc_src.parameters(), mod.attn_l))
        if key not in tables:  # the batch holds the tables it took (its runs share them)
            tables[key] = cache.get(x, table_key, batch, make)
            if batch.dst_start + batch.num_dst > tables[key][4]:
                cache.release(tables[key])  # no later batch of the layer reads it
        at, ft, el, num_rows, _ = tables[key]
        local = at.index_select(0, src)  # each edge's source row in the table
        num_dst = x_dst.shape[0]
        fd = fc_dst(x_dst).view(num_dst, heads, width)
        er = (fd * mod.attn_r).sum(dim=-1).unsqueeze(-1)
        e = mod.leaky_relu(el.index_select(0, local) + er.index_select(0, _destinations(indptr)))
        block = hopserve_block(
            indptr, local, local_edge_ids(local.numel(), x.device), num_rows, num_dst
        )
        att = dgl.ops.edge_softmax(block, e)
        size = (num_dst, num_rows)
        rst = torch.stack(
            [csr_weighted_sum(indptr, local, att[:, h, 0], ft[h], size) for h in range(heads)],
            dim=1,
        )
        if mod.res_fc is not None:
            rst = rst + mod.res_fc(x_dst).view(num_dst, -1, width)
        if mod.has_explicit_bias:
            rst = rst + mod.bias.view(1, heads, width)
        if mod.activation:
            rst = mod.activation(rst)
        return rst


def _gat_table(conv: Any) -> bool:
    """A relation conv that is DGL's own ``GATConv`` (its class's ``forward``, eval mode, no
    forward hooks): on a full layer its source side is a once-per-layer table."""
    if type(conv).__name__ != "GATConv" or not type(conv).__module__.startswith("dgl."):
        return False
    from hopserve.worker.convs.dgl_gat import _gat_forward, unhooked

    return type(conv).forward is _gat_forward() and not conv.training and unhooked(conv)


def _aggregate(agg_fn: Any, outs: list[Tensor], dsttype: str) -> Tensor:
    """``HeteroGraphConv``'s ``agg_fn(outs, dsttype)``; DGL's sum and mean (``torch.stack``,
    then the reduction over the stack) accumulate into the first output instead: the same
    values, without the ``[R, n, d]`` stack."""
    reducer = _dgl_reducer(agg_fn)
    if reducer not in ("sum", "mean") or len(outs) < 2:
        return agg_fn(outs, dsttype)
    y = outs[0].clone()  # a relation conv's output may be a view of its input
    for other in outs[1:]:
        y.add_(other)
    return y.div_(len(outs)) if reducer == "mean" else y
