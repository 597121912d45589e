"""A living graph served end to end: the stateful oracle test and read-your-writes.

Everything real: a graph store copied to a private folder, a server with two models on
it (3-layer GraphSAGE: degree-free, 2-layer GCN: degree-normalized), the in-process
worker, the session's redis-server as cache, updates over ``AdminService.UpdateGraph``
and queries over ``EmbeddingService`` on loopback gRPC.

The oracle keeps the graph as plain Python (external IDs, feature rows, an edge
multiset) and, after any interleaving of updates, queries and compactions, every served
row must equal the model's own forward on the whole mutated graph, also when it comes
from the cache (queries are asked twice: computed, then cached).
"""

from __future__ import annotations

import shutil
import time
from collections import Counter
from pathlib import Path

import grpc
import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule
from support import assert_exact
from support.models import GraphSAGE, TwoGCN

from hopserve.config import HopserveConfig
from hopserve.proto.v1 import admin_pb2, admin_pb2_grpc, embedding_pb2_grpc
from hopserve.proto.v1 import embedding_pb2 as pb
from hopserve.testing import free_port

from .conftest import FEATURES, ServerThread, external_ids

MODELS = {
    "sage": ("support.models:GraphSAGE", {"d_in": FEATURES, "hidden": 16, "d_out": 5}),
    "gcn": ("support.models:TwoGCN", {"d_in": FEATURES, "hidden": 16, "d_out": 5}),
}


def _model(name: str) -> torch.nn.Module:
    torch.manual_seed(3 if name == "sage" else 4)
    cls = GraphSAGE if name == "sage" else TwoGCN
    return cls(**MODELS[name][1]).eval()


class Oracle:
    """The graph as plain Python, and each model's own forward on it."""

    def __init__(self, graph_dir: Path) -> None:
        from hopserve import GraphStore

        store = GraphStore.open(graph_dir)
        ext = store.to_external(torch.arange(store.num_nodes)).numpy()
        self.ids: list[int] = [int(i) for i in ext]
        self.features = {int(i): store.features[k].numpy().copy() for k, i in enumerate(ext)}
        ei = store.edge_index().numpy()
        self.edges = Counter(zip(ext[ei[0]].tolist(), ext[ei[1]].tolist(), strict=True))
        self.models = {name: _model(name) for name in MODELS}

    def forward(self, name: str, ids: np.ndarray) -> torch.Tensor:
        row = {node: k for k, node in enumerate(self.ids)}
        x = torch.from_numpy(np.stack([self.features[i] for i in self.ids]))
        pairs = [(row[s], row[d]) for (s, d), c in self.edges.items() for _ in range(c)]
        edge_index = torch.tensor(pairs, dtype=torch.long).reshape(-1, 2).t()
        with torch.no_grad():
            out = self.models[name](x, edge_index)
        return out[[row[int(i)] for i in ids]]


def _rows(ids, features) -> pb.NodeRows:
    arr = np.asarray(features, dtype="<f4").reshape(len(ids), FEATURES)
    return pb.NodeRows(
        node_ids=[int(i) for i in ids], features=arr.tobytes(), dim=FEATURES,
        dtype=pb.DTYPE_FLOAT32,
    )  # fmt: skip


def serve(root: Path, graph_dir: Path, redis_url: str, **server) -> ServerThread:
    """A server with both models on a private copy of ``graph_dir``."""
    graph = root / "graph"
    shutil.copytree(graph_dir, graph, ignore=shutil.ignore_patterns("updates"))
    models = []
    for name, (entrypoint, kwargs) in MODELS.items():
        weights = root / f"{name}.pt"
        torch.save(_model(name).state_dict(), weights)
        models.append({
            "name": name, "version": "1", "entrypoint": entrypoint, "kwargs": kwargs,
            "weights": str(weights), "graph": str(graph),
        })  # fmt: skip
    config = HopserveConfig.model_validate({
        "models": models,
        "server": {"host": "127.0.0.1", "port": free_port(), "metrics_port": 0,
                   "max_wait_ms": 5, "grace_period_s": 1} | server,
        "cache": {"backend": "redis", "redis_url": redis_url, "redis_backoff_s": 0.2},
    })  # fmt: skip
    return ServerThread(config)


