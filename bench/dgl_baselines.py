"""What ``dgl_compare.py`` measures hopserve against: the DGL model and DGL's own loops.

:func:`make_model` builds the benchmark's ``dgl.nn`` models (GCN, GraphSAGE, GAT, JKNet);
:func:`dgl_manual` is the ``inference()`` loop of DGL's examples (layer by layer, full
1-hop blocks, fixed batches); :func:`dgl_nodewise` runs ``MultiLayerFullNeighborSampler(L)``
blocks per target batch (DGI Alg. 1). dgl and torch are imported inside the functions,
so importing this module is cheap.
"""

from __future__ import annotations

import time


def make_model(kind: str, layers: int, d_in: int, hidden: int, d_out: int, heads: int):
    """The benchmark's DGL model (seeded): ``forward(g, x)`` is what hopserve is given.

    ``forward_blocks`` is the same computation on a list of DGL blocks (node-wise), and
    ``layer(i, block, h)`` one layer on one block (DGL-manual); all three share modules.
    """
    import dgl.nn as dglnn
    import torch
    import torch.nn.functional as F
    from torch import nn

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.kind, self.num_layers = kind, layers
            jk = kind == "jknet"
            dims = [d_in] + [hidden] * (layers - 1) + ([hidden] if jk else [d_out])
            convs = []
            for i, (a, b) in enumerate(zip(dims, dims[1:], strict=False)):
                if kind in ("gcn", "jknet"):
                    convs.append(dglnn.GraphConv(a, b, norm="both", allow_zero_in_degree=True))
                elif kind == "sage":
                    convs.append(dglnn.SAGEConv(a, b, "mean"))
                elif kind == "gat":
                    last = i == layers - 1
                    h = 1 if last else heads
                    out = b if last else b // heads
                    convs.append(dglnn.GATConv(a, out, h, allow_zero_in_degree=True))
                else:
                    raise ValueError(f"unknown model {kind!r}")
            self.convs = nn.ModuleList(convs)
            self.out = nn.Linear(layers * hidden, d_out) if jk else None

        def step(self, i: int, h):
            """What follows conv ``i`` (node-wise)."""
            if self.kind == "gat":
                h = h.flatten(1)
            if i < self.num_layers - 1 or self.kind == "jknet":
                h = F.relu(h)
            return h

        def head(self, hs):
            """After the last conv: JKNet concatenates all layers (node-wise)."""
            return self.out(torch.cat(hs, dim=-1)) if self.out is not None else hs[-1]

        def forward(self, g, x):
            h, hs = x, []
            for i, conv in enumerate(self.convs):
                h = self.step(i, conv(g, h))
                hs.append(h)
            return self.head(hs)

        def forward_blocks(self, blocks, x):
            h, hs = x, []
            for i, (conv, block) in enumerate(zip(self.convs, blocks, strict=True)):
                h = self.step(i, conv(block, h))
                hs.append(h)
            n = blocks[-1].num_dst_nodes()  # DGL blocks: destinations are a prefix
            return self.head([t[:n] for t in hs])

    torch.manual_seed(0)
    return Net().eval()


def dgl_graph_of(store):
    """The DGL graph of a store in its stored numbering (source = ``indices``)."""
    import dgl
    import torch

    dst = torch.repeat_interleave(torch.arange(store.num_nodes), store.in_degrees)
    return dgl.graph((store.indices.long(), dst), num_nodes=store.num_nodes)


def dgl_manual(model, g, x, batch_size: int):
    """DGL's example ``inference()``: layer by layer, full 1-hop blocks, fixed batches."""
    import torch
    from dgl.dataloading import DataLoader, MultiLayerFullNeighborSampler

    n = g.num_nodes()
    loader = DataLoader(
        g,
        torch.arange(n),
        MultiLayerFullNeighborSampler(1),
        batch_size=batch_size,
        shuffle=False,
        drop_last=False,
        num_workers=0,
    )
    h, hs = x, []
    with torch.no_grad():
        for i, conv in enumerate(model.convs):
            y = None
            for input_nodes, output_nodes, blocks in loader:
                out = model.step(i, conv(blocks[0], h[input_nodes]))
                if y is None:
                    y = torch.empty(n, *out.shape[1:])
                y[output_nodes] = out
            h = y
            hs.append(y)
        if model.out is None:
            return h
        out = torch.empty(n, model.out.out_features)
        for a in range(0, n, batch_size):  # the JK head, node-wise in batches
            out[a : a + batch_size] = model.head([t[a : a + batch_size] for t in hs])
        return out


def dgl_nodewise(model, g, x, targets, batch_size: int, budget_s: float):
    """DGI Alg. 1 with DGL's sampler: L-hop full blocks per target batch, time-capped.

    Returns (rows done, their outputs, seconds).
    """
    import torch
    from dgl.dataloading import DataLoader, MultiLayerFullNeighborSampler

    loader = DataLoader(
        g,
        targets,
        MultiLayerFullNeighborSampler(model.num_layers),
        batch_size=batch_size,
        shuffle=False,
        drop_last=False,
        num_workers=0,
    )
    done, outs = [], []
    t0 = time.perf_counter()
    with torch.no_grad():
        for input_nodes, output_nodes, blocks in loader:
            outs.append(model.forward_blocks(blocks, x[input_nodes]))
            done.append(output_nodes)
            if time.perf_counter() - t0 > budget_s:
                break
    return torch.cat(done), torch.cat(outs), time.perf_counter() - t0
