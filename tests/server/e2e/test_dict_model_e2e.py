"""A dict model (``HeteroConv`` layers, ``forward(x_dict, edge_index_dict)``) served end
to end over gRPC from a typed store: item embeddings for a user's candidate items by the
items' own IDs, computed then cached, equal the model's own forward on the typed graph;
``ListModels`` says the model outputs items only, and a request for users (by type or by
store-wide IDs) is INVALID_ARGUMENT naming the type or the IDs."""

from __future__ import annotations

import pytest
import torch
from support import assert_exact
from support.hetero_models import UserItemHeads

from hopserve import GraphStore
from hopserve.client import EmbeddingClient, InvalidArgumentError
from hopserve.config import HopserveConfig
from hopserve.examples import HeteroSAGE
from hopserve.testing import free_port
from hopserve.worker.graph.synth_hetero import synth_recommender

from .conftest import FEATURES


def _kwargs(store: GraphStore) -> dict:
    return {
        "in_dims": {t.name: t.feature_dim for t in store.node_types},
        "hidden": 16,
        "out_dim": 6,
        "relations": store.relations,
        "out_type": "item",
    }


@pytest.fixture
def served(tmp_path, start_server):
    path = tmp_path / "rec"
    synth_recommender(150, 90, 6, FEATURES, seed=2, out=path, progress=False)
    kwargs = _kwargs(GraphStore.open(path))
    torch.manual_seed(3)
    model = HeteroSAGE(**kwargs).eval()
    torch.save(model.state_dict(), tmp_path / "hetero.pt")
    config = HopserveConfig.model_validate({
        "models": [{"name": "rec", "version": "1", "entrypoint": "hopserve.examples:HeteroSAGE",
                    "kwargs": kwargs, "weights": str(tmp_path / "hetero.pt"), "graph": str(path)}],
        "server": {"host": "127.0.0.1", "port": free_port(), "metrics_port": 0,
                   "max_wait_ms": 5, "grace_period_s": 1},
        "cache": {"backend": "memory"},
    })  # fmt: skip
    return start_server(config), path, model


def _forward(model: torch.nn.Module, path) -> torch.Tensor:
    """The model's own forward on the typed graph (item rows by item ID)."""
    store = GraphStore.open(path)
    x_dict, edge_index_dict = {}, {}
    for t in store.node_types:
        ids = torch.arange(t.offset, t.offset + t.count)
        x_dict[t.name] = store.features[store.to_storage(ids)][:, : t.feature_dim]
    order = store.sorted_external_order()
    rank = torch.empty_like(order)
    rank[order] = torch.arange(order.numel())
    ei = rank[store.edge_index()]
    types = store.edge_type.long()
    offsets = {t.name: t.offset for t in store.node_types}
    for k, name in enumerate(store.relations):
        src, _, dst = name.split("__")
        e = ei[:, types == k]
        edge_index_dict[(src, name.split("__")[1], dst)] = torch.stack(
            [e[0] - offsets[src], e[1] - offsets[dst]]
        )
    with torch.no_grad():
        return model(x_dict, edge_index_dict)


def test_a_dict_model_serves_its_output_type_exactly(served):
    server, path, model = served
    want = _forward(model, path)
    with EmbeddingClient(server.target, timeout=30) as client:
        (info,) = client.list_models()
        assert info.output_types == ("item",) and info.dim == 6
        candidates = [3, 0, 89, 3]
        for attempt in ("computed", "cached"):
            got = client.get_embeddings("rec", candidates, node_type="item")
            assert_exact(torch.from_numpy(got.copy()), want[candidates], attempt)
            server.drain()
        by_store_id = client.get_embeddings("rec", [150 + 7])
        assert_exact(torch.from_numpy(by_store_id.copy()), want[[7]], "store-wide")
        with pytest.raises(
            InvalidArgumentError, match="outputs embeddings of node types item only, not 'user'"
        ):
            client.get_embeddings("rec", [0], node_type="user")
        with pytest.raises(
            InvalidArgumentError, match="1 of 2 requested node IDs are of other types: 4"
        ):
            client.get_embeddings("rec", [150, 4])


def test_output_types_of_different_widths_are_listed_and_padded(tmp_path, start_server):
    """A dict model with a 4-wide user head and a 6-wide item head: ``ListModels`` gives
    each type's width (0 for categories, which it does not output); a user's row is its
    4 values, then zeros to the model's 6."""
    path = tmp_path / "rec"
    synth_recommender(150, 90, 6, FEATURES, seed=2, out=path, progress=False)
    store = GraphStore.open(path)
    kwargs = {"in_dims": {t.name: t.feature_dim for t in store.node_types},
              "relations": store.relations}  # fmt: skip
    torch.manual_seed(5)
    model = UserItemHeads(**kwargs).eval()
    torch.save(model.state_dict(), tmp_path / "heads.pt")
    config = HopserveConfig.model_validate({
        "models": [{"name": "heads", "version": "1",
                    "entrypoint": "support.hetero_models:UserItemHeads", "kwargs": kwargs,
                    "weights": str(tmp_path / "heads.pt"), "graph": str(path)}],
        "server": {"host": "127.0.0.1", "port": free_port(), "metrics_port": 0,
                   "max_wait_ms": 5, "grace_period_s": 1},
        "cache": {"backend": "memory"},
    })  # fmt: skip
    server = start_server(config)
    want = _forward(model, path)
    with EmbeddingClient(server.target, timeout=30) as client:
        (info,) = client.list_models()
        assert info.dim == 6 and info.output_types == ("user", "item")
        widths = {t.name: t.output_dim for t in info.node_types}
        assert widths == {"user": 4, "item": 6, "category": 0}
        users = client.get_embeddings("heads", [0, 149, 3], node_type="user")
        assert_exact(torch.from_numpy(users[:, :4].copy()), want["user"][[0, 149, 3]], "users")
        assert not users[:, 4:].any()
        items = client.get_embeddings("heads", [3, 0], node_type="item")
        assert_exact(torch.from_numpy(items.copy()), want["item"][[3, 0]], "items")