class Living(RuleBasedStateMachine):
    """Random interleavings of updates, queries and compactions against the oracle."""

    graph_dir: Path
    redis_url: str
    root: Path

    @initialize()
    def start(self) -> None:
        Living.runs += 1
        root = Living.root / f"run{Living.runs}"
        root.mkdir()
        self.server = serve(root, Living.graph_dir, Living.redis_url)
        self.oracle = Oracle(root / "graph")
        self.channel = grpc.insecure_channel(self.server.target)
        self.admin = admin_pb2_grpc.AdminServiceStub(self.channel)
        self.embed = embedding_pb2_grpc.EmbeddingServiceStub(self.channel)
        self.seq = 0
        self.next_id = 10**9
        self.rng = np.random.default_rng(Living.runs)

    def teardown(self) -> None:
        if hasattr(self, "server"):
            self.channel.close()
            self.server.stop()

    def _update(self, **fields) -> admin_pb2.UpdateGraphResponse:
        answer = self.admin.UpdateGraph(admin_pb2.UpdateGraphRequest(model="sage", **fields))
        assert answer.graph_seq == self.seq + 1
        self.seq = answer.graph_seq
        return answer

    def _pairs(self, k: int) -> tuple[list[int], list[int]]:
        ids = self.oracle.ids
        src = self.rng.choice(ids, size=k).tolist()
        dst = self.rng.choice(ids, size=k).tolist()
        return src, dst

    @rule(k=st.integers(1, 3), with_edges=st.booleans())
    def add_nodes(self, k: int, with_edges: bool) -> None:
        new = list(range(self.next_id, self.next_id + k))
        self.next_id += k
        feats = self.rng.standard_normal((k, FEATURES)).astype(np.float32)
        src, dst = self._pairs(k)
        if with_edges:  # a transaction between a new account and an existing one
            src, dst = new, dst
        self._update(
            add_nodes=_rows(new, feats),
            add_edges=pb.EdgeList(src=src, dst=dst) if with_edges else None,
        )
        self.oracle.ids += new
        self.oracle.features.update({i: f for i, f in zip(new, feats, strict=True)})
        if with_edges:
            self.oracle.edges.update(zip(src, dst, strict=True))

    @rule(k=st.integers(1, 20))
    def add_edges(self, k: int) -> None:
        src, dst = self._pairs(k)
        self._update(add_edges=pb.EdgeList(src=src, dst=dst))
        self.oracle.edges.update(zip(src, dst, strict=True))

    @precondition(lambda self: bool(self.oracle.edges))
    @rule(k=st.integers(1, 10))
    def remove_edges(self, k: int) -> None:
        edges = list(self.oracle.edges)
        pick = [
            edges[i] for i in self.rng.choice(len(edges), size=min(k, len(edges)), replace=False)
        ]
        self._update(remove_edges=pb.EdgeList(src=[s for s, _ in pick], dst=[d for _, d in pick]))
        for pair in pick:
            del self.oracle.edges[pair]

    @rule(k=st.integers(1, 5))
    def set_features(self, k: int) -> None:
        ids = self.rng.choice(self.oracle.ids, size=k, replace=False).tolist()
        feats = self.rng.standard_normal((k, FEATURES)).astype(np.float32)
        self._update(set_features=_rows(ids, feats))
        self.oracle.features.update({i: f for i, f in zip(ids, feats, strict=True)})

    @rule()
    def bad_update_changes_nothing(self) -> None:
        with pytest.raises(grpc.RpcError) as info:
            self.admin.UpdateGraph(admin_pb2.UpdateGraphRequest(
                model="sage",
                add_edges=pb.EdgeList(src=[self.oracle.ids[0], 5], dst=[self.oracle.ids[1], 6]),
            ))  # fmt: skip
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "add_edges.src[1]: node ID 5 is not in the graph" in info.value.details()
        graph = self.admin.GetGraph(admin_pb2.GetGraphRequest(model="sage"))
        assert graph.graph_seq == self.seq

    @rule()
    def compact(self) -> None:
        info = self.admin.CompactGraph(admin_pb2.CompactGraphRequest(model="gcn"))
        assert info.graph_seq == self.seq and info.base_seq == self.seq and info.log_batches == 0

    @rule(model=st.sampled_from(sorted(MODELS)), k=st.integers(1, 25))
    def query(self, model: str, k: int) -> None:
        ids = self.rng.choice(self.oracle.ids, size=k).tolist()
        want = self.oracle.forward(model, ids)
        for attempt in ("computed", "cached"):
            answer = self.embed.GetEmbeddings(pb.GetEmbeddingsRequest(model=model, node_ids=ids))
            got = np.frombuffer(answer.embeddings, "<f4").reshape(len(ids), -1)
            assert answer.graph_seq <= self.seq
            assert_exact(torch.from_numpy(got.copy()), want, f"{model} {attempt} at seq {self.seq}")
            self.server.drain()  # write-backs land before the next step

    @invariant()
    def served_sequence_is_the_latest(self) -> None:
        if hasattr(self, "admin"):
            assert self.admin.GetGraph(admin_pb2.GetGraphRequest(model="gcn")).graph_seq == self.seq


