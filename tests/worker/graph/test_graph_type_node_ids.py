"""Node types with their own ID spaces (``type_node_ids``, format version 4).

A type's nodes are named by their own IDs (distinct within the type, repeats across types
allowed) in typed lookups, typed ingest and typed updates; everything untyped keeps the
store-wide (homogeneous) numbering, so the same graph built with and without its own IDs
holds the same nodes, edges and features. IDs survive RCMK, save/open, the live log's
replay and compaction; repeats within a type, unknown IDs and updates that name nodes
without their type are refused naming them.
"""

from __future__ import annotations

import json
from collections import Counter

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from hopserve import GraphStore
from hopserve.cli import app
from hopserve.worker.graph import GraphFormatError, IngestError
from hopserve.worker.graph.errors import UnknownNodeError
from hopserve.worker.graph.ingest_typed import ingest_typed
from hopserve.worker.graph.live import InvalidUpdateError, LiveGraph, MutationBatch

USERS, ITEMS = 30, 20
USER_IDS = np.arange(USERS) * 1000 + 7  # account numbers: 7, 1007, ...
ITEM_IDS = np.r_[7, np.arange(ITEMS - 1, 0, -1) * 3]  # 7 (as user 0's), 57, 54, ..., 3


def _graph(seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    clicks = np.stack([rng.integers(0, USERS, 120), rng.integers(0, ITEMS, 120)])
    return {
        "x_dict": {
            "user": torch.from_numpy(rng.standard_normal((USERS, 3)).astype(np.float32)),
            "item": torch.from_numpy(rng.standard_normal((ITEMS, 5)).astype(np.float32)),
        },
        "edge_index_dict": {
            ("user", "clicks", "item"): torch.from_numpy(clicks),
            ("item", "clicked-by", "user"): torch.from_numpy(clicks[::-1].copy()),
        },
    }


@pytest.fixture(scope="module")
def stores():
    plain = GraphStore.from_hetero(**_graph())
    own = GraphStore.from_hetero(**_graph(), node_ids_dict={"user": USER_IDS, "item": ITEM_IDS})
    return plain, own


def typed_edges(topo) -> Counter:
    ext = topo.to_external(np.arange(topo.num_nodes))
    ei = topo.edge_index()
    return Counter(
        zip(
            ext[ei[0]].tolist(),
            ext[ei[1]].tolist(),
            np.asarray(topo.edge_type).tolist(),
            strict=True,
        )
    )


def test_own_ids_name_the_same_nodes_as_positions(stores):
    plain, own = stores
    assert typed_edges(own.topology) == typed_edges(plain.topology)  # the same graph
    assert plain.version != own.version  # the IDs are content
    for name, ids in (("user", USER_IDS), ("item", ITEM_IDS)):
        pos = np.random.default_rng(1).permutation(ids.size)
        by_own = own.topology.typed_storage(ids[pos], name)
        by_pos = plain.topology.typed_storage(pos, name)
        assert torch.equal(own.features[by_own], plain.features[by_pos]), name
        store_wide, found = own.topology.find_typed(ids[pos], name)
        assert found.all() and np.array_equal(store_wide, own.topology.to_external(by_own))
    # ID 7 is user 0 and item 0: each type reads it in its own space
    u, i = own.topology.typed_storage([7], "user"), own.topology.typed_storage([7], "item")
    assert u != i
    with pytest.raises(UnknownNodeError):
        own.topology.typed_storage([7, 8], "user")
    _, found = own.topology.find_typed([1, 7007, 4], "user")
    assert found.tolist() == [False, True, False]


def test_a_type_left_out_keeps_its_positions():
    store = GraphStore.from_hetero(**_graph(), node_ids_dict={"user": USER_IDS})
    plain = GraphStore.from_hetero(**_graph())
    assert np.array_equal(
        store.topology.typed_storage(np.arange(ITEMS), "item"),
        plain.topology.typed_storage(np.arange(ITEMS), "item"),
    )


def test_save_open_round_trip_and_format_version(stores, tmp_path):
    _, own = stores
    own.save(tmp_path / "g", progress=False)
    back = GraphStore.open(tmp_path / "g")
    meta = json.loads((tmp_path / "g" / "meta.json").read_text())
    assert (meta["format_version"], meta["has_type_node_ids"]) == (4, True)
    assert back.version == own.version
    assert np.array_equal(
        back.topology.typed_storage(ITEM_IDS, "item"), own.topology.typed_storage(ITEM_IDS, "item")
    )
    meta["has_type_node_ids"] = False  # a v4 meta that does not say so is refused
    (tmp_path / "g" / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(GraphFormatError, match="version 3 exactly when node types"):
        GraphStore.open(tmp_path / "g")


def test_plain_typed_stores_stay_version_3(stores, tmp_path):
    plain, _ = stores
    plain.save(tmp_path / "g", progress=False)
    meta = json.loads((tmp_path / "g" / "meta.json").read_text())
    assert meta["format_version"] == 3 and "has_type_node_ids" not in meta


@pytest.mark.parametrize(
    ("ids", "message"),
    [
        ({"user": np.r_[USER_IDS[:-1], USER_IDS[3]]}, r"node type 'user': ID 3007 is repeated \(its nodes 3 and 29\)"),
        ({"user": USER_IDS[:-1]}, r"node_ids_dict\['user'\] has 29 IDs, the type 30 nodes"),
        ({"shop": USER_IDS}, r"node_ids_dict names node types the graph lacks: \['shop'\]"),
        ({"user": USER_IDS + 0.5}, r"node_ids_dict\['user'\] must be integers"),
        (
            {"user": np.r_[USER_IDS[:-1].astype(np.uint64), np.uint64(2**63 + 5)]},
            r"node_ids_dict\['user'\] has values beyond the int64 range \(e.g. 9223372036854775813\)",
        ),
    ],
)  # fmt: skip
def test_bad_ids_are_refused_naming_them(ids, message):
    with pytest.raises(ValueError, match=message):
        GraphStore.from_hetero(**_graph(), node_ids_dict=ids)


# ----------------------------------------------------------------------------- ingest
@pytest.fixture
def files(tmp_path):
    g = _graph()
    np.save(tmp_path / "users.npy", g["x_dict"]["user"].numpy())
    np.save(tmp_path / "items.npy", g["x_dict"]["item"].numpy())
    np.save(tmp_path / "user_ids.npy", USER_IDS)
    np.save(tmp_path / "item_ids.npy", ITEM_IDS)
    clicks = g["edge_index_dict"][("user", "clicks", "item")].numpy()
    rows = zip(USER_IDS[clicks[0]].tolist(), ITEM_IDS[clicks[1]].tolist(), strict=True)
    (tmp_path / "clicks.csv").write_text("".join(f"{u},{i}\n" for u, i in rows))
    rev = np.stack([ITEM_IDS[clicks[1]], USER_IDS[clicks[0]]], axis=1)
    np.save(tmp_path / "rev.npy", rev)
    return tmp_path


def _ingest(files, **kw):
    return ingest_typed(
        {"user": files / "users.npy", "item": files / "items.npy"},
        {("user", "clicks", "item"): files / "clicks.csv",
         ("item", "clicked-by", "user"): files / "rev.npy"},
        out=files / "s", progress=False, **kw,
    )  # fmt: skip


def test_typed_ingest_reads_edges_in_the_types_own_ids(files, stores):
    _, own = stores
    store = _ingest(
        files, node_ids={"user": files / "user_ids.npy", "item": files / "item_ids.npy"}
    )
    assert store.meta.format_version == 4
    assert typed_edges(store.topology) == typed_edges(own.topology)
    for name, ids in (("user", USER_IDS), ("item", ITEM_IDS)):
        got = store.features[store.topology.typed_storage(ids, name)]
        assert torch.equal(got, own.features[own.topology.typed_storage(ids, name)])


def test_typed_ingest_refuses_an_id_the_type_lacks(files):
    (files / "clicks.csv").write_text("7,7\n8,7\n")
    ids = {"user": files / "user_ids.npy", "item": files / "item_ids.npy"}
    with pytest.raises(
        IngestError,
        match=r"clicks.csv: row 2: src 8 is not a 'user' node \(not in .*user_ids.npy\)",
    ):
        _ingest(files, node_ids=ids)
    assert not (files / "s").exists()
    np.save(files / "short.npy", USER_IDS[:-1])
    with pytest.raises(IngestError, match="has 29 node IDs but node type 'user' has 30"):
        _ingest(files, node_ids={"user": files / "short.npy"})


def test_cli_ingest_typed_takes_node_id_files(files):
    result = CliRunner().invoke(
        app,
        ["ingest-typed", "--out", str(files / "c"), "--nodes", f"user={files / 'users.npy'}",
         "--nodes", f"item={files / 'items.npy'}",
         "--edges", f"user:clicks:item={files / 'clicks.csv'}",
         "--node-ids", f"user={files / 'user_ids.npy'}",
         "--node-ids", f"item={files / 'item_ids.npy'}", "--no-progress"],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    store = GraphStore.open(files / "c")
    assert store.topology.typed_storage(USER_IDS[:3], "user").size == 3


# ----------------------------------------------------------------------------- updates
def test_updates_name_nodes_within_their_types(stores, tmp_path):
    """Added and removed edges name their ends within their relation's types, feature
    updates within their node type; replay and compaction keep the store's own IDs."""
    plain, own = stores
    own.save(tmp_path / "g", progress=False)
    live = LiveGraph(tmp_path / "g", with_features=True)
    assert set(live.topology.__dict__["_type_indexes"]) == {"user", "item"}  # built on open
    topo = own.topology

    def wide(ids, name):  # store-wide IDs of a type's own IDs
        return topo.to_external(topo.typed_storage(ids, name)).tolist()

    before = typed_edges(live.topology)
    (u,), (i,) = wide([USER_IDS[4]], "user"), wide([ITEM_IDS[2]], "item")
    live.apply(
        MutationBatch(
            add_src=[USER_IDS[4], ITEM_IDS[2]],
            add_dst=[ITEM_IDS[2], USER_IDS[4]],
            add_edge_type=["user__clicks__item", "item__clicked-by__user"],
        )
    )
    want = before + Counter({(u, i, 0): 1, (i, u, 1): 1})
    assert typed_edges(live.topology) == want
    ext = plain.topology.to_external(plain.topology.edge_index())  # an existing click
    k = int(np.flatnonzero(np.asarray(plain.topology.edge_type) == 0)[0])
    pos_u, pos_i = int(ext[0][k]), int(ext[1][k]) - USERS  # positions within the types
    (ru,), (ri,) = wide([USER_IDS[pos_u]], "user"), wide([ITEM_IDS[pos_i]], "item")
    live.apply(
        MutationBatch(
            remove_src=[USER_IDS[pos_u]],
            remove_dst=[ITEM_IDS[pos_i]],
            remove_edge_type=["user__clicks__item"],
            set_node_ids=[7],
            set_features=np.full((1, 5), 2.0, np.float32),
            set_node_type="item",
        )
    )
    want = Counter({k: v for k, v in want.items() if k[:2] != (ru, ri)})
    assert typed_edges(live.topology) == want
    item7 = live.store().topology.typed_storage([7], "item")
    assert live.store().features[item7].tolist() == [[2.0] * 5]
    refused = [
        (MutationBatch(add_src=[USER_IDS[0]], add_dst=[4], add_edge_type=["user__clicks__item"]),
         r"add_edges\[0\]: the destination 4 of a 'user__clicks__item' edge is not a 'item' node ID"),
        (MutationBatch(remove_src=[7], remove_dst=[7]),
         r"remove_edges: the graph's node types \(user, item\) have their own node IDs: name each"),
        (MutationBatch(remove_src=[7, 8], remove_dst=[7, 7], remove_edge_type=["user__clicks__item"] * 2),
         r"remove_edges\[1\]: the source 8 of a 'user__clicks__item' edge is not a 'user' node ID"),
        (MutationBatch(set_node_ids=[7], set_features=np.ones((1, 5), np.float32)),
         r"set_features: the graph's node types \(user, item\) have their own node IDs: name the"),
        (MutationBatch(set_node_ids=[8], set_features=np.ones((1, 5), np.float32), set_node_type="item"),
         r"set_features\[0\]: 8 is not a 'item' node ID"),
        (MutationBatch(set_node_ids=[7], set_features=np.ones((1, 5), np.float32), set_node_type="shop"),
         r"set_features.node_type: .*no node type 'shop'"),
    ]  # fmt: skip
    for batch, message in refused:
        with pytest.raises(InvalidUpdateError, match=message):
            live.apply(batch)
    assert live.seq == 2
    replayed = LiveGraph(tmp_path / "g")
    assert typed_edges(replayed.topology) == want
    live.compact()
    compacted = LiveGraph(tmp_path / "g", with_features=True)
    assert compacted.topology.meta.format_version == 4
    assert typed_edges(compacted.topology) == want
    assert compacted.store().features[item7].tolist() == [[2.0] * 5]
    assert np.array_equal(
        compacted.topology.typed_storage(ITEM_IDS, "item"), topo.typed_storage(ITEM_IDS, "item")
    )


def test_positional_typed_graphs_take_typed_updates_too(tmp_path):
    from hopserve.worker.graph.synth_hetero import synth_recommender

    synth_recommender(40, 30, 4, 4, seed=1, out=tmp_path / "rec", progress=False)
    live = LiveGraph(tmp_path / "rec", with_features=True)
    live.apply(
        MutationBatch(
            set_node_ids=[29], set_features=np.ones((1, 4), np.float32), set_node_type="item"
        )
    )
    row = live.store().topology.typed_storage([29], "item")
    assert live.store().features[row].tolist() == [[1.0] * 4]
    topo = live.topology  # a clicked pair that is not a buy: naming "buys" is refused
    types = {t.name: t for t in topo.node_types}
    ext = topo.to_external(topo.edge_index())
    names = np.array(topo.meta.relations)[np.asarray(topo.edge_type)]
    pairs = Counter(zip(ext[0].tolist(), ext[1].tolist(), names.tolist(), strict=True))
    u, i = next(
        (s, d)
        for s, d, r in pairs
        if r == "user__clicks__item" and (s, d, "user__buys__item") not in pairs
    )
    u, i = u - types["user"].offset, i - types["item"].offset  # positions within the types
    with pytest.raises(
        InvalidUpdateError, match=rf"remove_edges\[0\]: {u} -> {i} is not a 'user__buys__item' edge"
    ):
        live.apply(
            MutationBatch(remove_src=[u], remove_dst=[i], remove_edge_type=["user__buys__item"])
        )
    before = topo.num_edges
    live.apply(
        MutationBatch(remove_src=[u], remove_dst=[i], remove_edge_type=["user__clicks__item"])
    )
    assert live.topology.num_edges < before
    with pytest.raises(InvalidUpdateError, match=r"set_features\[0\]: 30 is not a 'item' node ID"):
        live.apply(
            MutationBatch(
                set_node_ids=[30], set_features=np.ones((1, 4), np.float32), set_node_type="item"
            )
        )


def test_untyped_graphs_refuse_typed_updates(tmp_path):
    rng = np.random.default_rng(0)
    GraphStore.from_edge_index(
        torch.from_numpy(rng.integers(0, 10, (2, 30))),
        torch.ones(10, 2),
        edge_type=rng.integers(0, 2, 30),
    ).save(tmp_path / "g", progress=False)
    live = LiveGraph(tmp_path / "g", with_features=True)
    for batch, message in [
        (MutationBatch(set_node_ids=[1], set_features=np.ones((1, 2), np.float32), set_node_type="user"),
         r"set_features.node_type: 'user' given, but the graph's nodes are untyped"),
        (MutationBatch(remove_src=[1], remove_dst=[2], remove_edge_type=["0"]),
         r"remove_edges.relations: the graph's nodes are untyped"),
    ]:  # fmt: skip
        with pytest.raises(InvalidUpdateError, match=message):
            live.apply(batch)
