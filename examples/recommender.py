"""A served heterogeneous recommender: item embeddings for a user's candidates, one request.

    python examples/recommender.py              # about 15 s on 2 cores

1. Generates a typed recommender graph (users, items, categories; clicks, buys,
   belongs-to and their reverses: six relations) with ``synth_hetero.recommender_graph``
   and writes it as a typed graph store (node types as storage-id ranges).
2. Trains a 2-layer RGCN (``hopserve.examples:RGCN``, plain PyG code on the graph's
   homogeneous form: ``forward(x, edge_index, edge_type)``) for a few seconds to predict
   each node's category (an item's own, a user's preferred one).
3. Serves it with hopserve (in-process worker and cache). ``ListModels`` lists the node
   types; one request asks for the user's candidate items by item ID
   (``node_type="item"``), another for the user; candidates are ranked by the dot product
   of the embeddings.

Every served row is checked against the model's own forward on the whole graph.
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from hopserve.examples import RGCN
from hopserve.worker.graph.synth_hetero import TypedGraph, recommender_graph


def train(model: torch.nn.Module, g: TypedGraph, seconds: float) -> None:
    """Full-batch training on every node's category label."""
    x, y = torch.from_numpy(g.features), torch.from_numpy(g.labels)
    ei = torch.from_numpy(np.stack([g.src, g.dst]))
    et = torch.from_numpy(g.edge_type.astype(np.int64))
    opt = torch.optim.Adam(model.parameters(), lr=0.02)
    model.train()
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        opt.zero_grad()
        F.cross_entropy(model(x, ei, et), y).backward()
        opt.step()
    model.eval()


def forward(model: torch.nn.Module, g: TypedGraph) -> np.ndarray:
    ei = torch.from_numpy(np.stack([g.src, g.dst]))
    with torch.no_grad():
        return model(
            torch.from_numpy(g.features), ei, torch.from_numpy(g.edge_type.astype(np.int64))
        ).numpy()


async def walkthrough(workdir: Path, users: int, train_seconds: float) -> dict:
    from hopserve.client import AsyncEmbeddingClient
    from hopserve.config import HopserveConfig
    from hopserve.server.app import build_server
    from hopserve.testing import free_port

    items, categories = users * 2 // 3, 12
    g = recommender_graph(users, items, categories, 16, seed=1)
    g.store(out=workdir / "shop")
    torch.manual_seed(0)
    kwargs = {"in_dim": 16, "hidden": 32, "out_dim": categories, "num_relations": len(g.relations)}
    model = RGCN(**kwargs)
    train(model, g, train_seconds)
    torch.save(model.state_dict(), workdir / "rgcn.pt")
    config = HopserveConfig.model_validate({
        "models": [{"name": "recommender", "entrypoint": "hopserve.examples:RGCN",
                    "kwargs": kwargs, "weights": str(workdir / "rgcn.pt"),
                    "graph": str(workdir / "shop")}],
        "server": {"host": "127.0.0.1", "port": free_port(), "metrics_port": 0},
        "cache": {"backend": "memory"},
    })  # fmt: skip
    service = await build_server(config)
    await service.start()
    await service.wait_ready(60)
    target = f"127.0.0.1:{service.port}"

    user = 7
    rng = np.random.default_rng(5)
    candidates = rng.choice(items, size=12, replace=False)  # item IDs (0..items-1)
    try:
        async with AsyncEmbeddingClient(target) as client:
            (info,) = [m for m in await client.list_models() if m.name == "recommender"]
            item_rows = await client.get_embeddings("recommender", candidates, node_type="item")
            user_row = await client.get_embeddings("recommender", [user], node_type="user")
    finally:
        await service.stop(1.0)

    want = forward(model, g)
    item_offset = g.offset("item")
    scores = item_rows @ user_row[0]
    ranked = candidates[np.argsort(-scores)]
    item_category = g.labels[item_offset + ranked]
    return {
        "node_types": [(t.name, t.count) for t in info.node_types],
        "relations": list(info.relations),
        "ranked": ranked.tolist(),
        "top3_in_preferred_category": int((item_category[:3] == g.labels[user]).sum()),
        "candidates_in_preferred_category": int(
            (g.labels[item_offset + candidates] == g.labels[user]).sum()
        ),
        "item_error": float(np.abs(item_rows - want[item_offset + candidates]).max()),
        "user_error": float(np.abs(user_row - want[[user]]).max()),
    }


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--users", type=int, default=3000)
    parser.add_argument("--train-seconds", type=float, default=4.0)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        out = asyncio.run(walkthrough(Path(tmp), args.users, args.train_seconds))
    print(f"node types: {out['node_types']}; relations: {', '.join(out['relations'])}")
    print(f"user 7's candidates, best first: {out['ranked']}")
    print(f"  top 3 in the user's preferred category: {out['top3_in_preferred_category']} "
          f"(of {out['candidates_in_preferred_category']} such candidates among 12)")  # fmt: skip
    print(f"max |served - model's own forward|: items {out['item_error']:.1e}, "
          f"user {out['user_error']:.1e}")  # fmt: skip
    return out


if __name__ == "__main__":
    main()