Living.runs = 0


def test_served_rows_equal_the_forward_on_the_mutated_graph(
    graph_dir: Path, redis_server: str, tmp_path: Path
) -> None:
    Living.graph_dir, Living.redis_url, Living.root = graph_dir, redis_server, tmp_path
    machine = Living.TestCase
    machine.settings = settings(
        max_examples=5, stateful_step_count=14, deadline=None,
        suppress_health_check=list(HealthCheck),
    )  # fmt: skip
    machine().runTest()


def test_read_your_writes_and_exact_invalidation(
    graph_dir: Path, redis_server: str, tmp_path: Path
) -> None:
    """A cached row changed by an update is never served again; untouched rows stay hits."""
    server = serve(tmp_path, graph_dir, redis_server)
    oracle = Oracle(tmp_path / "graph")
    try:
        with grpc.insecure_channel(server.target) as channel:
            admin = admin_pb2_grpc.AdminServiceStub(channel)
            embed = embedding_pb2_grpc.EmbeddingServiceStub(channel)
            ids = external_ids()
            ask = pb.GetEmbeddingsRequest(model="sage", node_ids=ids.tolist())
            embed.GetEmbeddings(ask)
            server.drain()
            assert embed.GetEmbeddings(ask).cache_hits == len(ids)  # all cached
            # One new edge into a node: its 3-hop downstream set changes, nothing else.
            target = int(ids[0])
            answer = admin.UpdateGraph(admin_pb2.UpdateGraphRequest(
                model="sage", add_edges=pb.EdgeList(src=[int(ids[1])], dst=[target]),
                idempotency_key="edge-1",
            ))  # fmt: skip
            oracle.edges[(int(ids[1]), target)] += 1
            after = embed.GetEmbeddings(ask)
            got = np.frombuffer(after.embeddings, "<f4").reshape(len(ids), -1)
            assert_exact(torch.from_numpy(got.copy()), oracle.forward("sage", ids), "after")
            assert after.graph_seq == answer.graph_seq == 1
            # Rows invalidated for both kinds (sage 3 layers, gcn 2 layers degree-normalized)
            # add up to the answer's count; the sage share are exactly the misses.
            assert 0 < len(ids) - after.cache_hits <= answer.rows_invalidated
            # A retry with the same key is answered, not applied again.
            again = admin.UpdateGraph(admin_pb2.UpdateGraphRequest(
                model="sage", add_edges=pb.EdgeList(src=[int(ids[1])], dst=[target]),
                idempotency_key="edge-1",
            ))  # fmt: skip
            assert again.replayed and again.graph_seq == 1
    finally:
        server.stop()


