"""A typed graph (users, items, categories; six relations) served end to end over gRPC.

An RGCN over the synthetic recommender graph: ``ListModels`` lists the node types and the
relations; a request naming ``node_type`` asks by that type's own IDs and equals the
model's own forward on the graph's homogeneous form (PyG's ``to_homogeneous`` numbering,
what store-wide IDs are); item embeddings for a user's candidate items in one request
(the demo's use). On a store whose types have their own IDs, updates and request-scoped
deltas add nodes to a type, asked for by their IDs. A type the graph lacks, a type on an
untyped graph, IDs beyond a type's count and typed nodes on a store numbered by position
are INVALID_ARGUMENT naming the value.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from support import assert_exact
from support.edge_models import RelationalGCN
from support.models import GraphSAGE

from hopserve import GraphStore
from hopserve.client import AdminClient, EmbeddingClient, InvalidArgumentError
from hopserve.config import HopserveConfig
from hopserve.testing import free_port
from hopserve.worker.graph.live import LiveGraph, MutationBatch
from hopserve.worker.graph.live.mutations import resolve
from hopserve.worker.graph.synth_hetero import synth_recommender

from .conftest import FEATURES

KWARGS = {"d_in": FEATURES, "relations": 6}


def _model() -> torch.nn.Module:
    torch.manual_seed(3)
    return RelationalGCN(**KWARGS).eval()


@pytest.fixture
def served(tmp_path, graph_dir, start_server):
    path = tmp_path / "rec"
    synth_recommender(150, 90, 6, FEATURES, seed=2, out=path, progress=False)
    torch.save(_model().state_dict(), tmp_path / "rgcn.pt")
    torch.manual_seed(0)
    torch.save(GraphSAGE(FEATURES, 16, 5).state_dict(), tmp_path / "sage.pt")
    models = [
        {"name": "rec", "version": "1", "entrypoint": "support.edge_models:RelationalGCN",
         "kwargs": KWARGS, "weights": str(tmp_path / "rgcn.pt"), "graph": str(path)},
        {"name": "plain", "version": "1", "entrypoint": "support.models:GraphSAGE",
         "kwargs": {"d_in": FEATURES, "hidden": 16, "d_out": 5},
         "weights": str(tmp_path / "sage.pt"), "graph": str(graph_dir)},
    ]  # fmt: skip
    config = HopserveConfig.model_validate({
        "models": models,
        "server": {"host": "127.0.0.1", "port": free_port(), "metrics_port": 0,
                   "max_wait_ms": 5, "grace_period_s": 1},
        "cache": {"backend": "memory"},
    })  # fmt: skip
    return start_server(config), path


def _forward(path_or_store) -> torch.Tensor:
    """The model on the graph's homogeneous form, rows by store-wide ID."""
    store = path_or_store
    if not isinstance(store, GraphStore):
        store = GraphStore.open(path_or_store)
    order = store.sorted_external_order()
    rank = torch.empty_like(order)
    rank[order] = torch.arange(order.numel())
    ei = store.edge_index()
    with torch.no_grad():
        return _model()(store.features[order], rank[ei], store.edge_type.long())


def test_typed_requests_are_exact_and_listed(served):
    server, path = served
    want = _forward(path)
    with EmbeddingClient(server.target, timeout=30) as client:
        info = {m.name: m for m in client.list_models()}
        types = {t.name: t for t in info["rec"].node_types}
        assert list(types) == ["user", "item", "category"]
        assert not any(t.own_ids for t in types.values())  # positions 0..count-1
        assert (types["item"].count, types["item"].offset) == (90, 150)
        assert "user__clicks__item" in info["rec"].relations and not info["plain"].node_types
        candidates = [3, 0, 89, 3]  # a user's candidate items, by item ID
        for attempt in ("computed", "cached"):
            got = client.get_embeddings("rec", candidates, node_type="item")
            assert_exact(torch.from_numpy(got.copy()), want[[150 + c for c in candidates]], attempt)
            server.drain()
        users = client.get_embeddings("rec", [0, 149], node_type="user")
        assert_exact(torch.from_numpy(users.copy()), want[[0, 149]], "users")
        store_wide = client.get_embeddings("rec", [153])  # item 3 by its store-wide ID
        assert_exact(torch.from_numpy(store_wide.copy()), want[[153]], "store-wide")
        rows = "hopserve_requested_rows_total"
        assert server.sample(rows, model="rec", node_type="item") == 2 * len(candidates)
        assert server.sample(rows, model="rec", node_type="user") == 2
        assert server.sample(rows, model="rec", node_type="any") == 1
        for kwargs, message in [
            ({"node_type": "shop"}, "the graph has no node type 'shop' (its node types: user, item, category)"),
            ({"node_type": "item", "model": "plain"}, "the graph has no node type 'item' (its nodes are untyped)"),
        ]:  # fmt: skip
            model = kwargs.pop("model", "rec")
            with pytest.raises(InvalidArgumentError) as err:
                client.get_embeddings(model, [0], **kwargs)
            assert message in str(err.value)
        with pytest.raises(
            InvalidArgumentError,
            match=r"1 of 2 requested 'item' node IDs are not in the graph \(its 90 IDs are 0..89\): 90",
        ):
            client.get_embeddings("rec", [1, 90], node_type="item")  # fmt: skip
        with pytest.raises(InvalidArgumentError, match="numbered by position 0..count-1"):
            client.get_embeddings_with_info(
                "rec", [0], node_type="item", add_nodes=([5000], np.ones((1, FEATURES))),
                add_node_type="item", add_edges=([5000], [0]),
                edge_relations=["item__clicked-by__user"],
            )  # fmt: skip
        with pytest.raises(InvalidArgumentError, match="node_type must be a non-empty string"):
            client.get_embeddings("rec", [0], node_type="")


