"""Nodes added to a typed graph by live updates (types with their own IDs).

A batch adds nodes of one type, named by new IDs within it; they get the store-wide IDs
``N, N+1, …`` (a run of their type), edges of the same batch name them by their
relation's types, and typed lookups, the type of every row, replay, compaction (format
version 5) and later batches keep them. Dict models (``to_hetero``, HGT, per-type
projections) evaluated on the updated graph equal their own forward on the same graph
built from scratch. Bad batches are refused naming the value, with nothing applied.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from support import assert_exact
from support.typed_live import (
    CLICKS,
    DIMS,
    TypedGraph,
    click_batch,
    typed_edges,
)
from torch_geometric import nn as pyg
from torch_geometric.data import HeteroData

from hopserve import GraphStore, LayerwiseEvaluator
from hopserve.worker.graph.live import InvalidUpdateError, LiveGraph, MutationBatch
from hopserve.worker.graph.live.mutations import decode, encode, resolve
from hopserve.worker.graph.node_types import type_of


def _apply(live: LiveGraph, g: TypedGraph, step: int) -> None:
    """Three kinds of batch: new users clicking old and each other's items, new items
    clicked by old and new users, and a removal plus a feature update of a new user."""
    rng = np.random.default_rng(100 + step)
    if step == 0:
        users = [555_001, 555_002, 40_007]  # 40007: an ID of no user yet (user 7 exists)
        rows = rng.standard_normal((3, DIMS["user"])).astype(np.float32)  # the type's width
        pairs = [(555_001, 7), (555_002, 57), (40_007, 7), (555_001, 3), (555_001, 7)]
        live.apply(click_batch(pairs, add_node_ids=users, add_node_features=rows,
                               add_node_type="user"))  # fmt: skip
        g.add("user", users, rows)
        g.click(pairs)
    elif step == 1:
        items = [7_777, 1]
        rows = rng.standard_normal((2, 5)).astype(np.float32)  # the graph's width (= item's)
        pairs = [(7, 7_777), (555_002, 1), (1_007, 1), (40_007, 7_777)]
        live.apply(click_batch(pairs, add_node_ids=items, add_node_features=rows,
                               add_node_type="item"))  # fmt: skip
        g.add("item", items, rows)
        g.click(pairs)
    else:
        new_row = np.zeros((1, 5), np.float32)
        new_row[0, :3] = rng.standard_normal(3)
        live.apply(
            MutationBatch(
                remove_src=[555_001], remove_dst=[7], remove_edge_type=[CLICKS],
                set_node_ids=[555_002], set_features=new_row, set_node_type="user",
            )
        )  # fmt: skip
        del g.edges[(0, 555_001, 7)]  # both copies; the reverse edges stay
        g.x["user"][g.ids["user"].index(555_002)] = new_row[0, :3]
    assert typed_edges(live.topology) == g.edges, f"batch {step}"


def test_added_nodes_keep_their_type_and_ids_through_replay_and_compaction(tmp_path):
    g = TypedGraph()
    g.store().save(tmp_path / "g", progress=False)
    live = LiveGraph(tmp_path / "g", with_features=True)
    n = live.topology.num_nodes
    for step in range(3):
        _apply(live, g, step)
    topo = live.topology
    types = {t.name: t for t in topo.meta.node_types}
    assert types["user"].added == ((n, 3),) and types["item"].added == ((n + 3, 2),)
    assert (types["user"].total, types["item"].total) == (33, 22)
    assert topo.typed_storage([555_001, 555_002, 40_007], "user").tolist() == [n, n + 1, n + 2]
    assert topo.typed_storage([7_777, 1], "item").tolist() == [n + 3, n + 4]
    assert topo.find_typed([40_007, 7_777], "user")[1].tolist() == [True, False]
    assert type_of(topo.meta.node_types, [0, 29, 30, 49, n, n + 2, n + 3, n + 4]).tolist() == [
        0, 0, 1, 1, 0, 0, 1, 1,
    ]  # fmt: skip
    store = live.store()
    assert store.node_type_ids[n:].tolist() == [0, 0, 0, 1, 1]
    assert store.features[n + 1, :3].tolist() == g.x["user"][-2].tolist()  # set after adding
    assert not store.features[n : n + 3, 3:].any()  # a user's columns past its 3 stay zero

    replayed = LiveGraph(tmp_path / "g")
    assert replayed.topology.meta.node_types == topo.meta.node_types
    assert typed_edges(replayed.topology) == g.edges
    live.compact()
    compacted = LiveGraph(tmp_path / "g", with_features=True)
    assert compacted.topology.meta.format_version == 5
    assert compacted.topology.meta.node_types == topo.meta.node_types
    assert typed_edges(compacted.topology) == g.edges
    for t in DIMS:
        assert np.array_equal(
            compacted.topology.typed_storage(g.ids[t], t), topo.typed_storage(g.ids[t], t)
        )
    assert torch.equal(compacted.store().features, store.features)
    # After the compaction runs go on from the new N; one right after its type's last run
    # joins it.
    for node_type, new_id in (("item", 99), ("user", 60_007), ("item", 98)):
        rows = np.ones((1, DIMS[node_type]), np.float32)
        pair = (new_id, 7) if node_type == "user" else (7, new_id)
        compacted.apply(
            click_batch(
                [pair], add_node_ids=[new_id], add_node_features=rows, add_node_type=node_type
            )  # fmt: skip
        )
        g.add(node_type, [new_id], rows)
        g.click([pair])
    topo = compacted.topology
    assert topo.node_type("item").added == ((n + 3, 3), (n + 7, 1))
    assert topo.node_type("user").added == ((n, 3), (n + 6, 1))
    assert topo.typed_storage([98, 99], "item").tolist() == [n + 7, n + 5]
    assert topo.typed_storage([60_007], "user").tolist() == [n + 6]
    assert typed_edges(topo) == g.edges


def _to_hetero(data: HeteroData) -> torch.nn.Module:
    class Skip(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv1 = pyg.SAGEConv((-1, -1), 8)
            self.lin1 = pyg.Linear(-1, 8)
            self.conv2 = pyg.SAGEConv((-1, -1), 4)

        def forward(self, x, edge_index):
            h = (self.conv1(x, edge_index) + self.lin1(x)).relu()
            return self.conv2(h, edge_index)

    return pyg.to_hetero(Skip(), data.metadata(), aggr="sum")


class HGT(torch.nn.Module):
    def __init__(self, data: HeteroData) -> None:
        super().__init__()
        self.proj = torch.nn.ModuleDict({t: torch.nn.Linear(d, 8) for t, d in DIMS.items()})
        self.conv = pyg.HGTConv(8, 8, data.metadata(), heads=2)

    def forward(self, x_dict, edge_index_dict):
        h = {t: self.proj[t](x).relu() for t, x in x_dict.items()}
        return self.conv(h, edge_index_dict)


@pytest.mark.parametrize("family", ["to_hetero", "hgt"])
def test_dict_models_on_the_updated_graph_equal_their_forward(tmp_path, family):
    g = TypedGraph(seed=1)
    g.store().save(tmp_path / "g", progress=False)
    live = LiveGraph(tmp_path / "g", with_features=True)
    torch.manual_seed(0)
    data = g.hetero()
    model = _to_hetero(data) if family == "to_hetero" else HGT(data)
    with torch.no_grad():
        model(data.x_dict, data.edge_index_dict)  # lazy shapes
    model.eval()
    ev = LayerwiseEvaluator(model, live.store(), init_batch_nodes=4, progress=False)
    for step in range(3):
        _apply(live, g, step)
        data = g.hetero()
        with torch.no_grad():
            want = model(data.x_dict, data.edge_index_dict)
        store = live.store()
        ev.graph = store  # as a worker does when the graph moves on (one model, loaded once)
        full = ev.evaluate()
        targets = []
        for t, rows in want.items():
            ids = store.topology.find_typed(g.ids[t], t)[0]
            assert_exact(full[ids], rows, f"{family} after batch {step}, type {t}")
            targets.append(ids[-3:])  # the newest nodes of the type, and older ones
        targets = np.concatenate(targets)
        partial = ev.evaluate(targets=torch.from_numpy(targets))
        assert_exact(partial, full[targets], f"{family} partial after batch {step}")
        fresh = LayerwiseEvaluator(model, store, init_batch_nodes=4, progress=False)
        assert_exact(fresh.evaluate(), full, f"{family} loaded on the updated graph")


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"add_node_type": ""},
         r"add_nodes.node_type: the graph's nodes are typed \(user, item\); name the type"),
        ({"add_node_type": "shop"}, r"add_nodes.node_type: .*no node type 'shop'"),
        ({"add_node_ids": [1, 7]}, r"add_nodes\[1\]: node ID 7 is already a 'user' node"),
        ({"add_node_ids": [1, 1]}, r"add_nodes\[1\]: node ID 1 is given twice"),
        ({"add_node_features": np.ones((2, 4), np.float32)},
         r"add_nodes: feature width 4 matches neither the graph's 5 nor the 'user' type's 3"),
        ({"add_node_ids": []}, r"add_nodes.node_type: 'user' given without nodes to add"),
        ({"add_node_features": np.ones((2, 5), np.float32)},
         r"add_nodes\[0\]: a 'user' node has 3 feature columns, but the row holds non-zero"),
        ({"add_src": [1], "add_dst": [1], "add_edge_type": [CLICKS]},
         r"add_edges\[0\]: the destination 1 of a 'user__clicks__item' edge is not a 'item' node ID"),
        ({"add_node_features": np.full((2, 3), np.nan, np.float32)},
         r"add_nodes\[0\]: features hold NaN or Inf"),
    ],
    ids=["no type", "unknown type", "ID in the type", "ID twice", "width", "type without nodes",
         "padding", "edge to a new node as another type", "NaN"],
)  # fmt: skip
def test_bad_typed_additions_are_refused_with_nothing_applied(tmp_path, kwargs, message):
    g = TypedGraph()
    g.store().save(tmp_path / "g", progress=False)
    live = LiveGraph(tmp_path / "g")
    batch = {"add_node_ids": [1, 2], "add_node_features": np.ones((2, 3), np.float32),
             "add_node_type": "user"} | kwargs  # fmt: skip
    with pytest.raises(InvalidUpdateError, match=message):
        live.apply(MutationBatch(**batch))
    assert live.seq == 0 and len(live.log) == 0
    assert live.topology.node_type("user").added == ()


def test_a_batch_sets_the_features_of_a_node_it_adds(tmp_path):
    """``set_features`` (applied after ``add_nodes``) names a node the batch adds by its
    type and ID, as edges of the batch do."""
    g = TypedGraph()
    g.store().save(tmp_path / "g", progress=False)
    live = LiveGraph(tmp_path / "g", with_features=True)
    n = live.topology.num_nodes
    row = np.zeros((1, 5), np.float32)
    row[0, :3] = 2.0
    live.apply(
        MutationBatch(
            add_node_ids=[555_001], add_node_features=np.ones((1, 3), np.float32),
            add_node_type="user", set_node_ids=[555_001], set_features=row,
            set_node_type="user",
        )
    )  # fmt: skip
    assert live.store().features[n].tolist() == row[0].tolist()


def test_graphs_without_own_ids_refuse_typed_nodes_naming_why(tmp_path):
    data = TypedGraph().hetero()
    GraphStore.from_hetero(data.x_dict, data.edge_index_dict).save(tmp_path / "pos", progress=False)
    GraphStore.from_edge_index(torch.tensor([[0, 1], [1, 0]]), torch.ones(2, 5)).save(
        tmp_path / "untyped", progress=False
    )
    rows = np.ones((1, 3), np.float32)
    for name, message in (
        ("pos", r"add_nodes: the graph's node types \(user, item\) are numbered by position"),
        ("untyped", r"add_nodes.node_type: 'user' given, but the graph's nodes are untyped"),
    ):
        live = LiveGraph(tmp_path / name)
        with pytest.raises(InvalidUpdateError, match=message):
            live.apply(MutationBatch(add_node_ids=[9], add_node_features=rows if name == "pos"
                                     else np.ones((1, 5), np.float32), add_node_type="user"))  # fmt: skip
        assert live.seq == 0


def test_typed_nodes_round_trip_through_the_log_bytes(tmp_path):
    g = TypedGraph()
    g.store().save(tmp_path / "g", progress=False)
    live = LiveGraph(tmp_path / "g")
    batch = click_batch([(555_001, 7)], add_node_ids=[555_001],
                        add_node_features=np.ones((1, 3), np.float32), add_node_type="user")  # fmt: skip
    resolved = resolve(batch, live.topology, 1)
    n = live.topology.num_nodes
    assert resolved.new_node_ids.tolist() == [n]  # store-wide: appended
    assert resolved.new_type_node_ids.tolist() == [555_001]
    assert resolved.new_node_type.tolist() == [0]
    assert resolved.add_src.tolist()[0] == n and resolved.add_dst.tolist()[1] == n
    back = decode(encode(resolved), 5)
    assert back.new_node_type.tolist() == [0] and back.new_type_node_ids.tolist() == [555_001]
    assert back.new_features.tolist() == [[1.0, 1.0, 1.0, 0.0, 0.0]]
    untyped = click_batch([(7, 7)])
    assert decode(encode(resolve(untyped, live.topology, 1)), 5).new_node_type is None