def test_hot_invalidated_rows_are_recomputed_in_the_background(
    graph_dir: Path, redis_server: str, tmp_path: Path
) -> None:
    """After an update, the recently requested rows it invalidated are computed again at
    the new sequence and cached: the next lookup is a hit, and exact."""
    server = serve(tmp_path, graph_dir, redis_server)
    oracle = Oracle(tmp_path / "graph")
    try:
        with grpc.insecure_channel(server.target) as channel:
            admin = admin_pb2_grpc.AdminServiceStub(channel)
            embed = embedding_pb2_grpc.EmbeddingServiceStub(channel)
            hot = external_ids()[:20].tolist()
            ask = pb.GetEmbeddingsRequest(model="gcn", node_ids=hot)
            embed.GetEmbeddings(ask)
            server.drain()
            answer = admin.UpdateGraph(admin_pb2.UpdateGraphRequest(
                model="gcn", add_edges=pb.EdgeList(src=[hot[1]], dst=[hot[0]]),
            ))  # fmt: skip
            oracle.edges[(hot[1], hot[0])] += 1
            server.drain()  # the refresh is a write-back like the others
            after = embed.GetEmbeddings(ask)
            assert answer.rows_invalidated > 0 and after.cache_hits == len(hot)
            got = np.frombuffer(after.embeddings, "<f4").reshape(len(hot), -1)
            assert_exact(torch.from_numpy(got.copy()), oracle.forward("gcn", hot), "refreshed")
    finally:
        server.stop()


def test_worker_processes_catch_up_from_the_log(
    graph_dir: Path, redis_server: str, tmp_path: Path
) -> None:
    """With worker processes (``server.local_workers``), each applies the update log up
    to the sequence a job names before evaluating: rows are exact after every update,
    whichever process computes them."""
    server = serve(tmp_path, graph_dir, redis_server, local_workers=2, max_batch_targets=8)
    oracle = Oracle(tmp_path / "graph")
    rng = np.random.default_rng(7)
    try:
        with grpc.insecure_channel(server.target) as channel:
            admin = admin_pb2_grpc.AdminServiceStub(channel)
            embed = embedding_pb2_grpc.EmbeddingServiceStub(channel)
            for step in range(4):
                src, dst = (rng.choice(oracle.ids, size=30).tolist() for _ in range(2))
                new = [2_000_000 + step]
                feats = rng.standard_normal((1, FEATURES)).astype(np.float32)
                admin.UpdateGraph(admin_pb2.UpdateGraphRequest(
                    model="sage", add_nodes=_rows(new, feats),
                    add_edges=pb.EdgeList(src=src + new, dst=dst + [oracle.ids[step]]),
                ))  # fmt: skip
                oracle.ids += new
                oracle.features[new[0]] = feats[0]
                oracle.edges.update(zip(src + new, dst + [oracle.ids[step]], strict=True))
                ids = rng.choice(oracle.ids, size=40).tolist() + new
                for name in MODELS:  # several batches: both processes get jobs
                    answer = embed.GetEmbeddings(
                        pb.GetEmbeddingsRequest(model=name, node_ids=ids), timeout=60
                    )
                    got = np.frombuffer(answer.embeddings, "<f4").reshape(len(ids), -1)
                    assert answer.graph_seq == step + 1
                    assert_exact(torch.from_numpy(got.copy()), oracle.forward(name, ids), name)
    finally:
        server.stop()


