"""A tiny servable model and the files a worker loads it from (graph store + weights).

``TinySAGE`` is usable as a config entrypoint ``"support.servable:TinySAGE"`` (pytest
puts ``tests/`` on the path). :func:`write_servable` writes a small RCMK-reordered graph
store with non-identity external IDs and the model's weights, and returns a
:class:`Servable` with the matching :class:`ModelConfig` and the full-graph reference.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import nn
from torch_geometric.nn import SAGEConv

from hopserve import GraphStore
from hopserve.config import ModelConfig
from hopserve.proto.contract import Job
from hopserve.worker.graph.planner import plan_frontiers

ENTRYPOINT = "support.servable:TinySAGE"


class TinySAGE(nn.Module):
    """Two-layer GraphSAGE: ``SAGE(in_dim → hidden) → ReLU → SAGE(hidden → out_dim)``."""

    def __init__(self, in_dim: int, hidden: int = 8, out_dim: int = 4) -> None:
        super().__init__()
        self.conv1 = SAGEConv(in_dim, hidden)
        self.conv2 = SAGEConv(hidden, out_dim)

    def forward(self, x: torch.Tensor, edge_index: torch.Tensor) -> torch.Tensor:
        return self.conv2(self.conv1(x, edge_index).relu(), edge_index)


class TinyAPPNP(nn.Module):
    """``Linear → APPNP(K=2)``: a K-hop conv the layer-wise engine refuses (node-wise only)."""

    def __init__(self, in_dim: int, hidden: int = 8, out_dim: int = 4) -> None:
        super().__init__()
        from torch_geometric.nn import APPNP

        self.lin = nn.Linear(in_dim, out_dim)
        self.prop = APPNP(K=2, alpha=0.1)

    def forward(self, x: torch.Tensor, edge_index: torch.Tensor) -> torch.Tensor:
        return self.prop(self.lin(x), edge_index)


class MixesNodes(TinySAGE):
    """``TinySAGE`` with a softmax over the node dimension: not node-wise, so the load-time
    self-check refuses it (its message is several lines: the reason and the schema)."""

    def forward(self, x: torch.Tensor, edge_index: torch.Tensor) -> torch.Tensor:
        return super().forward(x, edge_index).softmax(dim=0)


NotAModel = 42  # an entrypoint target that is not an nn.Module class


@dataclass
class Servable:
    """Everything a test needs to load and check the tiny model."""

    graph_dir: Path
    weights: Path
    kwargs: dict
    model: TinySAGE  # the reference model (same weights)
    store: GraphStore  # the saved store, opened from disk
    reference: torch.Tensor  # full-graph forward, row i = storage node i

    def config(self, name: str = "tiny", version: str = "1", **update) -> ModelConfig:
        fields = {
            "name": name,
            "version": version,
            "entrypoint": ENTRYPOINT,
            "kwargs": self.kwargs,
            "weights": self.weights,
            "graph": self.graph_dir,
        }
        return ModelConfig(**{**fields, **update})


def write_servable(
    root: Path, *, num_nodes: int = 120, num_edges: int = 600, in_dim: int = 6, seed: int = 0
) -> Servable:
    """Write ``root/graph`` and ``root/weights.pt`` for a seeded ``TinySAGE``."""
    gen = torch.Generator().manual_seed(seed)
    edge_index = torch.randint(0, num_nodes, (2, num_edges), generator=gen)
    x = torch.randn(num_nodes, in_dim, generator=gen)
    node_ids = torch.from_numpy(np.arange(num_nodes, dtype=np.int64) * 10 + 7)  # external IDs
    graph_dir = root / "graph"
    GraphStore.from_edge_index(edge_index, x, node_ids=node_ids).save(graph_dir, progress=False)
    kwargs = {"in_dim": in_dim, "hidden": 8, "out_dim": 4}
    torch.manual_seed(seed)
    model = TinySAGE(**kwargs).eval()
    weights = root / "weights.pt"
    torch.save(model.state_dict(), weights)
    store = GraphStore.open(graph_dir)
    with torch.no_grad():
        by_row = model(x, edge_index)  # row r = caller's node r = external id 10r + 7
    rows = (store.to_external(torch.arange(num_nodes)) - 7) // 10
    return Servable(graph_dir, weights, kwargs, model, store, by_row[rows])


def exact_job(
    store: GraphStore,
    targets,
    *,
    num_layers: int = 2,
    job_id: str = "j",
    model: str = "tiny",
    version: str = "1",
    **kw,
) -> Job:
    """An exact job carrying the frontiers the front-end's planner would send."""
    ids = np.asarray(targets, dtype=np.int64)
    plan = plan_frontiers(store.topology, np.unique(ids), num_layers)
    return Job(job_id, model, version, ids, frontiers=plan.frontiers, **kw)
