"""GCN (Kipf & Welling) on a batch, with whole-graph degree normalization.

.. math::
    h_v' = \\Theta^\\top \\sum_{u \\in N_{in}(v) \\cup \\{v\\}}
           \\frac{w_{uv}}{\\sqrt{\\hat d_u \\hat d_v}}\\, h_u + b,
    \\qquad \\hat d_v = w_{vv} + \\sum_{u \\in N_{in}(v) \\setminus \\{v\\}} w_{uv}

Exactness: :math:`\\hat d_u` is the *source* node's in-degree in the whole graph, which a
batch does not see (a neighbour's own in-edges are not in the batch). ``prepare`` computes
the normalized weight of every CSC edge and every self-loop once per graph, mirroring
PyG's ``gcn_norm`` (``add_remaining_self_loops`` keeps one loop per node, an existing
loop keeps weight 1, otherwise the fill value). The fill value is *measured* from the
installed PyG once: without edge weights, PyG 2.8 ignores ``improved`` (loops get 1), while
older releases used 2 — hopserve matches whichever is installed. Each batch
then runs the conv's own forward with ``normalize`` switched off and those weights as the
sparse adjacency's values.

Edge weights: a ``GCNConv`` called with ``edge_weight`` (served from the store's column,
:class:`~.base.EdgeInput`) normalizes as PyG's ``gcn_norm`` does with weights: :math:`w_{uv}`
is the edge's weight, the loop of a node that has one keeps its weight (the last of
several, in CSC order, which keeps parallel edges in input order as PyG's
``add_remaining_self_loops`` does), the others get the fill value (2 with ``improved``,
else 1: with weights PyG uses ``improved``), and :math:`\\hat d_v` sums the weights of
``v``'s in-edges and its loop. The per-node :math:`\\hat d^{-1/2}` table and, per batch,
the gathered weights ``edge_weight[batch.edge_ids]`` give every edge its whole-graph
normalized weight; ``normalize=False`` uses the raw weights. Sampled batches sum the weights
of each source's :math:`G_l` in-edges (its sample, hashed again per batch).

Sampling: a sampled batch (``batch.sampling`` set, fanout below the graph's maximum
in-degree) belongs to :math:`G_l`, the graph in which every node keeps its sampled in-edges
at layer :math:`l`; the model's forward on :math:`G_l` normalizes by :math:`G_l`'s degrees,
so :math:`\\hat d` is taken there: :math:`\\hat d_u = w^{G_l}_{uu} + \\#\\{` sampled non-loop
in-edges of :math:`u\\}`, where :math:`w^{G_l}_{uu}` is 1 when one of ``u``'s sampled in-edges
is a self-loop, else the fill value (the exact path's rule, applied to :math:`G_l`). This
holds for every source ``u`` of the batch, including nodes that are not destinations of
the request: their :math:`G_l` in-degree is :math:`\\min(d_u, f)` and only nodes with a
self-loop and more than ``f`` in-edges need their own sample (hashing their in-edges,
:func:`~hopserve.worker.graph.planner.sampled_in_degrees`), memoized per
``(layer, fanout, seed)`` in an int32 ``[N]`` table (a few kept, only for graphs with
self-loops). Without ``add_self_loops``, :math:`\\hat d_u = \\min(d_u, f)`. Whole-graph
weights would shrink a sampled hub's row by about :math:`\\sqrt{f / d}`.
"""

from __future__ import annotations

import functools
import threading
from collections import OrderedDict

import numpy as np
import torch
from torch import Tensor, nn

from hopserve.worker.convs.base import ConvAdapter, LayerBatch, Sampling, UnsupportedConvError
from hopserve.worker.convs.layer_table import LayerTableCache, full_layer
from hopserve.worker.graph.planner import sample_in_edges, sampled_in_degrees

# Sampled (layer, fanout, seed) self-loop tables kept per adapter (int32 [N] each).
SAMPLED_CACHE_SIZE = 4
# Edges per step while building a full layer's normalized edge weights.
FULL_WEIGHT_CHUNK_EDGES = 1 << 20