def test_cold_start_request_with_its_own_delta(
    graph_dir: Path, redis_server: str, tmp_path: Path
) -> None:
    """``GetEmbeddings`` with a delta: rows exact for graph + delta, for new and existing
    targets; the stored graph and the cache are untouched; footprints on request."""
    server = serve(tmp_path, graph_dir, redis_server, hub_degree=8)
    oracle = Oracle(tmp_path / "graph")
    try:
        with grpc.insecure_channel(server.target) as channel:
            admin = admin_pb2_grpc.AdminServiceStub(channel)
            embed = embedding_pb2_grpc.EmbeddingServiceStub(channel)
            a, b, c = (int(i) for i in external_ids()[:3])
            account, device = 5_000_001, 5_000_002
            feats = np.random.default_rng(1).standard_normal((2, FEATURES)).astype(np.float32)
            delta = pb.GraphDelta(
                add_nodes=_rows([account, device], feats),
                add_edges=pb.EdgeList(src=[account, device, a], dst=[a, account, account]),
            )
            targets = [account, a, c, device]
            before = {n: oracle.forward(n, [a, c]) for n in MODELS}
            for name in MODELS:
                embed.GetEmbeddings(pb.GetEmbeddingsRequest(model=name, node_ids=[a, c]))
            server.drain()
            with_delta = Oracle(tmp_path / "graph")
            with_delta.ids += [account, device]
            with_delta.features.update({account: feats[0], device: feats[1]})
            with_delta.edges.update([(account, a), (device, account), (a, account)])
            for name in MODELS:
                answer = embed.GetEmbeddings(pb.GetEmbeddingsRequest(
                    model=name, node_ids=targets, delta=delta, footprint=True,
                ))  # fmt: skip
                got = np.frombuffer(answer.embeddings, "<f4").reshape(len(targets), -1)
                assert_exact(torch.from_numpy(got.copy()), with_delta.forward(name, targets), name)
                # The delta matters for an existing target (the check could fail).
                assert not torch.allclose(with_delta.forward(name, [a]), before[name][:1])
                assert answer.cache_hits == 0 and answer.graph_seq == 0
                layers = 3 if name == "sage" else 2
                assert [len(f.frontier_sizes) for f in answer.footprints] == [layers + 1] * 4
                assert all(f.frontier_sizes[-1] == 1 for f in answer.footprints)
                assert all(f.hub == (f.max_degree >= 8) for f in answer.footprints)
                # Untouched: the stored graph, and cached rows still without the delta.
                plain = embed.GetEmbeddings(pb.GetEmbeddingsRequest(model=name, node_ids=[a, c]))
                rows = np.frombuffer(plain.embeddings, "<f4").reshape(2, -1)
                assert plain.cache_hits == 2
                assert_exact(torch.from_numpy(rows.copy()), before[name], f"{name} untouched")
            assert admin.GetGraph(admin_pb2.GetGraphRequest(model="sage")).graph_seq == 0
            for bad, message in (
                (pb.GraphDelta(add_edges=pb.EdgeList(src=[a], dst=[77])),
                 "delta: add_edges.dst[0]: node ID 77 is not in the graph"),
                (pb.GraphDelta(add_nodes=_rows([b], feats[:1])),
                 f"delta: add_nodes[0]: node ID {b} is already in the graph"),
            ):  # fmt: skip
                with pytest.raises(grpc.RpcError) as info:
                    embed.GetEmbeddings(
                        pb.GetEmbeddingsRequest(model="sage", node_ids=[a], delta=bad)
                    )
                assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
                assert message in info.value.details()
            with pytest.raises(grpc.RpcError) as info:  # a new ID without the delta
                embed.GetEmbeddings(pb.GetEmbeddingsRequest(model="sage", node_ids=[account]))
            assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    finally:
        server.stop()


def test_the_sdk_asks_with_a_delta_and_for_footprints(
    graph_dir: Path, redis_server: str, tmp_path: Path
) -> None:
    """``get_embeddings_with_info(add_nodes=..., add_edges=..., footprint=True)``: the
    fraud scorer's "what if" question, answered without writing anything."""
    server = serve(tmp_path, graph_dir, redis_server)
    try:
        a = int(external_ids()[0])
        feats = np.ones((1, FEATURES), np.float32)
        with server.client() as client:
            result = client.get_embeddings_with_info(
                "gcn", [9_000_000, a], add_nodes=([9_000_000], feats),
                add_edges=([9_000_000], [a]), footprint=True,
            )  # fmt: skip
        oracle = Oracle(tmp_path / "graph")
        oracle.ids.append(9_000_000)
        oracle.features[9_000_000] = feats[0]
        oracle.edges[(9_000_000, a)] += 1
        want = oracle.forward("gcn", [9_000_000, a])
        assert_exact(torch.from_numpy(result.embeddings.copy()), want, "sdk delta")
        assert [f.frontier_sizes[-1] for f in result.footprints] == [1, 1]
        assert result.cache_hits == 0 and result.graph_seq == 0
    finally:
        server.stop()