def test_requests_and_updates_name_nodes_by_their_types_own_ids(tmp_path, start_server):
    """A store whose types have their own IDs (account numbers; item 7 and user 7 are two
    nodes): typed requests ask by them and equal the forward; updates name added and
    removed edges' ends within their relations' types and feature rows within their type,
    and the served rows equal the forward on the updated graph; an ID the type lacks, and
    an update naming nodes without their type, are INVALID_ARGUMENT naming them."""
    plain = tmp_path / "plain"
    synth_recommender(150, 90, 6, FEATURES, seed=2, out=plain, progress=False)
    store = GraphStore.open(plain)
    own = {"user": np.arange(150) * 10 + 7, "item": np.arange(90)[::-1] * 10 + 7}
    own["category"] = np.arange(6) + 7  # ID 7 names a node of each type
    offsets = {t.name: t.offset for t in store.node_types}
    order = store.sorted_external_order()
    x = {t.name: store.features[order][t.offset : t.offset + t.count, : t.feature_dim]
         for t in store.node_types}  # fmt: skip
    ext = store.to_external(store.edge_index())
    relations = [tuple(r.split("__")) for r in store.relations]
    edges = {}
    for r, rel in enumerate(relations):
        on = store.edge_type.numpy() == r
        edges[rel] = torch.from_numpy(
            np.stack([ext[0][on] - offsets[rel[0]], ext[1][on] - offsets[rel[2]]])
        )
    path = tmp_path / "own"
    GraphStore.from_hetero(x, edges, node_ids_dict=own).save(path, progress=False)
    torch.save(_model().state_dict(), tmp_path / "rgcn.pt")
    config = HopserveConfig.model_validate({
        "models": [{"name": "rec", "version": "1", "entrypoint": "support.edge_models:RelationalGCN",
                    "kwargs": KWARGS, "weights": str(tmp_path / "rgcn.pt"), "graph": str(path)}],
        "server": {"host": "127.0.0.1", "port": free_port(), "metrics_port": 0,
                   "max_wait_ms": 5, "grace_period_s": 1},
        "cache": {"backend": "memory"},
    })  # fmt: skip
    server = start_server(config)
    want = _forward(path)
    with EmbeddingClient(server.target, timeout=30) as client:
        (info,) = client.list_models()
        assert [(t.name, t.own_ids) for t in info.node_types] == [
            ("user", True),
            ("item", True),
            ("category", True),
        ]
        items = [3, 0, 89, 3]  # by position, then by the items' own IDs
        got = client.get_embeddings("rec", own["item"][items].tolist(), node_type="item")
        assert_exact(torch.from_numpy(got.copy()), want[[150 + i for i in items]], "items")
        for name, pos in (("user", 0), ("category", 0)):  # ID 7 in each type's space
            got = client.get_embeddings("rec", [7], node_type=name)
            assert_exact(torch.from_numpy(got.copy()), want[[offsets[name] + pos]], name)
        with pytest.raises(
            InvalidArgumentError,
            match=r"1 of 2 requested 'item' node IDs are not in the graph \(its 90 IDs are its own\): 8",
        ):
            client.get_embeddings("rec", [7, 8], node_type="item")  # fmt: skip
    user7, item7 = 0, 150 + 89  # store-wide IDs of user 7 and item 7
    clicks = store.relations.index("user__clicks__item")
    k = int(np.flatnonzero(store.edge_type.numpy() == clicks)[0])
    u, i = int(ext[0][k]), int(ext[1][k]) - 150  # an existing click, by positions
    with AdminClient(server.target, timeout=30) as admin:
        for kwargs, message in [
            ({"remove_edges": ([own["user"][u]], [own["item"][i]])},
             "have their own node IDs: name each removed edge's relation"),
            ({"set_features": ([7], np.ones((1, FEATURES)))},
             "have their own node IDs: name the node type of the IDs"),
            ({"set_features": ([8], np.ones((1, FEATURES))), "set_node_type": "item"},
             r"set_features\[0\]: 8 is not a 'item' node ID"),
        ]:  # fmt: skip
            with pytest.raises(InvalidArgumentError, match=message):
                admin.update_graph("rec", **kwargs)
        admin.update_graph(
            "rec",
            add_edges=([7], [7]), edge_relations=["user__clicks__item"],
            remove_edges=([own["user"][u]], [own["item"][i]]),
            remove_relations=["user__clicks__item"],
            set_features=([7], np.full((1, FEATURES), 0.5)), set_node_type="item",
        )  # fmt: skip
    updated = LiveGraph(path, with_features=True).store()
    assert updated.features[updated.to_storage([item7])].tolist() == [[0.5] * FEATURES]
    want = _forward(updated)
    with EmbeddingClient(server.target, timeout=30) as client:
        got = client.get_embeddings("rec", [7], node_type="item")
        assert_exact(torch.from_numpy(got.copy()), want[[item7]], "item 7 updated")
        got = client.get_embeddings("rec", [7], node_type="user")
        assert_exact(torch.from_numpy(got.copy()), want[[user7]], "user 7 updated")
    # New nodes join their type over UpdateGraph: named by new IDs of the type, joined to
    # old and new nodes by edges of the same batch, served by those IDs.
    n = updated.num_nodes
    user_dim = next(t.feature_dim for t in updated.node_types if t.name == "user")
    rows = np.random.default_rng(5).standard_normal((2, user_dim))
    with AdminClient(server.target, timeout=30) as admin:
        for kwargs, message in [
            ({}, r"add_nodes.node_type: the graph's nodes are typed \(user, item, category\)"),
            ({"add_node_type": "user", "add_nodes": ([17], rows[:1])},
             r"add_nodes\[0\]: node ID 17 is already a 'user' node"),
        ]:  # fmt: skip
            with pytest.raises(InvalidArgumentError, match=message):
                admin.update_graph("rec", **({"add_nodes": ([5001], rows[:1])} | kwargs))
        result = admin.update_graph(
            "rec",
            add_nodes=([5001, 5002], rows), add_node_type="user",
            add_edges=([5001, 5002, 7, 7], [7, 7, 5001, 5002]),
            edge_relations=["user__clicks__item"] * 2 + ["item__clicked-by__user"] * 2,
        )  # fmt: skip
        assert result.nodes_added == 2 and result.num_nodes == n + 2
    updated = LiveGraph(path, with_features=True).store()
    want = _forward(updated)
    with EmbeddingClient(server.target, timeout=30) as client:
        (info,) = client.list_models()
        assert {t.name: t.count for t in info.node_types}["user"] == 152
        got = client.get_embeddings("rec", [5002, 5001], node_type="user")
        assert_exact(torch.from_numpy(got.copy()), want[[n + 1, n]], "new users")
        got = client.get_embeddings("rec", [7], node_type="item")  # cached before: dropped
        assert_exact(torch.from_numpy(got.copy()), want[[item7]], "item 7 with new clicks")
    # A request-scoped delta with a new user (its own ID) clicking item 7, asked for by
    # IDs within the type (the new one and user 7): exact on graph + delta, nothing kept.
    batch = MutationBatch(
        add_node_ids=[6001], add_node_features=rows[:1], add_node_type="user",
        add_src=[6001, 7], add_dst=[7, 6001],
        add_edge_type=["user__clicks__item", "item__clicked-by__user"],
    )  # fmt: skip
    live = LiveGraph(path, with_features=True)
    with live.with_delta(live.seq, resolve(batch, live.topology, live.seq)) as extended:
        want = _forward(extended)
    with EmbeddingClient(server.target, timeout=30) as client:
        got = client.get_embeddings_with_info(
            "rec", [6001, 7], node_type="user",
            add_nodes=([6001], rows[:1]), add_node_type="user",
            add_edges=([6001, 7], [7, 6001]),
            edge_relations=["user__clicks__item", "item__clicked-by__user"],
        )  # fmt: skip
        assert_exact(torch.from_numpy(got.embeddings.copy()), want[[n + 2, user7]], "delta")
        with pytest.raises(InvalidArgumentError, match=r"requested 'user' node IDs are not in"):
            client.get_embeddings("rec", [6001], node_type="user")  # the delta was not kept
        with pytest.raises(InvalidArgumentError, match=r"delta: add_nodes\[0\]: node ID 7 is"):
            client.get_embeddings_with_info(
                "rec", [7], node_type="user", add_nodes=([7], rows[:1]), add_node_type="user"
            )