@functools.cache
def pyg_loop_fill(improved: bool) -> float:
    """The self-loop weight PyG's ``gcn_norm`` really uses when no edge weights are given.

    On the graph ``0 → 1``, node 1's loop weight is ``fill / (1 + fill)``.
    """
    from torch_geometric.nn.conv.gcn_conv import gcn_norm

    edge_index, weight = gcn_norm(
        torch.tensor([[0], [1]]), None, 2, improved=improved, add_self_loops=True
    )
    loop = weight[(edge_index[0] == 1) & (edge_index[1] == 1)].double().item()
    return round(loop / (1.0 - loop), 6)


class GCNAdapter(ConvAdapter):
    """Runs ``GCNConv`` exactly on a batch using precomputed global edge weights."""

    accepts_edge_data = True

    def __init__(self, conv: nn.Module) -> None:
        super().__init__(conv)
        self._graph_key: object | None = None
        self._edge_weight: Tensor | None = None  # [E] per CSC edge, full layers (lazy)
        self._dinv: Tensor | None = None  # float64 [N]: the normalization's d^-1/2
        self._graph = None
        self._loop_weight: Tensor | None = None  # [N] added self-loop weight (or None)
        self._fill = 1.0
        self._topology = None  # the graph's GraphTopology (sampled batches read its CSC)
        self._max_in_degree = 0
        self._graph_loops: Tensor | None = None  # [N] self-loops per node (None: no loops)
        self._sampled_loops: OrderedDict[Sampling, Tensor] = OrderedDict()
        self._sample_lock = threading.Lock()
        self._device_weights: dict[tuple[str, str], Tensor] = {}  # per graph, see prepare
        self._weight: Tensor | None = None  # float32 [E] the graph's edge weights (if used)
        self._tables = LayerTableCache()  # x Θ of a full layer, while it runs

    def set_edge_inputs(self, inputs, model_edge_args, model_name, edge_feature_dim=None):  # noqa: ANN001
        for inp in inputs:
            if inp.param != "edge_weight" or inp.column != "weight":
                raise UnsupportedConvError(
                    f"'{inp.arg}' is passed as {type(self.conv).__name__}'s '{inp.param}'; "
                    "it takes edge weights (an edge_weight-like argument) only"
                )
        super().set_edge_inputs(inputs, model_edge_args, model_name, edge_feature_dim)

    def prepare(self, graph) -> None:  # graph: GraphStore
        """Per-node normalization of ``graph`` in ``O(N)`` (degrees and self-loop counts
        come from its topology, which a living graph carries over between versions); the
        per-edge weights of full layers are built on their first use (``O(E)``), so a
        graph update costs online jobs nothing per edge. With edge weights, ``O(E)``."""
        self.bind_edge_data(graph)
        key = (id(graph), getattr(graph, "version", None))
        if key == self._graph_key:
            return
        self._weight = self._edge_weights(graph) if self.edge_inputs else None
        if self._weight is not None:
            self._prepare_weighted(graph, key)
            return
        topology = graph.topology
        n = graph.num_nodes
        in_deg = torch.from_numpy(np.asarray(topology.in_degrees))
        self._topology = topology
        self._graph = graph
        self._max_in_degree = int(in_deg.max()) if n else 0
        self._graph_loops = None
        self._edge_weight = None
        with self._sample_lock:
            self._sampled_loops.clear()
            self._device_weights.clear()
        if not self.normalizes:
            self._dinv, self._loop_weight = None, None
        elif self.adds_self_loops:
            loops = torch.from_numpy(np.asarray(topology.self_loop_counts)).long()
            has_loop = loops > 0
            if bool(has_loop.any()):
                self._graph_loops = loops.int()
            fill = pyg_loop_fill(self.improved)
            loop_w = torch.where(has_loop, 1.0, fill).to(torch.float64)
            deg = loop_w + (in_deg - loops).to(torch.float64)
            dinv = deg.pow(-0.5)
            dinv[torch.isinf(dinv)] = 0
            self._dinv = dinv
            self._loop_weight = (loop_w * dinv * dinv).float()
            self._fill = fill
        else:
            dinv = in_deg.to(torch.float64).pow(-0.5)
            dinv[torch.isinf(dinv)] = 0
            self._dinv = dinv
            self._loop_weight = None
        self._graph_key = key

    def _edge_weights(self, graph) -> Tensor | None:  # noqa: ANN001 - a GraphStore
        """The ``[E]`` edge weights the normalization uses (CSC order): the store's."""
        return self._edge_columns.get("weight")

    def _prepare_weighted(self, graph, key) -> None:  # noqa: ANN001
        r"""``gcn_norm`` with edge weights: :math:`\hat d` sums weights (see the module doc)."""
        topology = graph.topology
        n = graph.num_nodes
        in_deg = torch.from_numpy(np.asarray(topology.in_degrees))
        self._topology, self._graph = topology, graph
        self._max_in_degree = int(in_deg.max()) if n else 0
        self._graph_loops, self._edge_weight = None, None
        with self._sample_lock:
            self._sampled_loops.clear()
            self._device_weights.clear()
        self._fill = 2.0 if self.improved else 1.0
        if not self.normalizes:
            self._dinv, self._loop_weight = None, None
            self._graph_key = key
            return
        w = self._weight.to(torch.float64)
        src = graph.indices.long()
        dst = torch.repeat_interleave(torch.arange(n), in_deg)
        is_loop = src == dst
        deg = torch.zeros(n, dtype=torch.float64)
        if self.adds_self_loops:
            loop_w = _last_loop_weight(dst, is_loop, w, n, self._fill)
            deg.index_add_(0, dst[~is_loop], w[~is_loop])
            deg += loop_w
        else:
            deg.index_add_(0, dst, w)
        dinv = deg.pow(-0.5)
        dinv[torch.isinf(dinv)] = 0
        self._dinv = dinv
        self._loop_weight = (loop_w * dinv * dinv).float() if self.adds_self_loops else None
        self._graph_key = key

    def _full_edge_weight(self) -> Tensor:
        """``[E]`` weight of every CSC edge (0 for loops when loops are re-added), built
        once per graph on the first full layer, a run of destinations at a time (float64
        products, as in ``prepare``; transient memory ``O(E / chunks)``, not ``O(E)``)."""
        with self._sample_lock:
            if self._edge_weight is None:
                graph = self._graph
                indptr = torch.as_tensor(graph.indptr).long()
                indices = graph.indices
                out = torch.empty(int(indptr[-1]), dtype=torch.float32)
                n = graph.num_nodes
                step = max(1, n * FULL_WEIGHT_CHUNK_EDGES // max(1, out.numel()))
                for a in range(0, n, step):
                    b = min(n, a + step)
                    lo, hi = int(indptr[a]), int(indptr[b])
                    src = indices[lo:hi].long()
                    dst = torch.repeat_interleave(torch.arange(a, b), indptr[a : b + 1].diff())
                    w = self._dinv[src] * self._dinv[dst]
                    if self._weight is not None:
                        w = w * self._weight[lo:hi].to(torch.float64)
                    if self._loop_weight is not None:
                        w[src == dst] = 0.0
                    out[lo:hi] = w
                self._edge_weight = out
            return self._edge_weight

    # The conv's ``gcn_norm`` flags; subclasses for other gcn-normalized convs override them.
    @property
    def normalizes(self) -> bool:
        """Whether the conv normalizes by degrees at all (``normalize``)."""
        return bool(self.conv.normalize)

    @property
    def adds_self_loops(self) -> bool:
        """Whether ``gcn_norm`` adds the remaining self-loops (``add_self_loops``)."""
        return bool(self.conv.add_self_loops)

    @property
    def improved(self) -> bool:
        """``gcn_norm``'s ``improved`` flag (the self-loop fill value)."""
        return bool(self.conv.improved)

    def _samples_graph(self, batch: LayerBatch) -> bool:
        """Whether ``batch``'s graph :math:`G_l` differs from the whole graph."""
        s = batch.sampling
        return s is not None and s.fanout < self._max_in_degree

    def _adjacency(self, batch: LayerBatch, dtype: torch.dtype) -> Tensor:
        if self._dinv is None:  # normalize=False: plain (weighted) sum over in-edges
            if self._weight is not None:
                return batch.adj_t(values=self._batch_weights(batch).to(dtype))
            return batch.adj_t(dtype=dtype)
        if self._samples_graph(batch):
            if self._weight is not None:
                return self._sampled_weighted_adjacency(batch, dtype)
            return self._sampled_adjacency(batch, dtype)
        device = batch.src_index.device
        if batch.dst_start is not None:  # a full layer: the per-edge weights, gathered
            w = self._weights_on(device, "edge")[batch.edge_ids]
        else:  # a frontier: w_uv = d_u^-1/2 d_v^-1/2 from the per-node table, O(batch)
            dinv = self._weights_on(device, "dinv")
            src = batch.src_index if batch.global_src_size else batch.src_nodes[batch.src_index]
            w = dinv[src] * dinv[batch.dst_nodes[batch.dst_index]]
            if self._weight is not None:
                w = w * self._batch_weights(batch).to(torch.float64)
            w = w.float()
        if self._loop_weight is None:
            return batch.adj_t(values=w.to(dtype))
        loop_w = self._weights_on(device, "loop")
        if batch.dst_start is not None:  # a contiguous run of destinations: a view
            loop_w = loop_w[batch.dst_start : batch.dst_start + batch.num_dst]
        else:
            loop_w = loop_w[batch.dst_nodes]
        return _one_loop_each(batch, w, loop_w, dtype)

    def _weights_on(self, device: torch.device, which: str) -> Tensor:
        """The edge (``"edge"``) or self-loop (``"loop"``) weights on ``device``, copied
        there once per graph (not once per batch)."""
        host = {
            "edge": self._full_edge_weight if which == "edge" else None,
            "dinv": self._dinv,
            "loop": self._loop_weight,
            "weight": self._weight,
        }[which]
        if callable(host):
            host = host()
        if device.type == "cpu":
            return host
        key = (which, str(device))
        with self._sample_lock:
            cached = self._device_weights.get(key)
            if cached is None:
                cached = self._device_weights[key] = host.to(device)
        return cached

    def _source_stats(self, sampling: Sampling, nodes: Tensor) -> tuple[Tensor, Tensor]:
        """:math:`G_l` in-degree and self-loop count of storage ``nodes`` (CPU int64)."""
        indptr = torch.from_numpy(self._topology.indptr)
        deg = indptr[nodes + 1] - indptr[nodes]
        kept = deg.clamp(max=sampling.fanout)
        if self._graph_loops is None:  # no self-loop anywhere (or none counted)
            return kept, torch.zeros_like(kept)
        with self._sample_lock:
            table = self._sampled_loops.get(sampling)
            if table is None:
                table = torch.full((self._graph_loops.numel(),), -1, dtype=torch.int32)
                self._sampled_loops[sampling] = table
                while len(self._sampled_loops) > SAMPLED_CACHE_SIZE:
                    self._sampled_loops.popitem(last=False)
            else:
                self._sampled_loops.move_to_end(sampling)
            loops = table[nodes].long()
            miss = loops < 0
            if bool(miss.any()):
                _, counted = sampled_in_degrees(
                    self._topology.indptr,
                    self._topology.indices,
                    nodes[miss].numpy(),
                    sampling.fanout,
                    sampling.layer,
                    sampling.seed,
                    self._graph_loops.numpy(),
                )
                found = torch.from_numpy(counted)
                table[nodes[miss]] = found.int()
                loops[miss] = found
        return kept, loops

    def _sampled_adjacency(self, batch: LayerBatch, dtype: torch.dtype) -> Tensor:
        """The batch's adjacency normalized by the degrees of its sampled graph :math:`G_l`."""
        device = batch.src_index.device
        nodes = batch.src_nodes.cpu()
        deg, loops = self._source_stats(batch.sampling, nodes)
        if self.adds_self_loops:
            loop_w = torch.where(loops > 0, 1.0, self._fill).to(torch.float64)
            d_hat = loop_w + (deg - loops).to(torch.float64)
        else:
            d_hat = deg.to(torch.float64)
        dinv = d_hat.pow(-0.5)
        dinv[torch.isinf(dinv)] = 0
        dinv = dinv.to(device)
        w = (dinv[batch.src_index] * dinv[batch.dst_index]).float()
        if not self.adds_self_loops:
            return batch.adj_t(values=w.to(dtype))
        n_dst = batch.num_dst
        own = (loop_w.to(device)[:n_dst] * dinv[:n_dst] * dinv[:n_dst]).float()
        return _one_loop_each(batch, w, own, dtype)

    def _batch_weights(self, batch: LayerBatch) -> Tensor:
        """The raw edge weights of the batch's edges (float32, the batch's device)."""
        return self._weights_on(batch.edge_ids.device, "weight")[batch.edge_ids]

    def _sampled_weighted_adjacency(self, batch: LayerBatch, dtype: torch.dtype) -> Tensor:
        """The batch's adjacency normalized by :math:`G_l`'s weighted degrees: each source's
        sampled in-edges (hashed again, ``O`` of their in-degrees) and their weights."""
        device = batch.src_index.device
        s = batch.sampling
        nodes = batch.src_nodes.cpu().numpy()
        topo = self._topology
        local, pos = sample_in_edges(topo.indptr, nodes, s.fanout, s.layer, s.seed)
        counts = torch.from_numpy(np.diff(local))
        seg = torch.repeat_interleave(torch.arange(nodes.size), counts)
        pos_t = torch.from_numpy(np.asarray(pos, dtype=np.int64))
        w = self._weight[pos_t].to(torch.float64)
        is_loop = (
            torch.from_numpy(topo.indices[pos].astype(np.int64)) == torch.from_numpy(nodes)[seg]
        )
        deg = torch.zeros(nodes.size, dtype=torch.float64)
        if self.adds_self_loops:
            loop_w = _last_loop_weight(seg, is_loop, w, nodes.size, self._fill)
            deg.index_add_(0, seg[~is_loop], w[~is_loop])
            deg += loop_w
        else:
            deg.index_add_(0, seg, w)
        dinv = deg.pow(-0.5)
        dinv[torch.isinf(dinv)] = 0
        dinv = dinv.to(device)
        ew = (dinv[batch.src_index] * dinv[batch.dst_index]).float() * self._batch_weights(batch)
        if not self.adds_self_loops:
            return batch.adj_t(values=ew.to(dtype))
        n_dst = batch.num_dst
        own = (loop_w.to(device)[:n_dst] * dinv[:n_dst] * dinv[:n_dst]).float()
        return _one_loop_each(batch, ew, own, dtype)

    def edge_bytes(self, src_row_bytes: int) -> int:
        # SpMM over a re-built CSR: indices, weights and the sort permutation per edge.
        return 40

    @property
    def supports_global_src(self) -> bool:
        return type(self.conv).forward is _GCN_FORWARD  # the steps run() repeats

    @property
    def global_src_full_layers_only(self) -> bool:
        return True

    def run(self, x: Tensor, batch: LayerBatch) -> Tensor:
        conv = self.conv
        adj = self._adjacency(batch, x.dtype)
        if not self.supports_global_src:  # a subclass's own forward: run it as written
            with self._lock:
                saved = conv.normalize
                conv.normalize = False
                try:
                    return conv(x, adj)
                finally:
                    conv.normalize = saved
        from torch_geometric.utils import spmm

        if self._aggregates_first(x, batch, adj):
            out = conv.lin(spmm(adj, x, reduce=conv.aggr))
        elif full_layer(batch):  # x Θ once per layer, read by every batch
            key = self._table_key(batch.layer)
            table = self._tables.get(x, key, batch, lambda: conv.lin(x))
            out = spmm(adj, table, reduce=conv.aggr)
        else:
            out = spmm(adj, conv.lin(x), reduce=conv.aggr)
        return out if conv.bias is None else out + conv.bias

    def _table_key(self, layer: int) -> tuple:
        weight = self.conv.lin.weight
        return (layer, id(weight), weight._version)

    @property
    def full_layer_table_only(self) -> bool:
        """A full layer that projects first (``in > out``) reads only ``x Θ``."""
        if not self.supports_global_src:
            return False
        d_out, d_in = self.conv.lin.weight.shape
        return d_in > d_out

    def derive_full_layer_table(self, x: Tensor, stand_in: Tensor, layer: int) -> None:
        self._tables.put(stand_in, self._table_key(layer), self.conv.lin(x))

    def drop_full_layer_table(self) -> None:
        self._tables.clear()

    def _aggregates_first(self, x: Tensor, batch: LayerBatch, adj: Tensor) -> bool:
        r"""Whether :math:`(\hat A x)\,\Theta` costs less than :math:`\hat A (x\Theta)` (the
        same function; ``GCNConv`` projects first, DGL's ``GraphConv`` picks the cheaper).

        Multiply-adds, with :math:`E` the batch's edges: projecting first costs
        :math:`n_{src} d_{in} d_{out} + E d_{out}`, aggregating first
        :math:`E d_{in} + n_{dst} d_{in} d_{out}`. On a full layer the projection is done
        once for all batches (:math:`n_{src} = n_{dst} = N`), so only the widths decide;
        at equal widths aggregating first also saves the ``[N, d_out]`` table."""
        d_out, d_in = self.conv.lin.weight.shape
        if full_layer(batch):
            return d_in <= d_out
        edges = adj._nnz()
        project_first = x.shape[0] * d_in * d_out + edges * d_out
        aggregate_first = edges * d_in + batch.num_dst * d_in * d_out
        return aggregate_first < project_first


def _gcn_forward():  # noqa: ANN202 - the class's forward, to tell overrides apart
    from torch_geometric.nn import GCNConv

    return GCNConv.forward


_GCN_FORWARD = _gcn_forward()


def _last_loop_weight(owner: Tensor, is_loop: Tensor, w: Tensor, n: int, fill: float) -> Tensor:
    """float64 ``[n]``: the weight of each owner's last self-loop (edges grouped by owner,
    in order), else ``fill``: what PyG's ``add_remaining_self_loops`` keeps."""
    loop_w = torch.full((n,), float(fill), dtype=torch.float64)
    at = is_loop.nonzero().squeeze(1)
    if at.numel():
        who = owner[at]
        last = torch.ones_like(who, dtype=torch.bool)
        last[:-1] = who[1:] != who[:-1]
        loop_w[who[last]] = w[at[last]]
    return loop_w


def _one_loop_each(batch: LayerBatch, w: Tensor, loop_w: Tensor, dtype: torch.dtype) -> Tensor:
    """``[B, n_src]`` CSR: the batch's non-loop edges weighted ``w``, one loop per destination.

    Existing self-loops are dropped; destination ``i`` gets the loop ``(i, i)`` weighted
    ``loop_w[i]`` (PyG's ``add_remaining_self_loops``), placed last in its row. Rows are
    already grouped (CSC order), so every entry's position is computed, not sorted: a kept
    edge moves up by its row index (one loop before it per earlier row), O(E).
    """
    device = batch.src_index.device
    n_dst = batch.num_dst
    # Gathered sources number destinations 0..B-1; global ones are storage ids (a full
    # layer's destinations are the run dst_start … dst_start+B-1).
    offset = batch.dst_start if batch.global_src_size is not None else 0
    dst = batch.dst_index
    keep = batch.src_index != dst + offset
    kept_dst = dst[keep]
    counts = torch.bincount(kept_dst, minlength=n_dst) + 1
    indptr = torch.zeros(n_dst + 1, dtype=torch.long, device=device)
    torch.cumsum(counts, 0, out=indptr[1:])
    total = int(kept_dst.numel()) + n_dst
    cols = torch.empty(total, dtype=torch.long, device=device)
    vals = torch.empty(total, dtype=dtype, device=device)
    edge_pos = torch.arange(kept_dst.numel(), device=device) + kept_dst
    loop_pos = indptr[1:] - 1
    cols[edge_pos] = batch.src_index[keep]
    vals[edge_pos] = w[keep].to(dtype)
    cols[loop_pos] = torch.arange(n_dst, device=device) + offset
    vals[loop_pos] = loop_w.to(dtype)
    return torch.sparse_csr_tensor(
        indptr, cols, vals, size=(n_dst, batch.num_src), check_invariants=False
    )