def test_a_remote_worker_with_its_own_copy_of_the_graph_follows_the_updates(
    graph_dir: Path, redis_server: str, tmp_path: Path
) -> None:
    """A worker on "another machine" (its own copy of the graph folder, no shared log)
    refuses a job planned past its sequence; the retried job carries the update-log
    records, which it appends to its own log: rows exact after every update, and it
    keeps them across its restart."""
    import subprocess
    import sys

    import yaml
    from support.processes import child_env

    from hopserve.testing import wait_for_port

    remote = tmp_path / "remote"
    remote.mkdir()
    shutil.copytree(graph_dir, remote / "graph", ignore=shutil.ignore_patterns("updates"))
    port = free_port()
    entries = []
    for name, (entrypoint, kwargs) in MODELS.items():
        weights = tmp_path / f"{name}-remote.pt"
        torch.save(_model(name).state_dict(), weights)
        entries.append({
            "name": name, "version": "1", "entrypoint": entrypoint, "kwargs": kwargs,
            "weights": str(weights), "graph": str(remote / "graph"),
        })  # fmt: skip
    (remote / "worker.yaml").write_text(yaml.safe_dump({"models": entries}))
    argv = [sys.executable, "-m", "hopserve", "worker", "-c", str(remote / "worker.yaml"),
            "--port", str(port)]  # fmt: skip

    def start() -> subprocess.Popen:
        proc = subprocess.Popen(argv, env=child_env(), stderr=subprocess.DEVNULL)
        wait_for_port(port, 120, proc)
        return proc

    worker = start()
    server = serve(tmp_path / "front", graph_dir, redis_server, workers=[f"127.0.0.1:{port}"])
    rng = np.random.default_rng(11)
    try:
        oracle = Oracle(tmp_path / "front" / "graph")
        with grpc.insecure_channel(server.target) as channel:
            admin = admin_pb2_grpc.AdminServiceStub(channel)
            embed = embedding_pb2_grpc.EmbeddingServiceStub(channel)

            def check(step: str) -> None:
                ids = rng.choice(oracle.ids, size=30).tolist()
                for name in MODELS:
                    answer = embed.GetEmbeddings(
                        pb.GetEmbeddingsRequest(
                            model=name, node_ids=ids,
                            options=pb.QueryOptions(cache_policy=pb.CACHE_BYPASS),
                        ),
                        timeout=60,
                    )  # fmt: skip
                    got = np.frombuffer(answer.embeddings, "<f4").reshape(len(ids), -1)
                    assert_exact(torch.from_numpy(got.copy()), oracle.forward(name, ids), step)

            for step in range(3):
                src, dst = (rng.choice(oracle.ids, size=20).tolist() for _ in range(2))
                admin.UpdateGraph(admin_pb2.UpdateGraphRequest(
                    model="sage", add_edges=pb.EdgeList(src=src, dst=dst),
                ))  # fmt: skip
                oracle.edges.update(zip(src, dst, strict=True))
                check(f"update {step + 1}")
            worker.kill()
            worker.wait(30)
            worker = start()  # replays its own log: already at the front-end's sequence
            deadline = time.monotonic() + 90
            while True:  # until the front-end sees the worker up again (health checks)
                try:
                    check("after the worker's restart")
                    break
                except grpc.RpcError as err:
                    if err.code() != grpc.StatusCode.UNAVAILABLE or time.monotonic() > deadline:
                        raise
                    time.sleep(0.5)
        assert (remote / "graph" / "updates" / "log").stat().st_size > 0
    finally:
        server.stop()
        worker.kill()
        worker.wait(30)
